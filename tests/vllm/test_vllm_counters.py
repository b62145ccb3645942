"""What a real vLLM 0.32's prefix-cache counters and per-request cached tokens say, against hand-computed values.

The rule (docs/vllm-semantics.md §2, measured in docs/vllm-cpu-measurements.md §1): queries += the whole
prompt; hits += the cached prefix in whole 32-token blocks, never including the last prompt token (it is always
recomputed); on this CPU server every hit comes from the device, so ``prompt_tokens_cached_by_source{device}`` = hits and
``prompt_tokens_by_source`` splits the prompt into ``local_cache_hit`` = hits and ``local_compute`` = the rest.
``usage.prompt_tokens_details.cached_tokens`` is the same hit, per request.
"""
from __future__ import annotations

import random
from typing import Any

import pytest
from vllm_lane import VllmServer, client, run, window

pytestmark = pytest.mark.vllm


def expected_deltas(prompt_lens: list[int], hits: list[int]) -> dict[str, int]:
    """Every KV counter's delta for requests with these prompt lengths and hits, all from the GPU tier."""
    queries, hit = sum(prompt_lens), sum(hits)
    zero = {client.counter_key(name, labels): 0 for name, labels in client.KV_COUNTERS}
    return {**zero, "prefix_cache_queries": queries, "prefix_cache_hits": hit, "prompt_tokens": queries,
            "prompt_tokens_cached": hit, "prompt_tokens_cached_by_source[device]": hit,
            "prompt_tokens_by_source[local_compute]": queries - hit,
            "prompt_tokens_by_source[local_cache_hit]": hit}


def send(url: str, prompts: list[list[int]], max_tokens: int = 1, *, stream: bool = True,
         **body: Any) -> tuple[list[Any], dict[str, int]]:
    """Send the prompts one after another inside one counter window."""
    how = client.complete if stream else client.complete_plain

    async def requests(session: Any) -> list[Any]:
        return [await how(session, url, p, max_tokens, **body) for p in prompts]

    done, deltas = run(lambda s: window(s, url, lambda: requests(s)))
    assert all(c.status == 200 and c.done for c in done), [c.raw_lines[-1:] for c in done]
    return done, deltas


def test_hand_computed_hits_match_the_rule() -> None:
    # The expectations below, spelled out once: floor((n - 1) / 32) * 32 of a fully cached n-token prompt.
    assert [client.expected_hits(n, n) for n in (20, 32, 33, 1000, 1024, 1025)] == [0, 0, 32, 992, 992, 1024]
    assert client.expected_hits(1074, 1024) == 1024


def test_1024_token_prompt_twice(kv_window: VllmServer, rng: random.Random) -> None:
    prompt = client.unique_prompt(rng, 1024)
    done, deltas = send(kv_window.url, [prompt, prompt])
    assert [c.cached_tokens for c in done] == [0, 992]
    assert deltas == expected_deltas([1024, 1024], [0, 992])


def test_cached_prefix_with_a_new_suffix_hits_the_whole_prefix(kv_window: VllmServer, rng: random.Random) -> None:
    prefix = client.unique_prompt(rng, 1024)
    longer = prefix + client.unique_prompt(rng, 50)
    done, deltas = send(kv_window.url, [prefix, longer])
    assert [c.cached_tokens for c in done] == [0, 1024]
    assert deltas == expected_deltas([1024, 1074], [0, 1024])


@pytest.mark.parametrize(("length", "repeat_hit"), [(20, 0), (32, 0), (33, 32), (1000, 992), (1025, 1024)])
def test_repeat_hits_whole_blocks_short_of_the_last_token(kv_window: VllmServer, rng: random.Random,
                                                          length: int, repeat_hit: int) -> None:
    prompt = client.unique_prompt(rng, length)
    done, deltas = send(kv_window.url, [prompt, prompt])
    assert [c.cached_tokens for c in done] == [0, repeat_hit]
    assert deltas == expected_deltas([length, length], [0, repeat_hit])


def test_prompt_logprobs_requests_bypass_the_prefix_cache(kv_window: VllmServer, rng: random.Random) -> None:
    prompt = client.unique_prompt(rng, 1024)
    send(kv_window.url, [prompt])  # now cached
    done, deltas = send(kv_window.url, [prompt], stream=False, prompt_logprobs=1)  # vLLM refuses it on a stream
    # Neither counted as a query nor served from the cache; the prompt still counts as prompt tokens.
    assert done[0].cached_tokens == 0
    assert deltas["prefix_cache_queries"] == 0 and deltas["prefix_cache_hits"] == 0
    assert deltas["prompt_tokens"] == 1024
    # And the cache still holds the prompt afterwards.
    done, deltas = send(kv_window.url, [prompt])
    assert done[0].cached_tokens == 992
    assert deltas == expected_deltas([1024], [992])


def test_many_distinct_prompts_evict_an_earlier_one(kv_window: VllmServer, rng: random.Random) -> None:
    blocks_per_prompt = 1024 // kv_window.block_size
    fills = kv_window.num_gpu_blocks // blocks_per_prompt + 1  # more distinct blocks than the cache holds
    if fills > 64:
        pytest.skip(f"{kv_window.num_gpu_blocks} GPU blocks: too much traffic to elicit eviction; start the "
                    "server with --num-gpu-blocks-override 512 (tools/vllm_cpu.py does)")
    first = client.unique_prompt(rng, 1024)
    send(kv_window.url, [first])
    send(kv_window.url, [client.unique_prompt(rng, 1024) for _ in range(fills)])
    done, deltas = send(kv_window.url, [first])
    assert done[0].cached_tokens == 0
    assert deltas == expected_deltas([1024], [0])
    assert deltas["num_preemptions"] == 0


@pytest.mark.parametrize("evicted", [1, 11, 25])
def test_lru_evicts_the_tail_of_the_oldest_prompt_first(kv_window: VllmServer, rng: random.Random,
                                                        evicted: int) -> None:
    """Reverse-order freeing: the victim's last blocks go first, so a partial eviction keeps its prefix."""
    lengths = client.evicting_fills(kv_window.num_gpu_blocks, 1024 // kv_window.block_size, evicted,
                                    kv_window.block_size)
    if len(lengths) > 64:
        pytest.skip(f"{kv_window.num_gpu_blocks} GPU blocks: too much traffic to elicit eviction")
    victim = client.unique_prompt(rng, 1024)
    send(kv_window.url, [victim])
    send(kv_window.url, [client.unique_prompt(rng, n) for n in lengths])
    done, deltas = send(kv_window.url, [victim])
    kept = (1024 // kv_window.block_size - evicted) * kv_window.block_size
    hit = client.expected_hits(1024, kept, kv_window.block_size)  # evicting only the last block costs nothing
    assert done[0].cached_tokens == hit
    assert deltas == expected_deltas([1024], [hit])
