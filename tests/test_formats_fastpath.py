"""The fast paths of the result writers and the trace reader give exactly what the general paths give.

Writers: :class:`~blis_sim.formats.results.Columns` written from numpy arrays against ``go_json`` of the
same rows as objects (awkward floats, huge ints, strings needing escapes, omitted fields, chunk
boundaries), and the engine's ``write_outputs`` against writing ``results`` / ``metrics()``.
Reader: the column-wise CSV path against the csv-module row path (records, types, error messages).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_sim.errors import FormatError
from blis_sim.formats import results as R
from blis_sim.formats import trace_data as TD
from blis_sim.formats._go import GO_SPACE, json_float, json_floats, json_ints
from blis_sim.formats._io import csv_with_header
from blis_sim.formats.hitrate import KVHitRate
from blis_sim.formats.results import (Columns, IntMapColumn, MetricsOutput, RequestMetrics, SimResult,
                                      columns_json, go_json, metrics_output_text, sim_results_text,
                                      write_metrics_output, write_sim_results)
from blis_sim.formats.trace_columns import read_trace_data
from blis_sim.formats.trace_data import BASE_COLUMNS, TraceRecord
from blis_sim.formats.trace_header import TraceServerConfig

REPO = Path(__file__).resolve().parents[1]
BLIS = REPO / "samples" / "blis"
VLLM = REPO / "samples" / "vllm-cpu"

AWKWARD_FLOATS = [0.0, -0.0, 1e-5, -1e-5, 9.99e-5, 1e-4, 1.5e-4, 1e-6, 1e-7, 5e-324, -5e-324, 2.2250738585072014e-308,
                  1.0, 33037.0, 0.1, 1 / 3, 0.30000000000000004, 1e15, 9999999999999998.0, 1e16, -1e16, 1.5e16,
                  2.0**53, 2.0**53 + 2, 1e20, 1e21, -1e21, 1e22, 1.7976931348623157e308, 123456.789, 1234567.0]
AWKWARD_INTS = [0, 1, -1, 2**31, 2**53 + 1, 2**62, 2**63 - 1, -(2**63)]
AWKWARD_TEXT = ["", "plain", '<b>&"q"\\', "naïve ✓", "line\nbreak\ttab", "\u2028\u2029", "%s %d %%", "\x01\x1f"]


# ------------------------------------------------------------------------------------------ scalar columns


def test_float_column_equals_go_format_on_random_bit_patterns() -> None:
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**64 - 1, 60_000, dtype=np.uint64, endpoint=True).view(np.float64)
    values = np.concatenate([bits[np.isfinite(bits)], AWKWARD_FLOATS, np.negative(AWKWARD_FLOATS)])
    assert json_floats(values) == [json_float(v) for v in values.tolist()]


def test_float_column_equals_go_format_on_everyday_magnitudes() -> None:
    rng = np.random.default_rng(8)
    x = np.exp(rng.uniform(math.log(1e-8), math.log(1e23), 20_000)) * rng.choice([-1.0, 1.0], 20_000)
    values = np.concatenate([x, np.round(x), np.round(x, 3), x / 1e3, x / 1e6])
    assert json_floats(values) == [json_float(v) for v in values.tolist()]


def test_float_column_keeps_go_errors_and_takes_any_layout() -> None:
    with pytest.raises(ValueError, match="NaN"):
        json_floats(np.array([1.0, math.nan]))
    with pytest.raises(ValueError, match="Inf"):
        json_floats(np.array([math.inf]))
    strided = np.arange(10, dtype=np.float64)[::3] / 7  # not contiguous
    assert json_floats(strided) == [json_float(v) for v in strided.tolist()]
    assert json_floats(np.array([1, 2], dtype=np.float32)) == ["1", "2"]
    assert json_floats(np.zeros(0)) == []


def test_int_column() -> None:
    assert json_ints(np.array(AWKWARD_INTS, dtype=np.int64)) == [str(v) for v in AWKWARD_INTS]
    assert json_ints(np.array([2**64 - 1], dtype=np.uint64)) == [str(2**64 - 1)]
    assert json_ints(np.array([True, False])) == ["true", "false"]
    with pytest.raises(ValueError, match="integer"):
        json_ints(np.array([1.5]))


# ------------------------------------------------------------------------------------------ rows


def _sim_columns(rows: list[tuple], *, cached: bool, by_source: bool) -> Columns:
    n = len(rows)
    rid, ttft, e2e, inp, out, slo, model, itl, ct, src = (list(c) for c in zip(*rows)) if rows else [[]] * 10
    data: dict = {"request_id": np.array(rid, dtype=np.int64), "ttft_us": np.array(ttft, dtype=np.float64),
                  "e2e_us": np.array(e2e, dtype=np.float64), "input_tokens": np.array(inp, dtype=np.int64),
                  "output_tokens": np.array(out, dtype=np.int64), "slo_class": slo, "model": model,
                  "itl_mean_us": np.array(itl, dtype=np.float64)}
    if cached:
        data["cached_tokens"] = np.array(ct, dtype=np.int64)
    if by_source:
        data["cached_tokens_by_source"] = IntMapColumn(("device", "host", "disk"),
                                                       np.array(src, dtype=np.int64).reshape(n, 3))
    return Columns(SimResult, n, data)


_float = st.one_of(st.sampled_from(AWKWARD_FLOATS), st.floats(allow_nan=False, allow_infinity=False))
_int = st.one_of(st.sampled_from(AWKWARD_INTS), st.integers(-(2**63), 2**63 - 1))
_text = st.one_of(st.sampled_from(AWKWARD_TEXT), st.text(st.characters(blacklist_categories=("Cs",)), max_size=8))
_sim_row = st.tuples(st.integers(-5, 5) | _int, _float, _float, _int, _int, _text, _text, _float, _int,
                     st.tuples(_int, _int, _int))


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(_sim_row, max_size=12), cached=st.booleans(), by_source=st.booleans(),
       chunk=st.sampled_from([1, 3, 8192]))
def test_sim_result_columns_write_what_the_objects_write(rows: list[tuple], cached: bool, by_source: bool,
                                                         chunk: int) -> None:
    cols = _sim_columns(rows, cached=cached, by_source=by_source)
    expected = sim_results_text(cols.records())  # the general writer, sorted by request id (stable)
    old = R.CHUNK_ROWS
    R.CHUNK_ROWS = chunk
    try:
        assert sim_results_text(cols) == expected
    finally:
        R.CHUNK_ROWS = old


def test_sim_result_columns_on_every_awkward_value(tmp_path: Path) -> None:
    rows = []
    for k, f in enumerate(AWKWARD_FLOATS):
        text = AWKWARD_TEXT[k % len(AWKWARD_TEXT)]
        rows.append((AWKWARD_INTS[k % len(AWKWARD_INTS)] // 2 - k, f, abs(f), k, 2**62 + k, text, text[::-1], f * (k % 2),
                     k % 3, (k, 0, 2**40)))
    for cached in (False, True):
        cols = _sim_columns(rows, cached=cached, by_source=True)
        write_sim_results(cols, tmp_path / "fast.json")
        write_sim_results(cols.records(), tmp_path / "objects.json")
        assert (tmp_path / "fast.json").read_bytes() == (tmp_path / "objects.json").read_bytes()
    assert b'"\\u003cb\\u003e\\u0026\\"q\\"\\\\"' in (tmp_path / "fast.json").read_bytes()
    assert b'"ttft_us": -0,' in (tmp_path / "fast.json").read_bytes()


def _request_columns(rows: list[tuple]) -> Columns:
    n = len(rows)
    arrived, ttft, sched, slo, tenant, rounds, capped = (list(c) for c in zip(*rows)) if rows else [[]] * 7
    return Columns(RequestMetrics, n, {
        "arrived_at": np.array(arrived, dtype=np.float64), "request_id": [f"request_{k}" for k in range(n)],
        "num_prefill_tokens": np.arange(n, dtype=np.int64), "num_decode_tokens": np.ones(n, dtype=np.int64),
        "ttft_ms": np.array(ttft, dtype=np.float64), "itl_ms": np.zeros(n), "e2e_ms": np.array(ttft, dtype=np.float64)[::-1],
        "scheduling_delay_ms": np.array(sched, dtype=np.float64), "slo_class": slo, "tenant_id": tenant,
        "handled_by": "instance_0", "length_capped": np.array(capped, dtype=bool), "gateway_queue_delay_ms": 0.0,
        "round_index": np.array(rounds, dtype=np.int64)})


_request_row = st.tuples(_float, _float, _float, _text, _text, _int, st.booleans())


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(_request_row, max_size=10), chunk=st.sampled_from([2, 8192]),
       rates=st.booleans(), hit_rate=st.sampled_from([None, 0.0, 0.5]))
def test_metrics_with_request_columns_write_what_the_objects_write(rows: list[tuple], chunk: int, rates: bool,
                                                                   hit_rate: float | None) -> None:
    cols = _request_columns(rows)
    kv = [KVHitRate(definition="by_source", tier="<host>", unit="tokens", hits=1, queries=3, hit_rate=1 / 3)]
    metrics = MetricsOutput(completed_requests=len(rows), e2e_p99_ms=1e21, cache_hit_rate=hit_rate,
                            saturation={"b": [1.5, None], "a": "x"}, kv_hit_rates=kv if rates else None)
    expected = metrics_output_text(metrics.model_copy(update={"requests": cols.records()}))
    old = R.CHUNK_ROWS
    R.CHUNK_ROWS = chunk
    try:
        assert metrics_output_text(metrics, requests=cols) == expected
    finally:
        R.CHUNK_ROWS = old


def test_metrics_request_columns_are_checked() -> None:
    cols = _request_columns([(1.0, 2.0, 0.0, "", "", 0, False)])
    with pytest.raises(ValueError, match="not both"):
        metrics_output_text(MetricsOutput(requests=cols.records()), requests=cols)
    with pytest.raises(TypeError, match="RequestMetrics"):
        metrics_output_text(MetricsOutput(), requests=_sim_columns([], cached=False, by_source=False))
    one = _sim_columns([(1, 1.0, 2.0, 3, 4, "", "", 0.0, 0, (0, 0, 0))], cached=True, by_source=True)
    with pytest.raises(ValueError, match="has 2 rows, expected 1"):
        Columns(SimResult, 1, {**one.data, "ttft_us": np.zeros(2)})
    with pytest.raises(ValueError, match="no field"):
        Columns(SimResult, 1, {**one.data, "ttft": np.zeros(1)})
    with pytest.raises(ValueError, match="need request_id, e2e_us"):
        Columns(SimResult, 1, {k: v for k, v in one.data.items() if k not in ("request_id", "e2e_us")})
    # a list column of other values (objects written as columns) lays each value out on its own
    assert '"model": 3,' in columns_json(Columns(SimResult, 1, {**one.data, "model": [3]}))


def test_a_model_whose_first_field_may_be_omitted() -> None:
    # every TraceServerConfig field is omitempty: rows where the first one is absent take the general writer
    cols = Columns(TraceServerConfig, 4, {"type": ["vllm", "", "", "x"], "model": ["", "", "m", "m"],
                                          "tensor_parallel": np.array([0, 0, 0, 2]), "block_size": 16,
                                          "gpu_memory_utilization": np.array([0.0, 0.0, 0.0, 0.9])})
    assert columns_json(cols) == go_json(cols.records())
    nothing = Columns(TraceServerConfig, 2, {})
    assert columns_json(nothing) == go_json(nothing.records()) == "[\n  {},\n  {}\n]"
    hit_rates = Columns(KVHitRate, 2, {"definition": ["prefix_cache", "external"], "unit": "tokens",
                                       "hits": np.array([1, 2]), "queries": np.array([3, 4]),
                                       "hit_rate": np.array([1 / 3, 0.5])})
    assert columns_json(hit_rates, "  ") == go_json(hit_rates.records(), "  ")  # keep_none: "tier": null


def test_reference_samples_stay_byte_identical_through_columns(tmp_path: Path) -> None:
    """The reference's own files, turned into columns, are written back byte for byte."""
    results = R.load_sim_results(BLIS / "sim.json")
    cols = Columns(SimResult, len(results), {
        name: (np.array([getattr(r, name) for r in results]) if name not in ("slo_class", "model")
               else [getattr(r, name) for r in results])
        for name in ("request_id", "ttft_us", "e2e_us", "input_tokens", "output_tokens", "slo_class", "model",
                     "itl_mean_us")})
    write_sim_results(cols, tmp_path / "sim.json")
    assert (tmp_path / "sim.json").read_bytes() == (BLIS / "sim.json").read_bytes()
    metrics = R.load_metrics_output(BLIS / "simagg.json")
    reqs = metrics.requests
    fields = RequestMetrics.model_fields
    data = {}
    for name, f in fields.items():
        values = [getattr(r, name) for r in reqs]
        data[name] = values if f.annotation in (str, "str") else np.array(values)
    write_metrics_output(metrics.model_copy(update={"requests": []}), tmp_path / "simagg.json",
                         requests=Columns(RequestMetrics, len(reqs), data))
    assert (tmp_path / "simagg.json").read_bytes() == (BLIS / "simagg.json").read_bytes()


