"""The TraceV2 data CSV (docs/reference-formats.md §1.4): one :class:`TraceRecord` per request, and its writer.

API::

    write_trace_data(records, "o.csv", mode="real")         # mode decides the conditional vllm_priority column
    data_text(records, mode=...) -> str; columns_for(records, mode) -> the header row that would be written
    # reading: blis_sim.formats.trace_columns (read_trace_columns -> columns, read_trace_data -> records)

:class:`TraceRecord` — the 27 base columns, the optional ``vllm_priority`` and ``slo_target_us`` (inserted
positionally), the reference's trailing ``x_request_id``, ``adapter``, ``think_time_us``, and OUR trailing
columns ``phase``, ``warmup``, ``cached_tokens`` (-1 = not reported), ``first_byte_time_us``,
``first_content_time_us`` (0 = unknown), ``replica`` (the cluster replica that served the row, 0-based;
-1 = one server, and the column is then not written). Properties ``ttft_us`` / ``e2e_us`` = first / last chunk time − send
time (client side, include the network).

This module holds the layout both directions share: the column positions a header row gives
(positional base columns shifted by the inline optional columns found in the header row, trailing
columns by header name, extra columns tolerated) and the reference's checks of one cell (Go
``ParseInt``/``ParseBool`` forms, range checks and messages, each a FormatError naming file, line and
column). Writing follows Go's ``encoding/csv`` (minimal quoting, ``\\n`` line ends); an optional column
is written only when some record carries it.
"""

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from blis_sim.errors import FormatError
from blis_sim.formats import _go
from blis_sim.formats._io import atomic_write, go_quote
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
               "first_content_time_us": any(r.first_content_time_us != 0 for r in records),
               "replica": any(r.replica != -1 for r in records)}
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
