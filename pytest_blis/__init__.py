"""pytest-blis: calibration scenarios for a tiered-KV simulator of vLLM, as pytest items.

The plugin (``pytest_blis.plugin``, entry point ``blis``) collects ``*.blis.yaml`` files and provides
fixtures. For a user's own tests the pieces the fixtures work with are importable from here (loaded
on first use, so the plugin itself stays cheap to load):

- ``ServerSpec``: what a server must offer (block size, GPU blocks, offload config, emulator profile);
- ``load_scenario_file(path)`` / ``load_scenario_text(text)`` → ``list[SweepPoint]`` (``.spec`` is
  the validated ``Scenario``);
- ``build_plan(scenario, cell_id=, capacity=target.capacity(), base_dir=, capacity_of=None)`` → the workload
  plan ``blis_observe`` dispatches (``capacity_of(spec) -> req/s`` resolves a workload phase's
  ``rate: "Nx capacity"``, e.g. ``lambda spec: blis_sim.engine.burst_capacity(spec, options)``);
- ``engine_options(target, latency=coeffs, max_num_seqs=None, max_num_batched_tokens=None,
  total_kv_blocks=None)`` → the simulator's options for ``blis_replay`` (``None``: resolved on replay from
  the trace header, else the documented default; docs/engine.md, "Settings, resolved once");
- ``CellPaths(dir)``: where the steps write (``trace.yaml``, ``sim.json``, ``calibration.json``, ...);
- ``CellFailure``: the exception a failed cell raises (rendered as the compact table).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blis_sim import __version__

_LAZY = {
    "ServerSpec": "pytest_blis._scenario", "Scenario": "pytest_blis._scenario",
    "SweepPoint": "pytest_blis._scenario", "load_scenario_file": "pytest_blis._scenario",
    "load_scenario_text": "pytest_blis._scenario", "build_plan": "pytest_blis._phases",
    "engine_options": "pytest_blis._replay", "CellPaths": "pytest_blis._steps",
    "CellFailure": "pytest_blis._render",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pytest_blis' has no attribute {name!r}")

if TYPE_CHECKING:  # the names served lazily above, as the type checker sees them
    from pytest_blis._phases import build_plan as build_plan
    from pytest_blis._render import CellFailure as CellFailure
    from pytest_blis._replay import engine_options as engine_options
    from pytest_blis._scenario import (
        Scenario as Scenario,
        ServerSpec as ServerSpec,
        SweepPoint as SweepPoint,
        load_scenario_file as load_scenario_file,
        load_scenario_text as load_scenario_text,
    )
    from pytest_blis._steps import CellPaths as CellPaths
