"""Test doubles for calibrate's columnar steps: trace rows and sim results written as a few named
fields each (the rest at their defaults), turned into the columns calibrate reads."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from blis_sim.calibrate.pairing import SimIndex
from blis_sim.calibrate.table import SimTable
from blis_sim.formats.results import Columns, SimResult
from blis_sim.formats.trace_columns import FIELDS, TraceColumns
from blis_sim.formats.trace_data import _ROW_DEFAULTS

_SIM_REQUIRED = {"request_id": 0, "ttft_us": 0.0, "e2e_us": 0.0, "input_tokens": 0, "output_tokens": 0}


def real_columns(records: Sequence[Any]) -> TraceColumns:
    """Rows (objects with some TraceRecord fields) as the trace's columns."""
    rows = [{name: getattr(r, name, default) for name, default in _ROW_DEFAULTS.items()} for r in records]
    return TraceColumns.from_columns(len(rows), {name: [row[name] for row in rows] for name in FIELDS})


def sim_columns(results: Sequence[Any]) -> Columns:
    """Results (objects with some SimResult fields) as SimResult columns."""
    data: dict[str, Any] = {}
    for name, f in SimResult.model_fields.items():
        default = _SIM_REQUIRED.get(name, f.default)
        data[name] = [getattr(r, name, default) for r in results]
    return Columns(SimResult, len(results), data)


def sim_table(results: Sequence[Any]) -> SimTable:
    return SimTable.of(sim_columns(results))


def matched_rows(real: TraceColumns, sim: SimTable, ids: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """The trace rows of ``ids`` and each one's sim row (-1: none), as calibrate's goodput takes them."""
    rid = real.array("request_id")
    rows = np.flatnonzero(np.isin(rid, sorted(ids)))
    found, sim_rows = SimIndex.of(sim.request_id).lookup(rid[rows])
    return rows, np.where(found, sim_rows, -1)


def paired(pairs: Sequence[tuple[Any, Any]]) -> tuple[TraceColumns, SimTable, np.ndarray, np.ndarray]:
    """(real, sim, rows, sim_rows) of pairs already matched: row i with result i."""
    rows = np.arange(len(pairs), dtype=np.int64)
    return real_columns([r for r, _ in pairs]), sim_table([s for _, s in pairs]), rows, rows
