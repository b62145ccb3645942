"""Every fault the emulator injects, seen from a real client."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator

import aiohttp
import asyncio
import httpx
import pytest

from blis_sim.emulator import EmulatorConfig, FaultConfig, RunningEmulator, start_emulator
from blis_sim.errors import ConfigError


@pytest.fixture()
def emu() -> Iterator[RunningEmulator]:
    with start_emulator(EmulatorConfig(profile="zero", stats_interval_s=0)) as running:
        yield running


_CLIENT = httpx.Client(timeout=10)  # one client: building one per call costs ~0.1 s (TLS context)


def _complete(url: str, **body: object) -> httpx.Response:
    return _CLIENT.post(url + "/v1/completions", json={"prompt": "a b c", "max_tokens": 4, **body})


@pytest.mark.parametrize("mode", ["http500", "drop", "hang"])
def test_metrics_faults(emu: RunningEmulator, mode: str) -> None:
    emu.set_faults(FaultConfig(metrics=mode))
    if mode == "http500":
        assert _CLIENT.get(emu.url + "/metrics", timeout=5).status_code == 500
    elif mode == "drop":
        with pytest.raises(httpx.RemoteProtocolError):
            _CLIENT.get(emu.url + "/metrics", timeout=5)
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(emu.url + "/metrics", timeout=0.3)
    # Generation is unaffected, and clearing the fault brings /metrics back.
    assert _complete(emu.url).status_code == 200
    emu.set_faults(FaultConfig())
    assert _CLIENT.get(emu.url + "/metrics", timeout=5).status_code == 200


@pytest.mark.parametrize("status", [500, 429])
def test_error_rate(emu: RunningEmulator, status: int) -> None:
    emu.set_faults(FaultConfig(error_rate=0.5, error_status=status))
    codes = [_complete(emu.url).status_code for _ in range(40)]
    assert set(codes) == {200, status}
    assert 8 <= codes.count(status) <= 32  # seeded draws: a fixed, plausible split
    r = next(r for r in (_complete(emu.url) for _ in range(40)) if r.status_code == status)
    assert r.json()["error"]["code"] == status
    if status == 429:
        assert r.headers["retry-after"] == "1"


def test_error_draws_are_seeded() -> None:
    def run() -> list[int]:
        cfg = EmulatorConfig(profile="zero", seed=3, faults=FaultConfig(error_rate=0.3))
        with start_emulator(cfg) as e:
            return [_complete(e.url).status_code for _ in range(20)]
    assert run() == run()


def test_stream_cut_midway(emu: RunningEmulator) -> None:
    emu.set_faults(FaultConfig(stream_cut_rate=1.0, stream_cut_after_tokens=2))

    async def read() -> tuple[list[str], BaseException | None]:
        lines: list[str] = []
        async with aiohttp.ClientSession() as s:
            try:
                async with s.post(emu.url + "/v1/completions",
                                  json={"prompt": "a b", "max_tokens": 50, "stream": True}) as r:
                    async for raw in r.content:
                        if raw.strip():
                            lines.append(raw.decode().strip())
            except aiohttp.ClientError as exc:
                return lines, exc
        return lines, None

    lines, error = asyncio.run(read())
    assert error is not None  # the chunked body never completed
    assert len(lines) == 2 and "data: [DONE]" not in lines
    assert all(json.loads(ln[len("data: "):])["choices"][0]["finish_reason"] is None for ln in lines)
    deadline = time.monotonic() + 5
    while emu.published().stats.request_success["abort"] != 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_slow_first_token(emu: RunningEmulator) -> None:
    emu.set_faults(FaultConfig(first_token_delay_s=0.3))
    t0 = time.monotonic()
    with httpx.stream("POST", emu.url + "/v1/completions", timeout=10,
                      json={"prompt": "a", "max_tokens": 2, "stream": True}) as r:
        first = next(r.iter_lines())
        elapsed = time.monotonic() - t0
    assert first.startswith("data: {") and elapsed >= 0.3


def test_stalled_first_token(emu: RunningEmulator) -> None:
    emu.set_faults(FaultConfig(stall_rate=1.0))
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream("POST", emu.url + "/v1/completions", timeout=httpx.Timeout(5, read=0.3),
                          json={"prompt": "a", "max_tokens": 2, "stream": True}) as r:
            assert r.status_code == 200  # headers come, tokens never do
            next(r.iter_lines())


def test_counters_reset_mid_run() -> None:
    cfg = EmulatorConfig(profile="zero", stats_interval_s=0, faults=FaultConfig(reset_counters_after=3))
    ids = list(range(100, 164))
    with start_emulator(cfg) as emu:
        before_created = emu.published().stats.created
        for _ in range(2):
            _complete(emu.url, prompt=ids)
        assert emu.published().stats.prefix_queries == 128
        _complete(emu.url, prompt=ids)  # the third finish triggers the restart
        after = emu.published().stats
        assert after.prefix_queries == 0 and after.created > before_created
        r = _complete(emu.url, prompt=ids)
        # A restart also empties the prefix cache: the repeat is a miss again.
        assert emu.published().stats.prefix_hits == 0 and r.status_code == 200


def test_restart_via_http_and_fault_endpoint(emu: RunningEmulator) -> None:
    _complete(emu.url)
    assert _CLIENT.post(emu.url + "/_emulator/restart").status_code == 200
    assert emu.published().stats.prompt_tokens == 0
    r = _CLIENT.post(emu.url + "/_emulator/faults", json={"error_rate": 1.0, "error_status": 429})
    assert r.status_code == 200 and _complete(emu.url).status_code == 429
    bad = _CLIENT.post(emu.url + "/_emulator/faults", json={"error_rate": 2})
    assert bad.status_code == 400 and "error_rate" in bad.json()["error"]["message"]
    unknown = _CLIENT.post(emu.url + "/_emulator/faults", json={"bogus": 1})
    assert unknown.status_code == 400 and "bogus" in unknown.json()["error"]["message"]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"metrics": "flaky"}, "faults.metrics"),
    ({"error_rate": -0.1}, "faults.error_rate"),
    ({"error_status": 404}, "faults.error_status"),
    ({"reset_counters_after": 0}, "faults.reset_counters_after"),
])
def test_bad_fault_config_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        FaultConfig(**kwargs)
    assert info.value.location.field == field
