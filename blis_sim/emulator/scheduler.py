"""vLLM V1's scheduler, step by step, over the emulator's block pool and offload tiers.

API::

    sched = Scheduler(geometry, pool, tiers_or_None, stats, tokenizer_output_fn, eos_probability, rng)
    sched.add(request)                    # a new Request joins the waiting queue
    plan = sched.schedule(now)            # StepPlan: (request, tokens) pairs + work totals
    sched.finish_step(plan, now)          # tokens computed, tokens sampled, requests finished
    sched.abort(request, now)             # client went away
    sched.has_work(now) / sched.next_wakeup(now)

Rules (``docs/vllm-semantics.md`` §2-§4):

* Running requests first, in order: each gets the tokens it still needs (1 for decode, the rest of
  its prompt for a chunked prefill) within ``max_num_batched_tokens``. When blocks run out, the last
  running request is preempted (blocks freed, computation reset, back to the front of the waiting
  queue) until the allocation fits.
* Then, if nothing was preempted in this step, waiting requests in FCFS order while there is token
  budget and fewer than ``max_num_seqs`` running. A request with nothing computed is looked up: GPU
  prefix hit (whole blocks, at most ``num_tokens - 1``), then the offload tiers after it (which may
  match the whole prompt). A tier answer of "retry" skips the request for this step; an offload hit
  allocates the blocks and loads asynchronously (the request waits, using no token budget, then
  computes the rest; after a full prompt hit, the last token). An allocation
  failure stops admission for this step.
* Prefix-cache stats are recorded once, at admission, after allocation succeeds; requests that were
  preempted before, and ``prompt_logprobs`` requests (which skip the cache), are not counted.
  External stats: queries = num_tokens - local hit (when non-zero), hits = the offload hit.
* After the step, newly full blocks are registered in the prefix cache, new full prompt chunks are
  stored to the CPU tier (write-through), and a request whose known tokens are all computed samples
  one token. It finishes on ``max_tokens`` (``length``), on EOS (``stop``, only without
  ``ignore_eos`` and after ``min_tokens``), or at ``max_model_len``.
"""
from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from blis_sim.emulator.config import Geometry
from blis_sim.emulator.gpu_cache import Block, BlockPool, block_hashes
from blis_sim.emulator.offload import LookupResult, OffloadTiers
from blis_sim.emulator.stats import EngineStats

# Request phases.
WAITING, LOADING, RUNNING, FINISHED = 0, 1, 2, 3


class Request:
    """One generation request inside the engine. ``sink`` is told about new tokens and the end."""

    __slots__ = ("rid", "tokens", "prompt_len", "max_tokens", "min_tokens", "ignore_eos",
                 "skip_cache", "seed", "sink", "num_computed", "blocks", "hashes",
                 "num_cached_blocks", "num_stored_chunks", "num_preemptions", "state",
                 "load_until", "load_tokens", "counted", "cached_tokens", "cached_by_source",
                 "arrival", "first_scheduled", "first_token", "last_token", "finish_time",
                 "finish_reason", "num_output")

    def __init__(self, rid: str, prompt_ids: list[int], *, max_tokens: int, min_tokens: int = 0,
                 ignore_eos: bool = False, skip_cache: bool = False, seed: int = 0,
                 arrival: float = 0.0, sink: Callable[[Request], None] | None = None) -> None:
        self.rid = rid
        self.tokens = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.ignore_eos = ignore_eos
        self.skip_cache = skip_cache
        self.seed = seed
        self.sink = sink
        self.num_computed = 0
        self.blocks: list[Block] = []
        self.hashes: list[int] = []
        self.num_cached_blocks = 0
        self.num_stored_chunks = 0
        self.num_preemptions = 0
        self.state = WAITING
        self.load_until = 0.0
        self.load_tokens = 0
        self.counted = False
        self.cached_tokens = 0
        self.cached_by_source: dict[str, int] = {"device": 0, "host": 0, "disk": 0}
        self.arrival = arrival
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.finish_time: float | None = None
        self.finish_reason: str | None = None
        self.num_output = 0

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.prompt_len:]


