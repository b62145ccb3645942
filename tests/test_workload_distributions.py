"""Length and arrival samplers: moments against parameters (seeded, generous tolerances), clamping, rounding."""
from __future__ import annotations

import math
import random
import statistics

from pathlib import Path

import pytest
import yaml

from blis_sim.errors import InputError
from blis_sim.formats.workload import ArrivalSpec, DistSpec, parse_workload_spec
from blis_sim.workload.arrivals import arrival_sampler, weibull_shape_from_cv
from blis_sim.workload.distributions import go_round, length_sampler

N = 20_000
REPO = Path(__file__).resolve().parents[1]


def draws(dist: DistSpec, n: int = N, seed: int = 1, floor: int = 1) -> list[int]:
    s, rng = length_sampler(dist, floor=floor), random.Random(seed)
    return [s.sample(rng) for _ in range(n)]


def iats(arrival: ArrivalSpec, rate_per_s: float, n: int = N, seed: int = 2) -> list[int]:
    s, rng = arrival_sampler(arrival, rate_per_s / 1e6), random.Random(seed)
    return [s.sample(rng) for _ in range(n)]


def cv(xs: list[int]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs)


def test_go_round_is_half_away_from_zero() -> None:
    assert [go_round(x) for x in (0.5, 1.5, 2.5, -0.5, -2.5, 2.4999)] == [1, 2, 3, -1, -3, 2]


def test_gaussian_moments() -> None:
    xs = draws(DistSpec(type="gaussian", params={"mean": 256, "std_dev": 64, "min": 32, "max": 1024}))
    assert statistics.fmean(xs) == pytest.approx(256, abs=2.5)
    assert statistics.pstdev(xs) == pytest.approx(64, abs=2.0)
    assert all(32 <= x <= 1024 for x in xs)


def test_gaussian_is_clamped_then_rounded() -> None:
    xs = draws(DistSpec(type="gaussian", params={"mean": 110, "std_dev": 50, "min": 100, "max": 120}))
    assert min(xs) == 100 and max(xs) == 120
    at_bounds = sum(1 for x in xs if x in (100, 120)) / len(xs)
    assert at_bounds == pytest.approx(2 * (1 - statistics.NormalDist().cdf(0.2)), abs=0.02)  # P(|Z| > 0.2)


def test_gaussian_min_equals_max_is_constant_and_floor_is_one() -> None:
    assert set(draws(DistSpec(type="gaussian", params={"mean": 5, "std_dev": 9, "min": 42, "max": 42}), 100)) == {42}
    xs = draws(DistSpec(type="gaussian", params={"mean": -50, "std_dev": 1, "min": -100, "max": 100}), 100)
    assert set(xs) == {1}


def test_exponential_moments_and_clamp() -> None:
    xs = draws(DistSpec(type="exponential", params={"mean": 64}))
    assert statistics.fmean(xs) == pytest.approx(64, rel=0.03)
    assert cv(xs) == pytest.approx(1.0, abs=0.05)
    ys = draws(DistSpec(type="exponential", params={"mean": 64, "min": 10, "max": 100}))
    assert min(ys) == 10 and max(ys) == 100
    assert sum(1 for y in ys if y == 100) / len(ys) == pytest.approx(math.exp(-100.5 / 64), abs=0.015)


def test_lognormal_moments() -> None:
    xs = draws(DistSpec(type="lognormal", params={"mu": 5, "sigma": 0.5}))
    assert statistics.fmean(xs) == pytest.approx(math.exp(5 + 0.125), rel=0.02)
    assert statistics.median(xs) == pytest.approx(math.exp(5), rel=0.03)
    ys = draws(DistSpec(type="lognormal", params={"mu": 5, "sigma": 2, "min": 20, "max": 400}))
    assert min(ys) == 20 and max(ys) == 400


def test_pareto_lognormal_mixture_mean() -> None:
    p = {"alpha": 3, "xm": 100, "mu": 5, "sigma": 0.5, "mix_weight": 0.3}
    xs = draws(DistSpec(type="pareto_lognormal", params=p), n=60_000)
    expected = 0.3 * 3 * 100 / (3 - 1) + 0.7 * math.exp(5 + 0.125)
    assert statistics.fmean(xs) == pytest.approx(expected, rel=0.03)
    pareto_only = draws(DistSpec(type="pareto_lognormal", params={**p, "mix_weight": 1.0}), n=5000)
    assert min(pareto_only) >= 100