# ------------------------------------------------------------------------------------------ engine outputs


def _odd_trace():
    from blis_sim.formats import load_trace

    trace = load_trace(BLIS / "trace.yaml", BLIS / "trace.csv")
    odd = ["", "gold<1>", 'a&"b"\\', "naïve", "\u2028"]
    records = [r.model_copy(update={"slo_class": odd[i % 5], "model": odd[(i + 1) % 5], "tenant_id": odd[(i + 2) % 5],
                                    "session_id": odd[i % 3], "adapter": odd[(i + 3) % 5]})
               for i, r in enumerate(trace.records)]
    return trace.model_copy(update={"records": records})


@pytest.mark.parametrize("odd", [False, True])
def test_engine_write_outputs_equals_writing_the_objects(tmp_path: Path, odd: bool) -> None:
    from blis_sim.engine import EngineOptions, replay_outcome
    from blis_sim.formats import load_trace

    trace = _odd_trace() if odd else load_trace(BLIS / "trace.yaml", BLIS / "trace.csv")
    out = replay_outcome(trace, EngineOptions(model="qwen/qwen3-14b", num_gpu_blocks=200))
    shown = out.write_outputs(tmp_path / "fast-sim.json", tmp_path / "fast-agg.json")
    write_sim_results(out.results, tmp_path / "sim.json")
    write_metrics_output(out.metrics(), tmp_path / "agg.json")
    assert (tmp_path / "fast-sim.json").read_bytes() == (tmp_path / "sim.json").read_bytes()
    assert (tmp_path / "fast-agg.json").read_bytes() == (tmp_path / "agg.json").read_bytes()
    assert shown == out.metrics(include_requests=False)
    if odd:
        assert b"gold\\u003c1\\u003e" in (tmp_path / "fast-agg.json").read_bytes()


