"""Every HTTP endpoint of the emulator, over a real loopback socket, with vLLM's shapes."""
from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from blis_sim.emulator import EmulatorConfig, RunningEmulator, start_emulator
from blis_sim.emulator.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    cfg = EmulatorConfig(profile="zero", block_size=16, num_gpu_blocks=256, max_model_len=512,
                         enable_prompt_tokens_details=True, stats_interval_s=0)
    with start_emulator(cfg) as running:
        yield running


@pytest.fixture()
def client(emu: RunningEmulator) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=emu.url, timeout=10) as c:
        yield c


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, checking the framing (each event ends in a blank line)."""
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e[len("data: "):] for e in events]


def test_health_version_models(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    assert client.get("/version").json() == {"version": "0.33.0"}
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["tiny-llama"]
    assert models["data"][0]["max_model_len"] == 512 and models["data"][0]["owned_by"] == "vllm"


def test_tokenize_detokenize_and_usage_agree(client: httpx.Client) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    tok = client.post("/tokenize", json={"model": "tiny-llama", "prompt": text}).json()
    assert tok["count"] == len(tok["tokens"]) == len(Tokenizer().encode(text))
    assert tok["max_model_len"] == 512
    assert client.post("/detokenize", json={"tokens": tok["tokens"]}).json() == {"prompt": text}
    usage = client.post("/v1/completions", json={"prompt": text, "max_tokens": 2}).json()["usage"]
    assert usage["prompt_tokens"] == tok["count"]
    chat_tok = client.post("/tokenize", json={"messages": [{"role": "user", "content": text}]}).json()
    chat = client.post("/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": text}], "max_tokens": 2}).json()
    assert chat["usage"]["prompt_tokens"] == chat_tok["count"]


def test_streaming_completion_framing(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": "tiny-llama", "prompt": "hello there", "max_tokens": 5,
                                             "stream": True, "stream_options": {"include_usage": True}},
                    headers={"X-Request-Id": "req-42"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-request-id"] == "req-42"
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content, usage = chunks[:-1], chunks[-1]
    assert len(content) == 5  # one event per generated token
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("cmpl-")
    for c in content:
        assert c["object"] == "text_completion" and c["model"] == "tiny-llama"
        (choice,) = c["choices"]
        assert list(choice) == ["index", "text", "logprobs", "finish_reason", "stop_reason",
                                "prompt_token_ids", "token_ids"]
        assert choice["text"]
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * 4 + ["length"]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 5
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 5
    assert usage["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_continuous_usage_stats(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3, "stream": True,
                                             "stream_options": {"include_usage": True,
                                                                "continuous_usage_stats": True}})
    chunks = [json.loads(e) for e in sse_events(r.text)[:-1]]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3, 3]
    assert chunks[-1]["choices"] == []


def test_per_request_metrics() -> None:
    cfg = EmulatorConfig(profile="tiny-cpu", step_noise=0.0, enable_per_request_metrics=True)
    with start_emulator(cfg) as e, httpx.Client(base_url=e.url, timeout=10) as c:
        r = c.post("/v1/completions", json={"prompt": list(range(100, 164)), "max_tokens": 40, "stream": True,
                                            "stream_options": {"include_usage": True}})
        usage = json.loads(sse_events(r.text)[-2])["usage"]
    m = usage["metrics"]
    assert set(m) == {"time_to_first_token_ms", "queue_time_ms", "mean_itl_ms", "generation_time_ms",
                      "tokens_per_second"}
    assert m["time_to_first_token_ms"] >= 7.42  # one 64-token prefill step of the tiny-cpu model
    # 39 decode steps of 2.0 ms, each paced from the previous step's target: a late first token
    # (under 20 ms late, or pacing restarts from it) can be absorbed by the following steps, but
    # the last token cannot come before the schedule's end: 78 - 20 ms over 39 gaps > 1.0 ms.
    assert m["mean_itl_ms"] > 1.0 and m["generation_time_ms"] >= 58.0


def test_streaming_without_usage_ends_with_done(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3, "stream": True})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and len(events) == 4
    assert all("usage" not in json.loads(e) for e in events[:-1])


def test_streaming_chat_sends_role_with_first_token(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}})
    events = sse_events(r.text)
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["object"] == "chat.completion.chunk" and chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"]["content"] for c in chunks[1:-1]]
    assert len(deltas) == 3 and all(deltas)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 3


def test_non_streaming_completion_and_chat(client: httpx.Client) -> None:
    body = client.post("/v1/completions", json={"prompt": "one two three", "max_tokens": 4}).json()
    assert body["object"] == "text_completion"
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length" and len(Tokenizer().encode(choice["text"])) == 4
    chat = client.post("/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                             "max_completion_tokens": 2}).json()
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] == 2


def test_default_max_tokens(client: httpx.Client) -> None:
    assert client.post("/v1/completions", json={"prompt": "x"}).json()["usage"]["completion_tokens"] == 16
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}).json()
    assert chat["usage"]["total_tokens"] == 512  # chat default: the rest of the context


def test_token_id_prompts_and_cached_tokens(client: httpx.Client) -> None:
    ids = list(range(3000, 3100))
    first = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 1}).json()
    again = client.post("/v1/completions", json={"prompt": [ids], "max_tokens": 1}).json()
    assert first["usage"]["prompt_tokens"] == 100
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 96  # floor(99/16)*16


def test_min_tokens_ignore_eos_and_stop() -> None:
    cfg = EmulatorConfig(profile="zero", eos_probability=1.0, stats_interval_s=0)
    with start_emulator(cfg) as e, httpx.Client(base_url=e.url, timeout=10) as c:
        stop = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 8}).json()["choices"][0]
        assert stop["finish_reason"] == "stop"
        assert c.post("/v1/completions", json={"prompt": "a", "max_tokens": 8, "min_tokens": 3}
                      ).json()["usage"]["completion_tokens"] == 3
        ignored = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 8, "ignore_eos": True}).json()
        assert ignored["usage"]["completion_tokens"] == 8 and ignored["choices"][0]["finish_reason"] == "length"
        success = e.published().stats.request_success
        assert success["stop"] == 2 and success["length"] == 1


def test_prompt_logprobs_returned(client: httpx.Client) -> None:
    body = client.post("/v1/completions", json={"prompt": [5000, 5001, 5002], "max_tokens": 1,
                                                "prompt_logprobs": 0}).json()
    plp = body["choices"][0]["prompt_logprobs"]
    assert plp[0] is None and len(plp) == 3 and "5001" in plp[1]


@pytest.mark.parametrize(("path", "body", "status", "needle"), [
    ("/v1/completions", {"prompt": "x", "model": "other"}, 404, "does not exist"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 600}, 400, "max_tokens=600 cannot be greater than max_model_len=512"),
    ("/v1/completions", {"prompt": [5] * 520}, 400, "maximum context length is 512 tokens. However, your prompt "
                                                    "contains 520 input tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": ""}, 400, "empty"),
    ("/v1/completions", {"prompt": 7}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 99999999]}, 400, "out of vocabulary"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream=True"),
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n=1"),
    ("/v1/chat/completions", {"messages": []}, 400, "empty conversation"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/detokenize", {"tokens": ["a"]}, 400, "tokens"),
])
def test_errors_are_shaped_like_vllm(client: httpx.Client, path: str, body: dict, status: int,
                                     needle: str) -> None:
    r = client.post(path, json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert needle in err["message"] and err["code"] == status and set(err) == {"message", "type", "param", "code"}


def test_malformed_json_is_a_400(client: httpx.Client) -> None:
    r = client.post("/v1/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


def test_reset_prefix_cache(emu: RunningEmulator, client: httpx.Client) -> None:
    ids = list(range(7000, 7064))
    client.post("/v1/completions", json={"prompt": ids, "max_tokens": 1})
    assert client.post("/reset_prefix_cache").status_code == 200
    again = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 1}).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_client_disconnect_aborts_the_request(emu: RunningEmulator) -> None:
    cfg = EmulatorConfig(profile="tiny-cpu", stats_interval_s=0)
    with start_emulator(cfg) as e:
        with httpx.Client(base_url=e.url, timeout=10) as c, c.stream(
                "POST", "/v1/completions", json={"prompt": "a b c", "max_tokens": 2000, "stream": True}) as r:
            next(r.iter_lines())
        # The server notices on its next write; the engine then frees the request.
        import time
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and e.published().stats.request_success["abort"] == 0:
            time.sleep(0.02)
        pub = e.published()
        assert pub.stats.request_success["abort"] == 1 and pub.running == 0


def test_an_engine_failure_answers_500_instead_of_hanging(monkeypatch: pytest.MonkeyPatch) -> None:
    from blis_sim.emulator.scheduler import Scheduler

    def broken(self: Scheduler, plan: object, now: float) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(Scheduler, "finish_step", broken)
    with start_emulator(EmulatorConfig(profile="zero")) as e, httpx.Client(base_url=e.url, timeout=10) as c:
        first = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, "stream": True})
        events = sse_events(first.text)
        assert "boom" in json.loads(events[0])["error"]["message"] and events[-1] == "[DONE]"
        second = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})
        assert second.status_code == 500 and "boom" in second.json()["error"]["message"]
