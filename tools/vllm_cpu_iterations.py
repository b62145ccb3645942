#!/usr/bin/env python3
"""vLLM's per-iteration log as a table: each engine step's batch and its model time (standard library only).

A server started with ``--enable-logging-iteration-details`` (``python tools/vllm_cpu.py start --log-iterations``)
logs one line per engine step: its prefill ("context") requests and tokens, its decode ("generation") requests, and
the time from dispatching the batch to its result ("iteration elapsed time"). Between two such times lies what the
engine does around the model: scheduling, output handling, streaming. docs/vllm-cpu-calibration.md compares the two
against the fitted step model.

    python tools/vllm_cpu_iterations.py ~/.cache/pytest-blis/vllm-server.log --csv iterations.csv
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

_LINE = re.compile(
    r"INFO (?P<time>\d\d-\d\d \d\d:\d\d:\d\d) .*?Iteration\((?P<index>\d+)\): (?P<prefill_requests>\d+) context "
    r"requests, (?P<prefill_tokens>\d+) context tokens, (?P<decode_requests>\d+) generation requests, "
    r"(?P<decode_tokens>\d+) generation tokens, iteration elapsed time: (?P<elapsed_ms>[\d.]+) ms")


@dataclasses.dataclass(frozen=True)
class Iteration:
    """One engine step as vLLM logged it (``time``: the log's own stamp, local time, to the second)."""

    time: str
    index: int
    prefill_requests: int
    prefill_tokens: int
    decode_requests: int
    decode_tokens: int
    elapsed_ms: float


def parse(lines: Iterable[str]) -> Iterator[Iteration]:
    """The iteration lines among ``lines``; every other line is skipped."""
    for line in lines:
        match = _LINE.search(line)
        if match:
            g = match.groupdict()
            yield Iteration(time=g["time"], elapsed_ms=float(g["elapsed_ms"]),
                            **{k: int(v) for k, v in g.items() if k not in ("time", "elapsed_ms")})


def write_csv(rows: Iterable[Iteration], path: Path) -> None:
    """Write ``rows`` with a header line of the field names."""
    fields = [f.name for f in dataclasses.fields(Iteration)]
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(fields)
        writer.writerows([getattr(row, f) for f in fields] for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/vllm_cpu_iterations.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="the server's log (tools/vllm_cpu.py paths: log_file)")
    parser.add_argument("--csv", type=Path, help="write every iteration here")
    args = parser.parse_args(argv)
    try:
        with args.log.open(errors="replace") as fh:
            rows = list(parse(fh))
    except OSError as exc:
        print(f"tools/vllm_cpu_iterations.py: cannot read {args.log}: {exc.strerror}", file=sys.stderr)
        return 2
    if not rows:
        print(f"tools/vllm_cpu_iterations.py: {args.log} has no iteration lines; start the server with "
              "`python tools/vllm_cpu.py start --log-iterations`", file=sys.stderr)
        return 1
    if args.csv:
        write_csv(rows, args.csv)
    total = sum(r.elapsed_ms for r in rows)
    print(f"{len(rows)} iterations ({rows[0].time} to {rows[-1].time}): model time {total / 1e3:.1f} s, "
          f"mean {total / len(rows):.1f} ms" + (f"; written to {args.csv}" if args.csv else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
