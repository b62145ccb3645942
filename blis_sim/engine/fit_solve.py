"""The linear solve of ``blis fit`` at one schedule, and what it says about itself.

* :func:`solve`: bounded (every coefficient within ``bounds``: the prior's plausible range, else
  ≥ 0; :func:`blis_sim.engine.prior.fit_bounds`), robust least squares with scipy. The data
  alone are solved by ``least_squares`` with a soft-L1 loss (started from ``lsq_linear``'s L2
  answer); its loss weights set each row's weight (outliers count little), normalised to mean 1;
  the weighted rows plus the prior rows ``λ·(w_i − prior_i)/prior_i``, ``λ = strength·√rows``,
  are solved by ``lsq_linear`` (a coefficient pinned by the data barely moves; one the data
  cannot see takes its physical value).
* :func:`bootstrap`: the same solve (as ``lsq_linear`` on the robust weights of the final solve)
  over requests resampled with replacement: seeded, deterministic; percentile intervals.
* :func:`collinearity`: condition number of the column-scaled design and each column's variance
  inflation factor.

scipy is imported here only, so ``blis replay`` never pays for it.

* :func:`one_blas_thread`: ``fit``'s linear algebra runs on one BLAS thread (threadpoolctl).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import numpy as np

from blis_sim.engine.prior import PhysicsPrior

_P = ParamSpec("_P")
_R = TypeVar("_R")


def one_blas_thread(f: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``f`` with BLAS (OpenBLAS, MKL) on one thread. The fit's matrices are tall and thin
    (a row per request, ~11 columns), where BLAS threads cost more than they save, and on a
    loaded host far more: an SVD of 20,000 × 11 took 23 ms on two threads of a quiet 2-core host
    and 3 ms on one, and a 10,000-request fit 39-61 s at load 3.5 against 5.5 s on one thread."""

    @functools.wraps(f)
    def limited(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1, user_api="blas"):
            return f(*args, **kwargs)

    return limited


#: Bounds of the soft-L1 scale of the data rows' relative residuals. The scale is the robust
#: spread (1.4826 × median absolute residual) of the L2 start: residuals beyond it count
#: linearly, so a request that lands on the other side of a step boundary in this schedule (off
#: by a whole step: it says nothing about the model) cannot pull the answer.
SCALE_BOUNDS = (1e-4, 0.05)


@dataclass(frozen=True)
class Design:
    """The least-squares rows at one schedule: features, target, weight (1/observed) and the
    request each row came from (TTFT and ITL rows of a request share it)."""

    x: np.ndarray
    y: np.ndarray
    w: np.ndarray
    request: np.ndarray

    @property
    def used(self) -> np.ndarray:
        """Columns the data touch (an all-zero column has nothing to fit)."""
        return np.any(self.x != 0, axis=0)


@dataclass(frozen=True)
class Solution:
    coef: np.ndarray
    row_weight: np.ndarray   # the robust loss's final weight of each data row (1 = inlier)


#: (low, high) per coefficient; None: every coefficient ≥ 0
Bounds = tuple[np.ndarray, np.ndarray]


def _bounds(design: Design, bounds: Bounds | None) -> Bounds:
    n = design.x.shape[1]
    if bounds is None:
        return np.zeros(n), np.full(n, np.inf)
    return np.asarray(bounds[0], dtype=np.float64), np.asarray(bounds[1], dtype=np.float64)


def _fixed_values(design: Design, prior: PhysicsPrior | None, bounds: Bounds | None = None
                  ) -> np.ndarray:
    """Values of the columns the data never touch: the prior's, else 0 (within the bounds)."""
    out = np.zeros(design.x.shape[1])
    if prior is not None:
        out = np.array([v or 0.0 for v in prior.values])
    lo, hi = _bounds(design, bounds)
    return np.where(design.used, 0.0, np.clip(out, lo, hi))


