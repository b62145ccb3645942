"""The tiered KV cache the engine drives: :class:`KVCache` (API documented in :mod:`blis_sim.kv`).

It composes the core structures of the selected backend (:class:`BlockPool` for the GPU,
:class:`ChunkStore` per offload tier) with the transfer stations and the counters, and keeps the
per-request state (block hashes, scheduled end, offload progress, per-source cached tokens).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from blis_sim.errors import SimulationError
from blis_sim.kv.config import KVConfig
from blis_sim.kv.station import TransferStation

SOURCES = ("device", "host", "disk")
_INF = float("inf")


class Lookup(NamedTuple):
    """Result of :meth:`KVCache.lookup`: tokens found per place (whole blocks / chunks)."""

    gpu_tokens: int
    external_tokens: int
    host_tokens: int
    disk_tokens: int


class Admission(NamedTuple):
    """Result of a successful :meth:`KVCache.admit`."""

    num_computed_tokens: int  # KV present once the load is done; always ≤ num_tokens − 1
    gpu_tokens: int
    external_tokens: int
    host_tokens: int
    disk_tokens: int
    load_ready_time: float  # µs; == now when nothing is loaded


class _Req:
    __slots__ = ("rid", "hashes", "num_prompt", "num_tokens", "end", "stored", "preempted",
                 "skip", "admitted", "cached", "seed", "lk_epoch", "lk_now", "lk", "plan",
                 "flags", "nblocks", "ncached", "acc_lo", "acc_hi")

    def __init__(self, rid: int, hashes: np.ndarray, num_prompt: int, skip: bool,
                 n_tiers: int) -> None:
        self.rid = rid
        self.hashes = hashes
        self.num_prompt = num_prompt
        self.num_tokens = num_prompt
        self.end = 0  # tokens computed or scheduled (vLLM: num_computed_tokens + scheduled)
        self.stored = 0  # chunks already offered to the offload store
        # Chunks [acc_lo, acc_hi) this request loaded or offered: their LRU recency is set when it finishes.
        self.acc_lo = -1
        self.acc_hi = 0
        self.nblocks = 0  # GPU blocks owned (mirrors the pool, so a decode step need not ask it)
        self.ncached = 0  # full blocks whose hashes were offered to the GPU cache
        self.preempted = False
        self.skip = skip
        self.admitted = False
        self.cached = {s: 0 for s in SOURCES}
        self.seed = 0
        self.lk_epoch = -1
        self.lk_now = 0.0
        self.lk: Lookup | None = None
        self.plan: list[tuple[int, int, int]] = []
        # (tier, chunk) already counted in the tier's chunk queries (bit 1) / hits (bit 2).
        self.flags: np.ndarray | None = None


def new_tier_counters() -> dict[str, float]:
    return {"chunk_queries": 0, "chunk_hits": 0, "read_bytes": 0, "read_time_us": 0.0,
            "read_jobs": 0, "write_bytes": 0, "write_time_us": 0.0, "write_jobs": 0,
            "stored_chunks": 0, "promoted_chunks": 0, "store_skipped_chunks": 0, "evictions": 0,
            "allocation_failures": 0}


class Readouts:
    """The read-outs shared by the pure :class:`KVCache` and the compiled one
    (``blis_sim.kv.compiled``): both hold ``counters``, ``pool``, ``tiers`` and ``tier_labels``
    and list their requests with ``_request_states()``."""

    counters: dict[str, Any]
    pool: Any
    tiers: list[Any]
    tier_labels: tuple[str, ...]

    def _request_states(self) -> dict[int, tuple[Any, ...]]:
        raise NotImplementedError


    def snapshot(self) -> dict[str, Any]:
        """Every counter (design D2), as plain data (ints/floats/dicts)."""
        c = self.counters
        out: dict[str, Any] = {k: v for k, v in c.items() if k not in ("tiers", "cached_by_source")}
        out["cached_by_source"] = dict(c["cached_by_source"])
        bh, bm = c["block_hits"], c["block_misses"]
        out["cache_hit_rate"] = bh / (bh + bm) if bh + bm else 0.0
        out["gpu_evictions"] = self.pool.evictions
        out["kv_cache_usage"] = self.pool.usage()
        tiers = {}
        for i, label in enumerate(self.tier_labels):
            t = dict(c["tiers"][label])
            t["evictions"] = self.tiers[i].evictions
            t["resident_chunks"] = len(self.tiers[i])
            tiers[label] = t
        out["tiers"] = tiers
        return out

    def hit_rate_entries(self) -> list[dict[str, Any]]:
        """The per-definition entries in their shared shape, ``metric`` None
        (docs/formats.md, "Where the per-definition hit-rates live")."""
        c = self.counters

        def entry(definition: str, tier: str | None, unit: str, hits: int,
                  queries: int) -> dict[str, Any]:
            return {"definition": definition, "tier": tier, "unit": unit, "hits": int(hits),
                    "queries": int(queries), "hit_rate": hits / queries if queries else 0.0,
                    "metric": None}

        q = c["prefix_cache_queries"]
        out = [entry("prefix_cache", None, "tokens", c["prefix_cache_hits"], q)]
        if self.tiers:
            out.append(entry("external", None, "tokens", c["external_hits"],
                             c["external_queries"]))
        for src in SOURCES:
            if src == "device" or self.tiers:
                out.append(entry("by_source", src, "tokens", c["cached_by_source"][src], q))
        for label in self.tier_labels:
            t = c["tiers"][label]
            out.append(entry("tiered", label, "chunks", t["chunk_hits"], t["chunk_queries"]))
        return out

    def state(self) -> dict[str, Any]:
        """Complete state (pool, tiers, requests, counters), for parity tests and debugging."""
        return {
            "pool": self.pool.state(),
            "tiers": [t.state() for t in self.tiers],
            "requests": self._request_states(),
            "counters": self.snapshot(),
        }

    def check_invariants(self) -> None:
        """Raise :class:`SimulationError` if a structural invariant is broken (tests use it)."""
        problems = _invariant_problems(self)
        if problems:
            raise SimulationError("KV cache invariant broken: " + "; ".join(problems[:5]))


class KVCache(Readouts):
    """GPU prefix cache + offload tiers + counters (pure Python). See :mod:`blis_sim.kv` for the
    API."""

    def __init__(self, config: KVConfig, core: ModuleType, compiled: bool) -> None:
        self.config = config
        self.compiled = compiled
        self._core = core
        self.block_size = config.block_size
        self.chunk_tokens = config.chunk_tokens
        self.pool = core.BlockPool(config.num_gpu_blocks, config.block_size,
                                   config.enable_caching)
        self.tier_labels = config.tier_labels
        self.tiers: list[Any] = []
        self.stations: list[TransferStation] = []
        if config.cpu is not None:
            self.tiers.append(core.ChunkStore(config.cpu.num_chunks, config.cpu.eviction_policy))
            self.stations.append(TransferStation(config.cpu.link, config.seed * 1000003))
            for i, fs in enumerate(config.fs_tiers):
                cap = -1 if fs.max_bytes is None else fs.max_bytes // max(config.chunk_bytes, 1)
                self.tiers.append(core.ChunkStore(cap, "lru"))
                self.stations.append(TransferStation(fs.station, config.seed * 1000003 + i + 1))
        self._threshold = config.cpu.store_threshold if config.cpu is not None else 0
        self._tracker_max = config.cpu.max_tracker_size if config.cpu is not None else 0
        self._tracker: dict[int, int] = {}
        self._reqs: dict[int, _Req] = {}
        self._epoch = 0
        self.counters: dict[str, Any] = {
            "prefix_cache_queries": 0, "prefix_cache_hits": 0,
            "preempted_queries": 0, "preempted_hits": 0,
            "external_queries": 0, "external_hits": 0,
            "cached_by_source": {s: 0 for s in SOURCES},
            "block_hits": 0, "block_misses": 0,
            "tiers": {label: new_tier_counters() for label in self.tier_labels},
        }
        self._tier_counters = [self.counters["tiers"][label] for label in self.tier_labels]
        self._deltas = np.zeros((len(self.tiers), 2), dtype=np.int64)

    # ------------------------------------------------------------------------------- requests
    def add_request(self, rid: int, block_hashes: np.ndarray | None, num_prompt_tokens: int, *,
                    skip_prefix_cache: bool = False) -> None:
        """Register a request: its block hashes (``hash_blocks`` of the prompt, or of prompt +
        output when the output tokens are known) and its prompt length. ``block_hashes=None``:
        unique content (nothing shared). ``skip_prefix_cache``: a ``prompt_logprobs`` request
        (no prefix-cache or connector lookup, not counted)."""
        if rid in self._reqs:
            raise SimulationError(f"request {rid} is already registered with the KV cache")
        if num_prompt_tokens < 1:
            raise SimulationError(f"request {rid}: a prompt needs at least one token")
        bs = self.block_size
        need = num_prompt_tokens // bs
        if block_hashes is None:
            hashes = self._core.extend_hashes(self._core.root_hash(rid), rid, 0, need)
        else:
            hashes = np.ascontiguousarray(block_hashes, dtype=np.uint64)
            if hashes.ndim != 1 or hashes.shape[0] < need:
                raise SimulationError(f"request {rid}: {hashes.shape[0]} block hashes for a "
                                      f"{num_prompt_tokens}-token prompt (needs {need})")
        r = _Req(rid, hashes, num_prompt_tokens, skip_prefix_cache, len(self.tiers))
        r.seed = self._core.mix64(rid & ((1 << 64) - 1))
        self._reqs[rid] = r

    def add_prefixed(self, rid: int, prefix: np.ndarray, shared: int, root: int, seed: int,
                     num_prompt_tokens: int) -> None:
        """:meth:`add_request` of a prefix-group request: its hashes are ``prefix[:shared]``
        then unique content (``core.prefixed_hashes``; ``shared`` is capped at the prompt's full
        blocks)."""
        need = num_prompt_tokens // self.block_size
        if prefix.dtype != np.uint64 or prefix.ndim != 1 or not 0 <= shared <= prefix.shape[0]:
            raise SimulationError(f"request {rid}: the prefix hashes must be a contiguous uint64 "
                                  f"array of at least {shared} entries")
        hashes = self._core.prefixed_hashes(prefix, min(shared, max(need, 0)), root, seed,
                                            max(need, 0))
        self.add_request(rid, hashes, num_prompt_tokens)

    def _req(self, rid: int) -> _Req:
        try:
            return self._reqs[rid]
        except KeyError:
            raise SimulationError(f"request {rid} is not registered with the KV cache") from None

    def _ensure_hashes(self, r: _Req, num_blocks: int) -> None:
        have = r.hashes.shape[0]
        if num_blocks > have:
            parent = int(r.hashes[have - 1]) if have else self._core.root_hash(r.rid)
            extra = self._core.extend_hashes(parent, r.seed, have, max(num_blocks - have, have))
            r.hashes = np.concatenate([r.hashes, extra])

    def _chunk_keys(self, r: _Req, nchunks: int) -> np.ndarray:
        bpc = self.config.blocks_per_chunk
        if nchunks * bpc > r.hashes.shape[0]:
            self._ensure_hashes(r, nchunks * bpc)
        if bpc == 1:
            return r.hashes[:nchunks]
        # A chunk is keyed by its last GPU block's hash, which chains over the whole prefix.
        return np.ascontiguousarray(r.hashes[bpc - 1: nchunks * bpc: bpc])

    # ------------------------------------------------------------------------------- counting
    def _flags_of(self, r: _Req, nchunks: int) -> np.ndarray:
        """The request's (tier, chunk) counted-flags, grown to ``nchunks`` chunks."""
        f = r.flags
        if f is None or f.shape[1] < nchunks:
            g = np.zeros((len(self.tiers), max(nchunks, 2 * f.shape[1] if f is not None else 0)),
                         dtype=np.uint8)
            if f is not None:
                g[:, :f.shape[1]] = f
            r.flags = f = g
        return f

    def _track(self, keys: np.ndarray, a: int, b: int) -> None:
        """store_threshold's reuse tracker: one count per chunk offered for storage, resident or not
        (LRU-bounded; vLLM's ``CPUOffloadingManager._record_accesses``, called by ``prepare_store``)."""
        tr = self._tracker
        for k in keys[a:b].tolist():
            c = tr.pop(k, 0)
            if not c and len(tr) >= self._tracker_max:
                del tr[next(iter(tr))]
            tr[k] = c + 1

    # ------------------------------------------------------------------------------- lookup
    def lookup(self, rid: int, now: float) -> Lookup:
        """Admission-time lookup of a waiting request (vLLM ``get_computed_blocks`` + the
        connector's ``get_num_new_matched_tokens``). Touches offload recency and counts the tiers'
        chunk queries/hits (once per request, tier and chunk); the prefix-cache counters move only
        in :meth:`admit`."""
        r = self._req(rid)
        bs, ct = self.block_size, self.chunk_tokens
        n_tok = r.num_tokens
        gpu = 0
        if not r.skip:
            gpu = self.pool.lookup(r.hashes, (n_tok - 1) // bs) * bs
        ext = host = disk = 0
        plan: list[tuple[int, int, int]] = []
        if self.tiers and not r.skip:
            nchunks = n_tok // ct
            keys = self._chunk_keys(r, nchunks)
            cpu = self.tiers[0]
            if cpu.arc:
                cpu.touch(keys, 0, nchunks)
            if nchunks * ct - gpu >= ct:
                start = gpu // ct
                flags = self._flags_of(r, nchunks)
                deltas = self._deltas
                pos, plan, counted = self._core.tier_walk(self.tiers, keys, start, nchunks, now,
                                                          flags, deltas)
                if counted:
                    for t, (dq, dh) in enumerate(deltas.tolist()):
                        tc = self._tier_counters[t]
                        tc["chunk_queries"] += dq
                        tc["chunk_hits"] += dh
                ext = ct * pos - gpu if pos > start else 0
                if ext < ct:
                    ext = 0
                    plan = []
                host, disk = self._split(plan, gpu)
        res = Lookup(gpu, ext, host, disk)
        r.lk, r.plan, r.lk_epoch, r.lk_now = res, plan, self._epoch, now
        return res

    def _split(self, plan: list[tuple[int, int, int]], gpu: int) -> tuple[int, int]:
        ct = self.chunk_tokens
        host = disk = 0
        for tier, a, b in plan:
            toks = ct * b - max(ct * a, gpu)
            if tier == 0:
                host += toks
            else:
                disk += toks
        return host, disk

    # ------------------------------------------------------------------------------- admission
    def admit(self, rid: int, num_new_tokens: int, now: float) -> Admission | None:
        """Allocate GPU blocks for a waiting request: its GPU hit, the external tokens to load
        and ``num_new_tokens`` to compute (vLLM passes 0 when loading asynchronously). Uses the
        :meth:`lookup` made just before (redone if the cache changed since). ``None``: not
        enough free blocks, nothing changed, nothing counted (preempt or keep waiting)."""
        r = self._req(rid)
        if r.nblocks:
            raise SimulationError(f"request {rid} is already admitted (it holds GPU blocks)")
        if r.lk is None or r.lk_epoch != self._epoch or r.lk_now != now:
            self.lookup(rid, now)
        lk = r.lk
        assert lk is not None
        bs = self.block_size
        gpu_blocks = lk.gpu_tokens // bs
        total = lk.gpu_tokens + lk.external_tokens + num_new_tokens
        before = self.pool.num_blocks_of(rid)
        if not self.pool.allocate(rid, r.hashes, gpu_blocks, total):
            return None
        self._epoch += 1
        r.lk = None
        ext, host, disk, ready = lk.external_tokens, lk.host_tokens, lk.disk_tokens, now
        if ext:
            ext, host, disk, ready = self._load(r, r.plan, lk.gpu_tokens, now)
            if ext:
                # The connector offers nothing below an external hit's boundary (its chunk-level policy:
                # OffloadingConnectorScheduler.update_state_after_alloc), GPU-hit head included.
                hit_end = -(-(lk.gpu_tokens + ext) // self.chunk_tokens)
                r.stored = max(r.stored, hit_end)
                self._accessed(r, r.plan[0][1], hit_end)
        gpu = lk.gpu_tokens
        c = self.counters
        if not r.skip:
            if r.preempted:
                c["preempted_queries"] += r.num_tokens
                c["preempted_hits"] += gpu
            else:
                c["prefix_cache_queries"] += r.num_tokens
                c["prefix_cache_hits"] += gpu
                if self.tiers and r.num_tokens - gpu:
                    c["external_queries"] += r.num_tokens - gpu
                    c["external_hits"] += ext
                by_src = c["cached_by_source"]
                by_src["device"] += gpu
                by_src["host"] += host
                by_src["disk"] += disk
        if not r.admitted:
            r.admitted = True
            r.cached = {"device": gpu, "host": host, "disk": disk}
        r.nblocks = self.pool.num_blocks_of(rid)
        new_blocks = r.nblocks - before - gpu_blocks
        c["block_hits"] += gpu_blocks + ext // bs
        c["block_misses"] += max(new_blocks - ext // bs, 0)
        computed = gpu + ext
        if computed >= r.num_tokens:
            computed = r.num_tokens - 1  # the last token is recomputed to sample the next one
        if ext:
            r.end = computed + num_new_tokens
            cache_to = gpu
        else:
            r.end = gpu + num_new_tokens
            cache_to = min(r.end, r.num_tokens)
        if -(-r.end // bs) > r.hashes.shape[0]:
            self._ensure_hashes(r, -(-r.end // bs))
        r.ncached = cache_to // bs
        self.pool.cache(rid, r.hashes, r.ncached)
        return Admission(computed, gpu, ext, host, disk, ready)

    def _load(self, r: _Req, plan: list[tuple[int, int, int]], gpu: int,
              now: float) -> tuple[int, int, int, float]:
        """Promote fs-resident chunks into the CPU tier, then load CPU → GPU. Returns the
        external/host/disk tokens actually loaded and the time the load is complete."""
        ct = self.chunk_tokens
        cpu = self.tiers[0]
        keys = self._chunk_keys(r, plan[-1][2])
        start = plan[0][1]
        cpu_ready = now
        end = start
        for tier, a, b in plan:
            if tier:
                done = self._promote(keys, tier, a, b, now)
                if done is None:
                    break
                cpu_ready = max(cpu_ready, done)
            end = b
        # vLLM pins none of a request's chunks before its load (prepare_load), so a promotion above can
        # evict this request's own CPU-resident chunks; a later lookup pass promotes each of them from an
        # fs tier in turn (TieringOffloadingManager.lookup), or the hit ends at the first no tier holds.
        repromoted: list[int] = []
        flags = None
        again = any(t for t, _, _ in plan)  # only a promotion can have evicted any
        while again:  # until a pass finds every chunk on the CPU (each promotion pins one more chunk)
            again = False
            c = start
            while c < end:
                if cpu.state_of(int(keys[c]), now) != self._core.ABSENT:
                    c += 1
                    continue
                if flags is None:
                    flags = self._flags_of(r, end)
                found = 0
                for t in range(1, len(self.tiers)):
                    hit = self.tiers[t].state_of(int(keys[c]), now) == self._core.READY
                    self._count_once(flags, t, c, hit)
                    if hit:
                        found = t
                        break
                done = self._promote(keys, found, c, c + 1, now) if found else None
                if done is None:
                    end = c
                    break
                cpu_ready = max(cpu_ready, done)
                repromoted.append(c)
                again = True
                c += 1
        kept = [(t, a, min(b, end)) for t, a, b in plan if a < end]
        ext = ct * end - gpu if end > start else 0
        if ext < ct:
            return 0, 0, 0, now
        nbytes = (ext // self.block_size) * self.config.bytes_per_block
        done, svc = self.stations[0].submit(True, nbytes, cpu_ready)
        tc = self.counters["tiers"][self.tier_labels[0]]
        tc["read_bytes"] += nbytes
        tc["read_time_us"] += svc
        tc["read_jobs"] += 1
        cpu.pin(keys, start, end, done)
        host, disk = self._split(kept, gpu)
        for c in repromoted:  # each at most once (a promotion stays pinned here): loaded from disk after all
            if c < end:
                toks = ct * (c + 1) - max(ct * c, gpu)
                host -= toks
                disk += toks
        return ext, host, disk, done

    def _promote(self, keys: np.ndarray, tier: int, a: int, b: int, now: float) -> float | None:
        """fs tier ``tier`` → CPU of chunks ``a … b−1`` (one read job); when it completes, or None when
        the CPU tier has no room (counted as an allocation failure)."""
        cpu = self.tiers[0]
        promoted = cpu.prepare_store(keys[a:b], now, _INF)
        if promoted is None:
            self.counters["tiers"][self.tier_labels[0]]["allocation_failures"] += 1
            return None
        cb = self.config.chunk_bytes
        done, svc = self.stations[tier].submit(True, (b - a) * cb, now)
        tc = self.counters["tiers"][self.tier_labels[tier]]
        tc["read_bytes"] += (b - a) * cb
        tc["read_time_us"] += svc
        tc["read_jobs"] += 1
        cpu.set_ready(promoted, done)
        self.counters["tiers"][self.tier_labels[0]]["promoted_chunks"] += len(promoted)
        self.tiers[tier].touch(keys, a, b)
        self.tiers[tier].pin(keys, a, b, done)
        return done

    def _count_once(self, flags: np.ndarray, tier: int, c: int, hit: bool) -> None:
        """One (request, tier, chunk) lookup into the tier's chunk counters, once: the core's ``_count``
        (the pure core's: this class runs on it)."""
        deltas = self._deltas
        deltas.fill(0)
        self._core._count(flags, deltas, tier, c, c + 1, hit)
        tc = self._tier_counters[tier]
        tc["chunk_queries"] += int(deltas[tier, 0])
        tc["chunk_hits"] += int(deltas[tier, 1])

    # ------------------------------------------------------------------------------- running
    def allocate(self, rid: int, num_new_tokens: int) -> bool:
        """Grow a scheduled request by ``num_new_tokens`` (a prefill chunk, a decode token, or
        the first compute after a load). ``False``: not enough free blocks (nothing changed).
        Full blocks up to the new end get their hashes registered (vLLM caches at scheduling)."""
        try:
            r = self._reqs[rid]
        except KeyError:
            r = self._req(rid)  # raises the SimulationError
        end = r.end + num_new_tokens
        bs = self.block_size
        need = -(-end // bs)
        full = end // bs
        if need > r.nblocks and full > r.ncached:  # a new block and a newly full one: one call
            if need > r.hashes.shape[0]:
                self._ensure_hashes(r, need)
            added = self.pool.allocate_and_cache(rid, r.hashes, end, full)
            if added < 0:
                return False
            self._epoch += 2 if added else 1
            self.counters["block_misses"] += need - r.nblocks
            r.nblocks = need
            r.ncached = full
            r.end = end
            if end > r.num_tokens:
                r.num_tokens = end
            return True
        if need > r.nblocks:  # most decode steps fit in the last block: no pool call
            if not self.pool.allocate(rid, r.hashes, 0, end):
                return False
            self._epoch += 1
            self.counters["block_misses"] += need - r.nblocks
            r.nblocks = need
        r.end = end
        if end > r.num_tokens:
            r.num_tokens = end
        if full > r.ncached:
            if need > r.hashes.shape[0]:
                self._ensure_hashes(r, need)
            if self.pool.cache(rid, r.hashes, full):
                self._epoch += 1
            r.ncached = full
        return True

    def computed(self, rid: int, now: float) -> None:
        """The tokens scheduled for ``rid`` are computed at ``now``: write-through stores of the
        chunks completed so far (the prompt's only, unless ``offload_prompt_only`` is off)."""
        r = self._req(rid)
        if not self.tiers:
            return
        limit = min(r.end, r.num_prompt) if self.config.offload_prompt_only else r.end
        nchunks = limit // self.chunk_tokens
        if nchunks <= r.stored:
            return
        keys = self._chunk_keys(r, nchunks)[r.stored:nchunks]
        self._accessed(r, r.stored, nchunks)
        if self._store(np.ascontiguousarray(keys), now):
            r.stored = nchunks
        # else: the CPU tier could not make room for the offer (an allocation failure, nothing
        # stored); as vLLM's connector scheduler, the request's stored index stays and its next
        # offer holds these chunks again with its new ones (docs/vllm-semantics.md §4; docs/kv.md
        # says where vLLM offers more often).

    @staticmethod
    def _accessed(r: _Req, a: int, b: int) -> None:
        r.acc_lo = a if r.acc_lo < 0 else min(r.acc_lo, a)
        r.acc_hi = max(r.acc_hi, b)

    def _store(self, keys: np.ndarray, now: float) -> bool:
        """Store an offer; False when the CPU tier could not make room for it (nothing stored)."""
        cb = self.config.chunk_bytes
        cpu = self.tiers[0]
        tcs = self._tier_counters
        tc0 = tcs[0]
        if self._threshold >= 2:
            # The offer counts first; then only chunks not in the CPU tier are store candidates, and a
            # candidate seen fewer than store_threshold times is skipped (CPUOffloadingManager.prepare_store).
            self._track(keys, 0, len(keys))
            tr = self._tracker
            absent = [k for k in keys.tolist() if cpu.state_of(k, now) == self._core.ABSENT]
            eligible = [k for k in absent if tr.get(k, 0) >= self._threshold]
            tc0["store_skipped_chunks"] += len(absent) - len(eligible)
            keys = np.array(eligible, dtype=np.uint64)
            if not len(keys):
                return True
        stored = cpu.prepare_store(keys, now, _INF)
        self._epoch += 1
        if stored is None:
            tc0["allocation_failures"] += 1
            return False
        n = len(stored)
        if not n:
            return True
        done, svc = self.stations[0].submit(False, n * cb, now)
        tc0["write_bytes"] += n * cb
        tc0["write_time_us"] += svc
        tc0["write_jobs"] += 1
        tc0["stored_chunks"] += n
        cpu.set_ready(stored, done)
        # Cascade: CPU → every secondary tier once the CPU copy exists; pinned until written.
        for t in range(1, len(self.tiers)):
            tier = self.tiers[t]
            tc = tcs[t]
            put = tier.prepare_store(stored, done, _INF)
            if put is None:
                tc["store_skipped_chunks"] += n
                tc["allocation_failures"] += 1
                continue
            m = len(put)
            if not m:
                continue
            t_done, t_svc = self.stations[t].submit(False, m * cb, done)
            tc["write_bytes"] += m * cb
            tc["write_time_us"] += t_svc
            tc["write_jobs"] += 1
            tc["stored_chunks"] += m
            tier.set_ready(put, t_done)
            cpu.pin(stored, 0, n, t_done)
        return True

    def free(self, rid: int) -> dict[str, int]:
        """A request finished (or was aborted): release its blocks, forget it. Returns its
        cached tokens by source (as :meth:`cached_by_source`)."""
        r = self._req(rid)
        self.pool.free(rid)
        self._epoch += 1
        if self.tiers and r.acc_lo >= 0 and not self.tiers[0].arc:
            # vLLM 0.32's LRU policy sets the recency of every chunk a request loaded or offered when the
            # request finishes, in reverse prefix order: its head ends up newest (LRUCachePolicy.on_request_
            # finished); lookups do not touch it.
            self.tiers[0].touch(self._chunk_keys(r, r.acc_hi), r.acc_lo, r.acc_hi)
        del self._reqs[r.rid]
        return dict(r.cached)

    def preempt(self, rid: int) -> None:
        """Recompute preemption: release the blocks (tail first), keep the request registered;
        its next admission looks up again but is not counted in the prefix-cache counters."""
        r = self._req(rid)
        self.pool.free(rid)
        self._epoch += 1
        r.end = r.nblocks = r.ncached = 0
        r.preempted = True
        r.lk = None

    # ------------------------------------------------------------------------------- reading
    def cached_by_source(self, rid: int) -> dict[str, int]:
        """Cached prompt tokens of ``rid`` at its first admission, by source."""
        return dict(self._req(rid).cached)

    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def _request_states(self) -> dict[int, tuple[Any, ...]]:
        return {rid: (r.end, r.stored, r.num_tokens, r.preempted, dict(r.cached))
                for rid, r in sorted(self._reqs.items())}

    def usage(self) -> float:
        """vLLM's ``kv_cache_usage_perc``."""
        return self.pool.usage()

def _invariant_problems(cache: Readouts) -> list[str]:
    p: list[str] = []
    s = cache.pool.state()
    ref, hashes, queue = s["ref"], s["hash"], s["free_queue"]
    n = len(ref)
    if any(x < 0 for x in ref):
        p.append("negative reference count")
    if len(queue) != s["num_free"] or len(set(queue)) != len(queue):
        p.append("free queue length/duplicates")
    inq = set(queue)
    if 0 in inq:
        p.append("null block in the free queue")
    for b in range(1, n):
        if (b in inq) == (ref[b] > 0):
            p.append(f"block {b}: ref {ref[b]} but in queue={b in inq}")
            break
    mp = dict(s["map"])
    if len(mp) != len(s["map"]):
        p.append("hash mapped twice")
    held = [h for h in hashes if h]
    if len(held) != len(set(held)):
        p.append("a hash held by two blocks")
    for h, b in mp.items():
        if hashes[b] != h:
            p.append(f"map entry {h}->{b} disagrees with the block")
            break
    if len(held) != len(mp):
        p.append("hashed blocks missing from the map")
    owners: dict[int, int] = {}
    for blocks in s["requests"].values():
        for b in blocks:
            owners[b] = owners.get(b, 0) + 1
    for b, k in owners.items():
        if ref[b] != k:
            p.append(f"block {b}: ref {ref[b]} != owners {k}")
            break
    for i, tier in enumerate(cache.tiers):
        cap = tier.capacity
        if cap > 0 and len(tier) > cap:
            p.append(f"tier {cache.tier_labels[i]} over capacity: {len(tier)} > {cap}")
        ks = tier.keys()
        if len(ks) != len(set(ks)):
            p.append(f"tier {cache.tier_labels[i]}: duplicate key")
        # Every chunk put into a tier is still there unless it was evicted.
        tc = cache.counters["tiers"][cache.tier_labels[i]]
        if len(ks) != tc["stored_chunks"] + tc["promoted_chunks"] - tier.evictions:
            p.append(f"tier {cache.tier_labels[i]}: {len(ks)} resident != stored "
                     f"{tc['stored_chunks']} + promoted {tc['promoted_chunks']} - evicted "
                     f"{tier.evictions}")
    for label, t in cache.counters["tiers"].items():
        if t["chunk_hits"] > t["chunk_queries"]:
            p.append(f"tier {label}: hits > queries")
    c = cache.counters
    if c["prefix_cache_hits"] > c["prefix_cache_queries"]:
        p.append("prefix hits > queries")
    if c["external_hits"] > c["external_queries"]:
        p.append("external hits > queries")
    return p
