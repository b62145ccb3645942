"""Small frozen configuration objects for the tiered KV cache (:mod:`blis_sim.kv`).

* :class:`TierStation` — one transfer station: ``n_read_threads`` / ``n_write_threads`` servers,
  service time ``base_latency + bytes / (bandwidth · ramp(q))`` µs, optional seeded jitter
  (docs/reference-formats.md §7.1). Bandwidths are bytes/µs (= MB/s), latencies µs.
* :class:`CpuTierConfig` — the primary offload tier (vLLM's CPU tier): capacity in **chunks**,
  ``lru`` | ``arc`` eviction, ``store_threshold`` (a chunk must be looked up that many times before it
  is stored; < 2 disables the filter), and the CPU↔GPU link as a :class:`TierStation`.
* :class:`FsTierConfig` — a secondary ``fs`` tier: its station, and an optional capacity
  ``max_bytes`` (LRU; ``None`` = unbounded, as in released vLLM).
* :class:`KVConfig` — GPU geometry (``block_size`` tokens per block, default 16; ``num_gpu_blocks``
  including vLLM's reserved null block), chunk geometry (``blocks_per_chunk``), bytes per GPU block
  (all layers, one TP rank), ``offload_prompt_only``, the tiers, and the jitter seed.

:func:`from_offload_config` adapts the resolved offload config of :mod:`blis_sim.formats.offload`
(``OffloadConfig``, the ``kv_offload:`` YAML block) to a :class:`KVConfig`. It only reads attributes,
so any object with the same field names works.

Every constructor validates and raises :class:`blis_sim.errors.ConfigError` naming the field.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from blis_sim import limits
from blis_sim.errors import ConfigError

EvictionPolicy = Literal["lru", "arc"]

#: Default CPU↔GPU link: the reference's ``cpu_dram`` device class (bytes/µs, µs).
DEFAULT_LINK_BANDWIDTH = 20000.0
DEFAULT_LINK_LATENCY = 1.0


def _positive_int(name: str, value: int, *, minimum: int = 1, maximum: int = limits.MAX_BYTES) -> None:
    # every integer here reaches the compiled core (C int64 / int, or an allocation): bounded
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"must be an integer >= {minimum}, got {value!r}", field=name)
    if value > maximum:
        raise ConfigError(limits.over(value, maximum) or "", field=name)


def _finite(name: str, value: float, *, minimum: float, strict: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        op = ">" if strict else ">="
        raise ConfigError(f"must be a finite number {op} {minimum:g}, got {value!r}", field=name)


@dataclass(frozen=True)
class TierStation:
    """Transfer model of one tier. ``read`` = towards the GPU (load/promotion), ``write`` = away."""

    read_bandwidth: float = DEFAULT_LINK_BANDWIDTH
    write_bandwidth: float = DEFAULT_LINK_BANDWIDTH
    base_latency: float = DEFAULT_LINK_LATENCY
    n_read_threads: int = 1
    n_write_threads: int = 1
    saturation_queue_depth: int = 1
    single_transfer_fraction: float = 1.0
    latency_jitter_stddev: float = 0.0

    def __post_init__(self) -> None:
        _finite("read_bandwidth", self.read_bandwidth, minimum=0.0, strict=True)
        _finite("write_bandwidth", self.write_bandwidth, minimum=0.0, strict=True)
        _finite("base_latency", self.base_latency, minimum=0.0, strict=False)
        _positive_int("n_read_threads", self.n_read_threads, maximum=limits.MAX_THREADS)
        _positive_int("n_write_threads", self.n_write_threads, maximum=limits.MAX_THREADS)
        _positive_int("saturation_queue_depth", self.saturation_queue_depth, minimum=0,
                      maximum=limits.MAX_QUEUE_DEPTH)
        _finite("latency_jitter_stddev", self.latency_jitter_stddev, minimum=0.0, strict=False)
        f1 = self.single_transfer_fraction
        _finite("single_transfer_fraction", f1, minimum=0.0, strict=True)
        if self.saturation_queue_depth >= 2 and not 0.0 < f1 <= 1.0:
            raise ConfigError(f"must be in (0, 1] when saturation_queue_depth >= 2, got {f1!r}",
                              field="single_transfer_fraction")


@dataclass(frozen=True)
class CpuTierConfig:
    """The primary offload tier (tier label ``0:primary``, source ``host``)."""

    num_chunks: int
    eviction_policy: EvictionPolicy = "lru"
    store_threshold: int = 0
    max_tracker_size: int = 64000
    link: TierStation = field(default_factory=TierStation)

    def __post_init__(self) -> None:
        _positive_int("cpu.num_chunks", self.num_chunks)
        if self.eviction_policy not in ("lru", "arc"):
            raise ConfigError(f'must be "lru" or "arc", got {self.eviction_policy!r}',
                              field="eviction_policy")
        _positive_int("store_threshold", self.store_threshold, minimum=0, maximum=limits.MAX_QUEUE_DEPTH)
        _positive_int("max_tracker_size", self.max_tracker_size)


@dataclass(frozen=True)
class FsTierConfig:
    """A secondary tier (label ``<i+1>:fs``, source ``disk``). ``max_bytes=None``: unbounded."""

    station: TierStation = field(default_factory=lambda: TierStation(
        read_bandwidth=7000.0, write_bandwidth=5000.0, base_latency=80.0,
        n_read_threads=16, n_write_threads=16))
    max_bytes: int | None = None
    type: str = "fs"

    def __post_init__(self) -> None:
        if self.max_bytes is not None:
            _positive_int("max_bytes", self.max_bytes)
        if not self.type or not isinstance(self.type, str):
            raise ConfigError(f"must be a non-empty string, got {self.type!r}", field="type")


@dataclass(frozen=True)
class KVConfig:
    """Everything :class:`blis_sim.kv.KVCache` needs. ``cpu=None`` means no offloading connector."""

    num_gpu_blocks: int
    block_size: int = 16
    enable_caching: bool = True
    blocks_per_chunk: int = 1
    bytes_per_block: int = 0
    offload_prompt_only: bool = True
    cpu: CpuTierConfig | None = None
    fs_tiers: tuple[FsTierConfig, ...] = ()
    seed: int = 0
    #: bytes of one offload chunk when it is not bytes_per_block × blocks_per_chunk exactly
    #: (the formats' ``bytes_per_chunk`` = int(kv_bytes_per_token × chunk tokens)); 0 = derived.
    bytes_per_chunk: int = 0

    def __post_init__(self) -> None:
        # vLLM reserves one block as the null block: two is the smallest usable pool.
        _positive_int("num_gpu_blocks", self.num_gpu_blocks, minimum=2, maximum=limits.MAX_GPU_BLOCKS)
        _positive_int("block_size", self.block_size, maximum=limits.MAX_BLOCK_TOKENS)
        _positive_int("blocks_per_chunk", self.blocks_per_chunk, maximum=limits.MAX_BLOCK_TOKENS)
        _positive_int("bytes_per_block", self.bytes_per_block, minimum=0)
        _positive_int("seed", self.seed, minimum=0, maximum=2**63 - 1)
        _positive_int("bytes_per_chunk", self.bytes_per_chunk, minimum=0)
        if self.fs_tiers and self.cpu is None:
            raise ConfigError("secondary tiers need the CPU primary tier", field="secondary_tiers")
        if not isinstance(self.fs_tiers, tuple):
            object.__setattr__(self, "fs_tiers", tuple(self.fs_tiers))
        for i, tier in enumerate(self.fs_tiers):
            if tier.max_bytes is not None and tier.max_bytes < self.chunk_bytes:
                raise ConfigError(f"max_bytes {tier.max_bytes} holds no chunk of "
                                  f"{self.chunk_bytes} bytes", field=f"secondary_tiers[{i}].max_bytes")

    @property
    def chunk_tokens(self) -> int:
        """Tokens per offload chunk (vLLM's offload ``block_size``)."""
        return self.block_size * self.blocks_per_chunk

    @property
    def chunk_bytes(self) -> int:
        return self.bytes_per_chunk or self.bytes_per_block * self.blocks_per_chunk

    @property
    def tier_labels(self) -> tuple[str, ...]:
        """vLLM's ``tier`` label values: ``0:primary``, then ``<i+1>:<type>``."""
        if self.cpu is None:
            return ()
        return ("0:primary",) + tuple(f"{i + 1}:{t.type}" for i, t in enumerate(self.fs_tiers))


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _station_from(tier: Any) -> TierStation:
    return TierStation(
        read_bandwidth=float(_get(tier, "read_bandwidth")),
        write_bandwidth=float(_get(tier, "write_bandwidth")),
        base_latency=float(_get(tier, "base_latency", 0.0)),
        n_read_threads=int(_get(tier, "n_read_threads", 16)),
        n_write_threads=int(_get(tier, "n_write_threads", 16)),
        saturation_queue_depth=int(_get(tier, "saturation_queue_depth", 1) or 1),
        single_transfer_fraction=float(_get(tier, "single_transfer_fraction", 1.0) or 1.0),
        latency_jitter_stddev=float(_get(tier, "latency_jitter_stddev", 0.0) or 0.0),
    )


def from_offload_config(offload_cfg: Any, *, block_size: int, num_gpu_blocks: int,
                        bytes_per_block: int, enable_caching: bool = True, seed: int = 0,
                        link: TierStation | None = None) -> KVConfig:
    """Build a :class:`KVConfig` from a resolved offload config (or ``None`` for GPU only).

    ``offload_cfg`` is the formats engineer's ``OffloadConfig`` (or a dict with its field names):
    ``cpu_bytes_to_use``, ``block_size`` (offload tokens per chunk) or ``blocks_per_chunk``,
    ``eviction_policy``, ``offload_prompt_only``, ``store_threshold`` (optional),
    ``secondary_tiers`` (each with resolved ``read_bandwidth``, ``write_bandwidth``,
    ``base_latency``, ``n_read_threads``, ``n_write_threads``, ``saturation_queue_depth``,
    ``single_transfer_fraction``, ``latency_jitter_stddev``, optional ``max_bytes``).
    ``bytes_per_block`` is the KV size of one GPU block; the chunk size is the config's
    ``bytes_per_chunk`` when it has one (the header's ``per_block_bytes``), else
    ``bytes_per_block · blocks_per_chunk``; the CPU capacity is ``cpu_bytes_to_use // chunk
    bytes`` chunks (vLLM 0.33 sizes it in chunks).
    """
    if offload_cfg is None:
        return KVConfig(num_gpu_blocks=num_gpu_blocks, block_size=block_size,
                        enable_caching=enable_caching, bytes_per_block=bytes_per_block, seed=seed)
    bpc = _get(offload_cfg, "blocks_per_chunk")
    chunk_tokens = _get(offload_cfg, "block_size")
    if chunk_tokens:
        if chunk_tokens % block_size:
            raise ConfigError(f"block_size ({chunk_tokens}) must be a positive multiple of the GPU "
                              f"block size ({block_size})", field="kv_offload.block_size")
        derived = chunk_tokens // block_size
        if bpc and bpc != derived:
            raise ConfigError(f"blocks_per_chunk {bpc} disagrees with block_size {chunk_tokens}",
                              field="kv_offload.blocks_per_chunk")
        bpc = derived
    bpc = int(bpc or 1)
    chunk_bytes = int(_get(offload_cfg, "bytes_per_chunk", 0) or 0)
    if bytes_per_block <= 0:
        bytes_per_block = chunk_bytes // bpc
    if chunk_bytes <= 0:
        chunk_bytes = bytes_per_block * bpc
    if bytes_per_block <= 0:
        raise ConfigError("offloading needs the KV bytes per GPU block (> 0)",
                          field="per_block_bytes")
    cpu_bytes = int(_get(offload_cfg, "cpu_bytes_to_use"))
    num_chunks = cpu_bytes // chunk_bytes
    if num_chunks < 1:
        raise ConfigError(f"cpu_bytes_to_use {cpu_bytes} holds no chunk of {chunk_bytes} bytes",
                          field="kv_offload.cpu_bytes_to_use")
    threshold = _get(offload_cfg, "store_threshold") or 0
    cpu = CpuTierConfig(num_chunks=num_chunks,
                        eviction_policy=cast(EvictionPolicy,  # CpuTierConfig checks it
                                             str(_get(offload_cfg, "eviction_policy", "lru") or "lru")),
                        store_threshold=int(threshold), link=link or TierStation())
    tiers = []
    for i, tier in enumerate(_get(offload_cfg, "secondary_tiers") or ()):
        try:
            tiers.append(FsTierConfig(station=_station_from(tier),
                                      max_bytes=_get(tier, "max_bytes"),
                                      type=str(_get(tier, "type", "fs") or "fs")))
        except ConfigError as exc:
            raise ConfigError(exc.reason, field=f"kv_offload.secondary_tiers[{i}]."
                              f"{exc.location.field}") from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(str(exc), field=f"kv_offload.secondary_tiers[{i}]") from None
    prompt_only = _get(offload_cfg, "offload_prompt_only", True)
    return KVConfig(num_gpu_blocks=num_gpu_blocks, block_size=block_size,
                    enable_caching=enable_caching, blocks_per_chunk=bpc,
                    bytes_per_block=bytes_per_block,
                    offload_prompt_only=True if prompt_only is None else bool(prompt_only),
                    cpu=cpu, fs_tiers=tuple(tiers), seed=seed,
                    bytes_per_chunk=0 if chunk_bytes == bytes_per_block * bpc else chunk_bytes)
