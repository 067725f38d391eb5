"""The answer first: the decision in words, why, and the biggest caveat.

Every table-format report of ``plan``, ``capacity`` and ``check`` starts with
these lines, so that a reader who stops after them still has the decision and
knows what it rests on. They are built from the same numbers as the tables.

The *why* is the model's decomposition (Kong et al., eq. 1):
``L = C1 / (1 - lambda C2)``, so

    speedup(lambda) = (C1_D / C1_k) * (1 - lambda C2_D)^-1 * (1 - lambda C2_k)

SD buys its zero-load speedup ``C1_D / C1_k`` by cutting the number of
steps, but where it raises the per-request batch cost ``C2`` (verifying
``k + 1`` tokens per request and step) the queueing factor grows faster with
SD, the speedup shrinks with load and reaches 1 at the break-even rate
``(C1_D - C1_k) / (C1_D C2_k - C1_k C2_D)``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from sdplan.planning.planner import NONE_STABLE, SD_OFF, last_saturating

if TYPE_CHECKING:
    from sdplan.inputs.acceptance import AcceptanceSpec
    from sdplan.planning.capacity_answer import CapacityAnswer, FleetPlan, OtherSpeed
    from sdplan.planning.planner import Plan, PlanInputs
    from sdplan.planning.uncertainty import SpeedMargin


def _g(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}g}"


def acceptance_origin(source: str) -> str:
    """A short word for where an acceptance value came from: assumed, measured, given."""
    text = source.lower()
    if text.startswith("default"):
        return "assumed"
    if text.startswith("speculation profile"):
        return "from the speculation profile"
    if "calibration" in text:
        return "from the calibration"
    if "workload file" in text:
        return "from the workload file"
    return "given"


def alpha_phrase(alpha: float, source: str, positions: list[float] | tuple[float, ...] | None = None) -> str:
    """``per-token alpha 0.700 (assumed)``: the acceptance with where it came from, for every table.

    With per-position rates (vLLM's ``r_1..r_K``) those are what the model used, not the alpha.
    """
    if positions:
        return (f"acceptance per draft position {', '.join(f'{r:.3g}' for r in positions)} "
                f"({acceptance_origin(source)})")
    return f"per-token alpha {alpha:.3f} ({acceptance_origin(source)})"


def given_positions(acceptance: AcceptanceSpec) -> list[float] | None:
    """The per-position rates as given (``--position-acceptance``, a calibration's or a file's), if they were."""
    return list(acceptance.values) if acceptance.metric.value == "per-position" else None


def caveats(method: str, acceptance_source: str, alpha: float, warnings: list[str] | tuple[str, ...] = (),
            batch_note: str | None = None) -> list[str]:
    """What the answer rests on, most important first."""
    items = []
    if acceptance_origin(acceptance_source) == "assumed":
        items.append(f"acceptance is ASSUMED (per-token alpha {alpha:.3f}, the default); measure it "
                     "(vLLM spec_decode_acceptance_length) and pass --acceptance-length/--acceptance-k")
    if method == "roofline":
        items.append("the calibration is a roofline estimate from datasheets, NOT measured; "
                     "fit one to your benchmarks (sdplan fit) or measure one (sdplan calibrate)")
    if method == "derived":
        items.append("the calibration is priced by AIConfigurator's op database (sdplan show: what was measured, "
                     "derived and assumed); check it against your benchmarks (sdplan validate)")
    if batch_note:
        items.append(batch_note)
    items.extend(warnings)
    return items


def caveat_lines(items: list[str]) -> list[str]:
    if not items:
        return ["Caveat: mean latencies from a calibrated model (Kong et al.); no percentiles (sdplan simulate)"]
    lines = [f"Caveat: {items[0]}"]
    lines.extend(f"  also: {item}" for item in items[1:])
    return lines


def _segments(plan: Plan, ia: int) -> list[tuple[int, float, float]]:
    """Runs of equal best k along the rate grid: (best k, first rate, last rate); unstable rows left out."""
    runs: list[tuple[int, float, float]] = []
    for ir, rate in enumerate(plan.rates_rps):
        best = int(plan.best_k[ia, ir])
        if best == NONE_STABLE:
            continue
        if runs and runs[-1][0] == best:
            runs[-1] = (best, runs[-1][1], float(rate))
        else:
            runs.append((best, float(rate), float(rate)))
    return runs


def _k_name(k: int) -> str:
    return "SD off" if k == 0 else f"k={k}"


def plan_answer(plan: Plan, inputs: PlanInputs, ia: int, batch_cap: float | None = None) -> list[str]:
    """The decision for acceptance row ``ia``: 'Answer:', 'Why:' and 'Caveat:' lines."""
    ks = [int(k) for k in plan.draft_lengths]
    c1, c2 = plan.c1_s[ia], plan.c2_s[ia]
    c1_d, c2_d = plan.baseline_c1_s, plan.baseline_c2_s
    zero_speedup = c1_d / c1
    k0 = int(np.argmin(c1))
    sat_d = plan.baseline_saturation_rate_rps
    sat = plan.saturation_rate_rps[ia]
    ksat = last_saturating(sat)
    ksat = k0 if ksat is None else ksat
    lines = []

    def at_cap(column: int, limit: str) -> str:  # which limit sets a saturation, where it is the engine's cap
        phrases = inputs.cap_phrases
        return f" (its {phrases[column]})" if limit == "cap" and column < len(phrases) else ""

    saturates = (f"saturates at {_g(sat_d, 4)} req/s without SD{at_cap(0, plan.baseline_saturation_limit)}, "
                 f"{_g(float(sat[ksat]), 4)} with k={ks[ksat]}{at_cap(ksat + 1, str(plan.saturation_limit[ia, ksat]))}"
                 if math.isfinite(sat_d) else "never saturates")
    wins = [(k, lo, hi) for k, lo, hi in _segments(plan, ia) if k > 0]
    if zero_speedup[k0] <= 1.0 and wins:  # slower at zero load, faster somewhere on the grid (MoE coverage)
        path = ", then ".join(f"{_k_name(k)} at {_g(lo)}{'' if lo == hi else f'-{_g(hi)}'}"
                              for k, lo, hi in _segments(plan, ia))
        lines.append(f"Answer: SD off at low load (best k={ks[k0]}: {zero_speedup[k0]:.2f}x at zero load), SD on "
                     f"from {_g(wins[0][1])} to {_g(wins[-1][2])} req/s on this grid; {saturates}.")
        lines.append(f"  best per rate (req/s): {path}.")
    elif zero_speedup[k0] <= 1.0:
        lines.append(f"Answer: SD off. No draft length is faster even at zero load (best: k={ks[k0]}, "
                     f"{zero_speedup[k0]:.2f}x); {saturates}.")
    else:
        faster_below = plan.sd_faster_below_break_even[ia]
        even = plan.break_even_rate_rps[ia]
        segments = _segments(plan, ia)
        if plan.moe_speedup_lost is not None:  # no closed-form break-even with expert coverage: read the grid
            off = [lo for k, lo, _ in segments if k == 0]
            always = not off
            limits = np.asarray([max(hi for k, _, hi in segments if k > 0 and hi < off[0])]) if off and any(
                k > 0 and hi < off[0] for k, _, hi in segments) else np.asarray([])
        else:
            always = bool(np.any(faster_below & ~np.isfinite(even)))
            limits = even[faster_below & np.isfinite(even)]
        path = ", then ".join(
            f"{_k_name(k)} at {_g(lo)}{'' if lo == hi else f'-{_g(hi)}'}"
            for k, lo, hi in segments)
        if always:
            head = f"Answer: SD on at every stable rate, k={ks[k0]} at zero load ({zero_speedup[k0]:.2f}x faster)"
        else:
            top = float(limits.max()) if limits.size else 0.0
            grid = " (the last rate of the grid with SD on; MoE has no closed-form break-even)" \
                if plan.moe_speedup_lost is not None else ""
            head = (f"Answer: SD on (k={ks[k0]}, {zero_speedup[k0]:.2f}x faster at zero load) up to "
                    f"{_g(top)} req/s{grid}; SD off above")
        loaded = _loaded_speedup(plan, ia)
        if loaded is not None:
            head += f"; {loaded[1]:.2f}x at {_g(loaded[0])} req/s"
        lines.append(f"{head}; {saturates}.")
        if path:
            lines.append(f"  best per rate (req/s): {path}.")
        direction = "but C2 (batch time each request adds) rises" if c2[k0] > c2_d else \
            "and C2 (batch time each request adds) falls"
        law = _law(plan.coefficients.load_concavity_sqrt_requests)
        why = (f"Why: {law}. With k={ks[k0]}, C1 (zero-load latency) falls "
               f"{_g(c1_d, 4)} -> "
               f"{_g(float(c1[k0]), 4)} s, {direction} {_g(c2_d, 4)} -> {_g(float(c2[k0]), 4)} s")
        if c2[k0] > c2_d:
            even_k0 = float(plan.break_even_rate_rps[ia, k0])
            why += (f" (k+1 tokens verified per request and step): the queueing factor grows faster with SD, so "
                    f"k={ks[k0]}'s speedup shrinks with load" + (f" and is gone at {_g(even_k0)} req/s."
                                                                 if math.isfinite(even_k0) else "."))
        else:
            why += (" (fewer steps outweigh the longer steps): SD saturates later, so its latency gain holds, even "
                    "grows, near no SD's saturation.")
        lines.append(why + _per_step(plan, ia, k0))
    batch_note, warnings = None, list(inputs.warnings)
    if batch_cap is not None:
        over = [float(rate) for ir, rate in enumerate(plan.rates_rps)
                if math.isfinite(_best_batch(plan, ia, ir)) and _best_batch(plan, ia, ir) > batch_cap]
        if over:
            # one caveat for one fact: the calibration's own warning of the batches past its range joins this one
            generic = next((warning for warning in warnings if "exceeds the calibrated batch sizes" in warning), None)
            if generic is not None:
                warnings.remove(generic)
            batch_note = (f"from {_g(over[0])} req/s the best option has more than {batch_cap:g} requests in "
                          "flight: " + (generic or "beyond the calibrated batch sizes; the step model is extrapolated "
                                        "there"))
    lines.extend(caveat_lines(caveats(inputs.calibration_method, inputs.acceptance.source, float(plan.alphas[ia]),
                                      warnings, batch_note)))
    if inputs.extrapolated:  # said before the answer, not only among the caveats after it
        lines[0] = lines[0].replace("Answer:", "Answer, extrapolated past the measured workloads ("
                                    + "; ".join(inputs.extrapolated) + "):", 1)
    return lines


def _per_step(plan: Plan, ia: int, ik: int) -> str:
    """`` Per engine step ...``: how SD's speedup at a fixed batch moves with the batch, where it moves."""
    if plan.step_speedup is None or plan.step_batches is None or plan.step_batches.size < 2:
        return ""
    first, last = float(plan.step_speedup[ia, ik, 0]), float(plan.step_speedup[ia, ik, -1])
    if abs(last / first - 1.0) < 0.02:
        return ""
    trend = "shrinks" if last < first else "grows"
    return (f" Per engine step its gain {trend} with the batch: {first:.2f}x with {plan.step_batches[0]:g} request "
            f"in flight, {last:.2f}x with {plan.step_batches[-1]:g}, as a concurrency sweep measures it "
            "(sdplan plan --concurrency).")


def _best_batch(plan: Plan, ia: int, ir: int) -> float:
    best = int(plan.best_k[ia, ir])
    if best == NONE_STABLE:
        return math.nan
    if best == SD_OFF:
        return float(plan.baseline_batch[ir])
    return float(plan.batch[ia, ir, list(plan.draft_lengths).index(best)])


def _loaded_speedup(plan: Plan, ia: int) -> tuple[float, float] | None:
    """(rate, best speedup) at the highest grid rate where no SD runs at most 75% utilisation."""
    chosen = None
    for ir, rate in enumerate(plan.rates_rps):
        speed = float(plan.best_speedup[ia, ir])
        if plan.baseline_utilisation[ir] <= 0.75 and math.isfinite(speed) and rate > 0:
            chosen = (float(rate), speed)
    return chosen


def capacity_answer(answer: CapacityAnswer) -> list[str]:
    """The decision of ``sdplan capacity`` in words, with why and the caveat."""
    cap, fleet = answer.capacity, answer.fleet
    best, best_sd = cap.best, cap.best_speculative
    slos = ", ".join(slo.text for slo in answer.slos)
    lines = []
    if best < 0:
        lines.append(f"Answer: no option meets {slos} at any request rate; relax the SLOs or use faster hardware.")
    else:
        rate = float(cap.max_rate_rps[best])
        if best == 0:
            head = f"Answer: SD off. Without SD a replica serves {_g(rate)} req/s under {slos}"
            if best_sd > 0:
                head += (f"; the best SD option ({cap.label(best_sd)}) only {_g(float(cap.max_rate_rps[best_sd]))}"
                         if cap.feasible[best_sd] else "; no SD option meets the SLOs")
        else:
            method = answer.scenario.method
            head = (f"Answer: SD on with {cap.label(best)}" + (f" ({method})" if method else "")
                    + f": {_g(rate)} req/s per replica under {slos}")
            off = float(cap.max_rate_rps[0])
            head += (f" vs {_g(off)} without SD" + (f" ({rate / off:.2f}x)" if off > 0 else "")
                     if cap.feasible[0] else "; without SD the SLOs cannot be met")
        lines.append(head + f" (binding: {cap.binding_slo[best] or '-'}).")
        if fleet is not None and fleet.no_sd is not None and fleet.best_sd is not None:
            lines.append(f"  for {fleet.target_rate_rps:g} req/s: {fleet.no_sd.replicas} replicas without "
                         f"SD, {fleet.best_sd.replicas} with {fleet.best_sd.option}.")
        why = capacity_why(answer)
        if why:
            lines.append(why)
    calibration = answer.scenario.calibration
    margin = answer.speed_margin
    lines.extend(caveat_lines(caveats(calibration.method or "", answer.scenario.workload.acceptance.source,
                                      cap.alpha, () if margin is None else
                                      (speed_caveat(margin, capacity_other_side(answer.other_speed)),))))
    return lines


#: What no speed margin covers: a replica's own speed (the intervals), drift, Little's law, other workloads.
NOT_COVERED = ("Not covered: one replica's own speed (the 95% intervals), the machine's drift over "
               "hours, the load an open loop's requests meet beyond Little's lambda L (about 6% in runs of 10 s "
               "or more), and workloads other than the calibrated one.")


def speed_caveat(margin: SpeedMargin, other: str | None, verb: str = "sized") -> str:
    """How fast the answer (``capacity``'s or ``check``'s) assumes the servers: its margin, or that it has none.

    ``other`` is the answer on the other side of the margin, in words (None: not computed); ``verb`` what
    the command did (``sized``, ``checked``). The texts of
    ``benchmarks/RESULTS-accuracy-served-2026-11.md`` (over-promise, the proposed rule).
    """
    if not margin.measured:
        return ("this calibration did not measure how far its server instances lie apart (served quick grids on "
                "2-core CPU VMs: 4.5-16%); the answer assumes servers exactly as fast as the ones it measured")
    plural = "s" if margin.instances != 1 else ""
    spread = (f"its servers {margin.sd_pct:.2g}% apart (repeat_sd_pct) over {margin.instances} instance{plural} "
              "per configuration; one-sided 95% of the calibration's own speed")
    if margin.applied:
        there = ("(--at-calibrated-speed): " + other) if other is not None else ": rerun with --at-calibrated-speed"
        return (f"{verb} for servers up to {margin.slower_pct:.2g}% slower than this calibration's ({spread}). "
                f"At the calibration's speed {there}. {NOT_COVERED}")
    there = f", the default: {other}" if other is not None else ": rerun without --at-calibrated-speed"
    return (f"{verb} at the calibration's speed (--at-calibrated-speed): servers as fast as the ones it measured. "
            f"On servers up to {margin.slower_pct:.2g}% slower ({spread}){there}.")


def capacity_other_side(other: OtherSpeed | None) -> str | None:
    """The capacity answer on the other side of the margin: the fleet where there is one, else the best rate."""
    if other is None:
        return None
    fleet = other.fleet
    if fleet is not None and (fleet.no_sd is not None or fleet.best_sd is not None):
        return _fleet_phrase(fleet)
    if other.best_rate_rps is None:
        return "no option meets the SLOs"
    return f"{_g(other.best_rate_rps)} req/s per replica with the best option"


def _fleet_phrase(fleet: FleetPlan) -> str:
    parts = []
    if fleet.no_sd is not None:
        parts.append(f"{fleet.no_sd.replicas} replicas without SD")
    if fleet.best_sd is not None:
        parts.append(f"{fleet.best_sd.replicas} with {fleet.best_sd.option}")
    return ", ".join(parts)


def replicas_saved_phrase(saved: int, at: str) -> str:
    """What SD does to a fleet's replicas at ``at`` (a target rate or concurrency), in words."""
    if saved > 0:
        return f"SD saves {saved} replica(s) at {at}"
    if saved < 0:
        return f"SD needs {-saved} more replica(s) at {at}"
    return f"SD needs as many replicas as no SD at {at}"


def capacity_why(answer: CapacityAnswer) -> str | None:
    """Why SD gains (or loses) capacity: C1 and C2 (past the knee) of no SD and of the best SD option."""
    cap = answer.capacity
    best_sd = cap.best_speculative
    if best_sd <= 0:
        return None
    c2 = cap.c2_past_knee_s
    c1_d, c2_d = float(cap.c1_s[0]), float(c2[0])
    c1_k, c2_k = float(cap.c1_s[best_sd]), float(c2[best_sd])
    direction = "rises" if c2_k > c2_d else "falls"
    if cap.expert_coverage:  # C1 at zero load, C2 with every expert covered (moe_capacity)
        law, c1_name, c2_name = (f"{MOE_LAW}, their steps costing more as a batch covers more experts",
                                 "C1 (zero load)", "C2 (every expert covered)")
    else:
        law, c1_name, c2_name = _law(0.0 if cap.knee is None else cap.knee.concavity), "C1", "C2"
    text = (f"Why: {law}. {cap.label(best_sd)} cuts {c1_name} {_g(c1_d, 4)} -> {_g(c1_k, 4)} s "
            f"{'but' if c2_k > c2_d else 'and'} {c2_name} {direction} {_g(c2_d, 4)} -> {_g(c2_k, 4)} s")
    if c2_k > c2_d:
        return text + ": SD helps a latency bound at low load, and costs capacity near saturation."
    return text + ": SD both lowers latency and lifts saturation."


#: The load law of an MoE target's answer (:mod:`sdplan.latency.moe`): a fixed point, no closed form.
MOE_LAW = "L = (C1(B) + W)/(1 - rate*C2(B)) with B = rate*L, W the wait for prefills queued ahead"


def _law(concavity: float) -> str:
    """The load law an answer's "Why" names: Kong et al.'s line, or the concave one (docs/model.md#concave-load),
    with the wait for the prefills queued ahead (docs/model.md#prefills-queued-ahead)."""
    if concavity > 0:
        return (f"L = C1 + W + C2 (B + {concavity:g} sqrt B) with B = rate*L (a concave load law), W the wait for "
                "prefills queued ahead")
    return "L = (C1 + W)/(1 - rate*C2), W the wait for prefills queued ahead"


def check_answer(passed: bool, met: int, total: int, where: str, regime: str, method: str, source: str,
                 alpha: float, failed: list[str], limit: str = "saturation", speed: str | None = None) -> list[str]:
    """The verdict of ``sdplan check`` in words, then the caveat; ``limit`` is what an unstable rate exceeds,
    ``speed`` the servers' speed the verdict assumes (:func:`speed_caveat`)."""
    head = f"Answer: {'PASS' if passed else 'FAIL'}: {met}/{total} SLOs met {where}"
    if regime == "unstable":
        head += f"; the rate is past {limit} (requests queue without bound)"
    elif failed:
        head += "; missed: " + "; ".join(failed)
    lines = [head + "."]
    lines.extend(caveat_lines(caveats(method, source, alpha, () if speed is None else (speed,))))
    return lines
