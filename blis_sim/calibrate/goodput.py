"""Per-SLO-class goodput, real vs simulated (the reference's ``--slo-ttft/-itl/-e2e``, issue #1413 BC-9).

API::

    parse_go_duration_ms("1m30.5s") -> 90500.0        Go time.ParseDuration, in ms; None if unparseable
    parse_slo_flag("critical=100ms,standard=500ms", "--slo-ttft") -> {"critical": 100.0, ...}   UsageError if bad
    merge_targets(cli_ttft, cli_itl, cli_e2e, header_targets) -> {class: SLODimTargets} | None
    goodput_comparison(real, sim, rows, sim_rows, itl_records, targets, runtime_s) -> GoodputComparison | None
        real: TraceColumns; sim: SimTable; rows: the trace rows counted, sim_rows: each one's result (-1: none)
    runtime_seconds(real, rows) -> float

Semantics, as the reference: precedence CLI > trace header per dimension; a record without an slo_class is
class "default"; only ``ok``/``error``/``timeout`` records of the matched set count; only ``ok`` records can be
good; a request is good when every gated dimension is met (TTFT, then E2E, then mean ITL); ITL gating with no
ITL data on a side marks ``skipped_itl`` and makes that request not good. Goodput is informational: no verdict.
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

import numpy as np

from blis_sim.calibrate.table import SimTable
from blis_sim.errors import UsageError
from blis_sim.formats.report import GoodputClassComparison, GoodputComparison, SLODimTargets
from blis_sim.formats.trace_columns import TraceColumns

_NS_PER_UNIT = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
                "m": 60_000_000_000, "h": 3_600_000_000_000}
_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration_ms(text: str) -> float | None:
    """Go's ``time.ParseDuration`` (integer nanoseconds, fractions truncated), returned in milliseconds."""
    s = text.strip()
    sign = -1 if s.startswith("-") else 1
    s = s[1:] if s[:1] in "+-" else s
    if s == "0":
        return 0.0
    if not s:
        return None
    total = 0
    pos = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if not m or m.group(1) in ("", "."):
            return None
        total += int(Decimal(m.group(1)) * _NS_PER_UNIT[m.group(2)])  # int() truncates, as Go does
        pos = m.end()
    return sign * total / 1_000_000


def parse_slo_flag(text: str, flag: str) -> dict[str, float] | None:
    """``class=duration[,class=duration...]`` → {class: ms}; None for an empty flag."""
    s = text.strip()
    if not s:
        return None
    out: dict[str, float] = {}
    for pair in (p.strip() for p in s.split(",")):
        if not pair:
            raise UsageError(f"{flag}: empty pair in {s!r} (expected key=duration)")
        key, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"{flag}: invalid pair {pair!r} (expected key=duration)")
        if not key.strip():
            raise UsageError(f"{flag}: empty class key in pair {pair!r}")
        ms = parse_go_duration_ms(value)
        if ms is None:
            raise UsageError(f"{flag}: unparseable duration in pair {pair!r}")
        if ms <= 0:
            raise UsageError(f"{flag}: non-positive duration in pair {pair!r}")
        out[key.strip()] = ms
    return out


def merge_targets(cli_ttft: Mapping[str, float] | None, cli_itl: Mapping[str, float] | None,
                  cli_e2e: Mapping[str, float] | None,
                  header: Mapping[str, Any] | None) -> dict[str, SLODimTargets] | None:
    """Per class and dimension: CLI beats the header; classes with nothing gated are dropped."""
    cli_ttft, cli_itl, cli_e2e, header = cli_ttft or {}, cli_itl or {}, cli_e2e or {}, header or {}
    out: dict[str, SLODimTargets] = {}
    for cls in sorted(set(cli_ttft) | set(cli_itl) | set(cli_e2e) | set(header)):
        h = header.get(cls)
        dims = {name: float(getattr(h, f"{name}_ms", 0.0) or 0.0) for name in ("ttft", "itl", "e2e")}
        for name, cli in (("ttft", cli_ttft), ("itl", cli_itl), ("e2e", cli_e2e)):
            if cls in cli:
                dims[name] = cli[cls]
        if any(dims.values()):
            out[cls] = SLODimTargets(ttft_ms=dims["ttft"], itl_ms=dims["itl"], e2e_ms=dims["e2e"])
    return out or None


def _itl_mean_ms(chunks: list[Any] | None) -> float | None:
    if not chunks or len(chunks) < 2:
        return None
    ordered = sorted(chunks, key=lambda c: c.chunk_index)
    deltas = [b.timestamp_us - a.timestamp_us for a, b in itertools.pairwise(ordered)]
    positive = [d for d in deltas if d > 0]
    return sum(positive) / len(positive) / 1000.0 if positive else None


