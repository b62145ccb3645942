"""Token content: a pure function of (seed, ids, lengths) that rebuilds the sharing structure from CSV columns."""
from __future__ import annotations

import numpy as np
import pytest

from blis_sim.formats.workload import parse_workload_spec
from blis_sim.workload import generate_workload
from blis_sim.workload.tokens import (
    VOCAB_SIZE, new_input_lengths, prefix_tokens, request_input, request_tokens, session_input_tokens,
    session_round_inputs, token_ids,
)


def test_values_are_pinned() -> None:
    # Changing the hash changes every replayed cache key; make that a deliberate decision.
    assert prefix_tokens(1, "g", 5).tolist() == [117968, 13894, 18255, 52578, 94436]
    assert prefix_tokens(42, "sys-0", 4).tolist() == token_ids(42, "prefix", "sys-0", length=4).tolist()


def test_range_dtype_and_spread() -> None:
    t = request_tokens(7, "r1", 100_000)
    assert t.dtype == np.int64 and t.min() >= 0 and t.max() < VOCAB_SIZE
    assert len(np.unique(t)) > 50_000  # not degenerate
    assert abs(t.mean() - VOCAB_SIZE / 2) < VOCAB_SIZE * 0.01
    assert token_ids(7, "r1", length=10, vocab=16).max() < 16


def test_prefix_is_stable_in_length_and_distinct_across_groups_and_seeds() -> None:
    long, short = prefix_tokens(3, "g", 1024), prefix_tokens(3, "g", 512)
    assert np.array_equal(long[:512], short)
    assert not np.array_equal(prefix_tokens(3, "h", 512), short)
    assert not np.array_equal(prefix_tokens(4, "g", 512), short)
    assert len(prefix_tokens(3, "g", 0)) == 0


def test_domains_do_not_collide() -> None:
    a = prefix_tokens(1, "x", 64)
    b = request_tokens(1, "x", 64)
    c = session_input_tokens(1, "x", 0, 64)
    assert not np.array_equal(a, b) and not np.array_equal(b, c)
    # key parts are length-prefixed: ("ab", "c") is not ("a", "bc")
    assert not np.array_equal(token_ids(1, "ab", "c", length=8), token_ids(1, "a", "bc", length=8))


def test_request_input_shares_exactly_the_group_prefix() -> None:
    r1 = request_input(9, prefix_group="g", prefix_length=100, suffix_length=30, request_key=1)
    r2 = request_input(9, prefix_group="g", prefix_length=100, suffix_length=50, request_key=2)
    assert len(r1) == 130 and len(r2) == 150
    assert np.array_equal(r1[:100], r2[:100]) and not np.array_equal(r1[100:130], r2[100:130])
    no_group = request_input(9, prefix_group="", prefix_length=0, suffix_length=30, request_key=1)
    assert len(no_group) == 30


def test_session_rounds_accumulate() -> None:
    rounds = session_round_inputs(5, session_id="s", new_input_lengths=[10, 4, 6], output_lengths=[3, 2],
                                  prefix_group="g", prefix_length=8)
    assert [len(r) for r in rounds] == [18, 18 + 3 + 4, 25 + 2 + 6]
    for a, b in zip(rounds, rounds[1:]):
        assert np.array_equal(b[:len(a)], a)
    assert np.array_equal(rounds[0][:8], prefix_tokens(5, "g", 8))
    flat = session_round_inputs(5, session_id="s", new_input_lengths=[10, 4], output_lengths=[3],
                                prefix_group="g", prefix_length=8, accumulate=False)
    assert [len(r) for r in flat] == [18, 12] and np.array_equal(flat[1][:8], flat[0][:8])


def test_new_input_lengths_from_csv_columns() -> None:
    # CSV input_tokens exclude the prefix: 10; 10+3+4 = 17; 17+2+6 = 25
    assert new_input_lengths([10, 17, 25], [3, 2, 9]) == [10, 4, 6]
    with pytest.raises(ValueError, match="not an accumulating session"):
        new_input_lengths([10, 5], [3, 1])


def test_replay_from_csv_columns_rebuilds_the_generated_tokens() -> None:
    """A planned session, driven, then rebuilt from only (prefix_group, prefix_length, input_tokens,
    output_tokens, session_id, round_index) gives the same ids as the plan itself."""
    text = """\
seed: 21
aggregate_rate: 1
num_requests: 6
clients:
  - id: chat
    rate_fraction: 1
    prefix_group: sys
    prefix_length: 40
    arrival: {process: poisson}
    input_distribution: {type: gaussian, params: {mean: 30, std_dev: 9, min: 5, max: 90}}
    output_distribution: {type: constant, params: {value: 12}}
    reasoning: {multi_turn: {max_rounds: 3, think_time_us: 1000, context_growth: accumulate}}
"""
    plan = generate_workload(parse_workload_spec(text))
    run = plan.phases[0].start()
    rows = []
    pending = list(run.initial)
    while pending:
        r = pending.pop(0)
        produced = 9 if r.round_index == 0 else r.output_tokens  # the server stopped early once
        rows.append((r, produced))
        nxt = run.on_complete(r, ok=True, output_tokens=produced, completed_at_us=r.arrival_us + 10)
        if nxt:
            pending.append(nxt)
    sessions: dict[str, list] = {}
    for r, produced in rows:
        sessions.setdefault(r.session_id, []).append((r.round_index, r.csv_input_tokens, produced, r))
    assert len(sessions) == 2
    for sid, rs in sessions.items():
        rs.sort(key=lambda x: x[0])
        news = new_input_lengths([x[1] for x in rs], [x[2] for x in rs])
        rebuilt = session_round_inputs(plan.seed, session_id=sid, new_input_lengths=news,
                                       output_lengths=[x[2] for x in rs], prefix_group="sys", prefix_length=40)
        for (_, _, _, r), ids in zip(rs, rebuilt):
            assert np.array_equal(ids, r.input_token_ids(plan.seed))
