"""One calibration cell, end to end: plan → observe → replay → calibrate → verdicts.

Failures are :class:`~pytest_blis._render.CellFailure` (rendered as a compact table); a server that
cannot show what the cell needs is a skip with its reason; a cell whose measured window shows no
sign of the cache path it is about is an error ("not elicited"), never a pass.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from blis_sim.calibrate import CalibrateOptions, CalibrationReport, VerdictRow
from blis_sim.calibrate.pairing import SimIndex
from blis_sim.calibrate.table import SimTable, real_table
from blis_sim.engine.capacity import burst_capacity
from blis_sim.formats.results import ColumnChunks, Columns
from blis_sim.formats.trace import Trace
from blis_sim.observe.run import ObserveOptions
from pytest_blis import _allure, _html
from pytest_blis._options import BlisOptions
from pytest_blis._phases import build_plan, measured_phase_names
from pytest_blis._plots import hit_rates_svg, ttft_cdf_svg, ttft_scatter_svg
from pytest_blis._render import CellFailure
from pytest_blis._scenario import Expect, SweepPoint
from pytest_blis._server import ServerTarget
from pytest_blis._session import SUMMARY_PROPERTY, CellSummary
from pytest_blis._simsweep import sweep_verdicts
from pytest_blis._steps import CellPaths, calibrate_step, observe_cluster_step, observe_step, replay_step

if TYPE_CHECKING:
    from blis_sim.engine import EngineOptions, LatencyCoefficients

# vLLM's prompt_tokens_cached_by_source labels for each cache path.
PATH_SOURCES = {"gpu": ("device",), "cpu": ("host",), "storage": ("disk",)}
SETTLE_EMBEDDED_S = 0.3
SETTLE_EXTERNAL_S = 1.0


@dataclass(frozen=True)
class CellContext:
    point: SweepPoint
    target: ServerTarget
    options: BlisOptions
    latency: LatencyCoefficients | None  # fitted on this server's probe
    paths: CellPaths
    probe_notes: tuple[str, ...] = ()  # what the probe says about the server itself (its repeatability)


def fit_notes(latency: LatencyCoefficients | None, failed: list[VerdictRow],
              probe_notes: Sequence[str] = ()) -> list[str]:
    """When TTFT is out of tolerance: what the latency fit said about itself (its own error,
    prior, coefficient intervals, first warnings), since an untrustworthy fit is a likely cause, and how
    well the server repeated itself in the probe, since a server that does not is the other one."""
    if not any(r.unit == "mape" for r in failed):
        return []
    report = getattr(latency, "fit", None)
    return ([report.summary()] if report is not None else []) + list(probe_notes)


def cell_id(point: SweepPoint) -> str:
    return f"{Path(point.file).name}::{point.scenario_name}::{point.name}"


def unable_reason(ctx: CellContext) -> str | None:
    """Why the server cannot show what the cell needs (None when it can)."""
    path = ctx.point.spec.expect.path
    need = {"cpu": "cpu", "storage": "storage"}.get(path)
    if need and need not in ctx.target.capabilities:
        where = "the embedded emulator's offload config" if ctx.target.embedded else \
            "--blis-kv-offload-config (the server's offload tiers)"
        return f"a {path}-hit cell needs a {need} offload tier, and {where} has none"
    injected = [k for k in ctx.point.spec.expect.faults if k in ("store_failure", "promotion_failure")]
    if injected and ctx.target.embedded:
        return (f"a fault cell needs a server that injects {', '.join(injected)}s, and the embedded emulator does "
                "not (tools/offload_lane.sh faults runs it against vLLM)")
    return None


def source_hits(trace: Trace) -> dict[str, int] | None:
    """Cached prompt tokens by source over the counter window, or None if the server does not say."""
    extra = trace.header.pytest_blis
    entries = [e for e in (extra.kv_hit_rates if extra else []) if e.definition == "by_source" and e.tier]
    return {e.tier: e.hits for e in entries if e.tier} if entries else None


def _prefix_hits(trace: Trace) -> int | None:
    extra = trace.header.pytest_blis
    for e in (extra.kv_hit_rates if extra else []):
        if e.definition in ("prefix_cache", "gpu_prefix_cache"):
            return e.hits
    return None


def path_problem(path: str, trace: Trace) -> str | None:
    """Why the measured window does not show ``path`` (None when it does, or cannot be told)."""
    if path == "any":
        return None
    by_source = source_hits(trace)
    if path == "miss":
        hits = sum(by_source.values()) if by_source is not None else _prefix_hits(trace)
        return None if not hits else f"a miss cell saw {hits} cached tokens in its window"
    if by_source is None:
        if path == "gpu":
            hits = _prefix_hits(trace)
            return None if hits else "no prefix-cache hits in the window: the GPU-hit path was not elicited"
        return f"the server exposes no per-source cached-token counters, so the {path}-hit path cannot be verified"
    wanted = sum(by_source.get(s, 0) for s in PATH_SOURCES[path])
    if wanted == 0:
        seen = ", ".join(f"{k}={v}" for k, v in sorted(by_source.items())) or "none"
        return f"the {path}-hit path was not elicited: no {'/'.join(PATH_SOURCES[path])} hits in the window ({seen})"
    return None


# The hit-rate a cell is about, by its expected path: first one the report carries wins.
HEADLINES = {"gpu": (("by_source", "device"), ("prefix_cache", None), ("gpu_prefix_cache", None)),
             "cpu": (("by_source", "host"), ("external", None)),
             "storage": (("by_source", "disk"), ("external", None)),
             "miss": (("prefix_cache", None), ("gpu_prefix_cache", None)),
             "any": (("prefix_cache", None), ("gpu_prefix_cache", None))}


def summarize(nodeid: str, path: str, report: CalibrationReport, note: str = "") -> CellSummary:
    """The cell's summary line: its headline hit-rate, the worst error of all, TTFT MAPE."""
    cell = CellSummary(nodeid=nodeid, outcome="", path=path, note=note)
    entries = list(report.kv_hit_rates or [])
    by_key = {(e.definition, e.tier): e for e in entries}
    errors = [e.abs_error_pp for e in entries]
    head = next((by_key[k] for k in HEADLINES[path] if k in by_key), None)
    if head is not None:
        cell.headline = head.definition + (f"/{head.tier}" if head.tier else "")
        cell.real_hit_rate, cell.sim_hit_rate = head.real_hit_rate, head.sim_hit_rate
        cell.abs_error_pp, cell.hit_rate_tolerance_pp = head.abs_error_pp, head.tolerance_pp
    if report.hit_rate is not None:
        errors.append(report.hit_rate.abs_error_pp)
        if head is None:
            cell.headline = f"hit_rate[{report.hit_rate.source}]"
            cell.real_hit_rate, cell.sim_hit_rate = report.hit_rate.real_hit_rate, report.hit_rate.sim_hit_rate
            cell.abs_error_pp = report.hit_rate.abs_error_pp
            cell.hit_rate_tolerance_pp = report.hit_rate.tolerance_pp
    for rep in report.replicas or ():  # a cluster: the worst error of any replica too
        if rep.judged:
            errors += [d.abs_error_pp for d in rep.kv_hit_rates]
    cell.max_error_pp = max(errors) if errors else None
    cell.definitions = len(entries)
    if report.ttft_tolerance is not None:
        cell.ttft_mape, cell.ttft_threshold = report.ttft_tolerance.mape, report.ttft_tolerance.threshold
    return cell


