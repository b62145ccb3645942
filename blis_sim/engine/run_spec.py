"""``run``: a workload spec through the simulator (no trace needed).

API::

    outcome = run_outcome(spec, options, seed=None, num_requests=None, horizon=None)   # RunOutcome
    results, metrics = run(spec, options)              # list[SimResult], MetricsOutput
    trace = outcome.trace(workload_spec="spec.yaml")   # TraceV2, mode "generated", kv_offload recorded
    columnar = outcome.trace_columns("spec.yaml")      # the same as columns (what the CLI writes)
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
from blis_sim.engine.simulate import EngineOptions, SimOutcome, build_kv, combine_outcomes, simulate_table
from blis_sim.workload.generate import generate_workload
from blis_sim.workload.plan import PhasePlan, PlannedRequest, WorkloadPlan

if TYPE_CHECKING:
    from collections.abc import Callable

    from blis_sim.engine.kvport import CacheOps
    from blis_sim.engine.requests import RequestTable
    from blis_sim.formats import MetricsOutput, SimResult, Trace
    from blis_sim.formats.trace_columns import ColumnarTrace
    from blis_sim.formats.workload import WorkloadSpec

MAX_FOLLOWUPS = 100_000


@dataclass
class RunOutcome(SimulatedOutputs):
    outcome: SimOutcome
    options: EngineOptions
    plan: WorkloadPlan
    phase_start: np.ndarray  # µs: start of each request's phase (deadlines are phase-relative)

    def trace(self, workload_spec: str = "") -> Trace:
        """The run as a :class:`~blis_sim.formats.Trace`: :meth:`trace_columns`' rows as records."""
        from blis_sim.formats import Trace

        columnar = self.trace_columns(workload_spec)
        return Trace.model_construct(header=columnar.header, records=columnar.records)

    def trace_columns(self, workload_spec: str = "") -> ColumnarTrace:
        """The run as a ``ColumnarTrace`` (what ``--trace-output`` writes: no object per row)."""
        from blis_sim.formats.trace_columns import ColumnarTrace

        accumulate = any(getattr(r, "accumulate", False) for r in self.outcome.table.source)
        header = sim_header(self.outcome, self.options, mode="generated",
                            workload_seed=self.plan.seed, workload_spec=workload_spec,
                            accumulate=accumulate)
        phase_start = self.phase_start
        reqs = self.outcome.table.source
        columns = _planned_columns(reqs, phase_start, self.outcome.loop.arrival_us)
        return ColumnarTrace(header=header, data=trace_records(self.outcome, columns))


def _planned_columns(reqs: Any, phase_start: np.ndarray, arrival: np.ndarray) -> dict[str, Any]:
    """The planned requests' trace columns (what the re-export records of each), in table order,
    each made an array (or string codes) as soon as it is read: one list alive at a time."""
    from blis_sim.formats.trace_columns import TraceColumns

    def get(name: str) -> list[Any]:
        return [getattr(r, name) for r in reqs]

    def column(name: str, values: list[Any]) -> Any:
        return TraceColumns.from_columns(len(values), {name: values}).data[name]

    csv_prefix = np.asarray(get("csv_prefix_length"), dtype=np.int64)
    rel_deadline = np.asarray(get("deadline_us"), dtype=np.int64)
    deadline = np.zeros(len(reqs), dtype=np.int64)
    has = np.flatnonzero(rel_deadline > 0)
    if has.size:  # int(phase start + deadline), not before the arrival
        absolute = (phase_start[has] + rel_deadline[has]).astype(np.int64)
        deadline[has] = np.maximum(absolute, arrival[has].astype(np.int64))
    cols: dict[str, Any] = {name: column(name, get(name)) for name in (
        "client_id", "tenant_id", "slo_class", "session_id", "round_index", "streaming",
        "output_tokens", "text_tokens", "image_tokens", "audio_tokens", "video_tokens",
        "reason_ratio", "model", "slo_target_us", "adapter", "think_time_us", "phase")}
    groups = get("prefix_group")
    cols.update(prefix_group=column("prefix_group", [g if p > 0 else "" for g, p in zip(groups, csv_prefix.tolist())]),
                prefix_length=csv_prefix, input_tokens=column("input_tokens", get("csv_input_tokens")),
                deadline_us=deadline)
    return cols


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
    (parts,), (starts,) = simulate_phases(plan, options, [kv])
    combined = combine_outcomes(parts, kv, offload)
    return RunOutcome(outcome=combined, options=options, plan=plan,
                      phase_start=np.concatenate(starts) if starts else np.zeros(0))


def simulate_phases(plan: WorkloadPlan, options: EngineOptions, kvs: list[CacheOps],
                    route: Callable[[RequestTable, EngineOptions], np.ndarray] | None = None
                    ) -> tuple[list[list[SimOutcome]], list[list[np.ndarray]]]:
    """Each phase of ``plan`` in turn, its requests on the replicas' caches ``kvs`` (``route(table,
    options)`` gives each request's replica; None: all on the one cache), the next phase once every
    replica has drained. Per replica: its phases' outcomes and each request's phase start (µs)."""
    offload = options.kv_offload
    block_size, num_blocks = int(options.block_size or 0), int(options.num_gpu_blocks or 0)
    per: list[list[SimOutcome]] = [[] for _ in kvs]
    starts: list[list[np.ndarray]] = [[] for _ in kvs]
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
        phase_options = replace(options, horizon_us=h)
        assign = route(table, phase_options) if route is not None else None
        end = float(t0)
        for r, kv in enumerate(kvs):
            sub = table if assign is None else table.take(np.flatnonzero(assign == r))
            part = simulate_table(sub, kv, phase_options, block_size=block_size,
                                  num_gpu_blocks=num_blocks, offload=offload, content_seed=plan.seed)
            per[r].append(part)
            starts[r].append(np.full(len(sub), t0))
            end = max(end, part.loop.end_us)
        t0 = end
    return per, starts


def run(spec: WorkloadSpec, options: EngineOptions | None = None, **kw: Any) -> tuple[list[SimResult], MetricsOutput]:
    """Simulate a workload spec: ``(SimResult list, MetricsOutput)``."""
    out = run_outcome(spec, options, **kw)
    return out.results, out.metrics()
