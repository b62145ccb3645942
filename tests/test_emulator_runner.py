"""Starting and stopping emulators: in-process, as a subprocess, and as `blis emulate`."""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from blis_sim.emulator import EmulatorConfig, FaultConfig, spawn_emulator, start_emulator
from blis_sim.emulator.cli import add_arguments, config_from_args, config_to_argv
from blis_sim.emulator.runner import READY_PREFIX
from blis_sim.emulator.tokenizer import BUILTIN_NOTE
from blis_sim.errors import ConfigError, ServerError, UsageError


def test_start_emulator_binds_loopback_on_a_free_port_and_stops() -> None:
    emu = start_emulator(EmulatorConfig(profile="zero"))
    with emu:
        assert emu.host == "127.0.0.1" and emu.port > 0 and emu.url == f"http://127.0.0.1:{emu.port}"
        assert httpx.get(emu.url + "/health", timeout=5).status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(emu.url + "/health", timeout=2)
    emu.stop()  # idempotent


def test_two_emulators_in_one_process_keep_separate_metrics() -> None:
    with start_emulator(EmulatorConfig(profile="zero", model="m1")) as a, \
            start_emulator(EmulatorConfig(profile="zero", model="m2")) as b:
        assert 'model_name="m1"' in httpx.get(a.url + "/metrics").text
        assert 'model_name="m1"' not in httpx.get(b.url + "/metrics").text


def test_port_in_use_is_a_server_error() -> None:
    with start_emulator(EmulatorConfig(profile="zero")) as a:
        with pytest.raises(ServerError, match="cannot listen"):
            start_emulator(EmulatorConfig(profile="zero", port=a.port))


def test_config_round_trips_through_flags(tmp_path: Path) -> None:
    offload = tmp_path / "o.yaml"
    cfg = EmulatorConfig(model="x", profile="h100-14b", block_size=32, num_gpu_blocks=99,
                         kv_bytes_per_token=1024, max_model_len=2048, max_num_seqs=8,
                         max_num_batched_tokens=512, enable_prefix_caching=False,
                         enable_chunked_prefill=False, kv_offload_config=str(offload),
                         metrics_profile="vllm-0.11", created_series=False, stats_interval_s=0.2,
                         enable_prompt_tokens_details=True, enable_per_request_metrics=True,
                         add_bos=True, eos_probability=0.1,
                         step_noise=0.0, seed=7, served_version="9.9.9", nice=5,
                         faults=FaultConfig(metrics="hang", error_rate=0.2, error_status=429,
                                            stream_cut_rate=0.1, stream_cut_after_tokens=3,
                                            first_token_delay_s=0.5, first_token_delay_rate=0.5,
                                            stall_rate=0.01, reset_counters_after=10))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args(config_to_argv(cfg))) == cfg
    assert config_from_args(parser.parse_args(config_to_argv(EmulatorConfig()) + ["--port", "0"])) \
        == EmulatorConfig()


def test_in_memory_offload_spec_cannot_be_spawned() -> None:
    from blis_sim.emulator import OffloadSpec

    with pytest.raises(UsageError):
        config_to_argv(EmulatorConfig(offload=OffloadSpec(cpu_bytes=1 << 20)))


