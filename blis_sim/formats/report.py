"""Calibration report JSON: the reference's ``CalibrationReport`` plus our extra fields.

API::

    CalibrationReport            the whole report (strict, frozen pydantic model)
      .verdicts() -> list[VerdictRow]     one row per verdict: hit_rate, ttft MAPE, each kv_hit_rates entry
      .passed -> bool                     every verdict within
    VerdictRow(metric, real, sim, error, tolerance, within, unit)
    load_report(path) -> CalibrationReport          strict: unknown keys, wrong types -> FormatError
    report_from_data(data, file) -> CalibrationReport
    dump_report(report, blis_compatible=False) -> str   Go json.MarshalIndent(..., "", "  ") layout
    write_report(report, path, blis_compatible=False)   atomic (temp file + rename)
    reference_view(report) -> CalibrationReport     the report without our additions

Reference fields (docs/reference-formats.md §5.6), in the reference's key order, with its omitempty rules:
``trace_info`` (``itl_dropped``/``duration`` omitted when empty), ``metrics`` (keys sorted: e2e, itl, ttft),
``config_match``, ``known_limitations``, ``goodput``, ``hit_rate``, ``ttft_tolerance``.

Our additions (a BLIS reader ignores unknown JSON keys), all documented in docs/calibrate.md:
``trace_info.unmatched_real`` / ``unmatched_sim``; ``hit_rate.sim_source`` (which simulated quantity was
compared); ``kv_hit_rates`` (one like-for-like comparison per hit-rate definition and tier both sides carry);
``kv_hit_rates_unpaired`` (definitions only one side carries, and why they were not compared);
``request_hit_agreement`` (per-request cached tokens, real vs sim); ``tier_service`` (each offload tier's
simulated against real transfer service seconds) and ``tier_service_fits`` (each tier's bandwidth and
per-transfer cost derived from the server's counters); ``verdict`` ({passed, failed});
``notes`` (caveats specific to this run); ``provenance`` (tool version, inputs and options).

Floats are written the way Go writes them (``777`` not ``777.0``, shortest round-trip digits), so a report
written from the same numbers as the reference is byte-identical to it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from blis_sim.errors import FormatError
from blis_sim.formats._json import load_json
from blis_sim.formats._model import StrictModel, to_go, validate_data
from blis_sim.formats.results import go_json
from blis_sim.formats.trace import atomic_write

# The reference's four known limitations, verbatim (calibrate always writes exactly these).
REFERENCE_KNOWN_LIMITATIONS: tuple[str, ...] = (
    "BLIS models discrete batch steps. Real servers use iteration-level continuous batching. This may cause "
    "systematic TTFT prediction error under high load.",
    "Sim constructs synthetic prefix token IDs. Prefix cache hit rates may differ from real server, especially "
    "after evictions.",
    "If the real server uses speculative decoding, actual token generation patterns differ from sim's "
    "sequential model.",
    "Token mismatch detection uses ServerInputTokens (server-reported prompt_tokens) when available. Non-zero "
    "token_mismatches on observe-generated prefix-cached traces typically reflect KV-block granularity rounding "
    "(simulator accounts tokens in multiples of BlockSizeTokens; server reports raw count). Expected variance is "
    "at most BlockSizeTokens tokens per request. This is expected behavior, not data corruption.",
)


class _Model(StrictModel):
    """Strict, frozen, unknown keys rejected; Go layout via ``to_go`` (``_omitempty`` / ``_keep_none``)."""


class TraceInfo(_Model):
    num_requests: int  # matched + warm_up_excluded + unmatched_real
    warm_up_excluded: int
    matched_pairs: int
    token_mismatches: int
    itl_dropped: int = 0
    duration: str = ""
    unmatched_real: int | None = None  # ours
    unmatched_sim: int | None = None  # ours
    _omitempty: ClassVar[frozenset[str]] = frozenset({"itl_dropped", "duration"})  # ours: None = absent


class WorkloadLevel(_Model):
    real_mean: float
    sim_mean: float
    mean_error: float
    mean_percent_error: float
    real_median: float
    sim_median: float
    median_error: float
    median_percent_error: float
    real_p50: float
    sim_p50: float
    p50_error: float
    p50_percent_error: float
    real_p90: float
    sim_p90: float
    p90_error: float
    p90_percent_error: float
    real_p95: float
    sim_p95: float
    p95_error: float
    p95_percent_error: float
    real_p99: float
    sim_p99: float
    p99_error: float
    p99_percent_error: float


class RequestLevel(_Model):
    mape: float
    pearson_r: float
    bias_direction: str  # "over-predict" | "under-predict" | "neutral" | "" (no pair with real != 0)
    quality: str  # "excellent" | "good" | "fair" | "poor"


class MetricComparison(_Model):
    workload_level: WorkloadLevel
    request_level: RequestLevel
    count: int


class ConfigMatch(_Model):
    matched: list[str] | None = None
    defaulted: list[str] | None = None
    _omitempty: ClassVar[frozenset[str]] = frozenset({"matched", "defaulted"})


class GoodputClassComparison(_Model):
    count: int
    real_slo_attainment: float
    sim_slo_attainment: float
    real_goodput_rps: float
    sim_goodput_rps: float
    real_attainment_by_dim: dict[str, float] | None = None
    sim_attainment_by_dim: dict[str, float] | None = None
    _omitempty: ClassVar[frozenset[str]] = frozenset({"real_attainment_by_dim", "sim_attainment_by_dim"})


class SLODimTargets(_Model):
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    e2e_ms: float = 0.0
    _omitempty: ClassVar[frozenset[str]] = frozenset({"ttft_ms", "itl_ms", "e2e_ms"})


class GoodputComparison(_Model):
    """Read-only here: the reference writes it with SLO targets; we read it back, we do not compute it."""

    targets: dict[str, SLODimTargets]
    per_class: dict[str, GoodputClassComparison]
    skipped_itl: bool = False
    _omitempty: ClassVar[frozenset[str]] = frozenset({"skipped_itl"})


class HitRateComparison(_Model):
    """The calibration guide's block: the primary observed source vs the simulated aggregate."""

    real_hit_rate: float
    sim_hit_rate: float
    abs_error_pp: float  # |sim − real| × 100
    tolerance_pp: float
    within: bool  # abs_error_pp <= tolerance_pp + 1e-9
    source: str  # "tiered" | "gpu-prefix-cache-fallback": echoed from the trace header
    # Ours: "cache_hit_rate" (the reference's block-based aggregate) or "kv_hit_rates:<definition>" when the
    # sim carried the like-for-like quantity (design D2).
    sim_source: str | None = None
    _omitempty: ClassVar[frozenset[str]] = frozenset({"sim_source"})


