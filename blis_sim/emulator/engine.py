"""The engine in real time: the scheduler's steps paced by the step-time model on an asyncio loop.

API (all on the loop the engine was started on)::

    engine = Engine(config)                  # builds pool, offload tiers, scheduler, stats
    await engine.start(); await engine.stop()
    engine.submit(request)                   # Request from blis_sim.emulator.scheduler
    engine.abort(request)
    engine.published()                       # Published: what /metrics shows right now
    engine.restart()                         # counters reset (new _created), caches dropped
    engine.reset_prefix_cache() -> bool      # vLLM's POST /reset_prefix_cache (only when idle)

Each step: schedule, sleep for the modelled duration (``profile.step_seconds`` x seeded noise),
then apply the step's results at the real end time, so server-side TTFT is measured, not assumed.
Consecutive steps are paced from the previous step's target end time (up to 20 ms of timer lateness
is absorbed), so a long decode keeps the modelled inter-token latency on average. Times come from
``emulator.loop.now()`` and waits from ``sleep_until`` (timers aimed early, then yields to the exact
target), so neither epoll's nor libuv's 1 ms timer rounding biases them, whichever loop runs.
Zero-duration steps still yield to the loop once, so HTTP handlers keep running. Stats are
published every ``stats_interval_s`` (0 = after every step), like vLLM's stats logging.
"""
from __future__ import annotations

import asyncio
import logging
import random

from blis_sim.emulator.config import EmulatorConfig
from blis_sim.emulator.gpu_cache import BlockPool
from blis_sim.emulator.hf_tokenizer import load_hf_tokenizer
from blis_sim.emulator.loop import now as _now, sleep_until
from blis_sim.emulator.metrics import Published
from blis_sim.emulator.offload import OffloadTiers
from blis_sim.emulator.scheduler import FINISHED, LOADING, Request, Scheduler, StepPlan
from blis_sim.emulator.stats import EngineStats
from blis_sim.emulator.tokenizer import ServedTokenizer, Tokenizer

log = logging.getLogger("blis_sim.emulator")


class EngineFailed(RuntimeError):
    """The engine loop died (a bug); requests are answered with a 500 instead of hanging."""


_CATCH_UP_S = 0.02  # lateness (timer rounding, a busy machine) that the next steps absorb


