"""How a capacity error in the step model becomes a TTFT error near saturation (issue 12, fault 4).

    python benchmarks/bench_roofline_saturation.py [--rates 2,6,9,11] [--requests 600]

Qwen3-14B on one H100, prompts ~1000 tokens (929-1047), outputs ~200, Poisson arrivals. The "real"
server is the whole-batch roofline as it is now (every computed token priced at the GEMM
efficiency); the "old" model is the same roofline with each decode token priced at the hardware
table's low-batch decode MFU (0.30 instead of 0.45), as before the fix. Prints, per arrival rate, the
mean TTFT of both and their ratio: the models agree at low load (the decode steps are memory bound
there) and drift apart without bound once the old model's smaller capacity is exceeded.
"""
from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from blis_sim.engine.latency import StepModel, get_hardware, roofline
from blis_sim.engine.models import KNOWN_MODELS
from blis_sim.engine.run_spec import run_outcome
from blis_sim.engine.simulate import EngineOptions
from blis_sim.formats.workload import parse_workload_spec

SPEC = """
version: "2"
seed: 5
aggregate_rate: {rate}
num_requests: {n}
clients:
  - {{id: u, rate_fraction: 1.0, arrival: {{process: poisson}},
     input_distribution: {{type: gaussian, params: {{mean: 988, std_dev: 30, min: 929, max: 1047}}}},
     output_distribution: {{type: gaussian, params: {{mean: 200, std_dev: 50, min: 64, max: 400}}}}}}
"""


def old_decode_pricing(model: StepModel, mfu_prefill: float, mfu_decode: float) -> StepModel:
    compute = list(model.compute)
    for j in (2, 3):  # decode sequences and decode context (attention) at the decode MFU
        compute[j] *= mfu_prefill / mfu_decode
    return replace(model, compute=tuple(compute))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="2,6,9,11")
    ap.add_argument("--requests", type=int, default=600)
    args = ap.parse_args()
    hw = get_hardware("H100")
    new = roofline(KNOWN_MODELS["qwen/qwen3-14b"], hw)
    old = old_decode_pricing(new, hw.mfu_prefill, hw.mfu_decode)
    opts = EngineOptions(model="qwen/qwen3-14b", max_num_seqs=256, max_num_batched_tokens=8192)
    print("rate req/s | mean TTFT now ms | mean TTFT old decode pricing ms | ratio | preemptions old")
    for rate in (float(r) for r in args.rates.split(",")):
        spec = parse_workload_spec(SPEC.format(rate=rate, n=args.requests))
        now = run_outcome(spec, replace(opts, latency=new)).outcome
        then = run_outcome(spec, replace(opts, latency=old)).outcome
        a, b = float(np.nanmean(now.ttft_us)) / 1e3, float(np.nanmean(then.ttft_us)) / 1e3
        print(f"{rate:10g} | {a:16.1f} | {b:31.1f} | {b / a:5.1f} | {then.loop.preemption_count}")


if __name__ == "__main__":
    main()
