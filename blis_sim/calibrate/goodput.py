"""Per-SLO-class goodput, real vs simulated (the reference's ``--slo-ttft/-itl/-e2e``, issue #1413 BC-9).

API::

    parse_go_duration_ms("1m30.5s") -> 90500.0        Go time.ParseDuration, in ms; None if unparseable
    parse_slo_flag("critical=100ms,standard=500ms", "--slo-ttft") -> {"critical": 100.0, ...}   UsageError if bad
    merge_targets(cli_ttft, cli_itl, cli_e2e, header_targets) -> {class: SLODimTargets} | None
    goodput_comparison(records, sim_by_id, matched_ids, itl_records, targets, runtime_s) -> GoodputComparison | None

Semantics, as the reference: precedence CLI > trace header per dimension; a record without an slo_class is
class "default"; only ``ok``/``error``/``timeout`` records of the matched set count; only ``ok`` records can be
good; a request is good when every gated dimension is met (TTFT, then E2E, then mean ITL); ITL gating with no
ITL data on a side marks ``skipped_itl`` and makes that request not good. Goodput is informational: no verdict.
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from blis_sim.errors import UsageError
from blis_sim.formats.report import GoodputClassComparison, GoodputComparison, SLODimTargets

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


@dataclass
class _Acc:
    count: int = 0
    real_good: int = 0
    sim_good: int = 0
    met: dict[str, int] | None = None
    n: dict[str, int] | None = None

    def __post_init__(self) -> None:
        self.met = {k: 0 for k in ("real_ttft", "real_itl", "real_e2e", "sim_ttft", "sim_itl", "sim_e2e")}
        self.n = dict(self.met)

    def gate(self, key: str, value_ms: float, limit_ms: float) -> bool:
        assert self.met is not None and self.n is not None
        self.n[key] += 1
        ok = value_ms <= limit_ms
        self.met[key] += int(ok)
        return ok


def _itl_mean_ms(chunks: list[Any] | None) -> float | None:
    if not chunks or len(chunks) < 2:
        return None
    ordered = sorted(chunks, key=lambda c: c.chunk_index)
    deltas = [b.timestamp_us - a.timestamp_us for a, b in itertools.pairwise(ordered)]
    positive = [d for d in deltas if d > 0]
    return sum(positive) / len(positive) / 1000.0 if positive else None


def goodput_comparison(records: Iterable[Any], sim_by_id: Mapping[int, Any], matched_ids: set[int],
                       itl_records: Iterable[Any] | None, targets: Mapping[str, SLODimTargets] | None,
                       runtime_s: float) -> GoodputComparison | None:
    """The reference's ``ComputeGoodputComparison``; None when no targets are configured."""
    if not targets:
        return None
    itl_by_request: dict[int, list[Any]] = {}
    for c in itl_records or ():
        itl_by_request.setdefault(c.request_id, []).append(c)
    accs = {cls: _Acc() for cls in targets}
    itl_missing = False
    for rec in records:
        if rec.status not in ("ok", "error", "timeout") or rec.request_id not in matched_ids:
            continue
        cls = rec.slo_class or "default"
        if cls not in targets:
            continue
        a, t = accs[cls], targets[cls]
        a.count += 1
        if rec.status == "ok":
            ttft = (rec.first_chunk_time_us - rec.send_time_us) / 1000.0
            e2e = (rec.last_chunk_time_us - rec.send_time_us) / 1000.0
            good = ttft > 0 and e2e > 0 and e2e >= ttft
            if t.ttft_ms > 0:
                good = good and a.gate("real_ttft", ttft, t.ttft_ms)
            if t.e2e_ms > 0:
                good = good and a.gate("real_e2e", e2e, t.e2e_ms)
            if t.itl_ms > 0 and good:
                mean = _itl_mean_ms(itl_by_request.get(rec.request_id))
                if mean is None:
                    itl_missing, good = True, False
                else:
                    good = a.gate("real_itl", mean, t.itl_ms)
            a.real_good += int(good)
        sr = sim_by_id.get(rec.request_id)
        if sr is not None:
            ttft, e2e = sr.ttft_us / 1000.0, sr.e2e_us / 1000.0
            good = ttft > 0 and e2e > 0 and e2e >= ttft
            if t.ttft_ms > 0:
                good = good and a.gate("sim_ttft", ttft, t.ttft_ms)
            if t.e2e_ms > 0:
                good = good and a.gate("sim_e2e", e2e, t.e2e_ms)
            if t.itl_ms > 0 and good:
                itl = (getattr(sr, "itl_mean_us", 0.0) or 0.0) / 1000.0
                if itl > 0:
                    good = a.gate("sim_itl", itl, t.itl_ms)
                else:
                    itl_missing, good = True, False
            a.sim_good += int(good)
    per_class: dict[str, GoodputClassComparison] = {}
    for cls in sorted(targets):
        a, t = accs[cls], targets[cls]
        assert a.met is not None and a.n is not None
        dims = [d for d, limit in (("ttft", t.ttft_ms), ("itl", t.itl_ms), ("e2e", t.e2e_ms)) if limit > 0]
        by_dim = {side: {d: _ratio(a.met[f"{side}_{d}"], a.n[f"{side}_{d}"]) for d in dims}
                  for side in ("real", "sim")}
        per_class[cls] = GoodputClassComparison(
            count=a.count, real_slo_attainment=_ratio(a.real_good, a.count),
            sim_slo_attainment=_ratio(a.sim_good, a.count),
            real_goodput_rps=a.real_good / runtime_s if runtime_s > 0 else 0.0,
            sim_goodput_rps=a.sim_good / runtime_s if runtime_s > 0 else 0.0,
            real_attainment_by_dim=by_dim["real"] or None, sim_attainment_by_dim=by_dim["sim"] or None)
    return GoodputComparison(targets=dict(targets), per_class=per_class, skipped_itl=itl_missing)


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


def runtime_seconds(records: Iterable[Any], matched_ids: set[int]) -> float:
    """Wall-clock span of the matched real requests: first send to last chunk (0 if not positive)."""
    first: int | None = None
    last = 0
    for rec in records:
        if rec.request_id not in matched_ids:
            continue
        first = rec.send_time_us if first is None else min(first, rec.send_time_us)
        last = max(last, rec.last_chunk_time_us)
    return (last - first) / 1e6 if first is not None and last > first else 0.0