class ToleranceVerdict(_Model):
    mape: float
    threshold: float
    within: bool  # mape <= threshold (no epsilon, as the reference)


class CapacityComparison(_Model):
    """Ours: simulated against observed throughput over the compared window (blis_sim.calibrate.capacity).
    ``within`` is None below saturation (reported, not judged)."""

    requests: int
    window_s: float  # last completion - first send, observed
    arrival_rps: float | None  # (n - 1) / send span; None for a burst (all sent at once)
    served_rps: float  # requests / window_s
    backlog: int  # requests still waiting for their first token when the last one was sent
    saturated: bool  # any sign in ``saturation`` (blis_sim.calibrate.capacity)
    real_rps: float
    sim_rps: float
    rps_error: float  # |sim - real| / real
    real_output_tps: float
    sim_output_tps: float
    output_tps_error: float
    tolerance: float
    within: bool | None
    # how late the last sends left (s), the median request's wait over its TTFT, and the signs of
    # saturation the window shows ("backlog", "sends lag", "waiting")
    send_lag_s: float = 0.0
    waiting_share: float = 0.0
    saturation: list[str] = Field(default_factory=list)
    # at saturation (design D9) E2E is judged, TTFT reported: the request-level E2E MAPE and its
    # threshold (the TTFT threshold)
    e2e_mape: float | None = None
    e2e_threshold: float | None = None
    _keep_none: ClassVar[frozenset[str]] = frozenset({"arrival_rps", "within"})


