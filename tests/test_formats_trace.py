"""TraceV2 header + data CSV + ITL: the reference's samples, byte-compatibility, round trips, pinned behaviours."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_sim.errors import FormatError
from blis_sim.formats import (
    ITLRecord,
    KVGeometry,
    KVHitRate,
    ObservedKVMetrics,
    PhaseInfo,
    PytestBlisHeader,
    ScrapeInfo,
    TierIO,
    Trace,
    TraceHeader,
    TraceNetworkConfig,
    TraceRecord,
    TraceServerConfig,
    itl_by_request,
    load_trace,
    read_itl,
    read_trace_data,
    read_trace_header,
    write_itl,
    write_trace,
)
from blis_sim.formats.trace import BASE_COLUMNS, columns_for, data_text, default_itl_path, header_text

REPO = Path(__file__).resolve().parents[1]
BLIS = REPO / "samples" / "blis"
VLLM = REPO / "samples" / "vllm-cpu"


def test_reference_samples_load() -> None:
    trace = load_trace(BLIS / "trace.yaml", BLIS / "trace.csv")
    assert trace.header.mode == "generated" and trace.header.workload_seed == 42
    assert trace.header.kv_offload is not None and trace.header.kv_offload.per_block_bytes == 2621440
    assert trace.header.kv_offload.secondary_tiers[0].device_class == "nvme_gen4"
    assert trace.header.observed_kv_metrics is None
    assert len(trace.records) == 200
    r0 = trace.records[0]
    assert (r0.request_id, r0.client_id, r0.prefix_group, r0.prefix_length) == (0, "g0", "sys-0", 1024)
    assert r0.ttft_us == 123847 - 90863 and r0.e2e_us == 1694456 - 90863

    observed = read_trace_header(BLIS / "trace-observed.yaml")
    obs = observed.observed_kv_metrics
    assert obs is not None and (obs.source, obs.hit_rate, obs.block_hits, obs.block_queries) == (
        "tiered", 0.68, 68000, 100000)
    # a plain all-digit scalar is a string field's text (yaml.v3 semantics), not the int 0
    assert obs.vllm_commit == "0" * 40


def test_real_vllm_observe_trace_loads() -> None:
    trace = load_trace(VLLM / "trace.yaml", VLLM / "trace.csv")
    assert trace.header.mode == "real" and trace.header.created_at == "2026-11-29T17:09:36Z"
    assert trace.header.server == TraceServerConfig(type="vllm", model="tiny-llama")
    assert trace.header.network == TraceNetworkConfig()
    assert len(trace.records) == 80 and all(r.x_request_id for r in trace.records)
    assert trace.records[1].request_id == 2  # completion order kept


@pytest.mark.parametrize(("header", "data"), [("blis/trace.yaml", "blis/trace.csv"),
                                               ("vllm-cpu/trace.yaml", "vllm-cpu/trace.csv")])
def test_blis_compatible_write_is_byte_identical(tmp_path: Path, header: str, data: str) -> None:
    trace = load_trace(REPO / "samples" / header, REPO / "samples" / data)
    write_trace(trace, tmp_path / "t.yaml", tmp_path / "t.csv", blis_compatible=True)
    assert (tmp_path / "t.yaml").read_bytes() == (REPO / "samples" / header).read_bytes()
    assert (tmp_path / "t.csv").read_bytes() == (REPO / "samples" / data).read_bytes()


def test_observed_sample_round_trips(tmp_path: Path) -> None:
    # trace-observed.yaml's block is hand-written: yaml.v3 would quote the all-digit commit, so the
    # file is not byte-identical, but it parses back identical.
    trace = load_trace(BLIS / "trace-observed.yaml", BLIS / "trace.csv")
    write_trace(trace, tmp_path / "t.yaml", tmp_path / "t.csv")
    assert load_trace(tmp_path / "t.yaml", tmp_path / "t.csv") == trace
    assert 'vllm_commit: "0000000000000000000000000000000000000000"' in (tmp_path / "t.yaml").read_text()


def _rich_header() -> TraceHeader:
    return TraceHeader(
        mode="real", created_at="2026-08-20T15:14:23Z", warm_up_requests=2, workload_seed=7,
        workload_spec="spec.yaml", server=TraceServerConfig(type="vllm", model="m", block_size=32),
        network=TraceNetworkConfig(measured_rtt_ms=1.5),
        observed_kv_metrics=ObservedKVMetrics(source="gpu-prefix-cache-fallback", hit_rate=0.0,
                                              block_queries=500),
        pytest_blis=PytestBlisHeader(
            tool_version="0.1.0", vllm_version="0.32.0", server_url="http://127.0.0.1:8000",
            kv_geometry=KVGeometry(block_size=32, num_gpu_blocks=512),
            kv_hit_rates=[
                KVHitRate(definition="prefix_cache", unit="tokens", hits=29696, queries=48579,
                          hit_rate=29696 / 48579, metric="vllm:prefix_cache_hits_total"),
                KVHitRate(definition="by_source", tier="device", unit="tokens", hits=10, queries=20, hit_rate=0.5),
                KVHitRate(definition="tiered", tier="1:fs", unit="chunks", hits=0, queries=3, hit_rate=0.0),
            ],
            tier_io=[TierIO(tier="1:fs", read_bytes=1 << 20, read_time_s=0.25)],
            scrape=ScrapeInfo(metrics_url="http://127.0.0.1:8000/metrics", start_time_us=1, end_time_us=2,
                              settle_s=0.5, families=["vllm:prefix_cache_hits"], warnings=["no tiered counters"]),
            phases=[PhaseInfo(name="seed", warmup=True, measured=False, requests=3), PhaseInfo(name="repeat")],
            partial=True, partial_reason="interrupted",
        ),
    )


def test_header_layout_matches_the_reference_writer() -> None:
    text = header_text(_rich_header(), blis_compatible=True)
    assert text.startswith('trace_version: 3\ntime_unit: us\ncreated_at: "2026-08-20T15:14:23Z"\nmode: real\n')
    assert "server:\n    type: vllm\n    model: m\n    block_size: 32\n" in text
    assert "network:\n    measured_rtt_ms: 1.5\n" in text
    assert "    hit_rate: 0\n" in text  # zero written explicitly (pinned by the reference's tests)
    assert "    block_queries: 500\n" in text
    assert "pytest_blis" not in text and "kv_offload" not in text


def test_absent_blocks_are_absent() -> None:
    text = header_text(TraceHeader(mode="generated", time_unit="microseconds"))
    assert text == "trace_version: 3\ntime_unit: microseconds\nmode: generated\nwarm_up_requests: 0\n"
    assert "observed_kv_metrics" not in text
    assert header_text(TraceHeader(mode="real", network=TraceNetworkConfig())).endswith("network: {}\n")


def test_pytest_blis_block_and_trailing_columns_round_trip(tmp_path: Path) -> None:
    records = [
        TraceRecord(request_id=0, client_id="c", slo_class="standard", vllm_priority=1, streaming=True,
                    input_tokens=10, output_tokens=5, reason_ratio=0.25, send_time_us=100, first_chunk_time_us=150,
                    last_chunk_time_us=300, num_chunks=6, x_request_id="abc", phase="seed", warmup=True,
                    cached_tokens=0, first_byte_time_us=140, first_content_time_us=151,
                    error_message='HTTP 500: "boom", again\nline 2', finish_reason="length"),
        TraceRecord(request_id=1, client_id=" lead", slo_target_us=5000, deadline_us=9, adapter="lora-a",
                    think_time_us=3, cached_tokens=-1, status="error"),
    ]
    trace = Trace(header=_rich_header(), records=records)
    write_trace(trace, tmp_path / "t.yaml", tmp_path / "t.csv")
    back = load_trace(tmp_path / "t.yaml", tmp_path / "t.csv")
    assert back == trace
    header_row = (tmp_path / "t.csv").read_text().splitlines()[0].split(",")
    assert header_row[4] == "vllm_priority" and header_row[header_row.index("deadline_us") + 1] == "slo_target_us"
    assert header_row[-8:] == ["x_request_id", "adapter", "think_time_us", "phase", "warmup", "cached_tokens",
                               "first_byte_time_us", "first_content_time_us"]
    # blis_compatible drops only our header block; the data stays whole (BLIS tolerates trailing columns)
    write_trace(trace, tmp_path / "b.yaml", tmp_path / "b.csv", blis_compatible=True)
    assert load_trace(tmp_path / "b.yaml", tmp_path / "b.csv") == Trace(
        header=trace.header.model_copy(update={"pytest_blis": None}), records=records)


def test_optional_columns_are_conditional() -> None:
    plain = [TraceRecord(request_id=0, slo_class="standard")]
    assert "vllm_priority" not in columns_for(plain, "generated")
    assert "vllm_priority" in columns_for(plain, "real")  # real + an slo_class, even with priority 0
    assert columns_for([TraceRecord(request_id=0)], "real") == list(columns_for([], "real"))
    assert len(columns_for([TraceRecord(request_id=0)], "real")) == 27


def test_go_csv_quoting_and_bools() -> None:
    rec = TraceRecord(request_id=3, client_id="a,b", tenant_id='say "hi"', session_id=" x", streaming=True)
    line = data_text([rec], mode="generated").splitlines()[1]
    assert line.startswith('3,"a,b","say ""hi""",," x",0,,0,true,')


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True"])
def test_go_parsebool_true_forms(tmp_path: Path, text: str) -> None:
    path = tmp_path / "t.csv"
    row = ["0"] * 27
    row[8], row[24] = text, "ok"
    path.write_text(",".join(["h"] * 27) + "\n" + ",".join(row) + "\n")
    assert read_trace_data(path)[0].streaming is True


