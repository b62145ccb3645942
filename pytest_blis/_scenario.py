"""Scenario files (``*.blis.yaml``): schema, sweep expansion and validation at collection time.

A file holds ``defaults`` (merged under every scenario) and ``scenarios`` (name → scenario). A
scenario says what the server must offer, the workload phases that put the cache into the state the
cell is about, the sweep axes, and the expectations::

    scenarios:
      gpu-hit:
        description: repeat a prefix still resident on the GPU
        sweep: {prefix_length: [256, 1024, 4096]}
        id: "prefix-{prefix_length}"
        phases:
          - seed: {groups: 4, prefix_length: "{prefix_length}"}
          - repeat: {}
        expect: {path: gpu}

``{axis}`` placeholders anywhere in the scenario are replaced by the sweep point's value (a string
that is exactly ``"{axis}"`` takes the value's type). Every sweep point is validated when the file is
collected, so a schema error is a collection error naming file, line and field.

Sizes (``prefix_length``, ``tokens``, ...) are tokens, or a multiple of a tier's capacity:
``"1.5x gpu"`` (GPU blocks × block size) or ``"0.5x cpu"`` (the CPU offload tier), resolved against
the server actually under test. A ``workload`` phase's ``rate`` is req/s, or a multiple of the
workload's capacity, ``"2x capacity"``: twice the throughput the cell's simulator predicts for it on that
server, so that a load meant to saturate does so whatever the machine's speed.
"""
from __future__ import annotations

import itertools
import re
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from blis_sim.defaults import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
from blis_sim.errors import FormatError
from blis_sim.formats._strict import YamlDoc, describe, load_yaml, parse_yaml

if TYPE_CHECKING:
    from blis_sim.routing import RoutingSpec

# pytest imports this module at start-up with the plugin: what a cell runs (the engine, the emulator,
# the scenario schema) is imported inside the functions that use it.

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*x\s*(gpu|cpu)\s*$")
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*x\s*capacity\s*$")
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # no '[', ']' or '::' (docs/design.md §8.1)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Size = Annotated[int | str, Field(description="tokens, or 'Nx gpu' / 'Nx cpu'")]


def check_size(value: int | str) -> int | str:
    if isinstance(value, bool):
        raise ValueError("a size is a token count or 'Nx gpu' / 'Nx cpu'")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"a size must be at least 1 token, got {value}")
        return value
    if not _SIZE_RE.match(value):
        raise ValueError(f"'{value}' is not a size: use a token count or 'Nx gpu' / 'Nx cpu'")
    return value.strip()


Rate = Annotated[float | str, Field(description="req/s, or 'Nx capacity'")]


def check_rate(value: float | str | None) -> float | str | None:
    if value is None:
        return None
    if isinstance(value, str) and _RATE_RE.match(value):
        return value.strip()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    raise ValueError(f"'{value}' is not a rate: use req/s (> 0) or 'Nx capacity'")


def capacity_factor(rate: float | str) -> float | None:
    """N of an ``'Nx capacity'`` rate; None for a rate in req/s."""
    m = _RATE_RE.match(rate) if isinstance(rate, str) else None
    return float(m.group(1)) if m else None


@dataclass(frozen=True)
class Capacity:
    """Token capacity of the tiers of the server under test, for resolving ``Nx gpu`` sizes."""

    gpu_tokens: int
    cpu_tokens: int | None = None

    def resolve(self, size: int | str, what: str = "size") -> int:
        if isinstance(size, int):
            return size
        m = _SIZE_RE.match(size)
        assert m, size  # validated by check_size
        factor, tier = float(m.group(1)), m.group(2)
        if tier == "cpu":
            if not self.cpu_tokens:
                raise FormatError(f"{what} '{size}' needs a CPU offload tier, and the server has none")
            return max(1, int(factor * self.cpu_tokens))
        return max(1, int(factor * self.gpu_tokens))


