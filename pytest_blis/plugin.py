"""pytest-blis hooks and options only; the logic lives in the private modules beside it."""
from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("blis", "calibration scenarios (pytest-blis)")
    group.addoption("--blis-server-url", action="append", default=[], metavar="URL",
                    help="vLLM server(s) to calibrate against; default: the embedded emulator")
    parser.addini("blis_server_url", "vLLM server URL(s) to calibrate against", type="linelist")
