"""Replay and run with the real KV cache: INV-13, the hard error, time origins, multi-turn sharing,
warm-up windows, determinism and backend parity."""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from blis_sim.engine import _loop_py
from blis_sim.engine.replay_trace import BC10_MESSAGE, replay, replay_outcome
from blis_sim.engine.run_spec import run_outcome
from blis_sim.engine.simulate import EngineOptions
from blis_sim.errors import ConfigError, UsageError
from blis_sim.formats import (PhaseInfo, PytestBlisHeader, Trace, TraceHeader, TraceRecord, load_trace,
                              metrics_output_text, sim_results_text, write_trace)
from blis_sim.formats.offload import load_offload_config
from blis_sim.formats.workload import load_workload_spec

REPO = Path(__file__).resolve().parents[1]
BLIS = REPO / "samples" / "blis"
VLLM_CPU = REPO / "samples" / "vllm-cpu"
QWEN_KV = 163840.0


def without_settings(text: str) -> str:
    """A MetricsOutput's text without ``provenance.settings``: where each setting came from differs
    between a run and its replay by design (the replay takes the geometry and the offload tiers from
    the header the run wrote); every other byte must not."""
    cut = re.sub(r',\n    "settings": \{\n.*?\n    \}(?=\n)', "", text, count=1, flags=re.S)
    assert cut != text, "the provenance records the settings' sources"
    return cut


def opts(**kw) -> EngineOptions:
    base = dict(model="qwen/qwen3-14b", num_gpu_blocks=1000)
    base.update(kw)
    return EngineOptions(**base)


def rec(rid: int, **kw) -> TraceRecord:
    kw.setdefault("arrival_time_us", rid * 1_000_000)
    kw.setdefault("send_time_us", kw["arrival_time_us"])
    return TraceRecord(request_id=rid, **kw)


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory: pytest.TempPathFactory):
    """`run` of the sample workload with the sample offload config, written as a trace."""
    spec = load_workload_spec(BLIS / "workload.yaml")
    off = load_offload_config(BLIS / "offload.yaml", kv_bytes_per_token=QWEN_KV)
    out = run_outcome(spec, opts(kv_offload=off))
    d = tmp_path_factory.mktemp("run")
    write_trace(out.trace("workload.yaml"), d / "t.yaml", d / "t.csv")
    return out, load_trace(d / "t.yaml", d / "t.csv"), off


def test_run_then_replay_gives_identical_metrics_inv13(sample_run) -> None:
    out, trace, _ = sample_run
    assert trace.header.kv_offload is not None and trace.header.kv_offload.per_block_bytes == 2621440
    rep = replay_outcome(trace, opts())  # no flag: the header's kv_offload is used
    assert without_settings(metrics_output_text(rep.metrics())) == \
        without_settings(metrics_output_text(out.metrics()))
    run_src, rep_src = out.options.sources, rep.options.sources
    assert (run_src["kv_offload"], run_src["block_size"]) == ("flag", "flag")  # the run's config gives its block
    assert (rep_src["kv_offload"], rep_src["block_size"], rep_src["num_gpu_blocks"]) == ("header", "header", "flag")
    assert sim_results_text(rep.results) == sim_results_text(out.results)
    rates = {(e["definition"], e["tier"]): e for e in rep.outcome.hit_rates}
    assert rates[("prefix_cache", None)]["hit_rate"] > 0.3
    assert rates[("tiered", "1:fs")]["queries"] > 0


def test_replay_with_the_identical_flag_is_accepted_a_different_one_is_not(sample_run) -> None:
    out, trace, off = sample_run
    results, _ = replay(trace, opts(kv_offload=off))
    assert len(results) == 200
    bigger = off.model_copy(update={"cpu_bytes_to_use": 2 * off.cpu_bytes_to_use})
    with pytest.raises(UsageError, match="conflicts with the kv_offload config recorded"):
        replay(trace, opts(kv_offload=bigger))


