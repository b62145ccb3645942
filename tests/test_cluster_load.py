"""Routing by load in a cluster replay and run (docs/cluster.md §2, §4): the replicas on one clock."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from blis_sim.engine import _loop_py
from blis_sim.engine.cluster import replay_cluster, row_keys, run_cluster
from blis_sim.engine.replay_trace import replay_outcome
from blis_sim.engine.simulate import EngineOptions
from blis_sim.errors import UsageError
from blis_sim.formats import Trace, TraceHeader, TraceRecord
from blis_sim.formats.offload_file import load_offload_config
from blis_sim.formats.workload import load_workload_spec
from blis_sim.routing import Router, RoutingSpec

OPTS = EngineOptions(model="tiny-llama", num_gpu_blocks=160, block_size=16)
SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "blis" / "workload.yaml"
# A long request, a short one that ends long before the next three, which come together.
ROWS = [(0, 64, 400), (10, 64, 1), (200_000, 64, 1), (200_010, 64, 1), (200_020, 64, 1)]


def _trace(rows: list[tuple[int, int, int]], **fields: object) -> Trace:
    return Trace(header=TraceHeader(mode="generated", time_unit="microseconds"), records=[
        TraceRecord(request_id=i, client_id="c", input_tokens=p, output_tokens=o, arrival_time_us=t,
                    send_time_us=t, **fields) for i, (t, p, o) in enumerate(rows)])


def _random_trace(n: int = 240, gap_us: float = 40_000, mode: str = "generated") -> Trace:
    rng = np.random.default_rng(7)
    records, t = [], 0
    for i in range(n):
        t += int(rng.exponential(gap_us)) + 1
        g = int(rng.integers(0, 8))
        records.append(TraceRecord(
            request_id=i, client_id=f"c{g}", prefix_group=f"sys-{g}", prefix_length=512,
            input_tokens=int(rng.integers(32, 256)), output_tokens=int(rng.integers(1, 64)),
            arrival_time_us=t, send_time_us=t))
    return Trace(header=TraceHeader(mode=mode, time_unit="microseconds"), records=records)


def _by_request(out) -> dict[int, int]:
    o = out.outcome
    return dict(zip(o.table.request_id.tolist(), o.replica.tolist()))


def _decisions_from(out, spec: RoutingSpec, n: int) -> list[int]:
    """The router's choices recomputed from the simulated results alone: at each arrival, a replica's
    requests in flight are those routed to it earlier, not dropped and not finished by then."""
    o = out.outcome
    order = np.lexsort((np.arange(len(o.table)), o.table.arrival_us)).tolist()
    arr, fin, rep, drop = o.table.arrival_us, o.loop.finish_us, o.replica, o.dropped
    keys = row_keys(o.table)
    router, seen, got = Router(spec, n), [], []
    for i in order:
        load = [sum(1 for j in seen if rep[j] == r and not drop[j] and not fin[j] <= arr[i]) for r in range(n)]
        r = router.choose(keys[i], inflight=load)
        router.sent(r, keys[i])
        got.append(r)
        seen.append(i)
    assert got == [int(rep[i]) for i in order]
    return got


@pytest.mark.parametrize("backend", [None, _loop_py], ids=["compiled", "pure"])
def test_least_loaded_routes_a_hand_checked_case(backend) -> None:
    """Request 0 runs for seconds; 1 ends within ms, so at 200 ms replica 1 is free again:
    0 → r0 (a tie: the lowest), 1 → r1 (loads 1,0), 2 → r1 (1,0: 1 has ended), 3 → r0 (1,1), 4 → r1 (2,1)."""
    opts = EngineOptions(model="tiny-llama", num_gpu_blocks=160, block_size=16, loop_backend=backend)
    out = replay_cluster(_trace(ROWS), opts, num_instances=2, routing=RoutingSpec("least-loaded"))
    assert _by_request(out) == {0: 0, 1: 1, 2: 1, 3: 0, 4: 1}
    fin = dict(zip(out.outcome.table.request_id.tolist(), out.outcome.loop.finish_us.tolist()))
    assert fin[1] < 200_000 < 200_020 < fin[0]  # what the hand check assumed
    # weighted queue-depth: 1 − load / most; ties round-robin among the tied (the cursor counts every
    # choice): 0 → r0 (tie, cursor 0), 1 → r1, 2 → r1, 3 → r1 (scores 0,0, cursor 3), 4 → r0 (0.5, 0)
    w = replay_cluster(_trace(ROWS), opts, num_instances=2, routing=RoutingSpec.parse("weighted", "queue-depth:1"))
    assert _by_request(w) == {0: 0, 1: 1, 2: 1, 3: 1, 4: 0}
    # always-busiest: the most in flight, ties to the lowest; replica 0 is never the lesser
    busy = replay_cluster(_trace(ROWS), opts, num_instances=2, routing=RoutingSpec("always-busiest"))
    assert set(_by_request(busy).values()) == {0}


@pytest.mark.parametrize("policy,scorers", [("least-loaded", None), ("always-busiest", None),
                                            ("weighted", "prefix-affinity:1,queue-depth:2")])
@pytest.mark.parametrize("gap_us", [40_000, 3_000])
def test_each_choice_is_the_one_the_simulated_loads_give(policy, scorers, gap_us) -> None:
    """Light and heavy load over 3 replicas: every choice is what the router would make from the
    in-flight counts of the replicas' own (final) simulation, and each replica is the replay of its rows."""
    spec = RoutingSpec.parse(policy, scorers)
    trace = _random_trace(gap_us=gap_us)
    out = replay_cluster(trace, OPTS, num_instances=3, routing=spec)
    _decisions_from(out, spec, 3)
    for r, part in enumerate(out.parts):
        mine = [x for x in trace.records if _by_request(out)[x.request_id] == r]
        if mine:
            alone = replay_outcome(Trace(header=trace.header, records=mine), OPTS).outcome
            np.testing.assert_array_equal(part.ttft_us, alone.ttft_us)
            assert part.hit_rates == alone.hit_rates


