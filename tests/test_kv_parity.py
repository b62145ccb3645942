"""Randomized operation sequences (hypothesis): the Cython core and the pure twin must end in the
same state with the same counters, and the cache's invariants hold after every operation."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_sim import _backend
from blis_sim.errors import SimulationError
from blis_sim.kv import (CpuTierConfig, FsTierConfig, KVCache, KVConfig, TierStation, _core_py,
                         hash_blocks)


def _cython_available() -> bool:
    try:
        import blis_sim.kv._core  # noqa: F401
    except ImportError:
        return False
    return True


needs_cython = pytest.mark.skipif(not _cython_available() and not _backend.ext_required(),
                                  reason="Cython KV core not built")

BS = 4
GROUPS = [np.random.default_rng(g).integers(0, 50, 400) for g in range(3)]

ops = st.lists(st.tuples(
    st.sampled_from(["add", "add", "admit", "admit", "admit", "grow", "grow", "computed",
                     "preempt", "free", "free"]),
    st.integers(0, 7),      # which live request
    st.sampled_from([0, 0, 1, 2, 3]),  # prefix group (3 = unique content)
    st.integers(1, 120),    # prompt length / tokens to schedule
    st.floats(0.0, 400.0),  # time step
), min_size=10, max_size=80)

configs = st.fixed_dictionaries({
    "gpu": st.integers(4, 40),
    "cpu": st.sampled_from([None, 2, 16, 64, 200, 200]),
    "fs": st.sampled_from([0, 1, 2]),
    "fs_cap": st.one_of(st.none(), st.integers(1, 20)),
    "policy": st.sampled_from(["lru", "arc"]),
    "bpc": st.sampled_from([1, 2]),
    "prompt_only": st.booleans(),
    "threshold": st.sampled_from([0, 0, 2]),
    "jitter": st.sampled_from([0.0, 0.3]),
})


def make_config(c: dict[str, Any]) -> KVConfig:
    cpu = None
    tiers: tuple[FsTierConfig, ...] = ()
    bpb = 100
    if c["cpu"] is not None:
        cpu = CpuTierConfig(num_chunks=c["cpu"], eviction_policy=c["policy"],
                            store_threshold=c["threshold"],
                            link=TierStation(read_bandwidth=10.0, write_bandwidth=20.0,
                                             base_latency=1.0))
        tiers = tuple(FsTierConfig(station=TierStation(
            read_bandwidth=5.0, write_bandwidth=20.0, base_latency=10.0, n_read_threads=2,
            n_write_threads=1, saturation_queue_depth=3, single_transfer_fraction=0.5,
            latency_jitter_stddev=c["jitter"]),
            max_bytes=None if c["fs_cap"] is None else c["fs_cap"] * bpb * c["bpc"])
            for _ in range(c["fs"]))
    return KVConfig(num_gpu_blocks=c["gpu"], block_size=BS, blocks_per_chunk=c["bpc"],
                    bytes_per_block=bpb, offload_prompt_only=c["prompt_only"], cpu=cpu,
                    fs_tiers=tiers, seed=7)


def drive(cache: KVCache, sequence: list[tuple], check: bool) -> list[Any]:
    """Apply the operations the way an engine would; returns every observable result.

    Operations pick their request among the live ones (``slot`` modulo their number), so every
    operation does something: waiting requests are admitted, admitted ones grow and compute."""
    out: list[Any] = []
    waiting: list[int] = []
    running: list[int] = []
    prompt: dict[int, int] = {}
    now, next_rid = 0.0, 0
    for op, slot, group, n, dt in sequence:
        now += dt
        res: Any = None
        if op == "add" or not (waiting or running):
            next_rid += 1
            rid = next_rid
            toks = (GROUPS[group][:n] if group < 3
                    else np.random.default_rng(1000 + rid).integers(0, 50, n))
            cache.add_request(rid, hash_blocks(toks, BS), n)
            prompt[rid] = n
            waiting.append(rid)
            res = rid
        elif op == "admit" and waiting:
            rid = waiting[slot % len(waiting)]
            lk = cache.lookup(rid, now)
            num_new = 0 if lk.external_tokens else min(n, prompt[rid] - lk.gpu_tokens)
            adm = cache.admit(rid, num_new, now)
            if adm is not None:
                waiting.remove(rid)
                running.append(rid)
                if num_new:
                    cache.computed(rid, now + 1.0)
            res = (tuple(lk), None if adm is None else tuple(adm))
        elif op in ("grow", "computed") and running:
            rid = running[slot % len(running)]
            res = cache.allocate(rid, min(n, 40)) if op == "grow" else None
            cache.computed(rid, now)
        elif op == "preempt" and running:
            rid = running[slot % len(running)]
            cache.preempt(rid)
            running.remove(rid)
            waiting.insert(0, rid)
            res = rid
        elif op == "free":
            pool = running or waiting
            rid = pool[slot % len(pool)]
            res = cache.free(rid)
            pool.remove(rid)
        out.append((op, res))
        if check:
            cache.check_invariants()
            _check_resident_readable(cache, now)
    return out


def _check_resident_readable(cache: KVCache, now: float) -> None:
    """Every resident chunk is findable: readable from its ready time on, never lost early."""
    for tier in cache.tiers:
        st_ = tier.state()
        for key, ready, busy in st_["t1"] + st_["t2"]:
            assert busy >= ready
            assert tier.state_of(key, max(ready, now)) == _core_py.READY


@needs_cython
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, sequence=ops)
def test_cython_and_python_cores_agree(cfg: dict[str, Any], sequence: list[tuple]) -> None:
    """The compiled cache, the pure cache, and the pure request layer on the compiled core (the
    core's own Python API: tier_walk, the pool's and the tiers' def methods) all agree."""
    from blis_sim.kv import _core
    from blis_sim.kv.cache import KVCache as PyKVCache

    config = make_config(cfg)
    py, cy = KVCache(config, backend="python"), KVCache(config, backend="cython")
    mixed = PyKVCache(config, _core, True)
    expected = drive(py, sequence, check=False)
    assert drive(cy, sequence, check=False) == expected == drive(mixed, sequence, check=False)
    assert py.state() == cy.state() == mixed.state()


@pytest.mark.parametrize("backend", ["python", pytest.param("cython", marks=needs_cython)])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, sequence=ops)
def test_invariants_hold_after_every_operation(backend: str, cfg: dict[str, Any],
                                               sequence: list[tuple]) -> None:
    cache = KVCache(make_config(cfg), backend=backend)
    drive(cache, sequence, check=True)
    snap = cache.snapshot()
    assert snap["prefix_cache_hits"] <= snap["prefix_cache_queries"]
    assert snap["external_hits"] <= snap["external_queries"]
    assert sum(snap["cached_by_source"].values()) == snap["prefix_cache_hits"] + snap["external_hits"]
    for label, tier in snap["tiers"].items():
        assert tier["chunk_hits"] <= tier["chunk_queries"], label


