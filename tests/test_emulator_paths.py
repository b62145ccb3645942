"""Counter semantics of design D2 on the four canonical cache paths, with hand-computed numbers.

Geometry: block 32, 5 GPU blocks (4 usable: vLLM reserves a null block), 512 B of KV per token, so
one offload chunk (1 block) is 16 KiB; the CPU tier holds 8 chunks; one unbounded fs tier.
Prompts are token ids, so every count is exact. Requests run one at a time (max_tokens=1).
"""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from blis_sim.emulator import EmulatorConfig, start_emulator
from blis_sim.emulator.stats import EngineStats

CHUNK_BYTES = 32 * 512


def _offload_yaml(tmp_path: Path, cpu_chunks: int = 8) -> str:
    path = tmp_path / "offload.yaml"
    path.write_text(
        "kv_offload:\n"
        f"  cpu_bytes_to_use: {cpu_chunks * CHUNK_BYTES}\n"
        "  secondary_tiers:\n"
        "    - type: fs\n"
        f"      root_dir: {tmp_path / 'kv'}\n"
        "      direct_io: true\n"
        "      device_class: nvme_gen4\n"
    )
    return str(path)


def _prompt(base: int, n: int) -> list[int]:
    return list(range(base, base + n))


class Counters:
    """Deltas of the engine's published counters between two snapshots."""

    def __init__(self, before: EngineStats, after: EngineStats) -> None:
        self.prefix = (after.prefix_queries - before.prefix_queries, after.prefix_hits - before.prefix_hits)
        self.external = (after.external_queries - before.external_queries,
                         after.external_hits - before.external_hits)
        self.by_source = {k: after.cached_by_source[k] - before.cached_by_source[k]
                          for k in ("device", "host", "disk")}

        def tier(stats: EngineStats, label: str) -> tuple[int, int]:
            t = stats.tiers.get(label)
            return (t.chunk_queries, t.chunk_hits) if t else (0, 0)

        self.tier0 = tuple(a - b for a, b in zip(tier(after, "0:primary"), tier(before, "0:primary")))
        self.tier1 = tuple(a - b for a, b in zip(tier(after, "1:fs"), tier(before, "1:fs")))


@pytest.fixture()
def tiered(tmp_path: Path):  # type: ignore[no-untyped-def]
    cfg = EmulatorConfig(profile="zero", block_size=32, num_gpu_blocks=5, kv_bytes_per_token=512,
                         max_model_len=256, kv_offload_config=_offload_yaml(tmp_path),
                         enable_prompt_tokens_details=True, stats_interval_s=0)
    with start_emulator(cfg) as emu:
        yield emu


def _run(emu, client: httpx.Client, prompt: list[int]) -> tuple[Counters, int]:  # type: ignore[no-untyped-def]
    before = emu.published().stats
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    r.raise_for_status()
    cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return Counters(before, emu.published().stats), cached


def test_four_canonical_paths(tiered) -> None:  # type: ignore[no-untyped-def]
    a = _prompt(1000, 96)  # 3 blocks = 3 chunks; GPU max hit = floor(95/32)*32 = 64
    with httpx.Client(base_url=tiered.url, timeout=10) as client:
        # 1. Full miss: the first pass asks the CPU tier about all 3 chunks (the fs tier's first
        # answer is RETRY, which does not stop the scan); then chunk 0 misses the fs tier, and the
        # lookup stops there.
        miss, cached = _run(tiered, client, a)
        assert miss.prefix == (96, 0) and miss.external == (96, 0) and cached == 0
        assert miss.tier0 == (3, 0) and miss.tier1 == (1, 0)
        assert miss.by_source == {"device": 0, "host": 0, "disk": 0}

        # 2. GPU hit: blocks 0-1 still cached on the GPU (the last token is never a GPU hit). The
        # connector then looks up what the GPU missed and, as in vLLM, finds chunk 2 in the CPU
        # tier: the whole prompt is cached (the last token is recomputed after the load).
        gpu, cached = _run(tiered, client, a)
        assert gpu.prefix == (96, 64) and cached == 96
        assert gpu.external == (32, 32)  # queries = num_tokens - local hit
        assert gpu.by_source == {"device": 64, "host": 32, "disk": 0}
        assert gpu.tier0 == (1, 1) and gpu.tier1 == (0, 0)

        # B takes all 4 usable GPU blocks: A's cached blocks are evicted from the GPU, but A's
        # chunks stay in the CPU tier (6 of 8 chunks used).
        _run(tiered, client, _prompt(5000, 127))

        # 3. CPU hit: no GPU hit; all three chunks load from the CPU tier.
        cpu, cached = _run(tiered, client, a)
        assert cpu.prefix == (96, 0) and cpu.external == (96, 96) and cached == 96
        assert cpu.by_source == {"device": 0, "host": 96, "disk": 0}
        assert cpu.tier0 == (3, 3) and cpu.tier1 == (0, 0)

        # C, D, E store 9 more chunks: LRU pushes all of A out of the 8-chunk CPU tier; the fs tier
        # (unbounded) still holds them, and the GPU holds none of A.
        for base in (6000, 7000, 8000):
            _run(tiered, client, _prompt(base, 127))

        # 4. Storage hit: every chunk misses the CPU, hits the fs tier, is promoted, then loaded.
        disk, cached = _run(tiered, client, a)
        assert disk.prefix == (96, 0) and disk.external == (96, 96) and cached == 96
        assert disk.by_source == {"device": 0, "host": 0, "disk": 96}
        assert disk.tier0 == (3, 0) and disk.tier1 == (3, 3)

        # 5. A prefix with a new suffix: the GPU serves the prefix, the suffix is computed.
        suffix, cached = _run(tiered, client, a[:64] + _prompt(9000, 40))
        assert suffix.prefix == (104, 64) and suffix.external == (40, 0) and cached == 64

        # 6. prompt_logprobs skips every cache: no local stats, but the connector still records its
        # queries (the whole prompt, no hit), as vLLM 0.32's scheduler does.
        before = tiered.published().stats
        client.post("/v1/completions", json={"prompt": a, "max_tokens": 1, "prompt_logprobs": 0}).raise_for_status()
        plp = Counters(before, tiered.published().stats)
        assert plp.prefix == (0, 0) and plp.external == (96, 0) and plp.tier0 == (0, 0)

        # by_source sums to prefix hits + external hits over the whole run (vLLM 0.33's invariant).
        s = tiered.published().stats
        assert sum(s.cached_by_source.values()) == s.prefix_hits + s.external_hits
        # Bytes: tiering read/write counters are per secondary tier (promotions / cascades); GPU <-> CPU
        # traffic is the connector's load/store counters. Every chunk stored to the CPU cascaded to fs.
        assert s.tiers["1:fs"].read_bytes == 3 * CHUNK_BYTES  # the three promotions
        # Stored chunks: A 3, B 3, C-E 9, the suffix request's new chunk 1 (resident ones are skipped).
        assert s.tiers["1:fs"].write_bytes == s.offload_store_bytes == 16 * CHUNK_BYTES
        assert s.offload_load_bytes == 7 * CHUNK_BYTES  # loads of 1 + 3 + 3 chunks
        assert s.tiers["0:primary"].read_bytes == s.tiers["0:primary"].write_bytes == 0


