"""The workload spec: the reference's samples load, v1 upgrades, phases, and bad input names file:line:field."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from blis_sim.errors import ConfigError, FormatError, InputError
from blis_sim.formats._strict import parse_yaml
from blis_sim.formats.workload import (
    load_workload_spec, parse_workload_spec, workload_spec_from_data, workload_spec_from_doc,
)

REPO = Path(__file__).resolve().parents[1]

BASE = """\
version: "2"
aggregate_rate: 4
num_requests: 10
clients:
  - id: a
    rate_fraction: 1
    arrival: {process: poisson}
    input_distribution: {type: constant, params: {value: 10}}
    output_distribution: {type: constant, params: {value: 5}}
"""

# The two example specs of docs/reference-formats.md §2.4, as the reference gives them.
SWEEP = """\
version: "2"
seed: 42
aggregate_rate: 4
num_requests: 200
clients:
  - id: shared-1024
    slo_class: standard
    rate_fraction: 0.75
    streaming: true
    prefix_group: sys-1024
    prefix_length: 1024
    arrival: {process: poisson}
    input_distribution:  {type: constant, params: {value: 128}}
    output_distribution: {type: constant, params: {value: 64}}
  - id: unique
    slo_class: standard
    rate_fraction: 0.25
    streaming: true
    arrival: {process: poisson}
    input_distribution:  {type: constant, params: {value: 1152}}
    output_distribution: {type: constant, params: {value: 64}}
"""
MULTI_TURN = """\
version: "2"
aggregate_rate: 1
num_requests: 50
clients:
  - id: chat
    rate_fraction: 1.0
    streaming: true
    arrival: {process: poisson}
    input_distribution:  {type: gaussian, params: {mean: 256, std_dev: 64, min: 32, max: 1024}}
    output_distribution: {type: gaussian, params: {mean: 128, std_dev: 32, min: 16, max: 512}}
    reasoning:
      reason_ratio_distribution: {type: constant, params: {value: 0}}
      multi_turn: {max_rounds: 4, think_time_us: 2000000, context_growth: accumulate}
"""


def test_reference_sample_spec_loads() -> None:
    spec = load_workload_spec(REPO / "samples/blis/workload.yaml")
    assert spec.version == "2" and spec.seed == 42 and spec.category == "language"
    assert len(spec.clients) == 17 and spec.num_requests == 200 and spec.aggregate_rate == 8.0
    g0 = spec.clients[0]
    assert (g0.id, g0.prefix_group, g0.prefix_length, g0.arrival.process) == ("g0", "sys-0", 1024, "poisson")
    assert g0.input_distribution.params == {"mean": 256, "std_dev": 64, "min": 32, "max": 1024}
    assert spec.clients[-1].prefix_group == ""
    (phase,) = spec.resolved_phases()
    assert phase.name == "" and len(phase.clients) == 17


def test_real_vllm_sample_spec_loads() -> None:
    spec = load_workload_spec(REPO / "samples/vllm-cpu/spec.yaml")
    assert [c.id for c in spec.clients] == ["g0", "g1", "g2", "u"]
    assert sum(c.rate_fraction for c in spec.clients) == pytest.approx(1.0)


@pytest.mark.parametrize("text", [SWEEP, MULTI_TURN])
def test_reference_examples_load(text: str) -> None:
    spec = parse_workload_spec(text)
    assert spec.clients


def test_multi_turn_fields() -> None:
    c = parse_workload_spec(MULTI_TURN).clients[0]
    assert c.multi_turn is not None and c.multi_turn.max_rounds == 4
    assert c.multi_turn.context_growth == "accumulate" and c.is_closed_loop


def test_full_reference_schema_is_accepted() -> None:
    text = BASE.replace("    rate_fraction: 1\n", """\
    rate_fraction: 1
    tenant_id: t1
    slo_class: batch
    model: m
    adapter: lora-1
    prefix_group: g
    prefix_length: 0
    streaming: true
    timeout: 0
    slo_target_us: 5000
    closed_loop: false
    network: {rtt_ms: 2, bandwidth_mbps: 100}
    lifecycle: {windows: [{start_us: 0, end_us: 1000000}]}
    multimodal:
      text_distribution: {type: constant, params: {value: 5}}
      image_distribution: {type: constant, params: {value: 100}}
      image_count_distribution: {type: empirical, params: {"1": 0.5, "2": 0.5}}
