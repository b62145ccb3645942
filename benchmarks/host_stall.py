"""Host stalls: how late a loaded machine makes the embedded emulator and the client, per request.

    python benchmarks/host_stall.py [--requests 30] [--prompt 256] [--profile h100-14b]

Starts the emulator (subprocess, per-request metrics on, no step noise) and sends ``--requests``
unique prompts of ``--prompt`` token ids one at a time, streaming 8 tokens. For each request it
splits the client's TTFT (send to first content chunk) into what the emulator's model says the first
step takes, and three kinds of lateness the model does not know about:

    queue    the server's arrival -> first scheduled (the engine loop did not run in time)
    step     the server's scheduled -> first token, minus the model's step time (its timer fired late)
    client   the client's TTFT minus the server's arrival -> first token (delivery both ways, the
             client's own event loop)

On an idle machine all three stay within ~1-2 ms; a main-job cell's TTFT MAPE is judged against a
model that cannot know them. Prints each request and the median / p90 / max of each, with the load.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from blis_sim.emulator import EmulatorConfig, spawn_emulator  # noqa: E402
from blis_sim.emulator.profiles import get_profile  # noqa: E402


async def measure(url: str, requests: int, prompt_len: int) -> list[tuple[float, float, float]]:
    """(client TTFT, server arrival -> first token, server queue), ms, per request."""
    rows = []
    async with aiohttp.ClientSession() as http:
        model = (await (await http.get(url + "/v1/models")).json())["data"][0]["id"]
        for _ in range(requests):
            body = {"model": model, "prompt": [random.randrange(1000, 30000) for _ in range(prompt_len)],
                    "max_tokens": 8, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            sent, first, usage = time.monotonic(), None, {}
            async with http.post(url + "/v1/completions", json=body) as resp:
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if first is None and chunk.get("choices"):
                        first = time.monotonic()
                    usage = chunk.get("usage") or usage
            metrics = usage["metrics"]
            server = metrics["queue_time_ms"] + metrics["time_to_first_token_ms"]
            rows.append(((first - sent) * 1000, server, metrics["queue_time_ms"]))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens (unique: every request misses)")
    parser.add_argument("--profile", default="h100-14b")
    args = parser.parse_args()
    profile = get_profile(args.profile)
    model_ms = 1000 * profile.step_seconds(args.prompt, 0, 0)
    load_before = os.getloadavg()[0]
    emu = spawn_emulator(EmulatorConfig(profile=args.profile, block_size=16, num_gpu_blocks=4096,
                                        enable_per_request_metrics=True, step_noise=0.0))
    try:
        rows = asyncio.run(measure(emu.url, args.requests, args.prompt))
    finally:
        emu.stop()
    queue = [q for _, _, q in rows]
    step = [s - q - model_ms for _, s, q in rows]
    client = [c - s for c, s, _ in rows]
    for (c, s, q), st, cl in zip(rows, step, client):
        print(f"client TTFT {c:6.1f} ms = model {model_ms:5.1f} + queue {q:5.1f} + step late {st:5.1f} + client {cl:5.1f}")
    print(f"load average {load_before:.2f} -> {os.getloadavg()[0]:.2f}; model first step {model_ms:.1f} ms")
    for name, values in (("queue", queue), ("step late", step), ("client", client)):
        ordered = sorted(values)
        print(f"{name:10} median {statistics.median(ordered):5.1f}  p90 {ordered[int(0.9 * (len(ordered) - 1))]:5.1f}"
              f"  max {ordered[-1]:5.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
