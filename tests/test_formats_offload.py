"""Offload config: the reference's resolution rules and error fragments, our chunk model, header round trips."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_sim.errors import ConfigError, FormatError, InputError
from blis_sim.formats import (
    DeviceClass,
    OffloadConfig,
    PytestBlisHeader,
    TraceHeader,
    load_device_classes,
    load_offload_config,
    parse_offload_config,
    read_trace_header,
    resolve_offload_config,
)
from blis_sim.formats.trace import OffloadExtensions, TraceKVOffloadConfig, header_text

REPO = Path(__file__).resolve().parents[1]
BLIS = REPO / "samples" / "blis"
QWEN14B = 163840  # bytes per token per rank: 40 layers × 8 kv heads × 128 × 2 (K,V) × 2 bytes

MINIMAL = """\
kv_offload:
  cpu_bytes_to_use: 17179869184
  secondary_tiers:
    - type: fs
      root_dir: /mnt/kv
      direct_io: true
      device_class: nvme_gen4
"""


def _parse(text: str, **kw: object) -> OffloadConfig:
    return parse_offload_config(text, kv_bytes_per_token=kw.pop("kv", QWEN14B), file="off.yaml", **kw)  # type: ignore[arg-type]


def test_sample_resolves_and_matches_the_recorded_header() -> None:
    cfg = load_offload_config(BLIS / "offload.yaml", kv_bytes_per_token=QWEN14B)
    assert cfg.bytes_per_chunk == 2621440 and cfg.cpu_capacity_chunks == 409
    assert cfg.to_header() == read_trace_header(BLIS / "trace.yaml").kv_offload
    assert cfg.secondary_tiers[0].label(0) == "1:fs" and cfg.secondary_tiers[0].capacity_chunks(1) is None


def test_minimal_config_defaults() -> None:
    cfg = _parse(MINIMAL)
    assert (cfg.eviction_policy, cfg.offload_prompt_only, cfg.self_describing_kv_events) == ("lru", True, False)
    assert (cfg.blocks_per_chunk, cfg.block_size, cfg.tokens_per_hash, cfg.gpu_block_size) == (1, 16, 16, 16)
    tier = cfg.secondary_tiers[0]
    assert (tier.n_read_threads, tier.n_write_threads, tier.enable_kv_events, tier.locality) == (16, 16, False, "")
    assert (tier.read_bandwidth, tier.write_bandwidth, tier.base_latency) == (7000.0, 5000.0, 80.0)
    assert (tier.saturation_queue_depth, tier.single_transfer_fraction, tier.latency_jitter_stddev) == (1, 1.0, 0.0)
    assert cfg.store_threshold == 0 and tier.max_bytes is None


def test_explicit_values_override_the_class() -> None:
    cfg = _parse(MINIMAL + "      read_bandwidth: 100\n      base_latency: 5.5\n")
    tier = cfg.secondary_tiers[0]
    assert (tier.read_bandwidth, tier.write_bandwidth, tier.base_latency) == (100.0, 5000.0, 5.5)


def test_chunks_larger_than_a_gpu_block_are_supported() -> None:
    cfg = _parse(MINIMAL.replace("  secondary_tiers", "  block_size: 64\n  secondary_tiers"))
    assert (cfg.blocks_per_chunk, cfg.block_size) == (4, 64)
    assert cfg.bytes_per_chunk == 64 * QWEN14B and cfg.cpu_capacity_chunks == 17179869184 // (64 * QWEN14B)
    cfg2 = _parse(MINIMAL.replace("  secondary_tiers", "  blocks_per_chunk: 2\n  secondary_tiers"), gpu_block_size=32)
    assert (cfg2.blocks_per_chunk, cfg2.block_size, cfg2.gpu_block_size) == (2, 64, 32)


def test_arc_and_store_threshold_no_ops_are_accepted() -> None:
    assert _parse(MINIMAL.replace("  secondary_tiers", "  eviction_policy: arc\n  secondary_tiers")).eviction_policy \
        == "arc"
    for value in (0, 1):
        assert _parse(MINIMAL + f"  store_threshold: {value}\n").store_threshold == 0
    # single-tier (CPUOffloadingSpec) keeps a real threshold: the KV core implements vLLM's filter
    single = _parse("kv_offload:\n  cpu_bytes_to_use: 17179869184\n  store_threshold: 3\n")
    assert single.store_threshold == 3 and single.secondary_tiers == ()


def test_buffered_regime_and_custom_device_classes(tmp_path: Path) -> None:
    (tmp_path / "defaults.yaml").write_text(
        "models: {ignored: true}\nkv_offload_devices:\n  slow:\n    read_bandwidth: 10\n    write_bandwidth: 20\n"
        "    base_latency: 3\n    saturation_queue_depth: 4\n    single_transfer_fraction: 0.5\n"
        "    buffered_read_bandwidth: 40\n")
    classes = load_device_classes(tmp_path / "defaults.yaml")
    assert classes["slow"] == DeviceClass(read_bandwidth=10, write_bandwidth=20, base_latency=3,
                                          saturation_queue_depth=4, single_transfer_fraction=0.5,
                                          buffered_read_bandwidth=40)
    text = MINIMAL.replace("nvme_gen4", "slow")
    direct = _parse(text, device_classes=classes).secondary_tiers[0]
    buffered = _parse(text.replace("direct_io: true", "direct_io: false"), device_classes=classes).secondary_tiers[0]
    assert (direct.read_bandwidth, buffered.read_bandwidth, buffered.write_bandwidth) == (10.0, 40.0, 20.0)
    assert (buffered.saturation_queue_depth, buffered.single_transfer_fraction) == (4, 0.5)
    with pytest.raises(ConfigError, match=r"known: slow\)"):
        _parse(MINIMAL, device_classes=classes)


REJECTS = [
    ("kv_offload:\n  eviction_policy: lru\n", "cpu_bytes_to_use is required", 1, "kv_offload.cpu_bytes_to_use"),
    (MINIMAL + "  store_threshold: 2\n", "TieringOffloadingSpec", 8, "kv_offload.store_threshold"),
    (MINIMAL + "  store_threshold: 5\n", "TieringOffloadingSpec", 8, "kv_offload.store_threshold"),
    (MINIMAL + "  store_threshold: -1\n", "store_threshold must be >= 0", 8, "kv_offload.store_threshold"),
    (MINIMAL + "  block_size: 32\n  blocks_per_chunk: 2\n", "mutually exclusive", 9, "kv_offload.blocks_per_chunk"),
    (MINIMAL + "  block_size: 20\n", "multiple of the GPU block size", 8, "kv_offload.block_size"),
    (MINIMAL + "  blocks_per_chunk: 0\n", "blocks_per_chunk must be > 0", 8, "kv_offload.blocks_per_chunk"),
    (MINIMAL + "  tokens_per_hash: 0\n", "tokens_per_hash", 8, "kv_offload.tokens_per_hash"),
    (MINIMAL.replace("type: fs", "type: obj"), "not supported", 4, "kv_offload.secondary_tiers.0.type"),
    (MINIMAL.replace("type: fs", "type: p2p"), "not supported", 4, "kv_offload.secondary_tiers.0.type"),
    (MINIMAL.replace("- type: fs\n      root_dir", "- root_dir"), "type is required", 4,
     "kv_offload.secondary_tiers.0.type"),
    (MINIMAL.replace("      root_dir: /mnt/kv\n", ""), "root_dir is required", 4,
     "kv_offload.secondary_tiers.0.root_dir"),
    (MINIMAL.replace("      direct_io: true\n", ""), "direct_io must be set", 4,
     "kv_offload.secondary_tiers.0.direct_io"),
    (MINIMAL.replace("nvme_gen4", "nvme_gen9"), "not defined in defaults.yaml", 7,
     "kv_offload.secondary_tiers.0.device_class"),
    (MINIMAL.replace("      device_class: nvme_gen4\n", "      read_bandwidth: 1\n"), "device_class OR an explicit", 4,
     "kv_offload.secondary_tiers.0"),
    (MINIMAL.replace("  secondary_tiers", "  eviction_policy: fifo\n  secondary_tiers"), "eviction_policy", 3,
     "kv_offload.eviction_policy"),
    (MINIMAL + "      locality: MARS\n", "locality must be", 8, "kv_offload.secondary_tiers.0.locality"),
    (MINIMAL + "      n_read_threads: 0\n", "n_read_threads must be > 0", 8,
     "kv_offload.secondary_tiers.0.n_read_threads"),
    (MINIMAL + "      write_bandwidth: -1\n", "write_bandwidth must be a finite value > 0", 8,
     "kv_offload.secondary_tiers.0.write_bandwidth"),
    (MINIMAL + "      base_latency: .nan\n", "base_latency must be a finite value >= 0", 8,
     "kv_offload.secondary_tiers.0.base_latency"),
    (MINIMAL.replace("17179869184", "0"), "cpu_bytes_to_use must be > 0", 2, "kv_offload.cpu_bytes_to_use"),
    # the reference accepts this and panics later (docs/reference-formats.md §6.3): refused at load time
    (MINIMAL.replace("17179869184", "1000"), "smaller than one offload chunk", 2, "kv_offload.cpu_bytes_to_use"),
    (MINIMAL + "      max_bytes: 10\n", "max_bytes (10) is smaller than one offload chunk", 8,
     "kv_offload.secondary_tiers.0.max_bytes"),
]


@pytest.mark.parametrize(("text", "fragment", "line", "field"), REJECTS)
def test_rejects_name_file_line_field_and_the_reference_fragment(text: str, fragment: str, line: int,
                                                                  field: str) -> None:
    with pytest.raises(ConfigError) as info:
        _parse(text)
    message = str(info.value)
    assert fragment in message
    assert message.startswith(f"off.yaml:{line}: field '{field}': ")


def test_schema_errors_are_format_errors(tmp_path: Path) -> None:
    # (a budget large enough for a chunk: a file's problems are reported together, this one has only the key)
    with pytest.raises(FormatError, match=r"off.yaml:3: field 'kv_offload.bogus': unknown key 'bogus'"):
        _parse("kv_offload:\n  cpu_bytes_to_use: 17179869184\n  bogus: 1\n")
    with pytest.raises(FormatError, match=r"off.yaml:3: .*duplicate key 'cpu_bytes_to_use'"):
        _parse("kv_offload:\n  cpu_bytes_to_use: 1\n  cpu_bytes_to_use: 2\n")
    with pytest.raises(FormatError, match=r"off.yaml:2: field 'kv_offload.cpu_bytes_to_use'"):
        _parse("kv_offload:\n  cpu_bytes_to_use: lots\n")
    with pytest.raises(ConfigError, match="no top-level kv_offload: block"):
        _parse("kv_offload:\n")
    with pytest.raises(InputError, match="file not found"):
        load_offload_config(tmp_path / "missing.yaml", kv_bytes_per_token=1)


def test_header_round_trip_is_the_identity() -> None:
    for text in (MINIMAL, MINIMAL.replace("  secondary_tiers", "  block_size: 64\n  eviction_policy: arc\n"
                                                                 "  offload_prompt_only: false\n  secondary_tiers")):
        cfg = _parse(text)
        back = OffloadConfig.from_header(cfg.to_header(), cfg.extensions())
        assert back == cfg and back.equivalent(cfg)


def test_extensions_carry_what_the_reference_block_cannot() -> None:
    cfg = _parse(MINIMAL + "      max_bytes: 1073741824\n")
    assert cfg.secondary_tiers[0].capacity_chunks(cfg.bytes_per_chunk) == 409
    ext = cfg.extensions()
    assert ext == OffloadExtensions(tier_max_bytes=[1073741824])
    assert OffloadConfig.from_header(cfg.to_header(), ext) == cfg
    assert not OffloadConfig.from_header(cfg.to_header()).equivalent(cfg)  # dropping max_bytes is a difference
    assert _parse(MINIMAL).extensions() is None


def test_equivalence_ignores_per_block_bytes_only() -> None:
    a = _parse(MINIMAL)
    b = _parse(MINIMAL, kv=QWEN14B * 2)
    assert a.equivalent(b)
    assert not a.equivalent(_parse(MINIMAL.replace("17179869184", "17179869185")))


def test_from_header_validates_like_a_load() -> None:
    block = read_trace_header(BLIS / "trace.yaml").kv_offload
    assert block is not None
    with pytest.raises(ConfigError, match="eviction_policy must be"):
        OffloadConfig.from_header(block.model_copy(update={"eviction_policy": "fifo"}), file="t.yaml")
    with pytest.raises(ConfigError, match="smaller than one offload chunk"):
        OffloadConfig.from_header(block.model_copy(update={"cpu_bytes_to_use": 10}))
    with pytest.raises(ConfigError, match="no kv_bytes_per_token"):
        OffloadConfig.from_header(TraceKVOffloadConfig(cpu_bytes_to_use=1 << 30, block_size=16, blocks_per_chunk=1,
                                                       tokens_per_hash=16, eviction_policy="lru"))
    derived = OffloadConfig.from_header(block.model_copy(update={"per_block_bytes": 0}), kv_bytes_per_token=QWEN14B)
    assert derived.bytes_per_chunk == 2621440


def test_resolve_from_a_mapping() -> None:
    cfg = resolve_offload_config({"kv_offload": {"cpu_bytes_to_use": 1 << 30}}, kv_bytes_per_token=QWEN14B)
    assert cfg.secondary_tiers == () and cfg.cpu_capacity_chunks == 409


def test_configs_built_in_code_are_checked_too() -> None:
    good = _parse(MINIMAL)
    with pytest.raises(ValueError, match="smaller than one offload chunk"):
        good.model_validate({**good.model_dump(), "cpu_bytes_to_use": 10})
    with pytest.raises(ValueError, match="blocks_per_chunk"):
        good.model_validate({**good.model_dump(), "blocks_per_chunk": 2})
    with pytest.raises(ValueError):
        good.secondary_tiers[0].model_validate({**good.secondary_tiers[0].model_dump(), "read_bandwidth": 0.0})

_pos = st.floats(min_value=1e-3, max_value=1e12, allow_nan=False, allow_infinity=False)


@st.composite
def _configs(draw: st.DrawFn) -> dict:
    tiers = [{"type": "fs", "root_dir": draw(st.text(min_size=1, max_size=8).filter(lambda s: s.strip() == s)),
              "direct_io": draw(st.booleans()), "read_bandwidth": draw(_pos), "write_bandwidth": draw(_pos),
              "base_latency": draw(st.floats(0, 1e7)), "n_read_threads": draw(st.integers(1, 64)),
              "locality": draw(st.sampled_from(["LOCAL", "REMOTE"])),
              **({"max_bytes": draw(st.integers(1 << 30, 1 << 40))} if draw(st.booleans()) else {})}
             for _ in range(draw(st.integers(0, 2)))]
    block = {"cpu_bytes_to_use": draw(st.integers(1 << 30, 1 << 40)), "blocks_per_chunk": draw(st.integers(1, 8)),
             "eviction_policy": draw(st.sampled_from(["lru", "arc"])), "offload_prompt_only": draw(st.booleans()),
             "tokens_per_hash": draw(st.integers(1, 64)), "secondary_tiers": tiers}
    if not tiers:
        block["store_threshold"] = draw(st.integers(0, 5))
    return {"kv_offload": block}


@settings(max_examples=60, deadline=None)
@given(data=_configs(), kv=st.integers(1, 1 << 20), gpu_bs=st.sampled_from([16, 32]))
def test_config_to_header_yaml_and_back_is_the_identity(tmp_path_factory: pytest.TempPathFactory, data: dict,
                                                        kv: int, gpu_bs: int) -> None:
    cfg = resolve_offload_config(data, kv_bytes_per_token=kv, gpu_block_size=gpu_bs)
    header = TraceHeader(mode="generated", kv_offload=cfg.to_header(),
                         pytest_blis=PytestBlisHeader(offload=cfg.extensions()))
    path = tmp_path_factory.mktemp("h") / "h.yaml"
    path.write_text(header_text(header))
    back = read_trace_header(path)
    assert back == header
    ext = back.pytest_blis.offload if back.pytest_blis else None
    assert back.kv_offload is not None
    assert OffloadConfig.from_header(back.kv_offload, ext) == cfg
