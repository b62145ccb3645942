"""vLLM's per-iteration log read as a table (tools/vllm_cpu_iterations.py), on lines a real vLLM 0.32 wrote
(samples/vllm-cpu/iterations.log: the lane server started with --enable-logging-iteration-details)."""
from __future__ import annotations

import csv
import subprocess
from pathlib import Path

from vllm_lane import iterations, run_tool

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "vllm-cpu" / "iterations.log"


def script(*args: str) -> subprocess.CompletedProcess[str]:
    return run_tool("vllm_cpu_iterations", *args)


def test_every_iteration_line_is_read_and_nothing_else() -> None:
    rows = list(iterations.parse(SAMPLE.read_text().splitlines()))
    assert [r.index for r in rows] == [0, 1, 2, 2399, 2400, 2401, 2402, 2403]  # the startup line is skipped
    first, saturated = rows[0], rows[4]
    assert (first.prefill_requests, first.prefill_tokens, first.decode_requests, first.elapsed_ms) == (1, 64, 0, 26.55)
    assert (saturated.prefill_requests, saturated.prefill_tokens, saturated.decode_requests,
            saturated.decode_tokens, saturated.elapsed_ms) == (1, 465, 31, 31, 141.77)
    assert saturated.time == "12-02 05:08:49"


def test_the_csv_holds_every_iteration(tmp_path: Path) -> None:
    out = script(str(SAMPLE), "--csv", str(tmp_path / "it.csv"))
    assert out.returncode == 0, out.stderr
    assert "8 iterations" in out.stdout and "mean 72.0 ms" in out.stdout
    with (tmp_path / "it.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 8 and table[3]["prefill_tokens"] == "606" and table[3]["elapsed_ms"] == "146.15"


def test_a_log_without_iterations_or_no_log_is_a_clear_error(tmp_path: Path) -> None:
    plain = tmp_path / "server.log"
    plain.write_text("INFO:     Application startup complete.\n")
    out = script(str(plain))
    assert out.returncode == 1 and "--log-iterations" in out.stderr and "Traceback" not in out.stderr
    out = script(str(tmp_path / "missing.log"))
    assert out.returncode == 2 and "cannot read" in out.stderr and "Traceback" not in out.stderr
