"""`observe()` and `blis observe` end to end against a small vLLM-like aiohttp server on 127.0.0.1.

The server (in a thread, port 0) has a word tokenizer (one token per 3 letters of a word, plus BOS), a
GPU prefix cache of 4-token blocks with vLLM's counting rules (hits = cached full blocks, capped at
n − 1; counted at admission), ``/tokenize``, ``/version`` and ``/metrics`` in vLLM's exposition, so
hit-rates can be computed by hand.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from blis_sim.cli import main as blis_main
from blis_sim.formats.trace import load_trace
from blis_sim.formats.workload import parse_workload_spec
from blis_sim.observe.capture import percentile as capture_percentile
from blis_sim.observe.run import ObserveOptions, observe, write_result

BLOCK = 4


@dataclass
class FakeVllm:
    version: str | None = "0.32.0"
    tokenize: bool = True
    metrics_status: int = 200
    metrics_body: str | None = None  # fixed body instead of the counters
    metrics_delay_s: float = 0.0  # /metrics answers this late
    reset_after: int = -1  # after this many requests the counters restart from zero (a server restart)
    delay_s: float = 0.0  # before the first token of every request
    api_key: str = ""  # when set, every route answers 401 without "Authorization: Bearer <key>"
    unauthorized: list[str] = field(default_factory=list)
    closing: bool = False
    early_stop: bool = False  # one token, finish_reason "stop", whatever min_tokens says
    queries: int = 0
    hits: int = 0
    created: float = 1795972159.0
    cached: set[tuple[str, ...]] = field(default_factory=set)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def tokens(self, text: str) -> list[str]:
        out = ["<s>"]
        for word in text.split():
            out.extend(word[i:i + 3] for i in range(0, len(word), 3))
        return out

    def admit(self, toks: list[str]) -> int:
        """vLLM's prefix-cache accounting for one admitted request; returns its cached tokens."""
        hit_blocks = 0
        for b in range(1, (len(toks) - 1) // BLOCK + 1):  # the last token is always recomputed
            if tuple(toks[:b * BLOCK]) in self.cached:
                hit_blocks = b
            else:
                break
        for b in range(1, len(toks) // BLOCK + 1):
            self.cached.add(tuple(toks[:b * BLOCK]))
        self.queries += len(toks)
        self.hits += hit_blocks * BLOCK
        if len(self.requests) == self.reset_after:
            self.queries = self.hits = 0
            self.created += 100.0
        return hit_blocks * BLOCK

    def exposition(self) -> str:
        if self.metrics_body is not None:
            return self.metrics_body
        lab = 'engine="0",model_name="m"'
        lines = []
        for name, value in (("prefix_cache_queries", self.queries), ("prefix_cache_hits", self.hits)):
            lines += [f"# HELP vllm:{name}_total x", f"# TYPE vllm:{name}_total counter",
                      f"vllm:{name}_total{{{lab}}} {float(value)}",
                      f"# TYPE vllm:{name}_created gauge", f"vllm:{name}_created{{{lab}}} {self.created}"]
        lines.append(f'vllm:cache_config_info{{block_size="{BLOCK}",{lab},num_gpu_blocks="100"}} 1.0')
        return "\n".join(lines) + "\n"

    def app(self) -> web.Application:
        @web.middleware
        async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
            if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
                self.unauthorized.append(request.path)
                return web.Response(status=401, text="unauthorized")
            return await handler(request)

        app = web.Application(middlewares=[auth])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        toks = self.tokens(body["prompt"])
        cached = self.admit(toks)
        n_out = 1 if self.early_stop else body.get("max_tokens", 16)
        usage = {"prompt_tokens": len(toks), "completion_tokens": n_out,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": "x" * n_out, "finish_reason": "length"}], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        until = time.monotonic() + self.delay_s
        while time.monotonic() < until and not self.closing:  # short steps: teardown must not wait
            await asyncio.sleep(0.02)
        for i in range(n_out):
            finish = ("stop" if self.early_stop else "length") if i == n_out - 1 else None
            chunk = {"choices": [{"index": 0, "text": " tok", "finish_reason": finish}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """Chat that sends its role-only chunk 50 ms before the first token (as older servers did)."""
        body = await request.json()
        self.requests.append(body)
        toks = self.tokens(body["messages"][0]["content"])
        self.admit(toks)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n')
        await asyncio.sleep(0.05)
        await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":" x"},"finish_reason":"length"}]}\n\n')
        usage = {"prompt_tokens": len(toks), "completion_tokens": 1}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    async def _tokenize(self, request: web.Request) -> web.Response:
        if not self.tokenize:
            return web.Response(status=404)
        body = await request.json()
        return web.json_response({"count": len(self.tokens(body["prompt"])), "max_model_len": 8192})

    async def _version(self, request: web.Request) -> web.Response:
        if self.version is None:
            return web.Response(status=404)
        return web.json_response({"version": self.version})

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics_delay_s:
            await asyncio.sleep(self.metrics_delay_s)
        return web.Response(status=self.metrics_status, text=self.exposition())


@pytest.fixture
def fake() -> Iterator[tuple[FakeVllm, str]]:
    """The fake server in its own thread and loop (so sync `observe()` and the CLI can call it)."""
    server = FakeVllm()
    ready = threading.Event()
    state: dict[str, Any] = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(server.app(), shutdown_timeout=0.1)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        state["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        state["loop"], state["stop"] = loop, asyncio.Event()
        ready.set()
        loop.run_until_complete(state["stop"].wait())
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield server, f"http://127.0.0.1:{state['port']}"
    server.closing = True
    state["loop"].call_soon_threadsafe(state["stop"].set)
    thread.join(10)


SPEC = """
version: "2"
seed: 7
aggregate_rate: 200
num_requests: 4
clients:
  - id: g
    rate_fraction: 1
    streaming: true
    prefix_group: sys
    prefix_length: 16
    arrival: {process: constant}
    input_distribution: {type: constant, params: {value: 6}}
    output_distribution: {type: constant, params: {value: 3}}
"""


def _opts(**kw: Any) -> ObserveOptions:
    base: dict[str, Any] = dict(model="m", max_concurrency=1, scrape_kv_metrics=True, settle_s=0.0, progress=False)
    base.update(kw)
    return ObserveOptions(**base)


def test_prefix_group_hit_rate_by_hand(fake: tuple[FakeVllm, str]) -> None:
    server, url = fake
    result = observe(url, parse_workload_spec(SPEC), _opts(warmup_requests=1, vllm_commit="abc123"))
    rows = sorted(result.trace.records, key=lambda r: r.request_id)
    assert [r.status for r in rows] == ["ok"] * 4
    # Exact prompt lengths through /tokenize: 16 prefix + 6 suffix tokens on the server, BOS included.
    assert [r.server_input_tokens for r in rows] == [22] * 4
    assert [(r.prefix_length, r.input_tokens) for r in rows] == [(16, 6)] * 4
    # The first request misses; the next three hit the 16-token prefix (4 full blocks).
    assert [r.cached_tokens for r in rows] == [0, 16, 16, 16]
    h = result.trace.header
    assert h.observed_kv_metrics is not None
    assert h.observed_kv_metrics.source == "gpu-prefix-cache-fallback"
    assert (h.observed_kv_metrics.block_hits, h.observed_kv_metrics.block_queries) == (48, 88)
    assert h.observed_kv_metrics.hit_rate == pytest.approx(48 / 88)
    assert h.observed_kv_metrics.vllm_commit == "abc123"
    extra = h.pytest_blis
    assert extra is not None
    assert [(e.definition, e.hits, e.queries, e.metric) for e in extra.kv_hit_rates] == [
        ("prefix_cache", 48, 88, "vllm:prefix_cache_hits_total")]
    assert extra.kv_geometry is not None and (extra.kv_geometry.block_size, extra.kv_geometry.num_gpu_blocks) == (4, 100)
    assert extra.vllm_version == "0.32.0" and not extra.partial
    assert [r.warmup for r in rows] == [True, False, False, False]
    assert h.warm_up_requests == 1 and h.mode == "real" and h.workload_seed == 7
    assert all(r.send_time_us <= r.first_byte_time_us <= r.first_chunk_time_us <= r.last_chunk_time_us
               for r in rows)
    assert all(r.first_content_time_us == r.first_chunk_time_us for r in rows)
    assert [r.arrival_time_us for r in rows] == [5000, 10000, 15000, 20000]  # 200 req/s, constant
    # Lateness can be recomputed from the files: the arrival origin is the first phase's start.
    origin = extra.phases[0].start_time_us
    from_files = [(r.send_time_us - origin - r.arrival_time_us) / 1000 for r in rows]
    by_id = {rec.request_id: rec for rec in result.records}
    assert all(late >= 0 for late in from_files)
    assert from_files == pytest.approx([(by_id[r.request_id].send_ns - by_id[r.request_id].scheduled_ns) / 1e6
                                        for r in rows], abs=0.002)
    assert result.prompt_mode.startswith("exact")
    assert not result.warnings


def test_ratio_mode_without_tokenize_records_drift(fake: tuple[FakeVllm, str]) -> None:
    server, url = fake
    server.tokenize = False
    result = observe(url, parse_workload_spec(SPEC), _opts())
    assert not result.prompt_mode.startswith("exact")
    rows = result.trace.records
    assert all(r.status == "ok" and r.server_input_tokens > 0 for r in rows)
    # Words of the reference vocabulary cost 1-3 tokens here: the drift is recorded and warned about.
    assert any("prompt lengths on the server differ" in w for w in result.warnings)


@pytest.mark.parametrize("setup,reason", [
    (lambda s: setattr(s, "metrics_status", 503), "HTTP 503"),
    (lambda s: setattr(s, "metrics_body", "<html>nope</html>"), "not Prometheus text"),
    (lambda s: setattr(s, "metrics_body", "# nothing\nhttp_requests_total 3\n"), "no recognized KV cache counters"),
    (lambda s: setattr(s, "reset_after", 3), "counter reset"),
])
def test_scrape_misses_warn_and_still_write_the_trace(fake: tuple[FakeVllm, str], tmp_path: Path, setup: Any,
                                                      reason: str) -> None:
    server, url = fake
    setup(server)
    result = observe(url, parse_workload_spec(SPEC), _opts())
    assert result.trace.header.observed_kv_metrics is None
    assert any(reason in w for w in result.warnings), result.warnings
    assert len(result.trace.records) == 4
    write_result(result, tmp_path / "t.yaml", tmp_path / "t.csv")
    back = load_trace(tmp_path / "t.yaml", tmp_path / "t.csv")
    assert back.header.observed_kv_metrics is None and len(back.records) == 4
    assert back.header.pytest_blis is not None and back.header.pytest_blis.kv_hit_rates == []


def test_zero_queries_is_a_miss(fake: tuple[FakeVllm, str]) -> None:
    server, url = fake
    server.metrics_body = ('vllm:prefix_cache_queries_total{engine="0"} 5.0\n'
                           'vllm:prefix_cache_hits_total{engine="0"} 1.0\n')
    result = observe(url, parse_workload_spec(SPEC), _opts())
    assert result.trace.header.observed_kv_metrics is None
    assert any("zero queries" in w for w in result.warnings)


PHASES = """
version: "2"
seed: 3
aggregate_rate: 500
phases:
  - name: seed
    num_requests: 2
    clients:
      - {id: a, rate_fraction: 1, streaming: true, prefix_group: p, prefix_length: 8, arrival: {process: constant},
         input_distribution: {type: constant, params: {value: 4}}, output_distribution: {type: constant, params: {value: 2}}}
  - name: repeat
    repeat: seed
    gap_us: 1000
"""


def test_phases_run_in_order_and_the_window_brackets_the_chosen_ones(fake: tuple[FakeVllm, str]) -> None:
    server, url = fake
    result = observe(url, parse_workload_spec(PHASES), _opts(window_phases=("repeat",)))
    rows = sorted(result.trace.records, key=lambda r: r.request_id)
    assert [r.phase for r in rows] == ["seed", "seed", "repeat", "repeat"]
    last_seed = max(r.last_chunk_time_us for r in rows if r.phase == "seed")
    assert all(r.send_time_us >= last_seed for r in rows if r.phase == "repeat")  # drained first
    assert all(r.arrival_time_us >= 1000 for r in rows if r.phase == "repeat")
    # Only the repeat phase is in the window: both requests hit the 8-token prefix (2 blocks) of 12.
    o = result.trace.header.observed_kv_metrics
    assert o is not None and (o.block_hits, o.block_queries) == (16, 24)
    phases = result.trace.header.pytest_blis.phases  # type: ignore[union-attr]
    assert [(p.name, p.measured, p.requests) for p in phases] == [("seed", False, 2), ("repeat", True, 2)]


def test_cli_writes_a_blis_readable_trace(fake: tuple[FakeVllm, str], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    _server, url = fake
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    code = blis_main(["observe", "--server-url", url, "--model", "m", "--workload-spec", str(spec),
                      "--trace-header", str(tmp_path / "t.yaml"), "--trace-data", str(tmp_path / "t.csv"),
                      "--scrape-kv-metrics", "--settle", "0", "--vllm-commit", "deadbeef", "--blis-compatible",
                      "--record-itl", "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("=== Simulation Metrics ===")
    header = yaml.safe_load((tmp_path / "t.yaml").read_text())
    assert "pytest_blis" not in header  # --blis-compatible
    assert header["observed_kv_metrics"]["vllm_commit"] == "deadbeef"
    assert header["workload_spec"] == str(spec)
    itl = (tmp_path / "t.itl.csv").read_text().splitlines()
    assert itl[0] == "request_id,chunk_index,timestamp_us" and len(itl) == 1 + 4 * 4  # 3 tokens + usage


@pytest.mark.parametrize("argv,message", [
    ([], "--server-url is required"),
    (["--server-url", "http://x", "--model", "m", "--trace-header", "h", "--trace-data", "d"],
     "Either --workload-spec, --rate, or --concurrency is required"),
    (["--server-url", "http://x", "--model", "m", "--trace-header", "h", "--trace-data", "d", "--rate", "1"],
     "requires either num_requests"),
    (["--server-url", "http://x", "--model", "m", "--trace-header", "h", "--trace-data", "d", "--rate", "1",
      "--num-requests", "1", "--api-format", "grpc"], "--api-format must be 'completions' or 'chat'"),
    (["--server-url", "http://x", "--model", "m", "--trace-header", "h", "--trace-data", "d", "--rate", "1",
      "--num-requests", "1", "--prewarm-duration", "5 parsecs"], "invalid duration"),
])
def test_cli_usage_errors_are_one_line_exit_2(argv: list[str], message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert blis_main(["observe", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_cli_unreachable_server_writes_the_trace_and_exits_3(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    code = blis_main(["observe", "--server-url", "http://127.0.0.1:9", "--model", "m", "--rate", "50",
                      "--num-requests", "3", "--prompt-tokens", "8", "--output-tokens", "2", "--timeout", "2",
                      "--trace-header", str(tmp_path / "t.yaml"), "--trace-data", str(tmp_path / "t.csv"),
                      "--scrape-kv-metrics", "--settle", "0", "--no-progress"])
    assert code == 3
    assert "no request succeeded" in capsys.readouterr().err
    trace = load_trace(tmp_path / "t.yaml", tmp_path / "t.csv")
    assert [r.status for r in trace.records] == ["error"] * 3
    assert trace.header.observed_kv_metrics is None


SESSIONS = """
version: "2"
seed: 11
aggregate_rate: 100
num_requests: 6
clients:
  - id: chat
    rate_fraction: 1
    streaming: true
    arrival: {process: constant}
    input_distribution: {type: constant, params: {value: 8}}
    output_distribution: {type: constant, params: {value: 4}}
    reasoning:
      multi_turn: {max_rounds: 3, think_time_us: 2000, context_growth: accumulate}
"""


def test_accumulating_sessions_are_released_on_completion_and_share_context(fake: tuple[FakeVllm, str]) -> None:
    server, url = fake
    result = observe(url, parse_workload_spec(SESSIONS), _opts(max_concurrency=8))
    rows = sorted(result.trace.records, key=lambda r: r.request_id)
    assert all(r.status == "ok" for r in rows)
    by_session: dict[str, list[Any]] = {}
    for r in rows:
        by_session.setdefault(r.session_id, []).append(r)
    assert len(by_session) == 2 and all(len(v) == 3 for v in by_session.values())
    for rounds in by_session.values():
        rounds.sort(key=lambda r: r.round_index)
        assert [r.round_index for r in rounds] == [0, 1, 2]
        for prev, nxt in zip(rounds, rounds[1:]):
            # Released by the completion, after the think time; exact server lengths; the whole
            # previous prompt is a cached prefix, to the block (the output a next prompt embeds is the
            # workload's synthetic one, not what the server generated).
            assert nxt.send_time_us - prev.last_chunk_time_us >= 2000
            assert nxt.server_input_tokens == prev.server_input_tokens + 4 + 8
            assert nxt.cached_tokens == prev.server_input_tokens // BLOCK * BLOCK


CLOSED = """
version: "2"
seed: 5
num_requests: 9
clients:
  - id: users
    concurrency: 3
    think_time_us: 1000
    streaming: false
    input_distribution: {type: constant, params: {value: 8}}
    output_distribution: {type: constant, params: {value: 2}}
"""


def test_closed_loop_users_never_exceed_their_concurrency(fake: tuple[FakeVllm, str]) -> None:
    _server, url = fake
    result = observe(url, parse_workload_spec(CLOSED), _opts(max_concurrency=64, scrape_kv_metrics=False))
    rows = result.trace.records
    assert len(rows) == 9 and all(r.status == "ok" and r.num_chunks == 1 for r in rows)
    events = sorted([(r.send_time_us, 1) for r in rows] + [(r.last_chunk_time_us, -1) for r in rows])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    assert peak <= 3
    geometry = result.trace.header.pytest_blis.kv_geometry  # type: ignore[union-attr]
    assert geometry is not None and geometry.block_size == 4  # recorded even without --scrape-kv-metrics


def test_sigint_writes_a_partial_trace_and_exits_130(fake: tuple[FakeVllm, str], tmp_path: Path) -> None:
    server, url = fake
    server.delay_s = 30.0  # every request is still in flight when the signal comes
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("aggregate_rate: 200", "aggregate_rate: 4"))
    header, data = tmp_path / "t.yaml", tmp_path / "t.csv"
    proc = subprocess.Popen(
        [sys.executable, "-m", "blis_sim", "observe", "--server-url", url, "--model", "m", "--workload-spec",
         str(spec), "--trace-header", str(header), "--trace-data", str(data), "--scrape-kv-metrics",
         "--settle", "0", "--grace", "0.3", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 30
        while len(server.requests) < 2 and time.monotonic() < deadline:  # two sent (0.25 s apart), both stuck
            time.sleep(0.05)
        assert len(server.requests) >= 2
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    trace = load_trace(header, data)
    extra = trace.header.pytest_blis
    assert extra is not None and extra.partial and "SIGINT" in extra.partial_reason
    assert trace.header.observed_kv_metrics is None
    assert len(trace.records) >= 2  # all sent before the signal; none of them finished
    assert all(r.status == "error" and r.error_message == "cancelled: observe interrupted" for r in trace.records)
    assert all(r.send_time_us > 0 and r.first_byte_time_us > 0 for r in trace.records)  # partial timings kept
    assert "interrupted" in err and "Traceback" not in err
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes left no temp files


def test_api_key_reaches_every_route_and_prewarm_stays_out_of_trace_and_window(fake: tuple[FakeVllm, str]) -> None:
    server, url = fake
    server.api_key = "k3y"
    result = observe(url, parse_workload_spec(SPEC), _opts(api_key="k3y", prewarm_duration_s=0.3))
    assert server.unauthorized == []
    prewarm = [b for b in server.requests if b["prompt"].startswith("warm warm")]
    assert prewarm and all(not b["stream"] and b["max_tokens"] == 64 for b in prewarm)
    assert len(result.trace.records) == 4 and result.prompt_mode.startswith("exact")
    o = result.trace.header.observed_kv_metrics
    assert o is not None and o.block_queries == 88  # the prewarm's tokens are outside the window


def test_wrong_api_key_is_recorded_per_request(fake: tuple[FakeVllm, str]) -> None:
    server, url = fake
    server.api_key = "right"
    result = observe(url, parse_workload_spec(SPEC), _opts(api_key="wrong"))
    assert all(r.status == "error" and r.error_message == "HTTP 401: unauthorized" for r in result.trace.records)
    assert any("scrape failed" in w and "HTTP 401" in w for w in result.warnings)


def test_early_role_chunk_is_flagged(fake: tuple[FakeVllm, str]) -> None:
    _server, url = fake
    result = observe(url, parse_workload_spec(SPEC), _opts(api_format="chat", use_tokenize=False))
    rows = result.trace.records
    assert all(r.status == "ok" and r.first_content_time_us >= r.first_chunk_time_us for r in rows)
    flagged = [r for r in rows if r.first_content_time_us - r.first_chunk_time_us > 1000]
    assert flagged  # the client may read both events at once when it is descheduled for 50 ms; not all of them
    assert any(w.startswith(f"{len(flagged)} streaming requests got an SSE event") for w in result.warnings)


def test_progress_line_only_when_enabled() -> None:
    import io

    from blis_sim.observe.progress import Progress

    quiet = io.StringIO()
    p = Progress(3, stream=quiet)  # StringIO is not a terminal
    p.advance(True)
    p.close()
    assert quiet.getvalue() == ""
    loud = io.StringIO()
    p = Progress(3, enabled=True, stream=loud)
    p.phase("flood")
    p.advance(True)
    p.advance(False)
    p.close()
    assert "observe [flood]" in loud.getvalue() and "2/3 done, 1 failed" in loud.getvalue()


def test_bad_window_phases_fail_before_any_request(fake: tuple[FakeVllm, str]) -> None:
    from blis_sim.errors import UsageError

    server, url = fake
    with pytest.raises(UsageError, match="unknown phases \\['nope'\\]"):
        observe(url, parse_workload_spec(PHASES), _opts(window_phases=("nope",)))
    assert server.requests == []


def test_early_stops_and_late_sends_are_reported(fake: tuple[FakeVllm, str]) -> None:
    server, url = fake
    server.early_stop = True
    server.delay_s = 0.02
    spec = SPEC.replace("num_requests: 4", "num_requests: 24")  # 200 req/s, one at a time: sends fall behind
    result = observe(url, parse_workload_spec(spec), _opts(scrape_kv_metrics=False))
    assert all(r.status == "ok" and r.output_tokens == 1 and r.finish_reason == "stop" for r in result.trace.records)
    assert any(w.startswith("24 requests stopped before min_tokens") for w in result.warnings), result.warnings
    assert any(w.startswith("sends were late against the schedule") for w in result.warnings), result.warnings
    assert capture_percentile(result.lateness_ms, 99) > 10
