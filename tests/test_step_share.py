"""The share of c2_step that does not grow with the context: the mean of its profile likelihood.

Real data: tests/data/served-quick-floor-cpu (a quick-grid calibration whose runs hardly tell the shares
apart) and tests/data/served-context-cpu (no SD measured at 128/64 and at 512/256 tokens on one server),
both README.md; the GPU case (a sharp profile) is in tests/test_silicon.py.
"""

from __future__ import annotations

import math

import pytest
from test_verify_floor import growth, quick_grid  # noqa: E402

from sdplan.fit import fit_pooled
from sdplan.step_share import FIXED_STEP_SHARES, profile_mean


def squares_around(minimum: float, curvature: float, floor: float = 0.02) -> list[float]:
    return [floor + curvature * (share - minimum) ** 2 for share in FIXED_STEP_SHARES]


def test_a_sharp_profile_keeps_its_minimum() -> None:
    # 30 runs, 2% residuals: S_min 0.012, sigma^2 6e-4; 1.0 more per 0.1^2 away is decisive
    mean, sd = profile_mean(FIXED_STEP_SHARES, squares_around(0.3, 100.0, 0.012), 30)
    assert mean == pytest.approx(0.3, abs=0.01) and sd < 0.05


def test_a_flat_profile_gives_the_middle_and_the_spread_of_a_uniform_share() -> None:
    mean, sd = profile_mean(FIXED_STEP_SHARES, [0.1] * len(FIXED_STEP_SHARES), 30)
    assert mean == pytest.approx(0.5) and sd == pytest.approx(math.sqrt(0.1), rel=1e-9)  # 11 even points


def test_a_shallow_slope_pulls_the_mean_towards_the_middle_but_not_past_it() -> None:
    # the minimum at 0, the fit 5% worse in squares at 1: weighs in, does not decide
    squares = [0.1 * (1 + 0.05 * share) for share in FIXED_STEP_SHARES]
    mean, sd = profile_mean(FIXED_STEP_SHARES, squares, 30)
    assert 0.3 < mean < 0.5 and sd > 0.25


def test_an_exact_fit_keeps_its_minimum() -> None:
    squares = squares_around(0.7, 1.0, 0.0)
    assert profile_mean(FIXED_STEP_SHARES, squares, 30) == (pytest.approx(0.7), 0.0)


def test_a_flat_profile_on_served_runs_lands_nearer_the_measured_growth_than_its_minimum() -> None:
    """The quick grid's lowest error is at share 0 by a hair (the mean over shares is 45%): with share 0,
    no SD at 4x the context was predicted 8.81x slower where one server measured 7.59x; with the mean,
    6.75x."""
    fit = fit_pooled(quick_grid())
    assert 0.3 < fit.fixed_step_share < 0.6
    assert any("hardly tell the shares apart" in note for note in fit.notes), fit.notes
    measured, predicted = growth(fit, "nosd")
    _, at_minimum = growth(fit_pooled(quick_grid(), fixed_step_share=0.0), "nosd")
    assert abs(predicted / measured - 1) < 0.15 < abs(at_minimum / measured - 1)
