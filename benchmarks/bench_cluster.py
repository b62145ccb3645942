"""Cluster replay benchmark (issue 28): a 4-replica replay of 100,000 requests against the
single-replica replay of the same trace, each the whole ``blis replay`` command in a fresh process.

The trace is :mod:`bench_replay`'s (16 prefix groups × 1024-token prefixes, 10 % unique prompts,
the sample offload config recorded in the header), on 1000 GPU blocks of 16 tokens per replica. The
4-replica runs re-route it (``--num-instances 4``) with round-robin, with prefix-affinity and with
least-loaded (routed on the replicas' one clock first, then simulated: docs/cluster.md §2).

    python benchmarks/bench_cluster.py                    # 100,000 requests, 3 runs each, alternating
    python benchmarks/bench_cluster.py --requests 20000 --repeat 1

Target: the 4-replica replay takes at most 4× the single-replica time (CPU seconds of the command;
wall time is printed beside it with the load average: on the shared 2-core machine wall time means
something only when the load average is below ~1).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay import ROOT, _timed, cached_trace  # noqa: E402

TARGET = 4.0


def command(prefix: Path, out_dir: str, tag: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "blis_sim.cli", "replay", "--trace-header", f"{prefix}.yaml",
            "--trace-data", f"{prefix}.csv", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000",
            "--results-path", os.path.join(out_dir, f"{tag}-sim.json"),
            "--metrics-path", os.path.join(out_dir, f"{tag}-simagg.json"), *extra]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    prefix = cached_trace(args.requests)
    cases = {"1 replica": [],
             "4 replicas, round-robin": ["--num-instances", "4", "--routing-policy", "round-robin"],
             "4 replicas, prefix-affinity": ["--num-instances", "4", "--routing-policy", "prefix-affinity"],
             "4 replicas, least-loaded": ["--num-instances", "4", "--routing-policy", "least-loaded"]}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    runs: dict[str, list[tuple[float, float, float]]] = {k: [] for k in cases}
    with tempfile.TemporaryDirectory() as out_dir:
        for _ in range(args.repeat):
            for i, (name, extra) in enumerate(cases.items()):  # alternating: the same load for each
                runs[name].append(_timed(command(prefix, out_dir, str(i), extra), env, out_dir, name))
    base_cpu = statistics.median(r[1] for r in runs["1 replica"])
    base_wall = statistics.median(r[0] for r in runs["1 replica"])
    print(f"{args.requests} requests, median of {args.repeat}, load average {os.getloadavg()[0]:.2f}")
    worst = 0.0
    for name, rs in runs.items():
        wall, cpu = statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)
        rss = max(r[2] for r in rs)
        ratio = cpu / base_cpu
        if name != "1 replica":
            worst = max(worst, ratio)
        print(f"  {name:30s} wall {wall:6.2f} s ({wall / base_wall:4.2f}x)  CPU {cpu:6.2f} s "
              f"({ratio:4.2f}x)  peak RSS {rss:5.0f} MB")
    verdict = "within" if worst <= TARGET else "OVER"
    print(f"4 replicas: at most {worst:.2f}x the single-replica CPU time ({verdict} the {TARGET:g}x target)")
    sys.exit(0 if worst <= TARGET else 1)


if __name__ == "__main__":
    main()
