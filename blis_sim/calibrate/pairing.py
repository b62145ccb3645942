"""Match trace rows with simulated results, exclude warm-up, adjust for the network
(docs/reference-formats.md §5.2–§5.4), on columns.

API::

    pairs = prepare_pairs(real, sim, warmup_requests=N, honour_warmup_column=True,
                          network_rtt_us=0, bandwidth_mbps=0.0, itl_records=None)
    # real: the trace's TraceColumns; sim: a SimTable (blis_sim.calibrate.table)
    pairs.ttft / pairs.e2e / pairs.itl       LatencyPair(real=array, sim=array) in µs
    pairs.by_slo / pairs.by_model            BreakdownPairs per non-empty sim slo_class / model
    pairs.matched, .excluded_warmup, .unmatched_real, .unmatched_sim, .token_mismatches, .itl_dropped
    pairs.matched_rows / pairs.matched_sim   trace row and sim row of every matched id, in file order
    pairs.warnings                           messages for the caller to log (the library never prints)
    upload_delay_us(mbps, tokens), download_delay_us(mbps, tokens)

Rules, as the reference: trace rows are visited in file order; a row is warm-up when ``request_id <
warmup_requests`` or (ours) its ``warmup`` column is true; a row whose id has no sim result is unmatched; a
matched row with a negative real TTFT or E2E is counted both as matched and as unmatched_real and left out
of the latency pairs. The row's status is not checked. Sim latencies get the full RTT added once (not
RTT/2) plus upload (and, for E2E, download) delay at ``bandwidth_mbps``. A repeated sim request id: the
last result wins, as the reference's map. Each operation is the reference's, element by element, so the
figures are the same bits as its per-request loop.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from blis_sim.calibrate.table import SimTable
from blis_sim.formats.trace_columns import TraceColumns


class ItlRecord(Protocol):
    """One SSE chunk's time (an ``ITLRecord`` of the ITL CSV, read-only)."""

    @property
    def request_id(self) -> int: ...

    @property
    def chunk_index(self) -> int: ...

    @property
    def timestamp_us(self) -> int: ...


_EMPTY = np.zeros(0, dtype=np.float64)


@dataclass
class LatencyPair:
    real: np.ndarray = field(default_factory=lambda: _EMPTY)
    sim: np.ndarray = field(default_factory=lambda: _EMPTY)


@dataclass
class BreakdownPairs:
    ttft: LatencyPair = field(default_factory=LatencyPair)
    e2e: LatencyPair = field(default_factory=LatencyPair)


@dataclass
class CalibrationPairs:
    ttft: LatencyPair = field(default_factory=LatencyPair)
    e2e: LatencyPair = field(default_factory=LatencyPair)
    itl: LatencyPair = field(default_factory=LatencyPair)
    by_slo: dict[str, BreakdownPairs] = field(default_factory=dict)
    by_model: dict[str, BreakdownPairs] = field(default_factory=dict)
    token_mismatches: int = 0
    excluded_warmup: int = 0
    matched: int = 0
    unmatched_real: int = 0
    unmatched_sim: int = 0
    itl_dropped: int = 0
    # every matched trace row (file order) and the sim row its id pairs with
    matched_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    matched_sim: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    duplicate_sim_ids: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # for the caller to log; the library never prints

    @property
    def num_requests(self) -> int:
        """The reference's trace_info.num_requests (a negative-latency row counts twice, as there)."""
        return self.matched + self.excluded_warmup + self.unmatched_real


def upload_delay_us(bandwidth_mbps: float, tokens: int) -> float:
    """Time to send ``tokens`` × 4 bytes at ``bandwidth_mbps``, µs (same operation order as the reference)."""
    if bandwidth_mbps <= 0:
        return 0.0
    return float(tokens * 4) * 8 / (bandwidth_mbps * 1e6) * 1e6


download_delay_us = upload_delay_us  # the reference uses the same formula for output tokens


def _delay_us(bandwidth_mbps: float, tokens: np.ndarray) -> np.ndarray | float:
    """:func:`upload_delay_us` of every row, the same operations in the same order."""
    if bandwidth_mbps <= 0:
        return 0.0
    return (tokens * 4).astype(np.float64) * 8 / (bandwidth_mbps * 1e6) * 1e6


def warmup_mask(real: TraceColumns, warmup_requests: int, honour_column: bool) -> np.ndarray:
    """Warm-up by id (the reference) or by our ``warmup`` column (observe keeps warm-up rows, marked)."""
    warm = real.array("request_id") < warmup_requests
    if honour_column:
        warm = warm | real.array("warmup")
    return warm


