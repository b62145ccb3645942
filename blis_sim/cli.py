"""`blis observe | probe | replay | calibrate | run | fit | emulate | sweep | plan`: argument parsing and exit
codes only.

Each subcommand lives with the code it drives, in a module that exposes
``register(subparsers) -> None``; the parser it adds sets ``func=`` to a callable taking the parsed
namespace and returning an exit code. Only the named subcommand's module is imported, so that a
subcommand does not need the others' dependencies (aiohttp for observe, the engine for calibrate).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

from blis_sim import __version__
from blis_sim.errors import EXIT_INPUT_ERROR, EXIT_INTERRUPTED, BlisError, error_line, one_line

if TYPE_CHECKING:
    # what each subcommand module's register() adds its parser to
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

# (subcommand module) in the order they appear in `blis --help`.
SUBCOMMAND_MODULES = (
    "blis_sim.observe.cli",
    "blis_sim.probe.cli",
    "blis_sim.engine.cli",
    "blis_sim.calibrate.cli",
    "blis_sim.emulator.cli",
    "blis_sim.sweep.cli",
)
# which module registers each subcommand: `blis replay` imports the engine's CLI only (importing
# all four costs about a second: aiohttp, the emulator, the calibration report models)
MODULE_OF = {"observe": "blis_sim.observe.cli", "probe": "blis_sim.probe.cli", "run": "blis_sim.engine.cli",
             "replay": "blis_sim.engine.cli", "fit": "blis_sim.engine.cli",
             "calibrate": "blis_sim.calibrate.cli", "emulate": "blis_sim.emulator.cli",
             "sweep": "blis_sim.sweep.cli", "plan": "blis_sim.sweep.cli"}

# subcommands that call no BLAS routine big enough to run threaded (only sorts, cumulative sums and
# tiny vectors): one OpenBLAS thread gives the same results without starting a thread pool
_ONE_BLAS_THREAD = frozenset({"replay", "run"})


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (its first word not starting with ``-``), if known."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in MODULE_OF else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``blis`` parser; given ``argv`` naming a known subcommand, only that subcommand's module
    is imported (``blis --help``, a typo or no subcommand: all of them)."""
    command = _command_of(argv) if argv is not None else None
    modules = (MODULE_OF[command],) if command else SUBCOMMAND_MODULES
    parser = argparse.ArgumentParser(
        prog="blis",
        description="Observe a vLLM server, replay its trace through the tiered-KV simulator, calibrate.",
    )
    parser.add_argument("--version", action="version", version=f"blis {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that part of the package is not there (yet)
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the console script or `python -m`: the process is ours
        argv = sys.argv[1:]
        if _command_of(argv) in _ONE_BLAS_THREAD:
            os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    args = build_parser(argv).parse_args(argv)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    """The subcommand's exit code (errors reported on stderr as one line)."""
    try:
        return int(args.func(args) or 0)
    except BlisError as exc:
        print(error_line(args.command, exc), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"blis {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:  # a missing input, an unwritable output, a full disk
        print(one_line(f"blis {args.command}: error: {exc.filename}: {exc.strerror}"), file=sys.stderr)
        return EXIT_INPUT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
