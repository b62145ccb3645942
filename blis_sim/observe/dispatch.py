"""Open-loop schedule + closed-loop follow-ups → concurrent requests, drained, stoppable.

API::

    dispatcher = Dispatcher(session, target, clock, max_concurrency=256, warmup_requests=0,  # session:
                            # an Http1Pool (observe's lean path) or an aiohttp session
                            stop=asyncio.Event(), grace_s=5.0, on_record=None)
    records = await dispatcher.run_phase(source, phase="", build=to_wire)
    dispatcher.next_id, dispatcher.interrupted

``source`` is a :class:`RequestSource`: ``initial()`` gives the open-loop requests (any objects with an
``arrival_us`` attribute, relative to the phase start), ``on_complete(planned, record, now_us)`` the
follow-ups a completion releases (session rounds, closed-loop users; their ``arrival_us`` already
includes the think time), ``build(planned) -> WireRequest`` turns one into a wire request.

Per request: wait for the scheduled time, then for a concurrency slot (``--max-concurrency``), then
take the next dispatch index and send. The record keeps the scheduled time (``arrival_us`` + phase
offset) and the actual send time, so lateness and slot waits are visible. When ``stop`` is set
(Ctrl-C, SIGTERM) nothing new is sent; in-flight requests get ``grace_s`` to finish (cut short by
setting ``abort``, e.g. a second Ctrl-C), then are cancelled and recorded as ``error`` ("cancelled: observe
interrupted") with the timings they had.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from blis_sim.observe.client import Target, send
from blis_sim.observe.http1 import Http1Pool
from blis_sim.observe.records import STATUS_ERROR, RequestRecord, RunClock, WireRequest

if TYPE_CHECKING:
    from blis_sim.workload.plan import PlannedRequest

# what a request is sent over: the lean HTTP/1.1 pool (http://) or an aiohttp session (https)
Sender = aiohttp.ClientSession | Http1Pool


class Route(Protocol):
    """A cluster's route (blis_sim.observe.cluster): per request the sender, target and replica index."""

    def choose(self, planned: PlannedRequest, rid: int) -> tuple[Sender, Target, int]: ...

    def done(self, replica: int) -> None: ...


class RequestSource(Protocol):
    def initial(self) -> list[PlannedRequest]: ...

    def on_complete(self, planned: PlannedRequest, record: RequestRecord, now_us: int) -> list[PlannedRequest]: ...


class ListSource:
    """A fixed open-loop list (no follow-ups)."""

    def __init__(self, planned: list[PlannedRequest]) -> None:
        self._planned = planned

    def initial(self) -> list[PlannedRequest]:
        return list(self._planned)

    def on_complete(self, planned: PlannedRequest, record: RequestRecord, now_us: int) -> list[PlannedRequest]:
        return []


