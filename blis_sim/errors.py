"""One exception root, narrow subclasses: catch at whatever level you need.

Every message says *what* is wrong and *where* (file, field, line, or server URL), so the CLI and the
pytest plugin can print it on one line instead of a traceback.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# Exit codes of the `blis` CLI (documented in README).
EXIT_OK = 0
EXIT_VERDICT_FAILED = 1  # ran fine, but at least one calibration verdict is out of tolerance
EXIT_INPUT_ERROR = 2  # bad flags or bad input files (argparse uses 2 for usage errors too)
EXIT_SERVER_ERROR = 3  # the server could not be reached or answered garbage
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM; whatever was collected has been written


# C0 controls, DEL and the C1 / Unicode line breaks: a message printed with one of these raw would not
# be one readable line (a field name or value quoted from a fuzzed file can carry any of them).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(message: str) -> str:
    """``message`` with every control character or line break escaped (``\\n``, ``\\x01``)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], message)


def error_line(command: str, exc: BaseException) -> str:
    """What the CLI prints for an error of ``blis <command>``: one line, or for :class:`ConfigErrors` a
    summary line and then one line per problem."""
    problems = getattr(exc, "problems", None)
    if problems:
        head = f"blis {command}: error: {one_line(exc.args[0] if exc.args else '')}"
        return "\n".join([head] + [f"  {one_line(str(p))}" for p in problems])
    return f"blis {command}: error: {one_line(str(exc))}"


class BlisError(Exception):
    """Root of every error this package raises on purpose."""

    exit_code: int = EXIT_INPUT_ERROR


@dataclass(frozen=True)
class Location:
    """Where in an input a problem sits. Every part is optional; ``str()`` joins what is known."""

    file: str | None = None
    line: int | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = self.file or "<input>"
        if self.line is not None:
            where += f":{self.line}"
        if self.field:
            where += f": field '{self.field}'"
        return where


class InputError(BlisError):
    """Bad user input: a file, a flag or a value. Carries the location it was found at."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.location = Location(file, line, field)
        self.reason = message
        super().__init__(f"{self.location}: {message}" if (file or line or field) else message)


class FormatError(InputError):
    """A file that does not parse or does not match its schema (YAML, CSV, JSON)."""


class ConfigError(InputError):
    """A configuration that parses but cannot be used (inconsistent or out-of-range values)."""


class ConfigErrors(ConfigError):
    """Several problems of one input, reported together so that one run shows them all. ``problems``
    holds each as its own :class:`InputError` (a :class:`FormatError` or :class:`ConfigError`, with its
    file, line and field); ``str()`` is a summary line followed by one line per problem."""

    def __init__(self, problems: list[InputError], *, file: str | None = None) -> None:
        self.problems = tuple(problems)
        summary = f"{file or '<input>'}: {len(self.problems)} problems"
        super().__init__(summary, file=file)
        self.args = (summary,)
        self.reason = summary

    def __str__(self) -> str:
        return "\n".join([self.args[0]] + [f"  {p}" for p in self.problems])


class UsageError(InputError):
    """Bad or conflicting command-line flags."""


class OutputError(BlisError):
    """An output file could not be written (a full disk, no permission). Writes are atomic: nothing is left
    under the output's name."""


class ServerError(BlisError):
    """The server under observation misbehaved: unreachable, stalled, reset, or answered garbage."""

    exit_code = EXIT_SERVER_ERROR

    def __init__(self, message: str, *, url: str | None = None) -> None:
        self.url = url
        super().__init__(f"{url}: {message}" if url else message)


class ScrapeError(ServerError):
    """`/metrics` could not be used for a counter window (unreachable, no counters, a reset)."""


class SimulationError(BlisError):
    """The simulator was asked something it cannot do (e.g. a request larger than the whole cache)."""


class VerdictFailed(BlisError):
    """A calibration verdict is out of tolerance. Carries the report for rendering."""

    exit_code = EXIT_VERDICT_FAILED

    def __init__(self, message: str, report: object | None = None) -> None:
        self.report = report
        super().__init__(message)
