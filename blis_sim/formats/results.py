"""Simulator outputs: per-request SimResult JSON and the aggregate MetricsOutput JSON (docs/reference-formats.md §4.6).

API::

    cols = read_sim_columns("sim.json")             # -> Columns of SimResult (sorted by request_id when written)
    results = load_sim_results("sim.json")          # -> list[SimResult]: the same rows as objects
    metrics = load_metrics_output("simagg.json")    # -> MetricsOutput
    write_sim_results(results, "sim.json")          # sorts by request_id; [] when empty, never null
    write_metrics_output(metrics, "simagg.json")
    sim_results_text(results) / metrics_output_text(metrics) -> str

    # the simulator's outputs as columns (one numpy array per field, no object per request)
    cols = Columns(SimResult, n, {"request_id": ids, "ttft_us": ttft, ..., "slo_class": "",
                                  "cached_tokens_by_source": IntMapColumn(("device", ...), counts)})
    write_sim_results(cols, "sim.json")             # sorted by request_id like the list
    write_metrics_output(metrics, "simagg.json", requests=Columns(RequestMetrics, n, {...}))
    columns_json(cols) / cols.records() / cols.take(rows) / Columns.from_records(SimResult, results)

A :class:`Columns` holds one numpy array (or a list of values, :class:`IntMapColumn`, or one shared
scalar) per field. Per-request rows are always written from columns (a list of objects is turned
into its columns first): a chunk of :data:`CHUNK_ROWS` rows at a time, each column formatted at once
(:func:`~blis_sim.formats._go.json_floats` / ``json_ints``: orjson's shortest digits laid out in Go's
format), the fields every row writes the same way folded into text, one join per chunk. Single
objects (the aggregate, its hit-rates, provenance) are laid out by ``to_go`` and :func:`go_json`.

Both are written like Go's ``json.MarshalIndent(v, "", "  ")``: 2-space indent, keys in the reference's
order, ``omitempty`` fields dropped when zero, floats in Go's format (``32984``, not ``32984.0``), ``<>&``
escaped as ``\\u003c`` etc., no trailing newline. Reading is strict: unknown keys, duplicate keys, wrong types
(``"1"`` for a number, ``1.5`` for an integer), NaN/Infinity, out-of-range values → FormatError naming the file,
the line and the field path (``sim.json:28: field '[3].ttft_us': ...``).

Our additions (extra JSON fields; BLIS ignores unknown JSON fields):

- :class:`SimResult`: ``cached_tokens`` (prompt tokens served from any cache) and ``cached_tokens_by_source``
  (``{"device": n, "host": n, "disk": n}``), written only when set.
- :class:`MetricsOutput`: ``kv_hit_rates`` — the simulated per-definition hit-rates
  (:class:`~blis_sim.formats.hitrate.KVHitRate`), ``tier_io`` (each offload tier's simulated transfer
  bytes, station service seconds and jobs over the window, the trace header's ``TierIO`` shape), and
  ``provenance`` (:class:`SimProvenance`: tool version, latency model and coefficients, seed, KV geometry,
  resolved offload config, where each setting came from; design D7),
  each written only when set. SimResult JSON is a bare list, so it has no room for provenance: the
  MetricsOutput written beside it, and the trace header of ``--trace-output``, carry it.
"""

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from blis_sim.errors import FormatError
from blis_sim.formats import _go
from blis_sim.formats._io import atomic_write_chunks
from blis_sim.formats._json import NotStreamable, located as _located, parse_json as _parse, stream_array, stream_object
from blis_sim.formats._model import StrictModel, _is_zero, to_go
from blis_sim.formats._strict import read_text
from blis_sim.formats.hitrate import KVHitRate
from blis_sim.formats.trace_header import KVGeometry, LatencyModelInfo, SettingSource, TierIO, TraceKVOffloadConfig

_Float = Field(default=0.0, allow_inf_nan=False)


_INT64_MAX = 2**63 - 1  # the reference's Go int64: a larger count or id is not a SimResult


