"""Pure-Python twin of :mod:`blis_sim.kv._core` (the Cython KV core). Same API, same results.

The core holds the three hot structures; :class:`blis_sim.kv.KVCache` composes them.

* :func:`hash_blocks(tokens, block_size, salt=0)` → ``uint64`` array: one chained 64-bit hash per
  **full** block (vLLM's parent chaining: block *i* matches iff tokens ``0 … (i+1)·bs − 1`` match and
  the salt matches). Never 0. The trailing partial block is not hashed.
* :class:`BlockPool` — the GPU block pool with vLLM V1 semantics: block 0 is the reserved null
  block; a doubly linked free queue (allocation pops the front; a popped block that still carries a
  hash is evicted from the hash map then); reference counts shared between requests; ``free`` walks
  a request's blocks tail first, appends hashed blocks to the back of the queue and puts hashless
  ones at the front (reused first); a hit on a free block takes it out of the queue.
  ``lookup(hashes, max_blocks)`` is a pure query; ``allocate(rid, hashes, num_hit_blocks,
  num_tokens)`` is check-then-act and returns ``False`` without changing anything when the free
  queue is too short; ``cache(rid, hashes, num_full_blocks)`` registers full blocks' hashes.
  A hash is held by at most one block: a block whose hash is already cached stays hashless.
* :class:`ChunkStore` — an offload tier keyed by chunk hash: ``lru`` (vLLM's LRUOffloadingManager)
  or ``arc`` (ARCOffloadingManager: T1/T2 + ghost lists B1/B2 and an adaptive T1 target), bounded
  (``capacity`` chunks) or unbounded (``capacity < 0``). Each entry has a ``ready`` time (readable
  from then on: vLLM's ``is_ready``) and a ``busy`` time (pinned by an in-flight transfer until
  then). Only entries with ``ready <= now`` and ``busy <= now`` can be evicted (vLLM's
  ``ref_cnt == 0``). ``prepare_store`` is vLLM's: keys already present are skipped, evictions come
  first, and ``None`` means the tier could not make room.

Everything is index-based (parallel lists + intrusive links) so the Cython port is line for line.
"""
from __future__ import annotations

from typing import Any

import numpy as np

MASK = (1 << 64) - 1
_SEED = 0x6A09E667F3BCC909
_MULT_SALT = 0x5BD1E995

LIST_T1, LIST_T2, LIST_B1, LIST_B2 = 0, 1, 2, 3
ABSENT, PENDING, READY = 0, 1, 2


def mix64(z: int) -> int:
    """splitmix64's finalizer: a bijection on 64-bit integers."""
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


_multipliers: dict[int, np.ndarray] = {}


def _mults(block_size: int) -> np.ndarray:
    arr = _multipliers.get(block_size)
    if arr is None:
        arr = np.array([mix64(j + _MULT_SALT) | 1 for j in range(block_size)], dtype=np.uint64)
        _multipliers[block_size] = arr
    return arr


def root_hash(salt: int = 0) -> int:
    """The chain's parent for block 0 (vLLM's NONE_HASH), per salt (LoRA, cache_salt, ...)."""
    return mix64(_SEED ^ (salt & MASK))


def chain(parent: int, content: int) -> int:
    h = mix64(mix64(parent) ^ content)
    return h if h else 1


def hash_blocks(tokens: Any, block_size: int, salt: int = 0) -> np.ndarray:
    """Chained 64-bit hashes of the full blocks of ``tokens`` (an integer array)."""
    toks = np.ascontiguousarray(tokens).astype(np.int64, copy=False)
    nb = toks.shape[0] // block_size
    out = np.empty(nb, dtype=np.uint64)
    if nb == 0:
        return out
    body = toks[: nb * block_size].reshape(nb, block_size).view(np.uint64) + np.uint64(1)
    contents = (body * _mults(block_size)).sum(axis=1, dtype=np.uint64)
    h = root_hash(salt)
    for i, c in enumerate(contents.tolist()):
        h = chain(h, c)
        out[i] = h
    return out


