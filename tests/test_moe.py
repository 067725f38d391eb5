"""Mixture-of-experts: coverage, fixed point, limits, and the CLI."""

from __future__ import annotations

import copy
import json
from dataclasses import fields

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdplan.calibration import parse_calibration
from sdplan.errors import InputFileError
from sdplan.latency.coefficients import Coefficients
from sdplan.latency.moe import MoESpec, solve
from sdplan.planning import planner

BASE = Coefficients(c1p_s=0.04, c2p_s=0.01, c1v_s=0.006, c2v_s=1e-4, c1d_s=0.001, c2d_s=5e-5,
                    baseline_c1_step_s=0.005, baseline_c2_step_s=1e-4, prompt_tokens=1000.0, output_tokens=500.0)
COVERAGE = {"c1v_s": 0.01, "baseline_c1_step_s": 0.01, "c2v_s": 2e-5, "baseline_c2_step_s": 2e-5, "c1p_s": 0.02}


def with_coverage(c: Coefficients, phi: float) -> Coefficients:
    """The dense model whose coefficients include phi times the coverage increments."""
    values = {field.name: getattr(c, field.name) for field in fields(c)}
    for key, value in COVERAGE.items():
        values[key] += phi * value
    return Coefficients(**values)


def test_coverage_values_match_published_table() -> None:
    spec = MoESpec(8, 128, {})  # Qwen3-30B-A3B: docs/model.md#mixture-of-experts
    assert numpy.allclose(spec.phi([1, 2, 4, 8, 16, 32, 64]), [0.062, 0.121, 0.228, 0.403, 0.644, 0.873, 0.984],
                          atol=1e-3)
    assert float(MoESpec(4, 32, {}).phi(1)) == pytest.approx(0.125)


def test_all_experts_per_token_reduces_to_the_dense_model() -> None:
    rates = numpy.linspace(0, 10, 21)
    ks = [1, 2, 4]
    moe = planner.plan(BASE, rates, ks, [0.8], moe=MoESpec(16, 16, COVERAGE))
    dense = planner.plan(with_coverage(BASE, 1.0), rates, ks, [0.8])
    numpy.testing.assert_allclose(moe.latency_s, dense.latency_s, rtol=1e-8)
    numpy.testing.assert_allclose(moe.baseline_latency_s, dense.baseline_latency_s, rtol=1e-8)
    assert numpy.array_equal(moe.best_k, dense.best_k)
    # TTFT and TPOT too: every step touches every expert, at zero load as under load
    numpy.testing.assert_allclose(moe.ttft_load_s, dense.ttft_load_s, rtol=1e-8)
    numpy.testing.assert_allclose(moe.baseline_ttft_load_s, dense.baseline_ttft_load_s, rtol=1e-8)
    numpy.testing.assert_allclose(moe.tpot_s, dense.tpot_s, rtol=1e-8)
    assert moe.ttft_s == pytest.approx(dense.ttft_s, rel=1e-12)


def test_ttft_follows_the_coverage_of_the_operating_batch() -> None:
    """A sparse MoE's TTFT at load is that of the coefficients at its step's coverage phi(t (1 + B)), more than
    the calibration's low-coverage coefficients give (TTFT used to ignore coverage)."""
    from sdplan.latency import model
    from sdplan.latency.moe import at_coverage

    spec = MoESpec(8, 128, COVERAGE)
    plan = planner.plan(BASE, [0.5, 4.0], [2], [0.8], moe=spec)
    tokens = float(plan.tokens_per_cycle[0, 0])
    for r, rate in enumerate((0.5, 4.0)):
        batch = float(plan.batch[0, r, 0])
        phi = float(spec.phi(3.0 * (1.0 + batch)))  # k + 1 = 3 tokens a sequence
        expected = float(model.time_to_first_token(at_coverage(BASE, spec, phi), 2, batch, tokens, rate))
        assert plan.ttft_load_s[0, r, 0] == pytest.approx(expected, rel=1e-9)
        assert plan.ttft_load_s[0, r, 0] > float(model.time_to_first_token(BASE, 2, batch, tokens, rate))
        base_batch = float(plan.baseline_batch[r])
        base_expected = model.time_to_first_token(at_coverage(BASE, spec, float(spec.phi(1.0 + base_batch))), 0,
                                                  base_batch, None, rate)
        assert plan.baseline_ttft_load_s[r] == pytest.approx(float(base_expected), rel=1e-9)
    assert plan.ttft_s == pytest.approx(float(model.time_to_first_token(at_coverage(BASE, spec, float(spec.phi(1))))))
    unstable = planner.plan(BASE, [1e3], [2], [0.8], moe=spec)
    assert numpy.isinf(unstable.ttft_load_s[0, 0, 0]) and numpy.isinf(unstable.baseline_ttft_load_s[0])


