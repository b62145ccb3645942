"""tools/lane_ttft_gate.py: the TTFT gate judged from a report-only run's summary.json (CI's lane step)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "lane_ttft_gate.py"


def gate(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), str(folder)], capture_output=True, text=True, check=False,
                          timeout=60)


def cell(name: str, mape: float, *, gated: bool = True) -> dict:
    return {"nodeid": f"vllm-cpu.blis.yaml::{name}", "outcome": "passed", "ttft_mape": mape, "ttft_checked": False,
            "ttft_gated": gated, "ttft_threshold": 0.15}


def write(folder: Path, cells: list[dict]) -> Path:
    (folder / "summary.json").write_text(json.dumps({"cells": cells}))
    return folder


def test_every_gated_cell_within_passes_and_ungated_cells_are_left_out(tmp_path: Path) -> None:
    done = gate(write(tmp_path, [cell("miss::prefix-256", 0.149), cell("saturation::default", 0.40, gated=False)]))
    assert done.returncode == 0, done.stderr
    assert "miss::prefix-256" in done.stdout and "WITHIN" in done.stdout
    assert "saturation" not in done.stdout
    assert "every 1 gated cell(s) within" in done.stdout


def test_one_cell_over_its_threshold_fails_and_is_named(tmp_path: Path) -> None:
    done = gate(write(tmp_path, [cell("gpu-hit::prefix-1024", 0.151), cell("miss::prefix-1024", 0.05)]))
    assert done.returncode == 1
    assert "gpu-hit::prefix-1024  ttft_mape  15.1%  threshold 15.0%  EXCEEDS" in done.stdout
    assert "1 of 2 gated cell(s) over" in done.stdout


def test_an_unusable_summary_is_a_clear_error(tmp_path: Path) -> None:
    missing = gate(tmp_path)
    assert missing.returncode == 2 and "summary.json" in missing.stderr and "Traceback" not in missing.stderr
    (tmp_path / "summary.json").write_text('{"cells": [\n  {"nodeid": ')
    broken = gate(tmp_path)
    assert broken.returncode == 2 and "summary.json:2: invalid JSON" in broken.stderr
    old = gate(write(tmp_path, [{"nodeid": "x", "ttft_mape": 0.1, "ttft_threshold": 0.15}]))
    assert old.returncode == 2 and "no cell judges TTFT" in old.stderr
    bad = gate(write(tmp_path, [{"nodeid": "x", "ttft_gated": True, "ttft_mape": None, "ttft_threshold": 0.15}]))
    assert bad.returncode == 2 and "'x' has no TTFT MAPE" in bad.stderr


def test_a_json_that_is_not_a_plugin_summary_is_refused(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("[1, 2]")
    done = gate(tmp_path)
    assert done.returncode == 2 and "not a pytest-blis summary" in done.stderr