class _Wakeup:
    """The dispatch loop's sleep: until ``set()`` (a completion, the stop) or a timeout.

    One future and at most one timer per sleep; an ``asyncio.Event`` plus ``asyncio.wait`` cost
    several tasks and callbacks per completion, which at thousands of requests per second is CPU the
    client takes from the responses it is timing. A ``set()`` before ``wait()`` is not remembered: the
    loop re-reads its state after every wake-up, and nothing can change between that read and the wait.
    """

    __slots__ = ("_fut",)

    def __init__(self) -> None:
        self._fut: asyncio.Future[None] | None = None

    def set(self) -> None:
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def wait(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._fut = fut
        timer = loop.call_later(timeout, _resolve, fut) if timeout is not None else None
        try:
            await fut
        finally:
            self._fut = None
            if timer is not None:
                timer.cancel()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Dispatcher:
    """Sends the requests of one phase at a time; request ids continue across phases."""

    def __init__(self, session: aiohttp.ClientSession | Http1Pool, target: Target, clock: RunClock, *,
                 max_concurrency: int = 256, warmup_requests: int = 0,
                 stop: asyncio.Event | None = None, grace_s: float = 5.0,
                 on_record: Callable[[RequestRecord], None] | None = None,
                 route: Route | None = None) -> None:
        self.session, self.target, self.clock = session, target, clock
        # a cluster (blis_sim.observe.cluster): ``route.choose(planned, rid)`` → (session, target,
        # replica) per request, ``route.done(replica)`` at its end
        self.route = route
        self.slots = asyncio.Semaphore(max_concurrency)
        self.warmup_requests = warmup_requests
        self.stop = stop or asyncio.Event()
        self.abort = asyncio.Event()  # a second Ctrl-C: cancel in-flight requests without the grace period
        self.grace_s = grace_s
        self.on_record = on_record
        self.next_id = 0
        self.interrupted = False
        self.origin_ns: int | None = None

    async def run_phase(self, source: RequestSource, build: Callable[[PlannedRequest, int], WireRequest],
                        phase_start_ns: int | None = None) -> list[RequestRecord]:
        """Dispatch ``source`` until drained (or stopped). Returns its records in dispatch order.

        ``build(planned, phase_offset_us)`` makes the wire request; the offset is the phase's start
        relative to the first phase's, so trace arrival times count from the start of dispatch.
        """
        start_ns = phase_start_ns if phase_start_ns is not None else self.clock.now_ns()
        if self.origin_ns is None:
            self.origin_ns = start_ns  # the trace's arrival times count from the first phase's start
        offset_us = (start_ns - self.origin_ns) // 1000
        tie = itertools.count()
        heap: list[tuple[int, int, PlannedRequest]] = [(p.arrival_us, next(tie), p) for p in source.initial()]
        heapq.heapify(heap)
        records: list[RequestRecord] = []
        inflight: dict[asyncio.Task[None], tuple[PlannedRequest, RequestRecord]] = {}
        wake = _Wakeup()
        stop_wait = asyncio.ensure_future(self.stop.wait())
        stop_wait.add_done_callback(lambda _: wake.set())

        def finished(task: asyncio.Task[None]) -> None:
            planned, record = inflight.pop(task)
            self.slots.release()
            if self.route is not None:
                self.route.done(record.replica)
            if not record.done:
                record.fail(STATUS_ERROR, "cancelled: observe interrupted")
            if self.on_record is not None:
                self.on_record(record)
            if not self.stop.is_set():
                now_us = (self.clock.now_ns() - start_ns) // 1000
                for follow in source.on_complete(planned, record, now_us):
                    heapq.heappush(heap, (follow.arrival_us, next(tie), follow))
            wake.set()

        try:
            while not self.stop.is_set():
                if not heap:
                    if not inflight:
                        break
                    await wake.wait(None)
                    continue
                due_us, _, planned = heap[0]
                delay_s = (start_ns + due_us * 1000 - self.clock.now_ns()) / 1e9
                if delay_s > 0:
                    # Sleep until due, but wake early for a follow-up that is due sooner, or a stop.
                    await wake.wait(delay_s)
                    continue
                heapq.heappop(heap)
                if self.slots.locked():
                    acquire = asyncio.ensure_future(self.slots.acquire())
                    await asyncio.wait([acquire, stop_wait], return_when=asyncio.FIRST_COMPLETED)
                    if not acquire.done():
                        acquire.cancel()
                        break
                else:
                    await self.slots.acquire()
                record = self._launch(planned, build, offset_us, start_ns + due_us * 1000, inflight,
                                      finished)
                records.append(record)
        finally:
            await self._drain(inflight)
            stop_wait.cancel()
            self.interrupted = self.interrupted or self.stop.is_set()
        return records

    def _launch(self, planned: PlannedRequest, build: Callable[[PlannedRequest, int], WireRequest],
                offset_us: int, scheduled_ns: int,
                inflight: dict[asyncio.Task[None], tuple[PlannedRequest, RequestRecord]],
                finished: Callable[[asyncio.Task[None]], None]) -> RequestRecord:
        rid = self.next_id
        self.next_id += 1
        wire = build(planned, offset_us)
        record = RequestRecord(request_id=rid, wire=wire, planned=planned, phase_offset_us=offset_us,
                               warmup=rid < self.warmup_requests, scheduled_ns=scheduled_ns)
        session, target = self.session, self.target
        if self.route is not None:
            session, target, record.replica = self.route.choose(planned, rid)
        task = asyncio.ensure_future(send(session, target, record, self.clock))
        inflight[task] = (planned, record)
        task.add_done_callback(finished)
        return record

    async def _drain(self, inflight: dict[asyncio.Task[None], tuple[PlannedRequest, RequestRecord]]) -> None:
        """Wait for in-flight requests; after a stop, only ``grace_s`` before cancelling them."""
        if not inflight:
            return
        tasks = list(inflight)
        if self.stop.is_set():
            self.interrupted = True
            pending: set[asyncio.Future[Any]] = set(tasks)
            deadline = asyncio.get_running_loop().time() + self.grace_s
            abort_wait = asyncio.ensure_future(self.abort.wait())
            try:
                while pending and not self.abort.is_set():
                    left = deadline - asyncio.get_running_loop().time()
                    if left <= 0:
                        break
                    _done, still = await asyncio.wait(pending | {abort_wait}, timeout=left,
                                                      return_when=asyncio.FIRST_COMPLETED)
                    pending = still - {abort_wait}
            finally:
                abort_wait.cancel()
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
            return
        stop_wait = asyncio.ensure_future(self.stop.wait())
        try:
            while inflight:
                done, _ = await asyncio.wait(list(inflight) + [stop_wait],
                                             return_when=asyncio.FIRST_COMPLETED)
                if stop_wait in done:
                    await self._drain(inflight)
                    return
        finally:
            stop_wait.cancel()
        # Let the done-callbacks (which may push follow-ups) run before returning.
        await asyncio.sleep(0)