class ServerSpec(_Strict):
    """What the server must offer. Configures the embedded emulator; checked against a real one."""

    block_size: int = Field(16, ge=1, le=4096)
    num_gpu_blocks: int = Field(2048, ge=1)
    offload: str | None = Field(None, description="offload config: our kv_offload: YAML or vllm serve's "
                                                  "--kv-transfer-config (JSON or YAML), a file relative to the "
                                                  "scenario file, or that JSON itself")
    kv_bytes_per_token: int = Field(4096, ge=1, description="KV bytes per token (sizes the CPU tier's chunks)")
    profile: str = Field("tiny-cpu", description="emulator step-time profile")
    tokenizer: str | None = Field(None, description="the served model's Hugging Face tokenizer (its folder or "
                                                    "tokenizer.json, relative to the scenario file): the embedded "
                                                    "emulator counts and templates as that model; prompts are "
                                                    "built with it")
    metrics_profile: str = "vllm-0.33"
    max_num_seqs: int = Field(DEFAULT_MAX_NUM_SEQS, ge=1)
    max_num_batched_tokens: int = Field(DEFAULT_MAX_NUM_BATCHED_TOKENS, ge=1)
    step_shape: Literal["linear", "roofline"] = Field(
        "linear", description="shape of the latency model fitted on the probe: linear, or roofline "
                              "(base + max(compute, memory), for a server with a compute/memory knee)")
    replicas: int = Field(1, ge=1, le=16, description="a cluster: this many replicas of the server, each with "
                                                      "its own caches (docs/cluster.md §6)")
    routing_policy: str = Field("round-robin", description="how the client routes a cluster's requests: "
                                                           "blis observe's --routing-policy")
    routing_scorers: str = Field("", description="the weighted policy's scorers, name:weight,...")

    @model_validator(mode="after")
    def _routing(self) -> ServerSpec:
        from blis_sim.errors import UsageError
        from blis_sim.routing import RoutingSpec

        try:
            spec = RoutingSpec.parse(self.routing_policy, self.routing_scorers or None)
        except UsageError as exc:
            raise ValueError(str(exc).replace("--routing-policy", "routing_policy")
                             .replace("--routing-scorers", "routing_scorers")) from None
        if spec.policy == "recorded":
            raise ValueError("routing_policy 'recorded' is the replay's; a cluster's client routes with "
                             "round-robin, least-loaded, always-busiest, prefix-affinity or weighted")
        return self

    def routing(self) -> RoutingSpec:
        """The cluster's client-side routing."""
        from blis_sim.routing import RoutingSpec

        return RoutingSpec.parse(self.routing_policy, self.routing_scorers or None)


class SeedPhase(_Strict):
    """Send one request per prefix group, so the groups' prefixes enter the cache."""

    groups: int = Field(4, ge=1, le=10_000)
    prefix_length: Size = 1024
    suffix_length: int = Field(32, ge=1)
    output_length: int = Field(8, ge=1)

    _size = field_validator("prefix_length")(check_size)


class RepeatPhase(_Strict):
    """Send the seeded groups again (new suffixes): the measured phase of a hit cell."""

    rounds: int = Field(1, ge=1, le=1000)
    suffix_length: int = Field(32, ge=1)
    output_length: int = Field(8, ge=1)


class FloodPhase(_Strict):
    """Unique traffic of a given total size, to push earlier content out of a tier."""

    tokens: Size
    request_length: Size = 2048
    output_length: int = Field(1, ge=1)

    _size = field_validator("tokens", "request_length")(check_size)


class UniquePhase(_Strict):
    """Requests that share nothing with anything: the full-miss path."""

    requests: int = Field(4, ge=1, le=100_000)
    prompt_length: Size = 1024
    output_length: int = Field(8, ge=1)

    _size = field_validator("prompt_length")(check_size)


class SessionPhase(_Strict):
    """Multi-turn sessions whose rounds accumulate context (input + output of the previous round)."""

    sessions: int = Field(2, ge=1, le=1000)
    rounds: int = Field(3, ge=2, le=100)
    first_length: Size = 256
    turn_length: int = Field(64, ge=1)
    output_length: int = Field(16, ge=1)

    _size = field_validator("first_length")(check_size)


PHASE_KINDS = ("seed", "repeat", "flood", "unique", "sessions", "workload")


class Phase(_Strict):
    """One step of a scenario's workload. Exactly one kind key; phases run in order, each drained."""

    name: str | None = None
    measure: bool | None = Field(None, description="inside the counter window (default: the last phase)")
    seed: SeedPhase | None = None
    repeat: RepeatPhase | None = None
    flood: FloodPhase | None = None
    unique: UniquePhase | None = None
    sessions: SessionPhase | None = None
    workload: str | None = Field(None, description="a workload spec YAML, relative to the scenario file")
    rate: Rate | None = Field(
        None, description="a workload phase's arrival rate, in place of its spec's aggregate_rate: req/s, or "
                          "'Nx capacity', N times the maximum throughput the cell's simulator (the probe's fit, "
                          "the server's limits) predicts for the workload")

    _rate = field_validator("rate")(check_rate)

    @model_validator(mode="after")
    def _one_kind(self) -> Phase:
        kinds = [k for k in PHASE_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            got = ", ".join(kinds) or "none"
            raise ValueError(f"a phase needs exactly one of {', '.join(PHASE_KINDS)} (got {got})")
        if self.rate is not None and self.workload is None:
            raise ValueError("'rate' sets a workload phase's arrival rate; this phase has no 'workload'")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in PHASE_KINDS if getattr(self, k) is not None)



