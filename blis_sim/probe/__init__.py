"""`blis probe`: a designed workload that identifies every coefficient of the latency model on any server.

Library API (the pytest plugin's probe is this one)::

    from blis_sim.probe import ProbeConfig, ProbeOptions, read_limits, run_probe, probe_plan
    limits = read_limits(url, model="m", max_num_seqs=256)         # /v1/models + vllm:cache_config_info
    result = run_probe(url, limits, ProbeConfig(), ProbeOptions(model="m", time_budget_s=300))
    result.observed.trace, result.ramp, result.max_rps, result.max_output_tps

Modules: ``plan`` (the phases and how they are sized), ``limits`` (what the server says about itself),
``run`` (observe within the budget, the ramp's throughput), ``cli`` (``register(subparsers)``).
See docs/probe.md.
"""
from __future__ import annotations

from blis_sim.probe.plan import ProbeConfig, ServerLimits, fitted_phases, probe_plan
from blis_sim.probe.run import ProbeOptions, ProbeResult, RampLevel, ramp_throughput, run_probe


def read_limits(url: str, **kw: object) -> ServerLimits:
    """The server's limits (see :mod:`blis_sim.probe.limits`; imports aiohttp)."""
    from blis_sim.probe.limits import read_limits as read

    return read(url, **kw)


__all__ = ["ProbeConfig", "ProbeOptions", "ProbeResult", "RampLevel", "ServerLimits", "fitted_phases",
           "probe_plan", "ramp_throughput", "read_limits", "run_probe"]
