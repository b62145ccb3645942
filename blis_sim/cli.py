"""`blis observe | probe | replay | calibrate | run | fit | emulate | sweep | plan`: argument parsing and exit codes only.

Each subcommand lives with the code it drives, in a module that exposes
``register(subparsers) -> None``; the parser it adds sets ``func=`` to a callable taking the parsed
namespace and returning an exit code. Modules are imported lazily so that `blis calibrate` does not
pay for aiohttp or the engine.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Sequence

from blis_sim import __version__
from blis_sim.errors import EXIT_INPUT_ERROR, EXIT_INTERRUPTED, BlisError, error_line, one_line

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
# tiny vectors): one OpenBLAS thread gives the same results and spares starting its thread pool
# when numpy is imported, ~0.05-0.1 s of a 10k-request `blis replay` on two cores
_ONE_BLAS_THREAD = frozenset({"replay", "run"})


def _start_program(command: str | None) -> None:
    """Process settings for ``blis`` run as a program (not ``main(argv)`` called in a process
    that is not ours): no cyclic garbage collection while the subcommand's modules are imported
    (each collection walks every object made so far: pydantic and numpy make many), and
    :data:`_ONE_BLAS_THREAD`."""
    gc.disable()
    if command in _ONE_BLAS_THREAD:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _end_program(code: int) -> int:
    """Leave without the interpreter's teardown, for :data:`_ONE_BLAS_THREAD` commands run as a
    program: their files are written and closed, so all that teardown does is free every module
    and the simulation's objects one by one (~0.01 s of a 10k-request replay). stdout and stderr
    are flushed first; if that fails (a closed pipe), returns ``code`` so that the interpreter
    reports it as it always has. No atexit handler of ours exists to be skipped."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return code
    os._exit(code)


def _imports_done() -> None:
    """The imported modules' objects live as long as the process: out of the collector's sight."""
    gc.freeze()
    gc.enable()


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
    program = argv is None  # the console script or `python -m`: the process is ours
    if argv is None:
        argv = sys.argv[1:]
        _start_program(_command_of(argv))
    parser = build_parser(argv)
    if program:
        _imports_done()
    args = parser.parse_args(argv)
    code = _run(args)
    if program and args.command in _ONE_BLAS_THREAD:
        return _end_program(code)
    return code


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
