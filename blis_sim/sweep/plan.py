"""`blis plan`: capacity questions answered by search over one monotone axis.

A :class:`PlanQuestion` is "the smallest (or largest) value of AXIS in [LOW, HIGH] at which
METRIC OP THRESHOLD holds": the smallest CPU tier (``kv_offload.cpu_bytes_to_use``) or fs tier
(``kv_offload.secondary_tiers.0.max_bytes``) with ``hit_rate.external >= 0.9``; the fewest GPU
blocks (``total_kv_blocks``) with ``hit_rate.prefix_cache >= 0.5``; the highest rate
(``workload.aggregate_rate``, or a trace's ``rate_scale``) with ``ttft_p99_ms <= 500``.

The search is a k-section (bisection with k probes per round, k = the workers available): both
ends first; then the bracket between the last value that fails and the first that meets the
target (for ``largest``: the last that meets and the first that fails) is cut into k + 1 parts
each round, until it is narrower than the resolution. The answer assumes the condition switches
once along the axis; :func:`monotonicity` checks that on every evaluated point (and whether the
metric itself moves one way), and the answer says when it does not hold. Every evaluated point is
a sweep point: it lands in the same store (``points.jsonl``, reused by later searches and sweeps)
and in ``plan.csv`` with every column of a sweep table; ``plan.json`` holds the answer and its
curve, ``plan-curve.png`` plots it.
"""
from __future__ import annotations

import itertools
import json
import math
import operator
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from blis_sim.errors import FormatError, UsageError
from blis_sim.formats._io import atomic_write
from blis_sim.formats._strict import YamlDoc
from blis_sim.sweep.axes import AxisKind, axis_kind, parse_size, positive_float
from blis_sim.sweep.base import SweepBase
from blis_sim.sweep.plots import curve_plot, have_matplotlib
from blis_sim.sweep.rows import columns
from blis_sim.sweep.runner import Backend, ray_connect, run_tasks
from blis_sim.sweep.spec import Axis, SweepSpec
from blis_sim.sweep.store import PointStore, write_table

_TARGET_RE = re.compile(r"^\s*([A-Za-z_][\w.:\-]*)\s*(>=|<=|>|<)\s*([-+]?[0-9.]+(?:[eE][-+]?\d+)?)\s*$")
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


@dataclass(frozen=True)
class PlanQuestion:
    axis: AxisKind
    low: float
    high: float
    metric: str
    op: str
    threshold: float
    find: str                          # "smallest" | "largest"
    resolution: float
    fixed: tuple[tuple[AxisKind, Any, Any], ...] = ()   # (kind, value as read, as written)

    def meets(self, value: float) -> bool:
        return _OPS[self.op](value, self.threshold)

    def describe(self) -> str:
        held = "".join(f", {k.name}={raw}" for k, _, raw in self.fixed)
        return f"{self.find} {self.axis.name} in [{_show(self.axis, self.low)}, " \
               f"{_show(self.axis, self.high)}] with {self.metric} {self.op} {self.threshold:g}{held}"

    @classmethod
    def from_flags(cls, *, axis: str, low: str, high: str, target: str, find: str,
                   resolution: str | None, fixed: Sequence[str], base_kind: str) -> PlanQuestion:
        kind = _kind(axis, base_kind, "--axis")
        if not kind.numeric:
            raise UsageError(f"--axis {axis} is not numeric; a search needs a numeric axis")
        lo, hi = _number(kind, low, "--range LOW"), _number(kind, high, "--range HIGH")
        if not lo < hi:
            raise UsageError(f"--range: LOW ({low}) must be below HIGH ({high})")
        m = _TARGET_RE.match(target)
        if m is None:
            raise UsageError(f"--target {target!r}: expected METRIC OP NUMBER, e.g. "
                             "'hit_rate.external>=0.9' or 'ttft_p99_ms<=500'")
        res = _resolution(kind, resolution) if resolution is not None else (hi - lo) / 100
        if kind.integer:
            res = max(1, math.ceil(res))
        if not res > 0:
            raise UsageError(f"--resolution must be > 0, got {resolution}")
        held = []
        for item in fixed:
            name, sep, text = item.partition("=")
            if not sep:
                raise UsageError(f"--set {item!r}: expected AXIS=VALUE")
            k = _kind(name.strip(), base_kind, "--set")
            if k.name == kind.name:
                raise UsageError(f"--set {k.name}: that is the searched axis")
            raw = yaml.safe_load(text)
            try:
                held.append((k, k.read(raw), raw))
            except ValueError as exc:
                raise UsageError(f"--set {item}: {exc}") from None
        return cls(axis=kind, low=lo, high=hi, metric=m.group(1), op=m.group(2),
                   threshold=float(m.group(3)), find=find, resolution=res, fixed=tuple(held))


