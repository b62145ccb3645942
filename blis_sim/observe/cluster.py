"""Observing a cluster: several replicas, the client routing each request (docs/cluster.md §3).

API::

    result = observe_cluster(["http://a:8000", "http://b:8000"], spec, options,
                             routing=RoutingSpec.parse("prefix-affinity"))
    write_result(result, "trace.yaml", "trace.csv")   # blis_sim.observe.run's writer

The run is observe's own (:class:`blis_sim.observe.run._Run`: prompts calibrated on the first
replica, phases, the counter window), with three differences: each request goes to the replica
:class:`blis_sim.routing.Router` chooses (its prefix key is the planned request's prefix group,
else its session, else its dispatch index, as a replay's), over that replica's own keep-alive pool;
every replica's ``/metrics`` is scraped at both ends of the window, together; and the header
records each replica's geometry, version, window hit-rates, transfers and faults in
``pytest_blis.cluster``, the cluster's sums at the usual places. The trace's ``replica`` column
names each row's replica.
"""
from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from blis_sim import __version__
from blis_sim.errors import UsageError
from blis_sim.formats.hitrate import KVHitRate
from blis_sim.formats.trace_header import ClusterInfo, KVGeometry, ReplicaInfo, ScrapeInfo, TierIO
from blis_sim.formats.workload import WorkloadSpec
from blis_sim.observe import loop as event_loop
from blis_sim.observe.client import Target
from blis_sim.observe.dispatch import Sender
from blis_sim.observe.faults import window_faults
from blis_sim.observe.http1 import Http1Pool
from blis_sim.observe.metrics import KvWindow
from blis_sim.observe.run import ObserveOptions, ObserveResult, _jobs, _Run, execute_with_signals
from blis_sim.observe.scrape import CounterWindow, Scraper
from blis_sim.routing import Router, RoutingSpec, prefix_key
from blis_sim.workload.generate import generate_workload
from blis_sim.workload.plan import PlannedRequest, WorkloadPlan


def sum_windows(results: Sequence[KvWindow | None]) -> KvWindow | None:
    """The cluster's window: hits and queries summed per definition and tier, the primary
    observation's block counts summed, transfers summed, faults listed; None if any replica's is."""
    if not results or any(r is None for r in results):
        return None
    windows = [r for r in results if r is not None]
    out = KvWindow()
    for k, w in enumerate(windows):
        if w.miss_reason and not out.miss_reason:
            out.miss_reason = f"replica {k}: {w.miss_reason}"
        out.notes.extend(f"replica {k}: {n}" for n in w.notes)
        out.faults.extend(w.faults)
    if not all(w.valid for w in windows):
        return out
    rates: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    order: list[tuple[Any, Any, Any]] = []
    for w in windows:
        for e in w.hit_rates:
            key = (e["definition"], e["tier"], e["unit"])
            if key not in rates:
                rates[key] = {**e, "hits": 0, "queries": 0}
                order.append(key)
            rates[key]["hits"] += e["hits"]
            rates[key]["queries"] += e["queries"]
    for key in order:
        e = rates[key]
        e["hit_rate"] = e["hits"] / e["queries"] if e["queries"] else 0.0
        out.hit_rates.append(e)
    observed = [w.observed for w in windows]
    if all(o is not None for o in observed) and len({o["source"] for o in observed}) == 1:  # type: ignore[index]
        first = dict(observed[0])  # type: ignore[arg-type]
        for name in ("block_hits", "block_queries", "read_time_total", "write_time_total"):
            if name in first:
                first[name] = sum(o.get(name, 0) for o in observed)  # type: ignore[union-attr]
        first["hit_rate"] = first["block_hits"] / first["block_queries"] if first["block_queries"] else 0.0
        out.observed = first
    elif not out.miss_reason:
        out.miss_reason = "the replicas' observed KV hit-rates have different sources"
    for w in windows:
        for tier, d in w.tier_io.items():
            acc = out.tier_io.setdefault(tier, {})
            for name, v in d.items():
                if v is None:
                    acc.setdefault(name, None)
                elif acc.get(name) is None and name in acc:
                    continue
                else:
                    acc[name] = acc.get(name, 0) + v
    return out


class ClusterWindow:
    """Every replica's :class:`CounterWindow`, opened and closed together (the settle delays run at once)."""

    def __init__(self, windows: list[CounterWindow]) -> None:
        self.windows = windows

    @property
    def opened(self) -> bool:
        return any(w.opened for w in self.windows)

    async def open(self) -> None:
        await asyncio.gather(*(w.open() for w in self.windows))

    async def close(self) -> None:
        await asyncio.gather(*(w.close() for w in self.windows))

    @property
    def result(self) -> KvWindow | None:
        return sum_windows([w.result for w in self.windows])

    @property
    def info(self) -> ScrapeInfo | None:
        return self.windows[0].info

    @property
    def geometry(self) -> dict[str, int] | None:
        return self.windows[0].geometry


