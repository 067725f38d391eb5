"""SLO parsing, the closed-form inverse against the forward model, fleets and the k schedule."""

from __future__ import annotations

import json
import math

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdplan.errors import InvalidValueError
from sdplan.inputs.slo import Metric, OperatingPoint, evaluate, parse_slo
from sdplan.latency import model
from sdplan.latency.coefficients import Coefficients
from sdplan.planning import planner
from sdplan.planning.capacity import capacity, fleet, replicas_needed
from sdplan.planning.schedule import batch_size_schedule
from sdplan.units import Dimension, finite_or_none, parse_quantity


def coefficients(**overrides: float) -> Coefficients:
    values = dict(c1p_s=0.05, c2p_s=0.01, c1v_s=0.009, c2v_s=1e-4, c1d_s=0.001, c2d_s=5e-5,
                  baseline_c1_step_s=0.008, baseline_c2_step_s=1e-4, prompt_tokens=1000.0, output_tokens=500.0)
    values.update(overrides)
    return Coefficients(**values)


@pytest.mark.parametrize(("text", "metric", "limit", "upper", "strict"), [
    ("e2e:mean<=2s", Metric.E2E, 2.0, True, False),
    ("ttft:mean<=300ms", Metric.TTFT, 0.3, True, False),
    ("tpot:mean < 40ms", Metric.TPOT, 0.04, True, True),
    ("throughput>=2000tok/s", Metric.THROUGHPUT, 2000.0, False, False),
    ("utilisation<=0.8", Metric.UTILISATION, 0.8, True, False),
    ("util<=80%", Metric.UTILISATION, 0.8, True, False),
    ("latency:mean<=1.5s", Metric.E2E, 1.5, True, False),
    ("E2E:MEAN<=500us", Metric.E2E, 5e-4, True, False),
])
def test_parse_valid_slos(text, metric, limit, upper, strict) -> None:
    slo = parse_slo(text)
    assert (slo.metric, slo.upper_bound, slo.strict) == (metric, upper, strict)
    assert slo.limit == pytest.approx(limit)


@pytest.mark.parametrize(("text", "message"), [
    ("e2e:p99<=5s", "means only"),
    ("ttft:p90<=300ms", "means only"),
    ("e2e<=2s", "say which statistic"),
    ("e2e:mean<=2", "needs a unit"),
    ("e2e:mean<=2parsecs", "unknown unit"),
    ("e2e:mean<=2tok/s", "expected a time"),
    ("e2e:mean>=2s", "upper bounds"),
    ("throughput<=2000tok/s", "lower bound"),
    ("throughput>=2000", "needs a unit"),
    ("utilisation<=1", "below 1"),
    ("goodput>=3rps", "unknown metric"),
    ("e2e:mean<=0s", "> 0"),
    ("nonsense", "METRIC:STATISTIC"),
])
def test_parse_invalid_slos(text, message) -> None:
    with pytest.raises(InvalidValueError, match=message):
        parse_slo(text)


def test_parse_quantity() -> None:
    assert parse_quantity("250ms", Dimension.TIME) == pytest.approx(0.25)
    assert parse_quantity("2 min", Dimension.TIME) == 120.0
    assert parse_quantity("12rps", Dimension.REQUEST_RATE) == 12.0
    with pytest.raises(InvalidValueError):
        parse_quantity("inf s", Dimension.TIME)


def test_finite_or_none_writes_unstable_as_null() -> None:
    # JSON refuses infinity and NaN (allow_nan=False), so an unstable latency must become None.
    assert finite_or_none(numpy.float32(0.25)) == 0.25
    assert type(finite_or_none(numpy.float32(0.25))) is float  # json.dumps refuses a numpy float32
    assert finite_or_none(math.inf) is None
    assert finite_or_none(-math.inf) is None
    assert finite_or_none(math.nan) is None
    assert json.dumps([finite_or_none(math.inf)], allow_nan=False) == "[null]"


@settings(max_examples=100)
@given(st.floats(0.3, 0.95), st.floats(0.0, 3.0), st.floats(1.05, 40.0))
def test_ttft_slo_binds_capacity_under_load(alpha: float, load_steps: float, headroom: float) -> None:
    """B11: TTFT grows with the effective batch and the prefill queue's wait, so a TTFT SLO bounds the rate
    (equality at capacity), even with no load weight (``load_steps = 0``): the wait alone grows with the rate."""
    from dataclasses import replace

    c = replace(coefficients(), ttft_wait_steps=0.5, ttft_load_steps=load_steps)
    ks = [1, 2, 4]
    zero_load = float(model.time_to_first_token(c, 0, 0.0))
    cap = capacity(c, ks, alpha, [parse_slo(f"ttft:mean<={zero_load * headroom * 1e3}ms")])
    result = planner.plan(c, cap.max_rate_rps, ks, [alpha])
    for index in numpy.flatnonzero(cap.feasible):
        saturation = float(model.saturation_rate(cap.c2_s[index]))
        ttft = result.baseline_ttft_load_s[index] if index == 0 else result.ttft_load_s[0, index, index - 1]
        if cap.max_rate_rps[index] < saturation * (1 - 1e-6):  # bound by TTFT, not by saturation
            # the inversion is exact; near saturation B = lambda L is ill-conditioned, hence 1e-6
            assert float(ttft) == pytest.approx(zero_load * headroom, rel=1e-6)