def extend_hashes(parent: int, seed: int, start: int, count: int) -> np.ndarray:
    """``count`` chained hashes standing for unique content (decode blocks whose tokens are unknown).

    Block ``start + k`` gets ``chain(prev, mix64(seed ^ (start + k)))``: unique per request seed.
    """
    out = np.empty(count, dtype=np.uint64)
    h = parent
    for k in range(count):
        h = chain(h, mix64((seed ^ (start + k)) & MASK))
        out[k] = h
    return out


def prefixed_hashes(prefix: np.ndarray, shared: int, root: int, seed: int, count: int) -> np.ndarray:
    """``count`` block hashes: ``prefix[:shared]``, then :func:`extend_hashes` of unique content
    after it (``root`` is the parent when ``shared`` is 0): a prefix-group request's blocks."""
    parent = int(prefix[shared - 1]) if shared else root
    tail = extend_hashes(parent, seed, shared, count - shared)
    return np.concatenate([prefix[:shared], tail]) if shared else tail


class BlockPool:
    """GPU blocks, free queue and hash map (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if num_blocks < 2 or block_size < 1:
            raise ValueError("num_blocks must be >= 2 and block_size >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        n = num_blocks
        self._ref = [0] * n
        self._hash = [0] * n
        self._prev = [-1] * n
        self._next = [-1] * n
        self._map: dict[int, int] = {}
        self._head = -1
        self._tail = -1
        self.num_free = 0
        self._req: dict[int, list[int]] = {}
        self._req_cached: dict[int, int] = {}
        self.evictions = 0
        # Block 0 is vLLM's null block: never in the free queue, never handed out.
        for b in range(1, n):
            self._push_back(b)

    # -- free queue -----------------------------------------------------------------------------
    def _push_back(self, b: int) -> None:
        self._prev[b] = self._tail
        self._next[b] = -1
        if self._tail >= 0:
            self._next[self._tail] = b
        else:
            self._head = b
        self._tail = b
        self.num_free += 1

    def _push_front(self, b: int) -> None:
        self._next[b] = self._head
        self._prev[b] = -1
        if self._head >= 0:
            self._prev[self._head] = b
        else:
            self._tail = b
        self._head = b
        self.num_free += 1

    def _unlink(self, b: int) -> None:
        p, nx = self._prev[b], self._next[b]
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

    # -- queries --------------------------------------------------------------------------------
    def lookup(self, hashes: np.ndarray, max_blocks: int) -> int:
        """Number of leading ``hashes`` cached on the GPU, at most ``max_blocks``."""
        if not self.enable_caching:
            return 0
        n = max(0, min(max_blocks, len(hashes)))
        m = self._map
        i = 0
        for h in hashes[:n].tolist():
            if h not in m:
                break
            i += 1
        return i

    def num_blocks_of(self, rid: int) -> int:
        blocks = self._req.get(rid)
        return len(blocks) if blocks is not None else 0

    def usage(self) -> float:
        """vLLM's ``kv_cache_usage_perc``: 1 − free / (num_gpu_blocks − 1)."""
        return 1.0 - self.num_free / (self.num_blocks - 1)

    # -- mutations ------------------------------------------------------------------------------
    def allocate(self, rid: int, hashes: np.ndarray, num_hit_blocks: int, num_tokens: int) -> bool:
        """Make ``rid`` own ``ceil(num_tokens / block_size)`` blocks; the first ``num_hit_blocks``
        (only for a request owning none) are the cached blocks of ``hashes[:num_hit_blocks]``.
        Returns ``False``, changing nothing, when the free queue cannot supply the rest."""
        blocks = self._req.get(rid)
        have = len(blocks) if blocks is not None else 0
        hits = num_hit_blocks if have == 0 else 0
        need = -(-num_tokens // self.block_size)
        n_new = need - have - hits
        if n_new < 0:
            n_new = 0
        hit_ids: list[int] = []
        evictable = 0
        if hits:
            m = self._map
            for h in hashes[:hits].tolist():
                b = m[h]
                hit_ids.append(b)
                if self._ref[b] == 0:
                    evictable += 1
        if n_new + evictable > self.num_free:
            return False
        if blocks is None:
            blocks = []
            self._req[rid] = blocks
            self._req_cached[rid] = 0
        for b in hit_ids:
            if self._ref[b] == 0:
                self._unlink(b)
            self._ref[b] += 1
            blocks.append(b)
        if hits:
            self._req_cached[rid] = hits
        for _ in range(n_new):
            b = self._head
            self._unlink(b)
            h = self._hash[b]
            if h:
                if self._map.get(h) == b:
                    del self._map[h]
                self._hash[b] = 0
                self.evictions += 1
            self._ref[b] = 1
            blocks.append(b)
        return True

    def allocate_and_cache(self, rid: int, hashes: np.ndarray, num_tokens: int,
                           num_full_blocks: int) -> int:
        """``allocate(rid, hashes, 0, num_tokens)`` then, if it succeeded, ``cache(rid, hashes,
        num_full_blocks)``: a decode step crossing a block boundary in one call. Returns -1
        (nothing changed) or ``cache``'s count."""
        if not self.allocate(rid, hashes, 0, num_tokens):
            return -1
        return self.cache(rid, hashes, num_full_blocks)

    def cache(self, rid: int, hashes: np.ndarray, num_full_blocks: int) -> int:
        """Register the hashes of ``rid``'s blocks up to ``num_full_blocks``; returns how many
        blocks were newly registered."""
        if not self.enable_caching:
            return 0
        blocks = self._req.get(rid)
        if blocks is None:
            return 0
        start = self._req_cached[rid]
        end = min(num_full_blocks, len(blocks), len(hashes))
        added = 0
        m = self._map
        for i in range(start, end):
            b = blocks[i]
            if self._hash[b]:
                continue
            h = int(hashes[i])
            if h in m:
                continue  # another block holds this hash: keep one copy (hash uniqueness)
            m[h] = b
            self._hash[b] = h
            added += 1
        if end > start:
            self._req_cached[rid] = end
        return added

    def free(self, rid: int) -> int:
        """Release ``rid``'s blocks (finish or preemption), tail block first; returns the count."""
        blocks = self._req.pop(rid, None)
        self._req_cached.pop(rid, None)
        if blocks is None:
            return 0
        front: list[int] = []
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if self._hash[b]:
                    self._push_back(b)
                else:
                    front.append(b)
        for b in reversed(front):
            self._push_front(b)
        return len(blocks)

    # -- introspection --------------------------------------------------------------------------
    def free_queue(self) -> list[int]:
        out = []
        b = self._head
        while b >= 0:
            out.append(b)
            b = self._next[b]
        return out

    def state(self) -> dict[str, Any]:
        """Complete observable state, for parity tests."""
        return {
            "free_queue": self.free_queue(),
            "ref": list(self._ref),
            "hash": [int(h) for h in self._hash],
            "map": sorted((int(h), b) for h, b in self._map.items()),
            "requests": {int(r): list(bs) for r, bs in sorted(self._req.items())},
            "req_cached": {int(r): c for r, c in sorted(self._req_cached.items())},
            "num_free": self.num_free,
            "evictions": self.evictions,
        }


class ChunkStore:
    """One offload tier (see the module docstring). Keys are nonzero 64-bit chunk hashes."""

    def __init__(self, capacity: int, policy: str = "lru") -> None:
        if policy not in ("lru", "arc"):
            raise ValueError(f"unknown eviction policy {policy!r}")
        if capacity == 0:
            raise ValueError("capacity must be > 0 (or < 0 for unbounded)")
        self.capacity = capacity
        self.arc = policy == "arc"
        # An unbounded LRU store never evicts, so pins and recency order change nothing there: it
        # ignores touch and pin, and its busy time is its ready time (the compiled twin then keeps
        # only key and ready time per chunk: tens of millions of chunks in an unbounded fs tier).
        self.compact = capacity < 0 and not self.arc
        self._key: list[int] = []
        self._ready: list[float] = []
        self._busy: list[float] = []
        self._prev: list[int] = []
        self._next: list[int] = []
        self._list: list[int] = []
        self._free_slots: list[int] = []
        self._map: dict[int, int] = {}
        self._head = [-1, -1, -1, -1]
        self._tail = [-1, -1, -1, -1]
        self._size = [0, 0, 0, 0]
        self.target_t1 = 0
        self.evictions = 0

    # -- slots and lists ------------------------------------------------------------------------
    def _new_slot(self, key: int, lst: int, ready: float, busy: float) -> int:
        if self._free_slots:
            s = self._free_slots.pop()
            self._key[s] = key
            self._ready[s] = ready
            self._busy[s] = busy
        else:
            s = len(self._key)
            self._key.append(key)
            self._ready.append(ready)
            self._busy.append(busy)
            self._prev.append(-1)
            self._next.append(-1)
            self._list.append(lst)
        self._map[key] = s
        self._append(s, lst)
        return s

    def _drop_slot(self, s: int) -> None:
        self._unlink(s)
        del self._map[self._key[s]]
        self._free_slots.append(s)

    def _append(self, s: int, lst: int) -> None:
        self._list[s] = lst
        t = self._tail[lst]
        self._prev[s] = t
        self._next[s] = -1
        if t >= 0:
            self._next[t] = s
        else:
            self._head[lst] = s
        self._tail[lst] = s
        self._size[lst] += 1

    def _unlink(self, s: int) -> None:
        lst = self._list[s]
        p, nx = self._prev[s], self._next[s]
        if p >= 0:
            self._next[p] = nx
        else:
            self._head[lst] = nx
        if nx >= 0:
            self._prev[nx] = p
        else:
            self._tail[lst] = p
        self._size[lst] -= 1

    def _resident(self, key: int) -> int:
        s = self._map.get(key, -1)
        if s >= 0 and self._list[s] <= LIST_T2:
            return s
        return -1

    # -- queries --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._size[LIST_T1] + self._size[LIST_T2]

    def state_of(self, key: int, now: float) -> int:
        """``ABSENT`` (0), ``PENDING`` (1: being written or promoted) or ``READY`` (2)."""
        s = self._resident(key)
        if s < 0:
            return ABSENT
        return READY if self._ready[s] <= now else PENDING

    def ready_prefix(self, keys: np.ndarray, start: int, end: int, now: float) -> int:
        """Count of consecutive keys from ``keys[start]`` (up to ``end``) that are ready."""
        n = 0
        for k in keys[start:end].tolist():
            s = self._resident(k)
            if s < 0 or self._ready[s] > now:
                break
            n += 1
        return n

    def ready_time(self, key: int) -> float:
        s = self._resident(key)
        return self._ready[s] if s >= 0 else -1.0

    # -- mutations ------------------------------------------------------------------------------
    def touch(self, keys: np.ndarray, start: int, end: int) -> None:
        """Mark ``keys[start:end]`` recently used, last key first (so the first ends up newest)."""
        if self.compact:
            return
        for k in reversed(keys[start:end].tolist()):
            s = self._map.get(k, -1)
            if s < 0:
                continue
            lst = self._list[s]
            if not self.arc:
                self._unlink(s)
                self._append(s, LIST_T1)
            elif lst in (LIST_T1, LIST_T2):
                self._unlink(s)
                self._append(s, LIST_T2)
            elif lst == LIST_B1:
                b1, b2 = self._size[LIST_B1], self._size[LIST_B2]
                delta = max(1, b2 // b1) if b1 > 0 else 1
                self.target_t1 = min(self.target_t1 + delta, self.capacity)
            else:
                b1, b2 = self._size[LIST_B1], self._size[LIST_B2]
                delta = max(1, b1 // b2) if b2 > 0 else 1
                self.target_t1 = max(self.target_t1 - delta, 0)

    def pin(self, keys: np.ndarray, start: int, end: int, until: float) -> None:
        """Protect resident ``keys[start:end]`` from eviction until ``until`` (a transfer)."""
        if self.compact:
            return
        for k in keys[start:end].tolist():
            s = self._resident(k)
            if s >= 0 and self._busy[s] < until:
                self._busy[s] = until

    def set_ready(self, keys: np.ndarray, ready: float) -> None:
        """A transfer into this tier completes at ``ready``: readable (and unpinned) from then."""
        for k in keys.tolist():
            s = self._resident(k)
            if s >= 0:
                self._ready[s] = ready
                if self.compact or self._busy[s] < ready or self._busy[s] == float("inf"):
                    self._busy[s] = ready

    def _evictable(self, s: int, now: float) -> bool:
        return self._ready[s] <= now and self._busy[s] <= now

    def _first_evictable(self, lst: int, now: float) -> int:
        s = self._head[lst]
        while s >= 0 and not self._evictable(s, now):
            s = self._next[s]
        return s

    def _evict_lru(self, count: int, now: float) -> bool:
        victims: list[int] = []
        s = self._head[LIST_T1]
        while s >= 0 and len(victims) < count:
            if self._evictable(s, now):
                victims.append(s)
            s = self._next[s]
        if len(victims) < count:
            return False
        for v in victims:
            self._drop_slot(v)
        self.evictions += count
        return True

    def _evict_arc(self, count: int, now: float) -> bool:
        for _ in range(count):
            t1, t2 = self._size[LIST_T1], self._size[LIST_T2]
            from_t1 = t1 > 0 and (t2 == 0 or t1 >= self.target_t1)
            src = LIST_T1 if from_t1 else LIST_T2
            s = self._first_evictable(src, now)
            if s < 0:
                return False
            self._unlink(s)
            self._append(s, LIST_B1 if from_t1 else LIST_B2)
            self.evictions += 1
            for ghost in (LIST_B1, LIST_B2):
                while self._size[ghost] > self.capacity:
                    self._drop_slot(self._head[ghost])
        return True

    def prepare_store(self, keys: np.ndarray, now: float, ready: float) -> np.ndarray | None:
        """Insert the keys not already resident, readable from ``ready``; evict to make room.

        Returns the inserted keys, or ``None`` when not enough entries could be evicted (for LRU
        nothing changed then; ARC may have evicted some first, as vLLM's does)."""
        todo = []
        seen = set()
        for k in keys.tolist():
            if k not in seen and self._resident(k) < 0:
                todo.append(k)
                seen.add(k)
        if not todo:
            return np.empty(0, dtype=np.uint64)
        if self.capacity > 0:
            need = len(todo) - (self.capacity - len(self))
            if need > 0:
                ok = self._evict_arc(need, now) if self.arc else self._evict_lru(need, now)
                if not ok:
                    return None
        for k in todo:
            s = self._map.get(k, -1)
            if s >= 0:  # a ghost entry (ARC): forget it, the key becomes resident in T1
                self._drop_slot(s)
            self._new_slot(k, LIST_T1, ready, ready)
        return np.array(todo, dtype=np.uint64)

    # -- introspection --------------------------------------------------------------------------
    def _walk(self, lst: int) -> list[tuple[int, float, float]]:
        out = []
        s = self._head[lst]
        while s >= 0:
            out.append((int(self._key[s]), float(self._ready[s]), float(self._busy[s])))
            s = self._next[s]
        return out

    def state(self) -> dict[str, Any]:
        return {
            "t1": self._walk(LIST_T1),
            "t2": self._walk(LIST_T2),
            "b1": [k for k, _, _ in self._walk(LIST_B1)],
            "b2": [k for k, _, _ in self._walk(LIST_B2)],
            "target_t1": self.target_t1,
            "evictions": self.evictions,
        }

    def keys(self) -> list[int]:
        """Resident keys, eviction order first (T1 then T2)."""
        return [k for k, _, _ in self._walk(LIST_T1) + self._walk(LIST_T2)]


# -- the admission-time tier walk (one call per lookup) ------------------------------------------
def _count(flags: np.ndarray, deltas: np.ndarray, tier: int, a: int, b: int, hit: bool) -> None:
    """Count chunks ``a … b−1`` of ``tier`` as queried (and hit): once per request, tier, chunk.
    ``flags[tier, chunk]``: bit 1 = counted in the queries, bit 2 = counted in the hits;
    ``deltas[tier] = (new queries, new hits)``."""
    seg = flags[tier, a:b]
    deltas[tier, 0] += int(np.count_nonzero((seg & 1) == 0))
    seg |= 1
    if hit:
        deltas[tier, 1] += int(np.count_nonzero((seg & 2) == 0))
        seg |= 2


def _count_first_pass(cpu: ChunkStore, keys: np.ndarray, pos: int, nchunks: int, now: float,
                      flags: np.ndarray, deltas: np.ndarray) -> None:
    """The primary tier's counts of a lookup's first pass when secondary tiers exist
    (docs/vllm-semantics.md, "Tiering counters"): a secondary tier answers RETRY until its
    asynchronous lookup resolves, so the first pass never meets a MISS and queries the CPU tier
    for every chunk from ``pos`` to ``nchunks`` (a READY chunk is a hit, an absent one a miss, a
    PENDING one is counted later, when a pass that reaches it sees it READY)."""
    for c in range(pos, nchunks):
        state = cpu.state_of(int(keys[c]), now)
        if state != PENDING:
            _count(flags, deltas, 0, c, c + 1, state == READY)


def tier_walk(tiers: list[ChunkStore], keys: np.ndarray, pos: int, nchunks: int, now: float,
              flags: np.ndarray, deltas: np.ndarray) -> tuple[int, list[tuple[int, int, int]], bool]:
    """The connector's lookup over the offload tiers, from chunk ``pos`` (the first chunk not on
    the GPU) up to ``nchunks``: the longest run of chunks each READY in the CPU tier or, failing
    that, READY in the first secondary tier that holds it. A chunk being written or promoted in
    the CPU tier (PENDING: vLLM's unresolved lookup) ends the run uncounted. Counts each tier's
    chunk queries/hits into ``flags``/``deltas`` (see :func:`_count`).
    Returns ``(end, plan, counted)``: the run ends before chunk ``end``; ``plan`` =
    ``[(tier, a, b)]`` ranges in order, adjacent ranges of one tier merged; ``counted``: some
    count moved (``deltas`` is zeroed first)."""
    cpu = tiers[0]
    plan: list[tuple[int, int, int]] = []
    deltas.fill(0)
    if len(tiers) > 1:
        _count_first_pass(cpu, keys, pos, nchunks, now, flags, deltas)
    while pos < nchunks:
        n = cpu.ready_prefix(keys, pos, nchunks, now)
        if n:
            _count(flags, deltas, 0, pos, pos + n, True)
            plan.append((0, pos, pos + n))
            pos += n
            if pos >= nchunks:
                break
        key = int(keys[pos])
        if cpu.state_of(key, now) != ABSENT:
            break
        _count(flags, deltas, 0, pos, pos + 1, False)
        found = 0
        for t in range(1, len(tiers)):
            hit = tiers[t].state_of(key, now) == READY
            _count(flags, deltas, t, pos, pos + 1, hit)
            if hit:
                found = t
                break
        if not found:
            break
        if plan and plan[-1][0] == found and plan[-1][2] == pos:
            plan[-1] = (found, plan[-1][1], pos + 1)
        else:
            plan.append((found, pos, pos + 1))
        pos += 1
    return pos, plan, bool(deltas.any())
