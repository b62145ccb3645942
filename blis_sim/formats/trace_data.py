"""The TraceV2 data CSV (docs/reference-formats.md §1.4): one :class:`TraceRecord` per request, and its writer.

API::

    write_trace_data(records, "o.csv", mode="real")         # mode decides the conditional vllm_priority column
    data_text(records, mode=...) -> str; columns_for(records, mode) -> the header row that would be written
    # reading: blis_sim.formats.trace_columns (read_trace_columns -> columns, read_trace_data -> records)

:class:`TraceRecord` — the 27 base columns, the optional ``vllm_priority`` and ``slo_target_us`` (inserted
positionally), the reference's trailing ``x_request_id``, ``adapter``, ``think_time_us``, and OUR trailing
columns ``phase``, ``warmup``, ``cached_tokens`` (-1 = not reported), ``first_byte_time_us``,
``first_content_time_us`` (0 = unknown), ``replica`` (the cluster replica that served the row,
0-based; -1 = one server, and the column is then not written). Properties ``ttft_us`` / ``e2e_us`` =
first / last chunk time − send time (client side, include the network).

This module holds the layout both directions share: the column positions a header row gives
(positional base columns shifted by the inline optional columns found in the header row, trailing
columns by header name, extra columns tolerated) and the reference's checks of one cell (Go
``ParseInt``/``ParseBool`` forms, range checks and messages, each a FormatError naming file, line and
column). Writing follows Go's ``encoding/csv`` (minimal quoting, ``\\n`` line ends); an optional column
is written only when some record carries it.
"""

import math
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import numpy as np
from pydantic import Field, field_validator, model_validator

from blis_sim.errors import FormatError
from blis_sim.formats import _go
from blis_sim.formats._io import atomic_write_chunks, go_quote
from blis_sim.formats._model import StrictModel

if TYPE_CHECKING:
    from blis_sim.formats.trace_columns import TraceColumns

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
    replica: int = Field(default=-1, ge=-1)  # the cluster replica that served it (-1: one server)

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
                                 "first_content_time_us", "replica")

_NONNEG = frozenset({"prefix_length", "input_tokens", "output_tokens", "text_tokens", "image_tokens",
                     "audio_tokens", "video_tokens", "server_input_tokens", "num_chunks", "vllm_priority",
                     "think_time_us"})
_INTS = frozenset({"request_id", "round_index", "prefix_length", "input_tokens", "output_tokens",
                   "text_tokens", "image_tokens", "audio_tokens", "video_tokens", "deadline_us",
                   "slo_target_us", "server_input_tokens", "arrival_time_us", "send_time_us",
                   "first_chunk_time_us", "last_chunk_time_us", "num_chunks", "vllm_priority", "think_time_us",
                   "cached_tokens", "first_byte_time_us", "first_content_time_us", "replica"})
_BOOLS = frozenset({"streaming", "warmup"})
# what the writers take: records, or the same rows as columns
Rows = Union[Sequence[TraceRecord], "TraceColumns"]
# String columns with few distinct values per trace (interned per file by the reader).
_REPEATED = frozenset({"client_id", "tenant_id", "slo_class", "prefix_group", "model", "status", "phase"})
_SUFFIX = {"deadline_us": " (use 0 for no timeout)", "slo_target_us": " (use 0 for no target)"}
_DEFAULTS: dict[str, Any] = {name: f.get_default(call_default_factory=True)
                             for name, f in TraceRecord.model_fields.items() if name != "request_id"}
_ROW_DEFAULTS: dict[str, Any] = {"request_id": 0, **_DEFAULTS}  # a row's dict starts as a copy: field order


