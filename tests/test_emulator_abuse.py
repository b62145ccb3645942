"""The emulator's HTTP server under abuse (issue 14): 1000 held connections (idle and half-open), fuzzed
requests and well-formed completions at once. It keeps answering ``/health`` quickly, answers or drops every
malformed request without dying, and loses no counter update.

Latency on a shared 2-core host: the emulator runs in its own process (as in use) and ``/health`` is probed
every 20 ms on its own connection *while* the abuse goes on. The requirement is 50 ms; the test checks it on
the median probe, so a single scheduler stall of the loaded CI host cannot fail it, while a server whose loop
is blocked by the abuse (every probe slow) does. Every probe must be answered. The distribution (p50, p99,
max) is measured by benchmarks/bench_emulator_abuse.py and recorded in docs/reliability.md.
"""
from __future__ import annotations

import asyncio
import statistics

import httpx
from prometheus_client.parser import text_string_to_metric_families

from blis_sim.emulator import EmulatorConfig, spawn_emulator
from emulator_abuse import abuse


def _counters(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in ("http_requests_total", "vllm:request_success_total"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _delta(before: dict, after: dict, name: str, **labels: str) -> float:
    def total(snap: dict) -> float:
        return sum(v for (n, lab), v in snap.items()
                   if n == name and all(dict(lab).get(k) == want for k, want in labels.items()))
    return total(after) - total(before)


def test_health_stays_fast_and_no_counter_is_lost_under_abuse() -> None:
    with spawn_emulator(EmulatorConfig(profile="zero", stats_interval_s=0)) as emu:
        before = _counters(emu.url)
        res = asyncio.run(abuse(emu.url, connections=1000, fuzzed=200, valid=40, seed=1))
        assert emu.alive
        after = _counters(emu.url)
        assert httpx.get(emu.url + "/health", timeout=5).status_code == 200
    assert res.held == 1000
    assert res.health_failures == 0 and len(res.health_ms) >= 10
    assert statistics.median(res.health_ms) <= 50.0, sorted(res.health_ms)
    assert res.valid_ok == 40
    # every completion answer the clients read is in the server's counters, and nothing else is
    for cls in ("2xx", "4xx", "5xx"):
        got = _delta(before, after, "http_requests_total", handler="/v1/completions", status=cls)
        assert got == res.completions[cls], (cls, got, res.completions)
    assert _delta(before, after, "vllm:request_success_total") == res.completions["2xx"]


def test_a_negative_chunk_size_or_length_is_a_400_not_a_stuck_loop() -> None:
    """``-6`` parsed as hex walked the chunk decoder back onto its own size line: the server's loop spun."""
    from emulator_abuse import _one

    with spawn_emulator(EmulatorConfig(profile="zero", stats_interval_s=0)) as emu:
        host, port = emu.url.rsplit("//", 1)[1].split(":")
        for bad in (b"Transfer-Encoding: chunked\r\n\r\n-6\r\n{}\r\n0\r\n\r\n",
                    b"Content-Length: -1\r\n\r\n{}", b"Content-Length: +2\r\n\r\n{}"):
            status = asyncio.run(_one(host, int(port), b"POST /v1/completions HTTP/1.1\r\n" + bad, 10))
            assert status == 400, bad
        assert httpx.get(emu.url + "/health", timeout=5).status_code == 200
