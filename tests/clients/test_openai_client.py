"""The official OpenAI Python client against the emulator serving the tiny model's tokenizer, and (marked ``vllm``)
against the real lane server: model list, completions, chat, streaming with ``stream_options.include_usage``, and
the errors it raises. Token counts are the tokenizer's own (the template's, for chat), so they are the same numbers
on both servers.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from external import SERVED, external_step, lane_like, tiny_tokenizer
from vllm_lane import exclusive, running_server_url

from blis_sim.emulator import start_emulator
from blis_sim.emulator.hf_tokenizer import load_hf_tokenizer

openai = pytest.importorskip("openai", reason="the OpenAI client is in the dev extra: pip install -e '.[dev]'")
PROMPT = "The scheduler admits waiting requests in arrival order"
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module", params=["emulator", pytest.param("real", marks=pytest.mark.vllm)])
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "real":
        url = running_server_url()
        with exclusive():
            yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        return
    external_step()
    with start_emulator(lane_like(tiny_tokenizer())) as emu:
        yield openai.OpenAI(base_url=emu.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def counts() -> dict[str, int]:
    tok = load_hf_tokenizer(tiny_tokenizer())
    chat = tok.render_chat(MESSAGES, add_generation_prompt=True)
    return {"completion": len(tok.encode_prompt(PROMPT, add_special_tokens=True)),
            "chat": len(tok.encode_prompt(chat, add_special_tokens=False))}


def test_models(client: Any) -> None:
    (model,) = client.models.list().data
    assert model.id == SERVED and model.owned_by == "vllm"


def test_completion(client: Any, counts: dict[str, int]) -> None:
    r = client.completions.create(model=SERVED, prompt=PROMPT, max_tokens=5, extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert isinstance(r.choices[0].text, str)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        counts["completion"], 5, counts["completion"] + 5)


def test_chat(client: Any, counts: dict[str, int]) -> None:
    r = client.chat.completions.create(model=SERVED, messages=MESSAGES, max_tokens=4, extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (counts["chat"], 4)


def test_streamed_chat_with_usage(client: Any, counts: dict[str, int]) -> None:
    chunks = list(client.chat.completions.create(model=SERVED, messages=MESSAGES, max_tokens=6, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    *content, last = chunks
    assert content[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in content] == [None] * (len(content) - 1) + ["length"]
    assert all(c.usage is None for c in content) and last.choices == []
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (counts["chat"], 6)
    assert len({c.id for c in chunks}) == 1


def test_streamed_completion_with_usage(client: Any, counts: dict[str, int]) -> None:
    chunks = list(client.completions.create(model=SERVED, prompt=PROMPT, max_tokens=6, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    *content, last = chunks
    assert len(content) == 6 and content[-1].choices[0].finish_reason == "length"
    assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens) == (counts["completion"], 6)


def test_errors(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=SERVED, prompt=PROMPT, max_tokens=9000)
    assert too_long.value.status_code == 400 and too_long.value.param == "max_tokens"
    assert "cannot be greater than max_model_len=8192" in too_long.value.message
    with pytest.raises(openai.BadRequestError) as overflow:
        client.completions.create(model=SERVED, prompt=[100] * 8200, max_tokens=1)
    assert overflow.value.param == "input_tokens" and "maximum context length is 8192" in overflow.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=2)
    assert unknown.value.status_code == 404 and unknown.value.param == "model"
    assert unknown.value.type == "NotFoundError"
