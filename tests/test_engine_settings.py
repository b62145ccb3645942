"""The simulator's settings, resolved once (blis_sim/engine/settings.py): each setting from the flag,
then the trace header, then the model, then the documented default; the source recorded in the
output's provenance; and every caller (CLI, library, sweep, plan, plugin) going through it."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from blis_sim import defaults
from blis_sim.cli import main
from blis_sim.engine import EngineOptions, replay_outcome
from blis_sim.engine.latency import default_step_model
from blis_sim.engine.models import default_num_gpu_blocks
from blis_sim.engine.run_spec import run_outcome
from blis_sim.engine.settings import SETTINGS, resolve_settings, with_flags
from blis_sim.errors import UsageError
from blis_sim.formats import KVGeometry, PytestBlisHeader, TraceHeader, load_trace
from blis_sim.formats.offload import load_offload_config
from blis_sim.formats.trace_header import TraceServerConfig
from blis_sim.formats.workload import load_workload_spec

REPO = Path(__file__).resolve().parents[1]
BLIS = REPO / "samples" / "blis"
VLLM = REPO / "samples" / "vllm-cpu"
QWEN = "qwen/qwen3-14b"
QWEN_KV = 163840.0


def header(*, geometry: KVGeometry | None = None, server: TraceServerConfig | None = None,
           offload=None, mode: str = "real") -> TraceHeader:
    ext = PytestBlisHeader(kv_geometry=geometry) if geometry is not None else None
    return TraceHeader(mode=mode, server=server, pytest_blis=ext,
                       kv_offload=offload.to_header() if offload is not None else None)


def resolved(header_: TraceHeader | None = None, **given):
    o = resolve_settings(EngineOptions(**given), header_)
    return o, o.sources


@pytest.fixture(scope="module")
def offload():
    return load_offload_config(BLIS / "offload.yaml", kv_bytes_per_token=QWEN_KV)


def test_block_size_flag_then_header_geometry_then_server_then_offload_block_then_16(offload) -> None:
    full = header(geometry=KVGeometry(block_size=32), server=TraceServerConfig(block_size=64))
    assert resolved(full, block_size=8)[0].block_size == 8
    o, src = resolved(full)
    assert (o.block_size, src["block_size"]) == (32, "header")
    o, src = resolved(header(server=TraceServerConfig(block_size=64)))
    assert (o.block_size, src["block_size"]) == (64, "header")
    o, src = resolved(header(offload=offload, mode="generated"))  # the recorded offload block's GPU block
    assert (o.block_size, src["block_size"]) == (offload.gpu_block_size, "header")
    o, src = resolved(None, kv_offload=offload)
    assert (o.block_size, src["block_size"]) == (offload.gpu_block_size, "flag")
    o, src = resolved(header())
    assert (o.block_size, src["block_size"]) == (defaults.DEFAULT_BLOCK_SIZE, "default") == (16, "default")


def test_gpu_blocks_flag_then_header_then_the_models_capacity_then_a_million() -> None:
    geo = header(geometry=KVGeometry(block_size=16, num_gpu_blocks=512))
    o, src = resolved(geo, model=QWEN, num_gpu_blocks=300)
    assert (o.num_gpu_blocks, src["num_gpu_blocks"]) == (300, "flag")
    o, src = resolved(geo, model=QWEN)
    assert (o.num_gpu_blocks, src["num_gpu_blocks"]) == (512, "header")
    o, src = resolved(header(), model=QWEN, hardware="A100", tp=2)
    assert (o.num_gpu_blocks, src["num_gpu_blocks"]) == (
        default_num_gpu_blocks(QWEN, 16, hardware="A100", tp=2), "model")
    # the capacity is the resolved block size's (a header giving 32 tokens halves the block count)
    o, _ = resolved(header(server=TraceServerConfig(block_size=32)), model=QWEN)
    assert o.num_gpu_blocks == default_num_gpu_blocks(QWEN, 32)
    o, src = resolved(header(), model="no-such-model")
    assert (o.num_gpu_blocks, src["num_gpu_blocks"]) == (defaults.DEFAULT_TOTAL_KV_BLOCKS, "default")


def test_scheduler_limits_flag_then_header_then_documented_default() -> None:
    h = header(server=TraceServerConfig(max_num_seqs=8))
    o, src = resolved(h, max_num_seqs=4, max_num_batched_tokens=512, long_prefill_token_threshold=64)
    assert (o.max_num_seqs, o.max_num_batched_tokens, o.long_prefill_token_threshold) == (4, 512, 64)
    assert src["max_num_seqs"] == src["max_num_batched_tokens"] == src["long_prefill_token_threshold"] == "flag"
    o, src = resolved(h)
    assert (o.max_num_seqs, src["max_num_seqs"]) == (8, "header")
    o, src = resolved(header())
    assert (o.max_num_seqs, src["max_num_seqs"]) == (defaults.DEFAULT_MAX_NUM_SEQS, "default")
    # one documented default, the same for every caller (vLLM's online server: blis_sim/defaults.py)
    assert (o.max_num_batched_tokens, src["max_num_batched_tokens"]) == (2048, "default")
    assert defaults.DEFAULT_MAX_NUM_BATCHED_TOKENS == 2048
    assert (o.long_prefill_token_threshold, src["long_prefill_token_threshold"]) == (0, "default")


def test_latency_model_given_or_the_bundled_default() -> None:
    o, src = resolved()
    assert o.latency == default_step_model() and (src["latency_model"], o.latency_source) == ("default", "default")
    fitted = default_step_model()
    o, src = resolved(latency=fitted, latency_source="probe fit")
    assert o.latency is fitted and (src["latency_model"], o.latency_source) == ("flag", "probe fit")


def test_kv_bytes_per_token_flag_then_header_then_model(offload) -> None:
    o, src = resolved(header(offload=offload, mode="generated"), model="tiny-llama", kv_bytes_per_token=99.0)
    assert (o.kv_bytes_per_token, src["kv_bytes_per_token"]) == (99.0, "flag")
    o, src = resolved(header(offload=offload, mode="generated"), model="tiny-llama")
    assert (o.kv_bytes_per_token, src["kv_bytes_per_token"]) == (QWEN_KV, "header")
    o, src = resolved(header(), model=QWEN)
    assert (o.kv_bytes_per_token, src["kv_bytes_per_token"]) == (QWEN_KV, "model")
    o, src = resolved(header(), model="no-such-model")
    assert (o.kv_bytes_per_token, src["kv_bytes_per_token"]) == (None, "default")


def test_offload_the_header_is_authoritative_a_flag_fills_an_observed_trace(offload) -> None:
    o, src = resolved(header(offload=offload, mode="generated"))
    assert o.kv_offload is not None and o.kv_offload.equivalent(offload) and src["kv_offload"] == "header"
    bigger = offload.model_copy(update={"cpu_bytes_to_use": 2 * offload.cpu_bytes_to_use})
    with pytest.raises(UsageError, match="conflicts"):
        resolved(header(offload=offload, mode="generated"), kv_offload=bigger)
    o, src = resolved(header(mode="real"), kv_offload=offload)
    assert o.kv_offload is offload and src["kv_offload"] == "flag"
    o, src = resolved(header())
    assert o.kv_offload is None and src["kv_offload"] == "default"


def test_resolving_again_changes_nothing_and_a_sweep_point_is_a_flag() -> None:
    h = header(geometry=KVGeometry(block_size=32, num_gpu_blocks=512))
    once = resolve_settings(EngineOptions(model=QWEN), h)
    assert resolve_settings(once, h) == once and once.sources == resolve_settings(once, h).sources
    assert set(once.sources) == set(SETTINGS)
    point = with_flags(once, num_gpu_blocks=100, max_num_seqs=4)
    assert (point.sources["num_gpu_blocks"], point.sources["max_num_seqs"], point.sources["block_size"]) == \
        ("flag", "flag", "header")
    assert resolve_settings(point, h).num_gpu_blocks == 100


def test_the_warning_on_an_observed_trace_names_each_default_once() -> None:
    said: list[str] = []
    resolve_settings(EngineOptions(model=QWEN), header(), warn=said.append)
    assert len(said) == 1 and "--max-num-seqs 256" in said[0] and "--max-num-batched-tokens 2048" in said[0]
    assert "(the model's capacity on H100)" in said[0]
    said.clear()
    resolve_settings(EngineOptions(model=QWEN), header(mode="generated"), warn=said.append)
    assert said == []  # a simulated trace had no real server whose limits we miss


# ------------------------------------------------------------------------------ every caller


def settings_of(metrics_json: str | Path) -> dict:
    text = Path(metrics_json).read_text() if isinstance(metrics_json, Path) else metrics_json
    return json.loads(text)["provenance"]["settings"]


def test_the_library_run_and_replay_record_where_each_setting_came_from(offload) -> None:
    out = run_outcome(load_workload_spec(BLIS / "workload.yaml"), EngineOptions(model=QWEN, kv_offload=offload),
                      num_requests=20)
    prov = out.metrics().provenance
    assert prov is not None and set(prov.settings) == set(SETTINGS)
    assert prov.settings["num_gpu_blocks"].source == "model"
    assert prov.settings["num_gpu_blocks"].value == default_num_gpu_blocks(QWEN, 16)
    assert prov.settings["kv_offload"].source == "flag" and prov.settings["latency_model"].value == "linear"
    rep = replay_outcome(load_trace(BLIS / "trace.yaml", BLIS / "trace.csv"), EngineOptions(model=QWEN))
    prov = rep.metrics().provenance
    assert prov is not None and prov.settings["max_num_batched_tokens"].source == "default"


def test_blis_run_records_its_flags_and_defaults(tmp_path: Path) -> None:
    assert main(["run", "--model", QWEN, "--workload-spec", str(BLIS / "workload.yaml"), "--num-requests", "20",
                 "--max-num-seqs", "8", "--metrics-path", str(tmp_path / "m.json")]) == 0
    s = settings_of(tmp_path / "m.json")
    assert s["max_num_seqs"] == {"value": 8, "source": "flag"}
    assert s["block_size"] == {"value": 16, "source": "default"}
    assert s["num_gpu_blocks"]["source"] == "model" and s["kv_offload"] == {"source": "default"}


def test_blis_replay_roofline_is_the_models(tmp_path: Path) -> None:
    assert main(["replay", "--model", QWEN, "--latency-model", "roofline", "--trace-header", str(BLIS / "trace.yaml"),
                 "--trace-data", str(BLIS / "trace.csv"), "--metrics-path", str(tmp_path / "m.json")]) == 0
    s = settings_of(tmp_path / "m.json")
    assert s["latency_model"] == {"value": "roofline:H100:tp1", "source": "model"}


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_a_sweep_records_its_axes_as_flags_and_the_rest_from_the_base(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("mode: grid\naxes:\n  max_num_seqs: [8, 16]\n")
    assert main(["sweep", "--trace-header", str(BLIS / "trace.yaml"), "--trace-data", str(BLIS / "trace.csv"),
                 "--model", QWEN, "--total-kv-blocks", "300", "--sweep", str(tmp_path / "s.yaml"),
                 "--output-dir", str(tmp_path / "out"), "--workers", "1", "--no-plots"]) == 0
    for row, seqs in zip(_rows(tmp_path / "out" / "sweep.csv"), (8, 16)):
        s = json.loads(row["provenance"])["settings"]
        assert s["max_num_seqs"] == {"value": seqs, "source": "flag"}
        assert s["num_gpu_blocks"] == {"value": 300, "source": "flag"}
        assert s["max_num_batched_tokens"] == {"value": 2048, "source": "default"}


def test_a_plan_records_its_axis_as_a_flag(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    assert main(["plan", "--trace-header", str(BLIS / "trace.yaml"), "--trace-data", str(BLIS / "trace.csv"),
                 "--model", QWEN, "--axis", "total_kv_blocks", "--range", "100", "400", "--resolution", "100",
                 "--target", "hit_rate.prefix_cache>=0.0", "--output-dir", str(out), "--workers", "1"]) in (0, 1)
    rows = _rows(next(out.glob("*.csv")))
    assert rows
    for row in rows:
        s = json.loads(row["provenance"])["settings"]
        assert s["num_gpu_blocks"] == {"value": int(float(row["total_kv_blocks"])), "source": "flag"}
        assert s["block_size"]["source"] in ("header", "default")


def test_the_plugin_gives_its_targets_geometry_and_the_scenarios_limits_as_flags(tmp_path: Path) -> None:
    from pytest_blis._replay import replay_options
    from pytest_blis._scenario import ServerSpec
    from pytest_blis._server import ServerTarget
    from pytest_blis._steps import CellPaths, replay_step

    target = ServerTarget(url="http://127.0.0.1:1", model="tiny-llama", embedded=True, block_size=32,
                          num_gpu_blocks=4096, offload=None, offload_path=None, lock_dir=tmp_path)
    trace = load_trace(VLLM / "trace.yaml", VLLM / "trace.csv")
    for server, seqs in ((ServerSpec(max_num_seqs=8), {"value": 8, "source": "flag"}),
                         (ServerSpec(), {"value": 256, "source": "default"})):
        ctx = SimpleNamespace(target=target, latency=None, options=SimpleNamespace(sim_total_kv_blocks=None),
                              point=SimpleNamespace(spec=SimpleNamespace(server=server, sequential=False)))
        paths = CellPaths(tmp_path / f"cell-{seqs['value']}")
        paths.root.mkdir(parents=True)
        replay_step(trace, replay_options(ctx), paths)  # type: ignore[arg-type]
        s = settings_of(paths.sim_metrics)
        assert s["max_num_seqs"] == seqs
        assert s["block_size"] == {"value": 32, "source": "flag"}
        assert s["num_gpu_blocks"] == {"value": 4096, "source": "flag"}
        assert s["max_num_batched_tokens"] == {"value": 2048, "source": "default"}
