"""`blis calibrate`: argument parsing, file loading and exit codes around :func:`calibrate_detailed`.

``register(subparsers)`` adds the subcommand. Flags: the reference's (docs/reference-formats.md §5.1: --trace-header,
--trace-data, --sim-results, --report, --warmup-requests, --network-rtt-us, --network-bandwidth-mbps,
--itl-data, --sim-metrics, --hit-rate-tolerance-pp, --ttft-mape-threshold, --slo-ttft/-itl/-e2e; not the
LoRA digital-twin mode) and ours (--capacity-tolerance, --tier-service-tolerance, --tier-window,
--write-offload-config). Exit codes: 0 every verdict within, 1 a verdict out of tolerance (the reference
always exits 0), 2 usage or input error (one line).
"""
from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from blis_sim.calibrate.capacity import DEFAULT_CAPACITY_TOLERANCE
from blis_sim.calibrate.core import (
    DEFAULT_HIT_RATE_TOLERANCE_PP,
    DEFAULT_TTFT_MAPE_THRESHOLD,
    CalibrateOptions,
    InputPaths,
    calibrate_detailed,
)
from blis_sim.calibrate.goodput import parse_slo_flag
from blis_sim.calibrate.summary import print_summary
from blis_sim.calibrate.tier_service import DEFAULT_TIER_SERVICE_TOLERANCE
from blis_sim.calibrate.verdict import exit_code
from blis_sim.errors import InputError, UsageError
from blis_sim.formats.report import write_report

if TYPE_CHECKING:
    from blis_sim.cli import Subparsers

# What a command runs is imported inside its function: `blis --help` imports every subcommand's
# module (blis_sim/cli.py), and a command needs only its own dependencies.

_REQUIRED = ("trace_header", "trace_data", "sim_results", "report")


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate", help="compare an observed trace with its simulated replay (verdicts gate the exit code)",
        description="Compare real (trace) and simulated (replay) TTFT/E2E/ITL and KV hit-rates. Exit 0 when "
                    "every verdict is within tolerance, 1 when one is not, 2 on bad flags or input files.")
    p.add_argument("--trace-header", default="", help="TraceV2 header YAML (required)")
    p.add_argument("--trace-data", default="", help="TraceV2 data CSV (required)")
    p.add_argument("--sim-results", default="", help="SimResult JSON from `blis replay --results-path` (required)")
    p.add_argument("--report", default="", help="where to write the calibration report JSON (required)")
    p.add_argument("--warmup-requests", type=int, default=-1,
                   help="exclude request ids below N; -1 (default) = the header's warm_up_requests; 0 = include "
                        "everything, also rows the trace's warmup column marks")
    p.add_argument("--network-rtt-us", type=int, default=-1,
                   help="RTT added to simulated latencies, µs; -1 (default) = the header's network.measured_rtt_ms")
    p.add_argument("--network-bandwidth-mbps", type=float, default=0.0,
                   help="upload/download delay of 4 bytes per token at this bandwidth; 0 (default) = none")
    p.add_argument("--itl-data", default="", help="ITL CSV from `blis observe --record-itl` (adds metrics.itl)")
    p.add_argument("--sim-metrics", default="",
                   help="MetricsOutput JSON from `blis replay --metrics-path` (the simulated hit-rates)")
    p.add_argument("--hit-rate-tolerance-pp", type=float, default=DEFAULT_HIT_RATE_TOLERANCE_PP,
                   help="hit-rate verdict band, percentage points (default 5)")
    p.add_argument("--ttft-mape-threshold", type=float, default=DEFAULT_TTFT_MAPE_THRESHOLD,
                   help="TTFT MAPE verdict threshold, a fraction (default 0.15)")
    p.add_argument("--capacity-tolerance", type=float, default=DEFAULT_CAPACITY_TOLERANCE,
                   help="throughput verdict band where the window is saturated, a relative error (default 0.05)")
    p.add_argument("--tier-service-tolerance", type=float, default=DEFAULT_TIER_SERVICE_TOLERANCE,
                   help="offload tier service-time verdict band, relative error of the seconds per tier and "
                        "direction (default 0.10)")
    p.add_argument("--tier-window", action="append", default=[], metavar="HEADER",
                   help="another trace header of the same server (repeatable): its tier I/O joins the tier "
                        "bandwidth fit (two windows of different transfer sizes give a per-transfer cost)")
    p.add_argument("--write-offload-config", default="", metavar="PATH",
                   help="write the replay's offload config (from --sim-metrics provenance) with the fitted "
                        "secondary-tier bandwidths, for `blis replay --kv-offload-config`")
    for dim, example in (("ttft", "critical=100ms,standard=500ms"), ("itl", "critical=20ms"),
                         ("e2e", "critical=5s,standard=30s")):
        p.add_argument(f"--slo-{dim}", default="",
                       help=f"per-class {dim.upper()} goodput thresholds, Go durations (e.g. \"{example}\"); "
                            "beat the trace header's goodput_slo_targets")
    p.set_defaults(func=run)


