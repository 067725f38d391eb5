"""Per-position acceptance and the goodput-adaptive policy."""

from __future__ import annotations

import json

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose

from sdplan.errors import ExitStatus, InvalidValueError
from sdplan.inputs.acceptance import (
    AcceptanceMetric,
    expected_tokens_per_cycle,
    make_acceptance,
    tokens_from_position_rates,
)
from sdplan.latency import model
from sdplan.latency.coefficients import Coefficients
from sdplan.latency.policy import goodput_latency
from sdplan.planning import planner
from sdplan.planning.schedule import batch_size_schedule

positive = st.floats(1e-6, 1e-1, allow_nan=False)


@st.composite
def coefficients(draw: st.DrawFn) -> Coefficients:
    return Coefficients(c1p_s=draw(positive), c2p_s=draw(positive), c1v_s=draw(positive), c2v_s=draw(positive),
                        c1d_s=draw(positive), c2d_s=draw(positive), baseline_c1_step_s=draw(positive),
                        baseline_c2_step_s=draw(positive), prompt_tokens=1024.0,
                        output_tokens=float(draw(st.integers(2, 2048))))


@given(st.floats(0.0, 1.0), st.integers(1, 10))
def test_equal_conditional_rates_give_the_iid_formula(alpha: float, k: int) -> None:
    unconditional = tuple(alpha ** (i + 1) for i in range(k))  # what vLLM reports for i.i.d. acceptance
    assert_allclose(tokens_from_position_rates(unconditional, numpy.arange(1, k + 1)),
                    expected_tokens_per_cycle(alpha, numpy.arange(1, k + 1)), rtol=1e-12)


def test_position_rates_validation() -> None:
    with pytest.raises(InvalidValueError, match="must not increase"):
        make_acceptance(AcceptanceMetric.PER_POSITION, (0.5, 0.7), None, "t")
    with pytest.raises(InvalidValueError, match="in \\[0, 1\\]"):
        make_acceptance(AcceptanceMetric.PER_POSITION, (1.2,), None, "t")
    with pytest.raises(InvalidValueError, match="1..2"):
        tokens_from_position_rates((0.8, 0.6), numpy.array([3]))
    spec = make_acceptance(AcceptanceMetric.PER_POSITION, (0.8, 0.6, 0.4), None, "t")
    assert_allclose(spec.tokens_per_cycle([1, 2, 3]), [[1.8, 2.4, 2.8]])


def test_decaying_positions_favour_shorter_drafts() -> None:
    """Real drafters accept late positions less: the best k is shorter than i.i.d. with the same E(K)."""
    c = Coefficients(c1p_s=0.05, c2p_s=0.01, c1v_s=0.009, c2v_s=1e-4, c1d_s=0.0005, c2d_s=5e-5,
                     baseline_c1_step_s=0.008, baseline_c2_step_s=1e-4, prompt_tokens=1000.0, output_tokens=500.0)
    decaying = (0.9, 0.7, 0.45, 0.25, 0.1, 0.04)  # a cheap draft: i.i.d. acceptance would draft 6
    spec = make_acceptance(AcceptanceMetric.PER_POSITION, decaying, None, "t")
    ks = numpy.arange(1, 7)
    positional = planner.plan(c, [0.5], ks, spec.alphas, tokens_per_cycle=spec.tokens_per_cycle(ks))
    iid = planner.plan(c, [0.5], ks, spec.alphas)  # same E at k = 6 by construction of the equivalent alpha
    assert positional.tokens_per_cycle[0, -1] == pytest.approx(iid.tokens_per_cycle[0, -1], rel=1e-9)
    assert positional.best_k[0, 0] < iid.best_k[0, 0]


