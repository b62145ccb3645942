"""vLLM's own offload configuration (--kv-transfer-config JSON/YAML, --kv-offloading-size) read as our
offload config, and a file's problems reported all at once."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from blis_sim.errors import ConfigError, ConfigErrors, FormatError, InputError, UsageError, error_line
from blis_sim.formats.offload import OffloadConfig, load_offload_config, parse_offload_config
from blis_sim.formats.offload_vllm import from_flags
from blis_sim.kv.config import KVConfig, from_offload_config

REPO = Path(__file__).resolve().parents[1]
KV = 163840  # qwen3-14b, bytes per token per rank
GPU_BS = 16

NATIVE_TIERED = """\
kv_offload:
  cpu_bytes_to_use: 1073741824
  block_size: 64
  eviction_policy: arc
  offload_prompt_only: false
  secondary_tiers:
    - type: fs
      root_dir: /mnt/kv-cache
      n_read_threads: 8
      n_write_threads: 4
      locality: LOCAL
      direct_io: true
      device_class: nvme_gen4
"""

NATIVE_CPU = "kv_offload:\n  cpu_bytes_to_use: 1073741824\n"

# a file whose lines are known: errors must name them
VLLM_LINES = """\
{
  "kv_connector": "OffloadingConnector",
  "kv_role": "kv_both",
  "kv_connector_extra_config": {
    "spec_name": "TieringOffloadingSpec",
    "cpu_bytes_to_use": 1073741824,
    "block_size": 64,
    "secondary_tiers": [
      {"type": "fs",
       "root_dir": "/mnt/kv-cache"}
    ]
  }
}
"""

# the same deployment with every other key vLLM takes, as NATIVE_TIERED spells it
VLLM_TIERED: dict[str, Any] = json.loads(VLLM_LINES)
VLLM_TIERED["kv_connector_extra_config"].update(eviction_policy="arc", offload_prompt_only=False)
VLLM_TIERED["kv_connector_extra_config"]["secondary_tiers"][0].update(n_read_threads=8, n_write_threads=4,
                                                                       locality="LOCAL")


def _kv(cfg: OffloadConfig) -> KVConfig:
    return from_offload_config(cfg, block_size=GPU_BS, num_gpu_blocks=1000, bytes_per_block=KV * GPU_BS)


def _native(text: str) -> OffloadConfig:
    return parse_offload_config(text, kv_bytes_per_token=KV, file="native.yaml")


def _vllm(source: str | Path | None, **kw: Any) -> OffloadConfig:
    kw.setdefault("warn", lambda message: None)
    return load_offload_config(source, kv_bytes_per_token=KV, gpu_block_size=GPU_BS, **kw)


def _vllm_text(text: str, file: str = "vllm.json", **kw: Any) -> OffloadConfig:
    kw.setdefault("warn", lambda message: None)
    return parse_offload_config(text, kv_bytes_per_token=KV, gpu_block_size=GPU_BS, file=file, **kw)


def _yaml_of(data: Any, indent: str = "") -> str:
    """The same structure as block YAML (no library: the test states the form a user writes)."""
    out = []
    for key, value in data.items():
        if isinstance(value, dict):
            out.append(f"{indent}{key}:")
            out.append(_yaml_of(value, indent + "  "))
        elif isinstance(value, list):
            out.append(f"{indent}{key}:")
            for item in value:
                lines = _yaml_of(item, indent + "    ").split("\n")
                out.append(f"{indent}  - " + lines[0].lstrip())
                out.extend(lines[1:])
        else:
            out.append(f"{indent}{key}: {json.dumps(value)}")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------- accepted forms


def test_every_form_resolves_to_the_native_config(tmp_path: Path) -> None:
    want = _native(NATIVE_TIERED)
    (tmp_path / "ktc.json").write_text(json.dumps(VLLM_TIERED, indent=2))
    (tmp_path / "tabs.json").write_text(json.dumps(VLLM_TIERED, indent="\t"))
    (tmp_path / "ktc.yaml").write_text(_yaml_of(VLLM_TIERED) + "\n")
    forms = {
        "json file": _vllm(tmp_path / "ktc.json"),
        "json file, tab indented": _vllm(tmp_path / "tabs.json"),
        "yaml file": _vllm(tmp_path / "ktc.yaml"),
        "inline json": _vllm(json.dumps(VLLM_TIERED)),
        "inline json, leading space": _vllm("  " + json.dumps(VLLM_TIERED)),
        "str path": _vllm(str(tmp_path / "ktc.json")),
    }
    for name, cfg in forms.items():
        assert cfg == want, name
        assert _kv(cfg) == _kv(want), name
        assert cfg.equivalent(want), name


def test_cpu_spec_defaults_match_vllm() -> None:
    # spec_name defaults to CPUOffloadingSpec; eviction lru, offload_prompt_only true, one GPU block per chunk
    cfg = _vllm(json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                            "kv_connector_extra_config": {"cpu_bytes_to_use": 1073741824}}))
    assert cfg == _native(NATIVE_CPU)
    assert (cfg.eviction_policy, cfg.offload_prompt_only, cfg.blocks_per_chunk, cfg.store_threshold) == \
        ("lru", True, 1, 0)
    assert _kv(cfg).cpu is not None and _kv(cfg).fs_tiers == ()


def test_kv_offloading_size_is_gib_over_all_ranks() -> None:
    # vllm/config/vllm.py: cpu_bytes_to_use = kv_offloading_size * (1 << 30), connector and role set
    assert from_flags(1.0) == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                               "kv_connector_extra_config": {"cpu_bytes_to_use": float(1 << 30)}}
    assert _vllm(None, kv_offloading_size=1.0) == _native(NATIVE_CPU)
    assert _vllm(None, kv_offloading_size=1.0, kv_offloading_backend="native") == _native(NATIVE_CPU)
    # a fraction is truncated as vLLM's int(cpu_bytes_to_use)
    assert _vllm(None, kv_offloading_size=0.1).cpu_bytes_to_use == int(0.1 * (1 << 30))


def test_kv_offloading_size_overrides_the_transfer_configs_budget() -> None:
    smaller = dict(VLLM_TIERED, kv_connector_extra_config=dict(VLLM_TIERED["kv_connector_extra_config"],
                                                                cpu_bytes_to_use=12345))
    cfg = _vllm(json.dumps(smaller), kv_offloading_size=1.0)
    assert cfg == _native(NATIVE_TIERED)
    # and it sets the connector and the role, as vLLM does
    bare = {"kv_connector_extra_config": {"cpu_bytes_to_use": 1}}
    assert _vllm(json.dumps(bare), kv_offloading_size=1.0) == _native(NATIVE_CPU)


def test_other_vllm_keys() -> None:
    extra = {"cpu_bytes_to_use": 1073741824, "blocks_per_chunk": 2, "store_threshold": 3,
             "self_describing_kv_events": True, "max_tracker_size": 64000, "canonical_layout": True}
    cfg = _vllm(json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_producer", "kv_port": 1,
                            "engine_id": "e", "kv_buffer_device": "cpu", "kv_load_failure_policy": "recompute",
                            "kv_connector_extra_config": extra}))
    assert cfg == _native("kv_offload:\n  cpu_bytes_to_use: 1073741824\n  blocks_per_chunk: 2\n"
                          "  store_threshold: 3\n  self_describing_kv_events: true\n")
    # store_threshold < 2 is "off" in vLLM, negative values included
    off = _vllm(json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                            "kv_connector_extra_config": {"cpu_bytes_to_use": 1073741824, "store_threshold": -1}}))
    assert off.store_threshold == 0


def test_out_of_tree_spec_is_read_as_the_stock_spec_it_subclasses() -> None:
    notes: list[str] = []
    data = json.loads(json.dumps(VLLM_TIERED))
    data["kv_connector_extra_config"].update(spec_name="CpuTieringSpec", spec_module_path="tools.offload_specs")
    assert _vllm(json.dumps(data), warn=notes.append) == _native(NATIVE_TIERED)
    assert len(notes) == 1 and "CpuTieringSpec" in notes[0] and "TieringOffloadingSpec" in notes[0]
    data["kv_connector_extra_config"].pop("secondary_tiers")
    data["kv_connector_extra_config"]["own_key"] = 1  # the spec's own keys: ignored, with the warning
    notes.clear()
    cpu = _vllm(json.dumps(data), warn=notes.append)
    assert cpu.secondary_tiers == () and "CPUOffloadingSpec" in notes[0] and "own_key" in notes[0]


# --------------------------------------------------------------------------------------------- the warning


def test_one_warning_names_the_defaulted_timing_fields() -> None:
    notes: list[str] = []
    two = json.loads(json.dumps(VLLM_TIERED))
    two["kv_connector_extra_config"]["secondary_tiers"].append({"type": "fs", "root_dir": "/mnt/b"})
    cfg = _vllm(json.dumps(two), warn=notes.append)
    assert len(notes) == 1
    for fragment in ("secondary_tiers[0]: direct_io=true, device_class=nvme_gen4",
                     "secondary_tiers[1]: direct_io=true, device_class=nvme_gen4"):
        assert fragment in notes[0]
    assert all(t.direct_io and t.device_class == "nvme_gen4" for t in cfg.secondary_tiers)
    assert (cfg.secondary_tiers[1].read_bandwidth, cfg.secondary_tiers[1].base_latency) == (7000.0, 80.0)


def test_no_warning_without_a_defaulted_field() -> None:
    notes: list[str] = []
    _vllm(None, kv_offloading_size=1.0, warn=notes.append)
    parse_offload_config(NATIVE_TIERED, kv_bytes_per_token=KV, warn=notes.append)
    assert notes == []


def test_the_warning_goes_to_the_log_by_default(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="blis_sim.formats.offload"):
        load_offload_config(json.dumps(VLLM_TIERED), kv_bytes_per_token=KV)
    assert len(caplog.records) == 1 and "device_class=nvme_gen4" in caplog.records[0].getMessage()


def test_cpu_spec_ignores_secondary_tiers_and_says_so() -> None:
    notes: list[str] = []
    data = json.loads(json.dumps(VLLM_TIERED))
    data["kv_connector_extra_config"].pop("spec_name")
    cfg = _vllm(json.dumps(data), warn=notes.append)
    assert cfg.secondary_tiers == () and "CPUOffloadingSpec reads no secondary tiers" in notes[0]


# --------------------------------------------------------------------------------------------- refusals


def _edit(path: tuple[Any, ...], value: Any = None, *, drop: bool = False) -> str:
    data = json.loads(json.dumps(VLLM_TIERED))
    node = data
    for part in path[:-1]:
        node = node[part]
    if drop:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return json.dumps(data)


E = "kv_connector_extra_config"
T0 = (E, "secondary_tiers", 0)
REFUSALS = [
    (_edit(("kv_conector",), "x"), "unknown key 'kv_conector'", "kv_conector"),
    (_edit(("kv_connector",), "LMCacheConnectorV1"), "is not modelled", "kv_connector"),
    (_edit(("kv_connector",), drop=True), "kv_connector is not set", "kv_connector"),
    (_edit(("kv_role",), drop=True), "Please specify kv_role", "kv_role"),
    (_edit(("kv_role",), "kv_everything"), "Unsupported kv_role", "kv_role"),
    (_edit((E, "evicton_policy"), "lru"), "unknown key 'evicton_policy'", f"{E}.evicton_policy"),
    (_edit((E, "eviction_policy"), "fifo"), "only vLLM's built-in 'lru' and 'arc'", f"{E}.eviction_policy"),
    (_edit((E, "spec_name"), "NvmeSpec"), "Unsupported spec type: NvmeSpec", f"{E}.spec_name"),
    (_edit((E, "cpu_bytes_to_use"), 0), "cpu_bytes_to_use must be specified", f"{E}.cpu_bytes_to_use"),
    (_edit((E, "cpu_bytes_to_use"), "lots"), "must be an integer", f"{E}.cpu_bytes_to_use"),
    (_edit((E, "cpu_bytes_to_use"), -5), "cpu_bytes_to_use must be > 0", f"{E}.cpu_bytes_to_use"),
    (_edit((E, "cpu_bytes_to_use"), 1000), "smaller than one offload chunk", f"{E}.cpu_bytes_to_use"),
    (_edit((E, "block_size"), 20), "must be a multiple of the GPU KV cache block size (16 tokens). Use 32",
     f"{E}.block_size"),
    (_edit((E, "blocks_per_chunk"), 2), "Specify only one of 'block_size' or 'blocks_per_chunk'",
     f"{E}.blocks_per_chunk"),
    (_edit((E, "store_threshold"), 2), "store_threshold is not supported for TieringOffloadingSpec",
     f"{E}.store_threshold"),
    (_edit((E, "max_tracker_size"), 10), "max_tracker_size=10 is not modelled", f"{E}.max_tracker_size"),
    (_edit((E, "offload_prompt_only"), "false"), "must be true or false", f"{E}.offload_prompt_only"),
    (_edit((E, "backpressure"), {"backpressure_cls": "X"}), "backpressure is not modelled", f"{E}.backpressure"),
    (_edit((E, "secondary_tiers"), {"type": "fs"}), "secondary_tiers must be a list", f"{E}.secondary_tiers"),
    (_edit((*T0, "type"), "obj"), "type='obj' is not modelled", f"{E}.secondary_tiers.0.type"),
    (_edit((*T0, "type"), "tape"), "Unknown secondary tier type: 'tape'", f"{E}.secondary_tiers.0.type"),
    (_edit((*T0, "type"), drop=True), "must include 'type'", f"{E}.secondary_tiers.0.type"),
    (_edit((*T0, "root_dir"), drop=True), "root_dir is required", f"{E}.secondary_tiers.0.root_dir"),
    (_edit((*T0, "direct_io"), True), "unexpected keyword argument 'direct_io'",
     f"{E}.secondary_tiers.0.direct_io"),
    (_edit((*T0, "max_bytes"), 10**9), "unexpected keyword argument 'max_bytes'",
     f"{E}.secondary_tiers.0.max_bytes"),
    (_edit((*T0, "locality"), "MARS"), "locality must be", f"{E}.secondary_tiers.0.locality"),
    (_edit((*T0, "n_read_threads"), 0), "n_read_threads must be > 0", f"{E}.secondary_tiers.0.n_read_threads"),
    (_edit((*T0, "n_write_threads"), "many"), "valid integer", f"{E}.secondary_tiers.0.n_write_threads"),
]


@pytest.mark.parametrize(("text", "fragment", "field"), REFUSALS)
def test_refusals_name_the_file_and_the_vllm_field(text: str, fragment: str, field: str) -> None:
    with pytest.raises(InputError) as info:
        _vllm_text(text, file="ktc.json")
    assert not isinstance(info.value, ConfigErrors), str(info.value)
    assert fragment in info.value.reason
    assert info.value.location.file == "ktc.json" and info.value.location.field == field
    assert info.value.location.line == 1  # the whole document is on line 1 here


def test_tiering_spec_refuses_a_store_threshold_even_without_tiers() -> None:
    # TieringOffloadingSpec.get_manager raises for store_threshold >= 2 whatever its tiers
    data = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 1 << 30,
                                          "store_threshold": 2}}
    with pytest.raises(ConfigError, match="store_threshold is not supported for TieringOffloadingSpec"):
        _vllm_text(json.dumps(data))
    data["kv_connector_extra_config"]["spec_name"] = "CPUOffloadingSpec"
    assert _vllm_text(json.dumps(data)).store_threshold == 2


def test_errors_carry_the_line_of_the_vllm_file() -> None:
    cases = [
        (VLLM_LINES.replace('"block_size": 64', '"block_size": 20'), 7, f"{E}.block_size"),
        (VLLM_LINES.replace('"root_dir": "/mnt/kv-cache"', '"root_dir": "/mnt/kv-cache", "direct_io": true'), 10,
         f"{E}.secondary_tiers.0.direct_io"),
        (VLLM_LINES.replace('"kv_role": "kv_both"', '"kv_role": "kv_both", "kv_prt": 1'), 3, "kv_prt"),
        (VLLM_LINES.replace('{"type": "fs",', '{"type": "fs", "n_read_threads": -1,'), 9,
         f"{E}.secondary_tiers.0.n_read_threads"),
    ]
    for text, line, field in cases:
        with pytest.raises(InputError) as info:
            _vllm_text(text, file="ktc.json")
        assert str(info.value).startswith(f"ktc.json:{line}: field '{field}': "), str(info.value)


def test_several_problems_are_reported_together() -> None:
    text = (VLLM_LINES.replace('"kv_role": "kv_both"', '"kv_role": "kv_master"')
            .replace('"block_size": 64', '"block_size": 20, "evicton_policy": "arc"')
            .replace('"root_dir": "/mnt/kv-cache"', '"root_dir": "/mnt/kv-cache", "locality": "MARS"'))
    with pytest.raises(ConfigErrors) as info:
        _vllm_text(text, file="ktc.json")
    problems = [(p.location.line, p.location.field) for p in info.value.problems]
    assert problems == [(3, "kv_role"), (7, f"{E}.evicton_policy"), (7, f"{E}.block_size"),
                        (10, f"{E}.secondary_tiers.0.locality")]
    assert isinstance(info.value, ConfigError)
    lines = str(info.value).split("\n")
    assert lines[0] == "ktc.json: 4 problems" and len(lines) == 5
    assert all(line.startswith("  ktc.json:") for line in lines[1:])
    printed = error_line("replay", info.value).split("\n")
    assert printed[0] == "blis replay: error: ktc.json: 4 problems" and len(printed) == 5


NATIVE_TWO_TRIES = """\
kv_offload:
  cpu_bytes_to_use: 1073741824
  secondary_tiers:
    - type: fs
      root_dir: /mnt/kv
      n_read_threads: 0
    - type: fs
      root_dir: /mnt/kv2
      direct_io: false
      device_class: floppy
  bogus: 1
