"""The emulator's V1 scheduler and block pool, stepped by hand with a fake clock."""
from __future__ import annotations

import random

from blis_sim.emulator.config import Geometry
from blis_sim.emulator.gpu_cache import BlockPool, block_hashes
from blis_sim.emulator.scheduler import FINISHED, Request, Scheduler
from blis_sim.emulator.stats import EngineStats
from blis_sim.emulator.tokenizer import Tokenizer


def make(num_gpu_blocks: int = 64, block_size: int = 16, budget: int = 2048, max_seqs: int = 256,
         chunked: bool = True) -> Scheduler:
    geo = Geometry(block_size=block_size, num_gpu_blocks=num_gpu_blocks, kv_bytes_per_token=512,
                   max_model_len=4096, max_num_seqs=max_seqs, max_num_batched_tokens=budget)
    return Scheduler(geo, BlockPool(num_gpu_blocks, block_size), None, EngineStats(), Tokenizer.output_token,
                     eos_token_id=Tokenizer.eos_token_id, eos_probability=0.0, rng=random.Random(0),
                     chunked_prefill=chunked)


def drive(sched: Scheduler, max_steps: int = 10_000) -> list[list[tuple[str, int]]]:
    steps: list[list[tuple[str, int]]] = []
    now = 0.0
    while sched.running or sched.waiting:
        plan = sched.schedule(now)
        steps.append([(r.rid, n) for r, n in plan.scheduled])
        now += 0.01
        sched.finish_step(plan, now)
        assert len(steps) < max_steps
    return steps


def req(rid: str, base: int, n: int, max_tokens: int = 1, **kw: object) -> Request:
    return Request(rid, list(range(base, base + n)), max_tokens=max_tokens, **kw)  # type: ignore[arg-type]


def test_chunked_prefill_splits_a_long_prompt_by_the_token_budget() -> None:
    s = make(budget=64)
    a = req("a", 0, 200, max_tokens=2)
    s.add(a)
    steps = drive(s)
    assert steps == [[("a", 64)], [("a", 64)], [("a", 64)], [("a", 8)], [("a", 1)]]
    assert a.first_token is not None and a.num_output == 2
    assert s.stats.prefix_queries == 200  # counted once, at admission


def test_without_chunked_prefill_a_prompt_over_budget_waits() -> None:
    s = make(budget=64, chunked=False)
    s.add(req("a", 0, 200))
    assert s.schedule(0.0).empty


def test_budget_is_shared_running_first() -> None:
    s = make(budget=128)
    a, b = req("a", 0, 100, max_tokens=3), req("b", 1000, 100, max_tokens=3)
    s.add(a)
    s.add(b)
    steps = drive(s)
    assert steps[0] == [("a", 100), ("b", 28)]
    assert steps[1] == [("a", 1), ("b", 72)]  # a decodes, b finishes its prefill
    plan_kinds = []
    s2 = make(budget=128)
    s2.add(req("c", 0, 100, max_tokens=2))
    plan = s2.schedule(0.0)
    plan_kinds.append((plan.prefill_tokens, plan.decode_seqs))
    s2.finish_step(plan, 0.01)
    plan = s2.schedule(0.01)
    plan_kinds.append((plan.prefill_tokens, plan.decode_seqs, plan.context_tokens))
    assert plan_kinds == [(100, 0), (0, 1, 100)]


def test_max_num_seqs_limits_the_batch() -> None:
    s = make(max_seqs=1)
    s.add(req("a", 0, 10, max_tokens=3))
    s.add(req("b", 100, 10, max_tokens=3))
    steps = drive(s)
    assert [ids for ids in steps] == [[("a", 10)], [("a", 1)], [("a", 1)], [("b", 10)], [("b", 1)], [("b", 1)]]


def test_preemption_frees_the_last_running_and_is_counted_once() -> None:
    s = make(num_gpu_blocks=5)  # 4 usable blocks of 16 tokens
    a, b = req("a", 0, 32, max_tokens=20), req("b", 1000, 32, max_tokens=20)  # 51 tokens fit 4 blocks
    s.add(a)
    s.add(b)
    steps = drive(s)
    assert steps[0] == [("a", 32), ("b", 32)]
    assert steps[1] == [("a", 1)]  # a needs a third block: b is preempted
    assert b.num_preemptions == 1 and s.stats.num_preemptions == 1
    assert a.state == b.state == FINISHED and a.num_output == b.num_output == 20
    # Queries are counted at the first admission only: the re-admission of b adds nothing.
    assert s.stats.prefix_queries == 64
    assert s.stats.request_success["length"] == 2


