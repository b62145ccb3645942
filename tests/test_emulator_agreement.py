"""Agreement with the real vLLM (design D4): block 32, GPU tier only, the request sequences and the
counter deltas measured on vLLM 0.32 on this CPU (docs/vllm-cpu-measurements.md §1), and the SSE framing of
the real sample (``samples/vllm-cpu/sse-completions-stream.txt``)."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from blis_sim.emulator import EmulatorConfig, RunningEmulator, start_emulator

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "vllm-cpu"
KEYS = {
    "queries": ("vllm:prefix_cache_queries_total", ()),
    "hits": ("vllm:prefix_cache_hits_total", ()),
    "device": ("vllm:prompt_tokens_cached_by_source_total", (("source", "device"),)),
    "compute": ("vllm:prompt_tokens_by_source_total", (("source", "local_compute"),)),
    "local": ("vllm:prompt_tokens_by_source_total", (("source", "local_cache_hit"),)),
    "prompt": ("vllm:prompt_tokens_total", ()),
}


@pytest.fixture()
def emu() -> Iterator[RunningEmulator]:
    # As the lane starts the real server: --block-size 32 --num-gpu-blocks-override 512
    # --enable-prompt-tokens-details, tiny model.
    # Counters published at every scrape (stats_interval_s=0), so the windows do not depend on a
    # settle delay on a loaded machine; the interval itself is tested in test_emulator_metrics.py.
    cfg = EmulatorConfig(profile="tiny-cpu", block_size=32, num_gpu_blocks=512,
                         enable_prompt_tokens_details=True, stats_interval_s=0)
    with start_emulator(cfg) as running:
        yield running


class Window:
    """Counter deltas from /metrics between two scrapes."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def scrape(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(self.client.get("/metrics").text):
            for s in fam.samples:
                for key, (name, extra) in KEYS.items():
                    if s.name == name and all(s.labels.get(k) == v for k, v in extra):
                        out[key] = out.get(key, 0.0) + float(s.value)
        return out

    def run(self, prompts: list[list[int]], **body: object) -> tuple[dict[str, int], list[int]]:
        before = self.scrape()
        cached = []
        for p in prompts:
            r = self.client.post("/v1/completions", json={"prompt": p, "max_tokens": 1, **body})
            r.raise_for_status()
            cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        after = self.scrape()
        return {k: int(after[k] - before.get(k, 0)) for k in after}, cached


def unique(base: int, n: int) -> list[int]:
    return list(range(base, base + n))


def test_repeat_1024_hits_992(emu: RunningEmulator) -> None:
    with httpx.Client(base_url=emu.url, timeout=30) as c:
        a = unique(10_000, 1024)
        first, cached_first = Window(c).run([a])
        again, cached_again = Window(c).run([a])
    assert first["queries"] == 1024 and first["hits"] == 0 and cached_first == [0]
    assert again["queries"] == 1024 and again["hits"] == 992 and cached_again == [992]
    assert again["device"] == 992
    assert again["local"] == 992 and again["compute"] == 32 and again["prompt"] == 1024


def test_cached_prefix_with_a_new_suffix_hits_1024(emu: RunningEmulator) -> None:
    with httpx.Client(base_url=emu.url, timeout=30) as c:
        a = unique(20_000, 1024)
        Window(c).run([a])
        deltas, cached = Window(c).run([a + unique(90_000, 50)])
    assert deltas["queries"] == 1074 and deltas["hits"] == 1024 and cached == [1024]


@pytest.mark.parametrize(("n", "repeat_hit"), [(20, 0), (32, 0), (33, 32), (1000, 992), (1025, 1024)])
def test_last_token_rule(emu: RunningEmulator, n: int, repeat_hit: int) -> None:
    # max hit = floor((n - 1) / 32) * 32: a 20-token prompt never hits.
    with httpx.Client(base_url=emu.url, timeout=30) as c:
        p = unique(30_000, n)
        deltas, cached = Window(c).run([p, p])
    assert deltas["queries"] == 2 * n and deltas["hits"] == repeat_hit and cached == [0, repeat_hit]


