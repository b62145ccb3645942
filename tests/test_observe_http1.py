"""observe's lean HTTP/1.1 client (Http1Pool): framing, keep-alive reuse, the stale-connection retry,
timeouts and malformed responses, against real sockets on 127.0.0.1 (raw asyncio servers that say
exactly the bytes each test needs), plus the chunked decoder under arbitrary read boundaries."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from blis_sim.observe.http1 import ConnectError, Disconnected, Http1Pool, HttpTimeout, ProtocolError, _Connection


class Sink:
    """Collects what the connection reports; ``done_after`` ends the request early on that marker."""

    def __init__(self, done_after: bytes | None = None) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        self.reads = 0
        self.head_ns = 0
        self.done_after = done_after

    def head(self, status: int, headers: dict[str, str], now_ns: int) -> None:
        self.status, self.headers, self.head_ns = status, headers, now_ns

    def data(self, chunk: bytes, now_ns: int) -> None:
        assert now_ns >= self.head_ns
        self.body += chunk
        self.reads += 1

    def done(self) -> bool:
        return self.done_after is not None and self.done_after in self.body


Responder = Callable[[bytes, asyncio.Transport, int], None]


@contextlib.asynccontextmanager
async def raw_server(respond: Responder) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A server that calls ``respond(request_head_and_body, transport, n_on_connection)`` per request."""
    stats: dict[str, Any] = {"connections": 0, "requests": []}

    class Proto(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.t = transport
            self.buf = b""
            self.n = 0
            stats["connections"] += 1

        def data_received(self, data: bytes) -> None:
            self.buf += data
            while b"\r\n\r\n" in self.buf:
                head, _, rest = self.buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v)
                if len(rest) < length:
                    return
                self.buf = rest[length:]
                stats["requests"].append(head + b"\r\n\r\n" + rest[:length])
                self.n += 1
                respond(stats["requests"][-1], self.t, self.n)  # type: ignore[arg-type]

    server = await asyncio.get_running_loop().create_server(Proto, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", stats
    finally:
        server.close()


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_chunked_stream_keep_alive_reuse_and_request_bytes() -> None:
    async def body() -> None:
        def respond(req: bytes, t: asyncio.Transport, n: int) -> None:
            t.write(OK_HEAD + chunked(b"data: a\n\n", b"data: [DONE]\n\n"))

        async with raw_server(respond) as (url, stats):
            pool = Http1Pool(url + "/prefix", headers={"User-Agent": "t"})
            for _ in range(3):
                sink = Sink()
                await pool.request("POST", "/v1/completions", b'{"x":1}', {"X-A": "b"}, sink, 5.0)
                assert (sink.status, sink.body) == (200, b"data: a\n\ndata: [DONE]\n\n")
                assert sink.headers["content-type"] == "text/event-stream"
            await pool.close()
        assert stats["connections"] == 1  # kept alive and reused
        first = stats["requests"][0]
        assert first.startswith(b"POST /prefix/v1/completions HTTP/1.1\r\n")
        for line in (b"Host: 127.0.0.1:", b"User-Agent: t\r\n", b"X-A: b\r\n", b"Content-Length: 7\r\n"):
            assert line in first
        assert b"Accept-Encoding" not in first  # bodies arrive as sent
        assert first.endswith(b'\r\n\r\n{"x":1}')

    asyncio.run(body())


def test_content_length_and_until_close_bodies() -> None:
    async def body() -> None:
        def respond(req: bytes, t: asyncio.Transport, n: int) -> None:
            if b"/length" in req:
                t.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\nbroke")
            else:  # HTTP/1.0 style: the body ends with the connection
                t.write(b"HTTP/1.1 200 OK\r\n\r\n{\"a\":")
                asyncio.get_running_loop().call_later(0.05, lambda: (t.write(b"1}"), t.close()))

        async with raw_server(respond) as (url, stats):
            pool = Http1Pool(url)
            sink = Sink()
            await pool.request("POST", "/length", b"", {}, sink, 5.0)
            assert (sink.status, sink.body) == (500, b"broke")
            sink = Sink()
            await pool.request("POST", "/close", b"", {}, sink, 5.0)
            assert (sink.status, sink.body) == (200, b'{"a":1}')
            sink = Sink()
            await pool.request("POST", "/length", b"", {}, sink, 5.0)
            await pool.close()
        assert stats["connections"] == 2  # the close-delimited one could not be reused

    asyncio.run(body())


def test_a_stale_keep_alive_connection_is_retried_once_on_a_fresh_one() -> None:
    async def body() -> None:
        def respond(req: bytes, t: asyncio.Transport, n: int) -> None:
            if b"/die" in req:
                t.close()  # closes without a byte, as a server whose keep-alive timeout just hit
            else:
                t.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

        async with raw_server(respond) as (url, stats):
            pool = Http1Pool(url)
            await pool.request("POST", "/a", b"", {}, Sink(), 5.0)
            # The idle connection is reused for /die, which the server drops without answering: a
            # fresh connection is tried once, and that one is dropped too, which is then an error.
            with pytest.raises(Disconnected):
                await pool.request("POST", "/die", b"", {}, Sink(), 5.0)
            assert stats["connections"] == 2
            # A request on a fresh connection (nothing idle) that is dropped is not retried.
            with pytest.raises(Disconnected):
                await pool.request("POST", "/die", b"", {}, Sink(), 5.0)
            assert stats["connections"] == 3
            await pool.close()

    asyncio.run(body())


def test_sink_done_releases_the_waiter_before_the_body_ends() -> None:
    async def body() -> None:
        def respond(req: bytes, t: asyncio.Transport, n: int) -> None:
            t.write(OK_HEAD + b"%x\r\n%s\r\n" % (14, b"data: [DONE]\n\n"))
            asyncio.get_running_loop().call_later(0.3, t.write, b"0\r\n\r\n")

        async with raw_server(respond) as (url, stats):
            pool = Http1Pool(url)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await pool.request("POST", "/", b"", {}, Sink(done_after=b"[DONE]"), 5.0)
            assert loop.time() - t0 < 0.25  # did not wait for the terminating chunk
            await asyncio.sleep(0.4)  # the terminator arrives; the connection goes back to the pool
            await pool.request("POST", "/", b"", {}, Sink(done_after=b"[DONE]"), 5.0)
            await pool.close()
        assert stats["connections"] == 1

    asyncio.run(body())


@pytest.mark.parametrize("reply,error", [
    (b"SPDY/3 200 OK\r\n\r\n", "not an HTTP/1.x status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size line"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXX", "chunk not followed by CRLF"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 1\r\n\r\nx", "unexpected Content-Encoding"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n", "bad Content-Length"),
])
def test_malformed_responses_are_protocol_errors(reply: bytes, error: str) -> None:
    async def body() -> None:
        async with raw_server(lambda req, t, n: t.write(reply)) as (url, _):
            pool = Http1Pool(url)
            with pytest.raises(ProtocolError, match=error):
                await pool.request("POST", "/", b"", {}, Sink(), 5.0)
            await pool.close()

    asyncio.run(body())


def test_timeout_and_connect_failure() -> None:
    async def body() -> None:
        async with raw_server(lambda req, t, n: t.write(b"HTTP/1.1 200 OK\r\n")) as (url, stats):
            pool = Http1Pool(url)
            with pytest.raises(HttpTimeout):
                await pool.request("POST", "/", b"", {}, Sink(), 0.2)
            await pool.close()
        pool = Http1Pool("http://127.0.0.1:9")
        with pytest.raises(ConnectError, match="cannot connect to 127.0.0.1:9"):
            await pool.request("POST", "/", b"", {}, Sink(), 2.0)

    asyncio.run(body())


def test_supports_only_plain_http() -> None:
    assert Http1Pool.supports("http://h:1") and not Http1Pool.supports("https://h")
    with pytest.raises(ValueError):
        Http1Pool("https://h")


class FakeTransport:
    def __init__(self) -> None:
        self.closed = False
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


def test_chunked_decoding_is_independent_of_read_boundaries() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=6),
           st.lists(st.integers(1, 23), min_size=1, max_size=40))
    def check(pieces: list[bytes], cuts: list[int]) -> None:
        raw = OK_HEAD + b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-T: 1\r\n\r\n"

        async def run() -> None:
            pool = Http1Pool("http://127.0.0.1:1")
            conn = _Connection(pool)
            conn.connection_made(FakeTransport())  # type: ignore[arg-type]
            sink = Sink()
            future = asyncio.get_running_loop().create_future()
            conn.start(b"req", sink, future)
            pos = 0
            for size in cuts + [len(raw)]:
                if pos < len(raw):
                    conn.data_received(raw[pos:pos + size])
                pos += size
            assert future.done() and future.exception() is None
            assert sink.body == b"".join(pieces)
            assert pool._idle == [conn]  # body complete: back to the pool

        asyncio.run(run())

    check()