def test_spawn_emulator_serves_and_stops_by_pid() -> None:
    with spawn_emulator(EmulatorConfig(profile="zero", metrics_profile="none")) as proc:
        assert proc.alive and proc.url.startswith("http://127.0.0.1:")
        r = httpx.post(proc.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
        assert r.status_code == 200
        assert "vllm:prefix_cache_queries_total" not in httpx.get(proc.url + "/metrics").text
    assert not proc.alive and proc.proc.returncode == 0  # SIGTERM is a clean shutdown


def test_spawned_emulator_takes_the_niceness_it_is_given() -> None:
    # a higher niceness (lower priority) is always allowed, so this holds with or without root
    with spawn_emulator(EmulatorConfig(profile="zero", metrics_profile="none", nice=7)) as proc:
        assert proc.niceness == 7
        assert httpx.get(proc.url + "/health", timeout=10).status_code == 200


def test_a_refused_niceness_is_one_stderr_line_and_the_process_runs_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from blis_sim.emulator.cli import set_niceness

    def refuse(*_: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "setpriority", refuse)
    msg = set_niceness(-10)
    assert msg is not None and "niceness -10 refused" in msg and "CAP_SYS_NICE" in msg
    assert "\n" not in msg
    assert set_niceness(os.getpriority(os.PRIO_PROCESS, 0)) is None  # nothing to change: nothing asked


@pytest.mark.skipif(not shutil.which("setpriv") or os.geteuid() != 0,
                    reason="needs root and setpriv(1) to take CAP_SYS_NICE away from the emulator")
def test_emulator_without_cap_sys_nice_says_so_once_and_serves() -> None:
    argv = ["setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice", sys.executable, "-m",
            "blis_sim.emulator", "--port", "0", "--profile", "zero", "--nice", "-10", "--exit-with-parent"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert line.startswith(READY_PREFIX), line
        url = line[len(READY_PREFIX):].strip()
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        # refused: it keeps the niceness it was started with (this test's own, e.g. under `nice`)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    lines = err.strip().splitlines()
    assert [line for line in lines if "niceness" in line] == [lines[0]] and "niceness -10 refused" in lines[0]
    assert lines[1:] == ["blis emulate: tokenizer: " + BUILTIN_NOTE] and "Traceback" not in err


def test_spawn_with_argv() -> None:
    proc = spawn_emulator(["--profile", "zero", "--served-model-name", "argv-model"])
    try:
        assert httpx.get(proc.url + "/v1/models").json()["data"][0]["id"] == "argv-model"
    finally:
        assert proc.stop() == 0


def test_spawn_reports_a_bad_config() -> None:
    with pytest.raises(ServerError, match="num_gpu_blocks"):
        spawn_emulator(["--profile", "zero", "--num-gpu-blocks", "1"])


def test_blis_emulate_cli(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "blis_sim", "emulate", "--host", "127.0.0.1", "--port", "0",
                             "--profile", "zero"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith(READY_PREFIX), proc.stderr.read() if proc.poll() is not None else line  # type: ignore[union-attr]
        url = line[len(READY_PREFIX):].strip()
        assert httpx.get(url + "/version").json()["version"] == "0.33.0"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0


@pytest.mark.parametrize(("args", "needle"), [
    (["--num-gpu-blocks", "0"], "field 'num_gpu_blocks'"),
    (["--nice", "20"], "field 'nice'"),
    (["--fault-error-rate", "3"], "field 'faults.error_rate'"),
    (["--kv-offload-config", "/nonexistent/offload.yaml"], "/nonexistent/offload.yaml"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    out = subprocess.run([sys.executable, "-m", "blis_sim.emulator", "--port", "0", *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_bad_offload_file_names_file_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "offload.yaml"
    bad.write_text("kv_offload:\n  cpu_bytes_to_use: 1073741824\n  eviction_polcy: lru\n")
    with pytest.raises(Exception) as info:
        start_emulator(EmulatorConfig(profile="zero", kv_offload_config=str(bad)))
    assert f"{bad}:3" in str(info.value) and "eviction_polcy" in str(info.value)
    threshold = tmp_path / "threshold.yaml"  # vLLM's TieringOffloadingSpec refuses store_threshold
    threshold.write_text("kv_offload:\n  cpu_bytes_to_use: 1073741824\n  store_threshold: 2\n"
                         f"  secondary_tiers:\n    - type: fs\n      root_dir: {tmp_path}\n"
                         "      direct_io: true\n      device_class: nvme_gen4\n")
    with pytest.raises(ConfigError, match="store_threshold") as refused:
        start_emulator(EmulatorConfig(profile="zero", kv_offload_config=str(threshold)))
    assert str(threshold) in str(refused.value)


def test_unknown_profile_names_the_field() -> None:
    with pytest.raises(ConfigError) as info:
        EmulatorConfig(profile="a100")
    assert info.value.location.field == "profile"
    with pytest.raises(ConfigError) as info:
        EmulatorConfig(metrics_profile="vllm-0.99")
    assert info.value.location.field == "metrics_profile"


def test_spawned_emulator_exits_with_its_parent(tmp_path: Path) -> None:
    # A parent that spawns an emulator and dies without stopping it: the child follows.
    code = ("import sys; from blis_sim.emulator import EmulatorConfig, spawn_emulator; "
            "p = spawn_emulator(EmulatorConfig(profile='zero')); print(p.pid, flush=True)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    child = int(out.stdout.split()[0])
    import os
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the orphaned emulator kept running")
