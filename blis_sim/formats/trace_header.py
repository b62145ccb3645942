"""The TraceV2 header YAML (docs/reference-formats.md §1.1–§1.3) and our ``pytest_blis`` block.

API::

    header = read_trace_header("t.yaml")                       # -> TraceHeader
    write_trace_header(header, "o.yaml", blis_compatible=False)
    header_text(header, blis_compatible=False) -> str

:class:`TraceHeader` has every key of the reference header in its order: ``trace_version, time_unit,
created_at, mode, warm_up_requests, workload_seed, workload_spec, session_context_growth, server``
(:class:`TraceServerConfig`), ``network`` (:class:`TraceNetworkConfig`), ``goodput_slo_targets``
({class: :class:`SLOTargets`}), ``kv_offload`` (:class:`TraceKVOffloadConfig`, docs/reference-formats.md §1.2;
convert with ``blis_sim.formats.offload``), ``observed_kv_metrics`` (:class:`ObservedKVMetrics`,
docs/reference-formats.md §1.3), then OUR block
``pytest_blis`` (:class:`PytestBlisHeader`: tool/vLLM versions, KV geometry, per-definition ``kv_hit_rates``,
per-tier I/O, scrape info, phases, partial flag, offload extensions, latency model). ``blis_compatible=True``
leaves our block out so BLIS can read the file back.

Reading is strict (unknown or duplicate keys, wrong types, out-of-range values → FormatError with file, line
and field); writing lays the file out as yaml.v3 does (4-space indent, ``hit_rate: 0`` explicit, absent
blocks absent), atomically.
"""

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from blis_sim import limits
from blis_sim.formats._io import atomic_write
from blis_sim.formats._model import StrictModel, to_go
from blis_sim.formats._strict import load_yaml, validate
from blis_sim.formats.hitrate import KVHitRate

SOURCE_TIERED = "tiered"
SOURCE_GPU_FALLBACK = "gpu-prefix-cache-fallback"


class TraceServerConfig(StrictModel):
    """``server:`` — observe writes type and model; the rest is schema the reference never fills."""

    type: str = ""
    model: str = ""
    tensor_parallel: int = Field(default=0, ge=0)
    max_num_seqs: int = Field(default=0, ge=0)
    block_size: int = Field(default=0, ge=0)
    gpu_memory_utilization: float = Field(default=0.0, ge=0.0, le=1.0)
    max_model_len: int = Field(default=0, ge=0)

    _omitempty: ClassVar[frozenset[str]] = frozenset(
        {"type", "model", "tensor_parallel", "max_num_seqs", "block_size", "gpu_memory_utilization",
         "max_model_len"})


class TraceNetworkConfig(StrictModel):
    """``network:`` — observe always writes it (``network: {}`` when no RTT was measured)."""

    measured_rtt_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)

    _omitempty: ClassVar[frozenset[str]] = frozenset({"measured_rtt_ms"})


class SLOTargets(StrictModel):
    """One ``goodput_slo_targets`` class: targets in ms, 0 = not gated."""

    ttft_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    itl_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    e2e_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)

    _omitempty: ClassVar[frozenset[str]] = frozenset({"ttft_ms", "itl_ms", "e2e_ms"})


class TraceTierConfig(StrictModel):
    """One resolved secondary tier of the ``kv_offload`` header block (bandwidths bytes/µs, latency µs)."""

    type: str = ""
    root_dir: str = ""
    n_read_threads: int = Field(default=0, ge=0)
    n_write_threads: int = Field(default=0, ge=0)
    locality: str = ""
    enable_kv_events: bool = False
    direct_io: bool = False
    device_class: str = ""
    read_bandwidth: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    write_bandwidth: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    base_latency: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    saturation_queue_depth: int = Field(default=0, ge=0)
    single_transfer_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    latency_jitter_stddev: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)

    _omitempty: ClassVar[frozenset[str]] = frozenset({"locality", "device_class"})