def ttft_pairs(trace: Trace, sim_results: Columns | ColumnChunks) -> tuple[list[float], list[float]]:
    """Real and simulated TTFT (µs) of the requests both sides completed, as calibrate pairs them
    (real: first chunk − send, client side), from the columns calibrate reads."""
    real, sim = real_table(trace), SimTable.of(sim_results)
    found, sim_rows = SimIndex.of(sim.request_id).lookup(real.array("request_id"))
    send, first = real.array("send_time_us"), real.array("first_chunk_time_us")
    status = real.strings("status")
    ok = status.codes == (status.names.index("ok") if "ok" in status.names else -1)
    keep = ok & (first > send) & (send > 0) & found
    return (first[keep] - send[keep]).astype(float).tolist(), sim.ttft_us[sim_rows[keep]].tolist()


def ttft_noise_floor(trace: Trace) -> float | None:
    """How much of a TTFT MAPE the host's own timing noise explains, as a fraction: the mean over
    requests of |first-byte delay - its median| / real TTFT. The server sends the response head
    when it accepts a request, before any engine step, so the spread of that delay is request
    delivery and scheduling on the shared machine, not the model; a MAPE near this floor is noise."""
    ok = [r for r in trace.records if r.status == "ok" and r.first_chunk_time_us > r.send_time_us > 0
          and r.first_byte_time_us >= r.send_time_us]
    if not ok:
        return None
    delays = [r.first_byte_time_us - r.send_time_us for r in ok]
    mid = statistics.median(delays)
    return sum(abs(d - mid) / (r.first_chunk_time_us - r.send_time_us) for d, r in zip(delays, ok)) / len(ok)


