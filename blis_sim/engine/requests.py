"""Requests as numpy columns: what the step loop, the KV content and the outputs need.

:func:`table_from_trace` builds a :class:`RequestTable` from a TraceV2 (docs/reference-formats.md §4.2, with
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
from typing import TYPE_CHECKING, Any

import numpy as np

from blis_sim.engine.content import ContentPlan
from blis_sim.errors import ConfigError
from blis_sim.formats.trace_columns import TraceColumns
from blis_sim.workload.tokens import new_input_lengths

if TYPE_CHECKING:
    from blis_sim.formats import TraceHeader, TraceRecord


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
    shared_prefix: np.ndarray       # int32 (a trace's) or int64
    session: np.ndarray             # int32 index into session_names (-1: not accumulating)
    prev_round: np.ndarray          # int64 (-1)
    new_input: np.ndarray           # int64
    in_window: np.ndarray           # bool: inside the comparison (counter) window
    keys: Sequence[str]             # a name unique to each row (IdKeys for a trace)
    group_names: list[str]
    session_names: list[str]
    source: Sequence[Any] = field(default_factory=list)  # TraceRows, or the PlannedRequest of each row
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

        return RequestTable(
            request_id=self.request_id[idx], arrival_us=self.arrival_us[idx].copy(),
            prompt_len=self.prompt_len[idx], output_len=self.output_len[idx],
            next_round=remap(self.next_round), think_us=self.think_us[idx], group=self.group[idx],
            shared_prefix=self.shared_prefix[idx], session=self.session[idx],
            prev_round=remap(self.prev_round), new_input=self.new_input[idx],
            in_window=self.in_window[idx], keys=take_rows(self.keys, idx),
            group_names=self.group_names, session_names=self.session_names,
            source=take_rows(self.source, idx) if len(self.source) else [], observed=self.observed)

    def phases(self) -> list[np.ndarray]:
        """Row indices per recorded phase (the ``phase`` column), in order of first arrival."""
        if isinstance(self.source, TraceRows):
            const, names = self.source.column("phase")
            if const:
                return [np.arange(len(self))]
        else:
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


class TraceRows(Sequence[Any]):
    """The trace rows of a table (``RequestTable.source``), held as columns and row indices:
    ``rows[k]`` is a TraceRecord made on demand, :meth:`column` a column in table order."""

    def __init__(self, data: Any, idx: np.ndarray) -> None:
        self.data = data          # blis_sim.formats.trace_columns.TraceColumns
        self.idx = idx            # int64 row numbers in the trace

    def __len__(self) -> int:
        return int(self.idx.shape[0])

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return TraceRows(self.data, self.idx[k])
        return self.data.record(int(self.idx[k]))

    def __iter__(self) -> Any:
        return iter(self.data.take(self.idx).records())  # a column at a time, not a row

    def take(self, idx: np.ndarray) -> TraceRows:
        return TraceRows(self.data, self.idx[idx])

    def column(self, name: str) -> Any:
        """``(True, value)`` when every row holds ``value``, else ``(False, values in table order)``
        (an array, or ``list[str]``)."""
        const, value = self.data.constant(name)
        if const:
            return True, value
        col = self.data.data[name]
        if isinstance(col, np.ndarray):
            return False, col[self.idx]
        names = col.names
        return False, [names[c] for c in col.codes[self.idx].tolist()]


class IdKeys(Sequence[str]):
    """``str(request_id)`` per row, made on demand (the content plan reads the first only)."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [str(v) for v in self.ids[k].tolist()]
        return str(int(self.ids[k]))

    def take(self, idx: np.ndarray) -> IdKeys:
        return IdKeys(self.ids[idx])


def take_rows(seq: Sequence[Any], idx: np.ndarray) -> Sequence[Any]:
    """``[seq[i] for i in idx]``, kept lazy for :class:`TraceRows` / :class:`IdKeys`."""
    if isinstance(seq, (TraceRows, IdKeys)):
        return seq.take(idx)
    return [seq[i] for i in idx.tolist()]


