"""Mutated specs give a spec or an InputError naming a field — never a traceback (hypothesis)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_sim.errors import InputError
from blis_sim.formats.workload import parse_workload_spec
from blis_sim.workload import generate_workload

REPO = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((REPO / "samples/blis/workload.yaml").read_text())
BASE["clients"] = BASE["clients"][:2] + BASE["clients"][-1:]
BASE["clients"][0]["reasoning"] = {"multi_turn": {"max_rounds": 3, "think_time_us": 10,
                                                  "context_growth": "accumulate"}}
BASE["num_requests"] = 20


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, prefix + (i,))
    return out


PATHS = _paths(BASE)
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.sampled_from(["type", "value", "bogus", "mean", "process"]),
                    st.one_of(st.integers(-5, 500), st.text(max_size=4)), max_size=3),
    st.sampled_from(["poisson", "gamma", "weibull", "constant", "gaussian", "exponential", "empirical",
                     "accumulate", "standard", "realtime"]))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=VALUES, drop=st.booleans())
def test_mutated_spec_is_a_spec_or_an_input_error(path: tuple[Any, ...], value: Any, drop: bool) -> None:
    data = copy.deepcopy(BASE)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if drop and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    text = yaml.safe_dump(data, sort_keys=False)
    try:
        spec = parse_workload_spec(text, "fuzz.yaml")
    except InputError as exc:
        assert str(exc).startswith("fuzz.yaml")
        return
    try:
        plan = generate_workload(spec, num_requests=20, horizon=10**9)
    except InputError:
        return
    assert sum(len(p.requests) for p in plan.phases) <= 20
