"""Routing a request to one replica of a cluster (docs/cluster.md §2).

Neutral ground, like ``_aio.py``: observe routes with it on the client, the simulator re-routes a
trace with it, the emulator's router front routes with it. It imports nothing of ``kv/`` or
``engine/`` (design D3: the emulator may use it).

API::

    spec = RoutingSpec.parse("weighted", "prefix-affinity:3,queue-depth:2")   # flags as the reference's
    router = Router(spec, num_instances=2)
    r = router.choose(key="g3", inflight=[4, 1])     # key: the request's prefix key (prefix_key)
    router.sent(r, key); ...; router.done(r)          # what the router remembers and counts in flight

Policies: ``round-robin``; ``least-loaded`` (fewest requests in flight, ties to the lowest index);
``always-busiest`` (most in flight: the reference's pathological baseline); ``prefix-affinity``
(consistent hashing of the prefix key on a ring of :data:`VNODES` points per replica); ``weighted``
(the highest sum of weight × scorer, ties taken round-robin among the tied). Scorers a client can
compute: ``prefix-affinity`` (1 on the replica the key was last sent to, else 0: the router's own
memory of what it sent, as llm-d's approximate prefix scorer), ``queue-depth`` (1 − in-flight / the
most in flight, 1 everywhere when nothing is in flight). ``recorded`` is the simulator's own: a
trace's ``replica`` column.
"""
from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from blis_sim.errors import UsageError

POLICIES = ("recorded", "round-robin", "least-loaded", "always-busiest", "prefix-affinity", "weighted")
SCORERS = ("prefix-affinity", "queue-depth")
# Scorers of the reference that need the server's own state; refused with the reason.
UNSUPPORTED_SCORERS = {
    "precise-prefix-cache": "needs the replicas' KV events (the blocks each one holds)",
    "kv-utilization": "needs each replica's KV usage at every arrival, which no routing here reads "
                      "(docs/cluster.md §8)",
    "load-aware": "scores each replica's waiting queue against a threshold (llm-d's); queue-depth "
                  "scores the requests in flight",
}
# Policies whose choice depends on requests in flight: the client counts its own when it observes; a
# replay or run advances the replicas to each arrival first (blis_sim/engine/load_routing.py).
LOAD_DEPENDENT = frozenset({"least-loaded", "always-busiest"})
VNODES = 64


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class RoutingSpec:
    """A routing policy with its scorers (name, weight), as ``--routing-policy`` / ``--routing-scorers``."""

    policy: str = "round-robin"
    scorers: tuple[tuple[str, float], ...] = ()

    @classmethod
    def parse(cls, policy: str, scorers: str | None = None, *, flag: str = "--routing-scorers") -> RoutingSpec:
        if policy not in POLICIES:
            raise UsageError(f"--routing-policy {policy!r}: expected one of {', '.join(POLICIES)}")
        parsed: list[tuple[str, float]] = []
        for item in (scorers or "").split(","):
            item = item.strip()
            if not item:
                continue
            name, sep, weight = item.partition(":")
            name = name.strip()
            if name in UNSUPPORTED_SCORERS:
                raise UsageError(f"{flag}: scorer {name!r} is not supported: it "
                                 f"{UNSUPPORTED_SCORERS[name]}; use {' or '.join(SCORERS)}")
            if name not in SCORERS:
                raise UsageError(f"{flag}: unknown scorer {name!r}: expected {' or '.join(SCORERS)} "
                                 "(as name:weight, comma-separated)")
            try:
                w = float(weight) if sep else 1.0
            except ValueError:
                raise UsageError(f"{flag}: scorer {name!r} has weight {weight!r}, not a number") from None
            if not w >= 0 or w == float("inf"):
                raise UsageError(f"{flag}: scorer {name!r} weight must be a finite number ≥ 0, got {weight}")
            if any(n == name for n, _ in parsed):
                raise UsageError(f"{flag}: scorer {name!r} is given twice")
            parsed.append((name, w))
        if policy == "weighted" and not parsed:
            raise UsageError("--routing-policy weighted needs --routing-scorers, e.g. "
                             "'prefix-affinity:3,queue-depth:2'")
        if policy != "weighted" and parsed:
            raise UsageError(f"--routing-scorers applies to --routing-policy weighted only, not {policy!r}")
        return cls(policy=policy, scorers=tuple(parsed))

    @property
    def load_dependent(self) -> bool:
        """Whether a choice depends on the requests in flight."""
        return self.policy in LOAD_DEPENDENT or any(n == "queue-depth" and w > 0 for n, w in self.scorers)

    def text(self) -> str:
        """The scorers as the flag writes them (``""`` for none)."""
        return ",".join(f"{n}:{w:g}" for n, w in self.scorers)


