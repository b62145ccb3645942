"""The TraceV2 data CSV (docs/reference-formats.md §1.4): one :class:`TraceRecord` per request.

API::

    records = read_trace_data("t.csv")                      # -> list[TraceRecord] (file order = completion order)
    write_trace_data(records, "o.csv", mode="real")         # mode decides the conditional vllm_priority column
    data_text(records, mode=...) -> str; columns_for(records, mode) -> the header row that would be written

:class:`TraceRecord` — the 27 base columns, the optional ``vllm_priority`` and ``slo_target_us`` (inserted
positionally), the reference's trailing ``x_request_id``, ``adapter``, ``think_time_us``, and OUR trailing
columns ``phase``, ``warmup``, ``cached_tokens`` (-1 = not reported), ``first_byte_time_us``,
``first_content_time_us`` (0 = unknown). Properties ``ttft_us`` / ``e2e_us`` = first / last chunk time − send
time (client side, include the network).

Reading follows the reference: positional base columns shifted by the inline optional columns found in the
header row, trailing columns by header name, extra columns tolerated, Go ``ParseInt``/``ParseBool`` forms, the
reference's range checks and messages, each a FormatError naming file, line and column. Speed: a file without
quotes, CRs or NULs is split by hand and parsed a chunk of rows and a column at a time (``_ChunkParser``); any
chunk it declines, and any other file, goes through the csv module row by row (``_read_rows``), which is also
what reports every error (docs/formats.md, "Speed and memory"). Writing follows Go's
``encoding/csv`` (minimal quoting, ``\\n`` line ends); an optional column is written only when some record
carries it.
"""

# No ``from __future__ import annotations``: pydantic would compile each field's annotation string
# (why: blis_sim/formats/_model.py). A method's annotation naming its own class is quoted.
import csv
import math
from collections import deque
from collections.abc import Sequence
from itertools import repeat
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from blis_sim.errors import FormatError
from blis_sim.formats import _go
from blis_sim.formats._io import atomic_write, csv_with_header, gc_paused, go_quote
from blis_sim.formats._model import StrictModel


_TRIMMED = ("error_message", "finish_reason", "x_request_id", "adapter")


class TraceRecord(StrictModel):
    """One request of the trace: a data CSV row (times are integer µs)."""

    request_id: int
    client_id: str = ""
    tenant_id: str = ""
    slo_class: str = ""
    vllm_priority: int = Field(default=0, ge=0)
    session_id: str = ""
    round_index: int = 0
    prefix_group: str = ""
    prefix_length: int = Field(default=0, ge=0)
    streaming: bool = False
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    text_tokens: int = Field(default=0, ge=0)
    image_tokens: int = Field(default=0, ge=0)
    audio_tokens: int = Field(default=0, ge=0)
    video_tokens: int = Field(default=0, ge=0)
    reason_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    model: str = ""
    deadline_us: int = Field(default=0, ge=0)
    slo_target_us: int = Field(default=0, ge=0)
    server_input_tokens: int = Field(default=0, ge=0)
    arrival_time_us: int = 0
    send_time_us: int = 0
    first_chunk_time_us: int = 0
    last_chunk_time_us: int = 0
    num_chunks: int = Field(default=0, ge=0)
    status: str = "ok"
    error_message: str = ""
    finish_reason: str = ""
    # the reference's trailing optional columns
    x_request_id: str = ""
    adapter: str = ""
    think_time_us: int = Field(default=0, ge=0)
    # OUR trailing columns (docs/formats.md)
    phase: str = ""
    warmup: bool = False
    cached_tokens: int = Field(default=-1, ge=-1)
    first_byte_time_us: int = 0
    first_content_time_us: int = 0

    @field_validator(*_TRIMMED)
    @classmethod
    def _trimmed(cls, v: str) -> str:
        # The reference trims these on read (strings.TrimSpace): storing them trimmed keeps a round trip exact.
        return _go.trim_space(v)

    @model_validator(mode="after")
    def _deadline_after_arrival(self) -> "TraceRecord":
        if self.deadline_us > 0 and self.arrival_time_us > 0 and self.deadline_us < self.arrival_time_us:
            raise ValueError(f"deadline_us {self.deadline_us} precedes arrival_time_us {self.arrival_time_us}")
        return self

    @property
    def ttft_us(self) -> int:
        """Client-side TTFT: first chunk − send (µs)."""
        return self.first_chunk_time_us - self.send_time_us

    @property
    def e2e_us(self) -> int:
        """Client-side E2E: last chunk − send (µs)."""
        return self.last_chunk_time_us - self.send_time_us


