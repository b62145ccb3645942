"""Spec -> :class:`~blis_sim.workload.plan.WorkloadPlan`: arrivals, lengths, prefix groups, sessions, phases.

API::

    plan = generate_workload(spec, seed=None, num_requests=None, horizon=None)   # CLI overrides (> 0 wins)

Semantics follow the reference generator (``sim/workload/generator.go``) where it matters for KV behaviour:

* Rates: ``rate_i = aggregate_rate × f_i / Σ f`` over rate-based clients (with lifecycle windows, Σ runs over the
  clients whose windows overlap client i's). Cohorts expand into ``population`` clients ``<id>-<j>`` of
  ``rate_fraction / population`` each (``prefix_sharing: per_member`` gives group ``<group>-<j>``; diurnal /
  drain become lifecycle windows).
* Each rate-based client draws arrivals from its own stream (independent of its length draws); arrivals at or
  after ``horizon`` are dropped; outside the client's lifecycle windows they are skipped.
* Every request of a ``prefix_group`` starts with the group's prefix; its length is the ``prefix_length`` of the
  first client (in spec order, across phases) naming the group, 50 when unset; it is **added** to the sampled
  input length. Prefix content comes from :mod:`blis_sim.workload.tokens` keyed by the group name, so the same
  group in two phases has the same prefix.
* ``num_requests`` caps a phase: requests are merged in arrival order (ties: client order) and the first N kept.
  A closed-loop multi-turn session is charged its ``max_rounds`` when it starts (truncated to what is left), so
  a phase never exceeds N requests. Virtual users (``concurrency``) get seeds within what is left, then share
  the remaining budget for follow-ups (``follow_up_budget``), as in the reference.
* Multi-turn (``reasoning.multi_turn``): closed loop by default (round r+1 is released by the driver when round r
  completes, after ``think_time_us``); with ``closed_loop: false`` every round is pre-scheduled at
  ``start + Σ(think_time + output_len µs)`` like the reference. ``context_growth: accumulate`` makes round r+1's
  input = round r's input + its output + new tokens; the prefix is at the start of the session.
* Closed-loop users (``concurrency: n``): user u's first request at ``u × think_time_us / n``; each next request
  ``think_time_us`` after the previous completes; no context growth; until horizon / budget.
* Deadlines: ``timeout`` unset gives none for open-loop clients and arrival + 300 s for session clients.

* Lifecycle windows with overrides (``trace_rate``, ``arrival``, distributions; cohort ``spike.trace_rate``) follow
  the reference's time-varying path for the clients that have windows: per window, ``ceil(rate × duration)``
  inter-arrival times rescaled to the window, the rate being the aggregate split by ``trace_rate`` (or
  ``rate_fraction``) over the clients active in the window, or ``trace_rate`` itself when ``aggregate_rate`` is 0
  (absolute mode). Unlike the reference, clients without windows keep generating (it drops them with a warning)
  and grouped requests keep their prefix (it drops it on that path).

Not supported (a :class:`~blis_sim.errors.ConfigError`): ``servegen_data`` and ``inference_perf`` sources.
"""
from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace

from blis_sim.errors import ConfigError
from blis_sim.formats.workload import (
    DEFAULT_PREFIX_LENGTH,
    ActiveWindow,
    ClientSpec,
    CohortSpec,
    LifecycleSpec,
    ResolvedPhase,
    WorkloadSpec,
)
from blis_sim.workload import tokens
from blis_sim.workload.arrivals import arrival_sampler
from blis_sim.workload.distributions import LengthSampler, length_sampler
from blis_sim.workload.plan import PhasePlan, PlannedRequest, SessionPlan, WorkloadPlan, compute_deadline

__all__ = ["generate_workload", "expand_cohorts", "group_prefix_lengths", "client_rates"]

_US_PER_HOUR = 3_600_000_000


