"""Lazy re-exports for package ``__init__`` modules (PEP 562).

A package lists, per submodule, the names it re-exports; a name's submodule is imported on first
access only, so importing one light submodule does not build every pydantic model of the package::

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {"pkg.mod": ("Name", "func")})
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package`` re-exporting ``exports``."""
    module_of = {name: module for module, names in exports.items() for name in names}
    names = sorted(module_of)

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # cache: the next access is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__, names
