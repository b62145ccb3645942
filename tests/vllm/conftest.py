"""Fixtures for the tests against a real vLLM server (the real-vLLM lane, design D4).

Server: ``BLIS_VLLM_URL`` when set (used as is, never stopped); otherwise the lane's own server from
``tools/vllm_cpu.py``: reused when one is up, else started once and stopped by the last pytest process that
used it (pytest-xdist workers share it through a lease directory under the lane's lock). When the lane is not
installed the tests skip, saying how to install it; with ``BLIS_REQUIRE_VLLM=1`` (CI) that is an error.
``BLIS_SKIP_VLLM=1`` skips them whatever is installed (CI's unit-test step, which leaves them to the lane step).

Counter tests take the ``kv_window`` fixture: an inter-process lock, so that no other test's traffic lands in
their ``/metrics`` delta window even under xdist.
"""
from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_lane import VllmServer, client, exclusive, healthy, lane, run, unavailable


def _lease_dir() -> Path:
    return lane.cache_paths().root / "leases"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _lane_server() -> Iterator[str]:
    """Start (or join) the lane's server; the last lease holder stops a server that pytest started."""
    paths = lane.cache_paths()
    lease = _lease_dir() / str(os.getpid())
    with lane.locked(paths):
        try:
            state, _ = lane.start(paths, owner="pytest")
        except lane.VllmCpuError as exc:
            pytest.fail(f"the lane's vLLM server did not start: {exc}", pytrace=False)
        lease.parent.mkdir(exist_ok=True)
        lease.touch()
    try:
        yield state.url
    finally:
        with lane.locked(paths):
            lease.unlink(missing_ok=True)
            for other in lease.parent.iterdir():
                if other.name.isdigit() and not _pid_alive(int(other.name)):
                    other.unlink(missing_ok=True)  # a crashed pytest process left it
            current = lane.ServerState.load(paths.state_file)
            if not any(lease.parent.iterdir()) and current is not None and current.owner == "pytest":
                lane.stop(paths)


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    if os.environ.get("BLIS_SKIP_VLLM") == "1":
        pytest.skip("BLIS_SKIP_VLLM=1: the real-vLLM lane runs in its own step")
    url = os.environ.get("BLIS_VLLM_URL", "").rstrip("/")
    if url:
        if not healthy(url):
            pytest.fail(f"BLIS_VLLM_URL={url}: /health does not answer 200", pytrace=False)
        cm: contextlib.AbstractContextManager[str] = contextlib.nullcontext(url)
    else:
        paths = lane.cache_paths()
        if not lane.installed(paths):
            unavailable(f"no vLLM lane in {paths.venv}: run `python tools/vllm_cpu.py install && "
                         "python tools/vllm_cpu.py build-model`, or set BLIS_VLLM_URL")
        if not lane.model_built(paths):
            unavailable(f"no tiny model in {paths.model}: run `python tools/vllm_cpu.py build-model`")
        cm = _lane_server()
    with cm as live_url:
        snap = run(lambda s: client.scrape(s, live_url))
        config = snap.labels_of("vllm:cache_config_info")[0]
        yield VllmServer(url=live_url, block_size=int(config["block_size"]),
                         num_gpu_blocks=int(config["num_gpu_blocks"]), requested_gpu_blocks=_requested_blocks(live_url))


def _requested_blocks(url: str) -> int | None:
    """``--num-gpu-blocks-override`` of the lane's server when ``url`` is that server, else None."""
    state = lane.ServerState.load(lane.cache_paths().state_file)
    if state is None or state.url != url or "--num-gpu-blocks-override" not in state.argv:
        return None
    return int(state.argv[state.argv.index("--num-gpu-blocks-override") + 1])


@pytest.fixture()
def kv_window(vllm_server: VllmServer) -> Iterator[VllmServer]:
    """Exclusive use of the server for one test, so that counter deltas hold only the measuring test's requests.

    Every test that sends generation requests takes it (not only the counter tests), and keeps it until the
    engine has published the stats of its last request (``SETTLE_S``), so that nothing it sent can land in
    the next test's window.
    """
    with exclusive():
        yield vllm_server


@pytest.fixture()
def rng(request: pytest.FixtureRequest) -> random.Random:
    """Fresh token ids per run: a reused server must not have these prompts cached already."""
    return random.Random(f"{request.node.nodeid}-{time.time_ns()}")
