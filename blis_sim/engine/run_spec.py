"""``run``: a workload spec through the simulator (no trace needed).

API::

    outcome = run_outcome(spec, options, seed=None, num_requests=None, horizon=None)   # RunOutcome
    results, metrics = run(spec, options)              # list[SimResult], MetricsOutput
    trace = outcome.trace(workload_spec="spec.yaml")   # TraceV2, mode "generated", kv_offload recorded
    outcome.write_outputs("sim.json", "simagg.json")    # the files, written from the columns (fast)

Phases run one after the other on the same KV cache (the next starts when the previous has
drained, plus its gap). Session rounds and closed-loop follow-ups are generated up front from the
workload plan (their lengths do not depend on timing) and released by the step loop when the
previous round finishes, after the think time (rounded up to a whole µs, so a trace records it
exactly and a replay reproduces it: INV-13). A phase whose closed-loop users have neither
``max_rounds`` nor a request budget stops generating follow-ups at ``num_requests`` (or 100,000).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from blis_sim.engine.outputs import SimulatedOutputs, trace_records
from blis_sim.engine.provenance import sim_header
from blis_sim.engine.requests import table_from_plan
from blis_sim.engine.settings import resolve_settings
from blis_sim.workload.generate import generate_workload
from blis_sim.workload.plan import PhasePlan, PlannedRequest, WorkloadPlan

if TYPE_CHECKING:
    from blis_sim.formats import MetricsOutput, SimResult, Trace
    from blis_sim.formats.workload import WorkloadSpec
from blis_sim.engine.simulate import EngineOptions, SimOutcome, build_kv, combine_outcomes, simulate_table

MAX_FOLLOWUPS = 100_000


@dataclass
class RunOutcome(SimulatedOutputs):
    outcome: SimOutcome
    options: EngineOptions
    plan: WorkloadPlan
    phase_start: np.ndarray  # µs: start of each request's phase (deadlines are phase-relative)

    def trace(self, workload_spec: str = "") -> Trace:
        from blis_sim.formats import Trace  # the record model: only a re-export builds it

        accumulate = any(getattr(r, "accumulate", False) for r in self.outcome.table.source)
        header = sim_header(self.outcome, self.options, mode="generated",
                            workload_seed=self.plan.seed, workload_spec=workload_spec,
                            accumulate=accumulate)
        base = [_planned_fields(r, self.outcome.loop.arrival_us[i], float(self.phase_start[i]))
                for i, r in enumerate(self.outcome.table.source)]
        return Trace.model_construct(header=header, records=trace_records(self.outcome, base))


def _planned_fields(r: PlannedRequest, arrival: float, phase_start: float) -> dict[str, Any]:
    deadline = int(phase_start + r.deadline_us) if r.deadline_us > 0 else 0
    return {
        "client_id": r.client_id, "tenant_id": r.tenant_id, "slo_class": r.slo_class,
        "session_id": r.session_id, "round_index": r.round_index,
        "prefix_group": r.prefix_group if r.csv_prefix_length > 0 else "",
        "prefix_length": r.csv_prefix_length, "streaming": r.streaming,
        "input_tokens": r.csv_input_tokens, "output_tokens": r.output_tokens,
        "text_tokens": r.text_tokens, "image_tokens": r.image_tokens,
        "audio_tokens": r.audio_tokens, "video_tokens": r.video_tokens,
        "reason_ratio": r.reason_ratio, "model": r.model,
        "deadline_us": max(deadline, int(arrival)) if deadline else 0,
        "slo_target_us": r.slo_target_us, "adapter": r.adapter, "think_time_us": r.think_time_us,
        "phase": r.phase,
    }


def _expand(phase: PhasePlan) -> tuple[list[PlannedRequest], dict[int, int]]:
    """The phase's initial requests plus every follow-up, generated round-robin."""
    run = phase.start()
    requests = list(run.initial)
    followups: dict[int, int] = {}
    limit = phase.num_requests if phase.num_requests > 0 else MAX_FOLLOWUPS
    k = 0
    while k < len(requests):
        req = requests[k]
        if req.session_id and len(requests) < limit + len(run.initial):
            nxt = run.on_complete(req, ok=True, output_tokens=req.output_tokens, completed_at_us=0)
            if nxt is not None:
                followups[k] = len(requests)
                requests.append(nxt)
        k += 1
    return requests, followups


def run_outcome(spec: WorkloadSpec, options: EngineOptions | None = None, *, seed: int | None = None,
                num_requests: int | None = None, horizon: int | None = None) -> RunOutcome:
    """Generate the workload and simulate it phase by phase (see the module docstring)."""
    options = resolve_settings(options or EngineOptions())
    plan = generate_workload(spec, seed=seed, num_requests=num_requests, horizon=horizon)
    offload = options.kv_offload
    block_size, num_blocks = int(options.block_size or 0), int(options.num_gpu_blocks or 0)
    kv = build_kv(num_blocks, block_size, offload, options.seed, backend=options.kv_backend)
    parts: list[SimOutcome] = []
    starts: list[np.ndarray] = []
    t0 = 0.0
    next_id = 0
    for phase in plan.phases:
        t0 = math.ceil(t0 + phase.gap_us)
        requests, followups = _expand(phase)
        if not requests:
            continue
        table = table_from_plan(requests, followups, plan.seed, first_id=next_id)
        table.arrival_us = table.arrival_us + t0
        next_id += len(requests)
        h = options.horizon_us
        if h is None and phase.horizon_us > 0:
            h = t0 + phase.horizon_us
        part = simulate_table(table, kv, replace(options, horizon_us=h), block_size=block_size,
                              num_gpu_blocks=num_blocks, offload=offload,
                              content_seed=plan.seed)
        parts.append(part)
        starts.append(np.full(len(table), t0))
        t0 = part.loop.end_us
    combined = combine_outcomes(parts, kv, offload)
    return RunOutcome(outcome=combined, options=options, plan=plan,
                      phase_start=np.concatenate(starts) if starts else np.zeros(0))


def run(spec: WorkloadSpec, options: EngineOptions | None = None, **kw: Any) -> tuple[list[SimResult], MetricsOutput]:
    """Simulate a workload spec: ``(SimResult list, MetricsOutput)``."""
    out = run_outcome(spec, options, **kw)
    return out.results, out.metrics()