# Base columns in positional order; the inline optional columns are inserted after their anchor.
BASE_COLUMNS: tuple[str, ...] = (
    "request_id", "client_id", "tenant_id", "slo_class", "session_id", "round_index", "prefix_group",
    "prefix_length", "streaming", "input_tokens", "output_tokens", "text_tokens", "image_tokens",
    "audio_tokens", "video_tokens", "reason_ratio", "model", "deadline_us", "server_input_tokens",
    "arrival_time_us", "send_time_us", "first_chunk_time_us", "last_chunk_time_us", "num_chunks", "status",
    "error_message", "finish_reason",
)
REFERENCE_TRAILING: tuple[str, ...] = ("x_request_id", "adapter", "think_time_us")
OUR_TRAILING: tuple[str, ...] = ("phase", "warmup", "cached_tokens", "first_byte_time_us",
                                 "first_content_time_us")

_NONNEG = frozenset({"prefix_length", "input_tokens", "output_tokens", "text_tokens", "image_tokens",
                     "audio_tokens", "video_tokens", "server_input_tokens", "num_chunks", "vllm_priority",
                     "think_time_us"})
_INTS = frozenset({"request_id", "round_index", "prefix_length", "input_tokens", "output_tokens",
                   "text_tokens", "image_tokens", "audio_tokens", "video_tokens", "deadline_us",
                   "slo_target_us", "server_input_tokens", "arrival_time_us", "send_time_us",
                   "first_chunk_time_us", "last_chunk_time_us", "num_chunks", "vllm_priority", "think_time_us",
                   "cached_tokens", "first_byte_time_us", "first_content_time_us"})
_BOOLS = frozenset({"streaming", "warmup"})
# String columns with few distinct values per trace (interned per file by the reader).
_REPEATED = frozenset({"client_id", "tenant_id", "slo_class", "prefix_group", "model", "status", "phase"})
_SUFFIX = {"deadline_us": " (use 0 for no timeout)", "slo_target_us": " (use 0 for no target)"}
_DEFAULTS: dict[str, Any] = {name: f.get_default(call_default_factory=True)
                             for name, f in TraceRecord.model_fields.items() if name != "request_id"}
_ROW_DEFAULTS: dict[str, Any] = {"request_id": 0, **_DEFAULTS}  # a row's dict starts as a copy: field order


def columns_for(records: Sequence[TraceRecord], mode: str) -> list[str]:
    """The header row the reference would write for ``records`` (plus ours when any record carries them)."""
    cols = list(BASE_COLUMNS[:4])
    if any(r.vllm_priority != 0 for r in records) or (mode == "real" and any(r.slo_class for r in records)):
        cols.append("vllm_priority")
    cols += BASE_COLUMNS[4:18]
    if any(r.slo_target_us > 0 for r in records):
        cols.append("slo_target_us")
    cols += BASE_COLUMNS[18:]
    # x_request_id: only in mode "real", as the reference (a replay re-export must not carry the real run's
    # request ids, which no longer match any server-side decision).
    if mode == "real" and any(r.x_request_id for r in records):
        cols.append("x_request_id")
    if any(r.adapter for r in records):
        cols.append("adapter")
    if any(r.think_time_us != 0 for r in records):
        cols.append("think_time_us")
    carried = {"phase": any(r.phase for r in records), "warmup": any(r.warmup for r in records),
               "cached_tokens": any(r.cached_tokens != -1 for r in records),
               "first_byte_time_us": any(r.first_byte_time_us != 0 for r in records),
               "first_content_time_us": any(r.first_content_time_us != 0 for r in records)}
    cols += [c for c in OUR_TRAILING if carried[c]]
    return cols


def _formatter(col: str) -> Any:
    """The cell writer of one column: Go's FormatBool / %d / FormatFloat('f', -1) / quoted string."""
    if col in _BOOLS:
        return _go.format_bool
    if col in _INTS:
        return str
    if col == "reason_ratio":
        return _go.fixed_float
    return _go.csv_field


