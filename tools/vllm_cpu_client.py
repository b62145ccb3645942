"""A small, exact client for probing a vLLM server: streamed completions and /metrics counter deltas.

Used by ``tools/vllm_cpu_measure.py`` and by the tests in ``tests/vllm/`` (loaded by path); it needs the
project's dependencies (aiohttp, prometheus-client), not the lane's virtualenv.

API:
- :func:`scrape` ``(url) -> Snapshot``: ``/metrics`` parsed with prometheus-client; ``snap.value(name, **labels)``
  sums the samples of ``name`` whose labels include ``labels`` (so ``engine``/``model_name`` need not be given);
  ``after.delta(before, name, **labels)``.
- :func:`complete` ``(session, url, prompt_ids, max_tokens, **body) -> Completion``: one streamed
  ``/v1/completions`` request with ``stream_options.include_usage``; records every raw SSE line, the send time,
  the first byte, the first token chunk, the first chunk with text, and the end (``time.perf_counter``
  seconds), the text, the usage and
  ``cached_tokens`` (``usage.prompt_tokens_details.cached_tokens``, ``None`` when not reported).
- :func:`complete_plain`: the same request without streaming (``prompt_logprobs`` needs it); ``done`` = 200.
- :func:`unique_prompt` ``(rng, n) -> list[int]``: n token ids that avoid the special tokens 0–3.
- :data:`KV_COUNTERS`: the counter samples whose deltas describe the prefix cache.
"""
from __future__ import annotations

import dataclasses
import json
import random
import time
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

MODEL = "tiny-llama"
FIRST_ORDINARY_TOKEN = 4  # 0..3 are <unk> <s> </s> <pad>
VOCAB_SIZE = 8000
TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
KV_COUNTERS: tuple[tuple[str, dict[str, str]], ...] = (
    ("vllm:prefix_cache_queries_total", {}),
    ("vllm:prefix_cache_hits_total", {}),
    ("vllm:external_prefix_cache_queries_total", {}),
    ("vllm:external_prefix_cache_hits_total", {}),
    ("vllm:prompt_tokens_total", {}),
    ("vllm:prompt_tokens_cached_total", {}),
    *(("vllm:prompt_tokens_cached_by_source_total", {"source": s})
      for s in ("device", "host", "p2p", "disk", "external_unspecified")),
    *(("vllm:prompt_tokens_by_source_total", {"source": s})
      for s in ("local_compute", "local_cache_hit", "external_kv_transfer")),
    ("vllm:num_preemptions_total", {}),
)


def counter_key(name: str, labels: dict[str, str]) -> str:
    """A short printable key: ``prefix_cache_hits`` or ``prompt_tokens_cached_by_source[device]``."""
    short = name.removeprefix("vllm:").removesuffix("_total")
    return f"{short}[{','.join(labels.values())}]" if labels else short


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One parsed ``/metrics`` exposition: (sample name, sorted labels) -> value."""

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    families: frozenset[str]

    def value(self, name: str, **labels: str) -> float:
        want = set(labels.items())
        found = [v for (n, lab), v in self.samples.items() if n == name and want <= set(lab)]
        if not found:
            raise KeyError(f"no sample {name}{labels or ''} in /metrics")
        return sum(found)

    def labels_of(self, name: str) -> list[dict[str, str]]:
        return [dict(lab) for (n, lab) in self.samples if n == name]

    def delta(self, before: Snapshot, name: str, **labels: str) -> float:
        return self.value(name, **labels) - before.value(name, **labels)

    def has(self, name: str, **labels: str) -> bool:
        want = set(labels.items())
        return any(n == name and want <= set(lab) for (n, lab) in self.samples)

    def kv_deltas(self, before: Snapshot) -> dict[str, int]:
        """Deltas of the :data:`KV_COUNTERS` this server exposes (a missing series is left out)."""
        return {counter_key(n, lab): int(self.delta(before, n, **lab)) for n, lab in KV_COUNTERS
                if self.has(n, **lab) and before.has(n, **lab)}

    def ttft_delta(self, before: Snapshot) -> tuple[int, float]:
        """(requests, summed seconds) added to the server's TTFT histogram."""
        count = self.delta(before, TTFT_HISTOGRAM + "_count")
        return int(count), self.delta(before, TTFT_HISTOGRAM + "_sum")


def parse_metrics(text: str) -> Snapshot:
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    families: set[str] = set()
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return Snapshot(samples, frozenset(families))


async def scrape(session: aiohttp.ClientSession, url: str) -> Snapshot:
    async with session.get(url + "/metrics") as resp:
        resp.raise_for_status()
        return parse_metrics(await resp.text())