def test_saturated_coverage_approaches_the_dense_model_of_total_size() -> None:
    # Many experts per token: phi(B) ~ 1 already at small B, so the MoE behaves like the full dense model.
    moe = planner.plan(BASE, [8.0], [2], [0.8], moe=MoESpec(60, 64, COVERAGE))
    dense = planner.plan(with_coverage(BASE, 1.0), [8.0], [2], [0.8])
    assert moe.latency_s[0, 0, 0] == pytest.approx(dense.latency_s[0, 0, 0], rel=1e-6)


def test_sparse_moe_is_faster_than_its_dense_equivalent_at_low_load() -> None:
    moe = planner.plan(BASE, [0.5], [2], [0.8], moe=MoESpec(8, 128, COVERAGE))
    dense = planner.plan(with_coverage(BASE, 1.0), [0.5], [2], [0.8])
    assert moe.latency_s[0, 0, 0] < dense.latency_s[0, 0, 0]
    assert moe.moe_speedup_lost[0, 0, 0] > 0  # drafted tokens touch more experts


def _smallest_root(a1: float, b1: float, a2: float, b2: float, t: float, lam: float, spec: MoESpec) -> float:
    """Independent solution: scan f(L) = F(L) - L from 0 for its first sign change, then brentq.

    ``F(L) = (a1 + b1 phi) / (1 - lam (a2 + b2 phi))`` with ``phi = phi(t (1 + lam L))``: the tagged request's
    step holds itself plus the ``lam L`` others (docs/model.md#per-step-form). Returns inf when no root exists
    below 1e6 s.
    """
    from scipy.optimize import brentq

    def f(latency: float) -> float:
        phi = float(spec.phi(t * (1.0 + lam * latency)))
        denominator = 1.0 - lam * (a2 + b2 * phi)
        return (a1 + b1 * phi) / denominator - latency if denominator > 0 else 1e300

    grid = numpy.geomspace(1e-6, 1e6, 4000)
    values = numpy.array([f(x) for x in grid])
    sign_change = numpy.flatnonzero((values[:-1] > 0) & (values[1:] <= 0))
    if sign_change.size == 0:
        return float("inf")
    i = int(sign_change[0])
    return float(brentq(f, grid[i], grid[i + 1], xtol=1e-14, rtol=1e-13))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 16), st.integers(16, 256), st.floats(0.5, 5.0), st.floats(0.0, 0.95), st.integers(1, 6))
def test_fixed_point_matches_an_independent_root_finder(m: int, experts: int, b1: float, load: float,
                                                         k: int) -> None:
    # Not a residual test, which would hold by construction: the solver's latency must equal the
    # smallest root of L = F(L) found by a scan and brentq, with phi at t (1 + lambda L) routed tokens.
    spec = MoESpec(min(m, experts), experts, {})
    a1, a2, b2 = 2.0, 0.05, 0.02
    lam = load / (a2 + b2)
    expected = _smallest_root(a1, b1, a2, b2, k + 1.0, lam, spec)
    got = float(solve(a1, b1, a2, b2, k + 1.0, numpy.array([lam]), spec).latency_s[0])
    if numpy.isfinite(expected) and expected < 1e5:
        assert got == pytest.approx(expected, rel=1e-7)
    else:
        assert not numpy.isfinite(got) or got > 1e4


def test_routed_tokens_count_the_request_itself() -> None:
    # At B = lambda L = 1 other request, a verification step of k = 3 routes 4 (1 + 1) = 8 tokens,
    # not 4 max(1, 1) = 4. Choose lambda so the fixed point is known: with b2 = 0, L = (a1 + b1 phi) / (1 - lam a2).
    spec = MoESpec(8, 128, {})
    a1, b1, a2 = 1.0, 1.0, 0.0
    phi8 = float(spec.phi(8.0))
    lam = 1.0 / (a1 + b1 * phi8)  # then lambda L = 1 exactly at the root with 8 routed tokens
    result = solve(a1, b1, a2, 0.0, 4.0, numpy.array([lam]), spec)
    assert result.latency_s[0] == pytest.approx(a1 + b1 * phi8, rel=1e-9)
    assert result.batch[0] == pytest.approx(1.0, rel=1e-9)


