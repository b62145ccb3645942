"""A cluster: N replicas, each with its own tiered KV cache, on one simulated clock (docs/cluster.md §4).

API::

    out = replay_cluster(trace, options, num_instances=None, routing=RoutingSpec("recorded"))
    out.parts[r]                    # replica r's SimOutcome; out.outcome: every row, with .replica
    out.metrics()                   # the cluster MetricsOutput, ``instances``: one per replica
    out.write_outputs("sim.json", "simagg.json"); out.trace()   # SimResult rows carry instance_id
    out.agreement                   # re-routed: share of rows sent where the recorded router sent them

Routing comes first (``blis_sim.routing``): the trace's ``replica`` column (``recorded``, the
default), or a policy that does not depend on load, in arrival order. Each replica's rows then run
through the single-server replay (:func:`~blis_sim.engine.replay_trace.simulate_replica`: phases,
sequential clients) on a cache of its own. Replicas share nothing but the clock, and their arrivals
are on one time axis (the trace's first send), so simulating them one after the other is the same
simulation as interleaving their steps. A policy that needs the requests in flight at each arrival
(``least-loaded``, ``always-busiest``, ``queue-depth``) is routed first by a pass that interleaves
the replicas' steps on caches of its own (:mod:`blis_sim.engine.load_routing`); its routing is then
simulated as a recorded one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from blis_sim.engine.load_routing import Replica, check_load_routable, route_by_load
from blis_sim.engine.outputs import SimulatedOutputs, metrics_output, trace_records
from blis_sim.engine.provenance import sim_provenance
from blis_sim.engine.replay_trace import BC10_MESSAGE, observed_from_tiers, prepare_trace, simulate_replica
from blis_sim.engine.requests import RequestTable
from blis_sim.engine.run_spec import RunOutcome, simulate_phases
from blis_sim.engine.settings import resolve_settings
from blis_sim.engine.simulate import EngineOptions, SimOutcome, build_kv, combine_outcomes, concat_parts
from blis_sim.errors import ConfigError, UsageError
from blis_sim.formats import MetricsOutput
from blis_sim.routing import RoutingSpec, prefix_key, route_static

if TYPE_CHECKING:
    from blis_sim.engine.replay_trace import ReplayableTrace
    from blis_sim.formats import Trace, TraceHeader
    from blis_sim.formats.trace_columns import ColumnarTrace
    from blis_sim.formats.trace_header import ClusterInfo
    from blis_sim.formats.workload import WorkloadSpec


class _ClusterOutputs(SimulatedOutputs):
    """The outputs of a cluster: the aggregate with one entry per replica, rows naming their instance."""

    outcome: SimOutcome
    parts: list[SimOutcome]
    options: EngineOptions
    routing: RoutingSpec

    def metrics(self, include_requests: bool = True) -> MetricsOutput:
        m = metrics_output(self.outcome, include_requests=include_requests,
                           provenance=sim_provenance(self.outcome, self.options))
        return m.model_copy(update={"instances": self.instance_metrics()})

    def instance_metrics(self) -> list[MetricsOutput]:
        return [metrics_output(p, include_requests=False, provenance=None).model_copy(
            update={"instance_id": f"instance_{r}"}) for r, p in enumerate(self.parts)]

    def write_outputs(self, results_path: str | Path | None = None,
                      metrics_path: str | Path | None = None) -> MetricsOutput:
        # the cluster aggregate is written once, with the replicas' aggregates in it
        from blis_sim.engine.outputs import _SourceText, request_metrics_columns, sim_result_columns
        from blis_sim.formats.results import write_metrics_output, write_sim_results

        o = self.outcome
        text = _SourceText(o)
        if results_path is not None:
            write_sim_results(sim_result_columns(o, text), results_path)
        metrics = self.metrics(include_requests=False)
        if metrics_path is not None:
            write_metrics_output(metrics, metrics_path, requests=request_metrics_columns(o, text))
        return metrics

    def _with_cluster(self, header: TraceHeader) -> TraceHeader:
        """``header`` with the simulated cluster block: routing, each replica's geometry and hit-rates."""
        from blis_sim.formats._model import construct
        from blis_sim.formats.hitrate import KVHitRate
        from blis_sim.formats.trace_header import ClusterInfo, KVGeometry, ReplicaInfo

        replicas = [construct(ReplicaInfo, index=r, requests=len(p.table),
                              kv_geometry=construct(KVGeometry, block_size=p.block_size,
                                                    num_gpu_blocks=p.num_gpu_blocks),
                              kv_hit_rates=[construct(KVHitRate, **e) for e in p.hit_rates])
                    for r, p in enumerate(self.parts)]
        cluster = construct(ClusterInfo, num_instances=len(self.parts), routing_policy=self.routing.policy,
                            routing_scorers=self.routing.text(), replicas=replicas)
        assert header.pytest_blis is not None  # sim_header always writes our block
        return header.model_copy(update={"pytest_blis": header.pytest_blis.model_copy(
            update={"cluster": cluster})})


