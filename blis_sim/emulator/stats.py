"""Counters and histograms the engine accumulates, and the snapshots `/metrics` publishes.

API::

    stats = EngineStats()            # all zero; ``created`` = now (epoch seconds)
    stats.prefix_queries += n ...    # the scheduler and the offload tiers update plain attributes
    stats.ttft.observe(0.012)        # Histogram.observe
    snap = stats.snapshot()          # deep copy, what a stats-logging interval publishes

Units follow vLLM: token counters in tokens, tiering counters in chunks, times in seconds, bytes in
bytes. The tier-keyed dicts only get a key once that tier saw an event (vLLM creates a tier's series
on its first event).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from bisect import bisect_left
from dataclasses import dataclass, field

TOKEN_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)
ITERATION_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
                     8192.0, 16384.0)
N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
PREEMPTION_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
# Bytes per GPU <-> CPU transfer job (vLLM 0.32's offloading connector).
TRANSFER_SIZE_BUCKETS = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)

CACHE_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


class Histogram:
    """Fixed upper bounds (``+Inf`` implied); per-bucket (non-cumulative) counts and a sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def copy(self) -> Histogram:
        out = Histogram.__new__(Histogram)
        out.bounds = self.bounds
        out.counts = list(self.counts)
        out.sum = self.sum
        return out

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs as the exposition writes them, ending with ``+Inf``."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, n in zip(self.bounds, self.counts):
            running += n
            out.append((repr(float(bound)), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


@dataclass
class TierCounters:
    """Per-tier tiering counters (``tier`` label "0:primary", "1:fs", ...)."""

    chunk_queries: int = 0
    chunk_hits: int = 0
    read_bytes: int = 0
    read_time: float = 0.0
    write_bytes: int = 0
    write_time: float = 0.0
    promotion_job_failures: int = 0
    cascade_job_failures: int = 0


def _hist(bounds: tuple[float, ...]):  # type: ignore[no-untyped-def]
    return field(default_factory=lambda: Histogram(bounds))


@dataclass
class EngineStats:
    """Everything `/metrics` reports that accumulates; reset as a whole on a (simulated) restart."""

    created: float = field(default_factory=time.time)
    prefix_queries: int = 0
    prefix_hits: int = 0
    external_queries: int = 0
    external_hits: int = 0
    cached_by_source: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CACHE_SOURCES, 0))
    prompt_tokens_cached: int = 0
    prompt_by_source: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROMPT_SOURCES, 0))
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    request_success: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    # Offload connector (GPU <-> CPU) totals and per-tier tiering counters.
    offload_load_bytes: int = 0
    offload_load_time: float = 0.0
    offload_store_bytes: int = 0
    offload_store_time: float = 0.0
    offload_allocation_failures: int = 0
    offload_stores_skipped: int = 0  # store_threshold not reached (vLLM: only with store_threshold >= 2)
    promotion_allocation_failures: int = 0
    tiers: dict[str, TierCounters] = field(default_factory=dict)
    # Histograms.
    ttft: Histogram = _hist(TTFT_BUCKETS)
    itl: Histogram = _hist(ITL_BUCKETS)
    tpot: Histogram = _hist(ITL_BUCKETS)
    e2e: Histogram = _hist(REQUEST_LATENCY_BUCKETS)
    queue_time: Histogram = _hist(REQUEST_LATENCY_BUCKETS)
    inference_time: Histogram = _hist(REQUEST_LATENCY_BUCKETS)
    prefill_time: Histogram = _hist(REQUEST_LATENCY_BUCKETS)
    decode_time: Histogram = _hist(REQUEST_LATENCY_BUCKETS)
    request_prompt_tokens: Histogram = _hist(TOKEN_BUCKETS)
    request_generation_tokens: Histogram = _hist(TOKEN_BUCKETS)
    request_max_tokens: Histogram = _hist(TOKEN_BUCKETS)
    request_max_generation_tokens: Histogram = _hist(TOKEN_BUCKETS)
    request_params_n: Histogram = _hist(N_BUCKETS)
    iteration_tokens: Histogram = _hist(ITERATION_BUCKETS)
    request_num_preemptions: Histogram = _hist(PREEMPTION_BUCKETS)
    request_prefill_kv_computed: Histogram = _hist(TOKEN_BUCKETS)
    offload_load_size: Histogram = _hist(TRANSFER_SIZE_BUCKETS)  # one observation per load job
    offload_store_size: Histogram = _hist(TRANSFER_SIZE_BUCKETS)

    def tier(self, label: str) -> TierCounters:
        counters = self.tiers.get(label)
        if counters is None:
            counters = self.tiers[label] = TierCounters()
        return counters

    def snapshot(self) -> EngineStats:
        """A copy that later updates do not touch (hand-rolled: ``deepcopy`` walks every object generically, and
        a snapshot is taken at every scrape and stats interval)."""
        out = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, Histogram):
                setattr(out, name, value.copy())
            elif isinstance(value, dict):
                setattr(out, name, {k: (dataclasses.replace(v) if isinstance(v, TierCounters) else v)
                                    for k, v in value.items()})
        return out
