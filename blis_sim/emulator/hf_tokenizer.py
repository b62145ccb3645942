"""A model's own Hugging Face tokenizer and chat template, read from local files (``--tokenizer PATH``).

API::

    tok = load_hf_tokenizer("/models/llama")       # a folder, or its tokenizer.json; ConfigError if absent
    tok.encode_prompt("Hello", add_special_tokens=True)     # vLLM's completions/tokenize count
    tok.render_chat(messages, add_generation_prompt=True)   # the model's chat template (jinja2), as text
    tok.decode(ids), tok.token_text(i), tok.token_str(i), tok.output_token(seed)
    tok.vocab_size, tok.eos_token_id, tok.root, tok.describe()

Files read, as transformers reads them for vLLM (no hub, no network): ``tokenizer.json`` (the
``tokenizers`` library), ``tokenizer_config.json`` (special tokens, ``chat_template``) and
``chat_template.jinja`` (the template of transformers 5 and later, which wins over the config's).
The template is rendered as transformers' ``apply_chat_template`` renders it: a sandboxed jinja2
environment with ``trim_blocks``/``lstrip_blocks``, ``tojson``, ``raise_exception`` and the special
tokens as variables. vLLM then encodes a chat prompt with ``add_special_tokens=False`` and a completion
prompt with ``True`` (the tokenizer's post-processor adds BOS where the model has one).

Generated tokens are drawn from the vocabulary's *canonical words*: tokens whose text is a space and
ASCII letters and which re-encode to themselves, so an answer echoed into the next turn re-tokenizes
to the same ids (multi-turn prefixes are shared, as with the built-in tokenizer).
"""
from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from blis_sim.errors import ConfigError

_FIELD = "tokenizer"
# transformers' message when a tokenizer has no template (vLLM answers a chat request with it, 400)
NO_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so you must provide a "
               "chat template if the tokenizer does not define one.")


class ChatTemplateError(ValueError):
    """The template is missing or rejected the messages (vLLM answers 400 with the reason)."""


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", "lstrip": false, ...} (AddedToken)
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"not a readable JSON file ({exc})", file=str(path), field=_FIELD) from None
    if not isinstance(doc, dict):
        raise ConfigError("expected a JSON object", file=str(path), field=_FIELD)
    return doc


def _pick_template(raw: Any, path: Path) -> str | None:
    """A config's ``chat_template``: a string, or a list of named ones (the ``default`` is used)."""
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ConfigError("chat_template must be a string or a list with a 'default' entry", file=str(path),
                      field=_FIELD)


class HfTokenizer:
    """A ``tokenizers.Tokenizer`` with the special tokens and chat template of its folder."""

    def __init__(self, tokenizer: Any, *, root: Path, config: dict[str, Any], chat_template: str | None,
                 source: str) -> None:
        self._tok = tokenizer
        self.root = root
        self.source = source
        self.chat_template = chat_template
        self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
        self.special = {name: text for name in ("bos_token", "eos_token", "unk_token", "pad_token")
                        if (text := _token_content(config.get(name))) is not None}
        eos = self.special.get("eos_token")
        eos_id = tokenizer.token_to_id(eos) if eos else None
        self.eos_token_id = int(eos_id) if eos_id is not None else 0
        # the SSE path decodes one token per event; a server keeps one tokenizer for its lifetime
        self.token_text = functools.lru_cache(maxsize=65536)(self._decode_one)

    # -- the emulator's tokenizer seam (blis_sim.emulator.tokenizer.ServedTokenizer) -----------------
    def encode_prompt(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def _decode_one(self, token_id: int) -> str:
        return str(self._tok.decode([token_id], skip_special_tokens=True))

    def token_str(self, token_id: int) -> str:
        """The vocabulary string of one token (``convert_ids_to_tokens``: ``Ġword`` in byte-level BPE)."""
        return str(self._tok.id_to_token(token_id) or "")

    def output_token(self, seed: int) -> int:
        words = self._canonical_words
        return words[seed % len(words)]

    @functools.cached_property
    def _canonical_words(self) -> tuple[int, ...]:
        texts = self._tok.decode_batch([[i] for i in range(self.vocab_size)], skip_special_tokens=True)
        candidates = [(i, t) for i, t in enumerate(texts)
                      if len(t) > 1 and t[0] == " " and t[1:].isascii() and t[1:].isalpha()]
        encoded = self._tok.encode_batch([t for _, t in candidates], add_special_tokens=False)
        words = tuple(i for (i, _), enc in zip(candidates, encoded) if enc.ids == [i])
        if not words:
            raise ConfigError("no token of the vocabulary is a space-led word that re-encodes to itself; the "
                              "emulator cannot generate text with this tokenizer", file=self.source, field=_FIELD)
        return words

    def render_chat(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool) -> str:
        if self.chat_template is None:
            raise ChatTemplateError(NO_TEMPLATE)
        try:
            return str(self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                              tools=None, documents=None, **self.special))
        except Exception as exc:
            raise ChatTemplateError(str(exc)) from None

    @functools.cached_property
    def _template(self) -> Any:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
                   sort_keys: bool = False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        def strftime_now(fmt: str) -> str:
            import datetime
            return datetime.datetime.now().strftime(fmt)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                           extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        assert self.chat_template is not None  # render_chat checks it first
        try:
            return env.from_string(self.chat_template)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise ConfigError(f"the chat template does not parse (its line {exc.lineno}: {exc.message})",
                              file=self.source, field=_FIELD) from None

    def describe(self) -> str:
        template = "its chat template" if self.chat_template else "no chat template"
        return f"{self.source} ({self.vocab_size} tokens, {template})"


def load_hf_tokenizer(path: str | Path) -> HfTokenizer:
    """The tokenizer of a model folder (or of a ``tokenizer.json`` file), from local files only."""
    given = Path(path).expanduser()
    if given.is_dir():
        folder, file = given, given / "tokenizer.json"
    else:
        folder, file = given.parent, given
    if not file.is_file():
        what = "no tokenizer.json in this folder" if given.is_dir() else "does not exist"
        raise ConfigError(f"{what} (give a model folder or its tokenizer.json; nothing is downloaded)",
                          file=str(given), field=_FIELD)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError("--tokenizer needs the 'tokenizers' package: pip install 'pytest-blis[tokenizer]'",
                          field=_FIELD) from None
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as exc:
        raise ConfigError(f"not a tokenizer.json the tokenizers library reads ({exc})", file=str(file),
                          field=_FIELD) from None
    config_file = folder / "tokenizer_config.json"
    config = _read_json(config_file) if config_file.is_file() else {}
    template = _pick_template(config.get("chat_template"), config_file)
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")
    return HfTokenizer(tok, root=folder.resolve(), config=config, chat_template=template, source=str(file))
