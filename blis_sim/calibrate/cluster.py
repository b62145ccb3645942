"""A cluster calibrated replica by replica (design D11, docs/cluster.md §5).

API::

    replicas, agreement, notes = calibrate_replicas(trace, sim_results, sim_metrics, options=..., warmup=0,
                                                    rtt_us=0)

For each replica of the trace header's ``pytest_blis.cluster`` block: the requests it served (the
data's ``replica`` column) paired with their simulated results, TTFT/E2E compared as for one server,
and its own counter window's hit-rates, every definition and tier, against the simulated instance's
(``MetricsOutput.instances``, in replica order). The routing agreement is the share of paired
requests whose simulated ``instance_id`` is the replica the real router chose. A replay that routed
otherwise (agreement below 1) serves other requests on each replica than the real one did: its
replica rows are reported but not judged, and the cluster's own verdicts stand.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from blis_sim.calibrate.hitrate import HitRateEntry, compare_definitions
from blis_sim.calibrate.pairing import prepare_pairs
from blis_sim.calibrate.stats import compute_calibration
from blis_sim.formats.report import (
    HitRateDefinitionComparison,
    MetricComparison,
    ReplicaCalibration,
    RoutingAgreement,
    ToleranceVerdict,
    UnpairedHitRate,
)


def calibrate_replicas(trace: Any, sim_results: Sequence[Any], sim_metrics: Any | None, *, options: Any,
                       warmup: int, rtt_us: int) -> tuple[list[ReplicaCalibration], RoutingAgreement | None,
                                                          list[str]]:
    """See the module docstring; ``([], None, [])`` for a trace of one server."""
    ext = getattr(trace.header, "pytest_blis", None)
    cluster = getattr(ext, "cluster", None)
    if cluster is None:
        return [], None, []
    notes: list[str] = []
    instances = list(getattr(sim_metrics, "instances", None) or ())
    by_id = {sr.request_id: sr for sr in sim_results}
    paired = [(rec, by_id[rec.request_id]) for rec in trace.records if rec.request_id in by_id]
    named = [(rec, sr) for rec, sr in paired if getattr(sr, "instance_id", "")]
    agreement = None
    if named:
        agreed = sum(1 for rec, sr in named if sr.instance_id == f"instance_{rec.replica}")
        agreement = RoutingAgreement(requests=len(named), agreed=agreed, share=agreed / len(named))
    else:
        notes.append("the simulated results name no instance (a single-server replay of a cluster trace): "
                     "no routing agreement, and each replica's requests are compared with their simulated "
                     "results")
    rerouted = agreement is not None and agreement.agreed < agreement.requests
    if rerouted:
        notes.append(f"re-routed replay: {agreement.share:.1%} of the requests went to the replica the real "  # type: ignore[union-attr]
                     "router chose; the replica rows compare different requests, so only the cluster's verdicts "
                     "are judged")
    if sim_metrics is not None and instances and len(instances) != cluster.num_instances:
        notes.append(f"the trace has {cluster.num_instances} replicas, the simulated metrics "
                     f"{len(instances)} instances: per-replica hit-rates are not compared")
        instances = []
    out: list[ReplicaCalibration] = []
    for k in range(cluster.num_instances):
        rep = cluster.replicas[k] if k < len(cluster.replicas) else None
        mine = [rec for rec in trace.records if rec.replica == k]
        ids = {rec.request_id for rec in mine}
        metrics: dict[str, MetricComparison] = {}
        tolerance = None
        matched = 0
        if mine:
            pairs = prepare_pairs(mine, [sr for sr in sim_results if sr.request_id in ids],
                                  warmup_requests=warmup, honour_warmup_column=options.warmup_requests != 0,
                                  network_rtt_us=rtt_us, bandwidth_mbps=options.network_bandwidth_mbps)
            matched = pairs.matched
            if pairs.ttft.real:
                metrics = {"ttft": compute_calibration(pairs.ttft.real, pairs.ttft.sim, "ttft"),
                           "e2e": compute_calibration(pairs.e2e.real, pairs.e2e.sim, "e2e")}
                mape = metrics["ttft"].request_level.mape
                tolerance = ToleranceVerdict(mape=mape, threshold=options.ttft_mape_threshold,
                                             within=mape <= options.ttft_mape_threshold)
        definitions: list[HitRateDefinitionComparison] = []
        unpaired: list[UnpairedHitRate] = []
        observed = [HitRateEntry.of(e) for e in (rep.kv_hit_rates if rep is not None else ())]
        simulated = [HitRateEntry.of(e) for e in (instances[k].kv_hit_rates or ())] if instances else []
        if observed and simulated:
            definitions, unpaired = compare_definitions(observed, simulated, options.hit_rate_tolerance_pp)
        out.append(ReplicaCalibration(replica=k, server_url=rep.server_url if rep is not None else "",
                                      matched_pairs=matched, metrics=metrics, ttft_tolerance=tolerance,
                                      kv_hit_rates=definitions, kv_hit_rates_unpaired=unpaired,
                                      judged=not rerouted))
    return out, agreement, notes
