"""A scenario's simulator sweep: one observation, replayed and judged at every simulator setting
(pytester, embedded emulator on the ``zero`` profile; see tests/test_plugin_run.py)."""
from __future__ import annotations

import json

import pytest

import blis_sim.emulator  # noqa: F401  (imported outside the inner runs: numpy loads once)
from blis_sim.engine import fit, replay  # noqa: F401
import blis_sim.kv  # noqa: F401
import blis_sim.observe.metrics  # noqa: F401
import blis_sim.sweep.axes  # noqa: F401
import pytest_blis._cell  # noqa: F401
import pytest_blis._plots  # noqa: F401
import pytest_blis._probe  # noqa: F401
import pytest_blis._simsweep  # noqa: F401

OFFLOAD = "kv_offload:\n  cpu_bytes_to_use: 67108864\n"
# 256 GPU blocks x 16 = 4096 tokens hold both 1024-token prefixes; 80 blocks (1280 tokens) do not
CELLS = """
defaults:
  server: {block_size: 16, num_gpu_blocks: 256, profile: zero, offload: off.yaml}
  expect: {path: gpu, check_ttft: false}
scenarios:
  any-cpu-tier:
    phases:
      - seed: {groups: 2, prefix_length: 1024}
      - repeat: {}
    simulator_sweep:
      kv_offload.cpu_bytes_to_use: [16MiB, 1GiB]
      max_num_seqs: [4, 256]
  small-gpu:
    phases:
      - seed: {groups: 2, prefix_length: 1024}
      - repeat: {}
    simulator_sweep:
      total_kv_blocks: [256, 80]
"""
FAST = ("-p", "no:hypothesispytest", "-p", "no:benchmark")


def test_every_setting_is_judged_and_a_failing_one_fails_the_cell(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", off=OFFLOAD)
    pytester.makefile(".blis.yaml", cells=CELLS)
    result = pytester.runpytest(*FAST)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*cells.blis.yaml::small-gpu::default: * verdict(s) out of tolerance",
        "[[]total_kv_blocks=256[]] kv_hit_rate?prefix_cache?*0.00pp*WITHIN",
        "[[]total_kv_blocks=80[]] kv_hit_rate?prefix_cache?*EXCEEDS",
        "simulator setting total_kv_blocks=80: worst hit-rate error *, * verdict(s) out of tolerance*",
    ])
    root = pytester.path / "blis-artifacts"
    passed = root / "cells.blis.yaml_any-cpu-tier_default"
    assert sorted(p.name for p in passed.glob("sim-*")) == ["sim-0", "sim-1", "sim-2", "sim-3"]
    report = json.loads((passed / "sim-3" / "calibration.json").read_text())
    assert report["hit_rate"]["within"]
    cells = {c["nodeid"]: c for c in json.loads((root / "summary.json").read_text())["cells"]}
    assert cells["cells.blis.yaml::small-gpu::default"]["max_error_pp"] > 5


def test_an_unknown_simulator_axis_is_a_collection_error(pytester: pytest.Pytester) -> None:
    pytester.makefile(".blis.yaml", cells="""
scenarios:
  x:
    phases: [{unique: {requests: 1}}]
    simulator_sweep:
      gpu_blocks: [10]
""")
    result = pytester.runpytest(*FAST)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*cells.blis.yaml:5: field 'scenarios.x.simulator_sweep.gpu_blocks*': *unknown axis 'gpu_blocks'*"])
