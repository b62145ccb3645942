"""The GPU KV block pool and prefix cache, as vLLM 0.33's ``BlockPool`` + ``KVCacheManager`` do it.

API::

    pool = BlockPool(num_gpu_blocks=512, block_size=32, enable_caching=True)
    hashes = block_hashes(token_ids, block_size, parent=None)   # chained hash per FULL block
    hit_blocks = pool.find_longest_hit(hashes, max_tokens)      # cached blocks, longest prefix
    pool.touch(hit_blocks)                # take them (ref += 1, out of the free queue)
    new = pool.allocate(n)                # list[Block] or None when there are not n free blocks
    pool.cache_block(block, block_hash)   # register a full, computed block under its hash
    pool.free(blocks)                     # release a request's blocks (tail first)
    pool.usage()                          # 1 - free/(num_gpu_blocks - 1), vLLM's kv_cache_usage_perc
    pool.reset()                          # drop every cached hash (only when nothing is in use)

Semantics (``docs/vllm-semantics.md`` §3): block ``i`` hashes ``(hash_{i-1}, tokens of block i)``;
only full blocks are hashed. The lookup stops at the first miss. The free queue pops from the front;
freed blocks with a hash are appended to the back (LRU eviction order, and a request's tail block is
freed first so a chain's tail goes before its head); blocks without a hash go to the front. A cached
block is evicted lazily, when it is popped for reuse. One block is vLLM's reserved null block, so
``num_gpu_blocks - 1`` are usable.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

NONE_HASH = hash(("blis-emulator-none-hash",))


class Block:
    """One GPU block: its reference count and, once full and computed, its hash."""

    __slots__ = ("block_hash", "ref_cnt")

    def __init__(self) -> None:
        self.block_hash: int | None = None
        self.ref_cnt = 0


def block_hashes(token_ids: Sequence[int], block_size: int, parent: int | None = None,
                 start_block: int = 0) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` from block ``start_block`` on."""
    out: list[int] = []
    h = NONE_HASH if parent is None else parent
    n_full = len(token_ids) // block_size
    for i in range(start_block, n_full):
        h = hash((h, tuple(token_ids[i * block_size:(i + 1) * block_size])))
        out.append(h)
    return out


class BlockPool:
    """Free queue + hash table of one GPU KV cache (see module docstring)."""

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._capacity = max(num_gpu_blocks - 1, 0)
        self._never_used = self._capacity  # blocks not yet materialised (front of the free queue)
        self._free_uncached: list[Block] = []  # free blocks without a hash (front of the queue)
        self._free_cached: OrderedDict[int, Block] = OrderedDict()  # id(block) -> block, LRU first
        self._cached: dict[int, Block] = {}  # block hash -> block

    # -- queries ---------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self._never_used + len(self._free_uncached) + len(self._free_cached)

    @property
    def capacity(self) -> int:
        return self._capacity

    def usage(self) -> float:
        if self._capacity == 0:
            return 0.0
        return 1.0 - self.num_free / self._capacity

    def find_longest_hit(self, hashes: Sequence[int], max_tokens: int) -> list[Block]:
        """Cached blocks for the longest prefix of ``hashes`` covering at most ``max_tokens``."""
        if not self.enable_caching:
            return []
        hit: list[Block] = []
        limit = min(len(hashes), max_tokens // self.block_size)
        cached = self._cached
        for i in range(limit):
            block = cached.get(hashes[i])
            if block is None:
                break
            hit.append(block)
        return hit

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._cached

    # -- mutations -------------------------------------------------------------------------------
    def touch(self, blocks: Sequence[Block]) -> None:
        for block in blocks:
            if block.ref_cnt == 0:
                self._free_cached.pop(id(block), None)
            block.ref_cnt += 1

    def allocate(self, n: int) -> list[Block] | None:
        if n > self.num_free:
            return None
        out: list[Block] = []
        while len(out) < n and self._free_uncached:
            out.append(self._free_uncached.pop())
        while len(out) < n and self._never_used:
            self._never_used -= 1
            out.append(Block())
        while len(out) < n:
            _, block = self._free_cached.popitem(last=False)
            # Lazy eviction: the block's hash stops being a cache hit only now.
            if self._cached.get(block.block_hash) is block:  # type: ignore[arg-type]
                del self._cached[block.block_hash]  # type: ignore[arg-type]
            block.block_hash = None
            out.append(block)
        for block in out:
            block.ref_cnt = 1
        return out

    def cache_block(self, block: Block, block_hash: int) -> None:
        """Register a full computed block; a hash already cached keeps its first block."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def free(self, blocks: Sequence[Block]) -> None:
        """Release a request's blocks: tail first, cached ones to the LRU back, others to the front."""
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt > 0:
                continue
            if block.block_hash is not None:
                self._free_cached[id(block)] = block
            else:
                self._free_uncached.append(block)

    def reset(self) -> bool:
        """Forget every cached hash (vLLM's reset_prefix_cache): refused while blocks are in use."""
        if self.num_free != self._capacity:
            return False
        for block in self._free_cached.values():
            block.block_hash = None
            self._free_uncached.append(block)
        self._free_cached.clear()
        self._cached.clear()
        return True
