"""Where finished points are kept, and the table written from them.

:class:`PointStore` is an append-only JSON-lines file (``points.jsonl`` in the output directory):
one line per finished point, ``{"key": digest, "figures": {...}}``, flushed and fsync'd as each
point finishes, so an interrupted sweep loses at most the points still running. A later run with
the same output directory reuses every point whose key (the digest of the base and the point's
resolved settings, :func:`blis_sim.sweep.base.task_key`) it holds, unless ``force``; a torn last
line (killed mid-write) is ignored. ``blis plan`` shares the same store, so a search reuses the
points a sweep (or an earlier search) evaluated.

:func:`write_table` writes the rows as CSV, and as Parquet when pyarrow is installed.
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

from blis_sim.formats._io import atomic_write

STORE_NAME = "points.jsonl"


class PointStore:
    def __init__(self, directory: str | Path, *, force: bool = False) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / STORE_NAME
        self._done: dict[str, dict[str, Any]] = {}
        if force:
            self.path.unlink(missing_ok=True)
        elif self.path.exists():
            self._done = _read(self.path)

    def get(self, key: str) -> dict[str, Any] | None:
        return self._done.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self._done

    def add(self, key: str, figures: dict[str, Any]) -> None:
        line = json.dumps({"key": key, "figures": figures}, separators=(",", ":")) + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self._done[key] = figures


def _read(path: Path) -> dict[str, dict[str, Any]]:
    """The whole entries of ``path``. A torn line (an interrupted write) is dropped from the file
    too, so the next appended point starts on a line of its own; that point runs again."""
    done: dict[str, dict[str, Any]] = {}
    kept: list[str] = []
    text = path.read_text(encoding="utf-8", errors="replace")
    for line in text.splitlines(keepends=True):
        try:
            entry = json.loads(line)
            done[entry["key"]] = entry["figures"]
        except (ValueError, KeyError, TypeError):
            continue
        if line.endswith("\n"):
            kept.append(line)
        else:
            kept.append(line + "\n")
    if "".join(kept) != text:
        atomic_write(path, "".join(kept))
    return done


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def table_text(rows: list[dict[str, Any]], columns: list[str]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([_cell(r.get(c)) for c in columns])
    return buf.getvalue()


def write_table(rows: list[dict[str, Any]], columns: list[str], csv_path: Path,
                parquet_path: Path | None = None) -> list[Path]:
    """The CSV (always) and Parquet (when pyarrow is importable and ``parquet_path`` given);
    returns the paths written."""
    atomic_write(csv_path, table_text(rows, columns))
    written = [csv_path]
    if parquet_path is not None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            return written
        data = {c: _parquet_column([r.get(c) for r in rows]) for c in columns}
        tmp = parquet_path.with_name(f".{parquet_path.name}.tmp")
        pq.write_table(pa.table(data), tmp)
        os.replace(tmp, parquet_path)
        written.append(parquet_path)
    return written


def _parquet_column(values: list[Any]) -> list[Any]:
    """One Parquet type per column: an axis that mixes numbers and strings ("1GiB", 2147483648)
    becomes strings."""
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {int, float} or len(kinds) <= 1:
        return values
    return [None if v is None else _cell(v) for v in values]