def test_run_write_outputs_equals_writing_the_objects(tmp_path: Path) -> None:
    from blis_sim.engine import EngineOptions, run_outcome
    from blis_sim.formats.workload import load_workload_spec

    out = run_outcome(load_workload_spec(BLIS / "workload.yaml"), EngineOptions(model="qwen/qwen3-14b",
                                                                                 num_gpu_blocks=300))
    out.write_outputs(tmp_path / "fast-sim.json", tmp_path / "fast-agg.json")
    write_sim_results(out.results, tmp_path / "sim.json")
    write_metrics_output(out.metrics(), tmp_path / "agg.json")
    assert (tmp_path / "fast-sim.json").read_bytes() == (tmp_path / "sim.json").read_bytes()
    assert (tmp_path / "fast-agg.json").read_bytes() == (tmp_path / "agg.json").read_bytes()


def test_engine_write_outputs_writes_only_what_is_asked(tmp_path: Path) -> None:
    from blis_sim.engine import EngineOptions, replay_outcome
    from blis_sim.formats import load_trace

    out = replay_outcome(load_trace(BLIS / "trace.yaml", BLIS / "trace.csv"), EngineOptions(model="qwen/qwen3-14b"))
    out.write_outputs(metrics_path=tmp_path / "agg.json")
    assert [p.name for p in tmp_path.iterdir()] == ["agg.json"]


