"""The linear / roofline-fit coefficient file (``--latency-coefficients``, written by ``blis fit``)
and the fit's report: pydantic models, with :func:`load_coefficients` / :func:`dump_coefficients`.

Kept apart from :mod:`blis_sim.engine.latency` (whose names still serve these, PEP 562) so that a
replay on the default model, which needs only the compiled :class:`~blis_sim.engine.latency.StepModel`,
does not build these seven model classes at start-up.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from blis_sim.engine.latency import _DEFAULT_FRONTEND, _DEFAULT_STEP, StepModel, _linear_step_model
from blis_sim.formats._strict import load_yaml, read_text, validate

# defer_build: a schema is built on first validation only (the replay path never validates one)
_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)
_PLAIN = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class StepCoefficients(BaseModel):
    """The linear step-time model, µs."""

    model_config = _STRICT
    base_us: float = Field(ge=0)
    per_prefill_token_us: float = Field(ge=0)
    per_decode_seq_us: float = Field(ge=0)
    per_context_token_us: float = Field(ge=0)
    # prefill attention: per (new token, attended token) pair, Σ t·(cached + (t+1)/2) per chunk —
    # what makes prefill superlinear in the prompt length (0 = off)
    per_prefill_attention_us: float = Field(default=0.0, ge=0)
    # per token of context a prefill chunk reads (its cached prefix and earlier chunks), once per
    # chunk: a prefill's KV read goes another way than a decode's (on vLLM's CPU backend ~2x
    # per token). None: per_context_token_us, as in files written before it.
    per_prefill_context_us: float | None = Field(default=None, ge=0)


class MemoryCoefficients(BaseModel):
    """The memory row of a ``roofline-fit`` model, µs: reading the weights once per step (the floor
    a small step cannot go below) and one token's KV per context token (decode and prefill)."""

    model_config = _STRICT
    weights_us: float = Field(ge=0)
    per_context_token_us: float = Field(default=0.0, ge=0)


class FrontendCoefficients(BaseModel):
    """Time outside the engine core added to TTFT and E2E, µs."""

    model_config = _STRICT
    base_us: float = Field(default=0.0, ge=0)
    per_inflight_us: float = Field(default=0.0, ge=0)
    # one request's admission by the API server (one at a time: a burst queues for it)
    admission_us: float = Field(default=0.0, ge=0)


class CoefficientEstimate(BaseModel):
    """One fitted coefficient with its bootstrap interval, its physics prior and plausible range
    (``None`` without a prior), and whether the data pin it down."""

    model_config = _PLAIN
    name: str
    value: float
    ci_low: float
    ci_high: float
    identified: bool = True
    prior: float | None = None
    plausible_low: float | None = None
    plausible_high: float | None = None


class FitIteration(BaseModel):
    """The fit's objective (in-sample TTFT MAPE + ITL MAPE) of one iterate."""

    model_config = _PLAIN
    iteration: int
    kind: Literal["start", "prior", "iterate", "median", "search"] = "iterate"
    ttft_mape: float
    itl_mape: float
    objective: float
    values: list[float] = Field(default_factory=list)   # the coefficients, in fit-report order


class TraceError(BaseModel):
    """One trace's in-sample error in a fit over several traces."""

    model_config = _PLAIN
    trace: str
    requests: int
    ttft_mape: float
    itl_mape: float


