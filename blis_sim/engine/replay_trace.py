"""``replay``: a TraceV2 through the simulator, the way the server would have served it.

API::

    results, metrics = replay(trace, options)          # list[SimResult], MetricsOutput
    outcome = replay_outcome(trace, options)            # ReplayOutcome: + SimOutcome, resolved config
    records = outcome.trace()                           # the re-export (--trace-output), mode "replayed"
    columnar = outcome.trace_columns()                  # the same as columns (what the CLI writes)
    prepared = prepare_trace(trace)                     # once per trace; then per options:
    outcome = replay_outcome(prepared, options)         # (a sweep: no re-reading, no table rebuild)
    outcome.write_outputs("sim.json", "simagg.json")     # the files, written from the columns (fast)

Rules (issue 4 item 5; docs/reference-formats.md §4.3–§4.4 with the reference's bugs fixed):

* **KV-offload config.** A header ``kv_offload`` block (sim-generated traces) is authoritative: a
  ``--kv-offload-config`` that resolves differently is an error (INV-13). Without a header block the
  flag may add a config only to an observe trace (``mode: real``). Neither: GPU prefix cache only.
* **The hard error (BC-10):** a trace whose observation came from the offload tiers
  (``observed_kv_metrics.source: tiered``, or non-zero ``external`` / ``tiered`` / host / disk
  entries in ``pytest_blis.kv_hit_rates``) replayed without an offload config.
* **Settings** (geometry, scheduler limits, latency model, offload tiers): the options', else the
  header's recorded server (``pytest_blis.kv_geometry``, ``server.*``, the offload block), else the
  model's, else the documented defaults: :func:`blis_sim.engine.settings.resolve_settings`.
* **Phases** (the ``phase`` column, two or more names) are replayed one after the other, each
  starting at its recorded first send or when the simulated previous phase has drained, whichever
  is later — on the server each phase started once the previous had drained.
* **Sequential clients** (``EngineOptions.sequential``, ``--sequential``): a trace observed with
  one request in flight at a time is replayed request by request, each starting at its recorded
  send or when the simulated previous request has finished, whichever is later (session rounds
  stay together). Replayed open loop, a simulator only slightly slower per request than the server
  would queue every request behind the previous one, and the lag would grow along the trace.
* **Time origin:** observe traces are replayed from their first send (relative µs). Without
  ``--horizon`` the replay runs until every request has finished (the reference stops at twice the
  last arrival, which drops requests still running then from the comparison).
* **Warm-up:** every replayable row is simulated (warm-up rows fill the cache as on the server);
  the hit-rates are computed over the rows inside the server's counter window
  (:func:`blis_sim.engine.requests.trace_window`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import numpy as np

from blis_sim.engine.outputs import SimulatedOutputs, trace_records
from blis_sim.engine.provenance import sim_header
from blis_sim.engine.requests import table_from_trace, trace_window
from blis_sim.engine.settings import resolve_settings
from blis_sim.engine.simulate import EngineOptions, SimOutcome, build_kv, combine_outcomes, simulate_table
from blis_sim.errors import ConfigError
from blis_sim.formats.trace_columns import ColumnarTrace, TraceColumns
from blis_sim.formats.trace_header import TraceHeader

if TYPE_CHECKING:
    from blis_sim.engine.kvport import CacheOps
    from blis_sim.engine.requests import RequestTable
    from blis_sim.formats import MetricsOutput, SimResult, Trace
    from blis_sim.formats.offload import OffloadConfig

BC10_MESSAGE = (
    "the trace's observed_kv_metrics were captured from the tiered KV-offload counters "
    '(source="tiered") but this replay has no offload config; replay would produce a GPU-only '
    "hit-rate that calibrate cannot compare against the tiered observation — pass "
    "--kv-offload-config <file> matching the observed deployment (INV-13, never silent degradation)")


@dataclass
class ReplayOutcome(SimulatedOutputs):
    outcome: SimOutcome
    header: TraceHeader
    options: EngineOptions

    def trace(self) -> Trace:
        """The replay re-exported as a :class:`~blis_sim.formats.Trace` (``mode: replayed``;
        observations kept verbatim): :meth:`trace_columns`' rows as records."""
        from blis_sim.formats import Trace

        columnar = self.trace_columns()
        return Trace.model_construct(header=columnar.header, records=columnar.records)

    def trace_columns(self) -> ColumnarTrace:
        """The re-export as a ``ColumnarTrace`` (what ``--trace-output`` writes: no object per row)."""
        from blis_sim.formats.trace_columns import ColumnarTrace

        header = sim_header(self.outcome, self.options, mode="replayed", base=self.header)
        return ColumnarTrace(header=header, data=trace_records(self.outcome))


def observed_from_tiers(header: TraceHeader) -> bool:
    """Whether the trace's observed hit-rate came from the offload tiers (BC-10 and ours)."""
    obs = header.observed_kv_metrics
    if obs is not None and obs.source == "tiered":
        return True
    ext = header.pytest_blis
    if ext is None:
        return False
    for e in ext.kv_hit_rates:
        if e.definition in ("external", "tiered") and e.queries > 0:
            return True
        if e.definition == "by_source" and e.tier not in ("device", None) and e.hits > 0:
            return True
    return False


