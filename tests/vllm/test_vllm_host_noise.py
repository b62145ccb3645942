"""The host-noise check (tools/vllm_cpu_noise.py, `tools/vllm_cpu.py host-noise`): the statistics on fixed samples,
and the command end to end on this machine (a real child process timing real work; no vLLM, no ``vllm`` marker).
Whether this machine is quiet is not asserted: that is what the command measures."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from vllm_lane import _load, run_tool

noise = _load("vllm_cpu_noise")


def test_the_floor_is_the_mape_of_predicting_every_sample_by_the_median() -> None:
    assert noise.noise_floor([100.0, 100.0, 100.0]) == 0.0
    # median 100: |90-100|/90 + 0 + |125-100|/125 over 3
    assert noise.noise_floor([90.0, 100.0, 125.0]) == pytest.approx((10 / 90 + 25 / 125) / 3)
    with pytest.raises(ValueError):
        noise.noise_floor([])


def test_window_medians_follow_the_samples_start_times() -> None:
    times = [0.0, 1.0, 4.9, 5.0, 6.0, 12.0]
    samples = [10.0, 30.0, 20.0, 50.0, 70.0, 5.0]
    assert noise.window_medians(times, samples, window_s=5.0) == [20.0, 60.0, 5.0]


def test_a_host_whose_speed_moves_between_two_modes_is_not_quiet() -> None:
    # the lane server's identical prompts on the EPYC VM: ~133 ms and ~180 ms stretches
    timed = [(i * 0.2, 133.0 if (i // 25) % 2 == 0 else 180.0) for i in range(200)]
    found = noise.report(timed, core=0, seconds=40.0)
    assert not found.quiet and found.floor > 0.05
    assert "too noisy" in found.describe()
    assert found.window_medians_ms[0] == 133.0 and 180.0 in found.window_medians_ms


def test_a_steady_host_is_quiet_and_the_limit_is_a_third_of_the_gate() -> None:
    timed = [(i * 0.1, 50.0 + (i % 5) * 0.5) for i in range(100)]  # within 2 %
    found = noise.report(timed, core=1, seconds=10.0)
    assert found.quiet and found.max_floor == pytest.approx(0.05)
    assert found.to_json()["quiet"] is True and found.to_json()["core"] == 1


def test_the_command_times_this_machine_and_writes_its_figures(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLIS_VLLM_CACHE", str(tmp_path))  # no server recorded there
    out = tmp_path / "noise.json"
    done = run_tool("vllm_cpu", "host-noise", "--seconds", "2", "--json", str(out))
    assert done.returncode in (0, 4), done.stderr
    data = json.loads(out.read_text())
    assert len(data["samples_ms"]) >= 2 and all(ms > 0 for ms in data["samples_ms"])
    assert data["core"] == min(os.sched_getaffinity(0))
    assert data["quiet"] is (done.returncode == 0)
    assert "host-noise: core" in done.stderr and ("quiet enough" in done.stderr or "too noisy" in done.stderr)


def test_an_impossible_limit_makes_the_command_say_noisy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLIS_VLLM_CACHE", str(tmp_path))
    done = run_tool("vllm_cpu", "host-noise", "--seconds", "1", "--max-floor", "0")
    assert done.returncode == 4, done.stderr  # no real machine times work to the microsecond twice
    assert "too noisy" in done.stderr
    bad = run_tool("vllm_cpu", "host-noise", "--max-floor", "1.5")
    assert bad.returncode == 2 and "--max-floor within [0, 1)" in bad.stderr


def test_a_core_outside_the_machine_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLIS_VLLM_CACHE", str(tmp_path))
    done = run_tool("vllm_cpu", "host-noise", "--seconds", "1", "--core", "4096")
    assert done.returncode == 2
    assert "could not time the host" in done.stderr and "Traceback" not in done.stderr
