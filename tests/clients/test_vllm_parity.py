"""Field by field, the emulator given the tiny model's tokenizer answers as the real lane server (vLLM 0.32) does:
the same keys in the same order, the same usage and finish reasons, the same error bodies (message, type, param,
code) and the same SSE framing (events, where usage and the fingerprint go, ``[DONE]``). Generated text, ids and
timestamps differ by nature and are masked; so is the fingerprint (ours says ``blisemu``). The differences left on
purpose are listed in docs/emulator.md ("Drop-in for your model"). Marked ``vllm``: runs in the lane.

Also here: ``/tokenize`` of both agree token for token, and prompts that observe builds offline with the tokenizer
(``--tokenizer``) have the requested length on the real server.
"""
from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from external import lane_like, tiny_tokenizer
from vllm_lane import exclusive, running_server_url

from blis_sim.emulator import RunningEmulator, start_emulator

pytestmark = pytest.mark.vllm
MASKED = {"id", "created", "text", "content", "system_fingerprint"}


def mask(value: Any) -> Any:
    """The shape of a JSON answer: keys kept in order, values kept, but those that differ by nature (a random
    model's token may stream as "" while its bytes are an incomplete UTF-8 character)."""
    if isinstance(value, dict):
        return [(k, "<masked>" if k in MASKED and v is not None else mask(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value


def events(text: str) -> list[Any]:
    """An SSE body as its events (masked JSON, or the literal ``[DONE]``); the framing must be exact."""
    assert text.endswith("\n\n"), text[-80:]
    out = []
    for block in text[:-2].split("\n\n"):
        assert block.startswith("data: ") and "\n" not in block, block
        payload = block[len("data: "):]
        out.append(payload if payload == "[DONE]" else mask(json.loads(payload)))
    return out


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, RunningEmulator]]:
    """The real server (held for the module: its generation requests stay out of other tests' counter windows)
    and the emulator configured as the lane starts it."""
    url = running_server_url()
    with exclusive(), start_emulator(lane_like(tiny_tokenizer())) as emu:
        yield url, emu


def both(servers: tuple[str, RunningEmulator], path: str, body: dict[str, Any]) -> list[httpx.Response]:
    real, emu = servers
    return [httpx.post(base + path, json=body, timeout=60) for base in (real, emu.url)]


def prompt(rng: random.Random) -> str:
    """Under one block (32 tokens), so neither server has a cached block of it."""
    return " ".join(rng.choice(["oak", "pine", "river", "stone", "cloud", "ember"]) for _ in range(6))


STREAMS = {"no usage": {}, "include_usage": {"stream_options": {"include_usage": True}},
           "continuous usage": {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}}


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("stream", [None, *STREAMS])
def test_answers_match_field_by_field(servers: tuple[str, RunningEmulator], chat: bool, stream: str | None) -> None:
    rng = random.Random()
    body: dict[str, Any] = {"max_tokens": 3, "ignore_eos": True}
    body.update({"messages": [{"role": "user", "content": prompt(rng)}]} if chat else {"prompt": prompt(rng)})
    if stream is not None:
        body.update(stream=True, **STREAMS[stream])
    real, emu = both(servers, "/v1/chat/completions" if chat else "/v1/completions", body)
    assert (real.status_code, emu.status_code) == (200, 200)
    assert emu.headers["content-type"] == real.headers["content-type"]
    if stream is None:
        assert mask(emu.json()) == mask(real.json())
    else:
        assert events(emu.text) == events(real.text)


ERRORS = [
    ("/v1/completions", {"prompt": "x", "model": "nope"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "model": "nope"}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 9000}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 9000}),
    ("/v1/completions", {"prompt": [100] * 8200, "max_tokens": 1}),
    ("/v1/completions", {"prompt": [100] * 8193, "max_tokens": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": " oak" * 8300}], "max_tokens": 5}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}),
    ("/v1/completions", {"prompt": "", "max_tokens": 4}),
    ("/v1/completions", {"max_tokens": 4}),
    ("/v1/completions", {"prompt": [9000], "max_tokens": 4}),
    ("/v1/completions", {"prompt": "x", "min_tokens": 5, "max_tokens": 2}),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": [], "max_tokens": 4}),
    ("/tokenize", {"prompt": "x", "model": "nope"}),
]


@pytest.mark.parametrize(("path", "body"), ERRORS, ids=[f"{p} {json.dumps(b)[:60]}" for p, b in ERRORS])
def test_error_bodies_match(servers: tuple[str, RunningEmulator], path: str, body: dict[str, Any]) -> None:
    real, emu = both(servers, path, body)
    assert real.status_code >= 400
    assert (emu.status_code, emu.json()) == (real.status_code, real.json())


def test_a_max_tokens_past_the_context_is_cut_as_vllm_cuts_it(servers: tuple[str, RunningEmulator]) -> None:
    real, emu = both(servers, "/v1/completions", {"prompt": [100] * 8180, "max_tokens": 50, "ignore_eos": True})
    usage = [r.json()["usage"] for r in (real, emu)]
    assert usage[0]["completion_tokens"] == 12 and usage[1] == {**usage[0], "prompt_tokens_details": usage[1][
        "prompt_tokens_details"]}
    assert [r.json()["choices"][0]["finish_reason"] for r in (real, emu)] == ["length", "length"]


TEXTS = ["Hello world, the quick brown fox", " oak pine  x\n\tcafé 日本", "<s>hi</s>", "def f(x):\n    return x"]


@pytest.mark.parametrize("special", [True, False])
def test_tokenize_agrees_token_for_token(servers: tuple[str, RunningEmulator], special: bool) -> None:
    for text in TEXTS:
        body = {"prompt": text, "add_special_tokens": special, "return_token_strs": True}
        real, emu = both(servers, "/tokenize", body)
        assert emu.json() == real.json(), text
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, {"role": "assistant", "content": "c"}]
    for generation in (True, False):
        real, emu = both(servers, "/tokenize", {"messages": messages, "add_generation_prompt": generation})
        assert emu.json() == real.json()
    real, emu = both(servers, "/detokenize", {"tokens": [1, 500, 600, 2, 9000]})
    assert emu.json() == real.json()


@pytest.mark.parametrize("api_format", ["completions", "chat"])
def test_offline_prompts_have_their_length_on_the_real_server(servers: tuple[str, RunningEmulator],
                                                              api_format: str) -> None:
    """observe --tokenizer: prompts built without the server's /tokenize have the asked-for token count there."""
    import aiohttp

    from blis_sim.observe.client import Target
    from blis_sim.observe.prompts import calibrate_prompts

    real, _ = servers
    target = Target(real, "tiny-llama", api_format, "", 30.0)

    async def build() -> Any:
        async with aiohttp.ClientSession() as session:
            return await calibrate_prompts(session, target, use_tokenize=False, tokenizer=str(tiny_tokenizer()))

    builder = asyncio.run(build())
    assert builder.mode == "exact" and "tokenizer" in builder.describe()
    rng = random.Random(5)
    for length in (40, 257, 1000):
        ids = [rng.randrange(10**6) for _ in range(length)]
        text = builder.text(ids)
        body: dict[str, Any] = ({"messages": [{"role": "user", "content": text}]} if api_format == "chat"
                                else {"prompt": text})
        count = httpx.post(real + "/tokenize", json=body, timeout=30).json()["count"]
        assert count == length