class TraceKVOffloadConfig(StrictModel):
    """``kv_offload:`` — the resolved offload config (docs/reference-formats.md §1.2); convert with
    ``blis_sim.formats.offload``."""

    cpu_bytes_to_use: int = Field(default=0, ge=0)
    per_block_bytes: int = Field(default=0, ge=0)
    block_size: int = Field(default=0, ge=0)
    blocks_per_chunk: int = Field(default=0, ge=0)
    tokens_per_hash: int = Field(default=0, ge=0)
    eviction_policy: str = ""
    offload_prompt_only: bool = False
    self_describing_kv_events: bool = False
    secondary_tiers: list[TraceTierConfig] = Field(default_factory=list)

    _omitempty: ClassVar[frozenset[str]] = frozenset({"secondary_tiers"})


class ObservedKVMetrics(StrictModel):
    """``observed_kv_metrics:`` — the real side's primary hit-rate (docs/reference-formats.md §1.3).
    ``hit_rate: 0`` is written."""

    source: Literal["tiered", "gpu-prefix-cache-fallback"]
    hit_rate: float = Field(ge=0.0, le=1.0)
    block_hits: int = Field(default=0, ge=0)
    block_queries: int = Field(default=0, ge=0)
    read_time_total: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    write_time_total: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    vllm_commit: str = ""

    _omitempty: ClassVar[frozenset[str]] = frozenset({"read_time_total", "write_time_total", "vllm_commit"})

    @model_validator(mode="after")
    def _hits_within_queries(self) -> "ObservedKVMetrics":
        if self.block_hits > self.block_queries:
            raise ValueError(f"block_hits ({self.block_hits}) exceed block_queries ({self.block_queries})")
        return self


# ----- our header block


class KVGeometry(StrictModel):
    """The server's KV geometry (``vllm:cache_config_info``): tokens per GPU block, GPU blocks."""

    block_size: int | None = Field(default=None, ge=1, le=limits.MAX_BLOCK_TOKENS)
    num_gpu_blocks: int | None = Field(default=None, ge=1, le=limits.MAX_GPU_BLOCKS)


class SettingSource(StrictModel):
    """One simulator setting as the simulation resolved it, and where it came from
    (blis_sim/engine/settings.py): a flag (or the caller), the trace header, the model, or the default."""

    value: int | float | str | None = None
    source: Literal["flag", "header", "model", "default"]


class TierIO(StrictModel):
    """Per-tier transfer counters over the window (vLLM's native units: bytes, seconds).

    ``read`` is towards the GPU, ``write`` away from it: for ``0:primary`` the connector's GPU <-> CPU
    loads and stores (``vllm:kv_offload_{load,store}_*``), for a secondary tier its promotions and
    cascades (``vllm:kv_offload_tiering_{read,write}_*{tier}``). ``read_jobs`` / ``write_jobs``: the
    transfers counted (the size histogram's ``_count``), None where the server counts none (vLLM
    counts no secondary-tier jobs); older files have neither field.
    """

    tier: str
    read_bytes: int = Field(default=0, ge=0)
    write_bytes: int = Field(default=0, ge=0)
    read_time_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    write_time_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    read_jobs: int | None = Field(default=None, ge=0)
    write_jobs: int | None = Field(default=None, ge=0)


# The faults the simulator reproduces from the offload configuration; any other fault makes a window's
# hit-rates incomparable (docs/calibrate.md, "Faults").
MODELLED_FAULT_KINDS = frozenset({"allocation_failure"})


