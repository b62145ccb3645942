"""The ITL CSV (``observe --record-itl``, docs/reference-formats.md §1.5): one row per SSE chunk.

API::

    rows = read_itl("t.itl.csv")            # -> list[ITLRecord]
    itl_by_request(rows)                    # -> {request_id: [epoch µs by chunk index]}
    write_itl(rows, "o.itl.csv"); default_itl_path("t.csv") -> Path("t.itl.csv")
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import Field

from blis_sim.errors import FormatError
from blis_sim.formats import _go
from blis_sim.formats._io import atomic_write, csv_with_header, go_quote
from blis_sim.formats._model import StrictModel


class ITLRecord(StrictModel):
    """One SSE chunk of one request (``observe --record-itl``): epoch µs."""

    request_id: int = Field(ge=0)
    chunk_index: int = Field(ge=0)
    timestamp_us: int = Field(ge=0)


ITL_COLUMNS: tuple[str, ...] = ("request_id", "chunk_index", "timestamp_us")


def default_itl_path(data_path: str | Path) -> Path:
    """``<trace-data minus .csv>.itl.csv`` (the reference's default)."""
    s = str(data_path)
    return Path((s[:-4] if s.endswith(".csv") else s) + ".itl.csv")


def read_itl(path: str | Path) -> list[ITLRecord]:
    """Read an ITL CSV. Stricter than the reference on one point: the header row must name the three columns."""
    p = Path(path)
    file = str(p)
    header, rows = csv_with_header(p)
    if tuple(header[:3]) != ITL_COLUMNS:
        raise FormatError(f"expected the header row {','.join(ITL_COLUMNS)}, got {','.join(header)}",
                          file=file, line=1)
    out: list[ITLRecord] = []
    for line, row in rows:
        if len(row) < 3:
            raise FormatError(f"CSV row has {len(row)} columns, expected at least 3", file=file, line=line)
        a, b, c = row[0], row[1], row[2]
        if (a.isdigit() and b.isdigit() and c.isdigit() and (a + b + c).isascii()
                and len(a) < 19 and len(b) < 19 and len(c) < 19):
            vals = (int(a), int(b), int(c))  # the common case: three plain non-negative integers
        else:
            vals = _slow_row(row, file, line)
        out.append(ITLRecord.model_construct(request_id=vals[0], chunk_index=vals[1], timestamp_us=vals[2]))
    return out


def _slow_row(row: list[str], file: str, line: int) -> tuple[int, int, int]:
    vals = []
    for col, raw in zip(ITL_COLUMNS, row):
        v = _go.parse_int(raw)
        if v is None:
            why = "value out of range" if _go.looks_int(raw) else "invalid syntax"
            raise FormatError(f"parsing {col} {go_quote(raw)}: {why}", file=file, line=line, field=col)
        if v < 0:  # the reference rejects a negative value in any column
            raise FormatError(f"parsing {col}: negative value {v} not allowed", file=file, line=line, field=col)
        vals.append(v)
    return vals[0], vals[1], vals[2]


def write_itl(records: Iterable[ITLRecord], path: str | Path) -> None:
    parts = [_go.csv_line(list(ITL_COLUMNS))]
    parts.extend(_go.csv_line([str(r.request_id), str(r.chunk_index), str(r.timestamp_us)]) for r in records)
    atomic_write(path, "".join(parts))


def itl_by_request(records: Iterable[ITLRecord]) -> dict[int, list[int]]:
    """Chunk timestamps per request, ordered by chunk index."""
    grouped: dict[int, list[tuple[int, int]]] = {}
    for r in records:
        grouped.setdefault(r.request_id, []).append((r.chunk_index, r.timestamp_us))
    return {rid: [t for _, t in sorted(chunks)] for rid, chunks in grouped.items()}
