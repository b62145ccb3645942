"""BLIS-compatible file formats (design D1): strict pydantic models with readers and writers.

- :mod:`blis_sim.formats.trace` — TraceV2 header YAML + data CSV + ITL CSV.
- :mod:`blis_sim.formats.offload` — the offload config YAML → resolved :class:`OffloadConfig`.
- :mod:`blis_sim.formats.results` — SimResult JSON and MetricsOutput JSON.
- :mod:`blis_sim.formats.workload` — the workload spec YAML (reference v2 + our ``phases``).
- :mod:`blis_sim.formats.report` — the calibration report JSON.
- :mod:`blis_sim.formats.hitrate` — the per-definition hit-rate entry shared by trace header and MetricsOutput.

Every reader raises :class:`blis_sim.errors.FormatError` (file, line, field) on bad input; every writer lays
the file out as the reference's Go code does. See docs/formats.md.

Names are re-exported lazily (PEP 562): importing one submodule, e.g. ``blis_sim.formats._strict``, does not
build every pydantic model of the package (that costs about a second at start-up).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from blis_sim._lazy import lazy_exports

_EXPORTS: dict[str, tuple[str, ...]] = {
    "blis_sim.formats.hitrate": (
        "DEFINITIONS",
        "KVHitRate",
    ),
    "blis_sim.formats.offload": (
        "DEFAULT_DEVICE_CLASSES",
        "DeviceClass",
        "OffloadConfig",
        "TierConfig",
        "load_device_classes",
        "load_offload_config",
        "parse_offload_config",
        "resolve_offload_config",
    ),
    "blis_sim.formats.results": (
        "AdapterMetrics",
        "MetricsOutput",
        "RequestMetrics",
        "SimProvenance",
        "SimResult",
        "load_metrics_output",
        "load_sim_results",
        "metrics_output_text",
        "read_sim_columns",
        "sim_results_text",
        "write_metrics_output",
        "write_sim_results",
    ),
    "blis_sim.formats.trace": (
        "SOURCE_GPU_FALLBACK",
        "SOURCE_TIERED",
        "ITLRecord",
        "KVGeometry",
        "LatencyModelInfo",
        "ObservedKVMetrics",
        "OffloadExtensions",
        "PhaseInfo",
        "PytestBlisHeader",
        "ScrapeInfo",
        "SLOTargets",
        "TierIO",
        "Trace",
        "TraceHeader",
        "TraceKVOffloadConfig",
        "TraceNetworkConfig",
        "TraceRecord",
        "TraceServerConfig",
        "TraceTierConfig",
        "default_itl_path",
        "itl_by_request",
        "load_trace",
        "read_itl",
        "read_trace_data",
        "read_trace_header",
        "write_itl",
        "write_trace",
        "write_trace_data",
        "write_trace_header",
    ),
    "blis_sim.formats.workload": (
        "WorkloadSpec",
        "load_workload_spec",
        "parse_workload_spec",
    ),
    "blis_sim.formats.report": (
        "CalibrationReport",
        "load_report",
        "write_report",
        "dump_report",
    ),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # the names served lazily above, as the type checker sees them
    from blis_sim.formats.hitrate import DEFINITIONS as DEFINITIONS, KVHitRate as KVHitRate
    from blis_sim.formats.offload import (
        DEFAULT_DEVICE_CLASSES as DEFAULT_DEVICE_CLASSES,
        DeviceClass as DeviceClass,
        OffloadConfig as OffloadConfig,
        TierConfig as TierConfig,
        load_device_classes as load_device_classes,
        load_offload_config as load_offload_config,
        parse_offload_config as parse_offload_config,
        resolve_offload_config as resolve_offload_config,
    )
    from blis_sim.formats.report import (
        CalibrationReport as CalibrationReport,
        dump_report as dump_report,
        load_report as load_report,
        write_report as write_report,
    )
    from blis_sim.formats.results import (
        AdapterMetrics as AdapterMetrics,
        MetricsOutput as MetricsOutput,
        RequestMetrics as RequestMetrics,
        SimProvenance as SimProvenance,
        SimResult as SimResult,
        load_metrics_output as load_metrics_output,
        load_sim_results as load_sim_results,
        metrics_output_text as metrics_output_text,
        read_sim_columns as read_sim_columns,
        sim_results_text as sim_results_text,
        write_metrics_output as write_metrics_output,
        write_sim_results as write_sim_results,
    )
    from blis_sim.formats.trace import (
        SOURCE_GPU_FALLBACK as SOURCE_GPU_FALLBACK,
        SOURCE_TIERED as SOURCE_TIERED,
        ITLRecord as ITLRecord,
        KVGeometry as KVGeometry,
        LatencyModelInfo as LatencyModelInfo,
        ObservedKVMetrics as ObservedKVMetrics,
        OffloadExtensions as OffloadExtensions,
        PhaseInfo as PhaseInfo,
        PytestBlisHeader as PytestBlisHeader,
        ScrapeInfo as ScrapeInfo,
        SLOTargets as SLOTargets,
        TierIO as TierIO,
        Trace as Trace,
        TraceHeader as TraceHeader,
        TraceKVOffloadConfig as TraceKVOffloadConfig,
        TraceNetworkConfig as TraceNetworkConfig,
        TraceRecord as TraceRecord,
        TraceServerConfig as TraceServerConfig,
        TraceTierConfig as TraceTierConfig,
        default_itl_path as default_itl_path,
        itl_by_request as itl_by_request,
        load_trace as load_trace,
        read_itl as read_itl,
        read_trace_data as read_trace_data,
        read_trace_header as read_trace_header,
        write_itl as write_itl,
        write_trace as write_trace,
        write_trace_data as write_trace_data,
        write_trace_header as write_trace_header,
    )
    from blis_sim.formats.workload import (
        WorkloadSpec as WorkloadSpec,
        load_workload_spec as load_workload_spec,
        parse_workload_spec as parse_workload_spec,
    )