class Fault(StrictModel):
    """One offload fault over the window, or content the server held from before it (docs/observe.md, "Faults").

    ``kind``: ``allocation_failure`` (the CPU tier could not take an offer; the simulator models it),
    ``store_failure`` / ``promotion_failure`` (a transfer to / from a secondary tier failed),
    ``promotion_allocation_failure``, or ``warm_start`` (requests hit content that nothing sent earlier in
    the window holds: a long-lived server, or an ``fs`` root that kept an earlier run's files). ``count``:
    the counter's delta (``warm_start``: the requests), ``tier``: a tier label or None."""

    kind: Literal["allocation_failure", "store_failure", "promotion_failure", "promotion_allocation_failure",
                  "warm_start"]
    tier: str | None = None
    count: int = Field(ge=0)
    metric: str = ""
    detail: str = ""

    _omitempty: ClassVar[frozenset[str]] = frozenset({"metric", "detail"})


class ScrapeInfo(StrictModel):
    """How the counter window was taken (times are epoch µs)."""

    metrics_url: str = ""
    start_time_us: int = 0
    end_time_us: int = 0
    settle_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    families: list[str] = Field(default_factory=list)   # the metric families seen at the end of the window
    warnings: list[str] = Field(default_factory=list)   # e.g. why a definition was omitted

    _omitempty: ClassVar[frozenset[str]] = frozenset({"metrics_url", "families", "warnings"})


class PhaseInfo(StrictModel):
    """One workload phase as dispatched (times are epoch µs; 0 = unknown)."""

    name: str
    warmup: bool = False
    measured: bool = True      # inside the counter window
    requests: int = Field(default=0, ge=0)
    start_time_us: int = 0
    end_time_us: int = 0


class CpuLink(StrictModel):
    """The CPU <-> GPU link of the offload tiers (``kv_offload.cpu_link``, ours): bytes/µs and µs, ``read``
    towards the GPU (a load), ``write`` away from it (a store). What ``blis calibrate --write-offload-config``
    fits from a server's ``vllm:kv_offload_{load,store}_{bytes,time}``; absent, the simulator's default link."""

    read_bandwidth: float = Field(gt=0, allow_inf_nan=False)
    write_bandwidth: float = Field(gt=0, allow_inf_nan=False)
    base_latency: float = Field(default=0.0, ge=0, allow_inf_nan=False)


class OffloadExtensions(StrictModel):
    """Offload settings the reference's ``kv_offload`` block cannot hold (INV-13 for our additions)."""

    store_threshold: int = Field(default=0, ge=0)
    tier_max_bytes: list[int | None] = Field(default_factory=list)  # per secondary tier; None = unbounded
    cpu_link: CpuLink | None = None

    _omitempty: ClassVar[frozenset[str]] = frozenset({"cpu_link"})

    @field_validator("tier_max_bytes")
    @classmethod
    def _positive(cls, v: list[int | None]) -> list[int | None]:
        for i, b in enumerate(v):
            if b is not None and b <= 0:
                raise ValueError(f"tier_max_bytes[{i}] must be > 0 or null, got {b}")
        return v


class LatencyModelInfo(StrictModel):
    """The latency model a sim-generated trace was produced with (design D7)."""

    name: str
    coefficients: dict[str, float] = Field(default_factory=dict)
    source: str = ""

    _omitempty: ClassVar[frozenset[str]] = frozenset({"source"})


class ReplicaInfo(StrictModel):
    """One replica of an observed cluster (docs/cluster.md §3): where it was, its geometry, and the
    hit-rates of its own counter window (every definition and tier, as ``kv_hit_rates``)."""

    index: int = Field(ge=0)
    name: str = ""                 # what the router's header named it (router mode), else ""
    server_url: str = ""
    vllm_version: str = ""
    kv_geometry: KVGeometry | None = None
    source: str = ""               # its observed_kv_metrics source: tiered, gpu-prefix-cache-fallback
    requests: int = Field(default=0, ge=0)
    kv_hit_rates: list[KVHitRate] = Field(default_factory=list)
    tier_io: list[TierIO] = Field(default_factory=list)
    scrape: ScrapeInfo | None = None
    faults: list[Fault] = Field(default_factory=list)

    _omitempty: ClassVar[frozenset[str]] = frozenset(
        {"name", "server_url", "vllm_version", "source", "kv_hit_rates", "tier_io", "faults"})


