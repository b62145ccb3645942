"""Latency-model fidelity outside the probe's regime, on the emulator's non-linear profile (issue 12).

Run:  python benchmarks/bench_latency_fidelity.py [--requests N] [--budget S] [--out DIR]

1. Serve the emulator (a separate process) with ``h100-14b-roofline``: steps are ``overhead + max(compute,
   memory)`` with attention quadratic in the context, outside the simulator's linear family, so the fit
   cannot recover what the emulator was given.
2. Probe it with `blis probe` (blis_sim.probe: prompts 64..4096, decode batches 1..256, mixed steps, a ramp
   to 256 concurrent requests) and fit the simulator's linear model on the probe only (blis_sim.engine.fit).
3. Validate on traces the fit never saw: two prompt mixes (64 output tokens), the probe's median prompt
   length (the median of its single-request lengths, 64..4096: 512) and 4x it (2048). Per mix, first a
   burst of ``--requests`` sent at once (saturated: it measures the mix's maximum throughput), then four
   open-loop Poisson loads at 0.25, 0.5, 0.75 and 1.5x that throughput (the last saturated). Each trace is
   replayed with the fitted model (the server's scheduler and KV settings) and calibrated.

Prints one row per trace: mix, load, TTFT MAPE, E2E MAPE, observed and predicted throughput (req/s, output
tok/s) and whether calibrate found the window saturated; then, as a ceiling, the TTFT and E2E MAPE of the
same replay with the emulator's own step shape written in the engine's two-row form (``StepModel``:
``max(compute . F, memory . F)``, no frontend term): what a fit with a memory row could reach at best, the
rest being HTTP and scheduling jitter on this machine. Targets (issue 12): TTFT MAPE <= 15 % at every
unsaturated load; at saturation, the maximum throughput within 5 % (TTFT MAPE reported). Ends with wall
time, peak RSS and the load average. The emulator runs in real time: ~10 minutes with 400 requests a trace.

How precise: the verdict is the request-level MAPE, as `blis calibrate` judges it. On the 512-token mix a
TTFT is ~30-60 ms and a step ~11-35 ms, and when a request lands within the step in progress (which the
emulator's step noise moves) differs between server and simulator for any step model: each request's error
has a floor of ~10-13 %, scattered widely. So the per-trace MAPE is an estimate with a sampling spread, and
each row prints its 95 % bootstrap interval over the requests: with 100 requests a trace it spanned ~±2
points (9-16 % on the same settings, run to run), hence 400 by default. Beside it, two figures that the
scatter does not move: the MAPE of the two TTFT distributions compared quantile by quantile (sorted against
sorted) and the mean bias (sim - real, ms): a model that is right on average scores a few % there whatever
the floor. Neither replaces the verdict.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from blis_sim.calibrate import calibrate_detailed
from blis_sim.emulator import EmulatorConfig, spawn_emulator
from blis_sim.emulator.profiles import get_profile
from blis_sim.engine import EngineOptions, fit, replay_outcome
from blis_sim.engine.latency import StepModel
from blis_sim.engine.prior import resolve_prior
from blis_sim.formats.workload import WorkloadSpec
from blis_sim.observe.run import ObserveOptions, observe, write_result
from blis_sim.probe import ProbeConfig, ProbeOptions, read_limits, run_probe

PROFILE = "h100-14b-roofline"
MAX_NUM_SEQS, MAX_BATCHED = 1024, 8192
LOADS = (0.25, 0.5, 0.75, 1.5)
OUTPUT = 64
TTFT_TARGET, CAPACITY_TARGET = 0.15, 0.05


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def spec(prompt: int, rate: float, n: int, seed: int) -> WorkloadSpec:
    client = {"id": "v", "rate_fraction": 1, "streaming": True, "arrival": {"process": "poisson"},
              "input_distribution": {"type": "constant", "params": {"value": prompt}},
              "output_distribution": {"type": "constant", "params": {"value": OUTPUT}}}
    return WorkloadSpec.model_validate({"version": "2", "seed": seed, "aggregate_rate": rate, "num_requests": n,
                                        "clients": [client]})


def burst(prompt: int, n: int, seed: int) -> WorkloadSpec:
    """``n`` requests sent at once: a queue from the start, the mix's maximum throughput."""
    client = {"id": "v", "rate_fraction": 1, "streaming": True, "arrival": {"process": "constant"},
              "input_distribution": {"type": "constant", "params": {"value": prompt}},
              "output_distribution": {"type": "constant", "params": {"value": OUTPUT}}}
    return WorkloadSpec.model_validate({"version": "2", "seed": seed, "aggregate_rate": 1e6, "num_requests": n,
                                        "clients": [client]})


