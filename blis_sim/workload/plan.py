"""What generation produces and what the two drivers (observe dispatcher, DES engine) consume.

* :class:`PlannedRequest`: one request, immutable, with everything a trace CSV row needs before the server
  answers (ids, phase, scheduled arrival, prefix group/length, input/output lengths, session/round, streaming,
  tenant/SLO/model, deadline) plus what is needed to rebuild its token ids (:meth:`PlannedRequest.input_token_ids`).
* :class:`SessionPlan`: a closed-loop multi-turn session or a closed-loop (``concurrency``) virtual user, whose
  next request is released only when the previous one completes, after the think time.
* :class:`PhasePlan`: one phase: its initial schedule (open-loop requests, session round 0s, virtual-user seeds,
  sorted by arrival) and its sessions. Times are µs relative to the phase start; a phase starts when the previous
  one has drained (+ ``gap_us``).
* :class:`PhaseRun`: the mutable state of one execution of a phase (``phase.start()``); drivers call
  :meth:`PhaseRun.on_complete` for every finished request and schedule what it returns.
* :class:`WorkloadPlan`: the phases in order, plus the seed.

Driver loop (either clock)::

    t0 = 0
    for phase in plan.phases:
        t0 += phase.gap_us
        run = phase.start()
        for req in run.initial: schedule(t0 + req.arrival_us, req)
        on each completion of req at absolute time t:
            nxt = run.on_complete(req, ok=status == "ok", output_tokens=n, completed_at_us=t - t0)
            if nxt: schedule(t0 + nxt.arrival_us, nxt)      # on a tie, a follow-up goes before a planned one
        when nothing is scheduled or in flight: t0 = drain time; next phase

The trace's ``arrival_time_us`` is ``t0 + req.arrival_us`` (relative to the first phase's start) and its
``deadline_us`` is ``t0 + req.deadline_us`` when that is non-zero; the trace's ``request_id`` is assigned by the
driver (observe: dispatch order); ``uid`` is a stable name for cross-checks. ``plan.session_context_growth`` is the
header's ``session_context_growth``. Pass the server's completion token count as ``output_tokens``: an
accumulating session's next round carries exactly that many output tokens.
"""
from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from blis_sim.formats.workload import DEFAULT_SESSION_TIMEOUT_US, DistSpec, WorkloadSpec
from blis_sim.workload import tokens
from blis_sim.workload.distributions import length_sampler

__all__ = ["PlannedRequest", "SessionPlan", "PhasePlan", "PhaseRun", "WorkloadPlan", "compute_deadline"]

Kind = Literal["open", "session", "closed_loop"]