def test_a_flag_cannot_add_offload_to_a_sim_trace_but_can_to_an_observe_trace(sample_run) -> None:
    _, trace, off = sample_run
    bare = trace.model_copy(update={"header": trace.header.model_copy(update={"kv_offload": None})})
    with pytest.raises(UsageError, match="cannot add one on replay"):
        replay(bare, opts(kv_offload=off))
    real = bare.model_copy(update={"header": bare.header.model_copy(update={"mode": "real"})})
    out = replay_outcome(real, opts(kv_offload=off))
    assert out.outcome.offload is not None


def test_tiered_observation_without_offload_is_a_hard_error() -> None:
    header = load_trace(BLIS / "trace-observed.yaml", BLIS / "trace.csv")
    bare = header.model_copy(update={"header": header.header.model_copy(update={"kv_offload": None})})
    assert bare.header.observed_kv_metrics.source == "tiered"
    with pytest.raises(ConfigError) as exc:
        replay(bare, opts())
    assert str(exc.value) == BC10_MESSAGE and "--kv-offload-config" in str(exc.value)
    # the GPU fallback source replays fine without an offload config
    obs = bare.header.observed_kv_metrics.model_copy(update={"source": "gpu-prefix-cache-fallback"})
    ok = bare.model_copy(update={"header": bare.header.model_copy(update={"observed_kv_metrics": obs})})
    results, _ = replay(ok, opts())
    assert len(results) == 200


def test_observe_trace_replays_on_a_relative_time_origin() -> None:
    trace = load_trace(VLLM_CPU / "trace.yaml", VLLM_CPU / "trace.csv")
    first_send = min(r.send_time_us for r in trace.records)
    assert first_send > 1_000_000_000_000_000  # epoch µs
    out = replay_outcome(trace, opts(model="tiny-llama", block_size=32, num_gpu_blocks=512))
    lp = out.outcome.loop
    assert lp.arrival_us.min() == 0.0
    by_id = {int(r): a for r, a in zip(out.outcome.table.request_id, lp.arrival_us)}
    rec0 = min(trace.records, key=lambda r: r.send_time_us)
    assert by_id[rec0.request_id] == 0.0
    assert lp.end_us < 1e9  # minutes, not an epoch
    m = out.metrics()
    assert m.completed_requests == len(trace.records)
    assert m.ttft_mean_ms > 0
    # prompts are the server's token counts; three prefix groups share their 512-token prefix
    rates = {(e.definition, e.tier): e for e in m.kv_hit_rates}
    assert rates[("prefix_cache", None)].hit_rate > 0.2


def _session_trace(same_session: bool) -> Trace:
    # round r's CSV input is everything so far: 100 | +50 out +40 new | +30 out +20 new
    rows = [rec(0, session_id="s", round_index=0, input_tokens=100, output_tokens=50),
            rec(1, session_id="s" if same_session else "t", round_index=1 if same_session else 0,
                input_tokens=190, output_tokens=30),
            rec(2, session_id="s" if same_session else "u", round_index=2 if same_session else 0,
                input_tokens=240, output_tokens=5)]
    return Trace(header=TraceHeader(mode="generated"), records=rows)


def test_multi_turn_rounds_reuse_the_previous_rounds_kv() -> None:
    out = replay_outcome(_session_trace(True), opts(num_gpu_blocks=100))
    cached = out.outcome.cached[:, 0].tolist()
    # round 0 computed 100 + 49 tokens (the last output is never fed back): 9 full blocks = 144
    # round 1 computed 190 + 29 = 219 tokens: 13 full blocks = 208 (its decode blocks included)
    assert cached == [0, 144, 208]
    independent = replay_outcome(_session_trace(False), opts(num_gpu_blocks=100))
    assert independent.outcome.cached[:, 0].tolist() == [0, 0, 0]


def test_prefix_groups_share_only_whole_prefix_blocks() -> None:
    rows = [rec(i, prefix_group="g", prefix_length=100, input_tokens=20, output_tokens=1)
            for i in range(3)]
    rows.append(rec(3, prefix_group="h", prefix_length=100, input_tokens=20, output_tokens=1))
    out = replay_outcome(Trace(header=TraceHeader(mode="generated"), records=rows),
                         opts(num_gpu_blocks=100))
    assert out.outcome.cached[:, 0].tolist() == [0, 96, 96, 0]


