"""Step-time profiles: the linear ones are linear, the roofline one has a knee and quadratic attention."""
from __future__ import annotations

import pytest

from blis_sim.emulator.profiles import PROFILES, get_profile
from blis_sim.errors import ConfigError
from tests.test_emulator_scheduler import make, req

ROOF = get_profile("h100-14b-roofline")


def pairs(n: int, computed: int = 0) -> float:
    return n * (computed + (n + 1) / 2)


def prefill(n: int) -> float:
    return ROOF.step_seconds(n, 0, 0, pairs(n))


def test_every_profile_takes_no_time_for_an_empty_step() -> None:
    for profile in PROFILES.values():
        assert profile.step_seconds(0, 0, 0, 0.0) == 0.0


def test_roofline_is_flat_below_the_knee_then_rises_with_the_tokens() -> None:
    # Below ~210 tokens a step costs the weight read, whatever its size.
    assert prefill(1) == pytest.approx(prefill(128), rel=0.01)
    assert prefill(1) == pytest.approx(11.4e-3, rel=0.02)
    # Above the knee the FLOPs dominate: 4x the tokens is ~4x the time (plus attention).
    assert prefill(1024) / prefill(256) > 3.5
    knee = next(n for n in range(1, 1000) if prefill(n) > prefill(1) * 1.001)
    assert 190 <= knee <= 230
    # A decode batch is memory-bound up to the knee as well: 128 sequences cost far less than 128x one.
    one = ROOF.step_seconds(0, 1, 500, pairs(1, 500))
    batch = ROOF.step_seconds(0, 128, 128 * 500, 128 * pairs(1, 500))
    assert batch < 1.5 * one


def test_roofline_prefill_attention_is_quadratic_in_the_prompt() -> None:
    # Doubling a long prompt more than doubles its step (the linear profiles double, no more).
    assert prefill(16384) / prefill(8192) > 2.2
    linear = get_profile("h100-14b")
    assert linear.step_seconds(16384, 0, 0) / linear.step_seconds(8192, 0, 0) < 2.01
    # The attention part alone grows with the square of the prompt.
    shape = ROOF.roofline
    assert shape is not None
    attention = [shape.attention_pair_s * pairs(n) for n in (4096, 8192)]
    assert attention[1] / attention[0] == pytest.approx(4.0, rel=0.01)


def test_the_scheduler_counts_attention_pairs_per_chunk() -> None:
    s = make(budget=64)
    s.add(req("a", 0, 100, max_tokens=2))
    plan = s.schedule(0.0)           # first chunk: 64 new tokens, nothing computed before
    assert plan.attention_pairs == pairs(64)
    s.finish_step(plan, 0.01)
    plan = s.schedule(0.01)          # the rest: 36 tokens over 64 already computed
    assert plan.attention_pairs == pairs(36, 64)
    s.finish_step(plan, 0.02)
    plan = s.schedule(0.02)          # the decode: one token attending to the 100 before it
    assert plan.decode_seqs == 1 and plan.attention_pairs == pairs(1, 100)


def test_an_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="h100-14b-roofline"):
        get_profile("h100-15b")
