"""Running the probe: read the server's limits, observe the plan within a time budget, read the ramp.

API::

    result = run_probe(url, limits, ProbeConfig(), ProbeOptions(model="m", time_budget_s=300))
    result.observed                 # ObserveResult (result.observed.trace: the TraceV2 that `blis fit` reads)
    result.ramp                     # [RampLevel(level, requests, seconds, rps, output_tps)], one per ramp phase run
    result.max_rps, result.max_output_tps     # the highest ramp level's throughput
    write_result(result.observed, "probe.yaml", "probe.csv")   # atomically, as observe writes

The time budget is checked between phases (each phase is small, so the overrun is at most one phase):
phases left when it is spent are skipped and named in a warning; what ran is a complete trace.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from blis_sim.calibrate.capacity import window_throughput
from blis_sim.observe.run import ObserveOptions, ObserveResult, observe
from blis_sim.probe.plan import ProbeConfig, ServerLimits, fitted_phases, max_in_flight, probe_plan

if TYPE_CHECKING:
    from blis_sim.formats import TraceRecord
    from blis_sim.workload import WorkloadPlan

DEFAULT_TIME_BUDGET_S = 300.0


@dataclass(frozen=True)
class ProbeOptions:
    """How to talk to the server (as observe's options) and how long the probe may take."""

    model: str
    time_budget_s: float = DEFAULT_TIME_BUDGET_S
    api_key: str = ""
    timeout_s: float = 300.0
    http_client: str = "lean"
    progress: bool = True  # phase-by-phase lines on stderr
    label: str = "blis probe"
    tokenizer: str = ""  # the served model's tokenizer: exact prompt lengths without /tokenize


@dataclass(frozen=True)
class RampLevel:
    level: int
    requests: int
    seconds: float
    rps: float
    output_tps: float


@dataclass
class ProbeResult:
    limits: ServerLimits
    observed: ObserveResult
    ramp: list[RampLevel] = field(default_factory=list)

    @property
    def max_rps(self) -> float:
        return max((r.rps for r in self.ramp), default=float("nan"))

    @property
    def max_output_tps(self) -> float:
        return max((r.output_tps for r in self.ramp), default=float("nan"))


def ramp_throughput(records: Iterable[TraceRecord]) -> list[RampLevel]:
    """Per ``ramp-<N>`` phase: its ``ok`` requests and output tokens over last completion − first send."""
    by_phase: dict[str, list[TraceRecord]] = {}
    for r in records:
        if r.phase.startswith("ramp-") and r.status == "ok" and r.last_chunk_time_us > 0:
            by_phase.setdefault(r.phase, []).append(r)
    out = []
    for name, rows in sorted(by_phase.items(), key=lambda kv: int(kv[0].split("-")[1])):
        t = window_throughput([float(r.send_time_us) for r in rows], [float(r.last_chunk_time_us) for r in rows],
                              [r.output_tokens for r in rows])
        out.append(RampLevel(int(name.split("-")[1]), t.requests, t.seconds, t.rps, t.output_tps))
    return out


def observe_options(options: ProbeOptions, plan: WorkloadPlan) -> ObserveOptions:
    return ObserveOptions(model=options.model, api_key=options.api_key, timeout_s=options.timeout_s,
                          max_concurrency=max_in_flight(plan), window_phases=fitted_phases(plan),
                          workload_label=options.label, http_client=options.http_client, progress=False,
                          time_budget_s=options.time_budget_s, announce_phases=options.progress,
                          handle_signals=True, tokenizer=options.tokenizer)


def run_probe(url: str, limits: ServerLimits, config: ProbeConfig, options: ProbeOptions) -> ProbeResult:
    """Observe the probe planned for ``limits`` on ``url``."""
    plan = probe_plan(limits, config)
    observed = observe(url, plan, observe_options(options, plan))
    return ProbeResult(limits=limits, observed=observed, ramp=ramp_throughput(observed.trace.records))
