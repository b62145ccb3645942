"""Helpers shared by the real-vLLM tests: the lane's scripts (loaded by path, or run as programs), the server record,
the skip-or-fail rule, a running server's URL, the counter-window lock, and small runners for aiohttp code.
Imported by ``conftest.py`` and by the test modules (``from vllm_lane import``).
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn, TypeVar

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
T = TypeVar("T")
SETTLE_S = 1.2  # > the engine's stats interval (0.1-1 s): a scrape after it holds every finished request


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


lane = _load("vllm_cpu")
client = _load("vllm_cpu_client")
iterations = _load("vllm_cpu_iterations")


def run_tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python tools/<name>.py ARGS`` as a user runs it (output captured as text)."""
    return subprocess.run([sys.executable, str(TOOLS / f"{name}.py"), *args], capture_output=True, text=True,
                          check=False, timeout=60)


@dataclass(frozen=True)
class VllmServer:
    """The server under test and the KV geometry it reported."""

    url: str
    block_size: int
    num_gpu_blocks: int
    requested_gpu_blocks: int | None  # the lane's --num-gpu-blocks-override, when this is the lane's server


def unavailable(reason: str) -> NoReturn:
    """Skip for ``reason``; fail instead under ``BLIS_REQUIRE_VLLM=1`` (CI's lane step)."""
    if os.environ.get("BLIS_REQUIRE_VLLM") == "1":
        pytest.fail(f"BLIS_REQUIRE_VLLM=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:  # noqa: S310 (loopback)
            return resp.status == 200
    except OSError:
        return False


def running_server_url() -> str:
    """``BLIS_VLLM_URL``, else the lane's server when its state file names a healthy one. Never starts
    a server (the ``vllm_server`` fixture does): without one the caller skips (fails under
    ``BLIS_REQUIRE_VLLM=1``); ``BLIS_SKIP_VLLM=1`` skips."""
    if os.environ.get("BLIS_SKIP_VLLM") == "1":
        pytest.skip("BLIS_SKIP_VLLM=1: the real-vLLM lane runs in its own step")
    url = os.environ.get("BLIS_VLLM_URL", "").rstrip("/")
    if not url:
        state = lane.ServerState.load(lane.cache_paths().state_file)
        url = state.url if state is not None else ""
    if not url:
        unavailable("no real vLLM: set BLIS_VLLM_URL or run `python tools/vllm_cpu.py start`")
    if not healthy(url):
        unavailable(f"the real vLLM at {url} is not healthy")
    return url


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """The lane's ``counters.lock`` for a test's traffic, kept until the engine has published the stats
    of its last request (``SETTLE_S``), so nothing it sent lands in the next holder's counter window."""
    with lane.counters_locked():
        yield
        time.sleep(SETTLE_S)


def run(fn: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``fn(session)`` with a fresh aiohttp session on a fresh event loop."""
    import aiohttp

    async def main() -> T:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            return await fn(session)

    return asyncio.run(main())


async def window(session: Any, url: str, requests: Callable[[], Awaitable[T]],
                 settle: float = SETTLE_S) -> tuple[T, dict[str, int]]:
    """Scrape, run ``requests()``, wait for the engine's next stats publication, scrape: (result, KV deltas)."""
    before = await client.scrape(session, url)
    result = await requests()
    await asyncio.sleep(settle)
    after = await client.scrape(session, url)
    return result, after.kv_deltas(before)