@dataclass
class StepPlan:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    prefill_tokens: int = 0
    decode_seqs: int = 0
    context_tokens: int = 0
    attention_pairs: float = 0.0  # sum over chunks of n * (computed + (n + 1) / 2): attention work

    @property
    def empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, geometry: Geometry, pool: BlockPool, tiers: OffloadTiers | None,
                 stats: EngineStats, output_token: Callable[[int], int], *,
                 eos_token_id: int, eos_probability: float, rng: random.Random,
                 chunked_prefill: bool = True) -> None:
        self.geo = geometry
        self.bs = geometry.block_size
        self.pool = pool
        self.tiers = tiers
        self.stats = stats
        self.output_token = output_token
        self.eos_token_id = eos_token_id
        self.eos_probability = eos_probability
        self.rng = rng
        self.chunked_prefill = chunked_prefill
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    # -- queue management --------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self._extend_hashes(req)
        self.waiting.append(req)

    def has_work(self, now: float) -> bool:
        if self.running:
            return True
        return any(r.state == WAITING or r.load_until <= now for r in self.waiting)

    def next_wakeup(self, now: float) -> float | None:
        """Earliest future time something becomes schedulable (a load or a promotion ending)."""
        times = [r.load_until for r in self.waiting if r.state == LOADING]
        if self.tiers is not None:
            promo = self.tiers.next_event_time(now)
            if promo is not None:
                times.append(promo)
        future = [t for t in times if t > now]
        return min(future) if future else None

    def abort(self, req: Request, now: float) -> None:
        if req.state == FINISHED:
            return
        if req in self.running:
            self.running.remove(req)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        self._finish(req, "abort", now)

    # -- hashing -----------------------------------------------------------------------------------
    def _extend_hashes(self, req: Request) -> None:
        n_full = req.num_tokens // self.bs
        have = len(req.hashes)
        if n_full > have:
            parent = req.hashes[-1] if have else None
            req.hashes.extend(block_hashes(req.tokens, self.bs, parent, start_block=have))

    def _blocks_needed(self, req: Request, total_tokens: int) -> int:
        return -(-total_tokens // self.bs) - len(req.blocks)

    # -- one step ----------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        plan = StepPlan()
        budget = self.geo.max_num_batched_tokens
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed, budget)
            if n <= 0:
                i += 1
                continue
            need = self._blocks_needed(req, req.num_computed + n)
            new_blocks: list[Block] | None = []
            if need > 0:
                new_blocks = self.pool.allocate(need)
                while new_blocks is None:
                    victim = self.running.pop()
                    self._preempt(victim)
                    preempted = True
                    if victim is req:
                        break
                    new_blocks = self.pool.allocate(need)
            if new_blocks is None:
                break
            req.blocks.extend(new_blocks)
            self._plan_add(plan, req, n, now)
            budget -= n
            i += 1
        if not preempted:
            self._admit_waiting(plan, budget, now)
        return plan

    def _plan_add(self, plan: StepPlan, req: Request, n: int, now: float) -> None:
        plan.scheduled.append((req, n))
        plan.context_tokens += req.num_computed
        plan.attention_pairs += n * (req.num_computed + (n + 1) / 2)
        if req.num_computed + n >= req.num_tokens and req.num_computed >= req.num_tokens - 1 \
                and req.num_output > 0:
            plan.decode_seqs += 1
        else:
            plan.prefill_tokens += n
        if req.first_scheduled is None:
            req.first_scheduled = now

    def _admit_waiting(self, plan: StepPlan, budget: int, now: float) -> None:
        skipped: list[Request] = []
        waiting = self.waiting
        while waiting and budget > 0 and len(self.running) < self.geo.max_num_seqs:
            req = waiting[0]
            if req.state == LOADING:
                if req.load_until > now:
                    skipped.append(waiting.popleft())
                    continue
                self._finish_load(req)
            local: list[Block] = []
            ext: LookupResult | None = None
            if req.num_computed == 0 and not req.blocks:
                max_hit = req.num_tokens - 1
                if not req.skip_cache:
                    local = self.pool.find_longest_hit(req.hashes, max_hit)
                local_tokens = len(local) * self.bs
                if self.tiers is not None and not req.skip_cache:
                    # The connector may match the whole prompt (not capped at num_tokens - 1).
                    ext = self.tiers.lookup(req, req.hashes, local_tokens, req.num_tokens, now)
                    if ext is None:  # a promotion is in flight: ask again next step
                        skipped.append(waiting.popleft())
                        continue
                ext_tokens = ext.tokens if ext is not None else 0
                computed = local_tokens + ext_tokens
                if ext_tokens:
                    n = 0  # asynchronous load: compute nothing until it lands
                else:
                    n = req.num_tokens - computed
                    if n > budget and not self.chunked_prefill:
                        break
                    n = min(n, budget)
                need = -(-(computed + n) // self.bs) - len(local)
                evictable = sum(1 for b in local if b.ref_cnt == 0)
                if need + evictable > self.pool.num_free:
                    break
                self.pool.touch(local)
                new_blocks = self.pool.allocate(need) or []
                req.blocks = list(local) + new_blocks
                req.num_cached_blocks = len(local)
                req.num_computed = local_tokens
                self._record_admission(req, local_tokens, ext)
                waiting.popleft()
                if ext_tokens:
                    # Nothing below the hit boundary is offered to the tiers again: after a load the
                    # connector moves the request's next store to the chunk the cached tokens end in
                    # (OffloadingConnectorScheduler, chunk-level policy: next_stored_chunk_idx =
                    # cdiv(num_cached_tokens, tokens_per_chunk)); docs/vllm-semantics.md §4.1.
                    ct = self.tiers.chunk_tokens  # type: ignore[union-attr]
                    req.num_stored_chunks = max(req.num_stored_chunks, -(-computed // ct))
                    req.state = LOADING
                    req.load_tokens = ext_tokens
                    assert self.tiers is not None and ext is not None  # ext_tokens > 0 comes from a lookup
                    req.load_until = self.tiers.start_load(req, ext, now)
                    skipped.append(req)
                    continue
            else:
                n = min(req.num_tokens - req.num_computed, budget)
                need = self._blocks_needed(req, req.num_computed + n)
                more = self.pool.allocate(need) if need > 0 else []
                if more is None:
                    break
                req.blocks.extend(more)
                waiting.popleft()
            req.state = RUNNING
            self.running.append(req)
            self._plan_add(plan, req, n, now)
            budget -= n
        # Skipped requests keep their place at the head of the queue, in order.
        for req in reversed(skipped):
            waiting.appendleft(req)

    def _finish_load(self, req: Request) -> None:
        req.num_computed += req.load_tokens
        req.load_tokens = 0
        req.state = WAITING
        self._cache_full_blocks(req)
        if req.num_computed >= req.num_tokens:
            # A full prompt hit: recompute the last token so the next one can be sampled.
            req.num_computed = req.num_tokens - 1

    def _record_admission(self, req: Request, local_tokens: int, ext: LookupResult | None) -> None:
        ext_tokens = ext.tokens if ext is not None else 0
        if req.num_preemptions == 0:
            req.cached_tokens = local_tokens + ext_tokens
            req.cached_by_source = {"device": local_tokens,
                                    "host": ext.host_tokens if ext else 0,
                                    "disk": ext.disk_tokens if ext else 0}
        if req.counted or req.num_preemptions > 0:
            return
        req.counted = True
        s = self.stats
        if not req.skip_cache:  # prompt_logprobs requests skip the local prefix-cache stats ...
            s.prefix_queries += req.num_tokens
            s.prefix_hits += local_tokens
        if self.tiers is not None:  # ... but not the connector's (vLLM 0.32 records them, 0 hits)
            ext_queries = req.num_tokens - local_tokens
            if ext_queries:
                s.external_queries += ext_queries
                s.external_hits += ext_tokens
        s.cached_by_source["device"] += local_tokens
        if ext is not None:
            s.cached_by_source["host"] += ext.host_tokens
            s.cached_by_source["disk"] += ext.disk_tokens

    def _preempt(self, req: Request) -> None:
        self.pool.free(req.blocks)
        req.blocks = []
        req.num_computed = 0
        req.num_cached_blocks = 0
        req.num_preemptions += 1
        req.state = WAITING
        self.stats.num_preemptions += 1
        self.waiting.appendleft(req)

    def _cache_full_blocks(self, req: Request) -> None:
        full = min(req.num_computed // self.bs, len(req.hashes), len(req.blocks))
        for i in range(req.num_cached_blocks, full):
            self.pool.cache_block(req.blocks[i], req.hashes[i])
        if full > req.num_cached_blocks:
            req.num_cached_blocks = full

    def _store_chunks(self, req: Request, now: float) -> None:
        tiers = self.tiers
        assert tiers is not None
        limit = min(req.num_computed, req.prompt_len) if tiers.prompt_only else req.num_computed
        n_chunks = limit // tiers.chunk_tokens
        if n_chunks > req.num_stored_chunks:
            bpc = tiers.blocks_per_chunk
            keys = [req.hashes[(c + 1) * bpc - 1] for c in range(req.num_stored_chunks, n_chunks)]
            if tiers.store(req, keys, now):
                req.num_stored_chunks = n_chunks

    # -- after the step ----------------------------------------------------------------------------
    def finish_step(self, plan: StepPlan, now: float) -> int:
        """Apply a step's results at ``now``; returns how many requests finished."""
        s = self.stats
        total = 0
        finished: list[Request] = []
        for req, n in plan.scheduled:
            if req.state != RUNNING:
                continue  # aborted while the step ran
            total += n
            req.num_computed += n
            self._cache_full_blocks(req)
            if self.tiers is not None:
                self._store_chunks(req, now)
            if req.num_computed < req.num_tokens:
                continue  # a chunk of a longer prefill
            token = self.output_token(hash((req.seed, req.num_output)) & 0x7FFFFFFF)
            eos = (self.eos_probability > 0 and not req.ignore_eos
                   and req.num_output + 1 >= req.min_tokens
                   and self.rng.random() < self.eos_probability)
            if eos:
                token = self.eos_token_id
            req.tokens.append(token)
            req.num_output += 1
            self._extend_hashes(req)
            s.generation_tokens += 1
            if req.first_token is None:
                req.first_token = now
                self._record_first_token(req, now)
            else:
                s.itl.observe(now - (req.last_token or now))
            req.last_token = now
            reason = None
            if eos:
                reason = "stop"
            elif req.num_output >= req.max_tokens or req.num_tokens >= self.geo.max_model_len:
                reason = "length"
            if reason is not None:
                req.finish_reason = reason
                finished.append(req)
            elif req.sink is not None:
                req.sink(req)
        if total:
            s.iteration_tokens.observe(total)
        for req in finished:
            self.running.remove(req)
            self._finish(req, req.finish_reason or "length", now)
        return len(finished)

    def _record_first_token(self, req: Request, now: float) -> None:
        s = self.stats
        s.ttft.observe(now - req.arrival)
        s.prompt_tokens += req.prompt_len
        cached = min(req.cached_tokens, req.prompt_len)
        ext = req.cached_by_source["host"] + req.cached_by_source["disk"]
        local = cached - ext
        s.prompt_tokens_cached += cached
        s.prompt_by_source["local_cache_hit"] += local
        s.prompt_by_source["external_kv_transfer"] += ext
        s.prompt_by_source["local_compute"] += req.prompt_len - cached

    def _finish(self, req: Request, reason: str, now: float) -> None:
        req.state = FINISHED
        req.finish_reason = reason
        req.finish_time = now
        if req.blocks:
            self.pool.free(req.blocks)
            req.blocks = []
        if self.tiers is not None:
            self.tiers.finish_request(req)
        s = self.stats
        s.request_success[reason] = s.request_success.get(reason, 0) + 1
        if req.first_token is not None:
            s.e2e.observe(now - req.arrival)
            start = req.first_scheduled if req.first_scheduled is not None else req.arrival
            s.queue_time.observe(start - req.arrival)
            s.inference_time.observe(now - start)
            s.prefill_time.observe(req.first_token - start)
            s.decode_time.observe(now - req.first_token)
            if req.num_output > 1:
                s.tpot.observe((now - req.first_token) / (req.num_output - 1))
            s.request_prompt_tokens.observe(req.prompt_len)
            s.request_generation_tokens.observe(req.num_output)
            s.request_max_tokens.observe(req.max_tokens)
            s.request_max_generation_tokens.observe(req.max_tokens)
            s.request_params_n.observe(1)
            s.request_num_preemptions.observe(req.num_preemptions)
            s.request_prefill_kv_computed.observe(req.prompt_len - min(req.cached_tokens, req.prompt_len))
        if req.sink is not None:
            req.sink(req)

    # -- restart -----------------------------------------------------------------------------------
    def clear_cache(self) -> bool:
        """Drop the prefix cache and offload tiers (a simulated restart); only when idle."""
        if not self.pool.reset():
            return False
        if self.tiers is not None:
            self.tiers.clear()
        return True
