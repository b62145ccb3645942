"""TraceV2: the reference's trace (header YAML + data CSV, plus the optional ITL CSV), read and written.

API::

    trace = load_trace("t.yaml", "t.csv")            # -> Trace(header: TraceHeader, records: list[TraceRecord])
    header = read_trace_header("t.yaml")             # -> TraceHeader
    records = read_trace_data("t.csv")               # -> list[TraceRecord] (file order = completion order)
    write_trace(trace, "o.yaml", "o.csv", blis_compatible=False)
    write_trace_header(header, "o.yaml", blis_compatible=False); write_trace_data(records, "o.csv", mode="real")
    itl = read_itl("t.itl.csv")                      # -> list[ITLRecord]; itl_by_request(itl) -> {id: [µs, ...]}
    write_itl(itl, "o.itl.csv"); default_itl_path("t.csv") -> "t.itl.csv"

Models (strict pydantic, frozen; unknown keys are errors):

- :class:`TraceHeader` — every key of the reference header (blis-pipeline.md §1.1) in its order:
  ``trace_version, time_unit, created_at, mode, warm_up_requests, workload_seed, workload_spec,
  session_context_growth, server`` (:class:`TraceServerConfig`), ``network`` (:class:`TraceNetworkConfig`),
  ``goodput_slo_targets`` ({class: :class:`SLOTargets`}), ``kv_offload`` (:class:`TraceKVOffloadConfig`,
  §1.2), ``observed_kv_metrics`` (:class:`ObservedKVMetrics`, §1.3), then OUR block ``pytest_blis``
  (:class:`PytestBlisHeader`: tool/vLLM versions, KV geometry, per-definition ``kv_hit_rates``, per-tier I/O,
  scrape info, phases, partial flag, offload extensions, latency model). ``blis_compatible=True`` leaves our
  block out so BLIS can read the file back.
- :class:`TraceRecord` — one CSV row: the 27 base columns, the optional ``vllm_priority`` and
  ``slo_target_us`` (inserted positionally), the reference's trailing ``x_request_id``, ``adapter``,
  ``think_time_us``, and OUR trailing columns ``phase``, ``warmup``, ``cached_tokens`` (-1 = not reported),
  ``first_byte_time_us``, ``first_content_time_us`` (0 = unknown). Properties ``ttft_us`` / ``e2e_us`` =
  first / last chunk time − send time (client side, include the network).

Reading follows the reference (§1.4): positional base columns shifted by the inline optional columns found in
the header row, trailing columns by header name, extra columns tolerated, Go ``ParseBool`` forms, the
reference's range checks. Any problem is a :class:`~blis_sim.errors.FormatError` naming file, line and column.
Writing follows Go: yaml.v3 layout (4-space indent, ``hit_rate: 0`` explicit, absent blocks absent),
``encoding/csv`` minimal quoting with ``\\n`` line ends; an optional column is written only when some record
carries it. Files are written atomically (temp file + rename), so an interrupted run never leaves half a file.
"""
from __future__ import annotations

import csv
import math
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from blis_sim.errors import FormatError
from blis_sim.formats import _go
from blis_sim.formats._model import StrictModel, to_go
from blis_sim.formats._strict import load_yaml, validate
from blis_sim.formats._yamlout import dump
from blis_sim.formats.hitrate import KVHitRate

SOURCE_TIERED = "tiered"
SOURCE_GPU_FALLBACK = "gpu-prefix-cache-fallback"


# --------------------------------------------------------------------------------------------- header


class TraceServerConfig(StrictModel):
    """``server:`` — observe writes type and model; the rest is schema the reference never fills."""

    type: str = ""
    model: str = ""
    tensor_parallel: int = Field(default=0, ge=0)
    max_num_seqs: int = Field(default=0, ge=0)
    block_size: int = Field(default=0, ge=0)
    gpu_memory_utilization: float = Field(default=0.0, ge=0.0, le=1.0)
    max_model_len: int = Field(default=0, ge=0)

    _omitempty: ClassVar[frozenset[str]] = frozenset(
        {"type", "model", "tensor_parallel", "max_num_seqs", "block_size", "gpu_memory_utilization",
         "max_model_len"})


class TraceNetworkConfig(StrictModel):
    """``network:`` — observe always writes it (``network: {}`` when no RTT was measured)."""

    measured_rtt_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)

    _omitempty: ClassVar[frozenset[str]] = frozenset({"measured_rtt_ms"})


