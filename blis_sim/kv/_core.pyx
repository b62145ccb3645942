# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: language = c++
"""Cython KV core: the compiled twin of :mod:`blis_sim.kv._core_py` (same API, same results).

See that module's docstring for the semantics of :func:`hash_blocks`, :class:`BlockPool` and
:class:`ChunkStore`. Containers are C++ (``unordered_map`` keyed by 64-bit hashes, index-based
intrusive lists over ``vector``s); batch methods take contiguous ``uint64`` arrays so one call
covers a whole request.
"""
from libc.stdint cimport int64_t, uint64_t, int32_t
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref, preincrement as inc

import numpy as np
cimport cython
cimport numpy as cnp

cnp.import_array()

cdef extern from *:
    """
    #include <vector>
    #include <cstdint>
    // Open-addressing (linear probing, backward-shift deletion) map uint64 -> int64 for the
    // offload tiers: one cache miss per lookup and no allocation per entry, where a node-based
    // std::unordered_map costs two misses and a malloc (an unbounded fs tier holds ~1M chunks).
    // Values are >= 0; find() returns -1 when absent. Key 0 (free-slot marker) is kept aside.
    struct BlisFlatMap {
        struct E { uint64_t k; int64_t v; };  // key and value side by side: one miss per probe
        std::vector<E> e;
        uint64_t mask;
        int shift;
        int64_t n;
        bool has0;
        int64_t v0;
        BlisFlatMap() : mask(0), shift(64), n(0), has0(false), v0(0) { rehash(16); }
        inline uint64_t home(uint64_t key) const {
            return (key * 0x9E3779B97F4A7C15ULL) >> shift;
        }
        void rehash(uint64_t cap) {
            std::vector<E> old; old.swap(e);
            e.assign(cap, E{0, 0});
            mask = cap - 1;
            shift = 64 - __builtin_ctzll(cap);
            for (size_t i = 0; i < old.size(); ++i) {
                if (old[i].k) {
                    uint64_t j = home(old[i].k);
                    while (e[j].k) j = (j + 1) & mask;
                    e[j] = old[i];
                }
            }
        }
        void reserve(uint64_t count) {
            uint64_t cap = 16;
            while (cap < 2 * count) cap <<= 1;
            if (cap > e.size()) rehash(cap);
        }
        inline int64_t find(uint64_t key) const {
            if (!key) return has0 ? v0 : -1;
            uint64_t i = home(key);
            while (true) {
                const E& c = e[i];
                if (c.k == key) return c.v;
                if (!c.k) return -1;
                i = (i + 1) & mask;
            }
        }
        // key -> val unless key is present (then nothing changes); whether it was inserted: one
        // probe where find + set took two
        bool insert(uint64_t key, int64_t val) {
            if (!key) {
                if (has0) return false;
                has0 = true; v0 = val; ++n;
                return true;
            }
            uint64_t i = home(key);
            while (true) {
                uint64_t c = e[i].k;
                if (c == key) return false;
                if (!c) break;
                i = (i + 1) & mask;
            }
            e[i].k = key; e[i].v = val; ++n;
            if ((uint64_t)n * 2 > e.size()) rehash(e.size() * 2);
            return true;
        }
        // erase key if it maps to val (one probe where find + erase took two)
        void erase_if(uint64_t key, int64_t val) {
            if (!key) { if (has0 && v0 == val) { has0 = false; --n; } return; }
            uint64_t i = home(key);
            while (true) {
                uint64_t c = e[i].k;
                if (!c) return;
                if (c == key) break;
                i = (i + 1) & mask;
            }
            if (e[i].v != val) return;
            uint64_t j = i;
            while (true) {
                j = (j + 1) & mask;
                uint64_t c = e[j].k;
                if (!c) break;
                // the entry at j may fill the hole at i unless its home lies in (i, j]
                if (((j - home(c)) & mask) >= ((j - i) & mask)) { e[i] = e[j]; i = j; }
            }
            e[i].k = 0; --n;
        }
        // start loading key's home slot: a batch of probes into a big map overlaps its misses
        inline void prefetch(uint64_t key) const { __builtin_prefetch(&e[home(key)]); }
        // every (key, value), in slot order (state dumps only)
        void items(std::vector<uint64_t>& ks, std::vector<int64_t>& vs) const {
            if (has0) { ks.push_back(0); vs.push_back(v0); }
            for (size_t i = 0; i < e.size(); ++i)
                if (e[i].k) { ks.push_back(e[i].k); vs.push_back(e[i].v); }
        }
    };

    // A request's GPU blocks and how many of them are registered in the hash map, under one key
    // (one lookup per pool call; two maps took three to five)
    struct BlisPoolReq { std::vector<int32_t> blocks; int64_t cached = 0; };

    // The chunk stores' slots and their key index, compact: an unbounded fs tier holds tens of
    // millions of chunks. Slots live in fixed pages (growing never copies); the index is open
    // addressing (linear probing, backward-shift deletion) of 8-byte entries (32 bits of the
    // key's hash, slot + 1; 0 = empty) over the slots' keys, split into 256 segments that grow one
    // at a time (no moment holds two copies of the whole index). The hash's bits 24-55 are the
    // tag, whose low bits are the home slot: an entry's home is known without reading its key.
    // A bounded (or ARC) store's slot carries its eviction state (BlisSlot, 32 bytes); an
    // unbounded LRU store never evicts, so its slot is the key and the ready time (BlisEntry).
    struct BlisSlot { uint64_t key; double ready; double busy; int32_t prev; int32_t next; };
    struct BlisEntry { uint64_t key; double ready; };
    template <class S> struct BlisTable {
        static const int PAGE_BITS = 15;
        static const int64_t PAGE = 1 << 15;
        // a segment: mask + 1 entries, n of them in use, regrown past limit (3/4 full). 32 bytes,
        // so that its address is a shift (with a vector's three words it was 40: a multiply per
        // probe, and the limit recomputed from the vector's size per insert)
        struct Seg { uint64_t* e; uint64_t mask; int64_t n; int64_t limit; };
        std::vector<S*> pages;
        std::vector<int32_t> free_slots;
        int64_t nslots;
        Seg seg[256];
        BlisTable() : nslots(0) {
            for (int k = 0; k < 256; ++k) { seg[k].e = nullptr; seg[k].n = 0; }
            for (int k = 0; k < 256; ++k) regrow(seg[k], 8);
        }
        ~BlisTable() {
            for (size_t k = 0; k < pages.size(); ++k) delete[] pages[k];
            for (int k = 0; k < 256; ++k) delete[] seg[k].e;
        }
        BlisTable(const BlisTable&) = delete;
        BlisTable& operator=(const BlisTable&) = delete;
        static inline uint64_t hash(uint64_t key) { return key * 0x9E3779B97F4A7C15ULL; }
        inline S* at(int64_t s) const { return pages[s >> PAGE_BITS] + (s & (PAGE - 1)); }
        inline int64_t find(uint64_t key) const {
            uint64_t h = hash(key);
            const Seg& sg = seg[h >> 56];
            uint32_t tag = (uint32_t)(h >> 24);
            uint64_t i = tag & sg.mask;
            while (true) {
                uint64_t c = sg.e[i];
                if (!c) return -1;
                if ((uint32_t)(c >> 32) == tag) {
                    int64_t s = (int64_t)(uint32_t)c - 1;
                    if (at(s)->key == key) return s;
                }
                i = (i + 1) & sg.mask;
            }
        }
        inline void prefetch(uint64_t key) const {
            uint64_t h = hash(key);
            const Seg& sg = seg[h >> 56];
            __builtin_prefetch(&sg.e[(uint32_t)(h >> 24) & sg.mask]);
        }
        static void place(Seg& sg, uint64_t c) {
            uint64_t i = (uint32_t)(c >> 32) & sg.mask;
            while (sg.e[i]) i = (i + 1) & sg.mask;
            sg.e[i] = c;
        }
        // sg's entries moved into a new array of cap (a power of two, >= 8) entries
        static void regrow(Seg& sg, uint64_t cap) {
            uint64_t* old = sg.e;
            uint64_t size = old ? sg.mask + 1 : 0;
            sg.e = new uint64_t[cap]();
            sg.mask = cap - 1;
            sg.limit = (int64_t)(cap / 4 * 3);
            for (uint64_t i = 0; i < size; ++i) if (old[i]) place(sg, old[i]);
            delete[] old;
        }
        void reserve(uint64_t count) {
            uint64_t cap = 8;
            while (cap * 3 < (count / 256 + 1) * 4) cap <<= 1;
            for (int k = 0; k < 256; ++k) if (cap > seg[k].mask + 1) regrow(seg[k], cap);
        }
        // a new slot holding a key not in the table, indexed (the caller fills the rest)
        int64_t add(uint64_t key) {
            int64_t s;
            if (!free_slots.empty()) { s = free_slots.back(); free_slots.pop_back(); }
            else {
                s = nslots++;
                if ((s >> PAGE_BITS) >= (int64_t)pages.size()) pages.push_back(new S[PAGE]);
            }
            index(s, key);
            return s;
        }
        // slot s (in use) now holds key, not in the table: an eviction and an insertion, without
        // freeing the slot and taking it back
        void rekey(int64_t s, uint64_t key) {
            unindex(s);
            index(s, key);
        }
        // unindex slot s and free it
        void drop(int64_t s) {
            unindex(s);
            free_slots.push_back((int32_t)s);
        }
        void index(int64_t s, uint64_t key) {
            at(s)->key = key;
            uint64_t h = hash(key);
            Seg& sg = seg[h >> 56];
            place(sg, ((uint64_t)(uint32_t)(h >> 24) << 32) | (uint64_t)(s + 1));
            if (++sg.n > sg.limit) regrow(sg, 2 * (sg.mask + 1));
        }
        void unindex(int64_t s) {
            uint64_t h = hash(at(s)->key);
            Seg& sg = seg[h >> 56];
            uint64_t i = (uint32_t)(h >> 24) & sg.mask;
            while ((uint64_t)(uint32_t)sg.e[i] != (uint64_t)(s + 1)) i = (i + 1) & sg.mask;
            uint64_t j = i;
            while (true) {
                j = (j + 1) & sg.mask;
                uint64_t c = sg.e[j];
                if (!c) break;
                // the entry at j may fill the hole at i unless its home lies in (i, j]
                uint64_t home = (uint32_t)(c >> 32) & sg.mask;
                if (((j - home) & sg.mask) >= ((j - i) & sg.mask)) { sg.e[i] = c; i = j; }
            }
            sg.e[i] = 0;
            --sg.n;
        }
    };
    """
    cppclass BlisFlatMap:
        BlisFlatMap() except +
        void reserve(uint64_t count) except +
        int64_t find(uint64_t key) noexcept nogil
        void erase_if(uint64_t key, int64_t val) noexcept nogil
        bint insert(uint64_t key, int64_t val) except +
        void items(vector[uint64_t]& ks, vector[int64_t]& vs) except +
        void prefetch(uint64_t key) noexcept nogil
        int64_t n

    cppclass BlisPoolReq:
        vector[int32_t] blocks
        int64_t cached

    cppclass BlisSlot:
        uint64_t key
        double ready
        double busy
        int32_t prev
        int32_t next
    cppclass BlisEntry:
        uint64_t key
        double ready
    cppclass BlisTable[S]:
        BlisTable() except +
        int64_t nslots
        S* at(int64_t s) noexcept nogil
        int64_t find(uint64_t key) noexcept nogil
        void prefetch(uint64_t key) noexcept nogil
        void reserve(uint64_t count) except +
        int64_t add(uint64_t key) except +
        void rekey(int64_t s, uint64_t key) except +
        void drop(int64_t s) except +


