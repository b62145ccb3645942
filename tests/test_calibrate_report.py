"""The CalibrationReport model: reads the reference's report, writes Go's layout, strict on bad input;
the library API (`calibrate()`, verdict rows, the failure table, `raise_if_failed`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from blis_sim.calibrate import CalibrateOptions, calibrate, raise_if_failed, render_table
from blis_sim.errors import EXIT_VERDICT_FAILED, FormatError, UsageError, VerdictFailed
from blis_sim.formats.report import (REFERENCE_KNOWN_LIMITATIONS, CalibrationReport, dump_report, load_report,
                                     write_report)
from blis_sim.formats.results import load_metrics_output, read_sim_columns
from blis_sim.formats.trace import ITLRecord, load_trace

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "blis"


@pytest.fixture(scope="module")
def sample_inputs() -> tuple:
    return (load_trace(SAMPLES / "trace-observed.yaml", SAMPLES / "trace.csv"),
            read_sim_columns(SAMPLES / "sim.json"), load_metrics_output(SAMPLES / "simagg.json"))


def test_reference_report_loads_and_writes_back_byte_identical() -> None:
    report = load_report(SAMPLES / "calibration.json")
    assert report.hit_rate is not None and report.hit_rate.source == "tiered"
    assert list(report.metrics) == ["e2e", "ttft"] and report.known_limitations == list(REFERENCE_KNOWN_LIMITATIONS)
    assert dump_report(report) == (SAMPLES / "calibration.json").read_text()


def test_our_report_round_trips(tmp_path: Path, sample_inputs: tuple) -> None:
    report = calibrate(*sample_inputs)
    write_report(report, tmp_path / "r.json")
    assert load_report(tmp_path / "r.json") == report
    text = (tmp_path / "r.json").read_text()
    assert '"mean_error": 777,' in text  # Go writes integral floats without ".0"
    assert list(json.loads(text)) == ["trace_info", "metrics", "config_match", "known_limitations", "hit_rate",
                                      "ttft_tolerance", "capacity", "verdict", "notes", "provenance"]


@pytest.mark.parametrize("mutate,expect", [
    (lambda d: d["trace_info"].update(bogus=1), "field 'trace_info.bogus': unknown key 'bogus'"),
    (lambda d: d["hit_rate"].update(within="yes"), "field 'hit_rate.within'"),
    (lambda d: d["metrics"]["ttft"].pop("count"), "field 'metrics.ttft.count': required field is missing"),
    (lambda d: d.update(ttft_tolerance=[1]), "field 'ttft_tolerance'"),
])
def test_bad_report_names_file_and_field(mutate, expect: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = json.loads((SAMPLES / "calibration.json").read_text())
    mutate(data)
    (tmp_path / "bad.json").write_text(json.dumps(data, indent=2))
    with pytest.raises(FormatError) as exc:
        load_report(tmp_path / "bad.json")
    assert str(tmp_path / "bad.json") in str(exc.value) and expect in str(exc.value)


def test_duplicate_key_and_non_object_are_rejected(tmp_path: Path) -> None:
    (tmp_path / "dup.json").write_text('{"trace_info": {}, "trace_info": {}}')
    with pytest.raises(FormatError, match="duplicate key 'trace_info'"):
        load_report(tmp_path / "dup.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(FormatError, match="expected a JSON object"):
        load_report(tmp_path / "list.json")


def test_verdict_rows_and_failure_table(sample_inputs: tuple) -> None:
    report = calibrate(*sample_inputs, options=CalibrateOptions(hit_rate_tolerance_pp=1.0))
    rows = report.verdicts()
    assert [(r.metric, r.within, r.unit) for r in rows] == [("hit_rate[tiered]", False, "pp"),
                                                              ("ttft_mape", True, "mape")]
    assert rows[0].error == pytest.approx(2.115444617784712) and rows[0].tolerance == 1.0
    assert not report.passed and report.verdict is not None and report.verdict.failed == ["hit_rate[tiered]"]
    table = render_table(rows, only_failed=True).splitlines()
    assert table[0].split() == ["metric", "real", "sim", "error", "tolerance", "verdict"]
    assert table[1].split() == ["hit_rate[tiered]", "68.00%", "65.88%", "2.12pp", "1.00pp", "EXCEEDS"]
    assert len(table) == 2
    with pytest.raises(VerdictFailed) as exc:
        raise_if_failed(report)
    assert exc.value.exit_code == EXIT_VERDICT_FAILED and exc.value.report is report
    assert "hit_rate[tiered]" in str(exc.value)


def test_passing_report_raises_nothing(sample_inputs: tuple) -> None:
    report = calibrate(*sample_inputs)
    assert report.passed and render_table(report.verdicts(), only_failed=True) == ""
    raise_if_failed(report)


def test_without_sim_metrics_no_hit_rate_but_ttft_verdict(sample_inputs: tuple) -> None:
    trace, sims, _ = sample_inputs
    report = calibrate(trace, sims, None)
    assert report.hit_rate is None and report.ttft_tolerance is not None and "ttft" in report.metrics


def test_sim_metrics_without_observation_is_noted(sample_inputs: tuple) -> None:
    trace, sims, metrics = sample_inputs
    bare = trace.model_copy(update={"header": trace.header.model_copy(update={"observed_kv_metrics": None})})
    report = calibrate(bare, sims, metrics)
    assert report.hit_rate is None and any("no observed hit-rate" in n for n in report.notes or [])


def test_sim_metrics_without_cache_hit_rate_gives_no_hit_rate(sample_inputs: tuple) -> None:
    trace, sims, metrics = sample_inputs
    report = calibrate(trace, sims, metrics.model_copy(update={"cache_hit_rate": None}))
    assert report.hit_rate is None


def test_header_warmup_and_override(sample_inputs: tuple) -> None:
    trace, sims, metrics = sample_inputs
    header = trace.header.model_copy(update={"warm_up_requests": 3})
    shifted = trace.model_copy(update={"header": header})
    r = calibrate(shifted, sims, metrics)
    assert (r.trace_info.warm_up_excluded, r.trace_info.matched_pairs, r.trace_info.num_requests) == (3, 197, 200)
    r = calibrate(shifted, sims, metrics, options=CalibrateOptions(warmup_requests=0))
    assert r.trace_info.warm_up_excluded == 0


def test_itl_metric(sample_inputs: tuple) -> None:
    trace, sims, metrics = sample_inputs
    first = trace.records[0]
    itl = [ITLRecord(request_id=first.request_id, chunk_index=i, timestamp_us=1000 + 20 * i) for i in range(4)]
    r = calibrate(trace, sims, metrics, itl_records=itl)
    assert r.metrics["itl"].count == 1 and r.metrics["itl"].workload_level.real_mean == 20.0
    assert list(json.loads(dump_report(r))["metrics"]) == ["e2e", "itl", "ttft"]


def test_options_are_validated() -> None:
    with pytest.raises(UsageError, match="--hit-rate-tolerance-pp must be a finite number >= 0, got -1"):
        CalibrateOptions(hit_rate_tolerance_pp=-1).validate()


def test_report_model_is_strict_and_frozen(sample_inputs: tuple) -> None:
    report = calibrate(*sample_inputs)
    with pytest.raises(Exception):
        report.trace_info.matched_pairs = 1  # type: ignore[misc]
    assert isinstance(CalibrationReport.model_validate(report.model_dump()), CalibrationReport)


def test_window_notes_follow_the_recorded_phases(sample_inputs: tuple) -> None:
    from blis_sim.formats.trace import PhaseInfo, PytestBlisHeader
    trace, sims, metrics = sample_inputs

    def notes_for(*phases: PhaseInfo) -> list[str]:
        header = trace.header.model_copy(update={"pytest_blis": PytestBlisHeader(phases=list(phases))})
        return calibrate(trace.model_copy(update={"header": header}), sims, metrics).notes or []

    before = notes_for(PhaseInfo(name="prewarm", warmup=True, measured=False, requests=8),
                       PhaseInfo(name="main", requests=200))
    assert any("'prewarm' (8 request(s)) ran before the observed counter window" in n for n in before)
    inside = notes_for(PhaseInfo(name="warm", warmup=True, measured=True, requests=3))
    assert any("window includes warm-up phase(s) 'warm' (3 request(s))" in n for n in inside)
    assert not any("warm-up" in n for n in notes_for(PhaseInfo(name="main", requests=200)))


def test_a_fault_the_simulator_does_not_model_fails_the_window(sample_inputs: tuple, tmp_path: Path) -> None:
    from blis_sim.formats.trace import Fault, PytestBlisHeader
    trace, sims, metrics = sample_inputs

    def report_for(*faults: Fault) -> CalibrationReport:
        header = trace.header.model_copy(update={"pytest_blis": PytestBlisHeader(faults=list(faults))})
        return calibrate(trace.model_copy(update={"header": header}), sims, metrics)

    clean = report_for(Fault(kind="store_failure", tier="1:fs", count=0),
                       Fault(kind="allocation_failure", tier="0:primary", count=0))
    assert clean.passed and clean.window_faults is None
    modelled = report_for(Fault(kind="allocation_failure", tier="0:primary", count=12))
    assert modelled.passed and any("12 allocation failures on tier 0:primary" in n for n in modelled.notes or [])
    bad = report_for(Fault(kind="store_failure", tier="1:fs", count=4), Fault(kind="warm_start", count=3))
    rows = [r for r in bad.verdicts() if r.unit == "faults"]
    assert [(r.metric, r.real, r.within) for r in rows] == [("fault[store_failure/1:fs]", 4.0, False),
                                                             ("fault[warm_start]", 3.0, False)]
    assert not bad.passed and bad.verdict is not None and "fault[warm_start]" in bad.verdict.failed
    assert render_table(rows).splitlines()[1].split() == ["fault[store_failure/1:fs]", "4", "0", "4", "0", "EXCEEDS"]
    write_report(bad, tmp_path / "r.json")
    assert load_report(tmp_path / "r.json").window_faults == bad.window_faults