def test_moe_zero_load_fields_equal_the_solved_latency_near_zero_load() -> None:
    # Zero-load latency/speedup and the baseline header include the coverage of the request's own step.
    spec = MoESpec(8, 128, COVERAGE)
    result = planner.plan(BASE, [1e-7], [1, 2, 4], [0.8], moe=spec)
    numpy.testing.assert_allclose(result.c1_s[0], result.latency_s[0, 0], rtol=1e-5)
    assert result.baseline_c1_s == pytest.approx(result.baseline_latency_s[0], rel=1e-5)
    zero_load_speedup = result.baseline_c1_s / result.c1_s[0]
    numpy.testing.assert_allclose(zero_load_speedup, result.speedup[0, 0], rtol=1e-5)


def test_moe_break_even_is_where_the_solved_speedup_crosses_one() -> None:
    cal_spec = MoESpec(8, 128, {"c1v_s": 0.0216, "baseline_c1_step_s": 0.0216})
    result = planner.plan(BASE, [0.1], [1, 2, 3, 4, 6], [0.8], moe=cal_spec)
    crossings = result.moe_break_even_rates_rps[0]
    found = crossings[numpy.isfinite(crossings)]
    assert found.size > 0  # this calibration has crossings (SD wins in a band)
    for rate in found:
        near = planner.plan(BASE, [rate * (1 - 1e-4), rate * (1 + 1e-4)], [1, 2, 3, 4, 6], [0.8], moe=cal_spec)
        ik = int(numpy.argwhere(crossings == rate)[0][0])
        below, above = near.speedup[0, :, ik]
        assert (below - 1.0) * (above - 1.0) < 0  # the sign flips across each reported crossing
    for ik in range(crossings.shape[0]):  # zero-load label agrees with the solved curve
        low = planner.plan(BASE, [1e-6], [[1, 2, 3, 4, 6][ik]], [0.8], moe=cal_spec)
        assert bool(result.sd_faster_below_break_even[0, ik]) == bool(low.speedup[0, 0, 0] > 1.0)


def test_latency_rises_with_load_and_round_off_is_not_reported_as_lost_speedup() -> None:
    from sdplan.latency.latency_grid import SPEEDUP_RESOLUTION

    spec = MoESpec(8, 128, COVERAGE)
    dense_c2 = 0.01 + 500 * 1.2e-4
    rates = numpy.linspace(0, 0.99 / dense_c2, 25)
    result = planner.plan(BASE, rates, [1, 2, 3, 4, 6], [0.8], moe=spec)
    for column in result.latency_s[0].T:  # latency rises with load until the option becomes unstable
        stable = column[numpy.isfinite(column)]
        assert numpy.all(numpy.diff(stable) >= -1e-9 * stable[1:])
    lost = result.moe_speedup_lost[numpy.isfinite(result.moe_speedup_lost)]
    assert numpy.all((lost == 0) | (numpy.abs(lost) >= SPEEDUP_RESOLUTION))
    from sdplan.latency.knee import prefill_wait_s

    rho = result.utilisation[0]  # dense-equivalent: L = (L(0) + W) / (1 - rho), W the prefills queued ahead
    wait = prefill_wait_s(BASE.c2p_s, BASE.prompt_cv, rates)[:, None]
    finite = numpy.isfinite(result.latency_s[0])
    numpy.testing.assert_allclose(((result.c1_s[0][None, :] + wait) / (1 - rho))[finite],
                                  result.latency_s[0][finite], rtol=1e-9)


def test_solver_reports_unstable_points() -> None:
    spec = MoESpec(8, 128, {})
    result = solve(1.0, 0.0, 0.1, 0.0, 1.0, numpy.array([5.0, 10.0, 20.0]), spec)
    assert result.latency_s[0] == pytest.approx(2.0) and numpy.all(numpy.isinf(result.latency_s[1:]))


def test_moe_schema(direct_document) -> None:
    document = copy.deepcopy(direct_document)
    document["moe"] = {"experts_per_token": 8, "experts": 128, "coverage": {"c1v_s": 0.01}}
    cal = parse_calibration(document, "x.toml")
    spec = cal.moe_at(1000, 500)
    assert spec is not None and spec.coverage == {"c1v_s": 0.01}
    document["moe"]["experts_per_token"] = 256
    with pytest.raises(InputFileError, match="moe.experts_per_token"):
        parse_calibration(document, "x.toml")
    document["moe"] = {"experts_per_token": 8, "experts": 128, "coverage": {"c1d_s": 0.01}}
    with pytest.raises(InputFileError, match="moe.coverage.c1d_s: unknown key"):
        parse_calibration(document, "x.toml")


