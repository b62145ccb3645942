# The compiled twin of blis_sim/kv/cache.py (KVCache's request layer) and of
# blis_sim/kv/station.py (TransferStation), included into _core.pyx so that it calls the pool's and
# the tiers' cdef methods on raw arrays. Same operations in the same order as the pure code, so the
# two give identical states, counters and float times (tests/test_kv_parity.py); the docstrings and
# the reasoning live in the pure modules.
cimport cython
cimport numpy as cnp
from cpython.pycapsule cimport PyCapsule_New

from blis_sim.kv._port_calls cimport Admitted, PortCalls

from blis_sim.errors import SimulationError
from blis_sim.kv.cache import Admission, Lookup, SOURCES, new_tier_counters

cdef Py_ssize_t _HASH_AHEAD = 4  # blocks hashed at least per extension of a request's hashes


@cython.final
cdef class Station:
    """Compiled :class:`blis_sim.kv.station.TransferStation`."""

    cdef public object cfg
    cdef vector[double] _rfree, _wfree
    cdef double base, rbw, wbw, f1, sigma
    cdef int qsat
    cdef bint flat
    cdef object _rng

    def __init__(self, cfg, seed):
        self.cfg = cfg
        self._rfree.assign(cfg.n_read_threads, 0.0)
        self._wfree.assign(cfg.n_write_threads, 0.0)
        self.base, self.rbw, self.wbw = cfg.base_latency, cfg.read_bandwidth, cfg.write_bandwidth
        self.qsat, self.f1 = cfg.saturation_queue_depth, cfg.single_transfer_fraction
        self.sigma = cfg.latency_jitter_stddev
        self._rng = np.random.default_rng(seed) if self.sigma > 0 else None
        self.flat = self.qsat < 2 or self.f1 <= 0.0 or self.f1 >= 1.0

    cdef double _ramp(self, int q) noexcept:
        if self.flat or q >= self.qsat:
            return 1.0
        return self.f1 + (1.0 - self.f1) * (q - 1) / (self.qsat - 1)

    def service_time(self, bint read, int64_t nbytes, int q):
        return self.base + nbytes / ((self.rbw if read else self.wbw) * self._ramp(q))

    def submit(self, bint read, int64_t nbytes, double t):
        cdef double svc
        cdef double done = self._submit(read, nbytes, t, &svc)
        return done, svc

    cdef double _submit(self, bint read, int64_t nbytes, double t, double* svc_out) except? -1:
        cdef vector[double]* servers = &self._rfree if read else &self._wfree
        cdef Py_ssize_t i, best = 0, n = servers.size()
        cdef double free = deref(servers)[0]
        cdef double start, svc
        cdef int q
        for i in range(1, n):
            if deref(servers)[i] < free:
                free = deref(servers)[i]
                best = i
        start = t if t > free else free
        if self.flat:
            svc = self.base + <double>nbytes / ((self.rbw if read else self.wbw) * 1.0)
        else:
            q = 1
            for i in range(n):
                if deref(servers)[i] > start:
                    q += 1
            svc = self.base + <double>nbytes / ((self.rbw if read else self.wbw) * self._ramp(q))
        if self._rng is not None:
            svc *= max(0.05, 1.0 + float(self._rng.normal(0.0, self.sigma)))
        deref(servers)[best] = start + svc
        svc_out[0] = svc
        return start + svc


@cython.final
cdef class _Req:
    """Per-request state (the pure ``_Req``), with the block hashes in a C++ vector."""

    cdef int64_t rid, num_prompt, num_tokens, end, stored, nblocks, ncached, lk_epoch
    cdef int64_t acc_lo, acc_hi  # chunks loaded or offered: their LRU recency is set at finish
    cdef bint preempted, skip, admitted, has_lk
    cdef bint live  # registered with its cache (a port's reference to it is current)
    cdef uint64_t seed
    cdef double lk_now
    cdef int64_t lk[4]
    cdef int64_t cached[3]
    cdef vector[uint64_t] hashes
    cdef vector[int32_t] lk_blocks  # first lk[0] // block_size: the GPU blocks the last lookup found
    cdef vector[Span] plan
    cdef vector[unsigned char] flags  # tiers × flags_cols: (tier, chunk) counted bits
    cdef Py_ssize_t flags_cols


cdef inline void _accessed(_Req r, int64_t a, int64_t b) noexcept:
    r.acc_lo = a if r.acc_lo < 0 else min(r.acc_lo, a)
    r.acc_hi = max(r.acc_hi, b)


cdef inline object _as_lookup(_Req r):
    """``r``'s last lookup as a :class:`Lookup` (built without a Python frame)."""
    return tuple.__new__(Lookup, (r.lk[0], r.lk[1], r.lk[2], r.lk[3]))


cdef inline object _as_admission(Admitted* a):
    return tuple.__new__(Admission, (a.computed, a.gpu, a.external, a.host, a.disk, a.ready))


# one tier's counters: the ints of new_tier_counters() by index (_TC_INT_NAMES), then its two
# float times in their own vectors
cdef tuple _TC_INT_NAMES = ("chunk_queries", "chunk_hits", "read_bytes", "read_jobs", "write_bytes",
                            "write_jobs", "stored_chunks", "promoted_chunks",
                            "store_skipped_chunks", "evictions", "allocation_failures")