class ClusterInfo(StrictModel):
    """``pytest_blis.cluster`` — how a trace's requests were routed over several replicas; the
    data CSV's ``replica`` column indexes ``replicas``."""

    num_instances: int = Field(ge=1, le=limits.MAX_INSTANCES)
    routing_policy: str
    routing_scorers: str = ""      # as --routing-scorers: name:weight, comma-separated
    router_url: str = ""           # one router in front (router mode) ...
    replica_header: str = ""       # ... and the response header naming the replica that served
    replicas: list[ReplicaInfo] = Field(default_factory=list)

    _omitempty: ClassVar[frozenset[str]] = frozenset({"routing_scorers", "router_url", "replica_header"})

    @model_validator(mode="after")
    def _replicas_indexed(self) -> "ClusterInfo":
        if self.replicas and [r.index for r in self.replicas] != list(range(self.num_instances)):
            raise ValueError(f"replicas must list indices 0..{self.num_instances - 1} in order, got "
                             f"{[r.index for r in self.replicas]}")
        return self


class PytestBlisHeader(StrictModel):
    """``pytest_blis:`` — everything we add to the header; omitted with ``blis_compatible=True``."""

    tool_version: str = ""
    vllm_version: str = ""
    server_url: str = ""
    kv_geometry: KVGeometry | None = None
    kv_hit_rates: list[KVHitRate] = Field(default_factory=list)
    tier_io: list[TierIO] = Field(default_factory=list)
    scrape: ScrapeInfo | None = None
    phases: list[PhaseInfo] = Field(default_factory=list)
    partial: bool = False
    partial_reason: str = ""
    offload: OffloadExtensions | None = None
    faults: list[Fault] = Field(default_factory=list)
    latency_model: LatencyModelInfo | None = None
    sim_seed: int | None = None         # the simulator's content/jitter seed (sim traces)
    warnings: list[str] = Field(default_factory=list)
    cluster: ClusterInfo | None = None  # several replicas behind a router (docs/cluster.md §3)

    _omitempty: ClassVar[frozenset[str]] = frozenset(
        {"tool_version", "vllm_version", "server_url", "kv_hit_rates", "tier_io", "phases", "partial",
         "partial_reason", "faults", "warnings"})


class TraceHeader(StrictModel):
    """The TraceV2 header (docs/reference-formats.md §1.1), keys in the reference's order, plus ``pytest_blis``."""

    trace_version: int = 3
    time_unit: str = "us"
    created_at: str = ""
    mode: Literal["real", "generated", "replayed"]
    warm_up_requests: int = Field(default=0, ge=0)
    workload_seed: int | None = None
    workload_spec: str = ""
    session_context_growth: Literal["", "accumulate"] = ""
    server: TraceServerConfig | None = None
    network: TraceNetworkConfig | None = None
    goodput_slo_targets: dict[str, SLOTargets] = Field(default_factory=dict)
    kv_offload: TraceKVOffloadConfig | None = None
    observed_kv_metrics: ObservedKVMetrics | None = None
    pytest_blis: PytestBlisHeader | None = None

    _omitempty: ClassVar[frozenset[str]] = frozenset(
        {"created_at", "workload_spec", "session_context_growth", "goodput_slo_targets"})


def read_trace_header(path: str | Path) -> TraceHeader:
    """Read a TraceV2 header YAML strictly (unknown keys, duplicate keys, bad values → FormatError)."""
    return validate(TraceHeader, load_yaml(path), plain_strings=True)


def header_text(header: TraceHeader, *, blis_compatible: bool = False) -> str:
    data = to_go(header)
    if blis_compatible:
        data.pop("pytest_blis", None)
    from blis_sim.formats._yamlout import dump  # the YAML writer: only when a header is written

    return dump(data)


def write_trace_header(header: TraceHeader, path: str | Path, *, blis_compatible: bool = False) -> None:
    atomic_write(path, header_text(header, blis_compatible=blis_compatible))