def concat_rows(parts: Sequence[Sequence[Any]]) -> Sequence[Any]:
    """The parts one after the other, kept lazy when they are all rows of one trace (or ids)."""
    rows = [p for p in parts if isinstance(p, TraceRows)]
    if parts and len(rows) == len(parts) and all(p.data is rows[0].data for p in rows):
        return TraceRows(rows[0].data, np.concatenate([p.idx for p in rows]))
    ids = [p for p in parts if isinstance(p, IdKeys)]
    if parts and len(ids) == len(parts):
        return IdKeys(np.concatenate([p.ids for p in ids]))
    return [x for p in parts for x in p]


def _replayable(data: TraceColumns) -> np.ndarray:
    """Row numbers of the rows the engine saw (every status but ``error``): int32 when the trace's
    rows fit (the table keeps them for the whole run)."""
    status = data.strings("status")
    bad = [c for c, name in enumerate(status.names) if name == "error"]
    dtype = np.int32 if data.n < 2**31 else np.int64
    if not bad:
        return np.arange(data.n, dtype=dtype)
    return np.flatnonzero(status.codes != bad[0]).astype(dtype)


def _columns_of(records: TraceColumns | Sequence[TraceRecord]) -> TraceColumns:
    """A trace's data as columns (``TraceColumns`` as is; a record list converted)."""
    return records if isinstance(records, TraceColumns) else TraceColumns.from_records(records)


def table_from_trace(header: TraceHeader, records: TraceColumns | Sequence[TraceRecord],
                     in_window: np.ndarray | None = None) -> RequestTable:
    """The replayable rows of a trace (``TraceColumns`` or a record list) as a
    :class:`RequestTable` (see the module docstring)."""
    data = _columns_of(records)
    rows = _replayable(data)
    n = int(rows.shape[0])
    # Every row replayable: the table's columns are the trace's own arrays where they are its
    # values (not a copy of each for the whole run); they are permuted below only when the rows
    # are not in arrival order already (a generated trace's are).
    whole = n == data.n

    def col(name: str) -> np.ndarray:
        a = data.array(name)
        return a if whole else a[rows]

    rid = col("request_id")
    send = col("send_time_us")
    arrival_col = col("arrival_time_us")
    arrival = np.where(send > 0, send, arrival_col).astype(np.float64)
    if header.mode == "real" and n and (send > 0).any():
        origin = float(send[send > 0].min())
        arrival = np.where(send > 0, send - origin, arrival_col).astype(np.float64)
        arrival = np.maximum(arrival, 0.0)
    plen = col("prefix_length")
    inp = col("input_tokens")
    server_in = col("server_input_tokens")
    out = col("output_tokens")
    gcode, gnames = _group_codes(data.strings("prefix_group"), rows, plen)
    shared = np.where(gcode >= 0, plen, 0).astype(np.int64)
    prompt = np.where(server_in > 0, server_in, plen + inp).astype(np.int64)
    prompt = np.maximum(prompt, 1)
    shared = np.minimum(shared, prompt).astype(np.int32)  # <= the prompt, which _check_sizes bounds

    # accumulating sessions: rounds in order; new input per round from the CSV columns
    session = np.full(n, -1, dtype=np.int32)
    prev: np.ndarray = _constant(-1, n)
    new_in = inp  # copied before a session round changes it
    by_session: dict[str, list[int]] = {}
    sessions = data.strings("session_id")
    if any(sessions.names):
        sid_of = sessions.codes[rows].tolist()
        for i, c in enumerate(sid_of):
            if sessions.names[c]:
                by_session.setdefault(sessions.names[c], []).append(i)
    round_of = col("round_index").tolist() if by_session else []
    snames: list[str] = []
    force = header.session_context_growth == "accumulate"
    for sid, idx in by_session.items():
        idx.sort(key=lambda i: round_of[i])
        rounds = [round_of[i] for i in idx]
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
        if not code:
            prev, new_in = np.full(n, -1, dtype=np.int64), inp.copy()
        for k, i in enumerate(idx):
            session[i] = code
            new_in[i] = news[k]
            prev[i] = idx[k - 1] if k else -1
            # a session round's prompt is its CSV structure (prefix + everything after it)
            prompt[i] = shared[i] + inp[i]
    prompt = np.maximum(prompt, 1)
    _check_sizes(prompt, out, rid)

    window = np.ones(n, dtype=bool) if in_window is None else np.asarray(in_window, bool)
    if n and not bool((arrival[1:] >= arrival[:-1]).all()):  # else sorted already: no permutation
        order = np.lexsort((np.arange(n), arrival))
        inv = np.empty(n, dtype=np.int64)
        inv[order] = np.arange(n)
        if snames:
            prev = np.where(prev[order] >= 0, inv[np.maximum(prev[order], 0)], -1)
        rid, arrival, prompt, out = rid[order], arrival[order], prompt[order], out[order]
        gcode, shared, session, new_in = gcode[order], shared[order], session[order], new_in[order]
        window, rows = window[order], rows[order]
    # (no session rounds in a trace: nothing is released by a finish, and no think time)
    return RequestTable(
        request_id=rid, arrival_us=arrival, prompt_len=prompt, output_len=out,
        next_round=_constant(-1, n), think_us=_constant(0.0, n), group=gcode, shared_prefix=shared,
        session=session, prev_round=prev, new_input=new_in, in_window=window,
        keys=IdKeys(rid), group_names=gnames, session_names=snames,
        source=TraceRows(data, rows), observed=header.mode == "real")