def test_cli_plan_moe(sdplan) -> None:
    name = "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived"
    result = sdplan("plan", "-c", name, "--acceptance", "0.8", "--rates", "2,8", "-k", "1-4", "-f", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["moe"]["max_relative_residual"] < 1e-8
    point = doc["results"][0]["rates"][0]["speculative"][2]
    assert point["speedup_lost_to_expert_coverage"] > 0
    table = sdplan("plan", "-c", name, "--acceptance", "0.8", "--rates", "2,8")
    assert "speedup lost to coverage (x)" in table.stdout and "at zero load" in table.stdout
    assert all("break_even_rates_rps" in per_k for per_k in doc["results"][0]["draft_lengths"])
    goodput = sdplan("plan", "-c", name, "--acceptance", "0.8", "--rates", "2,4", "--policy", "goodput")
    assert goodput.exit_code == 0, goodput.output
    assert "goodput (s)" in goodput.stdout and "speedup lost to coverage (x)" in goodput.stdout
    assert sdplan("capacity", "-c", name, "--slo", "e2e:mean<=10s").exit_code == 0  # searched over rates
    check = sdplan("check", "-c", name, "--rate", "2", "--slo", "e2e:mean<=30s", "--acceptance", "0.8")
    assert check.exit_code == 0, check.output


def test_moe_schedule_counts_expert_streaming_per_step() -> None:
    # The vllm-config schedule of an MoE target must include the experts each step streams.
    # Independent brute force: per batch size n and option, tau = c1 + phi(n t) cov_c1 + (n - 1)(c2 + phi cov_c2).
    from sdplan.inputs.acceptance import expected_tokens_per_cycle
    from sdplan.planning.schedule import batch_size_schedule

    spec = MoESpec(8, 128, COVERAGE)
    ks = [1, 2, 3, 4, 6]
    schedule = batch_size_schedule(BASE, ks, 0.8, 64, moe=spec)
    got = {n: k for a, b, k in schedule for n in range(a, b + 1)}
    for n in range(1, 65):
        best, best_goodput = 0, -1.0
        for k in [0, *ks]:
            t = k + 1
            phi = 1.0 - (1.0 - 8 / 128) ** (n * t)
            if k == 0:
                tau = (BASE.baseline_c1_step_s + phi * COVERAGE["baseline_c1_step_s"]
                       + (n - 1) * (BASE.baseline_c2_step_s + phi * COVERAGE["baseline_c2_step_s"]))
                tokens = 1.0
            else:
                tau = (BASE.c1v_s + k * BASE.c1d_s + phi * COVERAGE["c1v_s"]
                       + (n - 1) * (BASE.c2v_s + k * BASE.c2d_s + phi * COVERAGE["c2v_s"]))
                tokens = float(expected_tokens_per_cycle(0.8, k))
            if tokens / tau > best_goodput:
                best, best_goodput = k, tokens / tau
        assert got[n] == best, n
    dense = {n: k for a, b, k in batch_size_schedule(BASE, ks, 0.8, 64) for n in range(a, b + 1)}
    assert dense != got  # coverage changes the answer for this target


def _envelope_fixed_point(rate: float, ks: list[int], alpha: float, spec: MoESpec) -> float:
    """Brute force: the smallest fixed point of ``L = min_k h_k(rate L)`` by monotone iteration from 0, with
    ``h_k(B) = C1 + B C2`` of the dense formulas at the coverage ``phi((k + 1)(1 + B))`` of the request's step
    (docs/model.md#goodput-adaptive-draft-length, #mixture-of-experts); inf where it never settles."""
    from sdplan.inputs.acceptance import expected_tokens_per_cycle

    g, p = BASE.output_tokens, BASE.prompt_tokens
    prefill_phi = 1.0 - (1.0 - 8 / 128) ** p

    def h(k: int, others: float) -> float:
        phi = 1.0 - (1.0 - 8 / 128) ** ((k + 1) * (1.0 + others))
        c1p = BASE.c1p_s + prefill_phi * COVERAGE["c1p_s"]
        if k == 0:
            step1 = BASE.baseline_c1_step_s + phi * COVERAGE["baseline_c1_step_s"]
            step2 = BASE.baseline_c2_step_s + phi * COVERAGE["baseline_c2_step_s"]
            return c1p + (g - 1) * step1 + others * (BASE.c2p_s + (g - 1) * step2)
        cycles = g / float(expected_tokens_per_cycle(alpha, k))
        cycle1 = BASE.c1v_s + k * BASE.c1d_s + phi * COVERAGE["c1v_s"]
        cycle2 = BASE.c2v_s + k * BASE.c2d_s + phi * COVERAGE["c2v_s"]
        return c1p + cycles * cycle1 + others * (BASE.c2p_s + cycles * cycle2)

    from sdplan.latency.knee import prefill_wait_s

    wait = float(prefill_wait_s(BASE.c2p_s, BASE.prompt_cv, rate))  # the prefills queued ahead, every option alike
    latency = 0.0
    for _ in range(100_000):
        new = min(h(k, rate * latency) for k in [0, *ks]) + wait
        if new > 1e6:
            return float("inf")
        if abs(new - latency) <= 1e-12 * new:
            return new
        latency = new
    return float("inf")


def test_moe_goodput_policy_is_the_fixed_point_of_the_options_envelope() -> None:
    """``--policy goodput`` on an MoE target: the latency of choosing k per step is the smallest fixed point of the
    lower envelope of the options' latency curves, found here by brute force, never above any static option's;
    the zero-load k is the option fastest alone, at the coverage of its own steps."""
    spec = MoESpec(8, 128, COVERAGE)
    # at 0.5 the option fastest alone is k=1 with the coverage of its own steps, k=2 without it
    ks, alpha = [1, 2, 3, 4, 6], 0.5
    rates = numpy.linspace(0.5, 20.0, 14)  # past every option's saturation (14-18 req/s)
    result = planner.plan(BASE, rates, ks, [alpha], moe=spec, goodput_policy=True)
    assert result.goodput_latency_s is not None and result.zero_load_k is not None
    statics = numpy.concatenate([result.baseline_latency_s[None, :], result.latency_s[0].T])  # (1 + k, r)
    for ir, rate in enumerate(rates):
        expected = _envelope_fixed_point(float(rate), ks, alpha, spec)
        got = float(result.goodput_latency_s[0, ir])
        if numpy.isinf(expected):
            assert numpy.isinf(got), rate
            continue
        assert got == pytest.approx(expected, rel=1e-7), rate
        assert got <= statics[:, ir].min() * (1 + 1e-12)
    alone = [_envelope_fixed_point(0.0, [k], alpha, spec) if k else _envelope_fixed_point(0.0, [], alpha, spec)
             for k in [0, *ks]]
    assert int(result.zero_load_k[0]) == [0, *ks][int(numpy.argmin(alone))]
    assert numpy.isinf(result.goodput_latency_s[0]).any() and numpy.isfinite(result.goodput_latency_s[0]).any()


def test_cli_capacity_vllm_config_for_moe_uses_coverage(sdplan) -> None:
    name = "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived"
    result = sdplan("capacity", "-c", name, "--acceptance", "0.8", "-k", "1-6", "--slo", "e2e:mean<=10s",
                    "--max-batch-size", "64", "-f", "vllm-config")
    assert result.exit_code == 0, result.output
    schedule = json.loads(result.stdout)["num_speculative_tokens_per_batch_size"]
    assert [k for _, _, k in schedule if k == 0] == []  # SD pays at every batch size here (experts dominate)


def test_an_moe_options_batch_reaches_its_cap_at_the_cap_rate_the_grid_gives() -> None:
    """At ``lambda_N`` from :func:`moe_cap_rates` the MoE fixed point holds ``N`` requests, no SD and SD alike."""
    from sdplan.latency.latency_grid import moe_cap_rates

    spec = MoESpec(8, 128, COVERAGE)
    ks = numpy.array([1, 3])
    tokens = numpy.array([[1.8, 2.6]])
    caps = [48.0, 20.0, 12.0]
    base_rate, sd_rate = moe_cap_rates(BASE, ks, tokens, caps, spec)
    plan = planner.plan(BASE, [base_rate * (1 - 1e-9)], [1, 3], [0.7], tokens_per_cycle=tokens, moe=spec)
    assert float(plan.baseline_batch[0]) == pytest.approx(48.0, rel=1e-4)
    for j, cap in enumerate(caps[1:]):
        at_cap = planner.plan(BASE, [float(sd_rate[0, j]) * (1 - 1e-9)], [1, 3], [0.7], tokens_per_cycle=tokens,
                              moe=spec)
        assert float(at_cap.batch[0, 0, j]) == pytest.approx(cap, rel=1e-4)
    # an infinite cap has no cap rate
    assert moe_cap_rates(BASE, ks, tokens, [numpy.inf] * 3, spec)[0] == numpy.inf


def test_an_moe_plan_saturates_at_its_kv_cap_not_past_it(sdplan) -> None:
    """Qwen3-30B-A3B with a 0.6B draft on one H100: its KV cache keeps 91 requests running without SD, 36 with k=2."""
    result = sdplan("plan", "-c", "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived", "-f", "json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["baseline"]["saturation_limit"] == "cap"
    batches = [point["effective_batch_size"] for row in document["results"][0]["rates"]
               for point in [row["baseline"], *row["speculative"]] if point["effective_batch_size"] is not None]
    assert batches and max(batches) <= 91.0 + 1e-6


MOE_FILE = "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived"


def _capacity_options(sdplan, *slos: str, extra: tuple[str, ...] = ()) -> list[dict]:
    arguments = ["capacity", "-c", MOE_FILE, "--acceptance", "0.8", "-k", "1-5", "-f", "json", *extra]
    for slo in slos:
        arguments += ["--slo", slo]
    result = sdplan(*arguments)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["options"]


def _check(sdplan, rate: float, k: int, slo: str) -> dict:
    return json.loads(sdplan("check", "-c", MOE_FILE, "--acceptance", "0.8", "--rate", repr(rate), "--slo", slo,
                             "--draft-length", str(k) if k else "off", "-f", "json").stdout)


@pytest.mark.parametrize("slo", ["e2e:mean<=6s", "ttft:mean<=90ms", "tpot:mean<=10ms"])
def test_moe_capacity_is_the_rate_where_check_starts_to_fail(sdplan, slo) -> None:
    """An MoE target has no closed-form inverse: capacity searches the rates, and ``check`` (the same fixed
    point) passes at each option's capacity and fails 1% above it, where the binding SLO is missed."""
    options = _capacity_options(sdplan, slo)
    assert any(option["feasible"] for option in options)
    for option in options:
        if not option["feasible"]:
            continue
        k, rate = option["draft_length_tokens"] or 0, option["max_rate_under_slo_rps"]
        assert option["binding_slo"] == slo
        assert _check(sdplan, rate * 0.999, k, slo)["verdicts"][0]["passed"]
        assert not _check(sdplan, rate * 1.01, k, slo)["verdicts"][0]["passed"]


def test_moe_capacity_names_the_kv_cap_where_it_binds(sdplan) -> None:
    """Under a loose SLO each option runs up to its KV cache's requests (91 without the draft, 36 with it), the
    rate where its batch reaches them: the cap binds, and capacity is the planner's saturation there."""
    options = _capacity_options(sdplan, "e2e:mean<=60s")
    assert [option["binding_slo"] for option in options] == \
        ["batch cap (91 sequences)"] + ["batch cap (36 sequences)"] * 5
    for option in options:
        assert option["max_rate_under_slo_rps"] == pytest.approx(option["saturation_rate_rps"], rel=1e-6)
        batch = option["max_rate_under_slo_rps"] * option["mean_e2e_latency_at_capacity_s"]
        assert batch == pytest.approx(91.0 if option["option"] == "off" else 36.0, rel=1e-3)


def test_moe_capacity_sizes_a_fleet_and_the_simulator_agrees(sdplan) -> None:
    """The simulator prices an MoE target's steps as the model does (the experts their routed tokens touch): each
    option's simulated capacity under a mean SLO is the model's within 10%."""
    result = sdplan("capacity", "-c", MOE_FILE, "--acceptance", "0.8", "--slo", "e2e:mean<=6s", "--target-rate", "20")
    assert result.exit_code == 0, result.stderr
    assert "replicas without SD" in result.stdout and "L = (C1(B) + W)/(1 - rate*C2(B))" in result.stdout
    capacities = []
    for extra in ((), ("--simulate", "--requests", "1500", "--seeds", "2")):
        done = sdplan("capacity", "-c", MOE_FILE, "--acceptance", "0.8", "--slo", "e2e:mean<=6s", "-f", "json", *extra)
        assert done.exit_code == 0, done.stderr
        capacities.append([option["max_rate_under_slo_rps"] for option in json.loads(done.stdout)["options"]])
    analytic, simulated = capacities
    assert len(analytic) == 9 and simulated == pytest.approx(analytic, rel=0.10)
