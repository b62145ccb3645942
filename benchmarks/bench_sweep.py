"""Sweep benchmark (issue 16): a 100-point `blis sweep` over the 10k-request tiered trace of
``benchmarks/bench_replay.py``, start to finish.

The trace is bench_replay's (16 prefix groups × 1024-token prefixes + 10 % unique prompts, Poisson
at 8 req/s, the sample offload config: 1 GiB CPU tier + nvme_gen4 fs tier, Qwen3-14B KV size),
replayed on 1000 GPU blocks of 16 tokens. The sweep is a 10 × 10 grid: the CPU tier
(``kv_offload.cpu_bytes_to_use``, 128 MiB … 8 GiB) by the fs tier's read bandwidth
(``kv_offload.secondary_tiers.0.read_bandwidth``, 350 … 7000 bytes/µs). The figure is the whole
command in a fresh interpreter (start-up, loading the trace, 100 replays on every local core
through the process pool, the table and two plots), timed from outside; the load average is
printed before and after.

    python benchmarks/bench_sweep.py                  # the 100-point figure (target ≤ 30 s on 2 cores)
    python benchmarks/bench_sweep.py --requests 50000 --workers 1
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay import make_trace  # noqa: E402

SWEEP = """\
mode: grid
axes:
  kv_offload.cpu_bytes_to_use: [128MiB, 256MiB, 384MiB, 512MiB, 768MiB, 1GiB, 1536MiB, 2GiB, 4GiB, 8GiB]
  kv_offload.secondary_tiers.0.read_bandwidth: [350, 700, 1050, 1400, 2100, 2800, 3500, 4200, 5600, 7000]
plot:
  metrics: [hit_rate.external, hit_rate.by_source.disk, ttft_p99_ms]
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=None, help="default: every local core")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "trace"
        make_trace(args.requests, prefix)
        sweep = Path(tmp) / "sweep.yaml"
        sweep.write_text(SWEEP)
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "blis_sim.cli", "sweep", "--trace-header", f"{prefix}.yaml",
               "--trace-data", f"{prefix}.csv", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000",
               "--sweep", str(sweep), "--output-dir", str(out)]
        if args.workers:
            cmd += ["--workers", str(args.workers)]
        load_before = os.getloadavg()
        err_path = Path(tmp) / "stderr"
        t0 = time.perf_counter()
        with err_path.open("w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
            _, status, usage = os.wait4(proc.pid, 0)  # its CPU includes the pool workers it waited for
        wall = time.perf_counter() - t0
        load_after = os.getloadavg()
        stderr = err_path.read_text()
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"blis sweep failed: {stderr[-2000:]}")
        cpu = usage.ru_utime + usage.ru_stime
        with (out / "sweep.csv").open() as f:
            rows = list(csv.DictReader(f))
        per_point = [float(line.rsplit(" ", 2)[-2]) for line in stderr.splitlines()
                     if line.startswith("sweep: [")]
        ext = [float(r["hit_rate.external"]) for r in rows]
        print(f"{len(rows)}-point sweep over {args.requests} requests: {wall:.1f} s wall start to finish "
              f"({os.cpu_count()} cores, workers {args.workers or 'all'}); CPU {cpu:.1f} s "
              f"(the command and its workers); per point "
              f"{sum(per_point) / max(len(per_point), 1):.2f} s mean in its worker; "
              f"hit_rate.external {min(ext):.3f}..{max(ext):.3f}; load average before "
              f"{load_before[0]:.1f} / after {load_after[0]:.1f} (1-min)", flush=True)


if __name__ == "__main__":
    main()
