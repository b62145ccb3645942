"""Prompt text whose length *on the server* is what the workload asks for.

API::

    builder = await calibrate_prompts(session, target)   # probes /tokenize, else the reference's
                                                          # tokens-per-word ratio (docs/reference-formats.md §3.3)
    builder = await calibrate_prompts(session, target, tokenizer="/models/llama")   # the model's own
                                                          # tokenizer, offline: exact without /tokenize
    text = builder.text(token_ids, prefix_length)         # deterministic text for a request
    builder.mode, builder.describe()                      # "exact" | "ratio" | "fallback", for the log/header

Each workload token id becomes one vocabulary word, written with a leading space (``" oak"``), so
that prefix-sharing requests share a text prefix exactly when their token ids share a prefix (groups,
accumulated multi-turn context). In **exact** mode (the server answers ``/tokenize``) the words are the
vocabulary words that cost exactly one server token after a space, and the ``base`` tokens the server
adds on its own (BOS, chat template) are taken off the front, so ``usage.prompt_tokens`` equals the
spec's input length and the shared prefix is exactly ``prefix_length`` tokens. Otherwise (**ratio**
mode) the reference's calibration gives tokens per word and ``round(n / tpw)`` words stand for ``n``
tokens; lengths then drift and are recorded (``server_input_tokens``) and warned about. Given the
served model's tokenizer (``--tokenizer PATH``: its folder or ``tokenizer.json``, read by the emulator's
reader, :mod:`blis_sim.emulator.hf_tokenizer`), the same exact fit is made offline, counting as vLLM
counts (a completion prompt with special tokens, a chat message through the model's chat template), so
a server without ``/tokenize`` gets prompts of exact lengths too.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from blis_sim.observe.client import (
    Target,
    send,  # local: avoid a cycle at import time
)
from blis_sim.observe.records import RequestRecord, RunClock, WireRequest

log = logging.getLogger("blis_sim.observe")

# The reference's 100-word vocabulary (docs/reference-formats.md §3.3), so ratio mode matches its prompts.
VOCABULARY: tuple[str, ...] = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima",
    "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey",
    "xray", "yankee", "zulu", "apple", "banana", "cherry", "date", "elder", "fig", "grape", "hazel", "iris",
    "jasmine", "kiwi", "lemon", "mango", "nutmeg", "olive", "peach", "quince", "rose", "sage", "thyme", "umber",
    "violet", "willow", "yarrow", "acorn", "birch", "cedar", "daisy", "elm", "fern", "ginger", "holly", "ivy",
    "juniper", "kelp", "laurel", "maple", "nettle", "oak", "pine", "quinoa", "reed", "spruce", "tulip", "umbra",
    "vine", "walnut", "xylem", "yew", "zinnia", "alder", "basil", "clover", "dill", "fennel", "garlic", "hemp",
    "indigo", "jade", "kumquat", "lily", "moss", "neem", "orchid", "poppy", "rye", "saffron", "tea", "urchin",
    "verbena", "wheat", "xeris", "yucca", "zest"
)
assert len(VOCABULARY) == 100

MIN_EXACT_ALPHABET = 2  # fewer one-token words than this: fall back to ratio mode
_PROBE_CONCURRENCY = 8


@dataclass(frozen=True)
class PromptBuilder:
    """Token ids → text. ``words_per_token`` < 1 in ratio mode (each word stands for several tokens)."""

    alphabet: tuple[str, ...]
    mode: str  # "exact" (tokenize-fitted), "ratio" (calibrated tokens/word), "fallback" (1.0 assumed)
    tokens_per_word: float = 1.0
    base_tokens: int = 0  # tokens the server adds to any prompt (BOS, template); exact mode only
    counted_by: str = "server /tokenize"  # or "tokenizer <path>" (counted offline)

    def text(self, token_ids: list[int], prefix_length: int = 0) -> str:
        """The prompt for a request whose full input is ``token_ids`` (prefix first)."""
        if self.mode == "exact":
            ids = token_ids[self.base_tokens:] or token_ids[-1:]  # at least one word
            return self._words(ids)
        prefix_length = min(max(prefix_length, 0), len(token_ids))
        parts = []
        if prefix_length:
            parts.append(self._words(token_ids[:self._count(prefix_length)]))
        suffix = token_ids[prefix_length:]
        if suffix or not parts:
            parts.append(self._words(suffix[:self._count(len(suffix))] or token_ids[-1:]))
        return "".join(parts)

    def _count(self, tokens: int) -> int:
        return max(1, int(tokens / self.tokens_per_word + 0.5))

    def _words(self, ids: list[int]) -> str:
        spaced = self._spaced
        n = len(spaced)
        return "".join([spaced[i % n] for i in ids])

    @functools.cached_property
    def _spaced(self) -> tuple[str, ...]:
        """The alphabet with the leading spaces already on, so that a prompt is one join of words."""
        return tuple(" " + w for w in self.alphabet)

    def describe(self) -> str:
        if self.mode == "exact":
            return (f"exact ({self.counted_by}: {len(self.alphabet)} one-token words, "
                    f"{self.base_tokens} base tokens)")
        return f"{self.mode} ({self.tokens_per_word:.3f} tokens/word)"


async def tokenize_count(session: aiohttp.ClientSession, target: Target, text: str) -> int | None:
    """Server token count of ``text`` as a prompt in ``target``'s API format, or None if unavailable."""
    body: dict[str, Any] = {"model": target.model}
    if target.api_format == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    try:
        async with session.post(target.base_url.rstrip("/") + "/tokenize", json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=min(target.timeout_s, 30.0))) as resp:
            if resp.status != 200:
                return None
            data = await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
        return None
    if isinstance(data, dict):
        if isinstance(data.get("count"), int):
            return int(data["count"])
        if isinstance(data.get("tokens"), list):
            return len(data["tokens"])
    return None


