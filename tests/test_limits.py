"""Limits of the analytic model: calibrated batch range and the engine's batch cap.

See docs/model.md#saturation-and-batch-cap.
"""

from __future__ import annotations

import json

import numpy
import pytest

from sdplan.inputs.slo import parse_slo
from sdplan.latency import model
from sdplan.latency.coefficients import Coefficients
from sdplan.planning.capacity import batch_cap_label, capacity, latency_at

C = Coefficients(c1p_s=0.04, c2p_s=0.03, c1v_s=0.0072, c2v_s=1e-4, c1d_s=0.0012, c2d_s=5.6e-5,
                 baseline_c1_step_s=0.0067, baseline_c2_step_s=1e-4, prompt_tokens=1024.0, output_tokens=512.0)
CPU = "cpu-epyc-2core_tiny-llama-h256-l4_tiny-llama-h128-l1_measured"


def test_capacity_never_exceeds_the_batch_cap() -> None:
    slos = [parse_slo("e2e:mean<=60s")]
    free = capacity(C, [1, 3], 0.8, slos)
    capped = capacity(C, [1, 3], 0.8, slos, max_batch=32)
    batch = capped.max_rate_rps * latency_at(capped, capped.max_rate_rps)
    assert numpy.all(batch <= 32 * (1 + 1e-9))
    assert numpy.all(capped.max_rate_rps < free.max_rate_rps)
    assert capped.binding_slo == [batch_cap_label(32)] * 3
    numpy.testing.assert_allclose(batch, 32.0, rtol=1e-9)  # the cap binds exactly at lambda L = 32
    # and there the option saturates, as plan says: past the cap's rate it has no steady state
    numpy.testing.assert_allclose(capped.saturation_rate_rps, capped.max_rate_rps, rtol=1e-12)
    assert numpy.all(capped.saturation_rate_rps < free.saturation_rate_rps)
    numpy.testing.assert_allclose(free.saturation_rate_rps, 1.0 / free.c2_s, rtol=1e-12)


def test_a_full_batch_runs_as_the_closed_loop_the_validation_predicts() -> None:
    """The plateau of a sweep is the closed loop's N / L with L = C1 + f (N - 1) C2, as validation predicts it."""
    from dataclasses import replace

    from sdplan.fitting.runmodel import run_demand
    from sdplan.fitting.validation import predict_latency
    from sdplan.runs import BenchmarkRun

    coefficients = replace(C, closed_loop_factor=0.9)
    run = BenchmarkRun(source="x", requested_rate_rps=None, achieved_rate_rps=10.0, draft_length=0, alpha=None,
                       prompt_tokens=1024.0, output_tokens=512.0, mean_e2e_latency_s=1.0, concurrency=64)
    c1, c2 = run_demand(coefficients, run)
    throughput = model.closed_loop_throughput(c1, c2, 64, 0.9)
    assert throughput == pytest.approx(64 / predict_latency(coefficients, run), rel=1e-12)
    assert throughput == pytest.approx(64 / (c1 + 0.9 * 63 * c2), rel=1e-12)
    # f < 1: more than the open-loop rate at which the mean batch reaches the cap
    assert throughput > float(model.batch_cap_rate(c1, c2, 64))
    assert model.closed_loop_throughput(c1, c2, 1) == pytest.approx(1 / c1)


def test_batch_cap_rate_inverts_littles_law() -> None:
    c1, c2 = 2.0, 0.05
    rate = float(model.batch_cap_rate(c1, c2, 10.0))
    assert rate * float(model.mean_latency(c1, c2, rate)) == pytest.approx(10.0)
    from sdplan.calibration import resolve_calibration
    from sdplan.inputs.serving import LimitOptions, batch_cap_warning, resolve_limits

    limits = resolve_limits(resolve_calibration(None), None, LimitOptions(max_num_seqs=10), [0], 512, 128)
    assert not limits.reached(9.99) and limits.reached(10.0) and limits.reached(float("inf"))
    assert "batch cap of 10 sequences (the max_num_seqs given)" in batch_cap_warning(limits, "at 1 req/s")


