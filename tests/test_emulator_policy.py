"""The CPU tier's own policies over HTTP: ARC eviction and ``store_threshold`` (vLLM 0.32's
``CPUOffloadingManager`` with ``ARCCachePolicy`` / the reuse tracker), with hand-computed numbers.

Geometry: block 32, 5 GPU blocks (4 usable: vLLM reserves a null block), 512 B of KV per token, so one
offload chunk (1 block) is 16 KiB; the CPU tier holds 8 chunks, no secondary tier. Every prompt is 127
token ids (3 full chunks, prompt-only stores) and asks for one token, so a request takes all 4 usable
GPU blocks and the next distinct prompt evicts it from the GPU. Requests run one at a time.
"""
from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest

from blis_sim.emulator import EmulatorConfig, start_emulator
from blis_sim.emulator.config import OffloadSpec, TierSpec
from blis_sim.emulator.offload import OffloadTiers, _Arc
from blis_sim.emulator.stats import EngineStats
from blis_sim.errors import ConfigError

CHUNK_BYTES = 32 * 512


def _emulator(tmp_path: Path, body: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "offload.yaml"
    path.write_text(f"kv_offload:\n  cpu_bytes_to_use: {8 * CHUNK_BYTES}\n{body}")
    cfg = EmulatorConfig(profile="zero", block_size=32, num_gpu_blocks=5, kv_bytes_per_token=512,
                         max_model_len=256, kv_offload_config=str(path),
                         enable_prompt_tokens_details=True, stats_interval_s=0)
    return start_emulator(cfg)


def _cached(client: httpx.Client, base: int) -> int:
    r = client.post("/v1/completions", json={"prompt": list(range(base, base + 127)), "max_tokens": 1})
    r.raise_for_status()
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


A, B, SCAN = 1000, 2000, (3000, 4000, 5000)


def _scan_after_reuse(emu) -> list[int]:  # type: ignore[no-untyped-def]
    """A, B (once), A again (from the CPU), a one-off scan of 9 chunks, then A and B again."""
    with httpx.Client(base_url=emu.url, timeout=10) as client:
        cached = [_cached(client, A), _cached(client, B), _cached(client, A)]
        for base in SCAN:
            _cached(client, base)
        return cached + [_cached(client, A), _cached(client, B)]


@pytest.mark.parametrize(("policy", "expected"), [
    # ARC: A's reload moves its 3 chunks to T2; the scan (T1 >= target 0) evicts only from T1, so
    # B (offered once) and the scan's own oldest chunks go, and A hits whole from the CPU tier.
    ("arc", [0, 0, 96, 96, 0]),
    # LRU: the 9 scan chunks overflow the tier by 7: the 6 older chunks (A too) and the scan's first go.
    ("lru", [0, 0, 96, 0, 0]),
])
def test_arc_keeps_chunks_reused_against_a_one_off_scan(tmp_path: Path, policy: str, expected: list[int]) -> None:
    with _emulator(tmp_path, f"  eviction_policy: {policy}\n") as emu:
        assert _scan_after_reuse(emu) == expected
        s = emu.published().stats
        assert s.offload_allocation_failures == 0
        assert s.cached_by_source["host"] == sum(expected)


def test_store_threshold_stores_on_the_second_offer(tmp_path: Path) -> None:
    with _emulator(tmp_path, "  store_threshold: 2\n") as emu, \
            httpx.Client(base_url=emu.url, timeout=10) as client:
        def counters() -> tuple[int, int]:
            s = emu.published().stats
            return s.offload_stores_skipped, s.offload_store_bytes // CHUNK_BYTES

        # First offers: every chunk is a new candidate below the threshold, so skipped, not stored.
        assert (_cached(client, A), _cached(client, B)) == (0, 0)
        assert counters() == (6, 0)
        # Second offers (nothing resident to hit): the counts reach 2 and the chunks are stored.
        assert (_cached(client, A), _cached(client, B)) == (0, 0)
        assert counters() == (6, 6)
        # A, evicted from the GPU by B, now loads whole from the CPU tier; nothing is offered after
        # an external hit, so neither counter moves.
        assert _cached(client, A) == 96
        assert counters() == (6, 6)
        # A new prompt whose head is A's: the resident chunks are no candidates (their counts move
        # anyway), the new tail chunk is a first sighting.
        r = client.post("/v1/completions", json={"prompt": list(range(A, A + 64)) + list(range(9000, 9063)),
                                                 "max_tokens": 1})
        r.raise_for_status()
        assert counters() == (7, 6)
        text = client.get("/metrics").text
        assert 'vllm:kv_offload_stores_skipped_total{engine="0"' in text
        sample = [line for line in text.splitlines() if line.startswith("vllm:kv_offload_stores_skipped_total")]
        assert len(sample) == 1 and float(sample[0].rsplit(" ", 1)[1]) == 7


def test_stores_skipped_is_only_exported_with_a_threshold(tmp_path: Path) -> None:
    with _emulator(tmp_path, "") as emu, httpx.Client(base_url=emu.url, timeout=10) as client:
        _cached(client, A)
        text = client.get("/metrics").text
        assert "vllm:kv_offload_allocation_failure" in text and "stores_skipped" not in text


def test_store_threshold_with_a_secondary_tier_is_refused() -> None:
    # vLLM 0.32's TieringOffloadingSpec raises ValueError for it; only CPUOffloadingSpec filters.
    with pytest.raises(ConfigError, match="TieringOffloadingSpec") as info:
        OffloadSpec(cpu_bytes=8 * CHUNK_BYTES, store_threshold=2, secondary_tiers=(TierSpec(),))
    assert info.value.location.field == "kv_offload.store_threshold"
    OffloadSpec(cpu_bytes=8 * CHUNK_BYTES, store_threshold=1, secondary_tiers=(TierSpec(),))  # 0/1: no filter


def test_store_threshold_with_an_fs_tier_file_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "offload.yaml"
    path.write_text("kv_offload:\n  cpu_bytes_to_use: 1073741824\n  store_threshold: 2\n"
                    f"  secondary_tiers:\n    - type: fs\n      root_dir: {tmp_path / 'kv'}\n"
                    "      direct_io: true\n      device_class: nvme_gen4\n")
    with pytest.raises(ConfigError) as info:
        start_emulator(EmulatorConfig(profile="zero", kv_offload_config=str(path)))
    assert f"{path}:3" in str(info.value) and "store_threshold" in str(info.value)


def test_arc_eviction_order_and_ghost_learning() -> None:
    arc = _Arc(capacity=4)
    for key in (1, 2, 3, 4):
        arc.insert(key)
    arc.finish([1, 2], inserted=set(), reused={1, 2})  # reused: T1 -> T2, tail first
    assert (list(arc.t1), list(arc.t2)) == ([3, 4], [2, 1])
    assert arc.evict(1, lambda k: k != 3) == [4]  # T1 (size 2 >= target 0) first, skipping the pinned 3
    assert arc.evict(4, lambda k: True) is None  # atomic: only 3 chunks resident, nothing changes
    assert (list(arc.t1), list(arc.t2), list(arc.b1)) == ([3], [2, 1], [4])
    arc.on_store_miss([4])  # a B1 ghost about to be stored: T1's target grows by max(1, |B2|/|B1|)
    assert arc.target == 1.0
    arc.insert(4)
    assert 4 not in arc.b1 and list(arc.t1) == [3, 4]
    assert arc.evict(2, lambda k: True) == [3, 4]  # T1 (2) >= target (1): T1 again, twice
    assert arc.evict(1, lambda k: True) == [2]  # T1 empty: the T2 fallback
    arc.on_store_miss([2])  # a B2 ghost: the target shrinks by max(1, |B1|/|B2|) = 2
    assert arc.target == 0.0 and list(arc.b1) == [3, 4] and list(arc.b2) == [2]


@pytest.mark.parametrize("seed", range(20))
def test_arc_lists_mirror_the_cpu_tier(seed: int) -> None:
    """Seeded random lookups, loads, stores and finishes (with and without an fs tier or a threshold):
    T1 and T2 always partition the CPU tier's chunks, ghosts are never resident, every bound holds."""
    rng = random.Random(seed)
    secondary = (TierSpec(max_bytes=rng.choice([None, 20 * CHUNK_BYTES])),) if seed % 2 else ()
    spec = OffloadSpec(cpu_bytes=rng.randint(1, 12) * CHUNK_BYTES, eviction_policy="arc",
                       store_threshold=0 if secondary else rng.choice([0, 2, 3]), secondary_tiers=secondary)
    tiers = OffloadTiers(spec, block_size=32, kv_bytes_per_token=512, host_bandwidth_Bps=1e9,
                         host_latency_s=1e-5, stats=EngineStats())
    arc = tiers._arc
    assert arc is not None
    now, live = 0.0, []
    for _ in range(300):
        now += rng.random() * 1e-4
        tiers.next_event_time(now)
        if rng.random() < 0.5:
            req, prefix, n = object(), rng.randint(0, 6), rng.randint(1, 6)
            hashes = [prefix * 100 + i for i in range(n)]
            result = tiers.lookup(req, hashes, 0, n * 32, now)
            if result is not None and result.keys:
                tiers.start_load(req, result, now)
            tiers.store(req, hashes, now)
            live.append(req)
        elif live:
            tiers.finish_request(live.pop(rng.randrange(len(live))))
        assert set(arc.t1) | set(arc.t2) == set(tiers.cpu) and not set(arc.t1) & set(arc.t2)
        assert len(tiers.cpu) <= tiers.cpu_capacity and not (set(arc.b1) | set(arc.b2)) & set(tiers.cpu)
        assert max(len(arc.b1), len(arc.b2)) <= tiers.cpu_capacity and 0 <= arc.target <= tiers.cpu_capacity
