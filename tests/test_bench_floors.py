"""sdplan.accuracy.floors: what the servers' spread leaves to any model, and regret that noise cannot fake.

The floor is checked against a simulation of the benchmark's own protocol (a calibration on ``m`` server
instances, a validation run on another), the regrets against hand-computed geometric means, and the pooling
on the stored summaries of real benchmark runs (benchmarks/summaries). Nothing here starts vLLM.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sdplan.accuracy import floors
from sdplan.accuracy import summary as bench

ROOT = Path(__file__).resolve().parent.parent
SUMMARIES = ROOT / "benchmarks" / "summaries"


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