def write_plots(ctx: CellContext, point: SweepPoint, trace: Trace, sim_results: Columns | ColumnChunks,
                report: CalibrationReport) -> list[tuple[Path, str]]:
    """The cell's three plots as SVG files beside its other artifacts: (path, caption) each."""
    real, sim = ttft_pairs(trace, sim_results)
    name = f"{point.scenario_name} / {point.name}"
    tol = report.ttft_tolerance
    mape = f", MAPE {tol.mape * 100:.1f}%" if tol is not None else ""
    ctx.paths.ttft_plot.write_text(ttft_cdf_svg(real, sim, f"{name}: TTFT{mape}"))
    ctx.paths.ttft_scatter_plot.write_text(
        ttft_scatter_svg(real, sim, f"{name}: TTFT per request", band=tol.threshold if tol is not None else None))
    rows = [(e.definition + (f"/{e.tier}" if e.tier else ""), e.real_hit_rate, e.sim_hit_rate)
            for e in report.kv_hit_rates or []]
    if report.hit_rate is not None and not rows:
        rows = [(f"hit_rate[{report.hit_rate.source}]", report.hit_rate.real_hit_rate, report.hit_rate.sim_hit_rate)]
    ctx.paths.hit_rate_plot.write_text(hit_rates_svg(rows, f"{name}: KV hit-rates"))
    return [(ctx.paths.hit_rate_plot, "hit-rate by definition and tier, real vs sim"),
            (ctx.paths.ttft_plot, "TTFT CDF, real vs sim"),
            (ctx.paths.ttft_scatter_plot, "TTFT per request, real vs sim")]