cdef struct Seen:  # an entry of ChunkStore's per-call scratch set
    uint64_t key
    uint64_t call


cdef uint64_t _SEED = 0x6A09E667F3BCC909ULL
cdef uint64_t _MULT_SALT = 0x5BD1E995ULL
cdef uint64_t MASK64 = 0xFFFFFFFFFFFFFFFFULL

LIST_T1, LIST_T2, LIST_B1, LIST_B2 = 0, 1, 2, 3
ABSENT, PENDING, READY = 0, 1, 2
cdef double INF = float("inf")


cdef inline uint64_t _mix(uint64_t z) noexcept nogil:
    z = z + 0x9E3779B97F4A7C15ULL
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline uint64_t _chain(uint64_t parent, uint64_t content) noexcept nogil:
    cdef uint64_t h = _mix(_mix(parent) ^ content)
    return h if h != 0 else 1


def mix64(z):
    """splitmix64's finalizer: a bijection on 64-bit integers."""
    return _mix(<uint64_t>(int(z) & 0xFFFFFFFFFFFFFFFF))


def root_hash(salt=0):
    """The chain's parent for block 0 (vLLM's NONE_HASH), per salt."""
    return _mix(_SEED ^ <uint64_t>(int(salt) & 0xFFFFFFFFFFFFFFFF))


