"""Capacity fidelity in calibrate: throughput against throughput, judged only where the window is saturated."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from blis_sim.calibrate.capacity import MIN_REQUESTS, backlog, capacity_comparison as _capacity, is_saturated
from blis_sim.calibrate.verdict import render_table
from blis_sim.formats.report import CalibrationReport, TraceInfo
from tests.calibrate_columns import paired


def pairs(n: int, *, gap_us: float, service_us: float, sim_service_us: float, burst: bool = False,
          output: int = 10) -> list[tuple[SimpleNamespace, SimpleNamespace]]:
    """``n`` requests served one after another by a server taking ``service_us`` each (the sim:
    ``sim_service_us``), sent every ``gap_us`` (all at once with ``burst``)."""
    out = []
    real_free = sim_free = 1_000_000.0
    for i in range(n):
        send = 1_000_000.0 + (0 if burst else i * gap_us)
        start = max(real_free, send)  # one at a time: the first token comes when its service starts
        real_free = start + service_us
        sim_free = max(sim_free, send) + sim_service_us
        rec = SimpleNamespace(request_id=i, status="ok", send_time_us=send, arrival_time_us=send,
                              first_content_time_us=start + 1000, first_chunk_time_us=start + 1000,
                              last_chunk_time_us=real_free, output_tokens=output)
        out.append((rec, SimpleNamespace(request_id=i, e2e_us=sim_free - send, output_tokens=output)))
    return out


def capacity_comparison(matched: list[tuple[Any, Any]], tolerance: float = 0.05) -> Any:
    """The comparison of these matched pairs, as columns."""
    return _capacity(*paired(matched), tolerance)


def report_with(capacity: object) -> CalibrationReport:
    return CalibrationReport(trace_info=TraceInfo(num_requests=1, warm_up_excluded=0, matched_pairs=1,
                                                  token_mismatches=0),
                             metrics={}, capacity=capacity)  # type: ignore[arg-type]


def test_a_burst_is_saturated_and_a_faithful_model_passes() -> None:
    c = capacity_comparison(pairs(40, gap_us=0, service_us=50_000, sim_service_us=51_000, burst=True))
    assert c is not None and c.saturated and c.arrival_rps is None  # all sent at once
    assert c.backlog == 40  # every request still waits for its first token when the last is sent
    assert c.real_rps == pytest.approx(20.0) and c.sim_rps == pytest.approx(20 / 1.02, rel=1e-6)
    assert c.real_output_tps == pytest.approx(200.0)
    assert c.rps_error < 0.05 and c.within is True
    report = report_with(c)
    assert [r.metric for r in report.verdicts()] == ["capacity[req/s]", "capacity[output tok/s]"]
    assert report.passed


def test_a_slow_model_at_saturation_fails_the_verdict() -> None:
    # arrivals at 40 req/s into a 20 req/s server: the queue grows; the sim serves 15 % slower
    c = capacity_comparison(pairs(60, gap_us=25_000, service_us=50_000, sim_service_us=57_500))
    assert c is not None and c.saturated and c.arrival_rps == pytest.approx(40.0)
    assert c.backlog >= 20  # the queue grew with the arrivals
    assert c.rps_error == pytest.approx(0.13, abs=0.01) and c.within is False
    report = report_with(c)
    assert not report.passed
    table = render_table(report.verdicts(), only_failed=True)
    assert "capacity[req/s]" in table and "EXCEEDS" in table and "/s" in table


def test_below_saturation_throughput_is_reported_not_judged() -> None:
    # 10 req/s into a 20 req/s server: both sides serve the arrivals; even a 2x slower model
    # (still faster than the arrivals) shows the same throughput, so there is nothing to judge
    c = capacity_comparison(pairs(60, gap_us=100_000, service_us=50_000, sim_service_us=90_000))
    assert c is not None and not c.saturated and c.within is None and c.backlog == 1  # the last request itself
    assert c.rps_error < 0.05
    assert report_with(c).verdicts() == []


def test_too_few_requests_are_never_saturated() -> None:
    few = pairs(MIN_REQUESTS - 1, gap_us=0, service_us=50_000, sim_service_us=50_000, burst=True)
    waiting = backlog([r.send_time_us for r, _ in few], [r.first_content_time_us for r, _ in few])
    assert waiting == MIN_REQUESTS - 1 and not is_saturated(len(few), waiting)
    assert is_saturated(MIN_REQUESTS, waiting)
    c = capacity_comparison(few)
    assert c is not None and not c.saturated and c.within is None
    assert capacity_comparison(few[:1]) is None


def test_a_small_backlog_is_bunching_not_saturation() -> None:
    # 100 requests, 4 still waiting at the last send: Poisson bunching below capacity, not a growing queue
    assert not is_saturated(100, 4) and not is_saturated(100, 9) and is_saturated(100, 10)


def test_failed_and_warm_up_rows_do_not_count() -> None:
    data = pairs(30, gap_us=0, service_us=50_000, sim_service_us=50_000, burst=True)
    data[0][0].status = "error"
    c = capacity_comparison(data)
    assert c is not None and c.requests == 29


def test_the_blis_compatible_view_drops_the_capacity_block() -> None:
    from blis_sim.formats.report import reference_view

    c = capacity_comparison(pairs(40, gap_us=0, service_us=50_000, sim_service_us=50_000, burst=True))
    assert report_with(c).capacity is not None and reference_view(report_with(c)).capacity is None


def observed_burst(d: Path, *, rate: float, max_concurrency: int) -> tuple[Path, Path, list[Any]]:
    """30 requests of 256 prompt and 8 output tokens, scheduled at ``rate`` req/s through ``max_concurrency``
    client slots to the real emulator (h100-14b: steps of >= 10 ms); the trace written under ``d``."""
    from blis_sim.emulator import EmulatorConfig, start_emulator
    from blis_sim.formats.workload import WorkloadSpec
    from blis_sim.observe.run import ObserveOptions, observe, write_result

    client = {"id": "b", "rate_fraction": 1, "streaming": True, "arrival": {"process": "constant"},
              "input_distribution": {"type": "constant", "params": {"value": 256}},
              "output_distribution": {"type": "constant", "params": {"value": 8}}}
    spec = WorkloadSpec.model_validate({"version": "2", "seed": 3, "aggregate_rate": rate, "num_requests": 30,
                                        "clients": [client]})
    with start_emulator(EmulatorConfig(profile="h100-14b", block_size=16, num_gpu_blocks=2048)) as emu:
        result = observe(emu.url, spec, ObserveOptions(model="tiny-llama", max_concurrency=max_concurrency,
                                                       progress=False))
    write_result(result, d / "t.yaml", d / "t.csv")
    return d / "t.yaml", d / "t.csv", result.trace.records


@pytest.fixture(scope="module")
def burst_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Any]]:
    """30 requests sent at once (every request is still waiting for its first token when the last is sent)."""
    return observed_burst(tmp_path_factory.mktemp("burst"), rate=1e6, max_concurrency=64)


def _sim_file(path: Path, records: list[Any], slowdown: float) -> Path:
    """Simulated results that reproduce the observed latencies, stretched by ``slowdown``."""
    from blis_sim.formats.results import SimResult, write_sim_results

    results = [SimResult(request_id=r.request_id, ttft_us=(r.first_content_time_us - r.send_time_us) * slowdown,
                         e2e_us=(r.last_chunk_time_us - r.send_time_us) * slowdown, input_tokens=r.input_tokens,
                         output_tokens=r.output_tokens) for r in records]
    write_sim_results(results, path)
    return path


@pytest.mark.parametrize("slowdown,code", [(1.0, 0), (1.3, 1)])
def test_cli_judges_the_capacity_of_a_saturated_window(burst_trace: tuple[Path, Path, list[Any]], tmp_path: Path,
                                                      slowdown: float, code: int,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from blis_sim.cli import main as blis_main

    header, data, records = burst_trace
    sim = _sim_file(tmp_path / "sim.json", records, slowdown)
    argv = ["calibrate", "--trace-header", str(header), "--trace-data", str(data), "--sim-results", str(sim),
            "--report", str(tmp_path / "r.json"), "--ttft-mape-threshold", "1"]  # judge capacity alone
    assert blis_main(argv) == code
    err = capsys.readouterr().err
    report = json.loads((tmp_path / "r.json").read_text())
    c = report["capacity"]
    assert c["saturated"] and c["backlog"] >= 20 and c["requests"] == 30
    # the backlog is the burst's sign; a busy host may show the others too (its sends late, its waiting)
    assert c["saturation"][0] == "backlog" and set(c["saturation"]) <= {"backlog", "sends lag", "waiting"}
    assert f"Throughput (saturated: {', '.join(c['saturation'])}, 30 requests" in err
    assert "E2E MAPE at saturation=" in err and "(saturated: queueing, reported, not judged)" in err
    assert c["e2e_threshold"] == 1.0
    if code:
        assert c["within"] is False and c["rps_error"] > 0.2
        assert {"capacity[req/s]", "capacity[output tok/s]"} <= set(report["verdict"]["failed"])
    else:
        assert c["within"] is True and c["rps_error"] < 1e-9 and report["verdict"]["passed"]


def lagged_pairs(n: int, *, gap_us: float, service_us: float, sim_service_us: float, slots: int,
                 prompt: int = 1000) -> list[tuple[SimpleNamespace, SimpleNamespace]]:
    """A client with ``slots`` concurrency slots, scheduled every ``gap_us``, in front of a server
    taking ``service_us`` per request, one at a time: past capacity the sends fall behind their
    schedule (each waits for a slot), so the server's own queue stays short."""
    out = []
    done: list[float] = []
    real_free = sim_free = 1_000_000.0
    for i in range(n):
        scheduled = i * gap_us
        send = 1_000_000.0 + scheduled
        if len(done) >= slots:
            send = max(send, sorted(done)[-slots])  # the slot frees when an earlier request completes
        start = max(real_free, send)
        real_free = start + service_us
        done.append(real_free)
        sim_free = max(sim_free, send) + sim_service_us
        rec = SimpleNamespace(request_id=i, status="ok", send_time_us=send, arrival_time_us=scheduled,
                              first_content_time_us=start + 1000, first_chunk_time_us=start + 1000,
                              last_chunk_time_us=real_free, output_tokens=10, server_input_tokens=prompt)
        out.append((rec, SimpleNamespace(request_id=i, e2e_us=sim_free - send, output_tokens=10)))
    return out


