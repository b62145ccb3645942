"""The two sides calibrate compares, as columns: the trace's request table and the replay's results.

API::

    real = real_table(trace)            # TraceColumns of a ColumnarTrace (``.data``) or of a Trace's records
    sim = SimTable.of(columns)          # SimResult Columns / ColumnChunks (the replay's, or read from a file)
    sim.n; sim.request_id; sim.ttft_us; sim.e2e_us; sim.input_tokens; sim.output_tokens; sim.itl_mean_us
    sim.cached_tokens                   # int64, -1 where the result carries none
    sim.slo_class / sim.model / sim.instance_id     StrColumn (codes into names)
    sim.take(rows)                      # the results at those rows

One array per field, no object per request: calibrate's per-request work (pairing, goodput,
capacity, hit agreement, per replica) is array arithmetic on these (docs/design.md, data flow).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from blis_sim.formats.results import ColumnChunks, Columns, IntMapColumn, SimResult
from blis_sim.formats.trace_columns import ColumnarTrace, StrColumn, TraceColumns

if TYPE_CHECKING:
    from blis_sim.formats import Trace


def real_table(trace: Trace | ColumnarTrace) -> TraceColumns:
    """The trace's rows as columns: a ColumnarTrace's own, else its records' (a Trace built in code)."""
    data = getattr(trace, "data", None)
    if isinstance(data, TraceColumns):
        return data
    return TraceColumns.from_records(trace.records)


def strings(col: Any, n: int) -> StrColumn:
    """A string column (one value for every row, or one per row) as codes into its distinct values."""
    if isinstance(col, StrColumn):
        return col
    if col is None or isinstance(col, str):
        return StrColumn(np.zeros(n, dtype=np.int32), [col or ""])
    index: dict[str, int] = {}
    for name in dict.fromkeys(v or "" for v in col):
        index.setdefault(name, len(index))
    codes = np.fromiter((index[v or ""] for v in col), dtype=np.int32, count=n)
    return StrColumn(codes, list(index))


def _numbers(col: Any, n: int, dtype: Any, missing: Any = 0) -> np.ndarray:
    if isinstance(col, np.ndarray):
        return col.astype(dtype, copy=False)
    if isinstance(col, (list, tuple)):
        return np.asarray([missing if v is None else v for v in col], dtype=dtype)
    return np.full(n, missing if col is None else col, dtype=dtype)


@dataclass(frozen=True)
class SimTable:
    """The replay's per-request results that calibrate reads, one array per field."""

    n: int
    request_id: np.ndarray      # int64
    ttft_us: np.ndarray         # float64
    e2e_us: np.ndarray          # float64
    input_tokens: np.ndarray    # int64
    output_tokens: np.ndarray   # int64
    itl_mean_us: np.ndarray     # float64
    cached_tokens: np.ndarray   # int64, -1: not carried (SimResult's None)
    slo_class: StrColumn
    model: StrColumn
    instance_id: StrColumn

    @classmethod
    def of(cls, results: Columns | ColumnChunks) -> SimTable:
        """SimResult columns (a :class:`ColumnChunks` is joined chunk by chunk)."""
        if results.cls is not SimResult:
            raise TypeError(f"calibrate takes SimResult columns, not {results.cls.__name__}")
        parts = list(results.chunks()) if isinstance(results, ColumnChunks) else [results]
        tables = [cls._one(c) for c in parts]
        if len(tables) == 1:
            return tables[0]
        return cls.concat(tables)

    @classmethod
    def _one(cls, c: Columns) -> SimTable:
        n = c.n
        cached = c.column("cached_tokens")
        if isinstance(cached, IntMapColumn):  # not a SimResult layout; kept out of the arithmetic
            raise TypeError("cached_tokens must be a count per row")
        return cls(n=n, request_id=_numbers(c.column("request_id"), n, np.int64),
                   ttft_us=_numbers(c.column("ttft_us"), n, np.float64),
                   e2e_us=_numbers(c.column("e2e_us"), n, np.float64),
                   input_tokens=_numbers(c.column("input_tokens"), n, np.int64),
                   output_tokens=_numbers(c.column("output_tokens"), n, np.int64),
                   itl_mean_us=_numbers(c.column("itl_mean_us"), n, np.float64),
                   cached_tokens=_numbers(cached, n, np.int64, missing=-1),
                   slo_class=strings(c.column("slo_class"), n), model=strings(c.column("model"), n),
                   instance_id=strings(c.column("instance_id"), n))

    @classmethod
    def concat(cls, tables: list[SimTable]) -> SimTable:
        values: dict[str, Any] = {"n": sum(t.n for t in tables)}
        for f in fields(cls):
            if f.name == "n":
                continue
            cols = [getattr(t, f.name) for t in tables]
            if isinstance(cols[0], StrColumn):
                values[f.name] = _concat_strings(cols)
            else:
                values[f.name] = np.concatenate(cols) if cols else np.zeros(0)
        return cls(**values)

    def take(self, rows: np.ndarray) -> SimTable:
        values: dict[str, Any] = {"n": int(rows.size)}
        for f in fields(self):
            if f.name == "n":
                continue
            col = getattr(self, f.name)
            values[f.name] = StrColumn(col.codes[rows], col.names) if isinstance(col, StrColumn) else col[rows]
        return SimTable(**values)


def _concat_strings(cols: list[StrColumn]) -> StrColumn:
    index: dict[str, int] = {}
    codes = []
    for c in cols:
        remap = np.asarray([index.setdefault(name, len(index)) for name in c.names], dtype=np.int32)
        codes.append(remap[c.codes] if c.codes.size else c.codes)
    return StrColumn(np.concatenate(codes), list(index))


def values_at(col: StrColumn, rows: np.ndarray) -> list[str]:
    """The strings of ``col`` at ``rows``."""
    names = col.names
    return [names[c] for c in col.codes[rows].tolist()]
