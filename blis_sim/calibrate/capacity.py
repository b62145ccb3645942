"""Capacity fidelity: the simulated server's throughput against the real one's, over the compared window.

API::

    capacity_comparison(matched_records, tolerance=0.05) -> CapacityComparison | None
    window_throughput(sends_us, completions_us, output_tokens) -> Throughput
    backlog(sends_us, first_tokens_us) -> int       requests still waiting for a first token at the last send
    is_saturated(n, backlog) -> bool

At saturation a request's TTFT is queueing, so a model whose maximum throughput is a few per cent low
predicts an unbounded queue. The comparison runs over the matched requests (warm-up excluded), both
sides from the same start (the first send):

* **observed** throughput: requests and output tokens over ``last completion - first send``, where a
  request's completion is its last chunk;
* **predicted**: the same requests, each completing at its send time plus its *simulated* E2E.

**Saturation** (when throughput is the server's maximum rather than the offered load): the server fell
behind the arrivals, so requests queued through the window. When the window's last request was sent, its
*backlog* (requests sent but still waiting for their first token) was at least ``SATURATION_BACKLOG`` of
the window's requests (and at least ``MIN_BACKLOG``), and the window holds at least ``MIN_REQUESTS``
requests. A burst is saturated (every request waits); an open-loop load past the capacity is (the queue
grows with every arrival); a load below it is not, whatever the Poisson bunching (a queue of one or two
drains between arrivals). Only then is there a verdict: predicted request throughput *and* output-token
throughput each within ``tolerance`` (relative) of the observed. Below saturation the throughput follows
the arrivals on both sides whatever the model's speed, so it is reported, not judged. The arrival rate
``(n - 1) / send span`` and the served rate ``n / (last completion - first send)`` are reported beside it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from blis_sim.formats.report import CapacityComparison

DEFAULT_CAPACITY_TOLERANCE = 0.05
SATURATION_BACKLOG = 0.10  # of the window's requests, still waiting for a first token at the last send
MIN_BACKLOG = 5
MIN_REQUESTS = 20          # fewer is a few steps, not a throughput


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


def backlog(sends_us: Sequence[float], first_tokens_us: Sequence[float]) -> int:
    """Requests sent but still waiting for their first token when the last one was sent."""
    last = max(sends_us, default=0.0)
    return sum(1 for first in first_tokens_us if first > last)


def is_saturated(requests: int, waiting: int) -> bool:
    """The module docstring's rule: enough requests, and a backlog that grew with the arrivals."""
    return requests >= MIN_REQUESTS and waiting >= max(MIN_BACKLOG, SATURATION_BACKLOG * requests)


def _rate(count: int, span_s: float) -> float:
    return count / span_s if span_s > 0 else math.inf


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
    first = [float(rec.first_content_time_us or rec.first_chunk_time_us or rec.last_chunk_time_us)
             for rec, _ in pairs]
    waiting = backlog(sends, first)
    saturated = is_saturated(len(pairs), waiting)
    arrival = _rate(len(sends) - 1, (max(sends) - min(sends)) / 1e6)
    rps_error = abs(sim.rps - real.rps) / real.rps if real.rps > 0 else math.inf
    tps_error = abs(sim.output_tps - real.output_tps) / real.output_tps if real.output_tps > 0 else math.inf
    within = (rps_error <= tolerance and tps_error <= tolerance) if saturated else None
    return CapacityComparison(
        requests=real.requests, window_s=real.seconds, arrival_rps=arrival if math.isfinite(arrival) else None,
        served_rps=real.rps, backlog=waiting, saturated=saturated, real_rps=real.rps, sim_rps=sim.rps,
        rps_error=rps_error,
        real_output_tps=real.output_tps, sim_output_tps=sim.output_tps, output_tps_error=tps_error,
        tolerance=tolerance, within=within)
