"""``run_sweep``: every point of a sweep file around a base, as a table and plots.

Writes into ``out_dir``: ``points.jsonl`` (finished points, kept across runs: resume),
``sweep.csv`` and ``sweep.parquet`` (pyarrow), one row per point in point order, and
``plot-<axis>.png|svg`` per axis (matplotlib). The table is written again after an interruption,
with the points finished so far.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from blis_sim.errors import UsageError
from blis_sim.sweep.base import SweepBase, Task
from blis_sim.sweep.plots import PLOT_EXTRA, axis_plots, have_matplotlib
from blis_sim.sweep.rows import columns
from blis_sim.sweep.runner import Backend, run_tasks
from blis_sim.sweep.spec import SweepSpec
from blis_sim.sweep.store import PointStore, write_table


@dataclass
class SweepResult:
    rows: list[dict[str, Any]]
    columns: list[str]
    files: list[Path] = field(default_factory=list)
    complete: bool = True


def plan_tasks(base: SweepBase, sweep: SweepSpec) -> list[Task]:
    """Every point resolved against the base (every value checked before anything runs)."""
    raw = sweep.points(raw=True)
    return [base.task(i, p, sweep, raw=raw[i]) for i, p in enumerate(sweep.points())]


def table_rows(tasks: list[Task], store: PointStore) -> list[dict[str, Any]]:
    """The rows of the tasks the store holds, in point order."""
    return [{"point": t.index, **t.values, **fig} for t in tasks if (fig := store.get(t.key)) is not None]


def run_sweep(base: SweepBase, sweep: SweepSpec, out_dir: str | Path, *, backend: Backend | None = None,
              force: bool = False, plots: bool = True, progress: TextIO | None = None) -> SweepResult:
    out = Path(out_dir)
    backend = backend or Backend()
    tasks = plan_tasks(base, sweep)
    store = PointStore(out, force=force)
    axes = [a.name for a in sweep.axes]
    try:
        run_tasks(base.payload, tasks, store, backend, progress=progress)
    except BaseException as exc:
        rows = table_rows(tasks, store)
        if rows:  # what finished is in the table too, not only in points.jsonl
            write_table(rows, columns(rows, axes), out / "sweep.csv", out / "sweep.parquet")
        if progress and isinstance(exc, KeyboardInterrupt):
            print(f"sweep: interrupted: {len(rows)} of {len(tasks)} point(s) kept in {out}; the same "
                  "command resumes", file=progress)
        raise
    rows = table_rows(tasks, store)
    cols = columns(rows, axes)
    files = write_table(rows, cols, out / "sweep.csv", out / "sweep.parquet")
    if plots:
        files += sweep_plots(rows, cols, sweep, out, progress)
    return SweepResult(rows=rows, columns=cols, files=files)


def sweep_plots(rows: list[dict[str, Any]], cols: list[str], sweep: SweepSpec, out: Path,
                progress: TextIO | None) -> list[Path]:
    unknown = [m for m in sweep.plot.metrics if m not in cols]
    if unknown:
        i = sweep.plot.metrics.index(unknown[0])
        hit = ", ".join(c for c in cols if c.startswith("hit_rate.")) or "none"
        raise UsageError(f"plot metric {unknown[0]!r} is not a column of the table (hit-rates here: "
                         f"{hit}; figures: ttft_p99_ms, e2e_mean_ms, responses_per_sec, ...); the "
                         f"table is written", file=sweep.doc.file,
                         line=sweep.doc.line_of(("plot", "metrics", i)), field=f"plot.metrics.{i}")
    if not have_matplotlib():
        if progress:
            print(f"sweep: plots skipped: {PLOT_EXTRA}", file=progress)
        return []
    return axis_plots(rows, list(sweep.axes), sweep.plot.metrics, out, sweep.plot.format)