class _Routes:
    """The dispatcher's route: a router over the replicas' pools and targets."""

    def __init__(self, router: Router, senders: list[Sender], targets: list[Target]) -> None:
        self.router, self.senders, self.targets = router, senders, targets

    def choose(self, planned: PlannedRequest, rid: int) -> tuple[Sender, Target, int]:
        key = prefix_key(planned.prefix_group, planned.session_id, rid)
        r = self.router.choose(key)
        self.router.sent(r, key)
        return self.senders[r], self.targets[r], r

    def done(self, replica: int) -> None:
        self.router.done(replica)


class _ViaRouter:
    """The dispatcher's route in router mode: every request to the router, which names the replica."""

    def __init__(self, sender: Sender, target: Target) -> None:
        self.sender, self.target = sender, target

    def choose(self, planned: PlannedRequest, rid: int) -> tuple[Sender, Target, int]:
        return self.sender, self.target, -1

    def done(self, replica: int) -> None:
        pass


def replica_index(name: str, urls: Sequence[str]) -> int:
    """Which of ``urls`` a router's header value names: the URL itself, its ``host:port``, or its
    0-based index; -1 when none does."""
    from urllib.parse import urlsplit

    name = name.strip().rstrip("/")
    for k, u in enumerate(urls):
        if name in (u, urlsplit(u).netloc, str(k)):
            return k
    return -1


