"""A lean keep-alive HTTP/1.1 client for observe's hot path (plain ``http://`` only).

API::

    pool = Http1Pool("http://127.0.0.1:8000", headers={"User-Agent": "blis-observe/x"})
    Http1Pool.supports(url) -> bool          # False for https:// (observe then uses aiohttp)
    await pool.open(64)                      # keep-alive connections opened ahead (optional)
    await pool.request("POST", "/v1/completions", body, headers, sink, timeout_s)
    await pool.close()

``sink`` is a :class:`ResponseSink`; the connection calls it from ``data_received``, with the
monotonic time (``time.perf_counter_ns``) read as the bytes arrived: ``head(status, headers, now_ns)``
once the status line and headers are in, ``data(bytes, now_ns)`` for each piece of the decoded body
(chunked or Content-Length framing, or until close), ``done()`` polled after each piece (a sink that
has seen everything it needs, e.g. ``data: [DONE]``, ends the request early; the connection reads the
rest of the body on its own and only then goes back to the pool). ``request`` returns when the body
ended or the sink is done; it raises :class:`HttpTimeout` after ``timeout_s`` (total), and
:class:`HttpError` subclasses for a failed connect, a malformed response or a connection lost
mid-response. A sink that raises aborts the request with its exception.

Why not aiohttp here: at 64 concurrent streams aiohttp's request machinery (ClientRequest,
ClientResponse, StreamReader, timers, one await per network read) cost about 0.4 ms of CPU per
request on a 2-core machine, which is what the client TTFT overhead was made of. This client does no
work per request beyond formatting one request head, parsing one response head and decoding the
chunk framing, all inside the protocol callback; the body is never copied into a stream buffer.
Everything else observe sends (``/version``, ``/tokenize``, ``/metrics``, https servers) stays on
aiohttp.

Connections: LIFO reuse of idle keep-alive connections, a new one when none is idle (the dispatcher
bounds concurrency). A reused connection that closes before any response byte arrives (the server's
keep-alive timeout raced with our request) is retried once on a fresh connection, as browsers do.
No compression is asked for (no ``Accept-Encoding``), so bodies arrive as sent.
"""
from __future__ import annotations

import asyncio
import re
import time
from typing import Protocol
from urllib.parse import urlsplit

_MAX_HEAD_BYTES = 64 * 1024
_STATUS = re.compile(r"[0-9]{3}")
_DECIMAL = re.compile(r"[0-9]{1,18}")
_HEX = re.compile(rb"[0-9a-fA-F]{1,15}")
_DRAIN_S = 0.5  # how long a connection may take to finish a body nobody waits for any more


class HttpError(Exception):
    """The exchange failed below the application: connect, framing, connection lost."""


class ConnectError(HttpError):
    pass


class ProtocolError(HttpError):
    pass


class Disconnected(HttpError):
    pass


class HttpTimeout(asyncio.TimeoutError):
    pass


class ResponseSink(Protocol):
    def head(self, status: int, headers: dict[str, str], now_ns: int) -> None: ...

    def data(self, chunk: bytes, now_ns: int) -> None: ...

    def done(self) -> bool: ...


class _Exchange:
    """One request on one connection: its sink, its waiter, what the connection learnt so far."""

    __slots__ = ("sink", "future", "got_bytes")

    def __init__(self, sink: ResponseSink, future: asyncio.Future[None]) -> None:
        self.sink = sink
        self.future = future
        self.got_bytes = False

    def finish(self, exc: BaseException | None = None) -> None:
        if not self.future.done():
            if exc is None:
                self.future.set_result(None)
            else:
                self.future.set_exception(exc)


