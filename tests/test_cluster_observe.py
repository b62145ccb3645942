"""Observing a cluster of two emulators with client-side routing (docs/cluster.md §3), then replaying it."""
from __future__ import annotations

from typing import Any

import pytest

from blis_sim.emulator import EmulatorConfig, start_emulator
from blis_sim.engine.cluster import replay_cluster
from blis_sim.engine.simulate import EngineOptions
from blis_sim.errors import UsageError
from blis_sim.formats.workload import parse_workload_spec
from blis_sim.observe.cluster import observe_cluster, sum_windows
from blis_sim.observe.metrics import KvWindow
from blis_sim.observe.run import ObserveOptions
from blis_sim.routing import RoutingSpec

CLIENTS = "\n".join(
    f"  - {{id: c{i}, rate_fraction: 0.125, streaming: true, prefix_group: p{i}, prefix_length: 512, "
    "arrival: {process: poisson}, input_distribution: {type: constant, params: {value: 32}}, "
    "output_distribution: {type: constant, params: {value: 2}}}" for i in range(8))
SPEC = f'version: "2"\nseed: 5\naggregate_rate: 40\nnum_requests: 48\nclients:\n{CLIENTS}\n'
OPTS = ObserveOptions(model="tiny-llama", max_concurrency=1, scrape_kv_metrics=True, settle_s=0.1,
                      progress=False, timeout_s=5.0)


def _observe(policy: str, **kw: Any) -> Any:
    cfg = EmulatorConfig(block_size=16, num_gpu_blocks=150, enable_prompt_tokens_details=True)
    with start_emulator(cfg) as a, start_emulator(cfg) as b:
        return observe_cluster([a.url, b.url], parse_workload_spec(SPEC), OPTS,
                               routing=RoutingSpec.parse(policy, **kw))


@pytest.fixture(scope="module")
def observed() -> dict[str, Any]:
    return {p: _observe(p) for p in ("round-robin", "prefix-affinity")}


def _rate(entries: Any, definition: str = "prefix_cache") -> float:
    return next(e.hit_rate for e in entries if e.definition == definition and e.tier is None)


def test_each_replica_is_scraped_and_recorded(observed: dict[str, Any]) -> None:
    for policy, result in observed.items():
        cluster = result.trace.header.pytest_blis.cluster
        assert cluster.routing_policy == policy and cluster.num_instances == 2
        rows = result.trace.records
        assert {r.replica for r in rows} == {0, 1}
        for k, rep in enumerate(cluster.replicas):
            assert rep.requests == sum(r.replica == k for r in rows) > 0
            assert rep.kv_geometry.num_gpu_blocks == 150 and rep.source == "gpu-prefix-cache-fallback"
            assert rep.scrape is not None and rep.scrape.metrics_url == rep.server_url + "/metrics"
        hits = sum(e.hits for rep in cluster.replicas for e in rep.kv_hit_rates if e.definition == "prefix_cache")
        total = next(e for e in result.trace.header.pytest_blis.kv_hit_rates if e.definition == "prefix_cache")
        assert total.hits == hits
    pa = observed["prefix-affinity"].trace.records
    owner: dict[str, set[int]] = {}
    for r in pa:
        owner.setdefault(r.prefix_group, set()).add(r.replica)
    assert all(len(v) == 1 for v in owner.values())
    rr = sorted(observed["round-robin"].trace.records, key=lambda r: r.request_id)
    assert [r.replica for r in rr] == [i % 2 for i in range(len(rr))]


def test_recorded_routing_reproduces_every_replica(observed: dict[str, Any]) -> None:
    """The done-when target: per-replica hit-rates within 1 pp (0.00 pp expected)."""
    opts = EngineOptions(model="tiny-llama", sequential=True)
    for result in observed.values():
        out = replay_cluster(result.trace, opts)
        for rep, part in zip(result.trace.header.pytest_blis.cluster.replicas, out.parts):
            sim = next(e["hit_rate"] for e in part.hit_rates if e["definition"] == "prefix_cache")
            assert abs(sim - _rate(rep.kv_hit_rates)) < 1e-9


def test_rerouting_round_robin_predicts_prefix_affinity(observed: dict[str, Any]) -> None:
    opts = EngineOptions(model="tiny-llama", sequential=True)
    out = replay_cluster(observed["round-robin"].trace, opts, routing=RoutingSpec("prefix-affinity"))
    predicted = next(e["hit_rate"] for e in out.outcome.hit_rates if e["definition"] == "prefix_cache")
    measured = _rate(observed["prefix-affinity"].trace.header.pytest_blis.kv_hit_rates)
    rr = _rate(observed["round-robin"].trace.header.pytest_blis.kv_hit_rates)
    assert measured > rr + 0.15
    assert abs(predicted - measured) <= 0.05
    assert out.agreement is not None and out.agreement < 1.0


def test_flags_refused_before_anything_is_sent() -> None:
    with pytest.raises(UsageError, match="recorded"):
        observe_cluster(["http://127.0.0.1:9", "http://127.0.0.1:10"], parse_workload_spec(SPEC), OPTS,
                        routing=RoutingSpec("recorded"))
    with pytest.raises(UsageError, match="twice"):
        observe_cluster(["http://127.0.0.1:9", "http://127.0.0.1:9/"], parse_workload_spec(SPEC), OPTS,
                        routing=RoutingSpec("round-robin"))


