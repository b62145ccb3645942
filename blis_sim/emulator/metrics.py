"""`/metrics` exactly as vLLM serves it, from the engine's published stats, per metric profile.

API::

    registry = build_registry(source, config, geometry, offload_spec)  # a private CollectorRegistry
    text = render(registry)          # bytes in the Prometheus text format (prometheus-client's writer)

``source()`` returns the latest :class:`Published` (stats snapshot + gauges), which the engine
refreshes every ``stats_interval_s`` (vLLM updates its counters when the engine logs stats).

Exposition (checked against a real vLLM 0.32 on CPU, ``samples/vllm-cpu/metrics-after.txt``): labels
``engine`` and ``model_name`` on every vLLM series (``admission_rejections`` has no ``engine``),
labels sorted, counters exposed as ``<name>_total`` with their ``<name>_created`` gauge (turn off
with ``created_series=False``, as vLLM in multiprocess mode serves it), histograms as ``_bucket``,
``_count``, ``_sum``, plus the process/GC collectors and ``http_requests_total`` that a real server
also carries.

Metric profiles (``--metrics-profile``) choose the KV-cache families:

* ``vllm-0.33`` (default): ``prefix_cache_*``, ``external_prefix_cache_*``,
  ``prompt_tokens_cached``, ``prompt_tokens_by_source``, ``prompt_tokens_cached_by_source``,
  ``mm_cache_*``; with offload on, ``kv_offload_tiering_chunk_{queries,hits}{tier}``,
  ``kv_offload_tiering_{read,write}_{bytes,time}{tier}``, job-failure counters, the transfer-pin
  gauge ``kv_offload_cpu_cache_usage_perc``, active promotion/cascade job gauges, and the connector's
  ``kv_offload_{load,store}_{bytes,time}``, the per-job size histograms ``kv_offload_{load,store}_size``
  and the deprecated ``kv_offload_total_{bytes,time}{transfer_type}`` / ``kv_offload_size{transfer_type}``.
  Times are the emulator's own station service times (``latency + bytes / bandwidth`` per job, from
  the profile's host link and each tier's configured bandwidths), so a derivation from these series
  can be checked against the configuration.
* ``vllm-pr48798``: as above but the tiered counters spelled ``..._block_{queries,hits}`` (vLLM main
  between PR #48798 and #52812), and no ``prompt_tokens_cached_by_source`` (added in 0.33).
* ``vllm-0.11``: the legacy ``gpu_prefix_cache_{queries,hits}`` and ``gpu_cache_usage_perc`` instead
  of ``prefix_cache_*`` / ``kv_cache_usage_perc``; no by-source or tiering families.
* ``none``: no KV-cache counters at all (the gauge and ``cache_config_info`` stay).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from blis_sim.emulator.config import EmulatorConfig, Geometry, OffloadSpec
from blis_sim.emulator.offload import PRIMARY_LABEL
from blis_sim.emulator.stats import CACHE_SOURCES, EngineStats, Histogram

BASE = ("engine", "model_name")


@dataclass
class Published:
    """What one stats-logging interval makes visible."""

    stats: EngineStats
    running: int = 0
    waiting: int = 0
    waiting_deferred: int = 0
    kv_usage: float = 0.0
    offload_pin_share: float = 0.0  # CPU tier share pinned by in-flight transfers
    active_promotions: dict[str, int] = field(default_factory=dict)  # tier -> jobs
    active_cascades: dict[str, int] = field(default_factory=dict)
    http: dict[tuple[str, str, str], int] = field(default_factory=dict)


_HIST_DOCS: tuple[tuple[str, str, str], ...] = (
    ("request_prompt_tokens", "vllm:request_prompt_tokens", "Number of prefill tokens processed."),
    ("request_generation_tokens", "vllm:request_generation_tokens",
     "Number of generation tokens processed."),
    ("iteration_tokens", "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step."),
    ("request_max_generation_tokens", "vllm:request_max_num_generation_tokens",
     "Histogram of maximum number of requested generation tokens."),
    ("request_params_n", "vllm:request_params_n", "Histogram of the n request parameter."),
    ("request_max_tokens", "vllm:request_params_max_tokens",
     "Histogram of the max_tokens request parameter."),
    ("ttft", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
    ("itl", "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    ("tpot", "vllm:request_time_per_output_token_seconds",
     "Histogram of time_per_output_token_seconds per request."),
    ("e2e", "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
    ("queue_time", "vllm:request_queue_time_seconds",
     "Histogram of time spent in WAITING phase for request."),
    ("inference_time", "vllm:request_inference_time_seconds",
     "Histogram of time spent in RUNNING phase for request."),
    ("prefill_time", "vllm:request_prefill_time_seconds",
     "Histogram of time spent in PREFILL phase for request."),
    ("decode_time", "vllm:request_decode_time_seconds",
     "Histogram of time spent in DECODE phase for request."),
    ("request_num_preemptions", "vllm:request_num_preemptions",
     "Histogram of the number of times a request was preempted."),
    ("request_prefill_kv_computed", "vllm:request_prefill_kv_computed_tokens",
     "Histogram of new KV tokens computed during prefill (excluding cached tokens)."),
)

_BY_SOURCE_DOC = ("Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
                  "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
                  "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
                  "vllm:external_prefix_cache_hits.")


class VllmCollector(Collector):
    """Yields vLLM's metric families from the latest published stats."""

    def __init__(self, source: Callable[[], Published], config: EmulatorConfig, geometry: Geometry,
                 offload: OffloadSpec | None) -> None:
        self.source = source
        self.profile = config.metrics_profile
        self.created_series = config.created_series
        self.base_values = [config.engine_index, config.model]
        self.model = config.model
        self.info_labels = _cache_config_labels(config, geometry, offload)
        self.offload_on = offload is not None
        self.store_threshold = offload.store_threshold if offload is not None else 0

    # -- family builders ---------------------------------------------------------------------------
    def _counter(self, name: str, doc: str, value: float, created: float,
                 extra: dict[str, str] | None = None) -> CounterMetricFamily:
        fam = CounterMetricFamily(name, doc, labels=list(BASE) + list(extra or ()))
        fam.add_metric(self.base_values + list((extra or {}).values()), value,
                       created=created if self.created_series else None)
        return fam

    def _labelled_counter(self, name: str, doc: str, label: str, values: Mapping[str, float],
                          created: float) -> CounterMetricFamily:
        fam = CounterMetricFamily(name, doc, labels=list(BASE) + [label])
        for key, value in values.items():
            fam.add_metric(self.base_values + [key], value,
                           created=created if self.created_series else None)
        return fam

    def _gauge(self, name: str, doc: str, value: float, extra: dict[str, str] | None = None
               ) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(name, doc, labels=list(BASE) + list(extra or ()))
        fam.add_metric(self.base_values + list((extra or {}).values()), value)
        return fam

    def _histogram(self, name: str, doc: str, hist: Histogram, created: float) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, doc, labels=list(BASE))
        fam.add_metric(self.base_values, hist.cumulative(), hist.sum)
        if self.created_series:
            fam.samples.append(Sample(name + "_created", dict(zip(BASE, self.base_values)), created))
        return fam

    # -- collect -----------------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        pub = self.source()
        s = pub.stats
        c = s.created
        profile = self.profile
        legacy = profile == "vllm-0.11"
        kv = profile != "none"
        if profile == "vllm-0.33":
            for what in ("flops", "read_bytes", "write_bytes"):
                noun = "floating point operations" if what == "flops" else \
                    f"bytes {'read from' if what == 'read_bytes' else 'written to'} memory"
                yield self._counter(f"vllm:estimated_{what}_per_gpu",
                                    f"Estimated number of {noun} per GPU (for Model Flops Utilization "
                                    "calculations).", 0, c)
        yield self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                          pub.running)
        yield self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                          pub.waiting)
        fam = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
            "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, "
            "blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            labels=list(BASE) + ["reason"])
        fam.add_metric(self.base_values + ["capacity"], pub.waiting - pub.waiting_deferred)
        fam.add_metric(self.base_values + ["deferred"], pub.waiting_deferred)
        yield fam
        fam = GaugeMetricFamily(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            labels=list(BASE) + ["sleep_state"])
        for state, value in (("awake", 1.0), ("weights_offloaded", 0.0), ("discard_all", 0.0)):
            fam.add_metric(self.base_values + [state], value)
        yield fam
        if legacy:
            yield self._gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.",
                              pub.kv_usage)
        else:
            yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                              pub.kv_usage)
        if kv and legacy:
            yield self._counter("vllm:gpu_prefix_cache_queries",
                                "GPU prefix cache queries, in terms of number of queried tokens.",
                                s.prefix_queries, c)
            yield self._counter("vllm:gpu_prefix_cache_hits",
                                "GPU prefix cache hits, in terms of number of cached tokens.",
                                s.prefix_hits, c)
        elif kv:
            yield self._counter("vllm:prefix_cache_queries",
                                "Prefix cache queries, in terms of number of queried tokens.",
                                s.prefix_queries, c)
            yield self._counter("vllm:prefix_cache_hits",
                                "Prefix cache hits, in terms of number of cached tokens.", s.prefix_hits, c)
            yield self._counter("vllm:external_prefix_cache_queries",
                                "External prefix cache queries from KV connector cross-instance cache "
                                "sharing, in terms of number of queried tokens.", s.external_queries, c)
            yield self._counter("vllm:external_prefix_cache_hits",
                                "External prefix cache hits from KV connector cross-instance cache "
                                "sharing, in terms of number of cached tokens.", s.external_hits, c)
            if profile == "vllm-0.33":
                yield self._counter("vllm:mm_cache_queries",
                                    "Multi-modal cache queries, in terms of number of queried items.", 0, c)
                yield self._counter("vllm:mm_cache_hits",
                                    "Multi-modal cache hits, in terms of number of cached items.", 0, c)
        yield self._counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                            s.num_preemptions, c)
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens, c)
        if kv and not legacy:
            yield self._labelled_counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                                         "source", s.prompt_by_source, c)
            yield self._counter("vllm:prompt_tokens_cached",
                                "Number of cached prompt tokens (local + external).",
                                s.prompt_tokens_cached, c)
        if kv and profile == "vllm-0.33":
            yield self._labelled_counter("vllm:prompt_tokens_cached_by_source", _BY_SOURCE_DOC, "source",
                                         {k: s.cached_by_source.get(k, 0) for k in CACHE_SOURCES}, c)
        yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.",
                            s.generation_tokens, c)
        yield self._labelled_counter("vllm:request_success", "Count of successfully processed requests.",
                                     "finished_reason", s.request_success, c)
        rejections = CounterMetricFamily("vllm:admission_rejections",
                                         "Number of admission attempts rejected by a queue limit, by reason.",
                                         labels=["model_name", "reason"])
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.add_metric([self.model, reason], 0, created=c if self.created_series else None)
        yield rejections
        for attr, name, doc in _HIST_DOCS:
            yield self._histogram(name, doc, getattr(s, attr), c)
        if kv and self.offload_on and profile in ("vllm-0.33", "vllm-pr48798"):
            yield from self._offload_families(s)
            yield from self._offload_gauges(pub)
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                 labels=list(self.info_labels))
        info.add_metric(list(self.info_labels.values()), 1.0)
        yield info
        yield from self._http_families(pub)

    def _offload_families(self, s: EngineStats) -> Iterator[Metric]:
        c = s.created
        spelling = "block" if self.profile == "vllm-pr48798" else "chunk"
        tiers = s.tiers
        per_tier = (
            (f"vllm:kv_offload_tiering_{spelling}_queries",
             f"Number of offloading {spelling} lookups that resolved, per tier.", "chunk_queries"),
            (f"vllm:kv_offload_tiering_{spelling}_hits",
             f"Number of offloading {spelling} lookups that resolved as a hit, per tier.", "chunk_hits"),
            ("vllm:kv_offload_tiering_read_bytes", "Bytes read from a tier (towards the GPU).", "read_bytes"),
            ("vllm:kv_offload_tiering_read_time",
             "Seconds of device service time spent reading from a tier.", "read_time"),
            ("vllm:kv_offload_tiering_write_bytes", "Bytes written to a tier.", "write_bytes"),
            ("vllm:kv_offload_tiering_write_time",
             "Seconds of device service time spent writing to a tier.", "write_time"),
            ("vllm:kv_offload_tiering_promotion_job_failures",
             "Failed promotion jobs (secondary tier to primary), per tier.", "promotion_job_failures"),
            ("vllm:kv_offload_tiering_cascade_job_failures",
             "Failed cascade jobs (primary tier to secondary), per tier.", "cascade_job_failures"),
        )
        for name, doc, attr in per_tier:
            # Lookups are counted for every tier; transfer jobs run only between the primary tier
            # and a secondary one, and vLLM labels them with the secondary tier.
            values = {t: getattr(v, attr) for t, v in tiers.items()
                      if attr.startswith("chunk_") or t != PRIMARY_LABEL}
            if values:
                yield self._labelled_counter(name, doc, "tier", values, c)
        yield self._counter("vllm:kv_offload_tiering_promotion_allocation_failures",
                            "Promotions that found no space in the primary tier.",
                            s.promotion_allocation_failures, c)
        yield self._counter("vllm:kv_offload_load_bytes", "Bytes loaded from the offload tier to the GPU.",
                            s.offload_load_bytes, c)
        yield self._counter("vllm:kv_offload_store_bytes", "Bytes stored from the GPU to the offload tier.",
                            s.offload_store_bytes, c)
        yield self._counter("vllm:kv_offload_load_time", "Seconds spent loading KV to the GPU.",
                            s.offload_load_time, c)
        yield self._counter("vllm:kv_offload_store_time", "Seconds spent storing KV from the GPU.",
                            s.offload_store_time, c)
        yield self._counter("vllm:kv_offload_allocation_failure",
                            "Stores skipped because the offload tier had no free space.",
                            s.offload_allocation_failures, c)
        if self.store_threshold >= 2:  # CPUOffloadingSpec defines the counter only then
            yield self._counter("vllm:kv_offload_stores_skipped",
                                "Number of KV offload stores skipped because the reuse threshold was "
                                "not reached.", s.offload_stores_skipped, c)
        yield self._labelled_counter("vllm:kv_offload_total_bytes",
                                     "Deprecated: total bytes offloaded, by transfer type.",
                                     "transfer_type", {"CPU_to_GPU": s.offload_load_bytes,
                                                       "GPU_to_CPU": s.offload_store_bytes}, c)
        yield self._labelled_counter("vllm:kv_offload_total_time",
                                     "Deprecated: total offloading time, by transfer type.",
                                     "transfer_type", {"CPU_to_GPU": s.offload_load_time,
                                                       "GPU_to_CPU": s.offload_store_time}, c)
        # One observation per transfer job: its ``_count`` is the number of loads / stores.
        yield self._histogram("vllm:kv_offload_load_size",
                              "Histogram of KV offload load operation size, in bytes.", s.offload_load_size, c)
        yield self._histogram("vllm:kv_offload_store_size",
                              "Histogram of KV offload store operation size, in bytes.", s.offload_store_size, c)
        fam = HistogramMetricFamily("vllm:kv_offload_size", "Histogram of KV offload transfer size, in bytes.",
                                    labels=list(BASE) + ["transfer_type"])
        for transfer_type, hist in (("CPU_to_GPU", s.offload_load_size), ("GPU_to_CPU", s.offload_store_size)):
            fam.add_metric(self.base_values + [transfer_type], hist.cumulative(), hist.sum)
        yield fam

    def _offload_gauges(self, pub: Published) -> Iterator[Metric]:
        yield self._gauge("vllm:kv_offload_cpu_cache_usage_perc",
                          "Share of the CPU offload tier pinned by in-flight transfers (not residency).",
                          pub.offload_pin_share)
        for name, doc, values in (
            ("vllm:kv_offload_tiering_active_promotion_jobs", "Promotion jobs in flight, per tier.",
             pub.active_promotions),
            ("vllm:kv_offload_tiering_active_cascade_jobs", "Cascade jobs in flight, per tier.",
             pub.active_cascades),
        ):
            if values:
                fam = GaugeMetricFamily(name, doc, labels=list(BASE) + ["tier"])
                for tier, n in values.items():
                    fam.add_metric(self.base_values + [tier], n)
                yield fam

    def _http_families(self, pub: Published) -> Iterator[Metric]:
        if not pub.http:
            return
        fam = CounterMetricFamily("http_requests", "Total number of requests by method, status and handler.",
                                  labels=["handler", "method", "status"])
        for (handler, method, status), n in sorted(pub.http.items()):
            fam.add_metric([handler, method, status], n,
                           created=pub.stats.created if self.created_series else None)
        yield fam


