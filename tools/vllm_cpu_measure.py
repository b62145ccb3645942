"""Measure a real vLLM server's prefix-cache counters and timing for docs/vllm-cpu-measurements.md.

    python tools/vllm_cpu_measure.py [--url URL] [--json out.json] [--markdown out.md] [--seed N]

Without ``--url`` it uses the server recorded by ``tools/vllm_cpu.py start``. Every sequence uses token-id
prompts (exact lengths) drawn from a seeded RNG mixed with a per-run nonce, so nothing is cached beforehand
even on a server that has already served this script. Each step is bracketed by ``/metrics`` scrapes with a
settle wait (the engine publishes its stats every 0.1-1 s), and records the counter deltas, each request's
``usage.prompt_tokens_details.cached_tokens``, the server-side TTFT histogram delta and the client TTFT.

Sequences (docs/vllm-cpu-measurements.md §1): a 1024-token prompt twice; its 1024 tokens + a new 50-token
suffix; 1025, 1000 and 20
tokens each twice; a repeat of a cached prompt with ``prompt_logprobs``; the eviction curve with the small GPU
cache (a victim prompt, then distinct prompts sized to evict e of its blocks, then the victim again); then TTFT
against prompt length (64-2048 tokens, cold and prefix-cached, 8 requests each); then timing of a short request (64 prompt
tokens, 8 output tokens) at concurrency 1 and 4.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

HERE = Path(__file__).resolve().parent


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


client = _load("vllm_cpu_client")
SETTLE_S = 1.2  # > the engine's stats interval, so the closing scrape holds every request of the step


async def step(session: aiohttp.ClientSession, url: str, name: str, prompts: list[list[int]], *,
               max_tokens: int = 1, expect: list[int] | None = None, stream: bool = True,
               **body: Any) -> dict[str, Any]:
    """Send ``prompts`` one after another inside one counter window (client TTFT = E2E when not streamed)."""
    how = client.complete if stream else client.complete_plain
    before = await client.scrape(session, url)
    done = [await how(session, url, p, max_tokens, **body) for p in prompts]
    await asyncio.sleep(SETTLE_S)
    after = await client.scrape(session, url)
    for c in done:
        assert c.status == 200 and c.done, f"{name}: status {c.status}: {c.raw_lines[-1:]}"
    n, ttft_sum = after.ttft_delta(before)
    return {"step": name, "prompt_lens": [len(p) for p in prompts], "expected_hits": expect,
            "cached_tokens": [c.cached_tokens for c in done],
            "prompt_tokens": [c.usage["prompt_tokens"] for c in done],
            "client_ttft_ms": [round(c.ttft * 1e3, 2) for c in done],
            "server_ttft_requests": n, "server_ttft_mean_ms": round(ttft_sum / n * 1e3, 2) if n else None,
            "deltas": after.kv_deltas(before)}


async def counter_sequences(session: aiohttp.ClientSession, url: str, rng: random.Random) -> list[dict[str, Any]]:
    hits = client.expected_hits
    out = []
    a = client.unique_prompt(rng, 1024)
    out.append(await step(session, url, "1024 twice", [a, a], expect=[0, hits(1024, 1024)]))
    suffix = a + client.unique_prompt(rng, 50)
    out.append(await step(session, url, "1024 cached + new 50-token suffix", [suffix], expect=[hits(1074, 1024)]))
    for n in (1025, 1000, 20):
        p = client.unique_prompt(rng, n)
        out.append(await step(session, url, f"{n} twice", [p, p], expect=[0, hits(n, n)]))
    out.append(await step(session, url, "cached 1024 with prompt_logprobs=1", [a], expect=[0], stream=False,
                          prompt_logprobs=1))  # vLLM refuses prompt_logprobs on a stream
    out.append(await step(session, url, "cached 1024 again, plain", [a], expect=[hits(1024, 1024)]))
    return out


async def eviction_curve(session: aiohttp.ClientSession, url: str, rng: random.Random, num_gpu_blocks: int,
                         evictions: tuple[int, ...]) -> list[dict[str, Any]]:
    """A victim 1024-token prompt, then distinct prompts sized to evict exactly ``e`` of its 32 blocks
    (``client.evicting_fills``: LRU, reverse-order freeing, one null block), then the victim again."""
    out = []
    for evicted in evictions:
        victim = client.unique_prompt(rng, 1024)
        await step(session, url, "victim", [victim])
        lengths = client.evicting_fills(num_gpu_blocks, 32, evicted)
        await step(session, url, "fills", [client.unique_prompt(rng, n) for n in lengths])
        kept = (32 - evicted) * 32
        result = await step(session, url, f"victim after fills meant to evict {evicted} of its 32 blocks "
                            f"({len(lengths)} prompts, {sum(lengths)} tokens)", [victim],
                            expect=[client.expected_hits(1024, kept)])
        result["evicted"] = evicted
        out.append(result)
    return out


async def prefill_sweep(session: aiohttp.ClientSession, url: str, rng: random.Random,
                        lengths: tuple[int, ...] = (64, 256, 1024, 2048), reps: int = 8) -> list[dict[str, Any]]:
    """TTFT against prompt length, cold (distinct prompts) and prefix-cached (the same prompts again), one at a
    time, 1 output token: the data a step-time model's per-prefill-token term is fitted to."""
    out = []
    for n in lengths:
        prompts = [client.unique_prompt(rng, n) for _ in range(reps)]
        for state in ("cold", "cached"):
            s = await step(session, url, f"{n} {state}", prompts)
            ttft = sorted(s["client_ttft_ms"])
            out.append({"prompt_tokens": n, "state": state, "requests": reps,
                        "hits_per_request": s["deltas"]["prefix_cache_hits"] // reps,
                        "server_ttft_mean_ms": s["server_ttft_mean_ms"],
                        "client_ttft_median_ms": round(statistics.median(ttft), 2),
                        "client_ttft_min_ms": ttft[0], "client_ttft_max_ms": ttft[-1]})
    return out


