"""What ``blis fit`` checks about its own answer: which coefficients the data pin down (and what data
would pin down the others), which leave the physics prior's plausible range, and whether the trace
was saturated (its TTFT is then queueing, and the step coefficients absorb it)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from blis_sim.engine.coefficients import CoefficientEstimate
from blis_sim.engine.fit_solve import Design
from blis_sim.engine.prior import COEFFICIENT_NAMES, PhysicsPrior

#: A column the other columns explain to R² > 1 − 1/VIF_LIMIT is not identified.
VIF_LIMIT = 200.0
#: ... nor one whose bootstrap interval is wider than this fraction of its scale (the prior when
#: there is one, else the value).
CI_LIMIT = 1.0
#: ... where a coefficient without a prior is measured against the value that would move the
#: average prediction by this fraction, when it is smaller than that (a coefficient near 0).
NOTICEABLE = 0.01


#: design columns, in the fitted vector's order
_FRONTEND_BASE = COEFFICIENT_NAMES.index("frontend.base_us")
_ADMISSION = COEFFICIENT_NAMES.index("frontend.admission_us")


def short_name(name: str) -> str:
    """``per_prefill_token_us`` for a step coefficient, ``frontend.base_us`` for the frontend's."""
    return name.removeprefix("step.")


def _span(values: np.ndarray) -> tuple[int, int]:
    v = values[np.isfinite(values)]
    return (int(v.min()), int(v.max())) if v.size else (0, 0)


def _hints(design: Design, table: Any, steps: np.ndarray | None, load: np.ndarray) -> list[str]:
    """For each coefficient, the data that would pin it down (in COEFFICIENT_NAMES order)."""
    rows = np.unique(design.request)
    lo, hi = _span(table.prompt_len[rows].astype(np.float64))
    feats = steps if steps is not None and steps.size else np.zeros((1, 6))
    max_decode = int(feats[:, 2].max())
    ctx = np.where(feats[:, 2] > 0, feats[:, 3] / np.maximum(feats[:, 2], 1), np.nan)
    c_lo, c_hi = _span(ctx)
    s_lo, s_hi = _span(feats[:, 1] + feats[:, 2])
    l_lo, l_hi = _span(load[rows])
    ttft_rows = design.x[:, _FRONTEND_BASE] > 0  # the frontend base column is 1 on TTFT rows
    w_lo, w_hi = _span(np.round(design.x[ttft_rows, 0])) if ttft_rows.any() else (0, 0)
    _, q_hi = _span(design.x[ttft_rows, _ADMISSION]) if ttft_rows.any() else (0, 0)  # queue places
    prompts = (f"prompts span {lo}-{hi} tokens; add prompts from {min(256, lo)} to "
               f"{4 * max(hi, 1)} tokens")
    decode = (f"decode batches never exceeded {max_decode}; add concurrent requests"
              if max_decode <= 1 else
              f"decode batches span 1-{max_decode}; add load levels so they vary more")
    return [(f"steps computed {s_lo}-{s_hi} tokens; add light load (one request at a time) "
             "next to heavy"), prompts, decode,
            f"decode contexts span {c_lo}-{c_hi} tokens; add longer prompts and outputs", prompts,
            ("prefills read little cached context; add repeated prefixes with new suffixes, and "
             "prompts longer than max_num_batched_tokens"),
            f"TTFTs span {w_lo}-{w_hi} steps; add load so requests queue through more steps",
            f"requests in flight at send span {l_lo}-{l_hi}; add sparse and bursty arrivals",
            (f"at most {q_hi + 1} request(s) queued for admission at once; add bursts (many "
             "requests sent at once) next to spread-out arrivals"),
            (f"steps computed {s_lo}-{s_hi} tokens; add steps on both sides of the compute/memory "
             "knee (single decodes and long prefills)"),
            f"decode contexts span {c_lo}-{c_hi} tokens; add small decode batches with long prompts"]


