"""``construct`` and the YAML readers: a model built in code or read from a file is the one strict
validation gives (same values, same value types, same fields set), and every input pydantic refuses
is refused with pydantic's error."""
from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from blis_sim.formats import KVHitRate, MetricsOutput, OffloadConfig, TierConfig, TraceHeader
from blis_sim.formats._model import construct
from blis_sim.formats._strict import _restore_strings, load_yaml, validate

ROOT = Path(__file__).resolve().parents[1]
HEADERS = [ROOT / "samples" / "blis" / "trace.yaml", ROOT / "samples" / "blis" / "trace-observed.yaml",
           ROOT / "samples" / "vllm-cpu" / "trace.yaml"]
ODD_VALUES = [0, 1, -1, 2**70, 10**400, -(10**400), 1.5, -0.5, 0.0, math.nan, math.inf, True, False, "x", "", "LOCAL", "lru",
              "fs", None, [], {}, [1], {"a": 1}]


def _same(fast: BaseModel, slow: BaseModel) -> None:
    """Equal values of equal types, and the same fields set, at every level."""
    assert type(fast) is type(slow)
    assert repr(fast.model_dump()) == repr(slow.model_dump())
    assert fast == slow
    _same_sets(fast, slow)


def _same_sets(a: Any, b: Any) -> None:
    if isinstance(a, BaseModel):
        assert a.model_fields_set == b.model_fields_set, type(a).__name__
        for name in type(a).model_fields:
            _same_sets(getattr(a, name), getattr(b, name))
    elif isinstance(a, (list, tuple)):
        for x, y in zip(a, b):
            _same_sets(x, y)
    elif isinstance(a, dict):
        for k in a:
            _same_sets(a[k], b[k])


def _agree(model: type[BaseModel], data: Any) -> str:
    """Check one input through ``construct``: "fast" (accepted, pydantic's model) or "error"."""
    try:
        slow = model.model_validate(copy.deepcopy(data))
    except ValidationError:
        if isinstance(data, dict):
            with pytest.raises(ValidationError):
                construct(model, **copy.deepcopy(data))
        return "error"
    _same(construct(model, **copy.deepcopy(data)), slow)
    return "fast"