@dataclass(frozen=True)
class PreparedTrace:
    """A trace made ready to replay: its header and the request table of its replayable rows
    (what every replay of it builds first, whatever the options). Replaying one trace under many
    options (a sweep) prepares it once: ``replay_outcome(prepared, options)`` per point."""

    header: TraceHeader
    table: RequestTable  # read-only to the engine: phases and the loop work on copies


#: what a replay takes: the records, the columns ``blis replay`` reads, or a prepared table
ReplayableTrace = Union["Trace", ColumnarTrace, PreparedTrace]


def prepare_trace(trace: ReplayableTrace) -> PreparedTrace:
    """``trace`` (a Trace, a ColumnarTrace or a PreparedTrace) as a :class:`PreparedTrace`."""
    if isinstance(trace, PreparedTrace):
        return trace
    data = trace_columns(trace)
    if not len(data):
        raise ConfigError("Failed to build requests from trace: empty trace")
    table = table_from_trace(trace.header, data, trace_window(trace.header, data))
    if len(table) == 0:
        raise ConfigError("Failed to build requests from trace: every row has status 'error'")
    return PreparedTrace(header=trace.header, table=table)


def trace_columns(trace: Trace | ColumnarTrace) -> TraceColumns:
    """A trace's rows as ``TraceColumns``: a ``ColumnarTrace``'s as they are (nothing per row is
    built), a :class:`~blis_sim.formats.Trace`'s records converted."""
    data = getattr(trace, "data", None)
    if isinstance(data, TraceColumns):
        return data
    return TraceColumns.from_records(trace.records)


def replay_outcome(trace: ReplayableTrace, options: EngineOptions | None = None, *,
                   log_steps: bool = False) -> ReplayOutcome:
    """Replay ``trace`` (a :class:`~blis_sim.formats.Trace`, the ``ColumnarTrace`` of
    :func:`~blis_sim.formats.trace_columns.load_trace_columns`, or a :class:`PreparedTrace`);
    see the module docstring."""
    header = trace.header
    options = resolve_settings(options or EngineOptions(), header)
    offload = options.kv_offload
    if offload is None and observed_from_tiers(header):
        raise ConfigError(BC10_MESSAGE)
    table = prepare_trace(trace).table
    block_size, num_blocks = int(options.block_size or 0), int(options.num_gpu_blocks or 0)
    outcome = simulate_replica(table, options, block_size, num_blocks, offload, log_steps)
    return ReplayOutcome(outcome=outcome, header=header, options=options)


def simulate_replica(table: RequestTable, options: EngineOptions, block_size: int, num_blocks: int,
                     offload: OffloadConfig | None, log_steps: bool = False) -> SimOutcome:
    """``table`` through one server with its own KV cache: phases and sequential clients as the
    module docstring says (a cluster replays each replica's rows through this)."""
    kv = build_kv(num_blocks, block_size, offload, options.seed, backend=options.kv_backend)
    phases = table.phases()
    if options.sequential:
        phases = sequential_groups(table, phases)
    if len(phases) == 1:
        del phases  # an index of every row, not kept while the loop runs
        outcome = simulate_table(table, kv, options, block_size=block_size,
                                 num_gpu_blocks=num_blocks, offload=offload,
                                 content_seed=options.seed, horizon_us=None, log_steps=log_steps)
    else:
        outcome = _replay_phases(table, phases, kv, options, block_size, num_blocks, offload,
                                 log_steps)
    return outcome


def sequential_groups(table: RequestTable, phases: list[np.ndarray]) -> list[np.ndarray]:
    """Each phase split into its requests, in arrival order; a phase with session rounds stays
    whole (a round's content is built from the round before, and the rounds are already chained)."""
    groups: list[np.ndarray] = []
    for idx in phases:
        linked = (table.session[idx] >= 0) | (table.prev_round[idx] >= 0) | (table.next_round[idx] >= 0)
        if linked.any():
            groups.append(idx)
        else:
            groups.extend(np.array([i], dtype=np.int64) for i in idx)
    return groups


def _replay_phases(table: RequestTable, phases: list[np.ndarray], kv: CacheOps, options: EngineOptions,
                   block_size: int, num_blocks: int, offload: OffloadConfig | None, log_steps: bool) -> SimOutcome:
    """Phases one after the other, closed-loop at their boundaries: on the server each phase
    started once the previous one had drained, so a phase starts at its recorded first send or
    when the simulated previous phase has drained, whichever is later (its rows keep their
    spacing). Otherwise a slower simulation would batch requests that never ran together."""
    parts: list[SimOutcome] = []
    window_start = None
    drained = 0.0
    for idx in phases:
        part_table = table.take(idx)
        first = float(part_table.arrival_us.min())
        if drained > first:
            part_table.arrival_us = part_table.arrival_us + (drained - first)
        if window_start is None and part_table.in_window.any():
            window_start = kv.snapshot()
        part = simulate_table(part_table, kv, options, block_size=block_size,
                              num_gpu_blocks=num_blocks, offload=offload,
                              content_seed=options.seed, horizon_us=None, log_steps=log_steps)
        parts.append(part)
        drained = max(drained, part.loop.end_us)
    return combine_outcomes(parts, kv, offload, window_start if len(parts) > 1 else None)


def replay(trace: ReplayableTrace, options: EngineOptions | None = None) -> tuple[list[SimResult], MetricsOutput]:
    """Replay a trace: ``(SimResult list, MetricsOutput)`` (what ``--results-path`` /
    ``--metrics-path`` hold)."""
    out = replay_outcome(trace, options)
    return out.results, out.metrics()
