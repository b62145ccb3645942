"""The TraceV2 data CSV as columns: what the replay reads, without one object per row.

API::

    trace = load_trace_columns("t.yaml", "t.csv")   # -> ColumnarTrace(header, data: TraceColumns)
    data = read_trace_columns("t.csv")              # -> TraceColumns
    data.n; data.column("input_tokens")             # int64 / bool / float64 array, or list[str]
    data.strings("prefix_group")                    # StrColumn(codes int32, names) ("" is a name too)
    data.record(i); data.records()                  # TraceRecord objects, made on demand
    records = read_trace_data("t.csv")              # -> list[TraceRecord] (file order = completion order)
    TraceColumns.from_records(records)              # the other way (a Trace read as records)

A column with one value in the whole file (most of them: zeros, empty strings, ``ok``) is held as
that value alone; integer columns are int64 arrays, booleans bool, ``reason_ratio`` float64, and
string columns codes into their distinct values. A 1M-row trace is ~60 MB of arrays instead of
~1.1 GB of records.

Reading follows the reference (docs/reference-formats.md §1.4) with :mod:`~blis_sim.formats.trace_data`'s
column layout and cell checks: the csv module splits the rows (quotes, CRLF, blank lines as Go's
reader), and a chunk of rows is converted a column at a time (plain digits by numpy in one call,
anything else cell by cell through the reference's checks); the first bad cell in file order is a
FormatError naming file, line and column. ``read_trace_data`` gives the same rows as records.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from blis_sim.errors import FormatError
from blis_sim.formats import _go
from blis_sim.formats._io import csv_chunks, csv_data_line, gc_paused
from blis_sim.formats.trace_data import (
    _BOOLS,
    _INTS,
    _REPEATED,
    _ROW_DEFAULTS,
    _TRIMMED,
    TraceRecord,
    _column_positions,
    _parse_cell,
)
from blis_sim.formats.trace_header import read_trace_header

if TYPE_CHECKING:
    from blis_sim.formats.trace_header import TraceHeader

FIELDS: tuple[str, ...] = tuple(_ROW_DEFAULTS)  # every TraceRecord field, in declaration order


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
        return TraceColumns(len(idx), data)

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
        return TraceRecord.model_construct(**values)  # checked by the reader

    def records(self) -> list[Any]:
        per_field = []
        for name in FIELDS:
            col = self.data[name]
            if isinstance(col, (np.ndarray, StrColumn)):
                per_field.append(col.tolist())
            else:
                per_field.append([col] * self.n)
        # checked by the reader. Every record sets every field: one set of their names serves all
        # (pydantic keeps the set it is given; the records are frozen, and a copy copies the set),
        # instead of a 37-name set per record, two thirds of a record's memory.
        every = set(FIELDS)
        make = TraceRecord.model_construct
        return [make(every, **dict(zip(FIELDS, row))) for row in zip(*per_field)]

    @classmethod
    def from_columns(cls, n: int, columns: dict[str, Any]) -> TraceColumns:
        """Columns built by our own code (the simulator's re-export): each field an array, a
        ``StrColumn``, a list of values or one value for every row; a field left out takes its
        default. Not checked: the values come from a trace or a plan that was."""
        data: dict[str, Any] = {}
        for name in FIELDS:
            col = columns.get(name, _ROW_DEFAULTS[name])
            kind = _kind(name)
            if isinstance(col, (np.ndarray, list, tuple)) and not isinstance(col, StrColumn):
                col = _strings([(n, list(col), False)]) if kind is str else np.asarray(col, dtype=kind)
            data[name] = col
        return cls(n, data)

    @classmethod
    def from_records(cls, records: Sequence[Any]) -> TraceColumns:
        acc = _Accumulator()
        if records:
            acc.add_rows([r.__dict__ for r in records])
        return acc.finish()


class _Accumulator:
    """Chunks of rows (a template of constant values plus varying columns) joined into columns.

    A field stays one value while every chunk has it so; from the first chunk where it varies it is
    an array written in place, sized once from ``capacity`` (an estimate of the rows) and grown in
    place by a quarter when it runs out, then trimmed in place: a 10M-row trace is read without a
    list of parts to concatenate, whose copy and the heap left behind by its small chunk arrays
    doubled the columns' memory."""

    def __init__(self, capacity: int = 0) -> None:
        self.n = 0
        self.capacity = capacity
        self.const: dict[str, tuple[type, Any]] = {}    # field -> (type, value) while one value
        self.arrays: dict[str, np.ndarray] = {}         # field -> values (string fields: codes)
        self.index: dict[str, dict[str, int]] = {}      # string field -> code of each name

    def _buffer(self, name: str, dtype: Any, rows: int) -> np.ndarray:
        """``name``'s array with room for ``rows`` rows (made, or grown in place)."""
        buf = self.arrays.get(name)
        if buf is None:
            buf = self.arrays[name] = np.empty(max(rows, self.capacity), dtype=dtype)
        elif buf.shape[0] < rows:
            buf.resize(max(rows, buf.shape[0] + buf.shape[0] // 4 + 1024), refcheck=False)
        return buf

    def _code(self, name: str, value: str) -> int:
        return self.index.setdefault(name, {}).setdefault(value, len(self.index[name]))

    def add(self, n: int, template: dict[str, Any], names: list[str], columns: list[Any]) -> None:
        varying = dict(zip(names, columns))
        start, stop = self.n, self.n + n
        for name in FIELDS:
            if name not in varying:
                value = template[name]
                if name not in self.arrays:
                    key = (type(value), value)
                    if self.n == 0 or self.const.get(name) == key:
                        self.const[name] = key
                        continue
            kind = _kind(name)
            if name not in self.arrays:  # varies from here: the rows so far hold its one value
                dtype = np.int32 if kind is str else kind
                buf = self._buffer(name, dtype, stop)
                if start:
                    first = self.const[name][1]
                    buf[:start] = self._code(name, first) if kind is str else first
                self.const.pop(name, None)
            buf = self._buffer(name, np.int32 if kind is str else kind, stop)
            if name not in varying:
                buf[start:stop] = self._code(name, value) if kind is str else value
            elif kind is str:
                v = varying[name]
                index = self.index.setdefault(name, {})
                for s in dict.fromkeys(v):  # the new names in order of first appearance
                    index.setdefault(s, len(index))
                buf[start:stop] = np.fromiter(map(index.__getitem__, v), dtype=np.int32, count=n)
            else:
                buf[start:stop] = np.asarray(varying[name], dtype=kind)
        self.n = stop

    def add_rows(self, rows: list[dict[str, Any]]) -> None:
        """Rows as field dicts (the row parser's, or records')."""
        self.add(len(rows), {}, list(FIELDS), [[r[name] for r in rows] for name in FIELDS])

    def finish(self) -> TraceColumns:
        data: dict[str, Any] = {}
        for name in FIELDS:
            buf = self.arrays.get(name)
            if buf is None:
                data[name] = self.const[name][1] if name in self.const else _ROW_DEFAULTS[name]
                continue
            buf.resize(self.n, refcheck=False)  # in place: the pages past the rows go back
            data[name] = StrColumn(buf, list(self.index[name])) if _kind(name) is str else buf
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


# Rows are read and converted this many at a time: the cells of one chunk are alive at once, never
# those of the whole file.
CHUNK_ROWS = 4096
_BOOL_VALUES = {"true": True, "false": False}


class _CellError(Exception):
    """The first bad cell of one column of a chunk: its row's index in the chunk and the error
    (located by row index only: the line is looked up once, for the error reported)."""

    def __init__(self, row: int, error: FormatError) -> None:
        super().__init__(row)
        self.row, self.error = row, error


def read_trace_data(path: str | Path) -> list[Any]:
    """Read a TraceV2 data CSV as :class:`~blis_sim.formats.trace_data.TraceRecord` objects (file
    order = completion order): :func:`read_trace_columns`'s rows."""
    return read_trace_columns(path).records()


def read_trace_columns(path: str | Path) -> TraceColumns:
    """Read a TraceV2 data CSV as columns, with the reference's positional rules
    (docs/reference-formats.md §1.4): the csv module splits the rows, each column of a chunk is converted at
    once, and the first bad cell in file order is reported, located."""
    p = Path(path)
    file = str(p)
    with gc_paused():
        header, chunks = csv_chunks(p, CHUNK_ROWS)
        pos = _column_positions(header)
        min_cols = len(pos)  # every optional column the header declares counts, trailing ones included
        order = sorted(pos, key=lambda c: pos[c])
        shared: dict[str, str] = {}
        acc = _Accumulator()
        for rows in chunks:
            if not acc.n:  # the rows the file holds, estimated from its first chunk's
                acc.capacity = _rows_estimate(p, rows)
            try:
                acc.add(len(rows), *_chunk_columns(rows, pos, order, min_cols, file, shared))
            except _CellError as exc:
                e = exc.error
                raise FormatError(e.reason, file=file, line=csv_data_line(p, acc.n + exc.row),
                                  field=e.location.field) from None
        return acc.finish()


def _rows_estimate(path: Path, rows: list[list[str]]) -> int:
    """Rows in the file at the first chunk's bytes per row (a little over: growing costs more)."""
    sample = sum(map(len, map(",".join, rows))) + len(rows)
    return int(path.stat().st_size / max(sample / len(rows), 1.0) * 1.02) + len(rows)


def _chunk_columns(rows: list[list[str]], pos: dict[str, int], order: list[str], min_cols: int,
                   file: str, shared: dict[str, str]) -> tuple[dict[str, Any], list[str], list[Any]]:
    """A chunk's rows as ``(template, names, columns)``: the value of every field that is the same in
    every row (defaults included), then the varying columns (integer ones as int64 arrays)."""
    widths = set(map(len, rows))
    if min(widths) < min_cols:
        short = next(k for k, row in enumerate(rows) if len(row) < min_cols)
        if short:  # the rows before it are checked first: an earlier error comes first
            _chunk_columns(rows[:short], pos, order, min_cols, file, shared)
        raise _CellError(short, FormatError(f"CSV row has {len(rows[short])} columns, expected at least {min_cols}",
                                            file=file))
    n = len(rows)
    by_column = list(zip(*rows)) if len(widths) == 1 else None
    template = dict(_ROW_DEFAULTS)  # a column after unknown extras, absent from these rows: its default
    names: list[str] = []
    columns: list[Any] = []
    first: tuple[int, int, _CellError] | None = None  # (row, column position, error): the earliest
    for col in order:
        i = pos[col]
        if by_column is not None:
            if i >= len(by_column):
                continue
            cells: Sequence[str | None] = by_column[i]
        else:
            cells = [row[i] if i < len(row) else None for row in rows]
        try:
            one = cells[0]
            if cells[-1] == one and cells[n // 2] == one and cells.count(one) == n:
                if one is not None:
                    value = _convert(col, cells[:1], file, shared)[0]
                    template[col] = value.item() if isinstance(value, np.generic) else value
            else:
                values = _convert(col, cells, file, shared)
                names.append(col)
                columns.append(values)
        except _CellError as exc:
            if first is None or (exc.row, i) < first[:2]:
                first = (exc.row, i, exc)
    if first is not None:
        if first[0]:  # the rows before its row are checked first: a deadline there comes first
            _chunk_columns(rows[:first[0]], pos, order, min_cols, file, shared)
        raise first[2]
    bad = _deadline_before_arrival(template, names, columns, n)
    if bad is not None:
        k, d, a = bad
        raise _CellError(k, FormatError(f"parsing deadline_us: value {d} precedes arrival_time_us {a} "
                                        "(corrupt trace?)", file=file, field="deadline_us"))
    return template, names, columns


def _convert(col: str, cells: Sequence[str | None], file: str, shared: dict[str, str]) -> Any:
    """One column's cells as values (None: the row lacks the column, its default); raises
    :class:`_CellError` at the first cell the reference rejects."""
    if None in cells:
        present = [k for k, c in enumerate(cells) if c is not None]
        values = [_ROW_DEFAULTS[col]] * len(cells)
        try:
            given = _convert(col, [cells[k] for k in present], file, shared)
        except _CellError as exc:
            raise _CellError(present[exc.row], exc.error) from None
        for k, v in zip(present, list(given)):
            values[k] = v
        return np.asarray(values, dtype=np.int64) if col in _INTS else values
    return _convert_present(col, cast("Sequence[str]", cells), file, shared)


def _convert_present(col: str, cells: Sequence[str], file: str, shared: dict[str, str]) -> Any:
    """:func:`_convert` of cells every row has."""
    if col == "think_time_us":  # trimmed, and empty means 0 (the reference's "not recorded")
        cells = [c.strip(_go.GO_SPACE) for c in cells]
        plain = _plain_ints(cells)
        return plain if plain is not None else _cellwise(col, cells, file, empty_is=0)
    if col in _TRIMMED:
        return [c.strip(_go.GO_SPACE) for c in cells]
    if col in _INTS:
        plain = _plain_ints(cells)
        return plain if plain is not None else np.asarray(_cellwise(col, cells, file), dtype=np.int64)
    if col in _BOOLS:
        if set(cells) <= _BOOL_VALUES.keys():
            return list(map(_BOOL_VALUES.__getitem__, cells))
        return _cellwise(col, cells, file)
    if col == "reason_ratio":
        return [0.0] * len(cells) if set(cells) == {"0"} else _cellwise(col, cells, file)
    if col in _REPEATED:  # one string object per distinct value: a few hundred bytes less per row
        return list(map(shared.setdefault, cells, cells))
    return list(cells)


def _cellwise(col: str, cells: Sequence[str], file: str, empty_is: Any = None) -> list[Any]:
    """Each cell through the reference's checks (signs, Go's bool forms, ratios, ranges)."""
    out = []
    for k, c in enumerate(cells):
        if empty_is is not None and not c:
            out.append(empty_is)
            continue
        try:
            out.append(_parse_cell(col, c, file, 0))
        except FormatError as exc:
            raise _CellError(k, exc) from None
    return out


def _plain_ints(cells: Sequence[str]) -> np.ndarray | None:
    """The cells as an int64 array when every one is plain ASCII digits below 10**18 (what the
    reference reads the same way), parsed by numpy in one call; None otherwise (signs, spaces, empty
    cells, huge values: the cell checks decide)."""
    joined = ",".join(cells).encode("utf-8")
    if not joined or joined.translate(None, b"0123456789,") or b",," in joined or joined[:1] == b"," \
            or joined[-1:] == b",":
        return None
    values = np.fromstring(joined, dtype=np.int64, sep=",")  # saturates at 2**63 - 1: checked below
    if values.size != len(cells) or values.max() >= 10**18:
        return None
    return values


def _deadline_before_arrival(template: dict[str, Any], names: list[str], columns: list[Any],
                             n: int) -> tuple[int, int, int] | None:
    """(row, deadline, arrival) of the first row whose deadline precedes its arrival, or None."""
    if "deadline_us" not in names and not template["deadline_us"]:
        return None
    d, a = (np.asarray(columns[names.index(c)] if c in names else np.full(n, template[c]), dtype=np.int64)
            for c in ("deadline_us", "arrival_time_us"))
    bad = np.flatnonzero((d > 0) & (a > 0) & (d < a))
    return None if bad.size == 0 else (int(bad[0]), int(d[bad[0]]), int(a[bad[0]]))


@dataclass
class ColumnarTrace:
    """A trace read as columns: ``header`` (TraceHeader) and ``data`` (:class:`TraceColumns`).
    ``records`` makes the TraceRecord list on first use, so code that takes a
    :class:`~blis_sim.formats.Trace` (``.header``, ``.records``) takes this too."""

    header: TraceHeader
    data: TraceColumns
    _records: list[Any] | None = None

    @property
    def records(self) -> list[Any]:
        if self._records is None:
            self._records = self.data.records()
        return self._records


def load_trace_columns(header_path: str | Path, data_path: str | Path) -> ColumnarTrace:
    """Both files of a trace, the data as columns."""
    return ColumnarTrace(header=read_trace_header(header_path), data=read_trace_columns(data_path))
