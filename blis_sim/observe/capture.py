"""Per-request records → TraceV2 rows, the observe header, and the run's summary numbers.

API::

    row = to_trace_record(record, planned, clock, phase_offset_us)   # TraceRecord (epoch µs times)
    itl = itl_records(records, clock)                                # ITLRecord per SSE chunk
    lateness_ms(records)                                             # send − scheduled, ms, per request
    drift = length_drift(rows)                                       # server vs asked prompt lengths
    summary = summary_metrics(rows, wall_s)                          # the reference's stdout MetricsOutput

Prompt lengths: ``input_tokens`` in the CSV is the suffix (reference rule) and ``prefix_length`` the
group's, so the asked total is their sum; ``server_input_tokens`` is what the server counted.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from blis_sim.formats.trace import ITLRecord, TraceRecord
from blis_sim.observe.records import STATUS_OK, RequestRecord, RunClock

if TYPE_CHECKING:
    from blis_sim.workload.plan import PlannedRequest

# The reference's InvertForVLLM: the wire priority for an SLO class (0 = most urgent).
VLLM_PRIORITY = {"critical": 0, "standard": 1, "batch": 5, "sheddable": 6, "background": 7}


def wire_priority(slo_class: str) -> int | None:
    """vLLM ``priority`` for an SLO class; None (not sent) without a class; unknown classes rank standard."""
    return VLLM_PRIORITY.get(slo_class, 1) if slo_class else None


def to_trace_record(record: RequestRecord, planned: PlannedRequest, clock: RunClock,
                    phase_offset_us: int) -> TraceRecord:
    """One CSV row. ``planned`` is the workload's PlannedRequest; times become epoch µs."""
    w = record.wire
    deadline = planned.deadline_us + phase_offset_us if planned.deadline_us > 0 else 0
    return TraceRecord(
        request_id=record.request_id, client_id=planned.client_id, tenant_id=planned.tenant_id,
        slo_class=planned.slo_class, vllm_priority=wire_priority(planned.slo_class) or 0,
        session_id=planned.session_id, round_index=planned.round_index, prefix_group=planned.prefix_group,
        prefix_length=planned.csv_prefix_length, streaming=w.streaming, input_tokens=planned.csv_input_tokens,
        output_tokens=max(record.output_tokens, 0), text_tokens=planned.text_tokens,
        image_tokens=planned.image_tokens, audio_tokens=planned.audio_tokens, video_tokens=planned.video_tokens,
        reason_ratio=planned.reason_ratio, model=planned.model, deadline_us=deadline,
        slo_target_us=planned.slo_target_us, server_input_tokens=max(record.server_input_tokens, 0),
        arrival_time_us=phase_offset_us + planned.arrival_us, send_time_us=clock.epoch_us(record.send_ns),
        first_chunk_time_us=clock.epoch_us(record.first_chunk_ns),
        last_chunk_time_us=clock.epoch_us(record.last_chunk_ns), num_chunks=record.num_chunks,
        status=record.status, error_message=record.error_message, finish_reason=record.finish_reason,
        x_request_id=record.x_request_id, adapter=planned.adapter, think_time_us=planned.think_time_us,
        phase=planned.phase, warmup=record.warmup, cached_tokens=record.cached_tokens,
        first_byte_time_us=clock.epoch_us(record.first_byte_ns),
        first_content_time_us=clock.epoch_us(record.first_content_ns), replica=record.replica)


def itl_records(records: Iterable[RequestRecord], clock: RunClock) -> list[ITLRecord]:
    return [ITLRecord(request_id=r.request_id, chunk_index=i, timestamp_us=clock.epoch_us(t))
            for r in records for i, t in enumerate(r.chunk_times_ns)]


def lateness_ms(records: Iterable[RequestRecord]) -> list[float]:
    """Actual minus scheduled send time per sent request (slot waits included), ms."""
    return [(r.send_ns - r.scheduled_ns) / 1e6 for r in records if r.send_ns and r.scheduled_ns]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[k]


@dataclass(frozen=True)
class LengthDrift:
    """Server-counted minus asked prompt tokens over the ok rows that report usage."""

    rows: int
    mismatched: int
    mean_abs: float
    max_abs: int
    mean_rel: float  # mean |drift| / asked

    def message(self) -> str:
        return (f"prompt lengths on the server differ from the spec in {self.mismatched}/{self.rows} requests "
                f"(mean |drift| {self.mean_abs:.1f} tokens = {100 * self.mean_rel:.1f} %, max {self.max_abs})")


def length_drift(rows: Iterable[TraceRecord]) -> LengthDrift:
    diffs: list[tuple[int, int]] = []
    for r in rows:
        if r.status == STATUS_OK and r.server_input_tokens > 0:
            asked = r.input_tokens + r.prefix_length
            diffs.append((r.server_input_tokens - asked, max(asked, 1)))
    if not diffs:
        return LengthDrift(0, 0, 0.0, 0, 0.0)
    return LengthDrift(rows=len(diffs), mismatched=sum(1 for d, _ in diffs if d),
                       mean_abs=sum(abs(d) for d, _ in diffs) / len(diffs),
                       max_abs=max(abs(d) for d, _ in diffs),
                       mean_rel=sum(abs(d) / a for d, a in diffs) / len(diffs))


def summary_metrics(rows: Sequence[TraceRecord], wall_s: float) -> dict[str, Any]:
    """The reference's observe stdout JSON (docs/reference-formats.md §3.7): ok rows with 0 < TTFT ≤ E2E, ms."""
    ok = [r for r in rows if r.status == STATUS_OK and 0 < r.ttft_us <= r.e2e_us]
    ttft = [r.ttft_us / 1000 for r in ok]
    e2e = [r.e2e_us / 1000 for r in ok]
    out_tokens = sum(r.output_tokens for r in ok)
    wall = max(wall_s, 1e-9)

    def stats(name: str, xs: list[float]) -> dict[str, float]:
        return {f"{name}_mean_ms": sum(xs) / len(xs) if xs else 0.0, f"{name}_p90_ms": _p(xs, 90),
                f"{name}_p95_ms": _p(xs, 95), f"{name}_p99_ms": _p(xs, 99)}

    return {"completed_requests": len(ok), **stats("ttft", ttft), **stats("e2e", e2e),
            "responses_per_sec": len(ok) / wall, "tokens_per_sec": out_tokens / wall}


def _p(xs: list[float], q: float) -> float:
    v = percentile(xs, q)
    return 0.0 if math.isnan(v) else v
