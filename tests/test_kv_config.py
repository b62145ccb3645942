"""blis_sim.kv configuration: validation, the offload-config adapter, the transfer stations."""
from __future__ import annotations

from pathlib import Path

import pytest

from blis_sim.errors import ConfigError, SimulationError
from blis_sim.kv import (CpuTierConfig, FsTierConfig, KVCache, KVConfig, TierStation,
                         from_offload_config)
from blis_sim.kv.station import TransferStation

OFFLOAD = {
    "cpu_bytes_to_use": 10 * 32768,
    "block_size": 32,
    "eviction_policy": "arc",
    "offload_prompt_only": False,
    "secondary_tiers": [{"type": "fs", "read_bandwidth": 7000.0, "write_bandwidth": 5000.0,
                         "base_latency": 80.0, "n_read_threads": 4, "n_write_threads": 2,
                         "saturation_queue_depth": 4, "single_transfer_fraction": 0.5,
                         "latency_jitter_stddev": 0.1, "max_bytes": 3 * 32768}],
}


def test_adapter_maps_every_field() -> None:
    cfg = from_offload_config(OFFLOAD, block_size=16, num_gpu_blocks=100, bytes_per_block=16384)
    assert cfg.blocks_per_chunk == 2 and cfg.chunk_tokens == 32 and cfg.chunk_bytes == 32768
    assert cfg.cpu is not None and cfg.cpu.num_chunks == 10 and cfg.cpu.eviction_policy == "arc"
    assert cfg.offload_prompt_only is False
    (fs,) = cfg.fs_tiers
    assert fs.max_bytes == 3 * 32768
    assert fs.station == TierStation(read_bandwidth=7000.0, write_bandwidth=5000.0,
                                     base_latency=80.0, n_read_threads=4, n_write_threads=2,
                                     saturation_queue_depth=4, single_transfer_fraction=0.5,
                                     latency_jitter_stddev=0.1)
    assert cfg.tier_labels == ("0:primary", "1:fs")
    cache = KVCache(cfg, backend="python")
    assert [t.capacity for t in cache.tiers] == [10, 3]


REPO = Path(__file__).resolve().parents[1]


def test_adapter_takes_the_formats_offload_config() -> None:
    """The sample offload.yaml (qwen3-14b: 160 KiB/token) through blis_sim.formats.offload."""
    from blis_sim.formats.offload import load_offload_config

    off = load_offload_config(REPO / "samples" / "blis" / "offload.yaml",
                              kv_bytes_per_token=163840)
    cfg = from_offload_config(off, block_size=16, num_gpu_blocks=1000, bytes_per_block=0)
    assert cfg.chunk_bytes == off.bytes_per_chunk == 2621440
    assert cfg.cpu is not None and cfg.cpu.num_chunks == off.cpu_capacity_chunks == 409
    (fs,) = cfg.fs_tiers
    assert (fs.station.read_bandwidth, fs.station.write_bandwidth, fs.station.base_latency) == (
        7000.0, 5000.0, 80.0)  # nvme_gen4
    assert fs.station.n_read_threads == 16 and fs.max_bytes is None
    cache = KVCache(cfg, backend="python")
    assert [t.capacity for t in cache.tiers] == [409, -1]


def test_adapter_without_offload_is_gpu_only() -> None:
    cfg = from_offload_config(None, block_size=32, num_gpu_blocks=512, bytes_per_block=0)
    assert cfg.cpu is None and cfg.tier_labels == ()
    assert KVCache(cfg, backend="python").hit_rate_entries()[0]["definition"] == "prefix_cache"


