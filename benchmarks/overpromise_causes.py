#!/usr/bin/env python3
"""Why served calibrations over-promise: the candidate causes, tested offline on real served results.

Usage::

    python benchmarks/overpromise_causes.py

Served calibrations described faster servers than the ones they then predicted (saturation at the calibrated
workload over-predicted +12...+23%, latency under-predicted -6...-17% in acc50 and two later tries). New served
runs need the machine alone; these experiments use only real ``vllm bench serve`` results already in
``tests/data`` (each folder's README says how it was measured) and the *measured* plateaus of two stored
benchmark summaries (``benchmarks/summaries/acc41.json``, ``acc47.json``; their stored predictions are not
used). Every prediction below is made by today's code (:mod:`sdplan.fitting.fit`, :mod:`sdplan.fitting.validation`);
nothing is fitted to the runs being judged, and no constant is chosen here.

Each experiment prints its effect as a mean over ``n`` units with the standard error of that mean
(:func:`sdplan.accuracy.means.standard_error`), and beside it what an exact model would score where that
applies: :func:`sdplan.fitting.validation.exact_model_error_pct` from repeated runs of one level, or
:func:`sdplan.accuracy.floors.perfect_model_error` at zero load (a throughput or zero-load latency of one
server predicted exactly for another, the servers ``sigma = repeat_sd_pct`` apart).

The experiments (E1...E8) and the candidate each tests:

E1  closed loops fitted, open loops predicted, *on the same server*: does the closed-loop relation transfer
    to Poisson arrivals? (candidate: "closed-loop points fitted with a closed-loop factor that does not
    transfer to open loops")
E2  the load a Poisson run's requests meet, over Little's ``lambda L``, in calibrate's 8-s points and in
    runs of 10-30 s; and what fitting the short points at their measured load does to the calibration
E3  the second server instance of a calibration against its first (order in time within calibrate)
E4  the calibration's own servers against the validation's fresh servers minutes later, and a fresh plain
    ``vllm serve`` three hours later (fresh vs calibration servers; pre-warmed spare or not)
E5  one server's closed loop before and after a long run (warm-up and compile caches, server age)
E6  three validation passes on fresh servers, in time order
E7  the plateau: today's model of each calibration against the fresh servers' measured plateau, as a
    closed loop at its level and as ``1/C2``
E8  calibrate's load generator: what the fixtures can and cannot tell

E7c applies :func:`sdplan.planning.uncertainty.calibration_speed_margin` (the default answer's margin) to E7a: the
plateau a default answer would plan with if it carried the calibration's own speed error, one-sided 95%.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from sdplan.accuracy.floors import calibration_spread, perfect_model_error
from sdplan.accuracy.means import mean_or_none, standard_error
from sdplan.accuracy.repredict import saturation_prediction
from sdplan.calibration import load_calibration
from sdplan.fitting.fit import PooledFit, fit_configurations, fit_pooled
from sdplan.fitting.runmodel import run_demand
from sdplan.fitting.validation import exact_model_error_pct, predict_latency, repeat_spread
from sdplan.planning.uncertainty import calibration_speed_margin
from sdplan.runs import BenchmarkRun, load_runs, screen

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SUMMARIES = ROOT / "benchmarks" / "summaries"
#: The calibrations whose second server instance ran the Poisson points beside N = 1 and 64 again (quick grid).
QUICK_GRIDS = {"acc41": "served-frontend-floor-cpu", "acc47": "served-quick-floor-cpu",
               "s1": "served-sd-probes-cpu"}
#: ``--max-num-seqs`` of every served fixture here (their READMEs).
MAX_NUM_SEQS = 64
OPTIONS = {0: "nosd", 2: "k2", 4: "k4"}


@dataclass
class Effect:
    """One experiment's result: per-unit values (%), their mean and standard error, and the reading."""

    key: str
    candidate: str
    measure: str
    values: list[float]
    floor_pct: float | None = None
    floor_note: str = ""
    detail: list[str] = field(default_factory=list)
    #: Given where the effect is a difference of two groups' means (its standard error is theirs combined, and
    #: ``values`` holds both groups: no range or mean absolute value is printed for it).
    mean_pct: float | None = None
    se_pct: float | None = None
    difference: bool = False

    def __post_init__(self) -> None:
        if self.mean_pct is None:
            self.mean_pct = mean_or_none(self.values)
            self.se_pct = standard_error(self.values)