def test_prompt_logprobs_requests_skip_the_cache_and_the_counters() -> None:
    s = make()
    s.add(req("a", 0, 64))
    drive(s)
    p = req("p", 0, 64, skip_cache=True)
    s.add(p)
    drive(s)
    assert p.cached_tokens == 0
    assert (s.stats.prefix_queries, s.stats.prefix_hits) == (64, 0)


def test_decode_blocks_are_cached_too() -> None:
    # vLLM hashes every full block, generated tokens included: a follow-up that echoes the output hits it.
    s = make(block_size=16)
    a = req("a", 0, 16, max_tokens=17)
    s.add(a)
    drive(s)
    follow = Request("f", a.tokens[:32] + [5], max_tokens=1)
    s.add(follow)
    drive(s)
    assert follow.cached_tokens == 32


def test_block_pool_lru_and_lazy_eviction() -> None:
    pool = BlockPool(num_gpu_blocks=4, block_size=2)  # 3 usable
    first = pool.allocate(3)
    assert first is not None and pool.allocate(1) is None
    hashes = block_hashes([1, 2, 3, 4, 5, 6], 2)
    for block, h in zip(first, hashes):
        pool.cache_block(block, h)
    pool.free(first)  # tail first: LRU order is blocks 2, 1, 0
    assert pool.usage() == 0.0
    assert len(pool.find_longest_hit(hashes, 6)) == 3
    pool.allocate(1)  # evicts the tail block (hash 2) lazily
    hit = pool.find_longest_hit(hashes, 6)
    assert len(hit) == 2
    pool.touch(hit)
    assert pool.num_free == 0 and round(pool.usage(), 6) == 1.0
    assert not pool.reset()  # blocks in use
    pool.free(hit)
    assert pool.find_longest_hit(hashes, 6) == hit


def test_hashes_chain_on_the_whole_prefix() -> None:
    a = block_hashes([1, 2, 3, 4], 2)
    b = block_hashes([9, 9, 3, 4], 2)
    assert a[1] != b[1]  # same tokens in block 1, different parent
    assert block_hashes([1, 2, 3], 2) == a[:1]  # only full blocks


def test_a_step_after_idle_takes_its_full_modelled_time() -> None:
    """Pacing from the previous step's target must not shorten the first step after an idle gap."""
    import time

    import httpx

    from blis_sim.emulator import EmulatorConfig, start_emulator

    cfg = EmulatorConfig(profile="h100-14b", num_gpu_blocks=200, step_noise=0.0, stats_interval_s=0)
    with start_emulator(cfg) as emu, httpx.Client(base_url=emu.url, timeout=10) as c:
        ids = list(range(1000, 2024))
        c.post("/v1/completions", json={"prompt": ids, "max_tokens": 1})
        time.sleep(0.005)  # idle for less than the pacing window
        t0 = time.perf_counter()
        c.post("/v1/completions", json={"prompt": ids, "max_tokens": 1})
        elapsed = time.perf_counter() - t0
    # The cached repeat computes 16 tokens: 9.5 + 2 + 16 x 0.045 ms + 1008 x 2e-5 ms of context.
    assert elapsed >= 0.0122


def test_preemption_under_http_load_keeps_every_stream_whole() -> None:
    """Eight concurrent streams whose decodes outgrow a 16-block cache: requests get preempted and
    recomputed, and every stream still delivers all its tokens, in order, ending with [DONE]."""
    import asyncio
    import json

    import aiohttp

    from blis_sim.emulator import EmulatorConfig, start_emulator

    cfg = EmulatorConfig(profile="zero", block_size=16, num_gpu_blocks=17, max_model_len=256,
                         stats_interval_s=0)

    async def one(session: aiohttp.ClientSession, url: str, i: int) -> tuple[int, bool]:
        body = {"prompt": list(range(1000 * (i + 1), 1000 * (i + 1) + 40)), "max_tokens": 60, "stream": True,
                "stream_options": {"include_usage": True}}
        tokens, done = 0, False
        async with session.post(url + "/v1/completions", json=body) as r:
            async for line in r.content:
                if line.startswith(b"data: [DONE]"):
                    done = True
                elif line.startswith(b"data: {"):
                    chunk = json.loads(line[6:])
                    tokens += 1 if chunk["choices"] else 0
        return tokens, done

    async def run(url: str) -> list[tuple[int, bool]]:
        async with aiohttp.ClientSession() as session:
            return await asyncio.gather(*(one(session, url, i) for i in range(8)))

    with start_emulator(cfg) as emu:
        results = asyncio.run(run(emu.url))
        stats = emu.published().stats
    assert results == [(60, True)] * 8
    assert stats.num_preemptions > 0
    assert stats.request_success["length"] == 8 and stats.generation_tokens == 8 * 60
    assert stats.prefix_queries == 8 * 40  # preempted re-admissions are not counted again
