"""A real vLLM's endpoints as the harness uses them: /version, /tokenize, cache_config_info, SSE framing."""
from __future__ import annotations

import json
import random
from typing import Any

import pytest
from vllm_lane import VllmServer, client, run

pytestmark = pytest.mark.vllm


def test_version_is_the_pinned_release(vllm_server: VllmServer) -> None:
    async def get(session: Any) -> Any:
        async with session.get(vllm_server.url + "/version") as resp:
            return resp.status, await resp.json()

    status, body = run(get)
    assert status == 200
    assert body == {"version": "0.32.0"}


def test_cache_config_info_reports_the_lane_geometry(vllm_server: VllmServer) -> None:
    snap = run(lambda s: client.scrape(s, vllm_server.url))
    [config] = snap.labels_of("vllm:cache_config_info")
    assert config["block_size"] == "32"
    assert config["enable_prefix_caching"] == "True"
    assert int(config["num_gpu_blocks"]) > 0
    if vllm_server.requested_gpu_blocks is not None:  # the lane's --num-gpu-blocks-override took effect
        assert config["num_gpu_blocks"] == str(vllm_server.requested_gpu_blocks)


def test_counters_carry_engine_and_model_labels_and_no_legacy_names(vllm_server: VllmServer) -> None:
    snap = run(lambda s: client.scrape(s, vllm_server.url))
    for labels in snap.labels_of("vllm:prefix_cache_queries_total"):
        assert labels == {"engine": "0", "model_name": client.MODEL}
    sources = {lab["source"] for lab in snap.labels_of("vllm:prompt_tokens_cached_by_source_total")}
    assert sources == {"device", "host", "p2p", "disk", "external_unspecified"}
    assert not [f for f in snap.families if f.startswith("vllm:gpu_prefix_cache")]  # removed in vLLM 0.12
    assert not [f for f in snap.families if f.startswith("vllm:kv_offload")]  # no offloading on CPU


def test_tokenize_counts_what_a_completion_reports_as_prompt_tokens(kv_window: VllmServer) -> None:
    vllm_server = kv_window
    text = "def calibrate(trace, simulator):\n    return simulator.replay(trace)\n"

    async def both(session: Any) -> Any:
        async with session.post(vllm_server.url + "/tokenize",
                                json={"model": client.MODEL, "prompt": text}) as resp:
            assert resp.status == 200
            tokenized = await resp.json()
        done = await client.complete(session, vllm_server.url, text, 2)
        return tokenized, done

    tokenized, done = run(both)
    assert tokenized["count"] == len(tokenized["tokens"]) > 5
    assert tokenized["max_model_len"] == 8192
    assert all(isinstance(t, int) for t in tokenized["tokens"])
    assert done.usage["prompt_tokens"] == tokenized["count"]


def test_stream_framing_with_include_usage(kv_window: VllmServer, rng: random.Random) -> None:
    vllm_server = kv_window
    prompt = client.unique_prompt(rng, 40)
    done = run(lambda s: client.complete(s, vllm_server.url, prompt, 6, ignore_eos=True))
    assert done.status == 200
    # Events: "data: <json>" lines, each followed by one blank line; the stream ends with "data: [DONE]".
    lines = done.raw_lines
    events = lines[0::2]
    assert all(line == "" for line in lines[1::2])
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]" and done.done
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    assert {c["object"] for c in chunks} == {"text_completion"}
    content, (usage_chunk,) = chunks[:-1], chunks[-1:]
    # Usually one chunk per generated token, but a lagging frontend coalesces several tokens into one chunk
    # (seen here under load: 2 chunks for 6 tokens); only the last says why it stopped; usage comes alone, after.
    assert 1 <= len(content) <= 6
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * (len(content) - 1) + ["length"]
    assert all(len(c["choices"]) == 1 and c["choices"][0]["index"] == 0 for c in content)
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["prompt_tokens"] == 40 and usage["completion_tokens"] == 6 and usage["total_tokens"] == 46
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}  # --enable-prompt-tokens-details
    assert done.first_byte is not None and done.first_token is not None
    assert done.first_byte <= done.first_token <= done.end


def test_stream_without_include_usage_has_no_usage_chunk(kv_window: VllmServer,
                                                         rng: random.Random) -> None:
    vllm_server = kv_window
    prompt = client.unique_prompt(rng, 40)
    done = run(lambda s: client.complete(s, vllm_server.url, prompt, 3, ignore_eos=True, stream_options=None))
    assert done.status == 200 and done.done
    assert done.usage is None
    assert all(c["choices"] for c in done.chunks)