def test_constant_and_empirical() -> None:
    assert set(draws(DistSpec(type="constant", params={"value": 128}), 50)) == {128}
    assert set(draws(DistSpec(type="constant", params={"value": 0}), 50)) == {1}
    assert set(draws(DistSpec(type="constant", params={"value": 0}), 50, floor=0)) == {0}
    xs = draws(DistSpec(type="empirical", params={"10": 1, "20": 3, "30": 0}))
    assert set(xs) == {10, 20}
    assert xs.count(10) / len(xs) == pytest.approx(0.25, abs=0.015)


def test_samplers_are_deterministic_for_a_seed() -> None:
    d = DistSpec(type="gaussian", params={"mean": 256, "std_dev": 64, "min": 32, "max": 1024})
    assert draws(d, 100, seed=5) == draws(d, 100, seed=5) != draws(d, 100, seed=6)


# --- arrivals ------------------------------------------------------------------------------------------------

def test_poisson_iat_mean_and_cv() -> None:
    xs = iats(ArrivalSpec(process="poisson"), rate_per_s=10)
    assert statistics.fmean(xs) == pytest.approx(100_000, rel=0.03)
    assert cv(xs) == pytest.approx(1.0, abs=0.04)


def test_constant_iat() -> None:
    assert set(iats(ArrivalSpec(process="constant"), rate_per_s=3, n=10)) == {333_333}


@pytest.mark.parametrize("target_cv", [0.5, 2.0])
def test_gamma_iat_mean_and_cv(target_cv: float) -> None:
    xs = iats(ArrivalSpec(process="gamma", cv=target_cv), rate_per_s=5, n=60_000)
    assert statistics.fmean(xs) == pytest.approx(200_000, rel=0.04)
    assert cv(xs) == pytest.approx(target_cv, rel=0.08)


@pytest.mark.parametrize("target_cv", [0.5, 1.5])
def test_weibull_iat_mean_and_cv(target_cv: float) -> None:
    xs = iats(ArrivalSpec(process="weibull", cv=target_cv), rate_per_s=5, n=60_000)
    assert statistics.fmean(xs) == pytest.approx(200_000, rel=0.04)
    assert cv(xs) == pytest.approx(target_cv, rel=0.08)


def test_weibull_shape_from_cv() -> None:
    assert weibull_shape_from_cv(1.0) == pytest.approx(1.0, abs=0.01)  # k = 1 is the exponential


def test_explicit_shape_scale_override_rate() -> None:
    xs = iats(ArrivalSpec(process="gamma", shape=4, scale=1000, cv=3), rate_per_s=1000)
    assert statistics.fmean(xs) == pytest.approx(4000, rel=0.03)
    ys = iats(ArrivalSpec(process="weibull", shape=1, scale=5000), rate_per_s=1000)
    assert statistics.fmean(ys) == pytest.approx(5000, rel=0.03)


def test_iats_are_at_least_one_microsecond() -> None:
    assert min(iats(ArrivalSpec(process="poisson"), rate_per_s=1e7, n=2000)) == 1


def test_a_mean_near_the_float_maximum_is_refused_not_an_overflow() -> None:
    """Hypothesis found an exponential mean of 9.3e307: the sampler overflowed (OverflowError) or gave lengths of
    10**307 tokens. A token-valued parameter beyond the request maximum is a located input error; the sampler's
    overflow gives the floor (its min when set), as a lognormal's does."""
    text = (REPO / "samples/blis/workload.yaml").read_text()
    spec = yaml.safe_load(text)
    spec["clients"][0]["input_distribution"] = {"type": "exponential", "params": {"mean": 9.3e307}}
    with pytest.raises(InputError, match=r"w\.yaml.*input_distribution\.params\.mean.*at most 16777216 tokens"):
        parse_workload_spec(yaml.safe_dump(spec), "w.yaml")


    class Overflowing(random.Random):
        def expovariate(self, lambd: float) -> float:
            return 2.0  # x 1.7e308 is inf

    assert length_sampler(DistSpec(type="exponential", params={"mean": 1.7e308, "min": 7}), floor=1
                          ).sample(Overflowing()) == 7
    assert length_sampler(DistSpec(type="exponential", params={"mean": 1.7e308}), floor=1).sample(Overflowing()) == 1
