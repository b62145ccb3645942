"""Builds the Cython extensions; everything else is in pyproject.toml.

Every ``*.pyx`` under ``blis_sim/`` becomes an extension module next to its pure-Python twin.
Without a working compiler (or with ``BLIS_SKIP_EXT=1``) the install still succeeds and the
package runs on the pure-Python path; ``BLIS_REQUIRE_EXT=1`` turns any build failure into an error
(CI sets it, so a silently missing extension cannot pass).
"""
from __future__ import annotations

import os
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).parent
REQUIRE = bool(os.environ.get("BLIS_REQUIRE_EXT"))
DIRECTIVES = {
    "language_level": 3,
    "boundscheck": False,
    "wraparound": False,
    "cdivision": True,
    "initializedcheck": False,
}
SKIP = bool(os.environ.get("BLIS_SKIP_EXT")) and not REQUIRE


def _extensions() -> list[Extension]:
    if SKIP:
        return []
    sources = sorted(HERE.glob("blis_sim/**/*.pyx"))
    if not sources:
        return []
    try:
        import numpy
        from Cython.Build import cythonize
    except ImportError:
        if REQUIRE:
            raise
        return []
    built: list[Extension] = []
    # One cythonize() call per source: a translation error in one module must not take the others down.
    for src in sources:
        ext = Extension(
            ".".join(src.relative_to(HERE).with_suffix("").parts),
            [str(src.relative_to(HERE))],
            language="c++",
            include_dirs=[numpy.get_include()],
            extra_compile_args=["-O3", "-std=c++17"],
        )
        try:
            built.extend(cythonize([ext], compiler_directives=DIRECTIVES, quiet=True))
        except Exception:
            if REQUIRE:
                raise
    # cythonize() returns new Extension objects with optional=None: set it again, or a missing
    # compiler fails the whole install instead of falling back to pure Python.
    for ext in built:
        ext.optional = not REQUIRE
    return built


setup(ext_modules=_extensions())
