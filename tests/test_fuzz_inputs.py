"""Every input fuzzed (issue 14): a mutated file loads, or gives one error line naming the file; never a traceback,
a hang or a partial output file. The harness is tests/fuzzing.py; benchmarks/fuzz_soak.py runs it at 10^5 inputs
per format (docs/reliability.md). Here a small, derandomized budget per format, the regression cases of the
first CLI fuzz (three classes), and a few whole `blis` runs in-process and as real subprocesses.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzzing
from blis_sim.cli import main as blis_main
from blis_sim.errors import BlisError, FormatError, error_line

SAMPLES = fuzzing.BLIS
FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("name", sorted(fuzzing.TARGETS))
def test_the_sample_loads(name: str, tmp_path: Path) -> None:
    target = fuzzing.TARGETS[name]
    assert fuzzing.run(target, target.sample(), tmp_path) == ("loaded", None)


@pytest.mark.parametrize("name", sorted(fuzzing.TARGETS))
@FUZZ
@given(rnd=st.randoms(use_true_random=False), structural=st.booleans())
def test_a_mutated_input_loads_or_fails_on_one_line(name: str, rnd: random.Random, structural: bool,
                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    target = fuzzing.TARGETS[name]
    base = target.sample()
    data = fuzzing.mutate_structure(target, base, rnd) if structural else fuzzing.mutate_bytes(base, rnd)
    failure = fuzzing.check(target, data, tmp_path_factory.mktemp(name))
    assert failure is None, str(failure)


def test_the_property_catches_what_it_must() -> None:
    """The checker itself: a two-line message, a message without the file, a parse error without its line."""
    path = Path("/x/sim.json")
    assert fuzzing.message_problem("blis replay: error: /x/sim.json:3: bad", path, "replay") is None
    assert fuzzing.message_problem("blis replay: error: /x/sim.json: a\n  in \"<unicode string>\"", path, "replay")
    assert fuzzing.message_problem("blis replay: error: bad", path, "replay") == "does not name the file"
    assert fuzzing.message_problem("blis replay: error: /x/sim.json: invalid JSON: x", path, "replay") \
        == "a parse error without its line"


# ----------------------------------------------------------------------------------- the three classes


def _sim_json_with_duplicate_then_control() -> bytes:
    text = (SAMPLES / "sim.json").read_text()
    # the first object gets a duplicate key; a later key carries a control character
    text = text.replace('"ttft_us"', '"request_id": 9,\n    "ttft_us"', 1)
    return text.replace('"e2e_us"', '"e2e\x01us"', 3).replace('"e2e\x01us"', '"e2e_us"', 2).encode()


def test_duplicate_key_beside_a_control_character_is_located(tmp_path: Path) -> None:
    data = _sim_json_with_duplicate_then_control()
    for name in ("sim-results", "metrics-output"):
        target = fuzzing.TARGETS[name]
        assert fuzzing.check(target, data, tmp_path) is None
    path = tmp_path / "sim.json"
    path.write_bytes(data)
    from blis_sim.formats.results import load_sim_results

    with pytest.raises(FormatError) as exc:
        load_sim_results(path)
    assert f"{path}:4: field '[0].request_id': invalid JSON: duplicate key 'request_id'" == str(exc.value)


def test_a_huge_cpu_budget_is_a_located_bound(tmp_path: Path) -> None:
    text = (SAMPLES / "offload.yaml").read_text().replace("1073741824", "10737418240000000000000")
    path = tmp_path / "offload.yaml"
    path.write_text(text)
    from blis_sim.formats.offload import load_offload_config

    with pytest.raises(Exception) as exc:
        load_offload_config(path, kv_bytes_per_token=fuzzing.KV_BYTES_PER_TOKEN)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "cpu_bytes_to_use" in s)
    assert str(exc.value) == (f"{path}:{line}: field 'kv_offload.cpu_bytes_to_use': kv_offload: cpu_bytes_to_use "
                              "10737418240000000000000 exceeds the maximum 1152921504606846976 (docs/reliability.md)")


@pytest.mark.parametrize("text, line, column", [("a: b\x01c\n", 1, 5), ("a: 1\nb: \x07\n", 2, 4)])
def test_a_yaml_reader_error_is_one_line_with_its_line(text: str, line: int, column: int) -> None:
    from blis_sim.formats._strict import parse_yaml

    with pytest.raises(FormatError) as exc:
        parse_yaml(text, "w.yaml")
    msg = error_line("run", exc.value)
    assert msg.startswith(f"blis run: error: w.yaml:{line}: invalid YAML: unacceptable character #x")
    assert f"at column {column}" in msg and "\n" not in msg and "<unicode string>" not in msg


# ----------------------------------------------------------------------------------- whole commands


def _run_inprocess(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = blis_main(argv)
    return rc, err.getvalue()


COMMANDS = {
    # command: (the file mutated, argv builder(dir) with that file in dir, outputs)
    "replay": ("trace.yaml", lambda d: ["replay", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000",
                                        "--trace-header", str(d / "trace.yaml"), "--trace-data",
                                        str(SAMPLES / "trace.csv"), "--kv-offload-config",
                                        str(d / "offload.yaml"), "--results-path", str(d / "out.json"),
                                        "--metrics-path", str(d / "outagg.json")]),
    "calibrate": ("sim.json", lambda d: ["calibrate", "--trace-header", str(SAMPLES / "trace-observed.yaml"),
                                         "--trace-data", str(SAMPLES / "trace.csv"), "--sim-results",
                                         str(d / "sim.json"), "--sim-metrics", str(SAMPLES / "simagg.json"),
                                         "--report", str(d / "out.json")]),
    "run": ("workload.yaml", lambda d: ["run", "--model", "qwen/qwen3-14b", "--total-kv-blocks", "1000",
                                        "--workload-spec", str(d / "workload.yaml"), "--num-requests", "20",
                                        "--results-path", str(d / "out.json")]),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rnd=st.randoms(use_true_random=False))
def test_a_command_on_a_mutated_file_exits_0_1_or_2_with_no_partial_output(
        command: str, rnd: random.Random, tmp_path_factory: pytest.TempPathFactory) -> None:
    d = tmp_path_factory.mktemp(command)
    mutated, argv = COMMANDS[command]
    (d / "offload.yaml").write_bytes((SAMPLES / "offload.yaml").read_bytes())
    source = {"trace.yaml": SAMPLES / "trace.yaml", "sim.json": SAMPLES / "sim.json",
              "workload.yaml": SAMPLES / "workload.yaml"}[mutated]
    target = next(t for t in fuzzing.TARGETS.values() if t.filename == mutated)
    (d / mutated).write_bytes(fuzzing.mutate(target, source.read_bytes(), rnd))
    rc, err = _run_inprocess(argv(d))
    errors = [line for line in err.splitlines() if line.startswith(f"blis {command}: error:")]
    assert "Traceback" not in err
    if rc == 2:
        assert len(errors) == 1 and str(d) in errors[0], err
        assert not (d / "out.json").exists() and not (d / "outagg.json").exists()
    else:
        assert rc in (0, 1) and not errors, err
    assert not [p for p in d.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"], "temp file left"


CASES = {
    "duplicate-key": ("calibrate", "sim.json", _sim_json_with_duplicate_then_control, ":4: field '[0].request_id'"),
    "huge-integer": ("replay", "offload.yaml",
                     lambda: (SAMPLES / "offload.yaml").read_bytes().replace(b"1073741824", b"9" * 30),
                     "field 'kv_offload.cpu_bytes_to_use'"),
    "yaml-control-character": ("replay", "trace.yaml",
                               lambda: (SAMPLES / "trace.yaml").read_bytes().replace(b"mode:", b"mo\x07de:"),
                               "invalid YAML: unacceptable character #x0007"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cli_prints_one_line_for_each_class(case: str, tmp_path: Path) -> None:
    """The three classes of the first fuzz, through the real `blis` in a subprocess."""
    command, name, make, expected = CASES[case]
    for f in ("trace.yaml", "offload.yaml", "sim.json"):
        (tmp_path / f).write_bytes((SAMPLES / f).read_bytes())
    (tmp_path / name).write_bytes(make())
    argv = COMMANDS[command][1](tmp_path)
    if command == "calibrate":
        argv[argv.index("--sim-results") + 1] = str(tmp_path / "sim.json")
    env = {**os.environ, "PYTHONPATH": str(fuzzing.REPO)}
    proc = subprocess.run([sys.executable, "-m", "blis_sim", *argv], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"blis {command}: error: {tmp_path / name}:"), proc.stderr
    assert expected in lines[0]
    assert not (tmp_path / "out.json").exists()


def test_no_control_character_reaches_the_terminal() -> None:
    exc = FormatError("duplicate key 'a\x1b[2Jb'", file="x.json", line=3, field="a\nb")
    line = error_line("calibrate", exc)
    assert line == "blis calibrate: error: x.json:3: field 'a\\nb': duplicate key 'a\\x1b[2Jb'"
    assert json.dumps(line).count("\\u") == 0


def _header_error(tmp_path: Path, old: str, new: str) -> tuple[Path, str]:
    """The trace-header sample with ``old`` replaced by ``new``, loaded as the soak does: the CLI's error line."""
    target = fuzzing.TARGETS["trace-header"]
    text = target.sample().decode()
    assert old in text
    path = tmp_path / target.filename
    path.write_text(text.replace(old, new))
    with pytest.raises(BlisError) as exc:
        target.load(path)
    return path, error_line("replay", exc.value)