def emulator_shape() -> StepModel:
    """The emulator profile's roofline in the engine's two-row form (µs; features: one, prefill tokens,
    decode seqs, decode context, prefill context, prefill attention pairs)."""
    r = get_profile(PROFILE).roofline
    assert r is not None
    us = 1e6
    compute = (r.overhead_s * us, r.flop_per_token_s * us, r.flop_per_token_s * us, 0.0, 0.0,
               r.attention_pair_s * us)
    kv = r.kv_token_s * us
    memory = ((r.overhead_s + r.weights_s) * us, kv, kv, kv, kv, 0.0)
    return StepModel(kind="emulator-shape", compute=compute, memory=memory)


def engine_options(limits: Any, latency: Any = None) -> EngineOptions:
    extra: dict[str, Any] = {}
    if isinstance(latency, StepModel):
        extra = {"latency": latency, "latency_source": latency.kind}
    elif latency is not None:
        extra = {"latency": latency.to_step_model(), "latency_source": "probe fit"}
    return EngineOptions(block_size=limits.block_size, num_gpu_blocks=limits.num_gpu_blocks,
                         max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_BATCHED, **extra)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=400,
                    help="requests per validation trace (default 400: see 'How precise' in the docstring)")
    ap.add_argument("--budget", type=float, default=150.0, help="probe time budget, s (default 150)")
    ap.add_argument("--max-prompt", type=int, default=4096, help="the probe's longest prompt (default 4096)")
    ap.add_argument("--prior", action="store_true",
                    help="fit with blis fit's roofline prior for qwen/qwen3-14b on H100 (the model the profile is)")
    ap.add_argument("--step-shape", choices=("linear", "roofline"), default="linear",
                    help="the fitted model's shape: linear (one row), or roofline (base + max(compute row, "
                         "memory row): blis fit --step-shape)")
    ap.add_argument("--out", default="", help="keep the traces and reports here (default: a temp dir)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-fidelity-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print(f"profile {PROFILE}; load average at start {load_average()}; artifacts in {out}", flush=True)
    with spawn_emulator(EmulatorConfig(profile=PROFILE, max_num_seqs=MAX_NUM_SEQS,
                                       max_num_batched_tokens=MAX_BATCHED)) as emu:
        limits = read_limits(emu.url, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_BATCHED)
        probe = run_probe(emu.url, limits, ProbeConfig(max_prompt=args.max_prompt, decode_max=256, ramp_max=256),
                          ProbeOptions(model="tiny-llama", time_budget_s=args.budget, progress=False))
        write_result(probe.observed, out / "probe.yaml", out / "probe.csv")
        t_probe = time.perf_counter() - t0
        lengths = {int(p.split("-")[1]) for p in {r.phase for r in probe.observed.trace.records}
                   if p.startswith("cold-")}
        median = int(statistics.median_low(sorted(lengths)))
        ramp_top = max(probe.ramp, key=lambda r: r.rps)
        print(f"probe: {len(probe.observed.trace.records)} requests in {t_probe:.0f} s; median prompt {median}; "
              f"max throughput {probe.max_rps:.2f} req/s {probe.max_output_tps:.0f} output tok/s "
              f"(ramp {ramp_top.level}); warnings: {probe.observed.warnings or 'none'}", flush=True)
        t1 = time.perf_counter()
        prior, label = resolve_prior(model="qwen/qwen3-14b", hardware="H100", shape=args.step_shape) \
            if args.prior else (None, "none")
        coeffs = fit(probe.observed.trace, engine_options(limits), name="probe", prior=prior, prior_label=label,
                     shape=args.step_shape)
        (out / "latency.json").write_text(coeffs.model_dump_json(indent=2) + "\n")
        s = coeffs.step
        print(f"fit ({time.perf_counter() - t1:.1f} s): base {s.base_us:.0f} us, prefill {s.per_prefill_token_us:.2f} "
              f"us/token, decode {s.per_decode_seq_us:.2f} us/seq, context {s.per_context_token_us:.4f} us/token, "
              f"attention {s.per_prefill_attention_us:.5f} us/pair, frontend {coeffs.frontend.base_us:.0f} + "
              f"{coeffs.frontend.per_inflight_us:.1f}/in-flight us; memory row "
              f"{coeffs.memory.model_dump() if coeffs.memory else 'none'}; prior: {label}; its own TTFT MAPE "
              f"{coeffs.fit.ttft_mape * 100 if coeffs.fit else float('nan'):.1f} %; warnings: "
              f"{list(coeffs.fit.warnings) if coeffs.fit else []}", flush=True)
        rows = []
        for mix, prompt in (("probe median", median), ("4x median", 4 * median)):
            capacity = 0.0
            for k, load in enumerate(("burst", *LOADS)):
                rate = 0.0 if load == "burst" else load * capacity  # type: ignore[operator]
                name = f"{prompt}-{load}"
                workload = burst(prompt, args.requests, 100 + k) if load == "burst" else \
                    spec(prompt, rate, args.requests, seed=100 + k)
                result = observe(emu.url, workload,
                                 ObserveOptions(model="tiny-llama", max_concurrency=MAX_NUM_SEQS, progress=False))
                write_result(result, out / f"{name}.yaml", out / f"{name}.csv")
                replay = replay_outcome(result.trace, engine_options(limits, coeffs))
                detailed = calibrate_detailed(result.trace, replay.result_columns(), replay.metrics())
                report = detailed.report
                best = replay_outcome(result.trace, engine_options(limits, emulator_shape()))
                ceiling = calibrate_detailed(result.trace, best.result_columns(), best.metrics()).report.metrics
                c = report.capacity
                if load == "burst" and c is not None:
                    capacity = c.real_rps
                row = (mix, prompt, load, rate, report.metrics["ttft"].request_level.mape,
                       report.metrics["e2e"].request_level.mape, c, load_average(),
                       ceiling["ttft"].request_level.mape, ceiling["e2e"].request_level.mape,
                       ttft_spread(detailed.pairs.ttft.real, detailed.pairs.ttft.sim))
                rows.append(row)
                print(format_row(row), flush=True)
    print()
    print(header())
    for row in rows:
        print(format_row(row))
    failures = check(rows)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nwall {time.perf_counter() - t0:.0f} s, peak RSS {rss:.0f} MiB (this process), load average "
          f"{load_average()}")
    print("targets met" if not failures else "targets missed: " + "; ".join(failures))
    return 0 if not failures else 1