@functools.cache
def runs_of(folder: str) -> tuple[BenchmarkRun, ...]:
    """Every run of a fixture folder, as ``sdplan fit`` reads it (the screen applied by the callers), read once."""
    found, _ = load_runs([str(DATA / folder)], "vllm", None, None)
    return tuple(found)


def name(run: BenchmarkRun) -> str:
    """A run's file name without the folder and ``.json``."""
    return Path(run.source).name.removesuffix(".json")


def by_name(runs: Sequence[BenchmarkRun]) -> dict[str, BenchmarkRun]:
    return {name(run): run for run in runs}


def pct(ratio: float) -> float:
    return 100.0 * (ratio - 1.0)


def open_loop(run: BenchmarkRun) -> bool:
    return run.concurrency is None


def calibrated_workload(run: BenchmarkRun) -> bool:
    """A point at the calibration's own 128/64 (not a prompt- or decode-heavy probe)."""
    return "prompt" not in name(run) and "decode" not in name(run)


# ----------------------------------------------------------------------------- E1: closed -> open, one server


def same_server_sets() -> list[tuple[str, list[BenchmarkRun]]]:
    """Per fixture, the closed loops and Poisson runs each configuration measured on one server.

    ``served-cpu``: one server per configuration (N = 1, 2, 4, 8 and both Poisson points). The quick grids:
    the second instance (``_r1``: N = 1 and 64 again, then the Poisson points). Runs the steady-state screen
    leaves out are left out here too.
    """
    sets = [("served-cpu", [r for r in runs_of("served-cpu") if not screen(r)])]
    for label, folder in QUICK_GRIDS.items():
        sets.append((label, [r for r in runs_of(folder) if not screen(r) and calibrated_workload(r)
                             and (open_loop(r) or name(r).endswith("_r1"))]))
    return sets


def closed_to_open() -> list[Effect]:
    """E1: per configuration ``C1``, ``C2`` from one server's closed loops, that server's Poisson runs predicted.

    Three predictions of each Poisson run: (a) ``C1/(1 - lambda C2)`` at its arrival rate, ``C1`` and ``C2``
    fitted to the configuration's closed loops alone (:func:`sdplan.fitting.fit.fit_configurations`, ``B`` measured);
    (b) the same through the pooled fit of all the server's closed loops, as ``sdplan fit`` fits and
    ``sdplan validate`` predicts; (c) ``C1 + B C2`` at the run's *measured* others in flight, which leaves
    Little's law out and tests only whether a request's cost per other in flight is the same in both loops.
    """
    line, pooled, measured_b, detail = [], [], [], []
    for label, runs in same_server_sets():
        closed = [r for r in runs if not open_loop(r)]
        pooled_fit = fit_pooled(closed)
        full_fit = fit_pooled(runs)
        detail.append(f"{label}: the sdplan fit of these closed and open runs together puts the closed-loop factor "
                      f"at {full_fit.closed_loop_factor:.3f} (bounds 0.5-1)")
        for k in OPTIONS:
            members = [r for r in closed if r.draft_length == k]
            fits = fit_configurations(members)
            if not fits:
                continue
            c1, c2 = fits[0].c1_s, fits[0].c2_s
            for run in (r for r in runs if open_loop(r) and r.draft_length == k):
                rho = run.arrival_rate_rps * c2
                a = c1 / (1.0 - rho) if rho < 1.0 else math.inf
                b = predict_latency(pooled_fit.coefficients_at(run.prompt_tokens, run.output_tokens), run)
                c = c1 + run.mean_others * c2
                measured = run.mean_e2e_latency_s
                line.append(pct(a / measured))
                pooled.append(pct(b / measured))
                measured_b.append(pct(c / measured))
                detail.append(f"  {label} {name(run)}: measured {measured:.3f} s, lambda C2 {rho:.2f}; "
                              f"(a) {pct(a / measured):+.1f}%  (b) {pct(b / measured):+.1f}%  "
                              f"(c) {pct(c / measured):+.1f}%")
    floor = same_server_floor()
    floor_note = "exact model vs one Poisson run on the same server (served-arrivals, 11 req/s twice)"
    return [Effect("E1a", "closed-loop relation -> open loop, same server",
                   "Poisson E2E predicted from the server's own closed loops, per configuration", line, floor,
                   floor_note, detail),
            Effect("E1b", "the same through the pooled fit", "as sdplan fit + validate (closed loops only)",
                   pooled, floor, floor_note),
            Effect("E1c", "cost per other in flight, closed vs open", "C1 + B C2 at the run's measured B",
                   measured_b, floor, floor_note)]


