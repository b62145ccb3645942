"""Observe's HTTP/1.1 client against a misbehaving server (issue 14): every broken response becomes an error row
with a reason, the run goes on, the trace holds every request and the counter window is intact.

The server is a raw asyncio server on 127.0.0.1 (port 0, its own thread and loop) speaking just enough HTTP
to serve ``/version`` and ``/metrics`` properly and to answer each ``/v1/completions`` in the way named by
its turn in :data:`MODES`: well-formed, or with a malformed status line or header, a bad chunk size, broken
SSE frames, a line of several MB, a premature close, a slow drip, gzip nobody asked for, ... The server keys
each request by its ``x-request-id``, so each trace row can be checked against what was done to it.
"""
from __future__ import annotations

import asyncio
import gzip
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from blis_sim.formats.workload import parse_workload_spec
from blis_sim.observe.run import ObserveOptions, observe
from test_observe_run import SPEC


def _frame(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _sse(n: int = 3) -> bytes:
    out = b"".join(_frame({"choices": [{"index": 0, "text": " t", "finish_reason": "length" if i == n - 1 else None}]})
                   for i in range(n))
    return out + _frame({"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": n}}) + b"data: [DONE]\n\n"


def _chunked(body: bytes, size: int = 64) -> bytes:
    out = b""
    for i in range(0, len(body), size):
        piece = body[i:i + size]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + b"0\r\n\r\n"


OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
BIG = 4 * 1024 * 1024  # a "line" of several MB


async def _drip(writer: asyncio.StreamWriter, data: bytes, every_s: float) -> None:
    for i in range(len(data)):
        writer.write(data[i:i + 1])
        await writer.drain()
        await asyncio.sleep(every_s)


