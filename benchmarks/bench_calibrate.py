"""`blis calibrate` benchmark: wall time, CPU time and peak RSS of the whole command, per size.

For each size the replay trace of ``bench_replay.py`` is replayed once (``blis replay
--trace-output``, not timed here) and its re-export is calibrated against its own SimResult and
MetricsOutput files: every request pairs, so the command does all of its per-request work (pairing,
TTFT/E2E statistics, goodput, capacity, per-request hit agreement). Each command runs in a fresh
interpreter, timed from outside, so the cost curve per request can be read off the printed figures.

    python benchmarks/bench_calibrate.py                          # 10k, 100k, 1M requests
    python benchmarks/bench_calibrate.py --sizes 10000,100000
    python benchmarks/bench_calibrate.py --sizes 10000,100000,1000000,10000000 \
        --fs-max-bytes 2199023255552                          # the cost curve, a 2 TiB fs tier

CPU time is printed with the machine's load average: on a shared 2-core machine wall time is only
meaningful when the load average is below ~1.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

from bench_replay import ROOT, _timed, cached_trace, per_request


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--fs-max-bytes", type=int, default=None, metavar="BYTES",
                    help="replay on bench_replay's trace with its fs tier bounded to BYTES (default: "
                         "unbounded, as the sample config: the replay that makes the files to "
                         "calibrate then holds every chunk ever stored)")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            prefix = cached_trace(n, args.fs_max_bytes)
            sim, agg, re = (os.path.join(tmp, f) for f in ("sim.json", "simagg.json", "re"))
            _timed([sys.executable, "-m", "blis_sim.cli", "replay", "--trace-header", f"{prefix}.yaml",
                    "--trace-data", f"{prefix}.csv", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000",
                    "--results-path", sim, "--metrics-path", agg, "--trace-output", re], env, tmp, "blis replay")
            cmd = [sys.executable, "-m", "blis_sim.cli", "calibrate", "--trace-header", f"{re}.yaml",
                   "--trace-data", f"{re}.csv", "--sim-results", sim, "--sim-metrics", agg,
                   "--report", os.path.join(tmp, "calibration.json")]
            wall, cpu, rss = _timed(cmd, env, tmp, "blis calibrate")
            print(f"{n:>8} requests: `blis calibrate` {wall:.2f} s wall, CPU {cpu:.2f} s "
                  f"({per_request(cpu, n)}), peak RSS {rss:.0f} MB; machine load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
