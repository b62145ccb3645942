"""The probe phase: a short workload per server whose trace fits the engine's latency model.

A scenario's own requests are never used to fit what they are judged against, so every server gets
its probe once per worker, before its first cell, and the fitted coefficients are an artifact
(``<artifacts>/probe-<server>-<worker>/latency.json``, the probe's trace beside it).

The probe is designed so the least squares can tell the terms of the linear model apart:

``warmup``      two short requests, outside the fitted window (a fresh server's first request pays
                one-off costs: connection set-up, lazy imports, allocator growth);
``cold-<L>-<k>``  unique prompts of each length (two), sent alone: base + per-prefill-token;
``seed-<L>``    one more cold prompt whose prefix the next phases repeat;
``cached-<L>-<k>``  that prefix again (twice) with new suffixes, sent alone: separates the work a
                cached prefix saves from the per-request overheads that stay (frontend);
``decode``      short prompts with long outputs, sent alone: per-step base + per-decode-sequence
                (inter-token latency);
``ramp-<N>``    N concurrent unique prompts, N = 2, 4, 8, ... up to the highest ``concurrency`` of
                the cells that will run: the load-dependent terms (batched prefill, per-in-flight
                frontend time) over the range the cells use, without one large burst dominating.
                Sequential cells (concurrency 1) get no ramp: the load terms are then not fitted,
                which is right for them (nothing else is in flight when they arrive).

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
COLD_SAMPLES = 2                              # two cold samples per length (one hiccup is set aside)
CACHED_REPEATS = 2                            # cached TTFTs are short: two samples each
TTFT_OUTPUT = 4                               # TTFT requests: a few tokens, so they end quickly
DECODE_PROMPT, DECODE_OUTPUT, DECODE_REQUESTS = 64, 64, 2
RAMP_PROMPT, RAMP_OUTPUT = 512, 16           # per ramp request (prompt capped by the cache)
IDLE_GAP_US = 0  # phases drain, so each request is alone; no extra idle time (cells send back to back too)


def _limit(target: ServerTarget) -> int:
    """Largest probe prefix: a quarter of the GPU cache, so the probe never evicts its own prefixes."""
    return max(64, target.block_size * target.num_gpu_blocks // 4)


def ramp_levels(concurrency: int) -> tuple[int, ...]:
    """Concurrency levels of the ramp: powers of two below ``concurrency``, then ``concurrency``."""
    if concurrency <= 1:
        return ()
    levels = [c for c in (2, 4, 8, 16, 32, 64, 128, 256, 512) if c < concurrency]
    return (*levels, concurrency)


def probe_plan(target: ServerTarget, concurrency: int = 1) -> WorkloadPlan:
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
        for k in range(COLD_SAMPLES):  # unique prefixes: each cold sample misses
            add(f"cold-{length}-{k}", [{**group, "prefix_group": f"probe{seed:x}-{n}-cold{k}"}])
        add(f"seed-{length}", [group])
        for k in range(CACHED_REPEATS):
            add(f"cached-{length}-{k}", [group])
    for k in range(DECODE_REQUESTS):
        add(f"decode-{k}", [unique(DECODE_PROMPT, DECODE_OUTPUT)])
    for level in ramp_levels(concurrency):
        prompt = max(16, min(RAMP_PROMPT, _limit(target) // level))
        add(f"ramp-{level}", [unique(prompt, RAMP_OUTPUT) for _ in range(level)])
    spec = WorkloadSpec.model_validate({**_EMPTY_SPEC, "seed": seed})
    return WorkloadPlan(seed=seed, spec=spec, phases=tuple(phases))


def fitted_phases(plan: WorkloadPlan) -> tuple[str, ...]:
    """The phases the fit uses: all but the warm-up."""
    return tuple(p.name for p in plan.phases if not p.name.startswith("warmup"))


def run_probe(target: ServerTarget, artifacts_dir: Path, *, max_num_seqs: int, max_num_batched_tokens: int,
              concurrency: int = 1) -> Any:
    """Observe the probe and fit the latency model; returns the engine's ``LatencyCoefficients``.
    ``concurrency``: the highest concurrency the cells judged with this fit will use."""
    from pytest_blis._replay import fit_latency_model

    paths = CellPaths(artifacts_dir / f"probe-{target.key}-{worker_id()}")
    plan = probe_plan(target, concurrency)
    options = ObserveOptions(model=target.model, max_concurrency=max(concurrency, 1), progress=False,
                             window_phases=fitted_phases(plan), workload_label="pytest-blis probe")
    with target.exclusive():
        result = observe_step(target.url, plan, options, paths)
    return fit_latency_model(result.trace, target, paths.root / "latency.json", max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens)
