"""Real-vs-simulated statistics, bit-for-bit with the reference's ``ComputeCalibration``.

API::

    percentile(sorted_values, p) -> float   # linear interpolation, rank = p/100 * (n - 1)
    mape(real, sim) -> float | None         # fraction; pairs with real == 0 skipped; None if none qualify
    bias_direction(real, sim) -> str        # "over-predict" | "under-predict" | "neutral" | ""
    pearson_r(x, y) -> float                # 0 when n < 3 or the denominator is 0
    quality(mape, r) -> str                 # "excellent" | "good" | "fair" | "poor"
    mape_pct(real, sim) -> float            # like mape, also skips NaN/Inf (per-SLO log lines)
    compute_calibration(real, sim, name) -> MetricComparison

The formulas (sums in input order, one addition after another, over arrays; the textbook Pearson
form rather than numpy's) are kept exactly as the
reference computes them so our report agrees with a BLIS report to the last few ulps. Nothing here rounds:
the only integer conversion calibrate makes is the header RTT (``int(ms * 1000)``, Go's truncating
``int64()``), in ``core``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from blis_sim.errors import InputError
from blis_sim.formats.report import MetricComparison, RequestLevel, WorkloadLevel

# The reference's quality bands: (name, MAPE strictly below, Pearson r strictly above).
QUALITY_BANDS: tuple[tuple[str, float, float], ...] = (
    ("excellent", 0.10, 0.95),
    ("good", 0.20, 0.85),
    ("fair", 0.35, 0.70),
)
PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


def _seq_sum(values: np.ndarray) -> float:
    """Σ in input order, one addition after another (the reference's loop; numpy's ``sum`` pairs
    its terms and can differ in the last bits): a cumulative sum's last term."""
    return float(np.cumsum(values)[-1]) if values.size else 0.0


def _floats(values: Sequence[float] | np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def percentile(sorted_values: Sequence[float] | np.ndarray, p: float) -> float:
    """Percentile of already-sorted values by linear interpolation (numpy's "linear" method)."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    if n == 1:
        return float(sorted_values[0])
    rank = p / 100.0 * (n - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    if lo == hi:
        return float(sorted_values[lo])
    a, b = float(sorted_values[lo]), float(sorted_values[hi])
    return a + (rank - lo) * (b - a)


def mape(real: Sequence[float] | np.ndarray, sim: Sequence[float] | np.ndarray) -> float | None:
    """Mean absolute percentage error as a fraction over pairs with ``real != 0``; None if none qualify."""
    _check_parallel(real, sim, "mape")
    r, s = _floats(real), _floats(sim)
    keep = r != 0
    count = int(keep.sum())
    if not count:
        return None
    r, s = r[keep], s[keep]
    return _seq_sum(np.abs(r - s) / r) / count


def bias_direction(real: Sequence[float] | np.ndarray, sim: Sequence[float] | np.ndarray) -> str:
    """Sign of Σ(sim − real) over pairs with ``real != 0``; "" when no pair qualifies (as the reference)."""
    _check_parallel(real, sim, "bias")
    r, s = _floats(real), _floats(sim)
    keep = r != 0
    if not keep.any():
        return ""
    bias = _seq_sum(s[keep] - r[keep])
    if bias > 0:
        return "over-predict"
    if bias < 0:
        return "under-predict"
    return "neutral"


def pearson_r(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Pearson correlation, textbook single-pass form; 0 when n < 3 or either side is constant."""
    _check_parallel(x, y, "pearson")
    n = len(x)
    if n < 3:
        return 0.0
    a, b = _floats(x), _floats(y)
    sx, sy, sxy, sx2, sy2 = (_seq_sum(v) for v in (a, b, a * b, a * a, b * b))
    num = n * sxy - sx * sy
    prod = (n * sx2 - sx * sx) * (n * sy2 - sy * sy)
    # Cancellation can make a constant series' variance a tiny negative number: Go's Sqrt gives NaN
    # there and the reference would write NaN (invalid JSON). We treat it as the zero it is.
    if prod <= 0:
        return 0.0
    return num / math.sqrt(prod)


def quality(mape_value: float, r: float) -> str:
    """The reference's quality rating from MAPE (fraction) and Pearson r."""
    for name, max_mape, min_r in QUALITY_BANDS:
        if mape_value < max_mape and r > min_r:
            return name
    return "poor"


def mape_pct(real: Sequence[float] | np.ndarray, sim: Sequence[float] | np.ndarray) -> float:
    """MAPE fraction that also skips NaN/Inf (the reference's per-SLO/per-model log lines); 0 if empty."""
    _check_parallel(real, sim, "mape_pct")
    r, s = _floats(real), _floats(sim)
    keep = (r != 0) & np.isfinite(r)
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.abs(r[keep] - s[keep]) / r[keep]
    err = err[np.isfinite(err)]
    return _seq_sum(err) / err.size if err.size else 0.0


def compute_calibration(real: Sequence[float] | np.ndarray, sim: Sequence[float] | np.ndarray,
                        name: str) -> MetricComparison:
    """Workload-level aggregates and request-level quality for one latency metric (µs)."""
    if not len(real) or not len(sim):
        raise InputError(f"empty latency vectors for {name}")
    _check_parallel(real, sim, name)
    r, s = _floats(real), _floats(sim)
    n = len(r)
    fields: dict[str, float] = {}
    _put(fields, "mean", _seq_sum(r) / n, _seq_sum(s) / n)
    real_sorted, sim_sorted = np.sort(r), np.sort(s)
    pct = {p: (percentile(real_sorted, p), percentile(sim_sorted, p)) for p in PERCENTILES}
    _put(fields, "median", *pct[50])  # the median is the p50, as in the reference
    for p in PERCENTILES:
        _put(fields, f"p{p}", *pct[p])
    m = mape(r, s)
    pr = pearson_r(r, s)
    mape_value = 0.0 if m is None else m
    request = RequestLevel(mape=mape_value, pearson_r=pr, bias_direction=bias_direction(r, s),
                           quality=quality(mape_value, pr))
    return MetricComparison(workload_level=WorkloadLevel(**fields), request_level=request, count=n)


def _put(fields: dict[str, float], stat: str, real: float, sim: float) -> None:
    """real_X, sim_X, X_error = sim − real, X_percent_error = |error| / real (0 unless real > 0)."""
    error = sim - real
    fields[f"real_{stat}"] = real
    fields[f"sim_{stat}"] = sim
    fields[f"{stat}_error"] = error
    fields[f"{stat}_percent_error"] = abs(error) / real if real > 0 else 0.0


def _check_parallel(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, name: str) -> None:
    if len(a) != len(b):
        raise InputError(f"mismatched vector lengths for {name}: real={len(a)} sim={len(b)}")