# Body framing states
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _UNTIL_CLOSE, _IDLE = range(8)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; parses responses incrementally in ``data_received``."""

    def __init__(self, pool: Http1Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.exchange: _Exchange | None = None
        self.state = _IDLE
        self.buf = b""  # unparsed head / chunk-size line bytes
        self.remaining = 0  # body bytes left (Content-Length) or in the current chunk
        self.keep_alive = True
        self.drain_timer: asyncio.TimerHandle | None = None
        self.used = 0  # requests sent on this connection

    # -- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        ex = self.exchange
        self.exchange = None
        if self.drain_timer is not None:
            self.drain_timer.cancel()
        if ex is None:
            return
        if self.state == _UNTIL_CLOSE and exc is None:
            ex.finish()  # a body framed by the connection's end
            return
        reason = f": {exc}" if exc else ""
        ex.finish(Disconnected(f"server closed the connection mid-response{reason}"
                               if ex.got_bytes else f"server closed the connection{reason}"))

    def eof_received(self) -> bool:
        return False  # close our side too

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        ex = self.exchange
        if ex is None:
            self._abort()  # bytes nobody asked for: the connection is not reusable
            return
        ex.got_bytes = True
        try:
            while self.state == _HEAD:  # a loop: interim 1xx heads (103 Early Hints...) come first
                data = self._head(ex, data, now)
                if ex.future.done() or (self.state == _HEAD and not data):
                    return
            self._body(ex, data, now)
        except Exception as exc:
            self.exchange = None
            ex.finish(exc)
            self._abort()

    # -- parsing ----------------------------------------------------------------------------------
    def _head(self, ex: _Exchange, data: bytes, now: int) -> bytes:
        buf = self.buf + data if self.buf else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > _MAX_HEAD_BYTES:
                raise ProtocolError(f"response head longer than {_MAX_HEAD_BYTES} bytes")
            self.buf = buf
            return b""
        self.buf = b""
        lines = buf[:end].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not _STATUS.fullmatch(parts[1]):
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
        status = int(parts[1])
        if 100 <= status < 200 and status != 101:
            return buf[end + 4:]  # an interim response: the real head follows (state stays _HEAD)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError(f"malformed header line: {line[:100]!r}")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        connection = headers.get("connection", "").lower()
        self.keep_alive = ("close" not in connection) if parts[0] == "HTTP/1.1" else ("keep-alive" in connection)
        encoding = headers.get("content-encoding", "identity").lower()
        if encoding not in ("identity", ""):
            raise ProtocolError(f"unexpected Content-Encoding {encoding!r} (none was asked for)")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = _CHUNK_SIZE
        elif "content-length" in headers:
            length = headers["content-length"]
            if not _DECIMAL.fullmatch(length):  # int() would take "-5", "+5", "1_000", " 5"
                raise ProtocolError(f"bad Content-Length {length[:40]!r}")
            self.remaining = int(length)
            self.state = _LENGTH
        elif status in (204, 304, 101):
            self.remaining = 0
            self.state = _LENGTH
        else:
            self.state = _UNTIL_CLOSE
            self.keep_alive = False
        ex.sink.head(status, headers, now)
        if self.state == _LENGTH and self.remaining == 0:
            self._end(ex)
        return buf[end + 4:]

    def _body(self, ex: _Exchange, data: bytes, now: int) -> None:
        state = self.state
        if state == _LENGTH:
            if len(data) >= self.remaining:
                piece, extra = data[:self.remaining], data[self.remaining:]
                self.remaining = 0
                if piece:
                    ex.sink.data(piece, now)
                if extra:
                    self.keep_alive = False  # bytes past the body: not ours to interpret
                self._end(ex)
                return
            self.remaining -= len(data)
            if data:
                ex.sink.data(data, now)
                self._check_done(ex)
            return
        if state == _UNTIL_CLOSE:
            if data:
                ex.sink.data(data, now)
                self._check_done(ex)
            return
        # chunked: collect this read's payload pieces, hand them over once
        pieces: list[bytes] = []
        pos = 0
        n = len(data)
        while pos < n or state == _TRAILER:
            if state == _CHUNK_DATA:
                take = min(self.remaining, n - pos)
                pieces.append(data[pos:pos + take])
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    state = _CHUNK_CRLF
                    self.buf = b""
                continue
            if state == _CHUNK_CRLF:
                need = 2 - len(self.buf)
                self.buf += data[pos:pos + need]
                pos += need
                if len(self.buf) < 2:
                    break
                if self.buf != b"\r\n":
                    raise ProtocolError("chunk not followed by CRLF")
                self.buf = b""
                state = _CHUNK_SIZE
                continue
            # _CHUNK_SIZE or _TRAILER: a line
            if self.buf.endswith(b"\r") and data.startswith(b"\n", pos):
                line = self.buf[:-1]  # the CRLF was split across two reads
                pos += 1
            else:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    self.buf += data[pos:]
                    if len(self.buf) > 4096:
                        raise ProtocolError("chunk size line too long")
                    pos = n
                    break
                line = self.buf + data[pos:eol]
                pos = eol + 2
            self.buf = b""
            if state == _TRAILER:
                if not line:  # the empty line after the last chunk (and any trailers)
                    self.state = _IDLE
                    if pieces:
                        ex.sink.data(b"".join(pieces), now)
                    if pos < n:
                        self.keep_alive = False
                    self._end(ex)
                    return
                continue
            size_text = line.split(b";", 1)[0].strip()
            if not _HEX.fullmatch(size_text):  # int(x, 16) would take "-5", "0x5", "1_0"
                raise ProtocolError(f"bad chunk size line {line[:40]!r}")
            size = int(size_text, 16)
            if size == 0:
                state = _TRAILER
            else:
                self.remaining = size
                state = _CHUNK_DATA
        self.state = state
        if pieces:
            ex.sink.data(pieces[0] if len(pieces) == 1 else b"".join(pieces), now)
            self._check_done(ex)

    def _check_done(self, ex: _Exchange) -> None:
        """The sink has what it needs: release the waiter now, read the body's tail in the background."""
        if not ex.future.done() and ex.sink.done():
            ex.finish()
            if self.drain_timer is None and self.transport is not None:
                loop = asyncio.get_running_loop()
                self.drain_timer = loop.call_later(_DRAIN_S, self._abort)

    def _end(self, ex: _Exchange) -> None:
        self.state = _IDLE
        self.exchange = None
        ex.finish()
        if self.drain_timer is not None:
            self.drain_timer.cancel()
            self.drain_timer = None
        if self.keep_alive and not self.closed:
            self.pool._release(self)
        else:
            self._abort()

    def _abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # -- sending ----------------------------------------------------------------------------------
    def start(self, payload: bytes, sink: ResponseSink, future: asyncio.Future[None]) -> _Exchange:
        assert self.transport is not None and self.exchange is None
        ex = _Exchange(sink, future)
        self.exchange = ex
        self.state = _HEAD
        self.buf = b""
        self.used += 1
        self.transport.write(payload)
        return ex


