"""``fit``: the latency model's coefficients from an observed trace, by least squares (the linear
model; with ``shape="roofline"`` the two-row ``roofline-fit`` one, see :func:`_step_columns`).

API::

    coeffs = fit(trace, options)        # LatencyCoefficients, with .fit = FitReport (error,
                                        # convergence, intervals, warnings)
    coeffs = fit(trace, options, prior=physics_prior(geom, hw))   # regularised toward the roofline
    report = evaluate(trace, options)   # FitReport of any model on any trace (validate on another)

Each request's observed TTFT and mean ITL are linear in the coefficients *for a given schedule*:
replaying the trace with the current coefficients logs every step (start, duration, features F),
and a request's TTFT is the sum, over the steps between its arrival and its first token, of the
part of each step it waited through (a fraction for the step in progress when it arrived) times
``w · F``, plus idle time (e.g. a load with nothing running), plus the frontend term
``base + per_inflight · load + admission wait`` (load: requests in flight at its send, from the trace's send and
last-chunk times, as the simulator counts them; the wait: ``place · admission − since`` in the
admission queue of :func:`~blis_sim.engine.simulate.admission_queue`, grouped at the current
iterate); its mean ITL is the same sum between its first and last token over
(outputs − 1). Rows are weighted by 1/observed (relative errors, like the MAPE verdict), solved
by :func:`fit_solve.solve` (bounded, robust, toward an optional physics prior), and the replay is
redone with the new coefficients (the schedule depends on them); the best iterate by the
objective is returned, with the checks of :mod:`fit_checks` in its report. It recovers the
coefficients of a trace the engine generated itself to well under 0.1 %.

Which requests: ``status ok`` rows with a first token (in observe traces, streamed ones only: a
non-streamed response has no first-token time); TTFT = first content (else first chunk) − send;
ITL mean = (last chunk − first chunk) / (output tokens − 1) for rows with ≥ 2 outputs.
Rows outside the comparison window (warm-up) are simulated but not fitted; so are a probe trace's ramp
rows when it has a sustain phase (:func:`blis_sim.probe.plan.replayed_only` says why). A request that
waited most of its TTFT (:func:`queued_rows`) has no TTFT row in the regression; the search scores it.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from blis_sim.engine.coefficients import (
    FitIteration,
    FitReport,
    FrontendCoefficients,
    LatencyCoefficients,
    MemoryCoefficients,
    StepCoefficients,
    TraceError,
)
from blis_sim.engine.fit_solve import Design, one_blas_thread
from blis_sim.engine.prior import COEFFICIENT_NAMES, SHAPE_NAMES, PhysicsPrior
from blis_sim.engine.replay_trace import replay_outcome
from blis_sim.engine.settings import resolve_settings
from blis_sim.engine.simulate import EngineOptions, SimOutcome, admission_queue
from blis_sim.errors import ConfigError

if TYPE_CHECKING:
    from blis_sim.engine.replay_trace import PreparedTrace, ReplayableTrace

#: which of the loop's six features each linear step coefficient multiplies
_LINEAR_FROM_FEATURES = np.array([[1, 0, 0, 0, 0, 0],   # base
                                  [0, 1, 0, 0, 0, 0],   # per prefill token
                                  [0, 0, 1, 0, 0, 0],   # per decode sequence
                                  [0, 0, 0, 1, 0, 0],   # per decode context token
                                  [0, 0, 0, 0, 0, 1],   # per prefill attention pair
                                  [0, 0, 0, 0, 1, 0]],  # per prefill context token
                                 dtype=np.float64).T
N_STEP = _LINEAR_FROM_FEATURES.shape[1]
#: the frontend's columns after the step's: base, per request in flight, admission
N_FRONTEND = 3
N_LINEAR = N_STEP + N_FRONTEND
ADMISSION = COEFFICIENT_NAMES.index("frontend.admission_us")
PREFILL_CONTEXT = COEFFICIENT_NAMES.index("step.per_prefill_context_us")
#: the admission time the fit starts from when the start has none: it only groups the sends into
#: busy periods for the first solve (a burst's requests, sent within it of each other)
ADMISSION_START_US = 1000.0
#: the memory row's columns (weight-read floor, per context token), appended after the frontend's
_MEMORY_FROM_FEATURES = np.array([[1, 0, 0, 0, 0, 0],
                                  [0, 0, 0, 1, 1, 0]], dtype=np.float64).T
STEP_SHAPES = ("linear", "roofline")


def _step_columns(feats: np.ndarray, coef: np.ndarray, shape: str) -> np.ndarray:
    """Each logged step's row of the design's step columns (5 linear, plus 2 memory for the
    ``roofline`` shape). A two-row step is ``base + max(compute, memory)``: for a given schedule
    and estimate each step is on one side, so it is linear in the coefficients of that side (the
    base is on both): a compute-bound step fills the compute columns, a memory-bound one the base
    and the memory columns."""
    lin = feats @ _LINEAR_FROM_FEATURES
    if shape == "linear":
        return lin
    mem = feats @ _MEMORY_FROM_FEATURES
    compute = lin[:, 1:] @ coef[1:N_STEP]
    memory = mem @ coef[N_LINEAR:]
    on_memory = (memory > compute)[:, None]
    lin = np.where(on_memory, np.hstack([lin[:, :1], np.zeros_like(lin[:, 1:])]), lin)
    return np.hstack([lin, np.where(on_memory, mem, 0.0)])


#: In-sample TTFT or ITL MAPE above this (the calibration verdict's default) is warned.
POOR_FIT = 0.15


@dataclass
class Observed:
    """Observed per-request latencies aligned with the replay's table rows."""

    ttft_us: np.ndarray   # NaN where not usable
    itl_us: np.ndarray    # NaN where not usable
    load: np.ndarray      # requests in flight (sent earlier, last chunk not yet seen) at each send
    send_us: np.ndarray   # each send (the admission queue's arrivals)
    queued: np.ndarray    # its TTFT is mostly a wait (:func:`queued_rows`): no regression row