class _Gates:
    """One side's gating of a class's requests, dimension after dimension (TTFT, E2E, ITL): a
    dimension counts only the requests every earlier gate passed, as the reference's ``&&`` chain."""

    def __init__(self, good: np.ndarray) -> None:
        self.good = good
        self.met: dict[str, int] = {}
        self.n: dict[str, int] = {}

    def gate(self, dim: str, value_ms: np.ndarray, limit_ms: float, present: np.ndarray | None = None) -> None:
        if limit_ms <= 0:
            return
        asked = self.good if present is None else self.good & present
        ok = asked & (value_ms <= limit_ms)
        self.n[dim], self.met[dim] = int(asked.sum()), int(ok.sum())
        self.good = ok


def goodput_comparison(real: TraceColumns, sim: SimTable, rows: np.ndarray, sim_rows: np.ndarray,
                       itl_records: Iterable[Any] | None, targets: Mapping[str, SLODimTargets] | None,
                       runtime_s: float) -> GoodputComparison | None:
    """The reference's ``ComputeGoodputComparison``; None when no targets are configured. ``rows``:
    the trace rows of the matched ids; ``sim_rows``: each one's sim row."""
    if not targets:
        return None
    itl_by_request: dict[int, list[Any]] = {}
    for c in itl_records or ():
        itl_by_request.setdefault(c.request_id, []).append(c)
    status = real.strings("status")
    counted = {status.names.index(s) for s in ("ok", "error", "timeout") if s in status.names}
    code = status.codes[rows]
    rows, sim_rows, code = (a[np.isin(code, list(counted))] for a in (rows, sim_rows, code))
    ok_code = status.names.index("ok") if "ok" in status.names else -1
    slo = real.strings("slo_class")
    cls_of = [n or "default" for n in slo.names]
    itl_missing = False
    per_class: dict[str, GoodputClassComparison] = {}
    for cls in sorted(targets):
        t = targets[cls]
        mine = np.isin(slo.codes[rows], [k for k, name in enumerate(cls_of) if name == cls])
        at, srows = rows[mine], sim_rows[mine]
        is_ok = code[mine] == ok_code
        count = int(at.size)
        # real side: ok requests only
        send = real.array("send_time_us")[at]
        ttft = (real.array("first_chunk_time_us")[at] - send) / 1000.0
        e2e = (real.array("last_chunk_time_us")[at] - send) / 1000.0
        real_g = _Gates(is_ok & (ttft > 0) & (e2e > 0) & (e2e >= ttft))
        real_g.gate("ttft", ttft, t.ttft_ms)
        real_g.gate("e2e", e2e, t.e2e_ms)
        if t.itl_ms > 0:
            asked = np.flatnonzero(real_g.good)
            means = np.zeros(at.size)
            present = np.zeros(at.size, dtype=bool)
            for i in asked.tolist():
                m = _itl_mean_ms(itl_by_request.get(int(real.array("request_id")[at[i]])))
                if m is not None:
                    means[i], present[i] = m, True
            itl_missing |= bool((real_g.good & ~present).any())
            real_g.gate("itl", means, t.itl_ms, present)
        # sim side: every counted request with a result
        has = srows >= 0
        s = np.where(has, srows, 0)
        sim_ttft, sim_e2e = sim.ttft_us[s] / 1000.0, sim.e2e_us[s] / 1000.0
        sim_g = _Gates(has & (sim_ttft > 0) & (sim_e2e > 0) & (sim_e2e >= sim_ttft))
        sim_g.gate("ttft", sim_ttft, t.ttft_ms)
        sim_g.gate("e2e", sim_e2e, t.e2e_ms)
        if t.itl_ms > 0:
            itl = sim.itl_mean_us[s] / 1000.0
            present = itl > 0
            itl_missing |= bool((sim_g.good & ~present).any())
            sim_g.gate("itl", itl, t.itl_ms, present)
        real_good, sim_good = int(real_g.good.sum()), int(sim_g.good.sum())
        dims = [d for d, limit in (("ttft", t.ttft_ms), ("itl", t.itl_ms), ("e2e", t.e2e_ms)) if limit > 0]
        by_dim = {side: {d: _ratio(g.met.get(d, 0), g.n.get(d, 0)) for d in dims}
                  for side, g in (("real", real_g), ("sim", sim_g))}
        per_class[cls] = GoodputClassComparison(
            count=count, real_slo_attainment=_ratio(real_good, count),
            sim_slo_attainment=_ratio(sim_good, count),
            real_goodput_rps=real_good / runtime_s if runtime_s > 0 else 0.0,
            sim_goodput_rps=sim_good / runtime_s if runtime_s > 0 else 0.0,
            real_attainment_by_dim=by_dim["real"] or None, sim_attainment_by_dim=by_dim["sim"] or None)
    return GoodputComparison(targets=dict(targets), per_class=per_class, skipped_itl=itl_missing)


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


def runtime_seconds(real: TraceColumns, rows: np.ndarray) -> float:
    """Wall-clock span of the given real requests: first send to last chunk (0 if not positive)."""
    if not rows.size:
        return 0.0
    first = int(real.array("send_time_us")[rows].min())
    last = max(0, int(real.array("last_chunk_time_us")[rows].max()))
    return (last - first) / 1e6 if last > first else 0.0
