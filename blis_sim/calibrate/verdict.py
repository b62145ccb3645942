"""Verdicts as a gate: the exit code and a compact table of what passed and what failed.

API::

    exit_code(report) -> int                         EXIT_OK (0) if every verdict is within, else 1
    summarize_verdict(rows) -> Verdict               the report's ``verdict`` block ({passed, failed})
    render_table(rows, *, only_failed=False) -> str  fixed-width text, one verdict per line
    raise_if_failed(report) -> None                  VerdictFailed(message, report) when a verdict fails

Rows come from :meth:`CalibrationReport.verdicts` (``blis_sim.formats.report.VerdictRow``).
"""
from __future__ import annotations

from collections.abc import Sequence

from blis_sim.errors import EXIT_OK, EXIT_VERDICT_FAILED, VerdictFailed
from blis_sim.formats.report import CalibrationReport, Verdict, VerdictRow


def summarize_verdict(rows: Sequence[VerdictRow]) -> Verdict:
    failed = [r.metric for r in rows if not r.within]
    return Verdict(passed=not failed, failed=failed)


def exit_code(report: CalibrationReport) -> int:
    return EXIT_OK if report.passed else EXIT_VERDICT_FAILED


def _fmt_value(row: VerdictRow, value: float) -> str:
    # hit-rates are fractions shown as percentages; TTFT real/sim are mean µs; throughputs per second
    if row.unit == "rate":
        return f"{value:.2f}/s"
    if row.unit == "requests":
        return f"{value:.0f} tok"
    if row.unit == "faults":  # real: the fault's count over the window
        return f"{value:.0f}"
    if row.unit == "rel":  # a tier's service seconds over the window
        return f"{value * 1e3:.3f}ms"
    return f"{value * 100:.2f}%" if row.unit == "pp" else f"{value:.0f}us"


def _fmt_error(row: VerdictRow, value: float) -> str:
    if row.unit == "requests":
        return f"{value:.0f} req"
    if row.unit == "faults":
        return f"{value:.0f}"
    return f"{value:.2f}pp" if row.unit == "pp" else f"{value * 100:.1f}%"


def render_table(rows: Sequence[VerdictRow], *, only_failed: bool = False) -> str:
    """``metric  real  sim  error  tolerance  verdict`` lines, aligned; empty string for no rows."""
    shown = [r for r in rows if not (only_failed and r.within)]
    if not shown:
        return ""
    table = [("metric", "real", "sim", "error", "tolerance", "verdict")]
    for r in shown:
        table.append((r.metric, _fmt_value(r, r.real), _fmt_value(r, r.sim), _fmt_error(r, r.error),
                      _fmt_error(r, r.tolerance), "WITHIN" if r.within else "EXCEEDS"))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table)


def raise_if_failed(report: CalibrationReport) -> None:
    """For callers that gate by exception (the pytest plugin): the message carries the failure table."""
    rows = report.verdicts()
    failed = [r for r in rows if not r.within]
    if failed:
        names = ", ".join(r.metric for r in failed)
        raise VerdictFailed(f"{len(failed)} calibration verdict(s) out of tolerance: {names}\n"
                            + render_table(rows, only_failed=True), report=report)
