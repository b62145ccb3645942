"""``scenarios/vllm-cpu.blis.yaml`` stays runnable on the lane's server (no server needed, no ``vllm`` marker).

The scenario file is run against the real server by CI's lane step (``pytest --blis-server-url``); these tests
catch, in the unit step, the drift that would make that step fail or measure the wrong thing: a server spec that
no longer matches how ``tools/vllm_cpu.py`` starts vLLM, a request longer than its ``--max-model-len``, a flood
that no longer overflows the GPU cache, or a session spec that stopped accumulating context.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from vllm_lane import lane

from blis_sim.workload import PlannedRequest
from pytest_blis._phases import build_plan
from pytest_blis._scenario import Capacity, SweepPoint, load_scenario_file

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
FILE = SCENARIOS / "vllm-cpu.blis.yaml"
CAPACITY = Capacity(gpu_tokens=lane.BLOCK_SIZE * lane.NUM_GPU_BLOCKS)
USABLE_TOKENS = (lane.NUM_GPU_BLOCKS - 1) * lane.BLOCK_SIZE  # one block is vLLM's null block


def points() -> list[SweepPoint]:
    return load_scenario_file(FILE)


def planned(point: SweepPoint) -> dict[str, list[PlannedRequest]]:
    """The cell's requests by phase, session follow-ups included (each round completing as asked)."""
    plan = build_plan(point.spec, cell_id=f"test::{point.scenario_name}::{point.name}", capacity=CAPACITY,
                      base_dir=FILE.parent)
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
    assert ("session", "default") in names
    assert {p.spec.expect.path for p in points()} <= {"gpu", "miss"}  # no offload tier on this server


@pytest.mark.parametrize("point", points(), ids=lambda p: f"{p.scenario_name}-{p.name}")
def test_server_spec_is_the_lanes_server(point: SweepPoint) -> None:
    server = point.spec.server
    assert (server.block_size, server.num_gpu_blocks) == (lane.BLOCK_SIZE, lane.NUM_GPU_BLOCKS)
    assert server.offload is None and server.profile == "tiny-cpu"
    # vLLM 0.32's defaults for `vllm serve` on CPU (engine/arg_utils.py), which the lane does not override.
    assert (server.max_num_seqs, server.max_num_batched_tokens) == (128, 2048)
    assert point.spec.expect.hit_rate_tolerance_pp == 1


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
        assert r.accumulate and r.prefix_group == "system" and r.prefix_length == 256
        rounds.setdefault(r.session_id, []).append(r.input_tokens)
    # 256-token system prompt + 100 new tokens per round + the previous round's 64 output tokens.
    assert list(rounds.values()) == [[356, 520, 684, 848]] * 2
