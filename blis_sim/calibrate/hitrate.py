"""KV hit-rate comparisons: the guide's primary block, every like-for-like definition, per-request agreement.

API::

    compare_hit_rate(real, sim, tolerance_pp, source, sim_source=None) -> HitRateComparison
    within_pp(abs_error_pp, tolerance_pp) -> bool          inclusive band (+1e-9), as the reference
    HitRateEntry.of(obj) -> HitRateEntry                   a shared-shape entry from a dict or a model
    simulated_primary(source, sim_entries, cache_hit_rate) -> (rate, sim_source) | None
    compare_definitions(observed, simulated, tolerance_pp) -> (comparisons, unpaired)
    request_hit_agreement(real_cached, sim_cached) -> RequestHitAgreement | None    per matched pair, -1: not reported

Design D2: a hit-rate is only compared with the same hit-rate. Entries are matched on (definition, tier)
and must carry the same unit; the legacy ``gpu_prefix_cache`` counters count the same tokens as
``prefix_cache`` and pair with it when the other side has no entry of the same name. A ``by_source``
source that only one side lists counts as 0 hits on the other side when that side reports the split at all.
For the guide's primary ``hit_rate`` block the simulated side is, when the sim carries it, the like-for-like aggregate
(``tiered``: Σ chunk hits / Σ chunk queries over tiers, as the observed block sums its label series;
``gpu-prefix-cache-fallback``: ``prefix_cache`` tokens); otherwise the reference's ``cache_hit_rate``
(block-based, decode blocks counted as misses), which the report then flags in ``notes``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from blis_sim.formats.report import HitRateComparison, HitRateDefinitionComparison, RequestHitAgreement, UnpairedHitRate

BOUNDARY_EPS = 1e-9  # keeps |0.75 − 0.70| × 100 = 5.000000000000004 inside a 5 pp band
SOURCE_TIERED = "tiered"
SOURCE_GPU_FALLBACK = "gpu-prefix-cache-fallback"
SIM_SOURCE_CACHE_HIT_RATE = "cache_hit_rate"
_ALIASES = {"gpu_prefix_cache": "prefix_cache"}
# Which simulated definition reproduces each observed primary source, in order of preference.
_PRIMARY_DEFINITIONS = {SOURCE_TIERED: ("tiered",), SOURCE_GPU_FALLBACK: ("prefix_cache", "gpu_prefix_cache")}


def within_pp(abs_error_pp: float, tolerance_pp: float) -> bool:
    return abs_error_pp <= tolerance_pp + BOUNDARY_EPS


def compare_hit_rate(real: float, sim: float, tolerance_pp: float, source: str,
                     sim_source: str | None = None) -> HitRateComparison:
    """The reference's ``ComputeHitRateComparison`` (abs error in percentage points)."""
    abs_error_pp = abs(sim - real) * 100
    return HitRateComparison(real_hit_rate=real, sim_hit_rate=sim, abs_error_pp=abs_error_pp,
                             tolerance_pp=tolerance_pp, within=within_pp(abs_error_pp, tolerance_pp),
                             source=source, sim_source=sim_source)


@dataclass(frozen=True)
class HitRateEntry:
    """One per-definition hit-rate (shared shape), whichever side it comes from."""

    definition: str
    tier: str | None
    unit: str
    hits: int
    queries: int
    hit_rate: float
    metric: str | None = None

    @classmethod
    def of(cls, obj: Any) -> HitRateEntry:
        get = obj.get if isinstance(obj, Mapping) else (lambda k, d=None: getattr(obj, k, d))
        return cls(definition=str(get("definition")), tier=get("tier"), unit=str(get("unit")),
                   hits=int(get("hits", 0)), queries=int(get("queries", 0)),
                   hit_rate=float(get("hit_rate", 0.0)), metric=get("metric"))

    @property
    def key(self) -> tuple[str, str | None]:
        return self.definition, self.tier

    @property
    def label(self) -> str:
        return self.definition if self.tier is None else f"{self.definition}/{self.tier}"


def simulated_primary(source: str, sim_entries: Sequence[HitRateEntry],
                      cache_hit_rate: float | None) -> tuple[float, str] | None:
    """The simulated counterpart of the observed primary source, and where it came from; None if none."""
    for definition in _PRIMARY_DEFINITIONS.get(source, ()):
        mine = [e for e in sim_entries if e.definition == definition]
        total = [e for e in mine if e.tier is None]
        if total and total[0].queries > 0:
            return total[0].hit_rate, f"kv_hit_rates:{definition}"
        per_tier = [e for e in mine if e.tier is not None]
        queries = sum(e.queries for e in per_tier)
        if queries > 0:  # the observed block sums every label series: do the same
            return sum(e.hits for e in per_tier) / queries, f"kv_hit_rates:{definition}"
    if cache_hit_rate is not None:
        return cache_hit_rate, SIM_SOURCE_CACHE_HIT_RATE
    return None


