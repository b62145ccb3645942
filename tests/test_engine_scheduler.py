"""The step loop's scheduler rules on small hand-checked cases, on both loop backends.

Latency model for every case: step = 1000 µs + 1 µs per prefill token + 10 µs per decode
sequence (no context term), no frontend term. The KV side is the block-counting port of
tests/engine_ports.py, so block arithmetic is easy to follow by hand.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_ports import CountingPort  # noqa: E402

from blis_sim.engine import _loop_py  # noqa: E402
from blis_sim.engine import scheduler as S  # noqa: E402
from blis_sim.engine.latency import LatencyCoefficients, StepCoefficients  # noqa: E402
from blis_sim.errors import SimulationError  # noqa: E402

MODEL = LatencyCoefficients(step=StepCoefficients(
    base_us=1000.0, per_prefill_token_us=1.0, per_decode_seq_us=10.0,
    per_context_token_us=0.0)).to_step_model()


def _compiled():
    try:
        from blis_sim.engine import _loop
    except ImportError:
        if os.environ.get("BLIS_REQUIRE_EXT"):
            raise
        pytest.skip("the Cython step loop is not built")
    return _loop


@pytest.fixture(params=["cython", "python"])
def loop(request: pytest.FixtureRequest):
    return _compiled() if request.param == "cython" else _loop_py


def sim(loop, arrivals, prompts, outputs, port=None, **cfg):
    w = S.Workload(arrival_us=np.array(arrivals, dtype=float), prompt_len=np.array(prompts),
                   output_len=np.array(outputs))
    port = port or CountingPort(num_blocks=10_000)
    return S.simulate(w, port, MODEL, S.SchedulerConfig(**cfg), log_steps=True, backend=loop), port


def test_token_budget_chunks_a_long_prompt_and_running_requests_go_first(loop) -> None:
    # t=0: 100 + 1948 of 3000 tokens fill the 2048 budget (1000 + 2048 = 3048 µs).
    # t=3048: request 0 decodes, request 1's 1052 remaining tokens, request 2 (arrived at 500)
    #         its 10: 1000 + 1062 + 10 = 2072 µs. t=5120: two decodes, 1020 µs.
    r, _ = sim(loop, [0, 0, 500], [100, 3000, 10], [3, 2, 1])
    assert r.step_dur.tolist() == [3048.0, 2072.0, 1020.0]
    assert r.ttft_us.tolist() == [3048.0, 5120.0, 4620.0]
    assert r.e2e_us.tolist() == [6140.0, 6140.0, 4620.0]
    assert r.step_features[:, 1].tolist() == [2048.0, 1062.0, 0.0]
    # ITL samples: one gap of 2072 µs (request 0), two of 1020 µs
    assert r.itl_values.tolist() == [2072.0, 1020.0] and r.itl_weights.tolist() == [1, 2]


def test_max_num_seqs_keeps_the_second_request_waiting(loop) -> None:
    r, _ = sim(loop, [0, 0], [10, 10], [2, 2], max_num_seqs=1)
    # 1010 (prefill) + 1010 (decode) for request 0, then the same for request 1
    assert r.ttft_us.tolist() == [1010.0, 3030.0]
    assert r.e2e_us.tolist() == [2020.0, 4040.0]
    assert r.first_sched_us.tolist() == [0.0, 2020.0]


def test_long_prefill_threshold_chunks_each_request(loop) -> None:
    r, _ = sim(loop, [0, 0], [250, 10], [1, 1], long_prefill_token_threshold=100)
    # step 1: 100 of request 0 + 10 of request 1; then 100, then 50
    assert r.step_features[:, 1].tolist() == [110.0, 100.0, 50.0]
    assert r.ttft_us.tolist() == [1110.0 + 1100.0 + 1050.0, 1110.0]


def test_preemption_by_recompute_frees_the_latest_admitted(loop) -> None:
    # 4 blocks of 16 tokens. Both prompts fit (1 block each); decoding needs a second block at
    # token 17 each (4 used), a third at token 33: request 1 (admitted last) is preempted, its
    # blocks freed, and it recomputes prompt + generated tokens once request 0 is done.
    port = CountingPort(num_blocks=4, block_size=16)
    r, port = sim(loop, [0, 0], [16, 16], [40, 40], port=port)
    assert r.preemptions.tolist() == [0, 1] and r.preemption_count == 1
    assert ("preempt", 1) in port.calls
    assert r.num_out.tolist() == [40, 40]
    assert r.finish_us[0] < r.finish_us[1]
    # request 1's recompute step prefills 16 + 17 generated tokens = 33
    assert 33.0 in r.step_features[:, 1].tolist()
    # its first token stays the one streamed before the preemption
    assert r.first_token_us[1] == r.first_token_us[0]


def test_a_loading_request_waits_for_its_load_and_skips_recompute(loop) -> None:
    # request 0: 64 of its 100 prompt tokens are in the offload tiers, loading for 5000 µs;
    # request 1 (10 tokens) is not blocked by it.
    port = CountingPort(num_blocks=100, external_hits={0: 64}, load_us={0: 5000.0})
    r, port = sim(loop, [0, 0], [100, 10], [1, 1], port=port)
    assert r.ttft_us[1] == 1010.0
    # at 5000 the load is done: only the 36 remaining tokens are computed (1036 µs)
    assert r.ttft_us[0] == 5000.0 + 1036.0
    assert r.step_features[:, 1].tolist() == [10.0, 36.0]
    assert port.calls[0] == ("admit", 0, 0, 0.0)  # no compute scheduled with the load


def test_gpu_hit_tokens_are_not_computed(loop) -> None:
    port = CountingPort(num_blocks=100, local_hits={0: 96})
    r, _ = sim(loop, [0], [100], [1], port=port)
    assert r.step_features[:, 1].tolist() == [4.0]


def test_horizon_stops_the_run_and_reports_unfinished(loop) -> None:
    r, _ = sim(loop, [0, 0], [10, 10], [100, 2], horizon_us=5000.0)
    assert np.isnan(r.finish_us[0]) and r.status[0] == S.RUNNING
    assert r.status[1] == S.FINISHED
    assert r.end_us <= 5000.0 + 1100.0


def test_idle_gaps_are_skipped_not_spun(loop) -> None:
    r, _ = sim(loop, [0, 1_000_000], [10, 10], [1, 1])
    assert r.steps == 2 and r.ttft_us.tolist() == [1010.0, 1010.0]


def test_session_round_arrives_after_the_previous_finishes_plus_think_time(loop) -> None:
    w = S.Workload(arrival_us=np.array([0.0, 0.0]), prompt_len=np.array([10, 20]),
                   output_len=np.array([2, 1]), next_round=np.array([1, -1]),
                   think_us=np.array([0.0, 500.5]))
    r = S.simulate(w, CountingPort(100), MODEL, S.SchedulerConfig(), backend=loop)
    # round 0 finishes at 2020; round 1 arrives at ceil(2020 + 500.5) = 2521
    assert r.arrival_us[1] == 2521.0 and r.ttft_us[1] == 1020.0


def test_a_request_larger_than_the_cache_is_reported_not_spun(loop) -> None:
    w = S.Workload(arrival_us=np.array([0.0]), prompt_len=np.array([100]),
                   output_len=np.array([1]))
    with pytest.raises(SimulationError, match="cannot make progress"):
        S.simulate(w, CountingPort(num_blocks=2), MODEL, S.SchedulerConfig(), backend=loop)


def test_both_loops_agree_on_random_workloads() -> None:
    compiled = _compiled()
    rng = np.random.default_rng(3)
    for trial in range(5):
        n = 60
        arrivals = np.sort(rng.integers(0, 200_000, n)).astype(float)
        prompts = rng.integers(1, 900, n)
        outputs = rng.integers(1, 80, n)
        cfg = dict(max_num_seqs=int(rng.integers(2, 16)), max_num_batched_tokens=int(rng.integers(64, 1024)),
                   long_prefill_token_threshold=int(rng.integers(0, 200)))
        local = {i: int(rng.integers(0, 3)) * 16 for i in range(n)}
        ext = {i: 32 for i in range(n) if rng.random() < 0.2}
        blocks = int(rng.integers(60, 200))
        out = []
        for loop in (compiled, _loop_py):
            port = CountingPort(num_blocks=blocks, local_hits=dict(local),
                                external_hits=dict(ext), load_us={i: 3000.0 for i in ext})
            r, _ = sim(loop, arrivals, prompts, outputs, port=port, **cfg)
            out.append(r)
        a, b = out
        for name in ("first_token_us", "finish_us", "itl_sum_us", "num_out", "preemptions",
                     "status", "itl_values", "itl_weights", "step_dur", "step_features"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=f"{trial}:{name}")
        assert a.steps == b.steps and a.preemption_count == b.preemption_count


class _NoRoomForThePromotion(CountingPort):
    """The lookup saw the tiers, but the admission loaded nothing (no room in the CPU tier)."""

    def admit(self, i: int, num_new_tokens: int, now: float):
        self.calls.append(("admit", i, num_new_tokens, now))
        if not self._fit(i, num_new_tokens + self.external_hits.get(i, 0)):
            return None
        return (0, now)


def test_an_admission_that_loads_nothing_computes_the_prompt_once(loop) -> None:
    port = _NoRoomForThePromotion(num_blocks=100, external_hits={0: 64})
    r, port = sim(loop, [0], [100], [1], port=port)
    assert r.step_features[:, 1].tolist() == [100.0] and r.ttft_us[0] == 1100.0
    assert [c for c in port.calls if c[0] == "admit"] == [("admit", 0, 0, 0.0)]


def test_a_request_past_the_loops_int32_token_positions_is_refused(loop) -> None:
    # the loop keeps token positions as int32: a prompt + output over 2^31 - 1 is refused up front
    w = S.Workload(arrival_us=np.array([0.0, 0.0]), prompt_len=np.array([10, 2**31 - 5]),
                   output_len=np.array([1, 5]))
    with pytest.raises(SimulationError, match=r"request index 1: a prompt of 2147483643 tokens"):
        S.simulate(w, CountingPort(num_blocks=10_000), MODEL, S.SchedulerConfig(), backend=loop)


def test_without_session_rounds_the_arrivals_are_the_callers_not_a_copy(loop) -> None:
    arrivals = np.array([0.0, 10.0])
    w = S.Workload(arrival_us=arrivals, prompt_len=np.array([10, 10]), output_len=np.array([1, 1]),
                   next_round=np.full(2, -1), think_us=np.zeros(2))
    r = S.simulate(w, CountingPort(100), MODEL, S.SchedulerConfig(), backend=loop)
    assert r.arrival_us is arrivals
    w = S.Workload(arrival_us=arrivals, prompt_len=np.array([10, 10]), output_len=np.array([2, 1]),
                   next_round=np.array([1, -1]), think_us=np.array([0.0, 5.0]))
    r = S.simulate(w, CountingPort(100), MODEL, S.SchedulerConfig(), backend=loop)
    assert r.arrival_us is not arrivals and arrivals.tolist() == [0.0, 10.0]  # the caller's untouched
