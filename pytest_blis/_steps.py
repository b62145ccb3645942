"""The three steps of a calibration, as plain functions over files in an artifacts directory.

The fixtures ``blis_observe``, ``blis_replay`` and ``blis_calibrate`` hand these to user tests; the
scenario items compose them in :mod:`pytest_blis._cell`. Each step writes its outputs under the
cell's directory, so a failing cell leaves everything needed to reproduce it with the CLI::

    <artifacts>/<cell>/trace.yaml, trace.csv      observe
    <artifacts>/<cell>/sim.json, simagg.json      replay
    <artifacts>/<cell>/calibration.json           calibrate
    <artifacts>/<cell>/ttft-cdf.svg, hit-rates.svg, ttft-scatter.svg   plots (Allure, pytest-html)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blis_sim.calibrate import CalibrateOptions, CalibrationReport, calibrate, write_report
from blis_sim.errors import ServerError
from blis_sim.formats.results import ColumnChunks, MetricsOutput
from blis_sim.formats.trace import Trace
from blis_sim.observe.run import ObserveOptions, ObserveResult, observe, write_result
from blis_sim.workload import WorkloadPlan

if TYPE_CHECKING:
    from blis_sim.engine import EngineOptions
    from blis_sim.routing import RoutingSpec


@dataclass(frozen=True)
class CellPaths:
    root: Path

    @property
    def trace_header(self) -> Path:
        return self.root / "trace.yaml"

    @property
    def trace_data(self) -> Path:
        return self.root / "trace.csv"

    @property
    def sim_results(self) -> Path:
        return self.root / "sim.json"

    @property
    def sim_metrics(self) -> Path:
        return self.root / "simagg.json"

    @property
    def report(self) -> Path:
        return self.root / "calibration.json"

    @property
    def ttft_plot(self) -> Path:
        return self.root / "ttft-cdf.svg"

    @property
    def hit_rate_plot(self) -> Path:
        return self.root / "hit-rates.svg"

    @property
    def ttft_scatter_plot(self) -> Path:
        return self.root / "ttft-scatter.svg"


def observe_step(url: str, plan: WorkloadPlan, options: ObserveOptions, paths: CellPaths) -> ObserveResult:
    """Dispatch ``plan`` to ``url``, write the trace; a run where no request succeeded is a ServerError."""
    paths.root.mkdir(parents=True, exist_ok=True)
    result = observe(url, plan, options)
    write_result(result, paths.trace_header, paths.trace_data)
    if result.ok_requests == 0:
        statuses = sorted({f"{r.status}: {r.error_message}" for r in result.trace.records})[:3]
        raise ServerError(f"no request succeeded ({'; '.join(statuses) or 'nothing sent'})", url=url)
    return result


def observe_cluster_step(urls: tuple[str, ...], routing: RoutingSpec, plan: WorkloadPlan, options: ObserveOptions,
                         paths: CellPaths) -> ObserveResult:
    """:func:`observe_step` for a cluster: the client routes each request to one of ``urls``."""
    from blis_sim.observe.cluster import observe_cluster

    paths.root.mkdir(parents=True, exist_ok=True)
    result = observe_cluster(list(urls), plan, options, routing=routing)
    write_result(result, paths.trace_header, paths.trace_data)
    if result.ok_requests == 0:
        statuses = sorted({f"{r.status}: {r.error_message}" for r in result.trace.records})[:3]
        raise ServerError(f"no request succeeded ({'; '.join(statuses) or 'nothing sent'})", url=", ".join(urls))
    return result


def replay_step(trace: Trace, replay_options: EngineOptions, paths: CellPaths) -> tuple[ColumnChunks, MetricsOutput]:
    """Replay a trace through the simulator and write SimResult + MetricsOutput (a cluster's trace, with its
    ``pytest_blis.cluster`` block, on as many replicas with the recorded routing). The results come
    back as the columns calibrate takes (no object per request)."""
    from blis_sim.engine import replay_outcome  # the engine is only imported when a cell replays

    ext = trace.header.pytest_blis
    if ext is not None and ext.cluster is not None and ext.cluster.num_instances > 1:
        from blis_sim.engine.cluster import replay_cluster

        out: Any = replay_cluster(trace, replay_options)
    else:
        out = replay_outcome(trace, replay_options)
    out.write_outputs(paths.sim_results, paths.sim_metrics)  # the files straight from the columns
    return out.result_columns(), out.metrics()


def calibrate_step(trace: Trace, results: ColumnChunks, metrics: MetricsOutput,
                   options: CalibrateOptions, paths: CellPaths) -> CalibrationReport:
    report = calibrate(trace, results, metrics, options=options)
    write_report(report, paths.report)
    return report
