"""Where the points run (design D10): a local process pool by default, a Ray cluster when given an
address; the same rows either way (every point is a deterministic function of its task).

* **local** — :class:`concurrent.futures.ProcessPoolExecutor` with one worker per core (or
  ``workers``); the payload (the trace) reaches each worker once, through the pool's
  ``initializer`` (with the ``fork`` start method, used when this process runs no other thread, it
  is inherited, not even pickled; otherwise ``spawn`` pickles it once per worker). ``workers=1``
  runs in this process.
* **Ray** — ``ray.init(address=...)`` (``auto``: the cluster this node belongs to; ``ray://…``:
  Ray Client), or the Ray instance this process already initialised. The payload is put into the
  object store once (``ray.put``); one actor per CPU (or ``workers``) takes it at construction and
  evaluates points, handed out by :class:`ray.util.ActorPool`. The workers import ``blis_sim``:
  install the package on the cluster (docs/sweep.md).

:func:`run_tasks` runs the tasks the :class:`~blis_sim.sweep.store.PointStore` does not hold yet,
adds each finished point to it as it arrives (so an interruption keeps them), and reports
progress on ``progress`` (stderr by the CLI).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TextIO

from blis_sim.errors import BlisError, SimulationError, UsageError
from blis_sim.sweep.base import Payload, Task, evaluate
from blis_sim.sweep.store import PointStore


@dataclass(frozen=True)
class Backend:
    """Where to run: ``workers`` (None: every local core / every CPU of the Ray cluster) and
    ``ray_address`` (None: the local pool; ``"auto"``, ``"ray://host:10001"``, ``"host:6379"``)."""

    workers: int | None = None
    ray_address: str | None = None

    def describe(self) -> str:
        return f"Ray ({self.ray_address})" if self.ray_address else "local process pool"


# one evaluation, in whichever worker: (key, figures | None, error message | None, seconds)
Result = tuple[str, "dict[str, Any] | None", "str | None", float]


def _run_one(payload: Payload, task: Task) -> Result:
    t0 = time.perf_counter()
    try:
        figures = evaluate(payload, task)
    except BlisError as exc:
        return task.key, None, str(exc), time.perf_counter() - t0
    return task.key, figures, None, time.perf_counter() - t0


_PAYLOAD: Payload | None = None


def _init_worker(payload: Payload) -> None:
    global _PAYLOAD
    _PAYLOAD = payload


def _pool_task(task: Task) -> Result:
    assert _PAYLOAD is not None
    return _run_one(_PAYLOAD, task)


def _local(payload: Payload, todo: Sequence[Task], workers: int) -> Iterator[Result]:
    if workers <= 1 or len(todo) <= 1:
        for task in todo:
            yield _run_one(payload, task)
        return

    # fork shares the payload without pickling it, but forking a process that runs other threads
    # (a pytest-xdist worker, an embedding application) copies their state mid-flight: spawn there
    fork = "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1
    ctx = multiprocessing.get_context("fork" if fork else "spawn")
    pool = ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=ctx,
                               initializer=_init_worker, initargs=(payload,))
    try:
        pending = {pool.submit(_pool_task, t) for t in todo}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                yield f.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class _Evaluator:
    """A Ray actor: holds the payload, evaluates points."""

    def __init__(self, payload: Payload) -> None:
        self.payload = payload

    def run(self, task: Task) -> Result:
        return _run_one(self.payload, task)


def ray_connect(address: str) -> bool:
    """Connect to Ray unless this process already is; True when this call connected (the caller
    then shuts it down)."""
    try:
        import ray
    except ImportError:
        raise UsageError("--ray-address needs Ray: pip install 'pytest-blis[ray]'") from None
    if ray.is_initialized():
        return False
    ray.init(address=None if address == "local" else address, logging_level=logging.WARNING,
             log_to_driver=False)
    return True


def _ray(payload: Payload, todo: Sequence[Task], backend: Backend) -> Iterator[Result]:
    assert backend.ray_address
    started = ray_connect(backend.ray_address)
    import ray
    from ray.util import ActorPool

    try:
        n = backend.workers or max(1, int(ray.available_resources().get("CPU", 1)))
        ref = ray.put(payload)  # once, into the object store; each actor reads it once
        actor = ray.remote(num_cpus=1)(_Evaluator)
        pool = ActorPool([actor.remote(ref) for _ in range(min(n, len(todo)))])
        yield from pool.map_unordered(lambda a, t: a.run.remote(t), list(todo))
    except ray.exceptions.RayError as exc:  # a worker that died or could not import blis_sim
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SimulationError(f"a Ray worker failed ({type(exc).__name__}: {first}); the workers need "
                              "pytest-blis installed (docs/sweep.md)") from None
    finally:
        if started:
            ray.shutdown()


def run_tasks(payload: Payload, tasks: Sequence[Task], store: PointStore, backend: Backend, *,
              progress: TextIO | None = None, label: str = "sweep") -> dict[str, dict[str, Any]]:
    """Every task's figures, by key: from ``store`` when it holds them, else computed (and added
    to it as each finishes). A point whose simulation fails stops the run with its error (the
    finished points are kept)."""
    unique: dict[str, Task] = {}
    for t in tasks:
        unique.setdefault(t.key, t)
    todo = [t for k, t in unique.items() if k not in store]
    reused = len(unique) - len(todo)
    workers = backend.workers or os.cpu_count() or 1
    say = (lambda msg: print(f"{label}: {msg}", file=progress, flush=True)) if progress else (lambda msg: None)
    where = backend.describe()
    if not backend.ray_address:
        where += f", {min(workers, max(len(todo), 1))} worker(s)"
    say(f"{len(unique)} point(s): {reused} already done, {len(todo)} to run on {where}")
    t0 = time.perf_counter()
    results = _ray(payload, todo, backend) if backend.ray_address else _local(payload, todo, workers)
    by_key = {t.key: t for t in todo}
    for done, (key, figures, error, seconds) in enumerate(results, start=1):
        task = by_key[key]
        if error is not None:
            close = getattr(results, "close", None)
            if close is not None:
                close()
            raise SimulationError(f"point {task.index} ({_shown(task)}): {error}")
        assert figures is not None
        store.add(key, figures)
        say(f"[{done}/{len(todo)}] point {task.index} ({_shown(task)}) {seconds:.2f} s")
    if todo:
        say(f"{len(todo)} point(s) in {time.perf_counter() - t0:.1f} s")
    return {k: store.get(k) for k in unique}  # type: ignore[misc]


def _shown(task: Task) -> str:
    return ", ".join(f"{k}={v}" for k, v in task.values.items()) or "base"
