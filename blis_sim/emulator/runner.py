"""Starting and stopping emulators: in-process (own loop in a thread) or as a subprocess.

API::

    with start_emulator(EmulatorConfig(num_gpu_blocks=64)) as emu:   # RunningEmulator
        emu.url                      # "http://127.0.0.1:<port>" (port 0 -> a free port)
        emu.published()              # what /metrics shows now (stats snapshot + gauges)
        emu.set_faults(FaultConfig(metrics="http500"))
        emu.restart()                # counters reset + caches dropped, as a server restart
        emu.reset_prefix_cache()     # -> bool
    # emu.stop() on exit; idempotent

    with spawn_emulator(EmulatorConfig(...)) as proc:   # or spawn_emulator(["--profile", "zero"])
        proc.url, proc.pid
    with spawn_emulator(EmulatorConfig(...), replicas=2) as proc:   # a cluster: proc.urls
    # SIGTERM to that PID only, SIGKILL after a grace period

The subprocess runs ``python -m blis_sim.emulator ... --port 0`` and prints one ready line,
``blis emulate: serving <url>``, once the socket is bound; the parent reads the URL from it, so
there is no free-port race.
"""
from __future__ import annotations

import asyncio
import collections
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import IO, TypeVar

from blis_sim.emulator import loop as event_loop
from blis_sim.emulator.config import EmulatorConfig, FaultConfig
from blis_sim.emulator.engine import Engine
from blis_sim.emulator.metrics import Published
from blis_sim.emulator.server import App, Handlers, build_app
from blis_sim.errors import ServerError

T = TypeVar("T")

READY_PREFIX = "blis emulate: serving "


async def serve(config: EmulatorConfig) -> tuple[App, Handlers, str]:
    """Start the engine and the server on the running loop; returns (app, handlers, url)."""
    engine = Engine(config)
    app, handlers = build_app(engine)
    try:
        host, port = await app.start(config.host, config.port)
    except OSError as exc:
        raise ServerError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    return app, handlers, f"http://{host}:{port}"


class RunningEmulator:
    """An emulator served by an event loop in a daemon thread of this process."""

    def __init__(self, config: EmulatorConfig, *, startup_timeout_s: float = 10.0) -> None:
        self.config = config
        self._loop = event_loop.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._runner: App | None = None
        self._handlers: Handlers | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._main, name="blis-emulator", daemon=True)
        self._thread.start()
        if not self._ready.wait(startup_timeout_s):
            raise ServerError("emulator did not start in time")
        if self._error is not None:
            self._thread.join(timeout=5)
            raise self._error
        self.host, port = self.url.rsplit("//", 1)[1].rsplit(":", 1)
        self.port = int(port)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._runner, self._handlers, self.url = self._loop.run_until_complete(serve(self.config))
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._ready.set()
            self._loop.close()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def _call(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(*args)`` on the emulator's loop and return its result."""
        async def run() -> T:
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    @property
    def engine(self) -> Engine:
        assert self._handlers is not None
        return self._handlers.engine

    def published(self) -> Published:
        return self._call(self.engine.published)

    def set_faults(self, faults: FaultConfig) -> None:
        assert self._handlers is not None
        self._call(self._handlers.apply_faults, faults)

    def restart(self) -> None:
        self._call(self.engine.restart)

    def reset_prefix_cache(self) -> bool:
        return bool(self._call(self.engine.reset_prefix_cache))

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> RunningEmulator:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def start_emulator(config: EmulatorConfig | None = None) -> RunningEmulator:
    """Start an emulator in this process (its own loop in a thread); bound before it returns."""
    return RunningEmulator(config or EmulatorConfig())


class SpawnedEmulator:
    """An emulator in a child process, stopped by its PID."""

    def __init__(self, argv: Sequence[str], *, startup_timeout_s: float = 30.0,
                 env: dict[str, str] | None = None, replicas: int = 1) -> None:
        self.argv = [sys.executable, "-m", "blis_sim.emulator", *argv]
        self._stderr: collections.deque[str] = collections.deque(maxlen=50)
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True, env=env)
        self.pid = self.proc.pid
        threading.Thread(target=self._drain, args=(self.proc.stderr, self._stderr), daemon=True).start()
        # ``--replicas N``: one ready line per replica (docs/cluster.md §6)
        self.urls = self._read_ready(startup_timeout_s, replicas)
        self.url = self.urls[0]

    @staticmethod
    def _drain(stream: IO[str], keep: collections.deque[str] | None) -> None:
        for line in stream:
            if keep is not None:
                keep.append(line.rstrip())

    def _read_ready(self, timeout: float, replicas: int = 1) -> list[str]:
        """The URLs of the first ``replicas`` ready lines; stdout is then drained by a thread (one reader:
        a buffered stream that already holds the next line would not wake a selector)."""
        assert self.proc.stdout is not None
        lines: queue.Queue[str | None] = queue.Queue()

        def read(stream: IO[str]) -> None:
            for line in stream:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, args=(self.proc.stdout,), daemon=True).start()
        deadline = time.monotonic() + timeout
        urls: list[str] = []
        while len(urls) < replicas:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break  # exited
            if line.startswith(READY_PREFIX):
                urls.append(line[len(READY_PREFIX):].strip())
        if len(urls) == replicas:
            return urls
        self.proc.poll()
        self.stop()
        time.sleep(0.05)
        detail = "; ".join(self._stderr) or "no output"
        raise ServerError(f"emulator subprocess did not become ready (exit code "
                          f"{self.proc.returncode}): {detail}")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def niceness(self) -> int:
        """The child's scheduling niceness (``EmulatorConfig.nice``, when the OS granted it)."""
        return os.getpriority(os.PRIO_PROCESS, self.pid)

    def stop(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM to this child only; SIGKILL if it is still there after ``grace_s``."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=grace_s)
        return self.proc.returncode

    def __enter__(self) -> SpawnedEmulator:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def spawn_emulator(config: EmulatorConfig | Sequence[str] | None = None, *,
                   startup_timeout_s: float = 30.0, replicas: int = 1) -> SpawnedEmulator:
    """Start ``blis emulate`` in a subprocess on a free port (config or argv); ready on return.
    ``replicas``: serve that many independent replicas (a cluster; ``.urls``, one free port each)."""
    from blis_sim.emulator.cli import config_to_argv  # cli.py imports this module

    if config is None:
        config = EmulatorConfig()
    argv = config_to_argv(config) if isinstance(config, EmulatorConfig) else list(config)
    if "--port" not in argv:
        argv += ["--port", "0"]
    if "--exit-with-parent" not in argv:
        argv.append("--exit-with-parent")
    if replicas > 1:
        argv += ["--replicas", str(replicas)]
    return SpawnedEmulator(argv, startup_timeout_s=startup_timeout_s, replicas=replicas)