@dataclass
class ClusterOutcome(_ClusterOutputs):
    outcome: SimOutcome          # every replica's rows (``outcome.replica``), cluster hit-rates
    parts: list[SimOutcome]      # one per replica
    header: TraceHeader
    options: EngineOptions
    routing: RoutingSpec
    agreement: float | None      # re-routed with a recorded column: rows on the recorded replica

    def trace(self) -> Trace:
        """The replay re-exported (``mode: replayed``) with each row's simulated replica."""
        from blis_sim.formats import Trace

        columnar = self.trace_columns()
        return Trace.model_construct(header=columnar.header, records=columnar.records)

    def trace_columns(self) -> ColumnarTrace:
        """:meth:`trace` as a ``ColumnarTrace`` (what ``--trace-output`` writes)."""
        from blis_sim.engine.provenance import sim_header
        from blis_sim.formats.trace_columns import ColumnarTrace

        header = sim_header(self.outcome, self.options, mode="replayed", base=self.header)
        return ColumnarTrace(header=self._with_cluster(header), data=trace_records(self.outcome))


@dataclass
class ClusterRunOutcome(RunOutcome, _ClusterOutputs):
    """``blis run`` over a cluster: :class:`~blis_sim.engine.run_spec.RunOutcome` with the replicas."""

    parts: list[SimOutcome] = field(default_factory=list)
    routing: RoutingSpec = field(default_factory=RoutingSpec)

    def trace_columns(self, workload_spec: str = "") -> ColumnarTrace:
        from blis_sim.formats.trace_columns import ColumnarTrace

        base = RunOutcome.trace_columns(self, workload_spec=workload_spec)
        return ColumnarTrace(header=self._with_cluster(base.header), data=base.data)


__all__ = ["ClusterOutcome", "ClusterRunOutcome", "merge_replicas", "recorded_replicas", "replay_cluster",
           "route_table", "run_cluster"]


def recorded_replicas(table: RequestTable) -> np.ndarray | None:
    """The trace's ``replica`` column in table order, or None when it has none (one server)."""
    src = table.source
    column = getattr(src, "column", None)
    if column is None:
        return None
    const, value = column("replica")
    if const:
        return None if value == -1 else np.full(len(table), int(value), dtype=np.int64)
    col = np.asarray(value, dtype=np.int64)
    return None if col.size and (col == -1).all() else col


def row_keys(table: RequestTable) -> list[str]:
    """Each row's prefix key (:func:`blis_sim.routing.prefix_key`), in table (arrival) order."""
    src = table.source
    if hasattr(src, "column"):
        def col(name: str) -> list[Any]:
            const, value = src.column(name)
            return [value] * len(table) if const else list(value)
        groups, sessions = col("prefix_group"), col("session_id")
    else:
        groups = [getattr(r, "prefix_group", "") for r in src]
        sessions = [getattr(r, "session_id", "") for r in src]
    return [prefix_key(g, s, int(rid)) for g, s, rid in zip(groups, sessions, table.request_id.tolist())]