def estimates(coef: np.ndarray, center: np.ndarray, samples: np.ndarray, vif: np.ndarray,
              design: Design, prior: PhysicsPrior | None, table: Any, steps: np.ndarray | None,
              load: np.ndarray, names: tuple[str, ...] = COEFFICIENT_NAMES,
              zero_when_unused: frozenset[str] = frozenset(),
              bounds: tuple[np.ndarray, np.ndarray] | None = None
              ) -> tuple[list[CoefficientEstimate], list[str]]:
    """Each coefficient with its 90 % bootstrap interval, prior and plausible range, and the
    warnings: every coefficient the data cannot pin down (with what would), every implausible one.
    ``zero_when_unused``: coefficients whose column is empty only because their value is 0 (the
    admission time: at 0 no request queues, though the sends come in bursts that would at 1 ms),
    which the data put at 0 rather than never exercise. ``bounds``: the fit's (low, high); a
    value on a bound other than 0 is warned: the data pull it past what the prior allows, so the
    model is missing something or the trace is not what the prior's device does."""
    # the bootstrap's spread around the solve at this schedule (``center``), carried over to the
    # value returned (an iterate, or the median of iterates, solved at a neighbouring schedule)
    if samples.shape[0]:
        q5, q95 = np.percentile(samples, [5.0, 95.0], axis=0)
    else:  # no resamples asked for: no interval
        q5 = q95 = center
    low = np.maximum(np.minimum(coef + q5 - center, coef), 0.0)
    high = np.maximum(coef + q95 - center, coef)
    hints = _hints(design, table, steps, load)
    # a value small enough to move the predictions by < 1 % on average is "about 0", and an
    # interval around 0 no wider than that pins the coefficient down as negligible
    effect = np.mean(np.abs(design.x * design.w[:, None]), axis=0)
    noticeable = np.where(effect > 0, NOTICEABLE / np.where(effect > 0, effect, 1.0), np.inf)
    used = design.used
    out: list[CoefficientEstimate] = []
    warnings: list[str] = []
    for j, name in enumerate(names):
        p = prior.values[j] if prior is not None else None
        scale = p if p else max(abs(float(coef[j])), float(noticeable[j]))
        width = float(high[j] - low[j]) / scale
        measured_zero = name in zero_when_unused and coef[j] == 0.0
        why = ("" if not used[j] and measured_zero else
               "the data never exercise it" if not used[j] else
               f"collinear with the others (VIF {vif[j]:.3g})" if vif[j] > VIF_LIMIT else
               f"90 % interval {low[j]:.4g}-{high[j]:.4g} is wider than its scale"
               if width > CI_LIMIT else "")
        short = short_name(name)
        if why:
            fallback = (f"; its prior ({p:.4g}) settles what the data leave open" if p else
                        "; the file leaves it unset: a prefill's read is priced as a decode's"
                        if name == "step.per_prefill_context_us" and not used[j] else "")
            warnings.append(f"{short} not identified ({why}): {hints[j]}{fallback}")
        plo = prior.low[j] if prior is not None else None
        phi = prior.high[j] if prior is not None else None
        if plo is not None and phi is not None and not plo <= coef[j] <= phi:
            warnings.append(f"{short} = {coef[j]:.4g} is implausible: the prior "
                            f"({prior.source if prior else ''}) allows {plo:.4g}-{phi:.4g}")
        if bounds is not None and used[j]:
            for side, edge in (("lower", bounds[0][j]), ("upper", bounds[1][j])):
                if edge and np.isfinite(edge) and abs(coef[j] - edge) <= 1e-9 * abs(edge):
                    warnings.append(f"{short} = {coef[j]:.4g} is held at the {side} bound of its "
                                    f"plausible range ({bounds[0][j]:.4g}-{bounds[1][j]:.4g}): the "
                                    "data pull it further, so the model lacks a term this trace "
                                    "needs, or the prior is not this server's")
        out.append(CoefficientEstimate(name=name, value=float(coef[j]), ci_low=float(low[j]),
                                       ci_high=float(high[j]), identified=not why, prior=p,
                                       plausible_low=plo, plausible_high=phi))
    return out, warnings


def saturation(records: Sequence[Any], phases: list[str] | None = None) -> str | None:
    """A warning when the fitted requests (``ok`` records with a first token and a last chunk)
    show calibrate's saturation signs (:func:`blis_sim.calibrate.capacity.window_signs`: a
    backlog at the last send, sends that lag their schedule, or waiting that dominates TTFT):
    one rule for the verdict and the fit. Not for a probe trace (``blis probe``'s phases): its
    phases are drained one after the other (its TTFT grows with its prompt lengths, not with a
    queue), and its ramp saturates the server by design (its top levels measure the maximum
    throughput)."""
    from blis_sim.calibrate.capacity import window_signs
    from blis_sim.probe.plan import is_probe_trace

    if phases is not None and is_probe_trace(phases):
        return None
    seen = window_signs(records)
    if not seen.signs:
        return None
    said = {"backlog": f"{seen.backlog} of {seen.requests} requests still waited for a first token "
                       "at the last send",
            "sends lag": f"the last sends left {seen.send_lag_us / 1e6:.1f} s behind their schedule",
            "waiting": f"the median request waited {seen.waiting_share:.0%} of its TTFT"}
    return (f"the trace looks saturated ({'; '.join(f'{s}: {said[s]}' for s in seen.signs)}): "
            "queueing dominates its TTFT, so the step coefficients absorb it and the model is of "
            "this queue, not of the server: fit on a trace below capacity, or beside one")
