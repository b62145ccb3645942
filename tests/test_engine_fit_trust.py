"""`fit` can be trusted: it returns its best iterate, says which coefficients the data cannot pin
down (and what would), flags implausible coefficients and saturated traces, and regularises toward
the roofline prior."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from blis_sim.engine.fit_checks import estimates
from blis_sim.engine.fit_solve import Design
from blis_sim.engine.fitting import _to_coefficients, evaluate, fit
from blis_sim.engine.latency import (FrontendCoefficients, LatencyCoefficients, StepCoefficients,
                                     get_hardware)
from blis_sim.engine.models import KNOWN_MODELS
from blis_sim.engine.prior import COEFFICIENT_NAMES, physics_prior, resolve_prior
from blis_sim.engine.run_spec import run_outcome
from blis_sim.engine.simulate import EngineOptions
from blis_sim.formats.workload import parse_workload_spec

#: prompts 929-1047 tokens, as in the issue's 2 req/s trace: prefill token and attention costs
#: trade off freely
NARROW = """
version: "2"
seed: 3
aggregate_rate: {rate}
num_requests: {n}
clients:
  - {{id: u, rate_fraction: 1.0, arrival: {{process: poisson}},
     input_distribution: {{type: gaussian, params: {{mean: 988, std_dev: 30, min: 929, max: 1047}}}},
     output_distribution: {{type: gaussian, params: {{mean: 160, std_dev: 50, min: 64, max: 256}}}}}}
