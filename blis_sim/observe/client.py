"""One OpenAI-compatible request, timed without distorting it (design D6).

API::

    target = Target(base_url="http://127.0.0.1:8000", model="m", api_format="completions",
                    api_key="", timeout_s=300.0, record_itl=False)
    await send(session, target, record, clock)    # fills ``record`` in place; never raises for the
                                                  # server's faults (status/error_message instead)
    # session: an Http1Pool (observe's path to http:// servers) or an aiohttp.ClientSession (https)
    StreamState(record, record_itl).feed(raw, now_ns) / .finish()   # SSE bytes -> the record

Timestamps (monotonic ns): ``send`` just before the POST, ``first_byte`` when the response head
arrives, ``first_chunk`` at the first SSE ``data:`` event, ``first_content`` at the first event that
carries generated text, ``last_chunk`` at the last event before ``[DONE]``. Non-streaming: the first
and last body bytes. The record is filled as the response arrives, so a cancelled request keeps the
timings it had.
"""
from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from blis_sim.observe.http1 import Http1Pool, HttpError, HttpTimeout
from blis_sim.observe.records import STATUS_ERROR, STATUS_OK, STATUS_TIMEOUT, RequestRecord, RunClock, WireRequest
from blis_sim.observe.sse import LineSplitter, LineTooLong, interpret, usage_numbers

API_FORMATS = ("completions", "chat")
_ERROR_BODY_LIMIT = 2048
_DRAIN_TIMEOUT_S = 0.5
_loads = orjson.loads
# A token event after the first content that has no finish reason, usage or error needs no decoding.
_PLAIN_MARK = b'"finish_reason":null'
_USAGE_MARK = b'"usage"'
_ERROR_MARK = b'"error"'
_dumps = orjson.dumps  # compact JSON bytes; the body's key order is build_body's


@dataclass(frozen=True)
class Target:
    """Where and how to send: the server, the model name sent, the API flavour and limits."""

    base_url: str
    model: str
    api_format: str = "completions"
    api_key: str = ""
    timeout_s: float = 300.0
    record_itl: bool = False
    replica_header: str = ""  # a router's response header naming the replica that served (docs/cluster.md §3)

    @functools.cached_property
    def client_timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.timeout_s)

    @functools.cached_property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api_format == "chat" else "/v1/completions"

    @functools.cached_property
    def endpoint(self) -> str:
        return self.base_url.rstrip("/") + self.path


