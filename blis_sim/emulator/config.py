"""Emulator configuration: small frozen objects, validated on construction.

API::

    cfg = EmulatorConfig(profile="tiny-cpu", num_gpu_blocks=512, enable_prompt_tokens_details=True)
    cfg = cfg.replace(faults=FaultConfig(error_rate=0.1))     # dataclasses.replace, re-validated
    geo = cfg.geometry()          # Geometry: every profile default resolved (block size, blocks, ...)
    spec = load_offload_spec(path, block_size=32, kv_bytes_per_token=512)   # --kv-offload-config

``EmulatorConfig.kv_offload_config`` is a path to the simulator's offload YAML
(``docs/reference-formats.md`` §6: a top-level ``kv_offload:`` block); ``offload`` takes an
:class:`OffloadSpec` directly. Bad values raise :class:`~blis_sim.errors.ConfigError` naming the field.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from blis_sim.emulator.profiles import StepProfile, get_profile
from blis_sim.errors import ConfigError

METRICS_PROFILES = ("vllm-0.33", "vllm-pr48798", "vllm-0.11", "none")
METRICS_FAULTS = ("ok", "http500", "drop", "hang")

@dataclass(frozen=True)
class TierSpec:
    """One secondary offload tier (``fs``)."""

    type: str = "fs"
    read_bandwidth_Bps: float = 7e9
    write_bandwidth_Bps: float = 5e9
    latency_s: float = 80e-6
    n_read_threads: int = 16
    n_write_threads: int = 16
    max_bytes: int | None = None  # None: unbounded (vLLM's fs tier before PR #54327)

    def __post_init__(self) -> None:
        for name in ("read_bandwidth_Bps", "write_bandwidth_Bps"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"must be a finite value > 0, got {value}", field=name)
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ConfigError(f"must be a finite value >= 0, got {self.latency_s}", field="latency_s")
        if self.n_read_threads <= 0 or self.n_write_threads <= 0:
            raise ConfigError("thread counts must be > 0", field="n_read_threads")
        if self.max_bytes is not None and self.max_bytes < 0:
            raise ConfigError(f"must be >= 0, got {self.max_bytes}", field="max_bytes")


@dataclass(frozen=True)
class OffloadSpec:
    """The CPU offload tier and its secondary tiers, as the emulator needs them."""

    cpu_bytes: int
    blocks_per_chunk: int = 1
    offload_prompt_only: bool = True
    eviction_policy: Literal["lru", "arc"] = "lru"
    store_threshold: int = 0  # >= 2: a chunk is stored only on its store_threshold-th offer
    secondary_tiers: tuple[TierSpec, ...] = ()

    def __post_init__(self) -> None:
        if self.cpu_bytes <= 0:
            raise ConfigError(f"must be > 0, got {self.cpu_bytes}", field="kv_offload.cpu_bytes_to_use")
        if self.blocks_per_chunk <= 0:
            raise ConfigError(f"must be > 0, got {self.blocks_per_chunk}",
                              field="kv_offload.blocks_per_chunk")
        if self.eviction_policy not in ("lru", "arc"):
            raise ConfigError(f"must be 'lru' or 'arc', got {self.eviction_policy!r}",
                              field="kv_offload.eviction_policy")
        if self.store_threshold < 0:
            raise ConfigError(f"must be >= 0, got {self.store_threshold}", field="kv_offload.store_threshold")
        if self.store_threshold >= 2 and self.secondary_tiers:
            # vLLM 0.32's TieringOffloadingSpec refuses it (ValueError); only CPUOffloadingSpec filters.
            raise ConfigError(f"store_threshold={self.store_threshold} is not supported with secondary tiers "
                              "(vLLM's TieringOffloadingSpec refuses it)", field="kv_offload.store_threshold")


@dataclass(frozen=True)
class FaultConfig:
    """Fault injection. Rates are fractions of requests, drawn from the config's seeded RNG."""

    metrics: Literal["ok", "http500", "drop", "hang"] = "ok"  # how /metrics answers
    error_rate: float = 0.0  # fraction of generation requests answered with error_status
    error_status: int = 500  # 500 or 429
    stream_cut_rate: float = 0.0  # fraction of streams whose connection is cut mid-way
    stream_cut_after_tokens: int = 1  # tokens sent before the cut
    first_token_delay_s: float = 0.0  # extra delay before the first token ...
    first_token_delay_rate: float = 1.0  # ... for this fraction of requests
    stall_rate: float = 0.0  # fraction of requests whose first token never comes
    reset_counters_after: int | None = None  # after N finished requests: restart (counters + cache)

    def __post_init__(self) -> None:
        if self.metrics not in METRICS_FAULTS:
            raise ConfigError(f"must be one of {', '.join(METRICS_FAULTS)}, got {self.metrics!r}",
                              field="faults.metrics")
        for name in ("error_rate", "stream_cut_rate", "first_token_delay_rate", "stall_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"must be in [0, 1], got {value}", field=f"faults.{name}")
        if self.error_status not in (500, 429, 503):
            raise ConfigError(f"must be 500, 429 or 503, got {self.error_status}",
                              field="faults.error_status")
        if self.stream_cut_after_tokens < 0:
            raise ConfigError("must be >= 0", field="faults.stream_cut_after_tokens")
        if self.first_token_delay_s < 0:
            raise ConfigError("must be >= 0", field="faults.first_token_delay_s")
        if self.reset_counters_after is not None and self.reset_counters_after <= 0:
            raise ConfigError("must be > 0", field="faults.reset_counters_after")

    @property
    def active(self) -> bool:
        return self != FaultConfig()


@dataclass(frozen=True)
class Geometry:
    """Every size the engine needs, with the profile's defaults applied."""

    block_size: int
    num_gpu_blocks: int
    kv_bytes_per_token: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int


@dataclass(frozen=True)
class EmulatorConfig:
    """One emulated vLLM server. ``None`` sizes take the step-time profile's defaults."""

    model: str = "tiny-llama"
    host: str = "127.0.0.1"
    port: int = 0
    profile: str = "tiny-cpu"
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    kv_bytes_per_token: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    kv_offload_config: str | None = None  # path to the offload YAML
    offload: OffloadSpec | None = None  # or the spec itself
    metrics_profile: str = "vllm-0.33"
    created_series: bool = True  # `_created` samples, as the real vLLM 0.32 on CPU serves them
    stats_interval_s: float = 0.05  # counters published this often (0: after every engine step)
    enable_prompt_tokens_details: bool = False
    enable_per_request_metrics: bool = False  # server-side timings in the final usage object
    add_bos: bool = False  # the built-in tokenizer's; a model's own tokenizer has its post-processor
    # A Hugging Face tokenizer (a model folder or its tokenizer.json): counts, /tokenize and the chat
    # template become that model's (hf_tokenizer.py). None: the built-in tokenizer.
    tokenizer: str | None = None
    eos_probability: float = 0.0  # per generated token, when not ignore_eos and past min_tokens
    step_noise: float | None = None  # overrides the profile's noise_cv
    seed: int = 0
    served_version: str | None = None  # /version; default follows the metrics profile
    engine_index: str = "0"
    faults: FaultConfig = field(default_factory=FaultConfig)
    # Scheduling niceness of the emulator's own process (`blis emulate`, spawn_emulator; an in-process
    # serve() leaves its caller's alone). Negative raises its priority, which needs root or
    # CAP_SYS_NICE; when refused the process keeps its niceness and says so on stderr.
    nice: int = 0

    def __post_init__(self) -> None:
        get_profile(self.profile)  # raises ConfigError on an unknown name
        if self.metrics_profile not in METRICS_PROFILES:
            raise ConfigError(f"unknown metrics profile '{self.metrics_profile}' (known: "
                              f"{', '.join(METRICS_PROFILES)})", field="metrics_profile")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"must be in 0..65535, got {self.port}", field="port")
        for name in ("block_size", "num_gpu_blocks", "kv_bytes_per_token", "max_model_len",
                     "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"must be > 0, got {value}", field=name)
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 2:
            raise ConfigError("must be >= 2 (one block is vLLM's reserved null block)",
                              field="num_gpu_blocks")
        if self.stats_interval_s < 0:
            raise ConfigError("must be >= 0", field="stats_interval_s")
        if not -20 <= self.nice <= 19:
            raise ConfigError(f"must be in -20..19, got {self.nice}", field="nice")
        if not 0.0 <= self.eos_probability <= 1.0:
            raise ConfigError("must be in [0, 1]", field="eos_probability")
        if self.step_noise is not None and not 0.0 <= self.step_noise < 1.0:
            raise ConfigError("must be in [0, 1)", field="step_noise")
        if self.tokenizer is not None:
            if not Path(self.tokenizer).expanduser().exists():
                raise ConfigError("does not exist (give a model folder or its tokenizer.json; nothing is "
                                  "downloaded)", file=self.tokenizer, field="tokenizer")
            if self.add_bos:
                raise ConfigError("add_bos is the built-in tokenizer's; with a tokenizer its post-processor "
                                  "decides whether a prompt starts with BOS", field="add_bos")
        if self.kv_offload_config is not None and self.offload is not None:
            raise ConfigError("give kv_offload_config (a file) or offload (a spec), not both",
                              field="kv_offload_config")

    def replace(self, **changes: Any) -> EmulatorConfig:
        return dataclasses.replace(self, **changes)

    @property
    def step_profile(self) -> StepProfile:
        return get_profile(self.profile)

    def geometry(self) -> Geometry:
        p = self.step_profile

        def pick(value: int | None, default: int) -> int:
            return default if value is None else value

        return Geometry(
            block_size=pick(self.block_size, p.block_size),
            num_gpu_blocks=pick(self.num_gpu_blocks, p.num_gpu_blocks),
            kv_bytes_per_token=pick(self.kv_bytes_per_token, p.kv_bytes_per_token),
            max_model_len=pick(self.max_model_len, p.max_model_len),
            max_num_seqs=pick(self.max_num_seqs, p.max_num_seqs),
            max_num_batched_tokens=pick(self.max_num_batched_tokens, p.max_num_batched_tokens),
        )

    def offload_spec(self) -> OffloadSpec | None:
        if self.offload is not None:
            return self.offload
        if self.kv_offload_config is None:
            return None
        geo = self.geometry()
        return load_offload_spec(self.kv_offload_config, block_size=geo.block_size,
                                 kv_bytes_per_token=geo.kv_bytes_per_token)

    @property
    def version(self) -> str:
        if self.served_version:
            return self.served_version
        return {"vllm-0.11": "0.11.0", "vllm-pr48798": "0.27.2.dev312+g48798"}.get(
            self.metrics_profile, "0.33.0")


def load_offload_spec(path: str | Path, *, block_size: int, kv_bytes_per_token: int) -> OffloadSpec:
    """Read the simulator's offload YAML into an :class:`OffloadSpec` (strict; ConfigError/FormatError).

    The file is read by ``blis_sim.formats.offload.load_offload_config`` (the shared reader); this is
    the one place the emulator turns it into its own spec, so the emulator shares no KV logic with the
    simulator, only the file reader.
    """
    from blis_sim.emulator import _offload_file  # the shared file reader, only when a config is given

    # a str stays one: it may be vllm serve's --kv-transfer-config JSON itself, which Path() would alter
    return _offload_file.read(path, block_size=block_size, kv_bytes_per_token=kv_bytes_per_token)
