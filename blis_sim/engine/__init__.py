"""The simulation engine: vLLM V1's scheduler as a discrete-event step loop over the tiered KV cache.

Library API (names are imported lazily, so `blis calibrate` does not pay for the engine)::

    from blis_sim.engine import EngineOptions, replay, run, fit, evaluate

    results, metrics = replay(trace, EngineOptions(model="qwen/qwen3-14b", num_gpu_blocks=1000))
    results, metrics = run(workload_spec, EngineOptions(kv_offload=offload_config))
    coeffs = fit(trace, options)                 # LatencyCoefficients (+ .fit: its own error)
    report = evaluate(other_trace, options)      # FitReport of options.latency on another trace
    replay_outcome(trace, options).trace()       # re-export as TraceV2; run_outcome(...).trace()

``results`` is a list of :class:`blis_sim.formats.SimResult`, ``metrics`` a
:class:`blis_sim.formats.MetricsOutput`. Modules: :mod:`.scheduler` (the rules, the loop backends),
:mod:`.latency` (linear / roofline models, coefficient files), :mod:`.fitting`, :mod:`.replay_trace`,
:mod:`.run_spec`, :mod:`.simulate` (options, one simulation), :mod:`.requests` (trace/plan → request
columns), :mod:`.content` (token content as block hashes), :mod:`.kvport`, :mod:`.outputs`,
:mod:`.provenance`, :mod:`.models` (bundled model geometry), :mod:`.cli`. See docs/engine.md.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "EngineOptions": "blis_sim.engine.simulate",
    "replay": "blis_sim.engine.replay_trace",
    "replay_outcome": "blis_sim.engine.replay_trace",
    "run": "blis_sim.engine.run_spec",
    "run_outcome": "blis_sim.engine.run_spec",
    "fit": "blis_sim.engine.fitting",
    "evaluate": "blis_sim.engine.fitting",
    "LatencyCoefficients": "blis_sim.engine.latency",
    "load_coefficients": "blis_sim.engine.latency",
    "roofline": "blis_sim.engine.latency",
    "SchedulerConfig": "blis_sim.engine.scheduler",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'blis_sim.engine' has no attribute {name!r}")
    return getattr(import_module(module), name)
