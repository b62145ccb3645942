# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: language = c++
"""The step loop, compiled. Same algorithm and floating-point order as ``_loop_py.py`` (read that
file's docstring for the contract); tests check that both give byte-identical results.

Per-request state lives in typed numpy arrays, the queues in C++ containers; the only calls out
per step are the KV port's (lookup/admit at admission, grow per scheduled request, free): C
functions on the compiled port (its ``c_calls``), Python calls on any other.
"""
import numpy as np
cimport numpy as cnp
from libcpp.deque cimport deque
from libcpp.vector cimport vector
from libcpp.queue cimport priority_queue
from libcpp.unordered_map cimport unordered_map
from libcpp.utility cimport pair
from libc.math cimport isnan, ceil, NAN, INFINITY
from libc.stdint cimport int64_t
from libc.string cimport memcpy
from cpython.pycapsule cimport PyCapsule_GetPointer

from blis_sim.kv._port_calls cimport Admitted, PortCalls

cnp.import_array()

cdef enum:
    NOT_ARRIVED = 0
    WAITING = 1
    LOADING = 2
    RUNNING = 3
    FINISHED = 4
    DROPPED = 5

ctypedef pair[double, long] HeapItem


cdef inline bint _next_arrival(Py_ssize_t op, Py_ssize_t n, const double[::1] arr,
                               priority_queue[HeapItem]& heap, double* nxt) noexcept:
    """The earliest pending arrival (open-loop ``op``, or a released follow-up) into ``nxt``; False
    if none. The pure twin's ``_next_arrival``."""
    cdef bint have = False
    if op < n:
        nxt[0] = arr[op]
        have = True
    if not heap.empty() and (not have or -heap.top().first < nxt[0]):
        nxt[0] = -heap.top().first
        have = True
    return have


cdef double _fed(object feed, double t, priority_queue[HeapItem]& heap, double[::1] arr, object finish,
                 object status) except? -1:
    """The pure twin's ``fed``: a routed cluster's arrivals, handed over at ``t``."""
    cdef long i
    new, feed_t = feed(t, finish, status)
    for i in new:
        heap.push(HeapItem(-arr[i], -i))
    return feed_t


cdef double _wait_fed(object feed, double feed_t, double* nxt, bint* have, priority_queue[HeapItem]& heap,
                      double[::1] arr, object finish, object status) except? -1:
    """The pure twin's ``wait_fed``: the next feed time; ``nxt`` / ``have`` the loop's next event."""
    cdef size_t k
    while feed_t < INFINITY and (not have[0] or feed_t <= nxt[0]):
        k = heap.size()
        feed_t = _fed(feed, feed_t, heap, arr, finish, status)
        if heap.size() > k:
            if not have[0] or -heap.top().first < nxt[0]:
                nxt[0] = -heap.top().first
            have[0] = True
            break
    return feed_t


cdef inline Py_ssize_t _open_from(Py_ssize_t i, Py_ssize_t n, const signed char[::1] dynamic,
                                  const signed char[::1] status) noexcept:
    """The first open-loop request at or after ``i`` (``n``: none): not released by a session's
    previous round, not dropped. The pure twin's ``_open_from``."""
    while i < n and (dynamic[i] or status[i] == DROPPED):
        i += 1
    return i


cdef int _shift_of(long d) noexcept:
    """log2(d) when ``d`` is a power of two, else -1 (see :func:`_div`)."""
    cdef int k = 0
    if d <= 0 or d & (d - 1):
        return -1
    while (<long>1 << k) < d:
        k += 1
    return k


cdef inline long _div(long x, long d, int shift) noexcept nogil:
    """``x // d`` for ``x >= 0``, a shift when ``d`` is a power of two (``shift``): the step loop
    divides four times per scheduled request and step (~2.5 million times for 10k requests), and a
    64-bit division takes tens of cycles."""
    return x >> shift if shift >= 0 else x // d


cdef inline object _tuple(object x):
    """``x``, checked to be a tuple (a port's Lookup / Admission namedtuple), so that its items are
    read with a tuple's index, not the generic sequence protocol (the loop reads one per admission and
    lookup)."""
    if not isinstance(x, tuple):
        raise TypeError(f"a KV port answered {type(x).__name__}, not a tuple")
    return x


