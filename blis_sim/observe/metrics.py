"""vLLM `/metrics` snapshots and the KV hit-rates of a counter window (design D2).

API::

    snap = parse_exposition(text, url="http://h/metrics")   # Snapshot; ScrapeError if not Prometheus text
    window = derive_window(start, end, vllm_commit="", model="tiny-llama")
    window.observed       # the reference's `observed_kv_metrics` block (dict) or None
    window.hit_rates      # every definition the server exposed, as shared-shape entries (list of dicts)
    window.miss_reason    # why `observed` is None ("" when it is not)
    kv_geometry(snap)     # {"block_size": 32, "num_gpu_blocks": 512} from vllm:cache_config_info, or None

Parsing uses prometheus-client and keys on *sample* names (``x_total`` and a bare ``x`` both match
``x``), because a counter's family name depends on whether the exposition carries TYPE lines
(docs/vllm-semantics.md §6). Every label series is summed (over ``engine`` and tiers) after an optional
``model_name`` filter. A window is invalid (a reset) when any counter we read decreases, disappears,
or its ``_created`` timestamp changes between the two snapshots.

Tier I/O (``KvWindow.tier_io``, per tier label): the tiering read/write bytes and seconds per
secondary tier, and the connector's GPU <-> CPU load/store bytes, seconds and transfer counts
(the ``kv_offload_{load,store}_size`` histograms' ``_count``) as tier ``0:primary``.

Faults (``KvWindow.faults``): the offload fault counters of ``FAULT_FAMILIES`` over the window, one entry
per kind and tier the server exposes (a zero count included).

Primary-source precedence follows the reference (docs/reference-formats.md §3.5): the tiered offload
counters (``chunk_*`` as released, or the PR-48798 ``block_*`` spelling) whenever the end snapshot
has them, tagged ``tiered``; else the GPU prefix cache (``prefix_cache_*``, then the legacy
``gpu_prefix_cache_*`` counters, then the V0 gauge), tagged ``gpu-prefix-cache-fallback``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from blis_sim.errors import ScrapeError
from blis_sim.formats.hitrate import PRIMARY_TIER

SOURCE_TIERED = "tiered"
SOURCE_GPU_FALLBACK = "gpu-prefix-cache-fallback"

# (hits family, queries family) per spelling, most current first.
TIERED_FAMILIES = (
    ("vllm:kv_offload_tiering_chunk_hits", "vllm:kv_offload_tiering_chunk_queries"),
    ("vllm:kv_offload_tiering_block_hits", "vllm:kv_offload_tiering_block_queries"),  # PR #48798, unreleased
)
PREFIX_FAMILIES = (
    ("prefix_cache", "vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),  # vLLM >= 0.9
    ("gpu_prefix_cache", "vllm:gpu_prefix_cache_hits", "vllm:gpu_prefix_cache_queries"),  # removed in 0.12
)
EXTERNAL_FAMILIES = ("vllm:external_prefix_cache_hits", "vllm:external_prefix_cache_queries")
BY_SOURCE_FAMILY = "vllm:prompt_tokens_cached_by_source"
GPU_HIT_RATE_GAUGE = "vllm:gpu_prefix_cache_hit_rate"  # V0 gauge, not a counter
TIER_IO_FAMILIES = {
    "read_bytes": "vllm:kv_offload_tiering_read_bytes",
    "read_time_s": "vllm:kv_offload_tiering_read_time",
    "write_bytes": "vllm:kv_offload_tiering_write_bytes",
    "write_time_s": "vllm:kv_offload_tiering_write_time",
}
# The connector's GPU <-> CPU transfers (vLLM 0.32 OffloadingConnector, unlabelled beyond
# model_name/engine): recorded as tier PRIMARY_TIER, read = load (CPU -> GPU), write = store.
CONNECTOR_IO_FAMILIES = {
    "read_bytes": "vllm:kv_offload_load_bytes",
    "read_time_s": "vllm:kv_offload_load_time",
    "read_jobs": "vllm:kv_offload_load_size_count",   # the per-transfer size histogram's count
    "write_bytes": "vllm:kv_offload_store_bytes",
    "write_time_s": "vllm:kv_offload_store_time",
    "write_jobs": "vllm:kv_offload_store_size_count",
}
# Offload faults over the window (docs/vllm-semantics.md §4.1), by kind: (family, the label that names the
# tier, or None for the connector's unlabelled counter, recorded as tier "0:primary").
FAULT_FAMILIES = {
    # the CPU tier could not make room for an offer (connector: a failed prepare_store)
    "allocation_failure": ("vllm:kv_offload_allocation_failure", None),
    # a store from the CPU tier to a secondary tier failed (its chunks are not on that tier)
    "store_failure": ("vllm:kv_offload_tiering_cascade_job_failures", "tier"),
    # a promotion from a secondary tier failed (its chunks were recomputed)
    "promotion_failure": ("vllm:kv_offload_tiering_promotion_job_failures", "tier"),
    # the CPU tier could not make room for a promotion
    "promotion_allocation_failure": ("vllm:kv_offload_tiering_promotion_allocation_failures", None),
}
SERVER_TTFT_FAMILY = "vllm:time_to_first_token_seconds"
CACHE_CONFIG_FAMILY = "vllm:cache_config_info"

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Snapshot:
    """One parsed exposition: sample name → {sorted label tuple: value}."""

    samples: Mapping[str, Mapping[Labels, float]]
    url: str = ""

    def names(self, family: str) -> list[str]:
        """The sample names present for ``family`` (``family_total`` preferred over ``family``)."""
        return [n for n in (family + "_total", family) if n in self.samples]

    def has(self, family: str) -> bool:
        return bool(self.names(family))

    def series(self, family: str, model: str | None = None) -> dict[Labels, float]:
        """Every label series of ``family`` (first spelling present), filtered on ``model_name``.

        The filter applies only when some series carries that model, so a ``--model`` that differs
        from the served name (a path, say) does not silently drop everything.
        """
        names = self.names(family)
        if not names:
            return {}
        out = dict(self.samples[names[0]])
        if model:
            mine = {k: v for k, v in out.items() if dict(k).get("model_name") == model}
            if mine:
                out = mine
        return out

    def total(self, family: str, model: str | None = None) -> float:
        return sum(self.series(family, model).values())

    def by_label(self, family: str, label: str, model: str | None = None) -> dict[str, float]:
        """Sum of ``family`` per value of ``label`` (other labels, e.g. ``engine``, summed away)."""
        out: dict[str, float] = {}
        for labels, value in self.series(family, model).items():
            key = dict(labels).get(label, "")
            out[key] = out.get(key, 0.0) + value
        return out

    def created(self, family: str) -> dict[Labels, float]:
        return dict(self.samples.get(family + "_created", {}))


#: Families whose every sample is a count or a sum of counted things (never NaN or infinite).
_COUNTING = frozenset({"counter", "histogram"})


def parse_exposition(text: str, *, url: str = "") -> Snapshot:
    """Parse Prometheus text exposition. Raises :class:`ScrapeError` naming ``url`` on garbage."""
    samples: dict[str, dict[Labels, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = tuple(sorted(sample.labels.items()))
                value = float(sample.value)
                if family.type in _COUNTING and not math.isfinite(value):  # NaN or Inf would break the window
                    raise ScrapeError(f"{family.type} sample {sample.name}{dict(labels)} is {value}, not a finite "
                                      "number", url=url)
                samples.setdefault(sample.name, {})[labels] = value
    except (ValueError, TypeError, IndexError, OverflowError) as exc:
        head = text.strip().splitlines()[0][:80] if text.strip() else ""
        raise ScrapeError(f"not Prometheus text exposition ({exc}); first line: {head!r}", url=url) from None
    return Snapshot(samples=samples, url=url)


@dataclass
class KvWindow:
    """What one counter window yields. ``observed`` is None on a miss, with ``miss_reason`` set."""

    observed: dict[str, Any] | None = None
    hit_rates: list[dict[str, Any]] = field(default_factory=list)
    tier_io: dict[str, dict[str, float]] = field(default_factory=dict)
    server_ttft: dict[str, float] | None = None
    faults: list[dict[str, Any]] = field(default_factory=list)  # {kind, tier, count, metric}, 0 counts too
    miss_reason: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        """False when the window itself is unusable (a reset): then nothing in it is recorded."""
        return not self.miss_reason.startswith("counter reset")


class _Reset(Exception):
    pass


def _entry(definition: str, tier: str | None, unit: str, hits: float, queries: float,
           metric: str) -> dict[str, Any]:
    return {"definition": definition, "tier": tier, "unit": unit, "hits": int(hits + 0.5),
            "queries": int(queries + 0.5), "hit_rate": hits / queries, "metric": metric}


def _add(out: KvWindow, entry: dict[str, Any]) -> None:
    """Keep an entry unless it is impossible (more hits than queries): then say why in the notes."""
    if entry["hits"] > entry["queries"]:
        tier = f"[{entry['tier']}]" if entry["tier"] else ""
        out.notes.append(f"{entry['definition']}{tier}: {entry['hits']} hits > {entry['queries']} queries "
                         f"over the window ({entry['metric']}); not recorded")
        return
    out.hit_rates.append(entry)


class _Window:
    """Deltas between two snapshots, with reset detection on every counter read."""

    def __init__(self, start: Snapshot, end: Snapshot, model: str | None) -> None:
        self.start, self.end, self.model = start, end, model

    def check(self, family: str) -> None:
        before = self.start.series(family, self.model)
        after = self.end.series(family, self.model)
        name = (self.end.names(family) or [family])[0]
        for labels, old in before.items():
            new = after.get(labels)
            if new is None:
                raise _Reset(f"{name}{_fmt(labels)} disappeared from /metrics")
            if new < old:
                raise _Reset(f"{name}{_fmt(labels)} went backwards ({old:.0f} -> {new:.0f})")
        c0, c1 = self.start.created(family), self.end.created(family)
        for labels, t0 in c0.items():
            if labels in c1 and c1[labels] != t0:
                raise _Reset(f"{family}_created{_fmt(labels)} changed ({t0!r} -> {c1[labels]!r})")

    def delta(self, family: str) -> float:
        self.check(family)
        return self.end.total(family, self.model) - self.start.total(family, self.model)

    def delta_by(self, family: str, label: str) -> dict[str, float]:
        self.check(family)
        a = self.start.by_label(family, label, self.model)
        b = self.end.by_label(family, label, self.model)
        return {k: b[k] - a.get(k, 0.0) for k in sorted(b)}


def _fmt(labels: Labels) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else ""


def derive_window(start: Snapshot, end: Snapshot, *, vllm_commit: str = "",
                  model: str | None = None) -> KvWindow:
    """Every hit-rate definition the end snapshot exposes, over the window ``start`` → ``end``."""
    w = _Window(start, end, model)
    out = KvWindow()
    try:
        _collect_definitions(w, out)
        out.observed, out.miss_reason = _primary(w, out, vllm_commit)
    except _Reset as exc:
        return KvWindow(miss_reason=f"counter reset over the measured window ({exc}; likely a server "
                                    "restart); cannot derive a windowed hit-rate")
    return out


def _collect_definitions(w: _Window, out: KvWindow) -> None:
    for hits_f, queries_f in TIERED_FAMILIES:
        if not w.end.has(queries_f):
            continue
        hits, queries = w.delta_by(hits_f, "tier"), w.delta_by(queries_f, "tier")
        metric = w.end.names(hits_f)[0] if w.end.has(hits_f) else hits_f
        for tier, q in queries.items():
            if q > 0:
                _add(out, _entry("tiered", tier, "chunks", hits.get(tier, 0.0), q, metric))
        if sum(queries.values()) > 0:
            _add(out, _entry("tiered", None, "chunks", sum(hits.values()),
                                        sum(queries.values()), metric))
        break
    prefix_queries: float | None = None
    for definition, hits_f, queries_f in PREFIX_FAMILIES:
        if w.end.has(queries_f):
            q, h = w.delta(queries_f), w.delta(hits_f)
            prefix_queries = q if prefix_queries is None else prefix_queries
            if q > 0:
                _add(out, _entry(definition, None, "tokens", h, q, w.end.names(hits_f)[0]
                                            if w.end.has(hits_f) else hits_f))
            else:
                out.notes.append(f"{queries_f}: zero queries over the window")
    hits_f, queries_f = EXTERNAL_FAMILIES
    if w.end.has(queries_f):
        q, h = w.delta(queries_f), w.delta(hits_f)
        if q > 0:
            _add(out, _entry("external", None, "tokens", h, q, w.end.names(hits_f)[0]
                                        if w.end.has(hits_f) else hits_f))
    if w.end.has(BY_SOURCE_FAMILY) and prefix_queries:
        metric = w.end.names(BY_SOURCE_FAMILY)[0]
        for source, h in w.delta_by(BY_SOURCE_FAMILY, "source").items():
            _add(out, _entry("by_source", source, "tokens", h, prefix_queries, metric))
    for key, family in TIER_IO_FAMILIES.items():
        if w.end.has(family):
            for tier, d in w.delta_by(family, "tier").items():
                out.tier_io.setdefault(tier, {})[key] = d
    for key, family in CONNECTOR_IO_FAMILIES.items():
        if w.end.has(family):  # vLLM creates these series on the first transfer
            out.tier_io.setdefault(PRIMARY_TIER, {})[key] = w.delta(family)
    for kind, (family, label) in FAULT_FAMILIES.items():
        if not w.end.has(family):  # vLLM creates a counter's series on its first increment
            continue
        metric = w.end.names(family)[0]
        counts = {PRIMARY_TIER: w.delta(family)} if label is None else w.delta_by(family, label)
        for tier, n in counts.items():
            out.faults.append({"kind": kind, "tier": tier, "count": int(n + 0.5), "metric": metric})
    if w.end.has(SERVER_TTFT_FAMILY + "_count") and w.end.has(SERVER_TTFT_FAMILY + "_sum"):
        count = w.delta(SERVER_TTFT_FAMILY + "_count")
        total = w.delta(SERVER_TTFT_FAMILY + "_sum")
        out.server_ttft = {"count": count, "sum_s": total,
                           "mean_ms": (total / count * 1000.0) if count > 0 else math.nan}


def _primary(w: _Window, out: KvWindow, vllm_commit: str) -> tuple[dict[str, Any] | None, str]:
    """The reference's `observed_kv_metrics` block, or (None, reason)."""
    commit = {"vllm_commit": vllm_commit} if vllm_commit else {}
    for hits_f, queries_f in TIERED_FAMILIES:
        if w.end.has(queries_f):
            block = _counter_block(w, hits_f, queries_f, SOURCE_TIERED)
            if isinstance(block, str):
                return None, block
            # the reference's totals are the tiering family's, never the connector's GPU <-> CPU times
            read, write = (w.delta(TIER_IO_FAMILIES[k]) if w.end.has(TIER_IO_FAMILIES[k]) else 0.0
                           for k in ("read_time_s", "write_time_s"))
            if read:
                block["read_time_total"] = read
            if write:
                block["write_time_total"] = write
            return {**block, **commit}, ""
    for _definition, hits_f, queries_f in PREFIX_FAMILIES:
        if w.end.has(queries_f):
            block = _counter_block(w, hits_f, queries_f, SOURCE_GPU_FALLBACK)
            if isinstance(block, str):
                return None, block
            return {**block, **commit}, ""
    if w.end.has(GPU_HIT_RATE_GAUGE):
        rate = w.end.total(GPU_HIT_RATE_GAUGE, w.model)
        return {"source": SOURCE_GPU_FALLBACK, "hit_rate": rate, "block_hits": 0, "block_queries": 0,
                **commit}, ""
    looked = [q for _h, q in TIERED_FAMILIES] + [q for _d, _h, q in PREFIX_FAMILIES]
    return None, f"no recognized KV cache counters found in /metrics (looked for {', '.join(looked)})"