class SLOTargets(StrictModel):
    """One ``goodput_slo_targets`` class: targets in ms, 0 = not gated."""

    ttft_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    itl_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    e2e_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)

    _omitempty: ClassVar[frozenset[str]] = frozenset({"ttft_ms", "itl_ms", "e2e_ms"})


class TraceTierConfig(StrictModel):
    """One resolved secondary tier of the ``kv_offload`` header block (bandwidths bytes/µs, latency µs)."""

    type: str = ""
    root_dir: str = ""
    n_read_threads: int = Field(default=0, ge=0)
    n_write_threads: int = Field(default=0, ge=0)
    locality: str = ""
    enable_kv_events: bool = False
    direct_io: bool = False
    device_class: str = ""
    read_bandwidth: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    write_bandwidth: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    base_latency: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    saturation_queue_depth: int = Field(default=0, ge=0)
    single_transfer_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    latency_jitter_stddev: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)

    _omitempty: ClassVar[frozenset[str]] = frozenset({"locality", "device_class"})


class TraceKVOffloadConfig(StrictModel):
    """``kv_offload:`` — the resolved offload config (§1.2); convert with ``blis_sim.formats.offload``."""

    cpu_bytes_to_use: int = Field(default=0, ge=0)
    per_block_bytes: int = Field(default=0, ge=0)
    block_size: int = Field(default=0, ge=0)
    blocks_per_chunk: int = Field(default=0, ge=0)
    tokens_per_hash: int = Field(default=0, ge=0)
    eviction_policy: str = ""
    offload_prompt_only: bool = False
    self_describing_kv_events: bool = False
    secondary_tiers: list[TraceTierConfig] = Field(default_factory=list)

    _omitempty: ClassVar[frozenset[str]] = frozenset({"secondary_tiers"})


class ObservedKVMetrics(StrictModel):
    """``observed_kv_metrics:`` — the real side's primary hit-rate (§1.3). ``hit_rate: 0`` is written."""

    source: Literal["tiered", "gpu-prefix-cache-fallback"]
    hit_rate: float = Field(ge=0.0, le=1.0)
    block_hits: int = Field(default=0, ge=0)
    block_queries: int = Field(default=0, ge=0)
    read_time_total: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    write_time_total: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    vllm_commit: str = ""

    _omitempty: ClassVar[frozenset[str]] = frozenset({"read_time_total", "write_time_total", "vllm_commit"})

    @model_validator(mode="after")
    def _hits_within_queries(self) -> ObservedKVMetrics:
        if self.block_hits > self.block_queries:
            raise ValueError(f"block_hits ({self.block_hits}) exceed block_queries ({self.block_queries})")
        return self


# ----- our header block


class KVGeometry(StrictModel):
    """The server's KV geometry (``vllm:cache_config_info``): tokens per GPU block, GPU blocks."""

    block_size: int | None = Field(default=None, ge=1)
    num_gpu_blocks: int | None = Field(default=None, ge=1)


class TierIO(StrictModel):
    """Per-tier transfer counters over the window (vLLM's native units: bytes, seconds)."""

    tier: str
    read_bytes: int = Field(default=0, ge=0)
    write_bytes: int = Field(default=0, ge=0)
    read_time_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    write_time_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)


class ScrapeInfo(StrictModel):
    """How the counter window was taken (times are epoch µs)."""

    metrics_url: str = ""
    start_time_us: int = 0
    end_time_us: int = 0
    settle_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    families: list[str] = Field(default_factory=list)   # the metric families seen at the end of the window
    warnings: list[str] = Field(default_factory=list)   # e.g. why a definition was omitted

    _omitempty: ClassVar[frozenset[str]] = frozenset({"metrics_url", "families", "warnings"})


class PhaseInfo(StrictModel):
    """One workload phase as dispatched (times are epoch µs; 0 = unknown)."""

    name: str
    warmup: bool = False
    measured: bool = True      # inside the counter window
    requests: int = Field(default=0, ge=0)
    start_time_us: int = 0
    end_time_us: int = 0


class OffloadExtensions(StrictModel):
    """Offload settings the reference's ``kv_offload`` block cannot hold (INV-13 for our additions)."""

    store_threshold: int = Field(default=0, ge=0)
    tier_max_bytes: list[int | None] = Field(default_factory=list)  # per secondary tier; None = unbounded

    @field_validator("tier_max_bytes")
    @classmethod
    def _positive(cls, v: list[int | None]) -> list[int | None]:
        for i, b in enumerate(v):
            if b is not None and b <= 0:
                raise ValueError(f"tier_max_bytes[{i}] must be > 0 or null, got {b}")
        return v