class _ClusterRun(_Run):
    def __init__(self, urls: list[str], plan: WorkloadPlan, opts: ObserveOptions, routing: RoutingSpec,
                 router_url: str = "", replica_header: str = "") -> None:
        super().__init__(router_url or urls[0], plan, opts)
        self.urls = urls
        self.routing = routing
        self.router_url, self.replica_header = router_url, replica_header
        if router_url:
            self.target = dataclasses.replace(self.target, replica_header=replica_header)
        self.targets = [Target(u, opts.model, opts.api_format, opts.api_key, opts.timeout_s, opts.record_itl)
                        for u in urls]
        self.pools: list[Http1Pool | None] = []
        self.replica_windows: list[CounterWindow] = []
        self.replica_geometry: list[dict[str, int] | None] = [None] * len(urls)
        self.versions = [""] * len(urls)

    async def _execute(self) -> ObserveResult:
        if self.router_url:
            self.pools = [self.pool]
            self.route = _ViaRouter(self.pool if self.pool is not None else self.http, self.target)
            return await super()._execute()
        headers = {"User-Agent": f"blis-observe/{__version__}"}
        self.pools = [self.pool] + [
            Http1Pool(u, headers=headers) if self.opts.http_client == "lean" and Http1Pool.supports(u) else None
            for u in self.urls[1:]]
        try:
            senders = [p if p is not None else self.http for p in self.pools]
            self.route = _Routes(Router(self.routing, len(self.urls)), senders, self.targets)
            return await super()._execute()
        finally:
            for p in self.pools[1:]:
                if p is not None:
                    await p.close()

    async def _version(self) -> str:
        base = self.base_url
        for k, u in enumerate(self.urls):
            self.base_url = u
            self.versions[k] = await super()._version()
        self.base_url = base
        return self.versions[0]

    async def _open_connections(self, n: int) -> None:
        # observe's _execute calls this after it made the first replica's window: every replica's
        # window (or geometry) is made here, before anything is sent
        if self.opts.scrape_kv_metrics:
            windows = []
            for k in range(len(self.urls)):
                scraper = Scraper(self.http, self._metrics_url(k), api_key=self.opts.api_key,
                                  timeout_s=self.opts.timeout_s)
                windows.append(CounterWindow(scraper, self.clock, settle_s=self.opts.settle_s,
                                             vllm_commit=self.opts.vllm_commit, model=self.opts.model,
                                             warn=self._replica_warn(k), sleep=self._sleep))
            self.replica_windows = windows
            self.window = ClusterWindow(windows)  # type: ignore[assignment]
        else:
            for k in range(len(self.urls)):
                self.replica_geometry[k] = await Scraper(
                    self.http, self._metrics_url(k), api_key=self.opts.api_key,
                    timeout_s=self.opts.timeout_s).geometry()
        per = max(1, n // len(self.urls))
        for p in self.pools:
            if p is not None:
                await p.open(per)

    def _replica_warn(self, k: int) -> Callable[[str], None]:
        return lambda message: self.warn(f"replica {k}: {message}")

    def _metrics_url(self, k: int) -> str:
        return self.urls[k] + "/metrics"

    def _result(self, wall_s: float) -> ObserveResult:
        names: dict[int, str] = {}
        if self.router_url:  # the router's header says where each request went
            unnamed = 0
            for rec in self.completed:
                rec.replica = replica_index(rec.replica_name, self.urls)
                if rec.replica >= 0:
                    names.setdefault(rec.replica, rec.replica_name)
                elif rec.planned is not None:
                    unnamed += 1
            if unnamed:
                self.warn(f"{unnamed} response(s) named no replica of --server-url in their {self.replica_header!r} "
                          "header (the URL, its host:port or its index): their replica column is -1, and a replay "
                          "with the recorded routing refuses them")
        result = super()._result(wall_s)
        rows = result.trace.records
        replicas = []
        for k, u in enumerate(self.urls):
            w = self.replica_windows[k].result if self.replica_windows else None
            geom = self.replica_windows[k].geometry if self.replica_windows else self.replica_geometry[k]
            valid = w is not None and w.valid
            if w is None or not valid:
                w = KvWindow()  # no window (a scrape missed, or a reset): nothing of it is recorded
            mine = [r for r in rows if r.replica == k]
            replicas.append(ReplicaInfo(
                index=k, name=names.get(k, ""), server_url=u, vllm_version=self.versions[k],
                kv_geometry=KVGeometry(**geom) if geom else None,
                source=(w.observed or {}).get("source", "") if valid else "",
                requests=len(mine),
                kv_hit_rates=[KVHitRate(**e) for e in w.hit_rates] if valid else [],
                tier_io=[TierIO(tier=t, read_bytes=int(d.get("read_bytes", 0)),
                                write_bytes=int(d.get("write_bytes", 0)),
                                read_time_s=d.get("read_time_s", 0.0), write_time_s=d.get("write_time_s", 0.0),
                                read_jobs=_jobs(d.get("read_jobs")), write_jobs=_jobs(d.get("write_jobs")))
                         for t, d in sorted(w.tier_io.items())] if valid else [],
                scrape=self.replica_windows[k].info if self.replica_windows else None,
                faults=window_faults(w.faults if valid else [], mine, (geom or {}).get("block_size", 1))))
        cluster = ClusterInfo(num_instances=len(self.urls),
                              routing_policy="router" if self.router_url else self.routing.policy,
                              routing_scorers="" if self.router_url else self.routing.text(),
                              router_url=self.router_url, replica_header=self.replica_header, replicas=replicas)
        header = result.trace.header
        assert header.pytest_blis is not None  # observe always writes its block
        ext = header.pytest_blis.model_copy(update={"cluster": cluster})
        result.trace = result.trace.model_copy(update={"header": header.model_copy(update={"pytest_blis": ext})})
        return result


def observe_cluster(urls: Sequence[str], spec: WorkloadSpec | WorkloadPlan, options: ObserveOptions, *,
                    routing: RoutingSpec, router_url: str = "", replica_header: str = "") -> ObserveResult:
    """Observe ``urls`` (one per replica) behind the client-side ``routing``, or behind ``router_url``
    whose responses name the replica in ``replica_header``; see the module docstring."""
    return event_loop.run(observe_cluster_async(urls, spec, options, routing=routing, router_url=router_url,
                                                replica_header=replica_header))


async def observe_cluster_async(urls: Sequence[str], spec: WorkloadSpec | WorkloadPlan, options: ObserveOptions,
                                *, routing: RoutingSpec, router_url: str = "",
                                replica_header: str = "") -> ObserveResult:
    options.validate()
    if bool(router_url) != bool(replica_header):
        raise UsageError("--router-url and --replica-header go together: the router's URL, and the response "
                         "header in which it names the replica that served")
    if routing.policy == "recorded" and not router_url:
        raise UsageError("--routing-policy recorded is the replay's; observe needs a policy that routes "
                         "(round-robin, least-loaded, prefix-affinity, weighted, always-busiest)")
    if options.prewarm_duration_s > 0:
        raise UsageError("--prewarm-duration is not supported with several --server-url (docs/cluster.md §3)")
    if options.kv_metrics_url:
        raise UsageError("--kv-metrics-url names one server; with several --server-url each replica's "
                         "/metrics is scraped at <server-url>/metrics")
    urls = [u.rstrip("/") for u in urls]
    if len(set(urls)) != len(urls):
        raise UsageError(f"--server-url names a replica twice: {urls}")
    plan = spec if isinstance(spec, WorkloadPlan) else generate_workload(
        spec, seed=options.seed, num_requests=options.num_requests, horizon=options.horizon_us)
    run = _ClusterRun(urls, plan, replace(options), routing, router_url.rstrip("/"), replica_header)
    return await execute_with_signals(run, options.handle_signals)
