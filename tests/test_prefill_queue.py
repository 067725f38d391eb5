"""The wait for the prefills queued ahead of an open loop's arrival (docs/model.md#prefills-queued-ahead)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sdplan.calibration import resolve_calibration
from sdplan.inputs.slo import parse_slo
from sdplan.latency import knee, model
from sdplan.planning import planner
from sdplan.planning.capacity import capacity, latency_at
from sdplan.simulate import SimulationConfig, simulate

#: The default file at a prompt-heavy workload: 8,192-token prompts are 90% of C2.
HEAVY = resolve_calibration(None).coefficients_at(8192, 64)


def test_the_wait_is_pollaczek_khinchine() -> None:
    # M/D/1 at half load waits half a service; the spread of the prompts adds (1 + cv^2)
    assert float(knee.prefill_wait_s(0.2, 0.0, 2.5)) == pytest.approx(0.1)
    assert float(knee.prefill_wait_s(0.2, 1.0, 2.5)) == pytest.approx(0.2)
    assert float(knee.prefill_wait_s(0.2, 0.0, 0.0)) == 0.0
    assert np.isinf(knee.prefill_wait_s(0.2, 0.0, 5.0))  # the prefills alone saturate the server
    rates = np.linspace(0.0, 4.9, 50)
    assert np.all(np.diff(knee.prefill_wait_s(0.2, 0.0, rates)) > 0)


def test_the_law_adds_the_wait_to_c1_and_keeps_the_saturation() -> None:
    c1, c2 = model.baseline_demand(HEAVY)
    bend = model.baseline_knee(HEAVY, c1, c2)
    for rate in (0.0, 1.0, 2.5, 3.5):
        wait = float(knee.prefill_wait_s(HEAVY.c2p_s, HEAVY.prompt_cv, rate))
        expected = (float(c1) + wait) / (1.0 - rate * float(c2))
        assert float(knee.mean_latency(c1, c2, bend, rate)) == pytest.approx(expected, rel=1e-12)
    assert float(knee.mean_latency(c1, c2, bend, 0.0)) == pytest.approx(float(c1), rel=1e-12)  # alone: C1
    plan = planner.plan(HEAVY, [1.0], [3], [0.7])
    assert float(plan.baseline_saturation_rate_rps) == pytest.approx(1.0 / float(bend.c2_above_s), rel=1e-12)


def test_ttft_waits_in_an_open_loop_only() -> None:
    rate = 3.0
    plan = planner.plan(HEAVY, [rate], [3], [0.7])
    wait = float(knee.prefill_wait_s(HEAVY.c2p_s, HEAVY.prompt_cv, rate))
    batch = float(plan.baseline_batch[0])
    without = float(model.time_to_first_token(HEAVY, 0, batch))
    assert wait > 0.1  # a third of a second at 3 req/s: long prefills queue
    assert float(plan.baseline_ttft_load_s[0]) == pytest.approx(without + wait, rel=1e-12)


def test_the_break_even_is_where_the_latencies_meet() -> None:
    coefficients = dataclasses.replace(HEAVY, knee_tokens=0.0, knee_per_token_s=0.0)
    plan = planner.plan(coefficients, [1.0], [1, 4, 8], [0.3])
    crossed = np.isfinite(plan.break_even_rate_rps[0])
    assert crossed.any()
    for index in np.flatnonzero(crossed):
        rate = float(plan.break_even_rate_rps[0, index])
        at = planner.plan(coefficients, [rate], [[1, 4, 8][index]], [0.3])
        assert float(at.latency_s[0, 0, 0]) == pytest.approx(float(at.baseline_latency_s[0]), rel=1e-6)


def test_an_e2e_slo_holds_exactly_at_the_capacity() -> None:
    slo = parse_slo("e2e:mean<=2s")
    cap = capacity(HEAVY, [1, 3], 0.7, [slo])
    assert cap.feasible.all()
    np.testing.assert_allclose(latency_at(cap, cap.max_rate_rps), 2.0, rtol=1e-6)
    c1, c2 = model.baseline_demand(HEAVY)
    straight = (1.0 - float(c1) / 2.0) / float(c2)  # what the law without the wait allows
    assert cap.max_rate_rps[0] < straight


def test_the_planner_stays_near_the_simulator_where_prefills_queue() -> None:
    """8,192-token prompts at 60% load: processor sharing alone was 25% optimistic against the simulator, which
    queues prefills for the token budget as vLLM does; with the wait the planner is within 10%."""
    c1, c2 = model.baseline_demand(HEAVY)
    bend = model.baseline_knee(HEAVY, c1, c2)
    rate = 0.6 / float(bend.c2_above_s)
    simulated = np.mean([simulate(HEAVY, SimulationConfig(rate_rps=rate, draft_length=0, position_rates=(),
                                                          requests=6000, prompt_tokens=8192, output_tokens=64,
                                                          max_num_seqs=8192),
                                  np.random.default_rng(seed)).e2e_s.mean() for seed in range(2)])
    straight = float(model.mean_latency(c1, c2, rate))
    planned = float(knee.mean_latency(c1, c2, bend, rate))
    assert simulated / straight - 1 > 0.15
    assert abs(simulated / planned - 1) < 0.10