def same_server_floor() -> float | None:
    """:func:`exact_model_error_pct` of the one Poisson level measured twice on one server (served-arrivals)."""
    runs = by_name(runs_of("served-arrivals-cpu"))
    return exact_model_error_pct([[runs["nosd_r11_b1_1"].mean_e2e_latency_s,
                                   runs["nosd_r11_b1_2"].mean_e2e_latency_s]])


# ----------------------------------------------------------------------------- E2: Little's law, short vs long


def load_ratio(run: BenchmarkRun) -> float:
    """The others in flight a Poisson run's requests met (measured per request), over ``lambda L``."""
    return run.mean_others / (run.arrival_rate_rps * run.mean_e2e_latency_s)


def short_and_long_runs() -> tuple[list[BenchmarkRun], list[BenchmarkRun]]:
    """Calibrate's 8-s Poisson points (the quick grids), and Poisson runs of 10-30 s (burstiness 1, no cap hit).

    Long: acc35's three validation passes (25 s), served-arrivals' Poisson runs at 11 and 8 req/s (12 and
    10 s; the 8 req/s cap of 32 was never reached) and served-cpu's calibration points (30 s, an older grid).
    """
    short = [r for folder in QUICK_GRIDS.values() for r in runs_of(folder) if open_loop(r) and not screen(r)]
    arrivals = by_name(runs_of("served-arrivals-cpu"))
    long = [r for r in runs_of("served-passes-cpu") if not screen(r)]
    long += [arrivals[key] for key in ("nosd_r11_b1_1", "nosd_r11_b1_2", "nosd_r8_cap32")]
    long += [r for r in runs_of("served-cpu") if open_loop(r) and not screen(r)]
    return short, long


def littles_law() -> list[Effect]:
    """E2: ``B / (lambda L)`` in short and long Poisson runs, and the calibrations refitted at measured ``B``.

    ``sdplan fit`` takes ``B = lambda L`` for an open-loop point (the planner's own relation). In a short
    point the first requests meet an empty server and the last ones a draining one, so its requests meet fewer
    others than ``lambda L``; in a long run more (requests that stay longer meet more: the sojourn-weighted
    count, docs/model.md). Refitting each quick grid with its Poisson rows at their measured ``B`` shows how
    much of its ``1/C2`` the short points move.
    """
    short, long = short_and_long_runs()
    s = [pct(load_ratio(r)) for r in short]
    lo = [pct(load_ratio(r)) for r in long]
    ms, ml, es, el = mean_or_none(s), mean_or_none(lo), standard_error(s), standard_error(lo)
    assert ms is not None and ml is not None and es is not None and el is not None
    detail = [f"short (8 s, n={len(s)}): B/(lambda L) - 1 = {ms:+.1f}% +- {es:.1f}; long (10-30 s, n={len(lo)}): "
              f"{ml:+.1f}% +- {el:.1f}"]
    moved = []
    for label, folder in QUICK_GRIDS.items():
        kept = [r for r in runs_of(folder) if not screen(r)]
        as_fit, at_b = fit_pooled(kept), fit_pooled([at_measured_load(r) for r in kept])
        for k, option in OPTIONS.items():
            template = plateau_template(kept, k)
            before = saturation_prediction(as_fit.coefficients_at, template, MAX_NUM_SEQS)["uncapped_rps"]
            after = saturation_prediction(at_b.coefficients_at, template, MAX_NUM_SEQS)["uncapped_rps"]
            if before and after:
                moved.append(pct(after / before))
                detail.append(f"  {label} {option}: 1/C2 {before:.2f} -> {after:.2f} req/s "
                              f"({pct(after / before):+.1f}%); closed-loop factor "
                              f"{as_fit.closed_loop_factor:.3f} -> {at_b.closed_loop_factor:.3f}")
    return [Effect("E2a", "Little's law in short points (load a short point meets)",
                   "long minus short, B/(lambda L) - 1 (difference of group means)", [*lo, *s],
                   detail=detail, mean_pct=ml - ms, se_pct=math.sqrt(es * es + el * el), difference=True),
            Effect("E2b", "... its effect on the calibration's saturation",
                   "1/C2 refitted with Poisson rows at measured B, over 1/C2 as fitted", moved),
            littles_law_in_validation()]


