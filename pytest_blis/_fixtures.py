"""Fixtures: the server target, the latency model fitted on a probe, the three calibration steps,
per-item artifacts, and ``blis_run_cell`` which the scenario items call.

User tests can use them directly::

    def test_my_cell(blis_server, blis_observe, blis_replay, blis_calibrate, blis_artifacts): ...
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_blis import _session
from pytest_blis._options import BlisOptions

if TYPE_CHECKING:  # the heavy modules load when a fixture is first used, not with the plugin
    from blis_sim.calibrate import CalibrationReport
    from blis_sim.engine import LatencyCoefficients
    from pytest_blis._probe import ProbeFit
    from pytest_blis._scenario import ServerSpec, SweepPoint
    from pytest_blis._server import ServerPool, ServerTarget

# pytest imports this module at start-up with the plugin: what a cell runs (the engine, the emulator,
# the scenario schema) is imported inside the functions that use it.

_POOL = pytest.StashKey["ServerPool"]()
_LATENCY = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def blis_options(pytestconfig: pytest.Config) -> BlisOptions:
    """The resolved ``--blis-*`` options."""
    return pytestconfig.stash[_session.OPTIONS]


def _pool(config: pytest.Config) -> ServerPool:
    from pytest_blis._server import ServerPool

    if _POOL not in config.stash:
        config.stash[_POOL] = ServerPool(config.stash[_session.OPTIONS], config.stash[_session.STATE])
    return config.stash[_POOL]


@pytest.fixture(scope="session")
def blis_server(pytestconfig: pytest.Config) -> Callable[..., ServerTarget]:
    """``blis_server(server_spec=ServerSpec(), base_dir=Path.cwd()) -> ServerTarget``: the external
    server, or an embedded emulator for that spec (started once per worker, stopped at the end)."""
    def get(server_spec: ServerSpec | None = None, base_dir: Path | None = None) -> ServerTarget:
        from pytest_blis._scenario import ServerSpec

        return _pool(pytestconfig).target(server_spec or ServerSpec(), base_dir or Path.cwd())
    return get


def _probe_fit(config: pytest.Config, options: BlisOptions, target: ServerTarget,
               server_spec: ServerSpec | None, concurrency: int) -> ProbeFit:
    """The probe's fits of ``target``, run once per server, concurrency, step
    shape and worker."""
    from pytest_blis._probe import run_probe
    from pytest_blis._scenario import ServerSpec

    cache = config.stash.setdefault(_LATENCY, {})
    spec = server_spec or ServerSpec()
    key = (target.url, concurrency, spec.step_shape)
    if key not in cache:
        cache[key] = run_probe(target, options.artifacts_dir, max_num_seqs=spec.max_num_seqs,
                               max_num_batched_tokens=spec.max_num_batched_tokens, concurrency=concurrency,
                               step_shape=spec.step_shape)
    return cache[key]


@pytest.fixture(scope="session")
def blis_latency_model(pytestconfig: pytest.Config,
                       blis_options: BlisOptions) -> Callable[..., LatencyCoefficients]:
    """``blis_latency_model(target, server_spec=None, concurrency=1, sequential=False) -> LatencyCoefficients``:
    the engine's linear latency model fitted on a probe of that server (once per server, concurrency and
    worker; ``concurrency`` is the most requests in flight the cells judged with it will have).
    ``sequential``: the fit on the probe's one-at-a-time phases, for a cell that sends one request at a
    time (pytest_blis._probe.ProbeFit)."""
    def get(target: ServerTarget, server_spec: ServerSpec | None = None, concurrency: int = 1,
            sequential: bool = False) -> LatencyCoefficients:
        return _probe_fit(pytestconfig, blis_options, target, server_spec, concurrency).model(sequential)
    return get


@pytest.fixture
def blis_artifacts(request: pytest.FixtureRequest, blis_options: BlisOptions) -> Path:
    """A directory for this test's artifacts, named after its node id, under ``--blis-artifacts-dir``."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid).strip("_")
    path = blis_options.artifacts_dir / name
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def blis_observe() -> Callable[..., Any]:
    """``blis_observe(url, plan, ObserveOptions, CellPaths) -> ObserveResult`` (writes the trace)."""
    from pytest_blis import _steps

    return _steps.observe_step


@pytest.fixture(scope="session")
def blis_replay() -> Callable[..., Any]:
    """``blis_replay(trace, ReplayOptions, CellPaths) -> (SimResult columns, MetricsOutput)``."""
    from pytest_blis import _steps

    return _steps.replay_step


@pytest.fixture(scope="session")
def blis_calibrate() -> Callable[..., Any]:
    """``blis_calibrate(trace, results, metrics, CalibrateOptions, CellPaths) -> CalibrationReport``."""
    from pytest_blis import _steps

    return _steps.calibrate_step


@pytest.fixture
def blis_run_cell(request: pytest.FixtureRequest, blis_options: BlisOptions,
                  blis_server: Callable[..., ServerTarget],
                  blis_artifacts: Path) -> Callable[[SweepPoint], CalibrationReport]:
    """What a scenario item calls: run one sweep point end to end and assert its verdicts."""
    from pytest_blis._cell import CellContext, run_cell
    from pytest_blis._replay import replay_options
    from pytest_blis._steps import CellPaths

    def run(point: SweepPoint) -> CalibrationReport:
        target = blis_server(point.spec.server, Path(point.file).parent)
        # One probe per server covers every cell of the run: fitted up to the run's highest concurrency.
        concurrency = request.config.stash.get(_session.MAX_CONCURRENCY, point.spec.concurrency)
        probe = _probe_fit(request.config, blis_options, target, point.spec.server,
                           max(concurrency, point.spec.concurrency))
        ctx = CellContext(point=point, target=target, options=blis_options,
                          latency=probe.model(point.spec.sequential), paths=CellPaths(blis_artifacts),
                          probe_notes=(f"probe: {probe.repeatability}",) if probe.repeatability else ())
        return run_cell(ctx, request, replay_options(ctx))
    return run


__all__ = ["blis_artifacts", "blis_calibrate", "blis_latency_model", "blis_observe", "blis_options",
           "blis_replay", "blis_run_cell", "blis_server"]
