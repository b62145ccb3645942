"""The human summary `blis calibrate` prints on stderr: the reference's log lines, plus ours.

API::

    summary_lines(outcome, report_path) -> list[tuple[str, str]]    (level, message); level is "info" or "warning"
    print_summary(outcome, report_path, stream=sys.stderr) -> None

The JSON report is the contract; these lines are for people. Messages and number formats follow the
reference's logrus lines (docs/reference-formats.md §5.7), printed as ``INFO <message>`` / ``WARN <message>``.
"""
from __future__ import annotations

import sys
from typing import TextIO

from blis_sim.calibrate.core import CalibrationOutcome
from blis_sim.calibrate.pairing import BreakdownPairs
from blis_sim.calibrate.stats import mape_pct
from blis_sim.calibrate.verdict import render_table
from blis_sim.formats.report import MetricComparison

Line = tuple[str, str]
_LABELS = (("ttft", "TTFT: "), ("e2e", "E2E:  "), ("itl", "ITL:  "))


def _workload_lines(label: str, m: MetricComparison) -> list[Line]:
    w = m.workload_level
    out = [("info", f"  {label}Real mean={w.real_mean:.0f}µs, Sim mean={w.sim_mean:.0f}µs, "
                    f"Error={w.mean_error:+.0f}µs ({w.mean_percent_error * 100:.1f}%)")]
    for p in (50, 90, 95, 99):
        real, sim = getattr(w, f"real_p{p}"), getattr(w, f"sim_p{p}")
        err, pct = getattr(w, f"p{p}_error"), getattr(w, f"p{p}_percent_error")
        out.append(("info", f"        P{p}: Real={real:.0f}µs, Sim={sim:.0f}µs, Error={err:+.0f}µs "
                            f"({pct * 100:.1f}%)"))
    return out


def _breakdown_lines(title: str, key: str, table: dict[str, BreakdownPairs]) -> list[Line]:
    if not table:
        return []
    out = [("info", title)]
    for name in sorted(table):
        p = table[name]
        if p.ttft.real.size:
            ttft, e2e = mape_pct(p.ttft.real, p.ttft.sim) * 100, mape_pct(p.e2e.real, p.e2e.sim) * 100
            out.append(("info", f"  {key}={name}: n={len(p.ttft.real)} TTFT-MAPE={ttft:.1f}% E2E-MAPE={e2e:.1f}%"))
    return out


