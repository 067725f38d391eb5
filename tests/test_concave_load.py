"""The concave load law ``L = C1 + C2 (B + psi sqrt(B))`` (docs/model.md#concave-load): solved, inverted, fitted.

The closed forms are checked against the law itself (the fixed point ``B = lambda L``), not against stored
numbers; the fit is checked on real ``vllm bench serve`` results (tests/data/served-cpu).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sdplan.errors import ExitStatus
from sdplan.fitting.fit import LOAD_CONCAVITIES, fit_pooled, fitted_document
from sdplan.fitting.validation import validate
from sdplan.inputs.slo import parse_slo
from sdplan.latency import knee, model
from sdplan.latency.coefficients import Coefficients
from sdplan.planning.capacity import scanned_rate_bounds
from sdplan.runs import read_results

DATA = Path(__file__).parent / "data" / "served-cpu"
C1, C2 = 0.4, 0.02


def demands(psi: float, shape: tuple[int, ...] = ()) -> knee.KneeDemands:
    return knee.KneeDemands(c1_above_s=np.full(shape, C1), c2_above_s=np.full(shape, C2),
                            knee_batch=np.full(shape, np.inf), concavity=psi)


def law(batch: float, psi: float) -> float:
    return C1 + C2 * (batch + psi * math.sqrt(batch))


@pytest.mark.parametrize("psi", [0.5, 1.0, 3.0])
def test_the_open_loop_solves_littles_law_on_the_concave_law(psi: float) -> None:
    rates = np.array([0.0, 1.0, 10.0, 30.0, 49.0, 49.9])
    latency = knee.mean_latency(C1, C2, demands(psi), rates)
    batch = knee.concave_batch(C1, C2, psi, rates)
    for rate, value, b in zip(rates, latency, batch):
        assert b == pytest.approx(rate * value, rel=1e-9, abs=1e-12)
        assert value == pytest.approx(law(b, psi), rel=1e-9)
    assert np.all(np.diff(latency) > 0)
    # saturation stays at 1/C2: past it no steady state, as on the straight line
    assert np.all(np.isinf(knee.mean_latency(C1, C2, demands(psi), np.array([50.0, 60.0]))))
    # and the bend costs latency at every load below it: h(B) > B
    assert np.all(latency[1:] > model.mean_latency(C1, C2, rates[1:]))


def test_psi_zero_is_the_straight_line() -> None:
    rates = np.linspace(0.0, 49.0, 50)
    assert np.array_equal(knee.mean_latency(C1, C2, demands(0.0), rates), model.mean_latency(C1, C2, rates))
    assert model.concave_load(7.0, 0.0) == 7.0


def test_the_law_and_its_slope_are_one_function_for_numbers_and_arrays() -> None:
    others = np.array([0.0, 0.25, 1.0, 9.0, 400.0])
    for psi in (0.0, 0.5, 2.0):
        scalars = [model.concave_load(float(b), psi) for b in others]
        assert isinstance(scalars[1], float)
        assert scalars == pytest.approx(list(model.concave_load(others, psi)), rel=1e-15)
        assert scalars == pytest.approx([b + psi * math.sqrt(b) for b in others], rel=1e-15)
    # h'(B) against a central difference of h, and 1 at B = 0 where it is not defined
    b, step = others[1:], 1e-6
    slope = (model.concave_load(b + step, 1.5) - model.concave_load(b - step, 1.5)) / (2 * step)
    assert model.concave_load_slope(b, 1.5) == pytest.approx(slope, rel=1e-6)
    assert model.concave_load_slope(np.array([0.0]), 1.5)[0] == 1.0


@pytest.mark.parametrize("ascending", [True, False])
def test_bisection_keeps_the_side_where_the_condition_holds(ascending: bool) -> None:
    edge = np.array([0.3, 2.0, 7.5])
    holds = (lambda r: r <= edge) if ascending else (lambda r: r >= edge)
    inside, outside = (np.zeros(3), np.full(3, 10.0)) if ascending else (np.full(3, 10.0), np.zeros(3))
    inside, outside = knee.bisect_boundary(holds, inside, outside)
    assert np.all(holds(inside)) and not np.any(holds(outside))
    assert inside == pytest.approx(edge, abs=1e-12) and outside == pytest.approx(edge, abs=1e-12)


def test_a_closed_loop_and_a_batch_cap_cost_the_law_at_their_batch() -> None:
    c1_at, c2_at = knee.batch_cap_demands(C1, C2, demands(1.0), 15.0)
    assert c1_at + 15.0 * c2_at == pytest.approx(law(15.0, 1.0))
    rate = model.batch_cap_rate(c1_at, c2_at, 15.0)
    assert rate * law(15.0, 1.0) == pytest.approx(15.0)
    assert model.closed_loop_throughput(C1, C2, 16, 1.0, 1.0) == pytest.approx(16 / law(15.0, 1.0))


def test_the_break_even_is_where_the_latencies_meet() -> None:
    # SD: faster at zero load, but each request in flight costs it more
    c1_sd, c2_sd = np.array([0.3, 0.2]), np.array([0.024, 0.03])
    rates, faster_below = knee.break_even(C1, C2, demands(1.0), c1_sd, c2_sd, demands(1.0, (2,)))
    assert np.all(faster_below) and np.all(np.isfinite(rates))
    for i, rate in enumerate(rates):
        base = knee.mean_latency(C1, C2, demands(1.0), rate)
        sd = knee.mean_latency(c1_sd[i], c2_sd[i], demands(1.0), rate)
        assert sd == pytest.approx(base, rel=1e-6)
    # SD faster at every load: no crossing
    none, faster = knee.break_even(C1, C2, demands(1.0), np.array([0.3]), np.array([0.015]), demands(1.0, (1,)))
    assert math.isnan(none[0]) and faster[0]


@pytest.mark.parametrize("text", ["e2e:mean<=1s", "ttft:mean<=0.2s", "utilisation<=0.8", "tpot:mean<=20ms"])
def test_the_rate_an_slo_allows_is_where_the_law_meets_its_limit(text: str) -> None:
    slo = parse_slo(text)
    t0, per_other, g = np.array([0.05, 0.04]), np.array([0.006, 0.006]), 64.0
    c1, c2 = np.array([C1, 0.3]), np.array([C2, 0.025])
    low, high = scanned_rate_bounds(slo, c1, c2, demands(1.0, (2,)), t0, g, per_other)
    assert np.all(low == 0.0) and np.all((high > 0) & (high < 1 / c2))
    latency = knee.mean_latency(c1, c2, demands(1.0, (2,)), high)
    first = t0 + per_other * high * latency
    value = {"e2e": latency, "ttft": first, "utilisation": 1 - c1 / latency,
             "tpot": (latency - first) / (g - 1)}[slo.metric.value]
    assert value == pytest.approx(np.full(2, slo.limit), rel=1e-6)


def test_an_slo_no_rate_meets_is_refused_per_option() -> None:
    low, high = scanned_rate_bounds(parse_slo("e2e:mean<=0.35s"), np.array([C1, 0.3]), np.array([C2, C2]),
                                    demands(1.0, (2,)), np.zeros(2), 64.0, np.zeros(2))
    assert high[0] == -1.0 and high[1] > 0


@pytest.fixture(scope="module")
def runs():
    return read_results(DATA, "vllm")[0]


def test_the_fit_keeps_the_law_with_the_lowest_error_where_both_loops_are_fitted(runs) -> None:
    assert {r.concurrency is None for r in runs} == {True, False}
    profiled = fit_pooled(runs)
    fixed = [fit_pooled(runs, load_concavity_sqrt_requests=psi) for psi in LOAD_CONCAVITIES]
    assert profiled.load_concavity_sqrt_requests in LOAD_CONCAVITIES
    assert profiled.mape_pct == pytest.approx(min(fit.mape_pct for fit in fixed))
    assert any("load law" in note for note in profiled.notes)
    coefficients = profiled.coefficients_at(128, 64)
    assert coefficients.load_concavity_sqrt_requests == profiled.load_concavity_sqrt_requests


def test_closed_loops_alone_keep_the_straight_line(runs) -> None:
    closed = [r for r in runs if r.concurrency is not None]
    fit = fit_pooled(closed)
    assert fit.load_concavity_sqrt_requests == 0.0
    # what the rule guards against: the bend fitted to closed loops predicts their Poisson runs worse
    poisson = [r for r in runs if r.concurrency is None]
    line = validate(fit.coefficients_at, poisson).mape_pct
    bent = validate(fit_pooled(closed, load_concavity_sqrt_requests=2.0).coefficients_at, poisson).mape_pct
    assert bent > line + 2.0


def test_a_fitted_file_carries_the_law_and_show_prints_it(sdplan, tmp_path, runs, write_calibration) -> None:
    import datetime

    fit = fit_pooled(runs, load_concavity_sqrt_requests=1.0)
    provenance = {"method": "fit", "hardware": "test", "target_model": "t", "draft_model": "d", "engine": "vllm",
                  "engine_version": "0", "date": datetime.date(2026, 11, 29)}
    document = fitted_document(fit, runs, name="bent", provenance=provenance, description="test")
    assert document["coefficients"]["load_concavity_sqrt_requests"] == 1.0
    path = write_calibration(document, "bent")
    shown = sdplan("show", "-c", str(path))
    assert shown.exit_code == 0 and "load_concavity_sqrt_requests" in shown.stdout
    planned = sdplan("plan", "-c", str(path), "--rates", "1,5", "-k", "2", "-f", "json")
    assert planned.exit_code == 0, planned.output
    document["coefficients"].update(knee_tokens=64.0, knee_per_token_s=1e-5)
    refused = sdplan("show", "-c", str(write_calibration(document, "both")))
    assert refused.exit_code == ExitStatus.BAD_INPUT
    assert "coefficients.load_concavity_sqrt_requests" in refused.stderr and "Traceback" not in refused.output


def test_the_simulator_prices_a_step_of_n_sequences_on_the_law() -> None:
    from sdplan.simulate.config import SimulationConfig
    from sdplan.simulate.engine import simulate

    base = Coefficients(c1p_s=0.01, c2p_s=0.0, c1v_s=0.004, c2v_s=0.001, c1d_s=0.001, c2d_s=0.0002,
                        baseline_c1_step_s=0.004, baseline_c2_step_s=0.001, prompt_tokens=32, output_tokens=64)
    config = SimulationConfig(rate_rps=20.0, draft_length=0, position_rates=(), requests=400,
                              prompt_tokens=32, output_tokens=64)

    def mean_e2e(coefficients: Coefficients) -> float:
        return float(np.mean(simulate(coefficients, config, np.random.default_rng(3)).e2e_s))

    line, bent = mean_e2e(base), mean_e2e(replace(base, load_concavity_sqrt_requests=1.0))
    # the same arrivals: a step of n sequences costs h(n - 1) per-sequence costs, more than n - 1
    assert bent > line * 1.02