def test_warmup_rows_fill_the_cache_but_stay_out_of_the_hit_rate_window() -> None:
    rows = [rec(0, prefix_group="g", prefix_length=160, input_tokens=16, output_tokens=1,
                warmup=True, phase="warm"),
            rec(1, prefix_group="g", prefix_length=160, input_tokens=16, output_tokens=1,
                phase="main")]
    for measured, expect in ((False, (160, 176)), (True, (160, 352))):
        ext = PytestBlisHeader(phases=[PhaseInfo(name="warm", warmup=True, measured=measured),
                                       PhaseInfo(name="main")])
        trace = Trace(header=TraceHeader(mode="real", pytest_blis=ext), records=rows)
        out = replay_outcome(trace, opts(num_gpu_blocks=100))
        pc = out.outcome.hit_rates[0]
        assert (pc["hits"], pc["queries"]) == expect
        assert out.outcome.completed.all()  # the warm-up row was simulated either way


def test_same_inputs_and_seed_give_byte_identical_outputs(sample_run) -> None:
    _, trace, _ = sample_run
    a = replay_outcome(trace, opts())
    b = replay_outcome(trace, opts())
    assert metrics_output_text(a.metrics()) == metrics_output_text(b.metrics())
    assert sim_results_text(a.results) == sim_results_text(b.results)


def test_pure_python_loop_gives_byte_identical_outputs(sample_run) -> None:
    _, trace, _ = sample_run
    a = replay_outcome(trace, opts())
    b = replay_outcome(trace, opts(loop_backend=_loop_py))
    assert metrics_output_text(a.metrics()) == metrics_output_text(b.metrics())


def test_error_rows_are_not_replayed_and_an_empty_trace_is_an_error() -> None:
    rows = [rec(0, input_tokens=50, output_tokens=2), rec(1, input_tokens=50, status="error")]
    results, metrics = replay(Trace(header=TraceHeader(mode="real"), records=rows), opts())
    assert [r.request_id for r in results] == [0] and metrics.injected_requests == 1
    with pytest.raises(ConfigError, match="empty trace"):
        replay(Trace(header=TraceHeader(mode="real"), records=[]), opts())


def test_header_geometry_is_used_unless_overridden() -> None:
    from blis_sim.formats import KVGeometry

    ext = PytestBlisHeader(kv_geometry=KVGeometry(block_size=32, num_gpu_blocks=64))
    trace = Trace(header=TraceHeader(mode="real", pytest_blis=ext),
                  records=[rec(0, input_tokens=100, output_tokens=1)])
    out = replay_outcome(trace, EngineOptions())
    assert (out.outcome.block_size, out.outcome.num_gpu_blocks) == (32, 64)
    out = replay_outcome(trace, EngineOptions(block_size=16, num_gpu_blocks=500))
    assert (out.outcome.block_size, out.outcome.num_gpu_blocks) == (16, 500)


def test_an_unservable_request_is_dropped_not_stalled() -> None:
    rows = [rec(0, input_tokens=5000, output_tokens=1), rec(1, input_tokens=10, output_tokens=1)]
    _, metrics = replay(Trace(header=TraceHeader(mode="generated"), records=rows),
                        opts(num_gpu_blocks=10))
    assert metrics.dropped_unservable == 1 and metrics.completed_requests == 1


def test_frontend_term_grows_with_load() -> None:
    from blis_sim.engine.latency import FrontendCoefficients, LatencyCoefficients, StepCoefficients

    coeffs = LatencyCoefficients(
        step=StepCoefficients(base_us=1000.0, per_prefill_token_us=0.0, per_decode_seq_us=0.0,
                              per_context_token_us=0.0),
        frontend=FrontendCoefficients(base_us=100.0, per_inflight_us=50.0))
    rows = [rec(i, arrival_time_us=i, input_tokens=10, output_tokens=3) for i in range(3)]
    out = replay_outcome(Trace(header=TraceHeader(mode="generated"), records=rows),
                         opts(latency=coeffs.to_step_model()))
    assert out.outcome.frontend_us.tolist() == [100.0, 150.0, 200.0]
    assert replace(out.options).latency.frontend_per_inflight_us == 50.0


