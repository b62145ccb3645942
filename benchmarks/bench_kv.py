"""Benchmark of the KV core (blis_sim.kv): prints rates for the Cython core and the pure twin.

    python benchmarks/bench_kv.py [--backend cython|python|both] [--seconds 1.0]

Measured, per backend (best of 3 timed rounds of about ``--seconds`` each, wall clock):

* GPU block lookups/s on the hit path: ``BlockPool.lookup`` over a cached 1024-token prompt
  (64 blocks of 16 per call, every block a hit) — the core's batch API;
* GPU allocate+free/s in blocks: ``BlockPool.allocate`` of 64 fresh blocks then ``free``, which
  recycles them through the free queue and evicts their hashes;
* full request path (requests/s): ``KVCache`` add_request + lookup + admit + computed + free of a
  1024-token prompt sharing a 512-token prefix, GPU only;
* offload path (chunks/s): the same through a CPU tier and an fs tier: each request stores its 64
  chunks write-through and cascades them, then a repeat of an earlier prompt is looked up and
  loaded from the CPU (GPU evicted) — chunks stored+looked up per second;
* peak RSS of the process (``resource.getrusage``) at the end.

Floors (issue 3, Cython core, 2-core machine): ≥ 5 M block lookups/s, ≥ 2 M allocate+free/s.
The machine is shared: figures vary by ±30 % between runs.
"""
from __future__ import annotations

import argparse
import resource
import time
from collections.abc import Callable

import numpy as np

from blis_sim.kv import (CpuTierConfig, FsTierConfig, KVCache, KVConfig, TierStation,
                         load_core)

BS = 16
PROMPT = 1024


def rate(fn: Callable[[], int], seconds: float) -> float:
    """Best of three rounds of ``fn`` (which returns the units it processed) per second."""
    best = 0.0
    for _ in range(3):
        done, t0 = 0, time.perf_counter()
        while True:
            done += fn()
            dt = time.perf_counter() - t0
            if dt >= seconds:
                break
        best = max(best, done / dt)
    return best


def bench_pool(backend: str, seconds: float) -> dict[str, float]:
    core, _ = load_core(backend)
    pool = core.BlockPool(4096, BS, True)
    hashes = core.hash_blocks(np.arange(PROMPT), BS)
    nb = len(hashes)
    pool.allocate(1, hashes, 0, PROMPT)
    pool.cache(1, hashes, nb)
    pool.free(1)

    def lookups() -> int:
        for _ in range(100):
            pool.lookup(hashes, nb)
        return 100 * nb

    fresh = core.hash_blocks(np.arange(PROMPT) + 10**6, BS)
    rid = [10]

    def alloc_free() -> int:
        for _ in range(100):
            r = rid[0] = rid[0] + 1
            pool.allocate(r, fresh, 0, PROMPT)
            pool.free(r)
        return 100 * nb

    assert pool.lookup(hashes, nb) == nb
    return {"block lookups/s": rate(lookups, seconds),
            "allocate+free blocks/s": rate(alloc_free, seconds)}


def bench_requests(backend: str, seconds: float) -> dict[str, float]:
    cache = KVCache(KVConfig(num_gpu_blocks=2048, block_size=BS), backend=backend)
    core, _ = load_core(backend)
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 50000, 512)
    prompts = [core.hash_blocks(np.concatenate([prefix, rng.integers(0, 50000, 512)]), BS)
               for _ in range(64)]
    rid = [0]

    def serve() -> int:
        for i in range(20):
            r = rid[0] = rid[0] + 1
            cache.add_request(r, prompts[(r + i) % 64], PROMPT)
            lk = cache.lookup(r, float(r))
            cache.admit(r, PROMPT - lk.gpu_tokens, float(r))
            cache.computed(r, float(r) + 1)
            cache.free(r)
        return 20

    return {"requests/s (GPU only)": rate(serve, seconds)}


def bench_offload(backend: str, seconds: float) -> dict[str, float]:
    cfg = KVConfig(num_gpu_blocks=100, block_size=BS, bytes_per_block=131072,
                   cpu=CpuTierConfig(num_chunks=4096, link=TierStation()),
                   fs_tiers=(FsTierConfig(max_bytes=16384 * 131072),))
    cache = KVCache(cfg, backend=backend)
    core, _ = load_core(backend)
    rng = np.random.default_rng(1)
    rid = [0]
    now = [0.0]
    recent: list[np.ndarray] = []

    def cycle() -> int:
        chunks = 0
        for _ in range(10):
            r = rid[0] = rid[0] + 1
            now[0] += 1e5
            if recent and r % 2 == 0:
                h = recent[r % len(recent)]  # repeat: GPU evicted, CPU hit → load
            else:
                h = core.hash_blocks(rng.integers(0, 50000, PROMPT), BS)
                recent.append(h)
                del recent[:-16]
            cache.add_request(r, h, PROMPT)
            lk = cache.lookup(r, now[0])
            adm = cache.admit(r, 0 if lk.external_tokens else PROMPT - lk.gpu_tokens, now[0])
            assert adm is not None
            if lk.external_tokens:
                cache.allocate(r, PROMPT - adm.num_computed_tokens)
            cache.computed(r, adm.load_ready_time + 1)
            cache.free(r)
            chunks += PROMPT // BS
        return chunks

    out = {"offload chunks stored+looked up/s": rate(cycle, seconds)}
    snap = cache.snapshot()["tiers"]
    assert snap["0:primary"]["chunk_hits"] > 0 and snap["1:fs"]["stored_chunks"] > 0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cython", "python", "both"], default="both")
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    backends = ["cython", "python"] if args.backend == "both" else [args.backend]
    t0 = time.perf_counter()
    for backend in backends:
        try:
            load_core(backend)
        except ImportError:
            print(f"{backend}: not built (python setup.py build_ext --inplace)")
            continue
        figures = {}
        for bench in (bench_pool, bench_requests, bench_offload):
            figures.update(bench(backend, args.seconds))
        for name, value in figures.items():
            print(f"{backend:7s} {name:38s} {value / 1e6:10.3f} M" if value >= 1e5
                  else f"{backend:7s} {name:38s} {value:12,.0f}")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"wall time {time.perf_counter() - t0:.1f} s, peak RSS {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
