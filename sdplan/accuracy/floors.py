"""What the machine's noise leaves to any model: the floors under the accuracy benchmark's goals.

A benchmark run (``accuracy_served.py``) predicts servers other than the ones it calibrated on. Servers of one
configuration started minutes apart run at speeds a factor ``exp(d)`` apart, ``d ~ N(0, sigma^2)``; each
calibration measures its own ``sigma`` from the levels it repeats on a second instance (``[uncertainty]
repeat_sd_pct``, :attr:`sdplan.fitting.validation.RepeatSpread.sd_pct`: 4.5-16.3% on the 2-core VMs of acc40-49). So
even a model exact for the calibration's servers errs against the validation's, and near saturation
``L = C1/(1 - lambda C2)`` magnifies the error: at 80% load a server 10% slower runs 83% slower.

Four figures, none from the latencies being judged:

- :func:`perfect_model_error`: the mean absolute E2E error (each capped at 100%) a model exact but for the
  servers' speeds shows against one run, given that run's utilisation ``rho = lambda C2`` (docs/model.md;
  ``C2`` the calibration's, at the option and workload) and its calibration's ``sigma``;
- :func:`perfect_model_ttft_error`: the same for TTFT, whose queue's part grows like ``u^2/(1 - rho u)`` in a
  server ``u`` times slower (a step's cost times the requests in flight), so it needs the share ``q`` of TTFT
  the queue causes too (:func:`queue_share`, from the calibration's prediction);
- :func:`pooled_regret`: the regret of each pick against the options' latencies pooled over every run (the
  noise of one run averages out, a wrong model does not);
- :func:`oracle_regret`: the regret, against single runs, of picking the option that was fastest pooled over
  the *other* runs: what a planner right in expectation scores on the benchmark's per-rate goal.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
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

    return _capped_mean_error(lambda speed: slower_server_latency(speed, load), sigma, instances)


def slower_server_latency(speed: np.ndarray, load: float) -> np.ndarray:
    """The mean E2E latency of a server ``speed`` times slower than the mean instance, in units of the mean
    instance's zero-load latency ``C1``; inf where that server is past saturation.

    Parameters
    ----------
    speed : numpy.ndarray
        ``u``: the factor on every cost of the mean instance (``exp(d)``).
    load : float
        ``rho = lambda C2`` on the mean instance.

    Returns
    -------
    numpy.ndarray
        By eq. 1 of docs/model.md (``L = C1/(1 - lambda C2)``, #latency-law) with every cost times ``u``,

        .. math:: \\frac{L(u)}{C_1} = \\frac{u}{1 - \\rho u}, \\qquad
                  \\frac{L(u)}{L(1)} = (1 - \\rho) \\frac{L(u)}{C_1} = \\frac{u (1 - \\rho)}{1 - \\rho u}

        where ``rho u < 1``, inf elsewhere (``rho u >= 1``: no steady-state mean). The ratio to the mean
        instance's latency, ``L(u)/L(1)``, is the ``g(u)`` of docs/model.md#validation (the TTFT floor). It is
        returned over ``C1``, not over ``L(1)``, because the E2E floor divides two of them and ``L(1)`` is
        infinite at ``rho = 1``, where ``L(u)/L(1)`` would be 0 for every stable ``u``.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(load * speed < 1.0, speed / (1.0 - load * speed), np.inf)


def ttft_speed_factor(speed: np.ndarray, load: float, queue_share: float) -> np.ndarray:
    """A server's mean TTFT at ``speed`` times the mean instance's costs, over the mean instance's,
    ``u [(1 - q) + q g(u)]`` with ``g(u) = L(u)/L(1)`` (:func:`slower_server_latency`;
    :func:`perfect_model_ttft_error` derives it); inf where that server is past saturation."""
    latency = slower_server_latency(speed, load)
    stable = np.isfinite(latency)  # rho u < 1, slower_server_latency's own mask
    queue = (1.0 - load) * np.where(stable, latency, 0.0)
    return np.where(stable, speed * ((1.0 - queue_share) + queue_share * queue), np.inf)


def perfect_model_ttft_error(load: float, sigma: float, instances: int, queue_share: float) -> float:
    """The mean absolute TTFT error (a fraction, each error capped at 1) of a model exact for the calibration's
    servers, against one open-loop run on another server: :func:`perfect_model_error` for the time to first
    token.

    Parameters
    ----------
    load : float
        ``rho = lambda C2`` on the mean instance, as for :func:`perfect_model_error`.
    sigma : float
        The spread of the servers' log speeds (the calibration's ``repeat_sd_pct`` / 100).
    instances : int
        Servers the calibration rests on.
    queue_share : float
        ``q``: the share of the mean instance's TTFT that the other requests in flight cause, ``1 -
        TTFT(B = 0)/TTFT(B = lambda L)`` (the calibration's own decomposition, in [0, 1]).

    Returns
    -------
    float
        The mean over ``d_c ~ N(0, sigma^2/instances)`` and ``d_v ~ N(0, sigma^2)`` of

        .. math:: \\epsilon = \\min\\left( \\left| \\frac{T(e^{d_c})}{T(e^{d_v})} - 1 \\right|, 1 \\right),
                  \\qquad \\frac{T(u)}{T(1)} = u \\left[ (1 - q) + q \\, \\frac{u (1 - \\rho)}{1 - \\rho u}
                  \\right]

        (:func:`ttft_speed_factor`); a server past saturation (``rho u >= 1``) counts 1.

    Notes
    -----
    The model's TTFT (docs/model.md#ttft-and-tpot, :func:`sdplan.latency.model.time_to_first_token`) is

    .. math:: T = T_0 + w_{load} \\frac{C_2}{s} B, \\qquad T_0 = c_{1p} + \\mathrm{offset} + \\mathrm{prefill}
              + w_{wait} \\tau_1, \\qquad B = \\lambda L

    (``s`` the steps per request, ``B`` by Little's law in an open loop). A server at speed ``u = e^d`` pays
    ``u`` times every cost: ``u T0``, ``u C2/s``, and, since ``L(u) = u C1/(1 - rho u)``, its queue holds
    ``B(u) = lambda u C1/(1 - rho u)`` others. So the queue's part of TTFT is a step's cost times the number
    in flight and grows like ``u^2/(1 - rho u)``, where E2E grows like ``u/(1 - rho u)``:

    .. math:: T(u) = u T_0 + w_{load} \\frac{C_2}{s} \\lambda C_1 \\frac{u^2}{1 - \\rho u},

    and with ``q = P/(T0 + P)``, ``P = w_load (C2/s) lambda C1/(1 - rho)`` the queue's part at ``u = 1``, the
    ratio above. ``T(u)/T(1) = u [(1 - q) + q g(u)]`` with ``g(u) = u (1 - rho)/(1 - rho u) = L(u)/L(1)``, E2E's
    own factor. Hence, draw by draw:

    - ``q = 0`` (which ``rho = 0`` implies: no one in flight): ``T`` is proportional to ``u``, and the floor is the
      load-free one, ``perfect_model_error(0, sigma, instances)``, but for draws past saturation, which count 1;
    - ``q = 1``: ``T(u_c)/T(u_v) = (u_c/u_v) (L(u_c)/L(u_v))``, two factors on the same side of 1, so the
      error is at least E2E's: the floor is at least ``perfect_model_error(rho, sigma, instances)``;
    - between, ``ln T(u_c)/T(u_v)`` moves away from 0 as ``q`` grows (``g`` increases with ``u``), so the
      floor grows with ``q`` from the first bound to the second.

    Even at a light load the queue's part is not E2E's: ``g(u) -> u`` as ``rho -> 0``, so a TTFT that is all
    queue errs like ``u^2``, about twice E2E's error.

    Assumes, as the E2E floor does, that a slower server is slower at every cost alike (offset and prefill
    included) and that the calibration's ``q`` is the mean instance's. A closed loop's opening wave and
    queueing for admission are not in it (the benchmark's Poisson runs have neither).
    """

    return _capped_mean_error(lambda speed: ttft_speed_factor(speed, load, queue_share), sigma, instances)


def _capped_mean_error(latency: Callable[[np.ndarray], np.ndarray], sigma: float, instances: int) -> float:
    """The mean of ``min(|latency(e^{d_c}) / latency(e^{d_v}) - 1|, 1)`` over ``d_c ~ N(0, sigma^2/instances)``
    and ``d_v ~ N(0, sigma^2)``, by quadrature on :data:`NODES` nodes; ``latency`` maps speed factors to a
    latency (any unit; inf: past saturation, which counts 1)."""
    z = np.linspace(-Z_SPAN, Z_SPAN, NODES)
    weight = np.exp(-0.5 * z * z)
    weight /= weight.sum()
    d_c = (sigma / math.sqrt(instances)) * z[:, None]
    d_v = sigma * z[None, :]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        predicted, true = latency(np.exp(d_c)), latency(np.exp(d_v))
        error = np.where(np.isfinite(predicted) & np.isfinite(true), np.abs(predicted / true - 1.0), 1.0)
    return float((np.minimum(error, 1.0) * weight[:, None] * weight[None, :]).sum())


def floor_rows(runs: Sequence[Mapping[str, Any]], saturation: Sequence[Mapping[str, Any]],
               spreads: Mapping[str, tuple[float, int]]) -> list[dict[str, Any]]:
    """Per Poisson run of a benchmark run with a known spread: its utilisation ``rho = lambda C2``, the floor
    :func:`perfect_model_error` puts under its E2E error there, and the error it scored, capped alike (an
    unstable prediction counts 100%); beside them the same for TTFT (:func:`perfect_model_ttft_error`,
    :func:`ttft_floor`; None where the record cannot give it).

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
        rows.append({"run": r["run"], "load": r["load"], "rho": rho,
                     "plateau_load": r["rate_rps"] / record["measured_rps"],
                     "floor_pct": 100.0 * perfect_model_error(rho, spread[0] / 100.0, spread[1]),
                     "error_pct": 100.0 * capped_error(r.get("predicted_e2e_s"), r["e2e_s"]),
                     **ttft_floor(r, rho, spread)})
    return rows


def capped_error(predicted: float | None, measured: float) -> float:
    """A scored error capped as the floors cap theirs (:func:`_capped_mean_error`), so the two compare:
    ``min(|predicted/measured - 1|, 1)``, and 1 where the prediction is unstable (None)."""
    return 1.0 if predicted is None else min(abs(predicted / measured - 1.0), 1.0)


def queue_share(record: Mapping[str, Any]) -> float | None:
    """``q`` of a run record: the share of its predicted TTFT the others in flight cause, ``1 -
    predicted_ttft_alone_s / predicted_ttft_s`` in [0, 1]; 1 where the prediction is unstable (the queue's part
    grows without bound); None in records without ``predicted_ttft_alone_s`` (summaries before 2026-11-29)."""
    alone, loaded = record.get("predicted_ttft_alone_s"), record.get("predicted_ttft_s")
    if alone is None:
        return None
    if loaded is None:
        return 1.0
    return min(max(1.0 - alone / loaded, 0.0), 1.0) if loaded > 0 else None


def ttft_floor(record: Mapping[str, Any], rho: float, spread: tuple[float, int]) -> dict[str, float | None]:
    """A run's TTFT floor (:func:`perfect_model_ttft_error` at its ``rho`` and :func:`queue_share`) and its scored
    TTFT error capped alike (an unstable prediction counts 100%), in %; None where the record has no queue
    share or no measured TTFT."""
    share, measured = queue_share(record), record.get("ttft_s")
    if share is None or not measured:
        return {"ttft_share": share, "ttft_floor_pct": None, "ttft_error_pct": None}
    return {"ttft_share": share,
            "ttft_floor_pct": 100.0 * perfect_model_ttft_error(rho, spread[0] / 100.0, spread[1], share),
            "ttft_error_pct": 100.0 * capped_error(record.get("predicted_ttft_s"), measured)}


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
    """The floors beside the scores: by load, by benchmark run and over all, for the runs whose calibration's
    spread is known."""
    scored = floor_rows(runs, saturation, spreads)
    by_load = {f"{load:g}": floor_figures([row for row in scored if row["load"] == load])
               for load in sorted({row["load"] for row in scored})}
    by_run = {run: floor_figures([row for row in scored if row["run"] == run])
              for run in sorted({row["run"] for row in scored})}
    pooled, oracle = pooled_regret(runs, picks), oracle_regret(runs)
    worst = max((value for value, _ in pooled), default=None)
    return {
        "spreads": {run: {"repeat_sd_pct": sd, "instances": instances} for run, (sd, instances) in spreads.items()},
        # each error capped at 100%, the floor's and the scored alike (floors.perfect_model_error)
        **floor_figures(scored),
        "by_load": by_load,
        "by_run": by_run,
        "pooled_regret_rates": len(pooled),
        "pooled_regret_over_goal": sum(value > regret_goal_pct for value, _ in pooled),
        # over the goal beyond the runs' noise: the low end of the 95% interval too
        "pooled_regret_clearly_over_goal": sum(low > regret_goal_pct for _, low in pooled),
        "pooled_regret_max_pct": worst if worst is not None and math.isfinite(worst) else None,
        "oracle_regret_rates": len(oracle),
        "oracle_regret_over_goal": sum(value > regret_goal_pct for value in oracle),
    }


def floor_figures(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The means of :func:`floor_rows`' rows: the E2E floor and score over all of them, the TTFT floor and score
    over those that have one (``ttft_poisson_runs``)."""
    timed = [row for row in rows if row["ttft_floor_pct"] is not None]
    return {"poisson_runs": len(rows),
            "mean_rho": mean_or_none([row["rho"] for row in rows]),
            "mean_plateau_load": mean_or_none([row["plateau_load"] for row in rows]),
            "perfect_model_e2e_mape_pct": mean_or_none([row["floor_pct"] for row in rows]),
            "e2e_mape_pct": mean_or_none([row["error_pct"] for row in rows]),
            "ttft_poisson_runs": len(timed),
            "mean_ttft_share": mean_or_none([row["ttft_share"] for row in timed]),
            "perfect_model_ttft_mape_pct": mean_or_none([row["ttft_floor_pct"] for row in timed]),
            "ttft_mape_pct": mean_or_none([row["ttft_error_pct"] for row in timed])}


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
    if noise.get("ttft_poisson_runs"):  # absent from summaries written before the TTFT floor
        lines.append("the same model's TTFT (q: the share of TTFT the requests in flight cause, which grows like "
                     "u^2/(1 - rho u) in a server u times slower; each error capped at 100%):")
        for load, figures in noise["by_load"].items():
            if figures["ttft_poisson_runs"]:
                lines.append(f"  at {float(load):.0%} load (q {figures['mean_ttft_share']:.2f}): TTFT MAPE "
                             f"{figures['perfect_model_ttft_mape_pct']:.1f}% (scored {figures['ttft_mape_pct']:.1f}%, "
                             f"{figures['ttft_poisson_runs']} runs)")
        lines.append(f"  over all: {noise['perfect_model_ttft_mape_pct']:.1f}% (scored {noise['ttft_mape_pct']:.1f}%, "
                     f"{noise['ttft_poisson_runs']} runs)")
    if len(noise.get("by_run", {})) > 1:
        lines.append("the floors per benchmark run (E2E; TTFT), scored beside them:")
        for run, figures in noise["by_run"].items():
            ttft = ("" if not figures["ttft_poisson_runs"] else
                    f"; TTFT {figures['perfect_model_ttft_mape_pct']:.1f}% (scored {figures['ttft_mape_pct']:.1f}%)")
            lines.append(f"  {run}: E2E {figures['perfect_model_e2e_mape_pct']:.1f}% (scored "
                         f"{figures['e2e_mape_pct']:.1f}%){ttft}, {figures['poisson_runs']} runs")
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
