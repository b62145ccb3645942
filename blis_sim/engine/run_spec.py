"""``run``: a workload spec through the simulator (no trace needed).

API::

    outcome = run_outcome(spec, options, seed=None, num_requests=None, horizon=None)   # RunOutcome
    results, metrics = run(spec, options)              # list[SimResult], MetricsOutput
    trace = outcome.trace(workload_spec="spec.yaml")   # TraceV2, mode "generated", kv_offload recorded

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
from typing import Any

import numpy as np

from blis_sim.engine.outputs import metrics_output, sim_results, trace_records
from blis_sim.engine.requests import RequestTable, table_from_plan
from blis_sim.engine.scheduler import LoopResult
from blis_sim.engine.simulate import EngineOptions, SimOutcome, build_kv, hit_rates, simulate_table
from blis_sim.engine.models import default_num_gpu_blocks

MAX_FOLLOWUPS = 100_000


@dataclass
class RunOutcome:
    outcome: SimOutcome
    options: EngineOptions
    plan: Any
    phase_start: np.ndarray  # µs: start of each request's phase (deadlines are phase-relative)

    @property
    def results(self) -> list[Any]:
        return sim_results(self.outcome)

    def metrics(self, include_requests: bool = True) -> Any:
        return metrics_output(self.outcome, include_requests=include_requests)

    def trace(self, workload_spec: str = "") -> Any:
        from blis_sim.engine.provenance import sim_header
        from blis_sim.formats import Trace

        accumulate = any(getattr(r, "accumulate", False) for r in self.outcome.table.source)
        header = sim_header(self.outcome, self.options, mode="generated",
                            workload_seed=self.plan.seed, workload_spec=workload_spec,
                            accumulate=accumulate)
        base = [_planned_fields(r, self.outcome.loop.arrival_us[i], float(self.phase_start[i]))
                for i, r in enumerate(self.outcome.table.source)]
        return Trace.model_construct(header=header, records=trace_records(self.outcome, base))


def _planned_fields(r: Any, arrival: float, phase_start: float) -> dict[str, Any]:
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


def _expand(phase: Any) -> tuple[list[Any], dict[int, int]]:
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


def run_outcome(spec: Any, options: EngineOptions | None = None, *, seed: int | None = None,
                num_requests: int | None = None, horizon: int | None = None) -> RunOutcome:
    """Generate the workload and simulate it phase by phase (see the module docstring)."""
    from blis_sim.workload import generate_workload

    options = options or EngineOptions()
    plan = generate_workload(spec, seed=seed, num_requests=num_requests, horizon=horizon)
    offload = options.kv_offload
    block_size = options.block_size or (offload.gpu_block_size if offload is not None else 16)
    num_blocks = options.num_gpu_blocks or default_num_gpu_blocks(options.model, block_size)
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
    combined = _combine(parts, kv, offload)
    return RunOutcome(outcome=combined, options=replace(options, kv_offload=offload), plan=plan,
                      phase_start=np.concatenate(starts) if starts else np.zeros(0))


def run(spec: Any, options: EngineOptions | None = None, **kw: Any) -> tuple[list[Any], Any]:
    """Simulate a workload spec: ``(SimResult list, MetricsOutput)``."""
    out = run_outcome(spec, options, **kw)
    return out.results, out.metrics()


def _combine(parts: list[SimOutcome], kv: Any, offload: Any) -> SimOutcome:
    if len(parts) == 1:
        return parts[0]
    if not parts:
        raise ValueError("the workload produced no requests")

    def cat(get: Any) -> np.ndarray:
        return np.concatenate([get(p) for p in parts])

    tables = [p.table for p in parts]
    t = RequestTable(
        request_id=cat(lambda p: p.table.request_id), arrival_us=cat(lambda p: p.table.arrival_us),
        prompt_len=cat(lambda p: p.table.prompt_len), output_len=cat(lambda p: p.table.output_len),
        next_round=cat(lambda p: p.table.next_round), think_us=cat(lambda p: p.table.think_us),
        group=cat(lambda p: p.table.group), shared_prefix=cat(lambda p: p.table.shared_prefix),
        session=cat(lambda p: p.table.session), prev_round=cat(lambda p: p.table.prev_round),
        new_input=cat(lambda p: p.table.new_input), in_window=cat(lambda p: p.table.in_window),
        keys=[k for tb in tables for k in tb.keys], group_names=[], session_names=[],
        source=[s for tb in tables for s in tb.source])
    loops = [p.loop for p in parts]
    loop = LoopResult(
        arrival_us=cat(lambda p: p.loop.arrival_us), first_token_us=cat(lambda p: p.loop.first_token_us),
        finish_us=cat(lambda p: p.loop.finish_us), itl_sum_us=cat(lambda p: p.loop.itl_sum_us),
        num_out=cat(lambda p: p.loop.num_out), preemptions=cat(lambda p: p.loop.preemptions),
        first_sched_us=cat(lambda p: p.loop.first_sched_us), status=cat(lambda p: p.loop.status),
        itl_values=cat(lambda p: p.loop.itl_values), itl_weights=cat(lambda p: p.loop.itl_weights),
        steps=sum(lp.steps for lp in loops),
        preemption_count=sum(lp.preemption_count for lp in loops), end_us=loops[-1].end_us)

    admitted, cached = cat(lambda p: p.admitted), cat(lambda p: p.cached)
    counters = kv.snapshot()
    return SimOutcome(table=t, loop=loop, cached=cached, admitted=admitted,
                      frontend_us=cat(lambda p: p.frontend_us), kv_counters=counters,
                      hit_rates=hit_rates(t, admitted, cached, counters, None,
                                          tiers=offload is not None),
                      block_size=parts[0].block_size, num_gpu_blocks=parts[0].num_gpu_blocks,
                      offload=offload, dropped=cat(lambda p: p.dropped))