# name -> coroutine writing the response (or not) and closing; "ok" is the well-formed answer.
async def _respond(mode: str, writer: asyncio.StreamWriter) -> None:
    w = writer.write
    if mode == "ok":
        w(OK_HEAD + _chunked(_sse()))
    elif mode == "bad-status-line":
        w(b"HTTP/1.1 OK\r\nContent-Length: 0\r\n\r\n")
    elif mode == "garbage-status-line":
        w(b"\x00\xffSSH-2.0-OpenSSH\r\n\r\n")
    elif mode == "status-not-a-number":
        w(b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n")
    elif mode == "header-without-colon":
        w(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nNoColonHere\r\n\r\n" + _chunked(_sse()))
    elif mode == "head-too-large":
        w(b"HTTP/1.1 200 OK\r\nX-Filler: " + b"a" * (200 * 1024) + b"\r\n\r\n")
    elif mode == "bad-chunk-size":
        w(OK_HEAD + b"zz\r\n" + _sse() + b"\r\n0\r\n\r\n")
    elif mode == "negative-content-length":
        w(b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n" + _sse())
    elif mode == "short-content-length-body":
        w(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 100000\r\n\r\n" + _sse()[:50])
    elif mode == "broken-sse":
        w(OK_HEAD + _chunked(b"data: {not json\n\ndata: {\"choices\": 5}\n\nevent: x\ndata: [DONE]\n\n"))
    elif mode == "multi-megabyte-line":
        w(OK_HEAD + _chunked(b"data: " + b"x" * BIG, size=256 * 1024))
    elif mode == "premature-close":
        w(OK_HEAD + _chunked(_sse())[:70])
    elif mode == "slow-drip":  # slower than the request timeout allows
        w(OK_HEAD)
        await _drip(writer, _chunked(_sse()), 0.2)
    elif mode == "unasked-gzip":
        body = gzip.compress(_sse())
        w(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
          + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    elif mode == "http-500":
        w(b"HTTP/1.1 500 Internal Server Error\r\nConnection: close\r\nContent-Length: 5\r\n\r\nboom!")
    elif mode == "no-response":
        pass
    else:  # pragma: no cover
        raise AssertionError(mode)
    await writer.drain()


MODES = ["bad-status-line", "garbage-status-line", "status-not-a-number", "header-without-colon", "head-too-large",
         "bad-chunk-size", "negative-content-length", "short-content-length-body", "broken-sse",
         "multi-megabyte-line", "premature-close", "slow-drip", "unasked-gzip", "http-500", "no-response"]


class FuzzServer:
    """Answers the n-th completion with ``TURNS[n]``; counts hits and queries as a prefix cache would."""

    def __init__(self, turns: list[str]) -> None:
        self.turns = turns
        self.by_request_id: dict[str, str] = {}
        self.arrivals: dict[str, int] = {}  # a retried request arrives twice (and counts twice)
        self.queries = 0
        self.hits = 0

    def exposition(self) -> str:
        lab = 'engine="0",model_name="m"'
        lines = []
        for name, value in (("prefix_cache_queries", self.queries), ("prefix_cache_hits", self.hits)):
            lines += [f"# TYPE vllm:{name}_total counter", f"vllm:{name}_total{{{lab}}} {float(value)}"]
        lines.append(f'vllm:cache_config_info{{block_size="16",{lab},num_gpu_blocks="100"}} 1.0')
        return "\n".join(lines) + "\n"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: several requests per connection
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if path == "/metrics":
                    text = self.exposition().encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                 + f"Content-Length: {len(text)}\r\n\r\n".encode() + text)
                elif path == "/version":
                    text = b'{"version": "0.32.0"}'
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 + f"Content-Length: {len(text)}\r\n\r\n".encode() + text)
                elif path == "/v1/completions" and method == "POST":
                    json.loads(body)
                    rid = headers["x-request-id"]  # a retried request gets the same answer again
                    mode = self.by_request_id.get(rid) or self.turns[len(self.by_request_id) % len(self.turns)]
                    self.by_request_id[rid] = mode
                    self.arrivals[rid] = self.arrivals.get(rid, 0) + 1
                    self.queries += 32
                    self.hits += 16
                    await _respond(mode, writer)
                    if mode != "ok":
                        break  # every broken answer ends its connection
                else:
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
def fuzz_server() -> Iterator[tuple[FuzzServer, str]]:
    turns = [m for mode in MODES for m in ("ok", mode)]  # every broken answer follows a good one
    server = FuzzServer(turns)
    ready = threading.Event()
    state: dict[str, Any] = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        srv = loop.run_until_complete(asyncio.start_server(server.handle, "127.0.0.1", 0))
        state["port"] = srv.sockets[0].getsockname()[1]
        state["loop"], state["stop"] = loop, asyncio.Event()
        ready.set()
        loop.run_until_complete(state["stop"].wait())
        srv.close()
        pending = asyncio.all_tasks(loop)  # handlers still dripping or reading
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield server, f"http://127.0.0.1:{state['port']}"
    state["loop"].call_soon_threadsafe(state["stop"].set)
    thread.join(10)


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
def test_every_broken_response_is_an_error_row_and_the_window_survives(
        fuzz_server: tuple[FuzzServer, str], client: str) -> None:
    server, url = fuzz_server
    n = len(server.turns)
    opts = ObserveOptions(model="m", max_concurrency=4, scrape_kv_metrics=True, settle_s=0.0, progress=False,
                          timeout_s=1.5, use_tokenize=False, http_client=client)
    spec = SPEC.replace("num_requests: 4", f"num_requests: {n}")  # test_observe_run's spec, n requests
    result = observe(url, parse_workload_spec(spec), opts)
    rows = result.trace.records
    # one more request than rows: without /tokenize, observe calibrates tokens per word on one request first
    extra = [server.by_request_id[i] for i in set(server.by_request_id) - {r.x_request_id for r in rows}]
    assert len(rows) == n and extra == ["ok"]
    unseen = [(r.status, r.error_message) for r in rows if r.x_request_id not in server.by_request_id]
    assert not unseen
    assert {server.by_request_id[r.x_request_id] for r in rows} == set(MODES) | {"ok"}
    for row in rows:
        mode = server.by_request_id[row.x_request_id]
        if mode == "ok" or (client == "aiohttp" and mode == "unasked-gzip"):
            # aiohttp asks for gzip (its default Accept-Encoding) and decodes it: a good answer there
            assert row.status == "ok" and row.num_chunks >= 3, (mode, row)
        else:
            assert row.status != "ok" and row.error_message.strip(), (mode, row)
            assert "\n" not in row.error_message, (mode, row.error_message)
    # the counter window: 32 queries and 16 hits per request received, every one of them inside the window
    ours = result.trace.header.pytest_blis
    assert ours is not None and not ours.partial
    rates = {(e.definition, e.tier): e for e in ours.kv_hit_rates}
    prefix = rates[("prefix_cache", None)]
    received = sum(server.arrivals[r.x_request_id] for r in rows)
    assert (prefix.queries, prefix.hits) == (32 * received, 16 * received)
