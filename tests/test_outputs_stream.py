"""The streamed outputs give exactly what the whole-array formulas give.

* :func:`~blis_sim.engine.outputs.itl_summary` (the gap log read a chunk at a time: numpy's pairwise
  sum replayed over the chunks, ranks selected by float bits) against the mean and
  ``weighted_percentiles`` of the whole arrays, in memory and from a memory-mapped spill file.
* The ``--trace-output`` CSV written from columns against the same rows written as records, for a
  replay and a run, across the writer's chunk boundaries.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_sim.engine import outputs as O
from blis_sim.formats import trace_data as TD
from blis_sim.formats.trace_columns import read_trace_data

REPO = Path(__file__).resolve().parents[1]
BLIS = REPO / "samples" / "blis"


def _whole(values: np.ndarray, weights: np.ndarray, ps: tuple[float, ...]) -> tuple[float, list[float]]:
    v = values / 1e3
    total = int(weights.sum())
    return (float((v * weights).sum() / total) if total else 0.0), O.weighted_percentiles(v, weights, ps)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 3000), kind=st.sampled_from(["few", "rounded", "spread", "ties"]),
       chunk=st.sampled_from([128, 136, 1000, 1 << 20]), seed=st.integers(0, 2**32 - 1),
       zero_weights=st.booleans())
def test_itl_summary_equals_the_whole_arrays(n: int, kind: str, chunk: int, seed: int, zero_weights: bool,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    values = {"few": lambda: rng.choice([0.0, 1000.0, 2000.5, 33037.0], n),
              "rounded": lambda: np.round(rng.random(n) * 1e5, 1),
              "spread": lambda: rng.exponential(2e4, n) * 10.0 ** rng.integers(-3, 4, n),
              "ties": lambda: np.full(n, 12345.678)}[kind]()
    weights = rng.integers(0 if zero_weights else 1, 40, n).astype(np.int64)
    monkeypatch.setattr(O, "ITL_CHUNK", chunk)
    ps = (0, 50, 90, 95, 99, 100)
    assert O.itl_summary(values, weights, ps) == _whole(values, weights, ps)


def test_itl_summary_reads_a_spilled_log(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    gap = np.dtype([("value", np.float64), ("weight", np.int64)])
    rec = np.empty(200_003, dtype=gap)
    rec["value"] = rng.exponential(3e4, rec.size)
    rec["weight"] = rng.integers(1, 64, rec.size)
    with tempfile.TemporaryFile() as f:
        f.write(rec.tobytes())
        f.flush()
        mapped = np.memmap(f, dtype=gap, mode="r", shape=(rec.size,))
        monkeypatch.setattr(O, "ITL_CHUNK", 1 << 12)  # many chunks, several levels of halves
        got = O.itl_summary(mapped["value"], mapped["weight"], (90, 95, 99))
    assert got == _whole(rec["value"], rec["weight"], (90, 95, 99))


@pytest.mark.parametrize("chunk", [7, 65536])
def test_trace_output_from_columns_is_the_records_text(tmp_path: Path, chunk: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from blis_sim.engine.replay_trace import replay_outcome
    from blis_sim.engine.run_spec import run_outcome
    from blis_sim.engine.simulate import EngineOptions
    from blis_sim.formats import write_trace
    from blis_sim.formats.trace_columns import load_trace_columns
    from blis_sim.formats.workload import load_workload_spec

    monkeypatch.setattr(TD, "CHUNK_ROWS", chunk)
    opts = EngineOptions(model="qwen/qwen3-14b", num_gpu_blocks=2000)
    run = run_outcome(load_workload_spec(BLIS / "workload.yaml"), opts, num_requests=300)
    write_trace(run.trace_columns("workload.yaml"), tmp_path / "run.yaml", tmp_path / "run.csv")
    replay = replay_outcome(load_trace_columns(tmp_path / "run.yaml", tmp_path / "run.csv"), opts)
    write_trace(replay.trace_columns(), tmp_path / "re.yaml", tmp_path / "re.csv")
    for name, mode, outcome in (("run", "generated", run.trace("workload.yaml")), ("re", "replayed", replay.trace())):
        text = (tmp_path / f"{name}.csv").read_text()
        records = read_trace_data(tmp_path / f"{name}.csv")
        assert len(records) == 300
        # every row as records, each field: what a row-by-row writer would write
        assert TD.data_text(records, mode=mode) == text
        assert [r.__dict__ for r in records] == [r.__dict__ for r in outcome.records]
