"""Workload generation: a :class:`~blis_sim.formats.workload.WorkloadSpec` becomes a :class:`WorkloadPlan`.

API (everything public is re-exported here)::

    from blis_sim.formats.workload import load_workload_spec
    from blis_sim.workload import generate_workload

    plan = generate_workload(load_workload_spec("spec.yaml"), seed=None, num_requests=None, horizon=None)
    for phase in plan.phases:                 # PhasePlan, in order; each starts when the previous drained
        run = phase.start()                   # PhaseRun: follow-up state of this execution
        run.initial                           # PlannedRequest tuple sorted by arrival_us (phase-relative µs)
        nxt = run.on_complete(req, ok=True, output_tokens=n, completed_at_us=t)  # closed-loop follow-up or None

    req.input_token_ids(plan.seed)            # numpy int64 prompt ids: group prefix / session context shared

Modules: :mod:`.plan` (data types and the driver contract), :mod:`.generate` (spec -> plan),
:mod:`.distributions` (length samplers), :mod:`.arrivals` (inter-arrival samplers), :mod:`.tokens` (token content
as a pure function of seed and ids, also used to rebuild a trace's sharing structure from its CSV columns).
"""
from typing import TYPE_CHECKING

from blis_sim._lazy import lazy_exports

# lazy (PEP 562): the engine imports ``blis_sim.workload.tokens`` alone, without the spec models
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "blis_sim.workload.generate": ("client_rates", "expand_cohorts", "generate_workload",
                                   "group_prefix_lengths"),
    "blis_sim.workload.plan": ("PhasePlan", "PhaseRun", "PlannedRequest", "SessionPlan",
                               "WorkloadPlan", "compute_deadline"),
})

if TYPE_CHECKING:  # the names served lazily above, as the type checker sees them
    from blis_sim.workload.generate import (
        client_rates as client_rates,
        expand_cohorts as expand_cohorts,
        generate_workload as generate_workload,
        group_prefix_lengths as group_prefix_lengths,
    )
    from blis_sim.workload.plan import (
        PhasePlan as PhasePlan,
        PhaseRun as PhaseRun,
        PlannedRequest as PlannedRequest,
        SessionPlan as SessionPlan,
        WorkloadPlan as WorkloadPlan,
        compute_deadline as compute_deadline,
    )