def test_interim_1xx_heads_are_skipped() -> None:
    async def body() -> None:
        def respond(req: bytes, t: asyncio.Transport, n: int) -> None:
            t.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
            t.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

        async with raw_server(respond) as (url, _):
            pool = Http1Pool(url)
            sink = Sink()
            await pool.request("POST", "/", b"", {}, sink, 5.0)
            assert (sink.status, sink.body) == (200, b"ok")
            await pool.close()

    asyncio.run(body())


def test_observe_over_aiohttp_retries_the_keep_alive_race_once_and_only_on_a_reused_connection() -> None:
    """The aiohttp path (https servers) gets the same rule as the pool above, through the session's
    ``connection_reuse_trace``: a reused connection closed before any byte of an answer is retried once."""
    import aiohttp

    from blis_sim.observe.client import Target, connection_reuse_trace, send
    from blis_sim.observe.records import STATUS_ERROR, STATUS_OK, RequestRecord, RunClock, WireRequest

    answer = b'{"choices": [{"index": 0, "text": "hi", "finish_reason": "length"}]}'

    def respond(req: bytes, t: asyncio.Transport, n: int) -> None:
        # "race": the server closes a connection it has already answered on (its keep-alive timeout);
        # "die": it drops every request unanswered
        if b"die" in req or (b"race" in req and n > 1):
            t.close()
        else:
            t.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(answer), answer))

    async def one(session: aiohttp.ClientSession, url: str, word: str) -> RequestRecord:
        wire = WireRequest(prompt=f"{word} words here", max_tokens=2, streaming=False, arrival_us=0,
                           input_tokens=3, min_tokens=2)
        record = RequestRecord(request_id=0, wire=wire)
        await send(session, Target(url, "m", timeout_s=5.0), record, RunClock())
        return record

    async def body() -> None:
        async with raw_server(respond) as (url, stats), aiohttp.ClientSession(
                trace_configs=[connection_reuse_trace()]) as session:
            assert (await one(session, url, "first")).status == STATUS_OK
            # reused, closed unanswered, then answered on a fresh connection: one row, ok
            raced = await one(session, url, "race")
            assert raced.status == STATUS_OK and raced.error_message == ""
            assert (stats["connections"], len(stats["requests"])) == (2, 3)
            # reused and dropped, then dropped again on a fresh one: an error, after two tries
            dropped = await one(session, url, "die")
            assert dropped.status == STATUS_ERROR and "ServerDisconnected" in dropped.error_message
            assert (stats["connections"], len(stats["requests"])) == (3, 5)
            # a fresh connection (nothing idle) that is dropped: it may have delivered the request, so no retry
            assert (await one(session, url, "die")).status == STATUS_ERROR
            assert (stats["connections"], len(stats["requests"])) == (4, 6)

    asyncio.run(body())
