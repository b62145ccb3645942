"""A :class:`SimOutcome` as the reference's outputs: SimResult list, MetricsOutput, trace records.

* :func:`sim_results` — one :class:`~blis_sim.formats.SimResult` per completed request, sorted by
  request id: TTFT/E2E in µs (frontend term included), ``itl_mean_us`` = Σ gaps / (outputs − 1),
  plus ``cached_tokens`` and ``cached_tokens_by_source`` (device/host/disk at first admission).
* :func:`metrics_output` — the aggregate :class:`~blis_sim.formats.MetricsOutput`: the reference's
  fields (percentiles by linear interpolation at rank p/100·(n−1); ITL percentiles over every
  inter-token gap), its block-based ``cache_hit_rate`` (compatibility only), and ``kv_hit_rates``:
  every definition of design D2 over the comparison window.
* :func:`sim_result_columns` / :func:`request_metrics_columns` — the same rows as
  :class:`~blis_sim.formats.results.Columns` (numpy arrays, one per field), and
  :func:`write_outputs` — the two files written from them, byte-identical to writing the objects,
  without one pydantic object per request (the 50k-request replay writes both in ~0.3 s instead of
  ~3.3 s).
* :class:`SimulatedOutputs` — ``results`` / ``metrics()`` / ``write_outputs()`` of an outcome
  and its options (MetricsOutput with its ``provenance``), shared by ``ReplayOutcome`` and
  ``RunOutcome``.
* :func:`trace_records` — the simulated requests as TraceV2 rows, column by column (``--trace-output``,
  written a chunk of rows at a time; nothing made per request): integer µs
  times, ``first_chunk = arrival + TTFT``, ``last_chunk = arrival + E2E``, status ``ok`` or
  ``incomplete`` (did not finish before the horizon).
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from blis_sim.engine.provenance import sim_provenance
from blis_sim.engine.requests import TraceRows
from blis_sim.engine.scheduler import LOADING, NOT_ARRIVED, RUNNING, WAITING
from blis_sim.engine.simulate import SOURCES, EngineOptions, SimOutcome
from blis_sim.formats import KVHitRate, MetricsOutput, RequestMetrics, SimProvenance, SimResult, _go
from blis_sim.formats._model import construct
from blis_sim.formats.results import ColumnChunks, Columns, IntMapColumn, write_metrics_output, write_sim_results
from blis_sim.formats.trace_header import TierIO  # not via blis_sim.formats: that serves it from .trace

if TYPE_CHECKING:
    pass


def percentile(values: np.ndarray, p: float) -> float:
    return percentiles(values, (p,))[0]


def percentiles(values: np.ndarray, ps: Sequence[float]) -> list[float]:
    """``np.percentile(values, p)`` (linear interpolation at rank p/100·(n−1)) for each ``p``, with
    one sort and numpy's arithmetic step for step (same bits): ``np.percentile`` itself imports
    ``numpy.ma`` on first use, a tenth of the replay's start-up."""
    n = int(values.size)
    if n == 0:
        return [0.0 for _ in ps]
    v = np.sort(values)
    if np.isnan(v[-1]):  # numpy's NaN rules: let it answer
        return [float(np.percentile(values, p)) for p in ps]
    out = []
    for p in ps:
        virtual = (n - 1) * (p / 100)
        if virtual >= n - 1:
            out.append(float(v[-1]))
            continue
        lo = math.floor(virtual)
        a, b = float(v[lo]), float(v[lo + 1])
        t = virtual - lo
        # numpy's _lerp: from the nearer end
        out.append(b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t)
    return out


def weighted_percentile(values: np.ndarray, weights: np.ndarray, p: float) -> float:
    """Percentile of the multiset where ``values[k]`` appears ``weights[k]`` times (linear interp.)."""
    return weighted_percentiles(values, weights, (p,))[0]


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, ps: Sequence[float]) -> list[float]:
    """:func:`weighted_percentile` for several ``ps`` with one sort. The sort need not be stable:
    a value found by rank is the same whichever order equal values take."""
    total = int(weights.sum())
    if total == 0:
        return [0.0 for _ in ps]
    order = np.argsort(values)
    cum = weights[order]
    np.cumsum(cum, out=cum)  # in place: a million-request replay has ~10M gaps (80 MB an array)
    out = []
    for p in ps:
        rank = p / 100.0 * (total - 1)
        lo = int(np.floor(rank))
        hi = min(lo + 1, total - 1)
        vlo = values[order[np.searchsorted(cum, lo, side="right")]]
        vhi = values[order[np.searchsorted(cum, hi, side="right")]]
        out.append(float(vlo + (vhi - vlo) * (rank - lo)))
    return out


