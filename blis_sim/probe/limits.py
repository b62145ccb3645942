"""What the probe reads from the server before planning: ``/v1/models`` and ``vllm:cache_config_info``.

API::

    limits = read_limits(url, model="m", max_num_seqs=256, max_num_batched_tokens=2048)   # ServerLimits

``max_model_len`` comes from the model's ``/v1/models`` entry (the first one when ``model`` is empty);
``block_size`` / ``num_gpu_blocks`` from ``vllm:cache_config_info`` on ``/metrics``. vLLM publishes neither
``max_num_seqs`` nor ``max_num_batched_tokens``: they are the caller's (flags, defaulting to vLLM's).
Explicit overrides win over what the server says; a limit neither gives is a ConfigError naming it.
"""
from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from blis_sim.errors import ConfigError, ServerError
from blis_sim.observe.scrape import Scraper
from blis_sim.probe.plan import ServerLimits


async def _models(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    try:
        async with session.get(url + "/v1/models", headers=headers) as r:
            if r.status != 200:
                raise ServerError(f"GET /v1/models: HTTP {r.status}", url=url)
            body = await r.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
        raise ServerError(f"GET /v1/models: {type(exc).__name__}: {exc}", url=url) from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        raise ServerError("GET /v1/models: no 'data' list of models", url=url)
    return data


def _max_model_len(models: list[dict[str, Any]], model: str, url: str) -> int | None:
    chosen = [m for m in models if m.get("id") == model] if model else models[:1]
    if model and not chosen:
        known = ", ".join(str(m.get("id")) for m in models)
        raise ServerError(f"model {model!r} is not served (serves: {known or 'nothing'})", url=url)
    value = chosen[0].get("max_model_len") if chosen else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def read_limits_async(url: str, *, model: str = "", api_key: str = "", timeout_s: float = 30.0,
                            metrics_url: str = "", **overrides: int) -> ServerLimits:
    """The server's limits; ``overrides`` (any ServerLimits field, 0 = not given) win over the server."""
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        found: dict[str, int | None] = {"max_model_len": _max_model_len(await _models(session, url, headers),
                                                                        model, url)}
        geometry = await Scraper(session, metrics_url or url + "/metrics", api_key=api_key,
                                 timeout_s=timeout_s).geometry() or {}
    found.update(geometry)
    values = {k: v for k, v in found.items() if v}
    values.update({k: v for k, v in overrides.items() if v})
    for name in ("max_model_len", "block_size", "num_gpu_blocks"):
        if name not in values:
            source = "/v1/models" if name == "max_model_len" else "vllm:cache_config_info on /metrics"
            raise ConfigError(f"the server does not say ({source}); pass --{name.replace('_', '-')}", field=name)
    return ServerLimits(**values)


def read_limits(url: str, **kw: Any) -> ServerLimits:
    from blis_sim.observe.loop import run

    return run(read_limits_async(url, **kw))
