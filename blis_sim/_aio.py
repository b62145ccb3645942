"""The event loop observe and the emulator run on: uvloop when it imports, the standard library's
loop otherwise (a neutral module: the emulator imports nothing from the observe side, design D3).

API::

    run(main())                    # asyncio.run with uvloop's loop (fallback: the stdlib loop)
    new_event_loop()               # a loop of the same kind, for a caller that drives it
    loop_name(loop) -> str         # "uvloop" | "asyncio", for logs and tests

uvloop (libuv) costs less CPU per socket event and per timer than the stdlib selector loop; vLLM's
API server runs on it too (uvicorn's default). Where uvloop cannot import (Windows, a minimal
install) or ``BLIS_NO_UVLOOP=1`` is set, the standard loop is used: same behaviour, more CPU.
"""
from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's ``new_event_loop`` if usable, else asyncio's."""
    if os.environ.get("BLIS_NO_UVLOOP", "") not in ("", "0"):
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def new_event_loop() -> asyncio.AbstractEventLoop:
    return loop_factory()()


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop of :func:`loop_factory`."""
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(main)
    loop = new_event_loop()  # Python 3.10: no asyncio.Runner; what it does, by hand
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
