"""A small HTTP/1.1 server for the emulator: keep-alive, Content-Length and chunked bodies, SSE.

API (the subset of aiohttp.web the handlers use, so they read the same)::

    server = HttpServer(routes={("POST", "/v1/completions"): handler, ...})
    await server.start(host, port)   # -> (host, port) bound; port 0 = a free one
    await server.close()             # stop listening, close every connection

    async def handler(request: Request) -> Response | StreamResponse
    request.method, request.path, request.headers.get("X-Request-Id"), await request.read(),
    request.transport
    Response(status=200, body=b"", text=None, content_type=None, headers=None)
    json_response(obj, status=200)
    resp = StreamResponse(headers={...}); await resp.prepare(request); await resp.write(b"..")
    await resp.write_eof(b"last bytes")      # the last chunk and the terminator in one write

A handler that raises ``asyncio.CancelledError`` drops the connection without an answer (the
emulator's ``drop``/``hang`` faults); ``ConnectionResetError`` from a write means the client left.
Unknown paths get FastAPI's ``404 {"detail":"Not Found"}``, a known path with another method
``405``; a body over ``max_body`` bytes ``413``. ``Expect: 100-continue`` is answered.

Why not aiohttp.web: the emulator stands in for vLLM at thousands of requests per second on the same
2 cores as the client it is measured with; aiohttp's request/response objects, router, multidicts and
one transport write per header block cost about 0.25 ms of CPU per request there. Here a request is
parsed in ``data_received`` (head split once, body sliced), a response head is formatted once, and a
streamed answer goes out in as few writes as the handler makes. Response heads carry what uvicorn
(vLLM's server) sends: ``date``, ``server: uvicorn``, then the handler's headers.
"""
from __future__ import annotations

import asyncio
import email.utils
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

log = logging.getLogger("blis_sim.emulator")

_REASONS = {100: "Continue", 200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            411: "Length Required", 413: "Request Entity Too Large", 429: "Too Many Requests",
            500: "Internal Server Error", 503: "Service Unavailable"}
_MAX_HEAD = 64 * 1024
_DECIMAL = re.compile(r"[0-9]{1,18}")
_HEX = re.compile(rb"[0-9a-fA-F]{1,15}")


class Headers(dict[str, str]):
    """Request headers, keys lower-cased; ``get`` and ``[]`` ignore case like aiohttp's multidict."""

    def get(self, key: str, default: Any = None) -> Any:
        return dict.get(self, key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return dict.__getitem__(self, key.lower())

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key.lower() if isinstance(key, str) else key)


class Request:
    __slots__ = ("method", "path", "query", "headers", "body", "transport", "version")

    def __init__(self, method: str, path: str, query: str, headers: Headers, body: bytes,
                 transport: asyncio.Transport, version: str) -> None:
        self.method, self.path, self.query, self.headers = method, path, query, headers
        self.body, self.transport, self.version = body, transport, version

    async def read(self) -> bytes:
        return self.body


class Response:
    """A complete answer (Content-Length)."""

    __slots__ = ("status", "body", "headers")

    def __init__(self, *, status: int = 200, body: bytes | str = b"", text: str | None = None,
                 content_type: str | None = None, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = dict(headers or {})
        if text is not None:
            body = text
            content_type = content_type or "text/plain; charset=utf-8"
        self.body = body.encode() if isinstance(body, str) else body
        if content_type:
            self.headers["content-type"] = content_type


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(status=status, body=orjson.dumps(obj), content_type="application/json")


class StreamResponse:
    """A chunked answer: head on ``prepare`` (as uvicorn sends it at once), then chunks."""

    __slots__ = ("status", "headers", "_transport", "prepared", "eof")

    def __init__(self, *, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = dict(headers or {})
        self._transport: asyncio.Transport | None = None
        self.prepared = False
        self.eof = False

    async def prepare(self, request: Request) -> None:
        self._transport = request.transport
        self.prepared = True
        self._send(_head(self.status, self.headers, "Transfer-Encoding: chunked\r\n"))

    async def write(self, data: bytes) -> None:
        if data:
            self._send(b"%x\r\n%b\r\n" % (len(data), data))

    async def write_eof(self, data: bytes = b"") -> None:
        if self.eof:
            return
        self.eof = True
        self._send((b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data)) if data else b"0\r\n\r\n")

    def _send(self, data: bytes) -> None:
        t = self._transport
        if t is None or t.is_closing():
            raise ConnectionResetError("the client closed the connection")
        t.write(data)


AnyResponse = Response | StreamResponse
Handler = Callable[[Request], Awaitable[AnyResponse]]

_date_cache: list[Any] = [0, b""]


def _date() -> bytes:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0] = now
        _date_cache[1] = email.utils.formatdate(now, usegmt=True).encode()
    return _date_cache[1]


def _head(status: int, headers: dict[str, str], extra: str = "") -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (b"HTTP/1.1 %d %b\r\ndate: %b\r\nserver: uvicorn\r\n" % (status, _REASONS.get(status, "Unknown").encode(),
                                                                   _date())
            + (lines + extra + "\r\n").encode("latin-1"))