# Gaps read this many at a time by :func:`itl_summary` (16 MB of a spilled log resident at once).
# At least numpy's pairwise block (128): below it numpy sums a part whole, so cutting it would differ.
ITL_CHUNK = 1 << 20


def _spans(n: int) -> Iterator[tuple[int, int]]:
    """``[0, n)`` cut where numpy's pairwise summation cuts it (halves, rounded down to a multiple
    of 8, until a part is at most :data:`ITL_CHUNK`): summing each span with numpy and adding the
    partial sums up the same tree gives ``np.sum`` of the whole, bit for bit."""
    def cut(lo: int, m: int) -> Iterator[tuple[int, int]]:
        if m <= ITL_CHUNK:
            yield lo, m
            return
        half = m // 2
        half -= half % 8
        yield from cut(lo, half)
        yield from cut(lo + half, m - half)
    return cut(0, n)


def _pairwise_total(n: int, part_sums: Iterator[float]) -> float:
    """The partial sums of :func:`_spans` (in order) added up the same tree as numpy's."""
    sums = iter(part_sums)

    def add(m: int) -> float:
        if m <= ITL_CHUNK:
            return next(sums)
        half = m // 2
        half -= half % 8
        return add(half) + add(m - half)
    return add(n)


def _release(a: np.ndarray) -> None:
    """Drop the pages of a memory-mapped log read so far from this process (they stay in the
    page cache): read through once, a 10M-request replay's log would otherwise count whole."""
    mm = getattr(a, "_mmap", None)
    if mm is not None:
        import mmap

        mm.madvise(mmap.MADV_DONTNEED)


def itl_summary(values: np.ndarray, weights: np.ndarray, ps: Sequence[float]) -> tuple[float, list[float]]:
    """The inter-token gaps' mean and weighted percentiles in ms (``values`` in µs, ``values[k]``
    counted ``weights[k]`` times): ``((v/1e3 · w).sum() / Σw, weighted_percentiles(v/1e3, w, ps))``
    bit for bit, read a chunk at a time (the log of a 10M-request replay is ~1.5 GB, spilled to a
    file). The percentiles select each rank's gap by its float bits (non-negative float64 bits
    order as the values), 16 bits a pass, then sort the few candidates left."""
    n = int(values.shape[0])
    total = 0
    for lo, m in _spans(n):
        total += int(weights[lo:lo + m].sum())
        _release(weights)
    if total == 0:
        return 0.0, [0.0 for _ in ps]

    def part_sums() -> Iterator[float]:
        for lo, m in _spans(n):
            yield np.add.reduce((values[lo:lo + m] / 1e3) * weights[lo:lo + m])
            _release(values)
            _release(weights)
    mean = float(_pairwise_total(n, part_sums()) / total)
    ranks = []
    for p in ps:
        rank = p / 100.0 * (total - 1)
        lo = int(np.floor(rank))
        ranks.append((rank, lo, min(lo + 1, total - 1)))
    picked = _select_ranks(values, weights, sorted({k for _, lo, hi in ranks for k in (lo, hi)}))
    out = []
    for rank, lo, hi in ranks:
        vlo, vhi = picked[lo] / 1e3, picked[hi] / 1e3
        out.append(float(vlo + (vhi - vlo) * (rank - lo)))
    return mean, out


def _select_ranks(values: np.ndarray, weights: np.ndarray, ks: list[int]) -> dict[int, np.float64]:
    """The gap at each 0-based rank of ``ks``: a log of one chunk is sorted once for all of them,
    a longer one is searched rank by rank (:func:`_select`)."""
    if values.shape[0] <= ITL_CHUNK:
        order = np.argsort(values)
        cum = np.cumsum(weights[order])
        return {k: values[order[np.searchsorted(cum, k, side="right")]] for k in ks}
    return {k: _select(values, weights, k) for k in ks}