class HitRateDefinitionComparison(_Model):
    """Ours: one like-for-like hit-rate comparison, matched on (definition, tier, unit)."""

    definition: str  # prefix_cache | external | by_source | tiered | gpu_prefix_cache
    tier: str | None
    unit: str  # tokens | chunks
    real_hit_rate: float
    sim_hit_rate: float
    abs_error_pp: float
    tolerance_pp: float
    within: bool
    real_hits: int
    real_queries: int
    sim_hits: int
    sim_queries: int
    metric: str | None = None  # the server metric the real side came from
    _keep_none: ClassVar[frozenset[str]] = frozenset({"tier", "metric"})


class UnpairedHitRate(_Model):
    """Ours: a hit-rate definition only one side carries (or carries in another unit): not compared."""

    definition: str
    tier: str | None
    unit: str
    side: str  # "observed" | "simulated"
    reason: str
    _keep_none: ClassVar[frozenset[str]] = frozenset({"tier"})


class RequestHitAgreement(_Model):
    """Ours: per-request cached tokens (server ``usage.prompt_tokens_details.cached_tokens``) vs the sim's."""

    requests: int  # matched pairs where both sides report cached tokens
    matching: int  # of those, exactly equal
    match_share: float  # matching / requests
    mean_abs_diff_tokens: float
    real_cached_tokens: int  # sums over the compared requests
    sim_cached_tokens: int
    not_reported: int  # matched pairs left out: the server did not report (-1) or the sim has no value


class TierServiceComparison(_Model):
    """Ours: one offload tier's simulated against real transfer service seconds over the window, in one
    direction (read = towards the GPU), with the bandwidth each side implies (blis_sim.calibrate.tier_service)."""

    tier: str
    direction: str  # read | write
    real_seconds: float
    sim_seconds: float
    rel_error: float  # |sim - real| / real
    tolerance: float
    within: bool
    real_bytes: int
    sim_bytes: int
    real_bandwidth_Bps: float  # real bytes / real seconds
    sim_bandwidth_Bps: float | None
    real_jobs: int | None
    sim_jobs: int | None
    _keep_none: ClassVar[frozenset[str]] = frozenset({"sim_bandwidth_Bps", "real_jobs", "sim_jobs"})


class TierServiceFit(_Model):
    """Ours: a tier direction's bandwidth (bytes/s) and per-transfer cost derived from the server's counters."""

    tier: str
    direction: str
    bandwidth_Bps: float
    fixed_cost_s: float | None  # None: not identifiable from the windows (method bandwidth-only)
    method: str  # lstsq | bandwidth-only
    windows: int
    _keep_none: ClassVar[frozenset[str]] = frozenset({"fixed_cost_s"})


class Verdict(_Model):
    """Ours: the gate. ``failed`` names each verdict out of tolerance (as in :meth:`VerdictRow.metric`)."""

    passed: bool
    failed: list[str] = Field(default_factory=list)


class WindowFault(_Model):
    """A fault the trace header records over the window (its ``pytest_blis.faults``; docs/calibrate.md,
    "Faults"). ``modelled``: the simulator reproduces it from the offload configuration (allocation failures);
    otherwise the window's hit-rates are not comparable and the fault is a failing verdict of its own."""

    kind: str
    tier: str | None = None
    count: int = Field(ge=0)
    modelled: bool


class Provenance(_Model):
    """Ours: what produced this report (design D7)."""

    tool_version: str
    trace_header: str | None = None
    trace_data: str | None = None
    sim_results: str | None = None
    sim_metrics: str | None = None
    itl_data: str | None = None
    warmup_requests: int
    network_rtt_us: int
    network_bandwidth_mbps: float
    hit_rate_tolerance_pp: float
    ttft_mape_threshold: float
    tier_service_tolerance: float | None = None


@dataclass(frozen=True)
class VerdictRow:
    """One verdict, for a compact failure table. ``error`` and ``tolerance`` are in ``unit``."""

    metric: str  # "hit_rate[tiered]", "ttft_mape", "kv_hit_rate[tiered/0:primary]", ...
    real: float
    sim: float
    error: float
    tolerance: float
    within: bool
    unit: str  # "pp" (percentage points), "mape" (a fraction), "rate" (relative error of a throughput),
    #            "requests" (requests whose cached tokens differ; real/sim: the cached tokens in total) or
    #            "rel" (relative error of a tier's service seconds) or "faults" (a fault over the window
    #            the simulator does not model: real = its count)


