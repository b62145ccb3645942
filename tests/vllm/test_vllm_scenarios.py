"""``scenarios/lane/vllm-cpu.blis.yaml`` stays runnable on the lane's server (no server needed, no ``vllm`` marker).

The scenario file is run against the real server by CI's lane step (``pytest --blis-server-url``); these tests
catch, in the unit step, the drift that would make that step fail or measure the wrong thing: a server spec that
no longer matches how ``tools/vllm_cpu.py`` starts the lane model's vLLM, a request longer than its
``--max-model-len``, a flood that no longer overflows the GPU cache, a session spec that stopped accumulating
context, a cell whose TTFT would be mostly frontend (too few new prompt tokens), or a saturation cell whose load
no longer exceeds the server's capacity.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from vllm_lane import lane

from blis_sim.workload import PlannedRequest
from pytest_blis._phases import build_plan
from pytest_blis._scenario import Capacity, SweepPoint, load_scenario_file

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
FILE = SCENARIOS / "lane" / "vllm-cpu.blis.yaml"
MODEL = lane.MODELS["lane"]  # the compute-bound model the file runs against
CAPACITY = Capacity(gpu_tokens=lane.BLOCK_SIZE * MODEL.num_gpu_blocks)
USABLE_TOKENS = (MODEL.num_gpu_blocks - 1) * lane.BLOCK_SIZE  # one block is vLLM's null block
# At least this many prompt tokens to prefill per measured request: ~80 ms on the lane model, against a
# frontend of a few ms (docs/vllm-cpu.md), so that TTFT is compute and TTFT MAPE means something.
MIN_NEW_TOKENS = 256
# What a cell's simulator predicts for a `rate: Nx capacity` workload (the real one asks the probe-fitted model).
PREDICTED_RPS = 29.0


def points() -> list[SweepPoint]:
    return load_scenario_file(FILE)


def planned(point: SweepPoint) -> dict[str, list[PlannedRequest]]:
    """The cell's requests by phase, session follow-ups included (each round completing as asked)."""
    plan = build_plan(point.spec, cell_id=f"test::{point.scenario_name}::{point.name}", capacity=CAPACITY,
                      base_dir=FILE.parent, capacity_of=lambda spec: PREDICTED_RPS)
    out: dict[str, list[PlannedRequest]] = {}
    for phase in plan.phases:
        run = phase.start()
        pending, sent = list(run.initial), []
        while pending:
            req = pending.pop(0)
            sent.append(req)
            nxt = run.on_complete(req, ok=True, output_tokens=req.output_tokens, completed_at_us=req.arrival_us + 1)
            if nxt is not None:
                pending.append(nxt)
        out[phase.name] = sent
    return out


def test_the_cells_are_the_ones_a_cpu_vllm_can_show() -> None:
    names = {(p.scenario_name, p.name) for p in points()}
    for cell in ("gpu-hit", "miss", "gpu-evict"):
        assert {(cell, f"prefix-{n}") for n in (256, 1024, 4096)} <= names
    assert {("session", "default"), ("saturation", "default")} <= names
    assert {p.spec.expect.path for p in points()} <= {"gpu", "miss", "any"}  # no offload tier on this server


@pytest.mark.parametrize("point", points(), ids=lambda p: f"{p.scenario_name}-{p.name}")
def test_ttft_is_judged_on_every_cell_below_saturation(point: SweepPoint) -> None:
    expect = point.spec.expect
    assert expect.hit_rate_tolerance_pp == 1
    if expect.saturated:  # TTFT is queueing there: reported; throughput and E2E are judged instead
        assert not expect.check_ttft and expect.e2e_mape_threshold == 0.15
    else:
        assert expect.check_ttft and expect.ttft_mape_threshold == 0.15


@pytest.mark.parametrize("point", points(), ids=lambda p: f"{p.scenario_name}-{p.name}")
def test_measured_requests_prefill_enough_to_be_compute(point: SweepPoint) -> None:
    phases = planned(point)
    measured = [phases[point.spec.phase_names()[i]] for i in point.spec.measured()]
    for reqs in measured:
        for r in reqs:
            # What the server has not cached: a hit cell's suffix, a session round's new text (the earlier
            # rounds are cached), a miss cell's whole prompt.
            new = r.new_input_tokens if r.accumulate or point.spec.expect.path == "gpu" else r.input_tokens
            assert new >= MIN_NEW_TOKENS or point.spec.expect.saturated, (r.phase, r.input_tokens)