@settings(max_examples=150)
@given(coefficients(), st.floats(0.05, 0.99), st.floats(0.0, 1.2))
def test_goodput_policy_never_worse_than_best_static(c: Coefficients, alpha: float, load: float) -> None:
    ks = numpy.arange(1, 9)
    c1_d, c2_d = model.baseline_demand(c)
    rate = load / c2_d
    result = planner.plan(c, [rate], ks, [alpha], goodput_policy=True)
    best = result.best_latency_s[0, 0]
    adaptive = result.goodput_latency_s[0, 0]
    if numpy.isinf(best):
        assert numpy.isinf(adaptive)
        return
    assert adaptive <= best * (1 + 1e-9)
    assert adaptive == pytest.approx(best, rel=1e-9)  # equal in the mean-value model (see sdplan.latency.policy)
    assert adaptive <= result.zero_load_k_latency_s[0, 0] * (1 + 1e-9)


def test_goodput_beats_the_zero_load_k_under_load() -> None:
    c = Coefficients(c1p_s=0.05, c2p_s=0.01, c1v_s=0.009, c2v_s=1e-4, c1d_s=0.001, c2d_s=2e-4,
                     baseline_c1_step_s=0.008, baseline_c2_step_s=1e-4, prompt_tokens=1000.0, output_tokens=500.0)
    result = planner.plan(c, numpy.linspace(0.1, 9, 40), numpy.arange(1, 9), [0.8], goodput_policy=True)
    gain = result.zero_load_k_latency_s[0] / result.goodput_latency_s[0]
    assert gain[0] == pytest.approx(1.0) and numpy.nanmax(numpy.where(numpy.isfinite(gain), gain, 0)) > 1.5


def test_goodput_solver_is_independent_of_the_closed_form() -> None:
    c1 = numpy.array([[3.0, 2.0, 1.8]])
    c2 = numpy.array([[0.05, 0.07, 0.09]])
    rates = numpy.array([0.0, 4.0, 10.0, 12.0, 25.0])
    result = goodput_latency(c1, c2, rates)
    expected = numpy.min(numpy.where(rates[:, None] * c2[0] < 1, c1[0] / (1 - rates[:, None] * c2[0]), numpy.inf),
                         axis=1)
    assert_allclose(result.latency_s[0], expected, rtol=1e-12)
    assert numpy.isinf(result.latency_s[0, -1])


# Hand-built step costs with known switch points: a step with n sequences costs
# tau(n) = c1 + (n - 1) c2, so no SD: 1 + 0.1 m, k=1: 1.1 + 0.3 m, k=2: 1.2 + 0.45 m with m = n - 1.
HAND = Coefficients(c1p_s=0.05, c2p_s=0.01, c1v_s=1.0, c2v_s=0.15, c1d_s=0.1, c2d_s=0.15,
                    baseline_c1_step_s=1.0, baseline_c2_step_s=0.1, prompt_tokens=100.0, output_tokens=50.0)


def test_schedule_switch_points_derived_by_hand() -> None:
    # E = 1.5 (k=1) and 2 (k=2). Goodput E/tau: k=2 beats no SD iff 2 (1 + 0.1 m) > 1.2 + 0.45 m, i.e. m < 3.2
    # (n <= 4), and beats k=1 iff m < 5.33; k=1 alone beats no SD iff m < 2.67 (n <= 3).
    assert batch_size_schedule(HAND, [1, 2], 0.0, 10, tokens_per_cycle=[1.5, 2.0]) == [(1, 4, 2), (5, 10, 0)]
    assert batch_size_schedule(HAND, [1], 0.0, 10, tokens_per_cycle=[1.5]) == [(1, 3, 1), (4, 10, 0)]


def test_schedule_ranks_like_the_mean_model_at_n_minus_one_others() -> None:
    # At n sequences per step a request sees n - 1 others: the schedule's k(n) is argmin_k C1_k + (n-1) C2_k.
    c = Coefficients(c1p_s=0.05, c2p_s=0.01, c1v_s=0.009, c2v_s=1e-4, c1d_s=0.001, c2d_s=2e-4,
                     baseline_c1_step_s=0.008, baseline_c2_step_s=1e-4, prompt_tokens=1000.0, output_tokens=500.0)
    ks = list(range(1, 9))
    schedule = batch_size_schedule(c, ks, 0.8, 256)
    from sdplan.inputs.acceptance import expected_tokens_per_cycle
    from sdplan.latency import model

    c1_sd, c2_sd = model.demand_from_tokens(c, expected_tokens_per_cycle(0.8, numpy.array(ks, float)),
                                            numpy.array(ks, float))
    c1_d, c2_d = model.baseline_demand(c)
    c1, c2 = numpy.r_[c1_d, c1_sd], numpy.r_[c2_d, c2_sd]
    per_size = {n: k for a, b, k in schedule for n in range(a, b + 1)}
    assert sorted(per_size) == list(range(1, 257))
    for n in range(1, 257):
        assert per_size[n] == [0, *ks][int(numpy.argmin(c1 + (n - 1) * c2))]


