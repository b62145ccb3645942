"""observe's event loop (:mod:`blis_sim._aio`, shared with the emulator): uvloop when it imports,
the standard library's loop otherwise.

API::

    run(main())                    # asyncio.run with uvloop's loop (fallback: the stdlib loop)
    new_event_loop()               # a loop of the same kind, for a caller that drives it
    loop_name(loop) -> str         # "uvloop" | "asyncio", for logs and tests

observe's timestamps are only as good as the loop's latency (design D6); uvloop costs less CPU per
socket event and per timer.
"""
from blis_sim._aio import loop_factory, loop_name, new_event_loop, run

__all__ = ["loop_factory", "loop_name", "new_event_loop", "run"]
