"""The simulated server's maximum throughput for a workload: its requests sent together, far past capacity.

API::

    rps = burst_capacity(spec, options)               # completions per second
    rps = burst_capacity(spec, options, num_requests=128)

A workload whose arrivals outrun this rate saturates the simulated server, and a real one whose speed the
model matches within its error. Tests use it to size an open-loop load that must saturate whatever the
machine (``rate: "2x capacity"`` in a scenario's workload phase, docs/plugin.md), and the lane's
benchmark to place its load levels.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

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
