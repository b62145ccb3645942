"""The SSE client and the dispatcher against a real aiohttp server on 127.0.0.1 that misbehaves on cue.

The server picks its behaviour from the prompt's first word, so one server covers every fault.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from blis_sim.observe.client import Target, send
from blis_sim.observe.dispatch import Dispatcher, ListSource
from blis_sim.observe.http1 import Http1Pool
from blis_sim.observe.records import RequestRecord, RunClock, WireRequest
from blis_sim.observe.sse import LineSplitter, classify, interpret, usage_numbers


SEEN = web.AppKey("seen", list)


def _chunk(text: str, finish: str | None = None) -> bytes:
    obj = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _usage(prompt: int, completion: int, cached: int | None) -> bytes:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
        usage["metrics"] = {"time_to_first_token_ms": 7.5, "queue_time_ms": 1.25, "note": "x"}
    return b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"


async def _handler(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    prompt = body.get("prompt") or body["messages"][0]["content"]
    mode = prompt.split()[0]
    request.app[SEEN].append((body, request.headers.copy()))
    if mode == "http500":
        return web.Response(status=500, text="engine dead")
    if mode == "slowhead":
        await asyncio.sleep(5)
    if not body.get("stream"):
        if mode == "garbage":
            return web.Response(text="<html>not json</html>")
        return web.json_response({"choices": [{"text": "hi", "finish_reason": "length"}],
                                  "usage": {"prompt_tokens": 7, "completion_tokens": 2}})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if "messages" in body:  # chat: the role-only chunk first, like vLLM
        await resp.write(b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n')
        await asyncio.sleep(0.3)
        await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}\n\n')
    elif mode == "garbage":
        await resp.write(b"data: {not json\n\n")
    elif mode == "errorevent":
        await resp.write(b'data: {"error": {"message": "boom", "code": 500}}\n\n')
    elif mode == "endless":  # one line that never ends
        for _ in range(100):
            await resp.write(b"x" * (1 << 20))
        return resp
    elif mode == "truncated":
        await resp.write(_chunk("a"))
        return resp
    elif mode == "stall":
        await resp.write(_chunk("a"))
        await asyncio.sleep(5)
    elif mode == "drop":
        await resp.write(_chunk("a"))
        assert request.transport is not None
        request.transport.close()  # reset mid-stream
        return resp
    elif mode == "splitcrlf":  # events split at awkward places, CRLF framing, comments
        raw = b": keep-alive\r\n\r\n" + _chunk("a").replace(b"\n", b"\r\n") + _chunk("b", "length")
        for i in range(0, len(raw), 7):
            await resp.write(raw[i:i + 7])
            await asyncio.sleep(0)
    else:
        await asyncio.sleep(0.01)
        await resp.write(_chunk("a"))
        await asyncio.sleep(0.005)
        await resp.write(_chunk("b", "length"))
    if mode != "nodone":
        await resp.write(_usage(11, 2, 4 if mode == "cached" else None))
        await resp.write(b"data: [DONE]\n\n")
    else:
        await resp.write(_usage(11, 2, None))
    return resp


@contextlib.asynccontextmanager
async def fake_server() -> AsyncIterator[tuple[str, web.Application]]:
    app = web.Application()
    app[SEEN] = []
    app.router.add_post("/v1/completions", _handler)
    app.router.add_post("/v1/chat/completions", _handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        await runner.cleanup()


def in_loop(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test body (taking ``server``) inside a fresh event loop with the fake server up."""
    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        async def body() -> None:
            async with fake_server() as server:
                await test(server, *args, **kwargs)
        asyncio.run(body())
    wrapper.__signature__ = inspect.signature(test).replace(  # type: ignore[attr-defined]
        parameters=list(inspect.signature(test).parameters.values())[1:])
    return wrapper


def _wire(mode: str, streaming: bool = True, arrival_us: int = 0) -> WireRequest:
    return WireRequest(prompt=f"{mode} words here", max_tokens=2, streaming=streaming, arrival_us=arrival_us,
                       input_tokens=3, min_tokens=2, tenant_id="t1", slo_class="standard", priority=1)


async def _one(url: str, mode: str, *, streaming: bool = True, api_format: str = "completions",
               timeout_s: float = 2.0, lean: bool = False) -> RequestRecord:
    """One request, over observe's lean HTTP/1.1 pool (``lean``) or an aiohttp session."""
    target = Target(url, "m", api_format=api_format, api_key="sekret", timeout_s=timeout_s)
    record = RequestRecord(request_id=0, wire=_wire(mode, streaming))
    async with _sender(url, lean) as sender:
        await send(sender, target, record, RunClock())
    return record


