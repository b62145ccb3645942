"""What a fit on narrow prompts says about long ones, with and without the roofline prior (issue 12).

    python benchmarks/bench_fit_extrapolation.py [--seeds 4] [--noise 0.05]

An engine-generated trace (300 requests at 2 req/s, prompts 929-1047 tokens, coefficients near a
14B model on an H100 but off the prior: attention 0.0025 µs per pair against 0.00184) with each
TTFT and decode span scaled by 1 ± noise (seeded). For each seed, `fit` without and with the
Qwen3-14B/H100 prior: the error of the predicted 4096-token prefill step, the in-sample TTFT MAPE,
and the coefficients it reports unidentified. The trace and the noise are the tests' own
(tests/test_engine_fit_trust.py).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_engine_fit_trust import (NOISY_TRUTH, OPTS, QWEN_H100, jittered, narrow_trace,
                                   prefill_us)

from blis_sim.engine.fitting import fit


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--noise", type=float, default=0.05)
    args = ap.parse_args()
    base = narrow_trace(NOISY_TRUTH, n=300)
    want = prefill_us(NOISY_TRUTH, 4096)
    print("seed | prior | 4096-token prefill error | in-sample TTFT MAPE | not identified")
    for seed in range(args.seeds):
        trace = jittered(base, args.noise, seed)
        for prior in (None, QWEN_H100):
            c = fit(trace, OPTS, prior=prior, bootstrap_resamples=30)
            unid = [w.split(" ")[0] for w in c.fit.warnings if " not identified " in w]
            print(f"{seed:4d} | {'yes' if prior else 'no ':5s} | "
                  f"{prefill_us(c, 4096) / want - 1:+24.1%} | {c.fit.ttft_mape:19.3f} | "
                  f"{', '.join(unid)}")


if __name__ == "__main__":
    main()