def _kind(name: str, base_kind: str, flag: str) -> AxisKind:
    try:
        return axis_kind(name, base_kind=base_kind)
    except ValueError as exc:
        raise UsageError(f"{flag} {name}: {exc}") from None


def _number(kind: AxisKind, text: str, flag: str) -> float:
    raw = yaml.safe_load(text)
    try:
        value = parse_size(raw) if kind.read is parse_size else kind.read(raw)
    except ValueError as exc:
        raise UsageError(f"{flag} {text!r}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{flag}: axis {kind.name} is not numeric; a search needs a numeric axis")
    return value


def _resolution(kind: AxisKind, text: str) -> float:
    """A bracket width in the axis's units (a byte size for a size axis), not bound by its range."""
    raw = yaml.safe_load(text)
    try:
        return parse_size(raw) if kind.read is parse_size else positive_float(raw)
    except ValueError as exc:
        raise UsageError(f"--resolution {text!r}: {exc}") from None


def _show(kind: AxisKind, x: float, *, exact: bool = True) -> str:
    if kind.read is parse_size:
        human = f"{x / 2**20:.4g} MiB" if x < 2**30 else f"{x / 2**30:.4g} GiB"
        return f"{human} ({int(x)} bytes)" if exact else human
    return f"{int(x)}" if kind.integer else f"{x:.6g}"


@dataclass
class Evaluation:
    x: float
    metric: float
    meets: bool
    point: int


@dataclass
class PlanAnswer:
    question: str
    axis: str
    kind: AxisKind = field(repr=False)
    metric: str
    value: float | None
    shown: str
    bracket: tuple[float, float] | None
    evaluations: list[Evaluation]
    monotone: bool
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def text(self) -> str:
        lines = [f"plan: {self.question}: {self.shown}"]
        w = max(len(self.axis), 12)
        lines.append(f"  {self.axis:>{w}}  {self.metric:>16}  meets")
        for e in sorted(self.evaluations, key=lambda e: e.x):
            x = _show(self.kind, e.x, exact=False)
            lines.append(f"  {x:>{w}}  {e.metric:>16.6g}  {'yes' if e.meets else 'no'}")
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  wrote {f}" for f in self.files]
        return "\n".join(lines)


def interior(a: float, b: float, k: int, integer: bool) -> list[float]:
    """k probes cutting (a, b) into k + 1 equal parts (integers: rounded, distinct, strictly inside)."""
    xs = [a + (b - a) * j / (k + 1) for j in range(1, k + 1)]
    if integer:
        xs = sorted({int(round(x)) for x in xs} - {int(a), int(b)})
        xs = [x for x in xs if a < x < b]
    return xs


def monotonicity(evals: Sequence[Evaluation], find: str,
                 fmt: Callable[[float], str] = "{:g}".format) -> tuple[bool, list[str]]:
    """Whether the condition switches once along the axis (the search's assumption) on the
    evaluated points, and notes on what does not hold (the metric moving both ways too);
    ``fmt`` shows an axis value."""
    pts = sorted(evals, key=lambda e: e.x)
    notes = []
    want_first = find == "smallest"   # smallest: fails ... fails, meets ... meets
    switched = False
    bad = []
    for e in pts:
        if e.meets == want_first:
            switched = True
        elif switched:
            bad.append(e)
    if bad:
        ok = "meets" if want_first else "fails"
        notes.append(f"not monotone: the target {'fails' if want_first else 'is met'} again at "
                     + ", ".join(f"{fmt(e.x)} ({e.metric:g})" for e in bad)
                     + f" after it {ok} at a lower value; the answer is the first switch found")
    ups = [(a, b) for a, b in itertools.pairwise(pts) if b.metric > a.metric]
    downs = [(a, b) for a, b in itertools.pairwise(pts) if b.metric < a.metric]
    if ups and downs:
        notes.append(f"the metric is not monotone along the axis on the evaluated points: it rises "
                     f"from {fmt(ups[0][0].x)} to {fmt(ups[0][1].x)} and falls from {fmt(downs[0][0].x)} "
                     f"to {fmt(downs[0][1].x)}"
                     + (" (the target still switches once)" if not bad else ""))
    return not bad, notes


