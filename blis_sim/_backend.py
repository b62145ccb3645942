"""Choosing between a Cython extension and its pure-Python twin.

``BLIS_PURE_PYTHON=1`` forces the pure path at run time; ``BLIS_REQUIRE_EXT=1`` makes a missing
extension an error (CI sets it so a silently missing build cannot pass).
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType


def pure_forced() -> bool:
    return os.environ.get("BLIS_PURE_PYTHON", "") not in ("", "0")


def ext_required() -> bool:
    return os.environ.get("BLIS_REQUIRE_EXT", "") not in ("", "0")


def load(ext_name: str, pure_name: str) -> tuple[ModuleType, bool]:
    """Import ``ext_name`` (compiled) or fall back to ``pure_name``; returns (module, is_compiled)."""
    if not pure_forced():
        try:
            return importlib.import_module(ext_name), True
        except ImportError:
            if ext_required():
                raise ImportError(
                    f"BLIS_REQUIRE_EXT is set but the compiled module {ext_name} is missing; "
                    "rebuild with `pip install -e .` on a machine with a C++ compiler"
                ) from None
    return importlib.import_module(pure_name), False
