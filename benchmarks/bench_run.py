"""`blis run` benchmark: wall time, CPU time and peak RSS with and without ``--trace-output``.

The workload is ``samples/blis/workload.yaml`` at the sizes given, simulated on 20,000 GPU blocks of
the bundled Qwen3-14B geometry; each command runs in a fresh interpreter, timed from outside (its
own CPU time and peak RSS), so the cost curve per request can be read off the printed figures.

    python benchmarks/bench_run.py                       # 25k, 50k, 100k requests
    python benchmarks/bench_run.py --sizes 10000,100000,1000000,10000000   # the cost curve

CPU time is printed with the machine's load average: on a shared 2-core machine wall time is only
meaningful when the load average is below ~1.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

from bench_replay import ROOT, SAMPLES, _timed, per_request


def run_once(n: int, out_dir: str, trace: bool) -> tuple[float, float, float]:
    cmd = [sys.executable, "-m", "blis_sim.cli", "run", "--workload-spec", str(SAMPLES / "workload.yaml"),
           "--num-requests", str(n), "--total-kv-blocks", "20000", "--model", "qwen/qwen3-14b",
           "--results-path", os.path.join(out_dir, "sim.json")]
    if trace:
        cmd += ["--trace-output", os.path.join(out_dir, "trace")]
    return _timed(cmd, dict(os.environ, PYTHONPATH=str(ROOT)), out_dir, "blis run")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="25000,50000,100000")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            for trace in (False, True):
                wall, cpu, rss = run_once(n, tmp, trace)
                print(f"{n:>8} requests{' + --trace-output' if trace else '':>18}: {wall:.2f} s wall, "
                      f"CPU {cpu:.2f} s ({per_request(cpu, n)}), peak RSS {rss:.0f} MB "
                      f"({rss * 2**20 / n:.0f} B/request); machine load average "
                      f"{os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
