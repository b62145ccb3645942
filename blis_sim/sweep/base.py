"""What a sweep varies around, and one point of it.

* :class:`SweepBase` — the base: a trace (observed or generated) or a workload spec, with the
  simulator settings of ``blis replay`` / ``blis run`` (:class:`~blis_sim.engine.EngineOptions`,
  its offload config resolved). Built in the driver.
* :class:`Payload` — what the workers need of the base, sent to each worker once: the trace (a
  spec base sends nothing heavy: each point carries its own spec).
* :class:`Task` — one point, fully resolved in the driver (so a bad value is reported against the
  sweep file before anything runs): its engine options (offload config included), its workload
  spec (spec base), its rate scale (trace base), and ``key``, the digest of all of it (resume).
* :func:`evaluate` — a task on a payload, in a worker: the replay or run, and its table row.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from blis_sim import __version__
from blis_sim.engine.cluster import replay_cluster, run_cluster
from blis_sim.engine.coefficients import load_coefficients
from blis_sim.engine.replay_trace import replay_outcome
from blis_sim.engine.run_spec import run_outcome
from blis_sim.errors import ConfigError, FormatError, UsageError
from blis_sim.formats import PytestBlisHeader, Trace
from blis_sim.formats.workload import workload_spec_from_data
from blis_sim.routing import RoutingSpec
from blis_sim.sweep.axes import SettingError, apply_settings, set_path
from blis_sim.sweep.rows import row_of

if TYPE_CHECKING:
    from blis_sim.engine.latency import StepModel
    from blis_sim.engine.outputs import SimulatedOutputs
    from blis_sim.engine.simulate import EngineOptions
    from blis_sim.formats import Trace
    from blis_sim.formats.offload import OffloadConfig
    from blis_sim.formats.workload import WorkloadSpec
    from blis_sim.sweep.spec import SweepSpec


@dataclass(frozen=True)
class Payload:
    kind: str                          # "trace" | "spec"
    trace: Trace | None = None         # trace base
    workload_seed: int | None = None   # spec base: `blis run --workload-seed`
    num_requests: int | None = None    # spec base: `blis run --num-requests`


@dataclass(frozen=True)
class Task:
    index: int
    values: Mapping[str, Any]          # {axis: value as written in the sweep file}
    options: EngineOptions             # resolved, kv_offload included
    spec: WorkloadSpec | None = None   # spec base
    num_requests: int | None = None
    rate_scale: float = 1.0
    key: str = ""
    num_instances: int | None = None   # cluster axes (docs/cluster.md §4); None: one server
    routing: RoutingSpec | None = None


@dataclass
class SweepBase:
    payload: Payload
    options: EngineOptions             # the base's
    fingerprint: str                   # digest of the base inputs (files' bytes)
    spec_data: Any = None              # the spec as parsed (spec base): workload.* axes edit it
    spec: WorkloadSpec | None = None
    device_classes: Mapping[str, Any] | None = None
    label: str = ""
    _latency_cache: dict[str, StepModel] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.payload.kind

    def task(self, index: int, point: Mapping[str, Any], sweep: SweepSpec, *,
             raw: Mapping[str, Any] | None = None) -> Task:
        """Point ``index`` (``{axis: value}``, values as read) resolved against the base; a value
        that cannot apply is a FormatError at its line of the sweep file."""
        workload: list[tuple[str, Any]] = []
        rate, num_requests = 1.0, self.payload.num_requests
        kinds = {a.name: a.kind for a in sweep.axes}
        positions = {a.name: {repr(v): i for i, v in enumerate(a.values)} for a in sweep.axes}

        def fail(name: str, reason: str) -> FormatError:
            shown = ", ".join(f"{k}={v}" for k, v in (raw or point).items())
            return sweep.fail(f"point {index} ({shown}): {reason}", name,
                              positions[name].get(repr(point[name]), 0))

        cluster: dict[str, Any] = {}
        for name, value in point.items():
            target = kinds[name].target
            if target == "rate":
                rate = float(value)
            elif target == "num_requests":
                num_requests = int(value)
            elif target == "workload":
                workload.append((name, value))
            elif target == "cluster":
                cluster[name] = value
        num_instances, routing = self._cluster(cluster, fail)
        try:
            options = apply_settings(self.options, point, kinds, device_classes=self.device_classes,
                                     load_latency=lambda path: self._latency(path, sweep))
        except SettingError as exc:
            raise fail(exc.axis, str(exc)) from None
        spec = self.spec
        if workload:
            spec = self._spec_with(workload, fail)
        task = Task(index=index, values=dict(raw or point), options=options, spec=spec,
                    num_requests=num_requests, rate_scale=rate, num_instances=num_instances, routing=routing)
        return replace(task, key=task_key(self.fingerprint, task))

    def _cluster(self, values: Mapping[str, Any],
                 fail: Callable[[str, str], FormatError]) -> tuple[int | None, RoutingSpec | None]:
        """A point's replicas and routing from its cluster axes, with the defaults of `blis replay`
        (the trace's recorded routing) and `blis run` (round-robin)."""
        if not values:
            return None, None
        n = values.get("num_instances")
        policy = values.get("routing_policy", "recorded" if self.kind == "trace" else "round-robin")
        name = "routing_policy" if "routing_policy" in values else next(iter(values))
        try:
            routing = RoutingSpec.parse(policy, values.get("routing_scorers"), flag="routing_scorers")
        except UsageError as exc:
            raise fail(name, str(exc)) from None
        if routing.policy == "recorded" and self.kind != "trace":
            raise fail(name, "routing_policy 'recorded' needs a trace base (a spec has no recorded replicas)")
        return n, routing

    def _latency(self, path: str, sweep: SweepSpec) -> StepModel:
        p = sweep.base_dir / path
        if str(p) not in self._latency_cache:
            self._latency_cache[str(p)] = load_coefficients(p).to_step_model()
        return self._latency_cache[str(p)]

    def _spec_with(self, changes: Sequence[tuple[str, Any]],
                   fail: Callable[[str, str], FormatError]) -> WorkloadSpec:
        data = self.spec_data
        for name, value in changes:
            try:
                data = set_path(data, name[len("workload."):], value)
            except ValueError as exc:
                raise fail(name, str(exc)) from None
        try:
            return workload_spec_from_data(data, source="workload spec")
        except (FormatError, ConfigError) as exc:
            raise fail(changes[0][0], exc.reason + (f" (field '{exc.location.field}')"
                                                    if exc.location.field else "")) from None


def task_key(fingerprint: str, task: Task) -> str:
    """A digest of everything the point's result depends on: the base, the tool version and the
    point's resolved inputs (reprs of frozen dataclasses and pydantic models are deterministic)."""
    h = hashlib.sha256()
    parts = [fingerprint, __version__, repr(task.options), repr(task.spec), repr(task.num_requests),
             repr(task.rate_scale)]
    if task.num_instances is not None or task.routing is not None:  # one-server keys stay as they were
        parts += [repr(task.num_instances), repr(task.routing)]
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


# -------------------------------------------------------------------------------------- workers


def scaled_trace(trace: Trace, scale: float) -> Trace:
    """``trace`` with its arrivals compressed by ``scale`` (2: twice the request rate): send and
    arrival times from the first send, rounded to whole µs."""
    if scale == 1.0:
        return trace

    sends = [r.send_time_us or r.arrival_time_us for r in trace.records]
    origin = min(sends) if sends else 0
    records = []
    for r in trace.records:
        upd = {}
        for name in ("arrival_time_us", "send_time_us"):
            t = getattr(r, name)
            if t > 0:
                upd[name] = origin + int(round((t - origin) / scale))
        records.append(r.model_copy(update=upd) if upd else r)
    return Trace.model_construct(header=trace.header, records=records)


def with_offload(trace: Trace, cfg: OffloadConfig | None) -> Trace:
    """``trace`` whose header records ``cfg`` as its deployment's offload config (a what-if: the
    replay rules make the header's config authoritative)."""
    header = trace.header
    if cfg is None:
        return trace
    ext = header.pytest_blis or PytestBlisHeader()
    header = header.model_copy(update={
        "kv_offload": cfg.to_header(), "pytest_blis": ext.model_copy(update={"offload": cfg.extensions()})})
    return Trace.model_construct(header=header, records=trace.records)


def evaluate(payload: Payload, task: Task) -> dict[str, Any]:
    """One point: replay the trace (or run the spec) with the task's settings; its table row."""
    out: SimulatedOutputs
    cluster = task.num_instances is not None or task.routing is not None
    if payload.kind == "trace":
        trace = payload.trace
        assert trace is not None  # a trace base's payload carries its trace
        if task.options.kv_offload is not None:
            trace = with_offload(trace, task.options.kv_offload)
        trace = scaled_trace(trace, task.rate_scale)
        out = (replay_cluster(trace, task.options, num_instances=task.num_instances, routing=task.routing)
               if cluster else replay_outcome(trace, task.options))
    else:
        assert task.spec is not None  # a spec base's every task carries its spec
        if cluster:
            out = run_cluster(task.spec, task.options, num_instances=task.num_instances or 1,
                              routing=task.routing or RoutingSpec(), seed=payload.workload_seed,
                              num_requests=task.num_requests)
        else:
            out = run_outcome(task.spec, task.options, seed=payload.workload_seed,
                              num_requests=task.num_requests)
    return row_of(out, task)