def new_request_id() -> str:
    """A random version-4 UUID in its text form, as ``str(uuid.uuid4())`` gives, formatted from the bytes
    directly (no ``UUID`` object: observe makes one per request)."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def build_body(target: Target, wire: WireRequest) -> dict[str, Any]:
    """The JSON body, as the reference builds it (docs/reference-formats.md §3.2)."""
    body: dict[str, Any] = {"model": target.model, "stream": wire.streaming}
    if target.api_format == "chat":
        body["messages"] = [{"role": "user", "content": wire.prompt}]
    else:
        body["prompt"] = wire.prompt
    if wire.max_tokens > 0:
        body["max_tokens"] = wire.max_tokens
    if wire.min_tokens > 0:
        body["min_tokens"] = wire.min_tokens
    if wire.streaming:
        body["stream_options"] = {"include_usage": True}
    if wire.priority is not None:
        body["priority"] = wire.priority
    body.update(dict(wire.extra_body))
    return body


def build_headers(target: Target, wire: WireRequest, x_request_id: str) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "x-request-id": x_request_id}
    if target.api_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    if wire.tenant_id:
        headers["x-gateway-inference-fairness-id"] = wire.tenant_id
    if wire.slo_class:
        headers["x-gateway-inference-objective"] = wire.slo_class
    if wire.slo_target_us > 0:
        headers["x-slo-ttft-ms"] = str(-(-wire.slo_target_us // 1000))
    return headers


async def send(session: aiohttp.ClientSession | Http1Pool, target: Target, record: RequestRecord,
               clock: RunClock) -> None:
    """Send ``record.wire`` and fill ``record``. Server faults end up in status/error_message.

    ``session`` is an :class:`~blis_sim.observe.http1.Http1Pool` (the lean path observe uses for
    ``http://`` servers) or an aiohttp session (https, and any caller that has one).
    """
    wire = record.wire
    record.x_request_id = record.x_request_id or new_request_id()
    body = _dumps(build_body(target, wire))
    headers = build_headers(target, wire, record.x_request_id)
    if isinstance(session, Http1Pool):
        await _send_lean(session, target, record, body, headers)
        return
    record.send_ns = clock.now_ns()
    try:
        conn: dict[str, bool] = {}
        try:
            await _post(session, target, record, body, headers, clock, conn)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            if record.first_byte_ns or not conn.get("reused"):
                raise
            # The keep-alive race: the server closed an idle connection as we reused it, before any byte
            # of an answer (aiohttp says "Server disconnected", or "Can not write request body" when the
            # close came while it wrote). Once more on another connection (aiohttp dropped that one), as
            # Http1Pool does.
            await _post(session, target, record, body, headers, clock, {})
    except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as exc:
        _timed_out(record, target, exc)
    except aiohttp.ClientError as exc:
        record.fail(STATUS_ERROR, f"{_phase(record, 'error')}: {type(exc).__name__}: {exc}")
    except LineTooLong as exc:
        record.fail(STATUS_ERROR, f"streaming error: {exc}")
    except (OSError, UnicodeError, ValueError) as exc:  # e.g. a reset below aiohttp, a broken encoding
        record.fail(STATUS_ERROR, f"HTTP error: {type(exc).__name__}: {exc}")


def connection_reuse_trace() -> aiohttp.TraceConfig:
    """A trace config for the session :func:`send` uses: it marks a request whose connection came from the
    pool, the only case :func:`send` retries (a fresh connection that closes may have delivered the request).
    """
    trace = aiohttp.TraceConfig()

    async def reused(_session: Any, ctx: Any, _params: Any) -> None:
        if isinstance(ctx.trace_request_ctx, dict):
            ctx.trace_request_ctx["reused"] = True

    trace.on_connection_reuseconn.append(reused)
    return trace


async def _post(session: aiohttp.ClientSession, target: Target, record: RequestRecord, body: bytes,
                headers: dict[str, str], clock: RunClock, conn: dict[str, bool]) -> None:
    """One POST over aiohttp, read into ``record``; ``conn`` learns whether its connection was reused."""
    wire = record.wire
    async with session.post(target.endpoint, data=body, headers=headers, timeout=target.client_timeout,
                            trace_request_ctx=conn) as resp:
        record.first_byte_ns = clock.now_ns()
        if target.replica_header:
            record.replica_name = resp.headers.get(target.replica_header, "").strip()
        if resp.status != 200:
            text = (await resp.content.read(_ERROR_BODY_LIMIT)).decode("utf-8", errors="replace")
            record.fail(STATUS_ERROR, f"HTTP {resp.status}: {text.strip()}")
            return
        if wire.streaming:
            await _read_stream(resp, record, clock, target.record_itl)
        else:
            await _read_body(resp, record, clock)


async def _send_lean(pool: Http1Pool, target: Target, record: RequestRecord, body: bytes,
                     headers: dict[str, str]) -> None:
    """The same request over :class:`Http1Pool`: parsing runs in the protocol callback, no await per read."""
    sink = _LeanSink(record, target.record_itl, target.replica_header.lower())
    record.send_ns = time.perf_counter_ns()
    try:
        await pool.request("POST", target.path, body, headers, sink, target.timeout_s)
    except asyncio.TimeoutError as exc:  # HttpTimeout included
        _timed_out(record, target, exc)
        return
    except HttpError as exc:
        record.fail(STATUS_ERROR, f"{_phase(record, 'error')}: {type(exc).__name__}: {exc}")
        return
    except LineTooLong as exc:
        record.fail(STATUS_ERROR, f"streaming error: {exc}")
        return
    except (OSError, UnicodeError, ValueError) as exc:
        record.fail(STATUS_ERROR, f"HTTP error: {type(exc).__name__}: {exc}")
        return
    sink.finish()


def _timed_out(record: RequestRecord, target: Target, exc: BaseException) -> None:
    where = _phase(record, "timeout")
    detail = "" if isinstance(exc, HttpTimeout) else str(exc)
    record.fail(STATUS_TIMEOUT, f"{where}: no complete answer within {target.timeout_s:g} s {detail}".strip())


def _phase(record: RequestRecord, what: str) -> str:
    """Where a failure happened, as the reference words it: before the response head, or while reading."""
    if not record.first_byte_ns:
        return f"HTTP {what}"
    return f"streaming {what}" if record.wire.streaming else f"body read {what}"


class StreamState:
    """SSE events of one streaming response → the record. ``feed`` per network read, then ``finish``.

    Per read: split lines, and for each ``data:`` event count it, stamp it with the read's time (taken
    by the caller as the bytes arrived), decode it (orjson) and keep what matters: first content,
    finish reason, usage. Nothing is logged or validated per event.
    """

    __slots__ = ("record", "record_itl", "splitter", "malformed", "first_problem", "saw_done")

    def __init__(self, record: RequestRecord, record_itl: bool) -> None:
        self.record = record
        self.record_itl = record_itl
        self.splitter = LineSplitter()
        self.malformed = 0
        self.first_problem = ""
        self.saw_done = False

    def feed(self, raw: bytes, now: int) -> bool:
        """Take one read's bytes received at ``now``; True once ``data: [DONE]`` arrived."""
        record = self.record
        for line in self.splitter.feed(raw):
            if not line.startswith(b"data:"):
                continue  # blank separators, ``:`` comments, event:/id:/retry: fields
            payload = line[5:]
            if payload.strip() == b"[DONE]":
                self.saw_done = True
                return True
            record.num_chunks += 1
            record.last_chunk_ns = now
            if not record.first_chunk_ns:
                record.first_chunk_ns = now
            if self.record_itl:
                record.chunk_times_ns.append(now)
            if record.first_content_ns and _PLAIN_MARK in payload and _USAGE_MARK not in payload \
                    and _ERROR_MARK not in payload:
                continue  # a middle token event: nothing in it changes the record (no JSON decode)
            try:
                obj = _loads(payload)
            except ValueError:
                try:  # what orjson refuses (e.g. invalid UTF-8) the tolerant path may still read
                    obj = json.loads(payload.decode("utf-8", errors="replace"))
                except ValueError as exc:
                    self.malformed += 1
                    self.first_problem = self.first_problem or \
                        f"malformed JSON in SSE event {record.num_chunks}: {exc}"
                    continue
            if _take_plain_chunk(record, obj, now):
                continue
            info = interpret(obj)  # anything unusual: errors, odd shapes
            if info.error:
                self.first_problem = self.first_problem or info.error
                continue
            if info.has_content and not record.first_content_ns:
                record.first_content_ns = now
            if info.finish_reason:
                record.finish_reason = info.finish_reason
            if info.usage is not None:
                _take_usage(record, info.usage)
        return False

    def finish(self) -> None:
        """The stream ended (or [DONE] came): set the status from what was seen."""
        record = self.record
        if self.first_problem:
            extra = f" ({self.malformed} malformed events)" if self.malformed > 1 else ""
            record.fail(STATUS_ERROR, f"streaming error: {self.first_problem}{extra}")
        elif not self.saw_done and not record.finish_reason:
            # A clean close without [DONE] is fine once a finish_reason came (some servers omit it);
            # before that, the answer was cut short.
            record.fail(STATUS_ERROR, f"streaming error: stream ended before any finish_reason and without "
                                      f"[DONE] after {record.num_chunks} events")
        else:
            record.status = STATUS_OK