# ------------------------------------------------------------------------------------------ trace reader


def _row_rules(path: Path) -> list[TraceRecord]:
    """The reference's rules applied one row at a time, each row's values validated by pydantic: the
    oracle the reader (a chunk of rows, a column at a time) must agree with, value for value and error
    for error."""
    file = str(path)
    header, rows = csv_with_header(path)
    pos = TD._column_positions(header)
    min_cols = len(pos)
    out = []
    for line, row in rows:
        if len(row) < min_cols:
            raise FormatError(f"CSV row has {len(row)} columns, expected at least {min_cols}", file=file, line=line)
        d = dict(TD._ROW_DEFAULTS)
        for col, i in sorted(pos.items(), key=lambda kv: kv[1]):
            if i >= len(row):
                continue
            v = row[i]
            if col == "think_time_us":
                v = v.strip(GO_SPACE)
                d[col] = TD._parse_cell(col, v, file, line) if v else 0
            elif col in TD._TRIMMED:
                d[col] = v.strip(GO_SPACE)
            else:
                d[col] = TD._parse_cell(col, v, file, line)
        if 0 < d["deadline_us"] < d["arrival_time_us"]:
            raise FormatError(f"parsing deadline_us: value {d['deadline_us']} precedes arrival_time_us "
                              f"{d['arrival_time_us']} (corrupt trace?)", file=file, line=line, field="deadline_us")
        out.append(TraceRecord.model_validate(d))
    return out