def run_cell(ctx: CellContext, request: pytest.FixtureRequest, replay_options: EngineOptions) -> CalibrationReport:
    point, target, opts = ctx.point, ctx.target, ctx.options
    spec = point.spec
    item = request.node
    cid = cell_id(point)
    _allure.describe(request.config, title=f"{point.scenario_name} / {point.name}", file=Path(point.file).name,
                     scenario=point.scenario_name, description=spec.description,
                     parameters={**point.values, "path": spec.expect.path},
                     volatile={"server": target.url, "seed": spec.seed})
    reason = unable_reason(ctx)
    if reason:
        skipped = CellSummary(nodeid=cid, outcome="", path=spec.expect.path, note=f"skipped: {reason}")
        item.user_properties.append((SUMMARY_PROPERTY, json.dumps(asdict(skipped))))
        # Reported at the scenario's line in the YAML file, as a skip mark would be.
        raise pytest.skip.Exception(reason, _use_item_location=True)
    content_id = f"{cid}@{target.namespace}" if target.namespace else cid
    rate_notes: list[str] = []
    plan = build_plan(spec, cell_id=content_id, capacity=target.capacity(), base_dir=Path(point.file).parent,
                      capacity_of=lambda w: burst_capacity(w, replay_options), notes=rate_notes)
    window = measured_phase_names(spec, plan)
    obs_opts = ObserveOptions(
        model=target.model, scrape_kv_metrics=True, max_concurrency=spec.concurrency, window_phases=window,
        vllm_commit=opts.vllm_commit or "", progress=False,
        settle_s=SETTLE_EMBEDDED_S if target.embedded else SETTLE_EXTERNAL_S, workload_label=cid,
        tokenizer=target.tokenizer)
    with _allure.step("observe"), target.exclusive():
        if target.cluster:
            assert target.routing is not None  # the pool gives every cluster target its routing
            result = observe_cluster_step(target.urls, target.routing, plan, obs_opts, ctx.paths)
        else:
            result = observe_step(target.url, plan, obs_opts, ctx.paths)
    trace = result.trace
    with _allure.step("replay"):
        sim_results, sim_metrics = replay_step(trace, replay_options, ctx.paths)
    tol = spec.expect.hit_rate_tolerance_pp
    thr = spec.expect.ttft_mape_threshold
    cal_opts = CalibrateOptions(
        hit_rate_tolerance_pp=opts.hit_rate_tolerance_pp if tol is None else tol,
        ttft_mape_threshold=opts.ttft_mape_threshold if thr is None else thr)
    with _allure.step("calibrate"):
        report = calibrate_step(trace, sim_results, sim_metrics, cal_opts, ctx.paths)
    plots = write_plots(ctx, point, trace, sim_results, report)
    for path, name in ((ctx.paths.trace_header, "trace header"), (ctx.paths.trace_data, "trace data"),
                       (ctx.paths.sim_results, "sim results"), (ctx.paths.sim_metrics, "sim metrics"),
                       (ctx.paths.report, "calibration report"), *plots):
        _allure.attach_file(request.config, path, name)

    timing = not opts.timing_report_only
    rows = verdict_rows(report, spec.expect, timing=timing)
    setting_notes: list[str] = []
    if spec.simulator_sweep:  # the same observation, replayed at every simulator setting

        with _allure.step("simulator sweep"):
            more, setting_notes = sweep_verdicts(point, trace, replay_options, cal_opts, ctx.paths.root,
                                                 lambda r: verdict_rows(r, spec.expect, timing=timing))
        rows += more
    _html.remember(item, rows, plots)
    problem = path_problem(spec.expect.path, trace) or saturation_problem(report, spec.expect)
    notes = [f"artifacts: {ctx.paths.root}", *rate_notes, *setting_notes,
             *(f"warning: {w}" for w in result.warnings[:5])]
    summary = summarize(cid, spec.expect.path, report, note=problem or "")
    summary.ttft_checked = spec.expect.check_ttft and timing
    summary.ttft_gated = spec.expect.check_ttft  # a report-only run's summary can still be judged later
    if setting_notes:  # the worst error over every simulator setting too
        summary.max_error_pp = max([summary.max_error_pp or 0.0] + [r.error for r in rows if r.unit == "pp"])
    summary.ttft_noise_floor = ttft_noise_floor(trace)
    item.user_properties.append((SUMMARY_PROPERTY, json.dumps(asdict(summary))))
    if report.hit_rate is not None:
        item.user_properties.append(("hit_rate_abs_error_pp", report.hit_rate.abs_error_pp))
    if report.ttft_tolerance is not None:
        item.user_properties.append(("ttft_mape", report.ttft_tolerance.mape))
    failure: CellFailure | None = None
    failed = [r for r in rows if not r.within]
    if problem:
        failure = CellFailure(f"{cid}: {problem}", rows, notes)
    elif failed:
        failure = CellFailure(f"{cid}: {len(failed)} verdict(s) out of tolerance", rows,
                              notes + fit_notes(ctx.latency, failed, ctx.probe_notes))
    elif report.hit_rate is None:
        failure = CellFailure(f"{cid}: no hit-rate comparison (the server's counters were not scraped)", rows,
                              notes + [f"warning: {w}" for w in report.notes or []])
    if failure is not None:
        _allure.attach_text(request.config, str(failure), "calibration failure")
        raise failure
    return report


