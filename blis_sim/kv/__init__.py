"""Tiered KV cache with vLLM V1 semantics: GPU prefix cache, CPU offload tier, ``fs`` storage tiers.

The engine (``blis_sim.engine``) drives one :class:`KVCache` per simulated server, the way vLLM's
scheduler drives its ``KVCacheManager`` and ``OffloadingConnector``. Times are float µs; request
ids are ints chosen by the engine; token data enters only as numpy arrays (one call per request,
never a Python object per token).

Building one
------------
::

    from blis_sim.kv import KVConfig, CpuTierConfig, FsTierConfig, KVCache, hash_blocks
    cache = KVCache(KVConfig(num_gpu_blocks=512, block_size=32))            # GPU only
    cache = KVCache(from_offload_config(offload_cfg, block_size=16, num_gpu_blocks=N,
                                        bytes_per_block=per_block_bytes))   # with offload tiers
    cache.compiled            # True when the Cython core is in use

``KVCache(config, backend=None)``: ``backend`` is ``"cython"``, ``"python"`` or ``None`` (the
Cython core unless ``BLIS_PURE_PYTHON=1`` or it is not built; ``BLIS_REQUIRE_EXT=1`` makes a missing
build an error). ``num_gpu_blocks`` counts vLLM's reserved null block (usable = N − 1).

Per request (the engine's calls, in vLLM's order)
-------------------------------------------------
``hash_blocks(tokens, block_size, salt=0) -> np.ndarray[uint64]``
    Chained 64-bit hashes of the full blocks of a token-id array (once per request). ``salt``
    stands for vLLM's extra keys (LoRA, ``cache_salt``). Pass the hashes of prompt + output when the
    output tokens are known (multi-turn context reuse); blocks past the given hashes get unique
    synthetic hashes.
``core.root_hash(salt=0)``, ``core.extend_hashes(parent, seed, start, count)``, ``core.mix64(x)``
    Helpers of the same hash family (``core`` = the selected core module): the chain's root, and
    ``count`` chained hashes of unique content after ``parent`` (for synthetic suffixes), so that
    an engine building hashes without token ids stays consistent with ``hash_blocks``.
``add_request(rid, block_hashes, num_prompt_tokens, *, skip_prefix_cache=False)``
    Register a request. ``block_hashes=None``: unique content. ``skip_prefix_cache=True`` for
    ``prompt_logprobs`` requests (no lookups, not counted).
``add_prefixed(rid, prefix_hashes, shared_blocks, root, seed, num_prompt_tokens)``
    ``add_request`` of a prefix-group request without building its hash array:
    ``core.prefixed_hashes(prefix_hashes, shared_blocks, root, seed, num_prompt_tokens //
    block_size)`` (the group's first blocks, then unique chained content), built in place.
``lookup(rid, now) -> Lookup(gpu_tokens, external_tokens, host_tokens, disk_tokens)``
    At each admission attempt of a waiting request: the GPU hit (whole blocks, capped at
    ``num_tokens − 1``), then the offload tiers after it, chunk by chunk from the chunk holding the
    GPU hit's end, stopping at the first chunk found nowhere (or still being written: vLLM's
    HIT_PENDING). ``external_tokens = host_tokens + disk_tokens`` (0 if less than one chunk).
    Touches CPU-tier recency (vLLM's ``touch``) and counts per-tier chunk queries/hits.
``admit(rid, num_new_tokens, now) -> Admission | None``
    Allocate blocks for ``gpu_tokens + external_tokens + num_new_tokens`` (vLLM: pass
    ``num_new_tokens=0`` when ``external_tokens > 0``; the request then waits for its load). ``None``
    = not enough free GPU blocks; nothing changed or counted: keep it waiting or preempt.
    On success the prefix-cache / external / by-source counters move (not for a preempted
    re-admission, not for ``skip_prefix_cache``), the fs-resident chunks are promoted into the CPU
    tier and the CPU → GPU load is queued; ``Admission(num_computed_tokens, gpu_tokens,
    external_tokens, host_tokens, disk_tokens, load_ready_time)``; its external/host/disk tokens
    can be fewer than the lookup's when a promotion found no room in the CPU tier (the rest is
    computed; the blocks stay allocated to the request). The engine must not compute the
    request before ``load_ready_time``; loaded tokens are not recomputed, except that
    ``num_computed_tokens`` is at most ``num_tokens − 1`` (the last token is always computed).
    Full blocks up to ``gpu_tokens + num_new_tokens`` are registered in the GPU cache now
    (vLLM caches at scheduling time; loaded blocks are registered by the next ``allocate``).
``allocate(rid, num_new_tokens) -> bool``
    A scheduled request grows by ``num_new_tokens`` (next prefill chunk, a decode token, or the
    first compute after a load). ``False`` = not enough free blocks, nothing changed (preempt).
    Registers the hashes of full blocks up to the new end.
``computed(rid, now)``
    The tokens scheduled so far are computed at ``now`` (call it at the step's end): the newly
    complete chunks are stored write-through GPU → CPU (prompt chunks only unless
    ``offload_prompt_only=False``; ``store_threshold`` filter), then cascaded CPU → every fs tier.
    Stores cost write-station time and never block the request.
``preempt(rid)``
    Recompute preemption: blocks freed tail first (vLLM's order); the request stays registered.
``free(rid) -> {"device": n, "host": n, "disk": n}``
    Finished or aborted: blocks freed tail first, the request forgotten; returns its
    ``cached_by_source``.
``cached_by_source(rid) -> {"device": n, "host": n, "disk": n}``
    Cached prompt tokens of the request at its first admission (vLLM's ``num_cached_tokens``).

Counters (design D2) and state
------------------------------
``snapshot() -> dict``: ``prefix_cache_queries``/``_hits`` (tokens; once per request at admission),
``external_queries``/``_hits`` (tokens; the part the GPU missed / the part loaded),
``cached_by_source`` ``{device, host, disk}`` (tokens), ``preempted_queries``/``_hits`` (not exported
by vLLM), ``tiers[label]`` with ``chunk_queries``/``chunk_hits`` (once per request, tier and chunk),
``read_bytes``/``read_time_us``/``read_jobs`` (tier 0: CPU → GPU loads; fs: promotions),
``write_bytes``/``write_time_us``/``write_jobs`` (tier 0: GPU → CPU stores; fs: cascades),
``stored_chunks``, ``store_skipped_chunks``, ``allocation_failures``, ``evictions``,
``resident_chunks``; the reference's block-based ``block_hits``/``block_misses``/``cache_hit_rate``
(compatibility only); ``gpu_evictions`` and ``kv_cache_usage``. ``hit_rate_entries()`` gives the
shared-shape list (``prefix_cache``, ``external``, ``by_source`` per source, ``tiered`` per tier).
``usage()``, ``num_free_blocks()``, ``state()`` (full dump), ``check_invariants()``.

Tier labels follow vLLM: ``"0:primary"`` (CPU, source ``host``), ``"<i+1>:fs"`` (source ``disk``).
The model, the counters' update points and the departures from the reference: ``docs/kv.md``.
"""
from __future__ import annotations

