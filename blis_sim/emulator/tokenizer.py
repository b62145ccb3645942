"""A deterministic tokenizer with no downloads, consistent across `/tokenize`, usage and caching.

API::

    tok = Tokenizer()
    ids = tok.encode("The quick brown fox")     # list[int]
    text = tok.decode(ids)                       # exact inverse for any text
    tok.token_text(i) == tok.decode([i])         # one token's text (the SSE path)
    tok.vocab_size, tok.eos_token_id, tok.bos_token_id
    tok.output_token(seed)                       # a "word" token the model emits (canonical: re-encodes to itself)

Scheme (about 1.5 tokens per English word, like a small BPE): text is split into runs of letters
(optionally with one leading space), and every run into pieces of at most four letters; the first
letter of a run may be upper-case. Each piece has an arithmetic id, so no table is stored. Anything
else (digits, punctuation, other whitespace, non-ASCII) falls back to one token per UTF-8 byte.

Id layout: 0 <unk>, 1 <s>, 2 </s>, 3 <pad>; 4..259 the 256 byte tokens; then letter pieces, keyed
by (leading space?, capitalised?, letters).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol

UNK, BOS, EOS, PAD = 0, 1, 2, 3
_BYTE_BASE = 4
_PIECE_BASE = _BYTE_BASE + 256
MAX_PIECE = 4  # letters per piece: sets the tokens-per-word ratio
_ALPHA = 26
# Offsets of the length-k letter strings within one (space, capital) variant.
_LEN_OFFSET = [0]
for _k in range(1, MAX_PIECE + 1):
    _LEN_OFFSET.append(_LEN_OFFSET[-1] + _ALPHA ** _k)
_VARIANT_SIZE = _LEN_OFFSET[-1]
VOCAB_SIZE = _PIECE_BASE + 4 * _VARIANT_SIZE

# A run of ASCII letters with an optional single leading space; anything else is one char.
_SPLIT = re.compile(r" ?[A-Za-z]+|[^A-Za-z]", re.ASCII)
_SPECIAL_TEXT = {UNK: "<unk>", BOS: "<s>", EOS: "</s>", PAD: "<pad>"}


def _letters_index(letters: str) -> int:
    index = 0
    for ch in letters:
        index = index * _ALPHA + (ord(ch) - 97)
    return _LEN_OFFSET[len(letters) - 1] + index


@lru_cache(maxsize=65536)
def _encode_word(word: str) -> tuple[int, ...]:
    """Ids of one split unit (a letter run with optional leading space, or a single other char)."""
    if len(word) == 1 and not word.isalpha():
        return tuple(_BYTE_BASE + b for b in word.encode("utf-8"))
    space = word[0] == " "
    letters = word[1:] if space else word
    if not letters.isascii() or not letters.isalpha():
        return tuple(_BYTE_BASE + b for b in word.encode("utf-8"))
    ids: list[int] = []
    for start in range(0, len(letters), MAX_PIECE):
        piece = letters[start:start + MAX_PIECE]
        lead_space = space and start == 0
        capital = piece[0].isupper()
        rest_lower = piece[1:]
        if rest_lower and not rest_lower.islower():
            # Upper-case letters beyond the first of a piece: byte fallback keeps decode exact.
            if lead_space:
                ids.append(_BYTE_BASE + 32)
            ids.extend(_BYTE_BASE + b for b in piece.encode("ascii"))
            continue
        variant = (2 if lead_space else 0) + (1 if capital else 0)
        ids.append(_PIECE_BASE + variant * _VARIANT_SIZE + _letters_index(piece.lower()))
    return tuple(ids)


@lru_cache(maxsize=65536)
def _decode_piece(token_id: int) -> str:
    if token_id < _BYTE_BASE:
        return _SPECIAL_TEXT.get(token_id, "")
    if token_id < _PIECE_BASE:
        return chr(token_id - _BYTE_BASE)  # only reached for ASCII; see Tokenizer.decode
    rel = token_id - _PIECE_BASE
    variant, index = divmod(rel, _VARIANT_SIZE)
    length = 1
    while index >= _LEN_OFFSET[length]:
        length += 1
    index -= _LEN_OFFSET[length - 1]
    chars = []
    for _ in range(length):
        index, digit = divmod(index, _ALPHA)
        chars.append(chr(97 + digit))
    letters = "".join(reversed(chars))
    if variant & 1:
        letters = letters[0].upper() + letters[1:]
    return (" " + letters) if variant & 2 else letters


def _split(text: str) -> list[str]:
    """``_SPLIT.findall(text)``; for the common case (ASCII letters and spaces only) without the regex,
    which costs about half of an encode: ``str.split`` gives the same units."""
    if not (text.isascii() and text.replace(" ", "").isalpha()):
        return _SPLIT.findall(text)
    parts = text.split(" ")
    # "a b" -> ["a", "b"]: the first unit has no leading space, the others do. An empty part is a
    # space that no letter followed (a double, or a trailing, space): the regex gives a lone " ".
    units = [parts[0]] if parts[0] else []
    units += [" " + w if w else " " for w in parts[1:]]
    return units


class ServedTokenizer(Protocol):
    """What the server and the engine need of a tokenizer: this module's built-in one, or the model's own
    (:mod:`blis_sim.emulator.hf_tokenizer`, ``--tokenizer PATH``)."""

    vocab_size: int
    eos_token_id: int

    def encode_prompt(self, text: str, *, add_special_tokens: bool) -> list[int]: ...
    def render_chat(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool) -> str: ...
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...
    def token_text(self, token_id: int) -> str: ...
    def token_str(self, token_id: int) -> str: ...
    def output_token(self, seed: int) -> int: ...
    def describe(self) -> str: ...


BUILTIN_NOTE = ("the emulator's built-in tokenizer: token counts are not the served model's; "
                "give --tokenizer PATH for that model's own")


class Tokenizer:
    """Deterministic, table-free tokenizer (see module docstring). ``add_bos``: a text prompt encoded
    with special tokens starts with ``<s>`` (``--add-bos``)."""

    vocab_size = VOCAB_SIZE
    bos_token_id = BOS
    eos_token_id = EOS
    pad_token_id = PAD

    def __init__(self, *, add_bos: bool = False) -> None:
        self.add_bos = add_bos

    def encode_prompt(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return self.encode(text, add_bos=add_special_tokens and self.add_bos)

    @staticmethod
    def render_chat(messages: list[dict[str, Any]], *, add_generation_prompt: bool) -> str:
        """A plain template (the lane's tiny model has the same one): ``<|role|>\\ncontent\\n`` per message."""
        text = "".join(f"<|{m['role']}|>\n{m.get('content', '')}\n" for m in messages)
        return text + "<|assistant|>\n" if add_generation_prompt else text

    @staticmethod
    def describe() -> str:
        return BUILTIN_NOTE

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        ids: list[int] = [BOS] if add_bos else []
        for word in _split(text):
            ids.extend(_encode_word(word))
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        out: list[str] = []
        pending = bytearray()  # byte tokens are joined before UTF-8 decoding
        for token_id in ids:
            if _BYTE_BASE <= token_id < _PIECE_BASE:
                pending.append(token_id - _BYTE_BASE)
                continue
            if pending:
                out.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            if token_id < _BYTE_BASE and skip_special_tokens:
                continue
            out.append(_decode_piece(token_id))
        if pending:
            out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def token_text(self, token_id: int) -> str:
        """``decode([token_id])``, without its list and byte buffer for a letter piece (what the model
        emits): the SSE stream decodes one token per event."""
        if token_id >= _PIECE_BASE:
            return _decode_piece(token_id)
        return self.decode([token_id])

    def token_str(self, token_id: int) -> str:
        """The text of one token (byte tokens as their latin-1 character, like byte-level BPE)."""
        if _BYTE_BASE <= token_id < _PIECE_BASE:
            return chr(token_id - _BYTE_BASE)
        return _decode_piece(token_id)

    @staticmethod
    def output_token(seed: int) -> int:
        """A space-led lower-case word piece, chosen by ``seed``: decodes to text that re-encodes to
        the same single id, so multi-turn prompts that echo earlier outputs share their prefix."""
        length = 1 + seed % MAX_PIECE
        index = (seed // MAX_PIECE) % (_ALPHA ** length)
        return _PIECE_BASE + 2 * _VARIANT_SIZE + _LEN_OFFSET[length - 1] + index
