"""Capacity fidelity: the simulated server's throughput against the real one's, over the compared window.

API::

    capacity_comparison(matched_records, tolerance=0.05) -> CapacityComparison | None
    window_throughput(sends_us, completions_us, output_tokens) -> Throughput
    is_saturated(sends_us, completions_us) -> (saturated, arrival_rps, served_rps)

At saturation a request's TTFT is queueing, so a model whose maximum throughput is a few per cent low
predicts an unbounded queue. The comparison runs over the matched requests (warm-up excluded), both
sides from the same start (the first send):

* **observed** throughput: requests and output tokens over ``last completion - first send``, where a
  request's completion is its last chunk;
* **predicted**: the same requests, each completing at its send time plus its *simulated* E2E.

**Saturation** (when throughput is the server's maximum rather than the offered load): the requests
arrived faster than the server served them, so a queue grew through the window. The arrival rate is
``(n - 1) / (last send - first send)`` (infinite for a burst), the served rate ``n / (last completion -
first send)``; the window is saturated when arrival >= ``SATURATION_RATIO`` x served and it holds at
least ``MIN_REQUESTS`` requests. Only then is there a verdict: predicted request throughput *and*
output-token throughput each within ``tolerance`` (relative) of the observed. Below saturation the
throughput follows the arrivals on both sides whatever the model's speed, so it is reported, not judged.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from blis_sim.formats.report import CapacityComparison

DEFAULT_CAPACITY_TOLERANCE = 0.05
SATURATION_RATIO = 1.1   # arrivals at least 10 % faster than completions: the queue grew
MIN_REQUESTS = 20        # fewer is a few steps, not a throughput


@dataclass(frozen=True)
class Throughput:
    requests: int
    output_tokens: int
    seconds: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else math.nan

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else math.nan


def window_throughput(sends_us: Sequence[float], completions_us: Sequence[float],
                      output_tokens: Sequence[int]) -> Throughput:
    """Requests and output tokens over ``last completion - first send``."""
    if not sends_us:
        return Throughput(0, 0, 0.0)
    return Throughput(len(sends_us), int(sum(output_tokens)), (max(completions_us) - min(sends_us)) / 1e6)


def is_saturated(sends_us: Sequence[float], completions_us: Sequence[float]) -> tuple[bool, float, float]:
    """(saturated, arrival rate, served rate), rates in requests/s (see the module docstring)."""
    n = len(sends_us)
    if n < 2:
        return False, math.nan, math.nan
    send_span = (max(sends_us) - min(sends_us)) / 1e6
    arrival = (n - 1) / send_span if send_span > 0 else math.inf
    served = window_throughput(sends_us, completions_us, [0] * n).rps
    return (n >= MIN_REQUESTS and arrival >= SATURATION_RATIO * served), arrival, served


def _send_us(rec: Any) -> float:
    return float(rec.send_time_us or rec.arrival_time_us)


def capacity_comparison(matched_records: Sequence[tuple[Any, Any]],
                        tolerance: float = DEFAULT_CAPACITY_TOLERANCE) -> CapacityComparison | None:
    """Observed against predicted throughput over the matched ``ok`` requests; None when fewer than two."""
    pairs = [(rec, sr) for rec, sr in matched_records
             if rec.status == "ok" and rec.last_chunk_time_us > 0 and _send_us(rec) > 0]
    if len(pairs) < 2:
        return None
    sends = [_send_us(rec) for rec, _ in pairs]
    real_done = [float(rec.last_chunk_time_us) for rec, _ in pairs]
    sim_done = [s + float(sr.e2e_us) for s, (_, sr) in zip(sends, pairs)]
    real = window_throughput(sends, real_done, [rec.output_tokens for rec, _ in pairs])
    sim = window_throughput(sends, sim_done, [sr.output_tokens for _, sr in pairs])
    saturated, arrival, served = is_saturated(sends, real_done)
    rps_error = abs(sim.rps - real.rps) / real.rps if real.rps > 0 else math.inf
    tps_error = abs(sim.output_tps - real.output_tps) / real.output_tps if real.output_tps > 0 else math.inf
    within = (rps_error <= tolerance and tps_error <= tolerance) if saturated else None
    return CapacityComparison(
        requests=real.requests, window_s=real.seconds, arrival_rps=arrival if math.isfinite(arrival) else None, served_rps=served,
        saturated=saturated, real_rps=real.rps, sim_rps=sim.rps, rps_error=rps_error,
        real_output_tps=real.output_tps, sim_output_tps=sim.output_tps, output_tps_error=tps_error,
        tolerance=tolerance, within=within)