def _constant(value: int | float, n: int) -> np.ndarray:
    """A read-only column of ``n`` rows all holding ``value``, in the memory of one."""
    return np.broadcast_to(np.array(value, dtype=np.int64 if isinstance(value, int) else np.float64), (n,))


#: the most tokens (prompt + output) of one request the simulator takes (its token positions are int32)
MAX_REQUEST_TOKENS = 2**31 - 1


def _check_sizes(prompt: np.ndarray, output: np.ndarray, request_id: np.ndarray) -> None:
    """Refuse a trace row whose prompt + output tokens do not fit the step loop."""
    bad = np.flatnonzero(prompt + np.maximum(output, 1) > MAX_REQUEST_TOKENS)
    if bad.size:
        i = int(bad[0])
        raise ConfigError(f"request_id {int(request_id[i])}: a prompt of {int(prompt[i])} tokens and "
                          f"{int(output[i])} output tokens is more than the simulator's "
                          f"{MAX_REQUEST_TOKENS} tokens per request", field="input_tokens")


def _group_codes(groups: Any, rows: np.ndarray, plen: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Each row's prefix group (-1: none, or no shared prefix) numbered in order of first
    appearance, and the names."""
    names = groups.names
    raw = groups.codes[rows]
    raw = np.where(plen > 0, raw, -1)
    if len(names) == 1 and names[0] == "":
        return np.full(rows.shape[0], -1, dtype=np.int32), []
    empty = [c for c, name in enumerate(names) if name == ""]
    if empty:
        raw = np.where(raw == empty[0], -1, raw)
    used, first = np.unique(raw[raw >= 0], return_index=True)
    order = used[np.argsort(first)]  # the first row of each group decides its number
    renum = np.full(len(names) + 1, -1, dtype=np.int32)
    renum[order] = np.arange(order.shape[0], dtype=np.int32)
    return renum[raw], [names[c] for c in order.tolist()]


def trace_window(header: TraceHeader, records: TraceColumns | Sequence[TraceRecord]) -> np.ndarray:
    """Which replayable rows were inside the server's counter window.

    A row is inside unless its phase is recorded (``pytest_blis.phases``) as outside the window
    (``measured: false``), or — without phase records — it is marked ``warmup`` (our observe
    scrapes after the warm-up requests have drained).
    """
    data = _columns_of(records)
    rows = _replayable(data)
    phases = {}
    ext = header.pytest_blis
    if ext is not None:
        phases = {p.name: p.measured for p in ext.phases}
    phase = data.strings("phase")
    # per distinct phase name: its recorded "measured", or None (then the warm-up flag decides)
    measured = [phases.get(name) for name in phase.names]
    warm = data.array("warmup")[rows]
    out = ~warm
    codes = phase.codes[rows]
    for c, m in enumerate(measured):
        if m is not None:
            out[codes == c] = m
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
