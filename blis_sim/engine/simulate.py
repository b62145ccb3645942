"""One simulation: a :class:`RequestTable` through the step loop and a :class:`blis_sim.kv.KVCache`.

:class:`EngineOptions` holds every knob (the reference's simulator flags plus ours);
:func:`build_kv` makes the cache from the resolved geometry and offload config;
:func:`simulate_table` runs the loop and returns a :class:`SimOutcome`: the loop's per-request
arrays, the frontend term, the KV counters, and the hit-rates of design D2 over the comparison
window (per request for the token definitions, from counter snapshots for the per-tier chunks).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from blis_sim.engine.kvport import CacheOps, LoopPort, kv_port
from blis_sim.engine.latency import LatencyModel, StepModel
from blis_sim.engine.requests import RequestTable, concat_rows
from blis_sim.engine.scheduler import Feed, LoopResult, SchedulerConfig, Workload, simulate
from blis_sim.errors import ConfigError
from blis_sim.formats._io import gc_paused
from blis_sim.kv import KVCache, TierStation, from_offload_config

if TYPE_CHECKING:
    from blis_sim.formats.offload import OffloadConfig

SOURCES = ("device", "host", "disk")


@dataclass(frozen=True)
class EngineOptions:
    """Simulator knobs. ``None``: not given, resolved by
    :func:`~blis_sim.engine.settings.resolve_settings` (flag, trace header, model, default), which
    fills ``sources`` (setting → ``flag`` / ``header`` / ``model`` / ``default``)."""

    model: str = ""
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    long_prefill_token_threshold: int | None = None
    seed: int = 42
    horizon_us: float | None = None
    latency: StepModel | None = None
    latency_source: str = "default"
    kv_offload: OffloadConfig | None = None  # a resolved OffloadConfig (given, or the trace header's)
    kv_bytes_per_token: float | None = None
    model_config: str | None = None     # a local config.json: KV size and capacity of the model
    hardware: str | None = None         # the device of the model's KV capacity (default H100)
    tp: int = 1
    kv_backend: str | None = None       # "cython" | "python" | None (tests)
    # Replay only: the trace's client had one request in flight at a time (observe
    # --max-concurrency 1), so each request waits for the simulated previous one to finish.
    sequential: bool = False
    loop_backend: Any = None            # a loop module (tests)
    sources: dict[str, str] = field(default_factory=dict, hash=False)

    def scheduler(self, horizon_us: float | None = None) -> SchedulerConfig:
        assert self.max_num_seqs is not None and self.max_num_batched_tokens is not None, \
            "resolve_settings first"
        h = self.horizon_us if self.horizon_us is not None else horizon_us
        return SchedulerConfig(max_num_seqs=self.max_num_seqs,
                               max_num_batched_tokens=self.max_num_batched_tokens,
                               long_prefill_token_threshold=self.long_prefill_token_threshold or 0,
                               horizon_us=float(h) if h is not None else math.inf)


@dataclass
class SimOutcome:
    table: RequestTable
    loop: LoopResult
    cached: np.ndarray            # (n, 3) device/host/disk tokens at first admission
    admitted: np.ndarray          # bool
    frontend_us: np.ndarray
    kv_counters: dict[str, Any]
    hit_rates: list[dict[str, Any]]
    block_size: int
    num_gpu_blocks: int
    offload: OffloadConfig | None
    dropped: np.ndarray
    tier_io: list[dict[str, Any]] = field(default_factory=list)  # per tier, over the window
    replica: np.ndarray | None = None  # int64 per row: the cluster replica that served it (None: one server)

    @property
    def completed(self) -> np.ndarray:
        return ~np.isnan(self.loop.finish_us)

    @property
    def ttft_us(self) -> np.ndarray:
        return self.loop.first_token_us - self.loop.arrival_us + self.frontend_us

    @property
    def e2e_us(self) -> np.ndarray:
        return self.loop.finish_us - self.loop.arrival_us + self.frontend_us


def build_kv(num_gpu_blocks: int, block_size: int, offload: OffloadConfig | None, seed: int,
             backend: str | None = None) -> CacheOps:
    bytes_per_block = 0
    if offload is not None:
        bytes_per_block = int(offload.bytes_per_chunk // offload.blocks_per_chunk)
        if offload.gpu_block_size != block_size:
            raise ConfigError(f"the offload config was resolved for GPU block size "
                              f"{offload.gpu_block_size}, the simulation uses {block_size}",
                              field="kv_offload.block_size")
    link = None
    if offload is not None and offload.cpu_link is not None:  # the offload config's fitted or given link
        link = TierStation(read_bandwidth=offload.cpu_link.read_bandwidth,
                           write_bandwidth=offload.cpu_link.write_bandwidth,
                           base_latency=offload.cpu_link.base_latency)
    cfg = from_offload_config(offload, block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                              bytes_per_block=bytes_per_block, seed=seed, link=link)
    return KVCache(cfg, backend=backend)


def inflight_at_arrival(arrival: np.ndarray, finish: np.ndarray) -> np.ndarray:
    """Requests in flight when each one arrives: arrived earlier, not finished by then (a
    never-finished request stays in flight)."""
    arr_sorted = np.sort(arrival)
    fin = np.where(np.isnan(finish), np.inf, finish)
    fin_sorted = np.sort(fin)
    return (np.searchsorted(arr_sorted, arrival, side="left")
            - np.searchsorted(fin_sorted, arrival, side="right")).clip(min=0)


def admission_queue(arrival: np.ndarray, admission_us: float) -> tuple[np.ndarray, np.ndarray]:
    """Requests taken in one at a time, ``admission_us`` each, in arrival order: per request, its
    place in its busy period (0 for the one that found the frontend free) and the time since that
    busy period began. Its wait is ``place · admission_us − since`` (≥ 0), linear in
    ``admission_us`` for a given grouping — which is how ``fit`` uses it."""
    n = arrival.shape[0]
    place, since = np.zeros(n), np.zeros(n)
    if admission_us <= 0.0 or n == 0:
        return place, since
    free, began, k = -np.inf, 0.0, 0
    for i in np.lexsort((np.arange(n), arrival)).tolist():
        a = float(arrival[i])
        if a >= free:  # the frontend is free: a new busy period
            began, k, free = a, 0, a + admission_us
        else:
            k += 1
            free += admission_us
        place[i], since[i] = k, a - began
    return place, since


def frontend_term(model: LatencyModel, arrival: np.ndarray, finish: np.ndarray) -> np.ndarray:
    """Each request's frontend time: the base, the wait for admission (:func:`admission_queue`),
    and the in-flight term, whose load is what a client sees: requests sent earlier whose
    response (engine finish + their own frontend time) has not ended yet — the same count ``fit``
    takes from an observed trace's send and last-chunk times. Computed in arrival order."""
    per, admission = model.frontend_per_inflight_us, model.frontend_admission_us
    fixed = np.full(arrival.shape[0], model.frontend_base_us)
    if admission > 0.0:
        place, since = admission_queue(arrival, admission)
        fixed += place * admission - since
    if per == 0.0:
        return fixed

    out = np.empty(arrival.shape[0])
    ends: list[float] = []
    order = np.lexsort((np.arange(arrival.shape[0]), arrival))
    fin = np.where(np.isnan(finish), np.inf, finish)
    for i in order.tolist():
        a = arrival[i]
        while ends and ends[0] <= a:
            heapq.heappop(ends)
        f = fixed[i] + per * len(ends)
        out[i] = f
        heapq.heappush(ends, fin[i] + f)
    return out