@dataclass(frozen=True)
class SimIndex:
    """Where each request id's result is: the last row of each id (as the reference's map)."""

    ids: np.ndarray    # sorted distinct ids
    rows: np.ndarray   # the sim row of each
    duplicates: list[int]

    @classmethod
    def of(cls, request_id: np.ndarray) -> SimIndex:
        n = request_id.size
        ids, first = np.unique(request_id, return_index=True)
        _, last_rev = np.unique(request_id[::-1], return_index=True)
        repeated = np.ones(n, dtype=bool)
        repeated[first] = False
        return cls(ids=ids, rows=(n - 1 - last_rev).astype(np.int64),
                   duplicates=request_id[repeated].tolist())

    def lookup(self, request_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found, sim row) of each id (row 0 where not found)."""
        if self.ids.size == 0:
            return np.zeros(request_id.size, dtype=bool), np.zeros(request_id.size, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.ids, request_id), self.ids.size - 1)
        found = self.ids[pos] == request_id
        return found, np.where(found, self.rows[pos], 0)


def _breakdown(keys: np.ndarray, names: list[str], real_ttft: np.ndarray, sim_ttft: np.ndarray,
               real_e2e: np.ndarray, sim_e2e: np.ndarray) -> dict[str, BreakdownPairs]:
    out: dict[str, BreakdownPairs] = {}
    order = dict.fromkeys(keys.tolist())  # first appearance
    for code in order:
        if not names[code]:
            continue
        mask = keys == code
        out[names[code]] = BreakdownPairs(ttft=LatencyPair(real_ttft[mask], sim_ttft[mask]),
                                          e2e=LatencyPair(real_e2e[mask], sim_e2e[mask]))
    return out


def prepare_pairs(real: TraceColumns, sim: SimTable, *, warmup_requests: int = 0,
                  honour_warmup_column: bool = True, network_rtt_us: int = 0, bandwidth_mbps: float = 0.0,
                  itl_records: Iterable[ItlRecord] | None = None) -> CalibrationPairs:
    """Pair real and simulated latencies; see the module docstring for the rules."""
    pairs = CalibrationPairs()
    index = SimIndex.of(sim.request_id)
    pairs.duplicate_sim_ids = index.duplicates
    rid = real.array("request_id")
    warm = warmup_mask(real, warmup_requests, honour_warmup_column)
    found, srow = index.lookup(rid)
    matched = found & ~warm
    rows = np.flatnonzero(matched)
    srows = srow[rows]
    pairs.matched_rows, pairs.matched_sim = rows, srows
    pairs.excluded_warmup = int(warm.sum())
    pairs.matched = int(rows.size)
    server_in = real.array("server_input_tokens")[rows]
    real_in = np.where(server_in > 0, server_in, real.array("input_tokens")[rows])
    pairs.token_mismatches = int(((real_in != sim.input_tokens[srows])
                                  | (real.array("output_tokens")[rows] != sim.output_tokens[srows])).sum())
    send = real.array("send_time_us")[rows]
    real_ttft = (real.array("first_chunk_time_us")[rows] - send).astype(np.float64)
    real_e2e = (real.array("last_chunk_time_us")[rows] - send).astype(np.float64)
    ok = (real_ttft >= 0) & (real_e2e >= 0)
    # a negative latency: counted matched and unmatched, as the reference
    pairs.unmatched_real = int((~found & ~warm).sum()) + int((~ok).sum())
    keep = srows[ok]
    upload = _delay_us(bandwidth_mbps, sim.input_tokens[keep])
    download = _delay_us(bandwidth_mbps, sim.output_tokens[keep])
    rtt = float(network_rtt_us)
    sim_ttft = sim.ttft_us[keep] + rtt + upload
    sim_e2e = sim.e2e_us[keep] + rtt + upload + download
    real_ttft, real_e2e = real_ttft[ok], real_e2e[ok]
    pairs.ttft = LatencyPair(real_ttft, sim_ttft)
    pairs.e2e = LatencyPair(real_e2e, sim_e2e)
    pairs.by_slo = _breakdown(sim.slo_class.codes[keep], sim.slo_class.names, real_ttft, sim_ttft, real_e2e, sim_e2e)
    pairs.by_model = _breakdown(sim.model.codes[keep], sim.model.names, real_ttft, sim_ttft, real_e2e, sim_e2e)
    matched_ids = np.unique(rid[rows])
    pairs.unmatched_sim = int((~np.isin(sim.request_id, matched_ids)).sum())
    if itl_records is not None:
        _pair_itl(pairs, real, sim, index, itl_records, warm)
    return pairs


def _pair_itl(pairs: CalibrationPairs, real: TraceColumns, sim: SimTable, index: SimIndex,
              itl_records: Iterable[ItlRecord], warm: np.ndarray) -> None:
    """Real ITL = mean of non-negative consecutive chunk deltas; sim ITL = (e2e − ttft)/(out − 1).

    As the reference: no RTT is added, rows with negative TTFT/E2E are not excluded here, a request
    needs at least two chunks, and one whose deltas are all negative is dropped (counted in itl_dropped).
    """
    by_request: dict[int, list[ItlRecord]] = {}
    for r in itl_records:
        by_request.setdefault(r.request_id, []).append(r)
    rid = real.array("request_id")
    found, srow = index.lookup(rid)
    real_out: list[float] = []
    sim_out: list[float] = []
    for i in np.flatnonzero(found & ~warm).tolist():
        request_id = int(rid[i])
        chunks = by_request.get(request_id)
        if not chunks or len(chunks) < 2:
            continue
        chunks = sorted(chunks, key=lambda c: c.chunk_index)  # stable, like the reference's insertion sort
        total, count = 0.0, 0
        for prev, cur in itertools.pairwise(chunks):
            delta = float(cur.timestamp_us - prev.timestamp_us)
            if delta < 0:
                continue  # clock skew: skip this delta only
            total += delta
            count += 1
        if count == 0:
            pairs.warnings.append(f"request {request_id} ITL dropped (all {len(chunks) - 1} deltas "
                                  "negative, likely clock skew)")
            pairs.itl_dropped += 1
            continue
        s = int(srow[i])
        out = int(sim.output_tokens[s])
        e2e, ttft = float(sim.e2e_us[s]), float(sim.ttft_us[s])
        real_out.append(total / count)
        sim_out.append((e2e - ttft) / (out - 1) if out > 1 else 0.0)
    pairs.itl = LatencyPair(np.asarray(real_out, dtype=np.float64), np.asarray(sim_out, dtype=np.float64))