class LatencyModelInfo(StrictModel):
    """The latency model a sim-generated trace was produced with (design D7)."""

    name: str
    coefficients: dict[str, float] = Field(default_factory=dict)
    source: str = ""

    _omitempty: ClassVar[frozenset[str]] = frozenset({"source"})


class PytestBlisHeader(StrictModel):
    """``pytest_blis:`` — everything we add to the header; omitted with ``blis_compatible=True``."""

    tool_version: str = ""
    vllm_version: str = ""
    server_url: str = ""
    kv_geometry: KVGeometry | None = None
    kv_hit_rates: list[KVHitRate] = Field(default_factory=list)
    tier_io: list[TierIO] = Field(default_factory=list)
    scrape: ScrapeInfo | None = None
    phases: list[PhaseInfo] = Field(default_factory=list)
    partial: bool = False
    partial_reason: str = ""
    offload: OffloadExtensions | None = None
    latency_model: LatencyModelInfo | None = None
    warnings: list[str] = Field(default_factory=list)

    _omitempty: ClassVar[frozenset[str]] = frozenset(
        {"tool_version", "vllm_version", "server_url", "kv_hit_rates", "tier_io", "phases", "partial",
         "partial_reason", "warnings"})


class TraceHeader(StrictModel):
    """The TraceV2 header (§1.1), keys in the reference's order, plus ``pytest_blis``."""

    trace_version: int = 3
    time_unit: str = "us"
    created_at: str = ""
    mode: Literal["real", "generated", "replayed"]
    warm_up_requests: int = Field(default=0, ge=0)
    workload_seed: int | None = None
    workload_spec: str = ""
    session_context_growth: Literal["", "accumulate"] = ""
    server: TraceServerConfig | None = None
    network: TraceNetworkConfig | None = None
    goodput_slo_targets: dict[str, SLOTargets] = Field(default_factory=dict)
    kv_offload: TraceKVOffloadConfig | None = None
    observed_kv_metrics: ObservedKVMetrics | None = None
    pytest_blis: PytestBlisHeader | None = None

    _omitempty: ClassVar[frozenset[str]] = frozenset(
        {"created_at", "workload_spec", "session_context_growth", "goodput_slo_targets"})


# --------------------------------------------------------------------------------------------- records


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

    @model_validator(mode="after")
    def _deadline_after_arrival(self) -> TraceRecord:
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


class Trace(StrictModel):
    """A whole trace: header + records (in file order, i.e. completion order for observe traces)."""

    header: TraceHeader
    records: list[TraceRecord]


# --------------------------------------------------------------------------------------------- columns

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
_SUFFIX = {"deadline_us": " (use 0 for no timeout)", "slo_target_us": " (use 0 for no target)"}
_DEFAULTS: dict[str, Any] = {name: f.get_default(call_default_factory=True)
                             for name, f in TraceRecord.model_fields.items() if name != "request_id"}


def columns_for(records: Sequence[TraceRecord], mode: str) -> list[str]:
    """The header row the reference would write for ``records`` (plus ours when any record carries them)."""
    cols = list(BASE_COLUMNS[:4])
    if any(r.vllm_priority != 0 for r in records) or (mode == "real" and any(r.slo_class for r in records)):
        cols.append("vllm_priority")
    cols += BASE_COLUMNS[4:18]
    if any(r.slo_target_us > 0 for r in records):
        cols.append("slo_target_us")
    cols += BASE_COLUMNS[18:]
    # x_request_id: the reference writes it in mode "real" only; we write it whenever a record has one, so a
    # round trip never drops data (only observe sets it, so the two rules agree on every real file).
    if any(r.x_request_id for r in records):
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


# --------------------------------------------------------------------------------------------- reading


def _rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(first line number, fields) per CSV row; blank lines skipped like Go's csv.Reader."""
    try:
        f = path.open(newline="", encoding="utf-8")
    except FileNotFoundError:
        raise FormatError("file not found", file=str(path)) from None
    except OSError as exc:  # a directory, no permission, ...
        raise FormatError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    with f:
        reader = csv.reader(f, strict=True)
        line = 1
        try:
            for row in reader:
                start, line = line, reader.line_num + 1
                if row and row != [""]:
                    yield start, row
        except csv.Error as exc:
            raise FormatError(f"malformed CSV: {exc}", file=str(path), line=reader.line_num) from None
        except UnicodeDecodeError as exc:
            raise FormatError(f"not UTF-8 text ({exc.reason})", file=str(path), line=line) from None


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


