"""observe's event loop: uvloop when it imports, the stdlib loop when it does not or when
BLIS_NO_UVLOOP=1; observe() runs on it."""
from __future__ import annotations

import asyncio
import sys

import pytest

from blis_sim.observe import loop as event_loop


async def _running_loop_name() -> str:
    return event_loop.loop_name(asyncio.get_running_loop())


def test_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BLIS_NO_UVLOOP", raising=False)
    assert event_loop.run(_running_loop_name()) == "uvloop"


def test_env_switch_selects_the_stdlib_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLIS_NO_UVLOOP", "1")
    assert event_loop.run(_running_loop_name()) == "asyncio"
    monkeypatch.setenv("BLIS_NO_UVLOOP", "0")
    assert event_loop.run(_running_loop_name()) == "uvloop"


def test_falls_back_when_uvloop_cannot_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BLIS_NO_UVLOOP", raising=False)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` now raises ImportError
    assert event_loop.loop_factory() is asyncio.new_event_loop
    assert event_loop.run(_running_loop_name()) == "asyncio"


@pytest.mark.parametrize("no_uvloop", ["0", "1"])
def test_observe_runs_on_the_selected_loop(monkeypatch: pytest.MonkeyPatch, no_uvloop: str) -> None:
    from blis_sim.emulator import EmulatorConfig, start_emulator
    from blis_sim.formats.workload import WorkloadSpec
    from blis_sim.observe import run as observe_run

    seen: list[str] = []
    real = observe_run.observe_async

    async def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(event_loop.loop_name(asyncio.get_running_loop()))
        return await real(*args, **kwargs)

    monkeypatch.setenv("BLIS_NO_UVLOOP", no_uvloop)
    monkeypatch.setattr(observe_run, "observe_async", spy)
    spec = WorkloadSpec.model_validate({
        "version": "2", "seed": 1, "aggregate_rate": 50, "num_requests": 3,
        "clients": [{"id": "c", "rate_fraction": 1, "streaming": True,
                     "input_distribution": {"type": "constant", "params": {"value": 16}},
                     "output_distribution": {"type": "constant", "params": {"value": 2}}}]})
    with start_emulator(EmulatorConfig(profile="zero")) as emu:
        result = observe_run.observe(emu.url, spec, observe_run.ObserveOptions(model="tiny-llama", progress=False))
    assert seen == ["asyncio" if no_uvloop == "1" else "uvloop"]
    assert [r.status for r in result.trace.records] == ["ok"] * 3