def test_a_header_tier_the_resolver_refuses_is_located(tmp_path: Path) -> None:
    """Found by the soak: an empty ``root_dir`` in a header's ``kv_offload`` tier escaped as a pydantic error."""
    path, line = _header_error(tmp_path, "root_dir: /mnt/kv-cache", 'root_dir: ""')
    assert line == (f"blis replay: error: {path}: field 'kv_offload.secondary_tiers.0.root_dir': kv_offload: "
                    "secondary_tiers[0].root_dir: String should have at least 1 character (got '')")


@pytest.mark.parametrize("value", ["9" * 400, str(2**60 + 1)], ids=["400-digits", "2^60+1"])
def test_a_huge_header_per_block_bytes_is_a_located_bound(value: str, tmp_path: Path) -> None:
    """Found by the soak (trace-header input #24085, 14 of 80,000 inputs): a ``per_block_bytes`` too large for a
    float escaped as ``OverflowError`` when the header's offload config was resolved. It is now bounded like every
    other size, before it is divided."""
    path, line = _header_error(tmp_path, "per_block_bytes: 2621440", f"per_block_bytes: {value}")
    assert line == (f"blis replay: error: {path}: field 'kv_offload.per_block_bytes': kv_offload: per_block_bytes "
                    f"{value} exceeds the maximum 1152921504606846976 (docs/reliability.md)")