"""
TRUTH = LatencyCoefficients(
    step=StepCoefficients(base_us=8000.0, per_prefill_token_us=6.0, per_decode_seq_us=30.0,
                          per_context_token_us=0.2, per_prefill_attention_us=0.002),
    frontend=FrontendCoefficients(base_us=20000.0, per_inflight_us=500.0))
OPTS = EngineOptions(num_gpu_blocks=4000)
QWEN_H100 = physics_prior(KNOWN_MODELS["qwen/qwen3-14b"], get_hardware("H100"))


def narrow_trace(truth: LatencyCoefficients = TRUTH, rate: float = 2, n: int = 200):
    spec = parse_workload_spec(NARROW.format(rate=rate, n=n))
    return run_outcome(spec, replace(OPTS, latency=truth.to_step_model())).trace("spec")


@pytest.fixture(scope="module")
def narrow_fit():
    trace = narrow_trace()
    return trace, fit(trace, OPTS, name="narrow", bootstrap_resamples=50)


def objective(report) -> float:
    return report.ttft_mape + report.itl_mape


def test_fit_returns_the_best_iterate_not_the_last(narrow_fit) -> None:
    trace, c = narrow_fit
    r = c.fit
    tried = [it for it in r.convergence if it.kind != "start"]
    assert r.convergence[0].kind == "start" and len(tried) >= 3
    returned = objective(r)
    assert returned == pytest.approx(r.convergence[r.best_iteration].objective)
    # every iterate replayed on its own: none reproduces the trace better than the answer
    for it in tried:
        again = evaluate(trace, replace(OPTS, latency=_to_coefficients(np.array(it.values))
                                        .to_step_model()))
        assert objective(again) == pytest.approx(it.objective, abs=1e-12)
        assert returned <= objective(again) + 1e-12
    # on this trace the iteration does not settle: its last iterate is worse than the answer
    assert tried[-1].objective > returned


def test_collinear_prompts_are_named_with_the_data_that_would_separate_them(narrow_fit) -> None:
    _, c = narrow_fit
    text = "\n".join(c.fit.warnings)
    assert "per_prefill_attention_us not identified" in text
    assert "per_prefill_token_us not identified" in text
    assert "prompts span 929-1047 tokens; add prompts from 256 to" in text
    est = {e.name: e for e in c.fit.coefficients}
    assert not est["step.per_prefill_attention_us"].identified
    assert est["frontend.base_us"].identified
    # no prefill read a context (no shared prefix, one chunk each): the file leaves it to the decode's
    assert c.step.per_prefill_context_us is None
    assert c.fit.condition_number is not None and c.fit.condition_number > 50


def test_with_the_prior_unidentified_coefficients_stay_physical() -> None:
    physical = _to_coefficients(np.array([v or 0.0 for v in QWEN_H100.values[:6]] + [15000, 100, 0]))
    trace = narrow_trace(physical)
    c = fit(trace, OPTS, name="narrow", prior=QWEN_H100, bootstrap_resamples=20)
    r = c.fit
    assert r.prior.startswith("roofline") and "H100" in r.prior
    for e in r.coefficients[:5]:
        assert e.prior is not None and e.plausible_low <= e.value <= e.plausible_high, e
    # the data fix prefill token + attention only in combination: the prior picks the split
    assert c.step.per_prefill_attention_us == pytest.approx(QWEN_H100.values[4], rel=0.25)
    without = fit(trace, OPTS, name="narrow", bootstrap_resamples=0)
    assert without.fit.prior == "none"


def test_a_saturated_trace_is_warned_and_implausible_coefficients_are_named() -> None:
    physical = _to_coefficients(np.array([v or 0.0 for v in QWEN_H100.values[:6]] + [15000, 100, 0]))
    trace = narrow_trace(physical, rate=40, n=160)  # ~2x what the engine can serve
    c = fit(trace, OPTS, name="saturated", prior=QWEN_H100, max_iterations=4,
            bootstrap_resamples=10)
    r = c.fit
    assert any(w.startswith("the trace looks saturated") for w in r.warnings)
    # implausible values are bounded, not merely reported: every one within the prior's range,
    # and one held at a bound says so
    for e in r.coefficients:
        assert e.plausible_low is not None and e.plausible_low <= e.value <= e.plausible_high, e
        short = e.name.removeprefix("step.")
        if e.value in (e.plausible_high, e.plausible_low) and e.value:
            assert any(w.startswith(f"{short} = ") and "bound" in w for w in r.warnings)
    assert not any("implausible" in w for w in r.warnings)


def test_a_fit_that_cannot_reproduce_its_trace_says_so() -> None:
    # the server batched up to 256 sequences; the replay is told 1: no coefficients can fix that
    trace = narrow_trace(rate=8, n=80)
    c = fit(trace, replace(OPTS, max_num_seqs=1), max_iterations=2, bootstrap_resamples=0)
    # the search finds TTFTs that fit, but one sequence a step cannot give the server's ITLs
    assert c.fit.ttft_mape + c.fit.itl_mape > 0.5
    assert any(w.startswith("the fit reproduces its own trace poorly (") and "ITL MAPE" in w
               for w in c.fit.warnings), c.fit.warnings


def test_plausibility_names_each_coefficient_out_of_the_prior_range() -> None:
    n = 40
    rng = np.random.default_rng(1)
    x = rng.uniform(1, 2, (n, 9))
    design = Design(x, x @ np.ones(9), np.ones(n), np.arange(n))

    class Table:
        prompt_len = np.full(n, 1000)

    coef = np.array([110_000.0, 59.0, 63.0, 0.05, 0.0018, 0.05, 15_000.0, 51_000.0, 0.0])  # the issue's
    ests, warnings = estimates(coef, coef, np.tile(coef, (5, 1)), np.ones(9), design, QWEN_H100,
                               Table(), np.zeros((1, 6)), np.zeros(n))
    named = {w.split(" = ")[0] for w in warnings if "implausible" in w}
    assert named == {"base_us", "frontend.per_inflight_us"}
    assert [e.name for e in ests] == list(COEFFICIENT_NAMES)


def test_the_prior_comes_from_flags_or_the_header_and_needs_the_hardware() -> None:
    assert resolve_prior(model="qwen/qwen3-14b")[0] is None
    assert "no --hardware" in resolve_prior(model="qwen/qwen3-14b")[1]
    assert resolve_prior(model="unknown", hardware="H100")[0] is None
    prior, label = resolve_prior(model="qwen/qwen3-14b", hardware="h100")
    assert prior is not None and prior.values == QWEN_H100.values and "qwen/qwen3-14b" in label

    class Header:
        class server:
            model = "Qwen/Qwen3-14B"

    prior, label = resolve_prior(hardware="H100", header=Header())
    assert prior is not None and "trace header" in label


def jittered(trace, cv: float, seed: int):
    """``trace`` with each TTFT and each decode span scaled by 1 ± cv (uniform, seeded): the
    noise of a real server, which turns near-collinear columns into free trade-offs."""
    rng = np.random.default_rng(seed)
    records = []
    for r in trace.records:
        ttft, span = rng.uniform(1 - cv, 1 + cv, 2)
        first = r.send_time_us + int((r.first_chunk_time_us - r.send_time_us) * ttft)
        last = first + int((r.last_chunk_time_us - r.first_chunk_time_us) * span)
        records.append(r.model_copy(update={
            "first_chunk_time_us": first, "last_chunk_time_us": last,
            "first_content_time_us": first if r.first_content_time_us else 0}))
    return trace.model_copy(update={"records": records})


def prefill_us(coeffs: LatencyCoefficients, tokens: int) -> float:
    """One step prefilling ``tokens`` tokens from scratch."""
    return coeffs.to_step_model().step_time(
        np.array([1.0, tokens, 0.0, 0.0, 0.0, tokens * (tokens + 1) / 2]))


#: off the prior (attention 0.0025 against its 0.00184) but within its plausible range
NOISY_TRUTH = _to_coefficients(np.array([9000.0, 50.0, 70.0, 0.05, 0.0025, 0.05, 5000.0, 200.0, 0.0]))


@pytest.mark.parametrize("seed", [0, 2])
def test_on_noisy_narrow_prompts_the_prior_keeps_long_prompts_priced_right(seed: int) -> None:
    trace = jittered(narrow_trace(NOISY_TRUTH, n=300), 0.05, seed)
    free = fit(trace, OPTS, bootstrap_resamples=30)
    assert any(w.startswith("per_prefill_attention_us not identified") for w in free.fit.warnings)
    held = fit(trace, OPTS, prior=QWEN_H100, bootstrap_resamples=30)
    # fitted on 929-1047-token prompts, asked about 4096: the data alone cannot say (the issue
    # saw 91 % under to 1558 % over); with the prior the answer stays within 5 %
    assert prefill_us(held, 4096) == pytest.approx(prefill_us(NOISY_TRUTH, 4096), rel=0.05)


def test_one_request_at_a_time_cannot_separate_decode_batching_or_the_frontend() -> None:
    trace = jittered(narrow_trace(NOISY_TRUTH, rate=0.05, n=60), 0.02, 0)
    c = fit(trace, OPTS, bootstrap_resamples=30)
    by_name = {w.split(" ")[0]: w for w in c.fit.warnings if " not identified " in w}
    assert "decode batches span 1-2; add load levels" in by_name["per_decode_seq_us"]
    assert "add load so requests queue through more steps" in by_name["frontend.base_us"]


def test_the_report_survives_the_coefficient_file(narrow_fit, tmp_path) -> None:
    from blis_sim.engine.latency import dump_coefficients, load_coefficients

    _, c = narrow_fit
    for name in ("c.yaml", "c.json"):
        dump_coefficients(c, tmp_path / name)
        assert load_coefficients(tmp_path / name) == c


def test_admission_is_named_only_when_the_sends_could_not_show_it() -> None:
    from tests.test_engine_fit import OPTS as FIT_OPTS, SPEC, STEADY_SPEC, TRUTH as FIT_TRUTH

    no_admission = FIT_TRUTH.model_copy(update={"frontend": FrontendCoefficients(
        base_us=20000.0, per_inflight_us=500.0)})

    def fitted(spec: str) -> LatencyCoefficients:
        trace = run_outcome(parse_workload_spec(spec.format(seed=7)),
                            replace(FIT_OPTS, latency=no_admission.to_step_model())).trace("spec")
        return fit(trace, FIT_OPTS, bootstrap_resamples=10)

    bursty = fitted(SPEC)  # bursts that would queue at 1 ms: the fit measured 0
    assert bursty.frontend.admission_us == 0.0
    assert not [w for w in bursty.fit.warnings if "admission" in w]
    steady = fitted(STEADY_SPEC)  # Poisson only: nothing could have queued
    assert [w for w in steady.fit.warnings if w.startswith("frontend.admission_us not identified "
                                                           "(the data never exercise it)")]