def generate_workload(spec: WorkloadSpec, *, seed: int | None = None, num_requests: int | None = None,
                      horizon: int | None = None) -> WorkloadPlan:
    """Plan every phase of ``spec``. Deterministic for a seed. Raises ConfigError for what cannot be planned."""
    spec = spec.with_overrides(seed=seed, num_requests=num_requests, horizon=horizon)
    if spec.servegen_data is not None:
        raise ConfigError("servegen_data workloads are not supported; convert them to clients", field="servegen_data")
    if spec.inference_perf is not None:
        raise ConfigError("inference_perf workloads are not supported; write them as clients with prefix_group",
                          field="inference_perf")
    phases = spec.resolved_phases()
    expanded = [list(p.clients) + expand_cohorts(list(p.cohorts), spec.seed) for p in phases]
    lengths = group_prefix_lengths([c for cs in expanded for c in cs])
    return WorkloadPlan(seed=spec.seed, spec=spec,
                        phases=tuple(_plan_phase(spec.seed, p, cs, lengths, len(phases) > 1 or p.name != "")
                                     for p, cs in zip(phases, expanded)))


def group_prefix_lengths(clients: list[ClientSpec]) -> dict[str, int]:
    """Group -> prefix length: the first client naming the group decides (50 when it sets none)."""
    out: dict[str, int] = {}
    for c in clients:
        if c.prefix_group and c.prefix_group not in out:
            out[c.prefix_group] = c.prefix_length if c.prefix_length > 0 else DEFAULT_PREFIX_LENGTH
    return out


def expand_cohorts(cohorts: list[CohortSpec], seed: int) -> list[ClientSpec]:
    """The reference's ExpandCohorts: one client per member, windows from diurnal / spike / drain."""
    out: list[ClientSpec] = []
    for co in cohorts:
        for j in range(co.population):
            windows: list[ActiveWindow] = []
            if co.diurnal is not None:
                windows += _diurnal_windows(co.diurnal.peak_hour, co.diurnal.peak_to_trough_ratio)
            if co.spike is not None:
                tr = None if co.spike.trace_rate is None else co.spike.trace_rate / co.population
                windows.append(ActiveWindow(start_us=co.spike.start_time_us,
                                            end_us=co.spike.start_time_us + co.spike.duration_us, trace_rate=tr))
            if co.drain is not None:
                windows += _drain_windows(co.drain.start_time_us, co.drain.ramp_duration_us)
            group = f"{co.prefix_group}-{j}" if co.prefix_sharing == "per_member" and co.prefix_group \
                else co.prefix_group
            fields = co.model_dump(exclude={"id", "population", "prefix_sharing", "diurnal", "spike", "drain",
                                            "prefix_group", "rate_fraction"})
            out.append(ClientSpec.model_validate({
                **fields, "id": f"{co.id}-{j}", "prefix_group": group,
                "rate_fraction": co.rate_fraction / co.population,
                "lifecycle": LifecycleSpec(windows=windows).model_dump() if windows else None,
            }))
    return out


def _diurnal_windows(peak_hour: int, ratio: float) -> list[ActiveWindow]:
    out = []
    for h in range(24):
        mult = (1.0 + math.cos(2.0 * math.pi * (h - peak_hour) / 24)) / 2.0 * (1.0 - 1.0 / ratio) + 1.0 / ratio
        dur = min(_US_PER_HOUR, max(1, int(_US_PER_HOUR * mult)))
        out.append(ActiveWindow(start_us=h * _US_PER_HOUR, end_us=h * _US_PER_HOUR + dur))
    return out