def _simulator_axis(name: str) -> str:
    """A ``simulator_sweep`` axis: one of blis sweep's axes for a trace, but not ``rate_scale``."""
    from blis_sim.sweep.axes import axis_kind

    if axis_kind(name, base_kind="trace").target == "rate":  # ValueError names an unknown axis
        raise ValueError("'rate_scale' changes the traffic, so the observation no longer applies; "
                         "simulator_sweep varies simulator settings only")
    return name


CachePath = Literal["gpu", "cpu", "storage", "miss", "any"]


class Expect(_Strict):
    """What the cell must show. Tolerances default to the command line's (5 pp, 0.15)."""

    path: CachePath = Field("any", description="the cache path the measured phase must elicit")
    hit_rate_tolerance_pp: float | None = Field(None, ge=0)
    ttft_mape_threshold: float | None = Field(None, ge=0)
    check_ttft: bool = True
    e2e_mape_threshold: float | None = Field(None, ge=0, description="judge E2E MAPE too (None: reported only)")
    saturated: bool = Field(False, description="the measured window must run the server at or past capacity; "
                                               "simulated throughput is then judged against the observed")
    cached_tokens_equal: bool = Field(False, description="every request's cached tokens (the server's "
                                                         "usage.prompt_tokens_details) must equal the simulator's")
    faults: list[Literal["store_failure", "promotion_failure", "promotion_allocation_failure", "warm_start"]] = Field(
        default_factory=list, description="faults the window must show (a fault cell): each must be in the "
                                          "trace header; the hit-rates are then reported, not judged")


