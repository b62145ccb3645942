"""Abuse of the emulator's HTTP server (issue 14), shared by tests/test_emulator_abuse.py and
benchmarks/bench_emulator_abuse.py.

:func:`abuse` holds ``connections`` idle or half-open connections (no bytes, a partial head, a head with a
partial body), sends ``fuzzed`` malformed requests (seeded: random bytes, bad request lines, headers without a
colon, bad or huge Content-Length, bad chunk sizes, heads over 64 KiB, HTTP/2 prefaces, pipelined requests, bad
JSON and wrong types to ``/v1/completions``) and ``valid`` well-formed completions, while probing ``/health``
on its own keep-alive connection every ``probe_every_s``. It returns the probe latencies and what every
completion got, so a caller can check the server's counters against it.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class AbuseResult:
    health_ms: list[float] = field(default_factory=list)  # each /health probe, request to full response
    health_failures: int = 0
    # status class ("2xx", "4xx", ...) of every /v1/completions answer the client read in full
    completions: Counter[str] = field(default_factory=Counter)
    valid_ok: int = 0
    fuzz_answered: int = 0
    fuzz_unanswered: int = 0  # dropped without a status line (allowed for garbage; counted)
    held: int = 0


def _completion(body: bytes, *, extra: bytes = b"") -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


def fuzz_request(rnd: random.Random) -> tuple[bytes, bool]:
    """One malformed request; True when it is a complete request to /v1/completions (it will be counted)."""
    kind = rnd.randrange(14)
    if kind == 0:
        return bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 2000))), False
    if kind == 1:
        return b"GARBAGE\r\n\r\n", False
    if kind == 2:
        return b"GET /health HTTP/1.1\r\nNoColonHere\r\n\r\n", False
    if kind == 3:
        return b"POST /v1/completions HTTP/1.1\r\nContent-Length: " + rnd.choice(
            [b"-1", b"abc", b"99999999999999999999", b"1_0", b"+5"]) + b"\r\n\r\n{}", False
    if kind == 4:
        size = rnd.choice([b"zz", b"-2", b"-6", b"0x2", b"+2", b"2_0", b"fffffffffffffffffff"])
        return b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\n{}\r\n0\r\n\r\n", \
            False
    if kind == 5:
        return b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * (100 * 1024) + b"\r\n\r\n", False
    if kind == 6:
        return b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", False
    if kind == 7:
        return b"GET /health HTTP/1.1\r\n\r\nGET /nope HTTP/1.1\r\n\r\nGET /health HTTP/1.1\r\n\r\n", False
    if kind == 8:
        return _completion(b"{not json"), True
    if kind == 9:
        return _completion(b"\xff\xfe\x00garbage"), True
    if kind == 10:
        body = {"prompt": rnd.choice([5, None, [], [-1], "x" * 10, {"a": 1}]),
                "max_tokens": rnd.choice(["x", -1, 0, 10**30, 1.5, None, True])}
        return _completion(json.dumps(body).encode()), True
    if kind == 11:
        return _completion(json.dumps({"prompt": "a b", "max_tokens": 1, "n": rnd.choice([0, -3, 10**9])}).encode()), True
    if kind == 12:
        return b"GET /../../etc/passwd HTTP/1.1\r\n\r\n", False
    return b"DELETE /v1/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n", False


async def _read_response(reader: asyncio.StreamReader, timeout_s: float) -> int | None:
    """The status of one response, read in full (Content-Length or chunked), or None if none came."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
    if "chunked" in headers.get("transfer-encoding", ""):
        while True:
            size = int((await asyncio.wait_for(reader.readline(), timeout_s)).split(b";")[0], 16)
            await asyncio.wait_for(reader.readexactly(size + 2), timeout_s)
            if size == 0:
                break
    else:
        await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), timeout_s)
    return status


async def _one(host: str, port: int, data: bytes, timeout_s: float) -> int | None:
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
    try:
        writer.write(data)
        await writer.drain()
        return await _read_response(reader, timeout_s)
    except ConnectionError:
        return None
    finally:
        writer.close()


async def _hold(host: str, port: int, i: int, opened: list[asyncio.StreamWriter]) -> None:
    _, writer = await asyncio.open_connection(host, port)
    partial = [b"", b"GET /heal", b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"prompt\""][i % 3]
    if partial:
        writer.write(partial)
    opened.append(writer)


async def abuse(url: str, *, connections: int = 1000, fuzzed: int = 200, valid: int = 40, seed: int = 0,
                probe_every_s: float = 0.02, timeout_s: float = 10.0) -> AbuseResult:
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    res = AbuseResult()
    rnd = random.Random(seed)
    stop = asyncio.Event()

    async def probe() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                status = await _read_response(reader, timeout_s)
                if status == 200:
                    res.health_ms.append((time.perf_counter() - t0) * 1e3)
                else:
                    res.health_failures += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
                await asyncio.sleep(probe_every_s)
        finally:
            writer.close()

    async def fuzz_one(data: bytes, counted: bool) -> None:
        status = await _one(host, port, data, timeout_s)
        if status is None:
            res.fuzz_unanswered += 1
            return
        res.fuzz_answered += 1
        if counted:
            res.completions[f"{status // 100}xx"] += 1

    async def valid_one(i: int) -> None:
        body = json.dumps({"prompt": f"shared prefix words {i % 4} and more", "max_tokens": 2}).encode()
        status = await _one(host, port, _completion(body), timeout_s)
        if status is not None:
            res.completions[f"{status // 100}xx"] += 1
            res.valid_ok += status == 200

    prober = asyncio.create_task(probe())
    opened: list[asyncio.StreamWriter] = []
    try:
        await asyncio.sleep(0.2)
        # the held connections open in waves while fuzzed and valid requests go on
        batches = [asyncio.gather(*(_hold(host, port, i, opened) for i in range(s, min(s + 100, connections))))
                   for s in range(0, connections, 100)]
        work = [fuzz_one(*fuzz_request(rnd)) for _ in range(fuzzed)] + [valid_one(i) for i in range(valid)]
        rnd.shuffle(work)
        sem = asyncio.Semaphore(50)

        async def limited(coro: object) -> None:
            async with sem:
                await coro  # type: ignore[misc]

        await asyncio.gather(*batches, *(limited(w) for w in work))
        res.held = len(opened)
        await asyncio.sleep(0.5)  # every connection still held: /health keeps being probed
    finally:
        stop.set()
        await prober
        for w in opened:
            w.close()
    return res
