"""Capacity fidelity: the simulated server's throughput against the real one's, over the compared window.

API::

    capacity_comparison(real, sim, rows, sim_rows, tolerance=0.05) -> CapacityComparison | None
        real: the trace's TraceColumns, sim: a SimTable; rows / sim_rows: the matched pairs (pairing)
    window_throughput(sends_us, completions_us, output_tokens) -> Throughput
    backlog(sends_us, first_tokens_us) -> int       requests still waiting for a first token at the last send
    is_saturated(n, backlog) -> bool
    window_signs(records) -> WindowSigns            the saturation signs of observed records (blis fit's too)
    signs_of(sends_us, first_tokens_us, scheduled_us, prompt_tokens) -> WindowSigns   the same, of arrays
    wait_shares(ttft_us, prompt_tokens) -> array    each request's waiting share of its TTFT

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

import numpy as np

from blis_sim.calibrate.table import SimTable
from blis_sim.formats.report import CapacityComparison
from blis_sim.formats.trace_columns import TraceColumns

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


def window_throughput(sends_us: Sequence[float] | np.ndarray, completions_us: Sequence[float] | np.ndarray,
                      output_tokens: Sequence[int] | np.ndarray) -> Throughput:
    """Requests and output tokens over ``last completion - first send``."""
    if not len(sends_us):
        return Throughput(0, 0, 0.0)
    return Throughput(len(sends_us), int(np.sum(output_tokens, dtype=np.int64)),
                      (float(np.max(completions_us)) - float(np.min(sends_us))) / 1e6)


def backlog(sends_us: Sequence[float] | np.ndarray, first_tokens_us: Sequence[float] | np.ndarray) -> int:
    """Requests sent but still waiting for their first token when the last one was sent."""
    last = float(np.max(sends_us)) if len(sends_us) else 0.0
    return int((np.asarray(first_tokens_us, dtype=np.float64) > last).sum())


def is_saturated(requests: int, waiting: int) -> bool:
    """The backlog rule alone: enough requests, and a backlog that grew with the arrivals."""
    return requests >= MIN_REQUESTS and waiting >= max(MIN_BACKLOG, SATURATION_BACKLOG * requests)


def send_lag_us(scheduled_us: Sequence[float] | np.ndarray, sends_us: Sequence[float] | np.ndarray) -> float:
    """How late the last ``LAG_TAIL`` of the sends left (their median), relative to the least late
    send: the schedule and the sends are on different clocks (offset from the run's start, epoch µs),
    which the least late send's lateness cancels."""
    sends = np.asarray(sends_us, dtype=np.float64)
    if not sends.size:
        return 0.0
    order = np.argsort(sends, kind="stable")
    late = sends[order] - np.asarray(scheduled_us, dtype=np.float64)[order]
    floor = float(late.min())
    tail = late[-max(1, math.ceil(LAG_TAIL * late.size)):]
    return statistics.median(tail.tolist()) - floor


def sends_lag(scheduled_us: Sequence[float] | np.ndarray, sends_us: Sequence[float] | np.ndarray) -> bool:
    scheduled = np.asarray(scheduled_us, dtype=np.float64)
    span = float(scheduled.max()) - float(scheduled.min()) if scheduled.size else 0.0
    return send_lag_us(scheduled, sends_us) >= max(MIN_LAG_US, LAG_SHARE * span)


def _prompt_class(prompt_tokens: np.ndarray) -> np.ndarray:
    """``max(p, 1).bit_length()`` of every prompt length."""
    p = np.maximum(prompt_tokens.astype(np.int64), 1).astype(np.float64)  # exact below 2**53
    return np.frexp(p)[1].astype(np.int64)  # p = m · 2**e with m in [0.5, 1): e is its bit length


def wait_shares(ttft_us: Sequence[float] | np.ndarray, prompt_tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """Each request's (TTFT − its prompt class's floor) / TTFT (0 where it has no TTFT)."""
    t_all = np.asarray(ttft_us, dtype=np.float64)
    out = np.zeros(t_all.size)
    keep = t_all > 0
    if not keep.any():
        return out
    t = t_all[keep]
    cls = _prompt_class(np.asarray(prompt_tokens)[keep])
    every = np.sort(t)
    floor_of = np.empty_like(t)
    for k in dict.fromkeys(cls.tolist()):
        mine = cls == k
        v = t[mine]
        floor_of[mine] = _percentile(np.sort(v) if v.size >= MIN_CLASS else every, FLOOR_PERCENTILE)
    out[keep] = np.maximum(0.0, 1.0 - floor_of / t)
    return out


def waiting_share(ttft_us: Sequence[float] | np.ndarray, prompt_tokens: Sequence[int] | np.ndarray) -> float:
    """The median over requests of (TTFT − its prompt class's floor) / TTFT (0 for no request)."""
    t = np.asarray(ttft_us, dtype=np.float64)
    shares = wait_shares(t, prompt_tokens)[t > 0]
    return float(statistics.median(shares.tolist())) if shares.size else 0.0


def _percentile(ordered: np.ndarray, q: float) -> float:
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return float(ordered[k])


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


@dataclass(frozen=True)
class WindowSigns:
    """The observed side's saturation evidence over a window of ``ok`` records."""

    requests: int
    backlog: int
    send_lag_us: float
    waiting_share: float
    signs: list[str]


def signs_of(sends_us: np.ndarray, first_tokens_us: np.ndarray, scheduled_us: np.ndarray,
             prompt_tokens: np.ndarray) -> WindowSigns:
    """The signs of the module docstring, from each request's send, first token, scheduled send
    and prompt length: one rule for calibrate's verdict and ``blis fit``'s saturation warning."""
    waiting = backlog(sends_us, first_tokens_us)
    share = waiting_share(first_tokens_us - sends_us, prompt_tokens)
    signs = saturation_signs(int(sends_us.size), waiting, sends_lag(scheduled_us, sends_us), share)
    return WindowSigns(int(sends_us.size), waiting, send_lag_us(scheduled_us, sends_us), share, signs)


def window_signs(records: Sequence[Any]) -> WindowSigns:
    """:func:`signs_of` records (``ok``, completed, sent)."""
    def col(values: Any) -> np.ndarray:
        return np.asarray(list(values), dtype=np.float64)

    return signs_of(col(float(r.send_time_us or r.arrival_time_us) for r in records),
                    col(float(r.first_content_time_us or r.first_chunk_time_us or r.last_chunk_time_us)
                        for r in records),
                    col(float(r.arrival_time_us) for r in records),
                    np.asarray([int(getattr(r, "server_input_tokens", 0) or getattr(r, "input_tokens", 0) or 0)
                                for r in records], dtype=np.int64))


def capacity_comparison(real: TraceColumns, sim: SimTable, rows: np.ndarray, sim_rows: np.ndarray,
                        tolerance: float = DEFAULT_CAPACITY_TOLERANCE) -> CapacityComparison | None:
    """Observed against predicted throughput over the matched ``ok`` requests (trace rows ``rows``,
    paired with sim rows ``sim_rows``); None when fewer than two."""
    send_all = real.array("send_time_us")[rows]
    send_all = np.where(send_all != 0, send_all, real.array("arrival_time_us")[rows])
    last_all = real.array("last_chunk_time_us")[rows]
    status = real.strings("status")
    ok_code = status.names.index("ok") if "ok" in status.names else -1
    keep = (status.codes[rows] == ok_code) & (last_all > 0) & (send_all > 0)
    if int(keep.sum()) < 2:
        return None
    at, srows = rows[keep], sim_rows[keep]
    sends = send_all[keep].astype(np.float64)
    real_done = last_all[keep].astype(np.float64)
    sim_done = sends + sim.e2e_us[srows]
    real_tp = window_throughput(sends, real_done, real.array("output_tokens")[at])
    sim_tp = window_throughput(sends, sim_done, sim.output_tokens[srows])
    first = real.array("first_content_time_us")[at]
    first = np.where(first != 0, first, real.array("first_chunk_time_us")[at])
    first = np.where(first != 0, first, last_all[keep]).astype(np.float64)
    scheduled = real.array("arrival_time_us")[at].astype(np.float64)
    prompt = real.array("server_input_tokens")[at]
    prompt = np.where(prompt != 0, prompt, real.array("input_tokens")[at])
    seen = signs_of(sends, first, scheduled, prompt)
    n, signs = seen.requests, seen.signs
    saturated = bool(signs)
    arrival = _rate(n - 1, (float(sends.max()) - float(sends.min())) / 1e6)
    rps_error = abs(sim_tp.rps - real_tp.rps) / real_tp.rps if real_tp.rps > 0 else math.inf
    tps_error = (abs(sim_tp.output_tps - real_tp.output_tps) / real_tp.output_tps if real_tp.output_tps > 0
                 else math.inf)
    within = (rps_error <= tolerance and tps_error <= tolerance) if saturated else None
    return CapacityComparison(
        requests=real_tp.requests, window_s=real_tp.seconds, arrival_rps=arrival if math.isfinite(arrival) else None,
        served_rps=real_tp.rps, backlog=seen.backlog, send_lag_s=seen.send_lag_us / 1e6,
        waiting_share=seen.waiting_share,
        saturation=signs, saturated=saturated, real_rps=real_tp.rps, sim_rps=sim_tp.rps, rps_error=rps_error,
        real_output_tps=real_tp.output_tps, sim_output_tps=sim_tp.output_tps, output_tps_error=tps_error,
        tolerance=tolerance, within=within)
