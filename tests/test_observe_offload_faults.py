"""Offload faults in the trace header (blis_sim/observe/faults.py): the fault counters over the window, and a
warm start (content the server held from before the window), against the embedded emulator over real HTTP."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from blis_sim.emulator import EmulatorConfig, OffloadSpec, start_emulator
from blis_sim.formats.trace import Fault, TraceRecord, load_trace, write_trace
from blis_sim.formats.workload import parse_workload_spec
from blis_sim.observe.faults import fault_warnings, warm_start_requests, window_faults
from blis_sim.observe.metrics import derive_window, parse_exposition
from blis_sim.observe.run import ObserveOptions, observe
from test_observe_emulator import SPEC  # four requests of one prefix group: 64 prefix + 32 own tokens

OPTS: dict[str, Any] = dict(model="tiny-llama", max_concurrency=1, scrape_kv_metrics=True, settle_s=0.2,
                            progress=False, timeout_s=5.0)


def _row(i: int, t: int, cached: int, *, group: str = "", prefix: int = 0, inp: int = 32, session: str = "",
         out: int = 4) -> TraceRecord:
    return TraceRecord(request_id=i, send_time_us=t, arrival_time_us=t, prefix_group=group, prefix_length=prefix,
                       input_tokens=inp, output_tokens=out, session_id=session, cached_tokens=cached)


def test_the_bound_is_an_empty_infinite_cache_in_full_blocks() -> None:
    rows = [_row(0, 10, 0, group="a", prefix=100), _row(1, 20, 96, group="a", prefix=100),
            _row(2, 30, 128, group="a", prefix=100), _row(3, 40, 32, group="b", prefix=64)]
    # request 1 may hit the 3 full blocks of the 100-token prefix (96); 2 cannot hit 128; 3 is its group's first
    assert warm_start_requests(rows, 32) == [(2, 128, 96), (3, 32, 0)]
    # a session round may hit the previous round's prompt and output; -1 (not reported) is never warm
    sess = [_row(0, 1, 0, session="s", inp=60, out=10), _row(1, 2, 64, session="s", inp=100),
            _row(2, 3, -1, session="t")]
    assert warm_start_requests(sess, 32) == []
    assert warm_start_requests(sess, 1) == []
    assert warm_start_requests([_row(0, 1, 0, session="s", inp=60, out=10),
                                _row(1, 2, 96, session="s", inp=100)], 32) == [(1, 96, 64)]


def test_fault_counters_over_the_window_and_their_warnings() -> None:
    def snap(alloc: float, cascade: float) -> Any:
        return parse_exposition(
            "# TYPE vllm:kv_offload_allocation_failure counter\n"
            f'vllm:kv_offload_allocation_failure_total{{engine="0",model_name="m"}} {alloc}\n'
            "# TYPE vllm:kv_offload_tiering_cascade_job_failures counter\n"
            f'vllm:kv_offload_tiering_cascade_job_failures_total{{engine="0",tier="1:fs"}} {cascade}\n')

    window = derive_window(snap(3, 0), snap(10, 4))
    assert window.faults == [
        {"kind": "allocation_failure", "tier": "0:primary", "count": 7, "metric": "vllm:kv_offload_allocation_failure_total"},
        {"kind": "store_failure", "tier": "1:fs", "count": 4, "metric": "vllm:kv_offload_tiering_cascade_job_failures_total"}]
    faults = window_faults(window.faults, [], 32)
    text = fault_warnings(faults)
    assert len(text) == 2 and text[0].startswith("7 allocation failures on tier 0:primary")
    assert "4 store failures on tier 1:fs" in text[1] and "not comparable" in text[1]
    assert fault_warnings([Fault(kind="store_failure", tier="1:fs", count=0)]) == []


def test_a_second_window_on_a_long_lived_server_is_a_warm_start(tmp_path: Path) -> None:
    cfg = EmulatorConfig(block_size=32, num_gpu_blocks=256, enable_prompt_tokens_details=True,
                         offload=OffloadSpec(cpu_bytes=1 << 22))
    spec = parse_workload_spec(SPEC)
    with start_emulator(cfg) as emu:
        first = observe(emu.url, spec, ObserveOptions(**OPTS))
        second = observe(emu.url, spec, ObserveOptions(**OPTS))  # the same prompts: the cache still holds them
    h1, h2 = first.trace.header.pytest_blis, second.trace.header.pytest_blis
    assert h1 is not None and h2 is not None
    assert [f.kind for f in h1.faults if f.count] == []
    warm = [f for f in h2.faults if f.kind == "warm_start"]
    # the same seed sends the same prompts: the first request hits its whole 96-token prompt where nothing
    # of the window could have given it any, and each next one its own 32 tokens beyond the group's prefix
    assert len(warm) == 1 and warm[0].count == 4
    assert "(192 tokens in all; first: request 0, 96 cached where at most 0" in warm[0].detail
    assert any(w.startswith("warm start:") for w in second.warnings)
    assert any(w.startswith("warm start:") for w in h2.warnings)
    # the header keeps them through a write and a read
    write_trace(second.trace, tmp_path / "t.yaml", tmp_path / "t.csv")
    again = load_trace(tmp_path / "t.yaml", tmp_path / "t.csv").header.pytest_blis
    assert again is not None and again.faults == h2.faults