def test_a_replay_error_about_the_trace_names_the_trace(tmp_path: Path) -> None:
    """Found by the in-process command fuzz: INV-13 (an offload flag on a trace recorded without one) named no
    file. Errors about what the trace holds now name its two files."""
    lines = (SAMPLES / "trace.yaml").read_text().splitlines(keepends=True)
    start = lines.index("kv_offload:\n")
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
    (tmp_path / "trace.yaml").write_text("".join(lines[:start] + lines[end:]))
    (tmp_path / "offload.yaml").write_bytes((SAMPLES / "offload.yaml").read_bytes())
    rc, err = _run_inprocess(COMMANDS["replay"][1](tmp_path))
    assert rc == 2
    assert err.startswith(f"blis replay: error: {tmp_path / 'trace.yaml'} / {SAMPLES / 'trace.csv'}: the trace was "
                          "captured without a kv_offload config"), err


@pytest.mark.parametrize("text", ["a: [1, 2, {b: c}]\n", "a: !!int x\n", "a: &x [1]\nb: *x\n"],
                         ids=["loads", "fails-mid-document", "alias"])
def test_parsing_yaml_keeps_no_node(text: str) -> None:
    """Found by the soak: the strict loader's shared constructor kept every node it had built, ~45 nodes and 90
    marks an input, so a long soak worker grew to 1 GB and its garbage collections into seconds."""
    from blis_sim.formats import _strict, _yamlin

    with contextlib.suppress(FormatError):
        _strict.parse_yaml(text, "w.yaml")
    assert not _yamlin._LOADER_SINGLETON.constructed_objects
    assert not _yamlin._LOADER_SINGLETON.recursive_objects


@pytest.mark.parametrize("value", ["inf", "nan", "-Inf"])
def test_a_counter_that_is_not_a_number_is_a_scrape_error(value: str, tmp_path: Path) -> None:
    """Found by the soak (exposition inputs #5022, #5127): a counter sample of ``inf`` or ``nan`` reached
    ``int()`` in the counter window as OverflowError / ValueError."""
    target = fuzzing.TARGETS["exposition"]
    old = 'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="tiny-llama",source="device"} 29696.0'
    text = target.sample().decode()
    assert old in text
    path = tmp_path / target.filename
    path.write_text(text.replace(old, old.replace("29696.0", value)))
    with pytest.raises(BlisError) as exc:
        target.load(path)
    assert error_line("observe", exc.value) == (
        f"blis observe: error: {path}: counter sample vllm:prompt_tokens_cached_by_source_total{{'engine': '0', "
        f"'model_name': 'tiny-llama', 'source': 'device'}} is {float(value)}, not a finite number")