def test_extra_trailing_columns_tolerated_and_blank_lines_skipped(tmp_path: Path) -> None:
    src = (BLIS / "trace.csv").read_text().splitlines()
    lines = [src[0] + ",mystery"] + [src[1] + ",42", "", src[2]]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    recs = read_trace_data(tmp_path / "t.csv")
    assert [r.request_id for r in recs] == [0, 1]


def test_itl_round_trip(tmp_path: Path) -> None:
    rows = [ITLRecord(request_id=5, chunk_index=1, timestamp_us=20), ITLRecord(request_id=5, chunk_index=0,
                                                                              timestamp_us=10),
            ITLRecord(request_id=6, chunk_index=0, timestamp_us=3)]
    path = default_itl_path(tmp_path / "trace.csv")
    assert path.name == "trace.itl.csv"
    write_itl(rows, path)
    assert path.read_text() == "request_id,chunk_index,timestamp_us\n5,1,20\n5,0,10\n6,0,3\n"
    back = read_itl(path)
    assert back == rows
    assert itl_by_request(back) == {5: [10, 20], 6: [3]}


_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
_i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_nn = st.integers(min_value=0, max_value=2**63 - 1)


@st.composite
def _records(draw: st.DrawFn) -> TraceRecord:
    arrival = draw(st.integers(min_value=0, max_value=10**12))
    return TraceRecord(
        request_id=draw(_i64), client_id=draw(_text), tenant_id=draw(_text), slo_class=draw(_text),
        vllm_priority=draw(st.sampled_from([0, 0, 1, 7])), session_id=draw(_text), round_index=draw(_i64),
        prefix_group=draw(_text), prefix_length=draw(_nn), streaming=draw(st.booleans()),
        input_tokens=draw(_nn), output_tokens=draw(_nn), reason_ratio=draw(st.floats(0.0, 1.0)),
        model=draw(_text), deadline_us=draw(st.sampled_from([0, arrival, arrival + 5])),
        slo_target_us=draw(st.sampled_from([0, 0, 12])), server_input_tokens=draw(_nn), arrival_time_us=arrival,
        send_time_us=draw(_i64), first_chunk_time_us=draw(_i64), last_chunk_time_us=draw(_i64),
        num_chunks=draw(_nn), status=draw(st.sampled_from(["ok", "error", "timeout"])),
        error_message=draw(_text), finish_reason=draw(_text), x_request_id=draw(_text), adapter=draw(_text),
        think_time_us=draw(st.sampled_from([0, 5])), phase=draw(_text), warmup=draw(st.booleans()),
        cached_tokens=draw(st.integers(min_value=-1, max_value=10**6)), first_byte_time_us=draw(_i64),
        first_content_time_us=draw(_i64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_records(), max_size=5), mode=st.sampled_from(["real", "generated", "replayed"]))
