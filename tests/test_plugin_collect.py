"""Plugin acceptance: collection, ids, schema errors, options (pytester, no server needed)."""
from __future__ import annotations

import pytest

# Plugins this repo's environment loads that the inner runs do not need (hypothesis alone costs seconds).
FAST = ("-p", "no:hypothesispytest", "-p", "no:benchmark")


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*FAST, *args)

SCENARIO = """
defaults:
  server: {block_size: 16, num_gpu_blocks: 256}
scenarios:
  gpu-hit:
    sweep: {prefix_length: [256, 1024]}
    id: "prefix-{prefix_length}"
    marks: [slow]
    phases:
      - seed: {groups: 2, prefix_length: "{prefix_length}"}
      - repeat: {}
    expect: {path: gpu}
  miss:
    phases:
      - unique: {requests: 2, prompt_length: 128}
    expect: {path: miss}
"""


def test_items_and_ids(pytester: pytest.Pytester) -> None:
    pytester.makefile(".blis.yaml", cells=SCENARIO)
    result = _run(pytester, "--collect-only", "-q")
    result.stdout.fnmatch_lines([
        "cells.blis.yaml::gpu-hit::prefix-256",
        "cells.blis.yaml::gpu-hit::prefix-1024",
        "cells.blis.yaml::miss::default",
        "3 tests collected*",
    ])


def test_k_and_m_select(pytester: pytest.Pytester) -> None:
    pytester.makefile(".blis.yaml", cells=SCENARIO)
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow cells\n")
    result = _run(pytester, "--collect-only", "-q", "-m", "not slow")
    result.stdout.fnmatch_lines(["cells.blis.yaml::miss::default", "1/3 tests collected*"])
    result = _run(pytester, "--collect-only", "-q", "-k", "prefix-1024")
    result.stdout.fnmatch_lines(["cells.blis.yaml::gpu-hit::prefix-1024", "1/3 tests collected*"])


def test_other_yaml_is_not_collected(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", ci="jobs: {}\n")
    result = _run(pytester, "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


@pytest.mark.parametrize(("text", "expected"), [
    (SCENARIO.replace("groups: 2", "groups: 0"), "*cells.blis.yaml:9: field 'scenarios.gpu-hit.phases.0.seed.groups'*"),
    (SCENARIO.replace("expect: {path: miss}", "expect: {path: nowhere}"),
     "*cells.blis.yaml:15: field 'scenarios.miss.expect.path'*"),
    (SCENARIO.replace("repeat: {}", "repeat: {}\n        bogus: 1"), "*cells.blis.yaml:*unknown key 'bogus'*"),
    (SCENARIO.replace("  miss:", "  gpu-hit:"), "*cells.blis.yaml:12*duplicate key 'gpu-hit'*"),
    (SCENARIO.replace('"{prefix_length}"', '"2x tpu"'), "*is not a size*"),
    (SCENARIO.replace("- unique: {requests: 2, prompt_length: 128}", "- {}"), "*needs exactly one of*"),
    ("scenarios: {}\n", "*cells.blis.yaml:1: field 'scenarios'*"),
    (SCENARIO.replace("      - seed: {groups: 2, prefix_length: \"{prefix_length}\"}\n", ""),
     "*'repeat' phase needs a 'seed' phase*"),
    (SCENARIO.replace("- unique: {requests: 2, prompt_length: 128}",
                      "- unique: {requests: 2, prompt_length: 128}\n        rate: 2x capacity"),
     "*cells.blis.yaml:14: field 'scenarios.miss.phases.0'*has no 'workload'*"),
    (SCENARIO.replace("- unique: {requests: 2, prompt_length: 128}", "- {workload: w.yaml, rate: 2x fast}"),
     "*cells.blis.yaml:14: field 'scenarios.miss.phases.0.rate'*is not a rate*"),
], ids=["out-of-range", "bad-enum", "unknown-key", "duplicate-key", "bad-size", "no-phase-kind", "no-scenarios",
        "repeat-without-seed", "rate-without-workload", "bad-rate"])
def test_schema_errors_name_file_line_field(pytester: pytest.Pytester, text: str, expected: str) -> None:
    pytester.makefile(".blis.yaml", cells=text)
    result = _run(pytester, "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*ERROR collecting cells.blis.yaml*", expected])
    assert "Traceback" not in result.stdout.str()


def test_bad_option_values_are_usage_errors(pytester: pytest.Pytester) -> None:
    pytester.makefile(".blis.yaml", cells=SCENARIO)
    result = _run(pytester, "--collect-only", "--blis-server-url", "localhost:8000")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*expected http://host:port*"])
    result = _run(pytester, "--collect-only", "--blis-hit-rate-tolerance-pp", "-1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result = _run(pytester, "--collect-only", "--blis-emulator-nice", "-21")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--blis-emulator-nice must be in -20..19, got -21*"])


def test_report_header_names_target_and_tolerances(pytester: pytest.Pytester) -> None:
    pytester.makefile(".blis.yaml", cells=SCENARIO)
    pytester.makeini("[pytest]\nblis_hit_rate_tolerance_pp = 2.5\n")
    result = _run(pytester, "--collect-only", "--blis-ttft-mape-threshold", "0.2")
    result.stdout.fnmatch_lines(["blis: server embedded emulator*tolerances 2.5 pp hit-rate, 0.2 TTFT MAPE"])