def test_a_window_whose_sends_lag_their_schedule_is_saturated() -> None:
    # scheduled at 40 req/s, served at 20: two slots hold the queue in the client, not the server
    lagged = lagged_pairs(60, gap_us=25_000, service_us=50_000, sim_service_us=50_000, slots=2)
    c = capacity_comparison(lagged)
    assert c is not None and c.backlog < 5  # the backlog rule alone sees nothing
    assert c.saturation == ["sends lag"] and c.saturated and c.within is True
    assert 1.2 < c.send_lag_s <= 59 * 0.025  # the last sends left up to half the schedule late
    # on schedule (arrivals the server keeps up with) the same client is not
    easy = capacity_comparison(lagged_pairs(60, gap_us=100_000, service_us=50_000,
                                            sim_service_us=50_000, slots=2))
    assert easy is not None and not easy.saturated and easy.saturation == []
    assert easy.send_lag_s < 0.01


def test_at_saturation_throughput_and_e2e_are_judged_and_ttft_is_reported() -> None:
    from blis_sim.calibrate.core import calibrate_detailed  # noqa: F401  (the report's producer)
    from blis_sim.formats.report import ToleranceVerdict

    c = capacity_comparison(lagged_pairs(60, gap_us=25_000, service_us=50_000, sim_service_us=50_000,
                                         slots=2))
    assert c is not None
    judged = c.model_copy(update={"e2e_mape": 0.20, "e2e_threshold": 0.15})
    report = report_with(judged).model_copy(update={
        "ttft_tolerance": ToleranceVerdict(mape=0.9, threshold=0.15, within=False)})
    names = [r.metric for r in report.verdicts()]
    assert "ttft_mape" not in names  # reported (ttft_tolerance is kept), not judged
    assert names == ["capacity[req/s]", "capacity[output tok/s]"]  # no e2e metric in this report
    # below saturation TTFT is judged again
    below = report.model_copy(update={"capacity": None})
    assert [r.metric for r in below.verdicts()] == ["ttft_mape"] and not below.passed


