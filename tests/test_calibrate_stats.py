"""Calibration statistics against hand-computed values (docs/reference-formats.md §5.5, calibrate_test.go)."""
from __future__ import annotations

import math

import pytest

from blis_sim.calibrate.stats import (bias_direction, compute_calibration, mape, mape_pct, pearson_r, percentile,
                                      quality)
from blis_sim.errors import InputError


@pytest.mark.parametrize("values,p,expected", [
    ([1, 2, 3, 4], 90, 3.7),      # rank 0.9·3 = 2.7 → 3 + 0.7·(4 − 3)
    ([1, 2, 3, 4], 50, 2.5),      # rank 1.5
    ([1, 2, 3, 4], 99, 3.97),     # rank 2.97
    ([1, 2, 3, 4, 5], 50, 3.0),   # integral rank: no interpolation
    ([10, 20], 95, 19.5),
    ([7], 99, 7.0),               # n == 1 → s[0]
    ([], 50, 0.0),
])
def test_percentile_linear_interpolation(values: list[float], p: float, expected: float) -> None:
    assert percentile(values, p) == pytest.approx(expected, rel=1e-12)


def test_mape_and_bias_reference_cases() -> None:
    assert mape([100, 200, 300], [110, 220, 330]) == pytest.approx(0.10)
    assert bias_direction([100, 200, 300], [110, 220, 330]) == "over-predict"
    # real == 0 pairs are skipped: (20/200 + 30/300) / 2
    assert mape([0, 200, 300], [10, 220, 330]) == pytest.approx(0.10)
    # |50−100|/100 = 0.5 and |300−200|/200 = 0.5; Σ(sim − real) = −50 + 100 > 0
    assert mape([100, 200], [50, 300]) == pytest.approx(0.5)
    assert bias_direction([100, 200], [50, 300]) == "over-predict"
    assert bias_direction([100, 200], [90, 190]) == "under-predict"
    assert bias_direction([100, 200], [50, 250]) == "neutral"
    assert mape([0, 0], [1, 2]) is None and bias_direction([0, 0], [1, 2]) == ""


def test_mape_length_mismatch_is_an_error() -> None:
    with pytest.raises(InputError, match="mismatched vector lengths"):
        mape([1, 2], [1])


def test_mape_pct_skips_nan_and_inf() -> None:
    # only the (100, 150) pair qualifies: 0.5
    assert mape_pct([100, math.nan, math.inf, 0, 200], [150, 1, 1, 5, math.inf]) == pytest.approx(0.5)
    assert mape_pct([], []) == 0.0


def test_pearson_hand_computed() -> None:
    # Σx=6 Σy=13 Σxy=31 Σx²=14 Σy²=69: (3·31 − 6·13) / sqrt((3·14 − 36)(3·69 − 169)) = 15 / sqrt(228)
    assert pearson_r([1, 2, 3], [2, 4, 7]) == pytest.approx(15 / math.sqrt(228), rel=1e-12)
    assert pearson_r([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson_r([1, 2], [1, 2]) == 0.0           # n < 3
    assert pearson_r([5, 5, 5], [1, 2, 3]) == 0.0     # zero variance → 0, not NaN


@pytest.mark.parametrize("m,r,expected", [
    (0.05, 0.96, "excellent"),
    (0.05, 0.95, "good"),        # r must be strictly above 0.95
    (0.10, 0.99, "good"),        # MAPE must be strictly below 0.10
    (0.19, 0.86, "good"),
    (0.20, 0.99, "fair"),
    (0.34, 0.71, "fair"),
    (0.35, 0.99, "poor"),
    (0.0, 0.0, "poor"),          # n < 3 gives r = 0: always poor
])
def test_quality_bands(m: float, r: float, expected: str) -> None:
    assert quality(m, r) == expected


def test_compute_calibration_perfect_match() -> None:
    c = compute_calibration([100, 200, 300], [100, 200, 300], "ttft")
    assert c.count == 3
    assert c.request_level.mape == 0 and c.request_level.pearson_r == pytest.approx(1.0)
    assert c.request_level.quality == "excellent" and c.request_level.bias_direction == "neutral"


def test_compute_calibration_workload_level_hand_computed() -> None:
    c = compute_calibration([100, 200, 300, 400], [110, 190, 330, 500], "e2e")
    w = c.workload_level
    assert (w.real_mean, w.sim_mean, w.mean_error) == (250, 282.5, 32.5)
    assert w.mean_percent_error == pytest.approx(32.5 / 250)
    assert w.real_median == w.real_p50 == 250 and w.sim_median == w.sim_p50 == 260   # sorted sim 110,190,330,500
    assert w.real_p90 == pytest.approx(370) and w.sim_p90 == pytest.approx(449)      # rank 2.7: 330 + 0.7·170
    assert w.p90_error == pytest.approx(79) and w.p90_percent_error == pytest.approx(79 / 370)
    # (0.1 + 0.05 + 0.1 + 0.25) / 4
    assert c.request_level.mape == pytest.approx(0.125)
    assert c.request_level.bias_direction == "over-predict"


def test_percent_errors_guarded_when_real_is_zero() -> None:
    c = compute_calibration([0, 0, 0], [10, 20, 30], "ttft")
    w = c.workload_level
    assert w.mean_error == 20 and w.mean_percent_error == 0
    assert w.p99_error == pytest.approx(29.8) and w.p99_percent_error == 0
    assert c.request_level.mape == 0 and c.request_level.bias_direction == "" and c.request_level.quality == "poor"


def test_compute_calibration_rejects_empty_and_unequal() -> None:
    with pytest.raises(InputError, match="empty latency vectors for ttft"):
        compute_calibration([], [], "ttft")
    with pytest.raises(InputError, match="real=2 sim=1"):
        compute_calibration([1, 2], [1], "e2e")


def test_metric_comparison_has_exactly_three_keys() -> None:
    c = compute_calibration([1, 2, 3], [1, 2, 3], "ttft")
    assert list(c.model_dump()) == ["workload_level", "request_level", "count"]