def simulate_table(table: RequestTable, kv: CacheOps, options: EngineOptions, *, block_size: int,
                   num_gpu_blocks: int, offload: OffloadConfig | None, content_seed: int,
                   horizon_us: float | None = None, log_steps: bool = False) -> SimOutcome:
    """Run the step loop over ``table`` against ``kv`` (which may carry state from earlier phases);
    ``options`` resolved (:func:`~blis_sim.engine.settings.resolve_settings`)."""
    assert options.latency is not None, "resolve_settings first"
    dropped = dropped_rows(table, num_gpu_blocks, block_size)
    first = _window_first(table, dropped)
    port = kv_port(kv, table.content(content_seed, block_size), window_first=first)
    loop = run_table_loop(table, port, options, dropped, block_size=block_size, offload=offload,
                          horizon_us=horizon_us, log_steps=log_steps)
    admitted, cached = port.admitted, port.cached
    window = port.window_snapshot if first >= 0 else None
    del port  # the port's per-request records go before the arrays made below
    frontend = frontend_term(options.latency, loop.arrival_us, loop.finish_us)
    counters = kv.snapshot()
    rates = hit_rates(table, admitted, cached, counters, window, tiers=offload is not None)
    return SimOutcome(table=table, loop=loop, cached=cached, admitted=admitted,
                      frontend_us=frontend, kv_counters=counters, hit_rates=rates,
                      block_size=block_size, num_gpu_blocks=num_gpu_blocks, offload=offload,
                      dropped=dropped,
                      tier_io=tier_io(counters, window) if offload is not None else [])


