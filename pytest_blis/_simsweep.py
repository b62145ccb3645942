"""A cell's simulator sweep (``simulator_sweep:`` in a scenario): the trace the cell observed once,
replayed and calibrated again at every combination of simulator settings, each judged with the
cell's own tolerances ("the hit-rate stays within 5 pp for CPU tiers from 1 to 8 GiB").

The settings are ``blis sweep``'s axes for a trace (docs/sweep.md): engine limits and GPU blocks,
a latency coefficient file (relative to the scenario file), any offload field (applied to the
offload config the cell replays with). Each setting writes its replay and report under
``<cell>/sim-<i>/`` and its verdicts join the cell's, prefixed by the setting; the cell is one
item, passing only if every setting passes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blis_sim.calibrate import CalibrateOptions, VerdictRow
from blis_sim.engine.coefficients import load_coefficients
from blis_sim.errors import ConfigError
from blis_sim.sweep.axes import SettingError, apply_settings, axis_kind
from blis_sim.sweep.base import with_offload
from pytest_blis._steps import CellPaths, calibrate_step, replay_step

if TYPE_CHECKING:
    from blis_sim.engine import EngineOptions
    from blis_sim.formats import Trace
    from pytest_blis._scenario import SweepPoint


def setting_label(setting: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items())


def sweep_verdicts(point: SweepPoint, trace: Trace, options: EngineOptions, cal_opts: CalibrateOptions, root: Path,
                   judged: Callable[[Any], list[VerdictRow]]) -> tuple[list[VerdictRow], list[str]]:
    """Every setting's verdict rows (``judged(report)``: the rows the cell judges; metric prefixed
    ``[setting]``) and one summary line per setting (its worst hit-rate error)."""
    spec = point.spec
    kinds = {name: axis_kind(name, base_kind="trace") for name in spec.simulator_sweep}
    base_dir = Path(point.file).parent
    rows: list[VerdictRow] = []
    lines: list[str] = []
    for i, setting in enumerate(spec.simulator_settings()):
        label = setting_label(setting)
        values = {k: kinds[k].read(v) for k, v in setting.items()}
        try:
            opts = apply_settings(options, values, kinds,
                                  load_latency=lambda p: load_coefficients(base_dir / p).to_step_model())
        except SettingError as exc:
            raise ConfigError(f"simulator_sweep setting {label}: {exc}", file=point.file,
                              field=f"scenarios.{point.scenario_name}.simulator_sweep.{exc.axis}") from None
        paths = CellPaths(root / f"sim-{i}")
        paths.root.mkdir(parents=True, exist_ok=True)
        replayed = with_offload(trace, opts.kv_offload) if opts.kv_offload is not None else trace
        results, metrics = replay_step(replayed, opts, paths)
        report = calibrate_step(trace, results, metrics, cal_opts, paths)
        mine = judged(report)
        rows += [replace(r, metric=f"[{label}] {r.metric}") for r in mine]
        worst = max((r.error for r in mine if r.unit == "pp"), default=0.0)
        failed = sum(not r.within for r in mine)
        lines.append(f"simulator setting {label}: worst hit-rate error {worst:.2f} pp, "
                     f"{failed} verdict(s) out of tolerance ({paths.root})")
    return rows, lines
