"""What the machine's noise leaves to any model: the floors under the accuracy benchmark's goals.

A benchmark run (``accuracy_served.py``) predicts servers other than the ones it calibrated on. Servers of one
configuration started minutes apart run at speeds a factor ``exp(d)`` apart, ``d ~ N(0, sigma^2)``; each
calibration measures its own ``sigma`` from the levels it repeats on a second instance (``[uncertainty]
repeat_sd_pct``, :attr:`sdplan.fitting.validation.RepeatSpread.sd_pct`: 4.5-16.3% on the 2-core VMs of acc40-49). So
even a model exact for the calibration's servers errs against the validation's, and near saturation
``L = C1/(1 - lambda C2)`` magnifies the error: at 80% load a server 10% slower runs 83% slower.

Three figures, none from the latencies being judged:

- :func:`perfect_model_error`: the mean absolute E2E error (each capped at 100%) a model exact but for the
  servers' speeds shows against one run, given that run's utilisation ``rho = lambda C2`` (docs/model.md;
  ``C2`` the calibration's, at the option and workload) and its calibration's ``sigma``;
- :func:`pooled_regret`: the regret of each pick against the options' latencies pooled over every run (the
  noise of one run averages out, a wrong model does not);
- :func:`oracle_regret`: the regret, against single runs, of picking the option that was fastest pooled over
  the *other* runs: what a planner right in expectation scores on the benchmark's per-rate goal.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sdplan.accuracy.means import mean_or_none, standard_error

#: Quadrature of the floor: the speed factors' standard normal deviates on this many nodes over +-Z_SPAN.
NODES = 241
Z_SPAN = 6.0

Cell = tuple[Any, Any, str, float]  # (benchmark run, pass, workload, load)


def perfect_model_error(load: float, sigma: float, instances: int) -> float:
    """The mean absolute E2E error (a fraction, each error capped at 1) of a model exact for the calibration's
    servers, against one run on another server.

    Servers run at ``exp(d)`` times the costs ``C1``, ``C2`` of the configuration's mean instance. The
    calibration rests on ``instances`` servers, so its speed is ``exp(d_c)``, ``d_c ~ N(0, sigma^2 /
    instances)``; the validation's server is another, ``d_v ~ N(0, sigma^2)``. At the run's rate ``lambda``,
    with ``rho = lambda C2`` (the load on the mean instance),

    .. math:: \\hat L = \\frac{e^{d_c} C_1}{1 - \\rho e^{d_c}}, \\qquad
              L = \\frac{e^{d_v} C_1}{1 - \\rho e^{d_v}}, \\qquad
              \\epsilon = \\min\\left( \\left| \\hat L / L - 1 \\right|, 1 \\right)

    (``L(lambda) = C1/(1 - lambda C2)``, docs/model.md). Uncapped, the mean is infinite: as ``rho e^{d_c}``
    nears 1 the prediction grows like ``1/(1 - rho e^{d_c})``, whose mean over a normal ``d_c`` diverges.
    Capped at 1, it is a lower bound of any mean error a model exact for its servers scores here: a
    prediction past saturation (``rho e^{d_c} >= 1``) or a server past it (``rho e^{d_v} >= 1``, no steady
    latency) counts 1.
    """

    z = np.linspace(-Z_SPAN, Z_SPAN, NODES)
    weight = np.exp(-0.5 * z * z)
    weight /= weight.sum()
    d_c = (sigma / math.sqrt(instances)) * z[:, None]
    d_v = sigma * z[None, :]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        predicted = np.where(load * np.exp(d_c) < 1.0, np.exp(d_c) / (1.0 - load * np.exp(d_c)), np.inf)
        true = np.where(load * np.exp(d_v) < 1.0, np.exp(d_v) / (1.0 - load * np.exp(d_v)), np.inf)
        error = np.where(np.isfinite(predicted) & np.isfinite(true), np.abs(predicted / true - 1.0), 1.0)
    return float((np.minimum(error, 1.0) * weight[:, None] * weight[None, :]).sum())


def floor_rows(runs: Sequence[Mapping[str, Any]], saturation: Sequence[Mapping[str, Any]],
               spreads: Mapping[str, tuple[float, int]]) -> list[dict[str, Any]]:
    """Per Poisson run of a benchmark run with a known spread: its utilisation ``rho = lambda C2``, the floor
    :func:`perfect_model_error` puts under its E2E error there, and the error it scored, capped alike (an
    unstable prediction counts 100%).

    ``C2`` is the calibration's at the run's option and workload: ``1/C2`` is the saturation record's
    ``uncapped_rps`` (None: ``C2 <= 0``, no saturation, ``rho = 0``), so ``rho`` is the load of
    docs/model.md's eq. 1, ``L = C1/(1 - rho)``, on which the floor's law rests. The load on the measured
    closed-loop plateau (``plateau_load``, kept beside it) is higher: a closed loop of ``N`` clients tops out
    at ``N/(C1 + f (N - 1) C2)``, below ``1/C2`` (acc50 at 128/64 without SD: 29.4 against 35.3 req/s), and
    a floor at that load would excuse errors the servers' spread does not make.
    """
    plateau = {(s["run"], s["pass"], s["workload"], s["option"]): s for s in saturation}
    rows = []
    for r in runs:
        spread = spreads.get(r["run"])
        record = plateau.get((r["run"], r["pass"], r["workload"], r["option"]))
        if spread is None or record is None or not record["measured_rps"]:
            continue
        uncapped = record.get("uncapped_rps")
        rho = 0.0 if uncapped is None else r["rate_rps"] / uncapped
        predicted = r.get("predicted_e2e_s")
        error = 1.0 if predicted is None else min(abs(predicted / r["e2e_s"] - 1.0), 1.0)
        rows.append({"run": r["run"], "load": r["load"], "rho": rho,
                     "plateau_load": r["rate_rps"] / record["measured_rps"],
                     "floor_pct": 100.0 * perfect_model_error(rho, spread[0] / 100.0, spread[1]),
                     "error_pct": 100.0 * error})
    return rows


def _cells(runs: Sequence[Mapping[str, Any]]) -> dict[Cell, dict[int, float]]:
    """Each (run, pass, workload, load)'s measured mean E2E per option."""
    cells: dict[Cell, dict[int, float]] = defaultdict(dict)
    for r in runs:
        cells[(r["run"], r["pass"], r["workload"], r["load"])][r["option"]] = r["e2e_s"]
    return cells