def route_table(table: RequestTable, routing: RoutingSpec, num_instances: int) -> np.ndarray:
    """The replica of each row under ``routing`` (``recorded``: the trace's column)."""
    recorded = recorded_replicas(table)
    if routing.policy == "recorded":
        if recorded is None:
            if num_instances == 1:
                return np.zeros(len(table), dtype=np.int64)
            raise UsageError("--routing-policy recorded: the trace has no replica column (it was "
                             "observed on one server); re-route it with --routing-policy round-robin, "
                             "prefix-affinity or weighted")
        bad = np.flatnonzero((recorded < 0) | (recorded >= num_instances))
        if bad.size:
            rid = int(table.request_id[bad[0]])
            raise ConfigError(f"request {rid} was served by replica {int(recorded[bad[0]])}, outside "
                              f"the cluster's 0..{num_instances - 1} (--num-instances {num_instances})",
                              field="replica")
        return recorded
    if num_instances == 1:
        return np.zeros(len(table), dtype=np.int64)
    return np.asarray(route_static(routing, num_instances, row_keys(table)), dtype=np.int64)


def _cluster_info(header: TraceHeader) -> ClusterInfo | None:
    ext = header.pytest_blis
    return ext.cluster if ext is not None else None


def replay_cluster(trace: ReplayableTrace, options: EngineOptions | None = None, *, num_instances: int | None = None,
                   routing: RoutingSpec | None = None) -> ClusterOutcome:
    """Replay ``trace`` over ``num_instances`` replicas (default: the header's cluster block, else
    one more than the largest recorded replica, else 1); see the module docstring."""
    given = options or EngineOptions()
    routing = routing or RoutingSpec("recorded")
    header = trace.header
    options = resolve_settings(given, header)
    offload = options.kv_offload
    if offload is None and observed_from_tiers(header):
        raise ConfigError(BC10_MESSAGE)
    table = prepare_trace(trace).table
    info = _cluster_info(header)
    recorded = recorded_replicas(table)
    n = num_instances
    if n is None:
        n = info.num_instances if info is not None else (
            int(recorded.max()) + 1 if recorded is not None and recorded.size else 1)
    block_size, num_blocks = int(options.block_size or 0), int(options.num_gpu_blocks or 0)
    blocks = [num_blocks] * n
    for r in range(n):
        if given.num_gpu_blocks is None and info is not None and r < len(info.replicas):
            geom = info.replicas[r].kv_geometry
            if geom is not None and geom.num_gpu_blocks:
                blocks[r] = int(geom.num_gpu_blocks)
            if geom is not None and geom.block_size and geom.block_size != block_size:
                raise ConfigError(f"replica {r} has block size {geom.block_size}, the cluster "
                                  f"{block_size}: one block size per cluster",
                                  field="pytest_blis.cluster.replicas.kv_geometry.block_size")
    if routing.load_dependent and n > 1:
        check_load_routable(table, routing, sequential=options.sequential, phases=len(table.phases()))
        replicas = [Replica(build_kv(b, block_size, offload, options.seed, backend=options.kv_backend), b)
                    for b in blocks]
        assign = route_by_load(table, routing, replicas, options, content_seed=options.seed,
                               keys=row_keys(table))
    else:
        assign = route_table(table, routing, n)
    parts = [simulate_replica(table.take(np.flatnonzero(assign == r)), options, block_size, blocks[r], offload)
             for r in range(n)]
    agreement = None
    if routing.policy != "recorded" and recorded is not None and len(table):
        agreement = float((assign == recorded).mean())
    merged = merge_replicas(parts)
    return ClusterOutcome(outcome=merged, parts=parts, header=header, options=options, routing=routing,
                          agreement=agreement)


