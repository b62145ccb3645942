"""Match trace rows with simulated results, exclude warm-up, adjust for the network
(docs/reference-formats.md §5.2–§5.4).

API::

    pairs = prepare_pairs(records, sim_results, warmup_requests=N, honour_warmup_column=True,
                          network_rtt_us=0, bandwidth_mbps=0.0, itl_records=None)
    pairs.ttft / pairs.e2e / pairs.itl       LatencyPair(real=[...], sim=[...]) in µs
    pairs.by_slo / pairs.by_model            BreakdownPairs per non-empty sim slo_class / model
    pairs.matched, .excluded_warmup, .unmatched_real, .unmatched_sim, .token_mismatches, .itl_dropped
    pairs.matched_records                    [(trace record, sim result)] for every matched id (for hit agreement)
    pairs.warnings                           messages for the caller to log (the library never prints)
    upload_delay_us(mbps, tokens), download_delay_us(mbps, tokens)

Rules, as the reference: trace rows are visited in file order; a row is warm-up when ``request_id <
warmup_requests`` or (ours) its ``warmup`` column is true; a row whose id has no sim result is unmatched; a
matched row with a negative real TTFT or E2E is counted both as matched and as unmatched_real and left out
of the latency pairs. The row's status is not checked. Sim latencies get the full RTT added once (not
RTT/2) plus upload (and, for E2E, download) delay at ``bandwidth_mbps``. Records only need the attributes
named in :class:`RealRecord` / :class:`SimRecord`, so any trace/sim model (or a test double) works.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class RealRecord(Protocol):
    """What pairing reads of a trace row (a ``TraceRecord``, read-only)."""

    @property
    def request_id(self) -> int: ...

    @property
    def input_tokens(self) -> int: ...

    @property
    def output_tokens(self) -> int: ...

    @property
    def server_input_tokens(self) -> int: ...

    @property
    def send_time_us(self) -> int: ...

    @property
    def first_chunk_time_us(self) -> int: ...

    @property
    def last_chunk_time_us(self) -> int: ...


class SimRecord(Protocol):
    """What pairing reads of a simulated request (a ``SimResult``, read-only)."""

    @property
    def request_id(self) -> int: ...

    @property
    def ttft_us(self) -> float: ...

    @property
    def e2e_us(self) -> float: ...

    @property
    def input_tokens(self) -> int: ...

    @property
    def output_tokens(self) -> int: ...


class ItlRecord(Protocol):
    """One SSE chunk's time (an ``ITLRecord`` of the ITL CSV, read-only)."""

    @property
    def request_id(self) -> int: ...

    @property
    def chunk_index(self) -> int: ...

    @property
    def timestamp_us(self) -> int: ...


@dataclass
class LatencyPair:
    real: list[float] = field(default_factory=list)
    sim: list[float] = field(default_factory=list)

    def append(self, real: float, sim: float) -> None:
        self.real.append(real)
        self.sim.append(sim)


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
    matched_records: list[tuple[Any, Any]] = field(default_factory=list)
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


def is_warmup(record: Any, warmup_requests: int, honour_column: bool) -> bool:
    """Warm-up by id (the reference) or by our ``warmup`` column (observe keeps warm-up rows, marked)."""
    if record.request_id < warmup_requests:
        return True
    return honour_column and bool(getattr(record, "warmup", False))


def prepare_pairs(records: Iterable[RealRecord], sim_results: Sequence[SimRecord], *, warmup_requests: int = 0,
                  honour_warmup_column: bool = True, network_rtt_us: int = 0, bandwidth_mbps: float = 0.0,
                  itl_records: Iterable[ItlRecord] | None = None) -> CalibrationPairs:
    """Pair real and simulated latencies; see the module docstring for the rules."""
    sim_by_id: dict[int, SimRecord] = {}
    pairs = CalibrationPairs()
    for sr in sim_results:
        if sr.request_id in sim_by_id:
            pairs.duplicate_sim_ids.append(sr.request_id)
        sim_by_id[sr.request_id] = sr  # last one wins, as the reference's map
    matched_ids: set[int] = set()
    records = list(records)
    for rec in records:
        if is_warmup(rec, warmup_requests, honour_warmup_column):
            pairs.excluded_warmup += 1
            continue
        found = sim_by_id.get(rec.request_id)
        if found is None:
            pairs.unmatched_real += 1
            continue
        sr = found
        matched_ids.add(rec.request_id)
        pairs.matched += 1
        pairs.matched_records.append((rec, sr))
        real_in = rec.server_input_tokens if rec.server_input_tokens > 0 else rec.input_tokens
        if real_in != sr.input_tokens or rec.output_tokens != sr.output_tokens:
            pairs.token_mismatches += 1
        real_ttft = float(rec.first_chunk_time_us - rec.send_time_us)
        real_e2e = float(rec.last_chunk_time_us - rec.send_time_us)
        if real_ttft < 0 or real_e2e < 0:
            pairs.unmatched_real += 1  # after matched += 1: the reference counts it in both
            continue
        upload = upload_delay_us(bandwidth_mbps, sr.input_tokens)
        download = download_delay_us(bandwidth_mbps, sr.output_tokens)
        rtt = float(network_rtt_us)
        sim_ttft = sr.ttft_us + rtt + upload
        sim_e2e = sr.e2e_us + rtt + upload + download
        pairs.ttft.append(real_ttft, sim_ttft)
        pairs.e2e.append(real_e2e, sim_e2e)
        for key, table in ((getattr(sr, "slo_class", "") or "", pairs.by_slo),
                           (getattr(sr, "model", "") or "", pairs.by_model)):
            if key:
                bp = table.setdefault(key, BreakdownPairs())
                bp.ttft.append(real_ttft, sim_ttft)
                bp.e2e.append(real_e2e, sim_e2e)
    pairs.unmatched_sim = sum(1 for sr in sim_results if sr.request_id not in matched_ids)
    if itl_records is not None:
        _pair_itl(pairs, records, sim_by_id, itl_records, warmup_requests, honour_warmup_column)
    return pairs


def _pair_itl(pairs: CalibrationPairs, records: Sequence[RealRecord], sim_by_id: dict[int, SimRecord],
              itl_records: Iterable[ItlRecord], warmup_requests: int, honour_column: bool) -> None:
    """Real ITL = mean of non-negative consecutive chunk deltas; sim ITL = (e2e − ttft)/(out − 1).

    As the reference: no RTT is added, rows with negative TTFT/E2E are not excluded here, a request
    needs at least two chunks, and one whose deltas are all negative is dropped (counted in itl_dropped).
    """
    by_request: dict[int, list[ItlRecord]] = {}
    for r in itl_records:
        by_request.setdefault(r.request_id, []).append(r)
    for rec in records:
        if is_warmup(rec, warmup_requests, honour_column):
            continue
        sr = sim_by_id.get(rec.request_id)
        chunks = by_request.get(rec.request_id)
        if sr is None or not chunks or len(chunks) < 2:
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
            pairs.warnings.append(f"request {rec.request_id} ITL dropped (all {len(chunks) - 1} deltas "
                                  "negative, likely clock skew)")
            pairs.itl_dropped += 1
            continue
        sim_itl = (sr.e2e_us - sr.ttft_us) / (sr.output_tokens - 1) if sr.output_tokens > 1 else 0.0
        pairs.itl.append(total / count, sim_itl)