def prefix_key(prefix_group: str, session_id: str, request_id: int | str) -> str:
    """What prefix affinity hashes: the prefix group, else the session (its rounds share their
    context), else the request itself (a unique prompt: any replica)."""
    if prefix_group:
        return "group:" + prefix_group
    if session_id:
        return "session:" + session_id
    return f"request:{request_id}"


class Router:
    """One router's state: its ring, its round-robin cursor, its memory of keys sent."""

    def __init__(self, spec: RoutingSpec, num_instances: int) -> None:
        if num_instances < 1:
            raise UsageError(f"--num-instances must be ≥ 1, got {num_instances}")
        if spec.policy == "recorded":
            raise UsageError("--routing-policy recorded replays a trace's replica column; it cannot route")
        self.spec = spec
        self.n = num_instances
        self._rr = 0
        self._last: dict[str, int] = {}
        self.inflight = [0] * num_instances
        points = sorted((_hash64(f"replica-{r}-vnode-{v}"), r) for r in range(num_instances)
                        for v in range(VNODES))
        self._ring = [p for p, _ in points]
        self._owner = [r for _, r in points]

    def _ring_owner(self, key: str) -> int:
        k = bisect.bisect_left(self._ring, _hash64(key))
        return self._owner[k % len(self._ring)]

    def choose(self, key: str, inflight: Sequence[int] | None = None) -> int:
        """The replica for a request with prefix key ``key``; ``inflight`` per replica (default:
        this router's own counts from :meth:`sent` / :meth:`done`)."""
        load = list(inflight) if inflight is not None else self.inflight
        p = self.spec.policy
        if self.n == 1:
            return 0
        if p == "round-robin":
            r = self._rr
            self._rr = (self._rr + 1) % self.n
            return r
        if p == "least-loaded":
            return min(range(self.n), key=lambda i: (load[i], i))
        if p == "always-busiest":
            return min(range(self.n), key=lambda i: (-load[i], i))
        if p == "prefix-affinity":
            return self._ring_owner(key)
        scores = [0.0] * self.n
        top = max(load) if load else 0
        for name, w in self.spec.scorers:
            for i in range(self.n):
                if name == "prefix-affinity":
                    s = 1.0 if self._last.get(key) == i else 0.0
                else:  # queue-depth
                    s = 1.0 - load[i] / top if top > 0 else 1.0
                scores[i] += w * s
        best = max(scores)
        tied = [i for i in range(self.n) if scores[i] == best]
        r = tied[self._rr % len(tied)]
        self._rr += 1
        return r

    def sent(self, replica: int, key: str) -> None:
        self._last[key] = replica
        self.inflight[replica] += 1

    def done(self, replica: int) -> None:
        self.inflight[replica] -= 1


def route_static(spec: RoutingSpec, num_instances: int, keys: Sequence[str]) -> list[int]:
    """Route requests in order when no choice depends on load (a load policy's choices need the
    replicas' simulation: ``blis_sim.engine.load_routing.route_by_load``)."""
    if spec.load_dependent:
        raise ValueError(f"routing policy {spec.policy!r} depends on load: route it with route_by_load")
    router = Router(spec, num_instances)
    out = []
    for key in keys:
        r = router.choose(key, inflight=[0] * num_instances)
        router._last[key] = r
        out.append(r)
    return out
