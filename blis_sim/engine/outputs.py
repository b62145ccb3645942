"""A :class:`SimOutcome` as the reference's outputs: SimResult list, MetricsOutput, trace records.

* :func:`sim_results` — one :class:`~blis_sim.formats.SimResult` per completed request, sorted by
  request id: TTFT/E2E in µs (frontend term included), ``itl_mean_us`` = Σ gaps / (outputs − 1),
  plus ``cached_tokens`` and ``cached_tokens_by_source`` (device/host/disk at first admission).
* :func:`metrics_output` — the aggregate :class:`~blis_sim.formats.MetricsOutput`: the reference's
  fields (percentiles by linear interpolation at rank p/100·(n−1); ITL percentiles over every
  inter-token gap), its block-based ``cache_hit_rate`` (compatibility only), and ``kv_hit_rates``:
  every definition of design D2 over the comparison window.
* :func:`trace_records` — the simulated requests as TraceV2 rows (``--trace-output``): integer µs
  times, ``first_chunk = arrival + TTFT``, ``last_chunk = arrival + E2E``, status ``ok`` or
  ``incomplete`` (did not finish before the horizon).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from blis_sim.engine.simulate import SOURCES, SimOutcome
from blis_sim.engine.scheduler import LOADING, NOT_ARRIVED, RUNNING, WAITING
from blis_sim.formats import KVHitRate, MetricsOutput, RequestMetrics, SimResult


def percentile(values: np.ndarray, p: float) -> float:
    if values.size == 0:
        return 0.0
    return float(np.percentile(values, p))


def weighted_percentile(values: np.ndarray, weights: np.ndarray, p: float) -> float:
    """Percentile of the multiset where ``values[k]`` appears ``weights[k]`` times (linear interp.)."""
    total = int(weights.sum())
    if total == 0:
        return 0.0
    order = np.argsort(values, kind="stable")
    v = values[order]
    cum = np.cumsum(weights[order])
    rank = p / 100.0 * (total - 1)
    lo = int(np.floor(rank))
    hi = min(lo + 1, total - 1)
    vlo = v[np.searchsorted(cum, lo, side="right")]
    vhi = v[np.searchsorted(cum, hi, side="right")]
    return float(vlo + (vhi - vlo) * (rank - lo))


def _itl_mean(o: SimOutcome) -> np.ndarray:
    n_out = o.loop.num_out
    return np.where(n_out > 1, o.loop.itl_sum_us / np.maximum(n_out - 1, 1), 0.0)


def _builder(cls: Any) -> Any:
    """A constructor for ``cls`` from a dict holding every field (already of the right types):
    what ``model_construct`` does, without its per-field default and alias handling, which costs
    more than everything else when there is one object per request."""
    fields_set = set(cls.model_fields)
    new, setattr_ = cls.__new__, object.__setattr__

    def make(values: dict[str, Any]) -> Any:
        m = new(cls)
        setattr_(m, "__dict__", values)
        setattr_(m, "__pydantic_fields_set__", fields_set)
        setattr_(m, "__pydantic_extra__", None)
        setattr_(m, "__pydantic_private__", None)
        return m

    return make


def _text(o: SimOutcome, idx: list[int], name: str) -> list[str]:
    src = o.table.source
    if not src:
        return [""] * len(idx)
    return [getattr(src[i], name, "") or "" for i in idx]


def sim_results(o: SimOutcome) -> list[SimResult]:
    done = np.flatnonzero(o.completed)
    idx = done[np.argsort(o.table.request_id[done], kind="stable")]
    rid = o.table.request_id[idx].tolist()
    ttft, e2e, itl = o.ttft_us[idx].tolist(), o.e2e_us[idx].tolist(), _itl_mean(o)[idx].tolist()
    prompt, nout = o.table.prompt_len[idx].tolist(), o.loop.num_out[idx].tolist()
    cached = o.cached[idx].tolist()
    ii = idx.tolist()
    slo, model = _text(o, ii, "slo_class"), _text(o, ii, "model")
    make = _builder(SimResult)
    return [make({"request_id": rid[k], "ttft_us": ttft[k], "e2e_us": e2e[k],
                  "input_tokens": prompt[k], "output_tokens": nout[k], "slo_class": slo[k],
                  "model": model[k], "itl_mean_us": itl[k], "cached_tokens": sum(cached[k]),
                  "cached_tokens_by_source": dict(zip(SOURCES, cached[k]))})
            for k in range(len(ii))]


def _request_metrics(o: SimOutcome) -> list[RequestMetrics]:
    lp = o.loop
    idx = np.flatnonzero(o.completed)
    idx = idx[np.lexsort((o.table.request_id[idx], lp.arrival_us[idx]))]
    ii = idx.tolist()
    arrived = (lp.arrival_us[idx] / 1e6).tolist()
    rid = o.table.request_id[idx].tolist()
    prompt, nout = o.table.prompt_len[idx].tolist(), lp.num_out[idx].tolist()
    ttft, e2e = (o.ttft_us[idx] / 1e3).tolist(), (o.e2e_us[idx] / 1e3).tolist()
    itl = (_itl_mean(o)[idx] / 1e3).tolist()
    sched = ((lp.first_sched_us[idx] - lp.arrival_us[idx]) / 1e3).tolist()
    slo, tenant, model = _text(o, ii, "slo_class"), _text(o, ii, "tenant_id"), _text(o, ii, "model")
    adapter, session = _text(o, ii, "adapter"), _text(o, ii, "session_id")
    rounds = [int(getattr(o.table.source[i], "round_index", 0) or 0) for i in ii] \
        if o.table.source else [0] * len(ii)
    make = _builder(RequestMetrics)
    return [make({"arrived_at": arrived[k], "request_id": f"request_{rid[k]}",
                  "num_prefill_tokens": prompt[k], "num_decode_tokens": nout[k],
                  "ttft_ms": ttft[k], "itl_ms": itl[k], "e2e_ms": e2e[k],
                  "scheduling_delay_ms": sched[k], "slo_class": slo[k], "tenant_id": tenant[k],
                  "handled_by": "instance_0", "model": model[k], "adapter": adapter[k],
                  "length_capped": False, "gateway_queue_delay_ms": 0.0,
                  "session_id": session[k], "round_index": rounds[k]})
            for k in range(len(ii))]


def metrics_output(o: SimOutcome, *, include_requests: bool = True) -> MetricsOutput:
    lp = o.loop
    done = o.completed
    status = lp.status
    n_done = int(done.sum())
    # aggregates in request-id order, so a run and the replay of its trace (rows in another
    # order) sum in the same order: byte-identical means (INV-13)
    order = np.flatnonzero(done)
    order = order[np.argsort(o.table.request_id[order], kind="stable")]
    ttft_ms = o.ttft_us[order] / 1e3
    e2e_ms = o.e2e_us[order] / 1e3
    sched_ms = (lp.first_sched_us[order] - lp.arrival_us[order]) / 1e3
    itl_v, itl_w = lp.itl_values / 1e3, lp.itl_weights
    n_itl = int(itl_w.sum())
    duration_s = lp.end_us / 1e6
    total_in = int(o.table.prompt_len[done].sum())
    total_out = int(lp.num_out[done].sum())
    queued = int(np.isin(status, (WAITING, LOADING)).sum())
    running = int((status == RUNNING).sum())
    dropped = int(o.dropped.sum())
    not_arrived = int((status == NOT_ARRIVED).sum())
    requests = _request_metrics(o) if include_requests else []
    return MetricsOutput(
        completed_requests=n_done, still_queued=queued, still_running=running,
        injected_requests=len(o.table) - not_arrived,
        total_input_tokens=total_in, total_output_tokens=total_out,
        vllm_estimated_duration_s=duration_s,
        responses_per_sec=n_done / duration_s if duration_s > 0 else 0.0,
        tokens_per_sec=total_out / duration_s if duration_s > 0 else 0.0,
        e2e_mean_ms=float(e2e_ms.mean()) if n_done else 0.0,
        e2e_p90_ms=percentile(e2e_ms, 90), e2e_p95_ms=percentile(e2e_ms, 95),
        e2e_p99_ms=percentile(e2e_ms, 99),
        ttft_mean_ms=float(ttft_ms.mean()) if n_done else 0.0,
        ttft_p90_ms=percentile(ttft_ms, 90), ttft_p95_ms=percentile(ttft_ms, 95),
        ttft_p99_ms=percentile(ttft_ms, 99),
        itl_mean_ms=float((itl_v * itl_w).sum() / n_itl) if n_itl else 0.0,
        itl_p90_ms=weighted_percentile(itl_v, itl_w, 90),
        itl_p95_ms=weighted_percentile(itl_v, itl_w, 95),
        itl_p99_ms=weighted_percentile(itl_v, itl_w, 99),
        scheduling_delay_p99_ms=percentile(sched_ms, 99),
        preemption_count=int(lp.preemption_count),
        cache_hit_rate=float(o.kv_counters.get("cache_hit_rate", 0.0)),
        dropped_unservable=dropped,
        kv_hit_rates=[KVHitRate(**e) for e in o.hit_rates],
    ).model_copy(update={"requests": requests})  # validated above; the rows are built typed


def _int_us(x: float) -> int:
    return int(np.floor(x + 0.5))


def trace_records(o: SimOutcome, base: list[Any] | None = None) -> list[Any]:
    """TraceV2 rows for the simulated requests (``base``: one dict of the non-timing columns per
    table row; default: taken from the table's source records)."""
    from blis_sim.formats import TraceRecord

    lp = o.loop
    defaults = _default_fields()
    out = []
    for i in range(len(o.table)):
        if lp.status[i] == NOT_ARRIVED or o.dropped[i]:
            continue
        fields = dict(base[i]) if base is not None else _fields_of(o.table.source[i])
        arrival = _int_us(lp.arrival_us[i])
        done = not np.isnan(lp.finish_us[i])
        first = _int_us(lp.arrival_us[i] + o.ttft_us[i]) if not np.isnan(lp.first_token_us[i]) else 0
        last = _int_us(lp.arrival_us[i] + o.e2e_us[i]) if done else 0
        fields.update(request_id=int(o.table.request_id[i]), arrival_time_us=arrival,
                      send_time_us=arrival, first_chunk_time_us=first, last_chunk_time_us=last,
                      num_chunks=0, status="ok" if done else "incomplete", error_message="",
                      finish_reason="", server_input_tokens=0,
                      cached_tokens=int(o.cached[i].sum()) if o.admitted[i] else -1,
                      first_byte_time_us=0, first_content_time_us=0)
        out.append(TraceRecord.model_construct(**{**defaults, **fields}))
    return out


def _default_fields() -> dict[str, Any]:
    from blis_sim.formats import TraceRecord

    return {name: f.get_default(call_default_factory=True)
            for name, f in TraceRecord.model_fields.items() if name != "request_id"}


_KEEP = ("client_id", "tenant_id", "slo_class", "vllm_priority", "session_id", "round_index",
         "prefix_group", "prefix_length", "streaming", "input_tokens", "output_tokens",
         "text_tokens", "image_tokens", "audio_tokens", "video_tokens", "reason_ratio", "model",
         "deadline_us", "slo_target_us", "adapter", "think_time_us", "phase", "warmup",
         "x_request_id")


def _fields_of(record: Any) -> dict[str, Any]:
    return {k: getattr(record, k) for k in _KEEP if hasattr(record, k)}