def _select(values: np.ndarray, weights: np.ndarray, k: int) -> np.float64:
    """The gap at 0-based rank ``k`` of the multiset (``values[j]`` ``weights[j]`` times)."""
    n = int(values.shape[0])
    prefix, known, below = np.uint64(0), 0, 0  # the top ``known`` bits of the answer; rows under them
    while True:
        shift = np.uint64(64 - known - 16) if known < 48 else np.uint64(0)
        width = 64 - known - int(shift)
        hist = np.zeros(1 << width)
        candidates = 0
        for lo, m in _spans(n):
            bits = values[lo:lo + m].view(np.uint64)
            w = weights[lo:lo + m]
            if known:
                sel = (bits >> np.uint64(64 - known)) == prefix
                bits, w = bits[sel], w[sel]
            digit = (bits >> shift) & np.uint64((1 << width) - 1)
            hist += np.bincount(digit.astype(np.int64), weights=w, minlength=1 << width)
            candidates += int(bits.size)
            _release(values)
            _release(weights)
        if known and candidates <= ITL_CHUNK:  # few enough: gather and sort them
            return _select_small(values, weights, prefix, known, k - below)
        cum = np.cumsum(hist)
        d = int(np.searchsorted(cum, k - below, side="right"))
        below += int(cum[d - 1]) if d else 0
        prefix = (prefix << np.uint64(width)) | np.uint64(d)
        known += width
        if known == 64:
            return np.array([prefix], dtype=np.uint64).view(np.float64)[0]


def _select_small(values: np.ndarray, weights: np.ndarray, prefix: np.uint64, known: int,
                  k: int) -> np.float64:
    """Rank ``k`` among the gaps whose top ``known`` bits are ``prefix`` (gathered, then sorted)."""
    vs, ws = [], []
    n = int(values.shape[0])
    for lo, m in _spans(n):
        v = values[lo:lo + m]
        sel = (v.view(np.uint64) >> np.uint64(64 - known)) == prefix
        vs.append(np.asarray(v[sel]))
        ws.append(np.asarray(weights[lo:lo + m][sel]))
        _release(values)
        _release(weights)
    v, w = np.concatenate(vs), np.concatenate(ws)
    order = np.argsort(v)
    cum = np.cumsum(w[order])
    return v[order[np.searchsorted(cum, k, side="right")]]


def _ascending(a: np.ndarray) -> bool:
    """``a`` is non-decreasing (a stable sort by it leaves every row where it is)."""
    return bool((a[1:] >= a[:-1]).all())


def _by_request_id(o: SimOutcome, idx: np.ndarray) -> np.ndarray:
    """Rows ``idx`` (ascending) in request-id order, ties in row order: as they are when the
    table's ids ascend already (a generated trace), so no sort and no gathered copy is made."""
    rid = o.table.request_id
    return idx if _ascending(rid) else idx[np.argsort(rid[idx], kind="stable")]


def _itl_mean(o: SimOutcome, idx: np.ndarray) -> np.ndarray:
    n_out = o.loop.num_out[idx]
    return np.where(n_out > 1, o.loop.itl_sum_us[idx] / np.maximum(n_out - 1, 1), 0.0)


def _ttft(o: SimOutcome, idx: np.ndarray | slice) -> np.ndarray:
    """``o.ttft_us[idx]`` without the whole-table array (the same arithmetic per element)."""
    lp = o.loop
    return lp.first_token_us[idx] - lp.arrival_us[idx] + o.frontend_us[idx]


def _e2e(o: SimOutcome, idx: np.ndarray | slice) -> np.ndarray:
    lp = o.loop
    return lp.finish_us[idx] - lp.arrival_us[idx] + o.frontend_us[idx]


