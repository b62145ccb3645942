"""What observe sends and what it records, one request at a time, plus the run clock.

API::

    clock = RunClock()                      # one monotonic anchor + one epoch anchor per run
    clock.epoch_us(clock.now_ns())          # epoch µs of a monotonic reading (for the CSV)
    WireRequest(...)                        # a request ready to send (prompt text, lengths, headers)
    RequestRecord.from_wire(wire, ...)      # one trace row, filled in while the request runs

Intervals are measured with ``time.perf_counter_ns`` (monotonic) and mapped to epoch µs through a
single anchor, so every timestamp of a run shares one origin and none jumps with NTP.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from blis_sim.workload.plan import PlannedRequest

STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_TIMEOUT = "timeout"


class RunClock:
    """Monotonic nanoseconds mapped to epoch microseconds through one anchor taken at creation."""

    __slots__ = ("_mono0", "_epoch0_ns")

    def __init__(self) -> None:
        self._mono0 = time.perf_counter_ns()
        self._epoch0_ns = time.time_ns()

    @staticmethod
    def now_ns() -> int:
        return time.perf_counter_ns()

    def epoch_us(self, mono_ns: int) -> int:
        """Epoch µs of a monotonic reading; 0 stays 0 (the trace's "unknown")."""
        if not mono_ns:
            return 0
        return (self._epoch0_ns + (mono_ns - self._mono0)) // 1000

    def since_start_us(self, mono_ns: int) -> int:
        return (mono_ns - self._mono0) // 1000

    @property
    def start_ns(self) -> int:
        return self._mono0


@dataclass(frozen=True)
class WireRequest:
    """One request ready to send. ``prompt`` is the text; lengths are the spec's token targets."""

    prompt: str
    max_tokens: int
    streaming: bool
    arrival_us: int  # scheduled offset from the start of its phase's dispatch
    input_tokens: int  # target total prompt tokens (prefix + suffix)
    prefix_group: str = ""
    prefix_length: int = 0
    min_tokens: int = 0
    client_id: str = ""
    tenant_id: str = ""
    slo_class: str = ""
    priority: int | None = None  # vLLM wire priority (0 = most urgent); None = not sent
    slo_target_us: int = 0
    session_id: str = ""
    round_index: int = 0
    deadline_us: int = 0
    model: str = ""  # the spec client's model, recorded only
    phase: str = ""
    think_time_us: int = 0
    extra_body: tuple[tuple[str, Any], ...] = ()


@dataclass
class RequestRecord:
    """One trace row. Times are monotonic ns while running; the capture step converts to epoch µs."""

    request_id: int
    wire: WireRequest
    planned: PlannedRequest | None = None  # the workload's request this record sends (None for probes)
    phase_offset_us: int = 0  # the phase's start relative to the run start
    warmup: bool = False
    x_request_id: str = ""
    scheduled_ns: int = 0  # when the schedule said to send (monotonic); lateness = send_ns - this
    send_ns: int = 0
    first_byte_ns: int = 0
    first_chunk_ns: int = 0
    first_content_ns: int = 0
    last_chunk_ns: int = 0
    num_chunks: int = 0
    status: str = ""  # "" while in flight
    error_message: str = ""
    finish_reason: str = ""
    output_tokens: int = 0
    server_input_tokens: int = 0
    cached_tokens: int = -1  # usage.prompt_tokens_details.cached_tokens; -1 = not reported
    server_metrics: dict[str, float] | None = None  # usage.metrics (vLLM --enable-per-request-metrics), ms
    chunk_times_ns: list[int] = field(default_factory=list)  # only with --record-itl
    replica: int = -1  # the cluster replica it was routed to (-1: one server; docs/cluster.md §3)
    replica_name: str = ""  # what a router's response header said served it (router mode)

    @property
    def done(self) -> bool:
        return bool(self.status)

    def fail(self, status: str, message: str) -> None:
        """Mark as failed, keeping whatever timings were already taken."""
        self.status = status
        self.error_message = " ".join(message.split())[:500]

    def ttft_ms(self) -> float | None:
        """Client TTFT to the first content chunk (else first chunk), in ms; None if unknown."""
        first = self.first_content_ns or self.first_chunk_ns
        if self.status != STATUS_OK or not first or not self.send_ns:
            return None
        return (first - self.send_ns) / 1e6

    def server_ttft_ms(self) -> float | None:
        """The server's own TTFT from arrival (queue + first token), when it reports per-request metrics."""
        m = self.server_metrics
        if not m or "time_to_first_token_ms" not in m:
            return None
        return m.get("queue_time_ms", 0.0) + m["time_to_first_token_ms"]

    def e2e_ms(self) -> float | None:
        if self.status != STATUS_OK or not self.last_chunk_ns or not self.send_ns:
            return None
        return (self.last_chunk_ns - self.send_ns) / 1e6