def test_evaluate_marks_unstable_as_failed() -> None:
    slos = [parse_slo("ttft:mean<=1s"), parse_slo("throughput>=1tok/s")]
    point = OperatingPoint(e2e_s=math.inf, ttft_s=0.01, tpot_s=math.inf, throughput_tok_s=100.0, utilisation=1.2)
    assert [v.passed for v in evaluate(slos, point)] == [False, False]
    point = OperatingPoint(e2e_s=1.0, ttft_s=0.01, tpot_s=0.01, throughput_tok_s=100.0, utilisation=0.5)
    verdicts = evaluate(slos, point)
    assert [v.passed for v in verdicts] == [True, True]
    assert verdicts[0].margin == pytest.approx(0.99)


@settings(max_examples=100)
@given(st.floats(0.3, 0.95), st.floats(4.5, 30.0), st.floats(0.005, 0.05))
def test_capacity_rate_meets_latency_slos_with_equality(alpha: float, e2e_limit: float, tpot_limit: float) -> None:
    c = coefficients()
    ks = [1, 2, 3, 4, 6]
    for text, metric in ((f"e2e:mean<={e2e_limit}s", "e2e"), (f"tpot:mean<={tpot_limit * 1e3}ms", "tpot")):
        cap = capacity(c, ks, alpha, [parse_slo(text)])
        result = planner.plan(c, cap.max_rate_rps, ks, [alpha])
        for index in numpy.flatnonzero(cap.feasible):
            rate_index = index  # plan row i is evaluated at option i's capacity
            latency = (result.baseline_latency_s[rate_index] if index == 0
                       else result.latency_s[0, rate_index, index - 1])
            if metric == "e2e":
                assert latency == pytest.approx(e2e_limit, rel=1e-9)
            else:
                # TPOT = (L - TTFT(B))/(g - 1) with TTFT under load, as the planner reports it
                tpot = result.baseline_tpot_s[rate_index] if index == 0 else result.tpot_s[0, rate_index, index - 1]
                assert tpot == pytest.approx(tpot_limit, rel=1e-9)
            # a little more load breaks the SLO
            c1, c2 = cap.c1_s[index], cap.c2_s[index]
            assert float(model.mean_latency(c1, c2, cap.max_rate_rps[index] * 1.001)) > latency


def test_capacity_takes_the_tightest_slo_and_reports_it() -> None:
    c = coefficients()
    slos = [parse_slo("e2e:mean<=20s"), parse_slo("utilisation<=0.5")]
    cap = capacity(c, [2, 4], 0.8, slos)
    for index in range(3):
        by_latency = (1 - cap.c1_s[index] / 20.0) / cap.c2_s[index]
        by_util = 0.5 / cap.c2_s[index]
        assert cap.max_rate_rps[index] == pytest.approx(min(by_latency, by_util))
        expected = "e2e:mean<=20s" if by_latency < by_util else "utilisation<=0.5"
        assert cap.binding_slo[index] == expected


def test_capacity_infeasible_and_lower_bounds() -> None:
    c = coefficients()
    c1_d, _ = model.baseline_demand(c)
    cap = capacity(c, [1, 2], 0.7, [parse_slo(f"e2e:mean<={c1_d * 0.5}s")])
    assert not cap.feasible[0] and cap.max_rate_rps[0] == 0.0
    cap = capacity(c, [1], 0.7, [parse_slo("e2e:mean<=30s"), parse_slo("throughput>=1000000tok/s")])
    assert not numpy.any(cap.feasible) and cap.best == -1
    cap = capacity(c, [1], 0.7, [parse_slo("e2e:mean<=30s"), parse_slo("ttft:mean<=1ms")])
    assert not numpy.any(cap.feasible)  # TTFT ~ c1p = 50 ms at any load
    with pytest.raises(InvalidValueError, match="bounds the request rate"):
        capacity(c, [1], 0.7, [parse_slo("throughput>=10tok/s")])


def test_replicas_rounding_and_costs() -> None:
    assert replicas_needed(10.0, 2.5) == 4
    assert replicas_needed(10.01, 2.5) == 5
    assert replicas_needed(0.1, 2.5) == 1
    assert replicas_needed(10.0, 0.0) is None
    plan = fleet("k=3", 2.5, 10.0, 500.0, gpus_per_replica=2, gpu_hour_cost_usd=3.0)
    assert plan is not None
    assert (plan.replicas, plan.gpus, plan.cost_per_hour_usd) == (4, 8, 24.0)
    assert plan.cost_per_million_output_tokens_usd == pytest.approx(24.0 / (10 * 500 * 3600) * 1e6)
    bare = fleet("off", 2.5, 10.0, 500.0, None, None)
    assert bare is not None and bare.gpus is None and bare.cost_per_hour_usd is None


def test_schedule_covers_all_batch_sizes_and_shrinks_k() -> None:
    c = coefficients(c2d_s=2e-4)
    schedule = batch_size_schedule(c, list(range(1, 9)), 0.8, 256)
    assert schedule[0][0] == 1 and schedule[-1][1] == 256
    for (a, b, _), (c_start, _, _) in zip(schedule, schedule[1:]):
        assert c_start == b + 1 and a <= b
    ks = [k for _, _, k in schedule]
    assert ks == sorted(ks, reverse=True) and len(set(ks)) > 1
    # each range's k is the planner's best k at a rate whose batch falls in that range
    rates = numpy.linspace(0.01, 9.0, 300)
    result = planner.plan(c, rates, list(range(1, 9)), [0.8])
    batch = rates * result.best_latency_s[0]
    for rate_index in range(0, 300, 37):
        if result.best_k[0, rate_index] == planner.NONE_STABLE:
            continue
        size = max(1, math.ceil(batch[rate_index]))
        if size > 256:
            continue
        k = next(k for a, b, k in schedule if a <= size <= b)
        assert abs(k - result.best_k[0, rate_index]) <= 1  # neighbouring ranges may round either way
