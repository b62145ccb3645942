"""SimResult and MetricsOutput JSON: the reference's samples byte-identical, our extras, Go number layout."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_sim.formats import (
    KVHitRate,
    MetricsOutput,
    SimResult,
    load_metrics_output,
    load_sim_results,
    metrics_output_text,
    sim_results_text,
    write_metrics_output,
    write_sim_results,
)
from blis_sim.formats._go import fixed_float, json_float, yaml_float
from blis_sim.formats.results import go_json

BLIS = Path(__file__).resolve().parents[1] / "samples" / "blis"


def test_samples_load_and_write_back_byte_identical(tmp_path: Path) -> None:
    results = load_sim_results(BLIS / "sim.json")
    metrics = load_metrics_output(BLIS / "simagg.json")
    assert len(results) == 200 and results[14].itl_mean_us == 0.0  # omitted field reads as zero
    assert metrics.cache_hit_rate == pytest.approx(0.6588455538221529) and len(metrics.requests) == 200
    assert metrics.requests[0].request_id == "request_0" and metrics.requests[0].handled_by == "instance_0"
    write_sim_results(results, tmp_path / "sim.json")
    write_metrics_output(metrics, tmp_path / "simagg.json")
    assert (tmp_path / "sim.json").read_bytes() == (BLIS / "sim.json").read_bytes()
    assert (tmp_path / "simagg.json").read_bytes() == (BLIS / "simagg.json").read_bytes()


def test_extras_round_trip(tmp_path: Path) -> None:
    results = [SimResult(request_id=2, ttft_us=10.5, e2e_us=20, input_tokens=3, output_tokens=1, cached_tokens=16,
                         cached_tokens_by_source={"host": 16, "device": 0, "disk": 0}),
               SimResult(request_id=1, ttft_us=1, e2e_us=2, input_tokens=3, output_tokens=2, slo_class="batch")]
    write_sim_results(results, tmp_path / "sim.json")
    text = (tmp_path / "sim.json").read_text()
    assert text.index('"request_id": 1') < text.index('"request_id": 2')  # sorted by id
    assert '"cached_tokens_by_source": {\n      "device": 0,\n      "disk": 0,\n      "host": 16\n    }' in text
    assert load_sim_results(tmp_path / "sim.json") == sorted(results, key=lambda r: r.request_id)

    rates = [KVHitRate(definition="prefix_cache", unit="tokens", hits=5, queries=10, hit_rate=0.5),
             KVHitRate(definition="tiered", tier="0:primary", unit="chunks", hits=0, queries=0, hit_rate=0.0)]
    metrics = MetricsOutput(completed_requests=2, cache_hit_rate=0.0, kv_hit_rates=rates)
    write_metrics_output(metrics, tmp_path / "agg.json")
    data = json.loads((tmp_path / "agg.json").read_text())
    assert data["cache_hit_rate"] == 0 and list(data)[-1] == "kv_hit_rates"  # 0 is written; extras last
    assert data["kv_hit_rates"][0] == {"definition": "prefix_cache", "tier": None, "unit": "tokens", "hits": 5,
                                       "queries": 10, "hit_rate": 0.5, "metric": None}
    assert load_metrics_output(tmp_path / "agg.json") == metrics


def test_empty_results_are_an_empty_array() -> None:
    assert sim_results_text([]) == "[]"


def test_absent_cache_hit_rate_is_absent() -> None:
    text = metrics_output_text(MetricsOutput())
    assert "cache_hit_rate" not in text and '"requests"' not in text and "kv_hit_rates" not in text
    assert text.startswith('{\n  "instance_id": "cluster",\n  "completed_requests": 0,')


def test_opaque_reference_fields_are_kept(tmp_path: Path) -> None:
    data = json.loads((BLIS / "simagg.json").read_text())
    data["saturation"] = {"knee_rps": 3.5, "method": "x"}
    data["per_class"] = {"batch": {"goodput": 1}}
    data["goodput_rps"] = 1.25
    (tmp_path / "a.json").write_text(json.dumps(data))
    metrics = load_metrics_output(tmp_path / "a.json")
    assert metrics.saturation == {"knee_rps": 3.5, "method": "x"} and metrics.goodput_rps == 1.25
    write_metrics_output(metrics, tmp_path / "b.json")
    assert load_metrics_output(tmp_path / "b.json") == metrics


@pytest.mark.parametrize(("value", "yaml", "json_", "fixed"), [
    (7000.0, "7000", "7000", "7000"),
    (0.68, "0.68", "0.68", "0.68"),
    (0.0, "0", "0", "0"),
    (1e-05, "1e-05", "0.00001", "0.00001"),
    (1e-07, "1e-07", "1e-7", "0.0000001"),
    (17179869184.0, "1.7179869184e+10", "17179869184", "17179869184"),
    (123456.0, "123456", "123456", "123456"),
    (1234567.0, "1.234567e+06", "1234567", "1234567"),
    (1e21, "1e+21", "1e+21", "1000000000000000000000"),
    (-2.5, "-2.5", "-2.5", "-2.5"),
    (0.6588455538221529, "0.6588455538221529", "0.6588455538221529", "0.6588455538221529"),
])
def test_go_float_formats(value: float, yaml: str, json_: str, fixed: str) -> None:
    assert (yaml_float(value), json_float(value), fixed_float(value)) == (yaml, json_, fixed)
    assert float(yaml) == float(json_) == float(fixed) == value


def test_go_json_escapes_html_and_rejects_nan() -> None:
    assert go_json({"a": "<b>&"}) == '{\n  "a": "\\u003cb\\u003e\\u0026"\n}'
    with pytest.raises(ValueError, match="NaN"):
        go_json({"a": float("nan")})


@settings(max_examples=500, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_fast_float_path_equals_go_format(f: float) -> None:
    from blis_sim.formats.results import _float

    assert _float(f) == json_float(f)
    assert float(_float(f)) == f


def test_model_fast_path_equals_the_general_rules() -> None:
    from blis_sim.formats._model import to_go

    metrics = load_metrics_output(BLIS / "simagg.json").model_copy(update={
        "saturation": {"z": 1, "a": [1.5, {"y": None, "b": "x"}]}, "per_class": {"b": 1, "a": 2},
        "kv_hit_rates": [KVHitRate(definition="by_source", tier="host", unit="tokens", hits=1, queries=2,
                                   hit_rate=0.5)]})
    assert go_json(metrics) == go_json(to_go(metrics))
    result = SimResult(request_id=1, ttft_us=1, e2e_us=2, input_tokens=3, output_tokens=4,
                       cached_tokens_by_source={"host": 1, "device": 2})
    assert go_json(result) == go_json(to_go(result))
    assert '"saturation": {\n    "a": [' in go_json(metrics)  # Go maps: sorted keys


def test_objects_written_as_columns_equal_the_general_rules() -> None:
    """A list of objects is written through its columns (one writer for SimResult files): the text
    is the general layout of the same objects, at every indent and on awkward values (omitted
    fields in some rows, nil pointers, Go maps, escapes, extreme floats)."""
    from blis_sim.formats._model import to_go
    from blis_sim.formats.results import Columns, columns_json, sim_results_text

    metrics = load_metrics_output(BLIS / "simagg.json").model_copy(update={
        "saturation": {"z": 1, "a": [1.5, {"y": None, "b": "x<&>"}]}, "still_queued": 0,
        "kv_hit_rates": [KVHitRate(definition="by_source", tier="host", unit="tokens", hits=0, queries=2,
                                   hit_rate=0.0)]})
    rows = [SimResult(request_id=i, ttft_us=0.0 if i % 2 else 1e-7 * i, e2e_us=2.5e16 + i, input_tokens=0,
                      output_tokens=i, slo_class="" if i % 3 else "b\u2028", model="m",
                      cached_tokens=None if i % 4 else i, cached_tokens_by_source={"host": i, "device": 0} if i % 5 else None)
            for i in range(96)]
    for indent in ("", "    "):
        assert columns_json(Columns.from_records(SimResult, rows), indent) == go_json(to_go(rows), indent)
        for m in (metrics, *metrics.kv_hit_rates):
            assert go_json(m, indent) == go_json(to_go(m), indent)
    assert sim_results_text(rows[::-1]) == go_json(to_go(rows))  # sorted by request id


def test_metrics_output_read_without_its_request_rows() -> None:
    whole = load_metrics_output(BLIS / "simagg.json")
    assert whole.requests  # the sample has per-request rows
    aggregates = load_metrics_output(BLIS / "simagg.json", requests=False)
    assert aggregates.requests == []
    assert aggregates == whole.model_copy(update={"requests": []})


def test_the_streaming_readers_read_what_the_whole_text_holds(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 7 characters cut every number, string and key somewhere: the rows read a block at
    a time are the ones the whole text holds, and a file with some rows lacking a field, or a map,
    keeps them as they were."""
    from blis_sim.formats import _json
    from blis_sim.formats.results import read_sim_columns

    whole = [SimResult.model_validate(r) for r in json.loads((BLIS / "sim.json").read_text())]
    whole_metrics = MetricsOutput.model_validate(
        {k: v for k, v in json.loads((BLIS / "simagg.json").read_text()).items() if k != "requests"})
    mixed = [SimResult(request_id=i, ttft_us=1.5, e2e_us=3.0, input_tokens=2, output_tokens=1,
                       cached_tokens=None if i % 3 else i, slo_class="" if i % 2 else "batch",
                       cached_tokens_by_source={"host": i} if i % 5 else None) for i in range(20_000)]
    write_sim_results(mixed, tmp_path / "mixed.json")
    monkeypatch.setattr(_json, "_STREAM_CHARS", 7)
    assert load_sim_results(BLIS / "sim.json") == whole
    assert load_metrics_output(BLIS / "simagg.json", requests=False) == whole_metrics
    assert read_sim_columns(tmp_path / "mixed.json").records() == mixed


