"""A scenario's phases → a :class:`~blis_sim.workload.WorkloadPlan` the observe dispatcher runs.

Compact phases are planned request by request (no sampling), so each cell does exactly what its
name says: ``seed`` sends one request per prefix group; ``repeat`` sends the same groups again with
fresh suffixes; ``flood`` and ``unique`` send prompts that share nothing; ``workload`` splices in the
phases of a full workload spec. Prefix groups and token content are namespaced by the cell, so two
cells never hit each other's cache entries, even on one long-lived server.
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable
from pathlib import Path

from blis_sim.engine.capacity import with_rate
from blis_sim.errors import FormatError
from blis_sim.formats.workload import WorkloadSpec, load_workload_spec
from blis_sim.workload import PhasePlan, PlannedRequest, WorkloadPlan, generate_workload
from pytest_blis._scenario import Capacity, Phase, Scenario, capacity_factor

CapacityOf = Callable[[WorkloadSpec], float]  # a workload's predicted maximum throughput, req/s

_EMPTY_SPEC = {"version": "2", "seed": 0, "aggregate_rate": 1, "num_requests": 1,
               "clients": [{"id": "plugin", "rate_fraction": 1,
                            "input_distribution": {"type": "constant", "params": {"value": 1}},
                            "output_distribution": {"type": "constant", "params": {"value": 1}}}]}


def cell_seed(scenario_seed: int, cell_id: str) -> int:
    """A seed per cell: same cell → same content; different cells → unrelated content."""
    return (scenario_seed * 1_000_003 + zlib.crc32(cell_id.encode())) % (2**31)


def _request(pi: int, name: str, n: int, *, group: str = "", prefix: int = 0, total: int,
             output: int, client: str) -> PlannedRequest:
    return PlannedRequest(uid=f"{pi}.{n}", phase=name, phase_index=pi, client_id=client, arrival_us=0,
                          input_tokens=total, output_tokens=output, prefix_group=group, prefix_length=prefix,
                          new_input_tokens=total - prefix, streaming=True)


def _compact(phase: Phase, pi: int, name: str, cap: Capacity, groups: list[tuple[str, int]],
             tag: str) -> tuple[PlannedRequest, ...]:
    if phase.seed is not None:
        s = phase.seed
        length = cap.resolve(s.prefix_length, "seed.prefix_length")
        groups[:] = [(f"{tag}-g{g}", length) for g in range(s.groups)]
        return tuple(_request(pi, name, g, group=grp, prefix=length, total=length + s.suffix_length,
                              output=s.output_length, client="seed") for g, (grp, length) in enumerate(groups))
    if phase.repeat is not None:
        r = phase.repeat
        return tuple(_request(pi, name, k * len(groups) + g, group=grp, prefix=length,
                              total=length + r.suffix_length, output=r.output_length, client="repeat")
                     for k in range(r.rounds) for g, (grp, length) in enumerate(groups))
    if phase.flood is not None:
        f = phase.flood
        size = cap.resolve(f.request_length, "flood.request_length")
        count = math.ceil(cap.resolve(f.tokens, "flood.tokens") / size)
        return tuple(_request(pi, name, n, total=size, output=f.output_length, client="flood") for n in range(count))
    u = phase.unique
    assert u is not None
    size = cap.resolve(u.prompt_length, "unique.prompt_length")
    return tuple(_request(pi, name, n, total=size, output=u.output_length, client="unique")
                 for n in range(u.requests))


def _reindex(phase: PhasePlan, index: int, name: str) -> PhasePlan:
    reqs = tuple(r._replace(phase=name, phase_index=index) for r in phase.requests)
    sessions = {k: dataclasses.replace(v, phase=name, phase_index=index) for k, v in phase.sessions.items()}
    return dataclasses.replace(phase, index=index, name=name, requests=reqs, sessions=sessions)


def phase_spec(phase: Phase, base_dir: Path, capacity_of: CapacityOf | None = None,
               notes: list[str] | None = None) -> WorkloadSpec:
    """A ``workload`` phase's spec, at the phase's ``rate`` when it sets one (``capacity_of`` resolves
    ``'Nx capacity'``; what it resolved to is appended to ``notes``)."""
    assert phase.workload is not None
    spec = load_workload_spec(base_dir / phase.workload)
    if phase.rate is None:
        return spec
    factor = capacity_factor(phase.rate)
    if factor is None:
        return with_rate(spec, float(phase.rate))
    if capacity_of is None:
        raise FormatError(f"workload {phase.workload}: rate '{phase.rate}' needs a simulator to predict the "
                          "workload's capacity, and none was given")
    predicted = capacity_of(spec)
    if notes is not None:
        notes.append(f"{phase.workload}: rate {phase.rate} = {factor:g} x {predicted:.2f} req/s predicted "
                     f"= {factor * predicted:.2f} req/s")
    return with_rate(spec, factor * predicted)


def build_plan(scenario: Scenario, *, cell_id: str, capacity: Capacity, base_dir: Path,
               capacity_of: CapacityOf | None = None, notes: list[str] | None = None) -> WorkloadPlan:
    """Plan every phase of one cell against the server's capacity (``capacity_of``, ``notes``: phase_spec's)."""
    seed = cell_seed(scenario.seed, cell_id)
    tag = f"c{seed:x}"
    groups: list[tuple[str, int]] = []
    phases: list[PhasePlan] = []
    for name, phase in zip(scenario.phase_names(), scenario.phases):
        index = len(phases)
        if phase.workload is not None:
            sub = generate_workload(phase_spec(phase, base_dir, capacity_of, notes), seed=seed)
            for k, p in enumerate(sub.phases):
                phases.append(_reindex(p, len(phases), name if len(sub.phases) == 1 else f"{name}.{p.name or k}"))
            continue
        reqs = _compact(phase, index, name, capacity, groups, tag)
        phases.append(PhasePlan(index=index, name=name, seed=seed, gap_us=0, horizon_us=0,
                                num_requests=len(reqs), requests=reqs))
    spec = WorkloadSpec.model_validate({**_EMPTY_SPEC, "seed": seed})
    return WorkloadPlan(seed=seed, phases=tuple(phases), spec=spec)


def measured_phase_names(scenario: Scenario, plan: WorkloadPlan) -> tuple[str, ...]:
    """Names (as planned) of the phases inside the counter window."""
    wanted = {scenario.phase_names()[i] for i in scenario.measured()}
    return tuple(p.name for p in plan.phases if p.name in wanted or p.name.split(".")[0] in wanted)
