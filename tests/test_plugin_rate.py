"""A workload phase's ``rate``: req/s, or a multiple of the capacity the cell's simulator predicts
(blis_sim.engine.capacity), so that a load meant to saturate does on any machine."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from blis_sim.calibrate.capacity import is_saturated
from blis_sim.engine import EngineOptions, burst_capacity, run_outcome
from blis_sim.engine.capacity import sustained_capacity, with_rate
from blis_sim.errors import FormatError
from blis_sim.formats.workload import parse_workload_spec
from pytest_blis._phases import phase_spec
from pytest_blis._scenario import Phase

SPEC = """
version: "2"
seed: 3
aggregate_rate: 5
num_requests: 200
clients:
  - id: c
    rate_fraction: 1
    arrival: {process: poisson}
    input_distribution: {type: gaussian, params: {mean: 256, std_dev: 96, min: 64, max: 512}}
    output_distribution: {type: constant, params: {value: 16}}
"""
OPTIONS = EngineOptions(max_num_seqs=16, max_num_batched_tokens=1024, num_gpu_blocks=4096)


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    (tmp_path / "w.yaml").write_text(SPEC)
    return tmp_path


def test_a_load_at_twice_the_burst_capacity_saturates_the_simulated_server() -> None:
    spec = parse_workload_spec(SPEC)
    capacity = burst_capacity(spec, OPTIONS)
    assert burst_capacity(spec, EngineOptions(max_num_seqs=1, num_gpu_blocks=4096)) < capacity
    out = run_outcome(with_rate(spec, 2 * capacity), OPTIONS).outcome
    arrival, finish = out.loop.arrival_us, out.loop.arrival_us + out.e2e_us
    waiting = int((out.loop.first_token_us > arrival.max()).sum())  # still queued at the last arrival
    assert is_saturated(len(arrival), waiting)
    served = len(finish) / ((finish.max() - arrival.min()) / 1e6)
    assert served == pytest.approx(capacity, rel=0.1)
    # and half of it does not: the queue drains between arrivals
    out = run_outcome(with_rate(spec, 0.5 * capacity), OPTIONS).outcome
    assert not is_saturated(len(out.loop.arrival_us),
                            int((out.loop.first_token_us > out.loop.arrival_us.max()).sum()))


def test_with_rate_sets_every_phase_that_had_its_own() -> None:
    clients = SPEC[SPEC.index("clients:"):].replace("\n", "\n    ").replace("clients:", "    clients:", 1)
    spec = parse_workload_spec(SPEC[:SPEC.index("clients:")] + "phases:\n  - name: a\n    aggregate_rate: 1\n"
                               + clients + "\n  - {name: b, repeat: a}\n")
    fast = with_rate(spec, 40.0)
    assert fast.aggregate_rate == 40.0 and [p.aggregate_rate for p in fast.phases] == [40.0, None]
    assert [p.aggregate_rate for p in fast.resolved_phases()] == [40.0, 40.0]


def test_a_phase_rate_in_req_s_replaces_the_specs(spec_file: Path) -> None:
    phase = Phase.model_validate({"workload": "w.yaml", "rate": 12})
    assert phase_spec(phase, spec_file).aggregate_rate == 12.0
    assert phase_spec(Phase.model_validate({"workload": "w.yaml"}), spec_file).aggregate_rate == 5


def test_a_capacity_rate_asks_the_simulator_and_says_what_it_got(spec_file: Path) -> None:
    phase = Phase.model_validate({"workload": "w.yaml", "rate": "2.5x capacity"})
    notes: list[str] = []
    asked: list[int] = []

    def capacity_of(spec: object) -> float:
        asked.append(spec.num_requests)  # type: ignore[attr-defined]
        return 10.0

    assert phase_spec(phase, spec_file, capacity_of, notes).aggregate_rate == 25.0
    assert asked == [200]
    assert notes == ["w.yaml: rate 2.5x capacity = 2.5 x 10.00 req/s predicted = 25.00 req/s"]
    with pytest.raises(FormatError, match="needs a simulator to predict"):
        phase_spec(phase, spec_file)


def test_burst_capacity_is_deterministic() -> None:
    spec = parse_workload_spec(SPEC)
    assert burst_capacity(spec, OPTIONS) == burst_capacity(spec, OPTIONS)
    assert np.isfinite(burst_capacity(spec, OPTIONS, num_requests=20))


def test_sustained_capacity_is_the_rate_a_standing_queue_is_served_at() -> None:
    spec = parse_workload_spec(SPEC).with_overrides(num_requests=400)
    rate = sustained_capacity(spec, OPTIONS)
    assert rate == sustained_capacity(spec, OPTIONS)  # deterministic
    # offered 3x, the middle of the window's completions come at the same rate: the server's, not the load's
    assert sustained_capacity(spec, OPTIONS, offered=3.0) == pytest.approx(rate, rel=0.03)
    # the burst figure counts the batch filling and draining, below the steady rate
    assert burst_capacity(spec, OPTIONS) < rate
    # 1.2x of it saturates the simulated server, 0.8x does not
    for factor, saturated in ((1.2, True), (0.8, False)):
        loop = run_outcome(with_rate(spec, factor * rate), OPTIONS).outcome.loop
        waiting = int((loop.first_token_us > loop.arrival_us.max()).sum())
        assert is_saturated(len(loop.arrival_us), waiting) is saturated, factor


def test_sustained_capacity_refuses_a_window_without_a_standing_queue() -> None:
    spec = parse_workload_spec(SPEC)
    with pytest.raises(ValueError, match="queue did not stand"):
        sustained_capacity(spec, OPTIONS, num_requests=12)  # fewer than max_num_seqs: nothing ever waits
    with pytest.raises(ValueError, match="offered must be above 1"):
        sustained_capacity(spec, OPTIONS, offered=1.0)
