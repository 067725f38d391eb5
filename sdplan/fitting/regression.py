"""Bounded, robust linear least squares: the numerical tools the calibration fits share.

:mod:`sdplan.fitting.fit` fits latencies that are linear in non-negative coefficients
on *relative* errors. The tools here are independent of what is fitted:

* :func:`column_scale` and :func:`nonnegative_solve`: a bounded least squares
  (BVLS) in scaled units, with a faint ridge (:data:`RIDGE`) that settles the
  directions the data leave free;
* :func:`huber_weights`: Huber reweighting of relative residuals scaled by
  their median absolute deviation (``docs/model.md#huber-reweighting``);
* :func:`sandwich_covariance`: the heteroscedasticity-consistent (HC1)
  covariance of the estimate (``docs/model.md#fitting``);
* :func:`identified_parameters`: which coefficients the design determines.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Huber constant (in robust standard deviations) of the reweighting: 1.345, 95% efficiency under Gaussian
#: noise; 3 predicted independent served runs no better (benchmarks/RESULTS-accuracy-runs-2026-11.md,
#: docs/model.md#huber-reweighting).
HUBER_K = 1.345
#: Weight of the faint ridge that settles the fit's unidentified directions (relative to one run's residual).
RIDGE = 1e-9


def column_scale(design: Any) -> Any:
    """Each column's largest magnitude (1 for an empty column): the solvers' units."""
    scale = np.abs(design).max(axis=0)
    scale[scale == 0] = 1.0
    return scale


def identified_parameters(design: Any, tolerance: float = 1e-7) -> list[bool]:
    """Which coefficients the design determines: ``e_j`` lies in the row space of ``X``.

    A coefficient outside the row space can move without changing any fitted
    value (e.g. ``c1v`` against ``c1d`` with one draft length): its value is
    an artefact of the solver and must not be used to extrapolate.
    """
    normalised = design / column_scale(design)
    _, singular, vt = np.linalg.svd(normalised, full_matrices=True)
    rank = int((singular > tolerance * max(singular.max(initial=0.0), 1e-300)).sum())
    null = vt[rank:]
    if null.size == 0:
        return [True] * design.shape[1]
    return [bool(np.linalg.norm(null[:, j]) < 1e-6) for j in range(design.shape[1])]


def huber_weights(relative: Any) -> Any:
    """Huber weights from relative residuals, scaled by their median absolute deviation.

    ``w = 1`` for ``|r|/s <= HUBER_K``, else ``HUBER_K s/|r|``, with
    ``s = 1.4826 MAD(r)``, never below 1%.
    """
    scale = 1.4826 * float(np.median(np.abs(relative - np.median(relative))))
    scale = max(scale, 0.01)  # never trust residuals below 1% noise more than that
    z = np.abs(relative) / scale
    return np.where(z <= HUBER_K, 1.0, HUBER_K / np.maximum(z, 1e-12))


def sandwich_covariance(jacobian: Any, residual: Any, parameters: int) -> Any:
    """Heteroscedasticity-consistent covariance (HC1) of a least-squares estimate.

    ``cov = n/(n-p) (J'J)^-1 J' diag(r^2) J (J'J)^-1``. Relative residuals of
    latency are not of equal variance (with ``B`` measured from ``L``, the
    noise shrinks by ``1 - rho`` at high load), so the textbook ``s^2 (J'J)^-1``
    overstates some errors by up to 1.6x (Monte Carlo, tests); the sandwich
    matches the spread of the estimates.
    """
    n = jacobian.shape[0]
    bread = np.linalg.pinv(jacobian.T @ jacobian)
    meat = (jacobian * (residual**2)[:, None]).T @ jacobian
    return n / max(n - parameters, 1) * (bread @ meat @ bread)


def bounded_solve(design: Any, target: Any, lower: Any, upper: Any) -> Any:
    """``argmin |X x - y|^2`` subject to ``lower <= x <= upper`` (scipy's BVLS), clipped into the bounds.

    BVLS can land a rounding error outside a bound it holds (``-5.1e-21`` s for a cost bounded at 0, from an
    engine calibration on a CPU), which a calibration file's schema then refuses: the clip keeps the bound.
    """
    from scipy.optimize import lsq_linear

    solution = lsq_linear(design, target, bounds=(lower, upper), method="bvls")
    return np.clip(solution.x, lower, upper)


def nonnegative_solve(design: Any, target: Any, upper: Any = None) -> Any:
    """``argmin |X theta - y|^2`` subject to ``0 <= theta <= upper`` (BVLS, in :func:`column_scale` units).

    A faint ridge (:data:`RIDGE`, in scaled units) settles the directions the
    runs leave free -- one draft length cannot tell the verify step from the
    k draft steps -- between them (the minimum-norm split), rather than at a
    vertex of the bounds that gives one all the cost and the other none;
    identified directions move by about ``RIDGE`` relative.
    """
    scale = column_scale(design)
    high = np.inf if upper is None else upper * scale
    count = design.shape[1]
    return bounded_solve(np.vstack([design / scale, np.sqrt(RIDGE * len(target)) * np.eye(count)]),
                         np.concatenate([target, np.zeros(count)]), 0.0, high) / scale
