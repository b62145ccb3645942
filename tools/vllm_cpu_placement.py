"""Keep the lane server's frontend off the cores its model runs on (standard library only).

vLLM on CPU binds its model worker's OpenMP threads to the cores it chooses (``VLLM_CPU_OMP_THREADS_BIND=auto``:
core 0 on a 2-core machine, core 1 "reserved" for the rest) but leaves every other process free to run anywhere.
On a 2-core machine its EngineCore busy-polls ~95 % of a core, the API server streams, the client parses SSE; the
kernel then runs them on the model's core too, and the worker is preempted 200-1,200 times a second. Measured on
the lane's saturation cell (2026-12-02): the server's steps ran 6-23 % slower than the probe fit (ITL ratio mean
1.10), and its throughput 6 % lower, than with the frontend kept off the model's core (ITL ratio 0.93-1.09, mean
1.01). A GPU server has this split by construction: the model runs on the device, the frontend on the host CPUs.

:func:`place_server` moves every process of the server's session but the bound worker (all their threads) to the
host cores: the other cores. :func:`keep_off` does the same for a client process (the lane's pytest, the bench).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Placement:
    """Which cores the model's worker holds (``device``), and where everything else of the server runs (``host``)."""

    device: tuple[int, ...]
    host: tuple[int, ...]
    moved: tuple[int, ...]  # PIDs of the server's processes moved to the host cores

    def describe(self) -> str:
        if not self.host:
            return "the model's worker is not bound to a subset of the cores; placement left to the kernel"
        return (f"model worker on core(s) {_cores(self.device)}; the server's other {len(self.moved)} processes on "
                f"{_cores(self.host)}")


#: nothing bound, nothing moved: placement left to the kernel
UNPLACED = Placement(device=(), host=(), moved=())


def _cores(cpus: tuple[int, ...]) -> str:
    return ",".join(map(str, cpus))


def session_pids(sid: int) -> Iterator[int]:
    """PIDs of the processes in session ``sid`` (the server was started as a session leader)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the command name: state ppid pgrp session ... (proc(5)); the name may hold spaces.
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:
            yield int(entry.name)


def _pin_threads(pid: int, cpus: set[int]) -> bool:
    """Every thread of ``pid`` to ``cpus`` (threads created later inherit it). False when the process is gone."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return False
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that just exited
    return True


def place_server(sid: int) -> Placement:
    """Leave the server's bound worker(s) where vLLM put them; move its other processes to the remaining cores.

    A process is the model's when its affinity is narrower than the cores this machine gives us (vLLM bound it).
    With none bound, or no core left over, nothing moves."""
    allowed = os.sched_getaffinity(0)
    device: set[int] = set()
    others: list[int] = []
    for pid in session_pids(sid):
        try:
            cpus = os.sched_getaffinity(pid)
        except (ProcessLookupError, PermissionError):
            continue
        if cpus < allowed:
            device |= cpus
        else:
            others.append(pid)
    host = allowed - device
    if not device or not host:
        return UNPLACED
    moved = tuple(pid for pid in others if _pin_threads(pid, host))
    return Placement(device=tuple(sorted(device)), host=tuple(sorted(host)), moved=moved)


def keep_off(host: tuple[int, ...], pid: int = 0) -> bool:
    """Run ``pid`` (default: this process, all its threads) on the host cores only. False when there are none."""
    if not host:
        return False
    return _pin_threads(pid or os.getpid(), set(host))
