"""The pure parts of ``benchmarks/accuracy_served.py``: workloads, rates, budget, records, summary, pooling.

Nothing here starts a server or imports vLLM, so ``accuracy_served.py --pool`` and the tests run anywhere.
Records are plain JSON-ready dicts (units in the keys):

- a Poisson run: ``run`` (benchmark run id), ``pass``, ``workload`` ("P/G"), ``option`` (draft length, 0 = no
  SD), ``load``, ``rate_rps``, measured ``e2e_s``/``ttft_s``/``tpot_s``, ``predicted_*`` (at the acceptance the
  run measured, as ``sdplan validate`` predicts it; None where the model says unstable; ``predicted_ttft_alone_s``
  the TTFT with no other request in flight, absent before 2026-11-29), ``planned_e2e_s`` (as
  ``sdplan plan`` predicts it, with the calibration's acceptance), ``alpha``, ``foreign_cpu_cores``, ``flags``
  (the steady-state screen's reasons, :func:`sdplan.runs.screen`: a run with any is one ``sdplan validate``
  leaves out; the summary's ``kept_by_screen`` scores the others, the goals every run), ``stalled_streams``
  (:func:`sdplan.runs.screen.stalled_share`: the share of its requests whose streamed answer stalled on the way
  to the client; None where the file has no chunk times, and in summaries before acc40; the summary's
  ``streams_on_time`` scores the runs known to be at or under the share ``fit`` names), ``file``, ``seed``
  (``vllm bench serve --seed``, :func:`poisson_seed`; absent before acc44);
- a saturation: ``run``, ``pass``, ``workload``, ``option``, ``measured_rps`` (closed-loop plateau: the
  best throughput of the doubling levels), ``clients`` (the level that reached it), ``predicted_rps`` (the
  model's closed-loop throughput there, ``N/(C1 + f (N - 1) C2)``; before acc37 the open-loop cap rate
  ``min(1/C2, N/(C1 + N C2))``, now ``open_loop_cap_rps``), ``uncapped_rps`` (``1/C2``);
- a pick: ``run``, ``workload``, ``load``, ``rate_rps``, ``picked`` (the option ``sdplan plan`` picks; None
  where it predicts none stable), ``planned`` (``[{"option", "e2e_s"}]``).
"""

from __future__ import annotations

import json
import math
import zlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sdplan.accuracy.floors import calibration_spread, noise_summary
from sdplan.accuracy.floors import report_lines as noise_lines
from sdplan.accuracy.means import mean_or_none, median_or_none, standard_error
from sdplan.fitting.validation import option_regret, predict_latency, predict_ttft, predict_ttft_alone
from sdplan.latency import model
from sdplan.planning import planner
from sdplan.planning.planner import option_label
from sdplan.planning.scenario import ScenarioOptions, resolve_scenario
from sdplan.planning.uncertainty import coefficient_draws, plan_intervals
from sdplan.runs import screen
from sdplan.runs.screen import STALLED_SHARE_NOTED
from sdplan.units import finite_or_none

#: Goals of the benchmark (the module docstring of accuracy_served.py states them).
E2E_MAPE_GOAL_PCT = 15.0
TTFT_MAPE_GOAL_PCT = 25.0
BIAS_GOAL_PCT = 5.0
TOP_LOAD_E2E_GOAL_PCT = 20.0
REGRET_GOAL_PCT = 5.0
CALIBRATE_GOAL_S = 360.0
#: Benchmark runs (each with its own calibration) that a pooled bias needs before it is judged.
MIN_POOLED_RUNS = 3
#: The fewest requests of a Poisson run, whatever its length in seconds.
MIN_POISSON_REQUESTS = 60
SUMMARY_VERSION = 1
#: A summary's ``predicted_by`` where it records none (before acc51): its own day's code made its predictions.
UNRECORDED_CODE = "unrecorded (the run's own code)"


def workload_label(prompt_tokens: int, output_tokens: int) -> str:
    return f"{prompt_tokens}/{output_tokens}"