def columns_for(rows: Rows, mode: str) -> list[str]:
    """The header row the reference would write for ``rows`` (records or ``TraceColumns``; plus our
    columns when any row carries them)."""
    data = _as_columns(rows)

    def any_(name: str, test: Any) -> bool:
        """Whether some row's ``name`` passes ``test`` (one value, or a numpy array of them)."""
        if not data.n:
            return False
        const, value = data.constant(name)
        if const:
            return bool(test(value))
        col = data.data[name]
        if isinstance(col, np.ndarray):
            return bool(test(col).any())
        used = np.flatnonzero(np.bincount(col.codes, minlength=len(col.names))).tolist()
        return any(test(col.names[c]) for c in used)  # a string column: the names some row holds

    def nonzero(v: Any) -> Any:
        return v != 0

    def nonempty(v: Any) -> Any:
        return v.astype(bool) if isinstance(v, np.ndarray) else bool(v)

    cols = list(BASE_COLUMNS[:4])
    if any_("vllm_priority", nonzero) or (mode == "real" and any_("slo_class", nonempty)):
        cols.append("vllm_priority")
    cols += BASE_COLUMNS[4:18]
    if any_("slo_target_us", lambda a: a > 0):
        cols.append("slo_target_us")
    cols += BASE_COLUMNS[18:]
    # x_request_id: only in mode "real", as the reference (a replay re-export must not carry the real run's
    # request ids, which no longer match any server-side decision).
    if mode == "real" and any_("x_request_id", nonempty):
        cols.append("x_request_id")
    if any_("adapter", nonempty):
        cols.append("adapter")
    if any_("think_time_us", nonzero):
        cols.append("think_time_us")
    carried = {"phase": any_("phase", nonempty), "warmup": any_("warmup", nonempty),
               "cached_tokens": any_("cached_tokens", lambda a: a != -1),
               "first_byte_time_us": any_("first_byte_time_us", nonzero),
               "first_content_time_us": any_("first_content_time_us", nonzero),
               "replica": any_("replica", lambda a: a != -1)}
    cols += [c for c in OUR_TRAILING if carried[c]]
    return cols


def _as_columns(rows: Rows) -> "TraceColumns":
    """Records as ``TraceColumns`` (a ``TraceColumns`` as it is): the writer works on columns."""
    from blis_sim.formats.trace_columns import TraceColumns

    return rows if isinstance(rows, TraceColumns) else TraceColumns.from_records(rows)


def _formatter(col: str) -> Callable[[Any], str]:
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
                       "first_content_time_us", "replica"})


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
        if col == "replica" and v < -1:
            raise FormatError(f"parsing {col}: {v} is not a replica index (-1 = one server)",
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


# Rows are formatted this many at a time: the cells of one chunk are alive at once, never those
# of the whole file (a 10M-request re-export).
CHUNK_ROWS = 65536


def _cells(col: str, value: Any, n: int) -> Any:
    """One column of a chunk as CSV cells: a list of strings, or one string every row writes."""
    fmt = _formatter(col)
    if not isinstance(value, (np.ndarray, tuple)):
        return fmt(value)
    if isinstance(value, tuple):  # (codes, names) of a string column: each name formatted once
        codes, names = value
        cells = [fmt(v) for v in names]
        return [cells[c] for c in codes.tolist()]
    if col in _BOOLS:
        return np.where(value, "true", "false").tolist()
    if col in _INTS:
        return _go.json_ints(value)
    return [fmt(v) for v in value.tolist()]


def data_chunks(rows: Rows, *, mode: str) -> Iterator[str]:
    """The data CSV of ``rows`` (records or ``TraceColumns``) as successive pieces of text: the
    header row, then :data:`CHUNK_ROWS` rows at a time, formatted a column at a time."""
    data = _as_columns(rows)
    cols = columns_for(data, mode)
    yield _go.csv_line(cols)
    for start in range(0, data.n, CHUNK_ROWS):
        stop = min(data.n, start + CHUNK_ROWS)
        n = stop - start
        per_col = []
        for c in cols:
            col = data.data[c]
            if isinstance(col, np.ndarray):
                col = col[start:stop]
            elif not isinstance(col, (str, int, float, bool)):  # a StrColumn
                col = (col.codes[start:stop], col.names)
            cells = _cells(c, col, n)
            per_col.append(repeat(cells, n) if isinstance(cells, str) else cells)
        yield "".join(map("%s\n".__mod__, map(",".join, zip(*per_col))))


def data_text(rows: Rows, *, mode: str) -> str:
    return "".join(data_chunks(rows, mode=mode))


def write_trace_data(rows: Rows, path: str | Path, *, mode: str) -> None:
    atomic_write_chunks(path, data_chunks(rows, mode=mode))