def test_data_round_trip_is_lossless(tmp_path: Path, records: list[TraceRecord], mode: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(data_text(records, mode=mode), newline="")
    expected = records if mode == "real" else [r.model_copy(update={"x_request_id": ""}) for r in records]
    assert read_trace_data(path) == expected


def test_files_are_replaced_atomically(tmp_path: Path) -> None:
    trace = load_trace(BLIS / "trace.yaml", BLIS / "trace.csv")
    write_trace(trace, tmp_path / "t.yaml", tmp_path / "t.csv")
    write_trace(trace, tmp_path / "t.yaml", tmp_path / "t.csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.yaml"]  # no temp files left behind


def test_written_files_get_the_mode_open_would_give(tmp_path: Path) -> None:
    """The temp file behind an atomic write is private; the file it becomes is not (umask applies)."""
    import os
    import stat

    trace = load_trace(BLIS / "trace.yaml", BLIS / "trace.csv")
    old = os.umask(0o027)
    try:
        write_trace(trace, tmp_path / "t.yaml", tmp_path / "t.csv")
    finally:
        os.umask(old)
    for name in ("t.yaml", "t.csv"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o640


def test_kv_hit_rate_entry_rules() -> None:
    with pytest.raises(ValueError, match="exceed"):
        KVHitRate(definition="prefix_cache", unit="tokens", hits=3, queries=2, hit_rate=1.0)
    with pytest.raises(ValueError, match="counts chunks"):
        KVHitRate(definition="tiered", unit="tokens", hits=0, queries=2, hit_rate=0.0)
    with pytest.raises(ValueError, match="needs a tier"):
        KVHitRate(definition="by_source", unit="tokens", hits=0, queries=2, hit_rate=0.0)
    with pytest.raises(ValueError, match="has no tier"):
        KVHitRate(definition="external", tier="host", unit="tokens", hits=0, queries=2, hit_rate=0.0)


def test_record_model_mirrors_reader_rules() -> None:
    with pytest.raises(ValueError, match="precedes"):
        TraceRecord(request_id=0, arrival_time_us=10, deadline_us=5)
    with pytest.raises(ValueError):
        TraceRecord(request_id=0, input_tokens=-1)
    with pytest.raises(ValueError):
        TraceRecord(request_id="0")  # type: ignore[arg-type]  (strict: no str -> int coercion)


def test_empty_data_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("")
    with pytest.raises(FormatError, match="reading CSV header: EOF"):
        read_trace_data(tmp_path / "t.csv")


def _one_row(tmp_path: Path, column: int, cell: str) -> Path:
    row = ["0"] * 27
    row[8], row[24] = "false", "ok"
    row[column] = cell
    path = tmp_path / "t.csv"
    path.write_text(",".join(BASE) + "\n" + ",".join(row) + "\n")
    return path


BASE = BASE_COLUMNS


@pytest.mark.parametrize("cell", [" 12", "12 ", "1_000", "\u0661\u0662", "0x10", "1e3", "", "1.0"])
def test_integers_parse_like_go_parseint(tmp_path: Path, cell: str) -> None:
    with pytest.raises(FormatError, match="field 'input_tokens'"):
        read_trace_data(_one_row(tmp_path, 9, cell))


def test_integer_sign_forms(tmp_path: Path) -> None:
    assert read_trace_data(_one_row(tmp_path, 9, "+12"))[0].input_tokens == 12
    assert read_trace_data(_one_row(tmp_path, 20, "-5"))[0].send_time_us == -5  # timestamps may be negative


@pytest.mark.parametrize("cell", ["false", "nan", "-0.5", "2"])
def test_reason_ratio_rejects(tmp_path: Path, cell: str) -> None:
    with pytest.raises(FormatError, match="field 'reason_ratio'"):
        read_trace_data(_one_row(tmp_path, 15, cell))


_any_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(_any_text, min_size=6, max_size=6), rtt=st.floats(0, 1e9),
       rate=st.floats(0.0, 1.0), coeff=st.floats(allow_nan=False, allow_infinity=False))
def test_header_round_trip_with_arbitrary_strings_and_floats(tmp_path: Path, texts: list[str], rtt: float,
                                                             rate: float, coeff: float) -> None:
    from blis_sim.formats import LatencyModelInfo

    header = TraceHeader(
        mode="real", created_at=texts[0], workload_spec=texts[1], server=TraceServerConfig(type="vllm",
                                                                                            model=texts[2]),
        network=TraceNetworkConfig(measured_rtt_ms=rtt),
        observed_kv_metrics=ObservedKVMetrics(source="tiered", hit_rate=rate, vllm_commit=texts[3]),
        pytest_blis=PytestBlisHeader(warnings=[texts[4]], latency_model=LatencyModelInfo(
            name=texts[5] or "m", coefficients={texts[5]: coeff})))
    path = tmp_path / "h.yaml"
    path.write_text(header_text(header), encoding="utf-8")
    assert read_trace_header(path) == header


def test_reference_read_rules_for_trailing_columns(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    row = ["0"] * 27
    row[8], row[24], row[25], row[26] = "false", "ok", "  HTTP 500: x \t", " stop "
    path.write_text(",".join(BASE) + ",x_request_id,adapter,think_time_us\n" + ",".join(row) + ", id-1 , lora , \n")
    rec = read_trace_data(path)[0]
    # strings.TrimSpace on error_message, finish_reason, x_request_id, adapter; an empty think time is 0
    assert (rec.error_message, rec.finish_reason, rec.x_request_id, rec.adapter, rec.think_time_us) == (
        "HTTP 500: x", "stop", "id-1", "lora", 0)
    # every optional column the header declares counts towards the minimum row length
    path.write_text(",".join(BASE) + ",x_request_id\n" + ",".join(row) + "\n")
    with pytest.raises(FormatError, match="CSV row has 27 columns, expected at least 28"):
        read_trace_data(path)


def test_model_trims_like_the_reader_and_x_request_id_needs_mode_real() -> None:
    rec = TraceRecord(request_id=1, error_message=" boom\n", x_request_id="id")
    assert rec.error_message == "boom"
    assert "x_request_id" in columns_for([rec], "real") and "x_request_id" not in columns_for([rec], "replayed")


REFERENCE_OBSERVE_HEADER = """\
trace_version: 3
time_unit: us
created_at: "2026-08-20T15:14:23Z"
mode: real
warm_up_requests: 0
workload_seed: 42
workload_spec: sweep.yaml
server:
    type: vllm
    model: qwen/qwen3-14b
network: {}
observed_kv_metrics:
    source: tiered
    hit_rate: 0.734
    block_hits: 7340
    block_queries: 10000
    read_time_total: 12.5
    write_time_total: 3.25
    vllm_commit: 63a9a5010a6d1539c52957646ef9d6bbcf7a4deb
"""


def test_reference_observe_header_example_round_trips_byte_identical(tmp_path: Path) -> None:
    # the reference's example header (docs/reference-formats.md §1.1): its observe with --scrape-kv-metrics
    (tmp_path / "h.yaml").write_text(REFERENCE_OBSERVE_HEADER)
    header = read_trace_header(tmp_path / "h.yaml")
    obs = header.observed_kv_metrics
    assert obs == ObservedKVMetrics(source="tiered", hit_rate=0.734, block_hits=7340, block_queries=10000,
                                    read_time_total=12.5, write_time_total=3.25,
                                    vllm_commit="63a9a5010a6d1539c52957646ef9d6bbcf7a4deb")
    assert header_text(header) == REFERENCE_OBSERVE_HEADER


def test_negative_think_time_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    row = ["0"] * 27
    row[8], row[24] = "false", "ok"
    path.write_text(",".join(BASE) + ",think_time_us\n" + ",".join(row) + ",-3\n")
    with pytest.raises(FormatError, match=r"t.csv:2: field 'think_time_us': parsing think_time_us: negative value -3"):
        read_trace_data(path)


def test_records_read_are_frozen_and_copy_safely(tmp_path: Path) -> None:
    records = read_trace_data(BLIS / "trace.csv")
    a, b = records[0], records[1]
    assert a.model_fields_set == b.model_fields_set == set(TraceRecord.model_fields)
    changed = a.model_copy(update={"client_id": "other"})
    assert changed.client_id == "other" and a.client_id == "g0" and b.model_fields_set == set(TraceRecord.model_fields)
    with pytest.raises(ValueError):
        a.client_id = "x"  # type: ignore[misc]  (frozen: nothing can add to the shared set)
    assert records[0].status is records[1].status  # repeated strings are one object