def observed(outcome: SimOutcome, mode: str = "generated",
             phases: Collection[str] | None = None) -> Observed:
    """The trace's own latencies per table row. In an observe trace (``mode: real``) only
    streamed requests have a TTFT and ITLs (a non-streamed response arrives in one piece).
    ``phases``: only rows of these phases (the others are replayed, not fitted)."""
    n = len(outcome.table)
    ttft = np.full(n, np.nan)
    itl = np.full(n, np.nan)
    send = np.array([float(r.send_time_us or r.arrival_time_us) for r in outcome.table.source])
    last = np.array([float(r.last_chunk_time_us) if r.last_chunk_time_us > 0 else np.nan
                     for r in outcome.table.source])
    from blis_sim.engine.simulate import inflight_at_arrival
    from blis_sim.probe.plan import replayed_only

    load = inflight_at_arrival(send, last).astype(np.float64)
    skipped = replayed_only(r.phase for r in outcome.table.source)
    for i, r in enumerate(outcome.table.source):
        if r.status != "ok" or not outcome.table.in_window[i] or r.send_time_us <= 0 or r.phase in skipped:
            continue
        if phases is not None and r.phase not in phases:
            continue
        if mode == "real" and not r.streaming:
            continue
        first = r.first_content_time_us or r.first_chunk_time_us
        if first > 0:
            ttft[i] = first - r.send_time_us
        if r.output_tokens >= 2 and r.last_chunk_time_us > r.first_chunk_time_us > 0:
            itl[i] = (r.last_chunk_time_us - r.first_chunk_time_us) / (r.output_tokens - 1)
    return Observed(ttft, itl, load, send, queued_rows(ttft, outcome.table.prompt_len))


def queued_rows(ttft_us: np.ndarray, prompt_len: np.ndarray) -> np.ndarray:
    """The requests whose observed TTFT is at least 4× its prompt class's floor: it waited
    ``WAIT_SHARE`` (75 %) of it or more, calibrate's rule for waiting that dominates TTFT
    (:func:`blis_sim.calibrate.capacity.wait_shares`). The regression leaves their TTFT rows out:
    for a schedule held fixed such a TTFT is the sum of the steps it queued through, but how many
    it queues through grows with every step's cost, so its row overstates how far the step must
    move (the iterates alternated between a long queue and none, at 36 and 47 % TTFT MAPE, on the
    emulator's 1k trace at 1.2× capacity). The search still scores them: it replays the queue."""
    from blis_sim.calibrate.capacity import WAIT_SHARE, wait_shares

    ok = np.isfinite(ttft_us) & (ttft_us > 0)
    shares = np.zeros(ttft_us.size)
    shares[ok] = wait_shares(ttft_us[ok].tolist(), prompt_len[ok].tolist())
    return shares >= WAIT_SHARE


