"""A cluster calibrated replica by replica (design D11, docs/cluster.md §5).

API::

    replicas, agreement, notes = calibrate_replicas(header, real, sim, sim_metrics, options=..., warmup=0,
                                                    rtt_us=0)
    # real: the trace's TraceColumns; sim: a SimTable (blis_sim.calibrate.table)

For each replica of the trace header's ``pytest_blis.cluster`` block: the requests it served (the
data's ``replica`` column) paired with their simulated results, TTFT/E2E compared as for one server,
and its own counter window's hit-rates, every definition and tier, against the simulated instance's
(``MetricsOutput.instances``, in replica order). The routing agreement is the share of paired
requests whose simulated ``instance_id`` is the replica the real router chose. A replay that routed
otherwise (agreement below 1) serves other requests on each replica than the real one did: its
replica rows are reported but not judged, and the cluster's own verdicts stand.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from blis_sim.calibrate.hitrate import HitRateEntry, compare_definitions
from blis_sim.calibrate.pairing import SimIndex, prepare_pairs
from blis_sim.calibrate.stats import compute_calibration
from blis_sim.calibrate.table import SimTable
from blis_sim.formats.report import (
    HitRateDefinitionComparison,
    MetricComparison,
    ReplicaCalibration,
    RoutingAgreement,
    ToleranceVerdict,
    UnpairedHitRate,
)
from blis_sim.formats.trace_columns import TraceColumns

if TYPE_CHECKING:
    from blis_sim.calibrate.core import CalibrateOptions
    from blis_sim.formats import MetricsOutput, TraceHeader


def calibrate_replicas(header: TraceHeader, real: TraceColumns, sim: SimTable, sim_metrics: MetricsOutput | None, *,
                       options: CalibrateOptions,
                       warmup: int, rtt_us: int) -> tuple[list[ReplicaCalibration], RoutingAgreement | None,
                                                          list[str]]:
    """See the module docstring; ``([], None, [])`` for a trace of one server."""
    ext = getattr(header, "pytest_blis", None)
    cluster = getattr(ext, "cluster", None)
    if cluster is None:
        return [], None, []
    notes: list[str] = []
    instances = list(getattr(sim_metrics, "instances", None) or ())
    rid = real.array("request_id")
    replica = real.array("replica")
    found, srow = SimIndex.of(sim.request_id).lookup(rid)
    paired = np.flatnonzero(found)
    names = sim.instance_id.names
    named_code = np.asarray([bool(n) for n in names], dtype=bool)
    inst = sim.instance_id.codes[srow[paired]]
    named = named_code[inst]
    agreement = None
    if named.any():
        wanted = {f"instance_{r}" for r in np.unique(replica[paired][named]).tolist()}
        code_of = {n: k for k, n in enumerate(names) if n in wanted}
        expected = np.asarray([code_of.get(f"instance_{r}", -1) for r in replica[paired][named].tolist()],
                              dtype=np.int64)
        agreed = int((inst[named] == expected).sum())
        requests = int(named.sum())
        agreement = RoutingAgreement(requests=requests, agreed=agreed, share=agreed / requests)
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
        mine = np.flatnonzero(replica == k)
        metrics: dict[str, MetricComparison] = {}
        tolerance = None
        matched = 0
        if mine.size:
            theirs = np.flatnonzero(np.isin(sim.request_id, rid[mine]))
            pairs = prepare_pairs(real.take(mine), sim.take(theirs),
                                  warmup_requests=warmup, honour_warmup_column=options.warmup_requests != 0,
                                  network_rtt_us=rtt_us, bandwidth_mbps=options.network_bandwidth_mbps)
            matched = pairs.matched
            if pairs.ttft.real.size:
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
