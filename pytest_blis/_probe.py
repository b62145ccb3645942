"""The probe phase: `blis probe` (blis_sim.probe) run once per server and worker, before its first cell.

A scenario's own requests are never used to fit what they are judged against, so every server gets
its probe once per worker, before its first cell, and the fitted coefficients are an artifact
(``<artifacts>/probe-<server>-<worker>/latency.json``, the probe's trace beside it).

The phases are blis_sim.probe's (docs/probe.md), sized to what the cells need:

* prompts up to 4096 tokens (the scenarios' longest prefix; at most a quarter of the GPU cache);
* decode batches up to the cells' highest ``concurrency`` (one sequential decode for sequential cells);
* mixed prefill+decode phases and a ramp ``2, 4, ... concurrency`` only when cells send concurrently:
  sequential cells (concurrency 1) get neither, so the load terms are not fitted, which is right for
  them (nothing else is in flight when they arrive).

Two fits of the one probe (:class:`ProbeFit`): on every phase, for cells that send concurrently, and on the
phases that send one request at a time (``latency-sequential.json``; :func:`blis_sim.probe.plan.one_at_a_time`),
for cells that do too: the whole probe's fit is a compromise between the two regimes that priced 4096-token
prompts sent alone 8-19 % short on the lane's CPU vLLM (docs/vllm-cpu-calibration.md). A probe for sequential
cells only has no other phases, and one fit serves both.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from blis_sim.observe.run import ObserveOptions
from blis_sim.probe import ProbeConfig, ServerLimits, fitted_phases, probe_plan, read_limits
from blis_sim.probe.plan import max_in_flight, one_at_a_time
from blis_sim.probe.repeat import describe, repeat_floor, repeat_groups
from pytest_blis._phases import cell_seed
from pytest_blis._replay import fit_latency_model
from pytest_blis._server import ServerTarget
from pytest_blis._session import worker_id
from pytest_blis._steps import CellPaths, observe_step

if TYPE_CHECKING:
    from blis_sim.engine import LatencyCoefficients
    from blis_sim.formats.trace import Trace
    from blis_sim.workload import WorkloadPlan

MAX_PROMPT = 4096  # the scenarios' longest prefix


@dataclass(frozen=True)
class ProbeFit:
    """A probe's latency models (engine ``LatencyCoefficients``): ``all`` fitted on every phase, ``sequential``
    on the phases that send one request at a time (the same object when there are no others); and how well
    the server repeated itself in the probe (:mod:`blis_sim.probe.repeat`, one line; empty without repeats)."""

    all: LatencyCoefficients
    sequential: LatencyCoefficients
    repeatability: str = ""

    def model(self, sequential: bool) -> LatencyCoefficients:
        """The fit a cell is judged with: ``sequential`` for one that sends one request at a time."""
        return self.sequential if sequential else self.all


def probe_config(target: ServerTarget, concurrency: int = 1) -> ProbeConfig:
    # Per worker and run: two workers' probes on one external server must not hit each other's prefixes.
    seed = cell_seed(7, f"probe::{target.url}::{worker_id()}::{target.namespace}")
    sequential = concurrency <= 1
    return ProbeConfig(seed=seed, max_prompt=MAX_PROMPT, decode_max=max(concurrency, 1),
                       ramp_max=1 if sequential else concurrency, mixed=not sequential)


def server_limits(target: ServerTarget, max_model_len: int, **limits: int) -> ServerLimits:
    return ServerLimits(max_model_len=max_model_len, block_size=target.block_size,
                        num_gpu_blocks=target.num_gpu_blocks, **limits)


def plan_probe(target: ServerTarget, *, max_num_seqs: int, max_num_batched_tokens: int,
               concurrency: int = 1) -> WorkloadPlan:
    """The probe's workload plan for ``target``, sized for cells up to ``concurrency`` in flight."""
    # max_model_len from /v1/models; the geometry the target already knows (it replays with it)
    limits = read_limits(target.url, model=target.model, block_size=target.block_size,
                         num_gpu_blocks=target.num_gpu_blocks, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens)
    return probe_plan(limits, probe_config(target, concurrency))


def run_probe(target: ServerTarget, artifacts_dir: Path, *, max_num_seqs: int, max_num_batched_tokens: int,
              concurrency: int = 1, step_shape: str = "linear") -> ProbeFit:
    """Observe the probe and fit the latency models (:class:`ProbeFit`). ``concurrency``: the highest
    concurrency the cells judged with them will use; ``step_shape`` the fitted model's shape (the scenario's
    ``server.step_shape``)."""
    paths = CellPaths(artifacts_dir / f"probe-{target.key}-{worker_id()}")
    plan = plan_probe(target, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                      concurrency=concurrency)
    options = ObserveOptions(model=target.model, max_concurrency=max_in_flight(plan), progress=False,
                             window_phases=fitted_phases(plan), workload_label="pytest-blis probe",
                             tokenizer=target.tokenizer)
    with target.exclusive():
        result = observe_step(target.url, plan, options, paths)
    def fitted_on(out: Path, phases: Collection[str] | None = None) -> LatencyCoefficients:
        return fit_latency_model(result.trace, target, out, step_shape=step_shape, phases=phases,
                                 max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)

    every = fitted_on(paths.root / "latency.json")
    repeats = write_repeatability(result.trace, paths.root / "repeatability.json")
    fitted = set(fitted_phases(plan))
    alone = one_at_a_time(fitted)
    if not alone or alone == fitted:
        return ProbeFit(every, every, repeats)
    sequential = fitted_on(paths.root / "latency-sequential.json", alone)
    return ProbeFit(every, sequential, repeats)


def write_repeatability(trace: Trace, out: Path) -> str:
    """The TTFT spread of the probe's identical lone requests (:mod:`blis_sim.probe.repeat`), written to
    ``out`` (JSON); returns its one-line description, empty when the probe sent no repeats."""
    groups = repeat_groups(trace.records)
    if not groups:
        return ""
    line = describe(groups)
    out.write_text(json.dumps({"floor": repeat_floor(groups), "summary": line,
                               "groups": [dataclasses.asdict(g) for g in groups]}, indent=2) + "\n")
    return line
