"""The probe's repeatability: the TTFT spread of identical requests it sent alone (blis_sim.probe.repeat)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from blis_sim.probe.repeat import describe, repeat_floor, repeat_groups


@dataclass
class Rec:
    phase: str
    ttft_ms: float
    prefix_length: int = 1024
    input_tokens: int = 32
    output_tokens: int = 4
    cached_tokens: int = 0
    status: str = "ok"
    warmup: bool = False
    send_time_us: int = 1_000_000

    @property
    def first_chunk_time_us(self) -> int:
        return self.send_time_us + round(self.ttft_ms * 1000)


def test_identical_lone_requests_are_grouped_and_their_spread_is_a_mape_around_their_mean() -> None:
    records = [Rec("cold-1024-0", 100), Rec("cold-1024-1", 120), Rec("seed-1024", 110),
               Rec("cached-1024-0", 20, cached_tokens=1024), Rec("cached-1024-1", 20, cached_tokens=1024),
               Rec("cached-1024-2", 50, input_tokens=512, cached_tokens=1024),  # alone in its shape: no group
               Rec("ramp-4", 300), Rec("ramp-4", 100),                          # not sent alone: never grouped
               Rec("warmup-0", 500, prefix_length=0, input_tokens=64)]
    cold, cached = repeat_groups(records)
    assert (cold.prompt_tokens, cold.cached_tokens, cold.requests) == (1056, 0, 3)
    assert cold.mean_ttft_us == pytest.approx(110_000)
    assert cold.spread == pytest.approx((10 / 100 + 0 / 110 + 10 / 120) / 3)
    assert (cached.cached_tokens, cached.requests, cached.spread) == (1024, 2, 0.0)
    assert repeat_floor([cold, cached]) == pytest.approx(cold.spread * 3 / 5)
    line = describe([cold, cached])
    assert "within 3.7 %" in line and "1056: 6.1 %" in line


def test_a_server_that_reports_no_cached_tokens_has_its_cached_repeats_kept_apart_from_the_cold_ones() -> None:
    # vLLM without --enable-prompt-tokens-details: every record's cached_tokens is -1 (not reported)
    records = [Rec("cold-1024-0", 100, cached_tokens=-1), Rec("cold-1024-1", 120, cached_tokens=-1),
               Rec("seed-1024", 110, cached_tokens=-1),
               Rec("cached-1024-0", 20, cached_tokens=-1), Rec("cached-1024-1", 20, cached_tokens=-1)]
    cold, cached = repeat_groups(records)
    assert (cold.cached_tokens, cold.requests) == (0, 3)
    assert cold.spread == pytest.approx((10 / 100 + 0 / 110 + 10 / 120) / 3)
    assert (cached.cached_tokens, cached.requests, cached.spread) == (1024, 2, 0.0)


def test_a_trace_without_repeats_says_so() -> None:
    assert repeat_groups([Rec("ramp-2", 100), Rec("ramp-2", 120)]) == []
    assert repeat_floor([]) is None and describe([]) == "no identical requests sent alone"
