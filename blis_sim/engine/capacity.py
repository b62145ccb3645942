"""The simulated server's maximum throughput for a workload: its requests sent together, far past capacity
(burst), or offered faster than it serves them for long enough that the queue stands (sustained).

API::

    rps = burst_capacity(spec, options)               # completions per second
    rps = burst_capacity(spec, options, num_requests=128)
    rps = sustained_capacity(spec, options)           # steady-state service rate under a standing queue
    rps = sustained_capacity(spec, options, offered=3.0, num_requests=4000)

A workload whose arrivals outrun this rate saturates the simulated server, and a real one whose speed the
model matches within its error. Tests use it to size an open-loop load that must saturate whatever the
machine (``rate: "2x capacity"`` in a scenario's workload phase, docs/plugin.md), and the lane's
benchmark to place its load levels.

The burst figure counts the batch filling at the start and draining at the end, where the server runs
below its steady rate: with a few hundred requests against 256 sequences those edges are most of the span,
and the burst figure is a few percent under the rate a standing queue is served at. A load meant as a
fraction of what the server sustains (below it: never saturated; above it: always) takes the sustained one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from blis_sim.engine.run_spec import run_outcome

if TYPE_CHECKING:
    from blis_sim.engine.simulate import EngineOptions
    from blis_sim.formats.workload import WorkloadSpec

BURST_RATE = 1e6  # req/s: every request arrives within the first step


def with_rate(spec: WorkloadSpec, rate: float) -> WorkloadSpec:
    """``spec`` with ``rate`` as its ``aggregate_rate``, at the top and in every phase that sets its own."""
    phases = [p.model_copy(update={"aggregate_rate": rate}) if p.aggregate_rate is not None else p
              for p in spec.phases]
    return spec.model_copy(update={"aggregate_rate": rate, "phases": phases})


def burst_capacity(spec: WorkloadSpec, options: EngineOptions | None, *, num_requests: int | None = None,
                   seed: int | None = None) -> float:
    """Requests per second the simulator (``options``: its latency model and limits) completes when every
    request of ``spec`` (``num_requests`` of them, default the spec's) arrives at once: completions over the
    span from the first arrival to the last completion. A spec with several phases runs them in turn, each
    drained, so this is their average."""
    out = run_outcome(with_rate(spec, BURST_RATE), options, seed=seed, num_requests=num_requests).outcome
    done = out.completed
    if not done.any():
        raise ValueError("no simulated request completed: the workload has no capacity to measure")
    finish = out.loop.arrival_us[done] + out.e2e_us[done]
    return float(done.sum() / ((finish.max() - out.loop.arrival_us.min()) / 1e6))


def sustained_capacity(spec: WorkloadSpec, options: EngineOptions | None, *, offered: float = 2.0,
                       num_requests: int | None = None, seed: int | None = None) -> float:
    """Requests per second the simulator (``options``) completes in steady state when offered more than it
    can serve: ``spec``'s arrival process at ``offered`` times its burst capacity, ``num_requests`` of them
    (default the spec's), the completions counted over the middle of the window (from the completion of
    the request ranked a quarter of the way to that ranked three quarters), where the batch has filled and
    the queue stands. Raises ValueError when a queue did not stand at both ends of that window (``offered``
    too close to 1, or too few requests next to ``max_num_seqs``: ask for several times as many), and for a
    spec with several phases (each drains before the next, so none holds a queue throughout)."""
    if len(spec.resolved_phases()) > 1:
        raise ValueError("sustained_capacity measures one phase: this spec has several")
    if not offered > 1.0:
        raise ValueError(f"offered must be above 1 (more than the server serves); got {offered}")
    rate = offered * burst_capacity(spec, options, num_requests=num_requests, seed=seed)
    out = run_outcome(with_rate(spec, rate), options, seed=seed, num_requests=num_requests).outcome
    loop = out.loop
    finish = np.sort((loop.arrival_us + out.e2e_us)[out.completed])  # E2E with its frontend time, as above
    if finish.size < 8:
        raise ValueError(f"{finish.size} simulated requests completed: too few to measure a steady state")
    start, end = finish[finish.size // 4], finish[3 * finish.size // 4]
    for t in (start, end):  # a request waits at t: arrived, not yet scheduled
        if not ((loop.arrival_us <= t) & ~(loop.first_sched_us <= t)).any():
            raise ValueError(f"no request waited at {t / 1e6:.2f} s of the simulated window offered "
                             f"{rate:.3g} req/s: the queue did not stand; offer more, or more requests")
    return float(np.count_nonzero((finish > start) & (finish <= end)) / ((end - start) / 1e6))
