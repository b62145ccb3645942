"""Emulator benchmark: throughput of short streaming requests, and TTFT accuracy at low load.

    python benchmarks/bench_emulator.py [--requests 3000] [--concurrency 32] [--ttft-requests 200]

1. Throughput: the emulator runs in a subprocess pinned to one core (CPU 0; the client takes the
   other cores), step-time profile ``zero``; an aiohttp client sends ``--requests`` streaming
   completions (64 prompt tokens as ids, 8 output tokens, ``include_usage``) at ``--concurrency``.
   Prints requests/s (wall) and the server's CPU time per request (so the one-core ceiling is
   ``1 / cpu_per_request`` even on a busy machine), and checks the counters: prefix-cache queries,
   generation tokens and ``request_success{length}`` must equal what was sent. Target: >= 300 req/s.
2. TTFT at low load: profile ``tiny-cpu`` without noise, one request at a time, 64-token unique
   prompts: client TTFT (first content chunk) and the server's own TTFT (``usage.metrics`` with
   ``--enable-per-request-metrics``: first token - scheduling) minus the model's step time for that
   prefill (7.43 ms). Target: within 2 ms.

Prints wall time and peak RSS (server and client). Figures depend on machine load: run it on a quiet
machine, twice, and quote both runs.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from blis_sim.emulator import EmulatorConfig, spawn_emulator  # noqa: E402
from blis_sim.emulator.profiles import get_profile  # noqa: E402


def counters(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + (f"[{s.labels['finished_reason']}]" if "finished_reason" in s.labels else "")
            out[key] = out.get(key, 0.0) + float(s.value)
    return out


async def stream_one(session: aiohttp.ClientSession, url: str, prompt: list[int], max_tokens: int,
                     server_ttft: list[float] | None = None) -> tuple[float, int]:
    """(client TTFT in s, completion tokens) of one streaming completion; appends the server's own
    TTFT (``usage.metrics``, with --enable-per-request-metrics) to ``server_ttft``."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = -1.0
    tokens = 0
    async with session.post(url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if ttft < 0 and chunk["choices"] and chunk["choices"][0]["text"]:
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
                if server_ttft is not None and "metrics" in chunk["usage"]:
                    server_ttft.append(chunk["usage"]["metrics"]["time_to_first_token_ms"] / 1000)
    return ttft, tokens


async def throughput(url: str, n: int, concurrency: int) -> tuple[float, int]:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        # Warm-up (not counted in the window below? it is: the counters check includes it).
        await stream_one(session, url, list(range(1, 65)), 8)
        queue = iter(range(n))
        done = 0

        async def worker() -> None:
            nonlocal done
            for i in queue:
                base = 10_000 + i * 64
                _, tokens = await stream_one(session, url, list(range(base, base + 64)), 8)
                assert tokens == 8
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0, done


async def ttft_low_load(url: str, n: int) -> tuple[list[float], list[float]]:
    """(client TTFTs, server TTFTs from scheduling) of ``n`` sequential requests after a warm-up."""
    async with aiohttp.ClientSession() as session:
        for i in range(5):  # warm-up: first requests on a fresh server are slower
            await stream_one(session, url, list(range(900_000 + i * 64, 900_064 + i * 64)), 8)
        client: list[float] = []
        server: list[float] = []
        for i in range(n):
            base = 20_000 + i * 64
            ttft, _ = await stream_one(session, url, list(range(base, base + 64)), 8, server)
            client.append(ttft)
            await asyncio.sleep(0.005)
        return client, server


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--ttft-requests", type=int, default=200)
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    t_start = time.perf_counter()

    # 1. Throughput, server pinned to one core.
    with spawn_emulator(EmulatorConfig(profile="zero", block_size=16, num_gpu_blocks=65536)) as proc:
        server = psutil.Process(proc.pid)
        if len(cores) > 1:
            server.cpu_affinity([cores[0]])
            os.sched_setaffinity(0, cores[1:])
        cpu0 = server.cpu_times()
        wall, done = asyncio.run(throughput(proc.url, args.requests, args.concurrency))
        cpu1 = server.cpu_times()
        time.sleep(0.3)  # counters publish every 50 ms
        import httpx
        c = counters(httpx.get(proc.url + "/metrics", timeout=10).text)
        server_rss = server.memory_info().rss
    os.sched_setaffinity(0, cores)
    sent = done + 1  # + warm-up
    cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    ok = (c["vllm:prefix_cache_queries_total"] == 64 * sent
          and c["vllm:generation_tokens_total"] == 8 * sent
          and c["vllm:request_success_total[length]"] == sent)
    print(f"throughput: {done} streaming requests (64 in / 8 out) at concurrency {args.concurrency}, "
          f"server on 1 core: {done / wall:.0f} req/s wall; server CPU {1000 * cpu / done:.2f} ms/request "
          f"(one-core ceiling {done / cpu:.0f} req/s); counters {'correct' if ok else 'WRONG'} "
          f"(queries {c['vllm:prefix_cache_queries_total']:.0f}, generation "
          f"{c['vllm:generation_tokens_total']:.0f}, success {c['vllm:request_success_total[length]']:.0f}); "
          f"server RSS {server_rss / 2**20:.0f} MiB")

    # 2. TTFT accuracy at low load.
    model = get_profile("tiny-cpu").step_seconds(64, 0, 0)
    cfg = EmulatorConfig(profile="tiny-cpu", step_noise=0.0, enable_per_request_metrics=True)
    with spawn_emulator(cfg) as proc:
        ttfts, server = asyncio.run(ttft_low_load(proc.url, args.ttft_requests))
    over = [1000 * (t - model) for t in ttfts]
    server_over = [1000 * (t - model) for t in server]
    print(f"ttft: model {1000 * model:.2f} ms over {len(ttfts)} sequential requests; client TTFT - model: "
          f"p50 {pct(over, 50):+.2f} ms, p90 {pct(over, 90):+.2f} ms, p99 {pct(over, 99):+.2f} ms; "
          f"server TTFT (from scheduling, usage.metrics) - model: p50 {pct(server_over, 50):+.2f} ms, "
          f"p90 {pct(server_over, 90):+.2f} ms")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"wall {time.perf_counter() - t_start:.1f} s, client peak RSS {peak:.0f} MiB, "
          f"load average {os.getloadavg()[0]:.1f} on {len(cores)} cores")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
