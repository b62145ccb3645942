"""`blis calibrate` end to end: the reference sample, exit codes, our extra fields, bad input.

Inputs are the reference's own files (samples/blis/) or files written with our format writers.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from blis_sim.cli import main
from blis_sim.errors import EXIT_INPUT_ERROR, EXIT_OK, EXIT_VERDICT_FAILED
from blis_sim.formats.hitrate import KVHitRate
from blis_sim.formats.report import load_report
from blis_sim.formats.results import MetricsOutput, SimResult, load_sim_results, write_metrics_output, write_sim_results
from blis_sim.formats.trace import (ObservedKVMetrics, PytestBlisHeader, Trace, TraceHeader, TraceNetworkConfig,
                                    TraceRecord, write_trace)

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "blis"
REF_ARGS = ["--trace-header", str(SAMPLES / "trace-observed.yaml"), "--trace-data", str(SAMPLES / "trace.csv"),
            "--sim-results", str(SAMPLES / "sim.json"), "--sim-metrics", str(SAMPLES / "simagg.json")]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["calibrate", *argv])
    return code, capsys.readouterr().err


def assert_agrees(ours: Any, ref: Any, path: str = "") -> int:
    """Every field the reference report has must be in ours with the same value (floats to 1e-9 relative)."""
    if isinstance(ref, dict):
        assert isinstance(ours, dict), path
        return sum(assert_agrees(ours[k], v, f"{path}.{k}") for k, v in ref.items() if k in ours or
                   pytest.fail(f"{path}.{k} missing from our report"))
    if isinstance(ref, list):
        assert isinstance(ours, list) and len(ours) == len(ref), path
        return sum(assert_agrees(o, r, f"{path}[{i}]") for i, (o, r) in enumerate(zip(ours, ref)))
    if isinstance(ref, float) or (isinstance(ref, int) and not isinstance(ref, bool) and isinstance(ours, float)):
        assert math.isclose(ours, ref, rel_tol=1e-9, abs_tol=0.0 if ref else 1e-12), f"{path}: {ours} != {ref}"
    else:
        assert ours == ref, f"{path}: {ours!r} != {ref!r}"
    return 1


def test_sample_report_agrees_with_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "calibration.json"
    code, err = run([*REF_ARGS, "--report", str(out)], capsys)
    assert code == EXIT_OK
    ours, ref = json.loads(out.read_text()), json.loads((SAMPLES / "calibration.json").read_text())
    assert assert_agrees(ours, ref) > 60  # every leaf of the reference report was compared
    # the reference's log lines for this run (samples/blis/README.md)
    assert "KV hit-rate (source=tiered): Real=0.6800 Sim=0.6588 AbsErr=2.12pp (tolerance 5.00pp) [WITHIN]" in err
    assert "TTFT MAPE=0.0% (threshold 15.0%) [WITHIN]" in err
    # ours: which simulated figure was used, and the caveat that it is not like-for-like
    assert ours["hit_rate"]["sim_source"] == "cache_hit_rate"
    assert any("block-based" in n for n in ours["notes"]) and ours["verdict"] == {"passed": True, "failed": []}


def test_blis_compatible_view_is_byte_identical_to_reference(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from blis_sim.formats.report import dump_report
    out = tmp_path / "calibration.json"
    run([*REF_ARGS, "--report", str(out)], capsys)
    assert dump_report(load_report(out), blis_compatible=True) == (SAMPLES / "calibration.json").read_text()


def test_failing_hit_rate_verdict_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.json"
    code, err = run([*REF_ARGS, "--report", str(out), "--hit-rate-tolerance-pp", "2"], capsys)
    assert code == EXIT_VERDICT_FAILED
    report = load_report(out)  # the report is still written in full
    assert report.hit_rate is not None and report.hit_rate.within is False
    assert report.verdict is not None and report.verdict.failed == ["hit_rate[tiered]"]
    assert "[EXCEEDS]" in err and "hit_rate[tiered]" in err and "Traceback" not in err


def test_failing_ttft_verdict_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slow = [r.model_copy(update={"ttft_us": r.ttft_us * 1.5}) for r in load_sim_results(SAMPLES / "sim.json")]
    write_sim_results(slow, tmp_path / "sim.json")
    args = [a if a != str(SAMPLES / "sim.json") else str(tmp_path / "sim.json") for a in REF_ARGS]
    code, err = run([*args, "--report", str(tmp_path / "c.json")], capsys)
    assert code == EXIT_VERDICT_FAILED
    report = load_report(tmp_path / "c.json")
    assert report.ttft_tolerance is not None and report.ttft_tolerance.mape == pytest.approx(0.5)
    assert report.metrics["ttft"].request_level.bias_direction == "over-predict"
    assert "TTFT MAPE=50.0% (threshold 15.0%) [EXCEEDS]" in err


def test_console_script_exit_code(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "blis_sim", "calibrate", *REF_ARGS, "--report",
                           str(tmp_path / "c.json"), "--hit-rate-tolerance-pp", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_VERDICT_FAILED, proc.stderr
    assert (tmp_path / "c.json").exists() and "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------ our extensions


def _record(i: int, *, ttft: int, cached: int, warmup: bool = False) -> TraceRecord:
    send = 1_000_000 + i * 10_000
    return TraceRecord(request_id=i, input_tokens=100, output_tokens=10, server_input_tokens=100,
                       send_time_us=send, first_chunk_time_us=send + ttft, last_chunk_time_us=send + ttft + 900,
                       num_chunks=11, warmup=warmup, cached_tokens=cached, streaming=True)


def _write_observed_case(tmp: Path, *, sim_prefix_hits: int) -> list[str]:
    """A 6-request observe-like trace (2 marked warm-up) with per-definition rates and per-request cached tokens."""
    observed = [KVHitRate(definition="prefix_cache", unit="tokens", hits=300, queries=600, hit_rate=0.5,
                          metric="vllm:prefix_cache_hits_total"),
                KVHitRate(definition="external", unit="tokens", hits=30, queries=300, hit_rate=0.1,
                          metric="vllm:external_prefix_cache_hits_total")]
    header = TraceHeader(mode="real", warm_up_requests=0, network=TraceNetworkConfig(measured_rtt_ms=1.0),
                         observed_kv_metrics=ObservedKVMetrics(source="gpu-prefix-cache-fallback", hit_rate=0.5,
                                                               block_hits=300, block_queries=600),
                         pytest_blis=PytestBlisHeader(kv_hit_rates=observed))
    cached = [0, 96, 0, 96, 96, 48]
    records = [_record(i, ttft=20_000, cached=c, warmup=i < 2) for i, c in enumerate(cached)]
    write_trace(Trace(header=header, records=records), tmp / "t.yaml", tmp / "t.csv")
    sim_cached = [0, 96, 0, 96, 80, 48]
    write_sim_results([SimResult(request_id=i, ttft_us=19_000.0, e2e_us=19_900.0, input_tokens=100,
                                 output_tokens=10, cached_tokens=c) for i, c in enumerate(sim_cached)],
                      tmp / "sim.json")
    sim_rates = [KVHitRate(definition="prefix_cache", unit="tokens", hits=sim_prefix_hits, queries=600,
                           hit_rate=sim_prefix_hits / 600),
                 KVHitRate(definition="by_source", tier="device", unit="tokens", hits=280, queries=600,
                           hit_rate=280 / 600)]
    write_metrics_output(MetricsOutput(cache_hit_rate=0.2, kv_hit_rates=sim_rates), tmp / "m.json")
    return ["--trace-header", str(tmp / "t.yaml"), "--trace-data", str(tmp / "t.csv"), "--sim-results",
            str(tmp / "sim.json"), "--sim-metrics", str(tmp / "m.json"), "--report", str(tmp / "c.json")]


def test_per_definition_and_request_level_agreement(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(_write_observed_case(tmp_path, sim_prefix_hits=310), capsys)
    assert code == EXIT_OK, err
    r = load_report(tmp_path / "c.json")
    # warm-up rows come from our column; RTT 1 ms from the header: sim 19000 + 1000 = real 20000
    assert (r.trace_info.warm_up_excluded, r.trace_info.matched_pairs, r.trace_info.unmatched_sim) == (2, 4, 2)
    assert r.metrics["ttft"].request_level.mape == 0.0
    # primary block: like-for-like prefix_cache tokens (310/600), not the block-based cache_hit_rate 0.2
    assert r.hit_rate is not None and r.hit_rate.sim_source == "kv_hit_rates:prefix_cache"
    assert r.hit_rate.sim_hit_rate == pytest.approx(310 / 600)
    assert [(d.definition, d.tier, d.real_hits, d.sim_hits, d.within) for d in r.kv_hit_rates or []] == [
        ("prefix_cache", None, 300, 310, True)]
    assert {(u.definition, u.tier, u.side) for u in r.kv_hit_rates_unpaired or []} == {
        ("external", None, "observed"), ("by_source", "device", "simulated")}
    a = r.request_hit_agreement
    assert a is not None and (a.requests, a.matching, a.mean_abs_diff_tokens) == (4, 3, 4.0)
    assert any("warm-up" in n for n in r.notes or [])
    raw = json.loads((tmp_path / "c.json").read_text())
    assert raw["kv_hit_rates"][0]["tier"] is None  # written as null, as the shared shape says
    assert "KV hit-rate [prefix_cache] (tokens)" in err and "Per-request cached tokens: 3/4 match" in err


def test_failing_per_definition_verdict_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run([*_write_observed_case(tmp_path, sim_prefix_hits=400), "--hit-rate-tolerance-pp", "10"], capsys)
    assert code == EXIT_VERDICT_FAILED
    r = load_report(tmp_path / "c.json")
    assert r.verdict is not None and r.verdict.failed == ["hit_rate[gpu-prefix-cache-fallback]",
                                                          "kv_hit_rate[prefix_cache]"]
    assert [row.metric for row in r.verdicts() if not row.within] == r.verdict.failed


def test_warmup_zero_includes_marked_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run([*_write_observed_case(tmp_path, sim_prefix_hits=300), "--warmup-requests", "0"], capsys)
    assert code == EXIT_OK
    r = load_report(tmp_path / "c.json")
    assert (r.trace_info.warm_up_excluded, r.trace_info.matched_pairs) == (0, 6)


def test_explicit_rtt_overrides_header(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _write_observed_case(tmp_path, sim_prefix_hits=300)
    run([*args, "--network-rtt-us", "0"], capsys)
    r = load_report(tmp_path / "c.json")
    assert r.metrics["ttft"].request_level.mape == pytest.approx(0.05)  # 19000 vs 20000
    assert r.provenance is not None and r.provenance.network_rtt_us == 0


# ------------------------------------------------------------------------------------------ bad input


def _bad_json(tmp: Path, name: str, text: str) -> str:
    (tmp / name).write_text(text)
    return str(tmp / name)


def _swap(flag: str, value: str) -> list[str]:
    args = list(REF_ARGS)
    args[args.index(flag) + 1] = value
    return args


@pytest.mark.parametrize("case,expect", [
    ("missing-report", "--report is required"),
    ("missing-trace-header", "--trace-header is required"),
    ("negative-rtt", "--network-rtt-us must be >= 0 (or omit to use trace header), got -5"),
    ("negative-warmup", "--warmup-requests must be >= 0 (or -1 to use the trace header), got -3"),
    ("nan-tolerance", "--hit-rate-tolerance-pp must be a finite number >= 0, got nan"),
    ("negative-threshold", "--ttft-mape-threshold must be a finite number >= 0, got -0.1"),
    ("inf-bandwidth", "--network-bandwidth-mbps must be a finite number, got inf"),
    ("header-not-found", "nope.yaml: file not found"),
    ("sim-bad-json", "sim.json:3: invalid JSON"),
    ("sim-unknown-key", "field '[0].bogus': unknown key 'bogus'"),
    ("sim-empty", "No sim results found"),
    ("sim-no-match", "No matching request IDs found between trace and sim results"),
    ("metrics-wrong-type", "m.json:1: field 'cache_hit_rate'"),
    ("report-dir-missing", "failed to write calibration report"),
    ("itl-not-found", "itl.csv: file not found"),
])
def test_bad_input_is_one_line_exit_2(case: str, expect: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    report = ["--report", str(tmp_path / "c.json")]
    argv = {
        "missing-report": lambda: REF_ARGS,
        "missing-trace-header": lambda: _swap("--trace-header", "") + report,
        "negative-rtt": lambda: REF_ARGS + report + ["--network-rtt-us", "-5"],
        "negative-warmup": lambda: REF_ARGS + report + ["--warmup-requests", "-3"],
        "nan-tolerance": lambda: REF_ARGS + report + ["--hit-rate-tolerance-pp", "nan"],
        "negative-threshold": lambda: REF_ARGS + report + ["--ttft-mape-threshold", "-0.1"],
        "inf-bandwidth": lambda: REF_ARGS + report + ["--network-bandwidth-mbps", "inf"],
        "header-not-found": lambda: _swap("--trace-header", str(tmp_path / "nope.yaml")) + report,
        "sim-bad-json": lambda: _swap("--sim-results", _bad_json(
            tmp_path, "sim.json", '[\n  {"request_id": 0,\n  oops\n]')) + report,
        "sim-unknown-key": lambda: _swap("--sim-results", _bad_json(
            tmp_path, "sim.json", '[{"request_id": 0, "ttft_us": 1, "e2e_us": 2, "input_tokens": 1, '
                                  '"output_tokens": 1, "bogus": 1}]')) + report,
        "sim-empty": lambda: _swap("--sim-results", _bad_json(tmp_path, "sim.json", "[]")) + report,
        "sim-no-match": lambda: _swap("--sim-results", _bad_json(
            tmp_path, "sim.json", '[{"request_id": 9999, "ttft_us": 1, "e2e_us": 2, "input_tokens": 1, '
                                  '"output_tokens": 1}]')) + report,
        "metrics-wrong-type": lambda: _swap("--sim-metrics", _bad_json(
            tmp_path, "m.json", '{"cache_hit_rate": "high"}')) + report,
        "report-dir-missing": lambda: REF_ARGS + ["--report", str(tmp_path / "no" / "such" / "dir" / "c.json")],
        "itl-not-found": lambda: REF_ARGS + report + ["--itl-data", str(tmp_path / "itl.csv")],
    }[case]()  # lazily: each case writes its own files
    code, err = run(argv, capsys)
    assert code == EXIT_INPUT_ERROR
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("blis calibrate: error: "), err
    assert expect in lines[0]
    assert not (tmp_path / "c.json").exists()


def test_all_negative_latencies_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    header = TraceHeader(mode="real")
    records = [TraceRecord(request_id=i, send_time_us=100, first_chunk_time_us=0, last_chunk_time_us=0)
               for i in range(3)]
    write_trace(Trace(header=header, records=records), tmp_path / "t.yaml", tmp_path / "t.csv")
    write_sim_results([SimResult(request_id=i, ttft_us=1.0, e2e_us=2.0, input_tokens=0, output_tokens=0)
                       for i in range(3)], tmp_path / "sim.json")
    code, err = run(["--trace-header", str(tmp_path / "t.yaml"), "--trace-data", str(tmp_path / "t.csv"),
                     "--sim-results", str(tmp_path / "sim.json"), "--report", str(tmp_path / "c.json")], capsys)
    assert code == EXIT_INPUT_ERROR and "No valid latency pairs after filtering" in err


def test_unparseable_flag_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", *REF_ARGS, "--report", "x.json", "--warmup-requests", "many"])
    assert exc.value.code == EXIT_INPUT_ERROR
    assert "invalid int value: 'many'" in capsys.readouterr().err


def test_observation_without_sim_metrics_warns_and_skips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [a for a in REF_ARGS]
    i = args.index("--sim-metrics")
    del args[i:i + 2]
    code, err = run([*args, "--report", str(tmp_path / "c.json")], capsys)
    assert code == EXIT_OK
    assert "--sim-metrics was not provided; skipping the hit-rate comparison" in err
    assert "hit_rate" not in json.loads((tmp_path / "c.json").read_text())


def test_sim_metrics_without_cache_hit_rate_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_metrics_output(MetricsOutput(completed_requests=200), tmp_path / "m.json")
    code, err = run([*_swap("--sim-metrics", str(tmp_path / "m.json")), "--report", str(tmp_path / "c.json")],
                    capsys)
    assert code == EXIT_OK and "has no cache_hit_rate; skipping the hit-rate comparison" in err


def test_itl_data_adds_itl_metric(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from blis_sim.formats.trace import ITLRecord, write_itl
    chunks = [ITLRecord(request_id=rid, chunk_index=i, timestamp_us=10_000 * rid + 13_000 * i)
              for rid in (0, 1, 2) for i in range(5)]
    write_itl(chunks, tmp_path / "t.itl.csv")
    code, err = run([*REF_ARGS, "--report", str(tmp_path / "c.json"), "--itl-data", str(tmp_path / "t.itl.csv")],
                    capsys)
    assert code == EXIT_OK
    itl = json.loads((tmp_path / "c.json").read_text())["metrics"]["itl"]
    assert itl["count"] == 3 and itl["workload_level"]["real_mean"] == 13_000
    assert "ITL:  Real mean=13000µs" in err