class ReplicaCalibration(_Model):
    """Ours: one replica of a cluster (docs/cluster.md §5): its requests' TTFT/E2E against the simulated
    ones, and its own counter window's hit-rates against its simulated instance's. ``judged``: whether
    its verdicts count (False for a re-routed replay, whose replicas serve other requests than the real ones)."""

    replica: int
    server_url: str = ""
    matched_pairs: int = 0
    metrics: dict[str, MetricComparison] = Field(default_factory=dict)
    ttft_tolerance: ToleranceVerdict | None = None
    kv_hit_rates: list[HitRateDefinitionComparison] = Field(default_factory=list)
    kv_hit_rates_unpaired: list[UnpairedHitRate] = Field(default_factory=list)
    judged: bool = True

    _omitempty: ClassVar[frozenset[str]] = frozenset({"server_url", "kv_hit_rates", "kv_hit_rates_unpaired"})


class RoutingAgreement(_Model):
    """Ours: the share of paired requests the simulated router sent to the replica the real router chose."""

    requests: int
    agreed: int
    share: float


class CalibrationReport(_Model):
    trace_info: TraceInfo
    metrics: dict[str, MetricComparison]
    config_match: ConfigMatch = Field(default_factory=ConfigMatch)
    known_limitations: list[str] = Field(default_factory=lambda: list(REFERENCE_KNOWN_LIMITATIONS))
    goodput: GoodputComparison | None = None
    hit_rate: HitRateComparison | None = None
    ttft_tolerance: ToleranceVerdict | None = None
    # --- ours ---
    kv_hit_rates: list[HitRateDefinitionComparison] | None = None
    kv_hit_rates_unpaired: list[UnpairedHitRate] | None = None
    capacity: CapacityComparison | None = None
    request_hit_agreement: RequestHitAgreement | None = None
    tier_service: list[TierServiceComparison] | None = None
    tier_service_fits: list[TierServiceFit] | None = None
    window_faults: list[WindowFault] | None = None
    replicas: list[ReplicaCalibration] | None = None  # a cluster, replica by replica (docs/cluster.md §5)
    routing_agreement: RoutingAgreement | None = None
    verdict: Verdict | None = None
    notes: list[str] | None = None
    provenance: Provenance | None = None

    def verdicts(self) -> list[VerdictRow]:
        """Every verdict the report carries, primary hit-rate first, then TTFT MAPE, then each definition."""
        rows: list[VerdictRow] = []
        if self.hit_rate is not None:
            h = self.hit_rate
            rows.append(VerdictRow(f"hit_rate[{h.source}]", h.real_hit_rate, h.sim_hit_rate, h.abs_error_pp,
                                   h.tolerance_pp, h.within, "pp"))
        c = self.capacity
        saturated = c is not None and c.within is not None
        if self.ttft_tolerance is not None and not saturated:  # at saturation: reported (D9)
            t = self.ttft_tolerance
            ttft = self.metrics.get("ttft")
            real = ttft.workload_level.real_mean if ttft else math.nan
            sim = ttft.workload_level.sim_mean if ttft else math.nan
            rows.append(VerdictRow("ttft_mape", real, sim, t.mape, t.threshold, t.within, "mape"))
        for d in self.kv_hit_rates or ():
            name = d.definition if d.tier is None else f"{d.definition}/{d.tier}"
            rows.append(VerdictRow(f"kv_hit_rate[{name}]", d.real_hit_rate, d.sim_hit_rate, d.abs_error_pp,
                                   d.tolerance_pp, d.within, "pp"))
        for ts in self.tier_service or ():
            rows.append(VerdictRow(f"tier_service[{ts.tier}/{ts.direction}]", ts.real_seconds, ts.sim_seconds,
                                   ts.rel_error, ts.tolerance, ts.within, "rel"))
        for f in self.window_faults or ():
            if f.count and not f.modelled:  # the window cannot validate the simulator's hit-rates
                rows.append(VerdictRow(f"fault[{f.kind}{'/' + f.tier if f.tier else ''}]", float(f.count), 0.0,
                                       float(f.count), 0.0, False, "faults"))
        for rep in self.replicas or ():
            if not rep.judged:
                continue
            tol = rep.ttft_tolerance
            if tol is not None and not saturated:  # at saturation: reported, as the cluster's (D9)
                ttft = rep.metrics.get("ttft")
                rows.append(VerdictRow(f"replica[{rep.replica}].ttft_mape",
                                       ttft.workload_level.real_mean if ttft else math.nan,
                                       ttft.workload_level.sim_mean if ttft else math.nan, tol.mape, tol.threshold,
                                       tol.within, "mape"))
            for d in rep.kv_hit_rates:
                name = d.definition if d.tier is None else f"{d.definition}/{d.tier}"
                rows.append(VerdictRow(f"replica[{rep.replica}].kv_hit_rate[{name}]", d.real_hit_rate,
                                       d.sim_hit_rate, d.abs_error_pp, d.tolerance_pp, d.within, "pp"))
        c = self.capacity
        if c is not None and c.within is not None:  # judged only where the window is saturated
            rows.append(VerdictRow("capacity[req/s]", c.real_rps, c.sim_rps, c.rps_error, c.tolerance,
                                   c.rps_error <= c.tolerance, "rate"))
            rows.append(VerdictRow("capacity[output tok/s]", c.real_output_tps, c.sim_output_tps,
                                   c.output_tps_error, c.tolerance, c.output_tps_error <= c.tolerance, "rate"))
            e2e = self.metrics.get("e2e")
            if c.e2e_mape is not None and c.e2e_threshold is not None and e2e is not None:
                rows.append(VerdictRow("capacity[e2e_mape]", e2e.workload_level.real_mean,
                                       e2e.workload_level.sim_mean, c.e2e_mape, c.e2e_threshold,
                                       c.e2e_mape <= c.e2e_threshold, "mape"))
        return rows

    @property
    def passed(self) -> bool:
        """True when every verdict is within tolerance (vacuously true when there is none)."""
        return all(row.within for row in self.verdicts())


