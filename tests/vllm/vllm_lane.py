"""Helpers shared by the real-vLLM tests: the lane script and probe client (loaded by path), the server record,
and small runners for aiohttp code. Imported by ``conftest.py`` and by the test modules (``from vllm_lane import``).
"""
from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

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


@dataclass(frozen=True)
class VllmServer:
    """The server under test and the KV geometry it reported."""

    url: str
    block_size: int
    num_gpu_blocks: int
    requested_gpu_blocks: int | None  # the lane's --num-gpu-blocks-override, when this is the lane's server


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
