"""Differential test against a running real vLLM (design D4): the KV core predicts every request's
``cached_tokens`` under heavy eviction, block for block.

A random workload (shared prefixes, truncated prefixes, exact repeats, fresh prompts; several times
the GPU cache, so LRU eviction, tail-first freeing and the front placement of partial blocks all
decide the hits) is sent one request at a time (``max_tokens=1``) to the server and replayed
through :class:`blis_sim.kv.KVCache` with the server's own geometry (``vllm:cache_config_info``).
The prediction only depends on this test's requests: the free queue holds ``num_gpu_blocks − 1``
blocks on an idle server whatever was cached before, and the prompts are fresh random token ids.

Server: ``BLIS_VLLM_URL``, else the real-vLLM lane's server (``tools/vllm_cpu.py start``) when it is
up. It is never started here; without one the test skips (fails with ``BLIS_REQUIRE_VLLM=1``).
The lane's ``counters.lock`` keeps other tests' traffic out while it runs.
"""
from __future__ import annotations

import random
import time
from typing import Any

import aiohttp
import numpy as np
import pytest
from vllm_lane import client, exclusive, run, running_server_url, window

from blis_sim.kv import KVCache, KVConfig, hash_blocks

pytestmark = pytest.mark.vllm


#: The workload's shape (lengths, repeats, truncations) is seeded: with this seed eviction decides
#: the hits of 7 of its 60 requests on the lane's tiny server (32-token blocks, 512 of them); some
#: other shapes leave none to decide, and the test would then have no teeth. Token ids stay fresh.
SHAPE_SEED = 1


def workload(shape: random.Random, tokens: random.Random, n_requests: int, unique: Any) -> list[list[int]]:
    """Prompts with shared, truncated and repeated prefixes, and fresh ones: the choices drawn from
    ``shape``, the token ids from ``tokens``."""
    groups = [unique(tokens, shape.randrange(600, 2200)) for _ in range(5)]
    prompts: list[list[int]] = []
    for _ in range(n_requests):
        roll = shape.random()
        if prompts and roll < 0.2:
            prompts.append(list(shape.choice(prompts)))  # an exact repeat
        elif roll < 0.8:
            g = shape.choice(groups)
            cut = len(g) if shape.random() < 0.5 else shape.randrange(20, len(g))
            prompts.append(g[:cut] + unique(tokens, shape.randrange(0, 300)))
        else:
            prompts.append(unique(tokens, shape.randrange(5, 2500)))
    return prompts


def predict(prompts: list[list[int]], block_size: int, num_gpu_blocks: int) -> list[int]:
    cache = KVCache(KVConfig(num_gpu_blocks=num_gpu_blocks, block_size=block_size))
    hits = []
    for rid, p in enumerate(prompts):
        toks = np.array(p, dtype=np.int64)
        cache.add_request(rid, hash_blocks(toks, block_size), len(p))
        lk = cache.lookup(rid, float(rid))
        assert cache.admit(rid, len(p) - lk.gpu_tokens, float(rid)) is not None
        cache.free(rid)
        hits.append(lk.gpu_tokens)
    return hits


def test_cached_tokens_match_a_real_vllm_under_eviction() -> None:
    url = running_server_url()
    snap = run(lambda s: client.scrape(s, url))
    info = snap.labels_of("vllm:cache_config_info")[0]
    block_size, num_gpu_blocks = int(info["block_size"]), int(info["num_gpu_blocks"])
    problems: list[str] = []
    for attempt in range(3):
        tokens = random.Random(time.time_ns())  # fresh token ids: nothing of this run is cached yet
        prompts = workload(random.Random(SHAPE_SEED), tokens, 60, client.unique_prompt)
        total_blocks = sum(len(p) // block_size for p in prompts)
        assert total_blocks > 2 * num_gpu_blocks, "the workload must cycle the whole cache"
        predicted = predict(prompts, block_size, num_gpu_blocks)
        unbounded = predict(prompts, block_size, 10 * total_blocks)
        # The test has teeth: eviction decides some hits (an unbounded cache would predict more).
        assert predicted != unbounded, \
            f"SHAPE_SEED {SHAPE_SEED} leaves eviction nothing to decide at {num_gpu_blocks} blocks"

        async def send(session: Any, prompts: list[list[int]] = prompts) -> list[Any]:
            return [await client.complete(session, url, p, 1) for p in prompts]

        with exclusive():
            try:
                done, deltas = run(lambda s: window(s, url, lambda: send(s)))
            except aiohttp.ClientError as exc:  # the server went away (restarted by someone)
                problems.append(f"attempt {attempt + 1}: {exc!r}")
                continue
        assert all(c.status == 200 and c.done for c in done), [c.raw_lines[-1:] for c in done]
        # Someone else's requests (outside the lane's lock) would evict ours: only a window whose
        # query counter holds exactly this workload is conclusive.
        if deltas.get("prefix_cache_queries") == sum(len(p) for p in prompts):
            break
        problems.append(f"attempt {attempt + 1}: other traffic in the counter window")
    else:
        pytest.skip(f"inconclusive: {problems}")
    observed = [c.cached_tokens for c in done]
    assert None not in observed, "the server needs --enable-prompt-tokens-details"
    mismatches = [(i, len(prompts[i]), o, p) for i, (o, p) in enumerate(zip(observed, predicted))
                  if o != p]
    assert not mismatches, f"(request, prompt length, vLLM, predicted): {mismatches}"
    assert deltas["prefix_cache_hits"] == sum(observed) > 0
    print(f"{len(prompts)} requests, {total_blocks} blocks, hits {sum(observed)} "
          f"(unbounded cache: {sum(unbounded)}), attempt {attempt + 1}")