def summary_lines(outcome: CalibrationOutcome, report_path: str) -> list[Line]:
    r, pairs = outcome.report, outcome.pairs
    lines: list[Line] = [("warning", w) for w in outcome.warnings]
    lines.append(("info", f"Calibration report written to {report_path}"))
    lines.append(("info", f"  Matched pairs: {pairs.matched} (warm-up excluded: {pairs.excluded_warmup}, unmatched "
                          f"real: {pairs.unmatched_real}, unmatched sim: {pairs.unmatched_sim})"))
    lines.append(("info", "Workload-level aggregate metrics:"))
    for key, label in _LABELS:
        if key in r.metrics:
            lines += _workload_lines(label, r.metrics[key])
    lines.append(("info", "Request-level prediction quality:"))
    for key, label in _LABELS:
        if key in r.metrics:
            q = r.metrics[key].request_level
            lines.append(("info", f"  {label}MAPE={q.mape * 100:.1f}%, PearsonR={q.pearson_r:.3f}, "
                                  f"Bias={q.bias_direction}, Quality={q.quality}"))
    if r.hit_rate is not None:
        h = r.hit_rate
        lines.append(_judged(h.within, f"KV hit-rate (source={h.source}): Real={h.real_hit_rate:.4f} "
                                       f"Sim={h.sim_hit_rate:.4f} AbsErr={h.abs_error_pp:.2f}pp (tolerance "
                                       f"{h.tolerance_pp:.2f}pp)"))
    saturated = r.capacity is not None and r.capacity.within is not None
    if r.ttft_tolerance is not None:
        t = r.ttft_tolerance
        text = f"TTFT MAPE={t.mape * 100:.1f}% (threshold {t.threshold * 100:.1f}%)"
        lines.append(("info", text + " (saturated: queueing, reported, not judged)") if saturated
                     else _judged(t.within, text))
    for d in r.kv_hit_rates or ():
        name = d.definition if d.tier is None else f"{d.definition}/{d.tier}"
        lines.append(_judged(d.within, f"KV hit-rate [{name}] ({d.unit}): Real={d.real_hit_rate:.4f} "
                                       f"Sim={d.sim_hit_rate:.4f} AbsErr={d.abs_error_pp:.2f}pp (tolerance "
                                       f"{d.tolerance_pp:.2f}pp)"))
    if r.capacity is not None:
        c = r.capacity
        state = (f"saturated: {', '.join(c.saturation)}" if c.saturated
                 else "not saturated: reported, not judged")
        lines.append(_judged(c.within, f"Throughput ({state}, {c.requests} requests over {c.window_s:.2f}s): "
                                       f"Real={c.real_rps:.2f} req/s {c.real_output_tps:.1f} tok/s, "
                                       f"Sim={c.sim_rps:.2f} req/s {c.sim_output_tps:.1f} tok/s, error "
                                       f"{c.rps_error * 100:.1f}% / {c.output_tps_error * 100:.1f}% (tolerance "
                                       f"{c.tolerance * 100:.1f}%)"))
        if c.e2e_mape is not None and c.e2e_threshold is not None:
            lines.append(_judged(c.e2e_mape <= c.e2e_threshold,
                                 f"E2E MAPE at saturation={c.e2e_mape * 100:.1f}% (threshold "
                                 f"{c.e2e_threshold * 100:.1f}%)"))
    for ts in r.tier_service or ():
        sim_bw = "n/a" if ts.sim_bandwidth_Bps is None else f"{ts.sim_bandwidth_Bps / 1e9:.3f} GB/s"
        lines.append(_judged(ts.within, f"Tier service [{ts.tier}/{ts.direction}]: Real={ts.real_seconds * 1e3:.3f}ms "
                                       f"Sim={ts.sim_seconds * 1e3:.3f}ms error {ts.rel_error * 100:.1f}% (tolerance "
                                       f"{ts.tolerance * 100:.1f}%); bandwidth real "
                                       f"{ts.real_bandwidth_Bps / 1e9:.3f} GB/s, sim {sim_bw}"))
    for f in r.tier_service_fits or ():
        cost = "" if f.fixed_cost_s is None else f" + {f.fixed_cost_s * 1e6:.2f}us per transfer"
        lines.append(("info", f"Tier fit [{f.tier}/{f.direction}]: {f.bandwidth_Bps / 1e9:.3f} GB/s{cost} "
                              f"({f.method}, {f.windows} window(s))"))
    for u in r.kv_hit_rates_unpaired or ():
        name = u.definition if u.tier is None else f"{u.definition}/{u.tier}"
        lines.append(("info", f"KV hit-rate [{name}] ({u.side} only): not compared: {u.reason}"))
    if r.request_hit_agreement is not None:
        a = r.request_hit_agreement
        lines.append(("info", f"Per-request cached tokens: {a.matching}/{a.requests} match "
                              f"({a.match_share * 100:.1f}%), mean |diff|={a.mean_abs_diff_tokens:.1f} tokens "
                              f"({a.not_reported} not reported)"))
    if r.routing_agreement is not None:
        agree = r.routing_agreement
        lines.append(("info", f"Routing agreement: {agree.agreed}/{agree.requests} requests simulated on the replica "
                              f"the real router chose ({agree.share * 100:.1f}%)"))
    for rep in r.replicas or ():
        judged = "" if rep.judged else " (re-routed: reported, not judged)"
        tol = rep.ttft_tolerance
        if tol is not None:
            lines.append(_judged(tol.within if rep.judged and not saturated else None,
                                 f"Replica {rep.replica}{judged}: {rep.matched_pairs} requests, TTFT MAPE="
                                 f"{tol.mape * 100:.1f}% (threshold {tol.threshold * 100:.1f}%)"))
        for d in rep.kv_hit_rates:
            name = d.definition if d.tier is None else f"{d.definition}/{d.tier}"
            lines.append(_judged(d.within if rep.judged else None,
                                 f"Replica {rep.replica}{judged}: KV hit-rate [{name}] ({d.unit}): "
                                 f"Real={d.real_hit_rate:.4f} Sim={d.sim_hit_rate:.4f} AbsErr={d.abs_error_pp:.2f}pp"))
    lines += _breakdown_lines("Per-SLO-class calibration:", "SLO", pairs.by_slo)
    if r.goodput is not None and r.goodput.per_class:
        lines.append(("info", "Per-SLO-class goodput (real vs sim):"))
        for cls in sorted(r.goodput.per_class):
            g = r.goodput.per_class[cls]
            lines.append(("info", f"  {cls}: count={g.count} real_attain={g.real_slo_attainment:.3f} "
                                  f"sim_attain={g.sim_slo_attainment:.3f} real_rps={g.real_goodput_rps:.3f} "
                                  f"sim_rps={g.sim_goodput_rps:.3f}"))
    lines += _breakdown_lines("Per-model calibration:", "model", pairs.by_model)
    lines += [("info", f"Note: {n}") for n in r.notes or ()]
    rows = r.verdicts()
    if not r.passed:
        failed = sum(1 for row in rows if not row.within)
        lines.append(("warning", f"Calibration verdicts: {failed} of {len(rows)} out of tolerance"))
        lines += [("warning", row) for row in render_table(rows).splitlines()]
    return lines


def _judged(within: bool | None, text: str) -> tuple[str, str]:
    """A verdict's line: ``[WITHIN]`` / ``[EXCEEDS]`` appended (nothing when not judged), a warning when out."""
    mark = "" if within is None else f" [{'WITHIN' if within else 'EXCEEDS'}]"
    return ("warning" if within is False else "info", text + mark)


def print_summary(outcome: CalibrationOutcome, report_path: str, stream: TextIO | None = None) -> None:
    out = stream if stream is not None else sys.stderr
    for level, msg in summary_lines(outcome, report_path):
        print(f"{'WARN' if level == 'warning' else 'INFO'} {msg}", file=out)
