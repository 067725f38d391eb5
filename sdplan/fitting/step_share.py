"""The share of the no-SD step cost per running sequence that does not grow with the context.

The pooled fit (:func:`sdplan.fitting.fit.fit_pooled`) scales ``c2_step`` with the mean context ``s = p + g/2`` as
``c2_step(s) = c2_step (phi + (1 - phi) s/s_ref)`` (``c2_step_fixed_s = phi c2_step``,
:func:`sdplan.calibration.scaling.direct_coefficients_at`). The fit is linear in the coefficients at a
given ``phi`` but not in ``phi``, so ``phi`` is profiled: the fit is made at each of :data:`FIXED_STEP_SHARES`.

Where the runs tell the shares apart (AIConfigurator's GPU rows, mean contexts 1088-4608 tokens), the
profile has one clear minimum. Where they hardly do (a served quick grid, whose probes move the context
with the prompt, so that the prefill's share and the steps' growth trade off), the profile is flat and its
minimum lands at either end of the range by chance: on nine stored quick-grid calibrations of a 2-core CPU
(acc40-48) the lowest error sat at 0 or 1 in eight, and the no-SD latency at 4x the context (512/256
against 128/64 tokens, measured on one server: 7.59x) came out 16-42% too steep at 0 and 46% too shallow
at 1 (benchmarks/RESULTS-accuracy-served-2026-11.md, twenty-fourth session). So the share kept is the mean of
the profile's likelihood rather than its minimum (:func:`profile_mean`): a sharp profile keeps its
minimum, a flat one the middle of the range, and the note says how well the runs determined it. Its
standard deviation goes into ``[uncertainty] step_share_sd_pct``, which widens the intervals at other
contexts (:func:`sdplan.planning.uncertainty.coefficient_draws`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sdplan.calibration import mean_context
from sdplan.fitting.runmodel import LENGTH_GROUP_TOLERANCE, PARAMETERS

if TYPE_CHECKING:
    from sdplan.fitting.fit_result import PooledFit
    from sdplan.runs import BenchmarkRun

#: Shares of ``c2_step`` that do not grow with the context at which the fit is profiled
#: (0: all of it scales with the context, the default of one workload).
FIXED_STEP_SHARES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def spans_several_contexts(runs: Sequence[BenchmarkRun]) -> bool:
    """Whether the no-SD runs' mean contexts lie more than :data:`LENGTH_GROUP_TOLERANCE` apart."""
    contexts = [mean_context(r.prompt_tokens, r.output_tokens) for r in runs if r.draft_length == 0]
    return bool(contexts) and max(contexts) > LENGTH_GROUP_TOLERANCE * min(contexts)


def weighted_squares(fit: PooledFit) -> float:
    """The fit's robust sum of squared relative E2E residuals, ``sum_i w_i (L_hat_i / L_i - 1)^2``."""
    return sum(point.weight * (point.predicted_s / point.measured_s - 1.0) ** 2 for point in fit.residuals)


def profile_mean(shares: Sequence[float], squares: Sequence[float], points: int) -> tuple[float, float]:
    """The mean and standard deviation of the share under its profile likelihood.

    Parameters
    ----------
    shares : sequence of float
        The profiled shares, evenly spaced over [0, 1] (a uniform prior on the share).
    squares : sequence of float
        The fit's robust sum of squared relative residuals ``S(phi)`` at each share.
    points : int
        The number of runs fitted.

    Returns
    -------
    mean, sd : float
        ``sum phi w(phi) / sum w(phi)`` and the standard deviation under the same weights, with
        ``w(phi) = exp(-(S(phi) - S_min) / (2 sigma^2))``, the profile likelihood of Gaussian relative
        errors, and ``sigma^2 = S_min / (n - q)`` the residual variance of the best fit (``q``: the eight
        coefficients and the share). A sharp profile puts the mean at its minimum with a small ``sd``; a
        flat one (``w`` near 1 everywhere) at the middle of the range with ``sd`` near 0.3, that of a
        uniform share.
    """
    best = min(squares)
    variance = best / max(points - len(PARAMETERS) - 1, 1)
    if variance <= 0.0:
        return float(shares[list(squares).index(best)]), 0.0
    weights = [math.exp(-(s - best) / (2.0 * variance)) for s in squares]
    total = sum(weights)
    mean = sum(phi * w for phi, w in zip(shares, weights)) / total
    sd = math.sqrt(max(sum((phi - mean) ** 2 * w for phi, w in zip(shares, weights)) / total, 0.0))
    return mean, sd


def profile_fixed_step_share(fit_at: Callable[[float], PooledFit], points: int) -> tuple[float, float, str]:
    """The share to keep and its standard deviation (:func:`profile_mean` over :data:`FIXED_STEP_SHARES`), and
    the note that says so.

    ``fit_at(phi)`` is the fit at one share; ``points`` the number of runs it fits.
    """
    squares = [weighted_squares(fit_at(share)) for share in FIXED_STEP_SHARES]
    share, sd = profile_mean(FIXED_STEP_SHARES, squares, points)
    lowest = FIXED_STEP_SHARES[squares.index(min(squares))]
    how = ("the runs determine it" if sd < 0.1 else
           f"the runs hardly tell the shares apart (sd {sd:.0%}; alone the best fit is at {lowest:.0%}), so "
           "the middle of the range weighs in and the intervals away from the reference context carry it")
    note = (f"c2_step: {share:.0%} of it does not grow with the context (c2_step_fixed_s; the mean over "
            f"{FIXED_STEP_SHARES[0]:.0%}-{FIXED_STEP_SHARES[-1]:.0%} weighted by each share's fit to the runs "
            f"at several contexts: {how})")
    return share, sd, note