def _counter_block(w: _Window, hits_f: str, queries_f: str, source: str) -> dict[str, Any] | str:
    queries, hits = w.delta(queries_f), w.delta(hits_f)
    name = w.end.names(queries_f)[0]
    if queries <= 0:
        return f"{name} shows zero queries over the measured window; cannot derive a hit-rate"
    if hits > queries:
        return (f"{w.end.names(hits_f)[0]} reports more hits ({hits:.0f}) than queries ({queries:.0f}) over "
                "the window (hit-rate > 1 is impossible); refusing to record a bogus value")
    return {"source": source, "hit_rate": hits / queries, "block_hits": int(hits + 0.5),
            "block_queries": int(queries + 0.5)}


def kv_geometry(snap: Snapshot) -> dict[str, int] | None:
    """``{block_size, num_gpu_blocks}`` from ``vllm:cache_config_info`` (engine 0's series), or None."""
    series = sorted(snap.samples.get(CACHE_CONFIG_FAMILY, {}),
                    key=lambda labels: dict(labels).get("engine", ""))
    for labels in series:
        info = dict(labels)
        geometry = {k: _int_or_none(info.get(k)) for k in ("block_size", "num_gpu_blocks")}
        if geometry["block_size"] is not None:
            return {k: v for k, v in geometry.items() if v is not None}
    return None


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def summarize(entries: Iterable[Mapping[str, Any]]) -> str:
    """One line per definition, for logs: ``prefix_cache: 29696/48579 = 61.13 % (tokens)``."""
    return "; ".join(
        f"{e['definition']}{'[' + str(e['tier']) + ']' if e['tier'] else ''}: "
        f"{e['hits']}/{e['queries']} = {100 * e['hit_rate']:.2f} % ({e['unit']})" for e in entries)
