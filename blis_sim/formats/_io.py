"""File plumbing shared by the format readers and writers.

- :func:`atomic_write` — write a text file via a temp file in the same directory and a rename, so an
  interrupted run leaves the old file or the new one, never half of one. An unwritable path raises
  ``OSError``: the caller knows which flag named it and wraps it in an InputError (the writers of every
  format, ``write_trace`` etc., behave the same).
- :func:`atomic_write_chunks` — the same for text produced piece by piece (a big file never held whole).
- :func:`atomic_write_files` — several files that belong together: all written to temp files, then renamed.
- :func:`csv_rows` — ``(first line number, fields)`` per CSV row, blank lines skipped as Go's csv.Reader does,
  any read/decode/quoting problem a located :class:`~blis_sim.errors.FormatError`; :func:`csv_chunks` the
  same rows a chunk at a time without the line numbers (:func:`csv_data_line` finds one).
- :func:`gc_paused` — a context without the cyclic garbage collector, for readers that build many
  objects which cannot form cycles (a 50k-row trace: the collector would rescan the whole heap several times).
- :func:`go_quote` — a value quoted as Go's ``%q`` would, for messages that mirror the reference's.
"""
from __future__ import annotations

import csv
import gc
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any

from blis_sim.errors import FormatError


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and a rename."""
    atomic_write_chunks(path, (text,))


def atomic_write_chunks(path: str | Path, chunks: Iterable[str]) -> None:
    """Write the concatenation of ``chunks`` to ``path`` via a temp file and a rename; an exception
    while producing them leaves ``path`` untouched."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent or Path("."))
    try:
        # mkstemp makes the file private (0600); give it the mode a plain open() would
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            for chunk in chunks:
                f.write(chunk)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_files(files: Sequence[tuple[str | Path, str | Iterable[str]]]) -> None:
    """Write several files that belong together (a trace's header and data): every one to its temp file
    first, then the renames. A failure while writing (a full disk) leaves none of them under its final
    name changed, and no temp file behind. A file's text may come as successive pieces (a big file
    never held whole)."""
    temps: list[tuple[str, Path]] = []
    try:
        for path, text in files:
            p = Path(path)
            fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent or Path("."))
            temps.append((tmp, p))
            os.fchmod(fd, 0o666 & ~_umask())
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                for chunk in (text,) if isinstance(text, str) else text:
                    f.write(chunk)
        for tmp, p in temps:
            os.replace(tmp, p)
    except BaseException:
        for tmp, _ in temps:
            Path(tmp).unlink(missing_ok=True)
        raise


def csv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(first line number, fields) per CSV row; blank lines skipped like Go's csv.Reader."""
    f = _open_csv(path)
    with f:
        reader = csv.reader(f, strict=True)
        line = 1
        try:
            for row in reader:
                start, line = line, reader.line_num + 1
                if row and row != [""]:
                    yield start, row
        except csv.Error as exc:
            raise FormatError(f"malformed CSV: {exc}", file=str(path), line=reader.line_num) from None
        except UnicodeDecodeError as exc:
            raise FormatError(f"not UTF-8 text ({exc.reason})", file=str(path), line=line) from None


def csv_with_header(path: Path) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    """The header row and an iterator over the data rows; a file without a header row is an error
    (the reference's ``reading CSV header: EOF``)."""
    rows = csv_rows(path)
    try:
        _, header = next(rows)
    except StopIteration:
        raise FormatError("reading CSV header: EOF (the file has no header row)", file=str(path), line=1) from None
    return header, rows


def csv_chunks(path: Path, size: int) -> tuple[list[str], Iterator[list[list[str]]]]:
    """The header row and the data rows in lists of up to ``size`` (blank rows skipped, as
    :func:`csv_rows`), for readers that convert a chunk at a time; a row's line is looked up by
    :func:`csv_data_line` when it is needed (an error to report)."""
    chunks = _row_chunks(path, size)
    first = next(chunks, None)
    if not first:
        raise FormatError("reading CSV header: EOF (the file has no header row)", file=str(path), line=1)
    header, rest = first[0], first[1:]
    return header, _prepend(rest, chunks)


def _prepend(rows: list[list[str]], chunks: Iterator[list[list[str]]]) -> Iterator[list[list[str]]]:
    if rows:
        yield rows
    yield from chunks


def _row_chunks(path: Path, size: int) -> Iterator[list[list[str]]]:
    """The rows of :func:`csv_rows` without line numbers, ``size`` at a time (the first chunk holds the
    header row too): the csv module's rows with blank ones filtered out, each step a loop in C."""
    f = _open_csv(path)
    with f:
        reader = csv.reader(f, strict=True)
        rows = filter(None, reader)  # a blank line is []
        try:
            while chunk := list(islice(rows, size)):
                if [""] in chunk:  # a line holding only "": blank too, as Go's reader has it
                    chunk = [row for row in chunk if row != [""]]
                if chunk:
                    yield chunk
        except csv.Error as exc:
            raise FormatError(f"malformed CSV: {exc}", file=str(path), line=reader.line_num) from None
        except UnicodeDecodeError as exc:
            raise FormatError(f"not UTF-8 text ({exc.reason})", file=str(path), line=reader.line_num + 1) from None


def csv_data_line(path: Path, index: int) -> int:
    """The line on which data row ``index`` (0 = the first after the header row) starts."""
    for k, (line, _) in enumerate(csv_rows(path)):
        if k == index + 1:
            return line
    raise ValueError(f"{path} has no data row {index}")


def _open_csv(path: Path) -> Any:
    try:
        return path.open(newline="", encoding="utf-8")
    except FileNotFoundError:
        raise FormatError("file not found", file=str(path)) from None
    except OSError as exc:  # a directory, no permission, ...
        raise FormatError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic GC inside the block (restored after, if it was enabled). Reference counting
    still frees everything; only cycle detection waits, and a reader's records hold no cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def go_quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
