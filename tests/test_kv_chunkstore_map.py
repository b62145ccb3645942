"""The offload tiers' open-addressing key map (Cython ``ChunkStore``) against the pure twin.

Long seeded operation sequences with many keys, heavy eviction (small capacities: every eviction
is a map deletion, so backward-shift deletion runs constantly), ARC ghost lists, key 0 (the map's
free-slot marker, kept aside) and an unbounded tier that grows through several rehashes: both
backends must answer every query alike and end in the same state.
"""
from __future__ import annotations

import numpy as np
import pytest

from blis_sim.kv import _core_py, load_core


def _cython_core():  # type: ignore[no-untyped-def]
    try:
        core, compiled = load_core("cython")
    except ImportError:
        pytest.skip("the Cython core is not built")
    assert compiled
    return core


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("capacity,key_range", [(5, 40), (50, 400), (3000, 400), (-1, 1 << 20)])
def test_chunk_store_map_matches_twin(policy: str, capacity: int, key_range: int) -> None:
    core = _cython_core()
    if policy == "arc" and capacity < 0:
        pytest.skip("ARC needs a bound")
    rng = np.random.default_rng(abs(capacity) * 7 + len(policy))
    cy, py = core.ChunkStore(capacity, policy), _core_py.ChunkStore(capacity, policy)
    now = 0.0
    for step in range(2500):
        now += 1.0
        hi = key_range if step % 3 else 40  # a hot set (with key 0) and a wide one
        keys = rng.integers(0, hi, int(rng.integers(1, 40))).astype(np.uint64)
        op = int(rng.integers(0, 4))
        if op == 0:
            a, b = cy.prepare_store(keys, now, now + 3.0), py.prepare_store(keys, now, now + 3.0)
            assert (a is None) == (b is None)
            if a is not None:
                assert a.tolist() == b.tolist()
        elif op == 1:
            cy.touch(keys, 0, len(keys))
            py.touch(keys, 0, len(keys))
        elif op == 2:
            cy.pin(keys, 0, len(keys), now + 2.0)
            py.pin(keys, 0, len(keys), now + 2.0)
        else:
            assert cy.ready_prefix(keys, 0, len(keys), now) == py.ready_prefix(keys, 0, len(keys), now)
            for k in keys.tolist():
                assert cy.state_of(k, now) == py.state_of(k, now)
    assert len(cy) == len(py)
    assert cy.state() == py.state()
