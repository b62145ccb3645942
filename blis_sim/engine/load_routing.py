"""Routing by load: the replicas advance on one simulated clock while the router routes (docs/cluster.md §2).

API::

    assign = route_by_load(table, routing, replicas, options, content_seed=seed, keys=keys)
    # replicas: one Replica(kv, num_gpu_blocks) per instance (the caches are advanced: pass fresh
    # ones, or a run's shadow caches that have seen the same earlier phases)

A policy that reads the requests in flight (``least-loaded``, ``always-busiest``, ``weighted`` with
``queue-depth``) needs each replica's state at every arrival. Before arrival ``i`` at time ``t`` is
routed, every replica with requests in flight is advanced to ``t``: its step loop (``feed``,
``blis_sim/engine/_loop.pyx``) runs until the first step boundary at or past ``t`` and waits there.
The router then reads each replica's in-flight count and the request joins the chosen replica's
loop, which takes it at that boundary as an unrouted loop would have. Each replica's loop runs in a
greenlet of its own (a coroutine over the compiled loop's C stack: a switch costs about a
microsecond, where a thread's hand-over cost tens), one at a time: the router hands the clock to
one replica and takes it back at its next feed call, so the run is as deterministic as one loop.

**In flight** is the router's view: sent to the replica (its arrival, at or before ``t``) and not
finished by ``t`` (its last token's step ended after ``t``, or it has not ended). A request the
replica cannot hold (over its GPU capacity, dropped at arrival) is never in flight. That is the
engine's own waiting + running + loading count at ``t``, read exactly at every arrival.

This pass only routes: its loops run against caches that no result is read from. The caller then
simulates each replica's rows as a recorded routing would (``engine/cluster.py``), so a load-routed
replay and the replay of its ``--trace-output`` with ``--routing-policy recorded`` are the same
simulation (INV-13). Not routed by load (refused, with the reason): session rounds (a later round is
released when the earlier one finishes on its replica, so its row is not known to any one replica's
loop up front), phases of a replay and sequential replays (a phase's start on each replica depends
on the routing of the phase before).
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from greenlet import getcurrent, greenlet

from blis_sim.engine._loop_py import FINISHED
from blis_sim.engine.kvport import CacheOps, kv_port
from blis_sim.engine.requests import RequestTable
from blis_sim.engine.simulate import EngineOptions, dropped_rows, run_table_loop
from blis_sim.errors import UsageError
from blis_sim.formats._io import gc_paused
from blis_sim.routing import Router, RoutingSpec


@dataclass
class Replica:
    """One instance's cache and its geometry, as the routing pass advances it."""

    kv: CacheOps
    num_gpu_blocks: int


class _Lane:
    """A replica's loop in a greenlet of its own, which hands the clock back at each feed call."""

    def __init__(self, index: int, run: Callable[[_Lane], None]) -> None:
        self.index = index
        self.router = getcurrent()
        self.glet = greenlet(lambda: run(self))
        self.t = 0.0                   # where the loop waits: the first step boundary at or past a feed time
        self.done = False              # the loop has ended (its horizon): its state stays as it is
        self.open: list[int] = []      # rows handed to the loop, not finished by where it waits
        self.later: deque[float] = deque()  # finish times of rows that ended after the last routing time
        self.pending: list[int] = []   # rows routed here that the loop has not been handed yet

    def feed(self, t: float, finish: np.ndarray, status: np.ndarray) -> tuple[list[int], float]:
        """The loop's feed call, in the lane's greenlet: the router answers (rows, next time)."""
        answer: tuple[list[int], float] = self.router.switch((t, finish, status))
        return answer

    def start(self) -> None:
        """Run the loop to its first feed call, before anything is routed."""
        self._back(self.glet.switch())

    def resume(self, until: float) -> None:
        """Hand the loop its new rows and let it run to the first step boundary at or past ``until``."""
        rows, self.pending = self.pending, []
        self.open.extend(rows)
        self._back(self.glet.switch((rows, until)))

    def _back(self, msg: Any) -> None:
        if self.glet.dead:  # the loop ended (its horizon, or it ran out)
            self.done = True
        else:
            self.paused(*msg)

    def paused(self, t: float, finish: np.ndarray, status: np.ndarray) -> None:
        """The loop waits at ``t``: its rows that have finished by then leave ``open`` (their finish
        times, all at or before ``t``, are kept until the router's clock passes them). ``finish``
        holds a running request's last token time, a finished one's end (the loop's arrays)."""
        self.t = t
        if not self.open:
            return
        if len(self.open) <= 16:  # the usual few: item reads cost less than an index array
            ended = [j for j in self.open if status[j] == FINISHED]
            done = [float(finish[j]) for j in ended]
            if done:
                self.open = [j for j in self.open if status[j] != FINISHED]
        else:
            rows = np.asarray(self.open, dtype=np.int64)
            over = status[rows] == FINISHED
            done = finish[rows[over]].tolist()
            if done:
                self.open = rows[~over].tolist()
        if done:
            self.later = deque(sorted([*self.later, *done]))

    def in_flight(self, t: float) -> int:
        """Requests in flight at the router's time ``t`` (where the loop waits is at or past ``t``,
        or the replica is idle)."""
        later = self.later
        while later and later[0] <= t:
            later.popleft()
        return len(self.open) + len(later) + len(self.pending)


