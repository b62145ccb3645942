"""Observe's fault matrix, completed (issue 14; docs/reliability.md has the whole matrix):

- SIGINT and SIGTERM at every phase boundary (before the version query, during prompt calibration, at the
  window's opening scrape, at the start of the second phase, at the window's closing scrape, after the last
  phase): each gives a partial trace naming the signal, written atomically, and no windowed hit-rate unless
  the window closed;
- a full disk while the trace is written (ENOSPC injected into the write): one error line, exit 2, nothing
  under either final name, no temp file;
- ``/metrics`` answering slowly: within the timeout the window is intact; beyond it the run goes on, warns,
  and the trace is written without the windowed hit-rate.

The server restarting mid-run (a counter reset) is in tests/test_observe_run.py (real aiohttp fake) and
tests/test_emulator_faults.py (the emulator's restart fault).
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import os
import signal
from pathlib import Path
from typing import Any

import pytest

import blis_sim.formats._io as io_mod
import blis_sim.observe.run as run_mod
from blis_sim.cli import main as blis_main
from blis_sim.formats.trace import load_trace
from blis_sim.formats.workload import parse_workload_spec
from blis_sim.observe.run import ObserveOptions, observe, write_result
from blis_sim.observe.scrape import CounterWindow
import test_observe_run
from test_observe_run import FakeVllm

fake = test_observe_run.fake  # the fixture: a vLLM-like aiohttp server on 127.0.0.1

TWO_PHASES = """
version: "2"
seed: 7
aggregate_rate: 200
phases:
  - name: seed
    num_requests: 2
    clients:
      - {id: g, rate_fraction: 1, streaming: true, prefix_group: sys, prefix_length: 16,
         arrival: {process: constant}, input_distribution: {type: constant, params: {value: 6}},
         output_distribution: {type: constant, params: {value: 3}}}
  - {name: repeat, repeat: seed, num_requests: 2}