# ---------------------------------------------------------------------------------------------- reading


def report_from_data(data: Any, file: str = "<report>") -> CalibrationReport:
    """Validate already-parsed JSON (ours or the reference's) strictly."""
    if not isinstance(data, dict):
        raise FormatError(f"expected a JSON object (calibration report), got {type(data).__name__}", file=file)
    return validate_data(CalibrationReport, data, file=file)


def load_report(path: str | Path) -> CalibrationReport:
    """Read a calibration report: duplicate keys, NaN, unknown keys and wrong types are FormatErrors."""
    return report_from_data(load_json(path), str(path))


OUR_TOP_LEVEL_FIELDS: tuple[str, ...] = ("kv_hit_rates", "kv_hit_rates_unpaired", "capacity", "request_hit_agreement",
                                         "replicas", "routing_agreement", "verdict",
                                         "notes", "provenance")


def reference_view(report: CalibrationReport) -> CalibrationReport:
    """The report without our additions: exactly the reference's fields."""
    update: dict[str, Any] = {name: None for name in OUR_TOP_LEVEL_FIELDS}
    update["trace_info"] = report.trace_info.model_copy(update={"unmatched_real": None, "unmatched_sim": None})
    if report.hit_rate is not None:
        update["hit_rate"] = report.hit_rate.model_copy(update={"sim_source": None})
    return report.model_copy(update=update)


def dump_report(report: CalibrationReport, *, blis_compatible: bool = False) -> str:
    """The report as Go's ``json.MarshalIndent(report, "", "  ")`` would write it (no trailing newline).

    ``blis_compatible=True`` leaves our additions out (:func:`reference_view`).
    """
    return go_json(to_go(reference_view(report) if blis_compatible else report))


def write_report(report: CalibrationReport, path: str | Path, *, blis_compatible: bool = False) -> None:
    """Write atomically (temp file + rename): a reader never sees half a report."""
    atomic_write(path, dump_report(report, blis_compatible=blis_compatible))