def options_from_args(args: argparse.Namespace) -> CalibrateOptions:
    """Flags → options; -1 means "from the trace header" as in the reference."""
    for name in _REQUIRED:
        if not getattr(args, name):
            raise UsageError(f"--{name.replace('_', '-')} is required")
    if args.warmup_requests < -1:
        raise UsageError(f"--warmup-requests must be >= 0 (or -1 to use the trace header), got {args.warmup_requests}")
    if args.network_rtt_us < -1:
        raise UsageError(f"--network-rtt-us must be >= 0 (or omit to use trace header), got {args.network_rtt_us}")
    if math.isnan(args.network_bandwidth_mbps) or math.isinf(args.network_bandwidth_mbps):
        raise UsageError(f"--network-bandwidth-mbps must be a finite number, got {args.network_bandwidth_mbps}")
    options = CalibrateOptions(
        warmup_requests=None if args.warmup_requests == -1 else args.warmup_requests,
        network_rtt_us=None if args.network_rtt_us == -1 else args.network_rtt_us,
        network_bandwidth_mbps=args.network_bandwidth_mbps, hit_rate_tolerance_pp=args.hit_rate_tolerance_pp,
        ttft_mape_threshold=args.ttft_mape_threshold, capacity_tolerance=args.capacity_tolerance,
        slo_ttft_ms=parse_slo_flag(args.slo_ttft, "--slo-ttft"), slo_itl_ms=parse_slo_flag(args.slo_itl, "--slo-itl"),
        slo_e2e_ms=parse_slo_flag(args.slo_e2e, "--slo-e2e"), tier_service_tolerance=args.tier_service_tolerance,
        tier_windows=tuple(_read_header(p) for p in args.tier_window))
    options.validate()
    return options


def run(args: argparse.Namespace) -> int:
    # Readers are imported here so `blis --help` does not pay for them.
    from blis_sim.formats.itl import read_itl
    from blis_sim.formats.results import load_metrics_output, read_sim_columns
    from blis_sim.formats.trace_columns import load_trace_columns

    options = options_from_args(args)
    inputs = InputPaths(trace_header=args.trace_header, trace_data=args.trace_data, sim_results=args.sim_results,
                        sim_metrics=args.sim_metrics or None, itl_data=args.itl_data or None)
    trace = load_trace_columns(args.trace_header, args.trace_data)
    sim_results = read_sim_columns(args.sim_results)
    if not sim_results.n:
        raise InputError("No sim results found — cannot calibrate with empty data", file=args.sim_results)
    # the aggregates only: calibrate pairs requests from the SimResult file
    sim_metrics = load_metrics_output(args.sim_metrics, requests=False) if args.sim_metrics else None
    itl = read_itl(args.itl_data) if args.itl_data else None
    outcome = calibrate_detailed(trace, sim_results, sim_metrics, options=options, itl_records=itl, inputs=inputs)
    if args.write_offload_config:  # before the report: an unusable request writes neither (exit 2)
        _write_offload_config(args.write_offload_config, outcome.report, sim_metrics, args.sim_metrics)
    try:
        write_report(outcome.report, args.report)
    except OSError as exc:
        raise InputError(f"failed to write calibration report: {exc.strerror or exc}", file=args.report) from None
    print_summary(outcome, args.report)
    return exit_code(outcome.report)


def _read_header(path: str) -> Any:
    from blis_sim.formats.trace_header import read_trace_header

    return read_trace_header(path)


def _write_offload_config(path: str, report: Any, sim_metrics: Any, sim_metrics_path: str) -> None:
    """The replay's resolved offload config with the fitted bandwidths (blis_sim.calibrate.tier_service)."""
    from blis_sim.calibrate.tier_service import TierFit, offload_config_text
    from blis_sim.formats._io import atomic_write

    block = getattr(getattr(sim_metrics, "provenance", None), "kv_offload", None)
    if block is None:
        raise UsageError("--write-offload-config needs --sim-metrics from a replay with an offload config (its "
                         "provenance records the config the fitted bandwidths go into)")
    fits = {(f.tier, f.direction): TierFit(tier=f.tier, direction=f.direction, bandwidth_Bps=f.bandwidth_Bps,
                                           fixed_cost_s=f.fixed_cost_s, method=f.method, windows=f.windows,
                                           bytes=0.0, seconds=0.0, jobs=None)
            for f in report.tier_service_fits or ()}
    if not fits:
        raise InputError("--write-offload-config: the trace header records no tier transfer bytes and seconds "
                         "(observe with --scrape-kv-metrics against a server with offloading)")
    try:
        atomic_write(path, offload_config_text(block, fits, source=sim_metrics_path))
    except OSError as exc:
        raise InputError(f"cannot write the offload config: {exc.strerror or exc}", file=path) from None
