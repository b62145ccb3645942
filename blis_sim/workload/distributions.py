"""Token-length samplers built from a spec ``DistSpec``, with the reference's clamping and rounding.

API: ``sampler = length_sampler(dist)``; ``sampler.sample(rng) -> int`` with ``rng`` a ``random.Random``.

Semantics (the reference's ``sim/workload/distribution.go``):

* ``gaussian{mean, std_dev, min, max}``: ``min == max`` gives ``min``; else N(mean, std_dev) clamped to
  [min, max], then rounded half away from zero; at least 1. min/max are truncated to integers first.
* ``exponential{mean[, min, max]}``: Exp(mean) rounded, then clamped to min/max where they are > 0; at least 1.
* ``lognormal{mu, sigma[, min, max]}``: exp(mu + sigma·Z) rounded, clamped like exponential; an overflow gives
  ``min`` (or 1); at least 1.
* ``pareto_lognormal{alpha, xm, mu, sigma, mix_weight}``: with probability mix_weight Pareto(xm / U^(1/alpha)),
  else lognormal(mu, sigma); rounded; an overflow gives 1; at least 1.
* ``constant{value}``: ``int(value)``, at least 1.
* ``empirical{"<tokens>": p, ...}``: inverse CDF over the normalised bins (zero-probability bins dropped).

``floor`` (default 1) is the minimum returned value; the reasoning ratio uses 0 so that a constant 0 % stays 0
(the reference floors it to 1 %).
"""
from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from typing import Protocol

from blis_sim.formats.workload import DistSpec

__all__ = ["LengthSampler", "length_sampler", "go_round"]


def go_round(x: float) -> int:
    """Go's math.Round (half away from zero), unlike Python's banker's rounding."""
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


class LengthSampler(Protocol):
    def sample(self, rng: random.Random) -> int: ...


@dataclass(frozen=True)
class _Gaussian:
    mean: float
    std_dev: float
    lo: int
    hi: int
    floor: int

    def sample(self, rng: random.Random) -> int:
        if self.lo == self.hi:
            return max(self.lo, self.floor)
        v = min(float(self.hi), max(float(self.lo), rng.gauss(self.mean, self.std_dev)))
        return max(go_round(v), self.floor)


def _clamp(v: int, lo: int, hi: int, floor: int) -> int:
    if lo > 0 and v < lo:
        v = lo
    if hi > 0 and v > hi:
        v = hi
    return max(v, floor)


@dataclass(frozen=True)
class _Exponential:
    mean: float
    lo: int
    hi: int
    floor: int

    def sample(self, rng: random.Random) -> int:
        v = rng.expovariate(1.0) * self.mean
        if math.isinf(v):  # a mean near the float maximum overflows: as the lognormal's overflow
            return max(self.lo, self.floor) if self.lo > 0 else max(1, self.floor)
        return _clamp(go_round(v), self.lo, self.hi, self.floor)


@dataclass(frozen=True)
class _Lognormal:
    mu: float
    sigma: float
    lo: int
    hi: int
    floor: int

    def sample(self, rng: random.Random) -> int:
        try:
            v = math.exp(self.mu + self.sigma * rng.gauss(0.0, 1.0))
        except OverflowError:
            return max(self.lo, self.floor) if self.lo > 0 else max(1, self.floor)
        return _clamp(go_round(v), self.lo, self.hi, self.floor)


@dataclass(frozen=True)
class _ParetoLognormal:
    alpha: float
    xm: float
    mu: float
    sigma: float
    mix_weight: float
    floor: int

    def sample(self, rng: random.Random) -> int:
        try:
            if rng.random() < self.mix_weight:
                u = rng.random() or 5e-324  # avoid division by zero, as the reference does
                v = self.xm / u ** (1.0 / self.alpha)
            else:
                v = math.exp(self.mu + self.sigma * rng.gauss(0.0, 1.0))
        except (OverflowError, ZeroDivisionError):
            return max(1, self.floor)
        if math.isinf(v) or math.isnan(v):
            return max(1, self.floor)
        return max(go_round(v), self.floor)


@dataclass(frozen=True)
class _Constant:
    value: int

    def sample(self, rng: random.Random) -> int:
        return self.value


@dataclass(frozen=True)
class _Empirical:
    values: tuple[int, ...]
    cdf: tuple[float, ...]

    def sample(self, rng: random.Random) -> int:
        if len(self.values) == 1:
            return self.values[0]
        i = bisect.bisect_left(self.cdf, rng.random())
        return self.values[min(i, len(self.values) - 1)]


def length_sampler(dist: DistSpec, floor: int = 1) -> LengthSampler:
    """Build the sampler of a validated DistSpec (see the module docstring for each type)."""
    p = dist.params
    t = dist.type
    if t == "gaussian":
        return _Gaussian(p["mean"], p["std_dev"], int(p["min"]), int(p["max"]), floor)
    if t == "exponential":
        return _Exponential(p["mean"], int(p.get("min", 0)), int(p.get("max", 0)), floor)
    if t == "lognormal":
        return _Lognormal(p["mu"], p["sigma"], int(p.get("min", 0)), int(p.get("max", 0)), floor)
    if t == "pareto_lognormal":
        return _ParetoLognormal(p["alpha"], p["xm"], p["mu"], p["sigma"], p["mix_weight"], floor)
    if t == "constant":
        return _Constant(max(int(p["value"]), floor))
    if t == "empirical":
        bins = sorted((int(k), v) for k, v in p.items() if v > 0)
        total = sum(v for _, v in bins)
        cdf, acc = [], 0.0
        for _, v in bins:
            acc += v / total
            cdf.append(acc)
        cdf[-1] = 1.0
        return _Empirical(tuple(k for k, _ in bins), tuple(cdf))
    raise ValueError(f"unknown distribution type {t!r}")  # unreachable for a validated spec