def test_every_command_warns_outside_the_calibrated_batch_range(sdplan) -> None:
    common = ["-c", CPU, "--acceptance", "0.8", "--prompt-tokens", "512", "--output-tokens", "128"]
    plan = sdplan("plan", *common, "-f", "json")
    assert plan.exit_code == 0, plan.output
    assert any("calibrated batch sizes [1, 16]" in w for w in json.loads(plan.stdout)["warnings"])
    rows = json.loads(plan.stdout)["results"][0]["rates"]
    rate = next(r["request_rate_rps"] for r in rows if 16 < (r["baseline"]["effective_batch_size"] or 0) < 1e3)
    check = sdplan("check", *common, "--rate", str(rate), "--draft-length", "off", "--slo", "e2e:mean<=100s",
                   "-f", "json")
    assert any("calibrated batch sizes" in w for w in json.loads(check.stdout)["warnings"])
    assert "calibrated batch sizes" in check.stderr
    cap = sdplan("capacity", *common, "--slo", "e2e:mean<=30s", "-f", "json")
    assert any("calibrated batch sizes" in w for w in json.loads(cap.stdout)["warnings"])
    out_of_range = sdplan("check", "-c", CPU, "--acceptance", "0.8", "--prompt-tokens", "8000", "--rate", "0.1",
                          "--slo", "e2e:mean<=100s")
    assert "outside the calibrated range" in out_of_range.stderr


def test_plan_and_check_say_when_the_batch_reaches_the_cap(sdplan) -> None:
    check = sdplan("check", "--acceptance", "0.8", "--rate", "12", "--draft-length", "off", "--slo", "e2e:mean<=1000s",
                   "--max-num-seqs", "64")
    assert "batch cap of 64 sequences" in check.stderr


def test_prefill_dominated_load_is_flagged_where_the_simulator_departs() -> None:
    # c2p/C2 = 0.9 at rho 0.8: the simulator is 9-10% off the planner's law (benchmarks/map_model_vs_simulator.py)
    assert model.prefill_interference_warning(0.9, 1.0, 0.8) is not None
    assert model.prefill_interference_warning(0.3, 1.0, 0.8) is None  # decode-dominated: within 5%
    assert model.prefill_interference_warning(0.9, 1.0, 0.2) is None  # light load: within ~10%


def test_closed_form_departs_from_the_simulator_only_where_flagged() -> None:
    """Where prefill dominates C2 the straight law is >10% optimistic; the wait for the prefills queued ahead
    (docs/model.md#prefills-queued-ahead) brings the planner's law back within 12%. Elsewhere both are within 5%."""
    from sdplan.calibration import resolve_calibration
    from sdplan.latency import knee
    from sdplan.simulate import SimulationConfig, simulate

    for p, g, expect_flag in ((1024, 512, False), (8192, 64, True)):  # the default calibration
        c = resolve_calibration(None).coefficients_at(p, g)
        c1, c2 = (float(x) for x in model.baseline_demand(c))
        lam = 0.7 / c2
        runs = [simulate(c, SimulationConfig(rate_rps=lam, draft_length=0, position_rates=(), requests=6000,
                                             prompt_tokens=p, output_tokens=g, max_num_seqs=8192),
                         numpy.random.default_rng(seed)).e2e_s.mean() for seed in range(2)]
        straight = numpy.mean(runs) / float(model.mean_latency(c1, c2, lam)) - 1
        planned = numpy.mean(runs) / float(knee.mean_latency(c1, c2, model.baseline_knee(c, c1, c2), lam)) - 1
        flagged = model.prefill_interference_warning(c.c2p_s, c2, 0.7) is not None
        assert flagged == expect_flag
        assert (straight > 0.10) if expect_flag else (abs(straight) < 0.05)
        assert abs(planned) < (0.12 if expect_flag else 0.05)