@needs_cython
@settings(max_examples=200, deadline=None)
@given(toks=st.lists(st.integers(-5, 2**40), max_size=300), bs=st.integers(1, 40),
       salt=st.integers(0, 2**64 - 1))
def test_hashes_agree(toks: list[int], bs: int, salt: int) -> None:
    from blis_sim.kv import _core
    arr = np.array(toks, dtype=np.int64)
    a, b = _core.hash_blocks(arr, bs, salt), _core_py.hash_blocks(arr, bs, salt)
    assert a.dtype == b.dtype == np.uint64 and a.tolist() == b.tolist()
    assert 0 not in a.tolist()


@needs_cython
@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 40), shared=st.integers(0, 40), extra=st.integers(0, 40),
       seed=st.integers(0, 2**64 - 1))
def test_prefixed_hashes_agree(n: int, shared: int, extra: int, seed: int) -> None:
    """A prefix-group request's hashes: the group's first blocks, then unique chained content,
    the same in both cores and the same as building them from extend_hashes by hand."""
    from blis_sim.kv import _core
    shared = min(shared, n)
    prefix = _core_py.hash_blocks(np.arange(n * 4, dtype=np.int64), 4)
    root = _core_py.root_hash(0)
    count = shared + extra
    a = _core.prefixed_hashes(prefix, shared, root, seed, count)
    b = _core_py.prefixed_hashes(prefix, shared, root, seed, count)
    parent = int(prefix[shared - 1]) if shared else root
    by_hand = prefix[:shared].tolist() + _core_py.extend_hashes(parent, seed, shared, extra).tolist()
    assert a.tolist() == b.tolist() == by_hand