def _column_positions(header: list[str]) -> dict[str, int]:
    has_pri = "vllm_priority" in header
    has_slo = "slo_target_us" in header
    pos: dict[str, int] = {}
    i = 0
    for name in BASE_COLUMNS:
        pos[name] = i
        i += 1
        if name == "slo_class" and has_pri:
            pos["vllm_priority"] = i
            i += 1
        if name == "deadline_us" and has_slo:
            pos["slo_target_us"] = i
            i += 1
    for name in REFERENCE_TRAILING + OUR_TRAILING:
        if name in header:
            pos[name] = header.index(name)
    return pos


# Columns the reference parses with strconv.ParseInt (int64); the other integer columns use strconv.Atoi.
_PARSEINT = frozenset({"deadline_us", "slo_target_us", "arrival_time_us", "send_time_us", "first_chunk_time_us",
                       "last_chunk_time_us", "think_time_us", "cached_tokens", "first_byte_time_us",
                       "first_content_time_us"})


def _parse_cell(col: str, raw: str, file: str, line: int) -> Any:
    """One cell the fast path did not take, with the reference's checks and message texts."""
    if col in _INTS:
        v = _go.parse_int(raw)
        if v is None:
            fn = "strconv.ParseInt" if col in _PARSEINT else "strconv.Atoi"
            why = "value out of range" if _go.looks_int(raw) else "invalid syntax"
            raise FormatError(f"parsing {col} {go_quote(raw)}: {fn}: parsing {go_quote(raw)}: {why}",
                              file=file, line=line, field=col)
        if v < 0 and (col in _NONNEG or col in _SUFFIX):
            raise FormatError(f"parsing {col}: negative value {v} not allowed{_SUFFIX.get(col, '')}",
                              file=file, line=line, field=col)
        if col == "cached_tokens" and v < -1:
            raise FormatError(f"parsing {col}: {v} is not a token count (-1 = not reported)",
                              file=file, line=line, field=col)
        return v
    if col in _BOOLS:
        b = _go.parse_bool(raw)
        if b is None:
            raise FormatError(f"parsing {col} {go_quote(raw)}: strconv.ParseBool: parsing {go_quote(raw)}: "
                              "invalid syntax", file=file, line=line, field=col)
        return b
    if col == "reason_ratio":
        f = _go.parse_float(raw)
        if f is None:
            raise FormatError(f"parsing reason_ratio {go_quote(raw)}: strconv.ParseFloat: parsing {go_quote(raw)}: "
                              "invalid syntax", file=file, line=line, field=col)
        if math.isnan(f) or not 0.0 <= f <= 1.0:
            raise FormatError(f"parsing reason_ratio {go_quote(raw)}: must be in range [0.0, 1.0], got {f:g}",
                              file=file, line=line, field=col)
        return f
    return raw


def read_trace_data(path: str | Path) -> list[TraceRecord]:
    """Read a TraceV2 data CSV with the reference's positional rules (docs/reference-formats.md §1.4)."""
    p = Path(path)
    with gc_paused():
        text = _plain_text(p)
        if text is None:
            return _read_rows(p)
        return _read_text(text, p)


def _read_text(text: str, p: Path) -> list[TraceRecord]:
    """:func:`read_trace_data` of a file's text that :func:`_plain_text` accepted."""
    file = str(p)
    lines = text.split("\n")
    h = next((i for i, line in enumerate(lines) if line), None)
    if h is None:
        return _read_rows(p)  # no header row: its error
    if len(text) > csv.field_size_limit() and max(map(len, lines)) > csv.field_size_limit():
        return _read_rows(p)  # maybe a field over the csv module's limit: its error
    header = lines[h].split(",")
    pos = _column_positions(header)
    min_cols = len(pos)
    fast = _ChunkParser(pos, min_cols)
    slow = _row_parser(pos, min_cols, file, fast.shared)
    out: list[TraceRecord] = []
    for start in range(h + 1, len(lines), _CHUNK_LINES):
        chunk = lines[start:start + _CHUNK_LINES]
        numbers = range(start + 1, start + 1 + len(chunk))  # 1-based line numbers
        if "" in chunk:  # blank lines are skipped, as Go's csv.Reader does
            keep = [k for k, line in enumerate(chunk) if line]
            chunk, numbers = [chunk[k] for k in keep], [numbers[k] for k in keep]  # type: ignore[assignment]
        if not chunk:
            continue
        records = fast.parse(chunk)
        if records is None:  # something unusual or wrong in this chunk: row by row, located errors
            records = [_checked_row(slow, row, line, min_cols, file)
                       for line, row in zip(numbers, (c.split(",") for c in chunk))]
        out += records
    return out


