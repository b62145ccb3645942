"""`observe` as a library call: workload → server → TraceV2 (+ the counter window), no argv involved.

API::

    opts = ObserveOptions(model="tiny-llama", scrape_kv_metrics=True, max_concurrency=64)
    result = observe("http://127.0.0.1:8000", spec, opts)            # sync (runs its own event loop)
    result = await observe_async("http://127.0.0.1:8000", spec, opts)  # inside a running loop
    write_result(result, "trace.yaml", "trace.csv", blis_compatible=False, itl_path=None)
    result.trace, result.warnings, result.interrupted, result.window, result.lateness_ms
    result.wall_s, result.cpu_s   # dispatch wall time; this process's CPU time while phases dispatched

``spec`` is a :class:`~blis_sim.formats.workload.WorkloadSpec` or an already generated
:class:`~blis_sim.workload.plan.WorkloadPlan`.

Order of a run (docs/reference-formats.md §3.4, plus our phases and settle delay): ``/version``; prompt
calibration (``/tokenize``, else the tokens-per-word request); prewarm; then the phases in order, each
started when the previous one drained (+ its ``gap_us``). The counter window brackets the measured
phases (``window_phases``, default all): settle, start scrape, phases, drain, settle, end scrape.
Warm-up requests (the first ``warmup_requests`` dispatch indices) are sent inside the window and kept in
the trace, marked. A scrape miss never fails the run: it becomes a warning and the KV block is left
out. Ctrl-C / SIGTERM (``handle_signals=True``) stops dispatch, cancels in-flight requests after
``grace_s`` and returns what was collected with ``interrupted=True`` (the header says ``partial``).
"""
from __future__ import annotations

import asyncio
import datetime as _dt
import gc
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from blis_sim import __version__
from blis_sim.errors import OutputError, UsageError
from blis_sim.formats.hitrate import KVHitRate
from blis_sim.formats.trace import (
    ITLRecord,
    KVGeometry,
    ObservedKVMetrics,
    PhaseInfo,
    PytestBlisHeader,
    SLOTargets,
    TierIO,
    Trace,
    TraceHeader,
    TraceNetworkConfig,
    TraceRecord,
    TraceServerConfig,
    write_itl,
    write_trace,
)
from blis_sim.formats.workload import WorkloadSpec
from blis_sim.observe import capture, loop as event_loop
from blis_sim.observe.client import API_FORMATS, Target, connection_reuse_trace, send
from blis_sim.observe.dispatch import Dispatcher, Route
from blis_sim.observe.faults import fault_warnings, window_faults
from blis_sim.observe.http1 import Http1Pool
from blis_sim.observe.metrics import KvWindow
from blis_sim.observe.progress import Progress
from blis_sim.observe.prompts import PromptBuilder, calibrate_prompts
from blis_sim.observe.records import RequestRecord, RunClock, WireRequest
from blis_sim.observe.scrape import CounterWindow, Scraper
from blis_sim.workload.generate import generate_workload
from blis_sim.workload.plan import PhasePlan, PhaseRun, PlannedRequest, WorkloadPlan

log = logging.getLogger("blis_sim.observe")

PREWARM_WORKERS = 4
WARM_CONNECTIONS = 64  # keep-alive connections opened before dispatch (at most --max-concurrency)
PREWARM_PROMPT = "warm " * 256
DRIFT_WARN_FRACTION = 0.02
LATENESS_WARN_MS = 10.0  # p99 send lateness above this is reported
FIRST_CONTENT_GAP_US = 1000  # first chunk vs first content: more than this is worth a warning


