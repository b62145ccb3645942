"""The emulator's event loop: uvloop when it imports, the standard library's loop otherwise.

API::

    run(main())                    # asyncio.run with uvloop's loop (fallback: the stdlib loop)
    new_event_loop()               # a loop for a thread of its own (start_emulator)
    loop_name(loop) -> str         # "uvloop" | "asyncio", for logs and tests
    now() -> float                 # the emulator's clock (monotonic seconds, sub-µs resolution)
    await sleep_until(target)      # sleep until now() >= target: never early, on time when idle

uvloop (libuv) costs less CPU per socket event and per timer than the stdlib selector loop; the
emulator stands in for vLLM, whose API server also runs on uvloop (uvicorn's default). Where uvloop
cannot import (Windows, a minimal install) or ``BLIS_NO_UVLOOP=1`` is set, the standard loop is used:
same behaviour, more CPU.

The clock: uvloop's ``loop.time()`` and timers count whole milliseconds (libuv), the stdlib loop's
``time.monotonic()`` with timeouts rounded up to the next millisecond. Server-side timestamps (arrival,
first token: what vLLM reports as TTFT) and step pacing must not depend on which loop runs, so the
emulator stamps with :func:`now` (``time.monotonic``, the stdlib loop's clock) and waits with
:func:`sleep_until`, which aims the loop's timer a little early and yields to the loop for the rest.
The loop choice itself lives in :mod:`blis_sim._aio` (shared with observe; the emulator imports
nothing from the observe side, design D3).
"""
from __future__ import annotations

import asyncio
import time

from blis_sim._aio import loop_factory, loop_name, new_event_loop, run

__all__ = ["loop_factory", "loop_name", "new_event_loop", "now", "run", "sleep_until"]

now = time.monotonic  # the stdlib loop's clock; precise under uvloop too

# How early a timer is aimed: the stdlib loop rounds epoll timeouts up to whole ms (so aiming 0.5 ms
# early lands within +-0.5 ms); libuv rounds to whole ms and runs timers against a clock cached per
# loop iteration, so aim a full ms early there. The rest is covered by yielding to the loop.
_SLACK_S = {"asyncio": 0.0005, "uvloop": 0.001}


async def sleep_until(target: float) -> None:
    """Sleep until :func:`now` reaches ``target``: never early, on time on an idle loop.

    The loop's timer ends the bulk of the wait and ``sleep(0)`` yields cover the last fraction of a
    millisecond (HTTP handlers keep running meanwhile), at the CPU cost of those yields. The step
    pacing and the first-token delay fault both wait this way: a timer alone ends up to 1-2 ms late
    under uvloop, and a fault that late would read as client overhead in every TTFT measured
    against it.
    """
    delay = target - now()
    if delay <= 0:
        return
    slack = _SLACK_S[loop_name(asyncio.get_running_loop())]
    if delay > slack:
        await asyncio.sleep(delay - slack)
    while now() < target:
        await asyncio.sleep(0)
