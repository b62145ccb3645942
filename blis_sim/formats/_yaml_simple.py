"""A reader of the plain block YAML our writers emit (the trace header, the sample configs), without
PyYAML: importing PyYAML and composing a 30-line header with its pure-Python loader is ~3 % of a
10k-request ``blis replay``.

``parse_simple(text) -> (data, lines, raw) | None`` gives what :func:`blis_sim.formats._strict.parse_yaml`
builds from PyYAML's nodes (the data, the line of every key and item, the source text of plain
scalars that resolve to a non-string), for documents made only of: block mappings with plain
``snake_case`` keys, block sequences indented under their key (``- item``, ``- key: value``), ``{}``
and ``[]``, and scalars whose YAML 1.1 resolution is unambiguous here: decimal integers, decimal
fractions, ``true``/``false``, ``null``, plain words and paths, and quoted strings without escapes.
Anything else (comments, anchors, tags, flow collections, multi-line or exotic scalars, duplicate
keys, tabs, odd indentation, ...) returns ``None``: the caller parses it with PyYAML, which accepts
it or reports it as always.
"""
from __future__ import annotations

import re
from typing import Any

Path_ = tuple[str | int, ...]

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INT = re.compile(r"-?(?:0|[1-9][0-9]*)\Z")
_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)\.[0-9]+\Z")
# a plain scalar that YAML 1.1 reads as this string: starts with a letter or "/", then letters,
# digits and "_./-" only (no indicator, no space, no ":" or "#"), and is no bool or null word
_WORD = re.compile(r"[A-Za-z/][A-Za-z0-9_./-]*\Z")
_SPECIAL_WORDS = frozenset({"yes", "no", "true", "false", "on", "off", "null", "y", "n"})


class _Unsupported(Exception):
    """Not in the subset: let PyYAML read it."""


def parse_simple(text: str) -> tuple[Any, dict[Path_, int], dict[Path_, str]] | None:
    """``(data, lines, raw)`` of a document in the subset (see the module docstring), else None."""
    if not text or "\t" in text or "\r" in text or "#" in text or "\ufeff" in text:
        return None
    rows = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        content = line.lstrip(" ")
        if not content or line.endswith(" "):
            return None
        rows.append((number, len(line) - len(content), content))
    if not rows or rows[0][1] != 0 or rows[0][2].startswith(("---", "...", "%", "- ", "-\n")):
        return None
    lines: dict[Path_, int] = {(): rows[0][0]}
    raw: dict[Path_, str] = {}
    try:
        data, end = _mapping(rows, 0, 0, (), lines, raw)
    except (_Unsupported, RecursionError):
        return None
    if end != len(rows):
        return None
    return data, lines, raw


def _mapping(rows: list[tuple[int, int, str]], i: int, indent: int, path: Path_,
             lines: dict[Path_, int], raw: dict[Path_, str]) -> tuple[dict[str, Any], int]:
    """The block mapping whose keys sit at column ``indent`` from row ``i``; (mapping, next row)."""
    out: dict[str, Any] = {}
    while i < len(rows) and rows[i][1] == indent:
        number, _, content = rows[i]
        key, sep, rest = content.partition(":")
        if not sep or not _is_key(key) or key in out or (rest and not rest.startswith(" ")):
            raise _Unsupported
        child = path + (key,)
        lines[child] = number
        rest = rest[1:]
        i += 1
        if rest:
            out[key] = _scalar(rest, child, raw)
        elif i < len(rows) and rows[i][1] > indent:
            if rows[i][2].startswith("- "):
                out[key], i = _sequence(rows, i, rows[i][1], child, lines, raw)
            else:
                out[key], i = _mapping(rows, i, rows[i][1], child, lines, raw)
        else:
            raise _Unsupported  # an empty value: null in YAML, but leave it to PyYAML
        if i < len(rows) and rows[i][1] > indent:
            raise _Unsupported  # a continuation line (multi-line scalar) or a stray indent
    if i < len(rows) and rows[i][1] > indent:
        raise _Unsupported
    return out, i


def _sequence(rows: list[tuple[int, int, str]], i: int, indent: int, path: Path_,
              lines: dict[Path_, int], raw: dict[Path_, str]) -> tuple[list[Any], int]:
    """The block sequence whose dashes sit at column ``indent``; (list, next row)."""
    out: list[Any] = []
    while i < len(rows) and rows[i][1] == indent and rows[i][2].startswith("- "):
        number, _, content = rows[i]
        item = path + (len(out),)
        lines[item] = number
        body = content[2:]
        if not body or body.startswith(" "):
            raise _Unsupported
        key, sep, rest = body.partition(":")
        if sep and _is_key(key) and (not rest or rest.startswith(" ")):
            # "- key: value": a mapping whose keys sit two columns right of the dash (the row is
            # rewritten as its first key's; rows already read are not read again)
            rows[i] = (number, indent + 2, body)
            value, i = _mapping(rows, i, indent + 2, item, lines, raw)
        else:
            value = _scalar(body, item, raw)
            i += 1
        out.append(value)
    return out, i


def _is_key(text: str) -> bool:
    """A plain key YAML 1.1 reads as this string (``on``, ``null``, ... are not; PyYAML refuses an
    implicit key over 1024 characters, so long ones are left to it)."""
    return len(text) <= 128 and bool(_KEY.match(text)) and text.lower() not in _SPECIAL_WORDS


def _scalar(text: str, path: Path_, raw: dict[Path_, str]) -> Any:
    if _INT.match(text):
        raw[path] = text
        return int(text)
    if _FLOAT.match(text):
        raw[path] = text
        return float(text)
    if text in ("true", "false"):
        raw[path] = text
        return text == "true"
    if text == "null":
        return None
    if text == "{}":
        return {}
    if text == "[]":
        return []
    if _WORD.match(text) and text.lower() not in _SPECIAL_WORDS:
        return text
    if _quoted(text):
        return text[1:-1]
    raise _Unsupported


def _quoted(text: str) -> bool:
    """A quoted string without escapes: printable ASCII between its quotes, no quote or backslash."""
    if len(text) < 2 or text[0] != text[-1] or text[0] not in "\"'":
        return False
    inner = text[1:-1]
    return inner.isascii() and inner.isprintable() and text[0] not in inner and "\\" not in inner
