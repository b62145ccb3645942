"""`calibrate()`: a trace, simulated results and (optionally) simulated metrics → a CalibrationReport.

API::

    options = CalibrateOptions(warmup_requests=None, network_rtt_us=None, network_bandwidth_mbps=0.0,
                               hit_rate_tolerance_pp=5.0, ttft_mape_threshold=0.15)
    report = calibrate(trace, sim_results, sim_metrics, options=options, itl_records=None, inputs=None)
    outcome = calibrate_detailed(...)  # CalibrationOutcome(report, pairs, warnings): what the CLI logs

``trace`` has a ``.header`` and its rows as columns (a ``ColumnarTrace``: ``.data``; a ``Trace`` of
records is taken as its records' columns); ``sim_results`` the replay's SimResult columns
(``Columns`` / ``ColumnChunks``: ``read_sim_columns``, or a replay's ``result_columns()``);
``sim_metrics`` a MetricsOutput-like object or None. Every per-request step runs on the columns
(blis_sim.calibrate.table), in the CLI, the plugin and the sweep alike. Options left None
default to the trace header, as the reference's ``-1`` flag values do. Raises :class:`InputError` (exit 2)
for unusable inputs or options; never raises for a failed verdict: read ``report.passed`` /
``report.verdicts()`` (or use ``blis_sim.calibrate.verdict.raise_if_failed``).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from blis_sim import __version__
from blis_sim.calibrate.capacity import DEFAULT_CAPACITY_TOLERANCE, capacity_comparison
from blis_sim.calibrate.cluster import calibrate_replicas
from blis_sim.calibrate.goodput import goodput_comparison, merge_targets, runtime_seconds
from blis_sim.calibrate.hitrate import (
    SIM_SOURCE_CACHE_HIT_RATE,
    HitRateEntry,
    compare_definitions,
    compare_hit_rate,
    request_hit_agreement,
    simulated_primary,
)
from blis_sim.calibrate.pairing import CalibrationPairs, ItlRecord, SimIndex, prepare_pairs
from blis_sim.calibrate.stats import compute_calibration
from blis_sim.calibrate.table import SimTable, real_table
from blis_sim.calibrate.tier_service import DEFAULT_TIER_SERVICE_TOLERANCE, compare_tier_service, derive_tier_service
from blis_sim.calibrate.verdict import summarize_verdict
from blis_sim.errors import InputError, UsageError
from blis_sim.formats.report import (
    CalibrationReport,
    CapacityComparison,
    ConfigMatch,
    GoodputComparison,
    HitRateComparison,
    HitRateDefinitionComparison,
    MetricComparison,
    Provenance,
    TierServiceComparison,
    TierServiceFit,
    ToleranceVerdict,
    TraceInfo,
    UnpairedHitRate,
    WindowFault,
)
from blis_sim.formats.results import ColumnChunks, Columns
from blis_sim.formats.trace_header import MODELLED_FAULT_KINDS

if TYPE_CHECKING:
    from blis_sim.formats import KVHitRate, MetricsOutput, Trace, TraceHeader
    from blis_sim.formats.trace_columns import ColumnarTrace, TraceColumns

DEFAULT_HIT_RATE_TOLERANCE_PP = 5.0
DEFAULT_TTFT_MAPE_THRESHOLD = 0.15


@dataclass(frozen=True)
class CalibrateOptions:
    """What `blis calibrate` takes besides its files. None = use the trace header (the reference's -1)."""

    warmup_requests: int | None = None  # 0 = include everything, also rows our `warmup` column marks
    network_rtt_us: int | None = None
    network_bandwidth_mbps: float = 0.0
    hit_rate_tolerance_pp: float = DEFAULT_HIT_RATE_TOLERANCE_PP
    ttft_mape_threshold: float = DEFAULT_TTFT_MAPE_THRESHOLD
    # Goodput SLO targets per class, ms (the reference's --slo-ttft/-itl/-e2e); they beat the header's.
    slo_ttft_ms: Mapping[str, float] | None = None
    slo_itl_ms: Mapping[str, float] | None = None
    slo_e2e_ms: Mapping[str, float] | None = None
    capacity_tolerance: float = DEFAULT_CAPACITY_TOLERANCE  # relative, where the window is saturated
    tier_service_tolerance: float = DEFAULT_TIER_SERVICE_TOLERANCE  # relative, per tier and direction
    # Further counter windows of the same server (their trace headers' tier I/O) for the tier fits.
    tier_windows: tuple[Any, ...] = ()

    def validate(self) -> None:
        """The reference's checks, as UsageErrors naming the flag."""
        if self.network_rtt_us is not None and self.network_rtt_us < 0:
            raise UsageError(f"--network-rtt-us must be >= 0 (or omit to use trace header), got {self.network_rtt_us}")
        if not math.isfinite(self.network_bandwidth_mbps) or self.network_bandwidth_mbps < 0:
            raise UsageError("--network-bandwidth-mbps must be a finite number >= 0, "
                             f"got {self.network_bandwidth_mbps}")
        if not math.isfinite(self.hit_rate_tolerance_pp) or self.hit_rate_tolerance_pp < 0:
            raise UsageError(f"--hit-rate-tolerance-pp must be a finite number >= 0, got {self.hit_rate_tolerance_pp}")
        if not math.isfinite(self.ttft_mape_threshold) or self.ttft_mape_threshold < 0:
            raise UsageError(f"--ttft-mape-threshold must be a finite number >= 0, got {self.ttft_mape_threshold}")
        if not math.isfinite(self.capacity_tolerance) or self.capacity_tolerance < 0:
            raise UsageError(f"--capacity-tolerance must be a finite number >= 0, got {self.capacity_tolerance}")
        if not math.isfinite(self.tier_service_tolerance) or self.tier_service_tolerance < 0:
            raise UsageError("--tier-service-tolerance must be a finite number >= 0, got "
                             f"{self.tier_service_tolerance}")


@dataclass(frozen=True)
class InputPaths:
    """Where the inputs came from, recorded in the report's provenance (all optional)."""

    trace_header: str | None = None
    trace_data: str | None = None
    sim_results: str | None = None
    sim_metrics: str | None = None
    itl_data: str | None = None


@dataclass
class CalibrationOutcome:
    report: CalibrationReport
    pairs: CalibrationPairs
    warnings: list[str] = field(default_factory=list)  # the reference's warning log lines


def calibrate(trace: Trace | ColumnarTrace, sim_results: Columns | ColumnChunks,
              sim_metrics: MetricsOutput | None = None, *,
              options: CalibrateOptions = CalibrateOptions(), itl_records: Iterable[ItlRecord] | None = None,
              inputs: InputPaths | None = None) -> CalibrationReport:
    """The calibration report; see the module docstring."""
    return calibrate_detailed(trace, sim_results, sim_metrics, options=options, itl_records=itl_records,
                              inputs=inputs).report


def calibrate_detailed(trace: Trace | ColumnarTrace, sim_results: Columns | ColumnChunks,
                       sim_metrics: MetricsOutput | None = None, *,
                       options: CalibrateOptions = CalibrateOptions(),
                       itl_records: Iterable[ItlRecord] | None = None,
                       inputs: InputPaths | None = None) -> CalibrationOutcome:
    """:func:`calibrate` plus the pairs and warnings the CLI logs."""
    options.validate()
    inputs = inputs or InputPaths()
    if not isinstance(sim_results, (Columns, ColumnChunks)):
        raise TypeError("calibrate takes the replay's SimResult columns (read_sim_columns(path), "
                        f"outcome.result_columns()), not {type(sim_results).__name__}")
    if not sim_results.n:
        raise InputError("No sim results found — cannot calibrate with empty data", file=inputs.sim_results)
    warmup, rtt_us = _header_defaults(trace.header, options)
    itl = list(itl_records) if itl_records is not None else None
    real, sim = real_table(trace), SimTable.of(sim_results)
    pairs = prepare_pairs(real, sim, warmup_requests=warmup,
                          honour_warmup_column=options.warmup_requests != 0, network_rtt_us=rtt_us,
                          bandwidth_mbps=options.network_bandwidth_mbps, itl_records=itl or None)
    _check_pairs(pairs, inputs)
    warnings = list(pairs.warnings)
    notes: list[str] = []
    if pairs.duplicate_sim_ids:
        notes.append(f"sim results repeat {len(pairs.duplicate_sim_ids)} request_id(s) (first: "
                     f"{pairs.duplicate_sim_ids[0]}); the last result of each id was used")

    metrics: dict[str, MetricComparison] = {
        "ttft": compute_calibration(pairs.ttft.real, pairs.ttft.sim, "ttft"),
        "e2e": compute_calibration(pairs.e2e.real, pairs.e2e.sim, "e2e"),
    }
    if pairs.itl.real.size:
        metrics["itl"] = compute_calibration(pairs.itl.real, pairs.itl.sim, "itl")
    ttft = metrics["ttft"].request_level
    ttft_tolerance = ToleranceVerdict(mape=ttft.mape, threshold=options.ttft_mape_threshold,
                                      within=ttft.mape <= options.ttft_mape_threshold)

    goodput = _goodput(trace.header, real, sim, pairs, options, itl)
    if goodput is not None and goodput.skipped_itl:
        warnings.append("calibrate goodput: ITL gating skipped — ITL data missing on real or sim side; TTFT/E2E "
                        "rows still computed.")
    hit = _hit_rates(trace.header, real, sim_metrics, options, inputs)
    warnings += hit.warnings
    notes += hit.notes
    tier_rows, tier_fits, tier_notes = tier_service(trace.header, sim_metrics, options)
    notes += tier_notes
    faults = window_faults(trace.header)
    notes += [f"{f.count} {f.kind.replace('_', ' ')}s{' on tier ' + f.tier if f.tier else ''} over the window "
              "(the simulator models them from the offload configuration)" for f in faults if f.modelled]

    replicas, agreement, cluster_notes = calibrate_replicas(trace.header, real, sim, sim_metrics, options=options,
                                                            warmup=warmup, rtt_us=rtt_us)
    notes += cluster_notes

    report = CalibrationReport(
        trace_info=TraceInfo(num_requests=pairs.num_requests, warm_up_excluded=pairs.excluded_warmup,
                             matched_pairs=pairs.matched, token_mismatches=pairs.token_mismatches,
                             itl_dropped=pairs.itl_dropped, unmatched_real=pairs.unmatched_real,
                             unmatched_sim=pairs.unmatched_sim),
        metrics=metrics, config_match=ConfigMatch(), goodput=goodput, hit_rate=hit.primary,
        ttft_tolerance=ttft_tolerance, kv_hit_rates=hit.definitions or None,
        kv_hit_rates_unpaired=hit.unpaired or None,
        capacity=_capacity(real, sim, pairs, metrics, options),
        request_hit_agreement=request_hit_agreement(real.array("cached_tokens")[pairs.matched_rows],
                                                    sim.cached_tokens[pairs.matched_sim]),
        tier_service=tier_rows or None, tier_service_fits=tier_fits or None, window_faults=faults or None,
        replicas=replicas or None, routing_agreement=agreement, notes=notes or None,
        provenance=Provenance(tool_version=__version__, trace_header=inputs.trace_header,
                              trace_data=inputs.trace_data, sim_results=inputs.sim_results,
                              sim_metrics=inputs.sim_metrics, itl_data=inputs.itl_data, warmup_requests=warmup,
                              network_rtt_us=rtt_us, network_bandwidth_mbps=options.network_bandwidth_mbps,
                              hit_rate_tolerance_pp=options.hit_rate_tolerance_pp,
                              ttft_mape_threshold=options.ttft_mape_threshold,
                              tier_service_tolerance=options.tier_service_tolerance if tier_rows else None))
    report = report.model_copy(update={"verdict": summarize_verdict(report.verdicts())})
    return CalibrationOutcome(report=report, pairs=pairs, warnings=warnings)


def _capacity(real: TraceColumns, sim: SimTable, pairs: CalibrationPairs, metrics: dict[str, MetricComparison],
              options: CalibrateOptions) -> CapacityComparison | None:
    """The throughput comparison; at saturation with the E2E MAPE it judges (design D9: TTFT is
    then queueing, reported but not judged), against the TTFT threshold."""
    c = capacity_comparison(real, sim, pairs.matched_rows, pairs.matched_sim, options.capacity_tolerance)
    if c is None or not c.saturated or "e2e" not in metrics:
        return c
    return c.model_copy(update={"e2e_mape": metrics["e2e"].request_level.mape,
                                "e2e_threshold": options.ttft_mape_threshold})


def tier_service(header: TraceHeader, sim_metrics: MetricsOutput | None, options: CalibrateOptions
                 ) -> tuple[list[TierServiceComparison], list[TierServiceFit], list[str]]:
    """Each offload tier's simulated against real service seconds, and the fits of the server's
    counters over this trace's window and any ``options.tier_windows`` (blis_sim.calibrate.tier_service)."""
    observed = list(getattr(getattr(header, "pytest_blis", None), "tier_io", None) or ())
    extra = [list(getattr(getattr(h, "pytest_blis", None), "tier_io", None) or ()) for h in options.tier_windows]
    fits = [TierServiceFit(tier=f.tier, direction=f.direction, bandwidth_Bps=f.bandwidth_Bps,
                           fixed_cost_s=f.fixed_cost_s, method=f.method, windows=f.windows)
            for f in derive_tier_service([observed, *extra]).values()]
    simulated = list(getattr(sim_metrics, "tier_io", None) or ())
    if not observed or not simulated:
        return [], fits, []
    rows, notes = compare_tier_service(observed, simulated, options.tier_service_tolerance)
    return [TierServiceComparison(**vars(r)) for r in rows], fits, notes


def window_faults(header: TraceHeader) -> list[WindowFault]:
    """The header's faults that happened (a zero count is left out), marked modelled or not."""
    extra = header.pytest_blis
    return [WindowFault(kind=f.kind, tier=f.tier, count=f.count, modelled=f.kind in MODELLED_FAULT_KINDS)
            for f in (extra.faults if extra is not None else ()) if f.count]


def _header_defaults(header: TraceHeader, options: CalibrateOptions) -> tuple[int, int]:
    """Effective warm-up count and RTT (µs): the option, else the trace header (the reference's -1)."""
    warmup = options.warmup_requests
    if warmup is None or warmup == -1:
        warmup = int(getattr(header, "warm_up_requests", 0) or 0)
    rtt_us = options.network_rtt_us
    if rtt_us is None:
        rtt_ms = getattr(getattr(header, "network", None), "measured_rtt_ms", None) or 0.0
        rtt_us = int(rtt_ms * 1000) if rtt_ms > 0 else 0  # int() truncates, like Go's int64()
    return warmup, rtt_us


def _check_pairs(pairs: CalibrationPairs, inputs: InputPaths) -> None:
    """The reference's two fatal pairing outcomes, as input errors naming the files."""
    where = " and ".join(p for p in (inputs.trace_data, inputs.sim_results) if p)
    if pairs.matched == 0:
        raise InputError("No matching request IDs found between trace and sim results — check that both files "
                         "use the same request ID numbering" + (f" ({where})" if where else ""))
    if not pairs.ttft.real.size:
        raise InputError("No valid latency pairs after filtering — all matched requests may have corrupt timing "
                         "data (negative latencies)" + (f" ({inputs.trace_data})" if inputs.trace_data else ""))


@dataclass
class _HitRates:
    primary: HitRateComparison | None = None
    definitions: list[HitRateDefinitionComparison] = field(default_factory=list)
    unpaired: list[UnpairedHitRate] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _hit_rates(header: TraceHeader, real: TraceColumns, sim_metrics: MetricsOutput | None,
               options: CalibrateOptions, inputs: InputPaths) -> _HitRates:
    """The guide's primary block, every like-for-like definition, and the caveats that go with them."""
    out = _HitRates()
    out.primary, out.warnings, out.notes = _primary_hit_rate(header, sim_metrics, options, inputs)
    observed = [HitRateEntry.of(e) for e in _observed_entries(header)]
    simulated = [HitRateEntry.of(e) for e in (getattr(sim_metrics, "kv_hit_rates", None) or ())]
    if observed and simulated:
        out.definitions, out.unpaired = compare_definitions(observed, simulated, options.hit_rate_tolerance_pp)
    if sim_metrics is not None and not observed and getattr(header, "observed_kv_metrics", None) is None:
        out.notes.append("simulated metrics were given but the trace header carries no observed hit-rate "
                         "(observe ran without a /metrics scrape, or the scrape missed): no hit-rate was compared")
    if observed and sim_metrics is not None and not simulated:
        out.notes.append("the trace header carries per-definition observed hit-rates but the simulated metrics "
                         "carry no kv_hit_rates; only the primary hit_rate block was compared")
    if out.primary is not None or out.definitions:
        out.notes += _window_notes(header, real)
    return out


def _goodput(header: TraceHeader, real: TraceColumns, sim: SimTable, pairs: CalibrationPairs,
             options: CalibrateOptions, itl: list[Any] | None) -> GoodputComparison | None:
    targets = merge_targets(options.slo_ttft_ms, options.slo_itl_ms, options.slo_e2e_ms,
                            getattr(header, "goodput_slo_targets", None))
    if not targets:
        return None
    rid = real.array("request_id")
    rows = np.flatnonzero(np.isin(rid, rid[pairs.matched_rows]))  # every row of a matched id
    _found, sim_rows = SimIndex.of(sim.request_id).lookup(rid[rows])
    return goodput_comparison(real, sim, rows, sim_rows, itl, targets, runtime_seconds(real, rows))


def _observed_entries(header: TraceHeader) -> list[KVHitRate]:
    ours = getattr(header, "pytest_blis", None)
    return list(getattr(ours, "kv_hit_rates", None) or ())


def _window_notes(header: TraceHeader, real: TraceColumns) -> list[str]:
    """The guide's caveat: warm-up traffic and the counter window (phases say which side of it they ran)."""
    phases = list(getattr(getattr(header, "pytest_blis", None), "phases", None) or ())
    warm = [p for p in phases if getattr(p, "warmup", False)]
    if warm:
        notes = []
        inside = [p for p in warm if p.measured]
        outside = [p for p in warm if not p.measured]
        if inside:
            notes.append(f"the observed counter window includes warm-up phase(s) {_names(inside)} "
                         f"({sum(p.requests for p in inside)} request(s)); they are kept in the trace (marked), so "
                         "a replay of the whole trace counts them too")
        if outside:
            notes.append(f"warm-up phase(s) {_names(outside)} ({sum(p.requests for p in outside)} request(s)) ran "
                         "before the observed counter window: the simulated hit-rates are like-for-like only if "
                         "the replay counts over the same window")
        return notes
    marked = int(real.array("warmup").sum())
    if marked:
        return [f"the trace marks {marked} warm-up request(s) and records no phases: they are assumed to be inside "
                "the observed counter window, and a replay of the whole trace counts them too"]
    header_warmup = int(getattr(header, "warm_up_requests", 0) or 0)
    if header_warmup > 0:
        return [f"the observed counter window includes {header_warmup} warm-up request(s) that are not in the "
                "trace (a reference observe drops them): the simulated hit-rate does not see their traffic"]
    return []


def _names(phases: Sequence[Any]) -> str:
    return ", ".join(repr(p.name) for p in phases)


def _primary_hit_rate(header: TraceHeader, sim_metrics: MetricsOutput | None, options: CalibrateOptions,
                      inputs: InputPaths) -> tuple[HitRateComparison | None, list[str], list[str]]:
    """The guide's hit_rate block (or None), with the reference's warnings and our notes."""
    obs = getattr(header, "observed_kv_metrics", None)
    if obs is None:
        return None, [], []
    if sim_metrics is None:
        return None, [
            f"calibrate: trace header carries an observed KV hit-rate (source={obs.source}, {obs.hit_rate:.4f}) "
            "but --sim-metrics was not provided; skipping the hit-rate comparison. Produce it with `blis replay "
            "--metrics-path <file>` and pass --sim-metrics <file>."], []
    entries = [HitRateEntry.of(e) for e in (getattr(sim_metrics, "kv_hit_rates", None) or ())]
    chosen = simulated_primary(obs.source, entries, getattr(sim_metrics, "cache_hit_rate", None))
    if chosen is None:
        return None, [
            f"calibrate: --sim-metrics {inputs.sim_metrics or ''} has no cache_hit_rate; skipping the hit-rate "
            "comparison. Regenerate it with `blis replay --metrics-path` (a bare stdout run does not carry "
            "cache_hit_rate)."], []
    sim_rate, sim_source = chosen
    notes = []
    if sim_source == SIM_SOURCE_CACHE_HIT_RATE:
        notes.append(f"hit_rate compares the observed '{obs.source}' rate with the simulator's cache_hit_rate, a "
                     "block-based figure that counts decode blocks as misses: not the quantity the server "
                     "counts (design D2); the simulated metrics carried no like-for-like kv_hit_rates entry")
    return compare_hit_rate(obs.hit_rate, sim_rate, options.hit_rate_tolerance_pp, obs.source, sim_source), [], notes