def _leaves(data: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(data, dict):
        out = [path] if path else []
        for k, v in data.items():
            out += _leaves(v, path + (k,))
        return out
    if isinstance(data, list):
        out = [path]
        for i, v in enumerate(data):
            out += _leaves(v, path + (i,))
        return out
    return [path]


def _set(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(data)
    node = out
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return out


def _delete(data: Any, path: tuple[Any, ...]) -> Any:
    out = copy.deepcopy(data)
    node = out
    for p in path[:-1]:
        node = node[p]
    del node[path[-1]]
    return out


def _header_data(path: Path) -> Any:
    """The header's data as ``read_trace_header`` validates it (plain scalars of string fields as text)."""
    doc = load_yaml(path)
    return _restore_strings(TraceHeader, doc.data, (), doc.raw)


@pytest.mark.parametrize("path", HEADERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_sample_headers_read_the_same(path: Path) -> None:
    doc = load_yaml(path)
    fast = validate(TraceHeader, doc, plain_strings=True)
    slow = TraceHeader.model_validate(_header_data(path))
    _same(fast, slow)


def test_every_changed_value_of_a_header_agrees_with_pydantic() -> None:
    """Each value of the bench's kind of header (kv_offload with an fs tier) and of the samples
    replaced by odd values, each key deleted, an unknown key added: ``construct`` gives pydantic's
    model or pydantic's error; it never accepts what pydantic refuses."""
    seen: dict[str, int] = {"fast": 0, "error": 0}
    for path in HEADERS:
        data = _header_data(path)
        seen[_agree(TraceHeader, data)] += 1
        for leaf in _leaves(data):
            for value in ODD_VALUES:
                seen[_agree(TraceHeader, _set(data, leaf, value))] += 1
            seen[_agree(TraceHeader, _delete(data, leaf))] += 1
            if isinstance(leaf[-1], str):
                seen[_agree(TraceHeader, _set(data, leaf[:-1] + ("no_such_key",), 1))] += 1
    assert seen["fast"] > 50 and seen["error"] > 100  # both ways taken, many times


def test_after_validators_run_and_refusals_go_to_pydantic() -> None:
    good = {"definition": "by_source", "tier": "host", "unit": "tokens", "hits": 3, "queries": 4,
            "hit_rate": 0.75, "metric": None}
    assert _agree(KVHitRate, good) == "fast"
    for bad in ({"hits": 5}, {"tier": None}, {"unit": "chunks"}, {"hit_rate": 1.5}, {"queries": -1}):
        assert _agree(KVHitRate, {**good, **bad}) == "error"
    with pytest.raises(ValidationError, match="exceed queries"):
        construct(KVHitRate, **{**good, "hits": 5})


def test_constructed_configs_and_metrics_match_validated_ones() -> None:
    tier = {"root_dir": "/mnt/kv", "direct_io": True, "read_bandwidth": 7000, "write_bandwidth": 5000.0,
            "base_latency": 80, "max_bytes": None}
    t_fast, t_slow = construct(TierConfig, **tier), TierConfig(**tier)
    _same(t_fast, t_slow)
    cfg = {"cpu_bytes_to_use": 2**30, "gpu_block_size": 16, "block_size": 16, "blocks_per_chunk": 1,
           "tokens_per_hash": 16, "secondary_tiers": (t_fast,), "kv_bytes_per_token": 163840.0,
           "bytes_per_chunk": 2621440}
    _same(construct(OffloadConfig, **cfg), OffloadConfig(**cfg))
    for bad in ({"block_size": 32}, {"cpu_bytes_to_use": 10}, {"secondary_tiers": [t_fast]},
                {"kv_bytes_per_token": math.inf}, {"eviction_policy": "fifo"}):
        with pytest.raises(ValidationError):
            construct(OffloadConfig, **{**cfg, **bad})
    for bad in ({"root_dir": ""}, {"read_bandwidth": 0}, {"direct_io": 1}, {"n_read_threads": True}):
        with pytest.raises(ValidationError):
            construct(TierConfig, **{**tier, **bad})
    m = {"completed_requests": 3, "e2e_mean_ms": 1.25, "cache_hit_rate": None, "saturation": {"a": [1]},
         "kv_hit_rates": [construct(KVHitRate, definition="prefix_cache", unit="tokens", hits=1, queries=2,
                                    hit_rate=0.5)]}
    _same(construct(MetricsOutput, **m), MetricsOutput(**m))
    for bad in ({"e2e_mean_ms": math.nan}, {"cache_hit_rate": 1.5}, {"completed_requests": 1.0}):
        with pytest.raises(ValidationError):
            construct(MetricsOutput, **{**m, **bad})


def test_models_with_aliases_validators_or_lax_rules_follow_pydantic() -> None:
    from pydantic import ConfigDict, Field, field_validator

    from blis_sim.formats._model import StrictModel

    class Aliased(StrictModel):
        x: int = Field(default=0, validation_alias="X")

    class Checked(StrictModel):
        x: int = 0

        @field_validator("x")
        @classmethod
        def _even(cls, v: int) -> int:
            if v % 2:
                raise ValueError("odd")
            return v

    class Lax(StrictModel):
        model_config = ConfigDict(strict=False)
        x: int = 0

    class Plain(StrictModel):
        x: int = 0
        y: list[int] = Field(default_factory=list)

    assert construct(Aliased, X=5).x == 5
    with pytest.raises(ValidationError, match="odd"):
        construct(Checked, x=3)
    assert construct(Lax, x="4").x == 4  # pydantic's lax rules, not the plain check's
    made = construct(Plain, x=2)
    assert made.y == [] and made.model_fields_set == {"x"}
    _same(made, Plain.model_validate({"x": 2}))