@contextlib.asynccontextmanager
async def _sender(url: str, lean: bool) -> AsyncIterator[aiohttp.ClientSession | Http1Pool]:
    if lean:
        pool = Http1Pool(url)
        try:
            yield pool
        finally:
            await pool.close()
    else:
        async with aiohttp.ClientSession() as session:
            yield session


LEAN = pytest.mark.parametrize("lean", [True, False], ids=["http1pool", "aiohttp"])


def test_line_splitter_handles_split_crlf_and_cr() -> None:
    s = LineSplitter()
    out = s.feed(b"data: a\r") + s.feed(b"\ndata: b\n") + s.feed(b"\rdata: c") + s.flush()
    assert out == [b"data: a", b"data: b", b"", b"data: c"]
    assert classify(b"data:[DONE]") == ("done", "")
    assert classify(b": comment") == ("skip", "")
    assert classify(b"data:{}") == ("data", "{}")


def test_interpret_and_usage() -> None:
    info = interpret({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    assert not info.has_content
    assert interpret({"choices": [{"delta": {"reasoning_content": "hm"}}]}).has_content
    assert interpret({"error": {"message": "x"}}).error == "server error event: x"
    assert usage_numbers({"prompt_tokens": 5, "completion_tokens": 3,
                          "prompt_tokens_details": {"cached_tokens": 2}}) == (5, 3, 2)
    assert usage_numbers({"prompt_tokens": 5, "prompt_tokens_details": None}) == (5, 0, -1)


@LEAN
@in_loop
async def test_streaming_ok_records_every_timestamp_and_wire_details(server: Any, lean: bool) -> None:
    url, app = server
    r = await _one(url, "cached", lean=lean)
    assert r.status == "ok", r.error_message
    assert (r.num_chunks, r.output_tokens, r.server_input_tokens, r.cached_tokens) == (3, 2, 11, 4)
    assert r.server_ttft_ms() == 8.75  # usage.metrics: queue + first token (non-numbers ignored)
    assert r.finish_reason == "length"
    assert r.send_ns < r.first_byte_ns <= r.first_chunk_ns == r.first_content_ns < r.last_chunk_ns
    body, headers = app[SEEN][0]
    assert body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["min_tokens"], body["priority"], body["model"]) == (2, 2, 1, "m")
    assert headers["Authorization"] == "Bearer sekret"
    assert headers["x-request-id"] == r.x_request_id
    assert headers["x-gateway-inference-fairness-id"] == "t1"


@LEAN
@in_loop
async def test_chat_role_chunk_is_first_chunk_but_not_first_content(server: Any, lean: bool) -> None:
    url, app = server
    r = await _one(url, "hello", api_format="chat", lean=lean)
    assert r.status == "ok"
    assert r.first_content_ns - r.first_chunk_ns >= 100_000_000  # the server left 300 ms between them
    assert "messages" in app[SEEN][0][0]


@LEAN
@in_loop
async def test_non_streaming(server: Any, lean: bool) -> None:
    url, app = server
    r = await _one(url, "plain", streaming=False, lean=lean)
    assert (r.status, r.num_chunks, r.output_tokens, r.server_input_tokens) == ("ok", 1, 2, 7)
    assert "stream_options" not in app[SEEN][0][0]
    assert r.first_chunk_ns and r.last_chunk_ns >= r.first_chunk_ns


@LEAN
@in_loop
async def test_missing_done_after_finish_reason_is_ok(server: Any, lean: bool) -> None:
    url, _ = server
    r = await _one(url, "nodone", lean=lean)
    assert (r.status, r.output_tokens, r.finish_reason) == ("ok", 2, "length")


@LEAN
@in_loop
async def test_split_events_crlf_and_comments(server: Any, lean: bool) -> None:
    url, _ = server
    r = await _one(url, "splitcrlf", lean=lean)
    assert (r.status, r.num_chunks, r.finish_reason) == ("ok", 3, "length"), r.error_message


@pytest.mark.parametrize("mode,streaming,status,message", [
    ("http500", True, "error", "HTTP 500: engine dead"),
    ("garbage", True, "error", "streaming error: malformed JSON"),
    ("garbage", False, "error", "JSON parse error"),
    ("errorevent", True, "error", "streaming error: server error event: boom"),
    ("truncated", True, "error", "streaming error: stream ended before any finish_reason"),
    ("endless", True, "error", "streaming error: an SSE line longer than"),
    ("drop", True, "error", "streaming error"),
    ("stall", True, "timeout", "streaming timeout"),
    ("slowhead", True, "timeout", "HTTP timeout"),
])
@LEAN
@in_loop
async def test_server_faults_are_recorded_not_raised(server: Any, mode: str, streaming: bool, status: str,
                                                    message: str, lean: bool) -> None:
    url, _ = server
    # Only the timeout cases need a short timeout; the others get slack for a loaded CI machine.
    r = await _one(url, mode, streaming=streaming, timeout_s=0.5 if status == "timeout" else 10.0, lean=lean)
    assert r.status == status
    assert r.error_message.startswith(message), r.error_message
    if mode == "stall":
        assert r.first_chunk_ns and r.num_chunks == 1  # the partial timings are kept


@LEAN
def test_unreachable_server_is_an_error_record(lean: bool) -> None:
    r = asyncio.run(_one("http://127.0.0.1:9", "x", timeout_s=1.0, lean=lean))
    assert r.status == "error" and r.error_message.startswith("HTTP error")


@LEAN
@in_loop
async def test_dispatcher_schedule_concurrency_warmup_and_ids(server: Any, lean: bool) -> None:
    url, app = server
    planned = [_wire("ok", arrival_us=i * 2000) for i in range(20)]
    clock = RunClock()
    async with _sender(url, lean) as session:
        d = Dispatcher(session, Target(url, "m"), clock, max_concurrency=4, warmup_requests=3)
        records = await d.run_phase(ListSource(planned), build=lambda p, off: p)
    assert [r.request_id for r in records] == list(range(20))
    assert [r.warmup for r in records] == [True] * 3 + [False] * 17
    assert all(r.status == "ok" for r in records)
    assert all(r.send_ns >= r.scheduled_ns for r in records)
    # Never more than 4 in flight: sort sends and ends, sweep.
    events = sorted([(r.send_ns, 1) for r in records] + [(r.last_chunk_ns, -1) for r in records])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    assert peak <= 4
    assert not d.interrupted


@LEAN
@in_loop
async def test_stop_cancels_in_flight_after_grace_and_keeps_records(server: Any, lean: bool) -> None:
    url, _ = server
    planned = [_wire("stall", arrival_us=0), _wire("ok", arrival_us=0), _wire("ok", arrival_us=10_000_000)]
    stop = asyncio.Event()
    async with _sender(url, lean) as session:
        d = Dispatcher(session, Target(url, "m", timeout_s=30), RunClock(), stop=stop, grace_s=0.5)
        loop = asyncio.get_running_loop()
        loop.call_later(1.0, stop.set)  # the "ok" request has long finished; "stall" is still in flight
        records = await d.run_phase(ListSource(planned), build=lambda p, off: p)
    assert d.interrupted
    assert len(records) == 2  # the third was never sent
    by_mode = {r.wire.prompt.split()[0]: r for r in records}
    assert by_mode["ok"].status == "ok"
    assert by_mode["stall"].status == "error"
    assert by_mode["stall"].error_message == "cancelled: observe interrupted"
    assert by_mode["stall"].first_chunk_ns  # partial timings kept


@in_loop
async def test_follow_ups_released_on_completion(server: Any) -> None:
    """A closed-loop source: each completion releases the next request after a think time."""
    url, _ = server

    class Loop:
        def __init__(self) -> None:
            self.sent = 0

        def initial(self) -> list[WireRequest]:
            return [_wire("ok", arrival_us=0)]

        def on_complete(self, planned: WireRequest, record: RequestRecord, now_us: int) -> list[WireRequest]:
            self.sent += 1
            return [_wire("ok", arrival_us=now_us + 5000)] if self.sent < 5 else []

    async with aiohttp.ClientSession() as session:
        d = Dispatcher(session, Target(url, "m"), RunClock())
        records = await d.run_phase(Loop(), build=lambda p, off: p)
    assert len(records) == 5
    for prev, nxt in zip(records, records[1:]):
        assert nxt.send_ns - prev.last_chunk_ns >= 5_000_000  # think time respected


@LEAN
@in_loop
async def test_abort_cuts_the_grace_period_short(server: Any, lean: bool) -> None:
    url, _ = server
    stop = asyncio.Event()
    async with _sender(url, lean) as session:
        d = Dispatcher(session, Target(url, "m", timeout_s=30), RunClock(), stop=stop, grace_s=60)
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, stop.set)
        loop.call_later(0.4, d.abort.set)
        t0 = loop.time()
        records = await d.run_phase(ListSource([_wire("stall")]), build=lambda p, off: p)
        assert loop.time() - t0 < 10  # not the 60 s grace
    assert [r.error_message for r in records] == ["cancelled: observe interrupted"]