cdef enum:
    CQ = 0
    CH = 1
    RB = 2
    RJ = 3
    WB = 4
    WJ = 5
    SC = 6
    PC = 7
    SK = 8
    AF = 10
    _TC_INTS = 11


cdef class CacheCore:
    """Compiled :class:`blis_sim.kv.cache.KVCache` (hot paths); :class:`blis_sim.kv.CompiledKVCache`
    adds the read-outs shared with the pure class."""

    # Its C methods are ``final`` (a Python subclass adds read-outs, never overrides them): called
    # directly instead of through the vtable, so the C compiler may inline them.

    cdef public object config, pool, tiers, stations, tier_labels
    cdef public bint compiled
    cdef public int block_size, chunk_tokens
    cdef BlockPool _pool
    cdef int bpc, ntiers
    cdef int64_t chunk_bytes, bytes_per_block
    cdef bint prompt_only
    cdef int _threshold
    cdef Py_ssize_t _tracker_max
    cdef dict _tracker, _reqs
    cdef int64_t _epoch
    # prefix_cache q/h, preempted q/h, external q/h, by source device/host/disk, block hits/misses
    cdef int64_t c_pq, c_ph, c_rq, c_rh, c_eq, c_eh, c_dev, c_host, c_disk, c_bh, c_bm
    cdef vector[int64_t] _tc  # ntiers × _TC_INTS
    cdef vector[double] _rt, _wt  # read/write time per tier
    cdef vector[int64_t] _deltas
    cdef vector[uint64_t] _keys_tmp, _stored, _put
    cdef vector[int64_t] _stored_slots, _put_slots  # the slots _prepare_store made for them

    def __init__(self, config):
        self.config = config
        self.compiled = True
        self.block_size = config.block_size
        self.chunk_tokens = config.chunk_tokens
        self.bpc = config.blocks_per_chunk
        self.chunk_bytes = config.chunk_bytes
        self.bytes_per_block = config.bytes_per_block
        self.prompt_only = config.offload_prompt_only
        self._pool = BlockPool(config.num_gpu_blocks, config.block_size, config.enable_caching)
        self.pool = self._pool
        self.tier_labels = config.tier_labels
        self.tiers = []
        self.stations = []
        if config.cpu is not None:
            self.tiers.append(ChunkStore(config.cpu.num_chunks, config.cpu.eviction_policy))
            self.stations.append(Station(config.cpu.link, config.seed * 1000003))
            for i, fs in enumerate(config.fs_tiers):
                cap = -1 if fs.max_bytes is None else fs.max_bytes // max(config.chunk_bytes, 1)
                self.tiers.append(ChunkStore(cap, "lru"))
                self.stations.append(Station(fs.station, config.seed * 1000003 + i + 1))
        self.ntiers = len(self.tiers)
        self._threshold = config.cpu.store_threshold if config.cpu is not None else 0
        self._tracker_max = config.cpu.max_tracker_size if config.cpu is not None else 0
        self._tracker = {}
        self._reqs = {}
        self._epoch = 0
        self._tc.assign(self.ntiers * _TC_INTS, 0)
        self._rt.assign(self.ntiers, 0.0)
        self._wt.assign(self.ntiers, 0.0)
        self._deltas.assign(2 * self.ntiers, 0)

    # ------------------------------------------------------------------------------- requests
    def add_request(self, int64_t rid, block_hashes, int64_t num_prompt_tokens, *,
                    bint skip_prefix_cache=False):
        cdef _Req r = self._new_req(rid, num_prompt_tokens, skip_prefix_cache)
        cdef Py_ssize_t need = num_prompt_tokens // self.block_size
        cdef cnp.ndarray arr
        cdef const uint64_t* h
        if block_hashes is None:
            _extend(r.hashes, _mix(_SEED ^ <uint64_t>rid), <uint64_t>rid, 0, need)
        else:
            arr = np.ascontiguousarray(block_hashes, dtype=np.uint64)
            if arr.ndim != 1 or arr.shape[0] < need:
                raise SimulationError(f"request {rid}: {arr.shape[0]} block hashes for a "
                                      f"{num_prompt_tokens}-token prompt (needs {need})")
            h = <const uint64_t*>cnp.PyArray_DATA(arr)
            r.hashes.assign(h, h + arr.shape[0])
        self._reqs[rid] = r

    def add_prefixed(self, int64_t rid, cnp.ndarray prefix, Py_ssize_t shared, root, seed,
                     int64_t num_prompt_tokens):
        """:meth:`add_request` with the hashes ``prefixed_hashes(prefix, shared, root, seed,
        num_prompt_tokens // block_size)`` built in place (a prefix-group request)."""
        self._add_prefixed(rid, prefix, shared, root, <uint64_t>(int(seed) & 0xFFFFFFFFFFFFFFFF),
                           num_prompt_tokens)

    @cython.final
    cdef _Req _add_prefixed(self, int64_t rid, cnp.ndarray prefix, Py_ssize_t shared, object root,
                            uint64_t seed, int64_t num_prompt_tokens):
        """Registers the request; returns its state (the port keeps it: no lookup by id)."""
        cdef _Req r = self._new_req(rid, num_prompt_tokens, False)
        # checked in C: a numpy dtype comparison builds Python objects, and this runs once per request
        if (not (cnp.PyArray_ISUNSIGNED(prefix) and cnp.PyArray_ITEMSIZE(prefix) == 8)
                or not cnp.PyArray_ISNOTSWAPPED(prefix)
                or cnp.PyArray_NDIM(prefix) != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(prefix)
                or not 0 <= shared <= prefix.shape[0]):
            raise SimulationError(f"request {rid}: the prefix hashes must be a contiguous uint64 "
                                  f"array of at least {shared} entries")
        cdef Py_ssize_t need = num_prompt_tokens // self.block_size
        cdef const uint64_t* pre = <const uint64_t*>cnp.PyArray_DATA(prefix)
        if shared > need:
            shared = need
        r.hashes.reserve(need)
        r.hashes.assign(pre, pre + shared)
        _extend(r.hashes, pre[shared - 1] if shared else <uint64_t>int(root), seed, shared, need - shared)
        self._reqs[rid] = r
        return r

    @cython.final
    cdef _Req _new_req(self, int64_t rid, int64_t num_prompt_tokens, bint skip):
        """A new request's state, hashes still empty (the caller fills them and registers it)."""
        if rid in self._reqs:
            raise SimulationError(f"request {rid} is already registered with the KV cache")
        if num_prompt_tokens < 1:
            raise SimulationError(f"request {rid}: a prompt needs at least one token")
        cdef _Req r = _Req.__new__(_Req)  # (no call of the type: it has no __init__)
        r.rid = rid
        r.num_prompt = r.num_tokens = num_prompt_tokens
        r.skip = skip
        r.seed = _mix(<uint64_t>rid)
        r.lk_epoch = -1
        r.acc_lo = -1
        r.live = True
        return r

    @cython.final
    cdef _Req _req(self, int64_t rid):
        r = self._reqs.get(rid)
        if r is None:
            raise SimulationError(f"request {rid} is not registered with the KV cache")
        return <_Req>r

    @cython.final
    cdef void _ensure_hashes(self, _Req r, Py_ssize_t num_blocks) noexcept:
        cdef Py_ssize_t have = r.hashes.size()
        cdef uint64_t parent
        if num_blocks > have:
            parent = r.hashes[have - 1] if have else _mix(_SEED ^ <uint64_t>r.rid)
            # a few blocks ahead, not the pure twin's doubling (its arrays are copied on growth; a
            # vector is not): doubling would hash a whole prompt's length again at the first
            # decode block, for blocks most requests never reach. Which blocks a lookup
            # or cache call reads is bounded by the request's tokens, not by the hashes held.
            _extend(r.hashes, parent, r.seed, have, max(num_blocks - have, _HASH_AHEAD))

    @cython.final
    cdef const uint64_t* _chunk_keys(self, _Req r, Py_ssize_t nchunks) noexcept:
        """The chunk keys 0..nchunks of ``r`` (valid until the next call)."""
        cdef Py_ssize_t i, bpc = self.bpc
        if nchunks * bpc > <Py_ssize_t>r.hashes.size():
            self._ensure_hashes(r, nchunks * bpc)
        if bpc == 1:
            return r.hashes.data()
        # A chunk is keyed by its last GPU block's hash, which chains over the whole prefix.
        self._keys_tmp.resize(nchunks)
        for i in range(nchunks):
            self._keys_tmp[i] = r.hashes[(i + 1) * bpc - 1]
        return self._keys_tmp.data()

    @cython.final
    cdef void _grow_flags(self, _Req r, Py_ssize_t nchunks) noexcept:
        cdef Py_ssize_t old = r.flags_cols, cols, t, i
        if old >= nchunks:
            return
        cols = max(nchunks, 2 * old)
        cdef vector[unsigned char] g
        g.assign(self.ntiers * cols, 0)
        for t in range(self.ntiers):
            for i in range(old):
                g[t * cols + i] = r.flags[t * old + i]
        r.flags.swap(g)
        r.flags_cols = cols

    # ------------------------------------------------------------------------------- lookup
    def lookup(self, int64_t rid, double now):
        cdef _Req r = self._req(rid)
        self._lookup(r, now)
        return _as_lookup(r)

    @cython.final
    cdef int _lookup(self, _Req r, double now) except -1:
        cdef int64_t bs = self.block_size, ct = self.chunk_tokens
        cdef int64_t n_tok = r.num_tokens, gpu = 0, ext = 0, pos, start, nchunks
        cdef Py_ssize_t t
        cdef const uint64_t* keys
        cdef ChunkStore cpu
        r.plan.clear()
        if not r.skip:
            gpu = self._pool._lookup(r.hashes.data(), min((n_tok - 1) // bs, <int64_t>r.hashes.size()),
                                     &r.lk_blocks) * bs
        if self.ntiers and not r.skip:
            nchunks = n_tok // ct
            keys = self._chunk_keys(r, nchunks)
            cpu = <ChunkStore>self.tiers[0]
            if cpu.arc:
                cpu._touch(keys, 0, nchunks)
            if nchunks * ct - gpu >= ct:
                start = gpu // ct
                self._grow_flags(r, nchunks)
                pos = _walk(self.tiers, keys, start, nchunks, now, r.flags.data(), r.flags_cols,
                            self._deltas.data(), r.plan)
                for t in range(self.ntiers):
                    self._tc[t * _TC_INTS + CQ] += self._deltas[2 * t]
                    self._tc[t * _TC_INTS + CH] += self._deltas[2 * t + 1]
                ext = ct * pos - gpu if pos > start else 0
                if ext < ct:
                    ext = 0
                    r.plan.clear()
        r.lk[0], r.lk[1] = gpu, ext
        self._split(r.plan, gpu, &r.lk[2])
        r.has_lk, r.lk_epoch, r.lk_now = True, self._epoch, now
        return 0

    @cython.final
    cdef void _split(self, vector[Span]& plan, int64_t gpu, int64_t* out) noexcept:
        cdef int64_t ct = self.chunk_tokens, toks
        cdef size_t i
        out[0] = out[1] = 0
        for i in range(plan.size()):
            toks = ct * plan[i].b - max(ct * plan[i].a, gpu)
            out[0 if plan[i].tier == 0 else 1] += toks

    # ------------------------------------------------------------------------------- admission
    def admit(self, int64_t rid, int64_t num_new_tokens, double now):
        cdef Admitted a
        return _as_admission(&a) if self._admit(rid, num_new_tokens, now, &a) else None

    @cython.final
    cdef bint _admit(self, int64_t rid, int64_t num_new_tokens, double now, Admitted* out) except -1:
        """The admission into ``out``; False (nothing changed) when the GPU has no room."""
        return self._admit_r(self._req(rid), num_new_tokens, now, out)

    @cython.final
    cdef bint _admit_r(self, _Req r, int64_t num_new_tokens, double now, Admitted* out) except -1:
        cdef int64_t rid = r.rid
        cdef int64_t bs = self.block_size
        cdef int64_t gpu, gpu_blocks, total, before, ext, host, disk, computed, cache_to, new_blocks, first, hit_end
        cdef double ready
        cdef int64_t loaded[3]
        if r.nblocks:
            raise SimulationError(f"request {rid} is already admitted (it holds GPU blocks)")
        if not r.has_lk or r.lk_epoch != self._epoch or r.lk_now != now:
            self._lookup(r, now)
        gpu = r.lk[0]
        gpu_blocks = gpu // bs
        total = gpu + r.lk[1] + num_new_tokens
        before = self._pool._num_blocks_of(rid)
        # the lookup is current (same epoch and time): its blocks are the ones to take
        if not self._pool._allocate(rid, r.hashes.data(), gpu_blocks, total, r.lk_blocks.data()):
            return False
        self._epoch += 1
        r.has_lk = False
        ext, host, disk, ready = r.lk[1], r.lk[2], r.lk[3], now
        if ext:
            first = r.plan.front().a
            ready = self._load(r, gpu, now, loaded)
            ext, host, disk = loaded[0], loaded[1], loaded[2]
            if ext:
                # Nothing below an external hit's boundary is offered again (the pure admit).
                hit_end = -(-(gpu + ext) // self.chunk_tokens)
                r.stored = max(r.stored, hit_end)
                _accessed(r, first, hit_end)
        if not r.skip:
            if r.preempted:
                self.c_rq += r.num_tokens
                self.c_rh += gpu
            else:
                self.c_pq += r.num_tokens
                self.c_ph += gpu
                if self.ntiers and r.num_tokens - gpu:
                    self.c_eq += r.num_tokens - gpu
                    self.c_eh += ext
                self.c_dev += gpu
                self.c_host += host
                self.c_disk += disk
        if not r.admitted:
            r.admitted = True
            r.cached[0], r.cached[1], r.cached[2] = gpu, host, disk
        r.nblocks = self._pool._num_blocks_of(rid)
        new_blocks = r.nblocks - before - gpu_blocks
        self.c_bh += gpu_blocks + ext // bs
        self.c_bm += max(new_blocks - ext // bs, 0)
        computed = gpu + ext
        if computed >= r.num_tokens:
            computed = r.num_tokens - 1  # the last token is recomputed to sample the next one
        if ext:
            r.end = computed + num_new_tokens
            cache_to = gpu
        else:
            r.end = gpu + num_new_tokens
            cache_to = min(r.end, r.num_tokens)
        if (r.end + bs - 1) // bs > <int64_t>r.hashes.size():
            self._ensure_hashes(r, (r.end + bs - 1) // bs)
        r.ncached = cache_to // bs
        self._pool._cache(rid, r.hashes.data(), r.hashes.size(), r.ncached)
        out.computed, out.gpu, out.external, out.host, out.disk, out.ready = computed, gpu, ext, host, disk, ready
        return True

    @cython.final
    cdef double _load(self, _Req r, int64_t gpu, double now, int64_t* out) except? -1:
        """Promote fs-resident chunks into the CPU tier, then load CPU → GPU: ``out`` = loaded
        external/host/disk tokens; returns the time the load is complete (the pure ``_load``)."""
        cdef int64_t ct = self.chunk_tokens, nbytes, ext, toks
        cdef ChunkStore cpu = <ChunkStore>self.tiers[0]
        cdef ChunkStore tier
        cdef Station st
        cdef const uint64_t* keys = self._chunk_keys(r, r.plan.back().b)
        cdef Py_ssize_t start = r.plan[0].a, end = start, a, b, i, c
        cdef int t, found
        cdef double cpu_ready = now, done, svc
        cdef bint hit, again
        cdef vector[Span] kept
        cdef vector[Py_ssize_t] repromoted
        cdef Span sp
        for i in range(<Py_ssize_t>r.plan.size()):
            t, a, b = r.plan[i].tier, r.plan[i].a, r.plan[i].b
            if t:
                done = self._promote(keys, t, a, b, now)
                if done < 0:
                    break
                cpu_ready = max(cpu_ready, done)
            end = b
        # A promotion above can evict this request's own CPU-resident chunks (vLLM pins none before the
        # load); each is promoted from an fs tier in turn, or the hit ends there (the pure _load).
        again = False  # only a promotion can have evicted any
        for i in range(<Py_ssize_t>r.plan.size()):
            if r.plan[i].tier:
                again = True
        while again:  # until a pass finds every chunk on the CPU (the pure _load)
            again = False
            c = start
            while c < end:
                if cpu._resident(keys[c]) >= 0:
                    c += 1
                    continue
                found = 0
                for t in range(1, self.ntiers):
                    tier = <ChunkStore>self.tiers[t]
                    i = tier._resident(keys[c])
                    hit = i >= 0 and tier.ready_of(i) <= now
                    self._deltas[2 * t] = self._deltas[2 * t + 1] = 0
                    _count(r.flags.data(), r.flags_cols, self._deltas.data(), t, c, c + 1, hit)
                    self._tc[t * _TC_INTS + CQ] += self._deltas[2 * t]
                    self._tc[t * _TC_INTS + CH] += self._deltas[2 * t + 1]
                    if hit:
                        found = t
                        break
                done = self._promote(keys, found, c, c + 1, now) if found else -1.0
                if done < 0:
                    end = c
                    break
                cpu_ready = max(cpu_ready, done)
                repromoted.push_back(c)
                again = True
                c += 1
        for i in range(<Py_ssize_t>r.plan.size()):
            if r.plan[i].a < end:
                sp = r.plan[i]
                sp.b = min(sp.b, end)
                kept.push_back(sp)
        ext = ct * end - gpu if end > start else 0
        if ext < ct:
            out[0] = out[1] = out[2] = 0
            return now
        nbytes = (ext // self.block_size) * self.bytes_per_block
        st = <Station>self.stations[0]
        done = st._submit(True, nbytes, cpu_ready, &svc)
        self._tc[RB] += nbytes
        self._rt[0] += svc
        self._tc[RJ] += 1
        cpu._pin(keys, start, end, done)
        out[0] = ext
        self._split(kept, gpu, out + 1)
        for i in range(<Py_ssize_t>repromoted.size()):  # each at most once: a promotion stays pinned here
            c = repromoted[i]
            if c < end:  # found on the CPU at lookup, loaded from disk after all
                toks = ct * (c + 1) - max(ct * c, gpu)
                out[1] -= toks
                out[2] += toks
        return done

    @cython.final
    cdef double _promote(self, const uint64_t* keys, int t, Py_ssize_t a, Py_ssize_t b,
                         double now) except? -2:
        """fs tier ``t`` → CPU of chunks ``a … b−1`` (one read job): its completion time, or -1 when the
        CPU tier has no room (an allocation failure; the pure ``_promote``)."""
        cdef int64_t cb = self.chunk_bytes
        cdef ChunkStore cpu = <ChunkStore>self.tiers[0]
        cdef ChunkStore tier = <ChunkStore>self.tiers[t]
        cdef Station st = <Station>self.stations[t]
        cdef double done, svc
        if not cpu._prepare_store(keys + a, b - a, now, INF, self._put, self._put_slots):
            self._tc[AF] += 1
            return -1.0
        done = st._submit(True, (b - a) * cb, now, &svc)
        self._tc[t * _TC_INTS + RB] += (b - a) * cb
        self._rt[t] += svc
        self._tc[t * _TC_INTS + RJ] += 1
        cpu._set_ready_slots(self._put_slots.data(), self._put.size(), done, done)
        self._tc[PC] += self._put.size()
        tier._touch(keys, a, b)
        tier._pin(keys, a, b, done)
        return done

    # ------------------------------------------------------------------------------- running
    def allocate(self, int64_t rid, int64_t num_new_tokens):
        return self._grow(rid, num_new_tokens)

    @cython.final
    cdef bint _grow(self, int64_t rid, int64_t num_new_tokens) except -1:
        return self._grow_r(self._req(rid), num_new_tokens)

    @cython.final
    cdef bint _grow_r(self, _Req r, int64_t num_new_tokens) except -1:
        cdef int64_t rid = r.rid
        cdef int64_t end = r.end + num_new_tokens, bs = self.block_size
        cdef int64_t need = (end + bs - 1) // bs, full = end // bs
        cdef Py_ssize_t added
        if need > r.nblocks and full > r.ncached:  # a new block and a newly full one: one call
            if need > <int64_t>r.hashes.size():
                self._ensure_hashes(r, need)
            added = self._pool._allocate_and_cache(rid, r.hashes.data(), r.hashes.size(), end, full)
            if added < 0:
                return False
            self._epoch += 2 if added else 1
            self.c_bm += need - r.nblocks
            r.nblocks = need
            r.ncached = full
            r.end = end
            if end > r.num_tokens:
                r.num_tokens = end
            return True
        if need > r.nblocks:  # most decode steps fit in the last block: no pool call
            if not self._pool._allocate(rid, r.hashes.data(), 0, end, NULL):
                return False
            self._epoch += 1
            self.c_bm += need - r.nblocks
            r.nblocks = need
        r.end = end
        if end > r.num_tokens:
            r.num_tokens = end
        if full > r.ncached:
            if need > <int64_t>r.hashes.size():
                self._ensure_hashes(r, need)
            if self._pool._cache(rid, r.hashes.data(), r.hashes.size(), full):
                self._epoch += 1
            r.ncached = full
        return True

    def computed(self, int64_t rid, double now):
        self._computed(rid, now)

    @cython.final
    cdef int _computed(self, int64_t rid, double now) except -1:
        return self._computed_r(self._req(rid), now)

    @cython.final
    cdef int _computed_r(self, _Req r, double now) except -1:
        cdef int64_t limit, nchunks
        cdef const uint64_t* keys
        if not self.ntiers:
            return 0
        limit = min(r.end, r.num_prompt) if self.prompt_only else r.end
        nchunks = limit // self.chunk_tokens
        if nchunks <= r.stored:
            return 0
        keys = self._chunk_keys(r, nchunks)
        _accessed(r, r.stored, nchunks)
        if not self._store(keys + r.stored, nchunks - r.stored, now):
            r.stored = nchunks  # a failed allocation offers the same chunks again in the next offer (the pure computed)
        return 0

    @cython.final
    cdef int _store(self, const uint64_t* keys, Py_ssize_t nkeys, double now) except -1:
        cdef int64_t cb = self.chunk_bytes, n, m
        cdef ChunkStore cpu = <ChunkStore>self.tiers[0]
        cdef ChunkStore tier
        cdef Station st
        cdef double done, svc, t_done, t_svc, pin
        cdef Py_ssize_t t, i
        cdef vector[uint64_t] eligible
        cdef Py_ssize_t absent = 0
        if self._threshold >= 2:
            # The offer counts first (resident chunks too); then a chunk not in the CPU tier is stored
            # only once seen store_threshold times (the pure _store; CPUOffloadingManager.prepare_store).
            tr = self._tracker
            for i in range(nkeys):
                k = keys[i]
                c = tr.pop(k, 0)
                if not c and len(tr) >= self._tracker_max:
                    del tr[next(iter(tr))]
                tr[k] = c + 1
            for i in range(nkeys):
                if cpu._resident(keys[i]) < 0:
                    absent += 1
                    if tr[keys[i]] >= self._threshold:
                        eligible.push_back(keys[i])
            self._tc[SK] += absent - <Py_ssize_t>eligible.size()
            if not eligible.size():
                return 0
            keys, nkeys = eligible.data(), eligible.size()
        ok = cpu._prepare_store(keys, nkeys, now, INF, self._stored, self._stored_slots)
        self._epoch += 1
        if not ok:
            self._tc[AF] += 1
            return 1
        n = self._stored.size()
        if not n:
            return 0
        st = <Station>self.stations[0]
        done = st._submit(False, n * cb, now, &svc)
        self._tc[WB] += n * cb
        self._wt[0] += svc
        self._tc[WJ] += 1
        self._tc[SC] += n
        # Cascade: CPU → every secondary tier once the CPU copy exists; pinned until written (the
        # CPU copies' ready time and pin are set once, after: no tier's store reads them)
        pin = done
        for t in range(1, self.ntiers):
            tier = <ChunkStore>self.tiers[t]
            if not tier._prepare_store(self._stored.data(), n, done, INF, self._put, self._put_slots):
                self._tc[t * _TC_INTS + SK] += n
                self._tc[t * _TC_INTS + AF] += 1
                continue
            m = self._put.size()
            if not m:
                continue
            st = <Station>self.stations[t]
            t_done = st._submit(False, m * cb, done, &t_svc)
            self._tc[t * _TC_INTS + WB] += m * cb
            self._wt[t] += t_svc
            self._tc[t * _TC_INTS + WJ] += 1
            self._tc[t * _TC_INTS + SC] += m
            tier._set_ready_slots(self._put_slots.data(), m, t_done, t_done)
            pin = max(pin, t_done)
        cpu._set_ready_slots(self._stored_slots.data(), n, done, pin)
        return 0

    def free(self, int64_t rid):
        cdef _Req r = self._finish(rid)
        return {"device": r.cached[0], "host": r.cached[1], "disk": r.cached[2]}

    @cython.final
    cdef _Req _finish(self, int64_t rid):
        """Release ``rid``: its state, no longer registered."""
        cdef _Req r = self._req(rid)
        self._finish_r(r)
        return r

    @cython.final
    cdef int _finish_r(self, _Req r) except -1:
        cdef ChunkStore cpu
        self._pool._free(r.rid)
        self._epoch += 1
        if self.ntiers and r.acc_lo >= 0:
            cpu = <ChunkStore>self.tiers[0]
            if not cpu.arc:  # LRU recency at finish, in reverse prefix order (the pure free)
                cpu._touch(self._chunk_keys(r, r.acc_hi), r.acc_lo, r.acc_hi)
        del self._reqs[r.rid]
        r.live = False
        return 0

    def preempt(self, int64_t rid):
        self._preempt(rid)

    @cython.final
    cdef int _preempt(self, int64_t rid) except -1:
        return self._preempt_r(self._req(rid))

    @cython.final
    cdef int _preempt_r(self, _Req r) except -1:
        self._pool._free(r.rid)
        self._epoch += 1
        r.end = r.nblocks = r.ncached = 0
        r.preempted = True
        r.has_lk = False
        return 0

    # ------------------------------------------------------------------------------- reading
    def cached_by_source(self, int64_t rid):
        cdef _Req r = self._req(rid)
        return {"device": r.cached[0], "host": r.cached[1], "disk": r.cached[2]}

    def num_free_blocks(self):
        return self._pool.num_free

    def usage(self):
        return self._pool.usage()

    @property
    def counters(self):
        """The counters as the pure class keeps them (a fresh dict each time)."""
        tiers = {}
        for t, label in enumerate(self.tier_labels):
            tc = new_tier_counters()
            for k, name in enumerate(_TC_INT_NAMES):
                tc[name] = self._tc[t * _TC_INTS + k]
            tc["read_time_us"] = self._rt[t]
            tc["write_time_us"] = self._wt[t]
            tiers[label] = tc
        return {
            "prefix_cache_queries": self.c_pq, "prefix_cache_hits": self.c_ph,
            "preempted_queries": self.c_rq, "preempted_hits": self.c_rh,
            "external_queries": self.c_eq, "external_hits": self.c_eh,
            "cached_by_source": {"device": self.c_dev, "host": self.c_host, "disk": self.c_disk},
            "block_hits": self.c_bh, "block_misses": self.c_bm,
            "tiers": tiers,
        }

    def _request_states(self):
        out = {}
        cdef _Req r
        for rid in sorted(self._reqs):
            r = self._reqs[rid]
            out[rid] = (r.end, r.stored, r.num_tokens, r.preempted,
                        {"device": r.cached[0], "host": r.cached[1], "disk": r.cached[2]})
        return out


cdef void _extend(vector[uint64_t]& out, uint64_t parent, uint64_t seed, Py_ssize_t start,
                  Py_ssize_t count) noexcept:
    """Append :func:`extend_hashes` ``(parent, seed, start, count)`` to ``out``."""
    cdef size_t have = out.size()
    if count <= 0:
        return
    out.resize(have + count)
    _chain_fill(out.data() + have, parent, seed, start, count)


# -- the engine's KV port on the compiled cache ----------------------------------------------------
@cython.final
cdef class RequestPort:
    """:class:`blis_sim.engine.kvport.KVPort` on a compiled cache: the same calls and read-outs,
    with the per-admission work (registering a request's content on first sight, the lookup, the
    admission and its first-admission record) done here instead of in Python frames. ``content``
    is the engine's ``ContentPlan``: its per-request columns are read in place; a session round's
    hashes and a group's prefix hashes come from its methods (which build each once)."""

    cdef CacheCore _core
    cdef object _kv, _content, _no_prefix, _root
    cdef dict _prefix_of  # group -> its prefix hashes (the plan's, fetched once: no frame per request)
    cdef const int64_t[::1] _prompt
    cdef const int32_t[::1] _session, _group, _blocks
    cdef uint64_t _seed_base
    cdef vector[unsigned char] _registered, _admitted
    cdef vector[int32_t] _first  # per request: device, host, disk tokens at its first admission
    cdef Py_ssize_t _n
    cdef public int64_t window_first
    cdef public object window_snapshot, content, kv, grow, computed, preempt, finish

    def __init__(self, CacheCore kv, content, int64_t window_first=-1):
        cols = content.port_columns()
        self._core = kv
        self._kv = self.kv = kv
        self._content = self.content = content
        self._prompt, self._session, self._group, self._blocks = cols[:4]
        self._seed_base = <uint64_t>cols[4]
        self._root = cols[5]
        self._no_prefix = np.zeros(0, dtype=np.uint64)
        self._prefix_of = {}
        self._n = self._prompt.shape[0]
        self._registered.assign(self._n, 0)
        self._admitted.assign(self._n, 0)
        self._first.assign(3 * self._n, 0)
        self.window_first = window_first
        self.window_snapshot = None
        self.grow = kv.allocate
        self.computed = kv.computed
        self.preempt = kv.preempt
        self.finish = kv.free

    def __len__(self):
        return self._n

    cdef int _register(self, int64_t i) except -1:
        cdef int64_t g
        if i == self.window_first and self.window_snapshot is None:
            self.window_snapshot = self._kv.snapshot()
        if self._session[i] >= 0:
            self._kv.add_request(i, self._content.block_hashes(i), self._prompt[i])
        else:
            g = self._group[i]
            if g < 0:
                self._core._add_prefixed(i, self._no_prefix, 0, self._root,
                                         _request_seed(self._seed_base, i), self._prompt[i])
            else:
                prefix = self._prefix_of.get(g)
                if prefix is None:
                    prefix = self._prefix_of[g] = self._content.group_prefix(g)
                self._core._add_prefixed(i, prefix, self._blocks[i], self._root,
                                         _request_seed(self._seed_base, i), self._prompt[i])
        self._registered[i] = 1
        return 0

    cdef inline _Req _live(self, int64_t i):
        """Request ``i``'s cache state, from the cache's requests in flight (which raises for a
        request it does not hold): no slot per request of the trace."""
        return self._core._req(i)

    def lookup(self, int64_t i, double now):
        return _as_lookup(self._lookup(i, now))

    cdef _Req _lookup(self, int64_t i, double now):
        """Look request ``i`` up (registered on first sight); its state holds the result."""
        self._check(i)
        if not self._registered[i]:
            self._register(i)
        cdef _Req r = self._live(i)
        self._core._lookup(r, now)
        return r

    def admit(self, int64_t i, int64_t num_new_tokens, double now):
        cdef Admitted a
        return _as_admission(&a) if self._admit(i, num_new_tokens, now, &a) else None

    cdef bint _admit(self, int64_t i, int64_t num_new_tokens, double now, Admitted* out) except -1:
        self._check(i)
        if not self._core._admit_r(self._live(i), num_new_tokens, now, out):
            return False
        if not self._admitted[i]:
            self._admitted[i] = 1
            # (a prompt's tokens fit int32: the step loop refuses a longer request)
            self._first[3 * i] = <int32_t>out.gpu
            self._first[3 * i + 1] = <int32_t>out.host
            self._first[3 * i + 2] = <int32_t>out.disk
        return True

    cdef int _check(self, int64_t i) except -1:
        if not 0 <= i < self._n:
            raise IndexError(f"request {i} is not in the port's content ({self._n} requests)")
        return 0

    @property
    def c_calls(self):
        """The port's calls as C functions (a capsule of :c:type:`PortCalls`), for the compiled
        step loop: the same calls without a Python object per argument and result."""
        return _PORT_CALLS_CAPSULE

    @property
    def admitted(self):
        """Per request: admitted at least once (bool)."""
        out = np.zeros(self._n, dtype=np.uint8)
        cdef unsigned char[::1] o = out
        cdef Py_ssize_t i
        for i in range(self._n):
            o[i] = self._admitted[i]
        return out.astype(bool)

    @property
    def cached(self):
        """Per request: (device, host, disk) tokens found at its first admission (n × 3, int32)."""
        out = np.zeros((self._n, 3), dtype=np.int32)
        cdef int32_t[:, ::1] o = out
        cdef Py_ssize_t i
        for i in range(self._n):
            o[i, 0], o[i, 1], o[i, 2] = self._first[3 * i], self._first[3 * i + 1], self._first[3 * i + 2]
        return out


# -- RequestPort.c_calls: the port's calls for the compiled step loop -------------------------------
cdef int _port_lookup(object port, int64_t i, double now, int64_t* gpu, int64_t* external) except -1:
    cdef _Req r = (<RequestPort>port)._lookup(i, now)
    gpu[0], external[0] = r.lk[0], r.lk[1]
    return 0


cdef int _port_admit(object port, int64_t i, int64_t num_new_tokens, double now, Admitted* out) except -1:
    return (<RequestPort>port)._admit(i, num_new_tokens, now, out)


cdef int _port_grow(object port, int64_t i, int64_t num_new_tokens) except -1:
    cdef RequestPort p = <RequestPort>port
    return p._core._grow_r(p._live(i), num_new_tokens)


cdef int _port_computed(object port, int64_t i, double now) except -1:
    cdef RequestPort p = <RequestPort>port
    return p._core._computed_r(p._live(i), now)


cdef int _port_preempt(object port, int64_t i) except -1:
    cdef RequestPort p = <RequestPort>port
    return p._core._preempt_r(p._live(i))


cdef int _port_finish(object port, int64_t i) except -1:
    cdef RequestPort p = <RequestPort>port
    p._core._finish_r(p._live(i))
    return 0


cdef inline uint64_t _request_seed(uint64_t base, int64_t i) noexcept:
    """Request ``i``'s seed for its unique blocks: splitmix64 of ``base + i·φ`` (the content
    plan's ``request_seed``, the same bits)."""
    cdef uint64_t z = base + <uint64_t>i * <uint64_t>0x9E3779B97F4A7C15ULL
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef PortCalls _PORT_CALLS
_PORT_CALLS.lookup = _port_lookup
_PORT_CALLS.admit = _port_admit
_PORT_CALLS.grow = _port_grow
_PORT_CALLS.computed = _port_computed
_PORT_CALLS.preempt = _port_preempt
_PORT_CALLS.finish = _port_finish
_PORT_CALLS_CAPSULE = PyCapsule_New(&_PORT_CALLS, b"blis_sim.kv._port_calls.PortCalls", NULL)