def verdict_rows(report: CalibrationReport, expect: Expect, *, timing: bool = True) -> list[VerdictRow]:
    """The report's verdicts the cell judges: TTFT MAPE unless ``check_ttft`` is off, plus E2E MAPE when the
    cell sets ``e2e_mape_threshold``. The capacity rows (throughputs and the E2E MAPE, judged by calibrate only
    where the window is saturated, which then reports TTFT unjudged) are latency verdicts too: judged with
    ``check_ttft`` or in a ``saturated`` cell. The tier service-time rows (unit "rel") are reported in the
    cell's calibration report and not judged.
    A fault over the window that the simulator does not model is a failing row of its own (unit "faults"); a
    fault cell (``expect.faults``) is judged on its faults instead of its hit-rates (:func:`_fault_rows`).
    ``timing=False`` (``--blis-timing-report-only``): the hit-rate and fault rows only."""
    rows = [r for r in report.verdicts()
            if (not r.metric.endswith("ttft_mape") or expect.check_ttft)
            and (not r.metric.startswith("capacity[") or expect.check_ttft or expect.saturated)
            # Tier service seconds are in the report, not judged by a cell: its offload file gives the
            # deployment's tiers, not the bandwidths calibrate --write-offload-config fits afterwards.
            and r.unit != "rel"]
    if expect.faults:
        return _fault_rows(report, expect.faults) + [r for r in rows if r.unit not in ("pp", "requests", "faults")
                                                      and timing]
    agreement = report.request_hit_agreement
    if expect.cached_tokens_equal:
        if agreement is None:
            rows.append(VerdictRow("cached_tokens_per_request", 0.0, 0.0, 1.0, 0.0, False, "requests"))
        else:
            rows.append(VerdictRow("cached_tokens_per_request", agreement.real_cached_tokens,
                                   agreement.sim_cached_tokens, agreement.requests - agreement.matching, 0.0,
                                   agreement.matching == agreement.requests, "requests"))
    if not timing:
        return [r for r in rows if r.unit in ("pp", "requests", "faults")]
    e2e = report.metrics.get("e2e")
    if expect.e2e_mape_threshold is not None and e2e is not None:
        mape = e2e.request_level.mape
        rows.append(VerdictRow("e2e_mape", e2e.workload_level.real_mean, e2e.workload_level.sim_mean, mape,
                               expect.e2e_mape_threshold, mape <= expect.e2e_mape_threshold, "mape"))
    return rows


def _fault_rows(report: CalibrationReport, expected: Sequence[str]) -> list[VerdictRow]:
    """A fault cell's verdicts: every expected fault seen over the window, and no other fault the simulator
    does not model. Its hit-rates are in the report, not judged: the fault makes them incomparable."""
    seen: dict[str, int] = {}
    for f in report.window_faults or ():
        if not f.modelled:
            seen[f.kind] = seen.get(f.kind, 0) + f.count
    rows = [VerdictRow(f"fault[{kind}]", float(seen.get(kind, 0)), 1.0, float(seen.get(kind, 0)), 0.0,
                       seen.get(kind, 0) > 0, "faults") for kind in expected]
    rows += [VerdictRow(f"fault[{kind}]", float(n), 0.0, float(n), 0.0, False, "faults")
             for kind, n in sorted(seen.items()) if kind not in expected]
    return rows


def saturation_problem(report: CalibrationReport, expect: Expect) -> str | None:
    """Why a cell that must saturate the server did not (None when it did, or when the report cannot say)."""
    capacity = report.capacity
    if not expect.saturated or capacity is None or capacity.saturated:
        return None
    return (f"the window did not saturate the server (arrivals {capacity.arrival_rps or 0:.2f} req/s, served "
            f"{capacity.served_rps:.2f} req/s): the saturation path was not elicited")