def _parse_cell(col: str, raw: str, file: str, line: int) -> Any:
    if col in _INTS:
        v = _go.parse_int(raw)
        if v is None:
            why = "value out of range" if _go.looks_int(raw) else "invalid syntax"
            raise FormatError(f"parsing {col} {_quote(raw)}: {why}", file=file, line=line, field=col)
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
            raise FormatError(f"parsing {col} {_quote(raw)}: invalid syntax (expected true or false)",
                              file=file, line=line, field=col)
        return b
    if col == "reason_ratio":
        f = _go.parse_float(raw)
        if f is None:
            raise FormatError(f"parsing reason_ratio {_quote(raw)}: invalid syntax", file=file, line=line,
                              field=col)
        if math.isnan(f) or not 0.0 <= f <= 1.0:
            raise FormatError(f"parsing reason_ratio {_quote(raw)}: must be in range [0.0, 1.0], got {f:g}",
                              file=file, line=line, field=col)
        return f
    return raw


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def read_trace_data(path: str | Path) -> list[TraceRecord]:
    """Read a TraceV2 data CSV with the reference's positional rules (blis-pipeline.md §1.4)."""
    p = Path(path)
    file = str(p)
    rows = _rows(p)
    try:
        _, header = next(rows)
    except StopIteration:
        raise FormatError("reading CSV header: EOF (the file has no header row)", file=file, line=1) from None
    pos = _column_positions(header)
    min_cols = len(BASE_COLUMNS) + ("vllm_priority" in pos) + ("slo_target_us" in pos)
    parse_row = _row_parser(pos, min_cols, file)
    out: list[TraceRecord] = []
    for line, row in rows:
        n = len(row)
        if n < min_cols:
            raise FormatError(f"CSV row has {n} columns, expected at least {min_cols}", file=file, line=line)
        values = parse_row(row, n, line)
        d, a = values["deadline_us"], values["arrival_time_us"]
        if d > 0 and a > 0 and d < a:
            raise FormatError(f"parsing deadline_us: value {d} precedes arrival_time_us {a} (corrupt trace?)",
                              file=file, line=line, field="deadline_us")
        out.append(_fast_record(values))
    return out


def _row_parser(pos: dict[str, int], min_cols: int, file: str) -> Any:
    """A row -> field-values function specialised to this header's column positions.

    Generated source (like ``dataclasses`` and ``namedtuple`` do) so each cell is one inlined fast check —
    plain ASCII digits, ``true``/``false``, ``0`` — with everything else (signs, errors, range checks, the
    reference's messages) in :func:`_parse_cell`. A loop over a column plan cost twice as much per row.
    """
    body = ["def parse_row(row, n, line):", "    d = dict(DEFAULTS)"]
    for col, i in sorted(pos.items(), key=lambda kv: kv[1]):
        pad = "    "
        if i >= min_cols:  # a trailing column a short row may lack: keep the default
            body.append(f"    if n > {i}:")
            pad = "        "
        if col in _INTS:
            body += [f"{pad}v = row[{i}]",
                     f"{pad}d[{col!r}] = int(v) if v.isdigit() and v.isascii() and len(v) < 19 "
                     f"else slow({col!r}, v, FILE, line)"]
        elif col in _BOOLS:
            body += [f"{pad}v = row[{i}]",
                     f"{pad}d[{col!r}] = (v == 'true') if v in TF else slow({col!r}, v, FILE, line)"]
        elif col == "reason_ratio":
            body += [f"{pad}v = row[{i}]", f"{pad}d[{col!r}] = 0.0 if v == '0' else slow({col!r}, v, FILE, line)"]
        else:
            body.append(f"{pad}d[{col!r}] = row[{i}]")
    body.append("    return d")
    namespace: dict[str, Any] = {"DEFAULTS": _DEFAULTS, "slow": _parse_cell, "FILE": file,
                                 "TF": frozenset({"true", "false"})}
    exec("\n".join(body), namespace)  # noqa: S102 - source built above from fixed column names only
    return namespace["parse_row"]


_RECORD_FIELDS = frozenset(TraceRecord.model_fields)


def _fast_record(values: dict[str, Any]) -> TraceRecord:
    """``TraceRecord.model_construct(**values)`` without its per-field loop (values are already checked).

    The reader's checks are the model's constraints (tests compare both on the same inputs), so skipping
    pydantic here loses nothing but time: model_construct cost ~10x the whole parse of a row.
    """
    rec = TraceRecord.__new__(TraceRecord)
    object.__setattr__(rec, "__dict__", values)
    object.__setattr__(rec, "__pydantic_fields_set__", set(_RECORD_FIELDS))
    object.__setattr__(rec, "__pydantic_extra__", None)
    object.__setattr__(rec, "__pydantic_private__", None)
    return rec


