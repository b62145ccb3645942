"""A cluster replay (docs/cluster.md §2, §4): routing, the replica column, per-replica outputs."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from blis_sim.engine.cluster import replay_cluster, route_table
from blis_sim.engine.replay_trace import prepare_trace, replay_outcome
from blis_sim.engine.simulate import EngineOptions
from blis_sim.errors import FormatError, UsageError
from blis_sim.formats import Trace, TraceHeader, TraceRecord
from blis_sim.formats.results import load_metrics_output
from blis_sim.formats.trace_columns import read_trace_columns
from blis_sim.formats.trace_data import data_text
from blis_sim.routing import Router, RoutingSpec, prefix_key, route_static


def _trace(n: int = 240, groups: int = 8, replicas: list[int] | None = None) -> Trace:
    rng = np.random.default_rng(7)
    records = []
    t = 0
    for i in range(n):
        t += int(rng.exponential(40_000)) + 1
        g = int(rng.integers(0, groups))
        records.append(TraceRecord(
            request_id=i, client_id=f"c{g}", prefix_group=f"sys-{g}", prefix_length=512,
            input_tokens=int(rng.integers(32, 256)), output_tokens=int(rng.integers(1, 32)),
            arrival_time_us=t, send_time_us=t, replica=-1 if replicas is None else replicas[i]))
    return Trace(header=TraceHeader(mode="generated", time_unit="microseconds"), records=records)


OPTS = EngineOptions(model="tiny-llama", num_gpu_blocks=160, block_size=16)


def test_scorer_syntax_is_the_references() -> None:
    spec = RoutingSpec.parse("weighted", "prefix-affinity:3, queue-depth:2")
    assert spec.scorers == (("prefix-affinity", 3.0), ("queue-depth", 2.0))
    assert spec.text() == "prefix-affinity:3,queue-depth:2" and spec.load_dependent
    assert not RoutingSpec.parse("weighted", "prefix-affinity").load_dependent
    for policy, scorers, words in (("weighted", None, "needs --routing-scorers"),
                                   ("round-robin", "queue-depth:1", "weighted only"),
                                   ("weighted", "kv-utilization:1", "not supported"),
                                   ("weighted", "cache:1", "unknown scorer"),
                                   ("weighted", "queue-depth:x", "not a number"),
                                   ("weighted", "queue-depth:-1", "≥ 0"),
                                   ("weighted", "queue-depth:1,queue-depth:2", "twice"),
                                   ("random", None, "expected one of")):
        with pytest.raises(UsageError, match=words):
            RoutingSpec.parse(policy, scorers)


def test_policies_route_as_documented() -> None:
    keys = [prefix_key(f"g{i % 8}", "", i) for i in range(64)]
    rr = route_static(RoutingSpec("round-robin"), 3, keys)
    assert rr == [i % 3 for i in range(64)]
    pa = route_static(RoutingSpec("prefix-affinity"), 2, keys)
    owner = {k: r for k, r in zip(keys, pa)}
    assert all(owner[k] == r for k, r in zip(keys, pa))           # one replica per prefix
    assert set(pa) == {0, 1}                                       # and both replicas used
    # consistent hashing: adding a replica moves only the keys the new one takes
    pa3 = route_static(RoutingSpec("prefix-affinity"), 3, keys)
    assert all(b == a for a, b in zip(pa, pa3) if b != 2)
    # weighted prefix-affinity: a new prefix goes round-robin among the tied, then sticks
    w = route_static(RoutingSpec.parse("weighted", "prefix-affinity:1"), 2, keys)
    assert w[:2] == [0, 1] and all(w[i] == w[i % 8] for i in range(64))
    router = Router(RoutingSpec("least-loaded"), 3)
    assert router.choose("k", [2, 0, 1]) == 1 and router.choose("k", [1, 1, 1]) == 0
    assert Router(RoutingSpec("always-busiest"), 3).choose("k", [2, 0, 5]) == 2
    qd = Router(RoutingSpec.parse("weighted", "queue-depth:1"), 2)
    assert qd.choose("k", [3, 1]) == 1
    with pytest.raises(ValueError, match="route_by_load"):  # the replicas' clock routes it
        route_static(RoutingSpec("least-loaded"), 2, keys)


def test_recorded_routing_is_each_replica_replayed_alone() -> None:
    """Replicas share nothing but the clock: a cluster replay is the single-server replay of each
    replica's rows on a cache of its own, exactly."""
    replicas = [int(x) for x in np.random.default_rng(3).integers(0, 2, 240)]
    trace = _trace(replicas=replicas)
    out = replay_cluster(trace, OPTS)
    assert len(out.parts) == 2 and out.agreement is None
    for r in range(2):
        alone = Trace(header=trace.header, records=[x for x in trace.records if x.replica == r])
        single = replay_outcome(alone, OPTS).outcome
        part = out.parts[r]
        assert part.hit_rates == single.hit_rates
        np.testing.assert_array_equal(part.ttft_us, single.ttft_us)
    merged = out.outcome.hit_rates[0]
    assert merged["hits"] == sum(p.hit_rates[0]["hits"] for p in out.parts)
    assert merged["queries"] == sum(p.hit_rates[0]["queries"] for p in out.parts)