def littles_law_in_validation() -> Effect:
    """E2c: the part of a long validation run's prediction error that is Little's law, acc35's calibration.

    Each of acc35's 25-s validation runs (served-passes) predicted from the calibration calibrate wrote minutes
    before (``served.toml``, re-read by today's code), twice: at its arrival rate, ``C1/(1 - lambda C2)``, as
    ``sdplan validate`` predicts; and at the load its requests met, ``C1/(1 - kappa lambda C2)`` with the run's
    measured ``kappa = B/(lambda L)`` (the fixed point of ``L = C1 + B C2`` with ``B = kappa lambda L``). The
    difference is the error of taking ``B = lambda L``, amplified near saturation as the planner amplifies it;
    what the second leaves is the step relation's own error.
    """
    calibration = load_calibration(DATA / "served-passes-cpu" / "served.toml")
    values, detail = [], []
    for run in sorted(runs_of("served-passes-cpu"), key=name):
        coefficients = calibration.coefficients_at(run.prompt_tokens, run.output_tokens)
        c1, c2 = run_demand(coefficients, run)
        kappa, rho = load_ratio(run), run.arrival_rate_rps * c2
        at_rate = predict_latency(coefficients, run)
        at_load = c1 / (1.0 - kappa * rho) if kappa * rho < 1.0 else math.inf
        measured = run.mean_e2e_latency_s
        values.append(pct(at_rate / measured) - pct(at_load / measured))
        detail.append(f"  {name(run)}: lambda C2 {rho:.2f}, kappa {kappa:.3f}; "
                      f"at lambda {pct(at_rate / measured):+.1f}%, at kappa lambda {pct(at_load / measured):+.1f}%")
    return Effect("E2c", "... and in 25-s validation runs (acc35)", "error at lambda minus error at the measured "
                  "load kappa lambda (points)", values, detail=detail)


def at_measured_load(run: BenchmarkRun) -> BenchmarkRun:
    """An open-loop run whose rate times latency is its measured ``B`` (the fit's open-loop row at measured load)."""
    if not open_loop(run):
        return run
    return replace(run, requested_rate_rps=run.mean_others / run.mean_e2e_latency_s, scheduled_rate_rps=None)


def plateau_template(runs: list[BenchmarkRun], draft_length: int, clients: int = MAX_NUM_SEQS) -> BenchmarkRun:
    """The calibration's own first N = ``clients`` run of an option at 128/64: lengths and acceptance to predict at."""
    return next(r for r in sorted(runs, key=name) if r.draft_length == draft_length and r.concurrency == clients
                and calibrated_workload(r))


# ----------------------------------------------------------------------------- E3-E6: servers and time


def middle_latency(path: Path, clients: int) -> float:
    """Mean E2E of a closed loop's requests after its first wave and before its last (s), from the result file.

    A closed loop's first ``N`` requests start together (their prefills queue at once) and its last ``N``
    drain with fewer others, so a 3N-request point and a 6N-request one of the same server differ in their
    whole-run means; the middle requests of both ran with ``N - 1`` others, as in a steady state.
    """
    document = json.loads(path.read_text())
    ordered = sorted(zip(document["start_times"], document["latencies"]))
    middle = [latency for _, latency in ordered[clients:len(ordered) - clients]]
    return sum(middle) / len(middle)


