"""Requests as numpy columns: what the step loop, the KV content and the outputs need.

:func:`table_from_trace` builds a :class:`RequestTable` from a TraceV2 (blis-pipeline.md §4.2, with
our fixes): every row except ``status == "error"`` rows (they never reached the engine) is replayed;
the prompt is ``server_input_tokens`` when the server reported it, else ``prefix_length +
input_tokens``; rows of one prefix group share the group's first ``prefix_length`` tokens; rounds of
an accumulating session (header ``session_context_growth: accumulate``, or rows whose inputs grow by
at least the previous round's input + output) carry the previous rounds as context (in an observe
trace, the output a round carries is the planned text, not what the server generated: only the
previous rounds' prompt blocks are reused, see :mod:`blis_sim.engine.content`); arrivals are
``send_time_us`` (else ``arrival_time_us``) and, for observe traces (``mode: real``), rebased to the
first send so the clock starts near 0.

:func:`table_from_plan` builds one from a workload plan phase (``blis run``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from blis_sim.engine.content import ContentPlan
from blis_sim.workload.tokens import new_input_lengths


@dataclass
class RequestTable:
    """One row per simulated request, sorted by arrival (ties: trace order)."""

    request_id: np.ndarray          # int64: the trace's request_id (run: dispatch index)
    arrival_us: np.ndarray          # float64; a dynamic session round's is set by the loop
    prompt_len: np.ndarray          # int64: total prompt tokens
    output_len: np.ndarray          # int64
    next_round: np.ndarray          # int64: round released when this one finishes (-1)
    think_us: np.ndarray            # float64
    group: np.ndarray               # int32 index into group_names (-1)
    shared_prefix: np.ndarray       # int64
    session: np.ndarray             # int32 index into session_names (-1: not accumulating)
    prev_round: np.ndarray          # int64 (-1)
    new_input: np.ndarray           # int64
    in_window: np.ndarray           # bool: inside the comparison (counter) window
    keys: list[str]
    group_names: list[str]
    session_names: list[str]
    source: list[Any] = field(default_factory=list)  # the TraceRecord / PlannedRequest of each row
    observed: bool = False          # from an observe trace (mode real): see ContentPlan

    def __len__(self) -> int:
        return int(self.request_id.shape[0])

    def take(self, idx: np.ndarray) -> RequestTable:
        """The rows ``idx`` (in that order) as a table; links to rows outside become -1."""
        inv = np.full(len(self), -1, dtype=np.int64)
        inv[idx] = np.arange(idx.shape[0])

        def remap(links: np.ndarray) -> np.ndarray:
            sub = links[idx]
            return np.where(sub >= 0, inv[np.maximum(sub, 0)], -1)

        ii = idx.tolist()
        return RequestTable(
            request_id=self.request_id[idx], arrival_us=self.arrival_us[idx].copy(),
            prompt_len=self.prompt_len[idx], output_len=self.output_len[idx],
            next_round=remap(self.next_round), think_us=self.think_us[idx], group=self.group[idx],
            shared_prefix=self.shared_prefix[idx], session=self.session[idx],
            prev_round=remap(self.prev_round), new_input=self.new_input[idx],
            in_window=self.in_window[idx], keys=[self.keys[i] for i in ii],
            group_names=self.group_names, session_names=self.session_names,
            source=[self.source[i] for i in ii] if self.source else [], observed=self.observed)

    def phases(self) -> list[np.ndarray]:
        """Row indices per recorded phase (the ``phase`` column), in order of first arrival."""
        names = [getattr(r, "phase", "") or "" for r in self.source] if self.source else []
        if len(set(names)) < 2:
            return [np.arange(len(self))]
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(names):  # rows are sorted by arrival
            groups.setdefault(name, []).append(i)
        return [np.array(g, dtype=np.int64) for g in groups.values()]

    def content(self, seed: int, block_size: int) -> ContentPlan:
        return ContentPlan(seed=seed, block_size=block_size, prompt_len=self.prompt_len,
                           output_len=self.output_len, group=self.group,
                           shared_prefix=self.shared_prefix, session=self.session,
                           prev_round=self.prev_round, new_input=self.new_input, keys=self.keys,
                           group_names=self.group_names, session_names=self.session_names,
                           generated_differs=self.observed)


def _codes(names: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    index: dict[str, int] = {}
    codes = np.empty(len(names), dtype=np.int32)
    for i, name in enumerate(names):
        if not name:
            codes[i] = -1
            continue
        c = index.get(name)
        if c is None:
            c = index[name] = len(index)
        codes[i] = c
    return codes, list(index)


def table_from_trace(header: Any, records: Sequence[Any],
                     in_window: np.ndarray | None = None) -> RequestTable:
    """The replayable rows of a trace as a :class:`RequestTable` (see the module docstring)."""
    rows = [r for r in records if r.status != "error"]
    n = len(rows)
    rid = np.fromiter((r.request_id for r in rows), dtype=np.int64, count=n)
    send = np.fromiter((r.send_time_us for r in rows), dtype=np.int64, count=n)
    arrival_col = np.fromiter((r.arrival_time_us for r in rows), dtype=np.int64, count=n)
    arrival = np.where(send > 0, send, arrival_col).astype(np.float64)
    if header.mode == "real" and n and (send > 0).any():
        origin = float(send[send > 0].min())
        arrival = np.where(send > 0, send - origin, arrival_col).astype(np.float64)
        arrival = np.maximum(arrival, 0.0)
    plen = np.fromiter((r.prefix_length for r in rows), dtype=np.int64, count=n)
    inp = np.fromiter((r.input_tokens for r in rows), dtype=np.int64, count=n)
    server_in = np.fromiter((r.server_input_tokens for r in rows), dtype=np.int64, count=n)
    out = np.fromiter((r.output_tokens for r in rows), dtype=np.int64, count=n)
    groups = [r.prefix_group if r.prefix_length > 0 else "" for r in rows]
    gcode, gnames = _codes(groups)
    shared = np.where(gcode >= 0, plen, 0).astype(np.int64)
    prompt = np.where(server_in > 0, server_in, plen + inp).astype(np.int64)
    prompt = np.maximum(prompt, 1)
    shared = np.minimum(shared, prompt)

    # accumulating sessions: rounds in order; new input per round from the CSV columns
    session = np.full(n, -1, dtype=np.int32)
    prev = np.full(n, -1, dtype=np.int64)
    new_in = inp.copy()
    by_session: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        if r.session_id:
            by_session.setdefault(r.session_id, []).append(i)
    snames: list[str] = []
    force = header.session_context_growth == "accumulate"
    for sid, idx in by_session.items():
        idx.sort(key=lambda i: rows[i].round_index)
        rounds = [rows[i].round_index for i in idx]
        if rounds != list(range(len(rounds))) or len(idx) < 2:
            continue
        try:
            news = new_input_lengths([int(inp[i]) for i in idx], [int(out[i]) for i in idx])
        except ValueError:
            if force:
                news = None
            else:
                continue  # not an accumulating session: rounds stay independent
        if news is None:
            continue
        code = len(snames)
        snames.append(sid)
        for k, i in enumerate(idx):
            session[i] = code
            new_in[i] = news[k]
            prev[i] = idx[k - 1] if k else -1
            # a session round's prompt is its CSV structure (prefix + everything after it)
            prompt[i] = shared[i] + inp[i]
    prompt = np.maximum(prompt, 1)

    order = np.lexsort((np.arange(n), arrival))
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.arange(n)
    prev_sorted = np.where(prev[order] >= 0, inv[np.maximum(prev[order], 0)], -1)
    window = np.ones(n, dtype=bool) if in_window is None else np.asarray(in_window, bool)
    keys = [str(r.request_id) for r in rows]
    return RequestTable(
        request_id=rid[order], arrival_us=arrival[order], prompt_len=prompt[order],
        output_len=out[order], next_round=np.full(n, -1, dtype=np.int64), think_us=np.zeros(n),
        group=gcode[order], shared_prefix=shared[order], session=session[order],
        prev_round=prev_sorted, new_input=new_in[order], in_window=window[order],
        keys=[keys[i] for i in order], group_names=gnames, session_names=snames,
        source=[rows[i] for i in order], observed=header.mode == "real")


def trace_window(header: Any, records: Sequence[Any]) -> np.ndarray:
    """Which replayable rows were inside the server's counter window.

    A row is inside unless its phase is recorded (``pytest_blis.phases``) as outside the window
    (``measured: false``), or — without phase records — it is marked ``warmup`` (our observe
    scrapes after the warm-up requests have drained).
    """
    rows = [r for r in records if r.status != "error"]
    phases = {}
    ext = header.pytest_blis
    if ext is not None:
        phases = {p.name: p.measured for p in ext.phases}
    out = np.ones(len(rows), dtype=bool)
    for i, r in enumerate(rows):
        if r.phase in phases:
            out[i] = phases[r.phase]
        elif r.warmup:
            out[i] = False
    return out


def table_from_plan(requests: Sequence[Any], followups: dict[int, int], seed: int,
                    first_id: int = 0) -> RequestTable:
    """A :class:`RequestTable` from planned requests of one phase (sorted open-loop first).

    ``followups[i] = j``: request j is released when i finishes (after j's think time).
    """
    n = len(requests)
    rid = np.arange(first_id, first_id + n, dtype=np.int64)
    arrival = np.fromiter((r.arrival_us for r in requests), dtype=np.float64, count=n)
    prompt = np.fromiter((max(r.input_tokens, 1) for r in requests), dtype=np.int64, count=n)
    out = np.fromiter((r.output_tokens for r in requests), dtype=np.int64, count=n)
    groups = [r.prefix_group if r.prefix_length > 0 and r.input_tokens >= r.prefix_length else ""
              for r in requests]
    gcode, gnames = _codes(groups)
    shared = np.where(gcode >= 0, [r.prefix_length for r in requests], 0).astype(np.int64)
    next_round = np.full(n, -1, dtype=np.int64)
    think = np.zeros(n)
    for i, j in followups.items():
        next_round[i] = j
        think[j] = float(requests[j].think_time_us)
    session = np.full(n, -1, dtype=np.int32)
    prev = np.full(n, -1, dtype=np.int64)
    new_in = np.fromiter((r.new_input_tokens for r in requests), dtype=np.int64, count=n)
    snames: list[str] = []
    scode: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, r in enumerate(requests):
        if r.session_id and r.accumulate:
            c = scode.get(r.session_id)
            if c is None:
                c = scode[r.session_id] = len(snames)
                snames.append(r.session_id)
            session[i] = c
            prev[i] = last.get(r.session_id, -1)
            last[r.session_id] = i
    return RequestTable(
        request_id=rid, arrival_us=arrival, prompt_len=prompt, output_len=out,
        next_round=next_round, think_us=think, group=gcode, shared_prefix=shared, session=session,
        prev_round=prev, new_input=new_in, in_window=np.ones(n, dtype=bool),
        keys=[r.uid for r in requests], group_names=gnames, session_names=snames,
        source=list(requests))