class _StepIntegral:
    """G(t) = features accumulated by the steps up to time t (partial steps pro rata), B(t) =
    busy time up to t."""

    def __init__(self, start: np.ndarray, dur: np.ndarray, feats: np.ndarray) -> None:
        self.start, self.dur, self.feats = start, dur, feats
        self.cum = np.vstack([np.zeros((1, feats.shape[1])), np.cumsum(feats, axis=0)])
        self.cum_busy = np.concatenate([[0.0], np.cumsum(dur)])

    def __call__(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = np.searchsorted(self.start, t, side="right") - 1  # the step that started last before t
        k_safe = np.maximum(k, 0)
        frac = np.clip((t - self.start[k_safe]) / self.dur[k_safe], 0.0, 1.0)
        frac = np.where(k >= 0, frac, 0.0)
        g = self.cum[k_safe] + self.feats[k_safe] * frac[:, None]
        b = self.cum_busy[k_safe] + self.dur[k_safe] * frac
        g = np.where((k >= 0)[:, None], g, 0.0)
        b = np.where(k >= 0, b, 0.0)
        return g, b


def _design(outcome: SimOutcome, obs: Observed, coef: np.ndarray, shape: str = "linear") -> Design:
    """Rows (features, target, weight, request) for the least squares; columns: 5 step + 3
    frontend (+ 2 memory for the ``roofline`` shape). The admission column is each request's
    place in its admission busy period, grouped at the current admission time (``coef``), the
    time since that period began moved to the target: a fixed point like the schedule's."""
    lp = outcome.loop
    if lp.step_start is None or lp.step_dur is None or lp.step_features is None:
        raise ValueError("the replay was run without a step log")
    integ = _StepIntegral(lp.step_start, lp.step_dur, _step_columns(lp.step_features, coef, shape))
    done = ~np.isnan(lp.finish_us)
    load = obs.load
    rows, targets, weights, requests = [], [], [], []
    sel = np.flatnonzero(done & ~np.isnan(obs.ttft_us) & (obs.ttft_us > 0) & ~obs.queued)
    if sel.size:
        g0, b0 = integ(lp.arrival_us[sel])
        g1, b1 = integ(lp.first_token_us[sel])
        idle = (lp.first_token_us[sel] - lp.arrival_us[sel]) - (b1 - b0)
        g = g1 - g0
        place, since = admission_queue(obs.send_us, max(float(coef[ADMISSION]), 0.0))
        x = np.hstack([g[:, :N_STEP], np.ones((sel.size, 1)), load[sel, None], place[sel, None],
                       g[:, N_STEP:]])
        rows.append(x)
        targets.append(obs.ttft_us[sel] - idle + since[sel])
        weights.append(1.0 / obs.ttft_us[sel])
        requests.append(sel)
    sel = np.flatnonzero(done & ~np.isnan(obs.itl_us) & (obs.itl_us > 0) & (lp.num_out >= 2))
    if sel.size:
        g0, b0 = integ(lp.first_token_us[sel])
        g1, b1 = integ(lp.finish_us[sel])
        m = (lp.num_out[sel] - 1).astype(np.float64)
        idle = ((lp.finish_us[sel] - lp.first_token_us[sel]) - (b1 - b0)) / m
        g = (g1 - g0) / m[:, None]
        x = np.hstack([g[:, :N_STEP], np.zeros((sel.size, N_FRONTEND)), g[:, N_STEP:]])
        rows.append(x)
        targets.append(obs.itl_us[sel] - idle)
        weights.append(1.0 / obs.itl_us[sel])
        requests.append(sel)
    if not rows:
        raise ConfigError("the trace has no completed request with a usable TTFT or ITL to fit")
    return Design(np.vstack(rows), np.concatenate(targets), np.concatenate(weights),
                  np.concatenate(requests))


def _to_coefficients(values: np.ndarray, shared_context: bool = False) -> LatencyCoefficients:
    """The coefficient file of a fitted vector (9 values: linear; 11: the two-row shape).
    ``shared_context``: the prefill-context column was empty (no prefill read a context), so the
    file leaves ``per_prefill_context_us`` unset (= ``per_context_token_us``) rather than 0."""
    c = [float(v) for v in values]
    memory = (MemoryCoefficients(weights_us=c[N_LINEAR], per_context_token_us=c[N_LINEAR + 1])
              if len(c) > N_LINEAR else None)
    return LatencyCoefficients(
        model="roofline-fit" if memory else "linear",
        step=StepCoefficients(base_us=c[0], per_prefill_token_us=c[1], per_decode_seq_us=c[2],
                              per_context_token_us=c[3], per_prefill_attention_us=c[4],
                              per_prefill_context_us=None if shared_context else c[5]),
        memory=memory, frontend=FrontendCoefficients(base_us=c[6], per_inflight_us=c[7],
                                                     admission_us=c[8]))


def _vector(coeffs: LatencyCoefficients) -> np.ndarray:
    s, f, m = coeffs.step, coeffs.frontend, coeffs.memory
    mem = [m.weights_us, m.per_context_token_us] if m is not None else []
    prefill_context = s.per_context_token_us if s.per_prefill_context_us is None else s.per_prefill_context_us
    return np.array([s.base_us, s.per_prefill_token_us, s.per_decode_seq_us,
                     s.per_context_token_us, s.per_prefill_attention_us, prefill_context, f.base_us,
                     f.per_inflight_us, f.admission_us, *mem])


def _start_vector(start: LatencyCoefficients, shape: str, prior: PhysicsPrior | None) -> np.ndarray:
    """The starting vector in ``shape``. A linear start for the two-row shape gets a memory row:
    the prior's, else the linear base as the weight-read floor (the base then keeps a tenth, as
    the per-step overhead), so that small steps start on the memory side."""
    v = _vector(start)
    if v[ADMISSION] <= 0.0:  # at 0 no request queues, its column is empty and it would stay 0
        v[ADMISSION] = ADMISSION_START_US
    if shape == "linear" or v.size > N_LINEAR:
        return v[:N_LINEAR] if shape == "linear" else v
    if prior is not None:
        mem = [float(prior.values[N_LINEAR] or 0.0), float(prior.values[N_LINEAR + 1] or 0.0)]
        v[0] = 0.1 * v[0]
    else:
        mem = [0.9 * v[0], v[3]]
        v[0] = 0.1 * v[0]
    return np.concatenate([v, mem])


def _report(outcome: SimOutcome, obs: Observed, name: str, iterations: int) -> FitReport:
    ttft_sim = outcome.ttft_us
    lp = outcome.loop
    itl_sim = np.where(lp.num_out >= 2, (lp.finish_us - lp.first_token_us)
                       / np.maximum(lp.num_out - 1, 1), np.nan)

    def errs(sim: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
        ok = ~np.isnan(sim) & ~np.isnan(ref) & (ref > 0)
        if not ok.any():
            return 0.0, 0.0
        d = sim[ok] - ref[ok]
        return float(np.mean(np.abs(d) / ref[ok])), float(np.sqrt(np.mean(d * d)))

    t_mape, t_rmse = errs(ttft_sim, obs.ttft_us)
    i_mape, i_rmse = errs(itl_sim, obs.itl_us)
    used = int((~np.isnan(obs.ttft_us) & ~np.isnan(lp.finish_us)).sum())
    return FitReport(trace=name, requests=used, iterations=iterations, ttft_mape=t_mape,
                     itl_mape=i_mape, ttft_rmse_us=t_rmse, itl_rmse_us=i_rmse)


@dataclass
class _Case:
    """One trace of a fit (prepared once: every replay reads the same table), with the scheduler
    and KV settings it is replayed on, and its observed latencies (the trace's alone, whatever
    the coefficients: built on the first replay, read by every later one)."""

    trace: PreparedTrace
    options: EngineOptions
    name: str
    obs: Observed | None = None


@dataclass(eq=False)
class _Iterate:
    """One coefficient vector the fit tried, replayed on every trace: its objective, and each
    schedule's rows."""

    kind: str                   # "start" | "prior" | "iterate" | "median" | "search"
    coef: np.ndarray
    reports: list[FitReport]
    outcomes: list[SimOutcome]
    obs: list[Observed]
    designs: list[Design]
    label: str = ""             # a start's: where it came from

    @property
    def objective(self) -> float:
        """The mean over the traces of each trace's TTFT MAPE + ITL MAPE (every trace counts
        alike, whatever its length: a light probe beside a long production trace)."""
        return float(np.mean([r.ttft_mape + r.itl_mape for r in self.reports]))

    @property
    def report(self) -> FitReport:
        return _combined_report(self.reports)

    @property
    def design(self) -> Design:
        return _stacked(self.designs, [len(o.table) for o in self.outcomes])

    def release(self) -> None:
        """Drop the schedules (a replay's columns and rows): only the best and the last are kept."""
        self.outcomes = self.obs = self.designs = None  # type: ignore[assignment]


def _stacked(designs: list[Design], rows: list[int]) -> Design:
    """The traces' rows as one least squares, each trace's rows weighted to count alike (as in
    the objective), their requests numbered as the traces' tables stacked (``rows`` each)."""
    if len(designs) == 1:
        return designs[0]
    total = sum(d.y.size for d in designs)
    offset, request, w = 0, [], []
    for d, n in zip(designs, rows):
        w.append(d.w * np.sqrt(total / (len(designs) * d.y.size)))
        request.append(d.request + offset)
        offset += n
    return Design(np.vstack([d.x for d in designs]), np.concatenate([d.y for d in designs]),
                  np.concatenate(w), np.concatenate(request))


def _combined_report(reports: list[FitReport]) -> FitReport:
    """One trace's report, or the traces' together: their mean errors (the objective's terms),
    every request, and each trace's own error in ``traces``."""
    if len(reports) == 1:
        return reports[0]
    return FitReport(
        trace=", ".join(r.trace for r in reports), requests=sum(r.requests for r in reports),
        iterations=0, ttft_mape=float(np.mean([r.ttft_mape for r in reports])),
        itl_mape=float(np.mean([r.itl_mape for r in reports])),
        ttft_rmse_us=float(np.sqrt(np.mean([r.ttft_rmse_us ** 2 for r in reports]))),
        itl_rmse_us=float(np.sqrt(np.mean([r.itl_rmse_us ** 2 for r in reports]))),
        traces=[TraceError(trace=r.trace, requests=r.requests, ttft_mape=r.ttft_mape,
                           itl_mape=r.itl_mape) for r in reports])


#: How far past ``max_iterations`` a fit goes while each iterate still improves on every earlier one
#: (:func:`_still_improving`): a two-row fit that starts far off can sit on one row for several
#: iterates before it finds the other, and was still descending fast at the 10th (objective 0.059,
#: then 0.029, where the truth scores 0.00001) on a CPU whose rounding took it on a longer path.
EXTENDED = 3
IMPROVING = 0.01  # a relative gain of the objective that counts as still improving
#: replays the search stage may make (:mod:`fit_search`), Jacobian included: ~4 trust-region steps
#: over nine coefficients
SEARCH_EVALUATIONS = 40


def _still_improving(tried: list[_Iterate]) -> bool:
    """Whether the last iterate beats every earlier one (the starts included) by ``IMPROVING``."""
    *earlier, last = tried
    best = min((t.objective for t in earlier), default=np.inf)
    return last.objective < (1 - IMPROVING) * best


def _keep_best_and_last(tried: list[_Iterate]) -> None:
    best = min(tried, key=lambda t: t.objective)
    for t in tried[:-1]:
        if t is not best:
            t.release()


def _replayed(cases: list[_Case], coef: np.ndarray, kind: str, shape: str,
              phases: Collection[str] | None = None) -> _Iterate:
    model = _to_coefficients(coef).to_step_model()
    reports, outcomes, obs_all, designs = [], [], [], []
    for case in cases:
        out = replay_outcome(case.trace, replace(case.options, latency=model, latency_source="fit"),
                             log_steps=True).outcome
        if case.obs is None:
            case.obs = observed(out, case.trace.header.mode, phases)
        obs = case.obs
        reports.append(_report(out, obs, case.name, 0))
        outcomes.append(out)
        obs_all.append(obs)
        designs.append(_design(out, obs, coef, shape))
    return _Iterate(kind, coef, reports, outcomes, obs_all, designs)


#: the fractions of an overshooting regression step tried, toward the best candidate so far
BACKTRACK = (0.5, 0.25)
#: an iterate this many times the best objective so far overshot (on an emulator trace at 0.8x
#: capacity the iterates alternated between 1.9 and 61, and the fit returned 72 % TTFT MAPE)
OVERSHOOT = 1.5


def _backtrack(cases: list[_Case], leader: _Iterate, step_to: np.ndarray, tried: list[_Iterate],
               shape: str, phases: Collection[str] | None) -> _Iterate:
    """The first shorter step from ``leader`` toward ``step_to`` that beats it, else ``leader``."""
    for frac in BACKTRACK:
        cand = _replayed(cases, leader.coef + frac * (step_to - leader.coef), "iterate", shape,
                         phases)
        tried.append(cand)
        _keep_best_and_last(tried)
        if cand.objective < leader.objective:
            return cand
    return leader


def _residuals(it: _Iterate) -> tuple[np.ndarray, np.ndarray]:
    """Every fitted request's relative TTFT and ITL error at ``it`` (the terms of the objective,
    in a fixed order: the same requests whatever the coefficients), and each one's weight: 1/(its
    trace's and kind's count × the traces), so that the weighted sum is the objective's mean over
    traces of TTFT MAPE + ITL MAPE. A request the replay did not finish counts as 100 % off."""
    errors, weights = [], []
    k = len(it.outcomes)
    for out, obs in zip(it.outcomes, it.obs):
        lp = out.loop
        itl_sim = np.where(lp.num_out >= 2, (lp.finish_us - lp.first_token_us)
                           / np.maximum(lp.num_out - 1, 1), np.nan)
        for sim, ref in ((out.ttft_us, obs.ttft_us), (itl_sim, obs.itl_us)):
            ok = ~np.isnan(ref) & (ref > 0)
            if not ok.any():
                continue
            r = (sim[ok] - ref[ok]) / ref[ok]
            errors.append(np.where(np.isfinite(r), r, 1.0))
            weights.append(np.full(r.size, 1.0 / (ok.sum() * k)))
    if not errors:
        return np.zeros(1), np.zeros(1)
    return np.concatenate(errors), np.concatenate(weights)


def _cases(trace: ReplayableTrace | Sequence[ReplayableTrace], options: EngineOptions | Sequence[EngineOptions] | None,
           name: str | Sequence[str]) -> list[_Case]:
    traces: list[ReplayableTrace] = (list(trace) if isinstance(trace, (list, tuple))
                                     else [cast("ReplayableTrace", trace)])
    if not traces:
        raise ConfigError("no trace to fit", field="trace")
    if options is None or isinstance(options, EngineOptions):
        opts = [options or EngineOptions()] * len(traces)
    else:
        opts = list(options)
    names = [name] * len(traces) if isinstance(name, str) else list(name)
    if len(opts) != len(traces) or len(names) != len(traces):
        raise ConfigError(f"{len(traces)} traces need as many options and names, got "
                          f"{len(opts)} and {len(names)}", field="trace")
    if len(traces) > 1 and isinstance(name, str):
        names = [f"{name or 'trace'} {i + 1}" for i in range(len(traces))]
    from blis_sim.engine.replay_trace import prepare_trace

    # each trace's settings resolved once, against its own header (blis_sim/engine/settings.py)
    return [_Case(prepare_trace(t), resolve_settings(o, t.header), n) for t, o, n in zip(traces, opts, names)]


@one_blas_thread
def fit(trace: ReplayableTrace | Sequence[ReplayableTrace],
        options: EngineOptions | Sequence[EngineOptions] | None = None, *,
        max_iterations: int = 10, burn_in: int = 3, tolerance: float = 1e-6,
        name: str | Sequence[str] = "", prior: PhysicsPrior | None = None, prior_label: str = "",
        prior_strength: float = 0.01, bootstrap_resamples: int = 100, seed: int = 0,
        start: str = "", shape: str = "linear", phases: Collection[str] | None = None,
        search_evaluations: int = SEARCH_EVALUATIONS,
        starts: Sequence[tuple[str, LatencyCoefficients]] = ()) -> LatencyCoefficients:
    """Fit the model to ``trace`` — or to several traces at once (a list; ``options`` and ``name``
    then one per trace, or one for all): one model, each trace's error in the report's
    ``traces``. ``options`` sets the KV and scheduler knobs of each replay, and the starting
    coefficients if fitted-shaped (``start`` names where they came from, for the report).

    The objective is what the report says: the in-sample TTFT MAPE + ITL MAPE of replaying the
    trace(s) with the candidate coefficients (the mean over traces). Every candidate is within
    the bounds of :func:`~blis_sim.engine.prior.fit_bounds` (the prior's plausible range, else
    ≥ 0 and the frontend's heuristic range): implausible values are not returned. Stages:

    1. **Starts**, each replayed and scored: ``options.latency`` (the user's, else the bundled
       default), each of ``starts`` ((label, coefficients): more of the user's, e.g. a fit of
       another trace) and, with a prior, the prior's values (its frontend from the first start).
    2. **Regression** from the better start: replay, solve the rows of that schedule
       (:func:`fit_solve.solve`, toward ``prior``), repeat; plus the coordinate-wise median of
       the iterates after ``burn_in``. A replay is chaotic in the small, so the iterates jitter,
       alternate or drift; each is scored.
    3. **Search** (:mod:`fit_search`): scipy's bounded ``least_squares`` on the replayed
       per-request residuals, from the best so far, for at most ``search_evaluations`` replays;
       it sees what the regression cannot, that a slower step lengthens a queue.

    The answer is the best by the objective of every candidate scored, the starts included: never
    worse than any start (tested). Its report carries every candidate's objective, each
    coefficient's bootstrap interval (``bootstrap_resamples`` resamples of the requests at its
    schedule, seeded by ``seed``), identifiability, bound and saturation warnings.

    ``shape``: ``linear`` (the default), or ``roofline``: the two-row ``roofline-fit`` model, each
    step ``base + max(compute, memory)``; each regression solve puts every step of the schedule
    on the side its current estimate binds (:func:`_step_columns`), so the same fixed point fits
    both rows (``prior`` must then be ``physics_prior(..., shape="roofline")``).

    ``max_iterations``: the regression's iterates, or up to ``EXTENDED`` times as many while each
    new one still improves on every earlier one by 1 % (:func:`_still_improving`).

    ``phases``: fit only the rows of these phases; the rest of the trace is replayed (it shapes the
    schedule and the cache) but not fitted, e.g. a probe's one-at-a-time phases for cells that send
    one request at a time (:func:`blis_sim.probe.plan.one_at_a_time`).
    """
    from blis_sim.engine import fit_checks
    from blis_sim.engine.fit_search import robust, search
    from blis_sim.engine.fit_solve import bootstrap, collinearity, solve
    from blis_sim.engine.prior import fit_bounds

    if max_iterations < 1:
        raise ConfigError(f"max_iterations must be ≥ 1, got {max_iterations}", field="max_iterations")
    if search_evaluations < 0:
        raise ConfigError(f"search_evaluations must be ≥ 0, got {search_evaluations}",
                          field="search_evaluations")
    if shape not in STEP_SHAPES:
        raise ConfigError(f"unknown step shape {shape!r} (known: {', '.join(STEP_SHAPES)})",
                          field="step_shape")
    names = SHAPE_NAMES[shape]
    if prior is not None and prior.names != names:
        raise ConfigError(f"the prior ({prior.source}) is for another step shape than {shape!r}",
                          field="step_shape")
    cases = _cases(trace, options, name)
    low, high = (np.array(b, dtype=np.float64) for b in fit_bounds(names, prior))
    bounds = (low, high)
    start_coeffs, start_label = _start(cases[0].options)
    given = [(start or start_label, start_coeffs), *starts]
    user = _start_vector(start_coeffs, shape, prior)
    tried = []
    for label, coeffs in given:
        tried.append(_replayed(cases, np.clip(_start_vector(coeffs, shape, prior), low, high),
                               "start", shape, phases))
        tried[-1].label = label
    if prior is not None:
        physical = np.array([user[j] if v is None else v for j, v in enumerate(prior.values)])
        tried.append(_replayed(cases, np.clip(physical, low, high), "prior", shape, phases))
    fitted: list[np.ndarray] = []
    current = min(tried, key=lambda t: t.objective)
    while len(fitted) < EXTENDED * max_iterations:
        c = solve(current.design, prior, prior_strength, bounds).coef
        converged = bool(fitted) and bool(np.all(
            np.abs(c - fitted[-1]) <= tolerance * np.maximum(np.abs(fitted[-1]), 1.0)))
        fitted.append(c)
        leader = min(tried, key=lambda t: t.objective)
        current = _replayed(cases, c, "iterate", shape, phases)
        tried.append(current)
        _keep_best_and_last(tried)
        if current.objective > OVERSHOOT * leader.objective:
            # overshot (a fixed point of replay-and-solve can cycle between two schedules, one of
            # them far off): step back toward the best so far, and stop if no shorter step helps;
            # a smaller setback is the jitter of a chaotic replay, which the median evens out
            current = _backtrack(cases, leader, c, tried, shape, phases)
            if current is leader:
                break
        if converged or (len(fitted) >= max_iterations and not _still_improving(tried)):
            break
    settled = fitted[min(burn_in, len(fitted) - 1):]
    if len(settled) > 1:
        tried.append(_replayed(cases, np.median(np.array(settled), axis=0), "median", shape,
                               phases))
        _keep_best_and_last(tried)

    # the search keeps only each candidate's score; the best is replayed again for its rows
    lead = min(tried, key=lambda t: t.objective)
    used = lead.design.used if lead.designs is not None else np.ones(len(names), bool)
    typical = np.array([abs(v) if v else 1.0 for v in (prior.values if prior is not None
                                                       else [None] * len(names))])

    # the prior's rows, as the regression's solve has them (λ·(w − p)/p against residuals scaled
    # to a mean square): what the data cannot see stays physical here too
    has_prior = np.array([v is not None and v > 0 for v in prior.values]) if prior is not None \
        else np.zeros(len(names), bool)
    pvals = np.array([v if v else 1.0 for v in prior.values]) if prior is not None else None

    def penalty(coef: np.ndarray) -> np.ndarray:
        if pvals is None:
            return np.zeros(0)
        return prior_strength * (coef[has_prior] - pvals[has_prior]) / pvals[has_prior]

    def scored(coef: np.ndarray) -> np.ndarray:
        if np.array_equal(coef, lead.coef) and lead.outcomes is not None:
            # scipy's first call is its start: scored already
            return np.concatenate([robust(*_residuals(lead)), penalty(coef)])
        it = _replayed(cases, coef, "search", shape, phases)
        res = robust(*_residuals(it))
        tried.append(it)
        _keep_best_and_last(tried)
        return np.concatenate([res, penalty(coef)])

    search(scored, lead.coef, low, high, used, search_evaluations, typical)
    best_index = min(range(len(tried)), key=lambda i: tried[i].objective)
    best = tried[best_index]
    if best.designs is None:
        label = best.label
        best = _replayed(cases, best.coef, best.kind, shape, phases)
        best.label = label

    design = best.design
    sol = solve(design, prior, prior_strength, bounds)
    samples = bootstrap(design, prior, prior_strength, sol.row_weight, bootstrap_resamples, seed,
                        bounds)
    cond, vif = collinearity(design)
    features = [o.loop.step_features for o in best.outcomes]
    ests, warnings = fit_checks.estimates(
        best.coef, sol.coef, samples, vif, design, prior, _stacked_tables(best.outcomes),
        None if any(f is None for f in features) else np.vstack([f for f in features if f is not None]),
        np.concatenate([o.load for o in best.obs]), names,
        zero_when_unused=_zero_when_unused(best.obs[0]), bounds=bounds)
    for case, out, obs in zip(cases, best.outcomes, best.obs):
        window = [r for r, t in zip(out.table.source, obs.ttft_us)
                  if np.isfinite(t) and r.last_chunk_time_us > 0]
        sat = fit_checks.saturation(window, [r.phase for r in out.table.source])
        if sat:
            warnings.insert(0, sat if len(cases) == 1 else f"{case.name}: {sat}")
    report = best.report
    poor = [f"{name} MAPE {v:.1%}" for name, v in (("TTFT", report.ttft_mape),
                                                    ("ITL", report.itl_mape)) if v > POOR_FIT]
    if poor:
        warnings.append(f"the fit reproduces its own trace poorly ({', '.join(poor)}): the {shape} "
                        "model does not describe this server at these settings, or the replay's "
                        "scheduler limits and KV size are not the server's")
    if best.kind in ("start", "prior"):
        warnings.append(f"no regression or search candidate beat the {best.kind} "
                        f"({best.label if best.kind == 'start' else 'prior'}: objective "
                        f"{best.objective:.3g})")
    history = [FitIteration(iteration=i, kind=t.kind, ttft_mape=t.report.ttft_mape,
                            itl_mape=t.report.itl_mape, objective=t.objective,
                            values=[float(v) for v in t.coef]) for i, t in enumerate(tried)]
    report = report.model_copy(update={
        "iterations": len(fitted), "start": ", ".join(label for label, _ in given),
        "prior": prior_label or (prior.source if prior else "none"),
        "best_iteration": best_index, "convergence": history,
        "condition_number": cond if np.isfinite(cond) else None, "coefficients": ests,
        "warnings": warnings})
    shared = not design.used[PREFILL_CONTEXT]
    return _to_coefficients(best.coef, shared_context=shared).model_copy(update={"fit": report})


class _StackedTable:
    """The traces' prompt lengths as one table, for the identifiability hints."""

    def __init__(self, prompt_len: np.ndarray) -> None:
        self.prompt_len = prompt_len


def _stacked_tables(outcomes: list[SimOutcome]) -> Any:
    if len(outcomes) == 1:
        return outcomes[0].table
    return _StackedTable(np.concatenate([o.table.prompt_len for o in outcomes]))


def _zero_when_unused(obs: Observed) -> frozenset[str]:
    """The admission time, when the sends come in bursts (some would queue at the 1 ms the fit
    starts from) but the fit put it at 0: then its empty column is a measured 0."""
    bursts = admission_queue(obs.send_us, ADMISSION_START_US)[0].max(initial=0.0) > 0
    return frozenset({"frontend.admission_us"}) if bursts else frozenset()


def evaluate(trace: ReplayableTrace, options: EngineOptions, *, name: str = "") -> FitReport:
    """How well ``options.latency`` reproduces ``trace``'s TTFT and ITL (e.g. a model fitted on a
    probe phase, validated on another trace)."""
    out = replay_outcome(trace, options).outcome
    return _report(out, observed(out, trace.header.mode), name, 0)


def _start(options: EngineOptions) -> tuple[LatencyCoefficients, str]:
    """The starting coefficients: ``options.latency`` if fitted-shaped (linear or roofline-fit),
    else the bundled default."""
    from blis_sim.engine.coefficients import DEFAULT_COEFFICIENTS

    lat = options.latency
    if lat is not None and lat.kind in ("linear", "roofline-fit"):
        s, m = lat.details.get("step"), lat.details.get("memory")
        if s:
            return LatencyCoefficients(
                model=lat.kind, step=StepCoefficients(**s),
                memory=MemoryCoefficients(**m) if m else None,
                frontend=FrontendCoefficients(base_us=lat.frontend_base_us,
                                              per_inflight_us=lat.frontend_per_inflight_us,
                                              admission_us=lat.frontend_admission_us)), \
                options.latency_source
    return DEFAULT_COEFFICIENTS, "default"
