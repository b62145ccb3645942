"""A small YAML writer that lays documents out the way Go's yaml.v3 does (the reference's writer).

``dump(data) -> str`` takes plain data (dicts in key order, lists, str, int, float, bool, None) and writes
block style with a 4-space indent, sequences indented under their key (``- `` at +4, item keys at +6),
``{}`` / ``[]`` for empty collections, floats in Go's shortest ``'g'`` format, and strings plain unless a
plain scalar would read back as something else (then double-quoted, as yaml.v3 does for e.g.
``"2026-08-20T15:14:23Z"`` or ``"0042"``) or cannot be plain (then single-quoted).
"""
from __future__ import annotations

import re
from typing import Any

import yaml

from blis_sim.formats._go import yaml_float
from blis_sim.formats._yamlin import _Loader

_INDENT = 4
_resolver = _Loader("")
# Characters that cannot start a plain scalar, and sequences that cannot appear inside one (YAML 1.1/1.2).
_BAD_START = set("-?:,[]{}#&*!|>'\"%@`")
# Characters safe unescaped in a plain or single-quoted scalar: YAML's printable set minus the line
# breaks NEL/LS/PS and the BOM, which a reader would fold or drop.
_PRINTABLE = re.compile("[\x09\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd"
                        "\U00010000-\U0010ffff]*\\Z")
_SAFE_CHAR = re.compile("[\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]")


def _resolves_to_str(s: str) -> bool:
    # Our reader's resolver: YAML 1.1 plus 1.2 exponent floats, a superset of yaml.v3's (yes/no/on/off and
    # base-60 included, which yaml.v3 quotes too: isOldBool / isBase60Float).
    return _resolver.resolve(yaml.ScalarNode, s, (True, False)) == "tag:yaml.org,2002:str"


def _plain_ok(s: str) -> bool:
    if s[0] in _BAD_START and not (s[0] in "-?:" and len(s) > 1 and s[1] not in " \t"):
        return False
    if s[0].isspace() or s[-1].isspace() or s.endswith(":"):
        return False
    if ": " in s or " #" in s or "\t" in s or not _PRINTABLE.match(s):
        return False
    return s[0] not in "-?:" or s[1:2] not in ("", " ")


def _double_quoted(s: str) -> str:
    out = []
    for c in s:
        if c == '"':
            out.append('\\"')
        elif c == "\\":
            out.append("\\\\")
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif _SAFE_CHAR.match(c):
            out.append(c)
        elif ord(c) <= 0xFF:
            out.append(f"\\x{ord(c):02X}")
        elif ord(c) <= 0xFFFF:
            out.append(f"\\u{ord(c):04X}")
        else:
            out.append(f"\\U{ord(c):08X}")
    return '"' + "".join(out) + '"'


def scalar(v: Any) -> str:
    """One scalar value as yaml.v3 writes it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return yaml_float(v)
    if isinstance(v, str):
        if v == "" or not _resolves_to_str(v) or not _PRINTABLE.match(v):
            return _double_quoted(v)
        if _plain_ok(v):
            return v
        if _PRINTABLE.match(v):
            return "'" + v.replace("'", "''") + "'"
        return _double_quoted(v)
    raise TypeError(f"cannot write {type(v).__name__} to YAML")


def _is_block(v: Any) -> bool:
    return isinstance(v, (dict, list)) and len(v) > 0


def _mapping(d: dict[str, Any], indent: int, out: list[str], first_prefix: str | None = None) -> None:
    for i, (k, v) in enumerate(d.items()):
        pad = first_prefix if (i == 0 and first_prefix is not None) else " " * indent
        key = scalar(str(k))
        if not _is_block(v):
            value = "{}" if isinstance(v, dict) else "[]" if isinstance(v, list) else scalar(v)
            out.append(f"{pad}{key}: {value}")
        elif isinstance(v, dict):
            out.append(f"{pad}{key}:")
            _mapping(v, indent + _INDENT, out)
        else:
            out.append(f"{pad}{key}:")
            _sequence(v, indent + _INDENT, out)


def _sequence(items: list[Any], indent: int, out: list[str]) -> None:
    for item in items:
        pad = " " * indent + "- "
        if isinstance(item, dict) and item:
            _mapping(item, indent + 2, out, first_prefix=pad)
        elif isinstance(item, list) and item:
            out.append(pad.rstrip())
            _sequence(item, indent + _INDENT, out)
        else:
            value = "{}" if isinstance(item, dict) else "[]" if isinstance(item, list) else scalar(item)
            out.append(pad + value)


def dump(data: dict[str, Any]) -> str:
    """A top-level mapping as a yaml.v3 document (ends with a newline)."""
    out: list[str] = []
    if not data:
        return "{}\n"
    _mapping(data, 0, out)
    return "\n".join(out) + "\n"
