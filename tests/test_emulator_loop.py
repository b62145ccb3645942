"""The emulator's event loop and clock: uvloop when available (stdlib fallback), and waits that are
never early whichever loop runs (uvloop's own timers and loop.time() count whole milliseconds)."""
from __future__ import annotations

import asyncio
import sys

import pytest

from blis_sim.emulator import loop as event_loop


async def _name() -> str:
    return event_loop.loop_name(asyncio.get_running_loop())


def test_loop_selection_and_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BLIS_NO_UVLOOP", raising=False)
    assert event_loop.run(_name()) == "uvloop"
    monkeypatch.setenv("BLIS_NO_UVLOOP", "1")
    assert event_loop.run(_name()) == "asyncio"
    monkeypatch.delenv("BLIS_NO_UVLOOP")
    monkeypatch.setitem(sys.modules, "uvloop", None)
    assert event_loop.run(_name()) == "asyncio"


@pytest.mark.parametrize("no_uvloop", ["0", "1"])
def test_sleep_until_is_never_early(monkeypatch: pytest.MonkeyPatch, no_uvloop: str) -> None:
    monkeypatch.setenv("BLIS_NO_UVLOOP", no_uvloop)

    async def body() -> list[float]:
        lateness = []
        for delay in (0.0003, 0.0007, 0.0013, 0.002, 0.0051, 0.0102):
            target = event_loop.now() + delay
            await event_loop.sleep_until(target)
            lateness.append(event_loop.now() - target)
        return lateness

    lateness = event_loop.run(body())
    assert all(x >= 0 for x in lateness), lateness


def test_spawned_emulator_stamps_sub_millisecond_ttft() -> None:
    """The subprocess runs on uvloop (the default); its per-request TTFT keeps sub-ms resolution
    (stamps from uvloop's loop.time() would be whole milliseconds)."""
    import httpx

    from blis_sim.emulator import EmulatorConfig, spawn_emulator

    cfg = EmulatorConfig(profile="zero", enable_per_request_metrics=True)
    with spawn_emulator(cfg) as emu:
        ttfts = []
        for _ in range(5):
            r = httpx.post(emu.url + "/v1/completions", json={"prompt": "hello there", "max_tokens": 2}, timeout=10)
            r.raise_for_status()
            m = r.json()["usage"]["metrics"]
            ttfts.append(m["time_to_first_token_ms"] + m["queue_time_ms"])
    assert any(t != round(t) for t in ttfts), ttfts