@pytest.mark.parametrize("point", points(), ids=lambda p: f"{p.scenario_name}-{p.name}")
def test_server_spec_is_the_lanes_server(point: SweepPoint) -> None:
    server = point.spec.server
    assert (server.block_size, server.num_gpu_blocks) == (lane.BLOCK_SIZE, MODEL.num_gpu_blocks)
    assert server.offload is None and server.profile == "lane-cpu"
    # the scheduler limits `tools/vllm_cpu.py start --model lane` passes to vLLM
    assert (server.max_num_seqs, server.max_num_batched_tokens) == (MODEL.max_num_seqs, MODEL.max_num_batched_tokens)
    argv = lane.server_argv(lane.cache_paths(), 8000, model="lane")
    for flag, value in (("--num-gpu-blocks-override", server.num_gpu_blocks), ("--max-num-seqs", server.max_num_seqs),
                        ("--max-num-batched-tokens", server.max_num_batched_tokens)):
        assert argv[argv.index(flag) + 1] == str(value)


@pytest.mark.parametrize("point", points(), ids=lambda p: f"{p.scenario_name}-{p.name}")
def test_every_request_fits_the_servers_context(point: SweepPoint) -> None:
    for phase, reqs in planned(point).items():
        assert reqs, phase
        longest = max(r.input_tokens + r.output_tokens for r in reqs)
        assert longest <= lane.MAX_MODEL_LEN, (phase, longest)


@pytest.mark.parametrize("point", [p for p in points() if p.scenario_name == "gpu-evict"], ids=lambda p: p.name)
def test_the_flood_overflows_the_gpu_cache(point: SweepPoint) -> None:
    phases = planned(point)
    seeded = sum(r.input_tokens + r.output_tokens for r in phases["seed"])
    flood = sum(r.input_tokens + r.output_tokens for r in phases["flood"])
    # LRU evicts everything older than the last USABLE_TOKENS tokens of distinct content.
    assert seeded <= USABLE_TOKENS < flood
    assert {r.prefix_group for r in phases["repeat"]} == {r.prefix_group for r in phases["seed"]}


@pytest.mark.parametrize("point", [p for p in points() if p.scenario_name == "gpu-hit"], ids=lambda p: p.name)
def test_the_hit_cells_prefixes_stay_resident(point: SweepPoint) -> None:
    reqs = [r for phase in planned(point).values() for r in phase]
    prefixes = {r.prefix_group: r.prefix_length for r in reqs}
    # Distinct content the cell puts in the cache: each prefix once, then every request's own tokens.
    distinct = sum(prefixes.values()) + sum(r.input_tokens - r.prefix_length + r.output_tokens for r in reqs)
    assert distinct <= USABLE_TOKENS


def test_the_session_cell_accumulates_context() -> None:
    (point,) = [p for p in points() if p.scenario_name == "session"]
    (reqs,) = planned(point).values()
    rounds: dict[str, list[int]] = {}
    for r in reqs:
        assert r.accumulate and r.prefix_group == "system" and r.prefix_length == 512
        rounds.setdefault(r.session_id, []).append(r.input_tokens)
    # 8 sessions: 512-token system prompt + 256 new tokens per round + the previous round's 32 output tokens.
    assert list(rounds.values()) == [[768, 1056, 1344, 1632]] * 8


def test_the_saturation_cell_outruns_the_server() -> None:
    """Its arrivals come at twice the capacity the cell's simulator predicts for its mix on the server under
    test (a fixed rate saturated one CPU's lane model and not another's), all sent as they arrive."""
    (point,) = [p for p in points() if p.scenario_name == "saturation"]
    (phase,) = point.spec.phases
    assert phase.rate == "2x capacity"
    (reqs,) = planned(point).values()
    assert len(reqs) >= 64 and point.spec.concurrency >= len(reqs)
    span_s = (max(r.arrival_us for r in reqs) - min(r.arrival_us for r in reqs)) / 1e6
    assert (len(reqs) - 1) / span_s == pytest.approx(2 * PREDICTED_RPS, rel=0.1)
