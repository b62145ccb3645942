"""Placement of the lane server's processes (tools/vllm_cpu_placement.py), on real processes and without vLLM: a
session whose 'worker' binds itself to one core, as vLLM's model worker does, and a 'frontend' that does not."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_lane import lane, run_tool

placement = lane.placement
CORES = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="placement needs at least 2 usable cores")

# The session leader (the 'API server') starts a 'worker' bound to the first core and a 'frontend' left free,
# then reports their PIDs once the worker has bound itself.
SERVER = """
import os, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c",
    "import os, sys, time; os.sched_setaffinity(0, {int(sys.argv[1])}); print('bound', flush=True); time.sleep(120)",
    sys.argv[1]], stdout=subprocess.PIPE, text=True)
assert worker.stdout.readline().strip() == "bound"
frontend = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(worker.pid, frontend.pid, flush=True)
time.sleep(120)
"""


@pytest.fixture()
def server() -> Iterator[tuple[int, int, int]]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(CORES[0])], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        worker, frontend = map(int, proc.stdout.readline().split())  # type: ignore[union-attr]
        yield proc.pid, worker, frontend
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the group we started, by its PID
        proc.wait(timeout=10)


@needs_two_cores
def test_the_bound_worker_keeps_its_core_and_the_rest_of_the_server_moves_off_it(
        server: tuple[int, int, int]) -> None:
    leader, worker, frontend = server
    where = placement.place_server(leader)
    host = tuple(CORES[1:])
    assert where.device == (CORES[0],) and where.host == host
    assert sorted(where.moved) == sorted([leader, frontend])
    assert os.sched_getaffinity(worker) == {CORES[0]}
    for pid in (leader, frontend):
        for tid in os.listdir(f"/proc/{pid}/task"):  # every thread, not only the main one
            assert os.sched_getaffinity(int(tid)) == set(host)
    assert f"core(s) {CORES[0]}" in where.describe()


@needs_two_cores
def test_a_client_kept_off_the_device_runs_on_the_host_cores(server: tuple[int, int, int]) -> None:
    where = placement.place_server(server[0])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert placement.keep_off(where.host, child.pid)
        assert os.sched_getaffinity(child.pid) == set(where.host)
    finally:
        child.kill()
        child.wait()
    assert not placement.keep_off((), child.pid)  # no host cores: nothing to do, and it says so


def test_a_server_with_no_bound_process_is_left_to_the_kernel() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        time.sleep(0.1)
        where = placement.place_server(proc.pid)
        assert where == placement.UNPLACED
        assert "left to the kernel" in where.describe()
        assert os.sched_getaffinity(proc.pid) == set(CORES)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def test_host_cpus_without_a_server_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLIS_VLLM_CACHE", str(tmp_path))
    out = run_tool("vllm_cpu", "host-cpus")
    assert out.returncode == 1 and out.stdout == ""
    assert "no healthy server" in out.stderr and "Traceback" not in out.stderr


def test_the_state_file_keeps_the_placement(tmp_path: Path) -> None:
    state = lane.ServerState(pid=1, port=1, url="http://127.0.0.1:1", log="", started_at=0.0, startup_seconds=0.0,
                             num_gpu_blocks=4096, block_size=32, owner="test", argv=("vllm",), model="lane",
                             device_cpus=(0,), host_cpus=(1, 2, 3))
    state.save(tmp_path / "state.json")
    assert lane.ServerState.load(tmp_path / "state.json") == state
