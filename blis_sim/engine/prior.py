"""The physics prior of ``blis fit``: what the roofline says each linear coefficient should be for a
model on a piece of hardware, and the range outside of which a fitted value is implausible.

``physics_prior(geom, hw, tp, source)`` → :class:`PhysicsPrior`; ``resolve_prior(...)`` picks the
model (``--model-config``, else a bundled ``--model``, else the trace header's ``server.model`` if
bundled) and needs the hardware stated explicitly: a prior for the wrong device (an H100 prior on a
CPU trace) would pull unidentified coefficients to wrong values, so no hardware means no prior.

Prior of each coefficient (docs/engine.md, "The fit", its physics prior), from :func:`roofline_terms`:
``base`` = reading every weight once; ``per_prefill_token`` = one token through the linear layers
(plus its KV write); ``per_decode_seq`` = one decode token through the linear layers and the LM
head; ``per_context_token`` and ``per_prefill_context`` = reading one token's KV; ``per_prefill_attention`` =
one attention pair. The frontend has no physics: it gets no prior, only a heuristic plausible range.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blis_sim.engine.latency import Hardware, ModelGeometry, get_hardware, roofline_terms

#: The fitted vector's order (also the names in the fit report).
COEFFICIENT_NAMES = ("step.base_us", "step.per_prefill_token_us", "step.per_decode_seq_us",
                     "step.per_context_token_us", "step.per_prefill_attention_us",
                     "step.per_prefill_context_us", "frontend.base_us", "frontend.per_inflight_us",
                     "frontend.admission_us")
#: The two-row (``roofline-fit``) model's vector: the linear one's, then the memory row.
ROOFLINE_FIT_NAMES = COEFFICIENT_NAMES + ("memory.weights_us", "memory.per_context_token_us")
#: Step shapes ``blis fit`` can fit, and the coefficient names of each.
SHAPE_NAMES = {"linear": COEFFICIENT_NAMES, "roofline": ROOFLINE_FIT_NAMES}
#: A fitted step coefficient further than this factor from its prior is implausible.
PLAUSIBLE_FACTOR = 8.0
#: Coefficients whose true marginal cost can be ~0: a small decode batch is memory bound on the
#: weights, so one more decode sequence, or one more context token, may cost almost nothing.
MAY_BE_ZERO = frozenset({"step.per_decode_seq_us", "step.per_context_token_us",
                         "step.per_prefill_context_us", "memory.per_context_token_us"})
#: Heuristic ranges of the frontend terms, µs (API server, tokenisation, streaming): no physics.
FRONTEND_RANGE = {"frontend.base_us": (0.0, 100_000.0), "frontend.per_inflight_us": (0.0, 2_000.0),
                  "frontend.admission_us": (0.0, 20_000.0)}
#: The two-row model's per-step overhead (outside the max: launch, scheduling, sampling) has no
#: roofline either; a range only, µs.
OVERHEAD_RANGE = (0.0, 20_000.0)


@dataclass(frozen=True)
class PhysicsPrior:
    """Per coefficient (``COEFFICIENT_NAMES`` order): prior value (``None`` = no prior) and
    plausible range; ``source`` says which model and hardware it came from."""

    source: str
    values: tuple[float | None, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    names: tuple[str, ...] = COEFFICIENT_NAMES


def physics_prior(geom: ModelGeometry, hw: Hardware, tp: int = 1, source: str = "",
                  shape: str = "linear") -> PhysicsPrior:
    """The prior of the ``linear`` model's coefficients, or of the two-row ``roofline`` shape's:
    there the compute row is the roofline's compute (the decode context's cost is its attention
    pairs) and the memory row its weight read and KV read; the per-step base has no prior."""
    t = roofline_terms(geom, hw, tp)
    values: list[float | None]
    if shape == "linear":
        values = [t.weights_us, t.prefill_token_us + t.kv_token_us, t.decode_seq_us,
                  t.kv_token_us, t.attention_pair_us, t.kv_token_us, None, None, None]
    else:
        values = [None, t.prefill_token_us, t.decode_seq_us, t.attention_pair_us,
                  t.attention_pair_us, t.attention_pair_us, None, None, None, t.weights_us,
                  t.kv_token_us]
    names = SHAPE_NAMES[shape]
    low, high = [], []
    for name, v in zip(names, values):
        if v is None:
            lo, hi = FRONTEND_RANGE.get(name, OVERHEAD_RANGE)
        else:
            lo, hi = (0.0 if name in MAY_BE_ZERO else v / PLAUSIBLE_FACTOR), v * PLAUSIBLE_FACTOR
        low.append(lo)
        high.append(hi)
    return PhysicsPrior(source=source or f"roofline {hw.name} tp{tp}", values=tuple(values),
                        low=tuple(low), high=tuple(high), names=names)


def resolve_prior(*, model: str = "", model_config: str | Path | None = None,
                  hardware: str | None = None, tp: int = 1, header: Any = None,
                  shape: str = "linear") -> tuple[PhysicsPrior | None, str]:
    """(prior, description): the prior from the flags or the trace header, or ``None`` and why."""
    from blis_sim.engine.models import KNOWN_MODELS, geometry_for

    geom = geometry_for(model, model_config)
    label = str(model_config) if model_config is not None else model
    if geom is None and header is not None and header.server is not None:
        name = header.server.model.lower()
        if name in KNOWN_MODELS:
            geom, label = KNOWN_MODELS[name], f"{name} (trace header)"
    if geom is None:
        return None, ("none: no model geometry (give --model-config config.json or a bundled "
                      "--model, with --hardware)")
    if not hardware:
        return None, f"none: no --hardware given for {label} (the roofline prior needs the device)"
    hw = get_hardware(hardware)
    source = f"roofline {label} on {hw.name} tp{tp}"
    return physics_prior(geom, hw, tp, source, shape), source


def fit_bounds(names: tuple[str, ...], prior: PhysicsPrior | None) -> tuple[tuple[float, ...],
                                                                             tuple[float, ...]]:
    """(low, high) of each coefficient the fit may return: the prior's plausible range, else ≥ 0
    for a step coefficient and the frontend's heuristic range. A value outside is not an answer to
    report with a warning (a 106 ms admission time fitted to a saturated trace predicted the next
    one at 64,000 %): the optimizer is bounded by it."""
    if prior is not None:
        return prior.low, prior.high
    low = tuple(FRONTEND_RANGE.get(n, (0.0, 0.0))[0] for n in names)
    high = tuple(FRONTEND_RANGE.get(n, (0.0, float("inf")))[1] for n in names)
    return low, high
