"""The TraceV2 data CSV as columns: what the replay reads, without one object per row.

API::

    trace = load_trace_columns("t.yaml", "t.csv")   # -> ColumnarTrace(header, data: TraceColumns)
    data = read_trace_columns("t.csv")              # -> TraceColumns
    data.n; data.column("input_tokens")             # int64 / bool / float64 array, or list[str]
    data.strings("prefix_group")                    # StrColumn(codes int32, names) ("" is a name too)
    data.record(i); data.records()                  # TraceRecord objects, made on demand
    TraceColumns.from_records(records)              # the other way (a Trace read as records)

A column with one value in the whole file (most of them: zeros, empty strings, ``ok``) is held as
that value alone; integer columns are int64 arrays, booleans bool, ``reason_ratio`` float64, and
string columns codes into their distinct values. A 1M-row trace is ~60 MB of arrays instead of
~1.1 GB of records.

Reading is :func:`~blis_sim.formats.trace_data.read_trace_data`'s: the same fast path (a chunk of
rows and a column at a time) and the same row path for any chunk it declines, with every check and
located error of the record reader; a file the fast path cannot split (quotes, CRs, NULs) is read
as records by the csv module and turned into columns. The records made from columns are the ones
``read_trace_data`` returns (tests compare both).
"""
from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from blis_sim.formats._io import gc_paused
from blis_sim.formats.trace_data import (_BOOLS, _INTS, _ROW_DEFAULTS, _ChunkParser, _column_positions,
                                         _fast_record, _plain_text, _read_rows, _row_parser, checked_values)

FIELDS: tuple[str, ...] = tuple(_ROW_DEFAULTS)  # every TraceRecord field, in declaration order
# text of a file read at once is parsed this many characters at a time (whole lines)
_BLOCK_CHARS = 1 << 19


class StrColumn(NamedTuple):
    """A string column: ``names[codes[i]]`` is row i's value."""

    codes: np.ndarray  # int32
    names: list[str]

    def tolist(self) -> list[str]:
        names = self.names
        return [names[c] for c in self.codes.tolist()]


def _kind(name: str) -> Any:
    if name in _INTS:
        return np.int64
    if name in _BOOLS:
        return np.bool_
    if name == "reason_ratio":
        return np.float64
    return str


class TraceColumns:
    """The rows of a trace data CSV, column by column (see the module docstring)."""

    __slots__ = ("n", "data")

    def __init__(self, n: int, data: dict[str, Any]) -> None:
        self.n = n
        self.data = data  # field -> scalar (every row's value), ndarray or StrColumn

    def __len__(self) -> int:
        return self.n

    def constant(self, name: str) -> tuple[bool, Any]:
        """``(True, value)`` when every row holds ``value``; ``(False, None)`` otherwise."""
        col = self.data[name]
        if isinstance(col, (np.ndarray, StrColumn)):
            return False, None
        return True, col

    def array(self, name: str) -> np.ndarray:
        """A numeric or boolean column as an array (a constant one broadcast)."""
        col = self.data[name]
        if isinstance(col, np.ndarray):
            return col
        if isinstance(col, StrColumn):
            raise TypeError(f"{name} is a string column")
        return np.full(self.n, col, dtype=_kind(name))

    def strings(self, name: str) -> StrColumn:
        col = self.data[name]
        if isinstance(col, StrColumn):
            return col
        if not isinstance(col, str):
            raise TypeError(f"{name} is not a string column")
        return StrColumn(np.zeros(self.n, dtype=np.int32), [col])

    def column(self, name: str) -> Any:
        """Every row's value: an array for numbers and booleans, ``list[str]`` for strings."""
        return self.strings(name).tolist() if _kind(name) is str else self.array(name)

    def take(self, idx: np.ndarray) -> TraceColumns:
        data = {}
        for name, col in self.data.items():
            if isinstance(col, np.ndarray):
                col = col[idx]
            elif isinstance(col, StrColumn):
                col = StrColumn(col.codes[idx], col.names)
            data[name] = col
        return TraceColumns(int(len(idx)), data)

    def record(self, i: int) -> Any:
        """Row ``i`` as the :class:`TraceRecord` the record reader gives."""
        values = {}
        for name in FIELDS:
            col = self.data[name]
            if isinstance(col, np.ndarray):
                col = col[i].item()
            elif isinstance(col, StrColumn):
                col = col.names[col.codes[i]]
            values[name] = col
        return _fast_record(values)

    def records(self) -> list[Any]:
        per_field = []
        for name in FIELDS:
            col = self.data[name]
            if isinstance(col, np.ndarray):
                per_field.append(col.tolist())
            elif isinstance(col, StrColumn):
                per_field.append(col.tolist())
            else:
                per_field.append([col] * self.n)
        return [_fast_record(dict(zip(FIELDS, row))) for row in zip(*per_field)]

    @classmethod
    def from_records(cls, records: Sequence[Any]) -> TraceColumns:
        acc = _Accumulator()
        if records:
            acc.add_rows([r.__dict__ for r in records])
        return acc.finish()


