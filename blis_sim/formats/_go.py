"""Go-compatible scalar formatting and parsing, so our files are byte-compatible with the reference's.

The reference (Go) writes YAML with yaml.v3, JSON with ``encoding/json`` and CSV with ``encoding/csv``; each
formats numbers and quotes strings its own way, and Python's defaults differ from all three:

- :func:`yaml_float` — ``strconv.FormatFloat(f, 'g', -1, 64)`` as yaml.v3 emits it (``7000``, ``0.68``,
  ``1e+21``, ``.inf``).
- :func:`json_float` — ``encoding/json``'s float64 format (``32984``, ``28.346298``, ``1e-07``).
- :func:`json_floats` / :func:`json_ints` — the same for a whole numpy column at once (``list[str]``, one
  per value): what the columnar results writer uses (the shortest digits come from orjson's Ryu in C,
  ~0.1 µs a value against ~1 µs for ``repr``).
- :func:`fixed_float` — ``strconv.FormatFloat(f, 'f', -1, 64)`` (the CSV ``reason_ratio`` column).
- :func:`csv_field` — ``encoding/csv`` minimal quoting.
- :func:`parse_int`, :func:`parse_bool`, :func:`parse_float` — ``strconv.ParseInt/ParseBool/ParseFloat``: they
  return ``None`` where Go would fail, so callers build their own located error.
"""
from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

_INT_RE = re.compile(r"[+-]?[0-9]+\Z")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
# Go's ParseFloat accepts decimal and hex floats, "inf"/"infinity"/"nan" in any case, and underscores only
# between digits of a base-prefixed literal; we accept the decimal and special forms (all the reference writes).
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_SPECIAL_FLOATS = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf,
                   "+infinity": math.inf, "-infinity": -math.inf, "nan": math.nan}


def _digits(f: float) -> tuple[str, int]:
    """Shortest round-trip decimal digits of ``abs(f)`` and the decimal point position (Go's digs.d, digs.dp).

    Python's ``repr`` and Go's shortest formatting pick the same digits; only the layout differs.
    """
    _, digits, exponent = Decimal(repr(abs(f))).as_tuple()
    ds = "".join(map(str, digits)).lstrip("0")
    if not ds:
        return "0", 1
    dp = len(ds) + int(exponent)
    return ds.rstrip("0"), dp


def _fmt_e(ds: str, dp: int, neg: bool) -> str:
    exp = dp - 1
    mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
    sign = "-" if exp < 0 else "+"
    return f"{'-' if neg else ''}{mant}e{sign}{abs(exp):02d}"


def _fmt_f(ds: str, dp: int, neg: bool) -> str:
    if dp <= 0:
        s = "0." + "0" * (-dp) + ds
    elif dp >= len(ds):
        s = ds + "0" * (dp - len(ds))
    else:
        s = ds[:dp] + "." + ds[dp:]
    return ("-" if neg else "") + s


def _go_g(f: float) -> str:
    """``strconv.FormatFloat(f, 'g', -1, 64)``: %e when the exponent is < -4 or >= 6 (shortest mode)."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    neg = math.copysign(1.0, f) < 0
    if f == 0:
        return "-0" if neg else "0"
    ds, dp = _digits(f)
    exp = dp - 1
    if exp < -4 or exp >= 6:
        return _fmt_e(ds, dp, neg)
    return _fmt_f(ds, dp, neg)


def yaml_float(f: float) -> str:
    """A float64 as yaml.v3 writes it."""
    s = _go_g(float(f))
    return {"+Inf": ".inf", "-Inf": "-.inf", "NaN": ".nan"}.get(s, s)


def json_float(f: float) -> str:
    """A float64 as Go's encoding/json writes it (NaN/Inf are not representable: ValueError)."""
    f = float(f)
    if math.isnan(f) or math.isinf(f):
        raise ValueError(f"unsupported value: {f!r} (JSON has no NaN or Inf)")
    if f == 0:
        return "-0" if math.copysign(1.0, f) < 0 else "0"
    neg = f < 0
    ds, dp = _digits(f)
    a = abs(f)
    if a < 1e-6 or a >= 1e21:
        return _fmt_e(ds, dp, neg).replace("e-0", "e-").replace("e+0", "e+")
    return _fmt_f(ds, dp, neg)