def compute_deadline(arrival_us: int, timeout: int | None, session_client: bool) -> int:
    """The reference's computeDeadline: None -> 300 s for session clients else none; 0 -> none."""
    if timeout is None:
        return arrival_us + DEFAULT_SESSION_TIMEOUT_US if session_client else 0
    return 0 if timeout == 0 else arrival_us + timeout


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    uid: str                     # stable: "<phase index>.<n>" (initial schedule) or "<phase>.<session>#<round>"
    phase: str                   # phase name ("" for a spec without phases)
    phase_index: int
    client_id: str
    arrival_us: int              # scheduled arrival, µs relative to the phase start
    input_tokens: int            # total prompt tokens asked for, prefix included
    output_tokens: int           # exact output length asked for (max_tokens = min_tokens)
    kind: Kind = "open"          # open-loop / closed-loop session round / closed-loop virtual-user request
    prefix_group: str = ""
    prefix_length: int = 0       # tokens of the group prefix at the start of the input
    new_input_tokens: int = 0    # tokens this request adds (a session round's new text; else the suffix)
    session_id: str = ""
    round_index: int = 0
    accumulate: bool = False     # a session round that carries the previous rounds (context_growth: accumulate)
    history: tuple[tuple[int, int], ...] = ()  # accumulated sessions: (new input, output) of earlier rounds
    streaming: bool = False
    tenant_id: str = ""
    slo_class: str = ""
    model: str = ""
    adapter: str = ""
    deadline_us: int = 0         # phase-relative; 0 = none
    slo_target_us: int = 0
    think_time_us: int = 0       # think time that preceded this round (0 for round 0 / open-loop)
    reason_ratio: float = 0.0
    text_tokens: int = 0
    image_tokens: int = 0
    audio_tokens: int = 0
    video_tokens: int = 0

    def replace(self, **changes: object) -> PlannedRequest:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return replace(self, **changes)  # type: ignore[arg-type]

    _replace = replace  # NamedTuple spelling, kept because callers adopted it

    @property
    def suffix_tokens(self) -> int:
        """Input tokens after the group prefix."""
        return self.input_tokens - self.prefix_length

    @property
    def csv_prefix_length(self) -> int:
        """The trace CSV ``prefix_length`` (0 when the input is shorter than the prefix: the reference rule)."""
        return self.prefix_length if self.suffix_tokens >= 0 else 0

    @property
    def csv_input_tokens(self) -> int:
        """The trace CSV ``input_tokens``: the suffix only (the total when it would be negative)."""
        return self.suffix_tokens if self.suffix_tokens >= 0 else self.input_tokens

    def input_token_ids(self, seed: int, vocab: int = tokens.VOCAB_SIZE) -> np.ndarray:
        """This request's prompt token ids, shared with its group / session exactly as on the wire."""
        if self.session_id and not self.accumulate:  # a closed-loop user: new content each round
            return tokens.session_round_input(
                seed, session_id=self.session_id, round_index=self.round_index,
                new_input_length=self.new_input_tokens, prefix_group=self.prefix_group,
                prefix_length=self.prefix_length, vocab=vocab)
        if self.session_id:
            news = [n for n, _ in self.history] + [self.new_input_tokens]
            outs = [o for _, o in self.history]
            return tokens.session_round_inputs(
                seed, session_id=self.session_id, new_input_lengths=news, output_lengths=outs,
                prefix_group=self.prefix_group, prefix_length=self.prefix_length,
                accumulate=self.accumulate, vocab=vocab)[-1]
        return tokens.request_input(seed, prefix_group=self.prefix_group, prefix_length=self.prefix_length,
                                    suffix_length=self.suffix_tokens, request_key=self.uid, vocab=vocab)

    def output_token_ids(self, seed: int, vocab: int = tokens.VOCAB_SIZE) -> np.ndarray:
        """Synthetic output ids (what an accumulating session's next round embeds)."""
        if self.session_id:
            return tokens.session_output_tokens(seed, self.session_id, self.round_index, self.output_tokens, vocab)
        return tokens.token_ids(seed, "output", self.uid, length=self.output_tokens, vocab=vocab)


@dataclass(frozen=True)
class SessionPlan:
    """A closed-loop session (``kind="session"``) or virtual user (``kind="closed_loop"``)."""

    session_id: str
    kind: Kind
    client_id: str
    phase: str
    phase_index: int
    max_rounds: int | None       # None = unlimited (virtual users: until horizon / budget)
    think_time_us: int
    accumulate: bool
    input_distribution: DistSpec
    output_distribution: DistSpec
    reason_ratio_distribution: DistSpec | None
    prefix_group: str
    prefix_length: int
    streaming: bool
    tenant_id: str
    slo_class: str
    model: str
    adapter: str
    timeout: int | None
    slo_target_us: int
    horizon_us: int              # 0 = none; a follow-up scheduled after it ends the session


@dataclass(frozen=True)
class PhasePlan:
    index: int
    name: str
    seed: int
    gap_us: int                  # idle time between the previous phase draining and this phase starting
    horizon_us: int              # 0 = none
    num_requests: int            # 0 = unlimited
    requests: tuple[PlannedRequest, ...]
    sessions: Mapping[str, SessionPlan] = field(default_factory=dict)
    follow_up_budget: int = -1   # virtual users' follow-ups allowed in total; -1 = unlimited

    def start(self) -> PhaseRun:
        return PhaseRun(self)