def test_line_splitter_any_chunking_gives_the_same_lines() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    lines = st.lists(st.text(alphabet="ab:{} \"", max_size=12), min_size=1, max_size=8)

    @settings(max_examples=200, deadline=None)
    @given(lines, st.sampled_from(["\n", "\r\n", "\r"]), st.lists(st.integers(1, 9), min_size=1, max_size=30))
    def check(content: list[str], eol: str, cuts: list[int]) -> None:
        raw = "".join(line + eol for line in content).encode()
        splitter = LineSplitter()
        out: list[bytes] = []
        pos = 0
        for size in cuts + [len(raw)]:
            out += splitter.feed(raw[pos:pos + size])
            pos += size
        out += splitter.flush()
        assert out == [line.encode() for line in content]

    check()


def test_stream_state_decodes_only_events_that_can_change_the_record() -> None:
    """Middle token events (after the first content, no finish reason/usage/error) are counted and
    timed but not decoded; the events that carry something still are, whatever their position."""
    from blis_sim.observe.client import StreamState

    record = RequestRecord(request_id=0, wire=_wire("x"))
    state = StreamState(record, record_itl=True)
    events = [b'data: {"choices":[{"index":0,"text":" a","finish_reason":null}]}\n\n',
              b'data: {"choices":[{"index":0,"text":" b","finish_reason":null}]}\n\n',
              b'data: {"error": {"message": "late failure"}, "finish_reason":null}\n\n',
              b'data: {"choices":[{"index":0,"text":" c","finish_reason":"length"}]}\n\n',
              b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3}}\n\n']
    for t, raw in enumerate(events, start=1):
        assert not state.feed(raw, t * 1000)
    assert state.feed(b"data: [DONE]\n\n", 9000)
    state.finish()
    assert (record.first_content_ns, record.last_chunk_ns, record.num_chunks) == (1000, 5000, 5)
    assert record.chunk_times_ns == [1000, 2000, 3000, 4000, 5000]
    assert (record.finish_reason, record.output_tokens, record.server_input_tokens) == ("length", 3, 3)
    assert record.status == "error" and "late failure" in record.error_message


