"""Session-wide state: resolved options, servers started for the run, cell summaries, and the
terminal summary / JSON summary file written at the end.

Under xdist each worker is its own session: it starts its own embedded emulators, and its cell
summaries reach the controller through ``report.user_properties`` (key ``blis_cell``), which is
how the controller prints one summary for the whole run.
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

import pytest

from pytest_blis._options import BlisOptions

# pytest imports this module at start-up with the plugin: what a cell runs (the engine, the emulator,
# the scenario schema) is imported inside the functions that use it.

OPTIONS = pytest.StashKey[BlisOptions]()
STATE = pytest.StashKey["SessionState"]()
SUMMARY_PROPERTY = "blis_cell"
MAX_CONCURRENCY = pytest.StashKey[int]()  # highest scenario concurrency among the items that will run


def note_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """After collection and deselection: remember the highest concurrency the cells will use (every
    xdist worker sees the same full list, so every worker's probe is the same)."""
    levels = [item.point.spec.concurrency for item in items if hasattr(item, "point")]
    config.stash[MAX_CONCURRENCY] = max(levels, default=1)


@dataclass
class CellSummary:
    """What the terminal summary prints for one cell (JSON-serialisable).

    ``headline`` names the hit-rate the cell is about (``by_source/device`` for a GPU-hit cell,
    ``by_source/host`` for CPU, ``by_source/disk`` for storage, ``prefix_cache`` otherwise, or the
    guide's primary ``hit_rate`` block when the server has none of those); ``real_hit_rate``,
    ``sim_hit_rate`` and ``abs_error_pp`` are that one's; ``max_error_pp`` is the largest error over
    every definition and tier compared.
    """

    nodeid: str
    outcome: str
    path: str = "any"
    headline: str | None = None
    real_hit_rate: float | None = None
    sim_hit_rate: float | None = None
    abs_error_pp: float | None = None
    max_error_pp: float | None = None
    definitions: int = 0
    ttft_mape: float | None = None
    ttft_checked: bool = True
    ttft_gated: bool = False  # the scenario judges TTFT (expect.check_ttft), whether or not this run did
    ttft_threshold: float | None = None
    ttft_noise_floor: float | None = None  # the MAPE the host's timing noise alone explains
    hit_rate_tolerance_pp: float | None = None
    note: str = ""


@dataclass
class SessionState:
    """Things this process started and must stop; closed in ``pytest_unconfigure``."""

    closers: list[Any] = field(default_factory=list)
    cells: list[CellSummary] = field(default_factory=list)
    # Content namespace of this run on external servers: a long-lived server keeps earlier runs'
    # prefixes cached, so each run's prompts must differ from the last run's (the controller draws
    # it, workers receive it). Embedded emulators start empty and use "" (reproducible content).
    namespace: str = ""

    def close(self) -> None:
        while self.closers:
            closer = self.closers.pop()
            try:
                closer()
            except Exception:  # stopping one server must not keep the others running
                pass


def worker_id() -> str:
    # Not the `worker_id` fixture: the plugin must work with `-p no:xdist` too.
    return os.environ.get("PYTEST_XDIST_WORKER", "master")


def worker_index() -> int:
    wid = worker_id()
    return int(wid[2:]) if wid.startswith("gw") and wid[2:].isdigit() else 0


class XdistHooks:
    """Registered only when xdist is present."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:  # pragma: no cover - runs in the controller
        node.workerinput["blis_artifacts_dir"] = str(node.config.stash[OPTIONS].artifacts_dir)
        node.workerinput["blis_namespace"] = node.config.stash[STATE].namespace


def new_state(config: pytest.Config) -> SessionState:
    """This process's state; a worker takes the controller's content namespace."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "blis_namespace" in workerinput:
        return SessionState(namespace=workerinput["blis_namespace"])
    return SessionState(namespace=secrets.token_hex(4))


def report_header(config: pytest.Config) -> list[str]:
    opts = config.stash[OPTIONS]
    target = ", ".join(opts.server_urls) if opts.server_urls else "embedded emulator (one per worker)"
    try:  # the KV core's backend (the engine loop follows the same switches)
        from blis_sim.kv import COMPILED
        backend = "cython" if COMPILED else "python"
    except Exception as exc:  # a broken build must not hide the header
        backend = f"unavailable ({type(exc).__name__})"
    return [
        f"blis: server {target}; simulator backend {backend}; "
        f"tolerances {opts.hit_rate_tolerance_pp:g} pp hit-rate, {opts.ttft_mape_threshold:g} TTFT MAPE",
        f"blis: artifacts in {opts.artifacts_dir}",
    ]


def _short_id(nodeid: str) -> str:
    """``scenarios/minimal.blis.yaml::gpu-hit::p`` → ``minimal.blis.yaml::gpu-hit::p`` (as cells name themselves)."""
    path, _, rest = nodeid.partition("::")
    return f"{path.rsplit('/', 1)[-1]}::{rest}"


def collect_cells(terminalreporter: pytest.TerminalReporter) -> list[CellSummary]:
    """One summary per calibration cell that ran: what the cell recorded, or, for a cell that failed
    before it could (server unreachable, bad offload config), its outcome and first error line."""
    cells = []
    for key in ("passed", "failed", "error", "skipped"):
        for rep in terminalreporter.stats.get(key, []):
            if getattr(rep, "when", "call") not in ("call", "setup"):
                continue
            recorded = [v for n, v in getattr(rep, "user_properties", []) if n == SUMMARY_PROPERTY]
            for value in recorded:
                cell = CellSummary(**json.loads(value))
                cell.outcome = rep.outcome
                cells.append(cell)
            is_cell = str(getattr(rep, "location", ("",))[0]).endswith((".blis.yaml", ".blis.yml"))
            if not recorded and is_cell and rep.outcome != "passed":
                first = next((ln for ln in rep.longreprtext.splitlines() if ln.strip()), "")
                cells.append(CellSummary(nodeid=_short_id(rep.nodeid), outcome=rep.outcome, note=first[:200]))
    return sorted(cells, key=lambda c: c.nodeid)


def _pct(v: float | None) -> str:
    return "   -   " if v is None else f"{v * 100:6.2f}%"


def _pp(v: float | None) -> str:
    return "    -  " if v is None else f"{v:6.2f}"


def summary_lines(cells: list[CellSummary]) -> list[str]:
    """The table: one line per cell (hit-rate the cell is about, worst error over all definitions,
    TTFT MAPE and beside it the host's noise floor), then a note line under any cell that has one."""
    width = max([len(c.nodeid) for c in cells] + [4])
    lines = [f"{'cell'.ljust(width)}  outcome  hit-rate            real     sim   err(pp)  max-err(pp)  "
             f"ttft-mape  noise"]
    for c in cells:
        mape = "      -  " if c.ttft_mape is None else f"{c.ttft_mape * 100:8.1f}%"
        mape += "      -" if c.ttft_noise_floor is None else f"  {c.ttft_noise_floor * 100:4.1f}%"
        mape += "" if c.ttft_checked or c.ttft_mape is None else " (not checked)"
        lines.append(f"{c.nodeid.ljust(width)}  {c.outcome:7}  {(c.headline or '-'):17} {_pct(c.real_hit_rate)} "
                     f"{_pct(c.sim_hit_rate)}  {_pp(c.abs_error_pp)}  {_pp(c.max_error_pp)}      {mape}")
        if c.note:
            lines.append(f"{' ' * width}    {c.note}")
    return lines


def terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    cells = collect_cells(terminalreporter)
    if not cells:
        return
    tr = terminalreporter
    tr.write_sep("=", "blis calibration summary")
    for line in summary_lines(cells):
        tr.write_line(line)
    opts = config.stash[OPTIONS]
    opts.artifacts_dir.mkdir(parents=True, exist_ok=True)
    path = opts.artifacts_dir / "summary.json"
    path.write_text(json.dumps({"cells": [asdict(c) for c in cells]}, indent=2) + "\n")
    tr.write_line(f"blis: summary written to {path}")
