"""The simulation engine: vLLM V1's scheduler as a discrete-event step loop over the tiered KV cache.

Library API::

    from blis_sim.engine import EngineOptions, replay, run, fit, evaluate

    results, metrics = replay(trace, EngineOptions(model="qwen/qwen3-14b", num_gpu_blocks=1000))
    results, metrics = run(workload_spec, EngineOptions(kv_offload=offload_config))
    coeffs = fit(trace, options)                 # LatencyCoefficients (+ .fit: its own error)
    report = evaluate(other_trace, options)      # FitReport of options.latency on another trace
    replay_outcome(trace, options).trace()       # re-export as TraceV2; run_outcome(...).trace()
    prepared = prepare_trace(trace)              # a sweep: prepare once, replay_outcome(prepared, o) per point
    rps = burst_capacity(workload_spec, options) # the simulated server's maximum throughput for a workload

``results`` is a list of :class:`blis_sim.formats.SimResult`, ``metrics`` a
:class:`blis_sim.formats.MetricsOutput`. Modules: :mod:`.scheduler` (the rules, the loop backends),
:mod:`.latency` (linear / roofline models, coefficient files), :mod:`.fitting` (with :mod:`.fit_solve`,
:mod:`.fit_checks`, :mod:`.prior`: the solver, its self-checks, the roofline prior), :mod:`.replay_trace`,
:mod:`.run_spec`, :mod:`.capacity`, :mod:`.simulate` (options, one simulation), :mod:`.requests` (trace/plan → request
columns), :mod:`.content` (token content as block hashes), :mod:`.kvport`, :mod:`.outputs`,
:mod:`.provenance`, :mod:`.models` (bundled model geometry), :mod:`.cli`. See docs/engine.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from blis_sim._lazy import lazy_exports
from blis_sim.engine.latency import roofline
from blis_sim.engine.replay_trace import PreparedTrace, prepare_trace, replay, replay_outcome
from blis_sim.engine.scheduler import SchedulerConfig
from blis_sim.engine.simulate import EngineOptions

# `run` and `fit` need the workload generator and its spec models, a coefficient file its
# models: imported on first use (PEP 562)
__getattr__, __dir__, _ = lazy_exports(__name__, {
    "blis_sim.engine.capacity": ("burst_capacity",),
    "blis_sim.engine.coefficients": ("LatencyCoefficients", "MemoryCoefficients", "load_coefficients"),
    "blis_sim.engine.fitting": ("evaluate", "fit"),
    "blis_sim.engine.prior": ("PhysicsPrior", "physics_prior", "resolve_prior"),
    "blis_sim.engine.run_spec": ("run", "run_outcome"),
})
__all__ = ["EngineOptions", "burst_capacity", "LatencyCoefficients", "MemoryCoefficients", "PhysicsPrior",
           "PreparedTrace", "SchedulerConfig",
           "evaluate", "fit", "load_coefficients", "physics_prior", "prepare_trace", "replay",
           "replay_outcome", "resolve_prior", "roofline", "run", "run_outcome"]

if TYPE_CHECKING:  # the names served lazily above, as the type checker sees them
    from blis_sim.engine.capacity import burst_capacity as burst_capacity
    from blis_sim.engine.coefficients import (
        LatencyCoefficients as LatencyCoefficients,
        MemoryCoefficients as MemoryCoefficients,
        load_coefficients as load_coefficients,
    )
    from blis_sim.engine.fitting import evaluate as evaluate, fit as fit
    from blis_sim.engine.prior import (
        PhysicsPrior as PhysicsPrior,
        physics_prior as physics_prior,
        resolve_prior as resolve_prior,
    )
    from blis_sim.engine.run_spec import run as run, run_outcome as run_outcome