class SimResult(StrictModel):
    """One completed request of a replay (µs, measured from injection)."""

    request_id: int = Field(ge=-_INT64_MAX - 1, le=_INT64_MAX)
    ttft_us: float = Field(ge=0.0, allow_inf_nan=False)
    e2e_us: float = Field(ge=0.0, allow_inf_nan=False)
    input_tokens: int = Field(ge=0, le=_INT64_MAX)
    output_tokens: int = Field(ge=0, le=_INT64_MAX)
    slo_class: str = ""
    model: str = ""
    itl_mean_us: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    # ours
    cached_tokens: int | None = Field(default=None, ge=0, le=_INT64_MAX)
    cached_tokens_by_source: dict[str, int] | None = None
    instance_id: str = ""  # the cluster replica that served it (``instance_<i>``; docs/cluster.md §4)

    _omitempty: ClassVar[frozenset[str]] = frozenset({"slo_class", "model", "itl_mean_us", "instance_id"})


class RequestMetrics(StrictModel):
    """One entry of ``MetricsOutput.requests`` (ms and s, as the reference writes them)."""

    arrived_at: float = Field(allow_inf_nan=False)
    request_id: str = Field(alias="requestID")
    num_prefill_tokens: int = Field(ge=0)
    num_decode_tokens: int = Field(ge=0)
    ttft_ms: float = _Float
    itl_ms: float = _Float
    e2e_ms: float = _Float
    scheduling_delay_ms: float = _Float
    slo_class: str = ""
    tenant_id: str = ""
    handled_by: str = ""
    model: str = ""
    adapter: str = ""
    length_capped: bool = False
    gateway_queue_delay_ms: float = _Float
    session_id: str = ""
    round_index: int = 0

    _omitempty: ClassVar[frozenset[str]] = frozenset(
        {"slo_class", "tenant_id", "handled_by", "model", "adapter", "length_capped", "gateway_queue_delay_ms",
         "session_id"})


class AdapterMetrics(StrictModel):
    """Per-LoRA-adapter aggregate (``MetricsOutput.adapters``)."""

    load_count: int = 0
    eviction_count: int = 0
    ttft_p50_us: float = _Float
    ttft_p99_us: float = _Float
    throughput_tok_per_s: float = _Float


class SimProvenance(StrictModel):
    """What produced a MetricsOutput (design D7; ours): tool version, latency model with its
    coefficients and source, seed, KV geometry and the resolved offload config."""

    tool_version: str = ""
    latency_model: LatencyModelInfo | None = None
    seed: int = 0
    kv_geometry: KVGeometry | None = None
    kv_offload: TraceKVOffloadConfig | None = None
    settings: dict[str, SettingSource] = Field(default_factory=dict)  # where each setting came from

    _omitempty: ClassVar[frozenset[str]] = frozenset({"settings"})


class MetricsOutput(StrictModel):
    """The cluster aggregate of a replay (``--metrics-path``), keys in the reference's order."""

    instance_id: str = "cluster"
    completed_requests: int = Field(default=0, ge=0)
    still_queued: int = Field(default=0, ge=0)
    still_running: int = Field(default=0, ge=0)
    injected_requests: int = Field(default=0, ge=0)
    total_input_tokens: int = Field(default=0, ge=0)
    total_output_tokens: int = Field(default=0, ge=0)
    vllm_estimated_duration_s: float = _Float
    responses_per_sec: float = _Float
    tokens_per_sec: float = _Float
    e2e_mean_ms: float = _Float
    e2e_p90_ms: float = _Float
    e2e_p95_ms: float = _Float
    e2e_p99_ms: float = _Float
    ttft_mean_ms: float = _Float
    ttft_p90_ms: float = _Float
    ttft_p95_ms: float = _Float
    ttft_p99_ms: float = _Float
    itl_mean_ms: float = _Float
    itl_p90_ms: float = _Float
    itl_p95_ms: float = _Float
    itl_p99_ms: float = _Float
    scheduling_delay_p99_ms: float = _Float
    kv_allocation_failures: int = Field(default=0, ge=0)
    preemption_count: int = Field(default=0, ge=0)
    cache_hit_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    dropped_unservable: int = Field(default=0, ge=0)
    length_capped_requests: int = Field(default=0, ge=0)
    timed_out_requests: int = Field(default=0, ge=0)
    requests: list[RequestMetrics] = Field(default_factory=list)
    # The reference types these as interface{} (opaque JSON): kept verbatim.
    saturation: Any = None
    goodput_rps: float = _Float
    slo_attainment: float = _Float
    per_class: Any = None
    adapters: dict[str, AdapterMetrics] = Field(default_factory=dict)
    # ours
    kv_hit_rates: list[KVHitRate] | None = None
    tier_io: list[TierIO] | None = None  # per offload tier over the window: bytes, station seconds, jobs
    provenance: SimProvenance | None = None
    instances: list["MetricsOutput"] | None = None  # a cluster: one aggregate per replica (docs/cluster.md §4)

    _omitempty: ClassVar[frozenset[str]] = frozenset(
        {"kv_allocation_failures", "requests", "goodput_rps", "slo_attainment", "adapters"})