def instance_order() -> Effect:
    """E3: the second server instance's mean E2E over the first's, at N = 1 and 64, per configuration.

    calibrate starts the first instances in the order no SD, k=2, k=4 and the second ones k=4, k=2, no SD, so
    no SD's two instances lie furthest apart in time. Each unit is one configuration of one calibration
    (the mean of its two levels' ratios).
    """
    values, detail, sigmas = [], [], []
    for label, folder in QUICK_GRIDS.items():
        runs = by_name(runs_of(folder))
        spread = repeat_spread(list(runs.values()))
        if spread is not None:
            sigmas.append(spread.sd_pct)
        for option in OPTIONS.values():
            ratios = [runs[f"{option}_{level}_r1"].mean_e2e_latency_s / runs[f"{option}_{level}_r0"].mean_e2e_latency_s
                      for level in ("c1", "c64")]
            values.append(pct(sum(ratios) / len(ratios)))
            detail.append(f"  {label} {option}: N=1 {pct(ratios[0]):+.1f}%, N=64 {pct(ratios[1]):+.1f}%")
    sigma = sum(sigmas) / len(sigmas)
    return Effect("E3", "order in time within calibrate (2nd instance vs 1st)",
                  "2nd instance's mean E2E over the 1st's, N = 1 and 64", values,
                  100.0 * perfect_model_error(0.0, sigma / 100.0, 1),
                  f"two single servers sigma = {sigma:.1f}% apart (mean repeat_sd_pct)", detail)


def validation_floor() -> tuple[float, str]:
    """What an exact model of a calibration's servers errs by against another server at zero load (%, its note):
    :func:`perfect_model_error` at the mean of acc41's and acc47's ``repeat_sd_pct`` (their summaries'
    ``calibration_spread``), two instances each."""
    spreads = [calibration_spread(json.loads((SUMMARIES / f"{run}.json").read_text())) for run in ("acc41", "acc47")]
    known = [spread for spread in spreads if spread is not None]
    sigma = sum(sd for sd, _ in known) / len(known)
    instances = round(sum(n for _, n in known) / len(known))
    return (100.0 * perfect_model_error(0.0, sigma / 100.0, instances),
            f"calibration of {instances} instances vs another server, sigma {sigma:.1f}% (acc41, acc47)")


def fresh_plateaus() -> list[tuple[str, int, int, float]]:
    """The validation's measured plateau at 128/64 per option, minutes after each calibration, on fresh servers.

    acc41: the held-out plateau files; acc47: the measured plateau its summary records. (calibration label,
    option, clients of the plateau level, req/s)
    """
    found = [("acc41", r.draft_length, r.concurrency or 0, r.achieved_rate_rps)
             for r in runs_of("served-frontend-floor-heldout-cpu") if "-w0-" in name(r)]
    document = json.loads((SUMMARIES / "acc47.json").read_text())
    found += [("acc47", s["option"], s["clients"], s["measured_rps"]) for s in document["records"]["saturation"]
              if s["workload"] == "128/64"]
    return found


