"""vLLM 0.33's offloading connector with tiering: a CPU primary tier and secondary (fs) tiers.

API::

    tiers = OffloadTiers(spec, block_size=32, kv_bytes_per_token=512, host_bandwidth_Bps=10e9,
                         host_latency_s=20e-6, stats=engine_stats)
    tiers.lookup(req, hashes, start_tokens, max_tokens, now)
        -> None (ask again next step: a promotion is in flight) | LookupResult(tokens, host, disk, keys)
    tiers.start_load(req, result, now) -> completion time of the CPU -> GPU load (keys pinned until then)
    tiers.store(req, keys, now)  # write-through GPU -> CPU of newly computed full chunks (+ cascade)
    tiers.finish_request(req)    # the request's chunks get their recency; per-request state dropped
    tiers.next_event_time(now)   # earliest pending promotion completion (the engine wakes for it)
    tiers.gauges(now)            # (CPU share pinned by transfers, active promotions, active cascades)
    tiers.clear()                # empty every tier (a simulated restart)

Semantics (``docs/vllm-semantics.md`` §4, RFC #51439):

* A chunk is ``blocks_per_chunk`` GPU blocks; it is keyed by the chained hash of its last block, so a
  key names the whole prefix up to it. The CPU tier holds ``cpu_bytes // chunk_bytes`` chunks, LRU
  or ARC.
* Stores are write-through at compute time (the scheduler calls ``store`` for each newly complete
  chunk, prompt-only by default); a stored chunk becomes visible when the GPU -> CPU transfer ends,
  then cascades to every secondary tier (CPU -> fs write job; the CPU copy is pinned meanwhile).
* Lookups run at every admission of a request with nothing computed, chunk by chunk after the GPU
  hit, over every full chunk of the request (the whole prompt can hit: vLLM then recomputes the
  last token after the load), and stop at the first miss. A chunk ready in the CPU is a HIT. A chunk only in a secondary
  tier starts a promotion (fs -> CPU) and the lookup answers "retry" (``None``); once promoted it is a
  CPU HIT, and its tokens count as coming from ``disk``. Loads CPU -> GPU are asynchronous.
* Tiering counters (chunks) are counted once per (request, tier, key) when the lookup resolves:
  tier 0 query (+hit if in the CPU); on a CPU miss, each secondary tier in order gets a query (+hit).
  With secondary tiers, the first pass asks the CPU tier about every chunk of the request (a
  secondary tier's first answer is RETRY, and the connector's scan does not stop at a RETRY:
  ``OffloadingConnectorScheduler._maximal_prefix_lookup``), so tier 0 counts every chunk; the
  secondary tiers count up to the first chunk that no tier holds.
* LRU recency (vLLM 0.32's ``LRUCachePolicy``): set when a chunk is stored, and when a request
  finishes for every chunk it loaded or offered, in reverse prefix order; lookups do not touch it.
* ``eviction_policy: arc`` (vLLM 0.32's ``ARCCachePolicy``, :class:`_Arc`): stores enter T1; when a
  request finishes, chunks it reused (loaded, or offered while resident and ready) move to T2, ones it
  only stored refresh in place; ghosts of evicted chunks steer T1's target when stored again. An
  offer is stored all or nothing, never evicting its own chunks (``CPUOffloadingManager.prepare_store``).
* ``store_threshold >= 2`` (``CPUOffloadingManager._record_accesses``, :class:`_ReuseTracker`): every
  offer counts its chunks; a chunk not resident is stored once its count reaches the threshold, the
  others count in ``offload_stores_skipped``. Refused with secondary tiers (see ``OffloadSpec``).
* Transfers run on stations of ``n`` parallel FIFO servers: a job of ``b`` bytes takes
  ``latency + b / bandwidth`` of service time after the server frees up. Time counters add the
  service time (device time without queue wait, as vLLM's do); they and the byte counters move when
  a job is submitted (vLLM: when it finishes; they differ only for jobs in flight at a scrape).
  As in vLLM 0.32's ``TieringOffloadingMetrics``, tiering read/write bytes and times are per
  secondary tier only (read = promotions into the CPU, write = cascades from it); GPU <-> CPU
  traffic is the connector's ``kv_offload_{load,store}_*``. A chunk whose store or promotion is in
  flight answers HIT_PENDING: the request is deferred and counted when the lookup resolves.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blis_sim.emulator.config import OffloadSpec
from blis_sim.emulator.stats import EngineStats

PRIMARY_LABEL = "0:primary"


class Station:
    """``n`` parallel FIFO servers with a fixed latency and bandwidth."""

    __slots__ = ("_free_at", "bandwidth", "latency")

    def __init__(self, servers: int, bandwidth_Bps: float, latency_s: float) -> None:
        self._free_at = [0.0] * max(1, servers)
        self.bandwidth = bandwidth_Bps
        self.latency = latency_s

    def submit(self, now: float, nbytes: int) -> tuple[float, float]:
        """Queue a job; returns (completion time, service time)."""
        i = min(range(len(self._free_at)), key=self._free_at.__getitem__)
        start = max(now, self._free_at[i])
        service = self.latency + nbytes / self.bandwidth
        self._free_at[i] = start + service
        return start + service, service


class _CpuEntry:
    __slots__ = ("ready_at", "pinned_until", "promoted")

    def __init__(self, ready_at: float, pinned_until: float, promoted: bool) -> None:
        self.ready_at = ready_at
        self.pinned_until = pinned_until
        self.promoted = promoted  # arrived by promotion from a secondary tier (a RETRY while in flight)


class _SecondaryTier:
    def __init__(self, label: str, capacity_chunks: int | None, read: Station, write: Station) -> None:
        self.label = label
        self.capacity = capacity_chunks
        self.read = read
        self.write = write
        self.entries: OrderedDict[int, float] = OrderedDict()  # key -> ready time, LRU first

    def has(self, key: int, now: float) -> bool:
        ready_at = self.entries.get(key)
        return ready_at is not None and ready_at <= now

    def put(self, key: int, ready_at: float) -> None:
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        if self.capacity is not None:
            if self.capacity <= 0:
                return
            while len(self.entries) >= self.capacity:
                self.entries.popitem(last=False)
        self.entries[key] = ready_at


class _Arc:
    """ARC over the CPU tier's keys (vLLM 0.32's ``ARCCachePolicy``, cpu/policies/arc.py).

    ``t1`` holds chunks stored and not yet reused, ``t2`` chunks a request reused; ``b1``/``b2`` are
    the keys evicted from each (ghosts, at most ``capacity`` each); ``target`` is the size T1 is
    aimed at. Residency itself stays in :attr:`OffloadTiers.cpu`; this keeps only the order."""

    __slots__ = ("b1", "b2", "capacity", "t1", "t2", "target")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.target = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def insert(self, key: int) -> None:
        self.t1[key] = None
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def on_store_miss(self, keys: Sequence[int]) -> None:
        """A key about to be stored that ARC evicted earlier moves the T1 target (towards T1 for a
        B1 ghost, away from it for a B2 ghost), tail of the offer first."""
        for key in reversed(keys):
            if key in self.b1:
                self.target = min(self.target + max(1, len(self.b2) / len(self.b1)), self.capacity)
                self.b1.move_to_end(key)
            elif key in self.b2:
                self.target = max(self.target - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.move_to_end(key)

    def finish(self, ordered: Sequence[int], inserted: set[int], reused: set[int]) -> None:
        """A request's accesses, tail to head: a chunk it only stored keeps its list and becomes the
        most recent there; a chunk it reused moves to (the recent end of) T2."""
        for key in reversed(ordered):
            if key in inserted and key not in reused:
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
            elif key in reused:
                if key in self.t1:
                    del self.t1[key]
                    self.t2[key] = None
                elif key in self.t2:
                    self.t2.move_to_end(key)

    def evict(self, n: int, can_evict: Callable[[int], bool]) -> list[int] | None:
        """``n`` victims, or None (nothing changes) if fewer are evictable. From T1 while it is at
        least the target, else from T2; either list's oldest evictable first, the other one as the
        fallback. Victims become ghosts; each ghost list is then trimmed to ``capacity``."""
        t1 = (k for k in self.t1 if can_evict(k))
        t2 = (k for k in self.t2 if can_evict(k))
        t1_size = len(self.t1)
        picked: list[tuple[int, bool]] = []
        for _ in range(n):
            key = next(t1, None) if t1_size >= int(self.target) else None
            if key is None:
                key = next(t2, None)
                if key is not None:
                    picked.append((key, False))
                    continue
                key = next(t1, None)
                if key is None:
                    return None
            t1_size -= 1
            picked.append((key, True))
        for key, from_t1 in picked:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        for ghosts in (self.b1, self.b2):
            while len(ghosts) > self.capacity:
                ghosts.popitem(last=False)
        return [key for key, _ in picked]

    def clear(self) -> None:
        for keys in (self.t1, self.t2, self.b1, self.b2):
            keys.clear()
        self.target = 0.0


class _ReuseTracker:
    """``store_threshold``: how often each key was offered for a store (vLLM 0.32's
    ``CPUOffloadingManager._record_accesses``), the least recently offered dropped beyond ``size``."""

    __slots__ = ("counts", "size", "threshold")

    def __init__(self, threshold: int, size: int = 64_000) -> None:
        self.threshold = threshold
        self.size = size
        self.counts: OrderedDict[int, int] = OrderedDict()

    def offer(self, keys: Sequence[int]) -> None:
        counts = self.counts
        offered = set()
        for key in keys:
            if key in counts:
                counts[key] += 1
                counts.move_to_end(key)
                offered.add(key)
        droppable = len(counts) - len(offered)  # entries not part of this offer
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= self.size:
                if droppable == 0:
                    continue  # the tracker is full of this offer's keys: this one goes untracked
                counts.popitem(last=False)
                droppable -= 1
            counts[key] = 1

    def reached(self, key: int) -> bool:
        return self.counts.get(key, 0) >= self.threshold


class _ArcAccess:
    """One request's ARC-relevant accesses: the chunks it stored, the ready chunks it reused (loaded,
    or offered while resident), and the store misses ARC has already learnt from."""

    __slots__ = ("inserted", "misses", "reused")

    def __init__(self) -> None:
        self.inserted: set[int] = set()
        self.reused: set[int] = set()
        self.misses: set[int] = set()


@dataclass(frozen=True)
class LookupResult:
    """An admission-time hit in the offload tiers (after the GPU hit)."""

    tokens: int  # tokens to load (external hit)
    host_tokens: int  # of which found in the CPU tier
    disk_tokens: int  # of which promoted from a secondary tier for this request
    keys: tuple[int, ...]  # CPU chunks to load


class OffloadTiers:
    """The CPU tier, its secondary tiers and their transfer stations (see module docstring)."""

    def __init__(self, spec: OffloadSpec, *, block_size: int, kv_bytes_per_token: int,
                 host_bandwidth_Bps: float, host_latency_s: float, stats: EngineStats) -> None:
        self.spec = spec
        self.stats = stats
        self.block_size = block_size
        self.blocks_per_chunk = spec.blocks_per_chunk
        self.chunk_tokens = block_size * spec.blocks_per_chunk
        self.chunk_bytes = self.chunk_tokens * kv_bytes_per_token
        self.cpu_capacity = spec.cpu_bytes // self.chunk_bytes
        self.prompt_only = spec.offload_prompt_only
        self.host = Station(1, host_bandwidth_Bps, host_latency_s)
        self.cpu: OrderedDict[int, _CpuEntry] = OrderedDict()
        self.secondary = [
            _SecondaryTier(
                f"{i + 1}:{tier.type}",
                None if tier.max_bytes is None else tier.max_bytes // self.chunk_bytes,
                Station(tier.n_read_threads, tier.read_bandwidth_Bps, tier.latency_s),
                Station(tier.n_write_threads, tier.write_bandwidth_Bps, tier.latency_s),
            )
            for i, tier in enumerate(spec.secondary_tiers)
        ]
        self._counted: dict[object, set[tuple[int, int]]] = {}  # req -> {(tier index, key)}
        self._promoted_for: dict[object, set[int]] = {}  # req -> keys promoted on its behalf
        self._pending_promotions: dict[int, float] = {}  # key -> completion time
        self._promotion_tier: dict[int, str] = {}  # key -> label of the tier it is promoted from
        self._accessed: dict[object, dict[int, int]] = {}  # req -> {chunk key: prefix position}
        self._arc = _Arc(self.cpu_capacity) if spec.eviction_policy == "arc" else None
        self._arc_access: dict[object, _ArcAccess] = {}
        self._reuse = _ReuseTracker(spec.store_threshold) if spec.store_threshold >= 2 else None

    # -- CPU tier space ----------------------------------------------------------------------------
    def _cpu_make_room(self, n: int, now: float, protect: frozenset[int] | set[int] = frozenset()) -> bool:
        """Room in the CPU tier for ``n`` new chunks, all or nothing: the free slots, then as many idle
        chunks (ready, not pinned, not protected) evicted as the policy picks (LRU: the least recent
        first); if there are too few, nothing is evicted."""
        if self.cpu_capacity <= 0:
            return False
        need = n - (self.cpu_capacity - len(self.cpu))
        if need <= 0:
            return True
        if self._arc is not None:
            return self._arc_make_room(need, now, protect)
        victims = []
        for key, entry in self.cpu.items():  # LRU first
            if entry.ready_at <= now and entry.pinned_until <= now and key not in protect:
                victims.append(key)
                if len(victims) == need:
                    break
        if len(victims) < need:
            return False
        for key in victims:
            del self.cpu[key]
        return True

    def _arc_make_room(self, n: int, now: float, protect: frozenset[int] | set[int]) -> bool:
        """Evict ``n`` chunks ARC's way, or none if fewer are evictable (ready, not pinned, not
        protected)."""
        assert self._arc is not None
        cpu = self.cpu

        def can_evict(key: int) -> bool:
            entry = cpu[key]
            return entry.ready_at <= now and entry.pinned_until <= now and key not in protect

        victims = self._arc.evict(n, can_evict)
        if victims is None:
            return False
        for key in victims:
            del cpu[key]
        return True

    # -- stores ------------------------------------------------------------------------------------
    def store(self, req: object, keys: Sequence[int], now: float) -> bool:
        """Write-through GPU -> CPU of newly computed chunks, then cascade to secondary tiers.

        Resident chunks are not stored again; like every chunk the request offers, they count as
        accessed and get their recency when the request finishes. With ``store_threshold``, every
        offered chunk's count moves and a chunk not yet resident is stored only once its count
        reaches the threshold (the others count as skipped and as not accessed).

        Returns False when the tier could not make room for the offer (an allocation failure): the
        request offers the same chunks again with its next step's, as vLLM's connector scheduler
        does (``OffloadingConnectorScheduler``: a failed ``prepare_store`` leaves the request's
        stored index where it was)."""
        skipped: set[int] = set()
        if self._reuse is not None:
            self._reuse.offer(keys)
            skipped = {k for k in keys if k not in self.cpu and not self._reuse.reached(k)}
            self.stats.offload_stores_skipped += len(skipped)
        if self._arc is not None:
            return self._arc_store(req, keys, skipped, now)
        self._record_access(req, [k for k in keys if k not in skipped] if skipped else keys)
        to_store = [k for k in keys if k not in self.cpu and k not in skipped]
        if not to_store:
            return True
        # All or nothing, as vLLM's CPUOffloadingManager.prepare_store: room for every new chunk of
        # the offer at once, never evicting a chunk of the offer; if the tier cannot make that room
        # (too few idle chunks), nothing of the offer is stored and one allocation failure counts.
        if not self._cpu_make_room(len(to_store), now, set(keys)):
            self.stats.offload_allocation_failures += 1
            return False
        for key in to_store:
            self._write(key, now)
        return True

    def _arc_store(self, req: object, keys: Sequence[int], skipped: set[int], now: float) -> bool:
        """One ARC offer, all or nothing (``CPUOffloadingManager.prepare_store``): ARC learns from
        the ghosts of the chunks to store, then makes room for all of them at once, never evicting
        a chunk of the offer; if it cannot, nothing is stored (one allocation failure)."""
        assert self._arc is not None
        cpu = self.cpu
        to_store = [k for k in keys if k not in cpu and k not in skipped]
        ready = [k for k in keys if k in cpu and cpu[k].ready_at <= now]
        access = self._arc_access.setdefault(req, _ArcAccess())
        misses = [k for k in to_store if k not in access.misses]
        self._arc.on_store_miss(misses)
        access.misses.update(misses)
        recorded = set(to_store).union(ready)
        self._record_access(req, [k for k in keys if k in recorded])
        access.reused.update(k for k in ready if k not in access.inserted)
        if not to_store:
            return True
        if not self._cpu_make_room(len(to_store), now, set(keys)):
            self.stats.offload_allocation_failures += 1
            return False
        for key in to_store:
            self._write(key, now)
            self._arc.insert(key)
        access.inserted.update(to_store)
        return True

    def _write(self, key: int, now: float) -> None:
        """GPU -> CPU store of one chunk (room already made), cascading to every secondary tier."""
        done, service = self.host.submit(now, self.chunk_bytes)
        self.stats.offload_store_bytes += self.chunk_bytes
        self.stats.offload_store_time += service
        self.stats.offload_store_size.observe(self.chunk_bytes)
        pinned = done
        for tier in self.secondary:
            if key in tier.entries:
                continue
            cascade_done, cascade_service = tier.write.submit(done, self.chunk_bytes)
            counters = self.stats.tier(tier.label)
            counters.write_bytes += self.chunk_bytes
            counters.write_time += cascade_service
            tier.put(key, cascade_done)
            pinned = max(pinned, cascade_done)
        self.cpu[key] = _CpuEntry(done, pinned, promoted=False)

    # -- lookups -----------------------------------------------------------------------------------
    def _count(self, req: object, tier_index: int, key: int, hit: bool) -> None:
        seen = self._counted.setdefault(req, set())
        if (tier_index, key) in seen:
            return
        seen.add((tier_index, key))
        label = PRIMARY_LABEL if tier_index == 0 else self.secondary[tier_index - 1].label
        counters = self.stats.tier(label)
        counters.chunk_queries += 1
        if hit:
            counters.chunk_hits += 1

    def lookup(self, req: object, hashes: Sequence[int], start_tokens: int, max_tokens: int,
               now: float) -> LookupResult | None:
        """Offload hit after a GPU hit of ``start_tokens``; at most ``max_tokens`` in total."""
        cs = self.chunk_tokens
        first = start_tokens // cs
        last = min(max_tokens, (len(hashes) // self.blocks_per_chunk) * cs) // cs  # exclusive
        if last * cs - start_tokens < cs:
            return LookupResult(0, 0, 0, ())  # less than one chunk could be loaded: no lookup
        keys: list[int] = []
        retry = False
        promoted = self._promoted_for.setdefault(req, set())
        if self.secondary:
            # vLLM's secondary tiers answer their first lookup of a key with RETRY (the fs tier's
            # existence check runs on a background thread), and the connector's prefix scan goes on
            # past a RETRY: the first pass meets no MISS and asks the CPU tier about every chunk.
            for c in range(first, last):
                key = hashes[(c + 1) * self.blocks_per_chunk - 1]
                entry = self.cpu.get(key)
                if entry is None:
                    self._count(req, 0, key, False)
                elif entry.ready_at <= now:
                    self._count(req, 0, key, True)
        for c in range(first, last):
            key = hashes[(c + 1) * self.blocks_per_chunk - 1]
            entry = self.cpu.get(key)
            if entry is not None and entry.ready_at <= now:
                self._count(req, 0, key, True)
                keys.append(key)
                continue
            if entry is not None:
                # HIT_PENDING (a store or a promotion in flight): counts as a hit for the
                # prefix but defers the request; tier counters wait for the resolved answer.
                retry = True
                keys.append(key)
                continue
            self._count(req, 0, key, False)
            found = False
            for i, tier in enumerate(self.secondary, start=1):
                if tier.has(key, now):
                    self._count(req, i, key, True)
                    # The room may come from this request's own chunks found above: vLLM pins none
                    # of them before the load (TieringOffloadingManager._initiate_promotion ->
                    # prepare_write evicts any idle chunk), so a later pass promotes those from the
                    # fs tier too. What was promoted for this request is kept, so a CPU tier smaller
                    # than the prefix ends in an allocation failure, not a cycle (vLLM's promotions,
                    # idle once complete, could evict each other there).
                    if self._promote(key, tier, now, promoted):
                        promoted.add(key)
                        found = True
                    break
                self._count(req, i, key, False)
            if not found:
                break
            retry = True
            keys.append(key)
        if retry:
            return None
        if not keys:
            return LookupResult(0, 0, 0, ())
        tokens = (first + len(keys)) * cs - start_tokens
        disk = sum(1 for k in keys if k in promoted)
        disk_tokens = min(tokens, disk * cs)
        return LookupResult(tokens, tokens - disk_tokens, disk_tokens, tuple(keys))

    def _promote(self, key: int, tier: _SecondaryTier, now: float, protect: set[int]) -> bool:
        if not self._cpu_make_room(1, now, protect):
            self.stats.promotion_allocation_failures += 1
            return False
        done, service = tier.read.submit(now, self.chunk_bytes)
        counters = self.stats.tier(tier.label)
        counters.read_bytes += self.chunk_bytes
        counters.read_time += service
        self.cpu[key] = _CpuEntry(done, done, promoted=True)
        if self._arc is not None:  # the tiering manager stores a promotion like any chunk
            self._arc.on_store_miss((key,))
            self._arc.insert(key)
        self._pending_promotions[key] = done
        self._promotion_tier[key] = tier.label
        return True

    # -- loads -------------------------------------------------------------------------------------
    def start_load(self, req: object, result: LookupResult, now: float) -> float:
        """CPU -> GPU load of a lookup's chunks; returns its completion time."""
        nbytes = len(result.keys) * self.chunk_bytes
        done, service = self.host.submit(now, nbytes)
        self.stats.offload_load_bytes += nbytes
        self.stats.offload_load_time += service
        self.stats.offload_load_size.observe(nbytes)
        for key in result.keys:
            entry = self.cpu.get(key)
            if entry is not None:
                entry.pinned_until = max(entry.pinned_until, done)
        self._record_access(req, result.keys)
        if self._arc is not None:
            access = self._arc_access.setdefault(req, _ArcAccess())
            promoted = self._promoted_for.get(req, set())
            access.reused.update(k for k in result.keys if k not in access.inserted and k not in promoted)
        return done

    def gauges(self, now: float) -> tuple[float, dict[str, int], dict[str, int]]:
        """(CPU share pinned by in-flight transfers, active promotions per tier, active cascades per tier)."""
        pinned = sum(1 for e in self.cpu.values() if e.pinned_until > now)
        pin_share = pinned / self.cpu_capacity if self.cpu_capacity else 0.0
        promotions: dict[str, int] = {}
        cascades: dict[str, int] = {}
        for tier in self.secondary:
            cascades[tier.label] = sum(1 for t in tier.entries.values() if t > now)
            promotions[tier.label] = 0
        for key, done in self._pending_promotions.items():
            if done > now:
                label = self._promotion_tier.get(key)
                if label is not None:
                    promotions[label] = promotions.get(label, 0) + 1
        return pin_share, promotions, cascades

    def _record_access(self, req: object, keys: Sequence[int]) -> None:
        accessed = self._accessed.setdefault(req, {})
        for key in keys:
            accessed.setdefault(key, len(accessed))  # position order = prefix order

    def finish_request(self, req: object) -> None:
        """The request is done: its loaded and offered chunks become the most recent, in reverse
        prefix order (the first chunk last, so a prefix's tail is evicted before its head)."""
        accessed = self._accessed.pop(req, {})
        if self._arc is not None:
            access = self._arc_access.pop(req, None) or _ArcAccess()
            self._arc.finish(sorted(accessed, key=accessed.__getitem__),
                             access.inserted | self._promoted_for.get(req, set()), access.reused)
        for key in sorted(accessed, key=accessed.__getitem__, reverse=True):
            if key in self.cpu and self._arc is None:
                self.cpu.move_to_end(key)
            for tier in self.secondary:
                if key in tier.entries:
                    tier.entries.move_to_end(key)
        self._counted.pop(req, None)
        self._promoted_for.pop(req, None)

    def next_event_time(self, now: float) -> float | None:
        pending = self._pending_promotions
        for key in [k for k, t in pending.items() if t <= now]:
            del pending[key]
            self._promotion_tier.pop(key, None)
        return min(pending.values()) if pending else None

    def clear(self) -> None:
        self.cpu.clear()
        for tier in self.secondary:
            tier.entries.clear()
        self._counted.clear()
        self._promoted_for.clear()
        self._accessed.clear()
        self._arc_access.clear()
        if self._arc is not None:
            self._arc.clear()  # vLLM's reset_cache clears the policy, not store_threshold's counts
        self._pending_promotions.clear()
        self._promotion_tier.clear()
