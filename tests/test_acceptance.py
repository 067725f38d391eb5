"""Acceptance metrics: E(alpha, k) values and conversions between metrics."""

from __future__ import annotations

import numpy
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numpy.testing import assert_allclose

from sdplan.errors import InvalidValueError
from sdplan.inputs.acceptance import (
    AcceptanceMetric,
    alpha_from_draft_rate,
    alpha_from_mean_length,
    draft_rate_from_alpha,
    expected_tokens_per_cycle,
    expected_tokens_per_position,
    make_acceptance,
    mean_length_from_alpha,
)

# E(alpha, k) for k = 1..10 (docs/model.md#cycles), printed to 3-4 significant digits.
E_TABLE = {
    0.5: [1.5, 1.75, 1.875, 1.938, 1.969, 1.984, 1.992, 1.996, 1.998, 1.999],
    0.6: [1.6, 1.96, 2.176, 2.306, 2.383, 2.430, 2.458, 2.475, 2.485, 2.491],
    0.7: [1.7, 2.19, 2.533, 2.773, 2.941, 3.059, 3.141, 3.199, 3.239, 3.267],
    0.8: [1.8, 2.44, 2.952, 3.362, 3.689, 3.951, 4.161, 4.329, 4.463, 4.571],
    0.9: [1.9, 2.71, 3.439, 4.095, 4.686, 5.217, 5.695, 6.126, 6.513, 6.862],
}


@pytest.mark.parametrize("alpha", sorted(E_TABLE))
def test_expected_tokens_matches_published_table(alpha: float) -> None:
    ks = numpy.arange(1, 11)
    assert_allclose(expected_tokens_per_cycle(alpha, ks), E_TABLE[alpha], atol=6e-4)


def test_expected_tokens_limits() -> None:
    assert float(expected_tokens_per_cycle(1.0, 4)) == 5.0  # every draft accepted + bonus
    assert float(expected_tokens_per_cycle(0.0, 4)) == 1.0  # only the bonus token
    assert_allclose(expected_tokens_per_cycle(numpy.array([0.3, 0.9]), 0), [1.0, 1.0])  # k = 0: plain decoding
    # continuity at alpha -> 1
    assert_allclose(expected_tokens_per_cycle(1.0 - 1e-9, 6), 7.0, rtol=1e-6)


def test_broadcasting_shape() -> None:
    alphas = numpy.linspace(0, 1, 5)[:, None]
    ks = numpy.arange(1, 9)[None, :]
    assert expected_tokens_per_cycle(alphas, ks).shape == (5, 8)


@given(st.floats(0.0, 1.0), st.integers(1, 12))
def test_per_position_with_equal_rates_equals_iid(alpha: float, k: int) -> None:
    assert_allclose(expected_tokens_per_position(numpy.full(k, alpha)), expected_tokens_per_cycle(alpha, k), rtol=1e-12)


@given(st.floats(0.0, 1.0), st.integers(1, 12))
def test_mean_length_round_trip(alpha: float, k: int) -> None:
    tau = mean_length_from_alpha(alpha, k)
    back = alpha_from_mean_length(tau, k)
    # E is flat near alpha = 0 for large k only in higher orders; compare in E-space and alpha-space
    assert_allclose(mean_length_from_alpha(back, k), tau, rtol=1e-12, atol=1e-12)
    assert abs(float(back) - alpha) < 1e-6


@given(st.floats(0.0, 1.0), st.integers(1, 12))
def test_draft_rate_round_trip(alpha: float, k: int) -> None:
    rate = draft_rate_from_alpha(alpha, k)
    assert 0.0 <= float(rate) <= 1.0
    assert abs(float(alpha_from_draft_rate(rate, k)) - alpha) < 1e-6


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 8, 16])
def test_full_and_no_acceptance_convert_exactly(k: int) -> None:
    """Every draft token accepted is alpha = 1 exactly (bisection alone stopped an ulp short: 0.9999999999999998
    on served EAGLE runs at k=2), and nothing accepted is alpha = 0."""
    assert float(alpha_from_mean_length(k + 1.0, k)) == 1.0
    assert float(alpha_from_draft_rate(1.0, k)) == 1.0
    assert float(alpha_from_mean_length(1.0, k)) == 0.0
    assert_allclose(alpha_from_mean_length(numpy.array([1.0, k + 1.0]), k), [0.0, 1.0], rtol=0, atol=0)


def test_known_conversion_values() -> None:
    # docs/engines.md#successor-test-models: draft m3 at k=3 gives mean length 3.00 and draft rate 2/3.
    alpha = float(alpha_from_mean_length(3.0, 3))
    assert_allclose(float(draft_rate_from_alpha(alpha, 3)), 2 / 3, rtol=1e-9)
    assert_allclose(float(alpha_from_draft_rate(2 / 3, 3)), alpha, rtol=1e-9)
    assert float(alpha_from_mean_length(4.0, 3)) == pytest.approx(1.0, abs=1e-12)
    assert float(alpha_from_mean_length(1.0, 3)) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(
    ("metric", "values", "k", "message"),
    [
        (AcceptanceMetric.PER_TOKEN, (1.2,), None, "[0, 1]"),
        (AcceptanceMetric.PER_TOKEN, (-0.1,), None, "[0, 1]"),
        (AcceptanceMetric.MEAN_LENGTH, (5.0,), 3, "[1, 4]"),
        (AcceptanceMetric.MEAN_LENGTH, (0.5,), 3, "[1, 4]"),
        (AcceptanceMetric.MEAN_LENGTH, (2.0,), None, "--acceptance-k"),
        (AcceptanceMetric.DRAFT_RATE, (1.5,), 3, "[0, 1]"),
        (AcceptanceMetric.DRAFT_RATE, (0.5,), None, "--acceptance-k"),
        (AcceptanceMetric.PER_TOKEN, (), None, "at least one"),
    ],
)
def test_make_acceptance_rejects_out_of_domain(metric, values, k, message) -> None:
    with pytest.raises(InvalidValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        make_acceptance(metric, values, k, "test")


def test_make_acceptance_describes_what_it_received() -> None:
    spec = make_acceptance(AcceptanceMetric.MEAN_LENGTH, (3.0,), 3, "test")
    assert "mean acceptance length" in spec.describe()
    assert "k=3" in spec.describe()
    assert spec.alphas[0] == pytest.approx(float(alpha_from_mean_length(3.0, 3)))


def test_conditional_rates_invert_vllms_running_products() -> None:
    from sdplan.inputs.acceptance import conditional_from_position_rates, position_rates_from_conditional

    conditional = (0.9, 0.8, 0.5)
    assert conditional_from_position_rates(position_rates_from_conditional(conditional)) == pytest.approx(conditional)
    assert conditional_from_position_rates((0.5, 0.0, 0.0)) == (0.5, 0.0, 0.0)  # nothing after a never-accepted one
