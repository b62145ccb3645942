"""Reading ``--kv-offload-config`` (the simulator's offload YAML) into an :class:`OffloadSpec`.

Uses ``blis_sim.formats.offload.load_offload_config`` when that module exists (the shared reader);
until then a strict local reader of the same schema (``blis-pipeline.md`` §6.1, plus ``max_bytes``
per tier). Only the file is shared with the simulator, never KV logic (design D3).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from blis_sim.emulator.config import _DEVICE_CLASSES, OffloadSpec, TierSpec
from blis_sim.errors import ConfigError
from blis_sim.formats._strict import describe, load_yaml


class _Tier(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: str
    root_dir: str
    direct_io: bool
    n_read_threads: int = 16
    n_write_threads: int = 16
    locality: str = ""
    enable_kv_events: bool = False
    device_class: str | None = None
    read_bandwidth: float | None = None  # bytes/us
    write_bandwidth: float | None = None
    base_latency: float | None = None  # us
    max_bytes: int | None = None


class _KVOffload(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    cpu_bytes_to_use: int
    block_size: int | None = None
    blocks_per_chunk: int | None = None
    tokens_per_hash: int | None = None
    eviction_policy: str = "lru"
    offload_prompt_only: bool = True
    self_describing_kv_events: bool = False
    store_threshold: int | None = None
    secondary_tiers: list[_Tier] = []


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    kv_offload: _KVOffload


_SHARED_READER = False


def read(path: Path, *, block_size: int, kv_bytes_per_token: int) -> OffloadSpec:
    # Switched to the shared reader once its signature is checked (see _from_shared).
    if _SHARED_READER and importlib.util.find_spec("blis_sim.formats.offload") is not None:
        return _from_shared(path, block_size=block_size, kv_bytes_per_token=kv_bytes_per_token)
    return _read_local(path, block_size=block_size, kv_bytes_per_token=kv_bytes_per_token)


def _from_shared(path: Path, *, block_size: int, kv_bytes_per_token: int) -> OffloadSpec:
    from blis_sim.formats import offload  # the formats engineer's reader

    cfg: Any = offload.load_offload_config(path, kv_bytes_per_token=kv_bytes_per_token,
                                           gpu_block_size=block_size)
    return spec_from_offload_config(cfg, block_size=block_size, file=str(path))


def spec_from_offload_config(cfg: Any, *, block_size: int, file: str | None = None) -> OffloadSpec:
    """Adapter from the shared ``OffloadConfig`` model (duck-typed on its documented fields)."""
    chunk_tokens = int(getattr(cfg, "block_size", block_size) or block_size)
    tiers = []
    for tier in getattr(cfg, "secondary_tiers", ()) or ():
        tiers.append(TierSpec(
            type=tier.type,
            read_bandwidth_Bps=float(tier.read_bandwidth) * 1e6,
            write_bandwidth_Bps=float(tier.write_bandwidth) * 1e6,
            latency_s=float(tier.base_latency) * 1e-6,
            n_read_threads=int(tier.n_read_threads),
            n_write_threads=int(tier.n_write_threads),
            max_bytes=getattr(tier, "max_bytes", None),
        ))
    if chunk_tokens % block_size:
        raise ConfigError(f"block_size ({chunk_tokens}) must be a positive multiple of the GPU block "
                          f"size ({block_size})", file=file, field="kv_offload.block_size")
    return OffloadSpec(cpu_bytes=int(cfg.cpu_bytes_to_use), blocks_per_chunk=chunk_tokens // block_size,
                       offload_prompt_only=bool(cfg.offload_prompt_only),
                       eviction_policy=cfg.eviction_policy, secondary_tiers=tuple(tiers))


def _read_local(path: Path, *, block_size: int, kv_bytes_per_token: int) -> OffloadSpec:
    doc = load_yaml(path)
    if not isinstance(doc.data, dict) or "kv_offload" not in doc.data:
        raise ConfigError("the --kv-offload-config file has no top-level kv_offload: block", file=str(path))
    try:
        parsed = _File.model_validate(doc.data)
    except ValidationError as exc:
        raise describe(exc, doc) from None
    kv = parsed.kv_offload

    def fail(message: str, fld: str) -> ConfigError:
        return ConfigError(message, file=str(path), line=doc.line_of(tuple(fld.split("."))), field=fld)

    if kv.block_size is not None and kv.blocks_per_chunk is not None:
        raise fail("block_size and blocks_per_chunk are mutually exclusive; set at most one",
                   "kv_offload.block_size")
    bpc = kv.blocks_per_chunk or 1
    if kv.block_size is not None:
        if kv.block_size <= 0 or kv.block_size % block_size:
            raise fail(f"block_size ({kv.block_size}) must be a positive multiple of the GPU block "
                       f"size ({block_size})", "kv_offload.block_size")
        bpc = kv.block_size // block_size
    if bpc <= 0:
        raise fail(f"blocks_per_chunk must be > 0, got {bpc}", "kv_offload.blocks_per_chunk")
    if kv.store_threshold is not None and not 0 <= kv.store_threshold <= 1:
        raise fail(f"store_threshold={kv.store_threshold} is not supported (0 or 1 only)",
                   "kv_offload.store_threshold")
    if kv.eviction_policy != "lru":
        raise fail(f"eviction_policy {kv.eviction_policy!r} is not implemented by the emulator "
                   "(only 'lru')", "kv_offload.eviction_policy")
    chunk_bytes = bpc * block_size * kv_bytes_per_token
    if kv.cpu_bytes_to_use < chunk_bytes:
        raise fail(f"cpu_bytes_to_use ({kv.cpu_bytes_to_use}) is less than one offload chunk "
                   f"({chunk_bytes} bytes)", "kv_offload.cpu_bytes_to_use")
    tiers = []
    for i, tier in enumerate(kv.secondary_tiers):
        where = f"kv_offload.secondary_tiers.{i}"
        if tier.type != "fs":
            raise fail(f"type={tier.type!r} is not supported (only 'fs')", where + ".type")
        read_bw, write_bw, latency = _DEVICE_CLASSES.get(tier.device_class or "", (None, None, None))
        if tier.device_class is not None and read_bw is None:
            raise fail(f"device_class={tier.device_class!r} is not defined (known: "
                       f"{', '.join(sorted(_DEVICE_CLASSES))})", where + ".device_class")
        read_bw = tier.read_bandwidth if tier.read_bandwidth is not None else read_bw
        write_bw = tier.write_bandwidth if tier.write_bandwidth is not None else write_bw
        latency = tier.base_latency if tier.base_latency is not None else latency
        if read_bw is None or write_bw is None or latency is None:
            raise fail("needs a device_class OR an explicit read_bandwidth + write_bandwidth + "
                       "base_latency triple", where)
        try:
            tiers.append(TierSpec(type="fs", read_bandwidth_Bps=read_bw * 1e6,
                                  write_bandwidth_Bps=write_bw * 1e6, latency_s=latency * 1e-6,
                                  n_read_threads=tier.n_read_threads,
                                  n_write_threads=tier.n_write_threads, max_bytes=tier.max_bytes))
        except ConfigError as exc:
            raise fail(exc.reason, f"{where}.{exc.location.field}") from None
    return OffloadSpec(cpu_bytes=kv.cpu_bytes_to_use, blocks_per_chunk=bpc,
                       offload_prompt_only=kv.offload_prompt_only, secondary_tiers=tuple(tiers))