def _encode_response(resp: Response, keep_alive: bool) -> bytes:
    extra = f"content-length: {len(resp.body)}\r\n" + ("" if keep_alive else "connection: close\r\n")
    return _head(resp.status, resp.headers, extra) + resp.body


def _error(status: int, detail: str) -> Response:
    return Response(status=status, body=orjson.dumps({"detail": detail}), content_type="application/json")


class _Connection(asyncio.Protocol):
    """Requests on one connection, answered one at a time, in order."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.busy = False  # a handler is running; later requests wait in ``buf``
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf = self.buf + data if self.buf else data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        """Parse the next complete request from ``buf`` and start its handler."""
        t = self.transport
        if t is None or t.is_closing():
            return
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > _MAX_HEAD:
                self._fail(400, "request head too large")
            return
        lines = buf[:end].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self._fail(400, "malformed request line")
            return
        method, target, version = parts
        headers = Headers()
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                self._fail(400, "malformed header line")
                return
            headers[name.strip().lower()] = value.strip()
        start = end + 4
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body_end, body = _dechunk(buf, start)
            if body_end < 0:
                self._continue(headers)
                if body_end == -2:
                    self._fail(400, "malformed chunked body")
                return
        else:
            length_text = headers.get("content-length", "0")
            if not _DECIMAL.fullmatch(length_text):  # int() would take "-1", "+5", "1_0", " 5"
                self._fail(400, "bad content-length")
                return
            length = int(length_text)
            if length > self.server.max_body:
                self._fail(413, f"request body over {self.server.max_body} bytes")
                return
            if len(buf) - start < length:
                self._continue(headers)
                return
            body_end, body = start + length, buf[start:start + length]
        self.buf = buf[body_end:]
        path, _, query = target.partition("?")
        connection = headers.get("connection", "").lower()
        keep_alive = ("close" not in connection) if version == "HTTP/1.1" else ("keep-alive" in connection)
        request = Request(method, path, query, headers, body, t, version)
        self.busy = True
        self.task = asyncio.ensure_future(self._handle(request, keep_alive))

    def _continue(self, headers: Headers) -> None:
        """``Expect: 100-continue`` (curl, for bodies over 1 KiB): say go once, then wait for the body."""
        if headers.get("expect", "").lower() == "100-continue" and self.transport is not None \
                and not getattr(self, "_continued", False):
            self._continued = True
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _fail(self, status: int, detail: str) -> None:
        if self.transport is not None:
            self.transport.write(_encode_response(_error(status, detail), keep_alive=False))
            self.transport.close()

    async def _handle(self, request: Request, keep_alive: bool) -> None:
        self._continued = False
        t = request.transport
        try:
            handler = self.server.routes.get((request.method, request.path))
            if handler is None:
                if any(path == request.path for _, path in self.server.routes):
                    resp: Response | StreamResponse = _error(405, "Method Not Allowed")
                else:
                    resp = _error(404, "Not Found")
            else:
                resp = await handler(request)
            if isinstance(resp, StreamResponse):
                if not resp.prepared:
                    await resp.prepare(request)
                await resp.write_eof()
            elif not t.is_closing():
                t.write(_encode_response(resp, keep_alive))
        except asyncio.CancelledError:  # the handler's way to drop the connection (or we are stopping)
            t.close()
            return
        except ConnectionResetError:
            t.close()
            return
        except Exception:
            log.exception("emulator: handler for %s %s failed", request.method, request.path)
            if not t.is_closing():
                t.write(_encode_response(Response(status=500, text="Internal Server Error"), False))
            t.close()
            return
        finally:
            self.busy = False
            self.task = None
        if not keep_alive:
            t.close()
        elif self.buf:
            self._next()  # a pipelined request


def _dechunk(buf: bytes, pos: int) -> tuple[int, bytes]:
    """(end offset, body) of a chunked body starting at ``pos``; (-1, b"") incomplete, (-2, b"") bad."""
    parts: list[bytes] = []
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return -1, b""
        size_text = buf[pos:eol].split(b";", 1)[0].strip()
        if not _HEX.fullmatch(size_text):  # int(x, 16) would take "-2" (and loop here), "0x5", "1_0"
            return -2, b""
        size = int(size_text, 16)
        pos = eol + 2
        if size == 0:
            end = buf.find(b"\r\n\r\n", pos - 2)  # no trailers: the terminator's own CRLF
            if end < 0:
                return -1, b""
            return end + 4, b"".join(parts)
        if len(buf) < pos + size + 2:
            return -1, b""
        parts.append(buf[pos:pos + size])
        pos += size + 2


class HttpServer:
    """Listens on one host/port and serves ``routes`` ({(method, path): handler})."""

    def __init__(self, routes: dict[tuple[str, str], Handler], *, max_body: int = 64 * 1024 * 1024) -> None:
        self.routes = routes
        self.max_body = max_body
        self.connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, reuse_address=True)
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.task is not None:
                conn.task.cancel()
            if conn.transport is not None:
                conn.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
