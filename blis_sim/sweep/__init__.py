"""What-if sweeps and capacity searches over the simulator (design D10): `blis sweep`, `blis plan`.

Library API::

    from blis_sim.sweep import Backend, load_sweep_file, run_sweep, PlanQuestion, run_plan

    base = SweepBase(...)  # or blis_sim.sweep.cli.base_from_args(args): a trace or a workload spec
    result = run_sweep(base, load_sweep_file("sweep.yaml", base_kind=base.kind), "out/",
                       backend=Backend(ray_address="auto"))      # rows, columns, files
    answer = run_plan(base, question, "out/")                     # PlanAnswer: value + curve

Modules: :mod:`.axes` (what may vary), :mod:`.spec` (the sweep file), :mod:`.base` (base, point
tasks, one evaluation), :mod:`.rows` (a point's table row), :mod:`.store` (finished points, the
table), :mod:`.runner` (local process pool or Ray), :mod:`.run` (a sweep), :mod:`.plan` (a
search), :mod:`.plots`, :mod:`.cli`. See docs/sweep.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from blis_sim._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "blis_sim.sweep.base": ("Payload", "SweepBase", "Task", "evaluate"),
    "blis_sim.sweep.plan": ("PlanAnswer", "PlanQuestion", "run_plan"),
    "blis_sim.sweep.run": ("SweepResult", "run_sweep"),
    "blis_sim.sweep.runner": ("Backend", "run_tasks"),
    "blis_sim.sweep.spec": ("SweepSpec", "load_sweep_file", "parse_sweep_file"),
    "blis_sim.sweep.store": ("PointStore",),
})

if TYPE_CHECKING:  # the names served lazily above, as the type checker sees them
    from blis_sim.sweep.base import Payload as Payload, SweepBase as SweepBase, Task as Task, evaluate as evaluate
    from blis_sim.sweep.plan import PlanAnswer as PlanAnswer, PlanQuestion as PlanQuestion, run_plan as run_plan
    from blis_sim.sweep.run import SweepResult as SweepResult, run_sweep as run_sweep
    from blis_sim.sweep.runner import Backend as Backend, run_tasks as run_tasks
    from blis_sim.sweep.spec import (
        SweepSpec as SweepSpec,
        load_sweep_file as load_sweep_file,
        parse_sweep_file as parse_sweep_file,
    )
    from blis_sim.sweep.store import PointStore as PointStore