def _prior_rows(prior: PhysicsPrior | None, free: np.ndarray, scale: np.ndarray, lam: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """Rows λ·(z_j/s_j − p_j)/p_j over the free (scaled) variables z."""
    rows, target = [], []
    if prior is not None:
        for k, j in enumerate(np.flatnonzero(free)):
            p = prior.values[j]
            if p:
                r = np.zeros(free.sum())
                r[k] = lam / (p * scale[k])
                rows.append(r)
                target.append(lam)
    n = int(free.sum())
    return (np.array(rows).reshape(-1, n), np.array(target, dtype=np.float64))


def _scaled(design: Design, free: np.ndarray, sel: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, y, w = design.x, design.y, design.w
    if sel is not None:
        x, y, w = x[sel], y[sel], w[sel]
    a = x[:, free] * w[:, None]
    scale = np.linalg.norm(design.x[:, free] * design.w[:, None], axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    return a / scale, y * w, scale


def _robust_row_weights(a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray
                        ) -> np.ndarray:
    """Each data row's weight (√ of the soft-L1 loss's IRLS weight, normalised to mean-square 1)
    at scipy's robust solution of the data alone. Normalised, the weighted rows weigh as much in
    total as the unweighted ones, so the prior's λ means the same whatever the residual scale."""
    from scipy.optimize import least_squares, lsq_linear

    # bvls may land a hair below a bound (-1e-17), which least_squares refuses as a start
    z0 = np.clip(lsq_linear(a, b, bounds=(lo, hi), method="bvls").x, lo, hi)
    f = float(np.clip(1.4826 * np.median(np.abs(a @ z0 - b)), *SCALE_BOUNDS))
    res = least_squares(lambda z: a @ z - b, z0, jac=lambda z: a, bounds=(lo, hi),
                        loss="soft_l1", f_scale=f, method="trf", x_scale=1.0, ftol=1e-12,
                        xtol=1e-12, gtol=1e-12, max_nfev=500)
    r = (a @ res.x - b) / f
    omega = 1.0 / np.sqrt(1.0 + r * r)   # soft-L1's ρ'(r²): 1 for an inlier, ~f/|r| beyond
    return np.sqrt(omega / np.mean(omega))


def _scaled_bounds(design: Design, bounds: Bounds | None, free: np.ndarray, scale: np.ndarray
                   ) -> Bounds:
    lo, hi = _bounds(design, bounds)
    return lo[free] * scale, hi[free] * scale


def solve(design: Design, prior: PhysicsPrior | None, strength: float,
          bounds: Bounds | None = None) -> Solution:
    from scipy.optimize import lsq_linear

    free = design.used
    coef = _fixed_values(design, prior, bounds)
    if not free.any():
        return Solution(coef, np.ones(design.y.size))
    a, b, scale = _scaled(design, free)
    lo, hi = _scaled_bounds(design, bounds, free, scale)
    weight = _robust_row_weights(a, b, lo, hi)
    pa, pb = _prior_rows(prior, free, scale, strength * np.sqrt(a.shape[0]))
    z = lsq_linear(np.vstack([a * weight[:, None], pa]), np.concatenate([b * weight, pb]),
                   bounds=(lo, hi), method="bvls").x
    coef[free] = np.clip(z, lo, hi) / scale
    return Solution(coef, weight)


def bootstrap(design: Design, prior: PhysicsPrior | None, strength: float,
              row_weight: np.ndarray, resamples: int, seed: int,
              bounds: Bounds | None = None) -> np.ndarray:
    """(resamples, n_coef) coefficients, each solved on requests drawn with replacement."""
    from scipy.optimize import lsq_linear

    free = design.used
    base = _fixed_values(design, prior, bounds)
    out = np.tile(base, (resamples, 1))
    if not free.any() or resamples <= 0:
        return out
    a, b, scale = _scaled(design, free)
    lo, hi = _scaled_bounds(design, bounds, free, scale)
    a, b = a * row_weight[:, None], b * row_weight
    lam = strength * np.sqrt(a.shape[0])
    pa, pb = _prior_rows(prior, free, scale, lam)
    requests, rows_of = np.unique(design.request, return_inverse=True)
    order = np.argsort(rows_of, kind="stable")
    starts = np.searchsorted(rows_of[order], np.arange(requests.size + 1))
    rng = np.random.default_rng(seed)
    for k in range(resamples):
        pick = rng.integers(0, requests.size, requests.size)
        counts = np.bincount(pick, minlength=requests.size)
        mult = np.repeat(counts, np.diff(starts))  # rows in `order`, each request's count
        sel = order[np.repeat(np.arange(order.size), mult)]
        sa, sb = np.vstack([a[sel], pa]), np.concatenate([b[sel], pb])
        out[k, free] = np.clip(lsq_linear(sa, sb, bounds=(lo, hi), method="bvls").x,
                               lo, hi) / scale
    return out


def collinearity(design: Design) -> tuple[float, np.ndarray]:
    """(condition number, VIF per column; inf where unused or exactly dependent) of the weighted
    design with unit-norm columns. VIF_j = [(AᵀA)⁻¹]_jj of that matrix: 1 for a column orthogonal
    to the others, 1/(1 − R²) when the others explain a fraction R² of it."""
    free = design.used
    vif = np.full(design.x.shape[1], np.inf)
    if not free.any():
        return float("inf"), vif
    a, _, _ = _scaled(design, free)
    cond = float(np.linalg.cond(a))
    gram = a.T @ a
    try:
        inv = np.linalg.inv(gram)
        vif[free] = np.where(np.diag(inv) > 0, np.diag(inv), np.inf)
    except np.linalg.LinAlgError:
        pass
    return cond, vif