import abc
from types import ModuleType
from typing import Any

from blis_sim import _backend
from blis_sim.kv.cache import Admission, KVCache as PyKVCache, Lookup
from blis_sim.kv.config import CpuTierConfig, FsTierConfig, KVConfig, TierStation, from_offload_config

core, COMPILED = _backend.load("blis_sim.kv._core", "blis_sim.kv._core_py")
hash_blocks = core.hash_blocks


def load_core(backend: str | None = None) -> tuple[ModuleType, bool]:
    """The core module for ``backend`` ("cython" | "python" | None = the default choice)."""
    if backend is None:
        return core, COMPILED
    if backend == "python":
        from blis_sim.kv import _core_py  # a forced backend: only that one is imported
        return _core_py, False
    if backend == "cython":
        from blis_sim.kv import _core  # type: ignore[attr-defined]  # raises if not built
        return _core, True
    raise ValueError(f"unknown KV backend {backend!r} (use 'cython' or 'python')")


class KVCache(abc.ABC):  # noqa: B024  (the common type of the two caches, and their factory)
    """The tiered KV cache (see the module docstring). ``backend``: "cython" | "python" | None.

    ``KVCache(config)`` builds the compiled cache (:class:`blis_sim.kv.compiled.CompiledKVCache`,
    the whole request layer in Cython) or the pure one (:class:`blis_sim.kv.cache.KVCache` on
    the pure core); both are instances of this class and behave identically."""

    def __new__(cls, config: KVConfig, backend: str | None = None) -> Any:
        mod, compiled = load_core(backend)
        if compiled:
            from blis_sim.kv.compiled import CompiledKVCache
            return CompiledKVCache(config)
        return PyKVCache(config, mod, False)


KVCache.register(PyKVCache)  # the compiled class registers itself (blis_sim.kv.compiled)


__all__ = ["Admission", "COMPILED", "core", "CpuTierConfig", "FsTierConfig", "KVCache", "KVConfig",
           "Lookup", "TierStation", "from_offload_config", "hash_blocks", "load_core"]