@pytest.mark.parametrize("text,where", [
    ('[{"request_id": 1, "request_id": 2}]', "sim.json:1"),
    ('[\n{"request_id": 1, "ttft_us": 1, "e2e_us": 1, "input_tokens": 1, "output_tokens": 1},\n]', "sim.json:3"),
    ('[\n{"request_id": 1, "ttft_us": NaN}]', "sim.json:2"),
    ('[] []', "sim.json:1"),
])
def test_a_file_the_stream_does_not_take_is_reported_from_the_whole_text(tmp_path: Path, text: str,
                                                                          where: str) -> None:
    from blis_sim.errors import FormatError

    (tmp_path / "sim.json").write_text(text)
    with pytest.raises(FormatError) as exc:
        load_sim_results(tmp_path / "sim.json")
    assert where in str(exc.value) and "invalid JSON" in str(exc.value)


def test_aggregates_only_still_reject_what_the_whole_file_rejects(tmp_path: Path) -> None:
    from blis_sim.errors import FormatError

    for text, where in (('{"completed_requests": 1,\n "completed_requests": 2}', "simagg.json:2"),
                        ('{"requests": [{"a": 1, "a": 2}]}', "simagg.json:1"),
                        ('{"requests": [],\n "cache_hit_rate": 2}', "simagg.json:2")):
        (tmp_path / "simagg.json").write_text(text)
        with pytest.raises(FormatError) as exc:
            load_metrics_output(tmp_path / "simagg.json", requests=False)
        assert where in str(exc.value)