@dataclass(frozen=True)
class WorkloadPlan:
    seed: int
    phases: tuple[PhasePlan, ...]
    spec: WorkloadSpec

    @property
    def has_closed_loop(self) -> bool:
        return any(p.sessions for p in self.phases)

    def all_initial(self) -> list[PlannedRequest]:
        return [r for p in self.phases for r in p.requests]

    @property
    def session_context_growth(self) -> Literal["", "accumulate"]:
        """``"accumulate"`` when some session carries its context forward, else ``""``: the value of the trace
        header's ``session_context_growth`` (the reference's key, which its replay reads)."""
        acc = any(s.accumulate for p in self.phases for s in p.sessions.values()) or \
            any(r.accumulate for r in self.all_initial())
        return "accumulate" if acc else ""


class _SessionState:
    """Per-session follow-up state: its own random stream (rounds are sequential, so draws happen in round
    order whatever the completion order across sessions), its samplers, and the round now in flight."""

    __slots__ = ("rng", "input", "output", "ratio", "round")

    def __init__(self, seed: int, phase_index: int, sess: SessionPlan) -> None:
        self.rng = random.Random(tokens.key_hash(seed, "follow-ups", phase_index, sess.session_id))
        self.input = length_sampler(sess.input_distribution)
        self.output = length_sampler(sess.output_distribution)
        self.ratio = None if sess.reason_ratio_distribution is None \
            else length_sampler(sess.reason_ratio_distribution, floor=0)
        self.round = 0


class PhaseRun:
    """The follow-up state of one execution of a phase. Deterministic: a follow-up depends only on the seed,
    the session id, the round and the completed request's reported output length, never on completion order
    (or on the completion times, except for the horizon cut)."""

    def __init__(self, plan: PhasePlan) -> None:
        self.plan = plan
        self.initial: tuple[PlannedRequest, ...] = plan.requests
        self._done: set[str] = set()
        self._state: dict[str, _SessionState] = {}
        self._budget = plan.follow_up_budget
        self.released = 0  # follow-ups released so far

    def on_complete(self, req: PlannedRequest, *, ok: bool, output_tokens: int | None = None,
                    completed_at_us: int) -> PlannedRequest | None:
        """The next request of ``req``'s session, or None. A failed or timed-out request ends its session;
        a second completion of the same request (or of an older round) releases nothing."""
        sess = self.plan.sessions.get(req.session_id) if req.session_id else None
        if sess is None or req.session_id in self._done:
            return None
        st = self._state.get(req.session_id)
        if st is None:
            st = self._state[req.session_id] = _SessionState(self.plan.seed, self.plan.index, sess)
        if req.round_index != st.round:
            return None
        if not ok:
            self._done.add(req.session_id)
            return None
        nxt_round = req.round_index + 1
        if sess.max_rounds is not None and nxt_round >= sess.max_rounds:
            self._done.add(req.session_id)
            return None
        if sess.kind == "closed_loop" and self._budget >= 0 and self.released >= self._budget:
            self._done.add(req.session_id)
            return None
        arrival = completed_at_us + sess.think_time_us
        if sess.horizon_us > 0 and arrival > sess.horizon_us:
            self._done.add(req.session_id)
            return None
        new_in = st.input.sample(st.rng)
        out = st.output.sample(st.rng)
        ratio = 0.0 if st.ratio is None else min(100, st.ratio.sample(st.rng)) / 100.0
        produced = req.output_tokens if output_tokens is None else max(0, output_tokens)
        if sess.accumulate:
            history = req.history + ((req.new_input_tokens, produced),)
            total = req.input_tokens + produced + new_in
        else:
            history = ()
            total = sess.prefix_length + new_in
        self.released += 1
        st.round = nxt_round
        return replace(
            req, uid=f"{self.plan.index}.{sess.session_id}#{nxt_round}", arrival_us=arrival, input_tokens=total,
            output_tokens=out, new_input_tokens=new_in, round_index=nxt_round, history=history,
            deadline_us=compute_deadline(arrival, sess.timeout, True), think_time_us=sess.think_time_us,
            reason_ratio=ratio)
