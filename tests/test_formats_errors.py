"""Bad input across the formats: each case is a FormatError whose message names the file, field and line.

Every case writes a file, reads it with the public reader, and checks the exact location prefix
``<file>:<line>: field '<field>'`` (JSON: the field path and the line of that field, or of its nearest
ancestor; syntax errors the line ``json`` reports).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from blis_sim.errors import FormatError
from blis_sim.formats import load_metrics_output, load_sim_results, read_itl, read_trace_data, read_trace_header

BLIS = Path(__file__).resolve().parents[1] / "samples" / "blis"
HEADER = (BLIS / "trace-observed.yaml").read_text()
CSV_LINES = (BLIS / "trace.csv").read_text().splitlines(keepends=True)
SIM = json.loads((BLIS / "sim.json").read_text())


def _csv_with(row_index: int, column: int, value: str) -> str:
    """The sample CSV with one cell of data row ``row_index`` (0-based) replaced."""
    lines = list(CSV_LINES)
    cells = lines[row_index + 1].rstrip("\n").split(",")
    cells[column] = value
    lines[row_index + 1] = ",".join(cells) + "\n"
    return "".join(lines)


def _sim_with(index: int, **changes: Any) -> str:
    data = [dict(r) for r in SIM]
    data[index].update(changes)
    return json.dumps(data, indent=2)


# (id, file name, content, reader, expected location prefix, expected reason fragment)
CASES: list[tuple[str, str, str, Callable[[Path], Any], str, str]] = [
    ("header-unknown-top-level-key", "h.yaml", HEADER.replace("trace_version: 3", "trace_version: 99\nbogus_key: 1"),
     read_trace_header, "h.yaml:2: field 'bogus_key'", "unknown key 'bogus_key'"),
    ("header-unknown-observed-subkey", "h.yaml", HEADER + "    bogus: 1\n", read_trace_header,
     "h.yaml:36: field 'observed_kv_metrics.bogus'", "unknown key"),
    ("header-unknown-kv-offload-subkey", "h.yaml", HEADER.replace("    block_size: 16\n", "    blok_size: 16\n"),
     read_trace_header, "h.yaml:9: field 'kv_offload.blok_size'", "unknown key"),
    ("header-duplicate-key", "h.yaml", HEADER.replace("mode: generated\n", "mode: generated\nmode: real\n"),
     read_trace_header, "h.yaml:4: field 'mode'", "duplicate key 'mode'"),
    ("header-wrong-type", "h.yaml", HEADER.replace("warm_up_requests: 0", "warm_up_requests: three"),
     read_trace_header, "h.yaml:4: field 'warm_up_requests'", "valid integer"),
    ("header-hit-rate-out-of-range", "h.yaml", HEADER.replace("hit_rate: 0.68", "hit_rate: 1.5"),
     read_trace_header, "h.yaml:32: field 'observed_kv_metrics.hit_rate'", "less than or equal to 1"),
    ("header-hits-exceed-queries", "h.yaml", HEADER.replace("block_hits: 68000", "block_hits: 680000"),
     read_trace_header, "h.yaml:30: field 'observed_kv_metrics'", "exceed block_queries"),
    ("header-unknown-mode", "h.yaml", HEADER.replace("mode: generated", "mode: simulated"),
     read_trace_header, "h.yaml:3: field 'mode'", "'real', 'generated' or 'replayed'"),
    ("header-negative-tier-threads", "h.yaml", HEADER.replace("n_read_threads: 16", "n_read_threads: -1"),
     read_trace_header, "h.yaml:18: field 'kv_offload.secondary_tiers.0.n_read_threads'", "greater than or equal"),
    ("header-bad-yaml", "h.yaml", HEADER.replace("mode: generated", "mode: [generated"), read_trace_header,
     "h.yaml:", "invalid YAML"),
    ("csv-non-integer", "t.csv", _csv_with(2, 9, "12x"), read_trace_data,
     "t.csv:4: field 'input_tokens'", 'parsing input_tokens "12x": strconv.Atoi: parsing "12x": invalid syntax'),
    ("csv-integer-out-of-range", "t.csv", _csv_with(0, 20, "99999999999999999999"), read_trace_data,
     "t.csv:2: field 'send_time_us'", 'strconv.ParseInt: parsing "99999999999999999999": value out of range'),
    ("csv-negative-tokens", "t.csv", _csv_with(5, 10, "-3"), read_trace_data,
     "t.csv:7: field 'output_tokens'", "parsing output_tokens: negative value -3 not allowed"),
    ("csv-negative-deadline", "t.csv", _csv_with(0, 17, "-1"), read_trace_data,
     "t.csv:2: field 'deadline_us'", "(use 0 for no timeout)"),
    ("csv-deadline-before-arrival", "t.csv", _csv_with(1, 17, "5"), read_trace_data,
     "t.csv:3: field 'deadline_us'", "value 5 precedes arrival_time_us 150330 (corrupt trace?)"),
    ("csv-reason-ratio-out-of-range", "t.csv", _csv_with(3, 15, "1.5"), read_trace_data,
     "t.csv:5: field 'reason_ratio'", "must be in range [0.0, 1.0], got 1.5"),
    ("csv-bad-bool", "t.csv", _csv_with(0, 8, "yes"), read_trace_data,
     "t.csv:2: field 'streaming'", 'parsing streaming "yes": strconv.ParseBool: parsing "yes": invalid syntax'),
    ("csv-short-row", "t.csv", "".join(CSV_LINES[:3]) + "7,g0,,,\n", read_trace_data,
     "t.csv:4", "CSV row has 5 columns, expected at least 27"),
    ("csv-bad-quoting", "t.csv", "".join(CSV_LINES[:2]) + '1,"g0"x,,,\n', read_trace_data,
     "t.csv:3", "malformed CSV"),
    ("csv-negative-cached-tokens", "t.csv", CSV_LINES[0].rstrip("\n") + ",cached_tokens\n"
     + CSV_LINES[1].rstrip("\n") + ",-2\n", read_trace_data, "t.csv:2: field 'cached_tokens'", "not a token count"),
    ("json-wrong-type", "sim.json", _sim_with(3, ttft_us="fast"), load_sim_results,
     "sim.json:28: field '[3].ttft_us'", "valid number"),
    ("json-unknown-key", "sim.json", _sim_with(7, ttft_ms=1.0), load_sim_results,
     "sim.json:65: field '[7].ttft_ms'", "unknown key 'ttft_ms'"),
    ("json-float-for-integer", "sim.json", _sim_with(0, input_tokens=12.5), load_sim_results,
     "sim.json:6: field '[0].input_tokens'", "valid integer"),
    ("json-negative", "sim.json", _sim_with(2, output_tokens=-1), load_sim_results,
     "sim.json:23: field '[2].output_tokens'", "greater than or equal to 0"),
    ("json-syntax", "sim.json", (BLIS / "sim.json").read_text().replace('"ttft_us": 39779,', '"ttft_us": 39779'),
     load_sim_results, "sim.json:13", "invalid JSON"),
    ("json-duplicate-key", "agg.json", (BLIS / "simagg.json").read_text().replace(
        '"still_queued": 0,', '"still_queued": 0,\n  "still_queued": 1,'), load_metrics_output,
     "agg.json:5: field 'still_queued'", "duplicate key 'still_queued'"),
    ("json-nan", "agg.json", (BLIS / "simagg.json").read_text().replace(
        '"cache_hit_rate": 0.6588455538221529', '"cache_hit_rate": NaN'), load_metrics_output, "agg.json",
     "NaN is not valid JSON"),
    ("json-hit-rate-out-of-range", "agg.json", (BLIS / "simagg.json").read_text().replace(
        '"cache_hit_rate": 0.6588455538221529', '"cache_hit_rate": 1.2'), load_metrics_output,
     "agg.json:26: field 'cache_hit_rate'", "less than or equal to 1"),
    ("json-nested-request-entry", "agg.json", (BLIS / "simagg.json").read_text().replace(
        '"requestID": "request_1"', '"requestID": 1'), load_metrics_output,
     "agg.json:45: field 'requests[1].requestID'", "valid string"),
    ("itl-negative", "t.itl.csv", "request_id,chunk_index,timestamp_us\n1,0,10\n1,1,-5\n", read_itl,
     "t.itl.csv:3: field 'timestamp_us'", "negative value -5 not allowed"),
    ("itl-bad-integer", "t.itl.csv", "request_id,chunk_index,timestamp_us\n1,0,10\n1,1,1e3\n", read_itl,
     "t.itl.csv:3: field 'timestamp_us'", "invalid syntax"),
]


@pytest.mark.parametrize(("name", "file", "content", "reader", "where", "reason"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_located(tmp_path: Path, name: str, file: str, content: str, reader: Callable[[Path], Any],
                              where: str, reason: str) -> None:
    path = tmp_path / file
    path.write_text(content)
    with pytest.raises(FormatError) as info:
        reader(path)
    message = str(info.value)
    assert message.startswith(str(tmp_path / where)), message
    assert reason in message, message
    assert "\n" not in message  # one line, for the CLI


def test_at_least_fifteen_kinds() -> None:
    assert len(CASES) >= 15


def test_missing_files_are_named(tmp_path: Path) -> None:
    for reader in (read_trace_header, read_trace_data, load_sim_results, load_metrics_output, read_itl):
        with pytest.raises(FormatError, match=r"nope\.\w+: file not found"):
            reader(tmp_path / ("nope.yaml" if reader is read_trace_header else "nope.csv"))


def test_unreadable_paths_are_format_errors(tmp_path: Path) -> None:
    for reader in (read_trace_header, read_trace_data, load_sim_results, load_metrics_output, read_itl):
        with pytest.raises(FormatError, match="cannot read: Is a directory"):
            reader(tmp_path)


def test_binary_input_is_a_format_error(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_bytes(b"request_id\n\xff\xfe\n")
    (tmp_path / "h.yaml").write_bytes(b"\xff\xfe")
    with pytest.raises(FormatError, match="not UTF-8"):
        read_trace_data(tmp_path / "t.csv")
    with pytest.raises(FormatError, match="not UTF-8"):
        read_trace_header(tmp_path / "h.yaml")