"""


def _opts(**kw: Any) -> ObserveOptions:
    base: dict[str, Any] = dict(model="m", max_concurrency=2, scrape_kv_metrics=True, settle_s=0.0,
                                progress=False, handle_signals=True, grace_s=0.2)
    base.update(kw)
    return ObserveOptions(**base)


def _signal_before(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, sig: int, *,
                   when: Any = None) -> None:
    """Deliver ``sig`` to this process just before ``owner.name`` runs (the first time ``when`` holds)."""
    original = getattr(owner, name)
    fired = []

    def _fire(args: tuple[Any, ...]) -> None:
        if not fired and (when is None or when(*args)):
            fired.append(True)
            os.kill(os.getpid(), sig)

    if asyncio.iscoroutinefunction(original):
        async def wrapper(*args: Any, **kw: Any) -> Any:
            _fire(args)
            await asyncio.sleep(0)  # the loop runs the signal handler here, before the boundary's work
            return await original(*args, **kw)
    else:
        def wrapper(*args: Any, **kw: Any) -> Any:
            _fire(args)
            return original(*args, **kw)
    monkeypatch.setattr(owner, name, wrapper)


BOUNDARIES = {
    # boundary: (owner, attribute, condition on the call's arguments,
    #            every request sent and answered?, does the window close?, is the trace partial?)
    "start": (run_mod._Run, "_version", None, False, False, True),
    "prompt-calibration": (run_mod, "calibrate_prompts", None, False, False, True),
    "window-open": (CounterWindow, "open", None, False, False, True),
    "second-phase": (run_mod._Run, "_run_phase", lambda self, d, phase, measured: phase.name == "repeat",
                     False, False, True),
    # every request is done when the closing scrape starts: it completes, the stop is still recorded
    "window-close": (CounterWindow, "close", None, True, True, True),
    # the result is already built: the stop comes too late to cut anything
    "after-last-phase": (run_mod._Run, "_result", None, True, True, False),
}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("boundary", sorted(BOUNDARIES))
def test_a_signal_at_a_phase_boundary_gives_a_partial_trace(fake: tuple[FakeVllm, str], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch, boundary: str,
                                                            sig: int) -> None:
    _server, url = fake
    owner, name, when, all_done, window_closes, partial = BOUNDARIES[boundary]
    _signal_before(monkeypatch, owner, name, sig, when=when)
    result = observe(url, parse_workload_spec(TWO_PHASES), _opts())
    header, data = tmp_path / "t.yaml", tmp_path / "t.csv"
    write_result(result, header, data)
    trace = load_trace(header, data)
    ours = trace.header.pytest_blis
    assert ours is not None
    assert result.interrupted == ours.partial == partial
    if partial:
        assert signal.Signals(sig).name in ours.partial_reason
    done = len(trace.records) == 4 and all(r.status == "ok" for r in trace.records)
    assert done == all_done, [(r.status, r.error_message) for r in trace.records]
    hit_rates = {e.definition for e in ours.kv_hit_rates}
    assert ("prefix_cache" in hit_rates) == window_closes, (boundary, hit_rates)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.yaml"]  # no temp file


def test_a_full_disk_while_writing_the_trace_leaves_nothing_and_says_so(fake: tuple[FakeVllm, str],
                                                                       tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _server, url = fake
    spec = tmp_path / "spec.yaml"
    spec.write_text(TWO_PHASES)
    header, data = tmp_path / "t.yaml", tmp_path / "t.csv"
    real_fdopen = os.fdopen
    written: list[str] = []

    class FullDisk(io.StringIO):
        """Takes 100 characters, then the disk is full (as a real ENOSPC: after a partial write)."""

        def write(self, text: str) -> int:
            if sum(map(len, written)) + len(text) > 100:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written.append(text)
            return len(text)

    def fdopen(fd: int, *args: Any, **kw: Any) -> Any:
        real_fdopen(fd, *args, **kw).close()
        return FullDisk()

    monkeypatch.setattr(io_mod.os, "fdopen", fdopen)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = blis_main(["observe", "--server-url", url, "--model", "m", "--workload-spec", str(spec),
                        "--trace-header", str(header), "--trace-data", str(data), "--scrape-kv-metrics",
                        "--settle", "0", "--no-progress"])
    lines = [line for line in err.getvalue().splitlines() if "error" in line]
    assert rc == 2 and len(lines) == 1, err.getvalue()
    assert lines[0].startswith("blis observe: error: cannot write the trace (No space left on device): nothing "
                               f"was written under {header} or {data}; the 4 records collected are lost")
    assert list(tmp_path.iterdir()) == [spec]  # neither file, no temp file


def test_a_full_disk_keeps_the_previous_trace_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing over an earlier trace: ENOSPC on the second file leaves both old files as they were."""
    from blis_sim.formats.trace import read_trace_header, write_trace

    samples = Path(__file__).resolve().parents[1] / "samples" / "blis"
    trace = load_trace(samples / "trace.yaml", samples / "trace.csv")
    header, data = tmp_path / "t.yaml", tmp_path / "t.csv"
    header.write_text("old header\n")
    data.write_text("old data\n")
    real_fdopen = os.fdopen
    opened: list[int] = []

    def fdopen(fd: int, *args: Any, **kw: Any) -> Any:
        if opened:  # the second file (the header) hits the full disk
            os.close(fd)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        opened.append(fd)
        return real_fdopen(fd, *args, **kw)

    monkeypatch.setattr(io_mod.os, "fdopen", fdopen)
    with pytest.raises(OSError):
        write_trace(trace, header, data)
    assert header.read_text() == "old header\n" and data.read_text() == "old data\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.yaml"]  # no temp file
    monkeypatch.undo()
    write_trace(trace, header, data)
    assert read_trace_header(header).mode == trace.header.mode


@pytest.mark.parametrize("delay_s, timeout_s, intact", [(0.3, 5.0, True), (3.0, 1.0, False)])
def test_a_slow_metrics_endpoint(fake: tuple[FakeVllm, str], monkeypatch: pytest.MonkeyPatch,
                                 delay_s: float, timeout_s: float, intact: bool) -> None:
    """Slower than usual but within the timeout: the window is intact. Beyond it: a warning, no windowed
    hit-rate, every request still recorded."""
    server, url = fake
    server.metrics_delay_s = delay_s
    result = observe(url, parse_workload_spec(TWO_PHASES), _opts(handle_signals=False, timeout_s=timeout_s))
    assert len(result.trace.records) == 4 and all(r.status == "ok" for r in result.trace.records)
    ours = result.trace.header.pytest_blis
    assert ours is not None and not ours.partial
    assert ("prefix_cache" in {e.definition for e in ours.kv_hit_rates}) == intact
    if not intact:
        assert any("metrics" in w.lower() for w in result.warnings), result.warnings