class Http1Pool:
    """Keep-alive connections to one ``http://host:port`` origin."""

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"Http1Pool serves plain http:// URLs, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        default_port = parts.port is None or parts.port == 80
        host_header = self.host if default_port else f"{self.host}:{self.port}"
        if ":" in self.host:  # IPv6 literal
            host_header = f"[{self.host}]" + ("" if default_port else f":{self.port}")
        fixed = {"Host": host_header, "Accept": "*/*", **(headers or {})}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._closed = False

    @staticmethod
    def supports(url: str) -> bool:
        parts = urlsplit(url)
        return parts.scheme == "http" and bool(parts.hostname)

    def _release(self, conn: _Connection) -> None:
        if self._closed:
            conn._abort()
        else:
            self._idle.append(conn)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: _Connection(self), self.host, self.port)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from None
        self._all.add(conn)
        return conn

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
            self._all.discard(conn)
        return None

    def encode(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        """The request bytes: one write per request."""
        head = (f"{method} {self.prefix}{path} HTTP/1.1\r\n{self._fixed}"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                + f"Content-Length: {len(body)}\r\n\r\n")
        return head.encode("latin-1") + body

    async def request(self, method: str, path: str, body: bytes, headers: dict[str, str],
                      sink: ResponseSink, timeout_s: float) -> None:
        """Send one request and feed its response to ``sink``; see the module docstring."""
        if self._closed:
            raise HttpError("the connection pool is closed")
        loop = asyncio.get_running_loop()
        payload = self.encode(method, path, body, headers)
        deadline = loop.time() + timeout_s
        conn: _Connection | None = None
        future: asyncio.Future[None] = loop.create_future()
        timer = loop.call_at(deadline, _expire, future, timeout_s)
        try:
            for attempt in (0, 1):
                conn = self._take_idle()
                reused = conn is not None
                if conn is None:
                    conn = await asyncio.wait_for(self._connect(), max(0.0, deadline - loop.time()))
                ex = conn.start(payload, sink, future)
                try:
                    await future
                    return
                except Disconnected:
                    if attempt == 0 and reused and not ex.got_bytes:
                        future = loop.create_future()  # the keep-alive race: once more, fresh
                        timer.cancel()
                        timer = loop.call_at(deadline, _expire, future, timeout_s)
                        continue
                    raise
        except HttpTimeout:
            _drop(conn)
            raise
        except asyncio.TimeoutError:  # the connect's own wait_for
            _drop(conn)
            raise HttpTimeout(f"no connection within {timeout_s:g} s") from None
        except asyncio.CancelledError:  # observe stopping: the exchange is abandoned mid-way
            _drop(conn)
            raise
        finally:
            timer.cancel()

    async def open(self, n: int, timeout_s: float = 5.0) -> int:
        """Open up to ``n`` idle keep-alive connections ahead of time (no TCP handshake inside the
        first requests' TTFT); returns how many opened. A failure here is not an error: the
        requests will say what is wrong."""
        want = n - len(self._idle)
        if want <= 0:
            return 0
        results = await asyncio.gather(*(asyncio.wait_for(self._connect(), timeout_s) for _ in range(want)),
                                       return_exceptions=True)
        opened = [c for c in results if isinstance(c, _Connection)]
        for conn in opened:
            self._release(conn)
        return len(opened)

    async def close(self) -> None:
        self._closed = True
        for conn in list(self._all):
            conn._abort()
        self._all.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks


def _drop(conn: _Connection | None) -> None:
    """Close a connection whose exchange was abandoned (it cannot be reused mid-response)."""
    if conn is not None and conn.exchange is not None:
        conn.exchange = None
        conn._abort()


def _expire(future: asyncio.Future[None], timeout_s: float) -> None:
    if not future.done():
        future.set_exception(HttpTimeout(f"no complete answer within {timeout_s:g} s"))