def merge_replicas(parts: list[SimOutcome]) -> SimOutcome:
    """The replicas' outcomes as one: rows one replica after another, token and chunk hit-rates
    summed over replicas per definition and tier (each replica's own window), the reference's
    block ``cache_hit_rate`` the unweighted mean over instances (docs/reference-formats.md §4.5)."""
    t, loop, admitted, cached = concat_parts(parts)
    loop.end_us = max(p.loop.end_us for p in parts)
    rates: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for p in parts:
        for e in p.hit_rates:
            key = (e["definition"], e["tier"], e["unit"])
            acc = rates.setdefault(key, {**e, "hits": 0, "queries": 0})
            acc["hits"] += int(e["hits"])
            acc["queries"] += int(e["queries"])
    for acc in rates.values():
        acc["hit_rate"] = acc["hits"] / acc["queries"] if acc["queries"] else 0.0
    io: dict[str, dict[str, Any]] = {}
    for p in parts:
        for row in p.tier_io:
            acc = io.setdefault(row["tier"], {k: (0 if k != "tier" else v) for k, v in row.items()})
            for k, v in row.items():
                if k != "tier":
                    acc[k] += v
    chr_ = [float(p.kv_counters.get("cache_hit_rate", 0.0)) for p in parts]
    return SimOutcome(table=t, loop=loop, cached=cached, admitted=admitted,
                      frontend_us=np.concatenate([p.frontend_us for p in parts]),
                      kv_counters={"cache_hit_rate": sum(chr_) / len(chr_)},
                      hit_rates=list(rates.values()), block_size=parts[0].block_size,
                      num_gpu_blocks=parts[0].num_gpu_blocks, offload=parts[0].offload,
                      dropped=np.concatenate([p.dropped for p in parts]), tier_io=list(io.values()),
                      replica=np.concatenate([np.full(len(p.table), r, dtype=np.int64)
                                              for r, p in enumerate(parts)]))


def run_cluster(spec: WorkloadSpec, options: EngineOptions | None = None, *, num_instances: int, routing: RoutingSpec,
                seed: int | None = None, num_requests: int | None = None,
                horizon: int | None = None) -> ClusterRunOutcome:
    """``blis run`` over ``num_instances`` replicas: each phase's requests routed by ``routing`` (in
    arrival order; a load policy on the replicas' clock), each replica simulated on a cache of its own; the next
    phase starts when every replica has drained."""
    from blis_sim.workload import generate_workload

    if routing.policy == "recorded":
        raise UsageError("--routing-policy recorded replays a trace's replicas; blis run routes a workload "
                         "spec with round-robin, prefix-affinity or weighted")
    options = resolve_settings(options or EngineOptions())
    plan = generate_workload(spec, seed=seed, num_requests=num_requests, horizon=horizon)
    offload = options.kv_offload
    block_size, num_blocks = int(options.block_size or 0), int(options.num_gpu_blocks or 0)
    kvs = [build_kv(num_blocks, block_size, offload, options.seed, backend=options.kv_backend)
           for _ in range(num_instances)]
    # a load policy's routing pass runs on caches of its own, which see every phase as the replicas' do
    shadow = [Replica(build_kv(num_blocks, block_size, offload, options.seed, backend=options.kv_backend),
                      num_blocks) for _ in range(num_instances)] if routing.load_dependent else []

    def route(table: RequestTable, phase_options: EngineOptions) -> np.ndarray:
        if not shadow:
            return route_table(table, routing, num_instances)
        return route_by_load(table, routing, shadow, phase_options, content_seed=plan.seed,
                             keys=row_keys(table))
    per, starts = simulate_phases(plan, options, kvs, route)
    if not per[0]:
        raise ConfigError("the workload generated no request")
    parts = [combine_outcomes(per[r], kvs[r], offload) for r in range(num_instances)]
    merged = merge_replicas(parts)
    return ClusterRunOutcome(outcome=merged, options=options, plan=plan,
                             phase_start=np.concatenate([a for r in range(num_instances) for a in starts[r]]),
                             parts=parts, routing=routing)