def _take_plain_chunk(record: RequestRecord, obj: Any, now: int) -> bool:
    """The usual completions/chat chunk, applied to the record without building a ChunkInfo; False
    (nothing applied) for anything else, which :func:`interpret` then handles."""
    if type(obj) is not dict or "error" in obj:
        return False
    choices = obj.get("choices")
    if choices:
        if type(choices) is not list or type(choices[0]) is not dict:
            return False
        choice = choices[0]
        if not record.first_content_ns and _has_content(choice):
            record.first_content_ns = now
        finish = choice.get("finish_reason")
        if finish:
            record.finish_reason = str(finish)
    usage = obj.get("usage")
    if type(usage) is dict:
        _take_usage(record, usage)
    return True


def _has_content(choice: dict[str, Any]) -> bool:
    if choice.get("text"):
        return True
    for part in (choice.get("delta"), choice.get("message")):
        if type(part) is dict and (part.get("content") or part.get("reasoning_content") or part.get("reasoning")):
            return True
    return False


class _LeanSink:
    """:class:`Http1Pool`'s view of one request: head, body pieces (timed on arrival), done."""

    __slots__ = ("record", "replica_header", "stream", "status", "parts", "size")

    def __init__(self, record: RequestRecord, record_itl: bool, replica_header: str = "") -> None:
        self.record = record
        self.replica_header = replica_header
        self.stream = StreamState(record, record_itl) if record.wire.streaming else None
        self.status = 0
        self.parts: list[bytes] = []  # an error body or a non-streaming body
        self.size = 0

    def head(self, status: int, headers: dict[str, str], now_ns: int) -> None:
        self.status = status
        self.record.first_byte_ns = now_ns
        if self.replica_header:  # the parser lowercases header names
            self.record.replica_name = headers.get(self.replica_header, "").strip()

    def data(self, chunk: bytes, now_ns: int) -> None:
        if self.status == 200 and self.stream is not None:
            self.stream.feed(chunk, now_ns)
            return
        if not self.parts:
            self.record.first_chunk_ns = now_ns
        self.record.last_chunk_ns = now_ns
        if self.status != 200 and self.size >= _ERROR_BODY_LIMIT:
            return
        self.parts.append(chunk)
        self.size += len(chunk)

    def done(self) -> bool:
        if self.status != 200:
            return self.size >= _ERROR_BODY_LIMIT
        return self.stream is not None and self.stream.saw_done

    def finish(self) -> None:
        record = self.record
        if self.status != 200:
            text = b"".join(self.parts)[:_ERROR_BODY_LIMIT].decode("utf-8", errors="replace")
            record.fail(STATUS_ERROR, f"HTTP {self.status}: {text.strip()}")
        elif self.stream is not None:
            self.stream.finish()
        else:
            record.last_chunk_ns = record.last_chunk_ns or time.perf_counter_ns()
            record.first_chunk_ns = record.first_chunk_ns or record.last_chunk_ns
            _take_body(record, b"".join(self.parts))


