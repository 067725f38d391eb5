"""The served accuracy benchmark's estimate of what an exact model scores against one noisy pass."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "accuracy_served.py"


@pytest.fixture(scope="module")
def benchmark():
    spec = importlib.util.spec_from_file_location("accuracy_served", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_passes_give_the_log_ratio_over_root_two(benchmark):
    assert benchmark.exact_model_mape_pct([[1.0, 1.2]]) == pytest.approx(100 * math.log(1.2) / math.sqrt(2))
    # pairs average, single measurements are skipped
    assert benchmark.exact_model_mape_pct([[1.0, 1.0], [2.0, 2.0 * math.e ** 0.2], [5.0]]) == pytest.approx(
        100 * 0.1 / math.sqrt(2))


def test_identical_passes_leave_nothing_and_no_pairs_give_nan(benchmark):
    assert benchmark.exact_model_mape_pct([[0.4, 0.4, 0.4]]) == 0.0
    assert math.isnan(benchmark.exact_model_mape_pct([[0.4], []]))


@pytest.mark.parametrize("passes", [2, 3])
def test_it_estimates_the_exact_models_error_against_one_noisy_pass(benchmark, passes):
    """Log-normal noise of 12%: the estimate matches the exact model's mean error, E|exp(eps) - 1|."""
    rng = np.random.default_rng(7)
    sigma = 0.12
    truth = rng.uniform(0.2, 3.0, size=4000)
    measured = truth[:, None] * np.exp(rng.normal(0.0, sigma, size=(4000, passes)))
    exact_error = 100 * float(np.mean(np.abs(truth[:, None] / measured - 1)))
    estimate = benchmark.exact_model_mape_pct(measured.tolist())
    assert estimate == pytest.approx(exact_error, rel=0.05)
    assert estimate == pytest.approx(100 * sigma * math.sqrt(2 / math.pi), rel=0.05)