# A data file read in one piece is parsed this many lines at a time (the cells of one chunk are alive
# at once, not those of the whole file).
_CHUNK_LINES = 4096


def _plain_text(path: Path) -> str | None:
    """The file's text when the fast path can split it on "\\n" and "," exactly as Go's (and
    Python's) csv reader would: valid UTF-8 without quotes, CRs or NULs. None: use the csv module
    (which also reports whatever is wrong with the file, located)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if '"' in text or "\r" in text or "\x00" in text:
        return None
    return text


def _read_rows(p: Path) -> list[TraceRecord]:
    """The general reader: Python's csv module (quoted fields, CRLF, ...), one row at a time."""
    file = str(p)
    header, rows = csv_with_header(p)
    pos = _column_positions(header)
    # As the reference: every optional column the header declares counts (ours too), trailing ones included.
    min_cols = len(pos)
    parse_row = _row_parser(pos, min_cols, file)
    return [_checked_row(parse_row, row, line, min_cols, file) for line, row in rows]


def _checked_row(parse_row: Any, row: list[str], line: int, min_cols: int, file: str) -> TraceRecord:
    return _fast_record(checked_values(parse_row, row, line, min_cols, file))


def checked_values(parse_row: Any, row: list[str], line: int, min_cols: int, file: str) -> dict[str, Any]:
    """One row's field values, every check of the row path applied (errors located)."""
    n = len(row)
    if n < min_cols:
        raise FormatError(f"CSV row has {n} columns, expected at least {min_cols}", file=file, line=line)
    values = parse_row(row, n, line)
    d, a = values["deadline_us"], values["arrival_time_us"]
    if d > 0 and a > 0 and d < a:
        raise FormatError(f"parsing deadline_us: value {d} precedes arrival_time_us {a} (corrupt trace?)",
                          file=file, line=line, field="deadline_us")
    return values


_BOOL_VALUES = {"true": True, "false": False}


def _plain_ints(cells: list[str], *, arrays: bool = False) -> Any:
    """The cells as ints (an int64 array with ``arrays``) when every one is plain ASCII digits below
    10**18 (what ``int()`` and the row parser read the same way), parsed by numpy in one call; None otherwise (signs, spaces,
    empty cells, huge values: the row parser's checks decide)."""
    import numpy as np  # here: only a big file's columns need it

    joined = ",".join(cells).encode("utf-8")
    if not joined or joined.translate(None, b"0123456789,") or b",," in joined or joined[:1] == b"," \
            or joined[-1:] == b",":
        return None
    values = np.fromstring(joined, dtype=np.int64, sep=",")  # saturates at 2**63 - 1: checked below
    if values.size != len(cells) or values.max() >= 10**18:
        return None
    return values if arrays else values.tolist()