def calibration_vs_fresh() -> list[Effect]:
    """E4: the fresh servers' plateau over the calibration's own closed loops at the same N (throughput).

    E4a: the validation's plateau is the best of N = 8, 16, 32, 64 (6N requests each), the calibration's points
    at that N have 3N (both instances averaged where N = 64), so whole-run throughputs also differ by the
    share of ramp-up and drain: E4b compares the middle waves (:func:`middle_latency`) where both files are
    here (acc41). E4c: acc41 started its servers plainly, acc47 from calibrate's pre-imported spare (since
    acc42). E4d: a plain ``vllm serve`` three hours after acc47's calibration (served-context, N = 16, no SD:
    its SD runs used vLLM's random prompts, accepted at another rate, so they are not the calibration's SD).
    """
    values, by_run, detail = [], {"acc41": [], "acc47": []}, []
    for label, option, clients, measured in fresh_plateaus():
        runs = runs_of(QUICK_GRIDS[label])
        own = [r.achieved_rate_rps for r in runs
               if r.draft_length == option and r.concurrency == clients and calibrated_workload(r)]
        ratio = measured / (sum(own) / len(own))
        values.append(pct(ratio))
        by_run[label].append(pct(ratio))
        detail.append(f"  {label} {OPTIONS[option]} N={clients}: calibration {', '.join(f'{x:.2f}' for x in own)}"
                      f" req/s, fresh {measured:.2f} req/s ({pct(ratio):+.1f}%)")
    steady = []
    for run in runs_of("served-frontend-floor-heldout-cpu"):
        if "-w0-" not in name(run) or run.concurrency is None:
            continue
        fresh = middle_latency(DATA / "served-frontend-floor-heldout-cpu" / f"{name(run)}.json", run.concurrency)
        own = [middle_latency(DATA / QUICK_GRIDS["acc41"] / f"{OPTIONS[run.draft_length]}_c{run.concurrency}_{r}.json",
                              run.concurrency)
               for r in ("r0", "r1")
               if (DATA / QUICK_GRIDS["acc41"] / f"{OPTIONS[run.draft_length]}_c{run.concurrency}_{r}.json").exists()]
        steady.append(pct((sum(own) / len(own)) / fresh))
        detail.append(f"  acc41 {OPTIONS[run.draft_length]} middle waves: calibration "
                      f"{', '.join(f'{x:.3f}' for x in own)} s, fresh {fresh:.3f} s ({steady[-1]:+.1f}% throughput)")
    spare = [b - a for a, b in zip(by_run["acc41"], by_run["acc47"])]
    detail.append("  spare (acc47) minus plain starts (acc41), per option: "
                  + ", ".join(f"{v:+.1f}" for v in spare) + " points")
    later = middle_latency(DATA / "served-context-cpu" / "nosd_128-64_first.json", 16)
    calibration = middle_latency(DATA / "served-quick-floor-cpu" / "nosd_c16_r0.json", 16)
    detail.append(f"  E4d: no SD N=16 middle waves: calibration {calibration:.3f} s, 3 h later {later:.3f} s")
    floor, note = validation_floor()
    return [Effect("E4a", "fresh validation servers vs the calibration's", "fresh plateau over the calibration's "
                   "own closed loops at the same N, whole runs", values, floor, note, detail),
            Effect("E4b", "... at steady state (acc41)", "the same from the middle waves' mean E2E", steady, floor,
                   note),
            Effect("E4c", "pre-warmed spare vs plain starts", "acc47 (spare) minus acc41 (plain), E4a per option "
                   "(points)", spare),
            Effect("E4d", "a plain vllm serve 3 h later vs the calibration's", "no SD, N = 16, middle waves' "
                   "throughput", [pct(calibration / later)], floor, note)]


def server_age() -> Effect:
    """E5: one server's N = 16 closed loop at 128/64 again after a 512/256 run, over its first (served-context)."""
    runs = by_name(runs_of("served-context-cpu"))
    values, detail = [], []
    for option in OPTIONS.values():
        first, again = runs[f"{option}_128-64_first"], runs[f"{option}_128-64_again"]
        values.append(pct(again.mean_e2e_latency_s / first.mean_e2e_latency_s))
        detail.append(f"  {option}: {first.mean_e2e_latency_s:.3f} -> {again.mean_e2e_latency_s:.3f} s")
    return Effect("E5", "warm-up and compile caches (server age)", "mean E2E again over first, same server",
                  values, detail=detail)


def pass_order() -> Effect:
    """E6: acc35's later validation passes over its first (fresh servers, same requests and rates)."""
    runs = by_name(runs_of("served-passes-cpu"))
    values, detail, repeats = [], [], []
    for load in ("0.25", "0.55", "0.8"):
        latency = [runs[f"pass{i}-k2-poisson{load}"].mean_e2e_latency_s for i in (1, 2, 3)]
        repeats.append(latency)
        values += [pct(latency[1] / latency[0]), pct(latency[2] / latency[0])]
        detail.append(f"  {load} load: " + ", ".join(f"{x:.3f}" for x in latency) + " s")
    return Effect("E6", "order in time across validation passes", "pass 2 and 3 mean E2E over pass 1", values,
                  exact_model_error_pct(repeats), "exact model vs one pass, from the three passes", detail)


# ----------------------------------------------------------------------------- E7: the plateau


