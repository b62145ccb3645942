"""Generation: rates and rate_fraction split, determinism, bounds, phases, sessions, closed-loop users."""
from __future__ import annotations

import heapq
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from blis_sim.errors import ConfigError
from blis_sim.formats.workload import load_workload_spec, parse_workload_spec
from blis_sim.workload import PhasePlan, PlannedRequest, WorkloadPlan, generate_workload

REPO = Path(__file__).resolve().parents[1]


def client(cid: str, **kw: object) -> str:
    fields = {"id": cid, "rate_fraction": 1, "arrival": "{process: poisson}",
              "input_distribution": "{type: constant, params: {value: 10}}",
              "output_distribution": "{type: constant, params: {value: 5}}", **kw}
    return "  - {" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}\n"


def spec(head: str, *clients: str) -> WorkloadPlan:
    return generate_workload(parse_workload_spec(head + "clients:\n" + "".join(clients)))


def simulate(phase: PhasePlan, latency_us: int, fail: set[str] | frozenset[str] = frozenset(),
             output_of: dict[str, int] | None = None) -> list[tuple[int, int, PlannedRequest]]:
    """A simulated-time driver: every request takes ``latency_us``; returns (send, done, request) in send order."""
    run = phase.start()
    events: list[tuple[int, int, int, PlannedRequest]] = []  # (time, kind 0=arrival/1=completion, seq, req)
    seq = 0
    for r in run.initial:
        events.append((r.arrival_us, 1, seq, r))
        seq += 1
    heapq.heapify(events)
    done: list[tuple[int, int, PlannedRequest]] = []
    while events:
        t, kind, _, r = heapq.heappop(events)
        if kind == 1:  # arrival -> completion
            heapq.heappush(events, (t + latency_us, 0, seq, r))
            seq += 1
            done.append((t, t + latency_us, r))
            continue
        out = (output_of or {}).get(r.uid, r.output_tokens)
        nxt = run.on_complete(r, ok=r.uid not in fail, output_tokens=out, completed_at_us=t)
        if nxt is not None:
            assert nxt.arrival_us >= t
            heapq.heappush(events, (nxt.arrival_us, 1, seq, nxt))
            seq += 1
    return done


# --- rates, bounds, determinism ------------------------------------------------------------------------------

def test_sample_spec_generates_num_requests_in_arrival_order() -> None:
    plan = generate_workload(load_workload_spec(REPO / "samples/blis/workload.yaml"))
    (phase,) = plan.phases
    reqs = phase.requests
    assert len(reqs) == 200
    assert [r.arrival_us for r in reqs] == sorted(r.arrival_us for r in reqs)
    assert [r.uid for r in reqs] == [f"0.{i}" for i in range(200)]
    grouped = [r for r in reqs if r.prefix_group]
    assert all(r.prefix_length == 1024 and r.input_tokens == 1024 + r.new_input_tokens for r in grouped)
    assert all(32 <= r.new_input_tokens <= 1024 for r in grouped)
    assert all(r.prefix_length == 0 and r.prefix_group == "" for r in reqs if r.client_id == "unique")
    # 200 requests at 8 req/s take about 25 s
    assert 20e6 < reqs[-1].arrival_us < 31e6


def test_rate_fraction_split_and_aggregate_rate() -> None:
    plan = spec("aggregate_rate: 8\nhorizon: 1000000000\n",
                client("a", rate_fraction=3), client("b", rate_fraction=1))
    reqs = plan.phases[0].requests
    n = Counter(r.client_id for r in reqs)
    assert n["a"] + n["b"] == pytest.approx(8000, rel=0.04)
    assert n["a"] / n["b"] == pytest.approx(3.0, rel=0.08)
    assert max(r.arrival_us for r in reqs) < 1_000_000_000


def test_rate_fractions_are_normalised() -> None:
    a = spec("seed: 5\naggregate_rate: 8\nhorizon: 100000000\n", client("a", rate_fraction=0.3),
             client("b", rate_fraction=0.1))
    b = spec("seed: 5\naggregate_rate: 8\nhorizon: 100000000\n", client("a", rate_fraction=3),
             client("b", rate_fraction=1))
    assert [r.arrival_us for r in a.phases[0].requests] == [r.arrival_us for r in b.phases[0].requests]