class _SourceText:
    """String attributes of the table's source records (TraceRecord / planned requests), fetched
    once per name for both files: one attribute read per request is most of a column's cost."""

    def __init__(self, o: SimOutcome) -> None:
        self._src = o.table.source
        self._cache: dict[str, list[Any] | None] = {}

    def every(self, name: str) -> list[Any] | None:
        """``name`` of every row in table order; None when no row has a non-empty one."""
        if name not in self._cache:
            src = self._src
            if isinstance(src, TraceRows):  # columns: a constant one is answered at once
                const, value = src.column(name)
                if const:
                    self._cache[name] = [value] * len(src) if value else None
                else:
                    listed = value.tolist() if isinstance(value, np.ndarray) else value
                    self._cache[name] = listed if any(listed) else None
                return self._cache[name]
            try:
                vals: list[Any] | None = list(map(attrgetter(name), src))
            except AttributeError:
                vals = [getattr(r, name, "") for r in src]
            self._cache[name] = vals if vals and any(vals) else None
        return self._cache[name]

    def strings(self, name: str, idx: np.ndarray) -> list[str] | str:
        """``name`` of rows ``idx`` ("" where absent or None); ``""`` alone when every row's is
        empty (a constant column: the usual case)."""
        every = self.every(name)
        if every is None or idx.size == 0:
            return ""
        vals = [every[i] for i in idx.tolist()]
        if not all(type(v) is str for v in vals):
            vals = [v or "" for v in vals]
        return vals

    def ints(self, name: str, idx: np.ndarray) -> np.ndarray:
        every = self.every(name)
        if every is None:
            return np.zeros(idx.size, dtype=np.int64)
        return np.array([int(every[i] or 0) for i in idx.tolist()], dtype=np.int64)


def sim_result_columns(o: SimOutcome, text: _SourceText | None = None) -> ColumnChunks:
    """The completed requests as SimResult columns, sorted by request id, made a chunk at a time."""
    text = text or _SourceText(o)
    order = _by_request_id(o, np.flatnonzero(o.completed))

    def make(start: int, stop: int) -> Columns:
        idx = order[start:stop]
        cached = o.cached[idx]
        return Columns(SimResult, int(idx.size), {
            "request_id": o.table.request_id[idx], "ttft_us": _ttft(o, idx), "e2e_us": _e2e(o, idx),
            "input_tokens": o.table.prompt_len[idx], "output_tokens": o.loop.num_out[idx],
            "slo_class": text.strings("slo_class", idx), "model": text.strings("model", idx),
            "itl_mean_us": _itl_mean(o, idx), "cached_tokens": cached.sum(axis=1),
            "cached_tokens_by_source": IntMapColumn(SOURCES, cached),
            "instance_id": instance_names(o, idx) if o.replica is not None else ""})
    return ColumnChunks(SimResult, int(order.size), make)


def instance_names(o: SimOutcome, idx: np.ndarray) -> list[str]:
    """``instance_<r>`` of rows ``idx``: the reference's names for the replicas of a cluster."""
    assert o.replica is not None
    names = [f"instance_{r}" for r in range(int(o.replica.max()) + 1 if o.replica.size else 0)]
    return [names[r] for r in o.replica[idx].tolist()]


def sim_results(o: SimOutcome) -> list[SimResult]:
    return sim_result_columns(o).records()


def request_metrics_columns(o: SimOutcome, text: _SourceText | None = None) -> ColumnChunks:
    """``MetricsOutput.requests`` as columns: completed requests in arrival order (ms and s), made
    a chunk at a time."""
    text = text or _SourceText(o)
    lp = o.loop
    order = np.flatnonzero(o.completed)
    if not (_ascending(lp.arrival_us) and _ascending(o.table.request_id)):  # else in that order already
        order = order[np.lexsort((o.table.request_id[order], lp.arrival_us[order]))]

    def make(start: int, stop: int) -> Columns:
        idx = order[start:stop]
        rid = _go.json_ints(o.table.request_id[idx])
        return Columns(RequestMetrics, int(idx.size), {
            "arrived_at": lp.arrival_us[idx] / 1e6, "request_id": ["request_" + r for r in rid],
            "num_prefill_tokens": o.table.prompt_len[idx], "num_decode_tokens": lp.num_out[idx],
            "ttft_ms": _ttft(o, idx) / 1e3, "itl_ms": _itl_mean(o, idx) / 1e3,
            "e2e_ms": _e2e(o, idx) / 1e3,
            "scheduling_delay_ms": (lp.first_sched_us[idx] - lp.arrival_us[idx]) / 1e3,
            "slo_class": text.strings("slo_class", idx), "tenant_id": text.strings("tenant_id", idx),
            "handled_by": instance_names(o, idx) if o.replica is not None else "instance_0",
            "model": text.strings("model", idx),
            "adapter": text.strings("adapter", idx), "length_capped": False,
            "gateway_queue_delay_ms": 0.0, "session_id": text.strings("session_id", idx),
            "round_index": text.ints("round_index", idx)})
    return ColumnChunks(RequestMetrics, int(order.size), make)