"""


def test_native_yaml_reports_every_problem_with_its_line() -> None:
    # the three tries in one: direct_io missing, then a device class / bandwidths, plus more
    with pytest.raises(ConfigErrors) as info:
        _native(NATIVE_TWO_TRIES)
    got = [(p.location.line, p.location.field, type(p).__name__) for p in info.value.problems]
    assert got == [
        (4, "kv_offload.secondary_tiers.0.direct_io", "ConfigError"),
        (4, "kv_offload.secondary_tiers.0", "ConfigError"),
        (6, "kv_offload.secondary_tiers.0.n_read_threads", "ConfigError"),
        (10, "kv_offload.secondary_tiers.1.device_class", "ConfigError"),
        (11, "kv_offload.bogus", "FormatError"),
    ]
    assert "direct_io must be set explicitly" in info.value.problems[0].reason
    assert "needs a device_class OR an explicit" in info.value.problems[1].reason


def test_a_schema_error_does_not_also_report_its_consequence() -> None:
    # cpu_bytes_to_use: lots is dropped by the schema; "cpu_bytes_to_use is required" would be noise
    with pytest.raises(ConfigErrors) as info:
        _native("kv_offload:\n  cpu_bytes_to_use: lots\n  eviction_policy: fifo\n")
    assert [(p.location.line, type(p)) for p in info.value.problems] == [(2, FormatError), (3, ConfigError)]


def test_one_problem_is_raised_as_itself() -> None:
    with pytest.raises(ConfigError) as info:
        _native("kv_offload:\n  cpu_bytes_to_use: 1073741824\n  eviction_policy: fifo\n")
    assert not isinstance(info.value, ConfigErrors)


def test_flag_and_form_mismatches() -> None:
    with pytest.raises(UsageError, match="not to the kv_offload: YAML"):
        _vllm_text(NATIVE_CPU, file="native.yaml", kv_offloading_size=1.0)
    with pytest.raises(UsageError, match="--kv-offloading-backend applies"):
        _vllm_text(NATIVE_CPU, file="native.yaml", kv_offloading_backend="native")
    with pytest.raises(ConfigError, match="lmcache is not modelled"):
        _vllm(None, kv_offloading_size=1.0, kv_offloading_backend="lmcache")
    with pytest.raises(UsageError, match="needs --kv-offload-config or --kv-offloading-size"):
        _vllm(None)
    with pytest.raises(ConfigError, match="cpu_bytes_to_use must be specified"):
        _vllm(None, kv_offloading_size=0.0)  # vLLM: a falsy budget is no budget
    with pytest.raises(FormatError, match="invalid YAML"):
        _vllm("{not json")


# --------------------------------------------------------------------------------------------- the commands


def _blis(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "blis_sim", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def test_replay_takes_the_vllm_json_inline_and_the_size_flag() -> None:
    blis = REPO / "samples" / "blis"
    same = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 1 << 30,
                                          "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/kv-cache",
                                                               "locality": "LOCAL"}]}}
    base = ("replay", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000", "--trace-header",
            str(blis / "trace.yaml"), "--trace-data", str(blis / "trace.csv"))
    out = _blis(*base, "--kv-offload-config", json.dumps(same))
    assert out.returncode == 0, out.stderr  # the header's config, given as vLLM's JSON: INV-13 holds
    warnings = [line for line in out.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "device_class=nvme_gen4" in warnings[0]
    # the header's tiered config is not a 1 GiB CPU tier alone: the flag's config conflicts with it (INV-13)
    out = _blis(*base, "--kv-offloading-size", "1")
    assert out.returncode == 2 and "conflicts with the kv_offload config recorded" in out.stderr


def test_run_prints_every_problem_on_its_own_line(tmp_path: Path) -> None:
    bad = tmp_path / "ktc.json"
    bad.write_text(VLLM_LINES.replace('"kv_role": "kv_both"', '"kv_role": "kv_master"')
                   .replace('"block_size": 64', '"block_size": 20'))
    out = _blis("run", "--model", "qwen/qwen3-14b", "--workload-spec", str(REPO / "samples" / "blis" / "workload.yaml"),
                "--num-requests", "2", "--kv-offload-config", str(bad))
    assert out.returncode == 2
    lines = out.stderr.strip().split("\n")
    assert lines[0] == f"blis run: error: {bad}: 2 problems"
    assert lines[1].startswith(f"  {bad}:3: field 'kv_role'") and lines[2].startswith(f"  {bad}:7: field ")


# --------------------------------------------------------------------------------------------- plugin, emulator

MINIMAL_AS_VLLM = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                   "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 268435456,
                                                 "secondary_tiers": [{"type": "fs", "root_dir": "/tmp/blis-kv"}]}}


def test_scenario_offload_takes_the_vllm_json_as_a_file_or_inline(tmp_path: Path) -> None:
    from pytest_blis._scenario import ServerSpec
    from pytest_blis._server import _offload_for

    scenarios = REPO / "scenarios"
    want, _ = _offload_for(ServerSpec(offload="minimal-offload.yaml"), scenarios)
    (tmp_path / "ktc.json").write_text(json.dumps(MINIMAL_AS_VLLM))
    inline = json.dumps(MINIMAL_AS_VLLM)
    with pytest.warns(UserWarning, match="device_class=nvme_gen4"):
        from_file, path = _offload_for(ServerSpec(offload="ktc.json"), tmp_path)
    with pytest.warns(UserWarning, match="device_class=nvme_gen4"):
        from_inline, source = _offload_for(ServerSpec(offload=inline), tmp_path)
    assert from_file == want and from_inline == want
    assert path == tmp_path / "ktc.json" and source == inline  # the JSON reaches the emulator unaltered


class _Config:
    """What ``pytest_blis._options.resolve`` reads of a pytest config."""

    def __init__(self, **options: Any) -> None:
        self.options = options

    def getoption(self, name: str) -> Any:
        return self.options.get(name)

    def getini(self, name: str) -> Any:
        return [] if name == "blis_server_url" else {"blis_hit_rate_tolerance_pp": "5",
                                                      "blis_ttft_mape_threshold": "0.15"}.get(name, "")


def test_plugin_options_keep_inline_json_and_take_the_size() -> None:
    from pytest_blis._options import resolve

    inline = json.dumps({"kv_connector_extra_config": {"root_dir": "/a//b/"}})
    opts = resolve(_Config(blis_kv_offload_config=inline, blis_kv_offloading_size=2.0))  # type: ignore[arg-type]
    assert opts.kv_offload_config == inline and opts.kv_offloading_size == 2.0
    opts = resolve(_Config(blis_kv_offload_config="deploy/ktc.json"))  # type: ignore[arg-type]
    assert opts.kv_offload_config == Path("deploy/ktc.json") and opts.kv_offloading_size is None


def test_the_emulator_reads_the_vllm_json_into_the_same_spec(tmp_path: Path) -> None:
    import argparse

    from blis_sim.emulator.cli import add_arguments, config_from_args, config_to_argv
    from blis_sim.emulator.config import EmulatorConfig, load_offload_spec

    want = load_offload_spec(REPO / "scenarios" / "minimal-offload.yaml", block_size=16, kv_bytes_per_token=4096)
    inline = json.dumps(MINIMAL_AS_VLLM)
    assert load_offload_spec(inline, block_size=16, kv_bytes_per_token=4096) == want
    # through the emulator's command line, as spawn_emulator passes it
    argv = config_to_argv(EmulatorConfig(profile="zero", kv_offload_config=inline))
    assert argv[argv.index("--kv-offload-config") + 1] == inline
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(argv))
    assert config.kv_offload_config == inline