@dataclass(frozen=True)
class ObserveOptions:
    """Everything `blis observe` takes besides the server URL and the workload (flags of
    docs/reference-formats.md §3.1)."""

    model: str
    api_format: str = "completions"
    api_key: str = ""
    no_streaming: bool = False
    max_concurrency: int = 256
    warmup_requests: int = 0
    prewarm_duration_s: float = 0.0
    timeout_s: float = 300.0
    seed: int | None = None
    num_requests: int | None = None
    horizon_us: int | None = None
    scrape_kv_metrics: bool = False
    kv_metrics_url: str = ""
    vllm_commit: str = ""
    settle_s: float = 1.0  # vLLM publishes counters at its stats interval
    window_phases: tuple[str, ...] | None = None  # phases inside the counter window; None = all
    rtt_ms: float = 0.0
    record_itl: bool = False
    server_type: str = "vllm"
    workload_label: str = ""  # header `workload_spec` (the spec path, or "preset:<name>")
    grace_s: float = 5.0
    use_tokenize: bool = True
    tokenizer: str = ""  # the served model's tokenizer (folder or tokenizer.json): exact prompts offline
    progress: bool | None = None  # None: only when stderr is a terminal
    handle_signals: bool = False  # install SIGINT/SIGTERM handlers (the CLI does)
    # generation requests to http:// servers: "lean" (Http1Pool, the default) or "aiohttp";
    # https:// always goes through aiohttp
    http_client: str = "lean"
    # stop starting phases once this many seconds of dispatch have passed (0: none); the phase in
    # progress finishes, the skipped ones are named in a warning (the trace is complete, not partial)
    time_budget_s: float = 0.0
    announce_phases: bool = False  # log each phase as it starts (name, requests, elapsed), for `blis probe`

    def validate(self) -> None:
        if not self.model:
            raise UsageError("--model is required")
        if self.api_format not in API_FORMATS:
            raise UsageError(f"--api-format must be 'completions' or 'chat', got {self.api_format!r}")
        if self.max_concurrency <= 0:
            raise UsageError(f"--max-concurrency must be > 0, got {self.max_concurrency}")
        if self.warmup_requests < 0:
            raise UsageError(f"--warmup-requests must be >= 0, got {self.warmup_requests}")
        if self.prewarm_duration_s < 0:
            raise UsageError(f"--prewarm-duration must be >= 0, got {self.prewarm_duration_s}")
        if not 1 <= self.timeout_s <= 86400:
            raise UsageError(f"--timeout must be in 1..86400 seconds, got {self.timeout_s:g}")
        if not (self.rtt_ms >= 0 and self.rtt_ms != float("inf")):
            raise UsageError(f"--rtt-ms must be finite and >= 0, got {self.rtt_ms}")
        if self.record_itl and self.no_streaming:
            raise UsageError("--record-itl and --no-streaming are mutually exclusive")
        if self.settle_s < 0 or self.grace_s < 0:
            raise UsageError("--settle and --grace must be >= 0")
        if not 0 <= self.time_budget_s < float("inf"):
            raise UsageError(f"--time-budget must be finite and >= 0, got {self.time_budget_s}")
        if self.http_client not in ("lean", "aiohttp"):
            raise UsageError(f"--http-client must be 'lean' or 'aiohttp', got {self.http_client!r}")


@dataclass(repr=False)
class ObserveResult:
    """What a run produced. Its repr is one line: asyncio.run() formats the finished main task's result
    (when it restores the SIGINT handler), and a full repr of thousands of rows costs seconds."""

    trace: Trace
    records: list[RequestRecord]
    warnings: list[str] = field(default_factory=list)
    interrupted: bool = False
    window: KvWindow | None = None
    lateness_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0  # this process's CPU time while phases dispatched (scrapes and settle delays excluded)
    itl: list[ITLRecord] = field(default_factory=list)
    prompt_mode: str = ""

    def __repr__(self) -> str:
        return (f"ObserveResult({len(self.trace.records)} records, {self.ok_requests} ok, "
                f"interrupted={self.interrupted}, warnings={len(self.warnings)})")

    @property
    def ok_requests(self) -> int:
        return sum(1 for r in self.trace.records if r.status == "ok")

    def summary(self) -> dict[str, Any]:
        return capture.summary_metrics(self.trace.records, self.wall_s)


def observe(server_url: str, spec: WorkloadSpec | WorkloadPlan, options: ObserveOptions) -> ObserveResult:
    """Synchronous :func:`observe_async` on its own event loop (uvloop when available: observe.loop)."""
    return event_loop.run(observe_async(server_url, spec, options))


async def observe_async(server_url: str, spec: WorkloadSpec | WorkloadPlan,
                        options: ObserveOptions) -> ObserveResult:
    options.validate()
    plan = spec if isinstance(spec, WorkloadPlan) else generate_workload(
        spec, seed=options.seed, num_requests=options.num_requests, horizon=options.horizon_us)
    return await execute_with_signals(_Run(server_url.rstrip("/"), plan, options), options.handle_signals)


