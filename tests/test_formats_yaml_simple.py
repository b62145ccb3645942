"""The plain YAML reader (``_yaml_simple``) against PyYAML (``_yamlin``): on every YAML file of the
repository and on many odd variants of them, it either gives exactly PyYAML's document (values and
their types, the line of every key and item, the raw text of plain non-string scalars) or declines;
it never accepts what PyYAML refuses."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from blis_sim.errors import FormatError
from blis_sim.formats import _yamlin
from blis_sim.formats._strict import parse_yaml
from blis_sim.formats._yaml_simple import parse_simple

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p for d in ("samples", "scenarios", "tests", "benchmarks") for p in (ROOT / d).rglob("*.y*ml")
               if ".cache" not in p.parts)
ODD = ["yes", "On", "NO", "y", "0x1F", "007", "1_000", "1e3", "1.5e+06", "1.", ".5", "~", "NULL", "Null",
       "'quoted'", '"double"', '"a\\nb"', "'it''s'", "a: b", "- x", "[1, 2]", "{a: 1}", "{}", "[]", "&a x",
       "*a", "!!str 1", "2026-12-01", "12:30", "+1", "-0", "0", "0.0", "-1.5", "/path/x", "a#b", "a #b",
       "true", "False", "null", "x y", "é", "=", "<<", "a,b", "%x", "@x", "`x", "|", ">", "?", "-", ":"]


def _agree(text: str) -> str:
    try:
        full = _yamlin.parse(text, "t.yaml")
    except FormatError:
        assert parse_simple(text) is None, f"the plain reader accepted what PyYAML refuses:\n{text}"
        return "error"
    simple = parse_simple(text)
    if simple is None:
        return "pyyaml"
    assert _typed(simple[0]) == _typed(full[0]), text
    assert simple[1] == full[1], text
    assert simple[2] == full[2], text
    return "simple"


def _typed(value: Any) -> Any:
    """The value with every scalar's type beside it (1 and 1.0 and True differ)."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


def test_the_repository_yaml_files_read_alike() -> None:
    taken = {path.relative_to(ROOT).as_posix(): _agree(path.read_text(encoding="utf-8")) for path in FILES}
    # trace headers as the writer lays them out take the plain path (the others have comments,
    # flow mappings or a zero-padded commit id)
    assert taken["samples/blis/trace.yaml"] == taken["samples/vllm-cpu/trace.yaml"] == "simple"


def _bench_header() -> str:
    """A header as ``benchmarks/bench_replay.py`` writes it: the sample offload config resolved."""
    from blis_sim.formats import TraceHeader
    from blis_sim.formats.offload import load_offload_config
    from blis_sim.formats.trace_header import header_text

    cfg = load_offload_config(ROOT / "samples" / "blis" / "offload.yaml", kv_bytes_per_token=163840)
    return header_text(TraceHeader(mode="generated", time_unit="microseconds", workload_seed=42,
                                   kv_offload=cfg.to_header()))


@pytest.mark.parametrize("source", ["samples/blis/trace.yaml", "samples/vllm-cpu/trace.yaml", "bench"])
def test_odd_variants_read_alike_or_go_to_pyyaml(source: str) -> None:
    text = _bench_header() if source == "bench" else (ROOT / source).read_text(encoding="utf-8")
    assert _agree(text) == "simple"
    lines = text.split("\n")
    seen = {"simple": 0, "pyyaml": 0, "error": 0}
    for k, line in enumerate(lines):
        head, sep, _ = line.partition(": ")
        variants = []
        if sep:
            variants += [lines[:k] + [f"{head}: {v}"] + lines[k + 1:] for v in ODD]
            variants.append(lines[:k] + [head + ":"] + lines[k + 1:])
        if line.strip():
            variants += [lines[:k] + [" " + line] + lines[k + 1:], lines[:k] + [line[1:]] + lines[k + 1:],
                         lines[:k] + [line, line] + lines[k + 1:], lines[:k] + lines[k + 1:],
                         lines[:k] + [line + " "] + lines[k + 1:], lines[:k] + [line + "  # c"] + lines[k + 1:],
                         lines[:k] + ["\t" + line] + lines[k + 1:], lines[:k] + ["- " + line.lstrip()] + lines[k + 1:],
                         lines[:k] + [line, ""] + lines[k + 1:]]
        for v in variants:
            seen[_agree("\n".join(v))] += 1
    assert seen["simple"] > 20 and seen["pyyaml"] > 20 and seen["error"] > 5


def test_parse_yaml_takes_the_plain_path_and_keeps_its_errors(tmp_path: Path) -> None:
    doc = parse_yaml("a: 1\nb:\n    - c: x\n      d: 2.5\n", "t.yaml")
    assert doc.data == {"a": 1, "b": [{"c": "x", "d": 2.5}]} and doc.line_of(("b", 0, "d")) == 4
    assert doc.raw == {("a",): "1", ("b", 0, "d"): "2.5"}
    with pytest.raises(FormatError, match="duplicate key 'a'") as exc:
        parse_yaml("a: 1\na: 2\n", "t.yaml")
    assert exc.value.location.line == 2


def test_a_key_longer_than_pyyaml_allows_is_left_to_pyyaml() -> None:
    """Found by a differential fuzz run against main: PyYAML refuses an implicit key over 1024
    characters ("could not find expected ':'"); the plain reader must not accept it."""
    assert _agree("k" * 2000 + ": 1\n") == "error"
    assert _agree("a:\n    " + "k" * 1100 + ": x\n") == "error"
    assert _agree("k" * 100 + ": 1\n") == "simple"
