"""Calibrate: compare an observed trace with its simulated replay, with verdicts that gate CI.

Library API (what the pytest plugin calls; no argv involved)::

    from blis_sim.calibrate import CalibrateOptions, calibrate, raise_if_failed, render_table
    report = calibrate(trace, sim_results, sim_metrics, options=CalibrateOptions(hit_rate_tolerance_pp=5))
    report.passed                  # every verdict within tolerance
    report.verdicts()              # [VerdictRow(metric, real, sim, error, tolerance, within, unit)]
    print(render_table(report.verdicts(), only_failed=True))
    raise_if_failed(report)        # VerdictFailed (exit code 1) carrying the report

Modules: ``stats`` (MAPE, Pearson r, percentiles, quality), ``pairing`` (trace ↔ sim matching, warm-up,
network), ``hitrate`` (primary block, per-definition comparisons, per-request agreement), ``verdict``
(exit code, table), ``capacity`` (throughput against throughput, judged where saturated), ``tier_service`` (offload tier
bandwidths and per-transfer costs from the server's counters, simulated against real service seconds, the
fitted offload config), ``core`` (``calibrate``), ``summary`` (stderr log lines), ``cli`` (``blis calibrate``).
The report model lives in ``blis_sim.formats.report``. See docs/calibrate.md.
"""
from __future__ import annotations

from blis_sim.calibrate.core import CalibrateOptions, CalibrationOutcome, InputPaths, calibrate, calibrate_detailed
from blis_sim.calibrate.verdict import exit_code, raise_if_failed, render_table
from blis_sim.formats.report import CalibrationReport, VerdictRow, load_report, write_report

__all__ = [
    "CalibrateOptions", "CalibrationOutcome", "CalibrationReport", "InputPaths", "VerdictRow", "calibrate",
    "calibrate_detailed", "exit_code", "load_report", "raise_if_failed", "render_table", "write_report",
]