class Scenario(_Strict):
    """One calibration cell (before sweep expansion: placeholders may still be present)."""

    description: str = ""
    marks: list[str] = Field(default_factory=list)
    server: ServerSpec = Field(default_factory=ServerSpec)
    sweep: dict[str, list[int | float | str]] = Field(default_factory=dict)
    id: str | None = Field(None, description="item name template, e.g. 'prefix-{prefix_length}'")
    seed: int = 42
    concurrency: int = Field(1, ge=1, le=1024, description="requests in flight at once (1: one by one)")
    phases: list[Phase] = Field(min_length=1)
    expect: Expect = Field(default_factory=Expect)
    simulator_sweep: dict[Annotated[str, AfterValidator(_simulator_axis)], list[Any]] = Field(
        default_factory=dict, description="simulator settings the cell's trace is also replayed with "
                                          "(blis sweep's axes; a grid), each judged like the cell")

    @field_validator("simulator_sweep")
    @classmethod
    def _simulator_axes(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        from blis_sim.sweep.axes import axis_kind

        for axis, values in v.items():
            kind = axis_kind(axis, base_kind="trace")
            if not values:
                raise ValueError(f"simulator_sweep axis '{axis}' has no values")
            for value in values:
                try:
                    kind.read(value)
                except ValueError as exc:
                    raise ValueError(f"simulator_sweep axis '{axis}': {exc}") from None
        return v

    @model_validator(mode="after")
    def _cluster(self) -> Scenario:
        if self.server.replicas > 1 and self.simulator_sweep:
            raise ValueError("simulator_sweep replays one server; a cluster (server.replicas > 1) has none yet")
        return self

    @property
    def sequential(self) -> bool:
        """One request at a time: each sent when the previous has finished (replayed so, and judged against
        the probe's one-at-a-time fit)."""
        return self.concurrency == 1

    def simulator_settings(self) -> list[dict[str, Any]]:
        """Every combination of ``simulator_sweep`` (first axis slowest), values as written."""
        axes = list(self.simulator_sweep)
        return [dict(zip(axes, combo)) for combo in itertools.product(*self.simulator_sweep.values())]

    @field_validator("sweep")
    @classmethod
    def _axes_nonempty(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for axis, values in v.items():
            if not values:
                raise ValueError(f"sweep axis '{axis}' has no values")
            if len(set(map(str, values))) != len(values):
                raise ValueError(f"sweep axis '{axis}' repeats a value")
        return v

    @field_validator("marks")
    @classmethod
    def _mark_names(cls, v: list[str]) -> list[str]:
        for m in v:
            if not m.isidentifier():
                raise ValueError(f"'{m}' is not a valid mark name")
        return v

    def measured(self) -> list[int]:
        """Indices of the phases inside the counter window."""
        explicit = [i for i, p in enumerate(self.phases) if p.measure]
        return explicit or [len(self.phases) - 1]

    def phase_names(self) -> list[str]:
        """Unique phase names: the given name, else the kind (numbered when a kind repeats)."""
        kinds = [p.kind for p in self.phases]
        return [p.name or (f"{p.kind}-{i}" if kinds.count(p.kind) > 1 else p.kind)
                for i, p in enumerate(self.phases)]

    @model_validator(mode="after")
    def _names_unique(self) -> Scenario:
        names = self.phase_names()
        if len(set(names)) != len(names):
            raise ValueError(f"phase names must be unique, got {names}")
        if any(p.kind == "repeat" for p in self.phases) and not any(p.kind == "seed" for p in self.phases):
            raise ValueError("a 'repeat' phase needs a 'seed' phase before it")
        return self


class ScenarioDocument(_Strict):
    """A ``*.blis.yaml`` file's top level (the pytest collector of such a file is ``_collect.ScenarioFile``)."""

    defaults: dict[str, Any] = Field(default_factory=dict)
    scenarios: dict[str, dict[str, Any]] = Field(min_length=1)


@dataclass(frozen=True)
class SweepPoint:
    """A scenario at one point of its sweep: what a test item runs."""

    file: str
    scenario_name: str
    name: str
    values: Mapping[str, Any]
    spec: Scenario
    line: int | None


def _substitute(node: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(node, str):
        whole = _PLACEHOLDER_RE.fullmatch(node)
        if whole and whole.group(1) in values:
            return values[whole.group(1)]
        return _PLACEHOLDER_RE.sub(lambda m: str(values.get(m.group(1), m.group(0))), node)
    if isinstance(node, dict):
        return {k: _substitute(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, values) for v in node]
    return node


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _point_name(template: str | None, values: Mapping[str, Any]) -> str:
    if not values:
        return "default"
    if template:
        return _substitute(template, values) if isinstance(template, str) else str(template)
    return "-".join(f"{k.replace('_', '-')}-{v}" for k, v in values.items())


def _validate_scenario(raw: Mapping[str, Any], doc: YamlDoc, prefix: tuple[str | int, ...]) -> Scenario:
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        err = describe(exc, doc)
        # describe() located the error relative to the scenario; re-anchor it in the file.
        loc = tuple(exc.errors()[0]["loc"])
        raise FormatError(err.reason, file=doc.file, line=doc.line_of(prefix + loc),
                          field=".".join(map(str, prefix + loc))) from None


def load_scenario_file(path: str | Path) -> list[SweepPoint]:
    """Parse, validate and expand a scenario file into sweep points (file order, deterministic)."""
    return expand(load_yaml(path))


def load_scenario_text(text: str, file: str = "<scenario>") -> list[SweepPoint]:
    """:func:`load_scenario_file` for YAML held in a string (user tests building their own cells);
    ``file`` names it in error messages and is the base of relative paths in it."""
    return expand(parse_yaml(textwrap.dedent(text), file))


def expand(doc: YamlDoc) -> list[SweepPoint]:
    """Validate a parsed scenario document and expand it into sweep points."""
    if doc.data is None:
        raise FormatError("file is empty", file=doc.file)
    try:
        top = ScenarioDocument.model_validate(doc.data)
    except ValidationError as exc:
        raise describe(exc, doc) from None
    points: list[SweepPoint] = []
    for name, body in top.scenarios.items():
        prefix: tuple[str | int, ...] = ("scenarios", name)
        if not _NAME_RE.match(name):
            raise FormatError(f"scenario name '{name}' may hold only letters, digits, '_', '.', '-'",
                              file=doc.file, line=doc.line_of(prefix), field=".".join(map(str, prefix)))
        if not isinstance(body, dict):
            raise FormatError("a scenario is a mapping", file=doc.file, line=doc.line_of(prefix),
                              field=".".join(map(str, prefix)))
        raw = _merge(top.defaults, body)
        axes_raw = raw.get("sweep") or {}
        if not isinstance(axes_raw, dict):
            axes_raw = {}  # let the full validation below report the type error with its line
        axes = list(axes_raw)
        seen: set[str] = set()
        for combo in itertools.product(*(axes_raw[a] if isinstance(axes_raw[a], list) else [None]
                                          for a in axes)):
            values = dict(zip(axes, combo))
            spec = _validate_scenario(_substitute(raw, values), doc, prefix)
            point = _point_name(spec.id if not values else raw.get("id"), values)
            if not _NAME_RE.match(point) or point in seen:
                raise FormatError(f"sweep point name '{point}' is invalid or repeated; set 'id'",
                                  file=doc.file, line=doc.line_of(prefix + ("id",)), field=f"scenarios.{name}.id")
            seen.add(point)
            points.append(SweepPoint(doc.file, name, point, values, spec, doc.line_of(prefix)))
    return points


def iter_scenarios(points: list[SweepPoint]) -> Iterator[tuple[str, list[SweepPoint]]]:
    """Group points by scenario, in file order."""
    for name, group in itertools.groupby(points, key=lambda p: p.scenario_name):
        yield name, list(group)
