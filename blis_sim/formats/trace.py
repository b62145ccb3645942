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

- :class:`TraceHeader` — every key of the reference header (docs/reference-formats.md §1.1) in its order:
  ``trace_version, time_unit, created_at, mode, warm_up_requests, workload_seed, workload_spec,
  session_context_growth, server`` (:class:`TraceServerConfig`), ``network`` (:class:`TraceNetworkConfig`),
  ``goodput_slo_targets`` ({class: :class:`SLOTargets`}), ``kv_offload`` (:class:`TraceKVOffloadConfig`),
  ``observed_kv_metrics`` (:class:`ObservedKVMetrics`; both: docs/reference-formats.md §1.2–§1.3), then OUR block
  ``pytest_blis``
  (:class:`PytestBlisHeader`: tool/vLLM versions, KV geometry, per-definition ``kv_hit_rates``, per-tier I/O,
  scrape info, phases, partial flag, offload extensions, latency model). ``blis_compatible=True`` leaves our
  block out so BLIS can read the file back.
- :class:`TraceRecord` — one CSV row: the 27 base columns, the optional ``vllm_priority`` and
  ``slo_target_us`` (inserted positionally), the reference's trailing ``x_request_id``, ``adapter``,
  ``think_time_us``, and OUR trailing columns ``phase``, ``warmup``, ``cached_tokens`` (-1 = not reported),
  ``first_byte_time_us``, ``first_content_time_us`` (0 = unknown). Properties ``ttft_us`` / ``e2e_us`` =
  first / last chunk time − send time (client side, include the network).

The pieces live in :mod:`~blis_sim.formats.trace_header`, :mod:`~blis_sim.formats.trace_data` and
:mod:`~blis_sim.formats.itl`; this module re-exports them. Reading follows the reference
(docs/reference-formats.md §1.4): positional base columns shifted by the inline optional columns found in the
header row, trailing columns by header name, extra columns tolerated, Go ``ParseBool`` forms, the reference's
range checks. Any problem is a :class:`~blis_sim.errors.FormatError` naming file, line and column.
Writing follows Go: yaml.v3 layout (4-space indent, ``hit_rate: 0`` explicit, absent blocks absent),
``encoding/csv`` minimal quoting with ``\\n`` line ends; an optional column is written only when some record
carries it. Files are written atomically (temp file + rename), so an interrupted run never leaves half a file.
"""
from __future__ import annotations

from pathlib import Path

from blis_sim.formats._io import atomic_write, atomic_write_files
from blis_sim.formats._model import StrictModel
from blis_sim.formats.itl import ITL_COLUMNS, ITLRecord, default_itl_path, itl_by_request, read_itl, write_itl
from blis_sim.formats.trace_columns import ColumnarTrace, read_trace_data
from blis_sim.formats.trace_data import (
    BASE_COLUMNS,
    OUR_TRAILING,
    REFERENCE_TRAILING,
    TraceRecord,
    columns_for,
    data_chunks,
    data_text,
    write_trace_data,
)
from blis_sim.formats.trace_header import (
    SOURCE_GPU_FALLBACK,
    SOURCE_TIERED,
    Fault,
    KVGeometry,
    LatencyModelInfo,
    ObservedKVMetrics,
    OffloadExtensions,
    PhaseInfo,
    PytestBlisHeader,
    ScrapeInfo,
    SLOTargets,
    TierIO,
    TraceHeader,
    TraceKVOffloadConfig,
    TraceNetworkConfig,
    TraceServerConfig,
    TraceTierConfig,
    header_text,
    read_trace_header,
    write_trace_header,
)


class Trace(StrictModel):
    """A whole trace: header + records (in file order, i.e. completion order for observe traces)."""

    header: TraceHeader
    records: list[TraceRecord]


def load_trace(header_path: str | Path, data_path: str | Path) -> Trace:
    """Both files of a trace."""
    return Trace.model_construct(header=read_trace_header(header_path), records=read_trace_data(data_path))


def write_trace(trace: Trace | ColumnarTrace, header_path: str | Path, data_path: str | Path, *,
                blis_compatible: bool = False) -> None:
    """Write both files. ``blis_compatible=True`` leaves out the ``pytest_blis`` header block.

    Both are written to temp files before either is renamed: a failure (a full disk) leaves neither file
    changed, never a new header beside an old or missing data file."""
    data = getattr(trace, "data", None)  # a ColumnarTrace's columns, written as they are
    rows = data if data is not None else trace.records
    atomic_write_files([(data_path, data_chunks(rows, mode=trace.header.mode)),
                        (header_path, header_text(trace.header, blis_compatible=blis_compatible))])


__all__ = [
    "BASE_COLUMNS", "ITL_COLUMNS", "OUR_TRAILING", "REFERENCE_TRAILING", "SOURCE_GPU_FALLBACK", "SOURCE_TIERED",
    "Fault", "ITLRecord", "KVGeometry", "LatencyModelInfo", "ObservedKVMetrics", "OffloadExtensions", "PhaseInfo",
    "PytestBlisHeader", "ScrapeInfo", "SLOTargets", "TierIO", "Trace", "TraceHeader", "TraceKVOffloadConfig",
    "TraceNetworkConfig", "TraceRecord", "TraceServerConfig", "TraceTierConfig", "atomic_write", "columns_for",
    "data_text", "default_itl_path", "header_text", "itl_by_request", "load_trace", "read_itl", "read_trace_data",
    "read_trace_header", "write_itl", "write_trace", "write_trace_data", "write_trace_header",
]
