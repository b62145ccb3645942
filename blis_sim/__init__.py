"""blis_sim: observe a vLLM server, replay its trace through a tiered-KV simulator, calibrate.

Public names are re-exported here as the parts land; import submodules for the rest.
"""
from __future__ import annotations

__version__ = "0.1.0"

from blis_sim.errors import (
    BlisError,
    ConfigError,
    FormatError,
    InputError,
    OutputError,
    ScrapeError,
    ServerError,
    SimulationError,
    UsageError,
    VerdictFailed,
)

__all__ = [
    "__version__",
    "BlisError",
    "ConfigError",
    "FormatError",
    "InputError",
    "OutputError",
    "ScrapeError",
    "ServerError",
    "SimulationError",
    "UsageError",
    "VerdictFailed",
]
