"""The workload spec YAML: the reference's ``WorkloadSpec`` (BLIS v2, v1 auto-upgraded) plus our ``phases``.

API::

    spec = load_workload_spec("spec.yaml")   # WorkloadSpec, or FormatError/ConfigError "file:line: field 'x': why"
    spec = workload_spec_from_doc(doc, at=("workload",))   # a spec embedded in another YAML file (e.g. a scenario)
    spec = parse_workload_spec(text, file="<inline>")
    spec = workload_spec_from_data({"aggregate_rate": 4, ...}, source="<flags>")   # built in code
    for phase in spec.resolved_phases(): ...         # ResolvedPhase: name, clients, aggregate_rate, num_requests, ...

Every key of the reference spec is accepted with the reference's meaning (docs/reference-formats.md §2 and the Go
``sim/workload/spec.go``): ``version, seed, category, aggregate_rate, num_requests, horizon, clients, cohorts,
goodput_slo_targets, servegen_data, inference_perf``. Parsing is strict: an unknown key anywhere (including an
unknown distribution parameter, which BLIS would silently ignore) is an error naming file, line and field.
The reference's ``Validate()`` runs at load time rather than at generation time, so a bad spec fails before any
request is sent.

Our one extension is ``phases``: an ordered list of workloads run one after the other, each starting when the
previous one has drained (every request completed)::

    seed: 7
    aggregate_rate: 4            # top-level rate / num_requests / horizon are defaults for every phase
    phases:
      - name: seed-prefixes
        num_requests: 16
        clients: [...]
      - name: flood
        aggregate_rate: 20
        num_requests: 400
        clients: [...]
      - name: repeat
        repeat: seed-prefixes    # the same clients again (same prefixes, fresh per-request suffixes)
        gap_us: 2000000          # idle time after the previous phase drained

A spec without ``phases`` is a single unnamed phase (name ``""``), so every plain reference spec is valid
unchanged. With ``phases``, top-level ``clients``/``cohorts`` are refused (put them in a phase).
"""
from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator

from blis_sim import limits
from blis_sim.errors import ConfigError, FormatError
from blis_sim.formats._strict import YamlDoc, describe, dotted, load_yaml, parse_yaml

__all__ = [
    "ArrivalSpec", "ClientSpec", "CohortSpec", "DistSpec", "LifecycleSpec", "ActiveWindow", "MultiTurnSpec",
    "ReasoningSpec", "MultimodalSpec", "NetworkSpec", "PhaseSpec", "ResolvedPhase", "WorkloadSpec",
    "DEFAULT_PREFIX_LENGTH", "DEFAULT_SESSION_TIMEOUT_US", "DIST_PARAMS", "SLO_CLASSES",
    "load_workload_spec", "parse_workload_spec", "workload_spec_from_doc", "workload_spec_from_data",
]

log = logging.getLogger("blis_sim.workload")

DEFAULT_PREFIX_LENGTH = 50  # the reference's defaultPrefixLength: prefix_length 0/unset in a group means 50
DEFAULT_SESSION_TIMEOUT_US = 300_000_000  # session clients get arrival + 300 s unless `timeout` says otherwise
SLO_CLASSES = ("", "critical", "standard", "sheddable", "batch", "background")
ARRIVAL_PROCESSES = ("poisson", "gamma", "weibull", "constant")
CATEGORIES = ("", "language", "multimodal", "reasoning")
V1_SLO_CLASSES = {"realtime": "critical", "interactive": "standard"}
MAX_COHORT_POPULATION = 100_000

# Distribution type -> (required params, optional params). `empirical` takes "<tokens>": probability pairs.
DIST_PARAMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gaussian": (("mean", "std_dev", "min", "max"), ()),
    "exponential": (("mean",), ("min", "max")),
    "lognormal": (("mu", "sigma"), ("min", "max")),
    "pareto_lognormal": (("alpha", "xm", "mu", "sigma", "mix_weight"), ()),
    "constant": (("value",), ()),
    "empirical": ((), ()),
}

# The parameters of each distribution that are token counts (bounded by limits.MAX_REQUEST_TOKENS).
_TOKEN_PARAMS: dict[str, tuple[str, ...]] = {
    "gaussian": ("mean", "std_dev", "min", "max"), "exponential": ("mean", "min", "max"),
    "lognormal": ("min", "max"), "pareto_lognormal": ("xm",), "constant": ("value",),
}

_CFG = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


class _Model(BaseModel):
    model_config = _CFG