class _Accumulator:
    """Chunks of rows (a template of constant values plus varying columns) joined into columns."""

    def __init__(self) -> None:
        self.n = 0
        self.parts: dict[str, list[tuple[int, Any, bool]]] = {name: [] for name in FIELDS}

    def add(self, n: int, template: dict[str, Any], names: list[str], columns: list[Any]) -> None:
        varying = dict(zip(names, columns))
        for name in FIELDS:
            if name in varying:
                self.parts[name].append((n, varying[name], False))
            else:
                self.parts[name].append((n, template[name], True))
        self.n += n

    def add_rows(self, rows: list[dict[str, Any]]) -> None:
        """Rows as field dicts (the row parser's, or records')."""
        self.add(len(rows), {}, list(FIELDS), [[r[name] for r in rows] for name in FIELDS])

    def finish(self) -> TraceColumns:
        data: dict[str, Any] = {}
        for name in FIELDS:
            parts = self.parts[name]
            consts = {(type(v), v) for _, v, const in parts if const}
            if all(const for _, _, const in parts) and len(consts) <= 1:
                data[name] = parts[0][1] if parts else _ROW_DEFAULTS[name]
                continue
            kind = _kind(name)
            if kind is str:
                data[name] = _strings(parts)
            else:
                data[name] = np.concatenate([np.full(n, v, dtype=kind) if const else np.asarray(v, dtype=kind)
                                             for n, v, const in parts])
        return TraceColumns(self.n, data)


def _strings(parts: list[tuple[int, Any, bool]]) -> StrColumn:
    index: dict[str, int] = {}
    codes = []
    for n, v, const in parts:
        if const:
            codes.append(np.full(n, index.setdefault(v, len(index)), dtype=np.int32))
        else:
            for name in dict.fromkeys(v):  # the new names in order of first appearance
                index.setdefault(name, len(index))
            codes.append(np.fromiter(map(index.__getitem__, v), dtype=np.int32, count=n))  # no frame per row
    return StrColumn(np.concatenate(codes) if codes else np.zeros(0, np.int32), list(index))


def read_trace_columns(path: str | Path) -> TraceColumns:
    """Read a TraceV2 data CSV as columns (same rules, checks and errors as ``read_trace_data``)."""
    p = Path(path)
    with gc_paused():
        text = _plain_text(p)
        cols = None if text is None else _columns_of_text(text, p)
        if cols is None:
            return TraceColumns.from_records(_read_rows(p))
        return cols


def _blocks(text: str) -> Iterator[tuple[int, list[str]]]:
    """(1-based number of the first line, lines) per block of whole lines."""
    start, line = 0, 1
    while start < len(text):
        end = text.rfind("\n", start, start + _BLOCK_CHARS) + 1
        if end <= start:  # no line end within a block: the rest in one piece
            end = text.find("\n", start) + 1 or len(text)
        lines = text[start:end].split("\n")
        if end < len(text) or text.endswith("\n"):
            lines.pop()  # the "" after the block's last "\n"
        yield line, lines
        line += len(lines)
        start = end


def _columns_of_text(text: str, p: Path) -> TraceColumns | None:
    """The columns of a file's text that ``_plain_text`` accepted; None: let the csv module read it
    (no header row, or a line over its field limit: its errors)."""
    file = str(p)
    limit = csv.field_size_limit()
    acc = _Accumulator()
    fast = slow = None
    min_cols = 0
    for first, lines in _blocks(text):
        if max(map(len, lines), default=0) > limit:
            return None
        numbers: Sequence[int] = range(first, first + len(lines))
        if fast is None:
            h = next((k for k, line in enumerate(lines) if line), None)
            if h is None:
                continue
            pos = _column_positions(lines[h].split(","))
            min_cols = len(pos)
            fast = _ChunkParser(pos, min_cols)
            lines, numbers = lines[h + 1:], numbers[h + 1:]
        if "" in lines:  # blank lines are skipped, as Go's csv.Reader does
            keep = [k for k, line in enumerate(lines) if line]
            lines, numbers = [lines[k] for k in keep], [numbers[k] for k in keep]
        for k in range(0, len(lines), 4096):
            chunk = lines[k:k + 4096]
            parsed = fast.parse_columns(chunk, arrays=True)
            if parsed is None:  # something unusual or wrong in this chunk: row by row, located errors
                if slow is None:  # generated and compiled (~1 ms) only for a file that needs it
                    slow = _row_parser(pos, min_cols, file, fast.shared)
                acc.add_rows([checked_values(slow, line.split(","), num, min_cols, file)
                              for num, line in zip(numbers[k:k + 4096], chunk)])
            else:
                acc.add(len(chunk), *parsed)
    if fast is None:
        return None
    return acc.finish()


@dataclass
class ColumnarTrace:
    """A trace read as columns: ``header`` (TraceHeader) and ``data`` (:class:`TraceColumns`).
    ``records`` makes the TraceRecord list on first use, so code that takes a
    :class:`~blis_sim.formats.Trace` (``.header``, ``.records``) takes this too."""

    header: Any
    data: TraceColumns
    _records: list[Any] | None = None

    @property
    def records(self) -> list[Any]:
        if self._records is None:
            self._records = self.data.records()
        return self._records


def load_trace_columns(header_path: str | Path, data_path: str | Path) -> ColumnarTrace:
    """Both files of a trace, the data as columns."""
    from blis_sim.formats.trace_header import read_trace_header

    return ColumnarTrace(header=read_trace_header(header_path), data=read_trace_columns(data_path))
