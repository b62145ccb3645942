"""Compact rendering of a failed calibration cell: a title, the verdict table, notes.

The table itself is the calibrate library's (:func:`blis_sim.calibrate.render_table`), so the CLI and
the plugin print verdicts the same way.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CellFailure(AssertionError):
    """Raised by a calibration item whose verdicts failed, or whose cache path was not elicited.

    An ``AssertionError``, so reporters that tell failures from errors (Allure: failed vs broken,
    JUnit: failure vs error) file it as a failed check, not a crash."""

    title: str
    rows: Sequence[Any] = field(default_factory=list)  # blis_sim.calibrate.VerdictRow
    notes: Sequence[str] = field(default_factory=list)

    def __str__(self) -> str:
        return render_failure(self)


def render_failure(failure: CellFailure) -> str:
    from blis_sim.calibrate import render_table  # heavy: only when a cell failed

    parts = [failure.title]
    table = render_table(failure.rows)
    if table:
        parts.append(table)
    parts.extend(failure.notes)
    return "\n".join(parts)