class _ChunkParser:
    """Well-formed chunks of rows, a column at a time: every row the same number of fields, every
    cell in the row parser's fast form (plain digits, ``true``/``false``, ``0`` for the ratio) or
    accepted by its slow check. Anything else — a short row, a bad cell, a deadline before its
    arrival — returns None, and the chunk is read row by row for the located error.

    A column with one value in the whole chunk (most of them: zeros, empty strings, ``ok``) is
    converted once and goes into the chunk's template dict; each record is a copy of it with the
    varying columns assigned."""

    def __init__(self, pos: dict[str, int], min_cols: int) -> None:
        self.pos = pos
        self.min_cols = min_cols
        self.order = sorted(pos, key=lambda c: pos[c])
        self.shared: dict[str, str] = {}
        self._makers: dict[tuple[str, ...], Any] = {}

    def parse(self, chunk: list[str]) -> list[TraceRecord] | None:
        parsed = self.parse_columns(chunk)
        if parsed is None:
            return None
        template, names, columns = parsed
        key = tuple(names)
        make = self._makers.get(key)
        if make is None:
            make = self._makers[key] = _record_maker(key)
        return make(len(chunk), template, *columns)

    def parse_columns(self, chunk: list[str], *, arrays: bool = False
                      ) -> tuple[dict[str, Any], list[str], list[Any]] | None:
        """The chunk's rows as ``(template, names, columns)``: every field's value where the chunk
        has one value (defaults included), then the varying columns (plain-digit integer columns
        as int64 arrays with ``arrays``, other columns as lists). None: read it row by row."""
        n = len(chunk)
        width = chunk[0].count(",") + 1
        if width < self.min_cols:
            return None
        stride = width + 1
        # every row followed by a "\n" item: all of them where expected <=> every row has `width` fields
        flat = (",\n,".join(chunk) + ",\n").split(",")
        if len(flat) != n * stride or flat[width::stride].count("\n") != n:
            return None
        template = dict(_ROW_DEFAULTS)  # a column after unknown extras, absent from these rows: its default
        names: list[str] = []
        columns: list[list[Any]] = []
        for col in self.order:
            i = self.pos[col]
            if i >= width:
                continue
            cells = flat[i::stride]
            first = cells[0]
            if cells[-1] == first and cells[n // 2] == first and cells.count(first) == n:
                values = self._convert(col, cells[:1])
                if values is None:
                    return None
                template[col] = values[0]
            else:
                values = self._convert(col, cells, arrays=arrays)
                if values is None:
                    return None
                names.append(col)
                columns.append(values)
        if self._deadline_problem(template, names, columns, n):
            return None
        return template, names, columns

    @staticmethod
    def _deadline_problem(template: dict[str, Any], names: list[str], columns: list[list[Any]], n: int) -> bool:
        """Whether some row's deadline precedes its arrival (the row parser's check)."""
        if "deadline_us" not in names and not template["deadline_us"]:
            return False
        deadlines, arrivals = (columns[names.index(c)] if c in names else repeat(template[c], n)
                               for c in ("deadline_us", "arrival_time_us"))
        return any(0 < d < a for d, a in zip(deadlines, arrivals))

    def _convert(self, col: str, cells: list[str], *, arrays: bool = False) -> Any:
        if col == "think_time_us":  # trimmed, and empty means 0 (the reference's "not recorded")
            cells = [c.strip(_go.GO_SPACE) if c else c for c in cells]
            if not any(cells):
                return [0] * len(cells)
            values = _plain_ints(cells)
            return values if values is not None else self._cellwise(col, cells, empty_is=0)
        if col in _TRIMMED:
            return [c.strip(_go.GO_SPACE) for c in cells] if any(cells) else cells
        if col in _INTS:
            values = _plain_ints(cells, arrays=arrays)
            return values if values is not None else self._cellwise(col, cells)
        if col in _BOOLS:
            if set(cells) <= _BOOL_VALUES.keys():
                return list(map(_BOOL_VALUES.__getitem__, cells))
            return self._cellwise(col, cells)
        if col == "reason_ratio":
            if set(cells) == {"0"}:
                return [0.0] * len(cells)
            return self._cellwise(col, cells)
        if col in _REPEATED:  # one string object per distinct value: a few hundred bytes less per row
            return list(map(self.shared.setdefault, cells, cells))
        return cells

    @staticmethod
    def _cellwise(col: str, cells: list[str], empty_is: Any = None) -> list[Any] | None:
        """Each cell through the row parser's checks (signs, Go's bool forms, ratios); None at the
        first one they reject (its message needs the row's line: the caller reads the chunk again)."""
        try:
            return [empty_is if (empty_is is not None and not c) else _parse_cell(col, c, "", 0)
                    for c in cells]
        except FormatError:
            return None


def _record_maker(names: tuple[str, ...]) -> Any:
    """``make(n, template, *columns) -> list[TraceRecord]``: per row a copy of the template dict
    with ``names`` set to that row's values (one generated function per set of varying columns),
    then the records around them as :func:`_fast_record` builds one (the values are checked
    already), each step a loop in C."""
    params = [f"v{k}" for k in range(len(names))]
    src = [f"def row(template{''.join(', ' + p for p in params)}):", "    d = COPY(template)"]
    src += [f"    d[{name!r}] = {p}" for name, p in zip(names, params)]
    src.append("    return d")
    namespace: dict[str, Any] = {"COPY": dict.copy}
    exec("\n".join(src), namespace)  # noqa: S102 - source built above from fixed field names only
    row = namespace["row"]

    def make(n: int, template: dict[str, Any], *columns: list[Any]) -> list[TraceRecord]:
        dicts = list(map(row, repeat(template, n), *columns))
        records = list(map(_NEW, repeat(TraceRecord, n)))
        for slot, values in (("__dict__", dicts), ("__pydantic_fields_set__", repeat(_ALL_FIELDS_SET, n)),
                             ("__pydantic_extra__", repeat(None, n)), ("__pydantic_private__", repeat(None, n))):
            deque(map(_SET, records, repeat(slot, n), values), maxlen=0)
        return records

    return make


_NEW, _SET = TraceRecord.__new__, object.__setattr__


def _row_parser(pos: dict[str, int], min_cols: int, file: str, shared: dict[str, str] | None = None) -> Any:
    """A row -> field-values function specialised to this header's column positions.

    Generated source (like ``dataclasses`` and ``namedtuple`` do) so each cell is one inlined fast check —
    plain ASCII digits, ``true``/``false``, ``0`` — with everything else (signs, errors, range checks, the
    reference's messages) in :func:`_parse_cell`. A loop over a column plan cost twice as much per row.
    """
    body = ["def parse_row(row, n, line):", "    d = dict(DEFAULTS)"]  # every field, in declaration order
    for col, i in sorted(pos.items(), key=lambda kv: kv[1]):
        pad = "    "
        if i >= min_cols:  # placed after unknown extra columns: a row may still lack it (keep the default)
            body.append(f"    if n > {i}:")
            pad = "        "
        if col == "think_time_us":  # trimmed, and empty means 0 (the reference's "not recorded")
            body += [f"{pad}v = TRIM(row[{i}])",
                     f"{pad}d[{col!r}] = slow({col!r}, v, FILE, line) if v else 0"]
        elif col in _TRIMMED:
            body.append(f"{pad}d[{col!r}] = TRIM(row[{i}])")
        elif col in _INTS:
            body += [f"{pad}v = row[{i}]",
                     f"{pad}d[{col!r}] = int(v) if v.isdigit() and v.isascii() and len(v) < 19 "
                     f"else slow({col!r}, v, FILE, line)"]
        elif col in _BOOLS:
            body += [f"{pad}v = row[{i}]",
                     f"{pad}d[{col!r}] = (v == 'true') if v in TF else slow({col!r}, v, FILE, line)"]
        elif col == "reason_ratio":
            body += [f"{pad}v = row[{i}]", f"{pad}d[{col!r}] = 0.0 if v == '0' else slow({col!r}, v, FILE, line)"]
        elif col in _REPEATED:  # one string object per distinct value: a few hundred bytes less per row
            body.append(f"{pad}v = row[{i}]")
            body.append(f"{pad}d[{col!r}] = SHARED.setdefault(v, v)")
        else:
            body.append(f"{pad}d[{col!r}] = row[{i}]")
    body.append("    return d")
    namespace: dict[str, Any] = {"DEFAULTS": _ROW_DEFAULTS, "slow": _parse_cell, "FILE": file, "TRIM": _go.trim_space,
                                 "TF": frozenset({"true", "false"}),
                                 "SHARED": {} if shared is None else shared}
    exec("\n".join(body), namespace)  # noqa: S102 - source built above from fixed column names only
    return namespace["parse_row"]


# One fields-set object for every record read: a 37-name set is 2.2 KB, two thirds of a record's memory. Sharing
# it is safe because TraceRecord is frozen (pydantic adds to the set only on attribute assignment) and
# model_copy() copies the set before updating it.
_ALL_FIELDS_SET = set(TraceRecord.model_fields)


def _fast_record(values: dict[str, Any]) -> TraceRecord:
    """``TraceRecord.model_construct(**values)`` without its per-field loop (values are already checked).

    The reader's checks are the model's constraints (tests compare both on the same inputs), so skipping
    pydantic here loses nothing but time: model_construct cost ~10x the whole parse of a row.
    """
    rec = TraceRecord.__new__(TraceRecord)
    object.__setattr__(rec, "__dict__", values)
    object.__setattr__(rec, "__pydantic_fields_set__", _ALL_FIELDS_SET)
    object.__setattr__(rec, "__pydantic_extra__", None)
    object.__setattr__(rec, "__pydantic_private__", None)
    return rec


def data_text(records: Sequence[TraceRecord], *, mode: str) -> str:
    cols = columns_for(records, mode)
    plan = [(c, _formatter(c)) for c in cols]
    parts = [_go.csv_line(cols)]
    for r in records:
        v = r.__dict__
        parts.append(",".join([fmt(v[c]) for c, fmt in plan]) + "\n")
    return "".join(parts)


def write_trace_data(records: Sequence[TraceRecord], path: str | Path, *, mode: str) -> None:
    atomic_write(path, data_text(records, mode=mode))