@pytest.mark.parametrize("gap_us", [300, 1_000, 3_000])
def test_with_offload_tiers_each_choice_is_still_the_simulated_loads_one(gap_us) -> None:
    """With a CPU tier, a blocked queue retries at its own next event only, as an unrouted loop does
    (a replica waiting for the router's clock moves nothing)."""
    offload = load_offload_config(SAMPLE.parent / "offload.yaml", kv_bytes_per_token=512, gpu_block_size=16,
                                  warn=lambda message: None)
    opts = EngineOptions(model="tiny-llama", num_gpu_blocks=64, block_size=16, kv_offload=offload)
    spec = RoutingSpec("least-loaded")
    trace = _random_trace(gap_us=gap_us, mode="real")  # an observation: the offload config may be added
    for backend in (None, _loop_py):
        out = replay_cluster(trace, replace(opts, loop_backend=backend), num_instances=2, routing=spec)
        _decisions_from(out, spec, 2)
        host = next(e for e in out.outcome.hit_rates if e["definition"] == "by_source" and e["tier"] == "host")
        assert host["hits"] > 0, out.outcome.hit_rates  # the CPU tier serves some prefixes


def test_one_replica_is_the_single_server_replay() -> None:
    trace = _random_trace(gap_us=3_000)
    single = replay_outcome(trace, OPTS).outcome
    one = replay_cluster(trace, OPTS, num_instances=1, routing=RoutingSpec("least-loaded")).parts[0]
    np.testing.assert_array_equal(one.ttft_us, single.ttft_us)
    assert one.hit_rates == single.hit_rates


def test_run_least_loaded_and_the_replay_of_its_trace_agree() -> None:
    """INV-13: ``blis run --routing-policy least-loaded`` and its ``--trace-output`` replayed with the
    recorded routing are the same simulation."""
    spec = load_workload_spec(SAMPLE)
    run = run_cluster(spec, OPTS, num_instances=3, routing=RoutingSpec("least-loaded"), num_requests=300)
    trace = run.trace()
    assert trace.header.pytest_blis.cluster.routing_policy == "least-loaded"
    assert {r.replica for r in trace.records} == {0, 1, 2}
    again = replay_cluster(trace, OPTS)
    assert [(r.request_id, r.instance_id, r.ttft_us, r.e2e_us) for r in again.results] == \
        [(r.request_id, r.instance_id, r.ttft_us, r.e2e_us) for r in run.results]
    assert [m.kv_hit_rates for m in again.instance_metrics()] == [m.kv_hit_rates for m in run.instance_metrics()]
    # re-routing the run's trace by load replays to the run itself: the routing is the same
    rerouted = replay_cluster(trace, OPTS, routing=RoutingSpec("least-loaded"))
    assert rerouted.agreement == 1.0


def _blis(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blis_sim", *args], capture_output=True, text=True)


def test_cli_run_and_replay_least_loaded(tmp_path) -> None:
    run = _blis("run", "--model", "tiny-llama", "--workload-spec", str(SAMPLE), "--num-requests", "120",
              "--total-kv-blocks", "160", "--num-instances", "2", "--routing-policy", "least-loaded",
              "--results-path", str(tmp_path / "run.json"), "--trace-output", str(tmp_path / "t"))
    assert run.returncode == 0, run.stderr
    rep = _blis("replay", "--model", "tiny-llama", "--trace-header", str(tmp_path / "t.yaml"),
              "--trace-data", str(tmp_path / "t.csv"), "--total-kv-blocks", "160",
              "--results-path", str(tmp_path / "rep.json"))
    assert rep.returncode == 0, rep.stderr
    key = [(r["request_id"], r["instance_id"], r["ttft_us"]) for r in json.loads((tmp_path / "run.json").read_text())]
    assert key == [(r["request_id"], r["instance_id"], r["ttft_us"])
                   for r in json.loads((tmp_path / "rep.json").read_text())]


def test_what_load_routing_refuses() -> None:
    trace = _random_trace(n=20)
    with pytest.raises(UsageError, match="--sequential"):
        replay_cluster(trace, EngineOptions(model="tiny-llama", num_gpu_blocks=160, block_size=16, sequential=True),
                       num_instances=2, routing=RoutingSpec("least-loaded"))
    phased = Trace(header=trace.header, records=[r.model_copy(update={"phase": "a" if r.request_id < 10 else "b"})
                                                 for r in trace.records])
    with pytest.raises(UsageError, match="several phases"):
        replay_cluster(phased, OPTS, num_instances=2, routing=RoutingSpec("least-loaded"))
    with pytest.raises(UsageError, match="kv-utilization"):
        RoutingSpec.parse("weighted", "kv-utilization:1")


def test_session_rounds_are_refused_by_load(tmp_path) -> None:
    session = Path(__file__).resolve().parents[1] / "scenarios" / "lane" / "vllm-cpu-session.yaml"
    with pytest.raises(UsageError, match="session rounds"):
        run_cluster(load_workload_spec(session), OPTS, num_instances=2, routing=RoutingSpec("least-loaded"))
    out = _blis("run", "--model", "tiny-llama", "--workload-spec", str(session), "--total-kv-blocks", "160",
                "--num-instances", "2", "--routing-policy", "least-loaded")
    assert out.returncode == 2 and "session rounds" in out.stderr and "Traceback" not in out.stderr