def test_num_requests_truncates_the_merge_and_horizon_bounds_it() -> None:
    capped = spec("aggregate_rate: 100\nnum_requests: 37\n", client("a"), client("b"))
    assert len(capped.phases[0].requests) == 37
    bounded = spec("aggregate_rate: 100\nhorizon: 2000000\n", client("a"), client("b"))
    reqs = bounded.phases[0].requests
    assert all(r.arrival_us < 2_000_000 for r in reqs) and 150 < len(reqs) < 250
    both = spec("aggregate_rate: 100\nhorizon: 2000000\nnum_requests: 1000\n", client("a"))
    assert len(both.phases[0].requests) < 1000


def test_cli_overrides() -> None:
    s = parse_workload_spec("aggregate_rate: 100\nnum_requests: 37\nclients:\n" + client("a"))
    assert len(generate_workload(s, num_requests=5).phases[0].requests) == 5
    assert all(r.arrival_us < 100_000 for r in generate_workload(s, num_requests=10**6, horizon=100_000)
               .phases[0].requests)
    assert generate_workload(s, seed=9).seed == 9


def test_unbounded_workload_is_refused() -> None:
    with pytest.raises(ConfigError, match="num_requests, --num-requests, or --horizon"):
        spec("aggregate_rate: 1\n", client("a"))


def test_deterministic_for_a_seed() -> None:
    text = (REPO / "samples/blis/workload.yaml").read_text()
    one = generate_workload(parse_workload_spec(text))
    two = generate_workload(parse_workload_spec(text))
    assert one.phases[0].requests == two.phases[0].requests
    other = generate_workload(parse_workload_spec(text), seed=43)
    assert [r.arrival_us for r in other.phases[0].requests] != [r.arrival_us for r in one.phases[0].requests]