def test_waiting_dominates_ttft_when_requests_wait_most_of_it() -> None:
    from blis_sim.calibrate.capacity import WAIT_SHARE, waiting_share

    # two prompt classes, each with its own floor: a long prompt's long TTFT is not a wait
    light = [100_000.0] * 10 + [1_600_000.0] * 10
    assert waiting_share(light, [256] * 10 + [4096] * 10) == pytest.approx(0.0)
    queued = [100_000.0 * (1 + i) for i in range(20)]  # each waits for every earlier one
    assert waiting_share(queued, [1000] * 20) >= WAIT_SHARE


def test_a_real_client_held_back_by_its_slots_is_judged_saturated(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """30 requests scheduled at 200 req/s through 2 concurrency slots to the real emulator (h100-14b, ~10 ms
    steps, 8 output tokens: ~20 req/s): the sends fall ~1.4 s behind their schedule while the server never
    holds more than two, so only the lagging sends show that it could not keep up."""
    import json

    from blis_sim.cli import main as blis_main

    header, data, records = observed_burst(tmp_path, rate=200, max_concurrency=2)
    sim = _sim_file(tmp_path / "sim.json", records, 1.0)
    argv = ["calibrate", "--trace-header", str(header), "--trace-data", str(data),
            "--sim-results", str(sim), "--report", str(tmp_path / "r.json")]
    assert blis_main(argv) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    c = report["capacity"]
    assert c["backlog"] < 5 and c["saturation"] == ["sends lag"] and c["saturated"]
    assert c["send_lag_s"] > 0.5
    assert c["within"] is True and c["e2e_mape"] is not None and c["e2e_mape"] < 1e-9
    assert "Throughput (saturated: sends lag" in capsys.readouterr().err