def _both(path: Path) -> tuple[object, object]:
    """(the reader's records or error text, the row rules' records or error text)."""
    def run(fn):
        try:
            recs = fn(path)
        except FormatError as exc:
            return str(exc)
        return [(r.__dict__, [type(v) for v in r.__dict__.values()]) for r in recs]
    return run(read_trace_data), run(_row_rules)


@pytest.mark.parametrize("sample", [BLIS / "trace.csv", VLLM / "trace.csv"])
def test_reader_samples_equal_the_row_rules(sample: Path) -> None:
    fast, rows = _both(sample)
    assert not isinstance(fast, str) and fast == rows


_CELLS = {
    "int": ["0", "7", "123456789012345678", "1234567890123456789", "99999999999999999999", "+5", "-3", " 1", "1 ",
            "", "1e3", "0x10", "\u0661", "1.0"],
    "bool": ["true", "false", "TRUE", "t", "0", "1", "yes", ""],
    "ratio": ["0", "0.5", "1", "1.0", "nan", "-0.5", "2", ""],
    "text": ["", "a", " padded ", "x y", "\u00e9", "ok", "error"],
}


def _kind(col: str) -> str:
    if col in TD._BOOLS:
        return "bool"
    if col == "reason_ratio":
        return "ratio"
    return "int" if col in TD._INTS else "text"


@st.composite
def _csv_file(draw: st.DrawFn) -> str:
    extra = draw(st.sampled_from([[], ["x_request_id", "adapter", "think_time_us"], ["mystery", "phase", "warmup"],
                                  ["cached_tokens", "first_byte_time_us", "first_content_time_us"]]))
    header = list(BASE_COLUMNS) + extra
    n = draw(st.integers(1, 14))
    good = draw(st.booleans())  # half well-formed files
    rows = []
    for i in range(n):
        row = []
        for col in header:
            kind = "text" if col == "mystery" else _kind(col)
            if good:
                cell = {"int": str(draw(st.sampled_from([0, 1, i, 10**6]))), "bool": draw(st.sampled_from(
                    ["true", "false"])), "ratio": "0", "text": draw(st.sampled_from(["", "a", "b"]))}[kind]
                if col == "deadline_us":
                    cell = draw(st.sampled_from(["0", "0", "1"]))
            else:
                cell = draw(st.sampled_from(_CELLS[kind]))
            row.append(cell)
        if not good and draw(st.integers(0, 9)) == 0:
            row = row[:draw(st.integers(0, len(row)))]  # a short row
        if not good and draw(st.integers(0, 9)) == 0:
            row.append("surplus")
        rows.append(",".join(row))
        if draw(st.integers(0, 6)) == 0:
            rows.append("")  # blank lines are skipped
    text = "\n".join([",".join(header)] + rows) + draw(st.sampled_from(["\n", "", "\n\n"]))
    if draw(st.integers(0, 9)) == 0:
        text = text.replace("\n", "\r\n")  # CRLF line ends
    return text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_csv_file(), chunk=st.sampled_from([1, 2, 5, 4096]))
