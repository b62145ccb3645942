"""The search stage of ``blis fit``: minimise the objective the fit reports (the replay's per-request
relative TTFT and ITL errors) directly, over replays, from the best start.

The regression (:mod:`blis_sim.engine.fitting`'s fixed point) solves each schedule's rows with the
schedule held fixed: it cannot see that a slower step makes a queue longer, so on a trace whose TTFT
is queueing it settles where its own replay is far off (the issue-27 traces: 27-80 % in-sample).
Here every candidate is replayed, and scipy's ``least_squares`` (trust-region reflective, bounded by
the physics prior's plausible range) moves the coefficients on a finite-difference Jacobian of the
replayed residuals. The loss is soft-L1 on each request's *relative* error (:func:`robust`): beyond
``F_SCALE`` an error counts linearly, as in the MAPE the fit reports, so that the requests of a
standing queue (off by 30-50 % while the model is still far) do not outweigh the rest as their
squares would. The difference step is large (``DIFF_STEP`` of each coefficient): a replay is
piecewise constant in the small, so a tiny step sees no slope.

``search(evaluate, x0, low, high, free, budget, typical)`` calls ``evaluate(coef)`` (the residuals,
already robust: :func:`robust` of the replay's, then the prior's rows) at most ``budget`` times (the
Jacobian's replays counted: scipy does not count them) and returns how many it made: the caller
keeps every evaluation and returns the best by the objective, so the answer is never worse than any
start.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: relative finite-difference step of each coefficient (of its scale, ``max(|x|, typical)``)
DIFF_STEP = 0.05
#: soft-L1 scale of a relative error: errors beyond it count linearly (≈ the MAPE the fit reports)
F_SCALE = 0.10


def robust(errors: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Residuals whose squares sum to ``Σ wᵢ·ρ(eᵢ)``, ρ the soft-L1 loss of scale ``F_SCALE`` on each
    relative error ``eᵢ`` (``2f²(√(1 + (e/f)²) − 1)``: ``e²`` when small, ``2f·|e|`` when large).
    The loss is applied here, not by ``least_squares(loss=...)``, whose scale would apply to the
    weighted residuals: with each request weighted 1/√(its trace's count), a 10 % error of a
    300-request trace is 0.6 % there, so every error counted quadratically."""
    f = F_SCALE
    rho = 2.0 * f * f * (np.sqrt(1.0 + (errors / f) ** 2) - 1.0)
    return np.sign(errors) * np.sqrt(weights * rho)


class _Spent(Exception):
    """The evaluation budget is used up."""


def search(evaluate: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, low: np.ndarray,
           high: np.ndarray, free: np.ndarray, budget: int, typical: np.ndarray) -> int:
    """Minimise ``Σ evaluate(coef)²`` over the ``free`` coefficients within ``[low, high]``,
    from ``x0``; ``typical``: a coefficient's magnitude when it starts at 0 (its prior, else 1).
    Returns the evaluations made."""
    from scipy.optimize import least_squares

    x0 = np.clip(np.asarray(x0, dtype=np.float64), low, high)
    # only coefficients with room to move: least_squares needs lower < upper
    idx = np.flatnonzero(free & (high > low))
    if budget <= 0 or idx.size == 0:
        return 0
    scale = np.where(np.abs(x0[idx]) > 0, np.abs(x0[idx]), np.maximum(typical[idx], 1e-12))
    lo, hi = low[idx] / scale, high[idx] / scale
    z0 = np.clip(x0[idx] / scale, lo, hi)
    calls = 0

    def residuals(z: np.ndarray) -> np.ndarray:
        nonlocal calls
        if calls >= budget:
            raise _Spent
        calls += 1
        coef = x0.copy()
        coef[idx] = np.clip(z, lo, hi) * scale
        return evaluate(coef)

    try:
        least_squares(residuals, z0, bounds=(lo, hi), method="trf", loss="linear",
                      diff_step=DIFF_STEP, x_scale=1.0, max_nfev=budget,
                      xtol=1e-4, ftol=1e-6, gtol=1e-8)
    except _Spent:
        pass
    return calls