def write_outputs(o: SimOutcome, *, results_path: str | Path | None = None,
                  metrics_path: str | Path | None = None,
                  provenance: SimProvenance | None = None) -> MetricsOutput:
    """``--results-path`` (SimResult JSON) and ``--metrics-path`` (MetricsOutput JSON, with
    ``provenance`` when given), each written only when given, from the columns: byte-identical to
    writing the objects, without one object per request. Returns the aggregate without
    ``requests`` (what stdout shows)."""
    text = _SourceText(o)
    if results_path is not None:
        write_sim_results(sim_result_columns(o, text), results_path)
    metrics = metrics_output(o, include_requests=False, provenance=provenance)
    if metrics_path is not None:
        write_metrics_output(metrics, metrics_path, requests=request_metrics_columns(o, text))
    return metrics


def metrics_output(o: SimOutcome, *, include_requests: bool = True,
                   provenance: SimProvenance | None = None) -> MetricsOutput:
    lp = o.loop
    done = o.completed
    status = lp.status
    n_done = int(done.sum())
    # aggregates in request-id order, so a run and the replay of its trace (rows in another
    # order) sum in the same order: byte-identical means (INV-13); each figure's array is made
    # and summarised in turn (every request's, in a long replay), and every row of a table in
    # request-id order already completed is read as a slice, not gathered
    order: np.ndarray | slice = slice(None)
    if not (n_done == len(o.table) and _ascending(o.table.request_id)):
        order = _by_request_id(o, np.flatnonzero(done))
    e2e_ms = _e2e(o, order) / 1e3
    e2e_mean, e2e_p = float(e2e_ms.mean()) if n_done else 0.0, percentiles(e2e_ms, (90, 95, 99))
    del e2e_ms
    ttft_ms = _ttft(o, order) / 1e3
    ttft_mean, ttft_p = float(ttft_ms.mean()) if n_done else 0.0, percentiles(ttft_ms, (90, 95, 99))
    del ttft_ms
    sched_p99 = percentile((lp.first_sched_us[order] - lp.arrival_us[order]) / 1e3, 99)
    duration_s = lp.end_us / 1e6
    total_in = int(o.table.prompt_len[done].sum())
    total_out = int(lp.num_out[done].sum())
    queued = int(np.isin(status, (WAITING, LOADING)).sum())
    running = int((status == RUNNING).sum())
    dropped = int(o.dropped.sum())
    not_arrived = int((status == NOT_ARRIVED).sum())
    requests = request_metrics_columns(o).records() if include_requests else []
    itl_mean, itl_p = itl_summary(lp.itl_values, lp.itl_weights, (90, 95, 99))
    return construct(
        MetricsOutput, completed_requests=n_done, still_queued=queued, still_running=running,
        injected_requests=len(o.table) - not_arrived,
        total_input_tokens=total_in, total_output_tokens=total_out,
        vllm_estimated_duration_s=duration_s,
        responses_per_sec=n_done / duration_s if duration_s > 0 else 0.0,
        tokens_per_sec=total_out / duration_s if duration_s > 0 else 0.0,
        e2e_mean_ms=e2e_mean,
        e2e_p90_ms=e2e_p[0], e2e_p95_ms=e2e_p[1], e2e_p99_ms=e2e_p[2],
        ttft_mean_ms=ttft_mean,
        ttft_p90_ms=ttft_p[0], ttft_p95_ms=ttft_p[1], ttft_p99_ms=ttft_p[2],
        itl_mean_ms=itl_mean,
        itl_p90_ms=itl_p[0], itl_p95_ms=itl_p[1], itl_p99_ms=itl_p[2],
        scheduling_delay_p99_ms=sched_p99,
        preemption_count=int(lp.preemption_count),
        cache_hit_rate=float(o.kv_counters.get("cache_hit_rate", 0.0)),
        dropped_unservable=dropped,
        kv_hit_rates=[construct(KVHitRate, **e) for e in o.hit_rates],
        tier_io=[construct(TierIO, **e) for e in o.tier_io] or None,
    ).model_copy(update={"requests": requests,  # validated above; the rows are built typed
                         "provenance": provenance})