@dataclasses.dataclass
class Completion:
    """One streamed completion as the client saw it."""

    status: int
    sent: float
    first_byte: float | None = None
    first_token: float | None = None  # first chunk with a choice (a token; its text may be "" mid-UTF-8)
    first_content: float | None = None  # first chunk with non-empty text
    end: float | None = None
    raw_lines: list[str] = dataclasses.field(default_factory=list)
    chunks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    text: str = ""
    usage: dict[str, Any] | None = None
    done: bool = False

    @property
    def ttft(self) -> float:
        """Client TTFT: to the first chunk that carries a generated token."""
        assert self.first_token is not None, "no token chunk arrived"
        return self.first_token - self.sent

    @property
    def e2e(self) -> float:
        assert self.end is not None
        return self.end - self.sent

    @property
    def cached_tokens(self) -> int | None:
        details = (self.usage or {}).get("prompt_tokens_details")
        return None if details is None else details.get("cached_tokens")


async def complete(session: aiohttp.ClientSession, url: str, prompt: list[int] | str, max_tokens: int,
                   **body: Any) -> Completion:
    """Send one streamed completion (temperature 0, usage in the last chunk) and read it to ``[DONE]``."""
    payload = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
               "stream_options": {"include_usage": True}, **body}
    result = Completion(status=0, sent=time.perf_counter())
    async with session.post(url + "/v1/completions", json=payload) as resp:
        result.status = resp.status
        if resp.status != 200:
            result.raw_lines.append(await resp.text())
            result.end = time.perf_counter()
            return result
        buffer = b""
        async for piece in resp.content.iter_any():
            now = time.perf_counter()
            if result.first_byte is None:
                result.first_byte = now
            buffer += piece
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                _take_line(result, line.decode("utf-8"), now)
        if buffer:
            _take_line(result, buffer.decode("utf-8"), time.perf_counter())
    result.end = time.perf_counter()
    return result


async def complete_plain(session: aiohttp.ClientSession, url: str, prompt: list[int] | str, max_tokens: int,
                         **body: Any) -> Completion:
    """A non-streamed completion (needed for ``prompt_logprobs``, which vLLM refuses on a stream)."""
    payload = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": False,
               **body}
    result = Completion(status=0, sent=time.perf_counter())
    async with session.post(url + "/v1/completions", json=payload) as resp:
        result.status = resp.status
        raw = await resp.text()
    result.end = result.first_byte = result.first_token = result.first_content = time.perf_counter()
    result.raw_lines.append(raw)
    if result.status == 200:
        reply = json.loads(raw)
        result.chunks.append(reply)
        result.text = "".join(c.get("text") or "" for c in reply["choices"])
        result.usage = reply.get("usage")
        result.done = True
    return result


def _take_line(result: Completion, line: str, now: float) -> None:
    result.raw_lines.append(line)
    if not line.startswith("data: "):
        return
    data = line[len("data: "):]
    if data == "[DONE]":
        result.done = True
        return
    chunk = json.loads(data)
    result.chunks.append(chunk)
    for choice in chunk.get("choices") or []:
        if result.first_token is None:
            result.first_token = now
        if choice.get("text"):
            if result.first_content is None:
                result.first_content = now
            result.text += choice["text"]
    if chunk.get("usage"):
        result.usage = chunk["usage"]


def unique_prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(FIRST_ORDINARY_TOKEN, VOCAB_SIZE) for _ in range(n)]


def evicting_fills(num_gpu_blocks: int, victim_blocks: int, evict: int, block_size: int = 32) -> list[int]:
    """Prompt lengths (whole blocks) that, sent after a ``victim_blocks``-block prompt on an idle server,
    evict exactly its last ``evict`` blocks.

    vLLM's block pool: one of ``num_gpu_blocks`` is the reserved null block; a finished request's blocks go
    to the tail of the LRU free queue in reverse order (its last block first), and a new request takes its
    blocks from the head, evicting whatever was cached there. So on an idle server
    ``num_gpu_blocks - 1 - victim_blocks`` blocks stand before the victim's, and every block past those
    evicts one of the victim's, from its end.
    """
    total = num_gpu_blocks - 1 - victim_blocks + evict
    per_prompt = 1024 // block_size
    lengths = [1024] * (total // per_prompt)
    if total % per_prompt:
        lengths.append(total % per_prompt * block_size)
    return lengths


def expected_hits(n_prompt: int, cached_prefix: int, block_size: int = 32) -> int:
    """vLLM's prefix-cache hit for a prompt whose first ``cached_prefix`` tokens are cached in full blocks:
    whole blocks only, and never the last prompt token (it is always recomputed)."""
    usable = min(cached_prefix, n_prompt - 1)
    return usable // block_size * block_size
