"""Capacity fidelity: the simulated server's throughput against the real one's, over the compared window.

API::

    capacity_comparison(matched_records, tolerance=0.05) -> CapacityComparison | None
    window_throughput(sends_us, completions_us, output_tokens) -> Throughput
    backlog(sends_us, first_tokens_us) -> int       requests still waiting for a first token at the last send
    is_saturated(n, backlog) -> bool
    window_signs(records) -> WindowSigns            the saturation signs of observed records (blis fit's too)

At saturation a request's TTFT is queueing, so a model whose maximum throughput is a few per cent low
predicts an unbounded queue. The comparison runs over the matched requests (warm-up excluded), both
sides from the same start (the first send):

* **observed** throughput: requests and output tokens over ``last completion - first send``, where a
  request's completion is its last chunk;
* **predicted**: the same requests, each completing at its send time plus its *simulated* E2E.

**Saturation** (when throughput is the server's maximum rather than the offered load): the server fell
behind, so requests queued through the window. Any of three signs, each from the observed side
(``saturation_signs``):

* ``backlog``: when the window's last request was sent, the requests sent but still waiting for their first
  token were at least ``SATURATION_BACKLOG`` of the window's requests (and at least ``MIN_BACKLOG``): a
  burst, or an open-loop load past the capacity (the queue grows with every arrival);
* ``sends lag``: the client could not send on schedule (its concurrency slots were held by requests the
  server had not finished), so the queue grew in the client, not the server: the last tenth of the sends
  left, in the median, at least ``LAG_SHARE`` of the scheduled span late (and ``MIN_LAG_US``), relative to
  the least late send. Completions then track the (late) sends, and the backlog rule sees nothing;
* ``waiting``: waiting dominates TTFT: a request's wait is its TTFT above the floor of its prompt class
  (the ``FLOOR_PERCENTILE`` of the TTFTs of prompts of the same power-of-two length), and the median
  request waited ``WAIT_SHARE`` of its TTFT.

A load below the capacity shows none of them, whatever the Poisson bunching (a queue of one or two drains
between arrivals). The window must hold at least ``MIN_REQUESTS`` requests. Only then is there a verdict
(design D9): predicted request throughput *and* output-token throughput each within ``tolerance``
(relative) of the observed, and the E2E MAPE within the TTFT threshold (set by the caller); the TTFT MAPE
is reported, not judged: at saturation it is queueing, which the throughput decides. Below saturation the
throughput follows the arrivals on both sides whatever the model's speed, so it is reported, not judged.
The arrival rate ``(n - 1) / send span`` and the served rate ``n / (last completion - first send)`` are
reported beside it.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from blis_sim.formats.report import CapacityComparison

DEFAULT_CAPACITY_TOLERANCE = 0.05
SATURATION_BACKLOG = 0.10  # of the window's requests, still waiting for a first token at the last send
MIN_BACKLOG = 5
MIN_REQUESTS = 20          # fewer is a few steps, not a throughput
LAG_SHARE = 0.10           # of the scheduled span: how late the last sends left
MIN_LAG_US = 100_000.0     # a client's own jitter stays below this
LAG_TAIL = 0.10            # the share of the last sends whose median lateness is judged
WAIT_SHARE = 0.75          # the median request's wait over its TTFT (TTFT ≥ 4x its class's floor)
FLOOR_PERCENTILE = 5.0     # of a prompt class's TTFTs: its service time without a queue
MIN_CLASS = 5              # a prompt class with fewer requests takes the window's floor


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
    """The backlog rule alone: enough requests, and a backlog that grew with the arrivals."""
    return requests >= MIN_REQUESTS and waiting >= max(MIN_BACKLOG, SATURATION_BACKLOG * requests)


def send_lag_us(scheduled_us: Sequence[float], sends_us: Sequence[float]) -> float:
    """How late the last ``LAG_TAIL`` of the sends left (their median), relative to the least late
    send: the schedule and the sends are on different clocks (offset from the run's start, epoch µs),
    which the least late send's lateness cancels."""
    order = sorted(range(len(sends_us)), key=lambda i: sends_us[i])
    late = [sends_us[i] - scheduled_us[i] for i in order]
    if not late:
        return 0.0
    floor = min(late)
    tail = late[-max(1, math.ceil(LAG_TAIL * len(late))):]
    return statistics.median(tail) - floor


def sends_lag(scheduled_us: Sequence[float], sends_us: Sequence[float]) -> bool:
    span = max(scheduled_us, default=0.0) - min(scheduled_us, default=0.0)
    return send_lag_us(scheduled_us, sends_us) >= max(MIN_LAG_US, LAG_SHARE * span)


def wait_shares(ttft_us: Sequence[float], prompt_tokens: Sequence[int]) -> list[float]:
    """Each request's (TTFT − its prompt class's floor) / TTFT (0 where it has no TTFT)."""
    ok = [(t, p) for t, p in zip(ttft_us, prompt_tokens) if t > 0]
    if not ok:
        return [0.0] * len(ttft_us)
    every = sorted(t for t, _ in ok)
    classes: dict[int, list[float]] = {}
    for t, p in ok:
        classes.setdefault(max(int(p), 1).bit_length(), []).append(t)
    floors = {k: _percentile(sorted(v) if len(v) >= MIN_CLASS else every, FLOOR_PERCENTILE)
              for k, v in classes.items()}
    return [max(0.0, 1.0 - floors[max(int(p), 1).bit_length()] / t) if t > 0 else 0.0
            for t, p in zip(ttft_us, prompt_tokens)]


def waiting_share(ttft_us: Sequence[float], prompt_tokens: Sequence[int]) -> float:
    """The median over requests of (TTFT − its prompt class's floor) / TTFT (0 for no request)."""
    shares = [w for w, t in zip(wait_shares(ttft_us, prompt_tokens), ttft_us) if t > 0]
    return float(statistics.median(shares)) if shares else 0.0


def _percentile(ordered: list[float], q: float) -> float:
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[k]


def saturation_signs(requests: int, waiting: int, lag: bool, share: float) -> list[str]:
    """Which of the module docstring's signs the window shows (none below ``MIN_REQUESTS``)."""
    if requests < MIN_REQUESTS:
        return []
    signs = ["backlog"] if is_saturated(requests, waiting) else []
    if lag:
        signs.append("sends lag")
    if share >= WAIT_SHARE:
        signs.append("waiting")
    return signs


def _rate(count: int, span_s: float) -> float:
    return count / span_s if span_s > 0 else math.inf


def _prompt(rec: Any) -> int:
    """The prompt tokens the server counted, else the ones asked for (0: one class for all)."""
    return int(getattr(rec, "server_input_tokens", 0) or getattr(rec, "input_tokens", 0) or 0)


def _send_us(rec: Any) -> float:
    return float(rec.send_time_us or rec.arrival_time_us)


@dataclass(frozen=True)
class WindowSigns:
    """The observed side's saturation evidence over a window of ``ok`` records."""

    requests: int
    backlog: int
    send_lag_us: float
    waiting_share: float
    signs: list[str]


def _first_us(rec: Any) -> float:
    return float(rec.first_content_time_us or rec.first_chunk_time_us or rec.last_chunk_time_us)


def window_signs(records: Sequence[Any]) -> WindowSigns:
    """The signs of the module docstring from records (``ok``, completed, sent): one rule for
    calibrate's verdict and ``blis fit``'s saturation warning."""
    sends = [_send_us(rec) for rec in records]
    first = [_first_us(rec) for rec in records]
    waiting = backlog(sends, first)
    scheduled = [float(rec.arrival_time_us) for rec in records]
    share = waiting_share([f - s for f, s in zip(first, sends)], [_prompt(rec) for rec in records])
    signs = saturation_signs(len(records), waiting, sends_lag(scheduled, sends), share)
    return WindowSigns(len(records), waiting, send_lag_us(scheduled, sends), share, signs)


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
    seen = window_signs([rec for rec, _ in pairs])
    signs = seen.signs
    saturated = bool(signs)
    arrival = _rate(len(sends) - 1, (max(sends) - min(sends)) / 1e6)
    rps_error = abs(sim.rps - real.rps) / real.rps if real.rps > 0 else math.inf
    tps_error = abs(sim.output_tps - real.output_tps) / real.output_tps if real.output_tps > 0 else math.inf
    within = (rps_error <= tolerance and tps_error <= tolerance) if saturated else None
    return CapacityComparison(
        requests=real.requests, window_s=real.seconds, arrival_rps=arrival if math.isfinite(arrival) else None,
        served_rps=real.rps, backlog=seen.backlog, send_lag_s=seen.send_lag_us / 1e6,
        waiting_share=seen.waiting_share,
        saturation=signs, saturated=saturated, real_rps=real.rps, sim_rps=sim.rps, rps_error=rps_error,
        real_output_tps=real.output_tps, sim_output_tps=sim.output_tps, output_tps_error=tps_error,
        tolerance=tolerance, within=within)