class DistSpec(_Model):
    """A token-length distribution ``{type, params}``; ``type: ""`` means "not set" where a block is optional."""

    type: str = ""
    params: dict[str, float] = Field(default_factory=dict)
    file: str = ""

    @field_validator("params")
    @classmethod
    def _finite(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if not math.isfinite(x):
                raise ValueError(f"params.{k} must be a finite number, got {x}")
        return v


class ArrivalSpec(_Model):
    process: str = ""
    cv: float | None = None
    shape: float | None = None  # gamma alpha / weibull k; with `scale`, overrides cv and the client rate
    scale: float | None = None  # µs


class NetworkSpec(_Model):
    rtt_ms: float = 0.0
    bandwidth_mbps: float = 0.0


class ActiveWindow(_Model):
    start_us: int = 0
    end_us: int = 0
    trace_rate: float | None = None
    arrival: ArrivalSpec | None = None
    input_distribution: DistSpec | None = None
    output_distribution: DistSpec | None = None


class LifecycleSpec(_Model):
    windows: list[ActiveWindow] = Field(default_factory=list)


class MultimodalSpec(_Model):
    text_distribution: DistSpec = DistSpec()
    image_distribution: DistSpec = DistSpec()
    image_count_distribution: DistSpec = DistSpec()
    audio_distribution: DistSpec = DistSpec()
    audio_count_distribution: DistSpec = DistSpec()
    video_distribution: DistSpec = DistSpec()
    video_count_distribution: DistSpec = DistSpec()


class MultiTurnSpec(_Model):
    max_rounds: int = 0
    think_time_us: int = Field(0, ge=0)
    context_growth: Literal["", "accumulate"] = ""
    single_session: StrictBool = False


class ReasoningSpec(_Model):
    reason_ratio_distribution: DistSpec = DistSpec()  # sampled as an integer percentage, clamped to [0, 100]
    multi_turn: MultiTurnSpec | None = None


class SLODimTargets(_Model):
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    e2e_ms: float = 0.0


class _ClientFields(_Model):
    tenant_id: str = ""
    slo_class: str = ""
    model: str = ""
    adapter: str = ""
    arrival: ArrivalSpec = ArrivalSpec()
    input_distribution: DistSpec = DistSpec()
    output_distribution: DistSpec = DistSpec()
    prefix_group: str = ""
    prefix_length: int = 0
    streaming: StrictBool = False  # YAML true/false only: "true" or 1 is a typo the reference rejects too
    rate_fraction: float = 0.0
    reasoning: ReasoningSpec | None = None
    closed_loop: StrictBool | None = None
    timeout: int | None = None  # µs; None = none for open-loop clients, 300 s for session clients; 0 = none
    slo_target_us: int | None = None
    network: NetworkSpec | None = None
    multimodal: MultimodalSpec | None = None

    @property
    def multi_turn(self) -> MultiTurnSpec | None:
        return self.reasoning.multi_turn if self.reasoning is not None else None


class ClientSpec(_ClientFields):
    id: str = ""
    concurrency: int = 0
    think_time_us: int = 0
    lifecycle: LifecycleSpec | None = None

    @property
    def is_closed_loop(self) -> bool:
        """The reference's isClosedLoop: explicit ``closed_loop``, else true for multi-turn clients."""
        if self.closed_loop is not None:
            return self.closed_loop
        return self.multi_turn is not None


class DiurnalSpec(_Model):
    peak_hour: int = 0
    peak_to_trough_ratio: float = 0.0


class SpikeSpec(_Model):
    start_time_us: int = 0
    duration_us: int = 0
    trace_rate: float | None = None


class DrainSpec(_Model):
    start_time_us: int = 0
    ramp_duration_us: int = 0


class CohortSpec(_ClientFields):
    id: str = ""
    population: int = 0
    prefix_sharing: str = ""
    diurnal: DiurnalSpec | None = None
    spike: SpikeSpec | None = None
    drain: DrainSpec | None = None


class ServeGenDataSpec(_Model):
    path: str = ""
    time_window: str = ""
    span_start: int = 0
    span_end: int = 0
    window_duration_secs: int = 0
    drain_timeout_secs: int = 0


class StageSpec(_Model):
    rate: float = 0.0
    duration: int = 0


class SharedPrefixSpec(_Model):
    num_unique_system_prompts: int = 0
    num_users_per_system_prompt: int = 0
    system_prompt_len: int = 0
    question_len: int = 0
    output_len: int = 0
    enable_multi_turn_chat: StrictBool = False


class InferencePerfSpec(_Model):
    stages: list[StageSpec] = Field(default_factory=list)
    shared_prefix: SharedPrefixSpec | None = None


class PhaseSpec(_Model):
    """One phase (our extension). Unset scalars inherit the top-level value; ``repeat`` copies an earlier phase."""

    name: str
    repeat: str | None = None
    aggregate_rate: float | None = None
    num_requests: int | None = None
    horizon: int | None = None
    gap_us: int = Field(0, ge=0)
    clients: list[ClientSpec] | None = None
    cohorts: list[CohortSpec] | None = None


@dataclass(frozen=True)
class ResolvedPhase:
    """A phase with inheritance and ``repeat`` applied: what generation consumes."""

    index: int
    name: str
    aggregate_rate: float
    num_requests: int
    horizon: int
    gap_us: int
    clients: tuple[ClientSpec, ...]
    cohorts: tuple[CohortSpec, ...]
    path: tuple[str | int, ...]  # where the phase's clients sit in the YAML, for error messages


class WorkloadSpec(_Model):
    version: str = ""
    seed: int = 0
    category: str = ""
    clients: list[ClientSpec] = Field(default_factory=list)
    cohorts: list[CohortSpec] = Field(default_factory=list)
    aggregate_rate: float = 0.0
    horizon: int = 0
    num_requests: int = 0
    servegen_data: ServeGenDataSpec | None = None
    inference_perf: InferencePerfSpec | None = None
    goodput_slo_targets: dict[str, SLODimTargets] = Field(default_factory=dict)
    phases: list[PhaseSpec] = Field(default_factory=list)  # ours

    def resolved_phases(self) -> list[ResolvedPhase]:
        """The phases to run, in order. A spec without ``phases`` is one phase named ``""``."""
        if not self.phases:
            return [ResolvedPhase(0, "", self.aggregate_rate, self.num_requests, self.horizon, 0,
                                  tuple(self.clients), tuple(self.cohorts), ())]
        out: list[ResolvedPhase] = []
        by_name: dict[str, ResolvedPhase] = {}
        for i, ph in enumerate(self.phases):
            base = by_name[ph.repeat] if ph.repeat is not None else None
            r = ResolvedPhase(
                index=i, name=ph.name,
                aggregate_rate=_own_or(ph.aggregate_rate, base.aggregate_rate if base else self.aggregate_rate),
                num_requests=_own_or(ph.num_requests, base.num_requests if base else self.num_requests),
                horizon=_own_or(ph.horizon, base.horizon if base else self.horizon),
                gap_us=ph.gap_us,
                clients=tuple(ph.clients or ()) if base is None else base.clients,
                cohorts=tuple(ph.cohorts or ()) if base is None else base.cohorts,
                path=("phases", i) if base is None else base.path,
            )
            out.append(r)
            by_name[ph.name] = r
        return out

    def with_overrides(self, *, seed: int | None = None, num_requests: int | None = None,
                       horizon: int | None = None) -> WorkloadSpec:
        """The CLI's ``--seed/--num-requests/--horizon`` (a value > 0 overrides; for phases, every phase)."""
        upd: dict[str, Any] = {}
        if seed is not None:
            upd["seed"] = seed
        if num_requests:
            upd["num_requests"] = num_requests
        if horizon:
            upd["horizon"] = horizon
        if self.phases and (num_requests or horizon):
            phases = []
            for ph in self.phases:
                pu: dict[str, Any] = {}
                if num_requests:
                    pu["num_requests"] = num_requests
                if horizon:
                    pu["horizon"] = horizon
                phases.append(ph.model_copy(update=pu))
            upd["phases"] = phases
        return self.model_copy(update=upd)


def _own_or(own: Any, inherited: Any) -> Any:
    return inherited if own is None else own


# ---------------------------------------------------------------------------------------------------------------
# Loading


def load_workload_spec(path: str | Path) -> WorkloadSpec:
    """Load, upgrade (v1 -> v2) and validate a workload spec file."""
    return workload_spec_from_doc(load_yaml(path))


def parse_workload_spec(text: str, file: str = "<string>") -> WorkloadSpec:
    return workload_spec_from_doc(parse_yaml(text, file))


def workload_spec_from_data(data: Any, source: str = "<data>") -> WorkloadSpec:
    """Validate a spec built in code (e.g. from CLI flags) with the same rules; errors name ``source`` and the
    field (no line)."""
    return workload_spec_from_doc(YamlDoc(data=data, file=source))


def workload_spec_from_doc(doc: YamlDoc, at: tuple[str | int, ...] = ()) -> WorkloadSpec:
    """Validate the spec found at path ``at`` of a parsed YAML document (``()`` = the whole document)."""
    data: Any = doc.data
    for i, key in enumerate(at):
        if not isinstance(data, (dict, list)) or (isinstance(data, dict) and key not in data) or \
                (isinstance(data, list) and not (isinstance(key, int) and 0 <= key < len(data))):
            raise FormatError("required field is missing", file=doc.file, line=doc.line_of(at[:i]),
                              field=dotted(at[:i + 1]))
        data = data[key]  # type: ignore[index]  # a list only with an int key (checked above)
    if data is None:
        raise FormatError("workload spec is empty", file=doc.file, line=doc.line_of(at), field=dotted(at) or None)
    if not isinstance(data, dict):
        raise FormatError(f"workload spec must be a mapping, got {type(data).__name__}", file=doc.file,
                          line=doc.line_of(at), field=dotted(at) or None)
    data = _upgrade_v1(copy.deepcopy(data), doc.file)
    sub = YamlDoc(data=data, file=doc.file,
                  lines={k[len(at):]: v for k, v in doc.lines.items() if k[:len(at)] == at})
    try:
        spec = WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        err = describe(exc, sub)
        if at:  # re-anchor the field path in the enclosing document
            fld = dotted(at) + ("." + err.location.field if err.location.field else "")
            raise FormatError(err.reason, file=doc.file, line=err.location.line, field=fld) from None
        raise err from None
    _Checker(spec, sub, at).run()
    return spec


def _upgrade_v1(data: dict[str, Any], file: str) -> dict[str, Any]:
    """The reference's UpgradeV1ToV2: version ""/"1" -> "2", slo realtime -> critical, interactive -> standard."""
    version = data.get("version", "")
    if isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
        data["version"] = version
    if version not in ("", "1"):
        return data
    data["version"] = "2"

    def fix(clients: Any) -> None:
        if not isinstance(clients, list):
            return
        for c in clients:
            if isinstance(c, dict) and isinstance(c.get("slo_class"), str) and c["slo_class"] in V1_SLO_CLASSES:
                new = V1_SLO_CLASSES[c["slo_class"]]
                log.warning("%s: deprecated SLO class %r auto-mapped to %r; update your spec to use v2 tier names",
                            file, c["slo_class"], new)
                c["slo_class"] = new

    fix(data.get("clients"))
    fix(data.get("cohorts"))
    for ph in data.get("phases") or []:
        if isinstance(ph, dict):
            fix(ph.get("clients"))
            fix(ph.get("cohorts"))
    return data


class _Checker:
    """The reference's ``Validate()`` plus our phase rules, each error anchored at its YAML line."""

    def __init__(self, spec: WorkloadSpec, doc: YamlDoc, at: tuple[str | int, ...]) -> None:
        self.spec, self.doc, self.at = spec, doc, at

    def fail(self, path: tuple[str | int, ...], message: str) -> None:
        raise ConfigError(message, file=self.doc.file, line=self.doc.line_of(path),
                          field=dotted(self.at + path) or None)

    def run(self) -> None:
        s = self.spec
        if s.version != "2":
            self.fail(("version",), f"unsupported version {s.version!r}; valid: \"1\" (auto-upgraded) or \"2\"")
        if s.category not in CATEGORIES:
            self.fail(("category",), f"unknown category {s.category!r}; valid: language, multimodal, reasoning")
        for key in ("num_requests", "horizon"):
            if getattr(s, key) < 0:
                self.fail((key,), f"{key} must be >= 0, got {getattr(s, key)}")
        self._check_size((), s.num_requests, s.horizon, s.aggregate_rate)
        sources = [n for n, on in (("clients", bool(s.clients)), ("servegen_data", s.servegen_data is not None),
                                   ("inference_perf", s.inference_perf is not None)) if on]
        if len(sources) > 1:
            self.fail((sources[1],), f"workload sources {{{', '.join(sources)}}} are mutually exclusive; specify "
                      "exactly one of: clients, servegen_data, inference_perf")
        if s.inference_perf is not None:
            self._check_inference_perf(s.inference_perf)
        if s.phases:
            self._check_phases()
        else:
            if not s.clients and not s.cohorts and s.servegen_data is None and s.inference_perf is None:
                self.fail((), "at least one client, cohort, or servegen_data path required")
            self._check_workload((), s.clients, s.cohorts, s.aggregate_rate, ("aggregate_rate",))
        self._check_slo_mixing()
        self._check_group_lengths()

    def _check_size(self, p: tuple[str | int, ...], num_requests: int, horizon: float, rate: float) -> None:
        """At most ``limits.MAX_REQUESTS`` requests, capped by ``num_requests`` or by rate × horizon."""
        if num_requests > limits.MAX_REQUESTS:
            self.fail(p + ("num_requests",), f"num_requests {limits.over(num_requests, limits.MAX_REQUESTS)}")
        if not num_requests and horizon > 0 and rate > 0 and rate * horizon / 1e6 > limits.MAX_REQUESTS:
            self.fail(p + ("horizon",), f"aggregate_rate × horizon is {rate * horizon / 1e6:.3g} requests, more than "
                                        f"the maximum {limits.MAX_REQUESTS} (docs/reliability.md); set num_requests")

    # -- phases ------------------------------------------------------------------------------------------------
    def _check_phases(self) -> None:
        s = self.spec
        for key in ("clients", "cohorts", "servegen_data", "inference_perf"):
            if getattr(s, key):
                self.fail((key,), f"top-level {key} cannot be combined with phases; move it into a phase")
        seen: dict[str, int] = {}
        for i, ph in enumerate(s.phases):
            p = ("phases", i)
            if not ph.name:
                self.fail(p + ("name",), "phase name must be non-empty")
            if ph.name in seen:
                self.fail(p + ("name",), f"duplicate phase name {ph.name!r} (also phases.{seen[ph.name]})")
            seen[ph.name] = i
            for key in ("num_requests", "horizon"):
                v = getattr(ph, key)
                if v is not None and v < 0:
                    self.fail(p + (key,), f"{key} must be >= 0, got {v}")
            self._check_size(p, _own_or(ph.num_requests, s.num_requests), _own_or(ph.horizon, s.horizon),
                             _own_or(ph.aggregate_rate, s.aggregate_rate))
            if ph.repeat is not None:
                if ph.repeat not in seen or seen[ph.repeat] == i:
                    self.fail(p + ("repeat",), f"repeat: {ph.repeat!r} is not the name of an earlier phase")
                if ph.clients is not None or ph.cohorts is not None:
                    key = "clients" if ph.clients is not None else "cohorts"
                    self.fail(p + (key,), "a phase with `repeat` takes its clients from the repeated phase; "
                              f"remove {key}")
            elif not ph.clients and not ph.cohorts:
                self.fail(p, f"phase {ph.name!r} needs clients, cohorts or `repeat`")
        for r in s.resolved_phases():
            own = s.phases[r.index].aggregate_rate is not None
            rate_path = ("phases", r.index, "aggregate_rate") if own else ("aggregate_rate",)
            if r.path == ("phases", r.index):
                self._check_workload(r.path, list(r.clients), list(r.cohorts), r.aggregate_rate, rate_path)
            elif _rate_based(r.clients, r.cohorts) and not (math.isfinite(r.aggregate_rate)
                                                           and r.aggregate_rate > 0):
                self.fail(rate_path, f"aggregate_rate must be positive, got {r.aggregate_rate}")

    # -- one workload (top level or a phase) --------------------------------------------------------------------
    def _check_workload(self, base: tuple[str | int, ...], clients: list[ClientSpec], cohorts: list[CohortSpec],
                        rate: float, rate_path: tuple[str | int, ...]) -> None:
        if _rate_based(clients, cohorts):
            if not math.isfinite(rate):
                self.fail(rate_path, f"aggregate_rate must be a finite number, got {rate}")
            if rate < 0:
                self.fail(rate_path, f"aggregate_rate must be positive, got {rate}")
            if rate == 0:  # the reference's absolute rate mode: every rate-based client window carries trace_rate
                for i, c in enumerate(clients):
                    if c.concurrency:
                        continue
                    if c.lifecycle is None or not c.lifecycle.windows:
                        self.fail(rate_path, "aggregate_rate must be > 0 when a client is rate-based (it is 0 or "
                                  f"unset; absolute rate mode would need trace_rate on every window of client {i})")
                    assert c.lifecycle is not None  # self.fail raised otherwise
                    for j, w in enumerate(c.lifecycle.windows):
                        if w.trace_rate is None:
                            self.fail(base + ("clients", i, "lifecycle", "windows", j),
                                      f"aggregate_rate is 0 (absolute rate mode) but client {i} window {j} "
                                      "has no trace_rate")
                for i, co in enumerate(cohorts):
                    if co.diurnal is not None or co.drain is not None:
                        self.fail(base + ("cohorts", i), "aggregate_rate is 0 (absolute rate mode) but cohort "
                                  f"{i} has a diurnal/drain pattern (not supported; use spike with trace_rate)")
                    if co.spike is None or co.spike.trace_rate is None:
                        self.fail(base + ("cohorts", i), f"aggregate_rate is 0 (absolute rate mode) but cohort "
                                  f"{i} has no spike pattern with trace_rate")
        for i, c in enumerate(clients):
            self._check_client(base + ("clients", i), c)
        for i, co in enumerate(cohorts):
            self._check_cohort(base + ("cohorts", i), co)
        has_conc = any(c.concurrency > 0 for c in clients)
        mt = [i for i, c in enumerate(clients) if c.multi_turn is not None]
        if has_conc and (mt or any(co.multi_turn is not None for co in cohorts)):
            self.fail(base + ("clients", mt[0]) if mt else base,
                      "concurrency clients and multi-turn clients cannot be mixed in the same workload: "
                      "follow-up budget accounting does not support this combination")

    def _check_common(self, p: tuple[str | int, ...], c: _ClientFields, rate_based: bool) -> None:
        if c.slo_class not in SLO_CLASSES:
            self.fail(p + ("slo_class",), f"unknown slo_class {c.slo_class!r}; valid: critical, standard, "
                      "sheddable, batch, background, or empty")
        if rate_based:
            if not math.isfinite(c.rate_fraction) or c.rate_fraction <= 0:
                self.fail(p + ("rate_fraction",), f"rate_fraction must be positive, got {c.rate_fraction}")
            self._check_arrival(p + ("arrival",), c.arrival)
        if c.prefix_length < 0:
            self.fail(p + ("prefix_length",), f"prefix_length must be non-negative, got {c.prefix_length}")
        self._check_dist(p + ("input_distribution",), c.input_distribution, required=True)
        self._check_dist(p + ("output_distribution",), c.output_distribution, required=True)
        for key in ("timeout", "slo_target_us"):
            v = getattr(c, key)
            if v is not None and v < 0:
                self.fail(p + (key,), f"{key} must be non-negative, got {v}")
        if c.reasoning is not None:
            self._check_dist(p + ("reasoning", "reason_ratio_distribution"), c.reasoning.reason_ratio_distribution,
                             required=False)
            mt = c.reasoning.multi_turn
            if mt is not None and mt.max_rounds < 1:
                self.fail(p + ("reasoning", "multi_turn", "max_rounds"),
                          f"reasoning.multi_turn.max_rounds must be >= 1, got {mt.max_rounds}")
        if c.multimodal is not None:
            for name in MultimodalSpec.model_fields:
                self._check_dist(p + ("multimodal", name), getattr(c.multimodal, name), required=False)
        if c.network is not None and (c.network.rtt_ms < 0 or not math.isfinite(c.network.rtt_ms)):
            self.fail(p + ("network", "rtt_ms"), f"rtt_ms must be a finite number >= 0, got {c.network.rtt_ms}")

    def _check_client(self, p: tuple[str | int, ...], c: ClientSpec) -> None:
        if c.concurrency < 0:
            self.fail(p + ("concurrency",), f"concurrency must be non-negative, got {c.concurrency}")
        if c.think_time_us < 0:
            self.fail(p + ("think_time_us",), f"think_time_us must be non-negative, got {c.think_time_us}")
        if c.concurrency > 0 and c.rate_fraction > 0:
            self.fail(p + ("rate_fraction",), "concurrency and rate_fraction are mutually exclusive")
        self._check_common(p, c, rate_based=c.concurrency == 0)
        if c.lifecycle is not None:
            if not c.lifecycle.windows:
                self.fail(p + ("lifecycle",), "lifecycle specified with no windows")
            for j, w in enumerate(c.lifecycle.windows):
                wp = p + ("lifecycle", "windows", j)
                if w.start_us < 0:
                    self.fail(wp + ("start_us",), f"negative start_us ({w.start_us})")
                if w.end_us <= w.start_us:
                    self.fail(wp + ("end_us",), f"end_us ({w.end_us}) <= start_us ({w.start_us})")
                if w.trace_rate is not None and (not math.isfinite(w.trace_rate) or w.trace_rate <= 0):
                    self.fail(wp + ("trace_rate",), f"trace_rate must be positive, got {w.trace_rate}")
                if w.arrival is not None:
                    self._check_arrival(wp + ("arrival",), w.arrival)
                for key in ("input_distribution", "output_distribution"):
                    if getattr(w, key) is not None:
                        self._check_dist(wp + (key,), getattr(w, key), required=True)

    def _check_cohort(self, p: tuple[str | int, ...], c: CohortSpec) -> None:
        if c.population <= 0:
            self.fail(p + ("population",), f"population must be positive, got {c.population}")
        if c.population > MAX_COHORT_POPULATION:
            self.fail(p + ("population",), f"population {c.population} exceeds maximum {MAX_COHORT_POPULATION}")
        self._check_common(p, c, rate_based=True)
        if c.diurnal is not None:
            r = c.diurnal.peak_to_trough_ratio
            if not math.isfinite(r) or r < 1.0:
                self.fail(p + ("diurnal", "peak_to_trough_ratio"),
                          f"diurnal peak_to_trough_ratio must be a finite number >= 1.0, got {r}")
            if not 0 <= c.diurnal.peak_hour <= 23:
                self.fail(p + ("diurnal", "peak_hour"), f"diurnal peak_hour must be 0-23, got {c.diurnal.peak_hour}")
        if c.spike is not None:
            if c.spike.start_time_us < 0:
                self.fail(p + ("spike", "start_time_us"), "spike start_time_us must be non-negative")
            if c.spike.duration_us <= 0:
                self.fail(p + ("spike", "duration_us"), f"spike duration_us must be > 0, got {c.spike.duration_us}")
            if c.spike.trace_rate is not None and (not math.isfinite(c.spike.trace_rate) or c.spike.trace_rate <= 0):
                self.fail(p + ("spike", "trace_rate"), "spike.trace_rate must be a finite positive number")
        if c.drain is not None:
            if c.drain.start_time_us < 0:
                self.fail(p + ("drain", "start_time_us"), "drain start_time_us must be non-negative")
            if c.drain.ramp_duration_us <= 0:
                self.fail(p + ("drain", "ramp_duration_us"), "drain ramp_duration_us must be > 0")
        if c.prefix_sharing not in ("", "shared", "per_member"):
            self.fail(p + ("prefix_sharing",),
                      f"prefix_sharing must be \"shared\" or \"per_member\", got {c.prefix_sharing!r}")
        if c.prefix_sharing == "per_member" and not c.prefix_group:
            self.fail(p + ("prefix_sharing",), "prefix_sharing \"per_member\" requires prefix_group to be set")

    def _check_arrival(self, p: tuple[str | int, ...], a: ArrivalSpec) -> None:
        if a.process not in ARRIVAL_PROCESSES:
            self.fail(p + ("process",), f"unknown arrival process {a.process!r}; valid: poisson, gamma, weibull, "
                      "constant")
        explicit = a.shape is not None and a.scale is not None and a.shape > 0 and a.scale > 0
        if a.cv is not None:
            if not math.isfinite(a.cv) or a.cv <= 0:
                self.fail(p + ("cv",), f"cv must be positive, got {a.cv}")
            if a.process == "weibull" and not explicit and not 0.01 <= a.cv <= 10.4:
                self.fail(p + ("cv",), f"weibull CV must be in [0.01, 10.4], got {a.cv}")
        for key in ("shape", "scale"):
            v = getattr(a, key)
            if v is not None and (not math.isfinite(v) or v <= 0):
                self.fail(p + (key,), f"arrival.{key} must be positive, got {v}")

    def _check_dist(self, p: tuple[str | int, ...], d: DistSpec, *, required: bool) -> None:
        if not d.type:
            if required:
                self.fail(p + ("type",), "distribution type is required; valid: " + ", ".join(DIST_PARAMS))
            if d.params or d.file:
                self.fail(p + ("type",), "distribution has params but no type")
            return
        if d.type not in DIST_PARAMS:
            self.fail(p + ("type",), f"unknown distribution type {d.type!r}; valid: " + ", ".join(DIST_PARAMS))
        pp = p + ("params",)
        if d.type == "empirical":
            if d.file and not d.params:
                self.fail(p + ("file",), "empirical distributions from a file are not supported; give the PDF "
                          "inline as params: {\"<tokens>\": probability, ...}")
            if not d.params:
                self.fail(pp, "empirical distribution requires inline params {\"<tokens>\": probability, ...}")
            for k, v in d.params.items():
                try:
                    int(k)
                except ValueError:
                    self.fail(pp + (k,), f"empirical PDF key {k!r} is not an integer token count")
                if v < 0:
                    self.fail(pp + (k,), f"empirical probability must be >= 0, got {v}")
            if not any(v > 0 for v in d.params.values()):
                self.fail(pp, "empirical distribution has no bin with a positive probability")
            return
        if d.file:
            self.fail(p + ("file",), f"`file` applies only to empirical distributions, not {d.type}")
        req, opt = DIST_PARAMS[d.type]
        for k in d.params:
            if k not in req and k not in opt:
                self.fail(pp + (k,), f"unknown parameter {k!r} for a {d.type} distribution; valid: "
                          + ", ".join(req + opt))
        for k in req:
            if k not in d.params:
                self.fail(pp, f"{d.type} distribution requires parameter {k!r}")
        q = d.params
        # Token counts (a distribution's lengths and bounds) stay within the documented request maximum, so a
        # sampled length is an int a request can have (a mean near the float maximum overflowed the sampler).
        for k in _TOKEN_PARAMS.get(d.type, ()):
            if k in q and abs(q[k]) > limits.MAX_REQUEST_TOKENS:
                self.fail(pp + (k,), f"{k} must be at most {limits.MAX_REQUEST_TOKENS} tokens in size, got {q[k]:g} "
                                     "(docs/reliability.md)")
        if d.type == "gaussian":
            if q["std_dev"] < 0:
                self.fail(pp + ("std_dev",), f"std_dev must be >= 0, got {q['std_dev']}")
            if q["min"] > q["max"]:
                self.fail(pp + ("min",), f"min ({q['min']:g}) must be <= max ({q['max']:g})")
        elif d.type == "exponential":
            if q["mean"] <= 0:
                self.fail(pp + ("mean",), f"mean must be > 0, got {q['mean']}")
        elif d.type == "lognormal" and q["sigma"] < 0:
            self.fail(pp + ("sigma",), f"sigma must be >= 0, got {q['sigma']}")
        elif d.type == "pareto_lognormal":
            for k in ("alpha", "xm"):
                if q[k] <= 0:
                    self.fail(pp + (k,), f"{k} must be > 0, got {q[k]}")
            if q["sigma"] < 0:
                self.fail(pp + ("sigma",), f"sigma must be >= 0, got {q['sigma']}")
            if not 0 <= q["mix_weight"] <= 1:
                self.fail(pp + ("mix_weight",), f"mix_weight must be in [0, 1], got {q['mix_weight']}")
        if d.type in ("exponential", "lognormal") and "min" in q and "max" in q and 0 < q["max"] < q["min"]:
            self.fail(pp + ("min",), f"min ({q['min']:g}) must be <= max ({q['max']:g})")

    def _check_inference_perf(self, ip: InferencePerfSpec) -> None:
        p: tuple[str | int, ...] = ("inference_perf",)
        if not ip.stages:
            self.fail(p + ("stages",), "inference_perf: at least one stage required")
        for i, st in enumerate(ip.stages):
            if st.duration <= 0:
                self.fail(p + ("stages", i, "duration"), f"duration must be positive, got {st.duration}")
            if not math.isfinite(st.rate) or st.rate <= 0:
                self.fail(p + ("stages", i, "rate"), f"rate must be a finite positive number, got {st.rate}")
        if ip.shared_prefix is None:
            self.fail(p, "inference_perf: shared_prefix is required")

    def _check_slo_mixing(self) -> None:
        s = self.spec
        if s.inference_perf is not None or s.servegen_data is not None:
            return
        explicit: list[tuple[str | int, ...]] = []
        empty: list[tuple[str | int, ...]] = []
        for r in s.resolved_phases():
            if r.path != (() if not s.phases else ("phases", r.index)):
                continue
            for kind, items in (("clients", r.clients), ("cohorts", r.cohorts)):
                for i, c in enumerate(items):
                    (explicit if c.slo_class else empty).append(r.path + (kind, i))
        if explicit and empty:
            self.fail(empty[0] + ("slo_class",), "mixed slo_class specification: if any client/cohort specifies "
                      f"slo_class, all must specify it; {len(explicit)} have explicit values, {len(empty)} are "
                      f"empty (first: {dotted(self.at + empty[0])})")

    def _check_group_lengths(self) -> None:
        # The reference silently lets the first client of a group decide its length (and observe the last);
        # we keep "first wins" but say so, because the two tools disagree.
        first: dict[str, tuple[int, tuple[str | int, ...]]] = {}
        for r in self.spec.resolved_phases():
            for i, c in enumerate(r.clients):
                if not c.prefix_group:
                    continue
                length = c.prefix_length or DEFAULT_PREFIX_LENGTH
                if c.prefix_group not in first:
                    first[c.prefix_group] = (length, r.path + ("clients", i))
                elif first[c.prefix_group][0] != length:
                    log.warning("%s: prefix_group %r has prefix_length %d at %s but %d at %s; the first one is used",
                                self.doc.file, c.prefix_group, first[c.prefix_group][0],
                                dotted(first[c.prefix_group][1]), length, dotted(r.path + ("clients", i)))


def _rate_based(clients: Any, cohorts: Any) -> bool:
    return any(c.concurrency == 0 for c in clients) or bool(cohorts)
