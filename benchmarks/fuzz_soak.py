"""Fuzz soak (issue 14): N mutated inputs per format through the readers, in-process, with the CLI's error line.

Each format of ``tests/fuzzing.py`` (trace header, trace data, workload spec with and without phases, offload
config, SimResult, MetricsOutput, calibration report, ITL CSV, coefficient files, scenario YAML, Prometheus
exposition) gets ``--inputs`` mutations of its sample (half byte-level, half structure-aware, seeded), each
loaded as the CLI loads it. The property: it loads, or it fails with one error line naming the file (and the
line for a parse error); never a traceback, never longer than ``--timeout`` seconds (a hang).

    python benchmarks/fuzz_soak.py                          # 100,000 inputs per format, 2 worker processes
    python benchmarks/fuzz_soak.py --inputs 1000 --formats offload-config,sim-results
    python benchmarks/fuzz_soak.py --workers 1 --seed 7
    python benchmarks/fuzz_soak.py --formats trace-header --start 40000 --inputs 5000   # re-run one range

Prints one line per format (inputs, loaded, input errors, failures, hangs, time) and every distinct failure
with a reproducer; exits 1 if any input broke the property. Results are recorded in docs/reliability.md.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import fuzzing  # noqa: E402  (tests/fuzzing.py: the harness the tests use)

SLICE = 5000  # inputs per task: a failure is reported with the seed that reproduces it


def run_slice(name: str, seed: str, start: int, count: int, timeout_s: float) -> dict:
    """``count`` inputs of one format, mutation ``start`` … ``start + count - 1`` of the seeded stream."""
    target = fuzzing.TARGETS[name]
    base = target.sample()
    counts: Counter[str] = Counter()
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="blis-fuzz-") as tmp:
        workdir = Path(tmp)
        for i in range(start, start + count):
            rnd = random.Random(f"{seed}:{name}:{i}")
            data = fuzzing.mutate(target, base, rnd)
            kind, failure = fuzzing.run(target, data, workdir, timeout_s=timeout_s)
            counts[kind] += 1
            if failure is None:
                continue
            key = f"{failure.kind}: {failure.detail.strip().splitlines()[-1][:160]}"
            failures.setdefault(key, f"input #{i} (seed {seed!r}): {failure}")
    return {"name": name, "counts": counts, "failures": failures}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=100_000, help="mutated inputs per format")
    ap.add_argument("--formats", default=",".join(fuzzing.TARGETS), help="comma-separated target names")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", default="soak")
    ap.add_argument("--start", type=int, default=0,
                    help="first input index: inputs START … START+INPUTS-1 of the seeded stream (to re-run a range)")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds before an input counts as a hang")
    ap.add_argument("--progress", action="store_true",
                    help=f"a line every {SLICE} inputs, and each new failure as it is found")
    args = ap.parse_args(argv)
    names = [n for n in args.formats.split(",") if n]
    unknown = set(names) - set(fuzzing.TARGETS)
    if unknown:
        ap.error(f"unknown formats: {', '.join(sorted(unknown))} (known: {', '.join(fuzzing.TARGETS)})")
    print(f"fuzz soak: {args.inputs} inputs per format from #{args.start}, {len(names)} formats, {args.workers} workers, "
          f"seed {args.seed!r}, load average {os.getloadavg()[0]:.2f}", flush=True)
    bad = 0
    t0 = time.perf_counter()
    print(f"{'format':<20} {'inputs':>8} {'loaded':>8} {'errors':>8} {'traceback':>9} {'bad msg':>8} {'hang':>5} "
          f"{'time':>6}", flush=True)
    failures: dict[str, dict[str, str]] = {n: {} for n in names}
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for n in names:  # one format at a time, its line printed as soon as it is done
            t_format = time.perf_counter()
            end = args.start + args.inputs
            futures = [pool.submit(run_slice, n, args.seed, s, min(SLICE, end - s), args.timeout)
                       for s in range(args.start, end, SLICE)]
            c: Counter[str] = Counter()
            for fut in futures:
                res = fut.result()
                c.update(res["counts"])
                for k, v in res["failures"].items():
                    if k not in failures[n] and args.progress:  # seen now, not only at the end of a long run
                        print(f"  {n}: new failure {k}\n    {v.splitlines()[0]}", flush=True)
                    failures[n].setdefault(k, v)
                if args.progress:
                    print(f"  {n}: {sum(c.values())} inputs, {c['traceback'] + c['bad-message'] + c['hang']} "
                          f"failures, {time.perf_counter() - t_format:.0f}s", flush=True)
            print(f"{n:<20} {sum(c.values()):>8} {c['loaded']:>8} {c['input-error']:>8} {c['traceback']:>9} "
                  f"{c['bad-message']:>8} {c['hang']:>5} {time.perf_counter() - t_format:>5.0f}s", flush=True)
            bad += c["traceback"] + c["bad-message"] + c["hang"]
    print(f"total {time.perf_counter() - t0:.0f} s, load average {os.getloadavg()[0]:.2f}")
    for n in names:
        for k, v in failures[n].items():
            print(f"\n--- {n}: {k}\n{v}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