@pytest.mark.parametrize(("change", "field"), [
    ({"cpu_bytes_to_use": 100}, "kv_offload.cpu_bytes_to_use"),
    ({"block_size": 24}, "kv_offload.block_size"),
    ({"block_size": 32, "blocks_per_chunk": 3}, "kv_offload.blocks_per_chunk"),
])
def test_adapter_refuses_unusable_configs(change: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_offload_config({**OFFLOAD, **change}, block_size=16, num_gpu_blocks=100,
                            bytes_per_block=16384)
    assert err.value.location.field == field


def test_adapter_names_the_bad_tier_field() -> None:
    bad = {**OFFLOAD, "secondary_tiers": [{**OFFLOAD["secondary_tiers"][0], "n_read_threads": 0}]}
    with pytest.raises(ConfigError, match=r"secondary_tiers\[0\]\.n_read_threads"):
        from_offload_config(bad, block_size=16, num_gpu_blocks=100, bytes_per_block=16384)


def test_adapter_needs_bytes_per_block_for_offload() -> None:
    with pytest.raises(ConfigError, match="per_block_bytes"):
        from_offload_config(OFFLOAD, block_size=16, num_gpu_blocks=100, bytes_per_block=0)


@pytest.mark.parametrize(("factory", "field"), [
    (lambda: KVConfig(num_gpu_blocks=1), "num_gpu_blocks"),
    (lambda: KVConfig(num_gpu_blocks=10, block_size=0), "block_size"),
    (lambda: CpuTierConfig(num_chunks=0), "cpu.num_chunks"),
    (lambda: CpuTierConfig(num_chunks=4, eviction_policy="fifo"), "eviction_policy"),
    (lambda: TierStation(read_bandwidth=0.0), "read_bandwidth"),
    (lambda: TierStation(base_latency=float("nan")), "base_latency"),
    (lambda: TierStation(saturation_queue_depth=4, single_transfer_fraction=1.5),
     "single_transfer_fraction"),
    (lambda: KVConfig(num_gpu_blocks=10, fs_tiers=(FsTierConfig(),)), "secondary_tiers"),
    (lambda: KVConfig(num_gpu_blocks=10, bytes_per_block=100, cpu=CpuTierConfig(num_chunks=2),
                      fs_tiers=(FsTierConfig(max_bytes=50),)), "secondary_tiers[0].max_bytes"),
])
def test_config_errors_name_the_field(factory, field: str) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError) as err:
        factory()
    assert err.value.location.field == field


def _stations() -> list:
    out: list = [TransferStation]
    try:
        from blis_sim.kv import _core
    except ImportError:
        return out
    return out + [_core.Station]  # the compiled twin


@pytest.mark.parametrize("station", _stations(), ids=lambda c: c.__module__)
def test_station_ramp_matches_the_reference_check_vector(station: type) -> None:
    """docs/reference-formats.md §7.1: peak 10 B/µs, base 100, Qsat 4, f1 0.5, 1000 B → 300/250/220/200."""
    st = station(TierStation(read_bandwidth=10.0, base_latency=100.0,
                                     saturation_queue_depth=4, single_transfer_fraction=0.5,
                                     n_read_threads=8), seed=0)
    assert [st.service_time(True, 1000, q) for q in (1, 2, 3, 4, 6)] == pytest.approx(
        [300.0, 250.0, 220.0, 200.0, 200.0])
    # four jobs at once: each starts with one more in service than the previous
    assert [st.submit(True, 1000, 0.0)[1] for _ in range(4)] == pytest.approx(
        [300.0, 250.0, 220.0, 200.0])


def test_station_queues_fifo_per_pool() -> None:
    st = TransferStation(TierStation(write_bandwidth=1.0, base_latency=0.0, n_write_threads=2),
                         seed=0)
    done = [st.submit(False, 100, 0.0)[0] for _ in range(3)]
    assert done == [100.0, 100.0, 200.0]  # the third waits for a free server
    assert st.submit(True, 100, 0.0)[0] == pytest.approx(100 / 20000.0)  # reads unaffected


def test_station_jitter_is_seeded() -> None:
    cfg = TierStation(latency_jitter_stddev=0.3)
    a = [TransferStation(cfg, seed=3).submit(True, 1000, 0.0)[1] for _ in range(2)]
    b = TransferStation(cfg, seed=4).submit(True, 1000, 0.0)[1]
    assert a[0] == a[1] != b


def test_unknown_requests_are_simulation_errors() -> None:
    cache = KVCache(KVConfig(num_gpu_blocks=10), backend="python")
    with pytest.raises(SimulationError, match="request 7"):
        cache.lookup(7, 0.0)
    cache.add_request(7, None, 10)
    with pytest.raises(SimulationError, match="already registered"):
        cache.add_request(7, None, 10)
    with pytest.raises(SimulationError, match="needs 2"):
        cache.add_request(8, [1], 40)