def dropped_rows(table: RequestTable, num_gpu_blocks: int, block_size: int) -> np.ndarray:
    """The rows that could never fit in the GPU cache (dropped as unservable before the run)."""
    capacity = (num_gpu_blocks - 1) * block_size  # vLLM's null block is never handed out
    return (table.prompt_len + np.maximum(table.output_len, 1) - 1) > capacity


def run_table_loop(table: RequestTable, port: LoopPort, options: EngineOptions, dropped: np.ndarray, *,
                   block_size: int, offload: OffloadConfig | None, horizon_us: float | None = None,
                   log_steps: bool = False, feed: Feed | None = None) -> LoopResult:
    """The step loop over ``table``'s rows against ``port`` (``feed``: routed by load,
    :mod:`blis_sim.engine.load_routing`)."""
    assert options.latency is not None, "resolve_settings first"
    workload = Workload(arrival_us=table.arrival_us, prompt_len=table.prompt_len,
                        output_len=table.output_len, next_round=table.next_round,
                        think_us=table.think_us, dropped=dropped)
    store_chunk = 0
    prompt_only = True
    if offload is not None:
        store_chunk = int(offload.block_size)
        prompt_only = bool(offload.offload_prompt_only)
    with gc_paused():  # the loop makes no cycles; a full collection would walk every trace row
        return simulate(workload, port, options.latency, options.scheduler(horizon_us),
                        block_size=block_size, store_chunk_tokens=store_chunk,
                        store_prompt_only=prompt_only,
                        log_steps=log_steps, backend=options.loop_backend, feed=feed)


def _window_first(table: RequestTable, dropped: np.ndarray) -> int:
    """The first request of the comparison window to arrive (-1: the window is every request),
    found before the loop so that its index arrays are gone while the loop runs."""
    window_idx = np.flatnonzero(table.in_window & ~dropped)
    if not window_idx.size or window_idx.size == len(table):
        return -1
    return int(window_idx[np.argmin(table.arrival_us[window_idx])])


def _entry(definition: str, tier: str | None, unit: str, hits: int, queries: int) -> dict[str, Any]:
    return {"definition": definition, "tier": tier, "unit": unit, "hits": int(hits),
            "queries": int(queries), "hit_rate": hits / queries if queries else 0.0, "metric": None}


def hit_rates(table: RequestTable, admitted: np.ndarray, cached_tokens: np.ndarray,
              end: dict[str, Any], start: dict[str, Any] | None, *,
              tiers: bool) -> list[dict[str, Any]]:
    """Design D2's definitions over the window: token ones summed per request at first admission
    (exactly vLLM's counting; ``cached_tokens[i]`` = device/host/disk), per-tier chunk ones from
    the counter snapshots ``start`` (None: from zero) and ``end``."""
    queries, ext_q, by_source = _token_sums(table.prompt_len, table.in_window & admitted, cached_tokens)
    out = [_entry("prefix_cache", None, "tokens", by_source[0], queries)]
    if tiers:
        out.append(_entry("external", None, "tokens", by_source[1] + by_source[2], ext_q))
    for k, src in enumerate(SOURCES):
        if k == 0 or tiers:
            out.append(_entry("by_source", src, "tokens", by_source[k], queries))
    for label, t in end.get("tiers", {}).items():
        hits, qs = int(t["chunk_hits"]), int(t["chunk_queries"])
        if start is not None and label in start.get("tiers", {}):
            hits -= int(start["tiers"][label]["chunk_hits"])
            qs -= int(start["tiers"][label]["chunk_queries"])
        out.append(_entry("tiered", label, "chunks", hits, qs))
    return out


#: rows summed at a time by :func:`_token_sums`: its temporaries are a chunk's, not the trace's
_SUM_ROWS = 1 << 20


def _token_sums(prompt_len: np.ndarray, sel: np.ndarray,
                cached: np.ndarray) -> tuple[int, int, list[int]]:
    """Over the rows ``sel``: the prompt tokens, the tokens the GPU did not hold (the external
    queries) and the cached tokens of each source, summed a chunk of rows at a time (integer
    sums: the same totals in any grouping)."""
    queries, external, by_source = 0, 0, [0, 0, 0]
    for lo in range(0, prompt_len.shape[0], _SUM_ROWS):
        s = sel[lo:lo + _SUM_ROWS]
        prompt, c = prompt_len[lo:lo + _SUM_ROWS][s], cached[lo:lo + _SUM_ROWS][s]
        queries += int(prompt.sum())
        external += int(np.maximum(prompt - c[:, 0], 0).sum())
        for k in range(3):
            by_source[k] += int(c[:, k].sum())
    return queries, external, by_source


