"""Reading ``--kv-offload-config`` (the simulator's offload YAML, or what ``vllm serve`` takes as
``--kv-transfer-config``) into the emulator's :class:`OffloadSpec`.

The file is parsed and validated by the shared reader, ``blis_sim.formats.offload.load_offload_config``
(every message with file, line and field); only the file format is shared with the simulator,
never KV logic (design D3). The reader refuses ``store_threshold >= 2`` with secondary tiers (as
vLLM's TieringOffloadingSpec does); :class:`OffloadSpec` checks it again for specs built in memory.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from blis_sim.emulator.config import OffloadSpec, TierSpec
from blis_sim.errors import ConfigError

if TYPE_CHECKING:
    from blis_sim.formats.offload import OffloadConfig


def read(path: str | Path, *, block_size: int, kv_bytes_per_token: int) -> OffloadSpec:
    """The config at ``path`` (our YAML, or vLLM's --kv-transfer-config as a file or as the JSON itself)."""
    from blis_sim.formats.offload import INLINE, is_inline, load_offload_config

    cfg = load_offload_config(path, kv_bytes_per_token=kv_bytes_per_token, gpu_block_size=block_size)
    return spec_from_offload_config(cfg, file=INLINE if is_inline(path) else str(path))


def spec_from_offload_config(cfg: OffloadConfig, *, file: str | None = None) -> OffloadSpec:
    """``formats.offload.OffloadConfig`` (resolved) -> OffloadSpec (bandwidths in bytes/s, seconds)."""
    tiers = tuple(
        TierSpec(type=tier.type, read_bandwidth_Bps=tier.read_bandwidth * 1e6,
                 write_bandwidth_Bps=tier.write_bandwidth * 1e6, latency_s=tier.base_latency * 1e-6,
                 n_read_threads=tier.n_read_threads, n_write_threads=tier.n_write_threads,
                 max_bytes=tier.max_bytes)
        for tier in cfg.secondary_tiers
    )
    try:
        return OffloadSpec(cpu_bytes=cfg.cpu_bytes_to_use, blocks_per_chunk=cfg.blocks_per_chunk,
                           offload_prompt_only=cfg.offload_prompt_only, eviction_policy=cfg.eviction_policy,
                           store_threshold=cfg.store_threshold, secondary_tiers=tiers)
    except ConfigError as exc:  # name the file the values came from
        raise ConfigError(exc.reason, file=file, field=exc.location.field) from None
