"""Calibration report JSON: the reference's ``CalibrationReport`` plus our extra fields.

API::

    CalibrationReport            the whole report (strict, frozen pydantic model)
      .verdicts() -> list[VerdictRow]     one row per verdict: hit_rate, ttft MAPE, each kv_hit_rates entry
      .passed -> bool                     every verdict within
    VerdictRow(metric, real, sim, error, tolerance, within, unit)
    load_report(path) -> CalibrationReport          strict: unknown keys, wrong types -> FormatError
    parse_report(text, file) -> CalibrationReport
    dump_report(report) -> str                      Go json.MarshalIndent(..., "", "  ") style
    write_report(report, path) -> None              atomic (temp file + rename)

Reference fields (blis-pipeline.md §5.6), in the reference's key order, with its omitempty rules:
``trace_info`` (``itl_dropped``/``duration`` omitted when empty), ``metrics`` (keys sorted: e2e, itl, ttft),
``config_match``, ``known_limitations``, ``goodput``, ``hit_rate``, ``ttft_tolerance``.

Our additions (a BLIS reader ignores unknown JSON keys), all documented in docs/calibrate.md:
``trace_info.unmatched_real`` / ``unmatched_sim``; ``hit_rate.sim_source`` (which simulated quantity was
compared); ``kv_hit_rates`` (one like-for-like comparison per hit-rate definition and tier both sides carry);
``kv_hit_rates_unpaired`` (definitions only one side carries, and why they were not compared);
``request_hit_agreement`` (per-request cached tokens, real vs sim); ``verdict`` ({passed, failed});
``notes`` (caveats specific to this run); ``provenance`` (tool version, inputs and options).

Floats are written the way Go writes them (``777`` not ``777.0``, shortest round-trip digits), so a report
written from the same numbers as the reference is byte-identical to it.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer

from blis_sim.errors import FormatError
from blis_sim.formats._strict import describe

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


def _is_empty(value: Any) -> bool:
    # Go's omitempty: nil, false, 0, "", empty slice/map.
    return value is None or value is False or (not isinstance(value, bool) and value in (0, "")) or (
        isinstance(value, (list, dict)) and not value)


class _Model(BaseModel):
    """Strict, frozen, unknown keys rejected; fields in ``_omit_empty`` are dropped from output when empty."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    _omit_empty: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _serialize(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        return {k: v for k, v in data.items() if not (k in self._omit_empty and _is_empty(v))}


class TraceInfo(_Model):
    num_requests: int  # matched + warm_up_excluded + unmatched_real
    warm_up_excluded: int
    matched_pairs: int
    token_mismatches: int
    itl_dropped: int = 0
    duration: str = ""
    unmatched_real: int | None = None  # ours
    unmatched_sim: int | None = None  # ours
    _omit_empty = frozenset({"itl_dropped", "duration", "unmatched_real", "unmatched_sim"})


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
    _omit_empty = frozenset({"matched", "defaulted"})


class GoodputClassComparison(_Model):
    count: int
    real_slo_attainment: float
    sim_slo_attainment: float
    real_goodput_rps: float
    sim_goodput_rps: float
    real_attainment_by_dim: dict[str, float] | None = None
    sim_attainment_by_dim: dict[str, float] | None = None
    _omit_empty = frozenset({"real_attainment_by_dim", "sim_attainment_by_dim"})


class SLODimTargets(_Model):
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    e2e_ms: float = 0.0
    _omit_empty = frozenset({"ttft_ms", "itl_ms", "e2e_ms"})


class GoodputComparison(_Model):
    """Read-only here: the reference writes it with SLO targets; we read it back, we do not compute it."""

    targets: dict[str, SLODimTargets]
    per_class: dict[str, GoodputClassComparison]
    skipped_itl: bool = False
    _omit_empty = frozenset({"skipped_itl"})


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
    _omit_empty = frozenset({"sim_source"})


class ToleranceVerdict(_Model):
    mape: float
    threshold: float
    within: bool  # mape <= threshold (no epsilon, as the reference)


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


class UnpairedHitRate(_Model):
    """Ours: a hit-rate definition only one side carries (or carries in another unit): not compared."""

    definition: str
    tier: str | None
    unit: str
    side: str  # "observed" | "simulated"
    reason: str


class RequestHitAgreement(_Model):
    """Ours: per-request cached tokens (server ``usage.prompt_tokens_details.cached_tokens``) vs the sim's."""

    requests: int  # matched pairs where both sides report cached tokens
    matching: int  # of those, exactly equal
    match_share: float  # matching / requests
    mean_abs_diff_tokens: float
    real_cached_tokens: int  # sums over the compared requests
    sim_cached_tokens: int
    not_reported: int  # matched pairs left out: the server did not report (-1) or the sim has no value


class Verdict(_Model):
    """Ours: the gate. ``failed`` names each verdict out of tolerance (as in :meth:`VerdictRow.metric`)."""

    passed: bool
    failed: list[str] = Field(default_factory=list)


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
    _omit_empty = frozenset({"trace_header", "trace_data", "sim_results", "sim_metrics", "itl_data"})


