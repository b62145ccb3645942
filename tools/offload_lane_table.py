"""The real offload lane's cells × definitions table (docs/vllm-cpu-calibration.md, "Offload tiers against a real vLLM")
from the artifacts of ``bash tools/offload_lane.sh DIR``: one row per cell, real/simulated hit-rate in % and the
error in pp per definition and tier, the requests whose cached tokens matched, and the window's faults.

Usage: python tools/offload_lane_table.py DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = (("tiered", "0:primary"), ("tiered", "1:fs"), ("prefix_cache", None), ("external", None),
           ("by_source", "host"), ("by_source", "disk"))
HEADER = ("| cell | tiered 0:primary | tiered 1:fs | prefix_cache | external | by_source host | by_source disk "
          "| equal | faults |")


def _cell_name(report: Path) -> str:
    # scenarios_lane_offload-cpu.blis.yaml_cpu-hit_prefix-256 -> offload-cpu::cpu-hit 256
    stem = report.parent.name.removeprefix("scenarios_lane_")
    file, _, rest = stem.partition(".blis.yaml_")
    scenario, _, point = rest.rpartition("_")
    return f"{file}::{scenario} {point.removeprefix('prefix-')}"


def row(report: Path) -> str:
    data = json.loads(report.read_text())
    rates = {(d["definition"], d["tier"]): d for d in data.get("kv_hit_rates") or []}
    cells = []
    for key in COLUMNS:
        d = rates.get(key)
        cells.append("—" if d is None else
                     f"{d['real_hit_rate'] * 100:.1f}/{d['sim_hit_rate'] * 100:.1f} ({d['abs_error_pp']:.2f})")
    agreement = data.get("request_hit_agreement")
    equal = f"{agreement['matching']}/{agreement['requests']}" if agreement else "—"
    faults = ", ".join(f"{f['kind']}{'/' + f['tier'] if f.get('tier') else ''} {f['count']}"
                       for f in data.get("window_faults") or []) or "—"
    return f"| {_cell_name(report)} | {' | '.join(cells)} | {equal} | {faults} |"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__.strip(), file=sys.stderr)
        return 2
    reports = sorted(Path(argv[0]).glob("*/scenarios_*/calibration.json"))
    if not reports:
        print(f"offload_lane_table: no calibration.json under {argv[0]}/*/scenarios_*/", file=sys.stderr)
        return 1
    print(HEADER)
    print("|" + "---|" * 9)
    for report in reports:
        print(row(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
