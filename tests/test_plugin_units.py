"""Plugin units without a server: the probe's design, the summary table, the SVG plots."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_blis._plots import hit_rates_svg, ttft_cdf_svg
from blis_sim.probe import fitted_phases, probe_plan
from pytest_blis._probe import probe_config, server_limits
from pytest_blis._server import ServerTarget
from pytest_blis._session import CellSummary, summary_lines


def _target(blocks: int = 1024, url: str = "http://127.0.0.1:1") -> ServerTarget:
    return ServerTarget(url=url, model="m", embedded=True, block_size=16, num_gpu_blocks=blocks, offload=None,
                        offload_path=None, lock_dir=Path("/nonexistent"))


def _plan(target: ServerTarget, concurrency: int = 1, max_model_len: int = 40960):  # type: ignore[no-untyped-def]
    return probe_plan(server_limits(target, max_model_len, max_num_seqs=256), probe_config(target, concurrency))


def test_probe_separates_the_terms() -> None:
    plan = _plan(_target())
    names = [p.name for p in plan.phases]
    # Warm-up first and outside the fit; every phase of a sequential cell's probe holds one request.
    assert names[:2] == ["warmup-0", "warmup-1"] and fitted_phases(plan) == tuple(names[2:])
    assert all(len(p.requests) == 1 for p in plan.phases)
    # 16384 GPU tokens: prefixes up to a quarter (4096), three cold samples (spread over the probe), a seed + two cached with 32 new
    # tokens, and one with 512 (fewer where 512 would pass a quarter of the cache; none at 4096).
    for length in (64, 128, 256, 512, 1024, 2048, 4096):
        cold = [p.requests[0] for p in plan.phases if p.name.startswith(f"cold-{length}-")]
        seed = next(p.requests[0] for p in plan.phases if p.name == f"seed-{length}")
        cached = [p.requests[0] for p in plan.phases if p.name.startswith(f"cached-{length}-")]
        assert len(cold) == 3 and [r.new_input_tokens for r in cached] == [32, 32] + (
            [min(512, 4096 - length)] if length < 4096 else [])
        assert all(r.input_tokens == length + r.new_input_tokens for r in cached)
        assert len({r.prefix_group for r in cold + [seed]}) == 4  # cold samples share nothing
        assert {r.prefix_group for r in cached} == {seed.prefix_group}
        assert all(r.prefix_length == length for r in cached)
    decode = [p.requests[0] for p in plan.phases if p.name.startswith("decode-")]
    assert decode and all(r.output_tokens >= 64 for r in decode)
    # sequential cells: no load terms (no ramp, no mixed steps, decode alone)
    assert not any(n.startswith(("ramp", "mixed")) for n in names)
    assert [n for n in names if n.startswith("decode")] == ["decode-1", "decode-1-ctx2048"]


def test_probe_ramp_follows_the_cells_concurrency_and_fits_the_cache() -> None:
    assert not any(p.name.startswith("ramp") for p in _plan(_target(), 1).phases)
    assert [p.name for p in _plan(_target(), 6).phases if p.name.startswith("ramp")] == ["ramp-2", "ramp-4", "ramp-6"]
    plan = _plan(_target(blocks=64), concurrency=8)  # 1024 GPU tokens
    ramps = [p for p in plan.phases if p.name.startswith("ramp-")]
    assert [len(p.requests) for p in ramps] == [2, 4, 8]
    # a ramp never fills more than half the cache (it would preempt itself)
    assert all(sum(r.input_tokens + r.output_tokens for r in p.requests) <= 512 for p in ramps)
    assert max(r.input_tokens for p in plan.phases for r in p.requests) <= 256 + 32


def test_probe_content_differs_per_server() -> None:
    a, b = _plan(_target(url="http://127.0.0.1:1")), _plan(_target(url="http://127.0.0.1:2"))
    assert a.seed != b.seed


def test_summary_lines_show_headline_worst_error_and_notes() -> None:
    cells = [CellSummary(nodeid="f::gpu-hit::p", outcome="failed", path="gpu", headline="by_source/device",
                         real_hit_rate=0.9412, sim_hit_rate=0.1176, abs_error_pp=82.35, max_error_pp=82.35,
                         ttft_mape=0.25, ttft_noise_floor=0.031, ttft_checked=False, note="why"),
             CellSummary(nodeid="f::cpu-hit::p", outcome="skipped", note="skipped: no tier")]
    lines = summary_lines(cells)
    assert lines[0].split()[:4] == ["cell", "outcome", "hit-rate", "real"] and lines[0].split()[-2:] == [
        "ttft-mape", "noise"]
    assert lines[1].split() == ["f::gpu-hit::p", "failed", "by_source/device", "94.12%", "11.76%", "82.35",
                                "82.35", "25.0%", "3.1%", "(not", "checked)"]
    assert lines[2].strip() == "why" and lines[4].strip() == "skipped: no tier"


@pytest.mark.parametrize("real,sim", [([10_000, 20_000, 30_000], [12_000, 18_000]), ([], [])])
def test_ttft_cdf_is_valid_svg(real: list[float], sim: list[float]) -> None:
    root = ET.fromstring(ttft_cdf_svg(real, sim, "a <title> & more"))
    ns = "{http://www.w3.org/2000/svg}"
    lines = root.findall(f"{ns}polyline")
    assert len(lines) == (2 if real else 0)
    if real:  # the real CDF steps up once per sample and ends at 1 (y = top of the plot)
        points = lines[0].get("points").split()
        assert len(points) == 2 + 2 * len(real) and points[-1].endswith(",36.0")
    assert "a <title> & more" in "".join(root.itertext())


def test_hit_rate_bars_are_valid_svg() -> None:
    root = ET.fromstring(hit_rates_svg([("by_source/device", 0.5, 0.25), ("tiered/1:fs", 0.0, 1.0)], "t"))
    widths = [float(r.get("width")) for r in root.findall("{http://www.w3.org/2000/svg}rect")
              if r.get("height") == "11"]
    assert widths == [150.0, 75.0, 0.0, 300.0]


def test_a_ttft_failure_shows_what_the_latency_fit_said_about_itself() -> None:
    from blis_sim.calibrate import VerdictRow
    from blis_sim.engine.latency import DEFAULT_COEFFICIENTS, CoefficientEstimate, FitReport
    from pytest_blis._cell import fit_notes
    from pytest_blis._render import CellFailure

    report = FitReport(trace="probe", requests=40, iterations=3, ttft_mape=0.08, itl_mape=0.1,
                       ttft_rmse_us=1.0, itl_rmse_us=1.0, prior="none",
                       coefficients=[CoefficientEstimate(name="step.per_prefill_attention_us",
                                                         value=0.002, ci_low=0.0, ci_high=0.01,
                                                         identified=False)],
                       warnings=["per_prefill_attention_us not identified: prompts span 929-1047"])
    latency = DEFAULT_COEFFICIENTS.model_copy(update={"fit": report})
    ttft = VerdictRow("ttft_mape", 1.0, 2.0, 0.5, 0.15, False, "mape")
    hit = VerdictRow("hit_rate[tiered]", 0.5, 0.2, 30.0, 5.0, False, "pp")
    text = str(CellFailure("cell: 1 verdict(s) out of tolerance", [ttft], fit_notes(latency, [ttft])))
    assert "latency fit on probe: TTFT MAPE 8.0%" in text
    assert "per_prefill_attention_us 0.002 [0, 0.01]?" in text and "prompts span 929-1047" in text
    assert fit_notes(latency, [hit]) == []             # a hit-rate failure: not the fit's business
    assert fit_notes(DEFAULT_COEFFICIENTS, [ttft]) == []  # no fit, nothing to say
    # and how well the server repeated itself in the probe, the other likely cause
    repeat = "probe: identical requests sent alone repeat their TTFT within 11.0 %"
    assert fit_notes(latency, [ttft], [repeat])[-1] == repeat and fit_notes(latency, [hit], [repeat]) == []


def _sample_report() -> object:
    from blis_sim.calibrate import calibrate
    from blis_sim.formats.results import load_metrics_output, read_sim_columns
    from blis_sim.formats.trace import load_trace

    blis = Path(__file__).resolve().parents[1] / "samples" / "blis"
    return calibrate(load_trace(blis / "trace-observed.yaml", blis / "trace.csv"),
                     read_sim_columns(blis / "sim.json"), load_metrics_output(blis / "simagg.json"))


def test_verdict_rows_follow_the_cells_expectations() -> None:
    from pytest_blis._cell import verdict_rows
    from pytest_blis._scenario import Expect

    report = _sample_report()

    def names(rows: list) -> list[str]:
        return [r.metric for r in rows]

    assert "ttft_mape" in names(verdict_rows(report, Expect()))
    assert "ttft_mape" not in names(verdict_rows(report, Expect(check_ttft=False)))
    assert "e2e_mape" not in names(verdict_rows(report, Expect()))  # reported only unless a threshold is set
    e2e = report.metrics["e2e"].request_level.mape
    (row,) = [r for r in verdict_rows(report, Expect(e2e_mape_threshold=e2e)) if r.metric == "e2e_mape"]
    assert row.within and row.error == e2e and row.unit == "mape"
    (row,) = [r for r in verdict_rows(report, Expect(e2e_mape_threshold=e2e * 0.99)) if r.metric == "e2e_mape"]
    assert not row.within
    # --blis-timing-report-only: the hit-rate rows alone
    only = verdict_rows(report, Expect(e2e_mape_threshold=0.0), timing=False)
    assert only and {r.unit for r in only} == {"pp"}  # (the sample has no fault rows)


def test_a_fault_cell_is_judged_on_its_faults() -> None:
    from blis_sim.formats.report import WindowFault
    from pytest_blis._cell import verdict_rows
    from pytest_blis._scenario import Expect

    report = _sample_report()
    expect = Expect(check_ttft=False, faults=["store_failure"])

    def rows_with(*faults: WindowFault) -> list[tuple[str, bool]]:
        r = report.model_copy(update={"window_faults": list(faults) or None})
        return [(row.metric, row.within) for row in verdict_rows(r, expect, timing=False)]

    # the fault was not seen: the cell fails on it; its hit-rates are not judged either way
    assert rows_with() == [("fault[store_failure]", False)]
    store = WindowFault(kind="store_failure", tier="1:fs", count=3, modelled=False)
    assert rows_with(store) == [("fault[store_failure]", True)]
    # a modelled fault (allocation failures) is no verdict; an unexpected unmodelled one fails
    alloc = WindowFault(kind="allocation_failure", tier="0:primary", count=5, modelled=True)
    warm = WindowFault(kind="warm_start", count=2, modelled=False)
    assert rows_with(store, alloc, warm) == [("fault[store_failure]", True), ("fault[warm_start]", False)]
    # without an expected fault, the report's own fault row fails the cell
    plain = report.model_copy(update={"window_faults": [store]})
    assert ("fault[store_failure/1:fs]", False) in [(r.metric, r.within) for r in
                                                    verdict_rows(plain, Expect(check_ttft=False), timing=False)]


def test_saturation_is_required_only_where_asked() -> None:
    from pytest_blis._cell import saturation_problem
    from pytest_blis._scenario import Expect

    report = _sample_report()
    assert saturation_problem(report, Expect()) is None


def test_noise_floor_is_the_first_byte_spread_relative_to_ttft() -> None:
    from blis_sim.formats import Trace, TraceHeader, TraceRecord
    from pytest_blis._cell import ttft_noise_floor

    t0 = 1_700_000_000_000_000

    def rec(i: int, first_byte_us: int, ttft_us: int, status: str = "ok") -> TraceRecord:
        send = t0 + 1_000_000 * i
        return TraceRecord(request_id=i, arrival_time_us=send, send_time_us=send, status=status,
                           first_byte_time_us=send + first_byte_us, first_chunk_time_us=send + ttft_us)

    # first-byte delays 1, 1, 5 ms (median 1): deviations 0, 0, 4 ms over TTFTs of 40 ms -> 1/30
    rows = [rec(0, 1000, 40_000), rec(1, 1000, 40_000), rec(2, 5000, 40_000), rec(3, 90_000, 0, "error")]
    assert ttft_noise_floor(Trace(header=TraceHeader(mode="real"), records=rows)) == pytest.approx(4 / 40 / 3)
    assert ttft_noise_floor(Trace(header=TraceHeader(mode="real"), records=rows[3:])) is None


def test_ttft_scatter_draws_a_point_per_request_and_the_band() -> None:
    from pytest_blis._plots import ttft_scatter_svg

    root = ET.fromstring(ttft_scatter_svg([10_000, 20_000, 30_000], [11_000, 18_000, 45_000], "t", band=0.15))
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}circle")) == 3
    assert len([ln for ln in root.findall(f"{ns}line") if ln.get("stroke-dasharray")]) == 2
    assert "±15 %" in "".join(root.itertext())
    assert not ET.fromstring(ttft_scatter_svg([], [], "t")).findall(f"{ns}circle")


def test_html_row_cells_show_the_cells_verdicts() -> None:
    from pytest_blis._html import COLUMNS, row_cells

    cell = {"headline": "by_source/disk", "real_hit_rate": 0.8889, "sim_hit_rate": 0.8889, "abs_error_pp": 0.0,
            "max_error_pp": 0.0, "ttft_mape": 0.052, "ttft_noise_floor": 0.021, "ttft_checked": True}
    assert row_cells(cell) == ['<td class="col-blis">by_source/disk: 88.89 % / 88.89 % (0.00 pp)</td>',
                               '<td class="col-blis">0.00 pp</td>', '<td class="col-blis">5.2 % (2.1 %)</td>']
    assert row_cells(None) == ["<td></td>"] * len(COLUMNS)
