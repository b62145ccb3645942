"""A one-line progress display on stderr, only when stderr is a terminal (quiet in CI and pipes).

API::

    p = Progress(total=400, enabled=None)   # None: on iff stderr is a TTY
    p.phase("flood"); p.advance(ok=True); p.close()

Redraws at most 10 times a second so it never competes with the dispatcher for the CPU.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

_MIN_INTERVAL_S = 0.1


class Progress:
    def __init__(self, total: int, *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total = total
        self.done = self.failed = 0
        self.name = ""
        self._last = 0.0

    def phase(self, name: str) -> None:
        self.name = name
        self._draw(force=True)

    def advance(self, ok: bool) -> None:
        self.done += 1
        self.failed += 0 if ok else 1
        self._draw()

    def close(self) -> None:
        if self.enabled:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < _MIN_INTERVAL_S:
            return
        self._last = now
        # Sessions release follow-ups, so the total can grow past the planned count.
        total = max(self.total, self.done)
        width = 30
        filled = int(width * self.done / total) if total else width
        phase = f" [{self.name}]" if self.name else ""
        self.stream.write(f"\robserve{phase} |{'#' * filled}{'.' * (width - filled)}| "
                          f"{self.done}/{total} done, {self.failed} failed ")
        self.stream.flush()