async def timing(session: aiohttp.ClientSession, url: str, rng: random.Random, concurrency: int,
                 requests: int, prompt_len: int = 64, max_tokens: int = 8) -> dict[str, Any]:
    prompts = [client.unique_prompt(rng, prompt_len) for _ in range(requests)]
    queue: asyncio.Queue[list[int]] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    results: list[Any] = []

    async def worker() -> None:
        while not queue.empty():
            p = queue.get_nowait()
            results.append(await client.complete(session, url, p, max_tokens, ignore_eos=True))

    before = await client.scrape(session, url)
    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - began
    await asyncio.sleep(SETTLE_S)
    after = await client.scrape(session, url)
    n, ttft_sum = after.ttft_delta(before)
    ttft = sorted(c.ttft * 1e3 for c in results)
    e2e = sorted(c.e2e * 1e3 for c in results)
    itl = [(c.e2e - c.ttft) * 1e3 / (max_tokens - 1) for c in results]
    out_tokens = {c.usage["completion_tokens"] for c in results}
    return {"concurrency": concurrency, "requests": requests, "prompt_tokens": prompt_len,
            "output_tokens": sorted(out_tokens), "wall_s": round(wall, 3), "req_per_s": round(requests / wall, 1),
            "client_ttft_ms": {"median": round(statistics.median(ttft), 2), "p10": round(ttft[len(ttft) // 10], 2),
                               "p90": round(ttft[len(ttft) * 9 // 10], 2)},
            "client_e2e_ms": {"median": round(statistics.median(e2e), 2), "p90": round(e2e[len(e2e) * 9 // 10], 2)},
            "client_itl_ms_median": round(statistics.median(itl), 2),
            "server_ttft_mean_ms": round(ttft_sum / n * 1e3, 2) if n else None, "server_ttft_requests": n}


async def measure(url: str, seed: int, fills: tuple[int, ...]) -> dict[str, Any]:
    load_before = os.getloadavg()
    rng = random.Random(f"{seed}-{time.time_ns()}")
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.get(url + "/version") as resp:
            version = (await resp.json())["version"]
        snap = await client.scrape(session, url)
        config = snap.labels_of("vllm:cache_config_info")[0]
        await client.complete(session, url, client.unique_prompt(rng, 16), 2)  # warm the path once
        await asyncio.sleep(SETTLE_S)  # ... and keep it out of the first counter window
        sequences = await counter_sequences(session, url, rng)
        curve = await eviction_curve(session, url, rng, int(config["num_gpu_blocks"]), fills)
        sweep = await prefill_sweep(session, url, rng)
        timings = [await timing(session, url, rng, 1, 40), await timing(session, url, rng, 4, 80)]
    return {"url": url, "vllm_version": version, "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "cache_config": {k: config[k] for k in ("block_size", "num_gpu_blocks", "enable_prefix_caching")
                             if k in config},
            "sequences": sequences, "eviction": curve, "prefill_sweep": sweep, "timing": timings}


def render_markdown(m: dict[str, Any]) -> str:
    lines = [f"vLLM {m['vllm_version']}, cache_config_info {m['cache_config']}; load average (1/5/15 min) "
             f"{m['loadavg_before']} before, {m['loadavg_after']} after", "",
             "| step | prompt lens | expected hits | cached_tokens | prefix queries | prefix hits | "
             "cached_by_source[device] | by_source local_compute / local_cache_hit | server TTFT mean (n) | "
             "client TTFT |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in [*m["sequences"], *m["eviction"]]:
        d = s["deltas"]
        lines.append(
            f"| {s['step']} | {s['prompt_lens']} | {s['expected_hits']} | {s['cached_tokens']} | "
            f"{d['prefix_cache_queries']} | {d['prefix_cache_hits']} | {d['prompt_tokens_cached_by_source[device]']} | "
            f"{d['prompt_tokens_by_source[local_compute]']} / {d['prompt_tokens_by_source[local_cache_hit]']} | "
            f"{s['server_ttft_mean_ms']} ms ({s['server_ttft_requests']}) | {s['client_ttft_ms']} ms |")
    lines += ["", "| prompt tokens | cache | requests | hits/request | server TTFT mean | "
              "client TTFT median (min-max) |",
              "|---|---|---|---|---|---|"]
    for r in m.get("prefill_sweep", []):
        lines.append(f"| {r['prompt_tokens']} | {r['state']} | {r['requests']} | {r['hits_per_request']} | "
                     f"{r['server_ttft_mean_ms']} ms | {r['client_ttft_median_ms']} ms ({r['client_ttft_min_ms']}-"
                     f"{r['client_ttft_max_ms']}) |")
    lines += ["", "| concurrency | requests | req/s | client TTFT median (p10-p90) | client E2E median | "
              "ITL median | server TTFT mean |", "|---|---|---|---|---|---|---|"]
    for t in m["timing"]:
        c = t["client_ttft_ms"]
        lines.append(f"| {t['concurrency']} | {t['requests']} | {t['req_per_s']} | {c['median']} ms "
                     f"({c['p10']}-{c['p90']}) | {t['client_e2e_ms']['median']} ms | {t['client_itl_ms_median']} ms | "
                     f"{t['server_ttft_mean_ms']} ms |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="default: the server recorded by tools/vllm_cpu.py start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--evict", default="0,1,2,11,25,31,32",
                        help="eviction curve: how many of the victim's 32 blocks the fills should evict")
    parser.add_argument("--json", type=Path, help="write the raw measurements here")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    args = parser.parse_args(argv)
    url = args.url
    lane = _load("vllm_cpu")
    if url is None:
        state, healthy = lane.server_status()
        if not healthy:
            print("no healthy server recorded: run `python tools/vllm_cpu.py start` or pass --url", file=sys.stderr)
            return 2
        url = state.url
    fills = tuple(int(k) for k in args.evict.split(","))
    with lane.counters_locked():  # no other lane client's traffic in these windows (tests/vllm take it too)
        result = asyncio.run(measure(url.rstrip("/"), args.seed, fills))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    md = render_markdown(result)
    if args.markdown:
        args.markdown.write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