MetricsOutput.model_rebuild()


# --------------------------------------------------------------------------------------------- JSON I/O


def read_sim_columns(path: str | Path) -> "Columns":
    """Read a SimResult array (``replay --results-path``) as :class:`Columns`: the file a block of
    text at a time, each row validated (strict), its values put in one array per field; no object
    per row is kept, nor the whole text. A file the streaming pass does not take (bad JSON, a bad
    row) is read whole to report the first problem located (file, line, field)."""
    acc = _SimAccumulator()
    validate = SimResult.model_validate
    try:
        rows: list[dict[str, Any]] = []
        for block in stream_array(path):
            rows += [validate(item).__dict__ for item in block]
            if len(rows) >= CHUNK_ROWS:
                acc.add(rows)
                rows = []
        acc.add(rows)
    except (NotStreamable, ValidationError):
        _sim_error(path)
    return acc.finish()


def _sim_error(path: str | Path) -> None:
    """The first problem of a SimResult file, located, read whole (the streaming pass met one)."""
    file = str(path)
    text = read_text(path)
    data = _parse(text, file)
    if not isinstance(data, list):
        raise FormatError(f"expected a JSON array of sim results, got {type(data).__name__}", file=file, line=1)
    for i, item in enumerate(data):
        try:
            SimResult.model_validate(item)
        except ValidationError as exc:
            raise _located(exc, (i,), text, file) from None
    raise FormatError("unreadable sim results", file=file)  # the streaming pass and this one disagree


_SIM_DTYPES = {"request_id": np.int64, "ttft_us": np.float64, "e2e_us": np.float64, "input_tokens": np.int64,
               "output_tokens": np.int64, "itl_mean_us": np.float64, "cached_tokens": np.int64}
_MIXED = object()  # a field whose rows do not all hold one value