def ttft_spread(real: list[float], sim: list[float], resamples: int = 1000) -> tuple[float, float, float, float]:
    """How precisely a trace measures the request-level TTFT MAPE, and what is left once the per-request
    scatter is set aside: (2.5 and 97.5 percentiles of the MAPE over bootstrap resamples of the requests,
    the MAPE of the sorted TTFTs against each other (the two distributions compared quantile by quantile),
    the mean sim − real TTFT in ms). Reported beside the verdict, which stays the request-level MAPE."""
    r, s = np.asarray(real, dtype=float), np.asarray(sim, dtype=float)
    keep = r != 0
    r, s = r[keep], s[keep]
    ape = np.abs(s - r) / r
    rng = np.random.default_rng(0)
    boot = ape[rng.integers(0, len(ape), size=(resamples, len(ape)))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    sr = np.sort(r)
    return float(lo), float(hi), float(np.mean(np.abs(np.sort(s) - sr) / sr)), float((s - r).mean() / 1e3)


def header() -> str:
    return (f"{'mix':<13} {'prompt':>6} {'load':>5} {'req/s in':>8} {'TTFT MAPE':>9} {'95% interval':>13} "
            f"{'E2E MAPE':>8}  {'obs req/s':>9} {'sim req/s':>9} {'obs tok/s':>9} {'sim tok/s':>9} "
            f"{'saturated':>9}  {'ceiling TTFT/E2E':>16}  {'quantiles':>9} {'bias ms':>7}  load avg")


def format_row(row: tuple[Any, ...]) -> str:
    mix, prompt, load, rate, ttft, e2e, c, la, best_ttft, best_e2e, (lo, hi, quant, bias) = row
    cap = (f"{c.real_rps:>9.2f} {c.sim_rps:>9.2f} {c.real_output_tps:>9.0f} {c.sim_output_tps:>9.0f} "
           f"{c.saturated!s:>9}") if c is not None else f"{'-':>9} " * 5
    best = f"{best_ttft * 100:.1f}% / {best_e2e * 100:.1f}%"
    interval = f"{lo * 100:.1f}-{hi * 100:.1f}%"
    return (f"{mix:<13} {prompt:>6} {load:>5} {rate or float('inf'):>8.2f} {ttft * 100:>8.1f}% {interval:>13} "
            f"{e2e * 100:>7.1f}%  {cap}  {best:>16}  {quant * 100:>8.1f}% {bias:>+7.1f}  {la}")


def check(rows: list[tuple[Any, ...]]) -> list[str]:
    failures = []
    for mix, _prompt, load, _rate, ttft, _e2e, c, *_rest in rows:
        where = f"{mix} at {load}"
        if c is not None and c.saturated:
            if c.rps_error > CAPACITY_TARGET or c.output_tps_error > CAPACITY_TARGET:
                failures.append(f"{where}: throughput off by {c.rps_error * 100:.1f} % (req/s), "
                                f"{c.output_tps_error * 100:.1f} % (tok/s)")
        elif ttft > TTFT_TARGET:
            failures.append(f"{where}: TTFT MAPE {ttft * 100:.1f} %")
    return failures


if __name__ == "__main__":
    sys.exit(main())
