"""vLLM V1's scheduler as a discrete-event step loop: configuration, backend choice, results.

:func:`simulate` runs the compiled step loop (``_loop.pyx``; the pure twin ``_loop_py.py`` with
``BLIS_PURE_PYTHON=1``) over a :class:`Workload` of request arrays and a KV port. The rules, as vLLM
0.33's ``Scheduler.schedule()`` applies them (docs/vllm-semantics.md §2–§4):

* One step at a time; a step's batch is formed at its start, its duration comes from the latency
  model (:mod:`blis_sim.engine.latency`), its outputs (progress, sampled tokens, completions) land at
  its end, and the next step is formed then. Requests that arrive during a step wait for its end.
* Token budget ``max_num_batched_tokens`` per step. **Running requests first**, in admission order:
  each gets its remaining tokens (prompt chunk, or 1 for decode), capped by
  ``long_prefill_token_threshold`` (0 = off) and by the budget left (chunked prefill).
* **Preemption by recompute:** when the KV cache cannot grow a running request, the most recently
  admitted running request is preempted (its blocks freed, its progress reset, put back at the head
  of the waiting queue; it recomputes prompt + tokens generated so far when readmitted) until the
  allocation fits or the request preempted itself. A step that preempted admits nothing new.
* **Then the waiting queue, FCFS**, while the budget lasts and fewer than ``max_num_seqs`` run: a
  request with nothing computed is looked up (GPU prefix hit, then the offload tiers after it); if
  the tiers hold more of its prompt it is admitted **to load**: blocks allocated for the hit, the
  transfer started, and the request waits (skipped, keeping its place) until the load completes;
  loaded tokens are then computed, not recomputed. Otherwise the rest of its prompt is scheduled
  (capped as above). An allocation failure stops admission for this step (head-of-line blocking).
* A request yields its first token at the end of the step that computes its last prompt token, then
  one token per decode step; it finishes after ``output_tokens`` tokens (at least one), and its
  blocks are freed then. TTFT = first token − arrival, E2E = last token − arrival, ITL = the gaps
  between its tokens. A session round's successor arrives ``think_us`` after it finishes.
* ``horizon_us`` stops the simulation at the first step boundary past it; unfinished requests are
  reported as still queued or running.

A request that could never fit in the GPU cache (prompt + output tokens over its capacity) is
dropped as unservable before the run (the reference's guard), instead of stalling the queue. And
when nothing runs or loads and the head of the queue cannot be allocated because requests that
finished loading hold the blocks (vLLM would stall: its waiting loop never preempts), the most
recently queued holder is preempted (recompute) so the simulation moves on.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from blis_sim import _backend
from blis_sim.defaults import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
from blis_sim.engine.kvport import LoopPort
from blis_sim.engine.latency import LatencyModel
from blis_sim.errors import ConfigError

_loop, COMPILED = _backend.load("blis_sim.engine._loop", "blis_sim.engine._loop_py")

# Request status codes returned in LoopResult.status.
NOT_ARRIVED, WAITING, LOADING, RUNNING, FINISHED, DROPPED = 0, 1, 2, 3, 4, 5


@dataclass(frozen=True)
class SchedulerConfig:
    """The vLLM scheduler knobs (defaults are the reference's and vLLM's for a GPU server)."""

    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    long_prefill_token_threshold: int = 0
    horizon_us: float = float("inf")

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ConfigError(f"must be ≥ 1, got {self.max_num_seqs}", field="max_num_seqs")
        if self.max_num_batched_tokens < 1:
            raise ConfigError(f"must be ≥ 1, got {self.max_num_batched_tokens}",
                              field="max_num_batched_tokens")
        if self.long_prefill_token_threshold < 0:
            raise ConfigError(f"must be ≥ 0, got {self.long_prefill_token_threshold}",
                              field="long_prefill_token_threshold")
        if not self.horizon_us > 0:
            raise ConfigError(f"must be > 0, got {self.horizon_us}", field="horizon")


@dataclass
class Workload:
    """Request arrays, indexed by request position. Open-loop requests must be sorted by arrival.

    ``next_round[i]`` is the index of the session round released when ``i`` finishes (-1: none);
    such a round's ``arrival_us`` is ignored and set to (finish of i) + ``think_us[j]``.
    """

    arrival_us: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    next_round: np.ndarray | None = None
    think_us: np.ndarray | None = None
    dropped: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.arrival_us.shape[0])


@dataclass
class LoopResult:
    """What the step loop produced (arrays indexed like the workload; times in µs)."""

    arrival_us: np.ndarray
    first_token_us: np.ndarray
    finish_us: np.ndarray
    itl_sum_us: np.ndarray
    num_out: np.ndarray
    preemptions: np.ndarray
    first_sched_us: np.ndarray
    status: np.ndarray
    itl_values: np.ndarray
    itl_weights: np.ndarray
    steps: int
    preemption_count: int
    end_us: float
    step_start: np.ndarray | None = None
    step_dur: np.ndarray | None = None
    step_features: np.ndarray | None = None

    @property
    def ttft_us(self) -> np.ndarray:
        return self.first_token_us - self.arrival_us

    @property
    def e2e_us(self) -> np.ndarray:
        return self.finish_us - self.arrival_us


#: a load-routed replica's arrivals (:mod:`blis_sim.engine.load_routing`): called with the loop's time,
#: its finish times and request states, it answers the rows routed here since and when to
#: call it next
Feed = Callable[[float, np.ndarray, np.ndarray], tuple[list[int], float]]


def simulate(workload: Workload, port: LoopPort, model: LatencyModel, config: SchedulerConfig,
             *, block_size: int = 16, store_chunk_tokens: int = 0, store_prompt_only: bool = True,
             log_steps: bool = False, backend: Any = None, feed: Feed | None = None) -> LoopResult:
    """Run the step loop (compiled by default; ``backend`` forces a loop module, for tests).

    ``block_size``: the KV cache's, so the loop calls ``port.grow`` only at block boundaries.
    ``store_chunk_tokens`` > 0 makes the loop call ``port.computed(i, t)`` whenever a step completes
    an offloadable chunk (of the prompt only, with ``store_prompt_only``).
    ``feed``: the requests arrive as a cluster's router hands them over on one clock
    (:mod:`blis_sim.engine.load_routing`), not all up front.
    """
    n = len(workload)
    nr, think = workload.next_round, workload.think_us
    if nr is not None and not (nr >= 0).any():  # no session rounds: the loop needs neither column
        nr = think = None
    if nr is not None:
        nr = np.ascontiguousarray(nr, dtype=np.int64)
        think = np.ascontiguousarray(think if think is not None else np.zeros(n), dtype=np.float64)
    dropped = workload.dropped if workload.dropped is not None else np.zeros(n, bool)
    loop = backend or _loop
    out = loop.run_loop(
        np.ascontiguousarray(workload.arrival_us, dtype=np.float64),
        np.ascontiguousarray(workload.prompt_len, dtype=np.int64),
        np.ascontiguousarray(workload.output_len, dtype=np.int64), nr, think,
        np.ascontiguousarray(dropped, dtype=bool), model.weights(),
        int(config.max_num_seqs), int(config.max_num_batched_tokens),
        int(config.long_prefill_token_threshold), float(config.horizon_us), port,
        int(block_size), int(store_chunk_tokens), bool(store_prompt_only), bool(log_steps),
        *((feed,) if feed is not None else ()))
    return LoopResult(**out)
