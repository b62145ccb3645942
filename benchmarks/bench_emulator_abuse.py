"""/health latency of the emulator under abuse (issue 14): 1000 held idle/half-open connections, 200 fuzzed
requests and 40 completions at once, ``/health`` probed every 20 ms on its own connection meanwhile.

    python benchmarks/bench_emulator_abuse.py              # 3 rounds
    python benchmarks/bench_emulator_abuse.py --rounds 5 --connections 2000

Target: /health within 50 ms (p50; p99 and max printed with the load average). The abuse driver is the
one tests/test_emulator_abuse.py uses (tests/emulator_abuse.py); the emulator runs in its own process.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blis_sim.emulator import EmulatorConfig, spawn_emulator  # noqa: E402
from emulator_abuse import abuse  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--fuzzed", type=int, default=200)
    args = ap.parse_args()
    worst = 0.0
    for r in range(args.rounds):
        with spawn_emulator(EmulatorConfig(profile="zero", stats_interval_s=0)) as emu:
            res = asyncio.run(abuse(emu.url, connections=args.connections, fuzzed=args.fuzzed, seed=r))
        ms = sorted(res.health_ms)
        p50 = statistics.median(ms)
        p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
        worst = max(worst, p50)
        print(f"round {r}: {len(ms)} /health probes, p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {ms[-1]:.1f} ms, "
              f"failed {res.health_failures}; held {res.held}, fuzzed answered {res.fuzz_answered} / dropped "
              f"{res.fuzz_unanswered}, completions {dict(res.completions)}; load average {os.getloadavg()[0]:.2f}",
              flush=True)
    print(f"worst p50 {worst:.1f} ms (target 50 ms): {'OK' if worst <= 50 else 'MISSED'}")
    return 0 if worst <= 50 else 1


if __name__ == "__main__":
    sys.exit(main())