def _cache_config_labels(config: EmulatorConfig, geo: Geometry, offload: OffloadSpec | None
                         ) -> dict[str, str]:
    kv_bytes = geo.num_gpu_blocks * geo.block_size * geo.kv_bytes_per_token
    labels = {
        "block_size": str(geo.block_size),
        "cache_dtype": "auto",
        "enable_prefix_caching": str(config.enable_prefix_caching),
        "engine": config.engine_index,
        "gpu_memory_utilization": "0.92",
        "kv_cache_memory_bytes": str(kv_bytes),
        "kv_cache_size_tokens": str(geo.num_gpu_blocks * geo.block_size),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None" if offload is None else repr(offload.cpu_bytes / 2 ** 30),
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(geo.num_gpu_blocks),
        "num_gpu_blocks_override": "None" if config.num_gpu_blocks is None else str(config.num_gpu_blocks),
        "prefix_caching_hash_algo": "sha256",
        "sliding_window": "None",
        "user_specified_block_size": str(config.block_size is not None),
    }
    return dict(sorted(labels.items()))


def build_registry(source: Callable[[], Published], config: EmulatorConfig, geometry: Geometry,
                   offload: OffloadSpec | None) -> CollectorRegistry:
    """A private registry (never the global one: two emulators may share a process)."""
    registry = CollectorRegistry(auto_describe=False)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    ProcessCollector(registry=registry)
    registry.register(VllmCollector(source, config, geometry, offload))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
