"""pytest-blis hooks and options only; the logic lives in the private modules beside it.

Hooks, in the order pytest calls them:
- ``pytest_addoption``: the ``--blis-*`` options and ini keys (:mod:`pytest_blis._options`);
- ``pytest_configure``: markers, resolved options in ``config.stash``, the session state
  (server targets, results), under xdist the hand-out of external servers to workers, and with
  pytest-html the cells' report columns and embedded plots (:mod:`pytest_blis._html`);
- ``pytest_collect_file``: ``*.blis.yaml`` files become scenario collectors (:mod:`._collect`);
- ``pytest_collection_finish``: the highest concurrency of the cells that will run (sizes the probe);
- ``pytest_report_header``: server target, simulator backend, tolerances;
- ``pytest_terminal_summary``: one line per calibration cell, and the JSON summary file;
- ``pytest_unconfigure``: stops what the session started (embedded emulators), by handle.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from pytest_blis import _options, _session
from pytest_blis._collect import ScenarioFile, is_scenario_file
from pytest_blis._fixtures import (  # noqa: F401  (fixtures are discovered in the plugin module)
    blis_artifacts,
    blis_calibrate,
    blis_latency_model,
    blis_observe,
    blis_options,
    blis_replay,
    blis_run_cell,
    blis_server,
)

# pytest imports this module at start-up with the plugin: what a cell runs (the engine, the emulator,
# the scenario schema) is imported inside the functions that use it.


def pytest_addoption(parser: pytest.Parser) -> None:
    _options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "blis: a calibration cell collected from a *.blis.yaml file")
    config.addinivalue_line("markers", "blis_live: needs a real vLLM server (--blis-server-url)")
    config.stash[_session.OPTIONS] = _options.resolve(config)
    config.stash[_session.STATE] = _session.new_state(config)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_session.XdistHooks(), "blis-xdist")
    if config.pluginmanager.hasplugin("html"):
        from pytest_blis._html import HtmlHooks

        config.pluginmanager.register(HtmlHooks(), "blis-html")


def pytest_collect_file(parent: pytest.Collector, file_path: Path) -> pytest.Collector | None:
    if is_scenario_file(file_path):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


def pytest_collection_finish(session: pytest.Session) -> None:
    _session.note_items(session.config, session.items)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return _session.report_header(config)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    _session.terminal_summary(terminalreporter, config)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_session.STATE, None)
    if state is not None:
        state.close()
