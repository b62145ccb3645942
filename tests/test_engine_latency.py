"""Latency models: coefficient files (good and bad), the roofline from a local config.json."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from blis_sim.engine.latency import (DEFAULT_COEFFICIENTS, LatencyCoefficients, dump_coefficients,
                                     get_hardware, load_coefficients, load_model_config, roofline)
from blis_sim.engine.models import KNOWN_MODELS, default_num_gpu_blocks
from blis_sim.errors import ConfigError, FormatError

GOOD = """\
model: linear
step:
  base_us: 12000
  per_prefill_token_us: 4.6
  per_decode_seq_us: 4.5
  per_context_token_us: 0.095
frontend:
  base_us: 26000
  per_inflight_us: 120
"""


def features(tp=0.0, td=0.0, cd=0.0, cp=0.0, ap=0.0) -> np.ndarray:
    return np.array([1.0, tp, td, cd, cp, ap])


def test_yaml_and_json_coefficient_files_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(GOOD)
    c = load_coefficients(p)
    assert c.step.per_prefill_token_us == 4.6 and c.frontend.per_inflight_us == 120
    m = c.to_step_model()
    assert m.step_time(features(tp=1000, td=2, cd=3000)) == pytest.approx(
        12000 + 4.6 * 1000 + 4.5 * 2 + 0.095 * 3000)
    # eleven sent in turn, none finished: the first finds 0 in flight, the last 10
    from blis_sim.engine.simulate import frontend_term

    front = frontend_term(m, np.arange(11.0), np.full(11, np.nan))
    assert [front[0], front[10]] == [26000.0, 27200.0]
    j = tmp_path / "c.json"
    dump_coefficients(c, j)
    assert load_coefficients(j) == c
    assert json.loads(j.read_text())["step"]["base_us"] == 12000


def test_a_prefill_reads_its_context_at_its_own_price_or_the_decodes_when_unset(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(GOOD)
    unset = load_coefficients(p).to_step_model()  # a file from before the coefficient existed
    assert unset.step_time(features(tp=32, cp=4096)) == pytest.approx(12000 + 4.6 * 32 + 0.095 * 4096)
    assert "per_prefill_context_us" not in unset.describe()["step"]
    p.write_text(GOOD.replace("  per_context_token_us: 0.095\n",
                              "  per_context_token_us: 0.095\n  per_prefill_context_us: 0.3\n"))
    own = load_coefficients(p).to_step_model()
    assert own.step_time(features(tp=32, cp=4096)) == pytest.approx(12000 + 4.6 * 32 + 0.3 * 4096)
    assert own.step_time(features(td=1, cd=4096)) == pytest.approx(12000 + 4.5 + 0.095 * 4096)
    assert own.describe()["step"]["per_prefill_context_us"] == 0.3


@pytest.mark.parametrize("text,where", [
    (GOOD.replace("  per_decode_seq_us: 4.5\n", ""), "field 'step.per_decode_seq_us'"),
    (GOOD + "extra: 1\n", ":10: field 'extra'"),
    (GOOD.replace("4.6", "-1"), ":4: field 'step.per_prefill_token_us'"),
    (GOOD.replace("4.6", "fast"), ":4: field 'step.per_prefill_token_us'"),
    (GOOD.replace("model: linear", "model: cubic"), ":1: field 'model'"),
])
def test_bad_coefficient_files_name_file_line_and_field(tmp_path: Path, text: str, where: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(FormatError) as exc:
        load_coefficients(p)
    assert str(exc.value).startswith(str(p)) and where in str(exc.value)


def test_bad_json_coefficients_name_the_line(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_text('{"step": {\n "base_us": 1,,\n}}')
    with pytest.raises(FormatError, match=r"c.json:2"):
        load_coefficients(p)


def tiny_config(tmp_path: Path, **over) -> Path:
    cfg = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256,
           "vocab_size": 8000, "torch_dtype": "bfloat16"}
    cfg.update(over)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_roofline_from_a_local_config(tmp_path: Path) -> None:
    g = load_model_config(tiny_config(tmp_path))
    assert g.kv_bytes_per_token() == 2 * 2 * 2 * 32 * 2  # layers × (K,V) × kv heads × dim × bf16
    assert g == KNOWN_MODELS["tiny-llama"]
    qwen = KNOWN_MODELS["qwen/qwen3-14b"]
    h100 = roofline(qwen, get_hardware("H100"))
    # decode is memory bound: one decode step ≈ weights / bandwidth (~28 GiB at 3.35 TB/s ≈ 9 ms)
    one_decode = h100.step_time(features(td=1, cd=1024))
    assert 7_000 < one_decode < 12_000
    # a long prefill is compute bound and grows with the tokens
    p1, p2 = (h100.step_time(features(tp=t, ap=t * (t + 1) / 2)) for t in (1024, 4096))
    assert p1 > one_decode and 3.5 < p2 / p1 < 5.0
    # a faster memory system helps the memory-bound step, not the compute-bound one
    h200 = roofline(qwen, get_hardware("h200"))
    assert h200.step_time(features(td=1, cd=1024)) < one_decode
    assert h200.step_time(features(tp=4096, ap=4096 * 4097 / 2)) == pytest.approx(p2)
    assert roofline(qwen, get_hardware("H100"), tp=2).step_time(features(td=1)) < one_decode
    assert h100.describe()["hardware"] == "H100"


def test_bad_model_config_and_hardware_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="field 'hidden_size'"):
        load_model_config(tiny_config(tmp_path, hidden_size=0))
    with pytest.raises(ConfigError, match="torch_dtype"):
        load_model_config(tiny_config(tmp_path, torch_dtype="int3"))
    with pytest.raises(ConfigError, match="known: A100, H100, H200, L40S"):
        get_hardware("TPU")


def test_kv_capacity_matches_the_reference_formula() -> None:
    # docs/reference-formats.md §7.3: Qwen3-14B on one H100 at 0.9 utilisation → 15,909 blocks of 16
    assert abs(default_num_gpu_blocks("qwen/qwen3-14b", 16) - 15909) <= 50
    assert default_num_gpu_blocks("unknown/model", 16) == 1_000_000


def test_default_model_is_linear_and_records_itself() -> None:
    d = DEFAULT_COEFFICIENTS.to_step_model().describe()
    assert d["model"] == "linear" and d["frontend"]["base_us"] > 0
    assert isinstance(LatencyCoefficients.model_json_schema(), dict)


def test_default_step_model_is_the_default_coefficients_without_pydantic() -> None:
    # the replay path's default (no model built) must describe itself as the model would
    from blis_sim.engine.latency import default_step_model
    plain, model = default_step_model(), DEFAULT_COEFFICIENTS.to_step_model()
    assert plain == model and plain.describe() == model.describe()
    assert list(plain.describe()["step"]) == list(model.describe()["step"])  # key order is written


def test_roofline_prices_a_whole_mixed_batch_at_one_gemm_efficiency() -> None:
    qwen, h100 = KNOWN_MODELS["qwen/qwen3-14b"], get_hardware("H100")
    model = roofline(qwen, h100)
    gemm = 989.5e12 / 1e6 * 0.45                       # FLOPs per µs at the GEMM efficiency
    per_token = 2.0 * 40 * (5120 * (5120 + 2 * 1024) + 5120 * 5120 + 3 * 5120 * 17408)
    lm_head = 2.0 * 5120 * 151936
    # 512 decodes with no context: compute bound, every token a GEMM row like a prefill token's
    # (pricing each at the low-batch decode MFU, 0.30, made this step 1.5× too long)
    assert model.step_time(features(td=512)) == pytest.approx(512 * (per_token + lm_head) / gemm)
    assert model.step_time(features(tp=4096)) == pytest.approx(4096 * per_token / gemm)
    # one decode: memory bound on the weights
    weights = (40 * (5120 * (5120 + 2 * 1024) + 5120 * 5120 + 3 * 5120 * 17408) + 151936 * 5120) * 2
    assert model.step_time(features(td=1)) == pytest.approx((weights + 163840) / 3.35e6)  # + its KV write
    # a mixed chunked-prefill step is one max(compute, memory) over the whole batch: less than
    # the rooflines of its prefill and decode parts taken apart and summed
    prefill = {"tp": 2048, "cp": 2048, "ap": 2048 * 2048 + 2048 * 2049 / 2}
    decode = {"td": 256, "cd": 256 * 2048}
    mixed = model.step_time(features(**prefill, **decode))
    w = model.weights()
    f = features(**prefill, **decode)
    assert mixed == pytest.approx(max(w[0] @ f, w[1] @ f))
    assert mixed < model.step_time(features(**prefill)) + model.step_time(features(**decode))


def test_admission_queues_a_burst_and_leaves_spread_arrivals_alone() -> None:
    from blis_sim.engine.simulate import admission_queue, frontend_term

    # three sent together, one 1 ms later (still behind them), one long after
    arrival = np.array([0.0, 0.0, 0.0, 1000.0, 50_000.0])
    place, since = admission_queue(arrival, 2000.0)
    assert place.tolist() == [0, 1, 2, 3, 0] and since.tolist() == [0, 0, 0, 1000, 0]
    c = LatencyCoefficients.model_validate(
        {"step": {"base_us": 1, "per_prefill_token_us": 0, "per_decode_seq_us": 0,
                  "per_context_token_us": 0},
         "frontend": {"base_us": 500, "admission_us": 2000}})
    finish = arrival + 10.0
    assert frontend_term(c.to_step_model(), arrival, finish).tolist() == [500, 2500, 4500, 5500, 500]
    assert c.to_step_model().describe()["frontend"]["admission_us"] == 2000
    # 0 (every file written before the term existed): no wait, and no new key in the provenance
    old = load_coefficients_text(GOOD.replace("  per_inflight_us: 120\n", "")).to_step_model()
    assert "admission_us" not in old.describe()["frontend"]
    assert frontend_term(old, arrival, finish).tolist() == [26000.0] * 5


def load_coefficients_text(text: str) -> LatencyCoefficients:
    import yaml

    return LatencyCoefficients.model_validate(yaml.safe_load(text))