@pytest.mark.parametrize("backend", ["python", pytest.param("cython", marks=needs_cython)])
@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 12), shared=st.integers(0, 12), prompt=st.integers(1, 300),
       seed=st.integers(0, 2**64 - 1))
def test_add_prefixed_is_add_request_of_prefixed_hashes(backend: str, n: int, shared: int,
                                                         prompt: int, seed: int) -> None:
    """Registering a prefix-group request in place gives the same cache as registering the hashes
    ``prefixed_hashes`` builds (the shared part capped at the prompt's full blocks)."""
    shared = min(shared, n)
    prefix = _core_py.hash_blocks(np.arange(n * BS, dtype=np.int64), BS)
    root = _core_py.root_hash(0)
    a = KVCache(KVConfig(num_gpu_blocks=64, block_size=BS), backend=backend)
    b = KVCache(KVConfig(num_gpu_blocks=64, block_size=BS), backend=backend)
    # a first request holding the whole prefix, so that the second one's hits show in the state
    for cache in (a, b):
        cache.add_request(0, prefix, n * BS + 1)
        cache.admit(0, n * BS + 1, 0.0)
    a.add_prefixed(1, prefix, shared, root, seed, prompt)
    need = prompt // BS
    b.add_request(1, _core_py.prefixed_hashes(prefix, min(shared, need), root, seed, need), prompt)
    assert tuple(a.lookup(1, 1.0)) == tuple(b.lookup(1, 1.0))
    assert tuple(a.admit(1, 1, 1.0) or ()) == tuple(b.admit(1, 1, 1.0) or ())
    assert a.state() == b.state()
    with pytest.raises(SimulationError):
        a.add_prefixed(1, prefix, shared, root, seed, prompt)


@needs_cython
def test_compiled_add_prefixed_takes_only_a_contiguous_native_uint64_vector() -> None:
    """The compiled cache reads the prefix in place, so it checks its layout in C: any 8-byte
    unsigned integer vector in native byte order and contiguous is taken (as ``dtype ==
    np.uint64`` would), anything else is refused before a byte is read."""
    prefix = _core_py.hash_blocks(np.arange(8 * BS, dtype=np.int64), BS)
    root = _core_py.root_hash(0)
    cache = KVCache(KVConfig(num_gpu_blocks=64, block_size=BS), backend="cython")
    cache.add_prefixed(0, prefix, 8, root, 7, 8 * BS)
    cache.add_prefixed(1, prefix.astype(np.ulonglong), 8, root, 7, 8 * BS)  # the other 8-byte code
    assert cache.lookup(1, 0.0) == cache.lookup(0, 0.0)
    bad = [prefix.astype(np.int64), prefix.astype(np.float64), prefix.astype(">u8"),
           np.repeat(prefix, 2)[::2], prefix.reshape(2, 4), prefix.astype(np.uint32)]
    for k, arr in enumerate(bad, start=2):
        with pytest.raises(SimulationError, match="contiguous uint64"):
            cache.add_prefixed(k, arr, 4, root, 7, 8 * BS)
    with pytest.raises(SimulationError, match="contiguous uint64"):
        cache.add_prefixed(20, prefix, 9, root, 7, 8 * BS)  # more shared blocks than it holds