async def execute_with_signals(run: _Run, handle_signals: bool) -> ObserveResult:
    """``run.execute()``, with SIGINT/SIGTERM calling ``run.interrupt(sig)`` meanwhile when asked (the run
    then ends its window and returns what it collected, as a partial trace)."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if handle_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, run.interrupt, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread / platform
                pass
    try:
        result: ObserveResult = await run.execute()
        return result
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


class _PhaseSource:
    """Adapts the workload's PhaseRun (follow-ups on completion) to the dispatcher's source protocol."""

    def __init__(self, run: PhaseRun) -> None:
        self.run = run

    def initial(self) -> list[PlannedRequest]:
        return list(self.run.initial)

    def on_complete(self, planned: PlannedRequest, record: RequestRecord, now_us: int) -> list[PlannedRequest]:
        nxt = self.run.on_complete(planned, ok=record.status == "ok",
                                   output_tokens=record.output_tokens or None, completed_at_us=now_us)
        return [nxt] if nxt is not None else []


class _Run:
    """State of one observation; ``execute()`` does the whole run once."""

    def __init__(self, base_url: str, plan: WorkloadPlan, opts: ObserveOptions) -> None:
        self.base_url, self.plan, self.opts = base_url, plan, opts
        self.metrics_url = opts.kv_metrics_url or base_url + "/metrics"
        self.target = Target(base_url, opts.model, opts.api_format, opts.api_key, opts.timeout_s, opts.record_itl)
        self.clock = RunClock()
        self.stop = asyncio.Event()
        self.warnings: list[str] = []
        self.completed: list[RequestRecord] = []  # completion order, as the CSV is written
        self.phase_infos: list[PhaseInfo] = []
        self.builder: PromptBuilder | None = None
        self.window: CounterWindow | None = None
        self.geometry: dict[str, int] | None = None
        self.vllm_version = ""
        self.signal_name = ""
        self.dispatcher: Dispatcher | None = None
        self.session: aiohttp.ClientSession | None = None
        # The requests themselves go over the lean HTTP/1.1 pool (http://), else over aiohttp (https).
        self.pool: Http1Pool | None = None
        self._progress = Progress(0, enabled=False)
        self.cpu_s = 0.0
        self.measured = _measured_phases(plan, opts.window_phases)  # checked before anything is sent
        self.route: Route | None = None  # a cluster's router (blis_sim.observe.cluster); None: one server

    def interrupt(self, sig: int = signal.SIGINT) -> None:
        """First signal: stop sending, give in-flight requests the grace period. Second: cancel them now."""
        if self.stop.is_set():
            log.warning("observe: %s again: cancelling in-flight requests now", signal.Signals(sig).name)
            if self.dispatcher is not None:
                self.dispatcher.abort.set()
            return
        self.signal_name = signal.Signals(sig).name
        log.warning("observe: %s received: stopping dispatch (in-flight requests get %g s; again to cancel "
                    "them now)", self.signal_name, self.opts.grace_s)
        self.stop.set()

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self.session is not None, "only inside execute()"
        return self.session

    @property
    def sender(self) -> aiohttp.ClientSession | Http1Pool:
        """What the generation requests go through: the lean pool when the URL allows it."""
        return self.pool if self.pool is not None else self.http

    def warn(self, message: str) -> None:
        log.warning("observe: %s", message)
        self.warnings.append(message)

    # ------------------------------------------------------------------------------------------ run

    async def execute(self) -> ObserveResult:
        connector = aiohttp.TCPConnector(limit=self.opts.max_concurrency + PREWARM_WORKERS, limit_per_host=0,
                                         ttl_dns_cache=300)
        async with aiohttp.ClientSession(connector=connector, headers={"User-Agent": f"blis-observe/{__version__}"},
                                         trace_configs=[connection_reuse_trace()]) as session:
            self.session = session
            if self.opts.http_client == "lean" and Http1Pool.supports(self.base_url):
                self.pool = Http1Pool(self.base_url, headers={"User-Agent": f"blis-observe/{__version__}"})
            try:
                return await self._execute()
            finally:
                if self.pool is not None:
                    await self.pool.close()

    async def _execute(self) -> ObserveResult:
        """The run itself, inside the aiohttp session and the lean pool."""
        self.vllm_version = await self._version()
        self.builder = await calibrate_prompts(self.http, self.target, use_tokenize=self.opts.use_tokenize,
                                             tokenizer=self.opts.tokenizer)
        if self.opts.prewarm_duration_s > 0 and not self.stop.is_set():
            await self._prewarm()
        scraper = Scraper(self.http, self.metrics_url, api_key=self.opts.api_key, timeout_s=self.opts.timeout_s)
        if self.opts.scrape_kv_metrics:
            self.window = CounterWindow(scraper, self.clock, settle_s=self.opts.settle_s,
                                        vllm_commit=self.opts.vllm_commit, model=self.opts.model,
                                        warn=self.warn, sleep=self._sleep)
        else:
            self.geometry = await scraper.geometry()
        await self._open_connections(min(self.opts.max_concurrency, WARM_CONNECTIONS))
        start_ns = self.clock.now_ns()
        # Objects made so far (plan, modules, session) need no cycle collection during dispatch:
        # frozen, collections scan only what dispatch creates, which keeps GC pauses short. Left
        # alone when someone else in the process froze first (unfreezing would undo theirs).
        freeze = gc.get_freeze_count() == 0
        if freeze:
            gc.freeze()
        try:
            await self._phases()
        finally:
            if freeze:
                gc.unfreeze()
        wall_s = (self.clock.now_ns() - start_ns) / 1e9
        return self._result(wall_s)

    async def _phases(self) -> None:
        measured = self.measured
        first, last = (measured[0], measured[-1]) if measured else (-1, -1)
        dispatcher = Dispatcher(self.sender, self.target, self.clock, max_concurrency=self.opts.max_concurrency,
                                warmup_requests=self.opts.warmup_requests, stop=self.stop,
                                grace_s=self.opts.grace_s, on_record=self._completed, route=self.route)
        self.dispatcher = dispatcher
        window = self.window
        total = sum(len(p.requests) for p in self.plan.phases)
        progress = Progress(total, enabled=self.opts.progress)
        self._progress = progress
        budget = self.opts.time_budget_s
        start_ns = self.clock.now_ns()
        try:
            for i, phase in enumerate(self.plan.phases):
                if self.stop.is_set():
                    break
                elapsed = (self.clock.now_ns() - start_ns) / 1e9
                if budget > 0 and elapsed >= budget:
                    skipped = [p.name for p in self.plan.phases[i:]]
                    self.warn(f"time budget of {budget:g} s spent after {elapsed:.1f} s: {len(skipped)} phase(s) "
                              f"not run ({', '.join(skipped[:6])}{', ...' if len(skipped) > 6 else ''})")
                    break
                if self.opts.announce_phases:
                    log.info("phase %d/%d %s: %d request(s), %.1f s elapsed", i + 1, len(self.plan.phases),
                             phase.name, len(phase.requests), elapsed)
                if phase.gap_us > 0:
                    await self._sleep(phase.gap_us / 1e6)
                if i == first and window is not None:
                    await window.open()
                await self._run_phase(dispatcher, phase, i in measured)
                if i == last and window is not None and not self.stop.is_set():
                    await window.close()
        finally:
            progress.close()
        if window is not None and window.opened and window.result is None and not self.stop.is_set():
            await window.close()  # the budget ended the run before the window's last phase
        if window is not None and window.opened and self.stop.is_set() and window.result is None:
            self.warn("--scrape-kv-metrics: observe was interrupted before the measured window ended; "
                      "omitting the observed KV hit-rate from the trace header")
        if window is not None:
            self.geometry = window.geometry

    async def _run_phase(self, dispatcher: Dispatcher, phase: PhasePlan, measured: bool) -> None:
        builder = self.builder
        assert builder is not None
        seed = self.plan.seed
        no_stream, itl = self.opts.no_streaming, self.opts.record_itl
        # Open-loop prompts are built before the clock starts so building never makes a send late.
        prebuilt = {p.uid: _wire(p, builder, seed, no_stream, itl) for p in phase.requests}

        def build(p: PlannedRequest, _offset_us: int) -> WireRequest:
            return prebuilt.pop(p.uid, None) or _wire(p, builder, seed, no_stream, itl)

        self._progress.phase(phase.name)
        start_ns = self.clock.now_ns()
        cpu0 = time.process_time()
        records = await dispatcher.run_phase(_PhaseSource(phase.start()), build, phase_start_ns=start_ns)
        self.cpu_s += time.process_time() - cpu0
        self.phase_infos.append(PhaseInfo(
            name=phase.name, measured=measured, requests=len(records),
            start_time_us=self.clock.epoch_us(start_ns), end_time_us=self.clock.epoch_us(self.clock.now_ns())))

    def _completed(self, record: RequestRecord) -> None:
        self.completed.append(record)
        self._progress.advance(record.status == "ok")

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but return at once on a stop."""
        try:
            await asyncio.wait_for(self.stop.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass

    # -------------------------------------------------------------------------------- server info

    async def _version(self) -> str:
        try:
            async with self.http.get(self.base_url + "/version", headers=self._auth(),
                                        timeout=aiohttp.ClientTimeout(total=min(self.opts.timeout_s, 10.0))) as r:
                if r.status == 200:
                    data = await r.json(content_type=None)
                    if isinstance(data, dict) and isinstance(data.get("version"), str):
                        return str(data["version"])
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError) as exc:
            log.info("observe: %s/version: %s", self.base_url, exc)
        return ""

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.opts.api_key}"} if self.opts.api_key else {}

    async def _open_connections(self, n: int) -> None:
        """Open ``n`` keep-alive connections first (cheap ``GET /health``), so that the first requests
        of the run neither pay a TCP handshake inside their TTFT nor delay the schedule with one."""
        async def one() -> None:
            try:
                async with self.http.get(self.base_url + "/health", headers=self._auth(),
                                         timeout=aiohttp.ClientTimeout(total=min(self.opts.timeout_s, 5.0))) as r:
                    await r.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass  # nothing to warm: the requests will say what is wrong

        if self.pool is not None:
            await self.pool.open(n)
            return
        await asyncio.gather(*(one() for _ in range(n)))

    async def _prewarm(self) -> None:
        """The reference's prewarm: 4 loops of non-streaming requests, outside the window and the trace."""
        deadline = self.clock.now_ns() + int(self.opts.prewarm_duration_s * 1e9)
        sent = failed = 0

        async def worker() -> None:
            nonlocal sent, failed
            while self.clock.now_ns() < deadline and not self.stop.is_set():
                wire = WireRequest(prompt=PREWARM_PROMPT, max_tokens=64, streaming=False, arrival_us=0,
                                   input_tokens=0)
                rec = RequestRecord(request_id=-1, wire=wire)
                await send(self.sender, self.target, rec, self.clock)
                sent += 1
                if rec.status != "ok":
                    failed += 1
                    await self._sleep(0.5)

        await asyncio.gather(*(worker() for _ in range(PREWARM_WORKERS)))
        if sent and failed == sent:
            self.warn(f"prewarm: {failed}/{sent} requests failed (is the server reachable at {self.base_url}?)")

    # -------------------------------------------------------------------------------------- result

    def _check_first_chunks(self, rows: list[TraceRecord]) -> None:
        """A server that sends an event before the first generated text (an early role chunk) makes the
        reference's TTFT (first chunk) too short; say so, since calibrate uses that column."""
        late = _ttft_gap_rows(rows)
        if late:
            self.warn(f"{len(late)} streaming requests got an SSE event more than {FIRST_CONTENT_GAP_US} µs before "
                      "their first generated text (first_chunk_time_us < first_content_time_us): TTFT from the "
                      "first chunk understates the real one for them")

    def _check_finish_reasons(self, rows: list[TraceRecord]) -> None:
        """The reference's per-request warnings, counted once: aborts, and outputs shorter than asked."""
        aborted = [r.request_id for r in rows if r.finish_reason == "abort"]
        if aborted:
            self.warn(f"{len(aborted)} requests finished with finish_reason=abort (ids {aborted[:5]}...)")
        asked = {rec.request_id: rec.wire.min_tokens for rec in self.completed}  # the CSV lacks it
        early = [r.request_id for r in rows if r.status == "ok" and r.finish_reason == "stop"
                 and 0 < r.output_tokens < asked.get(r.request_id, 0)]
        if early:
            self.warn(f"{len(early)} requests stopped before min_tokens (the server may not support min_tokens; "
                      f"ids {early[:5]}...)")

    def _check_lateness(self, records: list[RequestRecord]) -> None:
        """Sends later than the schedule change the arrival process the simulator replays; say so."""
        late = capture.lateness_ms(records)
        if len(late) >= 20:
            p99 = capture.percentile(late, 99)
            if p99 > LATENESS_WARN_MS:
                self.warn(f"sends were late against the schedule: p50 {capture.percentile(late, 50):.1f} ms, p99 "
                          f"{p99:.1f} ms (waiting for a --max-concurrency slot counts; a busy client machine too)")

    def _compare_server_ttft(self, rows: list[TraceRecord]) -> None:
        """Log client vs server-side TTFT over the window (they differ under load:
        docs/vllm-cpu-measurements.md §5)."""
        window = self.window.result if self.window is not None else None
        if window is None or not window.server_ttft or not window.server_ttft["count"]:
            return
        measured = {p.name for p in self.phase_infos if p.measured}
        ttft = [(r.first_content_time_us or r.first_chunk_time_us) - r.send_time_us for r in rows
                if r.status == "ok" and r.streaming and r.phase in measured and r.first_chunk_time_us]
        if ttft:
            client_ms = sum(ttft) / len(ttft) / 1000
            log.info("observe: TTFT mean over the window: client %.2f ms, server-side %.2f ms "
                     "(vllm:time_to_first_token_seconds; the gap is HTTP, frontend and client time)",
                     client_ms, window.server_ttft["mean_ms"])

    def _result(self, wall_s: float) -> ObserveResult:
        rows: list[TraceRecord] = []
        for r in self.completed:
            if r.planned is not None:
                rows.append(capture.to_trace_record(r, r.planned, self.clock, r.phase_offset_us))
        drift = capture.length_drift(rows)
        builder = self.builder
        if drift.rows and (drift.mean_rel > DRIFT_WARN_FRACTION or (builder is not None and builder.mode == "exact"
                                                                   and drift.mismatched)):
            self.warn(drift.message())
        self._check_first_chunks(rows)
        self._check_finish_reasons(rows)
        self._check_lateness(self.completed)
        self._compare_server_ttft(rows)
        interrupted = self.stop.is_set()
        window = self.window.result if self.window is not None else None
        observed = window.observed if window is not None and window.valid else None
        hit_rates = window.hit_rates if window is not None and window.valid else []
        tier_io = [TierIO(tier=t, read_bytes=int(d.get("read_bytes", 0)), write_bytes=int(d.get("write_bytes", 0)),
                          read_time_s=d.get("read_time_s", 0.0), write_time_s=d.get("write_time_s", 0.0),
                          read_jobs=_jobs(d.get("read_jobs")), write_jobs=_jobs(d.get("write_jobs")))
                   for t, d in sorted((window.tier_io if window is not None and window.valid else {}).items())]
        geometry = KVGeometry(**self.geometry) if self.geometry else None
        faults = window_faults(window.faults if window is not None and window.valid else [], rows,
                               (self.geometry or {}).get("block_size", 1))
        for message in fault_warnings(faults):
            self.warn(message)
        extra = PytestBlisHeader(
            tool_version=__version__, vllm_version=self.vllm_version, server_url=self.base_url,
            kv_geometry=geometry, kv_hit_rates=[KVHitRate(**e) for e in hit_rates], tier_io=tier_io, faults=faults,
            scrape=self.window.info if self.window is not None else None,
            phases=self.phase_infos, partial=interrupted,
            partial_reason=(f"interrupted by {self.signal_name or 'a stop request'}" if interrupted else ""),
            warnings=list(self.warnings))
        spec = self.plan.spec
        header = TraceHeader(
            trace_version=3, time_unit="us", mode="real",
            created_at=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            warm_up_requests=self.opts.warmup_requests, workload_seed=self.plan.seed,
            workload_spec=self.opts.workload_label,
            session_context_growth=self.plan.session_context_growth,
            server=TraceServerConfig(type=self.opts.server_type, model=self.opts.model,
                                     block_size=(self.geometry or {}).get("block_size", 0)),
            network=TraceNetworkConfig(measured_rtt_ms=self.opts.rtt_ms),
            goodput_slo_targets={k: SLOTargets(**v.model_dump()) for k, v in spec.goodput_slo_targets.items()},
            observed_kv_metrics=ObservedKVMetrics(**observed) if observed else None,
            pytest_blis=extra)
        records = list(self.completed)
        return ObserveResult(
            trace=Trace(header=header, records=rows), records=records, warnings=list(self.warnings),
            interrupted=interrupted, window=window, lateness_ms=capture.lateness_ms(records), wall_s=wall_s,
            cpu_s=self.cpu_s,
            itl=capture.itl_records(records, self.clock) if self.opts.record_itl else [],
            prompt_mode=builder.describe() if builder is not None else "")


