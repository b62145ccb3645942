"""Server-sent-events framing and OpenAI chunk interpretation, free of I/O.

API::

    lines = LineSplitter()
    for line in lines.feed(raw_bytes): ...       # complete lines, any of \\n, \\r\\n, \\r
    lines.flush()                                 # the unterminated tail at end of stream
    kind, payload = classify(line)                # ("data", str) | ("done", "") | ("skip", "")
    info = interpret(obj)                         # ChunkInfo(content, finish_reason, usage, error)

Framing follows the SSE spec as vLLM uses it (docs/vllm-semantics.md §5): ``data:`` with or without the
space, comment lines (``:``, keep-alives) and other fields ignored, ``data: [DONE]`` ends the stream.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DONE = "[DONE]"


MAX_LINE_BYTES = 8 << 20  # a longer unterminated line is garbage, not an SSE event


class LineTooLong(ValueError):
    pass


class LineSplitter:
    """Incremental byte → line splitter that tolerates lines split across network reads."""

    __slots__ = ("_parts", "_size", "_pending_cr")

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # the unterminated tail, kept as received (no quadratic joins)
        self._size = 0
        self._pending_cr = False

    def feed(self, data: bytes) -> list[bytes]:
        if self._pending_cr and data.startswith(b"\n"):
            data = data[1:]  # the \n of a \r\n split across two reads
        self._pending_cr = False
        if b"\n" not in data and b"\r" not in data:
            self._parts.append(data)
            self._size += len(data)
            if self._size > MAX_LINE_BYTES:
                raise LineTooLong(f"an SSE line longer than {MAX_LINE_BYTES} bytes without a line end")
            return []
        self._parts.append(data)
        buf = b"".join(self._parts)
        if b"\r" in buf:
            self._pending_cr = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        tail = lines.pop()
        self._parts = [tail] if tail else []
        self._size = len(tail)
        return lines

    def flush(self) -> list[bytes]:
        tail = b"".join(self._parts)
        self._parts, self._size = [], 0
        return [tail] if tail else []


def classify(line: bytes) -> tuple[str, str]:
    """``("data", payload)``, ``("done", "")`` for the terminator, or ``("skip", "")``."""
    if not line.startswith(b"data:"):
        return "skip", ""  # blank separators, ``:`` comments, event:/id:/retry: fields
    payload = line[5:]
    if payload.startswith(b" "):
        payload = payload[1:]
    text = payload.decode("utf-8", errors="replace").strip()
    if text == DONE:
        return "done", ""
    return "data", text


@dataclass(frozen=True)
class ChunkInfo:
    has_content: bool
    finish_reason: str
    usage: dict[str, Any] | None
    error: str


def interpret(obj: Any) -> ChunkInfo:
    """What one decoded completions/chat chunk (or non-streaming body) tells us."""
    if not isinstance(obj, dict):
        return ChunkInfo(False, "", None, f"expected a JSON object, got {type(obj).__name__}")
    if "error" in obj and not obj.get("choices"):
        err = obj["error"]
        message = err.get("message", err) if isinstance(err, dict) else err
        return ChunkInfo(False, "", None, f"server error event: {message}")
    has_content = False
    finish = ""
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        finish = choice.get("finish_reason") or ""
        if choice.get("text"):
            has_content = True
        for part in (choice.get("delta"), choice.get("message")):
            if isinstance(part, dict) and (part.get("content") or part.get("reasoning_content")
                                           or part.get("reasoning")):
                has_content = True
    usage = obj.get("usage")
    return ChunkInfo(has_content, str(finish), usage if isinstance(usage, dict) else None, "")


def usage_numbers(usage: dict[str, Any]) -> tuple[int, int, int]:
    """(prompt_tokens, completion_tokens, cached_tokens or -1) from an OpenAI usage object."""
    def as_int(value: Any, default: int) -> int:
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

    details = usage.get("prompt_tokens_details")
    cached = as_int(details.get("cached_tokens"), -1) if isinstance(details, dict) else -1
    return as_int(usage.get("prompt_tokens"), 0), as_int(usage.get("completion_tokens"), 0), cached