async def _read_stream(resp: aiohttp.ClientResponse, record: RequestRecord, clock: RunClock,
                       record_itl: bool) -> None:
    state = StreamState(record, record_itl)
    async for raw in resp.content.iter_any():
        if state.feed(raw, clock.now_ns()):
            break
    if state.saw_done:
        await _drain_after_done(resp)
    state.finish()


async def _drain_after_done(resp: aiohttp.ClientResponse) -> None:
    """Read the stream's tail so aiohttp can reuse the connection; never wait long for it."""
    if resp.content.at_eof():
        return  # the usual case: [DONE] and the end of the body came in one read
    try:
        await asyncio.wait_for(resp.content.read(), timeout=_DRAIN_TIMEOUT_S)
    except (asyncio.TimeoutError, aiohttp.ClientError, OSError):
        pass  # the connection is then closed on release instead of reused: harmless


async def _read_body(resp: aiohttp.ClientResponse, record: RequestRecord, clock: RunClock) -> None:
    parts: list[bytes] = []
    async for raw in resp.content.iter_any():
        if not parts:
            record.first_chunk_ns = clock.now_ns()
        parts.append(raw)
    record.last_chunk_ns = clock.now_ns()
    record.first_chunk_ns = record.first_chunk_ns or record.last_chunk_ns
    _take_body(record, b"".join(parts))


def _take_body(record: RequestRecord, raw: bytes) -> None:
    """A non-streaming answer's JSON body → the record."""
    record.num_chunks = 1
    try:
        info = interpret(json.loads(raw))
    except ValueError as exc:
        record.fail(STATUS_ERROR, f"JSON parse error: {exc}")
        return
    if info.error:
        record.fail(STATUS_ERROR, info.error)
        return
    if info.has_content:
        record.first_content_ns = record.first_chunk_ns
    record.finish_reason = info.finish_reason
    if info.usage is not None:
        _take_usage(record, info.usage)
    record.status = STATUS_OK


def _take_usage(record: RequestRecord, usage: dict[str, Any]) -> None:
    prompt, completion, cached = usage_numbers(usage)
    record.server_input_tokens = prompt or record.server_input_tokens
    record.output_tokens = completion
    if cached >= 0:
        record.cached_tokens = cached
    metrics = usage.get("metrics")
    if isinstance(metrics, dict):
        record.server_metrics = {k: float(v) for k, v in metrics.items()
                                 if isinstance(v, (int, float)) and not isinstance(v, bool)}