class Engine:
    """One emulated vLLM engine core: scheduler, caches, stats, and the real-time step loop."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.geometry = config.geometry()
        self.profile = config.step_profile
        self.offload_spec = config.offload_spec()
        self.tokenizer: ServedTokenizer = (Tokenizer(add_bos=config.add_bos) if config.tokenizer is None
                                           else load_hf_tokenizer(config.tokenizer))
        # a model tokenizer's table of generated words is built now (a scan of its vocabulary), not in the first
        # request's TTFT
        self.tokenizer.output_token(0)
        self.stats = EngineStats()
        self.pool = BlockPool(self.geometry.num_gpu_blocks, self.geometry.block_size,
                              enable_caching=config.enable_prefix_caching)
        self.tiers = None
        if self.offload_spec is not None:
            self.tiers = OffloadTiers(self.offload_spec, block_size=self.geometry.block_size,
                                      kv_bytes_per_token=self.geometry.kv_bytes_per_token,
                                      host_bandwidth_Bps=self.profile.host_bandwidth_Bps,
                                      host_latency_s=self.profile.host_latency_s, stats=self.stats)
        self.scheduler = Scheduler(self.geometry, self.pool, self.tiers, self.stats,
                                   self.tokenizer.output_token, eos_token_id=self.tokenizer.eos_token_id,
                                   eos_probability=config.eos_probability,
                                   rng=random.Random(config.seed),
                                   chunked_prefill=config.enable_chunked_prefill)
        self.noise_cv = self.profile.noise_cv if config.step_noise is None else config.step_noise
        self._noise = random.Random(config.seed + 1)
        self.http_counts: dict[tuple[str, str, str], int] = {}
        self._published = Published(self.stats.snapshot())
        self._dirty = False
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._finished_total = 0
        self._restarted = False
        self._pending_cache_clear = False
        self._target = 0.0  # target end time of the last timed step (loop clock)
        self.crashed: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._tasks = [asyncio.create_task(self._run(), name="emulator-engine")]
        if self.config.stats_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._publisher(), name="emulator-stats"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks = []

    # -- requests ----------------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        if self.crashed is not None:
            raise EngineFailed(f"the emulator engine failed: {self.crashed!r}")
        self.scheduler.add(req)
        assert self._wake is not None
        self._wake.set()

    def abort(self, req: Request) -> None:
        if req.state != FINISHED:
            self.scheduler.abort(req, _now())
            self._dirty = True
            self._after_finishes(1)

    # -- stats -------------------------------------------------------------------------------------
    def published(self) -> Published:
        if self.config.stats_interval_s == 0:
            self._publish()
        self._published.http = dict(self.http_counts)
        return self._published

    def _publish(self) -> None:
        sched = self.scheduler
        deferred = sum(1 for r in sched.waiting if r.state == LOADING)
        pub = Published(self.stats.snapshot(), running=len(sched.running), waiting=len(sched.waiting),
                        waiting_deferred=deferred, kv_usage=self.pool.usage())
        if self.tiers is not None:
            now = _now()
            pub.offload_pin_share, pub.active_promotions, pub.active_cascades = self.tiers.gauges(now)
        self._published = pub
        self._dirty = False

    async def _publisher(self) -> None:
        interval = self.config.stats_interval_s
        while True:
            await asyncio.sleep(interval)
            if self._dirty:
                self._publish()

    def restart(self) -> None:
        """What a server restart does to the observable state: counters from zero, caches empty."""
        self.stats = EngineStats()
        self.scheduler.stats = self.stats
        if self.tiers is not None:
            self.tiers.stats = self.stats
        self._pending_cache_clear = not self.scheduler.clear_cache()
        self._publish()

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.clear_cache()

    def _after_finishes(self, n: int) -> None:
        self._finished_total += n
        after = self.config.faults.reset_counters_after
        if after is not None and not self._restarted and self._finished_total >= after:
            self._restarted = True
            self.restart()

    # -- the step loop -----------------------------------------------------------------------------
    def _step_seconds(self, plan: StepPlan) -> float:
        t = self.profile.step_seconds(plan.prefill_tokens, plan.decode_seqs, plan.context_tokens,
                                      plan.attention_pairs)
        if t > 0 and self.noise_cv > 0:
            t *= 1.0 + self.noise_cv * self._noise.uniform(-1.0, 1.0)
        return t

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: fail every request loudly instead of hanging them
            log.exception("emulator engine failed")
            self.crashed = exc
            now = _now()
            sched = self.scheduler
            for req in list(sched.running) + list(sched.waiting):
                try:
                    sched.abort(req, now)
                except Exception:
                    pass
                req.finish_reason = "error"

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()  # only for timers: times come from _now() (emulator.loop)
        wake = self._wake
        assert wake is not None
        sched = self.scheduler
        while True:
            wake.clear()
            now = _now()
            if self._pending_cache_clear and not sched.running:
                self._pending_cache_clear = not sched.clear_cache()
            plan = sched.schedule(now)
            if plan.empty:
                self._target = 0.0  # idle: the next step starts from its own start time
                wake_at = sched.next_wakeup(now)
                timer = loop.call_later(wake_at - now, wake.set) if wake_at is not None else None
                await wake.wait()
                if timer is not None:
                    timer.cancel()
                continue
            duration = self._step_seconds(plan)
            if duration > 0:
                # Back-to-back steps are paced from the previous step's target end, so the timer's
                # lateness (timers round to 1 ms) does not accumulate over a decode.
                base = self._target if 0.0 <= now - self._target < _CATCH_UP_S else now
                self._target = base + duration
                await sleep_until(self._target)
            else:
                await asyncio.sleep(0)
            finished = sched.finish_step(plan, _now())
            self._dirty = True
            if finished:
                self._after_finishes(finished)