# -- the port's calls: its C functions when it offers them (the compiled port's ``c_calls``), else
# its Python methods; the same answers either way
cdef int _lookup(PortCalls* c, object port, object lookup, long i, double t, long* gpu,
                 long* external) except -1:
    cdef int64_t g, e
    if c != NULL:
        c.lookup(port, i, t, &g, &e)
        gpu[0], external[0] = g, e
        return 0
    # the ports answer tuples (namedtuples): read as tuples, not generic sequences
    lk = _tuple(lookup(i, t))
    gpu[0], external[0] = (<tuple>lk)[0], (<tuple>lk)[1]
    return 0


cdef int _admit(PortCalls* c, object port, object admit, long i, long k, double t, int* computed,
                double* done) except -1:
    """1 admitted (``computed``, and ``done`` unless NULL: the load's ready time), 0 no room."""
    cdef Admitted a
    if c != NULL:
        if not c.admit(port, i, k, t, &a):
            return 0
        computed[0] = <int>a.computed
        if done != NULL:
            done[0] = a.ready
        return 1
    res = admit(i, k, t)
    if res is None:
        return 0
    computed[0] = <int>(<tuple>_tuple(res))[0]
    if done != NULL:
        done[0] = (<tuple>res)[len(<tuple>res) - 1]
    return 1


cdef inline int _grow(PortCalls* c, object port, object grow, long i, long n) except -1:
    if c != NULL:
        return c.grow(port, i, n)
    return 1 if grow(i, n) else 0


cdef inline int _computed(PortCalls* c, object port, object computed, long i, double t) except -1:
    if c != NULL:
        return c.computed(port, i, t)
    computed(i, t)
    return 0


cdef inline int _preempt(PortCalls* c, object port, object preempt, long i) except -1:
    if c != NULL:
        return c.preempt(port, i)
    preempt(i)
    return 0


cdef inline int _finish(PortCalls* c, object port, object finish, long i) except -1:
    if c != NULL:
        return c.finish(port, i)
    finish(i)
    return 0


cdef struct ItlGap:
    double value
    long weight


cdef class _ItlLog:
    """The inter-token gaps (value, weight), one or two per step: ~10 million entries for a
    million requests. Past :data:`_SPILL` entries they go to a temporary file a block at a time
    and come back memory-mapped, so they do not add to the peak memory of the run (the KV tiers
    are alive then); what reads them later (the metrics) runs after the cache is released."""

    cdef vector[ItlGap] buf
    cdef object spill
    cdef Py_ssize_t spilled

    def __cinit__(self):
        self.spill = None
        self.spilled = 0
        # room for a spill's worth at once: growing copied the gaps ~20 times on the way (the
        # reserved pages count in memory only once written)
        self.buf.reserve(_SPILL)

    # (int, not void ``except *``: no PyErr_Occurred() after each of ~100,000 calls)
    cdef inline int add(self, double value, long weight) except -1:
        cdef ItlGap g
        g.value = value
        g.weight = weight
        self.buf.push_back(g)
        if self.buf.size() >= _SPILL:
            self._flush()
        return 0

    cdef int _flush(self) except -1:
        if self.spill is None:
            import tempfile
            self.spill = tempfile.TemporaryFile(prefix="blis-itl-")
        self.spill.write((<char*>self.buf.data())[:self.buf.size() * sizeof(ItlGap)])
        self.spilled += self.buf.size()
        self.buf.clear()
        return 0

    def arrays(self):
        """(values float64, weights int64)."""
        cdef Py_ssize_t n = self.buf.size()
        if self.spill is None:
            rec = np.empty(n, dtype=_GAP)
            if n:
                memcpy(cnp.PyArray_DATA(rec), self.buf.data(), n * sizeof(ItlGap))
        else:
            if n:
                self._flush()
            self.spill.flush()
            rec = np.memmap(self.spill, dtype=_GAP, mode="r", shape=(self.spilled,))
            self.spill.close()  # the mapping stays valid; the file goes with it
        return rec["value"], rec["weight"]