def _drain_windows(start: int, ramp: int) -> list[ActiveWindow]:
    seg = max(1, ramp // 10)
    out = [ActiveWindow(start_us=0, end_us=start)] if start > 0 else []
    for i in range(10):
        s = start + i * seg
        out.append(ActiveWindow(start_us=s, end_us=s + max(1, int(seg * (10 - i) / 10))))
    return out


def client_rates(clients: list[ClientSpec], aggregate_rate: float) -> list[float]:
    """Requests per µs per client (0 for concurrency clients), lifecycle-aware like the reference."""
    def on(c: ClientSpec) -> bool:
        return c.lifecycle is None or not c.lifecycle.windows

    def overlap(a: ClientSpec, b: ClientSpec) -> bool:
        if on(a) or on(b):
            return True
        return any(wa.start_us < wb.end_us and wb.start_us < wa.end_us
                   for wa in a.lifecycle.windows for wb in b.lifecycle.windows)  # type: ignore[union-attr]

    rates = []
    for c in clients:
        if c.rate_fraction <= 0:
            rates.append(0.0)
            continue
        total = sum(o.rate_fraction for o in clients if o.rate_fraction > 0 and overlap(c, o))
        rates.append(aggregate_rate * c.rate_fraction / total / 1e6 if total > 0 else 0.0)
    return rates


# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Item:
    """One entry of the per-phase merge: a request, possibly starting a closed-loop session."""

    req: PlannedRequest
    session: SessionPlan | None = None
    later_rounds: tuple[PlannedRequest, ...] = ()  # open-loop multi-turn rounds after round 0


def _plan_phase(seed: int, ph: ResolvedPhase, clients: list[ClientSpec], lengths: dict[str, int],
                named: bool) -> PhasePlan:
    where = ".".join(str(p) for p in ph.path) or None
    time_varying = any(_has_overrides(c) for c in clients)
    if ph.num_requests <= 0 and ph.horizon <= 0:
        raise ConfigError("workload requires either num_requests, --num-requests, or --horizon to bound generation"
                          + (f" (phase {ph.name!r})" if ph.name else ""), field=where)
    tag = f"{ph.name}/" if named else ""
    rates = client_rates(clients, ph.aggregate_rate)
    budget = ph.num_requests if ph.num_requests > 0 else math.inf
    horizon = ph.horizon if ph.horizon > 0 else math.inf
    session_names = _Names(tag)

    heap: list[tuple[int, int, int, _Item]] = []
    stream_of: dict[int, Iterator[_Item]] = {}
    for ci, (c, rate) in enumerate(zip(clients, rates)):
        windowed = time_varying and c.lifecycle is not None and bool(c.lifecycle.windows)
        if c.concurrency > 0 or (rate <= 0 and not windowed):
            continue
        times = _window_arrivals(seed, ph, ci, c, clients, horizon) if windowed \
            else _steady_arrivals(seed, ph, ci, c, rate, horizon)
        stream_of[ci] = _client_stream(seed, ph, ci, c, times, horizon, lengths, session_names)
        _push_next(heap, stream_of[ci], ci, 0)

    kept: list[_Item] = []
    used = 0
    while heap and used < budget:
        arrival, ci, seq, item = heapq.heappop(heap)
        if ci >= 0:  # a client stream entry: refill from the same client
            _push_next(heap, stream_of[ci], ci, seq + 1)
        if item.session is not None and item.session.max_rounds is not None:
            left = budget - used
            rounds = int(min(item.session.max_rounds, left))
            item = _Item(item.req, replace(item.session, max_rounds=rounds))
            used += rounds
        else:
            used += 1
        kept.append(item)
        for k, r in enumerate(item.later_rounds):
            heapq.heappush(heap, (r.arrival_us, -1, _later_key(ci, seq, k), _Item(r)))

    sessions = {it.session.session_id: it.session for it in kept if it.session is not None}
    requests = [it.req for it in kept]

    # Closed-loop virtual users: seeds within what is left of the budget, then a shared follow-up budget.
    users = 0
    for c in clients:
        if c.concurrency <= 0:
            continue
        users += c.concurrency
        for u in range(c.concurrency):
            if len(requests) >= budget:
                break
            sid = session_names.unique(f"concurrency_{c.id}_user_{u}")
            arrival = u * c.think_time_us // c.concurrency if c.think_time_us > 0 and c.concurrency > 1 else 0
            sp = _session_plan(ph, c, sid, "closed_loop", None, c.think_time_us, False, lengths, horizon)
            rng = random.Random(tokens.key_hash(seed, "round", ph.index, sid, 0))
            requests.append(_round_request(sp, rng, arrival, 0, ()))
            sessions[sid] = sp
    follow_up_budget = int(budget - len(requests)) if budget != math.inf and users > 0 else -1

    requests.sort(key=lambda r: r.arrival_us)  # stable: ties keep client order
    for i, r in enumerate(requests):
        # Naming in place: these instances are not published yet, and a second construction per request
        # (dataclasses.replace) doubled generation time.
        object.__setattr__(r, "uid", f"{ph.index}.{i}")
    return PhasePlan(index=ph.index, name=ph.name, seed=seed, gap_us=ph.gap_us,
                     horizon_us=0 if horizon == math.inf else int(horizon),
                     num_requests=ph.num_requests, requests=tuple(requests), sessions=sessions,
                     follow_up_budget=max(follow_up_budget, -1))


def _later_key(ci: int, seq: int, k: int) -> int:
    # Pre-scheduled rounds (entry ci = -1) sort before stream entries at the same µs, in generation order.
    return (ci << 40) + (seq << 8) + k


def _push_next(heap: list[tuple[int, int, int, _Item]], stream: Iterator[_Item], ci: int, seq: int) -> None:
    item = next(stream, None)
    if item is not None:
        heapq.heappush(heap, (item.req.arrival_us, ci, seq, item))


class _Names:
    """Session ids, unique within a phase and across phases (prefixed with the phase name)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.seen: set[str] = set()
        self.counters: dict[str, int] = {}

    def next_session(self, client_id: str) -> str:
        n = self.counters.get(client_id, 0)
        self.counters[client_id] = n + 1
        return self.unique(f"{client_id}/s{n}")

    def unique(self, name: str) -> str:
        sid, k = self.tag + name, 1
        while sid in self.seen:
            sid, k = f"{self.tag}{name}~{k}", k + 1
        self.seen.add(sid)
        return sid


def _session_plan(ph: ResolvedPhase, c: ClientSpec, sid: str, kind: str, max_rounds: int | None, think: int,
                  accumulate: bool, lengths: dict[str, int], horizon: float) -> SessionPlan:
    rr = c.reasoning.reason_ratio_distribution if c.reasoning and c.reasoning.reason_ratio_distribution.type \
        else None
    return SessionPlan(
        session_id=sid, kind=kind, client_id=c.id, phase=ph.name, phase_index=ph.index,  # type: ignore[arg-type]
        max_rounds=max_rounds, think_time_us=think, accumulate=accumulate,
        input_distribution=c.input_distribution, output_distribution=c.output_distribution,
        reason_ratio_distribution=rr, prefix_group=c.prefix_group,
        prefix_length=lengths.get(c.prefix_group, 0) if c.prefix_group else 0, streaming=c.streaming,
        tenant_id=c.tenant_id, slo_class=c.slo_class, model=c.model, adapter=c.adapter, timeout=c.timeout,
        slo_target_us=c.slo_target_us or 0, horizon_us=0 if horizon == math.inf else int(horizon))


def _round_request(sp: SessionPlan, rng: random.Random, arrival: int, rnd: int,
                   history: tuple[tuple[int, int], ...]) -> PlannedRequest:
    """A session round (new input sampled from ``rng``); ``history`` holds earlier (new input, output) pairs."""
    new_in = length_sampler(sp.input_distribution).sample(rng)
    out = length_sampler(sp.output_distribution).sample(rng)
    ratio = 0.0
    if sp.reason_ratio_distribution is not None:
        ratio = min(100, length_sampler(sp.reason_ratio_distribution, floor=0).sample(rng)) / 100.0
    total = sp.prefix_length + sum(n + o for n, o in history) + new_in
    return PlannedRequest(
        uid="", phase=sp.phase, phase_index=sp.phase_index, client_id=sp.client_id, arrival_us=arrival,
        input_tokens=total, output_tokens=out, kind="open" if sp.kind == "open" else sp.kind,
        prefix_group=sp.prefix_group, prefix_length=sp.prefix_length, new_input_tokens=new_in,
        session_id=sp.session_id, round_index=rnd, accumulate=sp.accumulate, history=history,
        streaming=sp.streaming, tenant_id=sp.tenant_id, slo_class=sp.slo_class, model=sp.model,
        adapter=sp.adapter, deadline_us=compute_deadline(arrival, sp.timeout, True),
        slo_target_us=sp.slo_target_us, think_time_us=sp.think_time_us if rnd > 0 else 0, reason_ratio=ratio)


def _has_overrides(c: ClientSpec) -> bool:
    return any(w.trace_rate is not None or w.arrival is not None or w.input_distribution is not None
               or w.output_distribution is not None for w in (c.lifecycle.windows if c.lifecycle else []))


def _steady_arrivals(seed: int, ph: ResolvedPhase, ci: int, c: ClientSpec, rate: float,
                     horizon: float) -> Iterator[tuple[int, ClientSpec]]:
    """Arrivals of a client at a fixed rate, gated by its lifecycle windows, until the horizon."""
    rng = random.Random(tokens.key_hash(seed, "arrival", ph.index, ci, c.id))
    iat = arrival_sampler(c.arrival, rate)
    windows = c.lifecycle.windows if c.lifecycle and c.lifecycle.windows else None
    last_end = max(w.end_us for w in windows) if windows else 0
    single = c.multi_turn is not None and c.multi_turn.single_session
    t = 0
    while True:
        t += iat.sample(rng)
        if single and windows:
            t = windows[0].start_us + t  # the reference offsets a single session into the first window
        if t >= horizon:
            return
        if windows is not None and not any(w.start_us <= t < w.end_us for w in windows):
            if t >= last_end or single:
                return
            continue
        yield t, c


def _window_arrivals(seed: int, ph: ResolvedPhase, ci: int, c: ClientSpec, clients: list[ClientSpec],
                     horizon: float) -> Iterator[tuple[int, ClientSpec]]:
    """The reference's time-varying path: per window, ceil(rate × duration) inter-arrival times rescaled to the
    window's duration, with the window's arrival / length overrides and its proportional (or absolute) rate."""
    rng = random.Random(tokens.key_hash(seed, "arrival", ph.index, ci, c.id))
    events: list[tuple[int, ClientSpec]] = []
    for w in c.lifecycle.windows if c.lifecycle else []:
        if w.start_us >= horizon:
            continue
        end = int(min(w.end_us, horizon))
        cw = c.model_copy(update={k: v for k, v in (("arrival", w.arrival), ("input_distribution",
                                  w.input_distribution), ("output_distribution", w.output_distribution))
                                  if v is not None})
        rate = _window_rate(c, w, end, clients, ph.aggregate_rate)
        n = math.ceil(rate * (end - w.start_us) / 1e6)
        if rate <= 0 or n <= 0:
            continue
        sampler = arrival_sampler(cw.arrival, rate / 1e6)
        iats = [sampler.sample(rng) for _ in range(n)]
        scale = (end - w.start_us) / sum(iats)
        scaled = [int(x * scale) for x in iats]
        scaled[-1] += (end - w.start_us) - sum(scaled)
        t = w.start_us
        for x in scaled:
            t += x
            if t >= end:
                break
            events.append((t, cw))
    events.sort(key=lambda e: e[0])
    yield from events


def _window_rate(c: ClientSpec, w: ActiveWindow, end: int, clients: list[ClientSpec], aggregate: float) -> float:
    """Requests per second in a window: absolute ``trace_rate`` when aggregate_rate is 0, else the aggregate
    split by trace_rate (or rate_fraction) over the clients active during the window."""
    own = w.trace_rate if w.trace_rate is not None else c.rate_fraction
    if aggregate == 0:
        return own if w.trace_rate is not None else 0.0
    total = 0.0
    for o in clients:
        if o.lifecycle is None or not o.lifecycle.windows:
            total += o.rate_fraction
            continue
        for ow in o.lifecycle.windows:
            if ow.start_us < end and w.start_us < ow.end_us:
                total += ow.trace_rate if ow.trace_rate is not None else o.rate_fraction
                break
    return aggregate * own / total if total > 0 else 0.0


def _client_stream(seed: int, ph: ResolvedPhase, ci: int, client: ClientSpec,
                   times: Iterator[tuple[int, ClientSpec]], horizon: float, lengths: dict[str, int],
                   names: _Names) -> Iterator[_Item]:
    """The client's requests (or session starts) in arrival order."""
    len_rng = random.Random(tokens.key_hash(seed, "content", ph.index, ci, client.id))
    prefix_len = lengths.get(client.prefix_group, 0) if client.prefix_group else 0
    samplers: dict[int, tuple[LengthSampler, LengthSampler]] = {}
    for t, c in times:
        mt = c.multi_turn
        if mt is None:
            key = id(c)
            if key not in samplers:
                samplers[key] = (length_sampler(c.input_distribution), length_sampler(c.output_distribution))
            yield _Item(_open_request(ph, c, t, *samplers[key], len_rng, prefix_len))
            continue
        sid = names.next_session(c.id)
        accumulate = mt.context_growth == "accumulate"
        if c.is_closed_loop:
            sp = _session_plan(ph, c, sid, "session", mt.max_rounds, mt.think_time_us, accumulate, lengths,
                               horizon)
            rng = random.Random(tokens.key_hash(seed, "round", ph.index, sid, 0))
            yield _Item(_round_request(sp, rng, t, 0, ()), session=sp)
        else:
            windows = c.lifecycle.windows if c.lifecycle and c.lifecycle.windows else None
            yield _open_session(seed, ph, c, sid, t, mt.max_rounds, mt.think_time_us, accumulate, lengths,
                                horizon, windows)
        if mt.single_session:
            return


def _open_session(seed: int, ph: ResolvedPhase, c: ClientSpec, sid: str, start: int, max_rounds: int,
                  think: int, accumulate: bool, lengths: dict[str, int], horizon: float,
                  windows: list[ActiveWindow] | None) -> _Item:
    """An open-loop multi-turn session: every round pre-scheduled (think time + 1 µs per output token)."""
    sp = _session_plan(ph, c, sid, "open", max_rounds, think, accumulate, lengths, horizon)
    rounds: list[PlannedRequest] = []
    history: tuple[tuple[int, int], ...] = ()
    t = start
    for r in range(max_rounds):
        if t >= horizon:
            break
        rng = random.Random(tokens.key_hash(seed, "round", ph.index, sid, r))
        req = _round_request(sp, rng, t, r, history if accumulate else ())
        if windows is None or any(w.start_us <= t < w.end_us for w in windows):
            rounds.append(req)
        if accumulate:
            history = history + ((req.new_input_tokens, req.output_tokens),)
        t += think + req.output_tokens
    # Round 0 is never empty: the stream only starts sessions inside the horizon and the client's windows.
    return _Item(rounds[0], later_rounds=tuple(rounds[1:]))


def _open_request(ph: ResolvedPhase, c: ClientSpec, t: int, in_s: LengthSampler, out_s: LengthSampler,
                  rng: random.Random, prefix_len: int) -> PlannedRequest:
    text = image = audio = video = 0
    if c.multimodal is not None:
        mm = c.multimodal
        if mm.text_distribution.type:
            text = length_sampler(mm.text_distribution).sample(rng)
        for kind, tok, cnt in (("image", mm.image_distribution, mm.image_count_distribution),
                               ("audio", mm.audio_distribution, mm.audio_count_distribution),
                               ("video", mm.video_distribution, mm.video_count_distribution)):
            if tok.type and cnt.type:
                ts = length_sampler(tok)
                n = sum(ts.sample(rng) for _ in range(length_sampler(cnt).sample(rng)))
                if kind == "image":
                    image = n
                elif kind == "audio":
                    audio = n
                else:
                    video = n
        suffix = max(1, text + image + audio + video)
    else:
        suffix = in_s.sample(rng)
    out = out_s.sample(rng)
    return PlannedRequest(
        uid="", phase=ph.name, phase_index=ph.index, client_id=c.id, arrival_us=t, input_tokens=prefix_len + suffix,
        output_tokens=out, prefix_group=c.prefix_group, prefix_length=prefix_len, new_input_tokens=suffix,
        streaming=c.streaming, tenant_id=c.tenant_id, slo_class=c.slo_class, model=c.model, adapter=c.adapter,
        deadline_us=compute_deadline(t, c.timeout, c.is_closed_loop), slo_target_us=c.slo_target_us or 0,
        text_tokens=text, image_tokens=image, audio_tokens=audio, video_tokens=video)
