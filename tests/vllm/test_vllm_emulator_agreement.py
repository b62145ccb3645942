"""Agreement: the emulator configured like the lane's real vLLM gives the same counter deltas and per-request
cached tokens as the real server, step by step, for the same token-id request sequence (design D3/D4).

The emulator runs the ``tiny-cpu`` profile with the real server's block size and GPU block count (read from its
``vllm:cache_config_info``) and ``enable_prompt_tokens_details``, as the lane starts vLLM. Only the counters both
servers expose are compared (the emulator's metric profile follows vLLM 0.33); the core ones must be among them.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from vllm_lane import VllmServer, client, run, window

pytestmark = pytest.mark.vllm
CORE = {"prefix_cache_queries", "prefix_cache_hits", "prompt_tokens_cached_by_source[device]",
        "prompt_tokens_by_source[local_compute]", "prompt_tokens_by_source[local_cache_hit]"}


@dataclass(frozen=True)
class Step:
    name: str
    prompts: list[list[int]]
    stream: bool = True
    body: dict[str, Any] = field(default_factory=dict)


def sequence(rng: random.Random, num_gpu_blocks: int, block_size: int) -> list[Step]:
    """GPU hits, full misses, the last-token rule, prompt_logprobs and partial then full eviction."""
    a = client.unique_prompt(rng, 1024)
    steps = [Step("1024 twice", [a, a]), Step("1024 cached + 50 new", [a + client.unique_prompt(rng, 50)])]
    for n in (20, 33, 1000, 1025):
        p = client.unique_prompt(rng, n)
        steps.append(Step(f"{n} twice", [p, p]))
    steps.append(Step("cached 1024 with prompt_logprobs", [a], stream=False, body={"prompt_logprobs": 1}))
    for evicted in (11, 32):
        victim = client.unique_prompt(rng, 1024)
        fills = client.evicting_fills(num_gpu_blocks, 1024 // block_size, evicted, block_size)
        steps += [Step(f"victim ({evicted} to evict)", [victim]),
                  Step(f"{len(fills)} fills", [client.unique_prompt(rng, n) for n in fills]),
                  Step(f"victim again after evicting {evicted} blocks", [victim])]
    return steps


def observe(url: str, steps: list[Step]) -> list[tuple[str, list[int | None], dict[str, int]]]:
    async def one(session: Any, step: Step) -> list[Any]:
        how = client.complete if step.stream else client.complete_plain
        return [await how(session, url, p, 1, **step.body) for p in step.prompts]

    async def all_steps(session: Any) -> list[tuple[str, list[int | None], dict[str, int]]]:
        seen = []
        for step in steps:
            done, deltas = await window(session, url, lambda: one(session, step))
            assert all(c.status == 200 and c.done for c in done), (url, step.name, done[0].raw_lines[-1:])
            seen.append((step.name, [c.cached_tokens for c in done], deltas))
        return seen

    return run(all_steps)


def test_emulator_agrees_with_the_real_server(kv_window: VllmServer, rng: random.Random) -> None:
    from blis_sim.emulator import EmulatorConfig, start_emulator

    if kv_window.num_gpu_blocks > 2048:
        pytest.skip(f"{kv_window.num_gpu_blocks} GPU blocks: too much traffic to elicit eviction")
    steps = sequence(rng, kv_window.num_gpu_blocks, kv_window.block_size)
    real = observe(kv_window.url, steps)
    config = EmulatorConfig(profile="tiny-cpu", block_size=kv_window.block_size,
                            num_gpu_blocks=kv_window.num_gpu_blocks, enable_prompt_tokens_details=True)
    with start_emulator(config) as emu:
        emulated = observe(emu.url, steps)
    common = set(real[0][2]) & set(emulated[0][2])
    assert CORE <= common, f"counters missing on one side: {sorted(CORE - common)}"
    for (name, real_cached, real_deltas), (_, emu_cached, emu_deltas) in zip(real, emulated):
        assert emu_cached == real_cached, name
        assert {k: emu_deltas[k] for k in common} == {k: real_deltas[k] for k in common}, name