def test_the_kv_twin_gives_the_same_replay() -> None:
    from blis_sim.kv import COMPILED

    if not COMPILED:
        pytest.skip("the Cython KV core is not built")
    trace = load_trace(BLIS / "trace.yaml", BLIS / "trace.csv")
    a = replay_outcome(trace, opts(kv_backend="cython"))
    b = replay_outcome(trace, opts(kv_backend="python", loop_backend=_loop_py))
    assert metrics_output_text(a.metrics()) == metrics_output_text(b.metrics())


def _port_cases() -> list[tuple[str, object]]:
    """Traces and specs that use every part of the port: prefix groups, unique prompts, session
    rounds, a warm-up window (its counter snapshot), offload tiers and preemption."""
    from blis_sim.formats.workload import parse_workload_spec

    rng = np.random.default_rng(7)
    rows, t = [], 0
    for i in range(80):
        t += int(rng.exponential(100_000))
        grouped = rng.random() < 0.6
        rows.append(rec(i, arrival_time_us=t, prefix_group=f"g{rng.integers(0, 3)}" if grouped else "",
                        prefix_length=int(rng.integers(16, 600)) if grouped else 0,
                        input_tokens=int(rng.integers(1, 500)), output_tokens=int(rng.integers(0, 120)),
                        warmup=i < 10, phase="warm" if i < 10 else "main"))
    ext = PytestBlisHeader(phases=[PhaseInfo(name="warm", warmup=True, measured=False), PhaseInfo(name="main")])
    off = load_offload_config(BLIS / "offload.yaml", kv_bytes_per_token=QWEN_KV)
    return [("warm-up window, tiers", (Trace(header=TraceHeader(mode="real", pytest_blis=ext), records=rows),
                                       opts(num_gpu_blocks=120, kv_offload=off))),
            ("sessions", (parse_workload_spec(SESSIONS), opts(num_gpu_blocks=300, kv_offload=off)))]


@pytest.mark.parametrize("case", range(2))
def test_the_compiled_port_records_what_the_python_port_records(case: int, monkeypatch) -> None:
    """On the compiled cache the loop talks to ``RequestPort``; ``KVPort`` on the same cache must
    give the same outcome: per-request first admissions, window hit-rates, metrics."""
    from blis_sim.engine import kvport, simulate
    from blis_sim.kv import COMPILED

    if not COMPILED:
        pytest.skip("the Cython KV core is not built")
    _, (base, options) = _port_cases()[case]

    def go() -> object:
        if isinstance(base, Trace):
            return replay_outcome(base, replace(options, kv_backend="cython")).outcome
        return run_outcome(base, replace(options, kv_backend="cython")).outcome

    a = go()
    monkeypatch.setattr(simulate, "kv_port", lambda kv, content, window_first=-1:
                        kvport.KVPort(kv, content, window_first))
    b = go()
    assert a.cached.tolist() == b.cached.tolist() and a.cached.any()
    assert a.admitted.tolist() == b.admitted.tolist()
    assert a.hit_rates == b.hit_rates
    assert np.array_equal(a.loop.finish_us, b.loop.finish_us, equal_nan=True)
    assert a.loop.preemption_count == b.loop.preemption_count


@pytest.mark.parametrize("case", range(2))
def test_the_compiled_ports_c_calls_answer_as_its_methods(case: int, monkeypatch) -> None:
    """The compiled loop calls ``RequestPort``'s C functions (``c_calls``); through its Python
    methods (a port without ``c_calls``) the same run must give the same outcome."""
    from blis_sim.engine import simulate
    from blis_sim.kv import COMPILED

    if not COMPILED:
        pytest.skip("the Cython KV core is not built")
    _, (base, options) = _port_cases()[case]

    class MethodsOnly:
        """The port, its ``c_calls`` hidden."""

        def __init__(self, port: object) -> None:
            self._port = port
            self.lookup, self.admit, self.grow = port.lookup, port.admit, port.grow
            self.computed, self.preempt, self.finish = port.computed, port.preempt, port.finish

        def __getattr__(self, name: str) -> object:
            if name == "c_calls":
                raise AttributeError(name)
            return getattr(self._port, name)

        def __len__(self) -> int:
            return len(self._port)

    def go() -> object:
        if isinstance(base, Trace):
            return replay_outcome(base, replace(options, kv_backend="cython")).outcome
        return run_outcome(base, replace(options, kv_backend="cython")).outcome

    a = go()
    real = simulate.kv_port
    monkeypatch.setattr(simulate, "kv_port", lambda *args, **kw: MethodsOnly(real(*args, **kw)))
    b = go()
    assert a.cached.tolist() == b.cached.tolist() and a.cached.any()
    assert a.admitted.tolist() == b.admitted.tolist()
    assert a.hit_rates == b.hit_rates and a.kv_counters == b.kv_counters
    for name in ("finish_us", "first_token_us", "first_sched_us", "itl_values"):
        assert np.array_equal(getattr(a.loop, name), getattr(b.loop, name), equal_nan=True)
    assert a.loop.preemption_count == b.loop.preemption_count and a.loop.steps == b.loop.steps


