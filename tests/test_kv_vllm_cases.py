"""blis_sim.kv against the behaviour measured on a real vLLM (0.32, docs/vllm-cpu.md)
and the semantics of docs/vllm-semantics.md §2–§4, on both backends."""
from __future__ import annotations

import numpy as np
import pytest

from blis_sim import _backend
from blis_sim.kv import (CpuTierConfig, FsTierConfig, KVCache, KVConfig, TierStation,
                         hash_blocks)


def _cython_available() -> bool:
    try:
        import blis_sim.kv._core  # noqa: F401
    except ImportError:
        return False
    return True


BACKENDS = [
    pytest.param("python", id="python"),
    pytest.param("cython", id="cython", marks=pytest.mark.skipif(
        not _cython_available() and not _backend.ext_required(),
        reason="Cython KV core not built (python setup.py build_ext --inplace)")),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


def tokens(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 8000, n)


def serve(cache: KVCache, rid: int, toks: np.ndarray, now: float = 0.0, *,
          skip: bool = False) -> int:
    """One request through admission, one full prefill step, and finish: its GPU hit tokens."""
    bs = cache.block_size
    cache.add_request(rid, hash_blocks(toks, bs), len(toks), skip_prefix_cache=skip)
    lk = cache.lookup(rid, now)
    adm = cache.admit(rid, len(toks) - lk.gpu_tokens, now)
    assert adm is not None
    cache.computed(rid, now + 1.0)
    cache.free(rid)
    return lk.gpu_tokens


def repeat_hits(backend: str, block_size: int, first: np.ndarray, second: np.ndarray) -> int:
    cache = KVCache(KVConfig(num_gpu_blocks=1000, block_size=block_size), backend=backend)
    serve(cache, 1, first)
    before = cache.snapshot()["prefix_cache_hits"]
    serve(cache, 2, second)
    snap = cache.snapshot()
    assert snap["prefix_cache_queries"] == len(first) + len(second)
    cache.check_invariants()
    return snap["prefix_cache_hits"] - before


def test_1024_repeat_at_block_32_hits_992(backend: str) -> None:
    p = tokens(1024, 1)
    assert repeat_hits(backend, 32, p, p) == 992


def test_shared_1024_prefix_with_new_suffix_hits_1024(backend: str) -> None:
    p = tokens(1024, 2)
    assert repeat_hits(backend, 32, p, np.concatenate([p, tokens(50, 3)])) == 1024


def test_1025_repeat_hits_1024(backend: str) -> None:
    p = tokens(1025, 4)
    assert repeat_hits(backend, 32, p, p) == 1024


def test_1000_repeat_hits_992(backend: str) -> None:
    p = tokens(1000, 5)
    assert repeat_hits(backend, 32, p, p) == 992


def test_20_tokens_never_hit(backend: str) -> None:
    p = tokens(20, 6)
    assert repeat_hits(backend, 32, p, p) == 0


def test_1024_repeat_at_block_16_hits_1008(backend: str) -> None:
    p = tokens(1024, 7)
    assert repeat_hits(backend, 16, p, p) == 1008


def test_prompt_logprobs_requests_are_not_counted_and_do_not_hit(backend: str) -> None:
    cache = KVCache(KVConfig(num_gpu_blocks=200, block_size=16), backend=backend)
    p = tokens(256, 8)
    serve(cache, 1, p)
    assert serve(cache, 2, p, skip=True) == 0
    snap = cache.snapshot()
    assert snap["prefix_cache_queries"] == 256 and snap["prefix_cache_hits"] == 0


def test_failed_admission_counts_nothing_and_changes_nothing(backend: str) -> None:
    cache = KVCache(KVConfig(num_gpu_blocks=9, block_size=16), backend=backend)  # 8 usable
    cache.add_request(1, hash_blocks(tokens(100, 9), 16), 100)
    cache.lookup(1, 0.0)
    assert cache.admit(1, 100, 0.0) is not None  # 7 blocks
    cache.add_request(2, hash_blocks(tokens(40, 10), 16), 40)
    state = cache.state()
    cache.lookup(2, 0.0)
    assert cache.admit(2, 40, 0.0) is None  # needs 3, 1 free
    assert cache.state() == state
    assert cache.snapshot()["prefix_cache_queries"] == 100


def test_preempted_readmission_is_not_counted_again(backend: str) -> None:
    cache = KVCache(KVConfig(num_gpu_blocks=100, block_size=16), backend=backend)
    p = tokens(160, 11)
    cache.add_request(1, hash_blocks(p, 16), 160)
    cache.lookup(1, 0.0)
    cache.admit(1, 160, 0.0)
    cache.allocate(1, 1)  # one decode token
    cache.preempt(1)
    lk = cache.lookup(1, 5.0)
    assert lk.gpu_tokens == 160  # its own blocks kept their hashes on the free queue
    assert cache.admit(1, 161 - 160, 5.0) is not None
    snap = cache.snapshot()
    assert snap["prefix_cache_queries"] == 160 and snap["prefix_cache_hits"] == 0
    assert snap["preempted_queries"] == 161 and snap["preempted_hits"] == 160
    assert cache.cached_by_source(1) == {"device": 0, "host": 0, "disk": 0}


def test_shared_blocks_are_reference_counted(backend: str) -> None:
    cache = KVCache(KVConfig(num_gpu_blocks=100, block_size=16), backend=backend)
    p = tokens(64, 12)
    for rid in (1, 2):
        cache.add_request(rid, hash_blocks(p, 16), 64)
        lk = cache.lookup(rid, 0.0)
        assert cache.admit(rid, 64 - lk.gpu_tokens, 0.0) is not None
    pool = cache.state()["pool"]
    shared = pool["requests"][1][:3]
    assert pool["requests"][2][:3] == shared
    assert [pool["ref"][b] for b in shared] == [2, 2, 2]
    cache.free(1)
    pool = cache.state()["pool"]
    assert [pool["ref"][b] for b in shared] == [1, 1, 1]
    assert not set(shared) & set(pool["free_queue"])
    cache.check_invariants()


def test_free_order_and_lru_eviction(backend: str) -> None:
    """Freed hashed blocks go to the back tail-first; hashless ones to the front; allocation
    takes the front, evicting the least recently freed hash first."""
    cache = KVCache(KVConfig(num_gpu_blocks=11, block_size=4), backend=backend)  # 10 usable
    a, b = tokens(12, 13), tokens(12, 14)  # 3 full blocks each
    cache.add_request(1, hash_blocks(a, 4), 12)
    cache.lookup(1, 0.0)
    cache.admit(1, 12, 0.0)
    cache.add_request(2, hash_blocks(b, 4), 10)  # 2 full blocks + a partial one
    cache.lookup(2, 0.0)
    cache.admit(2, 10, 0.0)
    blocks1 = cache.state()["pool"]["requests"][1]
    blocks2 = cache.state()["pool"]["requests"][2]
    cache.free(1)
    cache.free(2)
    queue = cache.state()["pool"]["free_queue"]
    # front: request 2's hashless partial block; back: 1's blocks tail first, then 2's hashed ones
    assert queue[0] == blocks2[2]
    assert queue[-5:] == blocks1[::-1] + blocks2[1::-1]
    # Allocating the free blocks that never held a hash, then one more, evicts the oldest hash:
    # request 1's tail block, so request 1's prefix lookup now stops before it.
    fresh = len(queue) - 5
    cache.add_request(3, None, 4 * (fresh + 1))
    cache.lookup(3, 0.0)
    assert cache.admit(3, 4 * (fresh + 1), 0.0) is not None
    cache.add_request(4, hash_blocks(a, 4), 12)
    assert cache.lookup(4, 0.0).gpu_tokens == 8
    assert cache.snapshot()["gpu_evictions"] == 1
    cache.check_invariants()


def test_usage_is_vllms_kv_cache_usage_perc(backend: str) -> None:
    cache = KVCache(KVConfig(num_gpu_blocks=5, block_size=16), backend=backend)
    cache.add_request(1, None, 32)
    cache.lookup(1, 0.0)
    cache.admit(1, 32, 0.0)
    assert cache.usage() == pytest.approx(0.5)  # 2 of 4 usable blocks (block 0 is the null block)


# --------------------------------------------------------------------------- offload tiers
def offload_cache(backend: str, *, cpu_chunks: int = 1000, gpu_blocks: int = 200,
                  fs: bool = False, policy: str = "lru", prompt_only: bool = True,
                  threshold: int = 0, bpc: int = 1) -> KVCache:
    cfg = KVConfig(num_gpu_blocks=gpu_blocks, block_size=16, blocks_per_chunk=bpc,
                   bytes_per_block=16000, offload_prompt_only=prompt_only,
                   cpu=CpuTierConfig(num_chunks=cpu_chunks, eviction_policy=policy,
                                     store_threshold=threshold,
                                     link=TierStation(read_bandwidth=1000.0,
                                                      write_bandwidth=1000.0, base_latency=5.0)),
                   fs_tiers=(FsTierConfig(station=TierStation(
                       read_bandwidth=100.0, write_bandwidth=100.0, base_latency=50.0,
                       n_read_threads=2, n_write_threads=2)),) if fs else ())
    return KVCache(cfg, backend=backend)


def run_request(cache: KVCache, rid: int, toks: np.ndarray, now: float,
                decode: int = 0) -> tuple:
    cache.add_request(rid, hash_blocks(toks, 16), len(toks))
    lk = cache.lookup(rid, now)
    adm = cache.admit(rid, 0 if lk.external_tokens else len(toks) - lk.gpu_tokens, now)
    assert adm is not None
    t = adm.load_ready_time
    if lk.external_tokens:
        assert cache.allocate(rid, len(toks) - adm.num_computed_tokens)
    cache.computed(rid, t + 10.0)
    for _ in range(decode):
        assert cache.allocate(rid, 1)
        cache.computed(rid, t + 20.0)
    assert cache.free(rid) == {"device": adm.gpu_tokens, "host": adm.host_tokens,
                               "disk": adm.disk_tokens}
    return lk, adm


def evict_gpu(cache: KVCache, rid: int, now: float) -> None:
    """Fill the GPU with one unique request so every cached block is evicted."""
    n = (cache.config.num_gpu_blocks - 1) * 16
    cache.add_request(rid, None, n)
    cache.lookup(rid, now)
    assert cache.admit(rid, n, now) is not None
    cache.free(rid)


def test_cpu_hit_after_gpu_eviction_loads_instead_of_recomputing(backend: str) -> None:
    cache = offload_cache(backend, gpu_blocks=80)
    p = tokens(1024, 20)
    run_request(cache, 1, p, 0.0)
    evict_gpu(cache, 99, 1e4)
    lk, adm = run_request(cache, 2, p, 2e4)
    assert lk == (0, 1024, 1024, 0)
    assert adm.num_computed_tokens == 1023
    # one CPU→GPU job: base 5 µs + 64 blocks × 16000 B / 1000 B/µs
    assert adm.load_ready_time == pytest.approx(2e4 + 5.0 + 64 * 16.0)
    snap = cache.snapshot()
    # queries: the GPU-missed part of every admission (the filler request's 79 blocks too)
    assert snap["external_queries"] == 1024 + 79 * 16 + 1024 and snap["external_hits"] == 1024
    assert snap["cached_by_source"] == {"device": 0, "host": 1024, "disk": 0}
    assert cache.snapshot()["tiers"]["0:primary"]["chunk_hits"] == 64
    cache.check_invariants()


def test_offload_lookup_starts_after_the_gpu_hit(backend: str) -> None:
    cache = offload_cache(backend)
    p = tokens(1024, 21)
    run_request(cache, 1, p, 0.0)
    lk, adm = run_request(cache, 2, p, 1e4)  # still on the GPU
    assert lk == (1008, 16, 16, 0)  # the last block, capped on the GPU, comes from the CPU
    assert (adm.gpu_tokens, adm.host_tokens, adm.disk_tokens) == (1008, 16, 0)
    snap = cache.snapshot()
    assert snap["prefix_cache_hits"] == 1008 and snap["external_hits"] == 16
    assert snap["external_queries"] == 1024 + 16


def test_prompt_only_stores_skip_decode_chunks(backend: str) -> None:
    for prompt_only, expected in ((True, 64), (False, 65)):
        cache = offload_cache(backend, prompt_only=prompt_only)
        run_request(cache, 1, tokens(1030, 22), 0.0, decode=20)  # 1050 tokens = 65 full blocks
        assert cache.snapshot()["tiers"]["0:primary"]["stored_chunks"] == expected


def test_storage_hit_promotes_through_the_cpu(backend: str) -> None:
    cache = offload_cache(backend, cpu_chunks=64, gpu_blocks=80, fs=True)
    p = tokens(1024, 23)
    run_request(cache, 1, p, 0.0)
    run_request(cache, 2, tokens(1024, 24), 1e6)  # pushes p out of the CPU tier (64 chunks)
    evict_gpu(cache, 99, 2e6)
    lk, adm = run_request(cache, 3, p, 3e6)
    assert lk.disk_tokens == 1024 and lk.host_tokens == 0
    # fs read of 64 chunks (50 + 1024000/100 µs), then CPU→GPU (5 + 1024 µs)
    assert adm.load_ready_time == pytest.approx(3e6 + 50.0 + 10240.0 + 5.0 + 1024.0)
    snap = cache.snapshot()
    assert snap["cached_by_source"]["disk"] == 1024
    assert snap["tiers"]["1:fs"]["chunk_hits"] == 64
    assert snap["tiers"]["1:fs"]["read_bytes"] == 64 * 16000
    assert snap["tiers"]["1:fs"]["write_bytes"] == 128 * 16000
    cache.check_invariants()


def test_with_an_fs_tier_the_first_pass_queries_the_cpu_tier_for_every_chunk(backend: str) -> None:
    """vLLM 0.32 with an fs tier (measured on the real lane: cpu-hit, 256-token prefixes, 96 CPU-tier
    queries for 32 hits): the fs tier answers a key's first lookup with RETRY, which does not stop the
    connector's scan, so the CPU tier is asked about every chunk; the fs tier is asked up to its first miss."""
    for fs, cpu_queries, fs_queries in ((True, 24, 1), (False, 9, 0)):
        cache = offload_cache(backend, gpu_blocks=80, fs=fs)
        prefix = tokens(128, 40)  # 8 chunks
        run_request(cache, 1, prefix, 0.0)
        evict_gpu(cache, 99, 1e4)
        before = cache.snapshot()["tiers"]
        lk, _ = run_request(cache, 2, np.concatenate([prefix, tokens(256, 41)]), 2e4)  # 24 chunks
        after = cache.snapshot()["tiers"]
        assert lk.host_tokens == 128
        delta = after["0:primary"]["chunk_queries"] - before["0:primary"]["chunk_queries"]
        assert delta == cpu_queries, fs
        assert after["0:primary"]["chunk_hits"] - before["0:primary"]["chunk_hits"] == 8
        if fs:
            assert after["1:fs"]["chunk_queries"] - before["1:fs"]["chunk_queries"] == fs_queries
        cache.check_invariants()


def test_store_threshold_counts_offers(backend: str) -> None:
    """vLLM 0.32's reuse filter counts store offers (CPUOffloadingManager.prepare_store), not
    lookups (measured on the real lane: offload-threshold.blis.yaml, the whole prefix stored on its
    second offer): a prompt offered once stores nothing, offered again every chunk."""
    cache = offload_cache(backend, threshold=2)
    p = tokens(64, 25)  # 4 chunks
    run_request(cache, 1, p, 0.0)  # offered once: nothing stored, 4 skipped
    tiers = cache.snapshot()["tiers"]["0:primary"]
    assert tiers["stored_chunks"] == 0 and tiers["store_skipped_chunks"] == 4
    evict_gpu(cache, 98, 1e4)
    run_request(cache, 2, p, 2e4)  # offered twice: all 4 stored
    assert cache.snapshot()["tiers"]["0:primary"]["stored_chunks"] == 4
    evict_gpu(cache, 97, 3e4)
    lk, _ = run_request(cache, 3, p, 4e4)
    assert lk.host_tokens == 64


def test_blocks_per_chunk_keys_chunks_by_their_last_block(backend: str) -> None:
    cache = offload_cache(backend, bpc=2, gpu_blocks=80)
    p = tokens(1000, 26)  # 62 full blocks = 31 chunks of 32 tokens
    run_request(cache, 1, p, 0.0)
    assert cache.snapshot()["tiers"]["0:primary"]["stored_chunks"] == 31
    evict_gpu(cache, 99, 1e4)
    lk, _ = run_request(cache, 2, p, 2e4)
    assert lk.external_tokens == 992


def test_arc_policy_keeps_reused_chunks(backend: str) -> None:
    hot, results = tokens(64, 27), {}
    for policy in ("lru", "arc"):
        cache = offload_cache(backend, cpu_chunks=8, policy=policy, gpu_blocks=20)
        run_request(cache, 1, hot, 0.0)
        evict_gpu(cache, 90, 1e4)
        run_request(cache, 2, hot, 2e4)  # ARC: the hot chunks move to T2
        for i in range(3):  # a scan of one-off prompts
            run_request(cache, 10 + i, tokens(64, 100 + i), 3e4 + 1e4 * i)
        evict_gpu(cache, 91, 1e5)
        results[policy] = run_request(cache, 3, hot, 2e5)[0].host_tokens
        cache.check_invariants()
    assert results == {"lru": 0, "arc": 64}


def test_chunks_still_being_written_are_not_hits_yet(backend: str) -> None:
    """A chunk whose GPU → CPU store has not completed is HIT_PENDING: no hit, no query counted."""
    cache = offload_cache(backend, gpu_blocks=80)
    p = tokens(1024, 28)
    run_request(cache, 1, p, 0.0)  # store submitted at 10 µs, done at 10 + 5 + 1024 µs
    evict_gpu(cache, 99, 20.0)
    queries = cache.snapshot()["tiers"]["0:primary"]["chunk_queries"]
    cache.add_request(2, hash_blocks(p, 16), 1024)
    assert cache.lookup(2, 500.0).external_tokens == 0
    assert cache.snapshot()["tiers"]["0:primary"]["chunk_queries"] == queries
    assert cache.lookup(2, 2000.0).external_tokens == 1024  # written by now


def keys(*ks: int) -> np.ndarray:
    return np.array(ks, dtype=np.uint64)


def test_arc_store_follows_vllms_manager(backend: str) -> None:
    """ARCOffloadingManager: new keys enter T1, a touch promotes to T2, eviction takes T1 while
    |T1| ≥ target, a B1 ghost hit raises the target, ghost lists are bounded by the capacity."""
    from blis_sim.kv import load_core
    core, _ = load_core(backend)
    a, b, c, d, e = 11, 12, 13, 14, 15
    s = core.ChunkStore(2, "arc")
    s.prepare_store(keys(a), 0.0, 0.0)
    s.prepare_store(keys(b), 0.0, 0.0)
    s.touch(keys(a), 0, 1)
    assert [k for k, *_ in s.state()["t1"]] == [b] and [k for k, *_ in s.state()["t2"]] == [a]
    assert s.prepare_store(keys(c), 1.0, 1.0).tolist() == [c]  # target 0: evict T1's LRU (b)
    assert s.state()["b1"] == [b]
    s.touch(keys(b), 0, 1)  # ghost hit in B1
    assert s.target_t1 == 1
    s.prepare_store(keys(d), 2.0, 2.0)  # |T1| = 1 ≥ target 1: evict c from T1
    s.touch(keys(a), 0, 1)
    s.prepare_store(keys(e), 3.0, 3.0)  # evict d; B1 = [b, c, d] is bounded to 2
    st_ = s.state()
    assert [k for k, *_ in st_["t1"]] == [e] and [k for k, *_ in st_["t2"]] == [a]
    assert st_["b1"] == [c, d] and s.evictions == 3


def test_lru_store_skips_pinned_entries_and_refuses_all_or_nothing(backend: str) -> None:
    from blis_sim.kv import load_core
    core, _ = load_core(backend)
    s = core.ChunkStore(3, "lru")
    s.prepare_store(keys(1, 2, 3), 0.0, 0.0)
    s.pin(keys(1), 0, 1, 100.0)  # 1 is being read until t=100
    assert s.prepare_store(keys(4), 10.0, 20.0).tolist() == [4]  # evicts 2, not the pinned 1
    assert s.keys() == [1, 3, 4]
    assert s.prepare_store(keys(5, 6, 7), 10.0, 20.0) is None  # needs 3, only 3 is evictable
    assert s.keys() == [1, 3, 4] and s.evictions == 1
    assert s.state_of(4, 15.0) == 1 and s.state_of(4, 20.0) == 2  # pending until written
    assert s.prepare_store(keys(3, 3), 50.0, 50.0).tolist() == []  # resident keys are skipped