""") + """\
cohorts:
  - id: pop
    population: 3
    slo_class: batch
    rate_fraction: 0.5
    prefix_sharing: per_member
    prefix_group: pg
    arrival: {process: gamma, cv: 2}
    input_distribution: {type: lognormal, params: {mu: 4, sigma: 0.5, min: 10, max: 500}}
    output_distribution: {type: pareto_lognormal, params: {alpha: 2, xm: 10, mu: 3, sigma: 1, mix_weight: 0.3}}
    diurnal: {peak_hour: 12, peak_to_trough_ratio: 3}
goodput_slo_targets: {batch: {ttft_ms: 500, e2e_ms: 9000}}
horizon: 60000000
category: multimodal
"""
    spec = parse_workload_spec(text)
    assert spec.clients[0].adapter == "lora-1" and spec.cohorts[0].population == 3
    assert spec.goodput_slo_targets["batch"].ttft_ms == 500


def test_v1_upgrade_maps_slo_classes(caplog: pytest.LogCaptureFixture) -> None:
    text = BASE.replace('version: "2"', 'version: "1"').replace(
        "    rate_fraction: 1\n", "    rate_fraction: 1\n    slo_class: realtime\n")
    text += text[text.index("  - id: a"):].replace("id: a", "id: b").replace("realtime", "interactive")
    with caplog.at_level(logging.WARNING, logger="blis_sim.workload"):
        spec = parse_workload_spec(text)
    assert spec.version == "2"
    assert [c.slo_class for c in spec.clients] == ["critical", "standard"]
    assert "deprecated SLO class 'realtime'" in caplog.text


def test_missing_version_is_v1_and_int_version_accepted() -> None:
    assert parse_workload_spec(BASE.replace('version: "2"\n', "")).version == "2"
    assert parse_workload_spec(BASE.replace('version: "2"', "version: 2")).version == "2"


def test_v2_rejects_v1_class_names() -> None:
    with pytest.raises(ConfigError, match=r"x\.yaml:7: field 'clients\.0\.slo_class': unknown slo_class 'realtime'"):
        parse_workload_spec(BASE.replace("    rate_fraction: 1\n", "    rate_fraction: 1\n    slo_class: realtime\n"),
                            "x.yaml")


# --- bad input: each names file, line and field ---------------------------------------------------------------

BAD = [
    ("unknown top-level key (the doc's `rate:`)", BASE + "rate: 5\n", FormatError, 10, "rate", "unknown key 'rate'"),
    ("unknown client key", BASE.replace("    rate_fraction: 1\n", "    rate_fraction: 1\n    prefix_len: 3\n"),
     FormatError, 7, "clients.0.prefix_len", "unknown key"),
    ("duplicate key", BASE + "seed: 1\nseed: 2\n", FormatError, 11, "seed", "duplicate key"),
    ("quoted boolean", BASE.replace("    rate_fraction: 1\n", "    rate_fraction: 1\n    streaming: \"yes\"\n"),
     FormatError, 7, "clients.0.streaming", "valid boolean"),
    ("not an integer", BASE.replace("num_requests: 10", "num_requests: lots"), FormatError, 3, "num_requests",
     "valid integer"),
    ("unknown arrival process", BASE.replace("poisson", "poison"), ConfigError, 7, "clients.0.arrival.process",
     "unknown arrival process 'poison'"),
    ("negative rate_fraction", BASE.replace("rate_fraction: 1", "rate_fraction: -1"), ConfigError, 6,
     "clients.0.rate_fraction", "must be positive"),
    ("unknown distribution", BASE.replace("type: constant, params: {value: 10}", "type: uniform, params: {value: 10}"),
     ConfigError, 8, "clients.0.input_distribution.type", "unknown distribution type 'uniform'"),
    ("missing parameter", BASE.replace("{type: constant, params: {value: 10}}",
                                       "{type: gaussian, params: {mean: 10, std_dev: 1, min: 1}}"),
     ConfigError, 8, "clients.0.input_distribution.params", "requires parameter 'max'"),
    ("unknown parameter", BASE.replace("{value: 5}", "{value: 5, stddev: 3}"), ConfigError, 9,
     "clients.0.output_distribution.params.stddev", "unknown parameter 'stddev'"),
    ("gaussian min > max", BASE.replace("{type: constant, params: {value: 10}}",
                                        "{type: gaussian, params: {mean: 10, std_dev: 1, min: 20, max: 5}}"),
     ConfigError, 8, "clients.0.input_distribution.params.min", "must be <= max"),
    ("concurrency with rate_fraction", BASE.replace("    rate_fraction: 1\n", "    rate_fraction: 1\n    concurrency: 2\n"),
     ConfigError, 6, "clients.0.rate_fraction", "mutually exclusive"),
    ("weibull cv out of range", BASE.replace("{process: poisson}", "{process: weibull, cv: 20}"), ConfigError, 7,
     "clients.0.arrival.cv", "weibull CV must be in [0.01, 10.4]"),
    ("max_rounds 0", BASE + "    reasoning: {multi_turn: {max_rounds: 0}}\n", ConfigError, 10,
     "clients.0.reasoning.multi_turn.max_rounds", "max_rounds must be >= 1"),
    ("negative prefix_length", BASE.replace("    rate_fraction: 1\n", "    rate_fraction: 1\n    prefix_length: -4\n"),
     ConfigError, 7, "clients.0.prefix_length", "non-negative"),
    ("mixed slo classes", BASE.replace("    rate_fraction: 1\n", "    rate_fraction: 1\n    slo_class: batch\n")
     + "  - {id: b, rate_fraction: 1, arrival: {process: poisson}, input_distribution: {type: constant, params: "
       "{value: 1}}, output_distribution: {type: constant, params: {value: 1}}}\n",
     ConfigError, 11, "clients.1.slo_class", "mixed slo_class"),
    ("missing aggregate_rate", BASE.replace("aggregate_rate: 4\n", ""), ConfigError, None, "aggregate_rate",
     "aggregate_rate must be > 0"),
    ("phase without clients", BASE[:BASE.index("clients:")] + "phases:\n  - name: p1\n", ConfigError, 5, "phases.0",
     "needs clients"),
    ("repeat of an unknown phase", BASE[:BASE.index("clients:")] + "phases:\n  - name: p1\n    repeat: p0\n",
     ConfigError, 6, "phases.0.repeat", "not the name of an earlier phase"),
    ("top-level clients with phases", BASE + "phases: [{name: x}]\n", ConfigError, 4, "clients",
     "cannot be combined with phases"),
]


@pytest.mark.parametrize("text, exc, line, fld, reason", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_spec_names_file_line_field(text: str, exc: type[InputError], line: int | None, fld: str,
                                        reason: str) -> None:
    with pytest.raises(exc) as info:
        parse_workload_spec(text, "bad.yaml")
    err = info.value
    assert err.location.file == "bad.yaml"
    assert err.location.field == fld
    if line is not None:
        assert err.location.line == line
    assert reason in str(err)
    assert re.match(r"bad\.yaml:\d+: field '[^']+': ", str(err))


def test_missing_file_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="file not found"):
        load_workload_spec(tmp_path / "nope.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(FormatError, match="empty"):
        load_workload_spec(tmp_path / "empty.yaml")


# --- phases --------------------------------------------------------------------------------------------------

PHASED = """\
seed: 7
aggregate_rate: 4
num_requests: 10
phases:
  - name: warm
    num_requests: 3
    clients:
      - {id: a, rate_fraction: 1, prefix_group: g, prefix_length: 64, arrival: {process: poisson},
         input_distribution: {type: constant, params: {value: 10}},
         output_distribution: {type: constant, params: {value: 5}}}
  - name: flood
    aggregate_rate: 50
    clients:
      - {id: f, rate_fraction: 1, arrival: {process: poisson},
         input_distribution: {type: constant, params: {value: 1000}},
         output_distribution: {type: constant, params: {value: 5}}}
  - name: again
    repeat: warm
    gap_us: 500000