def test_cli_position_acceptance_and_goodput(sdplan) -> None:
    result = sdplan("plan", "--position-acceptance", "0.9,0.7,0.5,0.3", "--draft-lengths", "1-4", "--policy",
                    "goodput", "-f", "json", "--rates", "2,8")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["workload"]["acceptance"]["metric_given"] == "per-position"
    tokens = [k["tokens_per_cycle"] for k in doc["results"][0]["draft_lengths"]]
    assert tokens == pytest.approx([1.9, 2.6, 3.1, 3.4])
    policies = doc["results"][0]["rates"][1]["policies"]
    assert policies["goodput"]["mean_e2e_latency_s"] == pytest.approx(
        doc["results"][0]["rates"][1]["best"]["mean_e2e_latency_s"])
    table = sdplan("plan", "--policy", "goodput", "--rates", "2,8")
    assert "goodput (s)" in table.stdout and "always (s)" in table.stdout
    too_long = sdplan("plan", "--position-acceptance", "0.9,0.7", "--draft-lengths", "1-4")
    assert too_long.exit_code == ExitStatus.USAGE and "1..2" in too_long.stderr
    both = sdplan("plan", "--position-acceptance", "0.9", "--acceptance", "0.7")
    assert both.exit_code == ExitStatus.USAGE


def test_check_and_capacity_take_position_acceptance(sdplan) -> None:
    check = sdplan("check", "--rate", "4", "--slo", "e2e:mean<=5s", "--position-acceptance", "0.9,0.7,0.5",
                   "-k", "1-3", "-f", "json")
    assert check.exit_code == 0, check.output
    capacity = sdplan("capacity", "--slo", "e2e:mean<=5s", "--position-acceptance", "0.9,0.7,0.5", "-k", "1-3",
                      "-f", "vllm-config")
    assert capacity.exit_code == 0 and json.loads(capacity.stdout)["num_speculative_tokens"] <= 3


def test_goodput_solver_walks_past_a_segment_with_no_fixed_point() -> None:
    """Regression (found by hypothesis): the cheapest line at zero load is saturated (rho = 1), so its
    iterates crawl up to the breakpoint where a flatter line takes over; the solver must reach it."""
    c1 = numpy.array([[0.0134, 76.757, 142.7]])
    c2 = numpy.array([[1.0, 0.543, 0.532]]) / 0.0274
    rate = numpy.array([0.0274])
    result = goodput_latency(c1, c2, rate)
    rho = rate * c2[0]
    expected = numpy.min(c1[0][rho < 1] / (1 - rho[rho < 1]))
    assert result.latency_s[0, 0] == pytest.approx(expected, rel=1e-12)
    assert result.iterations <= 3


# --------------------------------------------------------------- a calibration's measured per-position rates

#: Conditional rates as ``sdplan calibrate`` stores them, from the benchmark's tiny draft (acc27): it accepts
#: its first two tokens about 98% of the time and its third about 1%, far from i.i.d.
MEASURED_CONDITIONAL = [0.985045, 0.983697, 0.012221, 0.0]


def _with_positions(document: dict) -> dict:
    document["acceptance"] = {"per_token_alpha": 0.735304, "measured_at_k": 4,
                              "per_position_rates": MEASURED_CONDITIONAL, "source": "served runs at k=4"}
    return document