def chain(parent, content):
    return _chain(<uint64_t>int(parent), <uint64_t>int(content))


def hash_blocks(tokens, int block_size, salt=0):
    """Chained 64-bit hashes of the full blocks of ``tokens`` (an integer array)."""
    cdef const int64_t[::1] toks = np.ascontiguousarray(tokens).astype(np.int64, copy=False)
    cdef Py_ssize_t nb = toks.shape[0] // block_size
    out = np.empty(nb, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    cdef vector[uint64_t] mult
    cdef Py_ssize_t i, j
    cdef uint64_t h, c
    for j in range(block_size):
        mult.push_back(_mix(<uint64_t>j + _MULT_SALT) | 1ULL)
    h = _mix(_SEED ^ <uint64_t>(int(salt) & 0xFFFFFFFFFFFFFFFF))
    with nogil:
        for i in range(nb):
            c = 0
            for j in range(block_size):
                c += (<uint64_t>toks[i * block_size + j] + 1ULL) * mult[j]
            h = _chain(h, c)
            o[i] = h
    return out


cdef void _chain_fill(uint64_t* out, uint64_t parent, uint64_t seed, Py_ssize_t start,
                      Py_ssize_t count) noexcept nogil:
    """``out[k] = chain(out[k - 1], mix64(seed ^ (start + k)))`` from ``parent``: ``count`` hashes
    of unique content (the one loop behind extend_hashes, prefixed_hashes and the cache's)."""
    cdef uint64_t h = parent
    cdef Py_ssize_t k
    for k in range(count):
        h = _chain(h, _mix(seed ^ <uint64_t>(start + k)))
        out[k] = h


def extend_hashes(parent, seed, Py_ssize_t start, Py_ssize_t count):
    """``count`` chained hashes standing for unique content (see the pure twin)."""
    out = np.empty(count, dtype=np.uint64)
    _chain_fill(<uint64_t*>cnp.PyArray_DATA(out), <uint64_t>int(parent),
                <uint64_t>(int(seed) & 0xFFFFFFFFFFFFFFFF), start, count)
    return out


def prefixed_hashes(const uint64_t[::1] prefix, Py_ssize_t shared, root, seed, Py_ssize_t count):
    """See the pure twin: ``prefix[:shared]`` then unique chained hashes, in one array."""
    if not 0 <= shared <= min(count, prefix.shape[0]):
        raise ValueError(f"shared blocks {shared} must be within the prefix ({prefix.shape[0]}) "
                         f"and the count ({count})")
    out = np.empty(count, dtype=np.uint64)
    cdef uint64_t* o = <uint64_t*>cnp.PyArray_DATA(out)
    cdef Py_ssize_t k
    for k in range(shared):
        o[k] = prefix[k]
    _chain_fill(o + shared, prefix[shared - 1] if shared else <uint64_t>int(root),
                <uint64_t>(int(seed) & 0xFFFFFFFFFFFFFFFF), shared, count - shared)
    return out


cdef inline const uint64_t* _ptr(const uint64_t[::1] a) noexcept:
    """The data pointer of a (possibly empty) contiguous array, for the pointer-based cdef methods."""
    return &a[0] if a.shape[0] else NULL


@cython.final  # no subclass: its C methods are called directly (and may be inlined)
cdef class BlockPool:
    """GPU blocks, free queue and hash map (see :mod:`blis_sim.kv._core_py`)."""

    cdef public int num_blocks, block_size
    cdef public bint enable_caching
    cdef public int64_t num_free, evictions
    cdef vector[int32_t] _ref, _prev, _next
    cdef vector[uint64_t] _hash
    cdef BlisFlatMap _map  # block hash -> block id
    cdef int32_t _head, _tail
    cdef unordered_map[int64_t, BlisPoolReq] _req  # per request: its blocks, how many cached
    cdef vector[int32_t] _hits, _front  # scratch of _allocate / _free (no allocation per call)

    def __init__(self, int num_blocks, int block_size, bint enable_caching=True):
        if num_blocks < 2 or block_size < 1:
            raise ValueError("num_blocks must be >= 2 and block_size >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._ref.assign(num_blocks, 0)
        self._prev.assign(num_blocks, -1)
        self._next.assign(num_blocks, -1)
        self._hash.assign(num_blocks, 0)
        self._head = -1
        self._tail = -1
        self.num_free = 0
        self.evictions = 0
        self._map.reserve(2 * num_blocks)  # at most a quarter full: short probes and shifts
        cdef int32_t b
        for b in range(1, num_blocks):
            self._push_back(b)

    cdef inline void _push_back(self, int32_t b) noexcept:
        self._prev[b] = self._tail
        self._next[b] = -1
        if self._tail >= 0:
            self._next[self._tail] = b
        else:
            self._head = b
        self._tail = b
        self.num_free += 1

    cdef inline void _push_front(self, int32_t b) noexcept:
        self._next[b] = self._head
        self._prev[b] = -1
        if self._head >= 0:
            self._prev[self._head] = b
        else:
            self._tail = b
        self._head = b
        self.num_free += 1

    cdef inline void _unlink(self, int32_t b) noexcept:
        cdef int32_t p = self._prev[b]
        cdef int32_t nx = self._next[b]
        if p >= 0:
            self._next[p] = nx
        else:
            self._head = nx
        if nx >= 0:
            self._prev[nx] = p
        else:
            self._tail = p
        self._prev[b] = -1
        self._next[b] = -1
        self.num_free -= 1

    def lookup(self, const uint64_t[::1] hashes, Py_ssize_t max_blocks):
        """Number of leading ``hashes`` cached on the GPU, at most ``max_blocks``."""
        return self._lookup(_ptr(hashes), min(max_blocks, hashes.shape[0]), NULL)

    cdef Py_ssize_t _lookup(self, const uint64_t* hashes, Py_ssize_t n,
                            vector[int32_t]* found) noexcept:
        """``found`` (unless NULL): its first entries (as many as returned) the blocks found, in
        order (for :meth:`_allocate`, while the pool is unchanged: no second probe per hit).
        Kept at least ``n`` long, so that filling it is a store, not a vector append."""
        if not self.enable_caching:
            return 0
        cdef Py_ssize_t i = 0
        cdef int64_t b
        cdef int32_t* out = NULL
        if found != NULL:
            if <Py_ssize_t>found.size() < n:
                found.resize(n)
            out = found.data()
        while i < n:
            b = self._map.find(hashes[i])
            if b < 0:
                break
            if out != NULL:
                out[i] = <int32_t>b
            i += 1
        return i

    def num_blocks_of(self, int64_t rid):
        return self._num_blocks_of(rid)

    cdef Py_ssize_t _num_blocks_of(self, int64_t rid) noexcept:
        cdef unordered_map[int64_t, BlisPoolReq].iterator it = self._req.find(rid)
        if it == self._req.end():
            return 0
        return deref(it).second.blocks.size()

    def usage(self):
        return 1.0 - self.num_free / <double>(self.num_blocks - 1)

    def allocate(self, int64_t rid, const uint64_t[::1] hashes, Py_ssize_t num_hit_blocks,
                 Py_ssize_t num_tokens):
        """See the pure twin: check-then-act allocation; ``False`` changes nothing."""
        return self._allocate(rid, _ptr(hashes), num_hit_blocks, num_tokens, NULL)

    def allocate_and_cache(self, int64_t rid, const uint64_t[::1] hashes, Py_ssize_t num_tokens,
                           Py_ssize_t num_full_blocks):
        """See the pure twin: a decode step crossing a block boundary in one call."""
        return self._allocate_and_cache(rid, _ptr(hashes), hashes.shape[0], num_tokens,
                                        num_full_blocks)

    cdef Py_ssize_t _allocate_and_cache(self, int64_t rid, const uint64_t* hashes, Py_ssize_t nh,
                                        Py_ssize_t num_tokens, Py_ssize_t num_full_blocks) except -2:
        if not self._allocate(rid, hashes, 0, num_tokens, NULL):
            return -1
        return self._cache(rid, hashes, nh, num_full_blocks)

    cdef bint _allocate(self, int64_t rid, const uint64_t* hashes, Py_ssize_t num_hit_blocks,
                        Py_ssize_t num_tokens, const int32_t* found) except -1:
        # ``hashes`` holds at least ``num_hit_blocks`` entries (the caller's lookup found them);
        # ``found`` (unless NULL): their blocks, as that lookup (on this same pool state) gave them
        cdef unordered_map[int64_t, BlisPoolReq].iterator it = self._req.find(rid)
        cdef bint known = it != self._req.end()
        cdef Py_ssize_t have = deref(it).second.blocks.size() if known else 0
        cdef Py_ssize_t hits = num_hit_blocks if have == 0 else 0
        cdef Py_ssize_t need = (num_tokens + self.block_size - 1) // self.block_size
        cdef Py_ssize_t n_new = need - have - hits
        cdef Py_ssize_t i, evictable = 0
        cdef int32_t b
        cdef uint64_t h
        cdef const int32_t* hit = found
        cdef int32_t* out
        cdef int32_t* ref = self._ref.data()
        cdef BlisPoolReq* req
        cdef vector[int32_t]* blocks
        cdef size_t want
        if n_new < 0:
            n_new = 0
        if hit == NULL and hits:  # found here once (the allocation below takes them)
            self._hits.resize(hits)
            for i in range(hits):
                self._hits[i] = <int32_t>self._map.find(hashes[i])
            hit = self._hits.data()
        for i in range(hits):
            if ref[hit[i]] == 0:
                evictable += 1
        if n_new + evictable > self.num_free:
            return False
        req = &deref(it).second if known else &self._req[rid]
        blocks = &req.blocks
        want = have + hits + n_new
        if want > blocks.capacity():  # geometric: an exact reserve copied the list per decode block
            blocks.reserve(max(want, 2 * blocks.capacity()))
        blocks.resize(want)  # written by index below: no append per block
        out = blocks.data() + have
        for i in range(hits):
            b = hit[i]
            if ref[b] == 0:
                self._unlink(b)
            ref[b] += 1
            out[i] = b
        if hits:
            req.cached = hits
        # the new blocks are the free queue's first n_new: taken in order, then detached with one
        # relink (an allocated block's links are never read: each push sets them again)
        cdef int32_t* nxt = self._next.data()
        cdef uint64_t* hashes_of = self._hash.data()
        out += hits
        b = self._head
        for i in range(n_new):
            h = hashes_of[b]
            if h != 0:
                self._map.erase_if(h, b)
                hashes_of[b] = 0
                self.evictions += 1
            ref[b] = 1
            out[i] = b
            b = nxt[b]
        if n_new:
            self._head = b
            if b >= 0:
                self._prev[b] = -1
            else:
                self._tail = -1
            self.num_free -= n_new
        return True

    def cache(self, int64_t rid, const uint64_t[::1] hashes, Py_ssize_t num_full_blocks):
        """Register the hashes of ``rid``'s blocks up to ``num_full_blocks``."""
        return self._cache(rid, _ptr(hashes), hashes.shape[0], num_full_blocks)

    cdef Py_ssize_t _cache(self, int64_t rid, const uint64_t* hashes, Py_ssize_t nh,
                           Py_ssize_t num_full_blocks) except -1:
        if not self.enable_caching:
            return 0
        cdef unordered_map[int64_t, BlisPoolReq].iterator it = self._req.find(rid)
        if it == self._req.end():
            return 0
        cdef BlisPoolReq* req = &deref(it).second
        cdef vector[int32_t]* blocks = &req.blocks
        cdef Py_ssize_t start = req.cached
        cdef Py_ssize_t end = min(num_full_blocks, <Py_ssize_t>blocks.size(), nh)
        cdef Py_ssize_t i, added = 0
        cdef int32_t b
        cdef uint64_t h
        cdef uint64_t* hashes_of = self._hash.data()
        cdef const int32_t* ids = blocks.data()
        for i in range(start, end):
            b = ids[i]
            if hashes_of[b] != 0:
                continue
            h = hashes[i]
            if not self._map.insert(h, b):
                continue
            hashes_of[b] = h
            added += 1
        if end > start:
            req.cached = end
        return added

    def free(self, int64_t rid):
        """Release ``rid``'s blocks, tail block first; returns the count."""
        return self._free(rid)

    cdef Py_ssize_t _free(self, int64_t rid) noexcept:
        cdef unordered_map[int64_t, BlisPoolReq].iterator it = self._req.find(rid)
        if it == self._req.end():
            return 0
        cdef vector[int32_t] blocks
        blocks.swap(deref(it).second.blocks)  # taken, not copied
        self._req.erase(it)
        cdef vector[int32_t]* front = &self._front
        front.clear()
        cdef Py_ssize_t i
        cdef int32_t b
        cdef int32_t* ref = self._ref.data()
        cdef const uint64_t* hashes_of = self._hash.data()
        for i in range(<Py_ssize_t>blocks.size() - 1, -1, -1):
            b = blocks[i]
            ref[b] -= 1
            if ref[b] == 0:
                if hashes_of[b] != 0:
                    self._push_back(b)
                else:
                    front.push_back(b)
        for i in range(<Py_ssize_t>front.size() - 1, -1, -1):
            self._push_front(deref(front)[i])
        return blocks.size()

    def _map_items(self):
        cdef vector[uint64_t] ks
        cdef vector[int64_t] vs
        self._map.items(ks, vs)
        return sorted(zip([int(k) for k in ks], [int(v) for v in vs]))

    def free_queue(self):
        out = []
        cdef int32_t b = self._head
        while b >= 0:
            out.append(b)
            b = self._next[b]
        return out

    def state(self):
        reqs = {}
        cached = {}
        cdef unordered_map[int64_t, BlisPoolReq].iterator it = self._req.begin()
        while it != self._req.end():
            reqs[int(deref(it).first)] = [int(x) for x in deref(it).second.blocks]
            cached[int(deref(it).first)] = int(deref(it).second.cached)
            inc(it)
        return {
            "free_queue": self.free_queue(),
            "ref": [int(x) for x in self._ref],
            "hash": [int(x) for x in self._hash],
            "map": self._map_items(),
            "requests": dict(sorted(reqs.items())),
            "req_cached": dict(sorted(cached.items())),
            "num_free": self.num_free,
            "evictions": self.evictions,
        }


@cython.final  # no subclass: its C methods are called directly (and may be inlined)
cdef class ChunkStore:
    """One offload tier (see :mod:`blis_sim.kv._core_py`)."""

    cdef public int64_t capacity, evictions, target_t1
    cdef public bint arc
    cdef BlisTable[BlisSlot] _t  # slots (key, ready, busy, links) and the key index
    cdef vector[unsigned char] _list  # per slot of _t: T1 / T2 / B1 / B2
    # An unbounded LRU store never evicts: its pins and recency order change nothing, so it keeps
    # (key, ready) per chunk only (the pure twin ignores touch and pin there too).
    cdef bint _compact
    cdef BlisTable[BlisEntry] _c
    # scratch of _prepare_store: keys seen in this call (open addressing; one probe per new key
    # where a map's find + set + erase took three). An entry is taken in the call whose number it
    # holds, so the table is never cleared: it only grows (then zeroed once)
    cdef vector[Seen] _seen
    cdef uint64_t _seen_call
    cdef vector[int64_t] _victims  # scratch of _pick_lru
    cdef bint _victims_lead
    cdef int64_t _head[4]
    cdef int64_t _tail[4]
    cdef int64_t _size[4]

    def __init__(self, int64_t capacity, str policy="lru"):
        if policy not in ("lru", "arc"):
            raise ValueError(f"unknown eviction policy {policy!r}")
        if capacity == 0:
            raise ValueError("capacity must be > 0 (or < 0 for unbounded)")
        self.capacity = capacity
        self.arc = policy == "arc"
        self._compact = capacity < 0 and not self.arc
        self.target_t1 = 0
        self.evictions = 0
        if capacity > 0:
            # ARC's lists hold up to 3x capacity keys; room for 8x keeps the index sparse: a small
            # store's keys fill its 256 segments unevenly, and each probe of a full one is longer
            self._t.reserve(min(8 * capacity, 1 << 22))
        cdef int i
        for i in range(4):
            self._head[i] = -1
            self._tail[i] = -1
            self._size[i] = 0

    cdef inline double ready_of(self, int64_t s) noexcept:
        if self._compact:
            return self._c.at(s).ready
        return self._t.at(s).ready

    cdef int64_t _new_slot(self, uint64_t key, int lst, double ready, double busy) except -1:
        cdef int64_t s
        cdef BlisSlot* p
        if self._compact:
            s = self._c.add(key)
            self._c.at(s).ready = ready
            self._size[0] += 1
            return s
        s = self._t.add(key)
        p = self._t.at(s)
        p.ready, p.busy, p.prev, p.next = ready, busy, -1, -1
        if s >= <int64_t>self._list.size():
            self._list.push_back(lst)
        self._append(s, lst)
        return s

    cdef int _drop_slot(self, int64_t s) except -1:  # (not ``except *``: no error check per call)
        self._unlink(s)
        self._t.drop(s)
        return 0

    cdef inline void _append(self, int64_t s, int lst) noexcept:
        self._list[s] = lst
        cdef int64_t t = self._tail[lst]
        cdef BlisSlot* p = self._t.at(s)
        p.prev = <int32_t>t
        p.next = -1
        if t >= 0:
            self._t.at(t).next = <int32_t>s
        else:
            self._head[lst] = s
        self._tail[lst] = s
        self._size[lst] += 1

    cdef inline void _unlink(self, int64_t s) noexcept:
        cdef int lst = self._list[s]
        cdef BlisSlot* q = self._t.at(s)
        cdef int64_t p = q.prev
        cdef int64_t nx = q.next
        if p >= 0:
            self._t.at(p).next = <int32_t>nx
        else:
            self._head[lst] = nx
        if nx >= 0:
            self._t.at(nx).prev = <int32_t>p
        else:
            self._tail[lst] = p
        self._size[lst] -= 1

    cdef inline void _to_lru_tail(self, int64_t s) noexcept:
        """Slot ``s`` of T1 made its most recent: :meth:`_unlink` and :meth:`_append` to T1, with
        no count or list to update (nothing at all when it is the tail already)."""
        cdef int64_t tail = self._tail[0]
        if s == tail:
            return
        cdef BlisSlot* q = self._t.at(s)
        cdef int64_t p = q.prev, nx = q.next  # nx >= 0: s is not the tail
        if p >= 0:
            self._t.at(p).next = <int32_t>nx
        else:
            self._head[0] = nx
        self._t.at(nx).prev = <int32_t>p
        self._t.at(tail).next = <int32_t>s
        q.prev = <int32_t>tail
        q.next = -1
        self._tail[0] = s

    cdef inline int64_t _resident(self, uint64_t key) noexcept:
        if self._compact:
            return self._c.find(key)
        cdef int64_t s = self._t.find(key)
        if s < 0:
            return -1
        if self._list[s] <= 1:
            return s
        return -1

    cdef inline void _prefetch(self, const uint64_t* keys, Py_ssize_t a, Py_ssize_t b) noexcept:
        cdef Py_ssize_t i
        if self._compact:
            for i in range(a, b):
                self._c.prefetch(keys[i])
            return
        for i in range(a, b):
            self._t.prefetch(keys[i])

    def __len__(self):
        return self._size[0] + self._size[1]

    def state_of(self, key, double now):
        cdef int64_t s = self._resident(<uint64_t>int(key))
        if s < 0:
            return ABSENT
        return READY if self.ready_of(s) <= now else PENDING

    def ready_prefix(self, const uint64_t[::1] keys, Py_ssize_t start, Py_ssize_t end, double now):
        cdef Py_ssize_t i, n = 0
        cdef int64_t s
        end = min(end, keys.shape[0])
        for i in range(start, end):
            s = self._resident(keys[i])
            if s < 0 or self.ready_of(s) > now:
                break
            n += 1
        return n

    def ready_time(self, key):
        cdef int64_t s = self._resident(<uint64_t>int(key))
        return self.ready_of(s) if s >= 0 else -1.0

    def touch(self, const uint64_t[::1] keys, Py_ssize_t start, Py_ssize_t end):
        self._touch(_ptr(keys), start, min(end, keys.shape[0]))

    cdef void _touch(self, const uint64_t* keys, Py_ssize_t start, Py_ssize_t end) noexcept:
        cdef Py_ssize_t i
        cdef int64_t s, b1, b2, delta
        cdef int lst
        if self._compact:
            return
        for i in range(end - 1, start - 1, -1):
            s = self._t.find(keys[i])
            if s < 0:
                continue
            lst = self._list[s]
            if not self.arc:
                self._to_lru_tail(s)
            elif lst == 0 or lst == 1:
                self._unlink(s)
                self._append(s, 1)
            elif lst == 2:
                b1 = self._size[2]
                b2 = self._size[3]
                delta = max(1, b2 // b1) if b1 > 0 else 1
                self.target_t1 = min(self.target_t1 + delta, self.capacity)
            else:
                b1 = self._size[2]
                b2 = self._size[3]
                delta = max(1, b1 // b2) if b2 > 0 else 1
                self.target_t1 = max(self.target_t1 - delta, 0)

    def pin(self, const uint64_t[::1] keys, Py_ssize_t start, Py_ssize_t end, double until):
        self._pin(_ptr(keys), start, min(end, keys.shape[0]), until)

    cdef void _pin(self, const uint64_t* keys, Py_ssize_t start, Py_ssize_t end,
                   double until) noexcept:
        cdef Py_ssize_t i
        cdef int64_t s
        if self._compact:
            return
        for i in range(start, end):
            s = self._resident(keys[i])
            if s >= 0:
                self._pin_slot(s, until)

    def set_ready(self, const uint64_t[::1] keys, double ready):
        self._set_ready(_ptr(keys), keys.shape[0], ready)

    cdef void _set_ready(self, const uint64_t* keys, Py_ssize_t n, double ready) noexcept:
        cdef Py_ssize_t i
        cdef int64_t s
        if self._compact:
            for i in range(n):
                s = self._c.find(keys[i])
                if s >= 0:
                    self._c.at(s).ready = ready
            return
        for i in range(n):
            s = self._resident(keys[i])
            if s >= 0:
                self._ready_slot(s, ready)

    cdef inline void _ready_slot(self, int64_t s, double ready) noexcept:
        """Slot ``s`` (of the full table) ready at ``ready``, busy until then at least."""
        cdef BlisSlot* p = self._t.at(s)
        p.ready = ready
        if p.busy < ready or p.busy == INF:
            p.busy = ready

    cdef inline void _pin_slot(self, int64_t s, double until) noexcept:
        """Slot ``s`` (of the full table) kept from eviction until ``until``."""
        cdef BlisSlot* p = self._t.at(s)
        if p.busy < until:
            p.busy = until

    cdef inline bint _evictable(self, int64_t s, double now) noexcept:
        cdef BlisSlot* p = self._t.at(s)
        return p.ready <= now and p.busy <= now

    cdef int64_t _first_evictable(self, int lst, double now) noexcept:
        cdef int64_t s = self._head[lst]
        while s >= 0 and not self._evictable(s, now):
            s = self._t.at(s).next
        return s

    cdef bint _pick_lru(self, int64_t count, double now) noexcept:
        """The ``count`` least recently used evictable slots into ``_victims``, oldest first;
        False (nothing chosen) when there are fewer. The caller reuses them for new keys.
        ``_victims_lead``: they are T1's first ``count`` slots (none skipped)."""
        cdef int64_t n = 0
        self._victims.resize(count)  # written by index, trimmed after (no append per victim)
        cdef int64_t* victims = self._victims.data()
        self._victims_lead = True
        cdef int64_t s = self._head[0]
        while s >= 0 and n < count:
            if self._evictable(s, now):
                victims[n] = s
                n += 1
            else:
                self._victims_lead = False
            s = self._t.at(s).next
        self._victims.resize(n)
        return n >= count

    cdef inline int _rekey_slot(self, int64_t s, uint64_t key, double ready) except -1:
        """Slot ``s`` evicted and holding ``key`` instead, ready and busy at ``ready`` (as a new
        slot would be); its place in the lists is the caller's."""
        cdef BlisSlot* p
        self._t.rekey(s, key)
        p = self._t.at(s)
        p.ready, p.busy = ready, ready
        return 0

    cdef void _lead_to_tail(self, int64_t last) noexcept:
        """Move T1's slots from its head through ``last`` to its tail, in their order: what
        unlinking and appending each of them in turn does, with one relink."""
        cdef int64_t first = self._head[0], tail = self._tail[0], nx
        if last == tail:
            return
        nx = self._t.at(last).next
        self._head[0] = nx
        self._t.at(nx).prev = -1
        self._t.at(tail).next = <int32_t>first
        self._t.at(first).prev = <int32_t>tail
        self._t.at(last).next = -1
        self._tail[0] = last

    cdef bint _evict_arc(self, int64_t count, double now) except -1:
        cdef int64_t k, s, t1, t2
        cdef bint from_t1
        cdef int src, ghost
        for k in range(count):
            t1 = self._size[0]
            t2 = self._size[1]
            from_t1 = t1 > 0 and (t2 == 0 or t1 >= self.target_t1)
            src = 0 if from_t1 else 1
            s = self._first_evictable(src, now)
            if s < 0:
                return False
            self._unlink(s)
            self._append(s, 2 if from_t1 else 3)
            self.evictions += 1
            for ghost in range(2, 4):
                while self._size[ghost] > self.capacity:
                    self._drop_slot(self._head[ghost])
        return True

    def prepare_store(self, const uint64_t[::1] keys, double now, double ready):
        cdef vector[uint64_t] todo
        cdef vector[int64_t] slots
        if not self._prepare_store(_ptr(keys), keys.shape[0], now, ready, todo, slots):
            return None
        out = np.empty(todo.size(), dtype=np.uint64)
        cdef uint64_t[::1] o = out
        cdef Py_ssize_t i
        for i in range(<Py_ssize_t>todo.size()):
            o[i] = todo[i]
        return out

    cdef inline bint _first_sight(self, uint64_t k) noexcept:
        """Whether ``k`` is new to this call's scratch set (and now in it)."""
        cdef uint64_t mask = self._seen.size() - 1
        cdef uint64_t i = (k * 0x9E3779B97F4A7C15ULL) >> 32 & mask
        cdef Seen* e
        while True:
            e = &self._seen[i]
            if e.call != self._seen_call:  # free in this call
                e.key, e.call = k, self._seen_call
                return True
            if e.key == k:
                return False
            i = (i + 1) & mask

    cdef bint _prepare_store(self, const uint64_t* keys, Py_ssize_t nkeys, double now,
                             double ready, vector[uint64_t]& todo,
                             vector[int64_t]& slots) except -1:
        """Fills ``todo`` with the keys stored (in order, duplicates and residents left out) and
        ``slots`` with their new slots (for _set_ready_slots: no second probe);
        ``False``: not enough evictable room, nothing changed. (``keys`` must not point into
        ``todo``.)"""
        cdef Py_ssize_t i, nt = 0
        cdef uint64_t k, cap
        cdef int64_t need, s
        cdef bint ok
        # todo and slots are sized for every key, written through pointers and trimmed: an append
        # per key loaded and stored the vector's end each time (~1.4 million for 10k requests)
        todo.resize(nkeys)
        slots.resize(nkeys)
        cdef uint64_t* tp = todo.data()
        cdef int64_t* sp = slots.data()
        self._prefetch(keys, 0, nkeys)
        if self._compact:
            # unbounded: nothing to evict, so each new key is stored at once, and a later copy of
            # it in this call finds it resident (no duplicate check); same keys, order and slots
            for i in range(nkeys):
                k = keys[i]
                if self._c.find(k) < 0:
                    tp[nt] = k
                    sp[nt] = self._new_slot(k, 0, ready, ready)
                    nt += 1
            todo.resize(nt)
            slots.resize(nt)
            return True
        if nkeys > 1:
            self._seen_call += 1
            if self._seen.size() < <size_t>(2 * nkeys):
                cap = 16
                while cap < <uint64_t>(2 * nkeys):
                    cap <<= 1
                self._seen.assign(cap, Seen(0, 0))
        for i in range(nkeys):
            k = keys[i]
            if self._resident(k) < 0 and (nkeys == 1 or self._first_sight(k)):
                tp[nt] = k
                nt += 1
        todo.resize(nt)
        slots.resize(nt)
        if nt == 0:
            return True
        need = 0
        if self.capacity > 0:
            need = nt - (self.capacity - self._size[0] - self._size[1])
            if need > 0:
                ok = self._evict_arc(need, now) if self.arc else self._pick_lru(need, now)
                if not ok:
                    todo.clear()
                    slots.clear()
                    return False
        if not self.arc:
            # LRU: the first ``need`` new keys take the victims' slots (evicting all of them
            # first, then storing, gives the same order, keys and counts: slot numbers are not
            # observable), the rest new slots
            # (victims leading T1 go to its tail in one relink, as the rotation they are)
            if need > 0 and self._victims_lead:
                self._lead_to_tail(self._victims[need - 1])
            for i in range(need):
                s = self._victims[i]
                if not self._victims_lead:
                    self._to_lru_tail(s)
                self._rekey_slot(s, tp[i], ready)
                sp[i] = s
            for i in range(max(need, 0), nt):
                sp[i] = self._new_slot(tp[i], 0, ready, ready)
            if need > 0:
                self.evictions += need
            return True
        for i in range(nt):
            k = tp[i]
            s = self._t.find(k)  # a ghost (B1/B2) entry of the key gives way
            if s >= 0:
                self._drop_slot(s)
            sp[i] = self._new_slot(k, 0, ready, ready)
        return True

    cdef void _set_ready_slots(self, const int64_t* slots, Py_ssize_t n, double ready,
                               double until) noexcept:
        """:meth:`_set_ready` on the slots a :meth:`_prepare_store` just made, then :meth:`_pin`
        until ``until`` (nothing more when that is not after ``ready``): one pass, no probe."""
        cdef Py_ssize_t i
        if self._compact:
            for i in range(n):
                self._c.at(slots[i]).ready = ready
            return
        for i in range(n):
            self._ready_slot(slots[i], ready)
            self._pin_slot(slots[i], until)

    def _walk(self, int lst):
        out = []
        cdef int64_t s = self._head[lst]
        if self._compact:  # insertion order (nothing reorders it); busy is the ready time
            if lst == 0:
                for s in range(self._c.nslots):
                    out.append((int(self._c.at(s).key), float(self._c.at(s).ready),
                                float(self._c.at(s).ready)))
            return out
        while s >= 0:
            out.append((int(self._t.at(s).key), float(self._t.at(s).ready), float(self._t.at(s).busy)))
            s = self._t.at(s).next
        return out

    def state(self):
        return {
            "t1": self._walk(0),
            "t2": self._walk(1),
            "b1": [k for k, _, _ in self._walk(2)],
            "b2": [k for k, _, _ in self._walk(3)],
            "target_t1": self.target_t1,
            "evictions": self.evictions,
        }

    def keys(self):
        return [k for k, _, _ in self._walk(0) + self._walk(1)]


# -- the admission-time tier walk (one call per lookup; see the pure twin) -------------------------
cdef struct Span:
    int tier
    Py_ssize_t a
    Py_ssize_t b


cdef inline void _count(unsigned char* flags, Py_ssize_t stride, int64_t* deltas, Py_ssize_t tier,
                        Py_ssize_t a, Py_ssize_t b, bint hit) noexcept:
    cdef Py_ssize_t i
    cdef unsigned char f
    for i in range(a, b):
        f = flags[tier * stride + i]
        if not (f & 1):
            deltas[2 * tier] += 1
            f |= 1
        if hit and not (f & 2):
            deltas[2 * tier + 1] += 1
            f |= 2
        flags[tier * stride + i] = f


cdef Py_ssize_t _walk(list tiers, const uint64_t* keys, Py_ssize_t pos, Py_ssize_t nchunks,
                      double now, unsigned char* flags, Py_ssize_t stride, int64_t* deltas,
                      vector[Span]& plan) except -1:
    """:func:`tier_walk` on raw arrays (``flags``: tiers × ``stride``; ``deltas``: tiers × 2,
    zeroed here); fills ``plan``, returns the run's end."""
    cdef ChunkStore cpu = <ChunkStore?>tiers[0]
    cdef ChunkStore tier
    cdef Py_ssize_t n, t, found, ntiers = len(tiers)
    cdef int64_t s = -1  # the last probe of the CPU tier
    cdef uint64_t key
    cdef bint hit
    cdef Span sp
    plan.clear()
    for t in range(2 * ntiers):
        deltas[t] = 0
    for t in range(1, ntiers):  # the secondary tiers are probed chunk by chunk: start the loads
        (<ChunkStore>tiers[t])._prefetch(keys, pos, min(nchunks, pos + 256))
    if ntiers > 1:
        # The first pass over asynchronous secondary tiers never meets a MISS, so it queries the
        # CPU tier for every chunk (see _core_py._count_first_pass); a PENDING chunk is counted later.
        for n in range(pos, nchunks):
            s = cpu._resident(keys[n])
            if s < 0:
                _count(flags, stride, deltas, 0, n, n + 1, False)
            elif cpu.ready_of(s) <= now:
                _count(flags, stride, deltas, 0, n, n + 1, True)
        s = -1
    while pos < nchunks:
        n = 0
        while pos + n < nchunks:
            s = cpu._resident(keys[pos + n])
            if s < 0 or cpu.ready_of(s) > now:
                break
            n += 1
        if n:
            _count(flags, stride, deltas, 0, pos, pos + n, True)
            sp.tier, sp.a, sp.b = 0, pos, pos + n
            plan.push_back(sp)
            pos += n
            if pos >= nchunks:
                break
        key = keys[pos]
        # s: the probe of keys[pos] that ended the run above. Resident: PENDING (a READY one would
        # have joined the run)
        if s >= 0:
            break
        _count(flags, stride, deltas, 0, pos, pos + 1, False)
        found = 0
        for t in range(1, ntiers):
            tier = <ChunkStore?>tiers[t]
            s = tier._resident(key)
            hit = s >= 0 and tier.ready_of(s) <= now
            _count(flags, stride, deltas, t, pos, pos + 1, hit)
            if hit:
                found = t
                break
        if not found:
            break
        if plan.size() and plan.back().tier == found and plan.back().b == pos:
            plan[plan.size() - 1].b = pos + 1
        else:
            sp.tier, sp.a, sp.b = <int>found, pos, pos + 1
            plan.push_back(sp)
        pos += 1
    return pos


def tier_walk(list tiers, const uint64_t[::1] keys, Py_ssize_t pos, Py_ssize_t nchunks,
              double now, unsigned char[:, ::1] flags, int64_t[:, ::1] deltas):
    """The connector's lookup over the offload tiers (see :func:`blis_sim.kv._core_py.tier_walk`)."""
    cdef vector[Span] plan
    cdef Py_ssize_t t
    nchunks = min(nchunks, keys.shape[0])
    pos = _walk(tiers, _ptr(keys), pos, nchunks, now, &flags[0, 0], flags.shape[1],
                &deltas[0, 0], plan)
    out = [(sp.tier, sp.a, sp.b) for sp in plan]
    for t in range(deltas.shape[0]):
        if deltas[t, 0] or deltas[t, 1]:
            return pos, out, True
    return pos, out, False


include "_cache.pxi"
