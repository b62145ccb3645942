"""The step loop, pure-Python twin of ``_loop.pyx`` (same algorithm, same floating-point order).

The compiled module is the default (``blis_sim._backend.load``); both must give byte-identical
results, which ``tests/test_engine_loop.py`` checks. Keep the two files in step: every statement
that touches a float is written in the same order in both.

``run_loop(arrival, prompt_len, output_len, next_round, think_us, dropped, weights, max_num_seqs,
max_num_batched_tokens, long_prefill_token_threshold, horizon_us, port, block_size,
store_chunk_tokens, store_prompt_only, log_steps, feed=None)`` (``next_round`` and ``think_us`` None:
no session rounds; a request's prompt + output at most ``MAX_TOKENS``) simulates vLLM
V1's scheduler (blis_sim.engine.scheduler documents the rules) and returns a dict of numpy arrays:
per request ``first_token_us``, ``finish_us``, ``itl_sum_us``, ``num_out``, ``preemptions``,
``first_sched_us``, ``arrival_us`` (dynamic arrivals filled in), ``status``; per step, the ITL
samples as ``itl_values``/``itl_weights``; counts ``steps``, ``preemption_count``, ``end_us``;
and with ``log_steps`` the step log ``step_start``, ``step_dur``, ``step_features`` (fit uses it).

``port`` is the KV side (blis_sim.engine.kvport documents it): ``lookup(i, now)`` → a tuple
starting (GPU-hit tokens, external tokens); ``admit(i, num_new_tokens, now)`` → None (no room) or a
tuple (num_computed_tokens, ..., load_ready_us); ``grow(i, num_new_tokens)`` → bool, called
only when a step fills a block or needs a new one (``block_size``), with every token scheduled
since the previous call;
``computed(i, now)`` when a step completed a chunk that may be offloaded (only with
``store_chunk_tokens > 0``: the chunk size; ``store_prompt_only``: prompt chunks only);
``preempt(i)``; ``finish(i)``.

``feed`` (a cluster routed by load, :mod:`blis_sim.engine.load_routing`): no open-loop request is
known up front; at each time ``feed`` names, the loop calls :func:`fed` at the first step boundary at
or past it (before that iteration takes its arrivals), or, when nothing runs until later, waits at
that time (:func:`wait_fed`); the requests routed here join then, through the heap of released
arrivals (a load-routed replay has no session rounds, so the heap holds nothing else).
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from blis_sim.errors import SimulationError

if TYPE_CHECKING:
    from blis_sim.engine.kvport import LoopPort
    from blis_sim.engine.scheduler import Feed

# Request status codes (shared with _loop.pyx and scheduler.py).
NOT_ARRIVED, WAITING, LOADING, RUNNING, FINISHED, DROPPED = 0, 1, 2, 3, 4, 5


def run_loop(arrival: np.ndarray, prompt_len: np.ndarray, output_len: np.ndarray,
             next_round: np.ndarray | None, think_us: np.ndarray | None, dropped: np.ndarray,
             weights: np.ndarray,
             max_num_seqs: int, max_num_batched_tokens: int, long_prefill_token_threshold: int,
             horizon_us: float, port: LoopPort, block_size: int, store_chunk_tokens: int,
             store_prompt_only: bool, log_steps: bool, feed: Feed | None = None) -> dict[str, Any]:
    n = arrival.shape[0]
    # next_round None: no session rounds, so no arrival is rewritten and the caller's arrivals
    # are the result's (not copied: a copy per request for the whole run)
    rounds = next_round is not None
    arr = np.ascontiguousarray(arrival, dtype=np.float64)
    if rounds or not arr.flags.writeable:
        arr = arr.copy()
    plen = prompt_len.astype(np.int64, copy=False)
    # (read only where a token was just sampled, so num_out >= 1: an output_len < 1 is one token)
    olen = output_len.astype(np.int64, copy=False)
    status = np.where(dropped.astype(bool), np.int8(DROPPED), np.int8(NOT_ARRIVED))
    for i in np.flatnonzero(plen + np.maximum(olen, 1) > MAX_TOKENS)[:1].tolist():
        raise_too_long(i, int(plen[i]), int(olen[i]))
    computed = np.zeros(n, dtype=np.int64)
    num_out = np.zeros(n, dtype=np.int32)
    first_tok = np.full(n, np.nan)
    # a request's last token time while it runs, its finish once FINISHED (the same time then):
    # NaN for the unfinished ones at the end (one array for both, not two a request)
    finish = np.full(n, np.nan)
    itl_sum = np.zeros(n)
    first_sched = np.full(n, np.nan)
    preempts = np.zeros(n, dtype=np.int32)
    load_done: dict[int, float] = {}  # a load's ready time, for the requests LOADING only
    kv_end = np.zeros(n, dtype=np.int64)  # tokens the KV cache has been told about
    in_kv = np.zeros(n, dtype=bool)  # admitted to the KV cache (blocks held) and not preempted since
    w = weights.astype(np.float64)
    wc0, wc1, wc2, wc3, wc4, wc5 = (float(x) for x in w[0])
    wm0, wm1, wm2, wm3, wm4, wm5 = (float(x) for x in w[1])

    # Open-loop arrivals are taken in index order (the caller sorts them), by a cursor over the
    # requests; a request whose arrival is released by its session's previous round (next_round)
    # goes through the heap.
    dynamic = np.zeros(n, dtype=bool)
    if rounds:
        assert next_round is not None and think_us is not None
        for i in range(n):
            j = int(next_round[i])
            if j >= 0:
                dynamic[j] = True
    op = _open_from(0, n, dynamic, status) if feed is None else n
    heap: list[tuple[float, int]] = []
    feed_t = -math.inf if feed is not None else math.inf

    waiting: deque[int] = deque()
    running: list[int] = []
    itl_values: list[float] = []
    itl_weights: list[int] = []
    log_start: list[float] = []
    log_dur: list[float] = []
    log_feat: list[tuple[float, ...]] = []
    t = 0.0
    steps = 0
    preemption_count = 0
    n_loading = 0

    while True:
        if t >= feed_t:
            feed_t = fed(feed, t, heap, arr, finish, status)
        # 1. Arrivals up to now join the waiting queue, in arrival order.
        while op < n and arr[op] <= t:
            i = op
            op = _open_from(op + 1, n, dynamic, status)
            status[i] = WAITING
            waiting.append(i)
        while heap and heap[0][0] <= t:
            _, i = heapq.heappop(heap)
            if status[i] == NOT_ARRIVED:
                status[i] = WAITING
                waiting.append(i)
        if not running and not waiting:
            nxt = _next_arrival(op, n, arr, heap)
            if feed_t < math.inf:
                nxt, feed_t = wait_fed(feed, feed_t, nxt, heap, arr, finish, status)
            if nxt is None or nxt > horizon_us:
                break
            t = nxt
            continue
        # 2. Loads finished by now make their requests schedulable again.
        if n_loading:
            for i in waiting:
                if status[i] == LOADING and load_done[i] <= t:
                    del load_done[i]
                    status[i] = WAITING
                    n_loading -= 1

        # 3. Schedule: running requests first (vLLM V1), then the waiting queue.
        budget = max_num_batched_tokens
        scheduled: list[int] = []
        sched_k: list[int] = []  # the new tokens of each scheduled request
        preempted = False
        idx = 0
        while idx < len(running) and budget > 0:
            i = running[idx]
            k = plen[i] + num_out[i] - computed[i]
            if 0 < long_prefill_token_threshold < k:
                k = long_prefill_token_threshold
            if k > budget:
                k = budget
            ok = True
            end = computed[i] + k
            # The cache hears about growth only when a new block is needed (once per block); the
            # tokens in between are passed along then, or when a chunk is stored, or at the end.
            if (end + block_size - 1) // block_size > (kv_end[i] + block_size - 1) // block_size:
                while not port.grow(i, int(end - kv_end[i])):
                    victim = running.pop()  # FCFS: the most recently admitted request
                    if kv_end[victim] < computed[victim]:  # its full blocks keep their hashes
                        port.grow(victim, int(computed[victim] - kv_end[victim]))
                    port.preempt(victim)
                    status[victim] = WAITING
                    computed[victim] = 0
                    kv_end[victim] = 0
                    in_kv[victim] = False
                    preempts[victim] += 1
                    preemption_count += 1
                    waiting.appendleft(victim)
                    preempted = True
                    if victim == i:
                        ok = False
                        break
                if not ok:
                    break
                kv_end[i] = end
            scheduled.append(i)
            sched_k.append(int(k))
            budget -= k
            idx += 1

        if not preempted:
            skipped: list[int] = []
            while waiting and budget > 0 and len(running) < max_num_seqs:
                i = waiting[0]
                if status[i] == LOADING:
                    skipped.append(waiting.popleft())
                    continue
                total = plen[i] + num_out[i]
                if not in_kv[i]:  # new, or preempted: look it up (GPU, then offload tiers)
                    lk = port.lookup(i, t)
                    local = int(lk[0])
                    external = int(lk[1])
                    if external > 0:
                        res = port.admit(i, 0, t)  # blocks for the hit + the load; no compute yet
                        if res is None:
                            break
                        waiting.popleft()
                        in_kv[i] = True
                        computed[i] = int(res[0])
                        kv_end[i] = computed[i]
                        done = float(res[-1])
                        if done > t:
                            status[i] = LOADING
                            load_done[i] = done
                            n_loading += 1
                            skipped.append(i)
                            continue
                        waiting.appendleft(i)  # loaded already: schedule the rest now
                        continue
                    k = total - local
                    if 0 < long_prefill_token_threshold < k:
                        k = long_prefill_token_threshold
                    if k > budget:
                        k = budget
                    res = port.admit(i, int(k), t)
                    if res is None:
                        break
                    in_kv[i] = True
                    computed[i] = int(res[0])
                    kv_end[i] = computed[i] + k
                else:  # admitted with a load that has finished: loaded tokens count as computed
                    k = total - computed[i]
                    if 0 < long_prefill_token_threshold < k:
                        k = long_prefill_token_threshold
                    if k > budget:
                        k = budget
                    if not port.grow(i, int(computed[i] + k - kv_end[i])):
                        break
                    kv_end[i] = computed[i] + k
                waiting.popleft()
                status[i] = RUNNING
                running.append(i)
                if first_sched[i] != first_sched[i]:  # NaN: first time scheduled
                    first_sched[i] = t
                scheduled.append(i)
                sched_k.append(int(k))
                budget -= k
            for i in reversed(skipped):
                waiting.appendleft(i)

        if not scheduled and not running and not n_loading and waiting:
            # Deadlock: nothing runs, nothing loads, and the head cannot be allocated because
            # waiting requests that finished loading hold the blocks. vLLM would stall here; we
            # preempt the most recently queued holder (recompute) and schedule again.
            victim = -1
            for x in range(len(waiting) - 1, -1, -1):
                if in_kv[waiting[x]] and (x > 0 or victim < 0):
                    victim = waiting[x]
                    break
            if victim >= 0 and victim != waiting[0]:
                port.preempt(victim)
                in_kv[victim] = False
                computed[victim] = 0
                kv_end[victim] = 0
                preempts[victim] += 1
                preemption_count += 1
                continue
        if not scheduled:
            # Nothing can run now: jump to the next arrival or load completion.
            nxt = _next_arrival(op, n, arr, heap)
            if n_loading:
                for i in waiting:
                    if status[i] == LOADING and (nxt is None or load_done[i] < nxt):
                        nxt = load_done[i]
            if feed_t < math.inf:
                nxt, feed_t = wait_fed(feed, feed_t, nxt, heap, arr, finish, status)
            if nxt is None:
                if waiting or running:
                    raise_stuck(waiting, plen, num_out)
                break
            if nxt > horizon_us:
                break
            t = nxt if nxt > t else t
            continue

        # 4. Step time from this batch's features.
        tp = 0.0
        td = 0.0
        cd = 0.0
        cp = 0.0
        ap = 0.0
        for x, i in enumerate(scheduled):
            k = sched_k[x]
            seq = computed[i]
            if num_out[i] > 0 and k == 1 and seq == plen[i] + num_out[i] - 1:
                td += 1.0
                cd += float(seq)
            else:
                tp += float(k)
                cp += float(seq)
                ap += float(k) * float(seq) + float(k) * float(k + 1) * 0.5
        dc = wc0 + wc1 * tp + wc2 * td + wc3 * cd + wc4 * cp + wc5 * ap
        dm = wm0 + wm1 * tp + wm2 * td + wm3 * cd + wm4 * cp + wm5 * ap
        d = dc if dc > dm else dm
        if d < 1.0:
            d = 1.0
        if log_steps:
            log_start.append(t)
            log_dur.append(d)
            log_feat.append((1.0, tp, td, cd, cp, ap))
        t_end = t + d
        steps += 1

        # 5. Outputs: progress, sampled tokens, completions.
        regular = 0
        keep: list[int] = []
        finished_any = False
        for x, i in enumerate(scheduled):
            old = computed[i]
            computed[i] += sched_k[x]
            if store_chunk_tokens > 0:
                lim = computed[i]
                if store_prompt_only and lim > plen[i]:
                    lim = plen[i]
                if lim // store_chunk_tokens > old // store_chunk_tokens:
                    if kv_end[i] < computed[i]:  # fills a block: no allocation, cannot fail
                        port.grow(i, int(computed[i] - kv_end[i]))
                        kv_end[i] = computed[i]
                    port.computed(i, t_end)
            if computed[i] == plen[i] + num_out[i]:
                num_out[i] += 1
                if num_out[i] == 1:
                    first_tok[i] = t_end
                else:
                    gap = t_end - finish[i]
                    itl_sum[i] += gap
                    if finish[i] == t:  # tokens in consecutive steps: the gap is this step
                        regular += 1
                    else:
                        itl_values.append(gap)
                        itl_weights.append(1)
                finish[i] = t_end
                if num_out[i] >= olen[i]:
                    if kv_end[i] < computed[i]:  # register the last full blocks' hashes
                        port.grow(i, int(computed[i] - kv_end[i]))
                        kv_end[i] = computed[i]
                    status[i] = FINISHED
                    port.finish(i)
                    finished_any = True
                    j = int(next_round[i]) if next_round is not None else -1
                    if j >= 0:
                        assert think_us is not None
                        # whole µs, so a trace records the arrival exactly (INV-13)
                        arr[j] = math.ceil(t_end + think_us[j])
                        heapq.heappush(heap, (float(arr[j]), j))
        if regular:
            itl_values.append(t_end - t)
            itl_weights.append(regular)
        if finished_any:
            for i in running:
                if status[i] == RUNNING:
                    keep.append(i)
            running = keep
        t = t_end
        if t > horizon_us:
            break

    finish[status != FINISHED] = np.nan
    out = {
        "arrival_us": arr, "first_token_us": first_tok, "finish_us": finish, "itl_sum_us": itl_sum,
        "num_out": num_out, "preemptions": preempts, "first_sched_us": first_sched,
        "status": status, "itl_values": np.array(itl_values, dtype=np.float64),
        "itl_weights": np.array(itl_weights, dtype=np.int64), "steps": steps,
        "preemption_count": preemption_count, "end_us": t,
    }
    if log_steps:
        out["step_start"] = np.array(log_start, dtype=np.float64)
        out["step_dur"] = np.array(log_dur, dtype=np.float64)
        out["step_features"] = np.array(log_feat, dtype=np.float64).reshape(-1, 6)
    return out


def _open_from(i: int, n: int, dynamic: np.ndarray, status: np.ndarray) -> int:
    """The first open-loop request at or after ``i`` (``n``: none): not released by a session's
    previous round, not dropped."""
    while i < n and (dynamic[i] or status[i] == DROPPED):
        i += 1
    return i


def _next_arrival(op: int, n: int, arr: np.ndarray,
                  heap: list[tuple[float, int]]) -> float | None:
    nxt = None
    if op < n:
        nxt = float(arr[op])
    if heap and (nxt is None or heap[0][0] < nxt):
        nxt = heap[0][0]
    return nxt



def fed(feed: Feed | None, t: float, heap: list[tuple[float, int]], arr: np.ndarray, finish: np.ndarray,
        status: np.ndarray) -> float:
    """A routed cluster's arrivals (``feed``: blis_sim.engine.load_routing): at ``t``, the loop hands
    its finish times and request states to ``feed``, which returns the requests
    routed here since (indices in arrival order, pushed on the heap of released arrivals) and the
    time to call it next (> ``t``)."""
    assert feed is not None  # called only while a feed time is pending
    new, feed_t = feed(t, finish, status)
    for i in new:
        heapq.heappush(heap, (float(arr[i]), i))
    return float(feed_t)


def wait_fed(feed: Feed | None, feed_t: float, nxt: float | None, heap: list[tuple[float, int]], arr: np.ndarray,
             finish: np.ndarray, status: np.ndarray) -> tuple[float | None, float]:
    """Nothing runs before the loop's own next event ``nxt`` (None: none): while the router's
    ``feed_t`` comes first, wait there with the loop's clock where it is, so that the loop retries
    nothing an unrouted loop would not; rows routed here arrive at that time, its next event.
    Returns (next event, next feed time)."""
    while feed_t < math.inf and (nxt is None or feed_t <= nxt):
        k = len(heap)
        feed_t = fed(feed, feed_t, heap, arr, finish, status)
        if len(heap) > k:
            a = heap[0][0]
            return (a if nxt is None or a < nxt else nxt), feed_t
    return nxt, feed_t


# the most tokens (prompt + output) of one request: the compiled loop's token positions are int32
MAX_TOKENS = 2**31 - 1


def raise_too_long(i: int, prompt: int, output: int) -> None:
    raise SimulationError(
        f"request index {i}: a prompt of {prompt} tokens and {output} output tokens is more than "
        f"the simulator's {MAX_TOKENS} tokens per request")


def raise_stuck(waiting: Sequence[int], plen: np.ndarray, num_out: np.ndarray) -> None:
    i = waiting[0] if waiting else -1
    size = int(plen[i] + num_out[i]) if i >= 0 else 0
    raise SimulationError(
        f"the simulation cannot make progress: request index {i} ({size} tokens) cannot be "
        "allocated and nothing else is running (the KV cache is too small for it)")