def test_a_calibrations_position_rates_give_each_shorter_draft_its_own_tokens_per_cycle(write_calibration,
                                                                                         direct_document) -> None:
    from sdplan.calibration import load_calibration
    from sdplan.inputs.workload import position_rates_from_conditional, resolve_workload

    spec = resolve_workload(load_calibration(write_calibration(_with_positions(direct_document), "pos"))).acceptance
    assert spec.metric is AcceptanceMetric.PER_POSITION and spec.source.startswith("from the calibration")
    cumulative = position_rates_from_conditional(MEASURED_CONDITIONAL)
    assert cumulative[1] == pytest.approx(0.985045 * 0.983697)
    tokens = spec.tokens_per_cycle(numpy.arange(1, 5))[0]
    assert_allclose(tokens, 1 + numpy.cumsum(cumulative), rtol=1e-12)
    # the i.i.d. alpha measured at k=4 would put k=2 at 2.28 tokens per cycle; the positions say 2.955
    assert float(expected_tokens_per_cycle(0.735304, 2)) == pytest.approx(2.28, abs=0.01)
    assert tokens[1] == pytest.approx(2.954, abs=0.001)


def test_plan_leaves_out_default_draft_lengths_the_calibration_did_not_measure(sdplan, write_calibration,
                                                                               direct_document) -> None:
    path = str(write_calibration(_with_positions(direct_document), "pos"))
    result = sdplan("plan", "-c", path, "-f", "json", "--rates", "1,2")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [k["draft_length_tokens"] for k in document["results"][0]["draft_lengths"]] == [1, 2, 3, 4]
    assert any("left out" in warning for warning in document["warnings"])
    assert document["workload"]["acceptance"]["metric_given"] == "per-position"
    assert "draft lengths 5-8 left out" in result.stderr and "up to k=4" in result.stderr
    table = sdplan("plan", "-c", path, "--rates", "1,2")
    assert "acceptance per draft position 0.985" in table.stdout and "per-token alpha 0.735" not in table.stdout
    shown = sdplan("show", "-c", path)
    assert shown.exit_code == 0 and "conditional a_i 0.985, 0.984, 0.0122, 0" in " ".join(shown.stdout.split())
    # draft lengths the user asks for past the measured ones: a usage error naming both ways out
    asked = sdplan("plan", "-c", path, "--draft-lengths", "1-8")
    assert asked.exit_code == ExitStatus.USAGE
    assert "draft lengths within 1-4" in asked.stderr and "--acceptance ALPHA" in asked.stderr
    # an alpha of the user's own extrapolates as before
    iid = sdplan("plan", "-c", path, "--acceptance", "0.7", "-f", "json", "--rates", "1")
    assert iid.exit_code == 0 and len(json.loads(iid.stdout)["results"][0]["draft_lengths"]) == 8


def test_check_capacity_and_simulate_use_the_calibrations_position_rates(sdplan, write_calibration,
                                                                          direct_document) -> None:
    path = str(write_calibration(_with_positions(direct_document), "pos"))
    check = sdplan("check", "-c", path, "--rate", "1", "--slo", "e2e:mean<=60s", "-f", "json")
    assert check.exit_code == 0, check.output
    assert json.loads(check.stdout)["speculation"]["candidates_tokens"] == [1, 2, 3, 4]
    assert "left out" in check.stderr
    capacity = sdplan("capacity", "-c", path, "--slo", "e2e:mean<=60s")
    assert capacity.exit_code == 0, capacity.output
    assert "acceptance per draft position" in capacity.stdout
    asked = sdplan("check", "-c", path, "--rate", "1", "--slo", "e2e:mean<=60s", "--draft-lengths", "2-6")
    assert asked.exit_code == ExitStatus.USAGE and "1-4" in asked.stderr
    fixed = sdplan("check", "-c", path, "--rate", "1", "--slo", "e2e:mean<=60s", "--draft-length", "6")
    assert fixed.exit_code == ExitStatus.USAGE and "--acceptance ALPHA" in fixed.stderr
    simulated = sdplan("simulate", "-c", path, "--rates", "0.5", "--requests", "200", "--seeds", "1", "-f", "json")
    assert simulated.exit_code == 0, simulated.output
    workload = json.loads(simulated.stdout)["workload"]
    assert workload["position_acceptance_rates"][0] == pytest.approx(0.985045)