def tier_io(end: dict[str, Any], start: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each tier's transfer counters over the window (the trace header's ``TierIO`` shape: bytes,
    seconds of station service time, jobs), from the snapshots ``start`` (None: from zero) and ``end``."""
    out = []
    for label, t in end.get("tiers", {}).items():
        s = (start or {}).get("tiers", {}).get(label, {})
        row: dict[str, Any] = {"tier": label}
        for way in ("read", "write"):
            row[f"{way}_bytes"] = int(t[f"{way}_bytes"]) - int(s.get(f"{way}_bytes", 0))
            row[f"{way}_time_s"] = (float(t[f"{way}_time_us"]) - float(s.get(f"{way}_time_us", 0.0))) / 1e6
            row[f"{way}_jobs"] = int(t[f"{way}_jobs"]) - int(s.get(f"{way}_jobs", 0))
        out.append(row)
    return out


def combine_outcomes(parts: list[SimOutcome], kv: CacheOps, offload: OffloadConfig | None,
                     window_start: dict[str, Any] | None = None) -> SimOutcome:
    """Phases simulated one after the other on the same ``kv`` as one outcome (rows in phase
    order). ``window_start``: the counter snapshot taken before the first phase of the comparison
    window (None: from zero)."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        raise ValueError("nothing was simulated")
    t, loop, admitted, cached = concat_parts(parts)
    counters = kv.snapshot()
    return SimOutcome(table=t, loop=loop, cached=cached, admitted=admitted,
                      frontend_us=np.concatenate([p.frontend_us for p in parts]), kv_counters=counters,
                      hit_rates=hit_rates(t, admitted, cached, counters, window_start,
                                          tiers=offload is not None),
                      block_size=parts[0].block_size, num_gpu_blocks=parts[0].num_gpu_blocks,
                      offload=offload, dropped=np.concatenate([p.dropped for p in parts]),
                      tier_io=tier_io(counters, window_start) if offload is not None else [])


def concat_parts(parts: list[SimOutcome]) -> tuple[RequestTable, LoopResult, np.ndarray, np.ndarray]:
    """The parts' tables, loop results, admitted flags and cached tokens one after the other
    (phases of one server, or the replicas of a cluster)."""

    def cat(get: Any) -> np.ndarray:
        return np.concatenate([get(p) for p in parts])

    tables = [p.table for p in parts]
    t = RequestTable(
        request_id=cat(lambda p: p.table.request_id), arrival_us=cat(lambda p: p.table.arrival_us),
        prompt_len=cat(lambda p: p.table.prompt_len), output_len=cat(lambda p: p.table.output_len),
        next_round=cat(lambda p: p.table.next_round), think_us=cat(lambda p: p.table.think_us),
        group=cat(lambda p: p.table.group), shared_prefix=cat(lambda p: p.table.shared_prefix),
        session=cat(lambda p: p.table.session), prev_round=cat(lambda p: p.table.prev_round),
        new_input=cat(lambda p: p.table.new_input), in_window=cat(lambda p: p.table.in_window),
        keys=concat_rows([tb.keys for tb in tables]), group_names=[], session_names=[],
        source=concat_rows([tb.source for tb in tables]), observed=tables[0].observed)
    loops = [p.loop for p in parts]
    loop = LoopResult(
        arrival_us=cat(lambda p: p.loop.arrival_us), first_token_us=cat(lambda p: p.loop.first_token_us),
        finish_us=cat(lambda p: p.loop.finish_us), itl_sum_us=cat(lambda p: p.loop.itl_sum_us),
        num_out=cat(lambda p: p.loop.num_out), preemptions=cat(lambda p: p.loop.preemptions),
        first_sched_us=cat(lambda p: p.loop.first_sched_us), status=cat(lambda p: p.loop.status),
        itl_values=cat(lambda p: p.loop.itl_values), itl_weights=cat(lambda p: p.loop.itl_weights),
        steps=sum(lp.steps for lp in loops),
        preemption_count=sum(lp.preemption_count for lp in loops), end_us=loops[-1].end_us)
    if all(lp.step_start is not None for lp in loops):  # step logs (fit) run on across phases
        loop.step_start = cat(lambda p: p.loop.step_start)
        loop.step_dur = cat(lambda p: p.loop.step_dur)
        loop.step_features = np.vstack([lp.step_features for lp in loops
                                        if lp.step_features is not None])

    return t, loop, cat(lambda p: p.admitted), cat(lambda p: p.cached)