def test_prefix_affinity_beats_round_robin_on_a_cache_that_fits_half_the_prefixes() -> None:
    trace = _trace()
    rates = {}
    for policy in ("round-robin", "prefix-affinity"):
        out = replay_cluster(trace, OPTS, num_instances=2, routing=RoutingSpec(policy))
        rates[policy] = out.outcome.hit_rates[0]["hit_rate"]
    assert rates["prefix-affinity"] > rates["round-robin"] + 0.2, rates


def test_outputs_and_the_reexported_trace(tmp_path) -> None:
    trace = _trace()
    out = replay_cluster(trace, OPTS, num_instances=2, routing=RoutingSpec("prefix-affinity"))
    out.write_outputs(tmp_path / "sim.json", tmp_path / "simagg.json")
    rows = json.loads((tmp_path / "sim.json").read_text())
    assert {r["instance_id"] for r in rows} == {"instance_0", "instance_1"}
    m = load_metrics_output(tmp_path / "simagg.json")
    assert m.instance_id == "cluster" and [i.instance_id for i in m.instances] == ["instance_0", "instance_1"]
    assert sum(i.completed_requests for i in m.instances) == m.completed_requests == 240
    assert m.instances[0].kv_hit_rates[0].hits + m.instances[1].kv_hit_rates[0].hits == m.kv_hit_rates[0].hits
    assert {r.handled_by for r in m.requests} == {"instance_0", "instance_1"}
    again = out.trace()
    assert again.header.pytest_blis.cluster.routing_policy == "prefix-affinity"
    owner: dict[str, set[int]] = {}
    for r in again.records:
        owner.setdefault(r.prefix_group, set()).add(r.replica)
    assert all(len(v) == 1 for v in owner.values()) and set().union(*owner.values()) == {0, 1}
    # replaying the re-export with its recorded routing gives the same replicas and results
    replayed = replay_cluster(again, OPTS)
    assert replayed.agreement is None
    for a, b in zip(replayed.parts, out.parts):
        assert a.hit_rates == b.hit_rates
    rerouted = replay_cluster(again, OPTS, routing=RoutingSpec("round-robin"))
    assert rerouted.agreement is not None and 0.0 <= rerouted.agreement < 1.0


def test_recorded_needs_a_replica_column_and_a_cluster_that_holds_it() -> None:
    table = prepare_trace(_trace()).table
    assert route_table(table, RoutingSpec("recorded"), 1).tolist() == [0] * 240
    with pytest.raises(UsageError, match="no replica column"):
        route_table(table, RoutingSpec("recorded"), 2)
    trace = _trace(replicas=[i % 3 for i in range(240)])
    with pytest.raises(Exception, match="outside the cluster"):
        replay_cluster(trace, OPTS, num_instances=2)


def test_replica_column_is_written_only_for_a_cluster(tmp_path) -> None:
    one = _trace()
    assert "replica" not in data_text(one.records, mode="real").splitlines()[0]
    two = _trace(replicas=[i % 2 for i in range(240)])
    text = data_text(two.records, mode="real")
    assert text.splitlines()[0].endswith(",replica")
    path = tmp_path / "t.csv"
    path.write_text(text)
    assert read_trace_columns(path).array("replica").tolist() == [i % 2 for i in range(240)]
    lines = text.splitlines()
    lines[1] = lines[1].rsplit(",", 1)[0] + ",-2"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(FormatError, match="replica") as info:
        read_trace_columns(path)
    assert info.value.location.line == 2


def test_run_over_a_cluster_and_its_replay_agree() -> None:
    """INV-13 for a cluster: ``blis run --num-instances 2`` and the replay of its trace, recorded routing."""
    from blis_sim.engine.cluster import run_cluster
    from blis_sim.formats.workload import load_workload_spec

    spec = load_workload_spec(Path(__file__).resolve().parents[1] / "samples" / "blis" / "workload.yaml")
    run = run_cluster(spec, OPTS, num_instances=2, routing=RoutingSpec("prefix-affinity"), num_requests=300)
    trace = run.trace()
    assert trace.header.pytest_blis.cluster.num_instances == 2
    assert {r.replica for r in trace.records} == {0, 1}
    again = replay_cluster(trace, OPTS)
    assert [(r.request_id, r.instance_id, r.ttft_us) for r in again.results] == \
        [(r.request_id, r.instance_id, r.ttft_us) for r in run.results]
    assert [m.kv_hit_rates for m in again.instance_metrics()] == [m.kv_hit_rates for m in run.instance_metrics()]
    with pytest.raises(UsageError, match="recorded"):
        run_cluster(spec, OPTS, num_instances=2, routing=RoutingSpec("recorded"), num_requests=10)
