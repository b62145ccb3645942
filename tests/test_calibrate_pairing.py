"""Pairing, warm-up exclusion, network adjustment and ITL (docs/reference-formats.md §5.2–§5.4; the reference's
calibrate_test.go)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from blis_sim.calibrate.pairing import CalibrationPairs, prepare_pairs as _prepare_pairs, upload_delay_us
from tests.calibrate_columns import real_columns, sim_table


@dataclass
class Rec:
    request_id: int
    send_time_us: int = 100
    first_chunk_time_us: int = 600
    last_chunk_time_us: int = 1100
    input_tokens: int = 10
    output_tokens: int = 5
    server_input_tokens: int = 0
    warmup: bool = False


@dataclass
class Sim:
    request_id: int
    ttft_us: float = 450.0
    e2e_us: float = 900.0
    input_tokens: int = 10
    output_tokens: int = 5
    slo_class: str = ""
    model: str = ""


@dataclass
class Chunk:
    request_id: int
    chunk_index: int
    timestamp_us: int


def prepare_pairs(recs: list[Rec], sims: list[Sim], **options: Any) -> CalibrationPairs:
    """Pairing of these rows and results, as columns."""
    return _prepare_pairs(real_columns(recs), sim_table(sims), **options)


def test_matching_by_id_in_any_order() -> None:
    p = prepare_pairs([Rec(2, send_time_us=10, first_chunk_time_us=500), Rec(1)], [Sim(1), Sim(2)])
    assert p.matched == 2 and p.ttft.real.tolist() == [490.0, 500.0] and p.ttft.sim.tolist() == [450.0, 450.0]


def test_rtt_is_added_once_to_sim_side_only() -> None:
    p = prepare_pairs([Rec(0, send_time_us=100, first_chunk_time_us=6000)], [Sim(0, ttft_us=500)],
                      network_rtt_us=5000)
    assert p.ttft.real.tolist() == [5900.0] and p.ttft.sim.tolist() == [5500.0] and p.e2e.sim.tolist() == [5900.0]


def test_bandwidth_adds_upload_and_download() -> None:
    # 10 input tokens × 4 B × 8 bit / 1 Mbit/s = 320 µs; 5 output tokens = 160 µs
    assert upload_delay_us(1.0, 10) == pytest.approx(320.0)
    assert upload_delay_us(0.0, 10) == 0.0
    p = prepare_pairs([Rec(0)], [Sim(0)], bandwidth_mbps=1.0)
    assert p.ttft.sim.tolist() == [pytest.approx(450 + 320)] and p.e2e.sim.tolist() == [pytest.approx(900 + 320 + 160)]


def test_warmup_by_id_and_unmatched_real() -> None:
    recs = [Rec(i) for i in range(5)]
    p = prepare_pairs(recs, [Sim(i) for i in (2, 3)], warmup_requests=2)
    assert (p.excluded_warmup, p.matched, p.unmatched_real, p.unmatched_sim) == (2, 2, 1, 0)
    assert p.num_requests == 5


def test_warmup_column_marks_rows_unless_disabled() -> None:
    recs = [Rec(0, warmup=True), Rec(1, warmup=True), Rec(2)]
    sims = [Sim(i) for i in range(3)]
    p = prepare_pairs(recs, sims)
    assert (p.excluded_warmup, p.matched, p.unmatched_sim) == (2, 1, 2)
    p = prepare_pairs(recs, sims, honour_warmup_column=False)
    assert (p.excluded_warmup, p.matched) == (0, 3)


def test_token_mismatch_prefers_server_input_tokens() -> None:
    sims = [Sim(0, input_tokens=500), Sim(1, input_tokens=16652), Sim(2, input_tokens=16652),
            Sim(3, output_tokens=6)]
    recs = [Rec(0, input_tokens=512), Rec(1, input_tokens=268, server_input_tokens=16652),
            Rec(2, input_tokens=268, server_input_tokens=16638), Rec(3)]
    assert prepare_pairs(recs, sims).token_mismatches == 3  # ids 0, 2 and 3 (output 5 vs 6)


def test_negative_latency_counts_as_matched_and_unmatched() -> None:
    p = prepare_pairs([Rec(0, first_chunk_time_us=0), Rec(1)], [Sim(0), Sim(1)])
    assert (p.matched, p.unmatched_real, len(p.ttft.real)) == (2, 1, 1)
    assert p.num_requests == 3  # the reference counts that row twice


def test_breakdowns_only_for_non_empty_keys() -> None:
    p = prepare_pairs([Rec(0), Rec(1)], [Sim(0, slo_class="batch", model="m"), Sim(1)])
    assert list(p.by_slo) == ["batch"] and list(p.by_model) == ["m"]
    assert p.by_slo["batch"].ttft.real.tolist() == [500.0]


def test_itl_skips_negative_deltas_and_drops_all_negative_requests() -> None:
    chunks = [Chunk(0, 0, 1000), Chunk(0, 1, 1030), Chunk(0, 2, 1010),   # deltas +30, −20 → keep 30
              Chunk(1, 1, 900), Chunk(1, 0, 1000),                        # sorted: 1000 → 900: all negative
              Chunk(2, 0, 1000)]                                          # one chunk: no ITL
    sims = [Sim(0, ttft_us=100, e2e_us=500, output_tokens=5), Sim(1), Sim(2)]
    p = prepare_pairs([Rec(0), Rec(1), Rec(2)], sims, itl_records=chunks)
    assert p.itl.real.tolist() == [30.0] and p.itl.sim.tolist() == [100.0]                  # (500 − 100) / (5 − 1)
    assert p.itl_dropped == 1 and "request 1 ITL dropped" in p.warnings[0]


def test_sim_itl_is_zero_for_single_token_outputs() -> None:
    chunks = [Chunk(0, 0, 0), Chunk(0, 1, 40)]
    p = prepare_pairs([Rec(0)], [Sim(0, output_tokens=1)], itl_records=chunks)
    assert p.itl.real.tolist() == [40.0] and p.itl.sim.tolist() == [0.0]


def test_duplicate_sim_ids_last_wins_and_are_reported() -> None:
    p = prepare_pairs([Rec(0)], [Sim(0, ttft_us=1), Sim(0, ttft_us=2)])
    assert p.ttft.sim.tolist() == [2.0] and p.duplicate_sim_ids == [0]
