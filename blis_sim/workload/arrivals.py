"""Inter-arrival-time samplers (µs) built from a spec ``ArrivalSpec`` and a client rate.

API: ``sampler = arrival_sampler(arrival, rate_per_us)``; ``sampler.sample(rng) -> int`` (µs, at least 1).

Semantics (the reference's ``sim/workload/arrival.go``): the rate is floored at 1e-15 req/µs.

* ``poisson``: ``int(Exp(1) / rate)``, at least 1.
* ``constant``: ``int(1 / rate)``, at least 1, every time.
* ``gamma``: shape/scale given explicitly (both > 0) win and ignore the rate; else ``cv`` (default 1):
  shape = 1/cv², scale = cv²/rate (mean 1/rate); a shape under 0.01 falls back to poisson.
* ``weibull``: explicit shape/scale win; else k solves CV(k) = cv by bisection on [0.1, 100] and
  scale = (1/rate) / Γ(1 + 1/k).

Truncation to whole µs makes the mean inter-arrival time about 0.5 µs shorter than 1/rate.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Protocol

from blis_sim.formats.workload import ArrivalSpec

__all__ = ["ArrivalSampler", "arrival_sampler", "weibull_shape_from_cv"]


class ArrivalSampler(Protocol):
    def sample(self, rng: random.Random) -> int: ...


@dataclass(frozen=True)
class _Poisson:
    rate: float

    def sample(self, rng: random.Random) -> int:
        return max(1, int(rng.expovariate(1.0) / self.rate))


@dataclass(frozen=True)
class _Constant:
    iat: int

    def sample(self, rng: random.Random) -> int:
        return self.iat


@dataclass(frozen=True)
class _Gamma:
    shape: float
    scale: float

    def sample(self, rng: random.Random) -> int:
        return max(1, int(rng.gammavariate(self.shape, self.scale)))


@dataclass(frozen=True)
class _Weibull:
    shape: float
    scale: float

    def sample(self, rng: random.Random) -> int:
        u = rng.random() or 5e-324
        return max(1, int(self.scale * (-math.log(u)) ** (1.0 / self.shape)))


def _weibull_cv(k: float) -> float:
    g1 = math.gamma(1.0 + 1.0 / k)
    return math.sqrt(math.gamma(1.0 + 2.0 / k) / (g1 * g1) - 1.0)


def weibull_shape_from_cv(cv: float) -> float:
    """The Weibull shape k whose coefficient of variation is ``cv`` (CV decreases in k)."""
    lo, hi = 0.1, 100.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        c = _weibull_cv(mid)
        if abs(c - cv) < 0.001:
            return mid
        if c > cv:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def arrival_sampler(arrival: ArrivalSpec, rate_per_us: float) -> ArrivalSampler:
    rate = max(rate_per_us, 1e-15)
    explicit = arrival.shape is not None and arrival.scale is not None and arrival.shape > 0 and arrival.scale > 0
    cv = arrival.cv if arrival.cv is not None and arrival.cv > 0 else 1.0
    if arrival.process == "constant":
        return _Constant(max(1, int(1.0 / rate)))
    if arrival.process == "gamma":
        if explicit:
            return _Gamma(arrival.shape, arrival.scale)  # type: ignore[arg-type]
        shape = 1.0 / (cv * cv)
        if shape < 0.01:
            return _Poisson(rate)
        return _Gamma(shape, cv * cv / rate)
    if arrival.process == "weibull":
        if explicit:
            return _Weibull(arrival.shape, arrival.scale)  # type: ignore[arg-type]
        k = weibull_shape_from_cv(cv)
        return _Weibull(k, (1.0 / rate) / math.gamma(1.0 + 1.0 / k))
    return _Poisson(rate)