def contrast_workloads(prompt_tokens: int, output_tokens: int) -> list[tuple[int, int]]:
    """A prompt-heavy and a decode-heavy workload the calibration (at ``P/G``) did not measure.

    Prompt-heavy: ``max(256, 2P)`` in, ``max(16, G/2)`` out (64/64 and 128/64 give 256/32). Decode-heavy:
    ``max(16, P/8)`` in, ``3G`` out (64/64 and 128/64 give 16/192).
    """
    return [(max(256, 2 * prompt_tokens), max(16, output_tokens // 2)),
            (max(16, prompt_tokens // 8), 3 * output_tokens)]


def parse_workloads(text: str) -> list[tuple[int, int]]:
    """``"256/32,16/192"`` as ``[(256, 32), (16, 192)]``; ValueError naming the bad entry."""
    found = []
    for entry in (part.strip() for part in text.split(",") if part.strip()):
        try:
            prompt, output = (int(value) for value in entry.split("/"))
        except ValueError:
            raise ValueError(f"--workloads: {entry!r} is not PROMPT/OUTPUT tokens, e.g. 256/32") from None
        if prompt < 1 or output < 1:
            raise ValueError(f"--workloads: {entry!r} needs at least 1 prompt and 1 output token")
        found.append((prompt, output))
    if not found:
        raise ValueError("--workloads: give at least one PROMPT/OUTPUT, e.g. 256/32,16/192")
    return found


def workload_role(workload: tuple[int, int], calibrated: tuple[int, int]) -> str:
    """``calibrated``, ``prompt-heavy`` or ``decode-heavy`` (by prompt/output ratio against the calibration's)."""
    if workload == calibrated:
        return "calibrated"
    ratio, reference = workload[0] / workload[1], calibrated[0] / calibrated[1]
    return "prompt-heavy" if ratio > reference else "decode-heavy" if ratio < reference else "same mix"


def common_rates(plateaus_rps: Mapping[int, float], loads: Sequence[float]) -> list[float]:
    """The absolute rates every option of one workload runs at: each load times the slowest option's plateau.

    So every option runs at or below that load of its own measured saturation (all stable), and the options
    are compared at the same rate. Three significant digits, as ``vllm bench serve`` is given them.
    """
    slowest = min(plateaus_rps.values())
    if not slowest > 0:
        raise ValueError(f"a measured plateau must be > 0 req/s: {dict(plateaus_rps)}")
    return [float(f"{load * slowest:.3g}") for load in loads]


def poisson_seed(run_id: str, workload_index: int, level: int) -> int:
    """The ``vllm bench serve --seed`` of a benchmark run's Poisson runs at one workload and load.

    Every option gets the same seed, so the options of one run meet the same prompts at the same arrival
    times and their regret compares like with like. Each benchmark run gets seeds of its own: vLLM draws the
    arrival gaps from one seeded stream and scales them by the rate, so one seed for every run (``100 +
    10 i + level`` up to acc43) is one arrival path, rescaled, in all of them (256/32 at 80%: 34, 52, 50, 35
    arrivals per 40 expected in acc40-acc43 alike), and pooling the runs could not average its bursts out.
    """

    return 1000 * (zlib.crc32(run_id.encode()) % 1_000_000) + 10 * workload_index + level


def poisson_requests(rate_rps: float, seconds: float) -> int:
    return max(MIN_POISSON_REQUESTS, int(rate_rps * seconds))


def poisson_seconds(budget_s: float, rates_rps: Sequence[float], overhead_s: float,
                    longest_s: float) -> float | None:
    """The longest Poisson run (s, at most ``longest_s``) with which runs at ``rates_rps`` fit ``budget_s``.

    A run at rate ``r`` given ``s`` seconds sends ``max(60, r s)`` requests, so it lasts
    ``max(60/r, s)`` plus ``overhead_s`` (client start, drain). None when even the 60-request runs overrun.
    """
    def total(seconds: float) -> float:
        return sum(max(MIN_POISSON_REQUESTS / r, seconds) + overhead_s for r in rates_rps)

    if total(0.0) > budget_s:
        return None
    if total(longest_s) <= budget_s:
        return longest_s
    low, high = 0.0, longest_s
    for _ in range(60):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if total(middle) <= budget_s else (low, middle)
    return low


def pct(predicted: float | None, measured: float | None) -> float | None:
    """Signed error (%) of a prediction; None where either is missing or the prediction is not finite."""
    if predicted is None or not measured or not math.isfinite(predicted):
        return None
    return (predicted - measured) / measured * 100.0


def on_time(record: Mapping[str, Any]) -> bool:
    """Whether a run record is known to have at most :data:`sdplan.runs.screen.STALLED_SHARE_NOTED` of its
    streams stalled (unknown, in records before acc40 or without chunk times: not counted as on time)."""

    share = record.get("stalled_streams")
    return share is not None and share <= STALLED_SHARE_NOTED


def run_record(run: Any, coefficients_at: Any, /, *, planned_e2e_s: float | None,
               planned_e2e_ci95_s: Sequence[float | None] | None = None, **meta: Any) -> dict[str, Any]:
    """A Poisson run's record: what it measured and what the model predicts for it (as ``sdplan validate``).

    ``run`` is a :class:`sdplan.runs.BenchmarkRun`; ``coefficients_at(p, g)`` the calibration's coefficients;
    ``planned_e2e_ci95_s`` the 95% interval ``sdplan plan`` gives at the run's rate (high None: unstable).
    """


    coefficients = coefficients_at(run.prompt_tokens, run.output_tokens)
    latency = predict_latency(coefficients, run)
    ttft = predict_ttft(coefficients, run, latency)
    tpot = (float(model.time_per_output_token(np.asarray(latency), ttft, run.output_tokens))
            if math.isfinite(latency) and math.isfinite(ttft) else math.inf)
    return {**meta, "option": run.draft_length, "e2e_s": run.mean_e2e_latency_s, "ttft_s": run.mean_ttft_s,
            "tpot_s": run.mean_tpot_s, "predicted_e2e_s": finite_or_none(latency),
            "predicted_ttft_s": finite_or_none(ttft), "predicted_tpot_s": finite_or_none(tpot),
            # TTFT with no other request in flight: the rest of predicted_ttft_s is the queue's (floors.queue_share)
            "predicted_ttft_alone_s": finite_or_none(predict_ttft_alone(coefficients, run)),
            "planned_e2e_s": planned_e2e_s,
            **({} if planned_e2e_ci95_s is None else {"planned_e2e_ci95_s": list(planned_e2e_ci95_s)}),
            "alpha": run.alpha, "flags": screen(run),
            "stalled_streams": run.stalled_streams, "file": run.source}


def _plan_scenario(calibration: str, workload: tuple[int, int], draft_lengths: Sequence[int]) -> Any:
    """What ``sdplan plan -c CAL --prompt-tokens P --output-tokens G --draft-lengths ...`` resolves: the
    calibration's own acceptance, per position where it has one."""

    return resolve_scenario(ScenarioOptions(calibration=calibration, prompt_tokens=workload[0],
                                            output_tokens=workload[1], draft_lengths=list(draft_lengths),
                                            single_acceptance=False))


def planner_picks(calibration: str, workload: tuple[int, int], draft_lengths: Sequence[int],
                  rates_rps: Sequence[float]) -> list[tuple[int | None, dict[int, float | None]]]:
    """Per rate, the option ``sdplan plan -c CAL --prompt-tokens P --output-tokens G --draft-lengths ...``
    picks (None: none predicted stable) and its predicted mean E2E per option (None: unstable).

    The acceptance is the calibration's own, as ``plan`` uses it when the user gives none.
    """

    scenario = _plan_scenario(calibration, workload, draft_lengths)
    result = planner.plan(scenario.coefficients, list(rates_rps), scenario.draft_lengths,
                          list(scenario.workload.acceptance.alphas), tokens_per_cycle=scenario.tokens_per_cycle,
                          moe=scenario.moe, batch_caps=scenario.limits.caps(scenario.draft_lengths))
    picks = []
    for index in range(len(rates_rps)):
        best = int(result.best_k[0, index])
        planned: dict[int, float | None] = {0: finite_or_none(float(result.baseline_latency_s[index]))}
        for column, k in enumerate(result.draft_lengths):
            planned[int(k)] = finite_or_none(float(result.latency_s[0, index, column]))
        picks.append((None if best == planner.NONE_STABLE else best, planned))
    return picks


def planned_intervals(calibration: str, workload: tuple[int, int], draft_lengths: Sequence[int],
                      rates_rps: Sequence[float]) -> list[dict[int, list[float | None]]] | None:
    """Per rate, the 95% interval of each option's mean E2E that ``sdplan plan`` prints (fit uncertainty and
    the spread between server instances; high None: unstable), or None for a calibration without a covariance.
    """


    scenario = _plan_scenario(calibration, workload, draft_lengths)
    draws = coefficient_draws(scenario.calibration, workload[0], workload[1],
                              options=(scenario.draft_lengths, scenario.tokens_per_cycle))
    if draws is None:
        return None
    alphas = np.asarray(scenario.workload.acceptance.alphas)
    bands = plan_intervals(draws, alphas, np.asarray(rates_rps, dtype=float), np.asarray(scenario.draft_lengths),
                           scenario.tokens_per_cycle)
    found = []
    for index in range(len(rates_rps)):
        per_option = {0: bands.baseline_latency_s[:, index]}
        per_option.update({int(k): bands.latency_s[:, 0, index, column] for column, k in enumerate(draft_lengths)})
        found.append({k: [float(low), finite_or_none(float(high))] for k, (low, high) in per_option.items()})
    return found


# ----------------------------------------------------------------------------------------------- summary

def _errors(runs: Sequence[Mapping[str, Any]], measured: str, predicted: str) -> list[float]:
    return [e for e in (pct(r[predicted], r[measured]) for r in runs) if e is not None]


def _negative_share(errors: Sequence[float]) -> float | None:
    return sum(e < 0 for e in errors) / len(errors) if errors else None


def _accuracy(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    e2e = _errors(runs, "e2e_s", "predicted_e2e_s")
    ttft = _errors(runs, "ttft_s", "predicted_ttft_s")
    planned = _errors(runs, "e2e_s", "planned_e2e_s")
    return {
        "poisson_runs": len(runs),
        "predicted_unstable": sum(r["predicted_e2e_s"] is None for r in runs),
        "e2e_mape_pct": mean_or_none(abs(e) for e in e2e),
        "e2e_bias_pct": mean_or_none(e2e),
        # the distribution beside the mean: one run far off moves the mean, not these
        "e2e_median_error_pct": median_or_none(e2e),
        "e2e_negative_share": _negative_share(e2e),
        "ttft_mape_pct": mean_or_none(abs(e) for e in ttft),
        "ttft_bias_pct": mean_or_none(ttft),
        "ttft_median_error_pct": median_or_none(ttft),
        "ttft_negative_share": _negative_share(ttft),
        "tpot_mape_pct": mean_or_none(abs(e) for e in _errors(runs, "tpot_s", "predicted_tpot_s")),
        "planned_e2e_mape_pct": mean_or_none(abs(e) for e in planned),
        "planned_unstable": sum(r["planned_e2e_s"] is None for r in runs),
        **_coverage(runs),
        **_server_side(runs),
    }


def _server_side(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The errors against the server's own histograms, where a run recorded them (``server_e2e_s``, from
    /metrics before and after it; runs before 2026-11-29's second session did not): the same predictions
    judged on the span the server measures, and how far the client's means lay above the server's."""
    served = [r for r in runs if r.get("server_e2e_s") is not None]
    if not served:
        return {}
    timed = [r for r in served if r.get("server_ttft_s") is not None]
    e2e = _errors(served, "server_e2e_s", "predicted_e2e_s")
    ttft = _errors(timed, "server_ttft_s", "predicted_ttft_s")
    return {"server_runs": len(served),
            "server_e2e_mape_pct": mean_or_none(abs(e) for e in e2e), "server_e2e_bias_pct": mean_or_none(e2e),
            "server_e2e_negative_share": _negative_share(e2e),
            "server_ttft_mape_pct": mean_or_none(abs(e) for e in ttft), "server_ttft_bias_pct": mean_or_none(ttft),
            # the client's mean over the server's, less 1: HTTP, detokenisation, streaming and a client short of CPU
            "client_over_server_e2e_pct": mean_or_none(_errors(served, "server_e2e_s", "e2e_s")),
            "client_over_server_ttft_pct": mean_or_none(_errors(timed, "server_ttft_s", "ttft_s"))}


def _coverage(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How many runs' measured mean E2E lies inside the 95% interval ``plan`` gave at their rate (runs recorded
    without one are left out: summaries before acc46, calibrations without a covariance)."""
    banded = [r for r in runs if r.get("planned_e2e_ci95_s") is not None]
    inside = [r for r in banded if r["planned_e2e_ci95_s"][0] <= r["e2e_s"]
              and (r["planned_e2e_ci95_s"][1] is None or r["e2e_s"] <= r["planned_e2e_ci95_s"][1])]
    return {"ci95_runs": len(banded), "ci95_coverage_pct": 100.0 * len(inside) / len(banded) if banded else None}


def regrets(runs: Sequence[Mapping[str, Any]], picks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Best-option regret at every (benchmark run, pass, workload, load).

    See :func:`sdplan.fitting.validation.option_regret`; a load whose pick was not measured, or with one option, is
    skipped.
    """

    picked = {(p["run"], p["workload"], p["load"]): p for p in picks}
    measured: dict[tuple[Any, ...], dict[int, float]] = defaultdict(dict)
    for r in runs:
        measured[(r["run"], r["pass"], r["workload"], r["load"])][r["option"]] = r["e2e_s"]
    rows = []
    for (run, attempt, workload, load), latencies in sorted(measured.items(), key=lambda item: str(item[0])):
        pick = picked.get((run, workload, load))
        if pick is None or len(latencies) < 2 or (pick["picked"] is not None and pick["picked"] not in latencies):
            continue
        regret = option_regret(latencies, pick["picked"])
        rows.append({"run": run, "pass": attempt, "workload": workload, "load": load, "rate_rps": pick["rate_rps"],
                     "picked": pick["picked"], "best": min(latencies, key=lambda k: latencies[k]),
                     "regret_pct": finite_or_none(100.0 * regret)})
    return rows


def _bias_per_run(runs: Sequence[Mapping[str, Any]], ids: Sequence[Any], measured: str, predicted: str) -> list[float]:
    """Each benchmark run's mean signed error (%) of one figure, in the order of ``ids`` (runs without one left out)."""
    return [b for b in (mean_or_none(_errors([r for r in runs if r["run"] == i], measured, predicted)) for i in ids)
            if b is not None]


def summarize(runs: Sequence[Mapping[str, Any]], saturation: Sequence[Mapping[str, Any]],
              picks: Sequence[Mapping[str, Any]], calibrate_wall_s: Sequence[float] = (),
              spreads: Mapping[str, tuple[float, int]] | None = None) -> dict[str, Any]:
    """Every figure the benchmark judges, per workload and over all of them, from the records; beside them
    (``noise``, :mod:`~sdplan.accuracy.floors`) what the servers' spread leaves to any model, for the benchmark runs
    whose calibration's spread ``spreads`` gives (run id: repeat_sd_pct, server instances per configuration).
    """
    by_workload: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in runs:
        by_workload[r["workload"]].append(r)
    top_load = max((r["load"] for r in runs), default=None)
    top = [r for r in runs if r["load"] == top_load]
    ids = sorted({r["run"] for r in runs} | {s["run"] for s in saturation})
    saturation_errors = [e for e in (pct(s["predicted_rps"], s["measured_rps"]) for s in saturation) if e is not None]
    e2e_per_run = _bias_per_run(runs, ids, "e2e_s", "predicted_e2e_s")
    ttft_per_run = _bias_per_run(runs, ids, "ttft_s", "predicted_ttft_s")
    saturation_per_run = [b for b in (mean_or_none(e for s in saturation if s["run"] == i
                                            for e in [pct(s["predicted_rps"], s["measured_rps"])] if e is not None)
                                      for i in ids) if b is not None]
    regret_rows = regrets(runs, picks)
    regret_values = [math.inf if r["regret_pct"] is None else r["regret_pct"] for r in regret_rows]
    top_accuracy = _accuracy(top)
    return {
        "version": SUMMARY_VERSION,
        "benchmark_runs": len(ids),
        "workloads": {label: _accuracy(members) for label, members in by_workload.items()},
        "all": _accuracy(runs),
        # what `sdplan validate` would judge: the runs its steady-state screen keeps (a diagnostic; the goals
        # are judged on every run)
        "kept_by_screen": _accuracy([r for r in runs if not r["flags"]]),
        # the runs whose answers reached the client on time (a diagnostic of the TTFT error that is delivery)
        "streams_on_time": _accuracy([r for r in runs if on_time(r)]),
        "top_load": top_load,
        "top_load_e2e_mape_pct": top_accuracy["e2e_mape_pct"],
        "top_load_e2e_bias_pct": top_accuracy["e2e_bias_pct"],
        "e2e_bias_per_run_pct": e2e_per_run,
        "e2e_bias_standard_error_pct": standard_error(e2e_per_run),
        "e2e_bias_per_run_median_pct": median_or_none(e2e_per_run),
        "e2e_bias_per_run_negative_share": _negative_share(e2e_per_run),
        "ttft_bias_per_run_pct": ttft_per_run,
        "ttft_bias_standard_error_pct": standard_error(ttft_per_run),
        "ttft_bias_per_run_median_pct": median_or_none(ttft_per_run),
        "ttft_bias_per_run_negative_share": _negative_share(ttft_per_run),
        "saturation_bias_pct": mean_or_none(saturation_errors),
        "saturation_mape_pct": mean_or_none(abs(e) for e in saturation_errors),
        "saturation_bias_per_run_pct": saturation_per_run,
        "saturation_bias_standard_error_pct": standard_error(saturation_per_run),
        "regret": regret_rows,
        "max_regret_pct": finite_or_none(max(regret_values)) if regret_values else None,
        "rates_over_regret_goal": sum(v > REGRET_GOAL_PCT for v in regret_values),
        "rates_compared": len(regret_values),
        "calibrate_wall_s": list(calibrate_wall_s),
        "noise": noise_summary(runs, saturation, picks, spreads or {}, REGRET_GOAL_PCT),
    }


def goals(summary: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(what, value, goal, met) rows; ``met`` is ``yes``, ``NO`` or ``n/a`` (a pooled goal on too few runs)."""
    def judge(value: float | None, ok: bool, pooled: bool = False) -> str:
        if value is None:
            return "n/a"
        if pooled and summary["benchmark_runs"] < MIN_POOLED_RUNS:
            return f"n/a ({summary['benchmark_runs']} run; pool >= {MIN_POOLED_RUNS})"
        return "yes" if ok else "NO"

    def show(value: float | None, unit: str = "%", signed: bool = False) -> str:
        if value is None:
            return "-"
        return f"{value:+.1f}{unit}" if signed else f"{value:.1f}{unit}"

    everything = summary["all"]
    e2e, ttft = everything["e2e_mape_pct"], everything["ttft_mape_pct"]
    e2e_bias, sat_bias = everything["e2e_bias_pct"], summary["saturation_bias_pct"]
    top = summary["top_load_e2e_mape_pct"]
    regret = summary["max_regret_pct"]
    compared = summary["rates_compared"]
    walls = summary["calibrate_wall_s"]
    slowest = max(walls) if walls else None
    unstable = everything["predicted_unstable"]
    return [
        ("cross-workload mean E2E MAPE", show(e2e) + (f" ({unstable} predicted unstable)" if unstable else ""),
         f"<= {E2E_MAPE_GOAL_PCT:g}%", judge(e2e, e2e is not None and e2e <= E2E_MAPE_GOAL_PCT and not unstable)),
        ("cross-workload mean TTFT MAPE", show(ttft), f"<= {TTFT_MAPE_GOAL_PCT:g}%",
         judge(ttft, ttft is not None and ttft <= TTFT_MAPE_GOAL_PCT)),
        ("signed E2E bias, pooled", show(e2e_bias, signed=True), f"within +-{BIAS_GOAL_PCT:g}%",
         judge(e2e_bias, e2e_bias is not None and abs(e2e_bias) <= BIAS_GOAL_PCT, pooled=True)),
        ("signed saturation bias, pooled", show(sat_bias, signed=True), f"within +-{BIAS_GOAL_PCT:g}%",
         judge(sat_bias, sat_bias is not None and abs(sat_bias) <= BIAS_GOAL_PCT, pooled=True)),
        (f"mean E2E MAPE at {summary['top_load']:.0%} load" if summary["top_load"] is not None else "top load",
         show(top), f"<= {TOP_LOAD_E2E_GOAL_PCT:g}%", judge(top, top is not None and top <= TOP_LOAD_E2E_GOAL_PCT)),
        ("best-option regret, worst rate", ("unstable pick" if regret is None and compared else show(regret))
         + f" ({summary['rates_over_regret_goal']} of {compared} rates over)", f"<= {REGRET_GOAL_PCT:g}% at every rate",
         judge(None if not compared else math.inf if regret is None else regret,
               compared > 0 and summary["rates_over_regret_goal"] == 0)),
        ("calibrate wall time, slowest run", show(slowest, " s"), f"<= {CALIBRATE_GOAL_S:g} s",
         judge(slowest, slowest is not None and slowest <= CALIBRATE_GOAL_S)),
    ]


def report_lines(summary: Mapping[str, Any]) -> list[str]:
    """The summary as text: per workload, over all, the regret per rate, and the goals."""
    def show(value: float | None, signed: bool = False) -> str:
        return "-" if value is None else (f"{value:+.1f}%" if signed else f"{value:.1f}%")

    codes = summary.get("predicted_by", [])
    mixed = len(codes) > 1 or UNRECORDED_CODE in codes
    lines = [] if not mixed else [
        f"predictions as stored, not re-made by today's code: made by {'; '.join(codes)}; the pooled figures may "
        "mix versions of the model", ""]
    lines += [f"{'workload':>12} {'runs':>5} {'E2E MAPE':>9} {'E2E bias':>9} {'TTFT MAPE':>10} {'TTFT bias':>10} "
              f"{'TPOT MAPE':>10} {'as plan':>8} {'unstable':>8}"]
    table = [*summary["workloads"].items(), ("all", summary["all"])]
    if summary["kept_by_screen"]["poisson_runs"] < summary["all"]["poisson_runs"]:
        table.append(("unflagged", summary["kept_by_screen"]))  # the runs the steady-state screen keeps
    on_time_runs = summary.get("streams_on_time")  # absent from summaries written before acc40
    if on_time_runs and 0 < on_time_runs["poisson_runs"] < summary["all"]["poisson_runs"]:
        table.append(("on time", on_time_runs))  # the runs known not to have stalled streams
    for label, a in table:
        lines.append(f"{label:>12} {a['poisson_runs']:>5} {show(a['e2e_mape_pct']):>9} "
                     f"{show(a['e2e_bias_pct'], True):>9} {show(a['ttft_mape_pct']):>10} "
                     f"{show(a.get('ttft_bias_pct'), True):>10} {show(a['tpot_mape_pct']):>10} "
                     f"{show(a['planned_e2e_mape_pct']):>8} {a['predicted_unstable']:>8}")
    lines.append("")
    if summary["regret"]:
        lines.append(f"{'run':>10} {'pass':>4} {'workload':>9} {'load':>5} {'rate':>7} {'plan picks':>11} "
                     f"{'best measured':>13} {'regret':>8}")
        for r in summary["regret"]:
            picked = "none stable" if r["picked"] is None else option_label(r["picked"])
            lines.append(f"{str(r['run'])[-10:]:>10} {r['pass']:>4} {r['workload']:>9} {r['load']:>5.2f} "
                         f"{r['rate_rps']:>7.3g} {picked:>11} {option_label(r['best']):>13} "
                         f"{'inf' if r['regret_pct'] is None else format(r['regret_pct'], '.1f') + '%':>8}")
        lines.append("")
    everything = summary["all"]
    for figure, name in (("e2e", "E2E"), ("ttft", "TTFT")):
        per_run = summary.get(f"{figure}_bias_per_run_pct", [])  # TTFT's absent from summaries before 2026-11-29
        if len(per_run) > 1:
            lines.append(f"{name} bias per benchmark run: " + ", ".join(f"{b:+.1f}%" for b in per_run)
                         + f" (standard error of the pooled bias {summary[f'{figure}_bias_standard_error_pct']:.1f} "
                         f"points; median {summary[f'{figure}_bias_per_run_median_pct']:+.1f}%, "
                         f"{summary[f'{figure}_bias_per_run_negative_share']:.0%} of runs negative)")
    for figure, name in (("e2e", "E2E"), ("ttft", "TTFT")):
        if everything.get(f"{figure}_median_error_pct") is not None:
            lines.append(f"{name} error per Poisson run: mean {everything[f'{figure}_bias_pct']:+.1f}%, median "
                         f"{everything[f'{figure}_median_error_pct']:+.1f}%, "
                         f"{everything[f'{figure}_negative_share']:.0%} negative")
    if everything.get("e2e_median_error_pct") is not None:
        sat = summary["saturation_bias_per_run_pct"]
        if len(sat) > 1:
            lines.append("saturation bias per benchmark run: " + ", ".join(f"{b:+.1f}%" for b in sat)
                         + f" (standard error {summary['saturation_bias_standard_error_pct']:.1f} points)")
    lines.append(f"saturation: mean abs. error {show(summary['saturation_mape_pct'])}")
    for label, a in table:
        if a.get("server_runs"):  # runs recorded with the server's /metrics around them
            lines.append(f"{label}, against the server's own histograms ({a['server_runs']} runs): E2E MAPE "
                         f"{show(a['server_e2e_mape_pct'])}, bias {show(a['server_e2e_bias_pct'], True)} "
                         f"({a['server_e2e_negative_share']:.0%} negative); TTFT MAPE "
                         f"{show(a['server_ttft_mape_pct'])}, "
                         f"bias {show(a['server_ttft_bias_pct'], True)}; the client measured E2E "
                         f"{show(a['client_over_server_e2e_pct'], True)} and TTFT "
                         f"{show(a['client_over_server_ttft_pct'], True)} above the server")
    banded = summary["all"].get("ci95_runs")
    if banded:
        lines.append(f"plan's 95% intervals hold {show(summary['all']['ci95_coverage_pct'])} of {banded} runs' "
                     "measured mean E2E")
    noise = summary.get("noise")  # absent from summaries written before acc50
    if noise:
        lines += noise_lines(noise, REGRET_GOAL_PCT)
    lines.append("")
    rows = goals(summary)
    width = max(len(row[0]) for row in rows)
    lines.append(f"{'goal':<{width}}  {'value':<34} {'target':<22} met")
    lines += [f"{what:<{width}}  {value:<34} {goal:<22} {met}" for what, value, goal, met in rows]
    return lines


def pool(documents: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary over several benchmark runs' JSON documents (each run is its own calibration)."""
    runs, saturation, picks, walls, codes = [], [], [], [], set()
    spreads: dict[str, tuple[float, int]] = {}
    seen = set()
    for document in documents:
        if document.get("version") != SUMMARY_VERSION:
            raise ValueError(f"summary version {document.get('version')!r}, expected {SUMMARY_VERSION}")
        identity = document["run_id"]
        if identity in seen:
            raise ValueError(f"benchmark run {identity!r} given twice")
        seen.add(identity)
        runs += document["records"]["runs"]
        saturation += document["records"]["saturation"]
        picks += document["records"]["picks"]
        walls.append(document["calibrate_wall_s"])
        codes.add(document.get("predicted_by") or UNRECORDED_CODE)
        spread = calibration_spread(document)
        if spread is not None:
            spreads[identity] = spread
    # which code made the predictions: more than one (or any unrecorded) and the pooled figures mix models
    return {**summarize(runs, saturation, picks, walls, spreads), "predicted_by": sorted(codes)}


def read_document(path: Path) -> dict[str, Any]:

    try:
        document: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not a readable benchmark summary ({error})") from None
    if "records" not in document or "run_id" not in document:
        raise ValueError(f"{path}: no 'records'/'run_id': not written by benchmarks/accuracy_served.py")
    return document
