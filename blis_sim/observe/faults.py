"""What went wrong in the offload tiers over an observe window, for the trace header (docs/observe.md, "Faults").

API::

    faults = window_faults(window.faults, rows, block_size)   # list[Fault] for the header
    warnings = fault_warnings(faults)                          # one line per fault that happened

Two sources:

* the server's fault counters over the window (``observe.metrics.FAULT_FAMILIES``): allocation failures
  of the CPU tier, failed stores to and promotions from secondary tiers;
* a **warm start**: requests whose cached tokens exceed what anything sent earlier in the window could
  have left in the cache. The bound per request is an infinite cache that starts empty: the full blocks
  of its prefix group's prefix once an earlier request of the group was sent, and of an earlier round of
  its session (prompt and output). A request above it hit content from before the window: a long-lived
  server, or an ``fs`` tier whose root kept an earlier run's files (their names are content hashes, so
  the same prompts find them again). The simulator replays the window from an empty cache, so such hits
  cannot be reproduced.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from blis_sim.formats.trace import Fault, TraceRecord


def warm_start_requests(rows: Sequence[TraceRecord], block_size: int) -> list[tuple[int, int, int]]:
    """``(request_id, cached_tokens, bound)`` of every request that hit more than the window explains."""
    bs = max(int(block_size), 1)
    group_longest: dict[str, int] = {}
    session_longest: dict[str, int] = {}
    warm: list[tuple[int, int, int]] = []
    for r in sorted(rows, key=lambda r: (r.send_time_us, r.request_id)):
        prompt = r.prefix_length + r.input_tokens
        bound = 0
        if r.prefix_group and r.prefix_group in group_longest:
            bound = min(r.prefix_length, group_longest[r.prefix_group])
        if r.session_id and r.session_id in session_longest:
            bound = max(bound, min(prompt, session_longest[r.session_id]))
        bound = bound // bs * bs
        if r.cached_tokens > bound:
            warm.append((r.request_id, r.cached_tokens, bound))
        if r.prefix_group:
            group_longest[r.prefix_group] = max(group_longest.get(r.prefix_group, 0), r.prefix_length)
        if r.session_id:
            session_longest[r.session_id] = max(session_longest.get(r.session_id, 0),
                                                prompt + r.output_tokens)
    return warm


def window_faults(counted: Iterable[Mapping[str, Any]], rows: Sequence[TraceRecord],
                  block_size: int) -> list[Fault]:
    """The header's ``faults``: every fault counter the server exposed, then a warm start if any."""
    faults = [Fault(kind=f["kind"], tier=f.get("tier"), count=int(f["count"]), metric=str(f.get("metric", "")))
              for f in counted]
    warm = warm_start_requests([r for r in rows if r.status == "ok"], block_size)
    if warm:
        rid, cached, bound = warm[0]
        faults.append(Fault(
            kind="warm_start", count=len(warm), metric="cached_tokens",
            detail=(f"{len(warm)} requests got more cached tokens than anything sent earlier in the window "
                    f"holds ({sum(c - b for _, c, b in warm)} tokens in all; first: request {rid}, {cached} "
                    f"cached where at most {bound} could be)")))
    return faults


_MEANING = {
    "allocation_failure": "offers the CPU tier could not make room for (nothing of them stored); the "
                          "simulator models these",
    "store_failure": "stores to this tier failed (those chunks are not on it); the simulator assumes every "
                     "store succeeds, so the window's hit-rates are not comparable",
    "promotion_failure": "promotions from this tier failed (those tokens were recomputed); the simulator "
                         "assumes every promotion succeeds, so the window's hit-rates are not comparable",
    "promotion_allocation_failure": "promotions the CPU tier could not make room for",
}


def fault_warnings(faults: Iterable[Fault]) -> list[str]:
    """One warning per fault that happened (a zero count says nothing)."""
    out = []
    for f in faults:
        if not f.count:
            continue
        if f.kind == "warm_start":
            out.append(f"warm start: {f.detail}: the server held content from before the window (a "
                       "long-lived server, or an fs tier root with an earlier run's files); the simulator "
                       "replays from an empty cache, so the window's hit-rates are not comparable")
            continue
        where = f" on tier {f.tier}" if f.tier else ""
        out.append(f"{f.count} {f.kind.replace('_', ' ')}s{where} ({f.metric}): {_MEANING[f.kind]}")
    return out