def plateau_relation() -> list[Effect]:
    """E7: today's fit of each calibration against the fresh servers' measured plateau at 128/64.

    As a closed loop at the plateau's level, ``N/(C1 + f (N - 1) C2)`` (what the benchmark scores), and as
    ``1/C2`` (the open-loop saturation ``capacity`` sizes by).
    """
    fits: dict[str, PooledFit] = {}
    closed_errors, uncapped_errors, detail = [], [], []
    for label, option, clients, measured in fresh_plateaus():
        kept = [r for r in runs_of(QUICK_GRIDS[label]) if not screen(r)]
        fit = fits.setdefault(label, fit_pooled(kept))
        template = replace(plateau_template(kept, option), concurrency=clients)
        predicted = saturation_prediction(fit.coefficients_at, template, MAX_NUM_SEQS)
        closed, uncapped = predicted["predicted_rps"], predicted["uncapped_rps"]
        assert closed is not None and uncapped is not None
        closed_errors.append(pct(closed / measured))
        uncapped_errors.append(pct(uncapped / measured))
        detail.append(f"  {label} {OPTIONS[option]} N={clients}: measured {measured:.2f}, closed loop "
                      f"{closed:.2f} ({pct(closed / measured):+.1f}%), 1/C2 {uncapped:.2f} req/s "
                      f"({pct(uncapped / measured):+.1f}%)")
    floor, note = validation_floor()
    margins = []
    for (label, option, _, _), closed in zip(fresh_plateaus(), closed_errors):
        spread = calibration_spread(json.loads((SUMMARIES / f"{label}.json").read_text()))
        assert spread is not None
        margin = calibration_speed_margin(*spread)
        margins.append(pct((1.0 + closed / 100.0) / margin))
        detail.append(f"  {label} {OPTIONS[option]}: with the calibration's speed margin u = {margin:.3f} "
                      f"(sigma {spread[0]:g}%, {spread[1]} instances): {margins[-1]:+.1f}%")
    return [Effect("E7a", "saturation at the calibrated workload (today's code)",
                   "predicted closed-loop plateau over the fresh servers' measured one", closed_errors, floor, note,
                   detail),
            Effect("E7b", "plateau-to-C2 relation", "1/C2 over the measured plateau", uncapped_errors, floor, note),
            Effect("E7c", "E7a with the speed margin (default answer)",
                   "predicted plateau / exp(1.645 sigma/sqrt(n)) over the measured one", margins, floor, note)]


# ----------------------------------------------------------------------------- report


def row(effect: Effect) -> str:
    mean = "-" if effect.mean_pct is None else f"{effect.mean_pct:+.1f}%"
    se = "-" if effect.se_pct is None else f"{effect.se_pct:.1f}"
    floor = "-" if effect.floor_pct is None else f"{effect.floor_pct:.1f}%"
    spread = (f"{min(effect.values):+.0f}...{max(effect.values):+.0f}%" if len(effect.values) > 1
              else f"{effect.values[0]:+.1f}%")
    mape = f"{mean_or_none(abs(v) for v in effect.values):.1f}%"
    if effect.difference:
        spread = mape = "-"
    return (f"| {effect.key} | {effect.candidate} | {effect.measure} | {mean} | {se} | {len(effect.values)} | "
            f"{spread} | {mape} | {floor} |")


def experiments() -> list[Effect]:
    steps: Sequence[Callable[[], Effect | list[Effect]]] = (
        closed_to_open, littles_law, instance_order, calibration_vs_fresh, server_age, pass_order,
        plateau_relation)
    found: list[Effect] = []
    for step in steps:
        result = step()
        found += result if isinstance(result, list) else [result]
    return found


def main() -> int:
    found = experiments()
    print("| | candidate | measure | mean | se | n | range | mean abs. | exact model |")
    print("|---|---|---|---|---|---|---|---|---|")
    for effect in found:
        print(row(effect))
    print()
    for effect in found:
        if effect.detail or effect.floor_note:
            print(f"{effect.key} ({effect.measure})" + (f"; exact model: {effect.floor_note}" if effect.floor_note
                                                        else ""))
            for line in effect.detail:
                print(line)
    print("E8 calibrate's load generator: every calibration here used calibrate's long-lived `vllm bench serve`, "
          "and so did the validation's plateaus (benchmarks/accuracy_served.py, BenchClient); no fixture runs one "
          "configuration under both clients, so the client cannot be told apart from the server or the time.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