class SimulatedOutputs:
    """The outputs of a simulation, for a class holding ``outcome`` and ``options``
    (``ReplayOutcome``, ``RunOutcome``)."""

    outcome: SimOutcome
    options: EngineOptions

    @property
    def results(self) -> list[SimResult]:
        return sim_results(self.outcome)

    def result_columns(self) -> ColumnChunks:
        """The completed requests as SimResult columns (what calibrate takes), made a chunk at a time."""
        return sim_result_columns(self.outcome)

    def metrics(self, include_requests: bool = True) -> MetricsOutput:
        return metrics_output(self.outcome, include_requests=include_requests,
                              provenance=sim_provenance(self.outcome, self.options))

    def write_outputs(self, results_path: str | Path | None = None,
                      metrics_path: str | Path | None = None) -> MetricsOutput:
        """Write the SimResult / MetricsOutput files given (same bytes as writing ``results`` and
        ``metrics()``, without one object per request); returns the MetricsOutput without
        ``requests``."""
        return write_outputs(self.outcome, results_path=results_path, metrics_path=metrics_path,
                             provenance=sim_provenance(self.outcome, self.options))


def trace_records(o: SimOutcome, base: dict[str, Any] | None = None) -> Any:
    """The simulated requests as TraceV2 rows (``TraceColumns``; nothing made per row): every row
    the loop saw arrive and did not drop, in table order. ``base``: the non-timing columns, one
    array, ``StrColumn`` or list per field in table order (default: the table's source rows' own)."""
    from blis_sim.formats.trace_columns import TraceColumns

    lp = o.loop
    keep = np.flatnonzero((lp.status != NOT_ARRIVED) & ~o.dropped)
    if base is None:
        data = _source_columns(o.table.source, keep)
    else:
        data = {name: _take(col, keep) for name, col in base.items()}
    arrival = _int_us(lp.arrival_us[keep])
    ttft, e2e = _ttft(o, keep), _e2e(o, keep)
    first = np.where(np.isnan(lp.first_token_us[keep]), 0, _int_us(lp.arrival_us[keep] + ttft))
    done = ~np.isnan(lp.finish_us[keep])
    last = np.where(done, _int_us(lp.arrival_us[keep] + e2e), 0)
    cached = np.where(o.admitted[keep], o.cached[keep].sum(axis=1), -1)
    data.update(request_id=o.table.request_id[keep], arrival_time_us=arrival, send_time_us=arrival,
                first_chunk_time_us=first, last_chunk_time_us=last, num_chunks=0,
                status=_str_column(np.where(done, 0, 1), ["ok", "incomplete"]), error_message="",
                finish_reason="", server_input_tokens=0, cached_tokens=cached.astype(np.int64),
                first_byte_time_us=0, first_content_time_us=0)
    if o.replica is not None:
        data["replica"] = o.replica[keep]
    return TraceColumns.from_columns(int(keep.size), data)


def _take(col: Any, keep: np.ndarray) -> Any:
    """Rows ``keep`` of a column (an array, string codes or a list)."""
    if isinstance(col, np.ndarray):
        return col[keep]
    if hasattr(col, "codes"):  # a StrColumn
        return type(col)(col.codes[keep], col.names)
    return [col[i] for i in keep.tolist()]


def _int_us(x: np.ndarray) -> np.ndarray:
    """µs rounded half up, as integers (NaN stays to be masked by the caller)."""
    with np.errstate(invalid="ignore"):
        return np.floor(np.nan_to_num(x, nan=0.0) + 0.5).astype(np.int64)


def _str_column(codes: np.ndarray, names: list[str]) -> Any:
    from blis_sim.formats.trace_columns import StrColumn

    return StrColumn(codes.astype(np.int32), names)


def _source_columns(src: Any, keep: np.ndarray) -> dict[str, Any]:
    """The kept non-timing columns of the table's source rows ``keep``: a trace's columns taken
    as they are; other records (a Trace's) converted first."""
    from blis_sim.formats.trace_columns import TraceColumns

    if isinstance(src, TraceRows):
        data = src.data.take(src.idx[keep])
    else:
        data = TraceColumns.from_records([src[i] for i in keep.tolist()])
    return {k: data.data[k] for k in _KEEP}


_KEEP = ("client_id", "tenant_id", "slo_class", "vllm_priority", "session_id", "round_index",
         "prefix_group", "prefix_length", "streaming", "input_tokens", "output_tokens",
         "text_tokens", "image_tokens", "audio_tokens", "video_tokens", "reason_ratio", "model",
         "deadline_us", "slo_target_us", "adapter", "think_time_us", "phase", "warmup",
         "x_request_id")
