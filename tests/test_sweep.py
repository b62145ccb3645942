"""`blis sweep` / `blis plan` (blis_sim.sweep): the table, resume, strict sweep files, the
capacity search, and local pool vs Ray giving the same rows."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from blis_sim.cli import main
from blis_sim.errors import FormatError
from blis_sim.sweep.axes import override_offload, parse_size, set_path
from blis_sim.sweep.plan import Evaluation, interior, monotonicity
from blis_sim.sweep.spec import parse_sweep_file

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples" / "blis"
TRACE = ["--trace-header", str(SAMPLES / "trace.yaml"), "--trace-data", str(SAMPLES / "trace.csv"),
         "--model", "qwen/qwen3-14b", "--total-kv-blocks", "300"]
SPEC = ["--workload-spec", str(SAMPLES / "workload.yaml"), "--model", "qwen/qwen3-14b",
        "--total-kv-blocks", "1000", "--kv-offload-config", str(SAMPLES / "offload.yaml"),
        "--num-requests", "80"]
GRID = """\
mode: grid
axes:
  kv_offload.cpu_bytes_to_use: [64MiB, 256MiB, 1GiB]
  max_num_seqs: [8, 256]
plot: {metrics: [hit_rate.external, ttft_p99_ms], format: svg}
"""


def _sweep(tmp: Path, text: str, out: str, *extra: str, base: list[str] = TRACE) -> int:
    f = tmp / "sweep.yaml"
    f.write_text(text)
    return main(["sweep", *base, "--sweep", str(f), "--output-dir", str(tmp / out), *extra])


def _rows(path: Path) -> list[dict[str, str]]:
    import csv

    with path.open() as f:
        return list(csv.DictReader(f))


def test_sweep_over_a_trace_writes_one_row_per_point_with_every_hit_rate(tmp_path: Path) -> None:
    assert _sweep(tmp_path, GRID, "out", "--workers", "1") == 0
    rows = _rows(tmp_path / "out" / "sweep.csv")
    assert [(r["kv_offload.cpu_bytes_to_use"], r["max_num_seqs"]) for r in rows] == [
        ("64MiB", "8"), ("64MiB", "256"), ("256MiB", "8"), ("256MiB", "256"), ("1GiB", "8"), ("1GiB", "256")]
    for r in rows:
        for col in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p90_ms", "itl_mean_ms", "responses_per_sec",
                    "preemption_count", "hit_rate.prefix_cache", "hit_rate.external",
                    "hit_rate.by_source.host", "hit_rate.by_source.disk", "hit_rate.tiered.0:primary",
                    "hit_rate.tiered.1:fs", "queries.tiered.1:fs"):
            assert r[col] != "", col
        prov = json.loads(r["provenance"])
        assert prov["kv_offload"]["cpu_bytes_to_use"] == parse_size(r["kv_offload.cpu_bytes_to_use"])
        assert prov["kv_geometry"] == {"block_size": 16, "num_gpu_blocks": 300}
    # a bigger CPU tier holds more: the external hit-rate grows along the axis
    ext = [float(r["hit_rate.external"]) for r in rows if r["max_num_seqs"] == "256"]
    assert ext[0] < ext[1] <= ext[2] + 1e-9
    assert {p.name for p in (tmp_path / "out").glob("plot-*.svg")} == {
        "plot-kv_offload.cpu_bytes_to_use.svg", "plot-max_num_seqs.svg"}


def test_the_process_pool_gives_the_same_table_as_one_process(tmp_path: Path) -> None:
    assert _sweep(tmp_path, GRID, "serial", "--workers", "1", "--no-plots") == 0
    assert _sweep(tmp_path, GRID, "pool", "--workers", "2", "--no-plots") == 0
    assert (tmp_path / "serial" / "sweep.csv").read_bytes() == (tmp_path / "pool" / "sweep.csv").read_bytes()


def test_an_interrupted_sweep_resumes_and_keeps_finished_points(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert _sweep(tmp_path, GRID, "full", "--workers", "1", "--no-plots") == 0
    assert _sweep(tmp_path, GRID, "cut", "--workers", "1", "--no-plots") == 0
    store = tmp_path / "cut" / "points.jsonl"
    lines = store.read_text().splitlines(keepends=True)
    # as if killed while the third point was being written: two whole lines and a torn one
    store.write_text("".join(lines[:2]) + lines[2][:40])
    capsys.readouterr()
    assert _sweep(tmp_path, GRID, "cut", "--workers", "1", "--no-plots") == 0
    assert "6 point(s): 2 already done, 4 to run" in capsys.readouterr().err
    assert (tmp_path / "cut" / "sweep.csv").read_bytes() == (tmp_path / "full" / "sweep.csv").read_bytes()
    # nothing is recomputed when everything is done; a new value runs only its own points
    assert _sweep(tmp_path, GRID, "cut", "--workers", "1", "--no-plots") == 0
    assert "6 point(s): 6 already done, 0 to run" in capsys.readouterr().err
    wider = GRID.replace("[64MiB, 256MiB, 1GiB]", "[64MiB, 256MiB, 1GiB, 4GiB]")
    assert _sweep(tmp_path, wider, "cut", "--workers", "1", "--no-plots") == 0
    assert "8 point(s): 6 already done, 2 to run" in capsys.readouterr().err
    assert _sweep(tmp_path, wider, "cut", "--workers", "1", "--no-plots", "--force") == 0
    assert "8 point(s): 0 already done, 8 to run" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "where", "reason"), [
    ("axes:\n  max_num_seqs: [8]\nplots: {}\n", "sweep.yaml:3: field 'plots'", "unknown key 'plots'"),
    ("axes:\n  max_num_seqs: [8]\n  max_num_seqs: [16]\n", "sweep.yaml:3: field 'axes.max_num_seqs'",
     "duplicate key"),
    ("axes:\n  kv_offload.cpu_bytes_to_use:\n    - 1GiB\n    - lots\n",
     "sweep.yaml:4: field 'axes.kv_offload.cpu_bytes_to_use.1'", "is not a byte size"),
    ("axes:\n  max_num_seqs: [8, 0]\n", "sweep.yaml:2: field 'axes.max_num_seqs.1'", "must be ≥ 1"),
    ("axes:\n  gpu_blocks: [8]\n", "sweep.yaml:2: field 'axes.gpu_blocks'", "unknown axis"),
    ("axes:\n  workload.aggregate_rate: [8]\n", "sweep.yaml:2: field 'axes.workload.aggregate_rate'",
     "needs a --workload-spec base"),
    ("mode: zip\naxes:\n  max_num_seqs: [8, 16]\n  total_kv_blocks: [300]\n", "sweep.yaml:1: field 'mode'",
     "one length"),
    ("axes:\n  kv_offload.secondary_tiers.0.max_bytes: [1KiB]\n",
     "sweep.yaml:2: field 'axes.kv_offload.secondary_tiers.0.max_bytes.0'", "smaller than one offload chunk"),
    ("axes:\n  kv_offload.store_threshold: [2]\n", "sweep.yaml:2: field 'axes.kv_offload.store_threshold.0'",
     "store_threshold >= 2 is not supported with secondary tiers"),
    ("axes:\n  routing_policy: [weighted]\n  routing_scorers: ['kv-utilization:1']\n",
     "sweep.yaml:2: field 'axes.routing_policy", "scorer 'kv-utilization' is not supported"),
    ("axes:\n  routing_policy: [nearest]\n", "sweep.yaml:2: field 'axes.routing_policy", "expected one of"),
    ("axes:\n  num_instances: [0]\n", "sweep.yaml:2: field 'axes.num_instances.0'", "must be ≥ 1"),
])
def test_a_bad_sweep_file_is_one_line_naming_file_line_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: str, reason: str) -> None:
    assert _sweep(tmp_path, text, "out") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and where in err and reason in err, err
    assert not (tmp_path / "out" / "points.jsonl").exists()  # checked before anything ran


def test_a_sweep_over_a_workload_spec(tmp_path: Path) -> None:
    text = ("mode: zip\naxes:\n  workload.aggregate_rate: [4, 32]\n"
            "  workload.clients.*.prefix_length: [512, 2048]\n")
    assert _sweep(tmp_path, text, "out", "--workers", "2", base=SPEC) == 0
    rows = _rows(tmp_path / "out" / "sweep.csv")
    assert [(r["workload.aggregate_rate"], r["workload.clients.*.prefix_length"]) for r in rows] == [
        ("4", "512"), ("32", "2048")]
    assert all(r["completed_requests"] == "80" for r in rows)
    assert float(rows[1]["ttft_p99_ms"]) > float(rows[0]["ttft_p99_ms"])  # 8x the load


def test_replicas_and_routing_are_axes_whose_points_are_blis_run_over_a_cluster(tmp_path: Path) -> None:
    """docs/cluster.md §4: a point with cluster axes is `blis run --num-instances N --routing-policy P`."""
    text = "axes:\n  num_instances: [1, 4]\n  routing_policy: [round-robin, prefix-affinity]\n"
    assert _sweep(tmp_path, text, "out", "--workers", "2", base=SPEC) == 0
    rows = {(r["num_instances"], r["routing_policy"]): r for r in _rows(tmp_path / "out" / "sweep.csv")}
    assert len(rows) == 4 and all(r["completed_requests"] == "80" for r in rows.values())
    # one replica: the policy cannot matter
    assert rows["1", "round-robin"]["ttft_p99_ms"] == rows["1", "prefix-affinity"]["ttft_p99_ms"]
    # four replicas: prefix-affinity keeps each prefix group on one cache, round-robin spreads it over four
    assert (float(rows["4", "prefix-affinity"]["hit_rate.prefix_cache"])
            > float(rows["4", "round-robin"]["hit_rate.prefix_cache"]))
    metrics = tmp_path / "m.json"
    assert main(["run", *SPEC, "--num-instances", "4", "--routing-policy", "prefix-affinity",
                 "--metrics-path", str(metrics)]) == 0
    m = json.loads(metrics.read_text())
    assert float(rows["4", "prefix-affinity"]["ttft_p99_ms"]) == pytest.approx(m["ttft_p99_ms"], rel=1e-12)
    assert int(rows["4", "prefix-affinity"]["completed_requests"]) == m["completed_requests"]


def test_a_load_policy_is_an_axis_too(tmp_path: Path) -> None:
    """docs/cluster.md §2: replay and run route by load, so a sweep point may."""
    text = "axes:\n  num_instances: [2]\n  routing_policy: [round-robin, least-loaded]\n"
    assert _sweep(tmp_path, text, "out", "--workers", "1", base=SPEC) == 0
    rows = {r["routing_policy"]: r for r in _rows(tmp_path / "out" / "sweep.csv")}
    metrics = tmp_path / "m.json"
    assert main(["run", *SPEC, "--num-instances", "2", "--routing-policy", "least-loaded",
                 "--metrics-path", str(metrics)]) == 0
    m = json.loads(metrics.read_text())
    assert float(rows["least-loaded"]["ttft_p99_ms"]) == pytest.approx(m["ttft_p99_ms"], rel=1e-12)
    assert rows["least-loaded"]["ttft_p99_ms"] != rows["round-robin"]["ttft_p99_ms"]


def test_plan_finds_the_fewest_replicas_under_a_ttft_slo(tmp_path: Path) -> None:
    args = ["plan", *SPEC[:-1], "400", "--axis", "num_instances", "--range", "1", "8",
            "--set", "routing_policy=round-robin", "--set", "workload.aggregate_rate=64",
            "--target", "ttft_p99_ms<=200", "--workers", "2",
            "--output-dir", str(tmp_path / "p")]
    assert main(args) == 0
    answer = json.loads((tmp_path / "p" / "plan.json").read_text())
    value = answer["value"]
    assert value == int(value) and 1 < value <= 8
    assert all(e["meets"] == (e["x"] >= value) for e in answer["evaluations"])


def test_plan_finds_the_smallest_cpu_tier_and_shows_its_curve(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    code = main(["plan", *TRACE, "--axis", "kv_offload.cpu_bytes_to_use", "--range", "64MiB", "4GiB",
                 "--target", "hit_rate.external>=0.6", "--output-dir", str(out), "--workers", "2"])
    assert code == 0
    answer = json.loads((out / "plan.json").read_text())
    value = answer["value"]
    evals = answer["evaluations"]
    assert any(e["x"] == value and e["meets"] for e in evals)
    below = [e for e in evals if e["x"] < value]
    assert below and not any(e["meets"] for e in below)
    lo, hi = answer["bracket"]
    assert hi == value and hi - lo <= (4 * 2**30 - 64 * 2**20) / 100 + 1
    assert answer["monotone"] is True
    assert len(_rows(out / "plan.csv")) == len(evals)
    assert "plan: smallest kv_offload.cpu_bytes_to_use" in capsys.readouterr().out
    # the same question again reuses every point
    assert main(["plan", *TRACE, "--axis", "kv_offload.cpu_bytes_to_use", "--range", "64MiB", "4GiB",
                 "--target", "hit_rate.external>=0.6", "--output-dir", str(out), "--workers", "2"]) == 0
    assert "to run" in (err := capsys.readouterr().err) and " 0 to run" in err and " 1 to run" not in err


def test_plan_finds_the_highest_rate_under_a_ttft_slo_and_says_when_it_is_unreachable(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", *SPEC, "--axis", "workload.aggregate_rate", "--range", "1", "64", "--find", "largest",
            "--resolution", "1", "--workers", "2"]
    assert main([*args, "--target", "ttft_p99_ms<=200", "--output-dir", str(tmp_path / "a")]) == 0
    answer = json.loads((tmp_path / "a" / "plan.json").read_text())
    assert 1 < answer["value"] < 64
    assert all(e["meets"] == (e["x"] <= answer["value"]) for e in answer["evaluations"])
    assert main([*args, "--target", "ttft_p99_ms<=1", "--output-dir", str(tmp_path / "b")]) == 1
    assert "not met anywhere in the range" in capsys.readouterr().out


def test_plan_rejects_bad_questions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", *TRACE, "--output-dir", str(tmp_path)]
    assert main([*base, "--axis", "kv_offload.eviction_policy", "--range", "1", "2", "--target", "x>=1"]) == 2
    assert main([*base, "--axis", "total_kv_blocks", "--range", "500", "100", "--target", "x>=1"]) == 2
    assert main([*base, "--axis", "total_kv_blocks", "--range", "100", "500", "--target", "x=>1"]) == 2
    err = capsys.readouterr().err
    assert "not numeric" in err and "must be below HIGH" in err and "expected METRIC OP NUMBER" in err


RAY_RUN = """
import sys
import ray
from blis_sim.cli import main