SESSIONS = """
version: "2"
seed: 5
aggregate_rate: 4
num_requests: 40
clients:
  - id: chat
    rate_fraction: 1.0
    streaming: true
    arrival: {process: poisson}
    input_distribution:  {type: gaussian, params: {mean: 256, std_dev: 64, min: 32, max: 1024}}
    output_distribution: {type: gaussian, params: {mean: 64, std_dev: 16, min: 16, max: 256}}
    reasoning:
      reason_ratio_distribution: {type: constant, params: {value: 0}}
      multi_turn: {max_rounds: 3, think_time_us: 200000, context_growth: accumulate}
"""


def test_closed_loop_sessions_run_and_replay_identically(tmp_path: Path) -> None:
    from blis_sim.formats.workload import parse_workload_spec

    out = run_outcome(parse_workload_spec(SESSIONS), opts(num_gpu_blocks=2000))
    src = out.outcome.table.source
    later = [i for i, r in enumerate(src) if r.round_index > 0]
    assert later, "the plan released follow-up rounds"
    lp = out.outcome.loop
    prev = {(r.session_id, r.round_index): i for i, r in enumerate(src)}
    for i in later:
        p = prev[(src[i].session_id, src[i].round_index - 1)]
        assert lp.arrival_us[i] == np.ceil(lp.finish_us[p] + 200000)  # after the previous + think
        assert out.outcome.cached[i, 0] > 0  # reuses the previous rounds' KV
    write_trace(out.trace("s.yaml"), tmp_path / "t.yaml", tmp_path / "t.csv")
    trace = load_trace(tmp_path / "t.yaml", tmp_path / "t.csv")
    assert trace.header.session_context_growth == "accumulate"
    rep = replay_outcome(trace, opts(num_gpu_blocks=2000))
    assert without_settings(metrics_output_text(rep.metrics())) == \
        without_settings(metrics_output_text(out.metrics()))