def _zero_fill_sources(entries: list[HitRateEntry], other: Iterable[HitRateEntry]) -> list[HitRateEntry]:
    """``by_source`` entries for sources only ``other`` lists, as 0 hits over this side's queries.

    A side that reports the by-source split at all has served 0 tokens from a source it does not list
    (vLLM lists every source; a simulator may list only those it models), so 0 vs 0 is compared, not dropped.
    """
    mine = [e for e in entries if e.definition == "by_source"]
    if not mine:
        return entries
    have = {e.tier for e in mine}
    missing = sorted({e.tier for e in other if e.definition == "by_source" and e.tier not in have}, key=str)
    return entries + [HitRateEntry("by_source", tier, mine[0].unit, 0, mine[0].queries, 0.0, mine[0].metric)
                      for tier in missing]


def compare_definitions(observed: Iterable[HitRateEntry], simulated: Iterable[HitRateEntry],
                        tolerance_pp: float) -> tuple[list[HitRateDefinitionComparison], list[UnpairedHitRate]]:
    """Pair entries on (definition, tier) and compare each pair; list what could not be paired, and why."""
    obs_in, sim_in = list(observed), list(simulated)
    obs = _zero_fill_sources(obs_in, sim_in)
    sims = {e.key: e for e in _zero_fill_sources(sim_in, obs_in)}
    used: set[tuple[str, str | None]] = set()
    pairs: list[tuple[HitRateEntry, HitRateEntry]] = []
    later: list[HitRateEntry] = []
    for e in obs:  # exact names first, so an alias never steals a partner from its namesake
        if e.key in sims and e.key not in used:
            pairs.append((e, sims[e.key]))
            used.add(e.key)
        else:
            later.append(e)
    unpaired_obs: list[HitRateEntry] = []
    for e in later:
        alias = (_ALIASES.get(e.definition, e.definition), e.tier)
        reverse = next((k for k in sims if _ALIASES.get(k[0]) == e.definition and k[1] == e.tier), None)
        partner = next((k for k in (alias, reverse) if k is not None and k in sims and k not in used), None)
        if partner is None:
            unpaired_obs.append(e)
        else:
            pairs.append((e, sims[partner]))
            used.add(partner)
    comparisons: list[HitRateDefinitionComparison] = []
    unpaired: list[UnpairedHitRate] = []
    for real, sim in pairs:
        reason = _incomparable(real, sim)
        if reason:
            unpaired.append(_unpaired(real, "observed", reason))
            unpaired.append(_unpaired(sim, "simulated", reason))
            continue
        abs_error_pp = abs(sim.hit_rate - real.hit_rate) * 100
        comparisons.append(HitRateDefinitionComparison(
            definition=real.definition, tier=real.tier, unit=real.unit, real_hit_rate=real.hit_rate,
            sim_hit_rate=sim.hit_rate, abs_error_pp=abs_error_pp, tolerance_pp=tolerance_pp,
            within=within_pp(abs_error_pp, tolerance_pp), real_hits=real.hits, real_queries=real.queries,
            sim_hits=sim.hits, sim_queries=sim.queries, metric=real.metric))
    unpaired += [_unpaired(e, "observed", "the simulated metrics carry no such definition/tier")
                 for e in unpaired_obs]
    unpaired += [_unpaired(e, "simulated", "the trace header carries no such observed definition/tier")
                 for k, e in sims.items() if k not in used]
    return comparisons, unpaired


def _incomparable(real: HitRateEntry, sim: HitRateEntry) -> str:
    if real.unit != sim.unit:
        return f"units differ (observed {real.unit}, simulated {sim.unit})"
    if real.queries <= 0 or sim.queries <= 0:
        side = "observed" if real.queries <= 0 else "simulated"
        return f"zero queries on the {side} side"
    return ""


def _unpaired(e: HitRateEntry, side: str, reason: str) -> UnpairedHitRate:
    return UnpairedHitRate(definition=e.definition, tier=e.tier, unit=e.unit, side=side, reason=reason)


def request_hit_agreement(real_cached: np.ndarray, sim_cached: np.ndarray) -> RequestHitAgreement | None:
    """Per-request cached tokens of the matched pairs, real (server usage) vs simulated (-1 where a
    side does not report it); None when either side never reports."""
    real_ok, sim_ok = real_cached >= 0, sim_cached >= 0
    both = real_ok & sim_ok
    compared = int(both.sum())
    if not (real_ok.any() and sim_ok.any()) or compared == 0:
        return None
    r, s = real_cached[both], sim_cached[both]
    matching = int((r == s).sum())
    return RequestHitAgreement(requests=compared, matching=matching, match_share=matching / compared,
                               mean_abs_diff_tokens=int(np.abs(r - s).sum()) / compared,
                               real_cached_tokens=int(r.sum()), sim_cached_tokens=int(s.sum()),
                               not_reported=int(real_cached.size) - compared)