Count = Callable[[str], Awaitable["int | None"]]


def local_count(path: str, api_format: str) -> tuple[Count, str]:
    """A counter of prompt tokens with the served model's own tokenizer, as vLLM counts for
    ``api_format``; and what it is, for the log. ConfigError when the tokenizer cannot be read."""
    # local: importing it loads the emulator package (its server and engine), wanted only with a tokenizer
    from blis_sim.emulator.hf_tokenizer import ChatTemplateError, load_hf_tokenizer

    tok = load_hf_tokenizer(path)

    async def count(text: str) -> int | None:
        if api_format == "chat":
            try:
                text = tok.render_chat([{"role": "user", "content": text}], add_generation_prompt=True)
            except ChatTemplateError:
                return None
            return len(tok.encode_prompt(text, add_special_tokens=False))
        return len(tok.encode_prompt(text, add_special_tokens=True))

    return count, f"tokenizer {tok.source}"


async def _exact_builder(session: aiohttp.ClientSession, target: Target, count: Count | None = None,
                         counted_by: str = "server /tokenize") -> PromptBuilder | None:
    """Probe each vocabulary word's cost after a space (``count``: the server's /tokenize unless given);
    None if it does not answer."""
    if count is None:
        async def count(text: str) -> int | None:
            return await tokenize_count(session, target, text)
    anchor = " " + VOCABULARY[0]
    one = await count(anchor)
    two = await count(anchor * 2)
    if one is None or two is None or two <= one:
        return None
    anchor_cost = two - one
    base = one - anchor_cost
    sem = asyncio.Semaphore(_PROBE_CONCURRENCY)

    async def cost(word: str) -> int | None:
        async with sem:
            n = await count(anchor + " " + word)
        return None if n is None else n - one

    costs = await asyncio.gather(*(cost(w) for w in VOCABULARY))
    alphabet = tuple(w for w, c in zip(VOCABULARY, costs) if c == 1)
    if len(alphabet) < MIN_EXACT_ALPHABET:
        known = [c for c in costs if c]
        tpw = sum(known) / len(known) if known else 1.0
        log.warning("observe: only %d vocabulary words are one server token; prompt lengths use "
                    "%.3f tokens/word and will drift", len(alphabet), tpw)
        return PromptBuilder(VOCABULARY, "ratio", tokens_per_word=tpw)
    # Check additivity once on a longer text (BPE merges across words would break the fit).
    probe = "".join(" " + alphabet[i % len(alphabet)] for i in range(64))
    measured = await count(probe)
    if measured != base + 64:
        log.warning("observe: %s is not additive over words (64 words gave %s tokens, expected %d); "
                    "falling back to tokens-per-word", counted_by, measured, base + 64)
        return None
    return PromptBuilder(alphabet, "exact", base_tokens=max(base, 0), counted_by=counted_by)


async def _ratio_builder(session: aiohttp.ClientSession, target: Target) -> PromptBuilder:
    """The reference's calibration: one 100-word request, ratio = prompt_tokens / 100 in [1, 3]."""
    wire = WireRequest(prompt=" ".join(VOCABULARY), max_tokens=1, streaming=False, arrival_us=0,
                       input_tokens=0)
    record = RequestRecord(request_id=-1, wire=wire)
    await send(session, Target(target.base_url, target.model, target.api_format, target.api_key,
                               min(target.timeout_s, 30.0)), record, RunClock())
    ratio = record.server_input_tokens / 100.0
    if record.status != "ok" or record.server_input_tokens <= 0 or not 1.0 <= ratio <= 3.0:
        why = record.error_message or (f"ratio {ratio:.3f} outside [1, 3]" if record.server_input_tokens
                                       else "no usage.prompt_tokens (check that usage reporting is enabled)")
        log.warning("observe: prefix token calibration failed (%s); assuming 1.0 tokens/word", why)
        return PromptBuilder(VOCABULARY, "fallback", tokens_per_word=1.0)
    log.info("observe: prefix token calibration: 100 words -> %d server tokens (%.3f tokens/word)",
             record.server_input_tokens, ratio)
    return PromptBuilder(VOCABULARY, "ratio", tokens_per_word=ratio)


async def calibrate_prompts(session: aiohttp.ClientSession, target: Target, *,
                            use_tokenize: bool = True, tokenizer: str = "") -> PromptBuilder:
    """The best builder: exact from the model's ``tokenizer`` (offline) when given, else exact via the
    server's /tokenize, else the reference's ratio."""
    if tokenizer:
        count, what = local_count(tokenizer, target.api_format)
        builder = await _exact_builder(session, target, count, what)
        if builder is not None:
            log.info("observe: prompt lengths %s", builder.describe())
            return builder
    if use_tokenize:
        builder = await _exact_builder(session, target)
        if builder is not None:
            log.info("observe: prompt lengths %s", builder.describe())
            return builder
    return await _ratio_builder(session, target)