base = sys.argv[1:]
assert main(["sweep", *base, "--output-dir", "local", "--workers", "2", "--no-plots"]) == 0
ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
try:
    # --ray-address local uses the instance this process started
    assert main(["sweep", *base, "--output-dir", "ray", "--ray-address", "local", "--no-plots"]) == 0
finally:
    ray.shutdown()
"""


def test_local_pool_and_ray_give_identical_tables(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the [ray] extra is not installed")
    import subprocess
    import sys

    (tmp_path / "sweep.yaml").write_text(GRID)
    # Ray runs in a process of its own: its daemons and signal handling stay out of pytest's workers
    proc = subprocess.run([sys.executable, "-c", RAY_RUN, *TRACE, "--sweep", "sweep.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on Ray (local)" in proc.stderr and "6 point(s): 0 already done, 6 to run on local" in proc.stderr
    local = (tmp_path / "local" / "sweep.csv").read_bytes()
    assert local.count(b"\n") == 7 and (tmp_path / "ray" / "sweep.csv").read_bytes() == local


# ------------------------------------------------------------------------------------ units


def test_sizes_paths_and_offload_overrides() -> None:
    assert parse_size("2GiB") == 2 * 2**30 and parse_size("1.5 GB") == 1_500_000_000 and parse_size(4096) == 4096
    for bad in ("lots", 0, True, "-1GiB"):
        with pytest.raises(ValueError):
            parse_size(bad)
    spec = {"clients": [{"prefix_length": 1}, {"prefix_length": 2}], "rate": 1}
    assert set_path(spec, "clients.*.prefix_length", 9)["clients"] == [{"prefix_length": 9}] * 2
    assert spec["clients"][0]["prefix_length"] == 1  # a copy
    with pytest.raises(ValueError, match="no 'nope'"):
        set_path(spec, "nope.x", 1)
    from blis_sim.formats.offload import load_offload_config

    cfg = load_offload_config(SAMPLES / "offload.yaml", kv_bytes_per_token=163840)
    slow = override_offload(cfg, {(0, "device_class"): "sata_ssd", (-1, "cpu_bytes_to_use"): 2**31})
    assert slow.secondary_tiers[0].read_bandwidth == 550.0 and slow.cpu_capacity_chunks == 2**31 // (163840 * 16)
    with pytest.raises(ValueError, match="no tier 3"):
        override_offload(cfg, {(3, "max_bytes"): 2**30})
    with pytest.raises(ValueError, match="smaller than one offload chunk"):
        override_offload(cfg, {(-1, "cpu_bytes_to_use"): 1024})


def test_search_helpers() -> None:
    assert interior(0, 10, 2, integer=True) == [3, 7]
    assert interior(4, 5, 3, integer=True) == []
    pts = [Evaluation(x, m, ok, i) for i, (x, m, ok) in enumerate([(1, 0.1, False), (2, 0.5, True),
                                                                   (3, 0.3, False), (4, 0.9, True)])]
    monotone, notes = monotonicity(pts, "smallest")
    assert not monotone and any("not monotone" in n for n in notes)
    assert monotonicity(pts[:2], "smallest") == (True, [])
    with pytest.raises(FormatError, match="unknown key"):
        parse_sweep_file("axes: {max_num_seqs: [1]}\nextra: 1\n", base_kind="trace")


def test_the_parquet_table_holds_the_csv_rows(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow (the [parquet] extra) is not installed")
    assert _sweep(tmp_path, GRID, "out", "--workers", "1", "--no-plots") == 0
    table = pq.read_table(tmp_path / "out" / "sweep.parquet").to_pylist()
    rows = _rows(tmp_path / "out" / "sweep.csv")
    assert [r["key"] for r in table] == [r["key"] for r in rows]
    assert [r["kv_offload.cpu_bytes_to_use"] for r in table] == ["64MiB", "64MiB", "256MiB", "256MiB", "1GiB", "1GiB"]
    assert [str(r["ttft_p99_ms"]) for r in table] == [r["ttft_p99_ms"] for r in rows]


def test_rate_scale_compresses_a_trace_and_a_latency_file_is_an_axis(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    slow = tmp_path / "slow.yaml"
    slow.write_text("model: linear\nstep: {base_us: 24000, per_prefill_token_us: 9.2, per_decode_seq_us: 9,"
                    " per_context_token_us: 0.19}\nfrontend: {base_us: 15563}\n")
    text = "axes:\n  rate_scale: [1, 4]\n  latency_coefficients: [slow.yaml]\n"
    assert _sweep(tmp_path, text, "out", "--workers", "1", "--no-plots",
                  base=[*TRACE[:-1], "1000"]) == 0
    one, four = _rows(tmp_path / "out" / "sweep.csv")
    assert float(four["duration_s"]) < float(one["duration_s"])
    assert float(four["ttft_p99_ms"]) > float(one["ttft_p99_ms"])
    assert json.loads(one["provenance"])["latency_model"]["source"] == "slow.yaml"
    assert _sweep(tmp_path, "axes:\n  latency_coefficients: [missing.yaml]\n", "bad", base=TRACE) == 2
    assert "sweep.yaml:2: field 'axes.latency_coefficients.0'" in capsys.readouterr().err


def test_plan_finds_the_fewest_gpu_blocks_to_the_block(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    assert main(["plan", *TRACE[:-2], "--axis", "total_kv_blocks", "--range", "100", "2000", "--resolution", "1",
                 "--target", "hit_rate.prefix_cache>=0.4", "--output-dir", str(out), "--workers", "2"]) == 0
    answer = json.loads((out / "plan.json").read_text())
    meets = {int(e["x"]): e["meets"] for e in answer["evaluations"]}
    n = answer["value"]
    assert n == int(n) and meets[n] and meets[n - 1] is False  # the block below was evaluated and fails
