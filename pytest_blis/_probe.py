"""The probe phase: a short workload per server whose trace fits the engine's latency model.

A scenario's own requests are never used to fit what they are judged against, so every server gets
its probe once per worker, before its first cell, and the fitted coefficients are an artifact
(``<artifacts>/probe-<server>-<worker>/latency.json``, the probe's trace beside it).

The probe is designed so the least squares can tell the terms of the linear model apart:

``warmup``      two short requests, outside the fitted window (a fresh server's first request pays
                one-off costs: connection set-up, lazy imports, allocator growth);
``cold-<L>``    one unique prompt per length, sent alone: base + per-prefill-token;
``cached-<L>-<k>``  the same prefix again (twice) with a new suffix, sent alone: separates the
                work a cached prefix saves from the per-request overheads that stay (frontend);
``decode``      short prompts with long outputs, sent alone: per-step base + per-decode-sequence
                (inter-token latency);
``ramp-<N>``    N concurrent unique prompts for a small N ramp: the load-dependent terms
                (batched prefill, per-in-flight frontend time) without one large burst dominating.

Every probe request is its own phase or a drained group, with an idle gap before it, so
"sequential" really means alone on the server; the whole probe is a few dozen requests.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from blis_sim.observe.run import ObserveOptions
from blis_sim.workload import PhasePlan, PlannedRequest, WorkloadPlan
from pytest_blis._phases import _EMPTY_SPEC, cell_seed
from pytest_blis._server import ServerTarget
from pytest_blis._session import worker_id
from pytest_blis._steps import CellPaths, observe_step

PROBE_LENGTHS = (64, 256, 1024, 2048, 4096)  # prefix lengths (tokens) of the cold/cached pairs
SUFFIX = 32                                   # fresh tokens after each prefix
CACHED_REPEATS = 2                            # cached TTFTs are short: two samples each
TTFT_OUTPUT = 4                               # TTFT requests: a few tokens, so they end quickly
DECODE_PROMPT, DECODE_OUTPUT, DECODE_REQUESTS = 64, 64, 2
RAMP = (2, 4)                                 # concurrency levels of the load part
RAMP_PROMPT, RAMP_OUTPUT = 512, 16
IDLE_GAP_US = 30_000                          # idle time before each phase: the server is quiet


def _limit(target: ServerTarget) -> int:
    """Largest probe prefix: a quarter of the GPU cache, so the probe never evicts its own prefixes."""
    return max(64, target.block_size * target.num_gpu_blocks // 4)


def probe_plan(target: ServerTarget) -> WorkloadPlan:
    """The probe's phases (see the module docstring), sized to the server's GPU cache."""
    from blis_sim.formats.workload import WorkloadSpec

    # Per worker and run: two workers' probes on one external server must not hit each other's prefixes.
    seed = cell_seed(7, f"probe::{target.url}::{worker_id()}::{target.namespace}")
    phases: list[PhasePlan] = []

    def add(name: str, reqs: list[dict[str, Any]]) -> None:
        index = len(phases)
        planned = tuple(PlannedRequest(uid=f"{index}.{n}", phase=name, phase_index=index, client_id="probe",
                                       arrival_us=0, streaming=True, **r) for n, r in enumerate(reqs))
        phases.append(PhasePlan(index=index, name=name, seed=seed, gap_us=IDLE_GAP_US, horizon_us=0,
                                num_requests=len(planned), requests=planned))

    def unique(length: int, output: int) -> dict[str, Any]:
        return {"input_tokens": length, "output_tokens": output}

    for k in range(2):
        add(f"warmup-{k}", [unique(64, TTFT_OUTPUT)])
    lengths = [n for n in PROBE_LENGTHS if n <= _limit(target)]
    for n, length in enumerate(lengths):
        group = {"prefix_group": f"probe{seed:x}-{n}", "prefix_length": length,
                 "input_tokens": length + SUFFIX, "new_input_tokens": SUFFIX, "output_tokens": TTFT_OUTPUT}
        add(f"cold-{length}", [group])
        for k in range(CACHED_REPEATS):
            add(f"cached-{length}-{k}", [group])
    for k in range(DECODE_REQUESTS):
        add(f"decode-{k}", [unique(DECODE_PROMPT, DECODE_OUTPUT)])
    for level in RAMP:
        add(f"ramp-{level}", [unique(RAMP_PROMPT, RAMP_OUTPUT) for _ in range(level)])
    spec = WorkloadSpec.model_validate({**_EMPTY_SPEC, "seed": seed})
    return WorkloadPlan(seed=seed, spec=spec, phases=tuple(phases))


def fitted_phases(plan: WorkloadPlan) -> tuple[str, ...]:
    """The phases the fit uses: all but the warm-up."""
    return tuple(p.name for p in plan.phases if not p.name.startswith("warmup"))


def run_probe(target: ServerTarget, artifacts_dir: Path, *, max_num_seqs: int, max_num_batched_tokens: int) -> Any:
    """Observe the probe and fit the latency model; returns the engine's ``LatencyCoefficients``."""
    from pytest_blis._replay import fit_latency_model

    paths = CellPaths(artifacts_dir / f"probe-{target.key}-{worker_id()}")
    plan = probe_plan(target)
    options = ObserveOptions(model=target.model, max_concurrency=max(RAMP), progress=False,
                             window_phases=fitted_phases(plan), workload_label="pytest-blis probe")
    with target.exclusive():
        result = observe_step(target.url, plan, options, paths)
    return fit_latency_model(result.trace, target, paths.root / "latency.json", max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens)
