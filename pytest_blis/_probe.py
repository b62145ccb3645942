"""The probe phase: a short workload per server whose trace fits the engine's latency model.

A scenario's own requests are never used to fit what they are judged against, so every server gets
its probe once per worker, before its first cell, and the fitted coefficients are an artifact
(``<artifacts>/probe-<server>/latency.json``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from blis_sim.observe.run import ObserveOptions
from blis_sim.workload import PhasePlan, PlannedRequest, WorkloadPlan
from pytest_blis._phases import _EMPTY_SPEC, cell_seed
from pytest_blis._server import ServerTarget
from pytest_blis._steps import CellPaths, observe_step

# Prompt lengths (tokens) of the sequential part; each sent twice with a new suffix so the probe
# also sees prefix hits, then a concurrent burst for the load-dependent terms.
PROBE_LENGTHS = (64, 256, 1024, 2048, 4096)
PROBE_OUTPUT = 16
BURST = 8
SPACING_US = 250_000  # the sequential part is paced, so its requests rarely overlap


def probe_plan(target: ServerTarget) -> WorkloadPlan:
    from blis_sim.formats.workload import WorkloadSpec

    seed = cell_seed(7, f"probe::{target.url}")
    limit = max(64, target.block_size * target.num_gpu_blocks // 4)
    reqs: list[PlannedRequest] = []
    for n, length in enumerate(L for L in PROBE_LENGTHS if L <= limit):
        for k in range(2):
            reqs.append(PlannedRequest(
                uid=f"0.{len(reqs)}", phase="probe", phase_index=0, client_id="probe",
                arrival_us=len(reqs) * SPACING_US,
                input_tokens=length + 32, output_tokens=PROBE_OUTPUT, prefix_group=f"probe{seed:x}-{n}",
                prefix_length=length, new_input_tokens=32, streaming=True))
    sequential = PhasePlan(index=0, name="probe", seed=seed, gap_us=0, horizon_us=0, num_requests=len(reqs),
                           requests=tuple(reqs))
    burst = tuple(PlannedRequest(uid=f"1.{n}", phase="probe-burst", phase_index=1, client_id="probe",
                                 arrival_us=0, input_tokens=512, output_tokens=PROBE_OUTPUT, streaming=True)
                  for n in range(BURST))
    spec = WorkloadSpec.model_validate({**_EMPTY_SPEC, "seed": seed})
    return WorkloadPlan(seed=seed, spec=spec, phases=(
        sequential, PhasePlan(index=1, name="probe-burst", seed=seed, gap_us=0, horizon_us=0,
                              num_requests=BURST, requests=burst)))


def run_probe(target: ServerTarget, artifacts_dir: Path, *, max_num_seqs: int, max_num_batched_tokens: int) -> Any:
    """Observe the probe (sequential, then a burst at concurrency ``BURST``) and fit the latency model."""
    from pytest_blis._replay import fit_latency_model

    paths = CellPaths(artifacts_dir / f"probe-{target.key}")
    options = ObserveOptions(model=target.model, max_concurrency=BURST, progress=False,
                             workload_label="pytest-blis probe")
    with target.exclusive():
        result = observe_step(target.url, probe_plan(target), options, paths)
    return fit_latency_model(result.trace, target, paths.root / "latency.json", max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens)
