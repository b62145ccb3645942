"""Judge the TTFT gate of a lane run that only reported it, from the run's ``summary.json`` (standard library only).

CI's lane step runs the cells with ``--blis-timing-report-only`` (hit-rates and cache paths judged, timing
reported) between two timings of the host (``tools/vllm_cpu.py host-noise``, before the server starts and after
it stops). Only when the host was quiet at both ends does this script judge the TTFT verdicts the scenario file
asks for: every cell whose scenario judges TTFT (``ttft_gated``) must have its TTFT MAPE within its threshold.
A quiet host at one end only says nothing about the minutes between: on the 2-vCPU EPYC VM of 2026-12-03 the host
measured 4.3 % (quiet) right before a lane run whose cells then ran 15-33 % slower than the probe before them.

    python tools/lane_ttft_gate.py blis-artifacts/vllm-cpu          # exit 0: every gated cell within; 1: not

Exit codes: 0 within, 1 a gated cell over its threshold, 2 no usable summary (missing, not the plugin's JSON,
or no gated cell in it).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_OVER = 1
EXIT_UNUSABLE = 2


class SummaryError(Exception):
    """The summary cannot be judged; the message says why."""


def gated_cells(summary: Any, source: str) -> list[dict[str, Any]]:
    """The cells of a plugin ``summary.json`` whose scenario judges TTFT, each with a MAPE and a threshold."""
    if not isinstance(summary, dict) or not isinstance(summary.get("cells"), list):
        raise SummaryError(f"{source}: not a pytest-blis summary (expected an object with a 'cells' list)")
    cells = [c for c in summary["cells"] if isinstance(c, dict) and c.get("ttft_gated")]
    if not cells:
        raise SummaryError(f"{source}: no cell judges TTFT (no 'ttft_gated' cell: a summary from before "
                           "pytest-blis wrote that field, or a file whose scenarios do not check TTFT)")
    for c in cells:
        if not isinstance(c.get("ttft_mape"), (int, float)) or not isinstance(c.get("ttft_threshold"), (int, float)):
            raise SummaryError(f"{source}: cell {c.get('nodeid')!r} has no TTFT MAPE or threshold")
    return cells


def judge(cells: Sequence[dict[str, Any]]) -> tuple[list[str], int]:
    """One line per cell (MAPE, threshold, verdict) and how many cells are over their threshold."""
    width = max(len(str(c["nodeid"])) for c in cells)
    lines, over = [], 0
    for c in cells:
        within = c["ttft_mape"] <= c["ttft_threshold"]
        over += not within
        lines.append(f"{str(c['nodeid']):{width}}  ttft_mape {c['ttft_mape'] * 100:5.1f}%  "
                     f"threshold {c['ttft_threshold'] * 100:4.1f}%  {'WITHIN' if within else 'EXCEEDS'}")
    return lines, over


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/lane_ttft_gate.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("artifacts", type=Path, help="the run's --blis-artifacts-dir (holding summary.json)")
    args = parser.parse_args(argv)
    path = args.artifacts / "summary.json"
    try:
        try:
            summary = json.loads(path.read_text())
        except OSError as exc:
            raise SummaryError(f"{path}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise SummaryError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
        cells = gated_cells(summary, str(path))
    except SummaryError as exc:
        print(f"tools/lane_ttft_gate.py: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    lines, over = judge(cells)
    for line in lines:
        print(line)
    print(f"TTFT gate: {f'{over} of' if over else 'every'} {len(cells)} gated cell(s) "
          f"{'over' if over else 'within'} their threshold")
    return EXIT_OVER if over else 0


if __name__ == "__main__":
    sys.exit(main())