@dataclass(frozen=True)
class VerdictRow:
    """One verdict, for a compact failure table. ``error`` and ``tolerance`` are in ``unit``."""

    metric: str  # "hit_rate[tiered]", "ttft_mape", "kv_hit_rate[tiered/0:primary]", ...
    real: float
    sim: float
    error: float
    tolerance: float
    within: bool
    unit: str  # "pp" (percentage points) or "mape" (a fraction)


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
    request_hit_agreement: RequestHitAgreement | None = None
    verdict: Verdict | None = None
    notes: list[str] | None = None
    provenance: Provenance | None = None
    _omit_empty = frozenset({"goodput", "hit_rate", "ttft_tolerance", "kv_hit_rates", "kv_hit_rates_unpaired",
                             "request_hit_agreement", "verdict", "notes", "provenance"})

    @model_serializer(mode="wrap")
    def _serialize(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        data["metrics"] = dict(sorted(data["metrics"].items()))  # Go sorts map keys
        return {k: v for k, v in data.items() if not (k in self._omit_empty and _is_empty(v))}

    def verdicts(self) -> list[VerdictRow]:
        """Every verdict the report carries, primary hit-rate first, then TTFT MAPE, then each definition."""
        rows: list[VerdictRow] = []
        if self.hit_rate is not None:
            h = self.hit_rate
            rows.append(VerdictRow(f"hit_rate[{h.source}]", h.real_hit_rate, h.sim_hit_rate, h.abs_error_pp,
                                   h.tolerance_pp, h.within, "pp"))
        if self.ttft_tolerance is not None:
            t = self.ttft_tolerance
            ttft = self.metrics.get("ttft")
            real = ttft.workload_level.real_mean if ttft else math.nan
            sim = ttft.workload_level.sim_mean if ttft else math.nan
            rows.append(VerdictRow("ttft_mape", real, sim, t.mape, t.threshold, t.within, "mape"))
        for d in self.kv_hit_rates or ():
            name = d.definition if d.tier is None else f"{d.definition}/{d.tier}"
            rows.append(VerdictRow(f"kv_hit_rate[{name}]", d.real_hit_rate, d.sim_hit_rate, d.abs_error_pp,
                                   d.tolerance_pp, d.within, "pp"))
        return rows

    @property
    def passed(self) -> bool:
        """True when every verdict is within tolerance (vacuously true when there is none)."""
        return all(row.within for row in self.verdicts())


# ---------------------------------------------------------------------------------------------- reading


def parse_report(text: str, file: str = "<report>") -> CalibrationReport:
    """Parse a calibration report (ours or the reference's) strictly."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"invalid JSON: {exc.msg} (column {exc.colno})", file=file, line=exc.lineno) from None
    if not isinstance(data, dict):
        raise FormatError(f"expected a JSON object, got {type(data).__name__}", file=file)
    try:
        return CalibrationReport.model_validate(data)
    except ValidationError as exc:
        raise describe(exc, file=file) from None


def load_report(path: str | Path) -> CalibrationReport:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FormatError("file not found", file=str(p)) from None
    except UnicodeDecodeError as exc:
        raise FormatError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", file=str(p)) from None
    return parse_report(text, str(p))


# ---------------------------------------------------------------------------------------------- writing


def dump_report(report: CalibrationReport) -> str:
    """The report as Go's ``json.MarshalIndent(report, "", "  ")`` would write it (no trailing newline)."""
    return _go_json(report.model_dump(mode="python"), "")


def write_report(report: CalibrationReport, path: str | Path) -> None:
    """Write atomically: a reader never sees half a report."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=str(p.parent) or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(dump_report(report))
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def go_float(x: float) -> str:
    """Go encoding/json float64 text: positional shortest digits in [1e-6, 1e21), else exponent form."""
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"unsupported float value {x!r} (JSON has no NaN/Inf)")
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    text = repr(x)
    if 1e-6 <= abs(x) < 1e21:
        if "e" in text or "E" in text:
            text = format(Decimal(text), "f")
        return text[:-2] if text.endswith(".0") else text
    mantissa, exp = text.split("e")
    mantissa = mantissa[:-2] if mantissa.endswith(".0") else mantissa
    digits = int(exp.lstrip("+-"))
    # Go pads the exponent to two digits, then trims "e-07" back to "e-7" (encoding/json's clean-up).
    return f"{mantissa}e-{digits}" if exp.startswith("-") else f"{mantissa}e+{digits:02d}"


def _go_string(s: str) -> str:
    # Go escapes HTML-sensitive characters and the JS line separators; non-ASCII stays UTF-8.
    out = json.dumps(s, ensure_ascii=False)
    return (out.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _go_json(value: Any, indent: str) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_float(value)
    if isinstance(value, str):
        return _go_string(value)
    inner = indent + "  "
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{_go_string(str(k))}: {_go_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        items = [f"{inner}{_go_json(v, inner)}" for v in value]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")