def pooled_latencies(runs: Sequence[Mapping[str, Any]],
                     leave_out: Any = None) -> dict[tuple[str, float], dict[int, float]]:
    """Per (workload, load), each option's log mean E2E relative to the other options of the same run, pooled.

    .. math:: r_k = \\operatorname{mean}_{runs} \\left( \\ln L_k - \\frac{1}{|K|} \\sum_{j \\in K} \\ln L_j \\right)

    over the runs that measured every option ``K`` of the (workload, load) (and not ``leave_out``), so one
    run's drift cancels and only how the options compare is pooled.
    """
    cells = _cells(runs)
    options: dict[tuple[str, float], set[int]] = defaultdict(set)
    for (_, _, workload, load), latencies in cells.items():
        options[(workload, load)] |= set(latencies)
    sums: dict[tuple[str, float], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (run, _, workload, load), latencies in cells.items():
        if run == leave_out or set(latencies) != options[(workload, load)] or len(latencies) < 2:
            continue
        centre = sum(math.log(v) for v in latencies.values()) / len(latencies)
        for option, value in latencies.items():
            sums[(workload, load)][option].append(math.log(value) - centre)
    return {key: {option: sum(values) / len(values) for option, values in per.items()} for key, per in sums.items()}


def pooled_regret(runs: Sequence[Mapping[str, Any]],
                  picks: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """Each pick's regret (%) against the pooled latencies (:func:`pooled_latencies`), ``exp(r_pick - min r) - 1``,
    and the low end of its 95% interval: ``exp(m - 2 se) - 1`` of the runs' own ``ln(L_pick / L_best)`` (mean
    ``m``, standard error ``se``; -inf below two runs). (inf, inf) where nothing was picked; picks at a
    (workload, load) no run measured whole are left out.

    Where two options lie within the runs' noise of each other the pooled best can flip with one more run,
    and so can whether a pick's regret is over a goal; the low end says whether it is over beyond that noise.
    """
    pooled = pooled_latencies(runs)
    cells = _cells(runs)
    regrets = []
    for pick in picks:
        relative = pooled.get((pick["workload"], pick["load"]))
        if relative is None or (pick["picked"] is not None and pick["picked"] not in relative):
            continue
        if pick["picked"] is None:
            regrets.append((math.inf, math.inf))
            continue
        best = min(relative, key=lambda option: relative[option])
        ratios = [math.log(latencies[pick["picked"]] / latencies[best]) for (_, _, workload, load), latencies
                  in cells.items() if (workload, load) == (pick["workload"], pick["load"])
                  and set(latencies) == set(relative)]
        error = standard_error(ratios)
        low = -math.inf if error is None else 100.0 * (math.exp(sum(ratios) / len(ratios) - 2.0 * error) - 1.0)
        regrets.append((100.0 * (math.exp(relative[pick["picked"]] - relative[best]) - 1.0), low))
    return regrets


def oracle_regret(runs: Sequence[Mapping[str, Any]]) -> list[float]:
    """The regret (%) against each single run of the option fastest pooled over the other runs
    (:func:`pooled_latencies` leaving that run out): a planner right in expectation, scored as the benchmark
    scores one. Needs two or more runs; a cell whose (workload, load) no other run measured whole is left out."""
    regrets = []
    by_run: dict[Any, dict[tuple[str, float], dict[int, float]]] = {}
    for (run, _, workload, load), latencies in sorted(_cells(runs).items(), key=lambda item: str(item[0])):
        if len(latencies) < 2:
            continue
        if run not in by_run:
            by_run[run] = pooled_latencies(runs, leave_out=run)
        relative = by_run[run].get((workload, load))
        if not relative or not set(relative) <= set(latencies):
            continue
        best = min(relative, key=lambda option: relative[option])
        regrets.append(100.0 * (latencies[best] / min(latencies.values()) - 1.0))
    return regrets


def noise_summary(runs: Sequence[Mapping[str, Any]], saturation: Sequence[Mapping[str, Any]],
                  picks: Sequence[Mapping[str, Any]], spreads: Mapping[str, tuple[float, int]],
                  regret_goal_pct: float) -> dict[str, Any]:
    """The floors beside the scores: by load and over all, for the runs whose calibration's spread is known."""
    scored = floor_rows(runs, saturation, spreads)
    by_load = {}
    for load in sorted({row["load"] for row in scored}):
        members = [row for row in scored if row["load"] == load]
        by_load[f"{load:g}"] = {"poisson_runs": len(members),
                                "mean_rho": mean_or_none([row["rho"] for row in members]),
                                "mean_plateau_load": mean_or_none([row["plateau_load"] for row in members]),
                                "perfect_model_e2e_mape_pct": mean_or_none([row["floor_pct"] for row in members]),
                                "e2e_mape_pct": mean_or_none([row["error_pct"] for row in members])}
    pooled, oracle = pooled_regret(runs, picks), oracle_regret(runs)
    worst = max((value for value, _ in pooled), default=None)
    return {
        "spreads": {run: {"repeat_sd_pct": sd, "instances": instances} for run, (sd, instances) in spreads.items()},
        # each error capped at 100%, the floor's and the scored alike (floors.perfect_model_error)
        "poisson_runs": len(scored),
        "perfect_model_e2e_mape_pct": mean_or_none([row["floor_pct"] for row in scored]),
        "e2e_mape_pct": mean_or_none([row["error_pct"] for row in scored]),
        "by_load": by_load,
        "pooled_regret_rates": len(pooled),
        "pooled_regret_over_goal": sum(value > regret_goal_pct for value, _ in pooled),
        # over the goal beyond the runs' noise: the low end of the 95% interval too
        "pooled_regret_clearly_over_goal": sum(low > regret_goal_pct for _, low in pooled),
        "pooled_regret_max_pct": worst if worst is not None and math.isfinite(worst) else None,
        "oracle_regret_rates": len(oracle),
        "oracle_regret_over_goal": sum(value > regret_goal_pct for value in oracle),
    }


def calibration_spread(document: Mapping[str, Any]) -> tuple[float, int] | None:
    """A benchmark run's ``calibration_spread`` (its calibration's repeat_sd_pct and server instances per
    configuration), None where the summary records none (before acc50, unless added from the run's notes)."""
    spread = document.get("calibration_spread")
    if not spread or spread.get("repeat_sd_pct") is None:
        return None
    return float(spread["repeat_sd_pct"]), int(spread.get("instances") or 1)


def report_lines(noise: Mapping[str, Any], regret_goal_pct: float) -> list[str]:
    """The floors as text, one line per figure."""
    lines = []
    if noise["poisson_runs"]:
        spreads = ", ".join(f"{run} {s['repeat_sd_pct']:g}%" for run, s in noise["spreads"].items())
        lines.append(f"a model exact but for the servers' speeds (spread between instances: {spreads}; "
                     "each error capped at 100%, here and in what was scored):")
        for load, figures in noise["by_load"].items():
            rho = figures.get("mean_rho")  # absent from summaries written before the floor used rho
            lines.append(f"  at {float(load):.0%} load" + ("" if rho is None else f" (rho = lambda C2 {rho:.2f})")
                         + f": E2E MAPE {figures['perfect_model_e2e_mape_pct']:.1f}% "
                         f"(scored {figures['e2e_mape_pct']:.1f}%, {figures['poisson_runs']} runs)")
        lines.append(f"  over all: {noise['perfect_model_e2e_mape_pct']:.1f}% (scored {noise['e2e_mape_pct']:.1f}%, "
                     f"{noise['poisson_runs']} runs)")
    if noise["pooled_regret_rates"]:
        worst = noise["pooled_regret_max_pct"]
        lines.append(f"regret against the options' latencies pooled over every run: {noise['pooled_regret_over_goal']} "
                     f"of {noise['pooled_regret_rates']} picks over {regret_goal_pct:g}%"
                     + (f" (worst {worst:.1f}%)" if worst is not None else " (a pick of none stable)")
                     + f", {noise['pooled_regret_clearly_over_goal']} beyond the runs' noise (95% interval)")
    if noise["oracle_regret_rates"]:
        lines.append(f"picking the option fastest over the other runs, against each run: "
                     f"{noise['oracle_regret_over_goal']} of {noise['oracle_regret_rates']} rates over "
                     f"{regret_goal_pct:g}%")
    return lines