# the most tokens (prompt + output) of one request: the loop's token positions are int32
cdef long _MAX_TOKENS = 2147483647

# gaps held in memory before they spill to a file (1M entries: 16 MB)
cdef size_t _SPILL = 1 << 20
_GAP = np.dtype([("value", np.float64), ("weight", np.int64)])


cdef _f64(vector[double]& v):
    """The vector as a new float64 array, copied at once (coercing it would make a list of floats)."""
    out = np.empty(v.size(), dtype=np.float64)
    if v.size():
        memcpy(cnp.PyArray_DATA(out), v.data(), v.size() * sizeof(double))
    return out


cdef int _check_tokens(const long[::1] plen, const long[::1] olen) except -1:
    """Refuse a request whose prompt + output does not fit the loop's int32 token positions."""
    cdef Py_ssize_t i
    for i in range(plen.shape[0]):
        if plen[i] + (olen[i] if olen[i] > 1 else 1) > _MAX_TOKENS:
            from blis_sim.engine._loop_py import raise_too_long
            raise_too_long(i, plen[i], olen[i])
    return 0


def run_loop(arrival, prompt_len, output_len, next_round, think_us, dropped, weights,
             long max_num_seqs, long max_num_batched_tokens, long long_prefill_token_threshold,
             double horizon_us, port, long block_size, long store_chunk_tokens,
             bint store_prompt_only, bint log_steps, feed=None):
    cdef Py_ssize_t n = arrival.shape[0]
    # next_round None: no session rounds, so no arrival is rewritten and the caller's arrivals
    # are the result's (not copied: a copy per request for the whole run)
    cdef bint rounds = next_round is not None
    arr_np = np.ascontiguousarray(arrival, dtype=np.float64)
    if rounds or not arr_np.flags.writeable:
        arr_np = arr_np.copy()
    cdef double[::1] arr = arr_np
    cdef const long[::1] plen = np.ascontiguousarray(prompt_len, dtype=np.int64)
    # (read only where a token was just sampled, so num_out >= 1: an output_len < 1 is one token)
    cdef const long[::1] olen = np.ascontiguousarray(output_len, dtype=np.int64)
    cdef const long[::1] nxt_round
    cdef const double[::1] think
    if rounds:
        nxt_round = np.ascontiguousarray(next_round, dtype=np.int64)
        think = np.ascontiguousarray(think_us, dtype=np.float64)
    status_np = np.where(np.asarray(dropped).astype(bool), np.int8(DROPPED), np.int8(NOT_ARRIVED))
    cdef signed char[::1] status = status_np
    # token counts held as int32 (a request's prompt + output is checked below 2^31 first): the
    # per-request arrays live for the whole run
    _check_tokens(plen, olen)
    cdef int[::1] computed = np.zeros(n, dtype=np.int32)
    num_out_np = np.zeros(n, dtype=np.int32)
    cdef int[::1] num_out = num_out_np
    first_tok_np = np.full(n, np.nan)
    cdef double[::1] first_tok = first_tok_np
    # a request's last token time while it runs, its finish once FINISHED (the same time then):
    # NaN for the unfinished ones at the end (one array for both, not two a request)
    finish_np = np.full(n, np.nan)
    cdef double[::1] finish = finish_np
    itl_sum_np = np.zeros(n)
    cdef double[::1] itl_sum = itl_sum_np
    first_sched_np = np.full(n, np.nan)
    cdef double[::1] first_sched = first_sched_np
    preempts_np = np.zeros(n, dtype=np.int32)
    cdef int[::1] preempts = preempts_np
    # a load's ready time, for the requests LOADING only (no slot per request of the trace)
    cdef unordered_map[long, double] load_done
    cdef int[::1] kv_end = np.zeros(n, dtype=np.int32)
    cdef signed char[::1] in_kv = np.zeros(n, dtype=np.int8)
    cdef double[:, ::1] w = np.ascontiguousarray(weights, dtype=np.float64)
    # the port's calls bound once: otherwise each call looks the name up and makes a bound method
    port_lookup, port_admit, port_grow = port.lookup, port.admit, port.grow
    port_computed, port_preempt, port_finish = port.computed, port.preempt, port.finish
    cdef PortCalls* calls = NULL
    capsule = getattr(port, "c_calls", None)
    if capsule is not None:
        calls = <PortCalls*>PyCapsule_GetPointer(capsule, b"blis_sim.kv._port_calls.PortCalls")
    cdef double wc0 = w[0, 0], wc1 = w[0, 1], wc2 = w[0, 2], wc3 = w[0, 3], wc4 = w[0, 4], wc5 = w[0, 5]
    cdef double wm0 = w[1, 0], wm1 = w[1, 1], wm2 = w[1, 2], wm3 = w[1, 3], wm4 = w[1, 4], wm5 = w[1, 5]

    # open-loop arrivals in index order: a cursor over the requests (no index list of them)
    cdef signed char[::1] dynamic = np.zeros(n, dtype=np.int8)
    cdef Py_ssize_t i, j, x
    if rounds:
        for i in range(n):
            j = nxt_round[i]
            if j >= 0:
                dynamic[j] = 1
    cdef Py_ssize_t op = _open_from(0, n, dynamic, status) if feed is None else n
    # min-heap of (arrival, index) via negated keys, so ties break like Python's heapq on tuples
    cdef priority_queue[HeapItem] heap

    cdef deque[long] waiting
    cdef vector[long] running
    # this step's scheduled requests and their new tokens (sched_k): the first nsched entries,
    # written by index (sized for every request in the system at the step's start, the most a
    # step schedules): the append was compiled out of line, ~690,000 calls for 10k requests
    cdef vector[long] scheduled
    cdef vector[long] sched_k
    cdef Py_ssize_t nsched = 0
    cdef vector[long] skipped
    cdef vector[long] keep
    cdef _ItlLog itl = _ItlLog()
    cdef vector[double] log_start
    cdef vector[double] log_dur
    cdef vector[double] log_feat
    cdef double t = 0.0, t_end, d, dc, dm, tp, td, cd, cp, ap, gap, nxt, done
    cdef bint have_nxt, preempted, ok, finished_any
    cdef long steps = 0, preemption_count = 0, n_loading = 0
    cdef long budget, k, total, seq, victim, local, external, regular, old, lim, end
    cdef Py_ssize_t idx
    cdef int bs_shift = _shift_of(block_size), ct_shift = _shift_of(store_chunk_tokens)
    cdef double feed_t = -INFINITY if feed is not None else INFINITY

    while True:
        if t >= feed_t:
            feed_t = _fed(feed, t, heap, arr, finish_np, status_np)
        # 1. arrivals up to now
        while op < n and arr[op] <= t:
            i = op
            op = _open_from(op + 1, n, dynamic, status)
            status[i] = WAITING
            waiting.push_back(i)
        while not heap.empty() and -heap.top().first <= t:
            i = -heap.top().second
            heap.pop()
            if status[i] == NOT_ARRIVED:
                status[i] = WAITING
                waiting.push_back(i)
        if running.empty() and waiting.empty():
            have_nxt = _next_arrival(op, n, arr, heap, &nxt)
            if feed_t < INFINITY:
                feed_t = _wait_fed(feed, feed_t, &nxt, &have_nxt, heap, arr, finish_np, status_np)
            if not have_nxt or nxt > horizon_us:
                break
            t = nxt
            continue
        # 2. finished loads
        if n_loading:
            for x in range(<Py_ssize_t>waiting.size()):
                i = waiting[x]
                if status[i] == LOADING and load_done[i] <= t:
                    load_done.erase(i)
                    status[i] = WAITING
                    n_loading -= 1

        # 3. schedule: running first, then waiting
        budget = max_num_batched_tokens
        nsched = 0
        if <size_t>(running.size() + waiting.size()) > scheduled.size():
            scheduled.resize(running.size() + waiting.size())
            sched_k.resize(scheduled.size())
        preempted = False
        idx = 0
        while idx < <Py_ssize_t>running.size() and budget > 0:
            i = running[idx]
            k = plen[i] + num_out[i] - computed[i]
            if 0 < long_prefill_token_threshold < k:
                k = long_prefill_token_threshold
            if k > budget:
                k = budget
            ok = True
            end = computed[i] + k
            if (_div(end + block_size - 1, block_size, bs_shift)
                    > _div(kv_end[i] + block_size - 1, block_size, bs_shift)):
                while not _grow(calls, port, port_grow, i, end - kv_end[i]):
                    victim = running.back()
                    running.pop_back()
                    if kv_end[victim] < computed[victim]:
                        _grow(calls, port, port_grow, victim, computed[victim] - kv_end[victim])
                    _preempt(calls, port, port_preempt, victim)
                    status[victim] = WAITING
                    computed[victim] = 0
                    kv_end[victim] = 0
                    in_kv[victim] = 0
                    preempts[victim] += 1
                    preemption_count += 1
                    waiting.push_front(victim)
                    preempted = True
                    if victim == i:
                        ok = False
                        break
                if not ok:
                    break
                kv_end[i] = end
            scheduled[nsched] = i
            sched_k[nsched] = k
            nsched += 1
            budget -= k
            idx += 1

        if not preempted:
            skipped.clear()
            while not waiting.empty() and budget > 0 and <long>running.size() < max_num_seqs:
                i = waiting.front()
                if status[i] == LOADING:
                    skipped.push_back(i)
                    waiting.pop_front()
                    continue
                total = plen[i] + num_out[i]
                if not in_kv[i]:
                    _lookup(calls, port, port_lookup, i, t, &local, &external)
                    if external > 0:
                        if not _admit(calls, port, port_admit, i, 0, t, &computed[i], &done):
                            break
                        waiting.pop_front()
                        in_kv[i] = 1
                        kv_end[i] = computed[i]
                        if done > t:
                            status[i] = LOADING
                            load_done[i] = done
                            n_loading += 1
                            skipped.push_back(i)
                            continue
                        waiting.push_front(i)
                        continue
                    k = total - local
                    if 0 < long_prefill_token_threshold < k:
                        k = long_prefill_token_threshold
                    if k > budget:
                        k = budget
                    if not _admit(calls, port, port_admit, i, k, t, &computed[i], NULL):
                        break
                    in_kv[i] = 1
                    kv_end[i] = computed[i] + k
                else:
                    k = total - computed[i]
                    if 0 < long_prefill_token_threshold < k:
                        k = long_prefill_token_threshold
                    if k > budget:
                        k = budget
                    if not _grow(calls, port, port_grow, i, computed[i] + k - kv_end[i]):
                        break
                    kv_end[i] = computed[i] + k
                waiting.pop_front()
                status[i] = RUNNING
                running.push_back(i)
                if isnan(first_sched[i]):
                    first_sched[i] = t
                scheduled[nsched] = i
                sched_k[nsched] = k
                nsched += 1
                budget -= k
            for x in range(<Py_ssize_t>skipped.size() - 1, -1, -1):
                waiting.push_front(skipped[x])

        if nsched == 0 and running.empty() and n_loading == 0 and not waiting.empty():
            victim = -1
            for x in range(<Py_ssize_t>waiting.size() - 1, -1, -1):
                if in_kv[waiting[x]] and (x > 0 or victim < 0):
                    victim = waiting[x]
                    break
            if victim >= 0 and victim != waiting.front():
                _preempt(calls, port, port_preempt, victim)
                in_kv[victim] = 0
                computed[victim] = 0
                kv_end[victim] = 0
                preempts[victim] += 1
                preemption_count += 1
                continue
        if nsched == 0:
            have_nxt = _next_arrival(op, n, arr, heap, &nxt)
            if n_loading:
                for x in range(<Py_ssize_t>waiting.size()):
                    i = waiting[x]
                    if status[i] == LOADING and (not have_nxt or load_done[i] < nxt):
                        nxt = load_done[i]
                        have_nxt = True
            if feed_t < INFINITY:
                feed_t = _wait_fed(feed, feed_t, &nxt, &have_nxt, heap, arr, finish_np, status_np)
            if not have_nxt:
                if not waiting.empty() or not running.empty():
                    from blis_sim.engine._loop_py import raise_stuck
                    raise_stuck([waiting.front()] if not waiting.empty() else [],
                                np.asarray(plen), num_out_np)
                break
            if nxt > horizon_us:
                break
            t = nxt if nxt > t else t
            continue

        # 4. step time
        tp = 0.0
        td = 0.0
        cd = 0.0
        cp = 0.0
        ap = 0.0
        for x in range(nsched):
            i = scheduled[x]
            k = sched_k[x]
            seq = computed[i]
            if num_out[i] > 0 and k == 1 and seq == plen[i] + num_out[i] - 1:
                td += 1.0
                cd += <double>seq
            else:
                tp += <double>k
                cp += <double>seq
                ap += <double>k * <double>seq + <double>k * <double>(k + 1) * 0.5
        dc = wc0 + wc1 * tp + wc2 * td + wc3 * cd + wc4 * cp + wc5 * ap
        dm = wm0 + wm1 * tp + wm2 * td + wm3 * cd + wm4 * cp + wm5 * ap
        d = dc if dc > dm else dm
        if d < 1.0:
            d = 1.0
        if log_steps:
            log_start.push_back(t)
            log_dur.push_back(d)
            log_feat.push_back(1.0)
            log_feat.push_back(tp)
            log_feat.push_back(td)
            log_feat.push_back(cd)
            log_feat.push_back(cp)
            log_feat.push_back(ap)
        t_end = t + d
        steps += 1

        # 5. outputs
        regular = 0
        finished_any = False
        for x in range(nsched):
            i = scheduled[x]
            old = computed[i]
            computed[i] += sched_k[x]
            if store_chunk_tokens > 0:
                lim = computed[i]
                if store_prompt_only and lim > plen[i]:
                    lim = plen[i]
                if _div(lim, store_chunk_tokens, ct_shift) > _div(old, store_chunk_tokens, ct_shift):
                    if kv_end[i] < computed[i]:
                        _grow(calls, port, port_grow, i, computed[i] - kv_end[i])
                        kv_end[i] = computed[i]
                    _computed(calls, port, port_computed, i, t_end)
            if computed[i] == plen[i] + num_out[i]:
                num_out[i] += 1
                if num_out[i] == 1:
                    first_tok[i] = t_end
                else:
                    gap = t_end - finish[i]
                    itl_sum[i] += gap
                    if finish[i] == t:
                        regular += 1
                    else:
                        itl.add(gap, 1)
                finish[i] = t_end
                if num_out[i] >= olen[i]:
                    if kv_end[i] < computed[i]:
                        _grow(calls, port, port_grow, i, computed[i] - kv_end[i])
                        kv_end[i] = computed[i]
                    status[i] = FINISHED
                    _finish(calls, port, port_finish, i)
                    finished_any = True
                    j = nxt_round[i] if rounds else -1
                    if j >= 0:
                        arr[j] = ceil(t_end + think[j])
                        heap.push(HeapItem(-arr[j], -j))
        if regular:
            itl.add(t_end - t, regular)
        if finished_any:
            keep.clear()
            for x in range(<Py_ssize_t>running.size()):
                i = running[x]
                if status[i] == RUNNING:
                    keep.push_back(i)
            running.swap(keep)
        t = t_end
        if t > horizon_us:
            break

    for i in range(n):
        if status[i] != FINISHED:
            finish[i] = NAN
    out = {
        "arrival_us": arr_np, "first_token_us": first_tok_np, "finish_us": finish_np,
        "itl_sum_us": itl_sum_np, "num_out": num_out_np, "preemptions": preempts_np,
        "first_sched_us": first_sched_np, "status": status_np,
        "steps": steps,
        "preemption_count": preemption_count, "end_us": t,
    }
    out["itl_values"], out["itl_weights"] = itl.arrays()
    if log_steps:
        out["step_start"] = _f64(log_start)
        out["step_dur"] = _f64(log_dur)
        out["step_features"] = _f64(log_feat).reshape(-1, 6)
    return out