@pytest.mark.parametrize("backend", ["python", pytest.param("cython", marks=needs_cython)])
def test_hash_chain_matches_iff_prefix_matches(backend: str) -> None:
    from blis_sim.kv import load_core
    core, _ = load_core(backend)
    a = np.arange(64)
    b = a.copy()
    b[40] = 999  # block 2 of 16 differs: blocks 0-1 match, 2-3 do not
    ha, hb = core.hash_blocks(a, 16), core.hash_blocks(b, 16)
    assert ha[:2].tolist() == hb[:2].tolist()
    assert all(x != y for x, y in zip(ha[2:].tolist(), hb[2:].tolist()))
    assert core.hash_blocks(a, 16, salt=1)[0] != ha[0]  # extra keys (LoRA, cache_salt) separate
    assert len(core.hash_blocks(a[:63], 16)) == 3  # only full blocks


# Request-at-a-time workloads with heavy prefix reuse and small GPU/CPU tiers, so that CPU hits,
# storage hits, promotions, cascades and tier evictions all happen (the op sequences above rarely
# reach the storage path).
workloads = st.lists(st.tuples(
    st.sampled_from([0, 0, 1, 1, 2, 3]),  # prefix group (3 = unique content)
    st.integers(8, 160),                  # prompt tokens
    st.integers(0, 12),                   # decode tokens
    st.sampled_from([0.0, 5.0, 1e3, 1e5]),  # time to the next request
), min_size=5, max_size=40)

tiered_configs = st.fixed_dictionaries({
    "gpu": st.integers(6, 30),
    "cpu": st.sampled_from([2, 8, 20]),
    "fs": st.sampled_from([1, 1, 2]),
    "fs_cap": st.sampled_from([None, 10, 40]),
    "policy": st.sampled_from(["lru", "arc"]),
    "bpc": st.sampled_from([1, 2]),
    "prompt_only": st.booleans(),
    "threshold": st.just(0),
    "jitter": st.sampled_from([0.0, 0.3]),
})


def serve_all(cache: KVCache, workload: list[tuple], check: bool) -> list[Any]:
    out: list[Any] = []
    now = 0.0
    for rid, (group, n, decode, dt) in enumerate(workload, start=1):
        now += dt
        toks = (GROUPS[group][:n] if group < 3
                else np.random.default_rng(5000 + rid).integers(0, 50, n))
        cache.add_request(rid, hash_blocks(toks, BS), n)
        lk = cache.lookup(rid, now)
        adm = cache.admit(rid, 0 if lk.external_tokens else n - lk.gpu_tokens, now)
        out.append((tuple(lk), None if adm is None else tuple(adm)))
        if adm is not None:
            t = adm.load_ready_time
            ok = not lk.external_tokens or cache.allocate(rid, n - adm.num_computed_tokens)
            cache.computed(rid, t + 1.0)
            for k in range(decode if ok else 0):
                if not cache.allocate(rid, 1):
                    break
                cache.computed(rid, t + 2.0 + k)
        out.append(cache.free(rid))
        if check:
            cache.check_invariants()
            _check_resident_readable(cache, now)
    return out


@needs_cython
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=tiered_configs, workload=workloads)
def test_cores_agree_on_tiered_workloads(cfg: dict[str, Any], workload: list[tuple]) -> None:
    config = make_config(cfg)
    py, cy = KVCache(config, backend="python"), KVCache(config, backend="cython")
    assert serve_all(py, workload, check=False) == serve_all(cy, workload, check=False)
    assert py.state() == cy.state()


@pytest.mark.parametrize("backend", ["python", pytest.param("cython", marks=needs_cython)])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=tiered_configs, workload=workloads)
def test_invariants_hold_on_tiered_workloads(backend: str, cfg: dict[str, Any],
                                             workload: list[tuple]) -> None:
    cache = KVCache(make_config(cfg), backend=backend)
    serve_all(cache, workload, check=True)
    snap = cache.snapshot()
    assert sum(snap["cached_by_source"].values()) == snap["prefix_cache_hits"] + snap["external_hits"]