def test_prompt_logprobs_requests_are_not_counted(emu: RunningEmulator) -> None:
    with httpx.Client(base_url=emu.url, timeout=30) as c:
        a = unique(40_000, 1024)
        Window(c).run([a])
        deltas, cached = Window(c).run([a], prompt_logprobs=1)
    assert deltas["queries"] == 0 and deltas["hits"] == 0
    assert cached == [0]  # the request skipped the prefix cache
    assert deltas["prompt"] == 1024  # but it was still processed


@pytest.mark.parametrize("evicted", [11, 32])
def test_eviction_is_lru_tail_first(emu: RunningEmulator, evicted: int) -> None:
    # 511 usable blocks. The victim's 32 blocks are freed tail first, so they head the LRU queue
    # (tail first) once the 479 never-used blocks are gone: fills of 479 + k blocks evict its last k.
    with httpx.Client(base_url=emu.url, timeout=30) as c:
        victim = unique(50_000, 1024)
        Window(c).run([victim])
        fill_blocks = 479 + evicted
        fills = [unique(100_000 + i * 2048, 1024) for i in range(fill_blocks // 32)]
        if fill_blocks % 32:
            fills.append(unique(1_500_000, (fill_blocks % 32) * 32))
        Window(c).run(fills)
        deltas, cached = Window(c).run([victim])
    expected = min(32 - evicted, 31) * 32
    assert deltas["hits"] == expected and cached == [expected]


def _sse_events(text: str) -> list[str]:
    assert text.endswith("\n\n")
    return [e[len("data: "):] for e in text[:-2].split("\n\n")]


def test_sse_framing_matches_the_real_sample(emu: RunningEmulator) -> None:
    real = _sse_events((SAMPLES / "sse-completions-stream.txt").read_text())
    with httpx.Client(base_url=emu.url, timeout=30) as c:
        r = c.post("/v1/completions", json={"prompt": unique(1, 64), "max_tokens": 8, "stream": True,
                                             "stream_options": {"include_usage": True}})
    ours = _sse_events(r.text)
    assert len(ours) == len(real) == 10  # 8 tokens, usage, [DONE]
    assert ours[-1] == real[-1] == "[DONE]"
    for mine, theirs in zip(ours[:-1], real[:-1]):
        a, b = json.loads(mine), json.loads(theirs)
        assert list(a) == list(b)  # same keys, same order
        assert [list(ch) for ch in a["choices"]] == [list(ch) for ch in b["choices"]]
        assert a["id"].startswith("cmpl-") and len(a["id"]) == len(b["id"])
        assert mine == json.dumps(a, separators=(",", ":"), ensure_ascii=False)  # compact, like vLLM
    usage_real, usage_ours = json.loads(real[-2])["usage"], json.loads(ours[-2])["usage"]
    assert list(usage_ours)[:3] == list(usage_real)  # plus prompt_tokens_details when enabled
    assert [json.loads(e)["choices"][0]["finish_reason"] for e in ours[:8]] == \
        [json.loads(e)["choices"][0]["finish_reason"] for e in real[:8]]


def test_metrics_sample_window_is_read_the_same_way() -> None:
    # The deltas the Window helper computes from the real before/after files: 29696 / 48579.
    def parse(path: Path) -> dict[str, float]:
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(path.read_text()):
            for s in fam.samples:
                for key, (name, extra) in KEYS.items():
                    if s.name == name and all(s.labels.get(k) == v for k, v in extra):
                        out[key] = out.get(key, 0.0) + float(s.value)
        return out

    before, after = parse(SAMPLES / "metrics-before.txt"), parse(SAMPLES / "metrics-after.txt")
    delta = {k: after[k] - before[k] for k in after}
    assert delta["queries"] == 48579 and delta["hits"] == 29696 == delta["device"] == delta["local"]
    assert delta["compute"] + delta["local"] == delta["prompt"]
