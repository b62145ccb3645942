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