class FitReport(BaseModel):
    """How well a fitted model reproduces the trace it was fitted on (written by ``blis fit``),
    how the fit converged, and how far its coefficients can be trusted."""

    model_config = _PLAIN
    trace: str
    requests: int
    iterations: int
    ttft_mape: float
    itl_mape: float
    ttft_rmse_us: float
    itl_rmse_us: float
    start: str = ""                  # where the iteration started (a file, or "default")
    prior: str = ""                  # the physics prior the fit was regularised toward, or "none: why"
    best_iteration: int = 0          # index in ``convergence`` of the coefficients returned
    convergence: list[FitIteration] = Field(default_factory=list)
    condition_number: float | None = None   # of the column-scaled weighted design matrix
    coefficients: list[CoefficientEstimate] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    traces: list[TraceError] | None = None   # each trace's error, when fitted on several

    def intervals(self) -> str:
        """``name value [low, high]`` of every coefficient, ``?`` marking the unidentified."""
        return ", ".join(f"{c.name.removeprefix('step.')} {c.value:.4g} [{c.ci_low:.4g}, "
                         f"{c.ci_high:.4g}]{'' if c.identified else '?'}" for c in self.coefficients)

    def summary(self, max_warnings: int = 3) -> str:
        """One compact paragraph (what a cell failing on TTFT shows): the fit's own error, its
        prior, the coefficients' 90 % intervals and its first warnings."""
        head = (f"latency fit on {self.trace or 'a trace'}: TTFT MAPE {self.ttft_mape:.1%}, ITL "
                f"MAPE {self.itl_mape:.1%}, prior {self.prior or 'none'}")
        parts = [head]
        if self.coefficients:
            parts.append("90 % intervals: " + self.intervals())
        parts += self.warnings[:max_warnings]
        if len(self.warnings) > max_warnings:
            parts.append(f"(+{len(self.warnings) - max_warnings} more warnings)")
        return "; ".join(parts)

    def text(self) -> str:
        """The report as ``blis fit`` prints it on stderr."""
        lines = [(f"blis fit: {self.trace}: {self.requests} requests, start {self.start or '?'}, "
                  f"prior {self.prior or 'none'}")]
        for t in self.traces or ():
            lines.append(f"  trace {t.trace}: {t.requests} requests, TTFT MAPE {t.ttft_mape:.2%}, "
                         f"ITL MAPE {t.itl_mape:.2%}")
        for it in self.convergence:
            mark = "  <- returned" if it.iteration == self.best_iteration else ""
            lines.append(f"  {it.kind:7s} {it.iteration:2d}: objective {it.objective:.4f} (TTFT "
                         f"MAPE {it.ttft_mape:.2%}, ITL MAPE {it.itl_mape:.2%}){mark}")
        if self.condition_number is not None:
            lines.append(f"  design condition number {self.condition_number:.3g}")
        for c in self.coefficients:
            prior = f", prior {c.prior:.4g}" if c.prior is not None else ""
            flag = "" if c.identified else "  NOT IDENTIFIED"
            lines.append(f"  {c.name:28s} {c.value:12.6g}  90% [{c.ci_low:.6g}, {c.ci_high:.6g}]"
                         f"{prior}{flag}")
        lines += [f"blis fit: warning: {w}" for w in self.warnings]
        return "\n".join(lines)


class LatencyCoefficients(BaseModel):
    """A coefficient file: ``model: linear`` (``step:``), or ``model: roofline-fit`` (``step:`` the
    compute row, ``memory:`` the memory row: step = base + max(compute terms, memory terms)),
    ``frontend:``, and ``fit:`` if fitted."""

    model_config = _PLAIN
    model: Literal["linear", "roofline-fit"] = "linear"
    step: StepCoefficients
    memory: MemoryCoefficients | None = None
    frontend: FrontendCoefficients = Field(default_factory=FrontendCoefficients)
    fit: FitReport | None = None

    @model_validator(mode="after")
    def _memory_matches_model(self) -> LatencyCoefficients:
        if self.model == "roofline-fit" and self.memory is None:
            raise ValueError("model roofline-fit needs a memory: row (weights_us, per_context_token_us)")
        if self.model == "linear" and self.memory is not None:
            raise ValueError("a memory: row needs model: roofline-fit (a linear model has one row)")
        return self

    def to_step_model(self) -> StepModel:
        return _linear_step_model(self.step.model_dump(), self.frontend.base_us,
                                  self.frontend.per_inflight_us,
                                  self.memory.model_dump() if self.memory is not None else None,
                                  frontend_admission_us=self.frontend.admission_us)


#: The default coefficients (:data:`blis_sim.engine.latency._DEFAULT_STEP` / ``_DEFAULT_FRONTEND``) as
#: the model, built on first use; :func:`blis_sim.engine.latency.default_step_model` is the same
#: model's StepModel without it.
def __getattr__(name: str) -> Any:
    if name == "DEFAULT_COEFFICIENTS":
        value = LatencyCoefficients(step=StepCoefficients(**_DEFAULT_STEP),
                                    frontend=FrontendCoefficients(**_DEFAULT_FRONTEND))
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_coefficients(path: str | Path) -> LatencyCoefficients:
    """Read a coefficient file (YAML, or JSON by its ``.json`` suffix); errors name file/line/field."""
    p = Path(path)
    if p.suffix.lower() == ".json":
        from blis_sim.formats._json import located, parse_json

        text = read_text(p)
        try:
            return LatencyCoefficients.model_validate(parse_json(text, str(p)))
        except ValidationError as exc:
            raise located(exc, (), text, str(p)) from None
    return validate(LatencyCoefficients, load_yaml(p))


def dump_coefficients(coeffs: LatencyCoefficients, path: str | Path) -> None:
    """Write a coefficient file; JSON if the suffix is ``.json``, YAML otherwise."""
    import yaml

    p = Path(path)
    data = coeffs.model_dump(exclude_none=True)
    text = json.dumps(data, indent=2) + "\n" if p.suffix.lower() == ".json" else \
        yaml.safe_dump(data, sort_keys=False)
    p.write_text(text)
