"""The YAML layer under every format: strict reading with yaml.v3's scalar rules, and the yaml.v3-style writer."""
from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from blis_sim.errors import FormatError
from blis_sim.formats import TraceHeader, read_trace_data, write_trace_data
from blis_sim.formats._strict import parse_yaml, validate
from blis_sim.formats._yamlout import dump, scalar


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    tags: list[str] = []


class _Outer(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    commit: str
    maybe: str | None = None
    inner: _Inner
    items: list[_Inner] = []
    by_name: dict[str, _Inner] = {}
    count: int = 0


DOC = """\
commit: 0000000000000000000000000000000000000000
maybe: 1.50
inner: {name: yes, tags: [on, 012, 2026-08-20]}
items:
  - name: 7
by_name:
  a: {name: null_is_a_string_here}
count: 3
"""


def test_plain_scalars_keep_their_text_in_string_fields() -> None:
    doc = parse_yaml(DOC, "d.yaml")
    model = validate(_Outer, doc, plain_strings=True)
    assert model.commit == "0" * 40 and model.maybe == "1.50"
    assert model.inner == _Inner(name="yes", tags=["on", "012", "2026-08-20"])
    assert model.items[0].name == "7" and model.count == 3
    # without the option, the YAML 1.1 types reach the model and strict validation refuses them
    with pytest.raises(FormatError, match=r"d.yaml:1: field 'commit'"):
        validate(_Outer, doc)


def test_null_stays_null_and_quoted_scalars_are_untouched() -> None:
    doc = parse_yaml('commit: "12"\nmaybe: null\ninner: {name: x}\n', "d.yaml")
    model = validate(_Outer, doc, plain_strings=True)
    assert model.commit == "12" and model.maybe is None


@pytest.mark.parametrize(("text", "value"), [("1e+06", 1e6), ("5e-324", 5e-324), ("1.5e3", 1500.0), ("-2E5", -2e5),
                                             (".5e1", 5.0), ("1.5", 1.5), ("1_000", 1000), ("e3", "e3"), ("1e", "1e")])
def test_exponent_floats_read_as_yaml_1_2(text: str, value: object) -> None:
    assert parse_yaml(f"v: {text}\n").data == {"v": value}


def test_syntax_and_duplicate_errors_have_lines() -> None:
    with pytest.raises(FormatError, match=r"d.yaml:3: field 'a.b': duplicate key 'b'"):
        parse_yaml("a:\n  b: 1\n  b: 2\n", "d.yaml")
    with pytest.raises(FormatError, match=r"d.yaml:2: invalid YAML"):
        parse_yaml("a: [1\nb: 2\n", "d.yaml")


@pytest.mark.parametrize(("value", "expected"), [
    ("/mnt/kv-cache", "/mnt/kv-cache"), ("qwen/qwen3-14b", "qwen/qwen3-14b"), ("preset:chat", "preset:chat"),
    ("", '""'), ("2026-08-20T15:14:23Z", '"2026-08-20T15:14:23Z"'), ("0042", '"0042"'), ("true", '"true"'),
    ("yes", '"yes"'), ("null", '"null"'), ("1e3", '"1e3"'), ("1.5", '"1.5"'), ("a: b", "'a: b'"),
    ("# c", "'# c'"), ("-", "'-'"), ("-a", "-a"), ("it's", "it's"), ("trail ", "'trail '"),
    ("a\nb", '"a\\nb"'), ("\x85", '"\\x85"'), ("é", "é"),
    (7000.0, "7000"), (0.0, "0"), (1e6, "1e+06"), (True, "true"), (None, "null"), (42, "42"),
])
def test_scalars_are_written_as_yaml_v3_does(value: object, expected: str) -> None:
    assert scalar(value) == expected
    assert parse_yaml(f"v: {expected}\n").data == {"v": value}


def test_block_layout() -> None:
    text = dump({"a": {"b": [{"c": 1, "d": [1, 2]}, "x"], "e": {}, "f": []}, "g": 1.5})
    assert text == "a:\n    b:\n        - c: 1\n          d:\n              - 1\n              - 2\n        - x\n" \
                   "    e: {}\n    f: []\ng: 1.5\n"
    assert parse_yaml(text).data == {"a": {"b": [{"c": 1, "d": [1, 2]}, "x"], "e": {}, "f": []}, "g": 1.5}


def test_empty_trace_round_trips(tmp_path: Path) -> None:
    write_trace_data([], tmp_path / "t.csv", mode="real")
    assert read_trace_data(tmp_path / "t.csv") == []
    assert TraceHeader(mode="real").model_dump()["mode"] == "real"
