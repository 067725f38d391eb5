"""The steady-state screen: which measured runs a fit or validation may use.

The model describes a server at a steady load of Poisson arrivals or a closed
loop of clients. :func:`screen` gives the reasons to leave a run out (failed
requests, max-load runs, ramps, non-Poisson or capped arrivals, a server or
client that fell behind) from what a run record says; the readers of
:mod:`sdplan.runs` measure the per-request evidence it reads
(:func:`sdplan.runs.screen.kept_up_fraction`, :func:`sdplan.runs.screen.held_back`,
:func:`sdplan.runs.screen.sent_in_bursts`). It lives in the core because the fit
and the validation apply it, and the core reads no result files.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sdplan.runs.record import BenchmarkRun

#: Steady-state screening thresholds.
MAX_FAILED_FRACTION = 0.01
MIN_ACHIEVED_FRACTION = 0.9
MAX_LITTLE_DEVIATION = 0.15
#: An open-loop run that scores less than this :func:`sdplan.runs.screen.kept_up_fraction` fell behind its
#: arrivals: 333 real Poisson runs of this project (served accuracy runs up to 80% load and the real-engine tests,
#: benchmarks/RESULTS-accuracy-served-2026-11.md) scored 0.947-1, one at twice the sustained rate 0.80.
MIN_KEPT_UP_FRACTION = 0.85


def fell_behind(kept_up: float | None) -> bool:
    """Whether an open loop's :func:`sdplan.runs.screen.kept_up_fraction` is below
    :data:`MIN_KEPT_UP_FRACTION` (None: no score)."""
    return kept_up is not None and kept_up < MIN_KEPT_UP_FRACTION


#: An open loop whose scheduled gaps repeat the one before more often than this is not Poisson.
MAX_REPEATED_GAP_SHARE = 0.2


def screen(run: BenchmarkRun) -> list[str]:
    """Reasons to leave a run out of a fit (empty: keep it).

    Checks: failed requests (> 1%); a max-load run (not at steady state); a run
    whose load the file does not record (:attr:`BenchmarkRun.unknown_load`); for
    open loops without per-request latencies, achieved below 90% of the arrival
    rate (saturated: with per-request latencies the run's :func:`~sdplan.runs.screen.kept_up_fraction`
    judges it, and a drain that is a large share of a short run does not
    matter); Little's law where a mean concurrency is reported; SD
    runs without acceptance; runs whose arrival rate ramped up
    (``--ramp-up-strategy``); open loops whose arrivals were not Poisson
    (``--burstiness`` other than 1, GuideLLM ``constant``) or that a client-side
    cap held back (:func:`sdplan.runs.screen.held_back`) or whose client fell behind its own schedule
    (GuideLLM's late starts, vLLM's bursts of sends: :func:`sdplan.runs.screen.sent_in_bursts`); open
    loops that fell behind their arrivals (:func:`sdplan.runs.screen.kept_up_fraction` below
    :data:`MIN_KEPT_UP_FRACTION`) and runs
    ``sdplan calibrate`` flagged overloaded in its manifest (see
    :mod:`sdplan.measure.levels`). Closed loops are kept: they are fitted with
    ``B`` = others in flight (``N - 1`` without per-request times).
    """
    reasons = []
    total = (run.completed or 0) + (run.failed or 0)
    if run.failed and total and run.failed / total > MAX_FAILED_FRACTION:
        reasons.append(f"{run.failed} of {total} requests failed")
    if run.open_loop_unbounded:
        reasons.append("max-load run (request rate inf without --max-concurrency): not at steady state")
    if run.speculation_unrecorded is not None:
        reasons.append(f"SD was on ({run.speculation_unrecorded}) but the file does not record the draft length: "
                       "give it per file (FILE:k=K, with len=L where the file lacks the acceptance) or with "
                       "--draft-length")
    if run.unknown_load is not None:
        reasons.append(f"its load is not recorded ({run.unknown_load}): neither an arrival rate nor a number of "
                       "clients, so the load its requests saw is unknown")
    if (run.requested_rate_rps and run.others_in_flight is None and run.kept_up is None
            and run.achieved_rate_rps < MIN_ACHIEVED_FRACTION * run.requested_rate_rps):
        reasons.append(f"achieved {run.achieved_rate_rps:.3g} of {run.requested_rate_rps:.3g} req/s requested: "
                       "saturated")
    if run.mean_concurrency is not None and run.concurrency is None and run.others_in_flight is None:
        little = run.achieved_rate_rps * run.mean_e2e_latency_s
        if abs(little - run.mean_concurrency) > MAX_LITTLE_DEVIATION * max(run.mean_concurrency, 1e-9):
            reasons.append(f"Little's law off: mean concurrency {run.mean_concurrency:.3g} vs lambda*L {little:.3g}")
    if run.draft_length > 0 and run.alpha is None:
        reasons.append("SD run without acceptance: give it per file (FILE:k=4,len=2.8) or with --acceptance ALPHA (or "
                       "--acceptance-length L with --acceptance-k K)")
    if run.ramp_up is not None:
        reasons.append(f"arrival rate ramped up during the run ({run.ramp_up}, --ramp-up-strategy): no one "
                       "steady load to fit or predict; measure at fixed rates or concurrencies")
    if fell_behind(run.kept_up) and not run.overloaded:
        reasons.append(f"the server fell behind its arrivals (kept up with {run.kept_up:.0%} of "
                       f"{run.requested_rate_rps:.3g} req/s, < {MIN_KEPT_UP_FRACTION:.0%}): past what it "
                       "sustains, not a steady state; its mean latency depends on how long the run was")
    if run.burstiness is not None and run.burstiness != 1.0:  # recorded for open loops at a finite rate only
        shape, effect = ((f"arrivals burstier than Poisson (--burstiness {run.burstiness:g})", "raises")
                         if run.burstiness < 1 else
                         ("constant-rate arrivals", "lowers") if math.isinf(run.burstiness) else
                         (f"arrivals more regular than Poisson (--burstiness {run.burstiness:g})", "lowers"))
        reasons.append(f"{shape}, which {effect} mean latency at the same rate; the model is for Poisson "
                       "arrivals: measure with vllm bench serve --burstiness 1 (its default) or GuideLLM's "
                       "poisson profile")
    if run.repeated_gaps is not None and run.repeated_gaps > MAX_REPEATED_GAP_SHARE and run.burstiness == 1.0:
        workers = f", {run.client_workers} here" if run.client_workers else ""
        reasons.append(f"its Poisson schedule repeats gaps ({run.repeated_gaps:.0%} of the gaps between scheduled "
                       f"sends equal the one before): GuideLLM 0.8 draws each gap once per worker process{workers}, "
                       "from one seed, so requests come in runs at one rate, not as Poisson arrivals; rerun "
                       "GuideLLM with GUIDELLM__MAX_WORKER_PROCESSES=1")
    if run.sent_late is not None:
        reasons.append(f"the client fell behind its own schedule ({run.sent_late}, after their scheduled times) "
                       "with no cap reached: the server saw fewer arrivals than scheduled; give "
                       "the client more CPU or run it on another machine")
    if run.held_back_by_cap is not None:
        reasons.append(f"the client's cap of {run.client_cap} requests in flight (vllm bench serve --max-concurrency, "
                       f"GuideLLM max_concurrency) held an open loop back ({run.held_back_by_cap}): "
                       "the server saw neither Poisson arrivals at "
                       f"{run.requested_rate_rps:.3g} req/s nor a closed loop of {run.client_cap}; rerun without "
                       "the cap or with one above the peak in flight")
    if run.overloaded:
        reasons.append("the server did not keep up with this Poisson point (flagged overloaded in sdplan "
                       "calibrate's manifest.jsonl): not at a steady state")
    return reasons
