"""sdplan.accuracy.floors: what the servers' spread leaves to any model, and regret that noise cannot fake.

The floor is checked against a simulation of the benchmark's own protocol (a calibration on ``m`` server
instances, a validation run on another), the regrets against hand-computed geometric means, and the pooling
on the stored summaries of real benchmark runs (benchmarks/summaries). Nothing here starts vLLM.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest

from sdplan.accuracy import floors
from sdplan.accuracy import summary as bench
from sdplan.calibration import load_calibration
from sdplan.fitting.runmodel import run_demand
from sdplan.latency import model
from sdplan.latency.coefficients import Coefficients
from sdplan.runs import read_results

ROOT = Path(__file__).resolve().parent.parent
SUMMARIES = ROOT / "benchmarks" / "summaries"
#: acc35's k=2 Poisson runs at 25/55/80% load, three passes on fresh servers, and the calibration of the same run.
PASSES = Path(__file__).parent / "data" / "served-passes-cpu"
#: acc60's calibration at 128/64 (/work/acc-runs/acc60/served.toml, [coefficients] and [ttft], to 6 digits).
ACC60 = Coefficients(c1p_s=0.0108156, c2p_s=0.00732578, c1v_s=0.00243126, c2v_s=0.000600817, c1d_s=0.000836784,
                     c2d_s=6.74557e-05, baseline_c1_step_s=0.00181414, baseline_c2_step_s=0.000234426,
                     prompt_tokens=128, output_tokens=64, ttft_wait_steps=0.89188, ttft_load_steps=1.539485,
                     ttft_offset_s=0.00848887)


def simulated_error(load: float, sigma: float, instances: int, draws: int = 400_000) -> float:
    """The benchmark's protocol drawn server by server: the calibration fits ``instances`` servers (its costs are
    their geometric mean), the validation runs on one more, both at the rate that loads the mean server to
    ``load``; the prediction's mean absolute error, each capped at 1 (an unstable prediction or server: 1)."""
    rng = np.random.default_rng(11)
    c1, c2 = 0.25, 0.004
    rate = load / c2
    calibrated = np.exp(rng.normal(0.0, sigma, size=(draws, instances)).mean(axis=1))
    validation = np.exp(rng.normal(0.0, sigma, size=draws))

    def latency(speed: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(rate * c2 * speed < 1.0, c1 * speed / (1.0 - rate * c2 * speed), np.inf)

    predicted, measured = latency(calibrated), latency(validation)
    with np.errstate(invalid="ignore"):
        error = np.where(np.isfinite(predicted) & np.isfinite(measured), np.abs(predicted / measured - 1.0), 1.0)
    return float(np.minimum(error, 1.0).mean())


@pytest.mark.parametrize(("load", "sigma", "instances"), [(0.3, 0.10, 2), (0.55, 0.13, 2), (0.8, 0.10, 1),
                                                          (0.8, 0.15, 2), (0.9, 0.08, 4)])
def test_the_floor_is_what_the_protocol_gives_a_model_exact_for_its_servers(load, sigma, instances) -> None:
    floor = floors.perfect_model_error(load, sigma, instances)
    assert floor == pytest.approx(simulated_error(load, sigma, instances), abs=0.01)


def test_the_floor_grows_with_the_spread_and_the_load_and_shrinks_with_instances() -> None:
    assert floors.perfect_model_error(0.8, 0.0, 2) == 0.0
    by_sigma = [floors.perfect_model_error(0.55, s, 2) for s in (0.02, 0.05, 0.10, 0.15)]
    by_load = [floors.perfect_model_error(rho, 0.10, 2) for rho in (0.1, 0.3, 0.55, 0.8)]
    by_instances = [floors.perfect_model_error(0.55, 0.10, m) for m in (1, 2, 4, 16)]
    assert by_sigma == sorted(by_sigma) and by_load == sorted(by_load)
    assert by_instances == sorted(by_instances, reverse=True)
    # the first-order value at low load: |d_c - d_v| has sd sigma sqrt(1 + 1/m), mean sd sqrt(2/pi)
    assert floors.perfect_model_error(0.01, 0.02, 2) == pytest.approx(0.02 * math.sqrt(1.5 * 2 / math.pi), rel=0.03)
    # past saturation every draw counts 1: at rho 0.99 and sigma 0.5 most draws of either server are
    assert floors.perfect_model_error(0.99, 0.5, 1) > 0.9


def test_a_slower_servers_latency_is_eq_1_with_every_cost_scaled() -> None:
    """The one home of L(u): the model's own mean latency on a server u times slower, over C1; inf past
    saturation. At rho = 1 the mean instance has no steady latency, yet two stable servers still compare."""
    c1, c2 = 0.25, 0.004
    speeds = np.array([0.7, 0.95, 1.0, 1.05, 1.2])
    for load in (0.0, 0.5, 0.9, 1.0, 1.3):
        expected = model.mean_latency(speeds * c1, speeds * c2, load / c2) / c1
        got = floors.slower_server_latency(speeds, load)
        assert np.array_equal(np.isinf(got), load * speeds >= 1.0)
        assert got[np.isfinite(got)] == pytest.approx(expected[np.isfinite(got)], rel=1e-12)
    assert 0.0 < floors.perfect_model_error(1.0, 0.10, 2) < 1.0


def records(latencies: dict[str, dict[int, float]]) -> list[dict]:
    return [{"run": run, "pass": 1, "workload": "256/32", "load": 0.55, "option": option, "e2e_s": value}
            for run, per in latencies.items() for option, value in per.items()]


#: Three runs at one rate: k=2 fastest in two, k=4 in the third; every run's drift of its own.
MEASURED = {"a": {0: 1.20, 2: 1.00, 4: 1.05}, "b": {0: 2.60, 2: 2.20, 4: 2.00}, "c": {0: 0.60, 2: 0.475, 4: 0.51}}


def relative(runs: list[str]) -> dict[int, float]:
    """Each option's log latency over the run's geometric mean, averaged over ``runs`` (by hand)."""
    out = {}
    for option in (0, 2, 4):
        values = []
        for run in runs:
            centre = sum(math.log(v) for v in MEASURED[run].values()) / 3
            values.append(math.log(MEASURED[run][option]) - centre)
        out[option] = sum(values) / len(values)
    return out


def test_regret_against_pooled_latencies_cancels_each_runs_drift() -> None:
    pooled = floors.pooled_latencies(records(MEASURED))
    assert pooled[("256/32", 0.55)] == pytest.approx(relative(["a", "b", "c"]))
    picks = [{"run": run, "workload": "256/32", "load": 0.55, "picked": picked}
             for run, picked in (("a", 2), ("b", 4), ("c", 0))]
    expected = relative(["a", "b", "c"])
    best = min(expected.values())
    regrets = floors.pooled_regret(records(MEASURED), picks)
    assert [value for value, _ in regrets] == pytest.approx(
        [0.0, 100 * (math.exp(expected[4] - best) - 1), 100 * (math.exp(expected[0] - best) - 1)])
    # the low end of the interval, from the runs' own ratios to the pooled best (k=2)
    for (_, low), picked in zip(regrets, (2, 4, 0)):
        ratios = [math.log(MEASURED[run][picked] / MEASURED[run][2]) for run in MEASURED]
        mean = sum(ratios) / 3
        error = math.sqrt(sum((x - mean) ** 2 for x in ratios) / 2 / 3)
        assert low == pytest.approx(100 * (math.exp(mean - 2 * error) - 1))
    # no SD is 20-27% slower in every run: over 5% beyond the noise; k=4 (+5%, -9%, +7%) is not
    assert regrets[2][1] > 5.0 and regrets[1][1] < 5.0
    nothing = floors.pooled_regret(records(MEASURED), [{"run": "a", "workload": "256/32", "load": 0.55,
                                                         "picked": None}])
    assert nothing == [(math.inf, math.inf)]
    single = floors.pooled_regret(records({"a": MEASURED["a"]}), [{"run": "a", "workload": "256/32",
                                                                     "load": 0.55, "picked": 0}])
    assert single[0][0] == pytest.approx(20.0) and single[0][1] == -math.inf  # one run: no interval
    elsewhere = [{"run": "a", "workload": "16/192", "load": 0.55, "picked": 2}]
    assert floors.pooled_regret(records(MEASURED), elsewhere) == []


def test_an_oracle_right_in_expectation_still_loses_single_runs() -> None:
    regrets = floors.oracle_regret(records(MEASURED))
    expected = []
    for run in ("a", "b", "c"):
        others = relative([r for r in MEASURED if r != run])
        pick = min(others, key=lambda option: others[option])
        expected.append(100 * (MEASURED[run][pick] / min(MEASURED[run].values()) - 1))
    assert regrets == pytest.approx(expected)
    assert regrets[1] == pytest.approx(10.0)  # run b: k=2 is best elsewhere, k=4 ran 10% faster here
    assert floors.oracle_regret(records({"a": MEASURED["a"]})) == []  # no other run to learn from


def test_the_floor_is_taken_at_the_utilisation_lambda_c2_not_at_the_measured_plateau() -> None:
    """docs/model.md: rho = lambda C2, C2 the calibration's (1/C2 = uncapped_rps); a closed loop tops out below
    1/C2, so the rate over the measured plateau is higher and would raise the floor."""
    saturation = [{"run": "a", "pass": 1, "workload": "128/64", "option": 0, "measured_rps": 29.4,
                   "uncapped_rps": 35.3},
                  {"run": "a", "pass": 1, "workload": "128/64", "option": 2, "measured_rps": 20.0,
                   "uncapped_rps": None}]  # C2 <= 0: no saturation
    runs = [{"run": "a", "pass": 1, "workload": "128/64", "option": option, "load": 0.8, "rate_rps": 16.0,
             "e2e_s": 1.0, "predicted_e2e_s": 1.2} for option in (0, 2)]
    rows = floors.floor_rows(runs, saturation, {"a": (10.0, 2)})
    assert [row["rho"] for row in rows] == pytest.approx([16.0 / 35.3, 0.0])
    assert [row["plateau_load"] for row in rows] == pytest.approx([16.0 / 29.4, 16.0 / 20.0])
    assert rows[0]["floor_pct"] == pytest.approx(100 * floors.perfect_model_error(16.0 / 35.3, 0.1, 2))
    assert rows[0]["floor_pct"] < 100 * floors.perfect_model_error(16.0 / 29.4, 0.1, 2)
    assert rows[1]["floor_pct"] == pytest.approx(100 * floors.perfect_model_error(0.0, 0.1, 2))
    assert [row["error_pct"] for row in rows] == pytest.approx([20.0, 20.0])


def test_pooling_the_stored_runs_reports_the_floors_beside_the_goals() -> None:
    # the runs of 2026-11-22...28 this test's figures were computed on (acc45 as the line predicted); later runs
    # (acc60-62) keep their calibrations apart and are pooled by re-prediction instead
    paths = sorted(p for p in SUMMARIES.glob("acc*.json") if p.name != "acc45.json" and p.stem < "acc60")
    documents = [bench.read_document(path) for path in paths]
    with_spread = {d["run_id"] for d in documents if floors.calibration_spread(d) is not None}
    assert with_spread and with_spread < {d["run_id"] for d in documents}  # acc38, acc39, acc48 record none
    summary = bench.pool(documents)
    noise = summary["noise"]
    assert set(noise["spreads"]) == with_spread
    assert noise["poisson_runs"] == sum(len(d["records"]["runs"]) for d in documents if d["run_id"] in with_spread)
    loads = [noise["by_load"][key]["perfect_model_e2e_mape_pct"] for key in sorted(noise["by_load"], key=float)]
    assert loads == sorted(loads) and len(loads) == 3
    # acc40-acc50 at nominal 30/55/80%: rho = lambda C2 below the load on the measured plateau, the floor with it
    rho = [noise["by_load"][key]["mean_rho"] for key in sorted(noise["by_load"], key=float)]
    plateau = [noise["by_load"][key]["mean_plateau_load"] for key in sorted(noise["by_load"], key=float)]
    assert rho == pytest.approx([0.252, 0.461, 0.671], abs=1e-3) and all(r < q for r, q in zip(rho, plateau))
    assert loads == pytest.approx([15.0, 21.3, 35.7], abs=0.05)
    # the stored predictions were made by each run's own code, and the report says so
    assert summary["predicted_by"] == [bench.UNRECORDED_CODE]
    assert bench.report_lines(summary)[0].startswith("predictions as stored")
    assert noise["pooled_regret_rates"] == noise["oracle_regret_rates"] == summary["rates_compared"]
    lines = bench.report_lines(summary)
    assert any(line.startswith("a model exact but for the servers' speeds") for line in lines)
    assert any("pooled over every run" in line for line in lines)
    json.dumps(summary, allow_nan=False)  # the pooled summary is written as strict JSON


def slower(coefficients: Coefficients, speed: float) -> Coefficients:
    """A server ``speed`` times slower at every cost (every field in seconds)."""
    return replace(coefficients, **{f.name: getattr(coefficients, f.name) * speed for f in fields(coefficients)
                                    if f.name.endswith("_s")})


def open_loop_ttft(coefficients: Coefficients, rate: float) -> float:
    """The model's mean TTFT of no SD in an open loop at ``rate``: at ``B = lambda L`` (inf: unstable)."""
    latency = float(model.mean_latency(*model.baseline_demand(coefficients), rate))
    return math.inf if not math.isfinite(latency) else float(model.time_to_first_token(coefficients, 0, rate * latency))


@pytest.mark.parametrize(("load", "sigma", "instances", "load_steps", "shares"),
                         [(0.3, 0.10, 2, None, (0.03, 0.1)), (0.8, 0.10, 2, None, (0.3, 0.45)),
                          (0.55, 0.15, 1, 15.0, (0.5, 0.8))])
def test_the_ttft_floor_is_what_the_protocol_gives_the_models_own_ttft(load, sigma, instances, load_steps,
                                                                       shares) -> None:
    """The derivation checked against the model itself: servers drawn one by one, each with every cost scaled,
    their TTFT computed by ``time_to_first_token`` at ``B = lambda L`` of their own ``L``; the floor needs only
    ``rho`` and the mean instance's queue share. acc60's own TTFT weights put 6% and 37% of its no-SD TTFT in the
    queue at 30% and 80% load; a load weight of 15 puts 64% there at 55%."""
    coefficients = ACC60 if load_steps is None else replace(ACC60, ttft_load_steps=load_steps)
    rate = load / model.baseline_demand(coefficients)[1]
    share = 1.0 - float(model.time_to_first_token(coefficients, 0, 0.0)) / open_loop_ttft(coefficients, rate)
    assert shares[0] < share < shares[1]
    rng = np.random.default_rng(7)
    draws = 6000
    calibrated = np.exp(rng.normal(0.0, sigma, size=(draws, instances)).mean(axis=1))
    validation = np.exp(rng.normal(0.0, sigma, size=draws))
    predicted = np.array([open_loop_ttft(slower(coefficients, u), rate) for u in calibrated])
    measured = np.array([open_loop_ttft(slower(coefficients, u), rate) for u in validation])
    with np.errstate(invalid="ignore"):
        error = np.where(np.isfinite(predicted) & np.isfinite(measured), np.abs(predicted / measured - 1.0), 1.0)
    simulated = float(np.minimum(error, 1.0).mean())
    assert floors.perfect_model_ttft_error(load, sigma, instances, share) == pytest.approx(simulated, abs=0.01)
    # the speed factor is the model's: T(u)/T(1) for a server u times slower
    for u in (0.8, 1.0, 1.15):
        assert float(floors.ttft_speed_factor(np.array(u), load, share)) == pytest.approx(
            open_loop_ttft(slower(coefficients, u), rate) / open_loop_ttft(coefficients, rate))


def test_the_ttft_floor_lies_between_the_load_free_floor_and_e2es_times_the_speed() -> None:
    assert floors.perfect_model_ttft_error(0.8, 0.0, 2, 0.7) == 0.0
    by_sigma = [floors.perfect_model_ttft_error(0.55, s, 2, 0.5) for s in (0.02, 0.05, 0.10, 0.15)]
    by_share = [floors.perfect_model_ttft_error(0.55, 0.10, 2, q) for q in (0.0, 0.25, 0.5, 0.75, 1.0)]
    by_load = [floors.perfect_model_ttft_error(rho, 0.10, 2, 0.5) for rho in (0.1, 0.3, 0.55, 0.8)]
    assert by_sigma == sorted(by_sigma) and by_share == sorted(by_share) and by_load == sorted(by_load)
    assert by_sigma[0] > 0 and by_share[0] < by_share[-1] and by_load[0] < by_load[-1]
    load_free = floors.perfect_model_error(0.0, 0.10, 2)
    for rho in (0.3, 0.55, 0.8):
        # q = 0: TTFT is proportional to the speed, the floor is E2E's at zero load, but for the servers past
        # saturation (at rho 0.8 those 25% slower, 2.2 sigma), which count 1 in TTFT's
        ttft = floors.perfect_model_ttft_error(rho, 0.10, 2, 0.0)
        assert ttft == pytest.approx(load_free, abs=1e-6) if rho < 0.6 else ttft > load_free + 0.01
        # q = 1: the speed times E2E's ratio, two factors on one side of 1: above E2E's floor at the same rho
        assert floors.perfect_model_ttft_error(rho, 0.10, 2, 1.0) > floors.perfect_model_error(rho, 0.10, 2)
    # even at a light load the queue's part grows like u^2 (a slower server holds more requests, each step slower):
    # a TTFT all queue errs about twice as much as E2E there
    light = floors.perfect_model_ttft_error(0.01, 0.10, 2, 1.0) / floors.perfect_model_error(0.01, 0.10, 2)
    assert light == pytest.approx(2.0, rel=0.05)


def test_floor_rows_carry_the_ttft_floor_where_the_record_gives_its_queue_share() -> None:
    saturation = [{"run": "a", "pass": 1, "workload": "128/64", "option": 0, "measured_rps": 29.4,
                   "uncapped_rps": 35.3}]
    base = {"run": "a", "pass": 1, "workload": "128/64", "option": 0, "load": 0.8, "rate_rps": 16.0, "e2e_s": 1.0,
            "predicted_e2e_s": 1.2, "ttft_s": 0.10, "predicted_ttft_s": 0.08}
    older, shared, unstable = (dict(base), {**base, "predicted_ttft_alone_s": 0.02},
                               {**base, "predicted_ttft_alone_s": 0.02, "predicted_ttft_s": None})
    rows = floors.floor_rows([older, shared, unstable], saturation, {"a": (10.0, 2)})
    assert rows[0]["ttft_share"] is None and rows[0]["ttft_floor_pct"] is None  # a summary before the TTFT floor
    assert rows[1]["ttft_share"] == pytest.approx(0.75)
    assert rows[1]["ttft_floor_pct"] == pytest.approx(100 * floors.perfect_model_ttft_error(16.0 / 35.3, 0.1, 2, 0.75))
    assert rows[1]["ttft_error_pct"] == pytest.approx(20.0)
    assert rows[2]["ttft_share"] == 1.0 and rows[2]["ttft_error_pct"] == 100.0  # unstable: the queue is all of it
    figures = floors.floor_figures(rows)
    assert figures["poisson_runs"] == 3 and figures["ttft_poisson_runs"] == 2
    assert figures["ttft_mape_pct"] == pytest.approx(60.0)


def pct(predicted: float | None, measured: float) -> float | None:
    return None if predicted is None else 100 * (predicted / measured - 1)


def test_pooling_reports_ttft_bias_per_run_as_it_does_for_e2e() -> None:
    """acc60-62 as stored (their own code made the predictions): TTFT's mean, median and share negative, per
    run and per Poisson run, by hand from the records; their records keep no queue share, so no TTFT floor."""
    documents = [bench.read_document(SUMMARIES / f"acc{n}.json") for n in (60, 61, 62)]
    summary = bench.pool(documents)
    per_run = []
    every = []
    for d in documents:
        errors = [e for r in d["records"]["runs"] for e in [pct(r["predicted_ttft_s"], r["ttft_s"])] if e is not None]
        per_run.append(sum(errors) / len(errors))
        every += errors
    assert summary["ttft_bias_per_run_pct"] == pytest.approx(per_run)
    assert summary["ttft_bias_per_run_median_pct"] == pytest.approx(sorted(per_run)[1])
    assert summary["ttft_bias_per_run_negative_share"] == pytest.approx(sum(b < 0 for b in per_run) / 3)
    mean = sum(per_run) / 3
    assert summary["ttft_bias_standard_error_pct"] == pytest.approx(
        math.sqrt(sum((b - mean) ** 2 for b in per_run) / 2 / 3))
    everything = summary["all"]
    assert everything["ttft_bias_pct"] == pytest.approx(sum(every) / len(every))
    assert everything["ttft_mape_pct"] == pytest.approx(sum(abs(e) for e in every) / len(every))
    assert everything["ttft_median_error_pct"] == pytest.approx(float(np.median(every)))
    assert everything["ttft_negative_share"] == pytest.approx(sum(e < 0 for e in every) / len(every))
    noise = summary["noise"]
    assert noise["poisson_runs"] > 0 and noise["ttft_poisson_runs"] == 0
    assert set(noise["by_run"]) == {"acc60", "acc61", "acc62"}
    lines = bench.report_lines(summary)
    assert any(line.startswith("TTFT bias per benchmark run: ") for line in lines)
    assert any(line.startswith("TTFT error per Poisson run: ") for line in lines)
    assert not any(line.startswith("the same model's TTFT") for line in lines)
    assert any(line.strip().startswith("acc61: E2E") for line in lines)


def test_pooled_records_of_real_runs_carry_the_ttft_floor_beside_its_score() -> None:
    """acc35's passes as three benchmark runs of the current code: each record's queue share from its calibration,
    the floor at its rho and share, by load, by run and over all, and the report's lines."""
    calibration = load_calibration(PASSES / "served.toml")
    runs = [read_results(path)[0][0] for path in sorted(PASSES.glob("pass*.json"))]
    documents = []
    for name in ("pass1", "pass2", "pass3"):
        own = [run for run in runs if Path(run.source).name.startswith(name)]
        records = [bench.run_record(run, calibration.coefficients_at, planned_e2e_s=None, run=name, **{"pass": 1},
                                    workload="128/64", load=float(Path(run.source).stem.split("poisson")[1]),
                                    rate_rps=run.requested_rate_rps) for run in own]
        c2 = run_demand(calibration.coefficients_at(128, 64), own[0])[1]
        saturation = [{"run": name, "pass": 1, "workload": "128/64", "option": 2, "measured_rps": 0.9 / c2,
                       "predicted_rps": 0.9 / c2, "uncapped_rps": 1.0 / c2}]
        documents.append({"version": bench.SUMMARY_VERSION, "run_id": name, "calibrate_wall_s": 300.0,
                          "calibration_spread": {"repeat_sd_pct": 8.0, "instances": 2}, "predicted_by": "one code",
                          "records": {"runs": records, "saturation": saturation, "picks": []}})
    noise = bench.pool(documents)["noise"]
    assert noise["ttft_poisson_runs"] == noise["poisson_runs"] == 9
    rows = floors.floor_rows([r for d in documents for r in d["records"]["runs"]],
                             [s for d in documents for s in d["records"]["saturation"]],
                             {d["run_id"]: (8.0, 2) for d in documents})
    for row, record in zip(rows, [r for d in documents for r in d["records"]["runs"]]):
        share = 1 - record["predicted_ttft_alone_s"] / record["predicted_ttft_s"]
        assert 0 < share < 1 and row["ttft_share"] == pytest.approx(share)
        assert row["ttft_floor_pct"] == pytest.approx(100 * floors.perfect_model_ttft_error(row["rho"], 0.08, 2, share))
        scored = abs(100 * (record["predicted_ttft_s"] / record["ttft_s"] - 1))
        assert row["ttft_error_pct"] == pytest.approx(min(100.0, scored))
    shares = [noise["by_load"][key]["mean_ttft_share"] for key in sorted(noise["by_load"], key=float)]
    assert shares == sorted(shares)  # the queue's part of TTFT grows with the load
    assert noise["perfect_model_ttft_mape_pct"] == pytest.approx(sum(row["ttft_floor_pct"] for row in rows) / 9)
    assert noise["by_run"]["pass2"]["ttft_poisson_runs"] == 3
    lines = bench.report_lines(bench.pool(documents))
    assert any(line.startswith("the same model's TTFT") for line in lines)
    assert any(line.strip().startswith("pass2: E2E") and "TTFT" in line for line in lines)
