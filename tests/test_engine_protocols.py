"""The typed seams (blis_sim/engine/kvport.py, latency.py): every implementation of the KV port, of the
cache under it and of a latency model has the Protocol's members. mypy checks the signatures (.ci/run)."""
from __future__ import annotations

import pytest

from blis_sim.engine.content import ContentPlan
from blis_sim.engine.kvport import CacheOps, KVPort, LoopPort, RequestPort, kv_port
from blis_sim.engine.latency import LatencyModel, StepModelSource, default_step_model
from blis_sim.kv import KVCache, KVConfig
from tests.engine_ports import CountingPort


def _content(n: int) -> ContentPlan:
    from blis_sim.engine import prepare_trace
    from blis_sim.formats import Trace, TraceHeader, TraceRecord

    rows = [TraceRecord(request_id=i, arrival_time_us=i, send_time_us=i, input_tokens=40, output_tokens=2)
            for i in range(n)]
    return prepare_trace(Trace(header=TraceHeader(mode="real"), records=rows)).table.content(1, 16)


@pytest.mark.parametrize("backend", ["python", "cython"])
def test_both_caches_offer_what_the_port_calls_and_both_ports_are_request_ports(backend: str) -> None:
    cache = KVCache(KVConfig(num_gpu_blocks=64, block_size=16), backend=backend)
    assert isinstance(cache, CacheOps)
    port = kv_port(cache, _content(3))
    assert isinstance(port, RequestPort) and isinstance(port, LoopPort)
    assert isinstance(port, KVPort) == (backend == "python")


def test_the_scheduler_tests_counting_port_is_a_loop_port() -> None:
    assert isinstance(CountingPort(num_blocks=8), LoopPort)
    assert not isinstance(CountingPort(num_blocks=8), RequestPort)  # it records nothing per request


def test_a_step_model_is_a_latency_model_and_a_coefficient_file_compiles_to_one() -> None:
    from blis_sim.engine.coefficients import DEFAULT_COEFFICIENTS

    assert isinstance(default_step_model(), LatencyModel)
    assert isinstance(DEFAULT_COEFFICIENTS, StepModelSource)
    assert isinstance(DEFAULT_COEFFICIENTS.to_step_model(), LatencyModel)
    assert not isinstance(DEFAULT_COEFFICIENTS, LatencyModel)