@pytest.mark.parametrize("obj", [
    {"choices": [{"index": 0, "text": "a", "finish_reason": None}]},
    {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
    {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
    {"choices": [{"delta": {"reasoning_content": "hm"}, "finish_reason": None}]},
    {"choices": [{"message": {"content": "x"}, "finish_reason": "length"}], "usage": {"prompt_tokens": 4}},
    {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                              "prompt_tokens_details": {"cached_tokens": 3}, "metrics": {"queue_time_ms": 1}}},
    {"choices": [], "usage": None},
    {"choices": {"not": "a list"}},
    {"choices": ["not a dict"]},
    {"error": {"message": "boom"}},
    {"error": "x", "choices": [{"text": "t"}]},
    ["not", "an", "object"],
])
def test_plain_chunk_fast_path_matches_interpret(obj: Any) -> None:
    """The fast path of StreamState applies exactly what interpret() would, or declines."""
    from blis_sim.observe.client import StreamState

    def run(fast: bool) -> tuple[Any, ...]:
        record = RequestRecord(request_id=0, wire=_wire("x"))
        state = StreamState(record, record_itl=False)
        raw = b"data: " + json.dumps(obj).encode() + b"\n\n"
        if not fast:
            import blis_sim.observe.client as client
            original = client._take_plain_chunk
            client._take_plain_chunk = lambda *a: False  # type: ignore[assignment]
            try:
                state.feed(raw, 7)
            finally:
                client._take_plain_chunk = original
        else:
            state.feed(raw, 7)
        return (record.first_content_ns, record.finish_reason, record.output_tokens, record.server_input_tokens,
                record.cached_tokens, record.server_metrics, state.first_problem)

    assert run(True) == run(False)


def test_request_ids_are_version_4_uuids() -> None:
    import uuid

    from blis_sim.observe.client import new_request_id

    ids = [new_request_id() for _ in range(200)]
    assert len(set(ids)) == 200
    for text in ids:
        parsed = uuid.UUID(text)
        assert (str(parsed), parsed.version, parsed.variant) == (text, 4, uuid.RFC_4122)