def test_deterministic_across_processes() -> None:
    """Nothing depends on Python's per-process hash seed: two interpreters produce the same plan."""
    code = ("import hashlib,sys; from blis_sim.formats.workload import load_workload_spec as L; "
            "from blis_sim.workload import generate_workload as G; "
            "p=G(L(sys.argv[1])); print(hashlib.sha256(repr(p.all_initial()).encode()).hexdigest())")
    path = str(REPO / "samples/blis/workload.yaml")
    outs = {subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(outs) == 1


def test_constant_arrivals_are_exact() -> None:
    reqs = spec("aggregate_rate: 4\nnum_requests: 5\n", client("a", arrival="{process: constant}")).phases[0].requests
    assert [r.arrival_us for r in reqs] == [250_000, 500_000, 750_000, 1_000_000, 1_250_000]


def test_group_prefix_length_first_client_wins_and_defaults_to_50() -> None:
    plan = spec("aggregate_rate: 10\nnum_requests: 200\n", client("a", prefix_group="g", prefix_length=300),
                client("b", prefix_group="g", prefix_length=100), client("c", prefix_group="h"))
    reqs = plan.phases[0].requests
    assert {r.prefix_length for r in reqs if r.prefix_group == "g"} == {300}
    assert {r.prefix_length for r in reqs if r.prefix_group == "h"} == {50}
    assert {r.input_tokens for r in reqs if r.prefix_group == "g"} == {310}


def test_request_fields_follow_the_client() -> None:
    plan = spec("aggregate_rate: 10\nnum_requests: 3\n",
                client("a", tenant_id="t", slo_class="batch", model="m", adapter="lo", streaming="true",
                       timeout=1000, slo_target_us=7))
    r = plan.phases[0].requests[0]
    assert (r.tenant_id, r.slo_class, r.model, r.adapter, r.streaming, r.slo_target_us) == \
        ("t", "batch", "m", "lo", True, 7)
    assert r.deadline_us == r.arrival_us + 1000 and r.kind == "open" and r.session_id == ""
    no_timeout = spec("aggregate_rate: 10\nnum_requests: 3\n", client("a")).phases[0].requests[0]
    assert no_timeout.deadline_us == 0


def test_csv_columns_follow_the_reference_rule() -> None:
    r = PlannedRequest(uid="x", phase="", phase_index=0, client_id="a", arrival_us=0, input_tokens=30,
                       output_tokens=1, prefix_group="g", prefix_length=50)
    assert (r.csv_input_tokens, r.csv_prefix_length) == (30, 0)  # shorter than its prefix: total, prefix 0
    r2 = PlannedRequest(uid="x", phase="", phase_index=0, client_id="a", arrival_us=0, input_tokens=80,
                        output_tokens=1, prefix_group="g", prefix_length=50)
    assert (r2.csv_input_tokens, r2.csv_prefix_length) == (30, 50)


def test_lifecycle_windows_gate_arrivals() -> None:
    plan = spec("aggregate_rate: 100\nhorizon: 10000000\n",
                client("a", lifecycle="{windows: [{start_us: 1000000, end_us: 2000000}, "
                                      "{start_us: 5000000, end_us: 6000000}]}"))
    ts = [r.arrival_us for r in plan.phases[0].requests]
    assert ts and all(1_000_000 <= t < 2_000_000 or 5_000_000 <= t < 6_000_000 for t in ts)
    assert 140 < len(ts) < 260


def test_cohorts_expand_into_members() -> None:
    text = ("aggregate_rate: 50\nnum_requests: 300\ncohorts:\n"
            "  - {id: pop, population: 4, rate_fraction: 1, prefix_group: sys, prefix_sharing: per_member, "
            "prefix_length: 20, arrival: {process: poisson}, input_distribution: {type: constant, params: {value: 3}}, "
            "output_distribution: {type: constant, params: {value: 2}}}\n")
    reqs = generate_workload(parse_workload_spec(text)).phases[0].requests
    assert {r.client_id for r in reqs} == {"pop-0", "pop-1", "pop-2", "pop-3"}
    assert {r.prefix_group for r in reqs} == {"sys-0", "sys-1", "sys-2", "sys-3"}
    assert all(r.prefix_group == "sys-" + r.client_id[-1] and r.input_tokens == 23 for r in reqs)


def test_multimodal_counts() -> None:
    plan = spec("aggregate_rate: 10\nnum_requests: 20\n", client(
        "a", multimodal="{text_distribution: {type: constant, params: {value: 7}}, "
                        "image_distribution: {type: constant, params: {value: 100}}, "
                        "image_count_distribution: {type: constant, params: {value: 2}}}"))
    for r in plan.phases[0].requests:
        assert (r.text_tokens, r.image_tokens, r.input_tokens) == (7, 200, 207)


def test_unsupported_sources_are_refused_clearly() -> None:
    text = ("aggregate_rate: 10\nnum_requests: 20\ninference_perf: {stages: [{rate: 1, duration: 10}], "
            "shared_prefix: {num_unique_system_prompts: 1, num_users_per_system_prompt: 1}}\n")
    with pytest.raises(ConfigError, match="inference_perf workloads are not supported"):
        generate_workload(parse_workload_spec(text))
    with pytest.raises(ConfigError, match="servegen_data workloads are not supported"):
        generate_workload(parse_workload_spec("aggregate_rate: 1\nnum_requests: 2\nservegen_data: {path: x}\n"))


def test_absolute_rate_windows_follow_the_reference_time_varying_path() -> None:
    # ceil(rate x duration) IATs rescaled to the window: the last lands on the window end and is dropped
    plan = spec("aggregate_rate: 0\nhorizon: 10000000\n", client(
        "a", lifecycle="{windows: [{start_us: 0, end_us: 1000000, trace_rate: 10}, "
                       "{start_us: 2000000, end_us: 3000000, trace_rate: 50, "
                       "input_distribution: {type: constant, params: {value: 999}}}]}"))
    reqs = plan.phases[0].requests
    first = [r for r in reqs if r.arrival_us < 1_000_000]
    second = [r for r in reqs if 2_000_000 <= r.arrival_us < 3_000_000]
    assert (len(first), len(second), len(reqs)) == (9, 49, 58)
    assert {r.new_input_tokens for r in first} == {10} and {r.new_input_tokens for r in second} == {999}


def test_proportional_windows_share_the_aggregate_with_always_on_clients() -> None:
    plan = spec("aggregate_rate: 100\nhorizon: 2000000\n",
                client("a", lifecycle="{windows: [{start_us: 0, end_us: 1000000, trace_rate: 1}]}"),
                client("b", rate_fraction=1))
    n = Counter(r.client_id for r in plan.phases[0].requests)
    assert n["a"] == 49                      # 100 x 1/(1+1) req/s over 1 s, last one dropped
    assert n["b"] == pytest.approx(100, rel=0.3)  # always-on b keeps generating (the reference drops it)


# --- phases --------------------------------------------------------------------------------------------------

PHASED = """\
seed: 7
aggregate_rate: 20
phases:
  - name: seed
    num_requests: 4
    clients:
      - {id: a, rate_fraction: 1, prefix_group: sys, prefix_length: 64, arrival: {process: poisson},
         input_distribution: {type: gaussian, params: {mean: 30, std_dev: 10, min: 5, max: 60}},
         output_distribution: {type: constant, params: {value: 5}}}
  - name: flood
    num_requests: 30
    clients:
      - {id: f, rate_fraction: 1, arrival: {process: poisson},
         input_distribution: {type: constant, params: {value: 2000}},
         output_distribution: {type: constant, params: {value: 1}}}
  - name: repeat
    repeat: seed
    gap_us: 1000
"""


def test_phases_are_ordered_and_every_request_records_its_phase() -> None:
    plan = generate_workload(parse_workload_spec(PHASED))
    assert [p.name for p in plan.phases] == ["seed", "flood", "repeat"]
    assert [len(p.requests) for p in plan.phases] == [4, 30, 4]
    for i, p in enumerate(plan.phases):
        assert all(r.phase == p.name and r.phase_index == i and r.uid.startswith(f"{i}.") for r in p.requests)
    assert plan.phases[2].gap_us == 1000
    uids = [r.uid for r in plan.all_initial()]
    assert len(set(uids)) == len(uids)


def test_repeated_phase_shares_prefixes_with_fresh_suffixes() -> None:
    plan = generate_workload(parse_workload_spec(PHASED))
    first, again = plan.phases[0].requests, plan.phases[2].requests
    p1 = first[0].input_token_ids(plan.seed)[:64]
    p2 = again[0].input_token_ids(plan.seed)[:64]
    assert np.array_equal(p1, p2)
    assert not np.array_equal(first[0].input_token_ids(plan.seed)[64:70], again[0].input_token_ids(plan.seed)[64:70])
    assert [r.arrival_us for r in first] != [r.arrival_us for r in again]


def test_phase_without_phases_is_unnamed() -> None:
    plan = spec("aggregate_rate: 10\nnum_requests: 3\n", client("a"))
    assert [p.name for p in plan.phases] == [""] and plan.phases[0].requests[0].phase == ""


# --- closed-loop multi-turn sessions -------------------------------------------------------------------------

SESSIONS = """\
seed: 11
aggregate_rate: 2
num_requests: {n}
clients:
  - id: chat
    rate_fraction: 1
    prefix_group: sys
    prefix_length: 32
    arrival: {{process: poisson}}
    input_distribution:  {{type: gaussian, params: {{mean: 100, std_dev: 20, min: 10, max: 300}}}}
    output_distribution: {{type: constant, params: {{value: 40}}}}
    reasoning:
      multi_turn: {{max_rounds: 4, think_time_us: 1000000, context_growth: {growth}}}
"""


def test_closed_loop_sessions_release_rounds_after_completion_plus_think_time() -> None:
    plan = generate_workload(parse_workload_spec(SESSIONS.format(n=40, growth="accumulate")))
    phase = plan.phases[0]
    assert len(phase.requests) == 10 and len(phase.sessions) == 10  # 10 sessions x 4 rounds = the 40 budget
    assert all(r.round_index == 0 and r.kind == "session" for r in phase.requests)
    sent = simulate(phase, latency_us=50_000)
    assert len(sent) == 40
    by_session: dict[str, list[tuple[int, int, PlannedRequest]]] = {}
    for s in sent:
        by_session.setdefault(s[2].session_id, []).append(s)
    for rounds in by_session.values():
        assert [r.round_index for _, _, r in rounds] == [0, 1, 2, 3]
        for (t0, d0, a), (t1, _, b) in zip(rounds, rounds[1:]):
            assert t1 == d0 + 1_000_000 and b.think_time_us == 1_000_000
            assert b.input_tokens == a.input_tokens + a.output_tokens + b.new_input_tokens   # accumulated
            assert b.prefix_length == 32 and b.prefix_group == "sys"
            assert b.deadline_us == b.arrival_us + 300_000_000
            prev, cur = a.input_token_ids(plan.seed), b.input_token_ids(plan.seed)
            assert len(cur) == b.input_tokens and np.array_equal(cur[:len(prev)], prev)


def test_accumulation_uses_the_reported_output_length() -> None:
    phase = generate_workload(parse_workload_spec(SESSIONS.format(n=8, growth="accumulate"))).phases[0]
    first = phase.requests[0]
    sent = simulate(phase, 1000, output_of={first.uid: 7})
    second = next(r for _, _, r in sent if r.session_id == first.session_id and r.round_index == 1)
    assert second.input_tokens == first.input_tokens + 7 + second.new_input_tokens
    assert second.history == ((first.new_input_tokens, 7),)


def test_sessions_without_growth_restart_from_the_prefix() -> None:
    plan = generate_workload(parse_workload_spec(SESSIONS.format(n=8, growth='""')))
    assert plan.session_context_growth == ""
    assert generate_workload(parse_workload_spec(SESSIONS.format(n=8, growth="accumulate"))) \
        .session_context_growth == "accumulate"
    phase = plan.phases[0]
    for _, _, r in simulate(phase, 1000):
        assert r.input_tokens == 32 + r.new_input_tokens and r.history == ()


def test_a_failed_round_ends_its_session() -> None:
    phase = generate_workload(parse_workload_spec(SESSIONS.format(n=40, growth="accumulate"))).phases[0]
    victim = phase.requests[0]
    sent = simulate(phase, 1000, fail={victim.uid})
    assert [r.round_index for _, _, r in sent if r.session_id == victim.session_id] == [0]
    assert len(sent) == 37


def test_duplicate_completions_release_nothing() -> None:
    phase = generate_workload(parse_workload_spec(SESSIONS.format(n=40, growth="accumulate"))).phases[0]
    run = phase.start()
    first = run.initial[0]
    nxt = run.on_complete(first, ok=True, completed_at_us=10)
    assert nxt is not None and nxt.round_index == 1
    assert run.on_complete(first, ok=True, completed_at_us=20) is None  # the same round again
    assert run.on_complete(nxt, ok=True, completed_at_us=30) is not None
    assert run.released == 2


def test_follow_ups_are_independent_of_completion_order() -> None:
    phase = generate_workload(parse_workload_spec(SESSIONS.format(n=40, growth="accumulate"))).phases[0]
    fast = {r.uid: r for _, _, r in simulate(phase, 1000)}
    slow = {r.uid: r for _, _, r in simulate(phase, 3_000_000)}
    assert fast.keys() == slow.keys()
    for uid in fast:
        a, b = fast[uid], slow[uid]
        assert (a.input_tokens, a.output_tokens, a.new_input_tokens) == (b.input_tokens, b.output_tokens,
                                                                         b.new_input_tokens)


def test_session_budget_truncates_the_last_session() -> None:
    phase = generate_workload(parse_workload_spec(SESSIONS.format(n=10, growth="accumulate"))).phases[0]
    assert sorted(s.max_rounds for s in phase.sessions.values()) == [2, 4, 4]  # type: ignore[type-var]
    assert len(simulate(phase, 1000)) == 10


def test_horizon_interrupts_sessions() -> None:
    text = SESSIONS.format(n=1000, growth="accumulate").replace("num_requests: 1000", "horizon: 3000000")
    phase = generate_workload(parse_workload_spec(text)).phases[0]
    sent = simulate(phase, 100_000)
    assert all(t <= 3_000_000 for t, _, _ in sent)
    assert any(r.round_index > 0 for _, _, r in sent)
    assert any(s.max_rounds == 4 for s in phase.sessions.values())


def test_open_loop_sessions_are_prescheduled() -> None:
    # sessions ~10 s apart, each spanning ~3 s: rounds of different sessions do not interleave
    text = SESSIONS.format(n=12, growth="accumulate").replace("reasoning:", "closed_loop: false\n    reasoning:") \
        .replace("aggregate_rate: 2", "aggregate_rate: 0.1")
    phase = generate_workload(parse_workload_spec(text)).phases[0]
    assert phase.sessions == {} and len(phase.requests) == 12
    rounds: dict[str, list[PlannedRequest]] = {}
    for r in phase.requests:
        rounds.setdefault(r.session_id, []).append(r)
    full = [rs for rs in rounds.values() if len(rs) == 4]
    assert full
    for rs in full:
        for a, b in zip(rs, rs[1:]):
            assert b.arrival_us == a.arrival_us + 1_000_000 + a.output_tokens
            assert b.input_tokens == a.input_tokens + a.output_tokens + b.new_input_tokens


def test_reason_ratio_is_sampled_as_a_percentage() -> None:
    text = SESSIONS.format(n=8, growth="accumulate").replace(
        "    reasoning:\n", "    reasoning:\n      reason_ratio_distribution: {type: constant, params: {value: 30}}\n")
    phase = generate_workload(parse_workload_spec(text)).phases[0]
    assert {r.reason_ratio for _, _, r in simulate(phase, 1000)} == {0.3}


# --- closed-loop virtual users (concurrency) -----------------------------------------------------------------

CONC = """\
seed: 3
{bound}
clients:
  - {{id: u, concurrency: 4, think_time_us: 10000, prefix_group: g, prefix_length: 16,
     input_distribution: {{type: constant, params: {{value: 8}}}},
     output_distribution: {{type: constant, params: {{value: 2}}}}}}
"""


def test_concurrency_users_keep_n_in_flight_until_the_horizon() -> None:
    phase = generate_workload(parse_workload_spec(CONC.format(bound="horizon: 1000000"))).phases[0]
    assert [r.arrival_us for r in phase.requests] == [0, 2500, 5000, 7500]   # staggered over the think time
    assert phase.follow_up_budget == -1
    sent = simulate(phase, latency_us=40_000)
    # each user: one request per 50 ms (40 ms service + 10 ms think) over 1 s
    per_user = Counter(r.session_id for _, _, r in sent)
    assert len(per_user) == 4 and all(19 <= n <= 21 for n in per_user.values())
    assert all(r.kind == "closed_loop" and r.input_tokens == 24 and r.history == () for _, _, r in sent)
    assert all(t <= 1_000_000 for t, _, _ in sent)
    inflight = max(sum(1 for s, d, _ in sent if s <= t < d) for t, _, _ in sent)
    assert inflight == 4


def test_concurrency_users_send_new_content_every_round() -> None:
    """A virtual user's rounds share the group prefix and nothing else (they do not accumulate)."""
    plan = generate_workload(parse_workload_spec(CONC.format(bound="num_requests: 12")))
    sent = simulate(plan.phases[0], latency_us=40_000)
    by_user: dict[str, list] = {}
    for _, _, r in sent:
        by_user.setdefault(r.session_id, []).append(r)
    rounds = by_user[sorted(by_user)[0]]
    assert len(rounds) >= 3 and [r.round_index for r in rounds] == list(range(len(rounds)))
    ids = [r.input_token_ids(plan.seed) for r in rounds]
    assert all(len(x) == 24 and np.array_equal(x[:16], ids[0][:16]) for x in ids)
    suffixes = {tuple(x[16:].tolist()) for x in ids}
    assert len(suffixes) == len(ids)  # every round's own 8 tokens differ


def test_concurrency_users_share_the_request_budget() -> None:
    phase = generate_workload(parse_workload_spec(CONC.format(bound="num_requests: 25"))).phases[0]
    assert len(phase.requests) == 4 and phase.follow_up_budget == 21
    assert len(simulate(phase, 40_000)) == 25
    tiny = generate_workload(parse_workload_spec(CONC.format(bound="num_requests: 2"))).phases[0]
    assert len(tiny.requests) == 2 and len(simulate(tiny, 40_000)) == 2


def test_concurrency_and_open_loop_clients_mix() -> None:
    # As in the reference, open-loop requests are kept first; users get seeds and follow-ups from what is left.
    text = CONC.format(bound="num_requests: 30\nhorizon: 1000000\naggregate_rate: 10") + \
        "  - {id: o, rate_fraction: 1, arrival: {process: poisson}, input_distribution: {type: constant, " \
        "params: {value: 8}}, output_distribution: {type: constant, params: {value: 2}}}\n"
    phase = generate_workload(parse_workload_spec(text)).phases[0]
    n_open = sum(1 for r in phase.requests if r.kind == "open")
    assert 3 <= n_open <= 20
    assert len(phase.requests) == n_open + 4 and phase.follow_up_budget == 30 - n_open - 4
    assert len(simulate(phase, 1000)) == 30
    full = generate_workload(parse_workload_spec(text.replace("num_requests: 30", "num_requests: 5"))).phases[0]
    assert len(full.requests) <= 5 and full.follow_up_budget == 5 - len(full.requests)


def test_session_rounds_mean_think_and_lengths() -> None:
    # think time is constant; the round lengths follow the client's distributions
    phase = generate_workload(parse_workload_spec(SESSIONS.format(n=400, growth='""'))).phases[0]
    news = [r.new_input_tokens for _, _, r in simulate(phase, 1000)]
    assert statistics.mean(news) == pytest.approx(100, abs=4)