def json_floats(values: np.ndarray) -> list[str]:
    """``[json_float(v) for v in values]`` for a 1-D float array, computed column-wise.

    orjson writes a float64 in [1e-4, 1e16) with the shortest round-trip digits in fixed notation, as
    Python's ``repr`` does (``33037.0``, ``0.1``), so only the ``.0`` of whole values needs stripping
    (found with numpy); values outside that range, zeros and NaN/Inf (which raise, as in
    :func:`json_float`) go through :func:`json_float` one by one.
    """
    import numpy as np  # here, not at the top: the YAML/CSV formats need neither numpy nor orjson
    import orjson

    a = np.ascontiguousarray(values, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"expected a 1-D array, got shape {a.shape}")
    if a.size == 0:
        return []
    out = orjson.dumps(a, option=orjson.OPT_SERIALIZE_NUMPY).decode()[1:-1].split(",")
    with np.errstate(invalid="ignore"):
        mag = np.abs(a)
        plain = (mag >= 1e-4) & (mag < 1e16)
        whole = np.flatnonzero(plain & (a == np.trunc(a)))
        zero = a == 0
    for i in whole.tolist():
        out[i] = out[i][:-2]  # "33037.0" -> "33037"
    for i in np.flatnonzero(~plain & ~zero).tolist():
        out[i] = json_float(float(a[i]))
    for i in np.flatnonzero(zero).tolist():  # zeros are common (no delay, one output token)
        out[i] = "-0" if math.copysign(1.0, a[i]) < 0 else "0"
    return out


def json_ints(values: np.ndarray) -> list[str]:
    """``[str(v) for v in values]`` for a 1-D integer array (``true``/``false`` for a bool array)."""
    import numpy as np
    import orjson

    a = np.ascontiguousarray(values)
    if a.ndim != 1 or a.dtype.kind not in "iub":
        raise ValueError(f"expected a 1-D integer or bool array, got {a.dtype} shape {a.shape}")
    if a.size == 0:
        return []
    return orjson.dumps(a, option=orjson.OPT_SERIALIZE_NUMPY).decode()[1:-1].split(",")


def fixed_float(f: float) -> str:
    """``strconv.FormatFloat(f, 'f', -1, 64)``."""
    f = float(f)
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    if f == 0:
        return "-0" if math.copysign(1.0, f) < 0 else "0"
    ds, dp = _digits(f)
    return _fmt_f(ds, dp, f < 0)


def parse_int(s: str) -> int | None:
    """``strconv.ParseInt(s, 10, 64)``: optional sign, ASCII digits, int64 range; else None."""
    if not _INT_RE.match(s):
        return None
    v = int(s)
    return v if _INT64_MIN <= v <= _INT64_MAX else None


def looks_int(s: str) -> bool:
    """Syntactically an integer (so a ParseInt failure means out of range)."""
    return bool(_INT_RE.match(s))


def parse_bool(s: str) -> bool | None:
    """``strconv.ParseBool``: 1,t,T,TRUE,true,True / 0,f,F,FALSE,false,False; else None."""
    if s in _GO_TRUE:
        return True
    if s in _GO_FALSE:
        return False
    return None


def parse_float(s: str) -> float | None:
    """``strconv.ParseFloat(s, 64)`` for decimal and special forms; else None."""
    if _FLOAT_RE.match(s):
        v = float(s)
        return v
    return _SPECIAL_FLOATS.get(s.lower())


# unicode.IsSpace: what Go's strings.TrimSpace strips (Python's str.strip() also strips \x1c-\x1f).
GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
           "\u2028\u2029\u202f\u205f\u3000"


def trim_space(s: str) -> str:
    """``strings.TrimSpace``."""
    return s.strip(GO_SPACE)


def format_bool(b: bool) -> str:
    return "true" if b else "false"


# Go quotes a field holding a comma, quote, CR or LF, starting with a unicode.IsSpace rune, or equal to \.
_NEEDS_QUOTES = re.compile('[,"\r\n]|\\A[' + re.escape(GO_SPACE) + r']|\A\\\.\Z')


def csv_field(s: str) -> str:
    """One field quoted the way Go's csv.Writer quotes it (minimal quoting, ``"`` doubled)."""
    if s and _NEEDS_QUOTES.search(s):
        return '"' + s.replace('"', '""') + '"'
    return s


def csv_line(fields: list[str]) -> str:
    return ",".join(csv_field(f) for f in fields) + "\n"
