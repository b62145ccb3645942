"""pytest-html, optional: a calibration cell's row shows its verdicts, and its details embed the
verdict table and the three plots (hit-rates by definition and tier, TTFT CDF, TTFT per request).

``remember(item, rows, plots)`` is called by the cell (a no-op cost without pytest-html: it only
stashes what the cell wrote); :class:`HtmlHooks` is registered only when pytest-html is loaded. The
plots are SVG image extras (base64): ``--self-contained-html`` embeds them in the one file,
otherwise pytest-html writes them under ``assets/`` beside the report.
"""
from __future__ import annotations

import base64
import html
import json
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import pytest

from blis_sim.calibrate import render_table
from pytest_blis._session import SUMMARY_PROPERTY

_CELL = pytest.StashKey[tuple[str, list[tuple[str, str]]]]()  # (verdict table, [(svg base64, caption)])
COLUMNS = ("hit-rate: real / sim", "max error", "TTFT MAPE (noise)")


def remember(item: pytest.Item, rows: Sequence[Any], plots: Sequence[tuple[Path, str]]) -> None:
    """Keep the cell's verdict table and plots for its report (read back in the report hook)."""
    images = [(base64.b64encode(path.read_bytes()).decode("ascii"), caption) for path, caption in plots
              if path.exists()]
    item.stash[_CELL] = (render_table(rows), images)


def _summary(report: pytest.TestReport) -> dict[str, Any] | None:
    for name, value in getattr(report, "user_properties", []):
        if name == SUMMARY_PROPERTY:
            return json.loads(value)
    return None


def row_cells(cell: dict[str, Any] | None) -> list[str]:
    """The cell's three columns (empty for a test that is not a calibration cell)."""
    if cell is None:
        return ["<td></td>"] * len(COLUMNS)

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v * 100:.2f} %"

    hit = "-"
    if cell.get("headline"):
        hit = f"{html.escape(cell['headline'])}: {pct(cell.get('real_hit_rate'))} / {pct(cell.get('sim_hit_rate'))}"
        if cell.get("abs_error_pp") is not None:
            hit += f" ({cell['abs_error_pp']:.2f} pp)"
    worst = "-" if cell.get("max_error_pp") is None else f"{cell['max_error_pp']:.2f} pp"
    mape = "-"
    if cell.get("ttft_mape") is not None:
        mape = f"{cell['ttft_mape'] * 100:.1f} %"
        if cell.get("ttft_noise_floor") is not None:
            mape += f" ({cell['ttft_noise_floor'] * 100:.1f} %)"
        if not cell.get("ttft_checked", True):
            mape += ", not checked"
    return [f'<td class="col-blis">{v}</td>' for v in (hit, worst, mape)]


class HtmlHooks:
    """Registered only when pytest-html is loaded (its hooks are unknown to pytest otherwise)."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
        outcome = yield
        report = outcome.get_result()
        if report.when != "call" or _CELL not in item.stash:
            return
        from pytest_html import extras

        table, images = item.stash[_CELL]
        added = [extras.html(f"<pre>{html.escape(table)}</pre>")] if table else []
        added += [extras.svg(content, name=caption) for content, caption in images]
        report.extras = [*getattr(report, "extras", []), *added]

    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        cells[2:2] = [f"<th>{name}</th>" for name in COLUMNS]

    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        cells[2:2] = row_cells(_summary(report))
