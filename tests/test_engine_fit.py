"""`fit` recovers the coefficients of a trace the engine generated itself (within 2 %), and a
fitted model can be validated on another trace. One client's arrivals are bursty (gamma, CV 5),
so that requests queue for admission and the admission time is identified too."""
from __future__ import annotations

from dataclasses import replace

import pytest

from blis_sim.engine.fitting import evaluate, fit
from blis_sim.engine.latency import FrontendCoefficients, LatencyCoefficients, StepCoefficients
from blis_sim.engine.run_spec import run_outcome
from blis_sim.engine.simulate import EngineOptions
from blis_sim.formats.workload import parse_workload_spec

STEADY_SPEC = """
version: "2"
seed: {seed}
aggregate_rate: 3
num_requests: 300
clients:
  - {{id: a, rate_fraction: {a}, prefix_group: pa, prefix_length: 512, arrival: {{process: poisson}},
     input_distribution: {{type: gaussian, params: {{mean: 256, std_dev: 128, min: 16, max: 1024}}}},
     output_distribution: {{type: exponential, params: {{mean: 48}}}}}}
  - {{id: b, rate_fraction: 0.3, prefix_group: pb, prefix_length: 256, arrival: {{process: poisson}},
     input_distribution: {{type: gaussian, params: {{mean: 128, std_dev: 64, min: 16, max: 512}}}},
     output_distribution: {{type: exponential, params: {{mean: 96}}}}}}
  - {{id: u, rate_fraction: {u}, arrival: {{process: poisson}},
     input_distribution: {{type: gaussian, params: {{mean: 1024, std_dev: 512, min: 32, max: 3000}}}},
     output_distribution: {{type: exponential, params: {{mean: 32}}}}}}
"""
#: the same clients with a fourth whose arrivals come in bursts: requests queue for admission
SPEC = STEADY_SPEC.replace("{a}", "0.3").replace("{u}", "0.2") + """  - {{id: s, rate_fraction: 0.2, arrival: {{process: gamma, cv: 5}},
     input_distribution: {{type: gaussian, params: {{mean: 256, std_dev: 64, min: 16, max: 512}}}},
     output_distribution: {{type: exponential, params: {{mean: 32}}}}}}
"""
STEADY_SPEC = STEADY_SPEC.replace("{a}", "0.4").replace("{u}", "0.3")
TRUTH = LatencyCoefficients(
    step=StepCoefficients(base_us=8000.0, per_prefill_token_us=6.0, per_decode_seq_us=30.0,
                          per_context_token_us=0.2, per_prefill_attention_us=0.002,
                          per_prefill_context_us=0.5),
    frontend=FrontendCoefficients(base_us=20000.0, per_inflight_us=500.0, admission_us=1500.0))
OPTS = EngineOptions(num_gpu_blocks=4000)


def generated(seed: int):
    spec = parse_workload_spec(SPEC.format(seed=seed))
    return run_outcome(spec, replace(OPTS, latency=TRUTH.to_step_model())).trace("spec")


@pytest.fixture(scope="module")
def fitted():
    trace = generated(7)
    return trace, fit(trace, OPTS, name="probe")  # starts from the (different) default model


def test_fit_recovers_known_coefficients_within_two_percent(fitted) -> None:
    _, c = fitted
    pairs = {"base": (c.step.base_us, 8000.0), "prefill": (c.step.per_prefill_token_us, 6.0),
             "decode": (c.step.per_decode_seq_us, 30.0), "context": (c.step.per_context_token_us, 0.2),
             "attention": (c.step.per_prefill_attention_us, 0.002),
             "prefill context": (c.step.per_prefill_context_us, 0.5),
             "frontend": (c.frontend.base_us, 20000.0), "inflight": (c.frontend.per_inflight_us, 500.0),
             "admission": (c.frontend.admission_us, 1500.0)}
    for name, (got, want) in pairs.items():
        assert abs(got - want) <= 0.02 * want, f"{name}: {got} vs {want}"