def test_a_replica_without_a_window_leaves_the_cluster_without_one() -> None:
    ok = KvWindow(observed={"source": "tiered", "hit_rate": 0.5, "block_hits": 1, "block_queries": 2},
                  hit_rates=[{"definition": "prefix_cache", "tier": None, "unit": "tokens", "hits": 1,
                              "queries": 2, "hit_rate": 0.5, "metric": "m"}])
    assert sum_windows([ok, None]) is None
    both = sum_windows([ok, ok])
    assert both is not None and both.observed["block_queries"] == 4 and both.hit_rates[0]["hits"] == 2


def test_calibrate_judges_each_replica_of_a_recorded_replay(observed: dict[str, Any]) -> None:
    from blis_sim.calibrate.core import CalibrateOptions, calibrate

    opts = EngineOptions(model="tiny-llama", sequential=True)
    trace = observed["prefix-affinity"].trace
    out = replay_cluster(trace, opts)
    report = calibrate(trace, out.result_columns(), out.metrics(), options=CalibrateOptions(ttft_mape_threshold=100.0))
    assert report.routing_agreement is not None and report.routing_agreement.share == 1.0
    assert [r.replica for r in report.replicas] == [0, 1] and all(r.judged for r in report.replicas)
    rows = {row.metric: row for row in report.verdicts()}
    for k in range(2):
        row = rows[f"replica[{k}].kv_hit_rate[prefix_cache]"]
        assert row.within and row.error == 0.0
        assert f"replica[{k}].ttft_mape" in rows
    assert report.passed
    rerouted = replay_cluster(trace, opts, routing=RoutingSpec("round-robin"))
    again = calibrate(trace, rerouted.result_columns(), rerouted.metrics(),
                      options=CalibrateOptions(ttft_mape_threshold=100.0))
    assert again.routing_agreement.share < 1.0 and not any(r.judged for r in again.replicas)
    assert not any(row.metric.startswith("replica[") for row in again.verdicts())
    assert any("re-routed" in n for n in again.notes)


class _Router:
    """A real HTTP router in front of two replicas (aiohttp, 127.0.0.1, port 0): generation requests go to
    the replica its prefix-group-blind turn picks, streamed back with an ``x-served-by: host:port`` header;
    anything else goes to the first replica."""

    def __init__(self, replicas: list[str]) -> None:
        import asyncio
        import threading

        self.replicas = replicas
        self.loop = asyncio.new_event_loop()
        self.turn = 0
        started = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(started,), daemon=True)
        self.thread.start()
        started.wait(10)

    def _main(self, started: Any) -> None:
        import aiohttp
        from aiohttp import web

        async def forward(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            target = self.replicas[0]
            if request.path.endswith("/completions"):
                target = self.replicas[self.turn % len(self.replicas)]
                self.turn += 1
            async with self.session.request(request.method, target + request.path_qs, data=body,
                                            headers={"Content-Type": "application/json"}) as up:
                resp = web.StreamResponse(status=up.status, headers={
                    "Content-Type": up.headers.get("Content-Type", "application/json"),
                    "x-served-by": target.split("//", 1)[1]})
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp

        async def start() -> None:
            self.session = aiohttp.ClientSession()
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", forward)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

        self.loop.run_until_complete(start())
        started.set()
        self.loop.run_forever()

    def stop(self) -> None:
        import asyncio

        async def close() -> None:
            await self.session.close()
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_a_router_that_names_the_replica_in_a_header() -> None:
    cfg = EmulatorConfig(block_size=16, num_gpu_blocks=150, enable_prompt_tokens_details=True)
    with start_emulator(cfg) as a, start_emulator(cfg) as b:
        router = _Router([a.url, b.url])
        try:
            result = observe_cluster([a.url, b.url], parse_workload_spec(SPEC), OPTS,
                                     routing=RoutingSpec("round-robin"), router_url=router.url,
                                     replica_header="X-Served-By")
        finally:
            router.stop()
    cluster = result.trace.header.pytest_blis.cluster
    assert cluster.routing_policy == "router" and cluster.router_url == router.url
    assert cluster.replica_header == "X-Served-By"
    rows = sorted(result.trace.records, key=lambda r: r.request_id)
    assert [r.replica for r in rows] == [i % 2 for i in range(len(rows))]  # the router's turns, as it said
    assert [rep.name for rep in cluster.replicas] == [a.url.split("//")[1], b.url.split("//")[1]]
    out = replay_cluster(result.trace, EngineOptions(model="tiny-llama", sequential=True))
    for rep, part in zip(cluster.replicas, out.parts):
        sim = next(e["hit_rate"] for e in part.hit_rates if e["definition"] == "prefix_cache")
        assert abs(sim - _rate(rep.kv_hit_rates)) < 1e-9
    with pytest.raises(UsageError, match="go together"):
        observe_cluster([a.url], parse_workload_spec(SPEC), OPTS, routing=RoutingSpec("round-robin"),
                        router_url="http://127.0.0.1:9")


def test_a_header_names_a_replica_by_url_host_port_or_index() -> None:
    from blis_sim.observe.cluster import replica_index

    urls = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert [replica_index(n, urls) for n in ("http://10.0.0.2:8000/", "10.0.0.1:8000", "1", " 0 ", "x", "")] == \
        [1, 0, 1, 0, -1, -1]
