"""Hit-rate comparisons: the reference's band cases, like-for-like definitions, per-request agreement."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from blis_sim.calibrate.hitrate import HitRateEntry, compare_definitions, compare_hit_rate, simulated_primary
from blis_sim.calibrate.hitrate import request_hit_agreement as _agreement


@pytest.mark.parametrize("real,sim,pp,within", [
    (0.70, 0.70, 0.0, True),
    (0.70, 0.73, 3.0, True),
    (0.70, 0.75, 5.0, True),     # boundary: 5.000000000000004 pp is within a 5 pp band
    (0.70, 0.80, 10.0, False),
    (0.70, 0.66, 4.0, True),
    (0.0, 0.03, 3.0, True),
])
def test_reference_band_cases(real: float, sim: float, pp: float, within: bool) -> None:
    c = compare_hit_rate(real, sim, 5.0, "tiered")
    assert c.abs_error_pp == pytest.approx(pp) and c.within is within
    assert (c.real_hit_rate, c.sim_hit_rate, c.tolerance_pp, c.source) == (real, sim, 5.0, "tiered")


def entry(definition: str, tier: str | None, hits: int, queries: int, unit: str = "tokens",
          metric: str | None = None) -> HitRateEntry:
    return HitRateEntry(definition, tier, unit, hits, queries, hits / queries if queries else 0.0, metric)


def test_entry_from_dict_and_from_object() -> None:
    d = {"definition": "tiered", "tier": "1:fs", "unit": "chunks", "hits": 3, "queries": 4, "hit_rate": 0.75,
         "metric": "vllm:kv_offload_tiering_chunk_hits_total"}

    @dataclass
    class Obj:
        definition: str = "tiered"
        tier: str | None = "1:fs"
        unit: str = "chunks"
        hits: int = 3
        queries: int = 4
        hit_rate: float = 0.75
        metric: str | None = "vllm:kv_offload_tiering_chunk_hits_total"

    assert HitRateEntry.of(d) == HitRateEntry.of(Obj()) and HitRateEntry.of(d).label == "tiered/1:fs"


def test_simulated_primary_prefers_like_for_like() -> None:
    tiers = [entry("tiered", "0:primary", 30, 100, "chunks"), entry("tiered", "1:fs", 10, 60, "chunks")]
    # no total entry: Σ hits / Σ queries over tiers, as the observed block sums label series
    assert simulated_primary("tiered", tiers, 0.9) == (pytest.approx(40 / 160), "kv_hit_rates:tiered")
    total = [entry("tiered", None, 41, 160, "chunks")] + tiers
    assert simulated_primary("tiered", total, 0.9) == (pytest.approx(41 / 160), "kv_hit_rates:tiered")
    prefix = [entry("prefix_cache", None, 61, 100)]
    assert simulated_primary("gpu-prefix-cache-fallback", prefix, 0.9) == (0.61, "kv_hit_rates:prefix_cache")
    # nothing like-for-like: the reference's block-based cache_hit_rate; nothing at all: None
    assert simulated_primary("tiered", prefix, 0.9) == (0.9, "cache_hit_rate")
    assert simulated_primary("tiered", [], None) is None


def test_definitions_paired_on_definition_and_tier() -> None:
    observed = [entry("prefix_cache", None, 600, 1000, metric="vllm:prefix_cache_hits_total"),
                entry("by_source", "device", 500, 1000), entry("by_source", "host", 100, 1000),
                entry("by_source", "p2p", 0, 1000), entry("external", None, 100, 400)]
    simulated = [entry("prefix_cache", None, 620, 1000), entry("by_source", "device", 450, 1000),
                 entry("by_source", "host", 100, 1000), entry("by_source", "disk", 80, 1000),
                 entry("tiered", "1:fs", 3, 4, "chunks")]
    comps, unpaired = compare_definitions(observed, simulated, 5.0)
    got = {(c.definition, c.tier): (round(c.abs_error_pp, 9), c.within) for c in comps}
    # a source only one side lists is 0 hits on the other (both report the by-source split)
    assert got == {("prefix_cache", None): (2.0, True), ("by_source", "device"): (5.0, True),
                   ("by_source", "host"): (0.0, True), ("by_source", "p2p"): (0.0, True),
                   ("by_source", "disk"): (8.0, False)}
    assert comps[0].metric == "vllm:prefix_cache_hits_total" and comps[0].real_hits == 600
    disk = next(c for c in comps if c.tier == "disk")
    assert (disk.real_hits, disk.real_queries, disk.sim_hits) == (0, 1000, 80)
    assert {(u.definition, u.tier, u.side) for u in unpaired} == {
        ("external", None, "observed"), ("tiered", "1:fs", "simulated")}


def test_by_source_is_not_invented_for_a_side_without_the_split() -> None:
    comps, unpaired = compare_definitions([entry("by_source", "device", 5, 10)], [entry("prefix_cache", None, 5, 10)],
                                          5.0)
    assert comps == [] and {(u.definition, u.side) for u in unpaired} == {("by_source", "observed"),
                                                                           ("prefix_cache", "simulated")}


def test_out_of_band_definition_fails_its_own_verdict() -> None:
    comps, _ = compare_definitions([entry("tiered", "1:fs", 80, 100, "chunks")],
                                   [entry("tiered", "1:fs", 60, 100, "chunks")], 5.0)
    assert comps[0].abs_error_pp == pytest.approx(20.0) and comps[0].within is False


def test_legacy_gpu_prefix_cache_pairs_with_prefix_cache_but_never_steals() -> None:
    comps, unpaired = compare_definitions([entry("gpu_prefix_cache", None, 50, 100)],
                                          [entry("prefix_cache", None, 52, 100)], 5.0)
    assert [(c.definition, c.sim_hits) for c in comps] == [("gpu_prefix_cache", 52)] and not unpaired
    comps, unpaired = compare_definitions(
        [entry("gpu_prefix_cache", None, 50, 100), entry("prefix_cache", None, 51, 100)],
        [entry("prefix_cache", None, 52, 100)], 5.0)
    assert [c.definition for c in comps] == ["prefix_cache"]
    assert [(u.definition, u.side) for u in unpaired] == [("gpu_prefix_cache", "observed")]


def test_unit_mismatch_and_zero_queries_are_not_compared() -> None:
    comps, unpaired = compare_definitions([entry("tiered", "1:fs", 5, 10, "chunks"), entry("external", None, 0, 0)],
                                          [entry("tiered", "1:fs", 80, 160, "tokens"), entry("external", None, 1, 2)],
                                          5.0)
    assert comps == []
    reasons = {(u.definition, u.side): u.reason for u in unpaired}
    assert reasons[("tiered", "observed")] == "units differ (observed chunks, simulated tokens)"
    assert reasons[("external", "simulated")] == "zero queries on the observed side"


@dataclass
class R:
    cached_tokens: int


@dataclass
class S:
    cached_tokens: int | None


def request_hit_agreement(pairs: list[tuple[Any, Any]]) -> Any:
    """The agreement of these matched pairs, as calibrate's columns (-1: not reported)."""
    real = np.asarray([r.cached_tokens for r, _ in pairs], dtype=np.int64)
    sim = np.asarray([-1 if getattr(s, "cached_tokens", None) is None else s.cached_tokens for _, s in pairs],
                     dtype=np.int64)
    return _agreement(real, sim)


def test_request_hit_agreement_hand_computed() -> None:
    pairs = [(R(32), S(32)), (R(0), S(16)), (R(48), S(32)), (R(-1), S(16)), (R(16), S(None))]
    a = request_hit_agreement(pairs)
    assert a is not None
    assert (a.requests, a.matching, a.not_reported) == (3, 1, 2)
    assert a.match_share == pytest.approx(1 / 3) and a.mean_abs_diff_tokens == pytest.approx(32 / 3)
    assert (a.real_cached_tokens, a.sim_cached_tokens) == (80, 80)


def test_request_hit_agreement_absent_when_a_side_never_reports() -> None:
    assert request_hit_agreement([(R(-1), S(3)), (R(-1), S(4))]) is None
    assert request_hit_agreement([(R(3), S(None))]) is None

    @dataclass
    class Bare:  # a BLIS SimResult has no cached_tokens at all
        request_id: int = 0

    assert request_hit_agreement([(R(3), Bare())]) is None