def check_load_routable(table: RequestTable, routing: RoutingSpec, *, sequential: bool = False,
                        phases: int = 1) -> None:
    """Refuse, with the reason, what a load policy does not route (the module docstring)."""
    what = f"--routing-policy {routing.policy}" + (f" with --routing-scorers {routing.text()}"
                                                   if routing.scorers else "")
    if sequential:
        raise UsageError(f"{what} reads the requests in flight at each arrival, and a --sequential "
                         "replay starts each replica's requests when its previous one ends, which "
                         "depends on the routing; replay without --sequential, or re-route with "
                         "round-robin or prefix-affinity (docs/cluster.md §2)")
    if phases > 1:
        raise UsageError(f"{what} does not route a replay of several phases (each replica's phase "
                         "starts when its previous phase drained, which depends on the routing); "
                         "re-route with round-robin or prefix-affinity (docs/cluster.md §2)")
    if ((table.next_round >= 0) | (table.prev_round >= 0) | (table.session >= 0)).any():
        raise UsageError(f"{what} does not route session rounds (a later round is released when the "
                         "earlier one finishes, on whichever replica served it); re-route with "
                         "round-robin or prefix-affinity (docs/cluster.md §2, §8)")


def route_by_load(table: RequestTable, routing: RoutingSpec, replicas: list[Replica], options: EngineOptions,
                  *, content_seed: int, keys: list[str]) -> np.ndarray:
    """The replica of each row of ``table`` (sorted by arrival) under a load-dependent ``routing``;
    ``keys``: each row's prefix key. ``options`` resolved, with the horizon the replicas' own
    simulation will have; the replicas' caches are advanced."""
    n = len(replicas)
    if n == 1:
        return np.zeros(len(table), dtype=np.int64)
    check_load_routable(table, routing)
    block_size = int(options.block_size or 0)
    content = table.content(content_seed, block_size)
    router = Router(routing, n)
    dropped = [dropped_rows(table, rep.num_gpu_blocks, block_size) for rep in replicas]

    def run(lane: _Lane) -> None:
        port = kv_port(replicas[lane.index].kv, content)
        run_table_loop(table, port, options, dropped[lane.index], block_size=block_size,
                       offload=options.kv_offload, feed=lane.feed)

    assign = np.full(len(table), -1, dtype=np.int64)
    lanes = [_Lane(r, run) for r in range(n)]
    # one pause for every loop: each loop's own would restore the collector while the others run
    with gc_paused():
        try:
            for lane in lanes:
                lane.start()
            arrival = table.arrival_us.tolist()
            inflight = [0] * n
            for i, t in enumerate(arrival):
                for lane in lanes:
                    if not lane.done and lane.t < t and (lane.open or lane.pending):
                        lane.resume(t)
                    inflight[lane.index] = lane.in_flight(t)
                r = router.choose(keys[i], inflight=inflight)
                router.sent(r, keys[i])
                assign[i] = r
                if not dropped[r][i]:
                    lanes[r].pending.append(i)
            for lane in lanes:  # let each loop run out, so that the caches hold the whole phase
                if not lane.done:
                    lane.resume(math.inf)
        finally:
            for lane in lanes:  # an error: unwind every loop still waiting
                if not lane.glet.dead:
                    lane.glet.throw()
    return assign
