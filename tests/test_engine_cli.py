"""`blis run`, `blis replay`, `blis fit` as a user runs them (subprocesses, real files)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_engine_replay import without_settings

REPO = Path(__file__).resolve().parents[1]
BLIS = REPO / "samples" / "blis"


def blis(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blis_sim", *map(str, args)], capture_output=True,
                          text=True)


@pytest.fixture(scope="module")
def run_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    out = blis("run", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000",
               "--workload-spec", BLIS / "workload.yaml", "--kv-offload-config", BLIS / "offload.yaml",
               "--trace-output", d / "t", "--metrics-path", d / "run.json", "--results-path",
               d / "run-sim.json")
    assert out.returncode == 0, out.stderr
    return d


def test_run_writes_a_trace_that_records_the_offload_config(run_trace: Path) -> None:
    header = (run_trace / "t.yaml").read_text()
    assert "mode: generated" in header and "kv_offload:" in header
    assert "per_block_bytes: 2621440" in header and "latency_model:" in header
    assert len((run_trace / "t.csv").read_text().splitlines()) == 201


def test_replay_of_the_run_trace_reproduces_its_metrics_byte_for_byte(run_trace: Path) -> None:
    out = blis("replay", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000",
               "--trace-header", run_trace / "t.yaml", "--trace-data", run_trace / "t.csv",
               "--metrics-path", run_trace / "rep.json", "--results-path", run_trace / "rep-sim.json",
               "--trace-output", run_trace / "again")
    assert out.returncode == 0, out.stderr
    # every byte but where each setting came from (tests/test_engine_replay.py, without_settings)
    assert without_settings((run_trace / "rep.json").read_text()) == \
        without_settings((run_trace / "run.json").read_text())
    assert (run_trace / "rep-sim.json").read_bytes() == (run_trace / "run-sim.json").read_bytes()
    shown = json.loads(out.stdout)
    assert "cache_hit_rate" not in shown and "requests" not in shown  # as the reference prints it
    saved = json.loads((run_trace / "rep.json").read_text())
    assert 0 < saved["cache_hit_rate"] < 1 and len(saved["requests"]) == 200
    defs = {(e["definition"], e["tier"]) for e in saved["kv_hit_rates"]}
    assert {("prefix_cache", None), ("external", None), ("by_source", "disk"), ("tiered", "1:fs")} <= defs
    prov = saved["provenance"]  # design D7: what produced these numbers, in the file itself
    assert prov["kv_geometry"] == {"block_size": 16, "num_gpu_blocks": 1000}
    assert prov["kv_offload"]["per_block_bytes"] == 2621440 and prov["latency_model"]["name"] == "linear"
    assert "seed" not in prov["latency_model"]["coefficients"] and prov["seed"] == 42  # not a coefficient
    # where each setting came from: the flags, the header the run wrote, the documented defaults
    assert prov["settings"]["num_gpu_blocks"] == {"value": 1000, "source": "flag"}
    assert prov["settings"]["block_size"] == {"value": 16, "source": "header"}
    assert prov["settings"]["kv_offload"] == {"source": "header"}
    assert prov["settings"]["max_num_batched_tokens"] == {"value": 2048, "source": "default"}
    assert prov["settings"]["kv_bytes_per_token"] == {"value": 163840, "source": "header"}
    assert json.loads((run_trace / "run.json").read_text())["provenance"]["settings"]["kv_offload"] == \
        {"source": "flag"}
    sim = json.loads((run_trace / "rep-sim.json").read_text())
    assert set(sim[0]["cached_tokens_by_source"]) == {"device", "host", "disk"}
    assert "mode: replayed" in (run_trace / "again.yaml").read_text()


def test_replay_reads_the_reference_sample_files(tmp_path: Path) -> None:
    out = blis("replay", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000",
               "--trace-header", BLIS / "trace.yaml", "--trace-data", BLIS / "trace.csv",
               "--results-path", tmp_path / "sim.json", "--metrics-path", tmp_path / "agg.json")
    assert out.returncode == 0, out.stderr
    ours = json.loads((tmp_path / "agg.json").read_text())
    ref = json.loads((BLIS / "simagg.json").read_text())
    assert ours["completed_requests"] == ref["completed_requests"] == 200
    # the block-based compatibility figure lands near the reference's own
    assert abs(ours["cache_hit_rate"] - ref["cache_hit_rate"]) < 0.05


@pytest.mark.parametrize("args,message", [
    (["replay", "--trace-header", BLIS / "trace.yaml", "--trace-data", BLIS / "trace.csv"],
     "LLM name not provided"),
    (["replay", "--model", "m", "--trace-data", BLIS / "trace.csv"], "--trace-header is required"),
    (["replay", "--model", "m", "--trace-header", "/nope.yaml", "--trace-data", BLIS / "trace.csv"],
     "--trace-header file not found: /nope.yaml"),
    (["run", "--model", "m", "--workload-spec", BLIS / "workload.yaml", "--horizon", "-5"],
     "--horizon must be > 0"),
    (["run", "--model", "unknown/m", "--workload-spec", BLIS / "workload.yaml", "--kv-offload-config",
      BLIS / "offload.yaml"], "cannot derive per_block_bytes"),
    (["run", "--model", "m", "--workload-spec", BLIS / "workload.yaml", "--latency-model", "roofline"],
     "--latency-model roofline needs --model-config"),
    # a coefficient file the roofline would ignore is refused, not silently dropped
    (["replay", "--model", "qwen/qwen3-14b", "--trace-header", BLIS / "trace.yaml", "--trace-data",
      BLIS / "trace.csv", "--latency-model", "roofline", "--latency-coefficients", BLIS / "sim.json"],
     "--latency-coefficients applies to --latency-model linear only"),
    (["fit", "--model", "qwen/qwen3-14b", "--trace-header", BLIS / "trace.yaml", "--trace-data",
      BLIS / "trace.csv", "--max-iterations", "0"], "--max-iterations must be ≥ 1"),
])
def test_bad_flags_are_one_line_usage_errors(args: list, message: str) -> None:
    out = blis(*args)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_tiered_observation_without_offload_exits_2(tmp_path: Path) -> None:
    header = (BLIS / "trace-observed.yaml").read_text()
    start, end = header.index("kv_offload:"), header.index("observed_kv_metrics:")
    (tmp_path / "h.yaml").write_text(header[:start] + header[end:])
    out = blis("replay", "--model", "qwen/qwen3-14b", "--trace-header", tmp_path / "h.yaml",
               "--trace-data", BLIS / "trace.csv")
    assert out.returncode == 2 and "--kv-offload-config <file> matching" in out.stderr


def test_bad_coefficient_file_names_its_line(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("step:\n  base_us: 1\n  bogus: 2\n  per_prefill_token_us: 1\n"
                                     "  per_decode_seq_us: 1\n  per_context_token_us: 0\n")
    out = blis("run", "--model", "m", "--workload-spec", BLIS / "workload.yaml",
               "--latency-coefficients", tmp_path / "c.yaml")
    assert out.returncode == 2 and f"{tmp_path / 'c.yaml'}:3: field 'step.bogus'" in out.stderr


def test_fit_writes_coefficients_that_run_accepts(run_trace: Path) -> None:
    coeffs = run_trace / "fitted.yaml"
    out = blis("fit", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000", "--trace-header",
               run_trace / "t.yaml", "--trace-data", run_trace / "t.csv", "--output", coeffs,
               "--max-iterations", "2", "--validate-header", run_trace / "t.yaml",
               "--validate-data", run_trace / "t.csv")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["fit"]["requests"] == 200 and "validation" in report
    assert report["coefficients"]["step"]["base_us"] == pytest.approx(12000, rel=0.02)
    again = blis("run", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000",
                 "--workload-spec", BLIS / "workload.yaml", "--latency-coefficients", coeffs)
    assert again.returncode == 0, again.stderr
    model = json.loads(again.stdout)["provenance"]["latency_model"]
    assert model["source"] == str(coeffs)
    assert model["coefficients"]["step.base_us"] == pytest.approx(report["coefficients"]["step"]["base_us"])


def test_fit_states_its_start_prints_its_report_and_writes_it(run_trace: Path) -> None:
    start = run_trace / "start.yaml"
    start.write_text("step:\n  base_us: 9000\n  per_prefill_token_us: 5\n  per_decode_seq_us: 5\n"
                     "  per_context_token_us: 0.1\n")
    out = blis("fit", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000", "--trace-header",
               run_trace / "t.yaml", "--trace-data", run_trace / "t.csv", "--max-iterations", "2",
               "--initial-coefficients", start, "--hardware", "H100", "--bootstrap-resamples", "10",
               "--output", run_trace / "fit2.json")
    assert out.returncode == 0, out.stderr
    assert f"blis fit: starting from {start} coefficients" in out.stderr
    assert "<- returned" in out.stderr and "step.per_prefill_token_us" in out.stderr
    fit = json.loads(out.stdout)["fit"]
    assert fit["start"] == str(start) and fit["prior"].startswith("roofline qwen/qwen3-14b on H100")
    assert [c["kind"] for c in fit["convergence"]][:4] == ["start", "prior", "iterate", "iterate"]
    assert fit["convergence"][0]["values"][0] == 9000
    assert len(fit["coefficients"]) == 9 and all("ci_low" in c for c in fit["coefficients"])
    saved = json.loads((run_trace / "fit2.json").read_text())["fit"]
    assert saved["warnings"] == fit["warnings"] and saved["best_iteration"] == fit["best_iteration"]
    no_prior = blis("fit", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000",
                    "--trace-header", run_trace / "t.yaml", "--trace-data", run_trace / "t.csv",
                    "--max-iterations", "1", "--bootstrap-resamples", "0")
    assert no_prior.returncode == 0, no_prior.stderr
    assert "blis fit: starting from default coefficients" in no_prior.stderr
    assert json.loads(no_prior.stdout)["fit"]["prior"].startswith("none: no --hardware")


def test_fit_takes_latency_coefficients_as_a_start_beside_the_initial_ones(run_trace: Path) -> None:
    """Any coefficient file the user gives is a start (issue 27): ``--latency-coefficients`` beside
    ``--initial-coefficients`` is a second start, replayed and scored as the first is."""
    first, second = run_trace / "first.yaml", run_trace / "second.yaml"
    first.write_text("step:\n  base_us: 9000\n  per_prefill_token_us: 5\n  per_decode_seq_us: 5\n"
                     "  per_context_token_us: 0.1\n")
    second.write_text("step:\n  base_us: 4000\n  per_prefill_token_us: 20\n  per_decode_seq_us: 30\n"
                      "  per_context_token_us: 0.01\n")
    out = blis("fit", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000", "--trace-header",
               run_trace / "t.yaml", "--trace-data", run_trace / "t.csv", "--max-iterations", "1",
               "--initial-coefficients", first, "--latency-coefficients", second,
               "--bootstrap-resamples", "0", "--search-evaluations", "0")
    assert out.returncode == 0, out.stderr
    assert f"blis fit: starting from {first} and {second} coefficients" in out.stderr
    fit = json.loads(out.stdout)["fit"]
    assert fit["start"] == f"{first}, {second}"
    runs = fit["convergence"]
    assert [c["kind"] for c in runs[:2]] == ["start", "start"]
    assert runs[0]["values"][0] == 9000 and runs[1]["values"][0] == 4000
    assert runs[fit["best_iteration"]]["objective"] <= min(c["objective"] for c in runs[:2])
    alone = blis("fit", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000", "--trace-header",
                 run_trace / "t.yaml", "--trace-data", run_trace / "t.csv", "--max-iterations", "1",
                 "--latency-coefficients", second, "--bootstrap-resamples", "0",
                 "--search-evaluations", "0")
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)["fit"]["convergence"][0]["values"][0] == 4000


VLLM = REPO / "samples" / "vllm-cpu"


def test_replay_of_an_observed_trace_warns_on_default_server_limits(tmp_path: Path) -> None:
    base = ["replay", "--model", "tiny-llama", "--trace-data", VLLM / "trace.csv"]
    out = blis(*base, "--trace-header", VLLM / "trace.yaml")
    assert out.returncode == 0, out.stderr
    warning = [line for line in out.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and "--max-num-batched-tokens 2048" in warning[0]
    assert "--max-num-seqs 256" in warning[0] and "--total-kv-blocks" in warning[0]
    # the header's server.max_num_seqs is honoured; the flags silence the rest
    header = (VLLM / "trace.yaml").read_text().replace("    model: tiny-llama\n",
                                                       "    model: tiny-llama\n    max_num_seqs: 8\n")
    (tmp_path / "h.yaml").write_text(header)
    out = blis(*base, "--trace-header", tmp_path / "h.yaml", "--max-num-batched-tokens", "512")
    assert out.returncode == 0 and "--max-num-seqs" not in out.stderr
    assert "--max-num-batched-tokens" not in out.stderr and "--total-kv-blocks" in out.stderr
    out = blis(*base, "--trace-header", tmp_path / "h.yaml", "--max-num-batched-tokens", "512",
               "--total-kv-blocks", "512")
    assert out.returncode == 0 and out.stderr == ""
    # a simulated trace has no real server behind it: nothing to warn about
    sim = blis("replay", "--model", "qwen/qwen3-14b", "--trace-header", BLIS / "trace.yaml",
               "--trace-data", BLIS / "trace.csv")
    assert sim.returncode == 0 and "warning" not in sim.stderr


def test_fit_of_the_two_row_shape_writes_a_roofline_fit_file_that_run_accepts(run_trace: Path) -> None:
    coeffs = run_trace / "two-row.yaml"
    out = blis("fit", "--model", "qwen/qwen3-14b", "--hardware", "H100", "--total-kv-blocks", "1000",
               "--trace-header", run_trace / "t.yaml", "--trace-data", run_trace / "t.csv",
               "--output", coeffs, "--max-iterations", "2", "--bootstrap-resamples", "5",
               "--step-shape", "roofline")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["coefficients"]["model"] == "roofline-fit" and "memory" in report["coefficients"]
    assert "memory.weights_us" in out.stderr   # the report names the memory row's coefficients
    again = blis("run", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000",
                 "--workload-spec", BLIS / "workload.yaml", "--latency-coefficients", coeffs)
    assert again.returncode == 0, again.stderr
    model = json.loads(again.stdout)["provenance"]["latency_model"]
    # the memory row reached run's provenance with its fitted values (on this 200-request trace the weights
    # term is weakly identified: its iterates move between 0 and ~900 µs, the KV-read term stays > 0)
    row = {k: v for k, v in model["coefficients"].items() if k.startswith("memory.")}
    assert model["name"] == "roofline-fit" and set(row) == {"memory.weights_us", "memory.per_context_token_us"}, model
    assert row["memory.per_context_token_us"] > 0 and row == {
        f"memory.{k}": v for k, v in report["coefficients"]["memory"].items()}, (row, report["coefficients"])


def test_process_settings_apply_to_the_program_only(run_trace: Path, tmp_path: Path, monkeypatch) -> None:
    """`blis replay` run as a program runs OpenBLAS with one thread (unless the user set it) and
    leaves the garbage collector alone; ``main(argv)`` called in a process that is not ours
    changes nothing."""
    import gc
    import os

    from blis_sim.cli import main

    args = ["replay", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000", "--trace-header",
            str(run_trace / "t.yaml"), "--trace-data", str(run_trace / "t.csv"),
            "--metrics-path", str(tmp_path / "m.json")]
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    frozen = gc.get_freeze_count()
    assert main(args) == 0
    assert gc.isenabled() and gc.get_freeze_count() == frozen and "OPENBLAS_NUM_THREADS" not in os.environ
    probe = ("import gc, os, sys; import blis_sim.cli as cli; sys.argv = ['blis'] + sys.argv[1:]; "
             "rc = cli.main(); print(rc, gc.isenabled(), gc.get_freeze_count() > 0, "
             "os.environ.get('OPENBLAS_NUM_THREADS'), file=sys.stderr)")
    for env, threads in (({}, "1"), ({"OPENBLAS_NUM_THREADS": "2"}, "2")):
        out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True,
                             env={**os.environ, **env})
        assert out.stderr.splitlines()[-1] == f"0 True False {threads}", out.stderr


def test_replay_as_a_program_writes_everything_and_returns_its_exit_code(
        run_trace: Path, tmp_path: Path) -> None:
    """`blis replay` run as a program: its stdout, its files and its exit codes are complete, and
    ``main()`` returns to its caller."""
    import os

    args = ["replay", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000", "--trace-header",
            str(run_trace / "t.yaml"), "--trace-data", str(run_trace / "t.csv"),
            "--metrics-path", str(tmp_path / "m.json"), "--results-path", str(tmp_path / "r.json")]
    probe = ("import sys; from blis_sim.cli import main; sys.argv = ['blis'] + sys.argv[1:]; "
             "rc = main(); print('after main', rc, file=sys.stderr); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True)
    assert out.returncode == 0 and "after main 0" in out.stderr, out.stderr
    shown = json.loads(out.stdout)
    saved = json.loads((tmp_path / "m.json").read_text())
    assert shown["completed_requests"] == saved["completed_requests"] == 200
    assert len(json.loads((tmp_path / "r.json").read_text())) == 200
    bad = subprocess.run([sys.executable, "-c", probe, *args[:-4], "--tp", "0"], capture_output=True,
                         text=True, env={**os.environ})
    assert bad.returncode == 2 and "--tp must be ≥ 1, got 0" in bad.stderr, bad.stderr


def test_replay_runs_as_a_program_and_names_stay_served_by_their_modules(run_trace: Path, tmp_path: Path) -> None:
    """`blis replay` of a trace whose header records its offload config runs through the replay
    path; the names the coefficient and offload-file modules export are still served by the
    modules that always exported them."""
    args = ["replay", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000", "--trace-header",
            str(run_trace / "t.yaml"), "--trace-data", str(run_trace / "t.csv"),
            "--metrics-path", str(tmp_path / "m.json")]
    probe = ("import sys; import blis_sim.cli as cli; sys.argv = ['blis'] + sys.argv[1:]; "
             "rc = cli.main(); "
             "print(rc, *sorted(m for m in sys.modules if m.startswith('blis_sim')), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rc, *modules = out.stderr.splitlines()[-1].split()
    assert rc == "0" and "blis_sim.engine.replay_trace" in modules

    from blis_sim.engine import LatencyCoefficients, coefficients, latency
    from blis_sim.formats import load_offload_config, offload, offload_file

    assert latency.LatencyCoefficients is coefficients.LatencyCoefficients is LatencyCoefficients
    assert latency.load_coefficients is coefficients.load_coefficients
    assert latency.DEFAULT_COEFFICIENTS is coefficients.DEFAULT_COEFFICIENTS
    assert offload.load_offload_config is offload_file.load_offload_config is load_offload_config
    assert offload.DEFAULT_DEVICE_CLASSES is offload_file.DEFAULT_DEVICE_CLASSES
    with pytest.raises(AttributeError):
        latency.no_such_name  # noqa: B018
    with pytest.raises(AttributeError):
        offload.no_such_name  # noqa: B018
