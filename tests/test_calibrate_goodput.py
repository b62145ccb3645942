"""Goodput per SLO class (--slo-ttft/-itl/-e2e): Go durations, precedence, hand-computed attainment."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from blis_sim.calibrate.goodput import goodput_comparison as _goodput
from blis_sim.calibrate.goodput import merge_targets, parse_go_duration_ms, parse_slo_flag
from blis_sim.calibrate.goodput import runtime_seconds as _runtime
from blis_sim.cli import main
from tests.calibrate_columns import matched_rows, real_columns, sim_table
from blis_sim.errors import UsageError
from blis_sim.formats.report import SLODimTargets

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "blis"


@pytest.mark.parametrize("text,ms", [
    ("100ms", 100.0), ("1.5s", 1500.0), ("1m30s", 90_000.0), ("1h", 3_600_000.0), ("500us", 0.5),
    ("250µs", 0.25), ("2ns", 2e-6), (".5s", 500.0), ("1.s", 1000.0), ("0", 0.0), ("-1s", -1000.0),
    ("1", None), ("abc", None), ("", None), (".s", None), ("1x", None), ("1s2", None),
])
def test_go_durations(text: str, ms: float | None) -> None:
    assert parse_go_duration_ms(text) == ms


def test_slo_flag_parsing_and_errors() -> None:
    assert parse_slo_flag(" critical=100ms, standard=0.5s ", "--slo-ttft") == {"critical": 100.0, "standard": 500.0}
    assert parse_slo_flag("", "--slo-ttft") is None
    for bad, msg in (("critical", "invalid pair 'critical'"), ("=1s", "empty class key"), ("a=1s,,b=2s", "empty pair"),
                     ("a=fast", "unparseable duration in pair 'a=fast'"), ("a=0s", "non-positive duration")):
        with pytest.raises(UsageError, match=msg):
            parse_slo_flag(bad, "--slo-e2e")


def test_merge_precedence_cli_over_header_per_dimension() -> None:
    header = {"critical": SLODimTargets(ttft_ms=200.0, e2e_ms=5000.0), "batch": SLODimTargets()}
    merged = merge_targets({"critical": 100.0}, None, None, header)
    assert merged == {"critical": SLODimTargets(ttft_ms=100.0, e2e_ms=5000.0)}  # batch gates nothing: dropped
    assert merge_targets(None, None, None, None) is None


@dataclass
class Rec:
    request_id: int
    ttft: int
    e2e: int
    slo_class: str = ""
    status: str = "ok"
    send_time_us: int = 1_000

    @property
    def first_chunk_time_us(self) -> int:
        return self.send_time_us + self.ttft

    @property
    def last_chunk_time_us(self) -> int:
        return self.send_time_us + self.e2e


@dataclass
class Sim:
    request_id: int
    ttft_us: float
    e2e_us: float
    itl_mean_us: float = 0.0


def goodput_comparison(recs: list[Rec], sims: dict[int, Sim], ids: set[int], itl: Any, targets: Any,
                       runtime_s: float) -> Any:
    """The goodput of the rows of ``ids``, as columns."""
    real, sim = real_columns(recs), sim_table(list(sims.values()))
    return _goodput(real, sim, *matched_rows(real, sim, ids), itl, targets, runtime_s)


def runtime_seconds(recs: list[Rec], ids: set[int]) -> float:
    real = real_columns(recs)
    return _runtime(real, np.flatnonzero(np.isin(real.array("request_id"), sorted(ids))))


def test_goodput_hand_computed() -> None:
    # class "default" (no slo_class): TTFT ≤ 100 ms and E2E ≤ 1 s
    recs = [Rec(0, 50_000, 500_000), Rec(1, 150_000, 500_000), Rec(2, 50_000, 2_000_000),
            Rec(3, 50_000, 500_000, status="error"), Rec(4, 50_000, 500_000, status="incomplete"),
            Rec(5, 50_000, 500_000, slo_class="batch")]
    sims = {i: Sim(i, 60_000.0, 600_000.0) for i in range(6)}
    targets = {"default": SLODimTargets(ttft_ms=100.0, e2e_ms=1000.0)}
    g = goodput_comparison(recs, sims, {0, 1, 2, 3, 4, 5}, None, targets, runtime_s=2.0)
    assert g is not None and not g.skipped_itl
    c = g.per_class["default"]
    # counted: ids 0–3 (status incomplete and class batch are not); real good: id 0 only; sim good: all 4
    assert (c.count, c.real_slo_attainment, c.sim_slo_attainment) == (4, 0.25, 1.0)
    assert (c.real_goodput_rps, c.sim_goodput_rps) == (0.5, 2.0)
    # real TTFT met 2 of 3 ok rows; E2E gated only on rows that met TTFT: 1 of 2
    assert c.real_attainment_by_dim == {"ttft": 2 / 3, "e2e": 0.5}
    assert c.sim_attainment_by_dim == {"ttft": 1.0, "e2e": 1.0}


def test_itl_gating_without_data_is_skipped() -> None:
    g = goodput_comparison([Rec(0, 10_000, 50_000)], {0: Sim(0, 1.0, 2.0)}, {0}, None,
                           {"default": SLODimTargets(itl_ms=20.0)}, runtime_s=1.0)
    assert g is not None and g.skipped_itl and g.per_class["default"].real_slo_attainment == 0.0


def test_runtime_spans_matched_requests() -> None:
    recs = [Rec(0, 1, 500_000, send_time_us=1_000_000), Rec(1, 1, 500_000, send_time_us=2_000_000),
            Rec(2, 1, 9_000_000, send_time_us=0)]
    assert runtime_seconds(recs, {0, 1}) == pytest.approx(1.5)


def test_cli_goodput_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.json"
    code = main(["calibrate", "--trace-header", str(SAMPLES / "trace-observed.yaml"), "--trace-data",
                 str(SAMPLES / "trace.csv"), "--sim-results", str(SAMPLES / "sim.json"), "--report", str(out),
                 "--slo-ttft", "default=50ms", "--slo-e2e", "default=2s"])
    err = capsys.readouterr().err
    assert code == 0, err
    g = json.loads(out.read_text())["goodput"]
    assert g["targets"] == {"default": {"ttft_ms": 50, "e2e_ms": 2000}}
    assert g["per_class"]["default"]["count"] == 200
    assert list(g["per_class"]["default"]["real_attainment_by_dim"]) == ["e2e", "ttft"]
    assert "Per-SLO-class goodput (real vs sim):" in err


def test_cli_bad_slo_flag_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["calibrate", "--trace-header", "h", "--trace-data", "d", "--sim-results", "s", "--report", "r",
                 "--slo-ttft", "critical=soon"])
    assert code == 2 and "--slo-ttft: unparseable duration in pair 'critical=soon'" in capsys.readouterr().err