def _jobs(count: float | None) -> int | None:
    """A transfer count over the window (a histogram's ``_count`` delta), None when not exposed."""
    return None if count is None else int(count + 0.5)


def _measured_phases(plan: WorkloadPlan, window_phases: tuple[str, ...] | None) -> list[int]:
    """Indices of the phases inside the counter window (all by default); they must be consecutive."""
    names = [p.name for p in plan.phases]
    if window_phases is None:
        return list(range(len(names)))
    unknown = sorted(set(window_phases) - set(names))
    if unknown:
        raise UsageError(f"--window-phases names unknown phases {unknown} (phases: {names})")
    measured = [i for i, n in enumerate(names) if n in window_phases]
    if measured != list(range(measured[0], measured[-1] + 1)):
        raise UsageError(f"--window-phases must be consecutive phases, got {list(window_phases)} of {names}")
    return measured


def _ttft_gap_rows(rows: list[TraceRecord]) -> list[TraceRecord]:
    return [r for r in rows if r.status == "ok" and r.streaming and r.first_content_time_us
            and r.first_content_time_us - r.first_chunk_time_us > FIRST_CONTENT_GAP_US]


def _wire(p: PlannedRequest, builder: PromptBuilder, seed: int, no_streaming: bool, record_itl: bool) -> WireRequest:
    """A planned request on the wire: prompt text from its token ids, exact output length asked."""
    ids = p.input_token_ids(seed).tolist()
    max_tokens = p.output_tokens if p.output_tokens > 0 else 2048
    return WireRequest(
        prompt=builder.text(ids, p.prefix_length), max_tokens=max_tokens,
        min_tokens=p.output_tokens if p.output_tokens > 0 else 0,
        streaming=record_itl or (p.streaming and not no_streaming), arrival_us=p.arrival_us,
        input_tokens=p.input_tokens, prefix_group=p.prefix_group, prefix_length=p.prefix_length,
        client_id=p.client_id, tenant_id=p.tenant_id, slo_class=p.slo_class,
        priority=capture.wire_priority(p.slo_class), slo_target_us=p.slo_target_us, session_id=p.session_id,
        round_index=p.round_index, deadline_us=p.deadline_us, model=p.model, phase=p.phase,
        think_time_us=p.think_time_us)


def write_result(result: ObserveResult, header_path: str | Path, data_path: str | Path, *,
                 blis_compatible: bool = False, itl_path: str | Path | None = None) -> None:
    """Write the trace (both files atomically) and, with ITL data, the ITL CSV.

    A file that cannot be written (a full disk) is an :class:`OutputError` saying what was and was not
    written; nothing is ever left half-written under an output's name."""
    try:
        write_trace(result.trace, header_path, data_path, blis_compatible=blis_compatible)
    except OSError as exc:
        raise OutputError(f"cannot write the trace ({exc.strerror or exc}): nothing was written under {header_path} "
                          f"or {data_path}; the {len(result.trace.records)} records collected are lost") from None
    if itl_path is not None and result.itl:
        try:
            write_itl(result.itl, itl_path)
        except OSError as exc:
            raise OutputError(f"cannot write the ITL file {itl_path} ({exc.strerror or exc}); the trace was "
                              f"written to {header_path} / {data_path}") from None


__all__ = ["ObserveOptions", "ObserveResult", "observe", "observe_async", "write_result"]
