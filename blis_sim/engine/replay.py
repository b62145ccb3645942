"""Compatibility path: ``from blis_sim.engine.replay import EngineOptions, replay`` keeps working.

The implementation lives in :mod:`blis_sim.engine.replay_trace`; prefer
``from blis_sim.engine import EngineOptions, replay``. (``blis_sim.engine`` binds its ``replay``
attribute to the function after importing this module, so the package-level name stays callable.)
"""
from __future__ import annotations

from blis_sim.engine.replay_trace import (BC10_MESSAGE, ReplayOutcome, replay,  # noqa: F401
                                          replay_outcome)
from blis_sim.engine.simulate import EngineOptions  # noqa: F401
