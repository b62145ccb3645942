"""``*.blis.yaml`` → one collector per scenario → one ``pytest.Function`` per sweep point.

Items are ``pytest.Function`` subclasses built with ``callobj=`` (public API), so fixtures, ``-k``,
``-m``, ``--lf``, ``--junitxml`` and xdist all work; names never hold ``[``, ``]`` or ``::``
(pytest 9.2 ``--lf`` pitfall). Ids read ``minimal.blis.yaml::gpu-hit::prefix-1024``.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from blis_sim.errors import BlisError
from pytest_blis._render import CellFailure, render_failure

if TYPE_CHECKING:  # loaded when a scenario file is collected, not with the plugin
    from pytest_blis._scenario import SweepPoint

# pytest imports this module at start-up with the plugin: what a cell runs (the engine, the emulator,
# the scenario schema) is imported inside the functions that use it.

SUFFIXES = (".blis.yaml", ".blis.yml")


def is_scenario_file(path: Path) -> bool:
    return path.name.endswith(SUFFIXES)


class ScenarioFile(pytest.File):
    """A ``*.blis.yaml`` file; validated as a whole at collection (errors name file:line:field)."""

    def collect(self) -> Iterator[pytest.Collector]:
        from pytest_blis._scenario import iter_scenarios, load_scenario_file

        try:
            points = load_scenario_file(self.path)
        except BlisError as exc:
            raise self.CollectError(f"invalid scenario file: {exc}") from None
        for name, group in iter_scenarios(points):
            yield ScenarioNode.from_parent(self, name=name, points=group)


class ScenarioNode(pytest.Collector):
    """One scenario; its children are the sweep points."""

    def __init__(self, *, points: list[SweepPoint], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.points = points
        for mark in points[0].spec.marks:
            self.add_marker(mark)
        self.add_marker("blis")

    def collect(self) -> Iterator[pytest.Item]:
        for point in self.points:
            def cell(blis_run_cell: Any, _point: SweepPoint = point) -> None:
                blis_run_cell(_point)

            yield CalibrationItem.from_parent(self, name=point.name, callobj=cell, point=point)


class CalibrationItem(pytest.Function):
    """One calibration cell. Failures render as a compact table, not a traceback."""

    def __init__(self, *, point: SweepPoint, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.point = point

    def reportinfo(self) -> tuple[Path, int | None, str]:
        line = self.point.line - 1 if self.point.line else None
        return self.path, line, f"{self.point.scenario_name}::{self.point.name}"

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]) -> Any:  # type: ignore[override]
        full = self.config.getoption("blis_full_trace")
        if not full and isinstance(excinfo.value, CellFailure):
            return render_failure(excinfo.value)
        if not full and isinstance(excinfo.value, BlisError):
            return f"{self.nodeid}: {type(excinfo.value).__name__}: {excinfo.value}"
        return super().repr_failure(excinfo)