def run_plan(base: SweepBase, q: PlanQuestion, out_dir: str | Path, *, backend: Backend | None = None,
             force: bool = False, max_rounds: int = 30, progress: TextIO | None = None) -> PlanAnswer:
    out = Path(out_dir)
    backend = backend or Backend()
    store = PointStore(out, force=force)
    spec = SweepSpec(mode="grid", axes=(Axis(q.axis, (), ()), *(Axis(k, (v,), (r,)) for k, v, r in q.fixed)),
                     plot=None, doc=YamlDoc(data=None, file="<plan>"))  # type: ignore[arg-type]
    evals: dict[float, Evaluation] = {}
    tasks: dict[float, Any] = {}
    per_round = max(1, backend.workers or os.cpu_count() or 1)

    def evaluate(xs: Sequence[float]) -> None:
        new = [x for x in xs if x not in evals]
        batch = []
        for x in new:
            value = int(x) if q.axis.integer else float(x)
            point = {q.axis.name: value, **{k.name: v for k, v, _ in q.fixed}}
            raw = {q.axis.name: value, **{k.name: r for k, _, r in q.fixed}}
            try:
                task = base.task(len(tasks), point, spec, raw=raw)
            except FormatError as exc:
                raise UsageError(f"{q.axis.name}={value}: {exc.reason.split(': ', 1)[-1]}") from None
            tasks[x] = task
            batch.append(task)
        figures = run_tasks(base.payload, batch, store, backend, progress=progress, label="plan")
        for x, task in zip(new, batch):
            fig = figures[task.key]
            if q.metric not in fig:
                have = ", ".join(k for k in fig if k.startswith("hit_rate.")) or "none"
                raise UsageError(f"--target: {q.metric!r} is not a column (hit-rates here: {have}; "
                                 "figures: ttft_p99_ms, e2e_p99_ms, responses_per_sec, ...)")
            evals[x] = Evaluation(x=x, metric=float(fig[q.metric]), meets=q.meets(float(fig[q.metric])),
                                  point=task.index)

    with _ray_session(backend):
        value, bracket, notes = _search(q, evaluate, evals, per_round, max_rounds)
    monotone, more = monotonicity(list(evals.values()), q.find, lambda x: _show(q.axis, x, exact=False))
    notes += more
    shown = _show(q.axis, value) if value is not None else "none in range"
    answer = PlanAnswer(question=q.describe(), axis=q.axis.name, kind=q.axis, metric=q.metric, value=value, shown=shown,
                        bracket=bracket, evaluations=sorted(evals.values(), key=lambda e: e.x),
                        monotone=monotone, notes=notes)
    answer.files = [str(p) for p in _write(answer, q, tasks, store, out)]
    return answer


def _search(q: PlanQuestion, evaluate: Callable[[Sequence[float]], None], evals: dict[float, Evaluation],
            per_round: int, max_rounds: int) -> tuple[float | None, tuple[float, float] | None, list[str]]:
    lo, hi = q.low, q.high
    evaluate([lo, hi])
    smallest = q.find == "smallest"
    good, bad = (hi, lo) if smallest else (lo, hi)   # where the target should hold / fail
    if evals[bad].meets:
        return bad, None, [f"the target already holds at the {'low' if smallest else 'high'} end of the range"]
    if not evals[good].meets:
        return None, None, [f"the target is not met anywhere in the range ({q.metric} = "
                            f"{evals[good].metric:g} at the {'high' if smallest else 'low'} end)"]
    a, b = lo, hi
    rounds = 0
    while b - a > q.resolution and rounds < max_rounds:
        xs = interior(a, b, per_round, q.axis.integer)
        if not xs:
            break
        evaluate(xs)
        rounds += 1
        inside = sorted(x for x in evals if a <= x <= b)
        if smallest:
            b = next(x for x in inside if evals[x].meets)
            a = max(x for x in inside if x < b)
        else:
            b = next(x for x in inside if not evals[x].meets)
            a = max(x for x in inside if x < b)
    notes = [] if b - a <= q.resolution or rounds < max_rounds else \
        [f"stopped after {max_rounds} rounds with the bracket [{a:g}, {b:g}] wider than the resolution"]
    return (b if smallest else a), (a, b), notes


class _ray_session:
    """One Ray connection for the whole search (each round would otherwise connect anew)."""

    def __init__(self, backend: Backend) -> None:
        self.backend, self.started = backend, False

    def __enter__(self) -> None:
        if self.backend.ray_address:
            self.started = ray_connect(self.backend.ray_address)

    def __exit__(self, *exc: Any) -> None:
        if self.started:
            import ray

            ray.shutdown()


def _write(answer: PlanAnswer, q: PlanQuestion, tasks: dict[float, Any], store: PointStore,
           out: Path) -> list[Path]:
    rows = [{"point": t.index, **t.values, **(store.get(t.key) or {})} for _, t in sorted(tasks.items())]
    cols = columns(rows, [q.axis.name, *(k.name for k, _, _ in q.fixed)])
    files = write_table(rows, cols, out / "plan.csv", out / "plan.parquet")
    doc = {k: v for k, v in asdict(answer).items() if k not in ("files", "kind")}
    atomic_write(out / "plan.json", json.dumps(doc, indent=2) + "\n")
    files.append(out / "plan.json")

    if have_matplotlib():
        files.append(curve_plot([(e.x, e.metric) for e in answer.evaluations], axis=q.axis.name,
                                metric=q.metric, threshold=q.threshold, answer=answer.value,
                                path=out / "plan-curve.png"))
    return files