def test_without_offload_external_counters_stay_zero() -> None:
    cfg = EmulatorConfig(profile="zero", block_size=32, num_gpu_blocks=5, max_model_len=256,
                         enable_prompt_tokens_details=True, stats_interval_s=0)
    with start_emulator(cfg) as emu, httpx.Client(base_url=emu.url, timeout=10) as client:
        a = _prompt(1000, 96)
        _run(emu, client, a)
        again, _ = _run(emu, client, a)
        assert again.prefix == (96, 64)
        assert again.external == (0, 0) and again.tier0 == (0, 0)


def test_fs_tier_capacity_limits_storage_hits(tmp_path: Path) -> None:
    """An fs tier with max_bytes of 2 chunks keeps only the 2 most recent: A's chunks are gone."""
    path = tmp_path / "offload.yaml"
    path.write_text(
        "kv_offload:\n"
        f"  cpu_bytes_to_use: {2 * CHUNK_BYTES}\n"
        "  secondary_tiers:\n"
        f"    - {{type: fs, root_dir: {tmp_path}, direct_io: true, device_class: nvme_gen4, "
        f"max_bytes: {2 * CHUNK_BYTES}}}\n")
    cfg = EmulatorConfig(profile="zero", block_size=32, num_gpu_blocks=5, kv_bytes_per_token=512,
                         max_model_len=256, kv_offload_config=str(path), stats_interval_s=0,
                         enable_prompt_tokens_details=True)
    with start_emulator(cfg) as emu, httpx.Client(base_url=emu.url, timeout=10) as client:
        a = _prompt(1000, 96)
        _run(emu, client, a)
        _run(emu, client, _prompt(5000, 127))
        again, _ = _run(emu, client, a)
        assert again.external == (96, 0)
        assert again.tier0 == (3, 0) and again.tier1 == (1, 0)


def test_storage_hit_larger_than_the_cpu_tier_does_not_livelock(tmp_path: Path) -> None:
    """A 3-chunk prefix only in fs and a 2-chunk CPU tier: promotions never evict the lookup's own
    chunks, so the request is admitted with the 2 chunks that fit (a partial storage hit) instead of
    promoting and evicting in a circle forever."""
    path = tmp_path / "offload.yaml"
    path.write_text(
        "kv_offload:\n"
        f"  cpu_bytes_to_use: {2 * CHUNK_BYTES}\n"
        "  secondary_tiers:\n"
        f"    - {{type: fs, root_dir: {tmp_path}, direct_io: true, read_bandwidth: 1000000, "
        "write_bandwidth: 1000000, base_latency: 0}\n")
    # One chunk per step (token budget 32), so each store lands before the next one needs room.
    cfg = EmulatorConfig(profile="zero", block_size=32, num_gpu_blocks=6, kv_bytes_per_token=512,
                         max_model_len=256, max_num_batched_tokens=32, kv_offload_config=str(path),
                         enable_prompt_tokens_details=True, stats_interval_s=0)
    with start_emulator(cfg) as emu, httpx.Client(base_url=emu.url, timeout=10) as client:
        a = _prompt(1000, 128)  # 4 chunks, all stored (CPU keeps the last 2, fs all 4); max hit 3
        _run(emu, client, a)
        _run(emu, client, _prompt(5000, 159))  # takes all 5 GPU blocks; its chunks push A out of the CPU
        disk, cached = _run(emu, client, a)
        failures = emu.published().stats.promotion_allocation_failures
    assert disk.tier0 == (4, 0) and disk.tier1 == (3, 3)  # the first pass asks the CPU about all 4 chunks
    assert disk.by_source["disk"] == 64 and cached == 64 and disk.external == (128, 64)
    assert failures >= 2  # chunk 2 found no room, twice
