"""Strict JSON reading shared by every JSON input (SimResult, MetricsOutput, calibration report, coefficient
and model-config files): duplicate keys and NaN/Infinity rejected, every error a one-line
:class:`FormatError` naming the file and the line (and the field of a duplicate key).

API::

    data = load_json("sim.json")                 # -> Any
    data = parse_json(text, "sim.json")
    lines, dup = json_lines(text)                # line of every key/item by path; first duplicate key
    json_path((3, "ttft_us"))                    # -> "[3].ttft_us"
    located(validation_error, (3,), text, file)  # -> FormatError("sim.json:28: field '[3].ttft_us': ...")
    for item in stream_array("sim.json"): ...    # a file-long array's items, a block of text at a time
    stream_object("simagg.json", skip="requests")  # the object without that (big) array, never held whole
    # both raise NotStreamable on text they do not take as it is: read the whole file then, for its error
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from blis_sim.errors import FormatError
from blis_sim.formats._strict import describe, read_text

_CONSTANTS = ("NaN", "Infinity", "-Infinity")


class _Rejected(ValueError):
    """A duplicate key or a NaN/Infinity constant (json's own errors are JSONDecodeError)."""


def _reject_constant(name: str) -> Any:
    raise _Rejected(f"{name} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # one object in millions: look for which key only then
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _Rejected(f"duplicate key '{k}'")
            seen.add(k)
    return out


def parse_json(text: str, file: str) -> Any:
    """Parse ``text`` strictly; errors name ``file`` and the line."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise FormatError(f"invalid JSON: {exc.msg} (column {exc.colno})", file=file, line=exc.lineno) from None
    except _Rejected as exc:
        _, dup = json_lines(text)
        if dup is not None:
            raise FormatError(f"invalid JSON: {exc}", file=file, line=dup[1], field=json_path(dup[0]) or None) \
                from None
        raise FormatError(f"invalid JSON: {exc}", file=file, line=_constant_line(text)) from None
    except RecursionError:
        raise FormatError("invalid JSON: nested too deeply", file=file) from None


def load_json(path: str | Path) -> Any:
    """Strict JSON: duplicate keys and NaN/Infinity rejected; errors name file and line."""
    return parse_json(read_text(path), str(path))


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')


def _constant_line(text: str) -> int | None:
    """Line of the first NaN/Infinity token outside a string."""
    for m in _TOKEN.finditer(text):
        if m.group() in _CONSTANTS:
            return text.count("\n", 0, m.start()) + 1
    return None


def _key(token: str) -> Any:
    """A key token's text; the raw token when it does not decode (the parse failed elsewhere already)."""
    try:
        return json.loads(token, strict=False)
    except ValueError:
        return token


def json_lines(text: str) -> tuple[dict[tuple[Any, ...], int], tuple[tuple[Any, ...], int] | None]:
    """The line of every key and array item by path, and the first duplicate key (path, line) if any.

    Only run when a file failed to load (it is a slow pure-Python tokenizer). It never raises: on text
    that is not valid JSON its answer is a best effort.
    """
    lines: dict[tuple[Any, ...], int] = {}
    stack: list[list[Any]] = []  # [kind, current key/index, seen keys, expecting_key]
    line, last = 1, 0
    dup: tuple[tuple[Any, ...], int] | None = None
    for m in _TOKEN.finditer(text):
        line += text.count("\n", last, m.start())
        last = m.start()
        tok = m.group()
        top = stack[-1] if stack else None
        if tok in ",:":
            if tok == "," and top is not None:
                if top[0] == "arr":
                    top[1] += 1
                else:
                    top[3] = True
            continue
        if tok in "}]":
            if stack:
                stack.pop()
            continue
        if top is not None and top[0] == "obj" and top[3]:  # a key
            key = _key(tok)
            top[1], top[3] = key, False
            path = tuple(c[1] for c in stack)
            if key in top[2] and dup is None:
                dup = (path, line)
            top[2].add(key)
            lines.setdefault(path, line)
            continue
        if top is not None and top[0] == "arr":
            lines.setdefault(tuple(c[1] for c in stack), line)
        if tok == "{":
            stack.append(["obj", None, set(), True])
        elif tok == "[":
            stack.append(["arr", 0, None, False])
    return lines, dup


def json_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def located(exc: ValidationError, prefix: tuple[Any, ...], text: str, file: str) -> FormatError:
    """A pydantic error at ``prefix`` + its location as a FormatError naming the JSON file's line."""
    loc = prefix + tuple(p for p in exc.errors()[0]["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    lines, _ = json_lines(text)
    line = None
    for n in range(len(loc), -1, -1):  # the field, or its nearest ancestor
        line = lines.get(loc[:n])
        if line is not None:
            break
    return FormatError(describe(exc, file=file).reason, file=file, line=line, field=json_path(loc) or None)


class NotStreamable(Exception):
    """The streaming reader met text it does not take as it is (invalid JSON, a duplicate top-level
    key, bytes that are not UTF-8...): the caller reads the whole file instead, which reports it."""


_WS = " \t\n\r"
_STREAM_CHARS = 1 << 22  # characters read at a time


class _Stream:
    """A UTF-8 file read a block at a time; ``buf[pos:]`` is the text not consumed yet."""

    def __init__(self, path: str | Path) -> None:
        try:
            self.f = open(path, encoding="utf-8")  # noqa: SIM115 (closed by close())
        except OSError:  # missing, a directory, unreadable: read_text names it
            raise NotStreamable from None
        self.buf, self.pos, self.eof = "", 0, False
        self.decoder = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)

    def close(self) -> None:
        self.f.close()

    def _more(self) -> bool:
        if self.eof:
            return False
        try:
            block = self.f.read(_STREAM_CHARS)
        except (UnicodeDecodeError, OSError):
            raise NotStreamable from None
        if not block:
            self.eof = True
            return False
        self.buf = self.buf[self.pos:] + block
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next character after whitespace ("" at the end of the file)."""
        while True:
            buf, pos = self.buf, self.pos
            while pos < len(buf) and buf[pos] in _WS:
                pos += 1
            self.pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self._more():
                return ""

    def expect(self, chars: str) -> str:
        c = self.peek()
        if not c or c not in chars:
            raise NotStreamable
        self.pos += 1
        return c

    def value(self) -> Any:
        """The next JSON value. A value that ends where the text read so far ends might go on
        (a number cut by the block boundary): more is read before it is taken."""
        self.peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except (_Rejected, RecursionError):
                raise NotStreamable from None
            except json.JSONDecodeError:
                if self._more():  # the value may go on past the text read so far
                    continue
                raise NotStreamable from None
            if end == len(self.buf) and self._more():
                continue
            self.pos = end
            return value

    def items(self) -> list[Any]:
        """The complete array items in the text read so far that end in ``},``, decoded at once
        (each one's trailing comma consumed); [] when there are none. The cut is right: cut inside
        a nested value or a string, the wrapped text does not decode (unbalanced brackets, an
        unterminated string), and the items are taken one at a time instead."""
        self.peek()
        cut = self.buf.rfind("},", self.pos)
        if cut < 0:
            return []
        try:
            block = json.loads("[" + self.buf[self.pos:cut + 1] + "]", object_pairs_hook=_no_duplicates,
                               parse_constant=_reject_constant)
        except (json.JSONDecodeError, _Rejected, RecursionError):
            return []
        self.pos = cut + 2
        return list(block)

    def end(self) -> None:
        if self.peek():
            raise NotStreamable


def stream_array(path: str | Path) -> Iterator[list[Any]]:
    """The items of the JSON array that is the whole file, a block of them at a time, strict as
    :func:`parse_json`; raises :class:`NotStreamable` where the file is not such an array."""
    s = _Stream(path)
    try:
        s.expect("[")
        if s.peek() == "]":
            s.pos += 1
        else:
            while True:
                block = s.items()
                if block:
                    yield block
                else:
                    yield [s.value()]
                    if s.expect(",]") == "]":
                        break
        s.end()
    finally:
        s.close()


def stream_object(path: str | Path, skip: str) -> dict[str, Any]:
    """The JSON object that is the whole file, strict as :func:`parse_json`, without the array
    under key ``skip`` (its items are read one at a time and dropped, never held together)."""
    s = _Stream(path)
    out: dict[str, Any] = {}
    try:
        s.expect("{")
        if s.peek() == "}":
            s.pos += 1
            s.end()
            return out
        while True:
            if s.peek() != '"':
                raise NotStreamable
            key = s.value()
            if key in out:
                raise NotStreamable
            s.expect(":")
            if key == skip and s.peek() == "[":
                s.pos += 1
                if s.peek() == "]":
                    s.pos += 1
                else:
                    while True:
                        s.value()
                        if s.expect(",]") == "]":
                            break
                out[key] = None
            else:
                out[key] = s.value()
            if s.expect(",}") == "}":
                break
        s.end()
        out.pop(skip, None)
        return out
    finally:
        s.close()