class _SimAccumulator:
    """Chunks of validated rows joined into SimResult columns: numbers into int64/float64 arrays
    grown in place, a field every row holds the same value of as that value, any other field
    (strings, maps, counts some rows lack) as its per-row values, strings shared."""

    def __init__(self) -> None:
        self.n = 0
        self.arrays: dict[str, np.ndarray] = {}
        self.const: dict[str, Any] = {}
        self.lists: dict[str, list[Any]] = {}
        self.maps: dict[str, tuple[tuple[str, ...], list[np.ndarray]]] = {}  # keys, blocks of rows
        self.shared: dict[str, str] = {}

    def add(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        start, stop = self.n, self.n + len(rows)
        for name in SimResult.model_fields:
            values = [r[name] for r in rows]
            dtype = _SIM_DTYPES.get(name)
            if dtype is not None and (name in self.arrays or not start) and None not in values:
                buf = self.arrays.get(name)
                if buf is None:
                    buf = self.arrays[name] = np.empty(max(stop, 4 * CHUNK_ROWS), dtype=dtype)
                elif buf.shape[0] < stop:
                    buf.resize(max(stop, 2 * buf.shape[0]), refcheck=False)
                buf[start:stop] = values
                continue
            if name in self.arrays:  # a count some rows lack: per-row values from here
                self.lists[name] = self.arrays.pop(name)[:start].tolist()
            self._add_values(name, values, start)
        self.n = stop

    def _add_values(self, name: str, values: list[Any], start: int) -> None:
        if name not in self.lists and name not in self.maps:
            first = self.const.get(name, values[0]) if start else values[0]
            if all(type(v) is type(first) and v == first for v in values):
                self.const[name] = first
                return
        if name not in self.lists and self._add_map(name, values, start):
            return
        if name not in self.lists:
            self.lists[name] = self._rows_so_far(name, start)
        if all(type(v) is str for v in values):
            values = list(map(self.shared.setdefault, values, values))
        self.lists[name] += values

    def _add_map(self, name: str, values: list[Any], start: int) -> bool:
        """Maps with the same keys in every row so far: a row of counts each (False: they are not)."""
        if not all(isinstance(v, dict) for v in values):
            return False
        keys = tuple(sorted(values[0]))
        if any(tuple(sorted(v)) != keys for v in values):
            return False
        if name not in self.maps:
            first = self.const.get(name) if start else {}
            if not isinstance(first, dict) or (start and tuple(sorted(first)) != keys):
                return False
            self.const.pop(name, None)
            head = np.tile(np.asarray([first[k] for k in keys], dtype=np.int64), (start, 1)) if start else None
            self.maps[name] = (keys, [] if head is None else [head])
        elif self.maps[name][0] != keys:
            return False
        self.maps[name][1].append(np.asarray([[v[k] for k in keys] for v in values], dtype=np.int64))
        return True

    def _rows_so_far(self, name: str, start: int) -> list[Any]:
        if name in self.maps:
            keys, blocks = self.maps.pop(name)
            return [dict(zip(keys, row)) for block in blocks for row in block.tolist()]
        return [self.const.pop(name)] * start if start else []

    def finish(self) -> "Columns":
        data: dict[str, Any] = {}
        for name, f in SimResult.model_fields.items():
            if name in self.arrays:
                buf = self.arrays[name]
                buf.resize(self.n, refcheck=False)
                data[name] = buf
            elif name in self.maps:
                keys, blocks = self.maps[name]
                data[name] = IntMapColumn(keys, np.concatenate(blocks))
            elif name in self.lists:
                data[name] = self.lists[name]
            elif name in self.const:
                data[name] = self.const[name]
            elif f.is_required():
                data[name] = np.zeros(0, dtype=_SIM_DTYPES[name])
        return Columns(SimResult, self.n, data)


def load_sim_results(path: str | Path) -> list[SimResult]:
    """:func:`read_sim_columns`'s rows as SimResult objects."""
    return read_sim_columns(path).records()


def load_metrics_output(path: str | Path, *, requests: bool = True) -> MetricsOutput:
    """Read an aggregate MetricsOutput (``replay --metrics-path``). ``requests=False``: the
    per-request rows are left out, unread (a reader of the aggregates only: ``calibrate``, whose
    input from a 1M-request replay would otherwise hold a million row objects)."""
    file = str(path)
    if not requests:  # the rows streamed past, never held (a 10M-request file is gigabytes of them)
        try:
            return MetricsOutput.model_validate(stream_object(path, skip="requests"))
        except (NotStreamable, ValidationError):
            pass  # read whole below, for the located error
    text = read_text(path)
    data = _parse(text, file)
    if not isinstance(data, dict):
        raise FormatError(f"expected a JSON object (MetricsOutput), got {type(data).__name__}", file=file, line=1)
    if not requests:
        data.pop("requests", None)
    try:
        return MetricsOutput.model_validate(data)
    except ValidationError as exc:
        raise _located(exc, (), text, file) from None


# --------------------------------------------------------------------------------------------- writing


_PLAIN_JSON = re.compile(r"[ !#-%'-;=?-\[\]-~]*\Z")  # printable ASCII without " \\ < > &


def _escape(s: str) -> str:
    if _PLAIN_JSON.match(s):
        return '"' + s + '"'
    # Go's encoding/json escapes HTML-sensitive characters and the JS line separators.
    out = json.dumps(s, ensure_ascii=False)
    return (out.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _float(f: float) -> str:
    # Fast path: in [1e-4, 1e16) Python's repr is fixed-point with the shortest digits, like Go's 'f' -1.
    a = abs(f)
    if 1e-4 <= a < 1e16:
        r = repr(f)
        return r[:-2] if r.endswith(".0") else r
    return _go.json_float(f)


def go_json(value: Any, indent: str = "") -> str:
    """``json.MarshalIndent(v, "", "  ")`` layout of plain data (dicts in their given order, as ``to_go``
    builds them) or of a model (laid out by ``to_go`` first)."""
    t = type(value)
    if t is str:
        return _escape(value)
    if t is float:
        return _float(value)
    if t is bool:
        return "true" if value else "false"
    if t is int:
        return str(value)
    if value is None:
        return "null"
    if isinstance(value, BaseModel):
        return go_json(to_go(value), indent)
    inner = indent + "  "
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{_escape(str(k))}: {go_json(v, inner)}" for k, v in value.items()]
        return _bracketed("{\n", items, "\n" + indent + "}")
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        return _bracketed("[\n", [inner + go_json(v, inner) for v in value], "\n" + indent + "]")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        return _escape(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def _omitted(v: Any, omitempty: bool, keep_none: bool) -> bool:
    """Whether a field holding ``v`` is left out (a nil pointer, or Go's ``omitempty`` of a zero value)."""
    return (v is None and not keep_none) or (omitempty and _is_zero(v))


def _fields(cls: type[StrictModel]) -> list[tuple[str, str, bool, bool]]:
    """(attribute, quoted JSON key, omitempty, keep_none) per field, in declaration order."""
    return [(name, _escape(f.alias or name), name in cls._omitempty, name in cls._keep_none)
            for name, f in cls.model_fields.items()]


def _bracketed(head: str, items: list[str], tail: str) -> str:
    """``head + ",\\n".join(items) + tail`` (``items`` not empty) built by one join: with 50k
    requests the text is tens of MB, and each concatenation would hold another copy at once."""
    parts = [head]
    for it in items:
        parts.append(it)
        parts.append(",\n")
    parts[-1] = tail
    return "".join(parts)


# --------------------------------------------------------------------------------------------- columnar rows


class IntMapColumn(NamedTuple):
    """A Go ``map[string]int`` field per row: ``values[i, j]`` is row i's value for ``keys[j]``."""

    keys: tuple[str, ...]
    values: np.ndarray  # (n, len(keys)) integers


@dataclass(frozen=True)
class Columns:
    """Rows of one model class held column by column (the simulator's outputs are numpy arrays).

    ``data`` maps a field name to a 1-D numpy array (one value per row; float, integer or bool), a
    list of ``str``, an :class:`IntMapColumn`, or one scalar (``str``/``int``/``float``/``bool``/``None``)
    or dict shared by every row. A field left out takes its default. Values are not validated: the
    columns come from our own code, as the objects of :meth:`records` would (built without pydantic).
    """

    cls: type[StrictModel]
    n: int
    data: Mapping[str, Any]

    def __post_init__(self) -> None:
        missing = [name for name, f in self.cls.model_fields.items() if f.is_required() and name not in self.data]
        if missing:
            raise ValueError(f"{self.cls.__name__} columns need {', '.join(missing)} (no default)")
        for name, col in self.data.items():
            if name not in self.cls.model_fields:
                raise ValueError(f"{self.cls.__name__} has no field {name!r}")
            size = _column_size(col)
            if size is not None and size != self.n:
                raise ValueError(f"column {name!r} has {size} rows, expected {self.n}")

    def column(self, name: str) -> Any:
        if name in self.data:
            return self.data[name]
        return self.cls.model_fields[name].get_default(call_default_factory=True)

    def take(self, rows: np.ndarray | slice) -> "Columns":
        """The rows selected by an index array or a slice, in that order."""
        data: dict[str, Any] = {}
        for name, col in self.data.items():
            if isinstance(col, np.ndarray):
                data[name] = col[rows]
            elif isinstance(col, IntMapColumn):
                data[name] = IntMapColumn(col.keys, col.values[rows])
            elif isinstance(col, (list, tuple)):
                data[name] = col[rows] if isinstance(rows, slice) else [col[i] for i in rows.tolist()]
            else:
                data[name] = col
        n = len(range(*rows.indices(self.n))) if isinstance(rows, slice) else len(rows)
        return Columns(self.cls, n, data)

    def records(self) -> list[Any]:
        """One model object per row (what the JSON readers would give back for the written text)."""
        names = list(self.cls.model_fields)
        per_field: list[Any] = []
        for name in names:
            col = self.column(name)
            if isinstance(col, np.ndarray):
                per_field.append(col.tolist())
            elif isinstance(col, IntMapColumn):
                keys = col.keys
                per_field.append([dict(zip(keys, row)) for row in col.values.tolist()])
            elif isinstance(col, (list, tuple)):
                per_field.append(col)
            else:
                per_field.append(repeat(col, self.n))
        make = self.cls.model_construct  # our own values: validated where they were made
        every = set(names)  # every row sets every field: one set of names for all (as TraceColumns.records)
        return [make(every, **dict(zip(names, row))) for row in zip(*per_field)]

    @classmethod
    def from_records(cls, model: type[StrictModel], records: Sequence[Any]) -> "Columns":
        """Model objects as columns (each field a list of the objects' values)."""
        return cls(model, len(records), {name: [getattr(r, name) for r in records] for name in model.model_fields})


@dataclass(frozen=True)
class ColumnChunks:
    """Rows of one model class made a chunk at a time, in the order they are written:
    ``make(start, stop)`` gives the :class:`Columns` of rows ``[start, stop)``. What a writer of
    millions of rows takes, so that only one chunk's columns exist at once."""

    cls: type[StrictModel]
    n: int
    make: Callable[[int, int], Columns]

    def chunks(self) -> Iterator[Columns]:
        for start in range(0, self.n, CHUNK_ROWS):
            yield self.make(start, min(self.n, start + CHUNK_ROWS))

    def records(self) -> list[Any]:
        return [r for chunk in self.chunks() for r in chunk.records()]


def _column_size(col: Any) -> int | None:
    if isinstance(col, np.ndarray):
        if col.ndim != 1:
            raise ValueError(f"a column must be 1-D, got shape {col.shape}")
        return int(col.shape[0])
    if isinstance(col, IntMapColumn):
        if col.values.ndim != 2 or col.values.shape[1] != len(col.keys):
            raise ValueError(f"an int map column needs ({len(col.keys)} keys) columns, got {col.values.shape}")
        return int(col.values.shape[0])
    if isinstance(col, (list, tuple)):
        return len(col)
    return None


# Rows are formatted this many at a time: the per-column strings of one chunk are alive at once,
# never those of the whole file.
CHUNK_ROWS = 8192


def _field_line(v: Any, key: str, omitempty: bool, keep_none: bool, inner: str) -> str | None:
    """One field's ``key: value`` line (None: the field is omitted)."""
    if _omitted(v, omitempty, keep_none):
        return None
    return f"{inner}{key}: {go_json(to_go(v), inner)}"


def _string_cells(values: Sequence[str]) -> tuple[list[str], bool]:
    """(cells, quoted): the values themselves when none needs escaping (the template adds the quotes),
    else each one escaped and quoted."""
    joined = "".join(values)
    if _PLAIN_JSON.match(joined):
        return list(values), False
    cache: dict[str, str] = {}
    return [cache[v] if v in cache else cache.setdefault(v, _escape(v)) for v in values], True


def _rows_text(cols: Columns | ColumnChunks, indent: str) -> Iterator[str]:
    """The rows as JSON objects (``indent`` before each, ``json.MarshalIndent`` layout inside), one
    string per chunk of rows, rows joined by ``,\\n`` within a chunk (the caller joins the chunks)."""
    if isinstance(cols, ColumnChunks):
        for chunk in cols.chunks():
            yield _chunk_text(chunk, indent)
        return
    for start in range(0, cols.n, CHUNK_ROWS):
        yield _chunk_text(cols.take(slice(start, min(cols.n, start + CHUNK_ROWS))), indent)


# One field of a chunk's rows: its parts in order, each either text every row writes (str) or one
# string per row (list), and whether every row writes it. The first part starts with ",\n" + indent.
_Piece = tuple[list[Any], bool] | None


def _field_piece(col: Any, key: str, omitempty: bool, keep_none: bool, inner: str) -> _Piece:
    head = f",\n{inner}{key}: "
    if isinstance(col, IntMapColumn):
        if not col.keys:
            col = {}  # written as a constant below
        else:
            inner2 = inner + "  "
            parts: list[Any] = [head + "{"]
            for j in sorted(range(len(col.keys)), key=lambda j: col.keys[j]):  # Go maps: sorted keys
                parts += [f"{',' if len(parts) > 1 else ''}\n{inner2}{_escape(col.keys[j])}: ",
                          _go.json_ints(col.values[:, j])]
            return parts + ["\n" + inner + "}"], True
    if isinstance(col, np.ndarray):
        cells = _go.json_floats(col) if col.dtype.kind == "f" else _go.json_ints(col)
        empty = (col == 0).tolist() if omitempty else None
        close = ""
    elif isinstance(col, (list, tuple)) and all(type(v) is str for v in col):
        cells, quoted = _string_cells(col)
        empty = [not v for v in col] if omitempty else None
        head, close = (head, "") if quoted else (head + '"', '"')
    elif isinstance(col, (list, tuple)):  # any other values, each laid out on its own
        cells = [go_json(to_go(v), inner) for v in col]
        empty = [_omitted(v, omitempty, keep_none) for v in col]
        close = ""
    else:
        text = _field_line(col, key, omitempty, keep_none, inner)
        return None if text is None else ([",\n" + text], True)
    if empty is None or not any(empty):
        return [head, cells, close], True
    if all(empty):
        return None
    # some rows omit the field: one fragment per row, "" where omitted
    frags = list(map((head.replace("%", "%%") + "%s" + close).__mod__, cells))
    for i in np.flatnonzero(empty).tolist():
        frags[i] = ""
    return [frags], False


def _chunk_text(cols: Columns, indent: str) -> str:
    """One chunk of rows, joined by ``,\\n``. Each row is the same sequence of items — text every
    row shares, or that row's string of a column — so the whole chunk is one list, filled a column
    at a time with slice assignments, and one join (no per-row formatting in Python)."""
    inner = indent + "  "
    pieces = [p for name, key, omitempty, keep_none in _fields(cols.cls)
              if (p := _field_piece(cols.column(name), key, omitempty, keep_none, inner)) is not None]
    n = cols.n
    if not pieces:  # every field omitted in every row
        return ",\n".join([indent + "{}"] * n)
    if not pieces[0][1]:  # the first field's leading "," cannot be dropped once for all rows
        return ",\n".join(indent + go_json(r, indent) for r in cols.records())
    first = pieces[0][0]
    parts = [indent + "{\n" + first[0][2:]] + first[1:]  # the first field has no leading ","
    parts += [part for p in pieces[1:] for part in p[0]] + ["\n" + indent + "}"]
    items: list[Any] = []
    for part in parts:  # adjacent texts merged
        if isinstance(part, str) and items and isinstance(items[-1], str):
            items[-1] += part
        else:
            items.append(part)
    stride = len(items)
    flat: list[str] = [""] * (n * stride)
    for j, item in enumerate(items):
        if isinstance(item, str):
            flat[j::stride] = [item + ",\n"] * n if j == stride - 1 else [item] * n
        else:
            flat[j::stride] = item
    flat[-1] = items[-1]  # no separator after the chunk's last row
    return "".join(flat)


def _array_chunks(cols: Columns | ColumnChunks, indent: str = "") -> Iterator[str]:
    """``go_json(cols.records(), indent)`` as successive pieces of text."""
    if cols.n == 0:
        yield "[]"
        return
    yield "[\n"
    sep = ""
    for text in _rows_text(cols, indent + "  "):
        yield sep
        yield text
        sep = ",\n"
    yield "\n" + indent + "]"


def _sorted_by_id(cols: Columns | ColumnChunks) -> Columns | ColumnChunks:
    """SimResult columns in request-id order (stable, as the list writer sorts); chunks are made
    in that order by their maker."""
    if cols.cls is not SimResult:
        raise TypeError(f"sim result columns must be of SimResult, not {cols.cls.__name__}")
    if isinstance(cols, ColumnChunks):
        return cols
    rid = cols.column("request_id")
    if isinstance(rid, np.ndarray):
        if rid.size < 2 or bool(np.all(rid[1:] >= rid[:-1])):
            return cols
        return cols.take(np.argsort(rid, kind="stable"))
    order = sorted(range(cols.n), key=lambda i: rid[i])
    return cols.take(np.asarray(order, dtype=np.int64))


def _metrics_chunks(metrics: MetricsOutput, requests: Columns | ColumnChunks | None) -> Iterator[str]:
    if requests is None:
        yield go_json(metrics)
        return
    if requests.cls is not RequestMetrics:
        raise TypeError(f"request columns must be of RequestMetrics, not {requests.cls.__name__}")
    if metrics.requests:
        raise ValueError("pass the requests either in the MetricsOutput or as columns, not both")
    names = list(MetricsOutput.model_fields)
    later = {MetricsOutput.model_fields[n].alias or n for n in names[names.index("requests") + 1:]}
    found = requests.n > 0  # "requests" is omitempty
    before: list[str] = []
    after: list[str] = []
    for key, value in to_go(metrics).items():
        (after if key in later else before).append(f"  {_escape(key)}: {go_json(value, '  ')}")
    if not found:
        yield go_json(metrics)
        return
    yield "{\n" + "".join(t + ",\n" for t in before) + '  "requests": '
    yield from _array_chunks(requests, "  ")
    yield "".join(",\n" + t for t in after) + "\n}"


def columns_json(cols: Columns, indent: str = "") -> str:
    """``go_json(cols.records(), indent)`` without the objects: the rows as a JSON array."""
    return "".join(_array_chunks(cols, indent))


def _as_columns(results: Sequence[SimResult] | Columns | ColumnChunks) -> Columns | ColumnChunks:
    if isinstance(results, (Columns, ColumnChunks)):
        return results
    return Columns.from_records(SimResult, results)


def sim_results_text(results: Sequence[SimResult] | Columns) -> str:
    return "".join(_array_chunks(_sorted_by_id(_as_columns(results))))


def metrics_output_text(metrics: MetricsOutput, requests: Columns | None = None) -> str:
    """``requests``: the per-request entries as :class:`Columns` of :class:`RequestMetrics` (then
    ``metrics.requests`` must be empty); written where the ``requests`` field goes."""
    return "".join(_metrics_chunks(metrics, requests))


def write_sim_results(results: Sequence[SimResult] | Columns | ColumnChunks, path: str | Path) -> None:
    """Sorted by request id (stable); objects are written as their columns."""
    atomic_write_chunks(path, _array_chunks(_sorted_by_id(_as_columns(results))))


def write_metrics_output(metrics: MetricsOutput, path: str | Path,
                         requests: Columns | ColumnChunks | None = None) -> None:
    """``requests``: as in :func:`metrics_output_text` (the big part, written chunk by chunk)."""
    atomic_write_chunks(path, _metrics_chunks(metrics, requests))