def read_trace_header(path: str | Path) -> TraceHeader:
    """Read a TraceV2 header YAML strictly (unknown keys, duplicate keys, bad values → FormatError)."""
    return validate(TraceHeader, load_yaml(path), plain_strings=True)


def load_trace(header_path: str | Path, data_path: str | Path) -> Trace:
    """Both files of a trace."""
    return Trace.model_construct(header=read_trace_header(header_path), records=read_trace_data(data_path))


# --------------------------------------------------------------------------------------------- writing


def atomic_write(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and a rename."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent or Path("."))
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def header_text(header: TraceHeader, *, blis_compatible: bool = False) -> str:
    data = to_go(header)
    if blis_compatible:
        data.pop("pytest_blis", None)
    return dump(data)


def data_text(records: Sequence[TraceRecord], *, mode: str) -> str:
    cols = columns_for(records, mode)
    plan = [(c, _formatter(c)) for c in cols]
    parts = [_go.csv_line(cols)]
    for r in records:
        v = r.__dict__
        parts.append(",".join([fmt(v[c]) for c, fmt in plan]) + "\n")
    return "".join(parts)


def write_trace_header(header: TraceHeader, path: str | Path, *, blis_compatible: bool = False) -> None:
    atomic_write(path, header_text(header, blis_compatible=blis_compatible))


def write_trace_data(records: Sequence[TraceRecord], path: str | Path, *, mode: str) -> None:
    atomic_write(path, data_text(records, mode=mode))


def write_trace(trace: Trace, header_path: str | Path, data_path: str | Path, *,
                blis_compatible: bool = False) -> None:
    """Write both files. ``blis_compatible=True`` leaves out the ``pytest_blis`` header block."""
    write_trace_data(trace.records, data_path, mode=trace.header.mode)
    write_trace_header(trace.header, header_path, blis_compatible=blis_compatible)


# --------------------------------------------------------------------------------------------- ITL


class ITLRecord(StrictModel):
    """One SSE chunk of one request (``observe --record-itl``): epoch µs."""

    request_id: int
    chunk_index: int = Field(ge=0)
    timestamp_us: int


ITL_COLUMNS: tuple[str, ...] = ("request_id", "chunk_index", "timestamp_us")


def default_itl_path(data_path: str | Path) -> Path:
    """``<trace-data minus .csv>.itl.csv`` (the reference's default)."""
    s = str(data_path)
    return Path((s[:-4] if s.endswith(".csv") else s) + ".itl.csv")


def read_itl(path: str | Path) -> list[ITLRecord]:
    p = Path(path)
    file = str(p)
    rows = _rows(p)
    try:
        _, header = next(rows)
    except StopIteration:
        raise FormatError("reading CSV header: EOF (the file has no header row)", file=file, line=1) from None
    if tuple(header[:3]) != ITL_COLUMNS:
        raise FormatError(f"expected the header row {','.join(ITL_COLUMNS)}, got {','.join(header)}",
                          file=file, line=1)
    out: list[ITLRecord] = []
    for line, row in rows:
        if len(row) < 3:
            raise FormatError(f"CSV row has {len(row)} columns, expected at least 3", file=file, line=line)
        vals = []
        for col, raw in zip(ITL_COLUMNS, row):
            v = _go.parse_int(raw)
            if v is None:
                raise FormatError(f"parsing {col} {_quote(raw)}: invalid syntax", file=file, line=line, field=col)
            vals.append(v)
        if vals[1] < 0:
            raise FormatError(f"parsing chunk_index: negative value {vals[1]} not allowed", file=file,
                              line=line, field="chunk_index")
        out.append(ITLRecord.model_construct(request_id=vals[0], chunk_index=vals[1], timestamp_us=vals[2]))
    return out


def write_itl(records: Iterable[ITLRecord], path: str | Path) -> None:
    parts = [_go.csv_line(list(ITL_COLUMNS))]
    parts.extend(_go.csv_line([str(r.request_id), str(r.chunk_index), str(r.timestamp_us)]) for r in records)
    atomic_write(path, "".join(parts))


def itl_by_request(records: Iterable[ITLRecord]) -> dict[int, list[int]]:
    """Chunk timestamps per request, ordered by chunk index."""
    grouped: dict[int, list[tuple[int, int]]] = {}
    for r in records:
        grouped.setdefault(r.request_id, []).append((r.chunk_index, r.timestamp_us))
    return {rid: [t for _, t in sorted(chunks)] for rid, chunks in grouped.items()}