"""


def test_phases_resolve_with_inheritance_and_repeat() -> None:
    phases = parse_workload_spec(PHASED).resolved_phases()
    assert [p.name for p in phases] == ["warm", "flood", "again"]
    assert [p.num_requests for p in phases] == [3, 10, 3]
    assert [p.aggregate_rate for p in phases] == [4, 50, 4]
    assert phases[2].clients == phases[0].clients and phases[2].gap_us == 500000


def test_duplicate_phase_name() -> None:
    text = PHASED.replace("name: flood", "name: warm")
    with pytest.raises(ConfigError, match=r"p\.yaml:11: field 'phases\.1\.name': duplicate phase name 'warm'"):
        parse_workload_spec(text, "p.yaml")


def test_repeat_with_own_clients_is_refused() -> None:
    text = PHASED + "    clients: []\n"
    with pytest.raises(ConfigError, match=r"field 'phases\.2\.clients': a phase with `repeat`"):
        parse_workload_spec(text)


def test_error_inside_a_phase_points_into_it() -> None:
    text = PHASED.replace("value: 1000", "value: 1000, typo: 1")
    with pytest.raises(ConfigError, match=r"p\.yaml:15: field 'phases\.1\.clients\.0\.input_distribution\.params\.typo'"):
        parse_workload_spec(text, "p.yaml")


def test_spec_embedded_in_another_document() -> None:
    doc = parse_yaml("name: scenario\nworkload:\n" + "".join("  " + ln + "\n" for ln in BASE.splitlines()), "s.yaml")
    spec = workload_spec_from_doc(doc, at=("workload",))
    assert spec.clients[0].id == "a"
    bad = parse_yaml("name: s\nworkload:\n" + "".join("  " + ln + "\n" for ln in (BASE + "bogus: 1").splitlines()),
                     "s.yaml")
    with pytest.raises(FormatError, match=r"s\.yaml:12: field 'workload\.bogus': unknown key"):
        workload_spec_from_doc(bad, at=("workload",))


def test_overrides() -> None:
    spec = parse_workload_spec(PHASED).with_overrides(seed=1, num_requests=99, horizon=5)
    assert spec.seed == 1
    assert all(p.num_requests == 99 and p.horizon == 5 for p in spec.resolved_phases())
    same = parse_workload_spec(BASE).with_overrides(seed=None, num_requests=0, horizon=0)
    assert same.num_requests == 10 and same.horizon == 0


def test_spec_built_in_code_gets_the_same_checks() -> None:
    data = {"version": "2", "aggregate_rate": 2, "num_requests": 3,
            "clients": [{"id": "distribution", "rate_fraction": 1, "arrival": {"process": "constant"},
                         "input_distribution": {"type": "gaussian",
                                                "params": {"mean": 512, "std_dev": 256, "min": 2, "max": 7000}},
                         "output_distribution": {"type": "constant", "params": {"value": 8}}}]}
    assert workload_spec_from_data(data, "<flags>").clients[0].id == "distribution"
    data["clients"][0]["input_distribution"]["params"]["min"] = 9000
    with pytest.raises(ConfigError, match=r"<flags>: field 'clients\.0\.input_distribution\.params\.min': min"):
        workload_spec_from_data(data, "<flags>")


def test_odd_shapes_are_errors_not_tracebacks() -> None:
    with pytest.raises(FormatError, match=r"field 'clients\.0\.slo_class'"):
        parse_workload_spec(BASE.replace('version: "2"', 'version: "1"').replace(
            "    rate_fraction: 1\n", "    rate_fraction: 1\n    slo_class: [a]\n"))
    with pytest.raises(FormatError, match="must be a mapping"):
        parse_workload_spec("- 1\n- 2\n")
    with pytest.raises(FormatError, match=r"field 'workload': required field is missing"):
        workload_spec_from_doc(parse_yaml("name: x\n", "s.yaml"), at=("workload",))
    with pytest.raises(FormatError, match=r"field 'phases'"):
        parse_workload_spec("aggregate_rate: 1\nphases: {a: 1}\n")