def test_fit_reports_its_own_error(fitted) -> None:
    _, c = fitted
    assert c.fit is not None and c.fit.trace == "probe" and c.fit.requests == 300
    assert c.fit.ttft_mape < 0.02 and c.fit.itl_mape < 0.02


def test_a_varied_trace_identifies_every_coefficient_within_tight_intervals(fitted) -> None:
    _, c = fitted
    assert c.fit.warnings == [] and c.fit.prior == "none" and c.fit.start == "default"
    for e in c.fit.coefficients:
        assert e.identified and e.ci_low <= e.value <= e.ci_high, e
        assert e.ci_high - e.ci_low < 0.02 * e.value, e


def test_a_fitted_model_validates_on_another_trace_and_a_wrong_one_does_not(fitted) -> None:
    _, c = fitted
    other = generated(11)
    good = evaluate(other, replace(OPTS, latency=c.to_step_model()), name="other")
    assert good.ttft_mape < 0.03
    wrong = evaluate(other, OPTS)  # the default coefficients
    assert wrong.ttft_mape > 5 * max(good.ttft_mape, 0.005)


def test_non_streamed_observe_rows_cannot_be_fitted() -> None:
    from pathlib import Path

    from blis_sim.errors import ConfigError
    from blis_sim.formats import load_trace

    vllm = Path(__file__).resolve().parents[1] / "samples" / "vllm-cpu"
    trace = load_trace(vllm / "trace.yaml", vllm / "trace.csv")  # streaming: false everywhere
    with pytest.raises(ConfigError, match="no completed request with a usable TTFT"):
        fit(trace, EngineOptions(model="tiny-llama", block_size=32, num_gpu_blocks=512),
            max_iterations=1)


def _as_probe(trace, head: str, tail: str, late_us: int):
    """``trace`` relabelled as a probe's: its first 100 rows in phase ``head`` with their first token
    ``late_us`` later (rows no model of the rest can fit), the others in ``tail``."""
    records = []
    for i, r in enumerate(sorted(trace.records, key=lambda r: r.arrival_time_us)):
        update: dict = {"phase": head if i < 100 else tail}
        if i < 100:
            update.update(first_chunk_time_us=r.first_chunk_time_us + late_us,
                          first_content_time_us=(r.first_content_time_us + late_us) if r.first_content_time_us else 0)
        records.append(r.model_copy(update=update))
    return trace.model_copy(update={"records": records})


def test_a_probe_with_a_sustain_phase_replays_its_ramp_but_does_not_fit_it() -> None:
    trace = generated(7)
    with_sustain = fit(_as_probe(trace, "ramp-64", "sustain-96", 200_000), OPTS)
    assert with_sustain.fit is not None and with_sustain.fit.requests == 200  # the ramp's 100 rows left out
    assert abs(with_sustain.step.base_us - 8000.0) <= 0.02 * 8000.0
    assert abs(with_sustain.frontend.base_us - 20000.0) <= 0.02 * 20000.0
    # without a sustain phase the ramp is fitted: its late first tokens pull the model off the truth
    without = fit(_as_probe(trace, "ramp-64", "cold-64-0", 200_000), OPTS)
    assert without.fit is not None and without.fit.requests == 300
    assert abs(without.frontend.base_us - 20000.0) > 0.1 * 20000.0


def test_a_fit_on_some_phases_replays_the_others_but_does_not_fit_them() -> None:
    trace = generated(7)
    late = _as_probe(trace, "late", "on-time", 200_000)  # the first 100 rows 200 ms late
    only = fit(late, OPTS, phases={"on-time"})
    assert only.fit is not None and only.fit.requests == 200
    assert abs(only.step.base_us - 8000.0) <= 0.02 * 8000.0
    every = fit(late, OPTS)
    assert abs(every.step.base_us - 8000.0) > 0.02 * 8000.0 or abs(every.frontend.base_us - 20000.0) > 400.0
