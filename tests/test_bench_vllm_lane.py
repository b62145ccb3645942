"""The lane fidelity bench's load levels: a trace's Poisson arrivals come at the rate asked for."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from blis_sim.workload import generate_workload

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_vllm_lane.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_vllm_lane", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.mark.parametrize("seed", range(4))
def test_a_load_level_arrives_at_the_rate_asked_for(bench, seed: int) -> None:
    rate = 1.33  # the long mix at 0.8 x capacity: 40 unscaled arrivals realized 1.08-1.66 req/s over these seeds
    plan = generate_workload(bench.mix_spec("long", rate, 40, seed=seed))
    before = [r.arrival_us for r in plan.all_initial()]
    after = [r.arrival_us for r in bench.at_rate(plan, rate).all_initial()]
    assert len(after) == 40 and after == sorted(after) and after[0] == before[0]
    assert (len(after) - 1) / ((after[-1] - after[0]) / 1e6) == pytest.approx(rate, rel=1e-4)
    # the gaps keep their Poisson proportions: only the time axis is stretched
    gaps = [b - a for a, b in zip(before, before[1:])]
    new_gaps = [b - a for a, b in zip(after, after[1:])]
    k = (after[-1] - after[0]) / (before[-1] - before[0])
    assert all(g2 == pytest.approx(g * k, abs=2) for g, g2 in zip(gaps, new_gaps))