def test_reader_equals_the_row_rules(tmp_path: Path, text: str, chunk: int) -> None:
    from blis_sim.formats import trace_columns as TC

    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8", newline="")
    old = TC.CHUNK_ROWS
    TC.CHUNK_ROWS = chunk
    try:
        got, rows = _both(path)
    finally:
        TC.CHUNK_ROWS = old
    assert got == rows


def test_well_formed_files_with_extra_columns_read_as_the_row_rules(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from blis_sim.formats import trace_columns as TC

    src = (BLIS / "trace.csv").read_text().splitlines()
    mixed = [src[0] + ",mystery,phase"] + [line + f",{i % 3},p{i % 2}" for i, line in enumerate(src[1:])]
    mixed.insert(50, "")
    (tmp_path / "t.csv").write_text("\n".join(mixed) + "\n")
    expected = _row_rules(tmp_path / "t.csv")
    sample = _row_rules(BLIS / "trace.csv")
    monkeypatch.setattr(TC, "CHUNK_ROWS", 64)
    assert read_trace_data(tmp_path / "t.csv") == expected
    assert read_trace_data(BLIS / "trace.csv") == sample


def test_reader_errors_name_the_line_and_column_in_a_big_file(tmp_path: Path) -> None:
    header = ",".join(BASE_COLUMNS)
    row = ["0"] * 27
    row[8], row[24] = "false", "ok"
    lines = [header] + [",".join([str(i)] + row[1:]) for i in range(10_000)]
    lines[7001] = lines[7001].replace(",false,", ",maybe,", 1)
    lines[9001] = lines[9001].replace(",ok,", ",ok,x,", 1)  # would be a later error: the first one is reported
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(FormatError) as exc:
        read_trace_data(tmp_path / "t.csv")
    assert str(exc.value).startswith(f"{tmp_path / 't.csv'}:7002: field 'streaming': parsing streaming \"maybe\"")
    lines[7001] = lines[7002]
    deadline = row[:]
    deadline[17], deadline[19] = "5", "9"
    lines[8000] = ",".join(["1"] + deadline[1:])
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(FormatError, match=r"t.csv:8001: field 'deadline_us': parsing deadline_us: value 5 precedes"):
        read_trace_data(tmp_path / "t.csv")


def test_reader_handles_quotes_bad_bytes_long_fields_and_no_header(tmp_path: Path) -> None:
    sample = (BLIS / "trace.csv").read_text()
    quoted = sample.replace(",ok,", ',"ok",', 1)
    (tmp_path / "q.csv").write_text(quoted)
    assert read_trace_data(tmp_path / "q.csv") == read_trace_data(BLIS / "trace.csv")
    (tmp_path / "bad.csv").write_bytes(sample.encode()[:300] + b"\xff" + sample.encode()[300:])
    with pytest.raises(FormatError, match="not UTF-8"):
        read_trace_data(tmp_path / "bad.csv")
    with pytest.raises(FormatError, match="file not found"):
        read_trace_data(tmp_path / "missing.csv")
    long = sample.replace(",ok,", ",ok," + "x" * 140_000, 1)  # over the csv module's field limit
    (tmp_path / "long.csv").write_text(long)
    with pytest.raises(FormatError, match="malformed CSV: field larger than field limit"):
        read_trace_data(tmp_path / "long.csv")
    (tmp_path / "blank.csv").write_text("\n\n")
    with pytest.raises(FormatError, match="reading CSV header: EOF"):
        read_trace_data(tmp_path / "blank.csv")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_csv_file(), chunk=st.sampled_from([3, 200, 4096]))
def test_column_reader_equals_the_row_rules(tmp_path: Path, text: str, chunk: int) -> None:
    """``read_trace_columns`` (the replay's reader) holds the records the row rules give — values
    and types — or the same located error, whatever the chunk size."""
    from blis_sim.formats import trace_columns as TC

    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8", newline="")

    def read(fn):  # type: ignore[no-untyped-def]
        try:
            return [[(k, type(v), v) for k, v in r.__dict__.items()] for r in fn(path)]
        except FormatError as exc:
            return str(exc)

    old = TC.CHUNK_ROWS
    TC.CHUNK_ROWS = chunk
    try:
        got = read(lambda p: TC.read_trace_columns(p).records())
    finally:
        TC.CHUNK_ROWS = old
    assert got == read(_row_rules)