def _counter(path: Path, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            if s.name == name:
                return s.value
    raise AssertionError(f"{name} not in {path}")


def test_replay_of_the_real_vllm_trace_matches_its_prefix_cache_counters() -> None:
    """The real vLLM 0.32 run (block 32, 512 GPU blocks): the simulated prefix-cache hit-rate over
    the same requests lands within 1 pp of the server's counter delta."""
    name = "vllm:prefix_cache_hits_total"
    hits = _counter(VLLM_CPU / "metrics-after.txt", name) - _counter(VLLM_CPU / "metrics-before.txt", name)
    name = "vllm:prefix_cache_queries_total"
    queries = (_counter(VLLM_CPU / "metrics-after.txt", name)
               - _counter(VLLM_CPU / "metrics-before.txt", name))
    trace = load_trace(VLLM_CPU / "trace.yaml", VLLM_CPU / "trace.csv")
    out = replay_outcome(trace, opts(model="tiny-llama", block_size=32, num_gpu_blocks=512))
    sim = out.outcome.hit_rates[0]
    assert sim["definition"] == "prefix_cache"
    assert abs(sim["hit_rate"] - hits / queries) < 0.01


def test_window_hit_rates_equal_the_kv_counters_when_every_row_is_in_the_window(sample_run) -> None:
    out, trace, _ = sample_run
    rep = replay_outcome(trace, opts())
    assert rep.outcome.loop.preemption_count == 0
    ours = {(e["definition"], e["tier"]): (e["hits"], e["queries"]) for e in rep.outcome.hit_rates}
    c = rep.outcome.kv_counters
    assert ours[("prefix_cache", None)] == (c["prefix_cache_hits"], c["prefix_cache_queries"])
    assert ours[("external", None)] == (c["external_hits"], c["external_queries"])
    for src in ("device", "host", "disk"):
        assert ours[("by_source", src)][0] == c["cached_by_source"][src]
    for label, t in c["tiers"].items():
        assert ours[("tiered", label)] == (t["chunk_hits"], t["chunk_queries"])


@pytest.mark.parametrize("blocks", [120, 200])
def test_a_tiny_cache_preempts_instead_of_stalling_and_both_loops_agree(blocks: int) -> None:
    """With 200 blocks, three requests that loaded their 1024-token prefixes from the tiers hold
    192 blocks and none can grow (vLLM would stall): the latest is preempted and recomputed."""
    trace = load_trace(BLIS / "trace.yaml", BLIS / "trace.csv")
    a = replay_outcome(trace, opts(num_gpu_blocks=blocks))
    b = replay_outcome(trace, opts(num_gpu_blocks=blocks, loop_backend=_loop_py))
    assert a.outcome.loop.preemption_count > 0
    assert a.metrics().completed_requests == 200
    assert metrics_output_text(a.metrics()) == metrics_output_text(b.metrics())


@pytest.mark.parametrize("seed", range(8))
def test_random_traces_on_small_caches_complete_and_both_loops_agree(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows, t = [], 0
    for i in range(int(rng.integers(5, 60))):
        t += int(rng.exponential(200_000))
        grouped = rng.random() < 0.6
        rows.append(rec(i, arrival_time_us=t, prefix_group=f"g{rng.integers(0, 3)}" if grouped else "",
                        prefix_length=int(rng.integers(16, 600)) if grouped else 0,
                        input_tokens=int(rng.integers(1, 500)), output_tokens=int(rng.integers(0, 120))))
    off = load_offload_config(BLIS / "offload.yaml",
                              kv_bytes_per_token=float(rng.choice([163840, 16384, 1638400])))
    knobs = dict(num_gpu_blocks=int(rng.integers(40, 400)), max_num_seqs=int(rng.integers(1, 32)),
                 max_num_batched_tokens=int(rng.integers(16, 2048)),
                 long_prefill_token_threshold=int(rng.choice([0, 0, 64, 256])),
                 kv_offload=off if rng.random() < 0.6 else None)
    trace = Trace(header=TraceHeader(mode="real"), records=rows)
    a = replay_outcome(trace, opts(**knobs))
    b = replay_outcome(trace, opts(**knobs, loop_backend=_loop_py))
    m = a.metrics()
    assert metrics_output_text(m) == metrics_output_text(b.metrics())
    assert m.completed_requests + m.dropped_unservable == len(rows)


def test_observed_sessions_reuse_prompt_blocks_but_not_generated_ones() -> None:
    """The real vLLM session cell (docs/vllm-cpu-calibration.md): 2 sessions × 4 rounds, a shared
    256-token system prompt, 100 new tokens and 64 outputs per round, 32-token blocks. The client
    sends back the planned output text, not what the server generated, so round r+1 reuses round
    r's prompt blocks only: the server's cached tokens were [0, 256, 352, 352, 512, 512, 672, 672]."""
    rows, rid = [], 0
    for r in range(4):
        for s in range(2):
            rows.append(rec(rid, arrival_time_us=10_000_000 * rid, session_id=f"s{s}", round_index=r,
                            prefix_group="sys", prefix_length=256, input_tokens=100 + 164 * r,
                            output_tokens=64))
            rid += 1
    out = replay_outcome(Trace(header=TraceHeader(mode="real"), records=rows),
                         opts(model="tiny-llama", block_size=32, num_gpu_blocks=512))
    assert out.outcome.cached[:, 0].tolist() == [0, 256, 352, 352, 512, 512, 672, 672]
    # a simulated client sends back what was generated: decode blocks are reused too
    gen = replay_outcome(Trace(header=TraceHeader(mode="generated"), records=rows),
                         opts(model="tiny-llama", block_size=32, num_gpu_blocks=512))
    assert gen.outcome.cached[:, 0].tolist() == [0, 256, 416, 416, 576, 576, 736, 736]


def test_phases_replay_closed_loop_at_their_boundaries() -> None:
    """Phase b was sent 1 ms after phase a started (the server drained a fast); the simulated a
    takes longer, so b starts when a has drained instead of being batched with it."""
    from blis_sim.engine.latency import LatencyCoefficients, StepCoefficients

    model = LatencyCoefficients(step=StepCoefficients(
        base_us=1000.0, per_prefill_token_us=1.0, per_decode_seq_us=10.0,
        per_context_token_us=0.0)).to_step_model()
    t0 = 1_700_000_000_000_000  # epoch µs, as observe records them
    rows = [rec(0, arrival_time_us=t0, input_tokens=100, output_tokens=5, phase="a"),
            rec(1, arrival_time_us=t0 + 1000, input_tokens=20, output_tokens=2, phase="b"),
            rec(2, arrival_time_us=t0 + 1500, input_tokens=20, output_tokens=2, phase="b")]
    out = replay_outcome(Trace(header=TraceHeader(mode="real"), records=rows),
                         opts(latency=model, num_gpu_blocks=100))
    lp = out.outcome.loop
    assert lp.arrival_us.tolist() == [0.0, lp.finish_us[0], lp.finish_us[0] + 500.0]
    assert out.outcome.loop.ttft_us[1] == 1020.0  # alone in its first step, as on the server
    # without phases the same rows are batched with request 0
    flat = [r.model_copy(update={"phase": ""}) for r in rows]
    mixed = replay_outcome(Trace(header=TraceHeader(mode="real"), records=flat),
                           opts(latency=model, num_gpu_blocks=100))
    assert mixed.outcome.loop.arrival_us[1] == 1000.0 and mixed.outcome.loop.ttft_us[1] > 1020.0


def test_a_trace_read_as_columns_and_a_prepared_trace_replay_like_the_records(sample_run,
                                                                             tmp_path: Path) -> None:
    """`blis replay` reads the trace as columns; a sweep prepares it once and replays it under
    several options: both give what replaying the record list gives, every time."""
    from blis_sim.engine import prepare_trace
    from blis_sim.formats.trace_columns import load_trace_columns

    _, trace, _ = sample_run
    write_trace(trace, tmp_path / "t.yaml", tmp_path / "t.csv")
    columns = load_trace_columns(tmp_path / "t.yaml", tmp_path / "t.csv")
    prepared = prepare_trace(columns)
    for o in (opts(), opts(num_gpu_blocks=300, max_num_seqs=8)):
        expected = replay_outcome(trace, o)
        want = (metrics_output_text(expected.metrics()), sim_results_text(expected.results))
        for got in (replay_outcome(columns, o), replay_outcome(prepared, o)):
            assert (metrics_output_text(got.metrics()), sim_results_text(got.results)) == want
        assert [r.__dict__ for r in replay_outcome(prepared, o).trace().records] == \
            [r.__dict__ for r in expected.trace().records]


def test_content_plan_prefix_spec_shares_what_the_hashed_prefix_holds() -> None:
    # prefix_spec's shared block count is precomputed for all requests at once; it must be the
    # per-request rule: min(shared prefix, prompt, the group's hashed prefix) in full blocks
    from blis_sim.engine.content import ContentPlan

    rng = np.random.default_rng(7)
    n, bs = 400, 16
    group = rng.integers(-1, 5, n).astype(np.int32)
    group[group == 4] = 3                                # group 4 named but never used
    shared = np.where(group >= 0, rng.integers(0, 300, n), 0).astype(np.int64)
    shared[rng.random(n) < 0.1] = 0                      # grouped requests sharing nothing
    prompt = rng.integers(1, 400, n).astype(np.int64)
    session = np.where(rng.random(n) < 0.1, 0, -1).astype(np.int32)
    plan = ContentPlan(seed=3, block_size=bs, prompt_len=prompt, output_len=np.ones(n, np.int64),
                       group=group, shared_prefix=shared, session=session,
                       prev_round=np.full(n, -1, np.int64), new_input=prompt.copy(),
                       keys=[str(i) for i in range(n)], group_names=["a", "b", "c", "d", "e"],
                       session_names=["s"])
    for i in range(n):
        spec = plan.prefix_spec(i)
        if session[i] >= 0:
            assert spec is None
            continue
        prefix, blocks, _, _ = spec
        if group[i] < 0:
            assert (len(prefix), blocks) == (0, 0)
            continue
        assert len(prefix) == shared[group == group[i]].max() // bs
        assert blocks == min(shared[i] // bs, prompt[i] // bs, len(prefix))


def test_a_sequential_trace_replays_request_by_request() -> None:
    """A client with one request in flight sent each request 1 ms after the last was sent (the
    server was that fast); the simulated requests take longer. Open loop, each arrives while the
    last is still running and the lag grows along the trace; sequential, each is alone in its
    first step, as on the server, and starts when the simulated previous one has finished."""
    from blis_sim.engine.latency import LatencyCoefficients, StepCoefficients

    model = LatencyCoefficients(step=StepCoefficients(
        base_us=1000.0, per_prefill_token_us=1.0, per_decode_seq_us=10.0,
        per_context_token_us=0.0)).to_step_model()
    t0 = 1_700_000_000_000_000
    rows = [rec(i, arrival_time_us=t0 + 1000 * i, input_tokens=100, output_tokens=3, phase="p") for i in range(6)]
    trace = Trace(header=TraceHeader(mode="real"), records=rows)
    seq = replay_outcome(trace, opts(latency=model, num_gpu_blocks=100, sequential=True)).outcome.loop
    assert seq.ttft_us.tolist() == [1100.0] * 6
    assert all(seq.arrival_us[i] == max(1000.0 * i, seq.finish_us[i - 1]) for i in range(1, 6))
    open_loop = replay_outcome(trace, opts(latency=model, num_gpu_blocks=100)).outcome.loop
    assert open_loop.arrival_us.tolist() == [1000.0 * i for i in range(6)]
    assert np.all(np.diff(open_loop.ttft_us) > 0) and open_loop.ttft_us[-1] > 1.5 * 1100.0  # the lag grows


def test_sequential_replay_keeps_session_rounds_together() -> None:
    a = replay_outcome(_session_trace(True), opts()).outcome
    b = replay_outcome(_session_trace(True), opts(sequential=True)).outcome
    assert a.cached.tolist() == b.cached.tolist()


def test_a_sorted_trace_s_table_shares_its_columns_and_a_shuffled_one_replays_the_same() -> None:
    from blis_sim.engine.requests import table_from_trace
    from blis_sim.formats.trace_columns import TraceColumns

    recs = [rec(i, input_tokens=20 + i, output_tokens=3, prefix_group="g" if i % 2 else "",
                prefix_length=16 if i % 2 else 0) for i in range(6)]
    header = TraceHeader(mode="generated", time_unit="microseconds")
    data = TraceColumns.from_records(recs)
    table = table_from_trace(header, data)
    assert np.shares_memory(table.request_id, data.array("request_id"))  # not a copy per column
    assert np.shares_memory(table.output_len, data.array("output_tokens"))
    assert table.next_round.tolist() == [-1] * 6 and table.think_us.tolist() == [0.0] * 6
    shuffled = TraceColumns.from_records([recs[k] for k in (3, 0, 5, 1, 4, 2)])
    other = table_from_trace(header, shuffled)
    for name in ("request_id", "arrival_us", "prompt_len", "output_len", "group", "shared_prefix"):
        assert getattr(other, name).tolist() == getattr(table, name).tolist(), name
    a = replay(Trace(header=header, records=recs), opts())
    b = replay(Trace(header=header, records=[recs[k] for k in (3, 0, 5, 1, 4, 2)]), opts())
    assert sim_results_text(a[0]) == sim_results_text(b[0])


def test_a_trace_row_past_the_simulators_tokens_per_request_is_a_config_error() -> None:
    recs = [rec(0, input_tokens=10, output_tokens=2), rec(7, input_tokens=2**31 - 2, output_tokens=4)]
    header = TraceHeader(mode="generated", time_unit="microseconds")
    with pytest.raises(ConfigError, match=r"request_id 7: a prompt of 2147483646 tokens and 4 output"):
        replay(Trace(header=header, records=recs), opts())
