"""Views of ``sdplan check`` and ``sdplan capacity`` answers: text, JSON, plots, the lines on stderr.

Every view reads the typed answer of the core (:class:`sdplan.planning.check_answer.CheckAnswer`,
:class:`sdplan.planning.capacity_answer.CapacityAnswer`); the JSON is built from it here, in one place.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rich.table import Table
from rich.text import Text

from sdplan import __version__
from sdplan.inputs.methods import METHODS, provenance_method
from sdplan.planning.planner import option_label
from sdplan.render import (
    JSON_SCHEMA_VERSION,
    OutputFormat,
    Style,
    print_paragraph,
    print_table,
    render_rich,
    table_box,
    to_json,
)
from sdplan.render.answer import (
    alpha_phrase,
    capacity_answer,
    capacity_other_side,
    check_answer,
    given_positions,
    replicas_saved_phrase,
    speed_caveat,
)
from sdplan.render.closed_loop import DEFINITIONS as CLOSED_LOOP_DEFINITIONS
from sdplan.render.plan import METHOD_LABELS
from sdplan.render.plan_data import TPOT_NOTE, TTFT_NOTE, cap_fields
from sdplan.render.plots import file_bars, terminal_bars
from sdplan.units import finite_or_none

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np
    import numpy.typing as npt

    from sdplan.inputs.slo import SLO, Verdict
    from sdplan.planning.capacity import Fleet
    from sdplan.planning.capacity_answer import CapacityAnswer, EngineConfigAnswer, OtherSpeed
    from sdplan.planning.check import CheckReport
    from sdplan.planning.check_answer import CheckAnswer
    from sdplan.planning.scenario import Scenario
    from sdplan.planning.uncertainty import SpeedMargin

_SUFFIX = {"e2e": "_s", "ttft": "_s", "tpot": "_s", "throughput": "_tok_s", "utilisation": "_fraction"}


def _option(draft_length: int) -> str:
    return f"SD {option_label(draft_length)}"


def _ttft_note(report: CheckReport) -> str:
    """What the TTFT is: an open loop's (no queue for admission), or a closed loop's (its wait added)."""
    if report.clients is None:
        return TTFT_NOTE
    wave = f", and the opening wave of a run of {report.requests:,} requests" if report.requests is not None else ""
    return CLOSED_LOOP_DEFINITIONS["mean_ttft_s"] + wave


def _load(report: CheckReport) -> str:
    """The load checked: ``8 req/s``, or a closed loop's ``64 clients``."""
    return f"{report.rate_rps:g} req/s" if report.clients is None else f"{report.clients} clients"


def verdict_document(verdict: Verdict) -> dict[str, Any]:
    suffix = _SUFFIX[verdict.slo.metric.value]
    return {
        "slo": verdict.slo.text,
        "metric": verdict.slo.metric.value,
        "statistic": verdict.slo.statistic,
        "bound": "upper" if verdict.slo.upper_bound else "lower",
        f"limit{suffix}": verdict.slo.limit,
        f"predicted{suffix}": finite_or_none(verdict.predicted),
        "margin_pct": finite_or_none(verdict.margin * 100.0),
        "passed": verdict.passed,
    }


def check_other_side(report: CheckReport | None) -> str | None:
    """The check on the other side of a speed margin, in words (None: not made)."""
    if report is None:
        return None
    met = sum(v.passed for v in report.verdicts)
    text = f"{'PASS' if report.passed else 'FAIL'}, {met}/{len(report.verdicts)} SLOs met"
    failed = [f"{v.slo.text} predicted {v.slo.format_value(v.predicted)}" for v in report.verdicts if not v.passed]
    return text + (f" ({'; '.join(failed)})" if failed else "")


def _furthest(report: CheckReport) -> str:
    """Where no candidate is stable at the checked rate: which goes furthest, and how far (else nothing)."""
    most = report.most_stable
    if most is None:
        return ""
    return f"no option is stable at this rate; the most any sustains is {most[1]:.4g} req/s, with {_option(most[0])}"


def check_summary(report: CheckReport) -> str:
    """The summary printed on stderr: one paragraph, which :func:`sdplan.render.say` wraps."""
    met = sum(v.passed for v in report.verdicts)
    head = "PASS" if report.passed else "FAIL"
    where = f"at {_load(report)} with {_option(report.draft_length)}"
    line = f"sdplan check: {head}: {met}/{len(report.verdicts)} SLOs met {where}"
    if report.simulated:
        line += " (simulated)"
    if report.regime == "unstable":
        furthest = _furthest(report)
        return line + f" (unstable: the rate exceeds {report.limit}{'; ' + furthest if furthest else ''})"
    failed = [v for v in report.verdicts if not v.passed]
    if failed:
        line += ": " + "; ".join(f"{v.slo.text} predicted {v.slo.format_value(v.predicted)}" for v in failed)
    return line


def github_annotations(report: CheckReport) -> list[str]:
    """``::error`` workflow commands for failed SLOs (GitHub Actions)."""
    return [
        f"::error title=sdplan check: SLO violated::{v.slo.text} predicted {v.slo.format_value(v.predicted)} "
        f"at {_load(report)} ({_option(report.draft_length)})"
        for v in report.verdicts
        if not v.passed
    ]


def scenario_document(scenario: Scenario) -> dict[str, Any]:
    """The calibration and the workload a check or capacity answer is for, as JSON."""
    calibration, workload = scenario.calibration, scenario.workload
    provenance = calibration.provenance
    return {
        "calibration": {
            "name": calibration.name,
            "path": calibration.path,
            "method": calibration.method,
            "hardware": provenance.get("hardware"),
            "target_model": provenance.get("target_model"),
            "draft_model": provenance.get("draft_model"),
            "speculative_method": provenance_method(provenance),
        },
        "workload": {
            "file": scenario.file.path if scenario.file else None,
            "prompt_tokens": workload.prompt_tokens,
            "output_tokens": workload.output_tokens,
            "acceptance": workload.acceptance.document(),
        },
    }


def pessimistic_lines(answer: CheckAnswer) -> list[str]:
    """For standard error: each SLO's 95% interval, checked at its worse end (``--pessimistic``)."""
    if answer.pessimistic is None:
        return []
    return [f"pessimistic: {text}: 95% interval {low:.4g}-{high:.4g}; checked at the worse end"
            for text, (low, high) in answer.pessimistic.intervals.items()]


def check_document(answer: CheckAnswer) -> dict[str, Any]:
    """The answer of ``sdplan check`` as JSON."""
    report, point = answer.report, answer.report.point
    stable = report.regime != "unstable"
    context = scenario_document(answer.scenario)
    context["warnings"] = list(answer.warnings)
    pessimistic = answer.pessimistic
    if pessimistic is not None:
        context["pessimistic"] = {
            "level": pessimistic.level,
            "rule": f"each SLO checked at the pessimistic end of its 95% interval ({pessimistic.covers})",
            "server_sd_pct": pessimistic.server_sd_pct,
            "intervals": {text: [low, high if high != float("inf") else None]
                          for text, (low, high) in pessimistic.intervals.items()}}
    margin, other = answer.speed_margin, answer.other_speed
    if margin is not None:
        other_side = None if other is None else {
            "at": "calibration's speed" if margin.applied else "slower server (u)",
            "passed": other.passed,
            "verdicts": [verdict_document(v) for v in other.verdicts]}
        context["speed_margin"] = margin_document(margin, check_other_side(other), "checked") | {
            "other_side": other_side}
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "sdplan_version": __version__,
        "command": "check",
        "passed": report.passed,
        "exit_status": int(report.exit_status),
        **context,
        "request_rate_rps": report.rate_rps if report.clients is None else None,
        "closed_loop": None if report.clients is None else {
            "clients": report.clients,
            "running_requests": int(report.batch),
            "waiting_requests": report.clients - int(report.batch),
            "completed_rate_rps": report.rate_rps,
            "run_requests": report.requests,
        },
        "per_token_alpha": report.alpha,
        "evaluated_by": report.simulated or "analytic model (means)",
        "speculation": {
            "mode": report.mode,
            "enabled": report.draft_length > 0,
            "draft_length_tokens": report.draft_length or None,
            "candidates_tokens": list(report.candidates) if report.mode == "best" else None,
            # where no candidate is stable at the rate: the one that saturates last, and where
            "most_stable": None if report.most_stable is None else {
                "draft_length_tokens": report.most_stable[0] or None,
                "saturation_rate_rps": report.most_stable[1]},
        },
        "operating_point": {
            "regime": report.regime,
            "mean_e2e_latency_s": finite_or_none(point.e2e_s),
            "mean_ttft_s": point.ttft_s if stable else None,
            "mean_tpot_s": finite_or_none(point.tpot_s) if stable else None,
            "output_throughput_tok_s": point.throughput_tok_s if stable else None,
            "utilisation": point.utilisation,
            "effective_batch_size": finite_or_none(report.batch),
            **cap_fields(report.batch_cap),
        },
        "definitions": {"mean_ttft_s": _ttft_note(report), "mean_tpot_s": TPOT_NOTE,
                        "margin_pct": "headroom relative to the limit; negative when violated"},
        "verdicts": [verdict_document(v) for v in report.verdicts],
    }


def render_check(answer: CheckAnswer, fmt: OutputFormat, style: Style, terminal: bool) -> str:
    """The answer of ``sdplan check``: JSON, or the verdict in words and the verdict table."""
    if fmt is OutputFormat.JSON:
        return to_json(check_document(answer))
    report = answer.report
    calibration, acceptance = answer.scenario.calibration, answer.scenario.workload.acceptance

    def draw(console: Any) -> None:
        source = acceptance.source
        positions = given_positions(acceptance)
        failed = [f"{v.slo.text} predicted {v.slo.format_value(v.predicted)}" for v in report.verdicts if not v.passed]
        furthest = _furthest(report)
        where = f"at {_load(report)} with {_option(report.draft_length)}" + (f" ({furthest})" if furthest else "")
        speed_margin = answer.speed_margin
        speed = None if speed_margin is None else speed_caveat(speed_margin, check_other_side(answer.other_speed),
                                                               "checked")
        for line in check_answer(report.passed, sum(v.passed for v in report.verdicts), len(report.verdicts), where,
                                 report.regime, calibration.method or "", source, report.alpha, failed,
                                 report.limit, speed):
            print_paragraph(console, line)
        console.print(f"calibration {calibration.name} ({METHOD_LABELS.get(calibration.method, '')})", markup=False)
        best_of = f" (best of k={','.join(map(str, report.candidates))})" if report.mode == "best" else ""
        if report.clients is None:
            load = f"{report.rate_rps:g} req/s"
            state = f"utilisation {report.point.utilisation:.2f}, B = {report.batch:.3g} requests in flight"
        else:
            run = f" over {report.requests:,} requests" if report.requests is not None else ""
            load = f"{report.clients} clients (closed loop{run}, {report.rate_rps:.4g} req/s completed)"
            state = (f"{report.batch:.0f} running, utilisation {report.point.utilisation:.2f} of the most it "
                     "completes")
        console.print(f"operating point: {load}, {_option(report.draft_length)}{best_of}, "
                      f"{alpha_phrase(report.alpha, source, positions)}: regime {report.regime.replace('_', ' ')}, "
                      f"{state}")
        how = report.simulated or "model means"
        table = Table(box=table_box(style))
        for header in ("SLO", "predicted", "limit", "margin", "result"):
            table.add_column(header, justify="left" if header in ("SLO", "result") else "right")
        for verdict in report.verdicts:
            margin = "-" if not math.isfinite(verdict.margin) else f"{verdict.margin * 100:+.1f}%"
            table.add_row(
                verdict.slo.text,
                verdict.slo.format_value(verdict.predicted),
                verdict.slo.format_value(verdict.slo.limit),
                margin,
                Text("pass", style="green") if verdict.passed else Text("FAIL", style="bold red"),
            )
        print_table(console, table, title=f"SLO verdicts at {_load(report)}, {_option(report.draft_length)}, "
                    f"{alpha_phrase(report.alpha, source, positions)} ({how})")
        if report.simulated:
            console.print("Simulated values are means over replications of each statistic (sdplan-simulate(1)).")
        else:
            console.print(f"TTFT {_ttft_note(report)}.\nTPOT {TPOT_NOTE}.")

    return render_rich(draw, style, terminal)


# ----------------------------------------------------------------------------- capacity


def _fleet_document(fleet: Fleet | None) -> dict[str, Any] | None:
    if fleet is None:
        return None
    return {
        "option": fleet.option,
        "per_replica_rate_rps": fleet.per_replica_rate_rps,
        "replicas": fleet.replicas,
        "gpus": fleet.gpus,
        "cost_per_hour_usd": fleet.cost_per_hour_usd,
        "cost_per_million_output_tokens_usd": fleet.cost_per_million_output_tokens_usd,
    }


class SizedOptions(Protocol):
    """What both capacity answers (at a rate and in clients) hold per option: no SD first, then each k."""

    @property
    def alpha(self) -> float: ...
    @property
    def draft_lengths(self) -> list[int]: ...
    @property
    def feasible(self) -> npt.NDArray[np.bool_]: ...
    @property
    def best(self) -> int: ...
    @property
    def best_speculative(self) -> int: ...
    def label(self, index: int) -> str: ...


def option_head(cap: SizedOptions, index: int) -> dict[str, Any]:
    """The fields that name option ``index`` (0: no SD) in a capacity answer's JSON."""
    return {"option": cap.label(index), "speculation": index > 0,
            "draft_length_tokens": cap.draft_lengths[index - 1] if index else None,
            "feasible": bool(cap.feasible[index])}


def choice_document(cap: SizedOptions, slos: Sequence[SLO], options: list[dict[str, Any]]) -> dict[str, Any]:
    """A capacity answer's JSON fields for the options under the SLOs and the best of them."""
    return {
        "per_token_alpha": cap.alpha,
        "slos": [slo.text for slo in slos],
        "options": options,
        "best": cap.label(cap.best) if cap.best >= 0 else None,
        "best_speculative": cap.label(cap.best_speculative) if cap.best_speculative > 0 else None,
    }


def capacity_document(answer: CapacityAnswer) -> dict[str, Any]:
    """The answer of ``sdplan capacity`` as JSON."""
    cap, scenario = answer.capacity, answer.scenario
    c2 = cap.c2_past_knee_s
    batch_caps = scenario.limits.batch_caps(cap.draft_lengths)
    options = []
    for index in range(len(cap.c1_s)):
        options.append(option_head(cap, index) | {
            "max_rate_under_slo_rps": float(cap.max_rate_rps[index]),
            "binding_slo": cap.binding_slo[index],
            "mean_e2e_latency_at_capacity_s": finite_or_none(cap.latency_at_capacity_s[index]),
            "c1_s": float(cap.c1_s[index]),
            "c2_s": float(c2[index]),
            "saturation_rate_rps": finite_or_none(cap.saturation_rate_rps[index]),
            "saturation_limit": cap.saturation_limit[index],
            **cap_fields(batch_caps[index]),
            "break_even_rate_rps": finite_or_none(cap.break_even_rate_rps[index - 1]) if index else None,
        })
    document: dict[str, Any] = {
        "schema_version": JSON_SCHEMA_VERSION,
        "sdplan_version": __version__,
        "command": "capacity",
        **scenario_document(scenario),
        "speculative_method": scenario.method,
        "warnings": list(answer.warnings),
        "batch_cap_sequences": float(scenario.limits.batch_cap.requests),
        "evaluated_by": answer.evaluated_by,
    }
    intervals = answer.intervals
    if intervals is not None:
        bounds = intervals.bounds_rps
        document["max_rate_under_slo_ci95_rps"] = {cap.label(i): [float(bounds[0, i]), float(bounds[1, i])]
                                                   for i in range(bounds.shape[1])}
        document["server_sd_pct"] = intervals.server_sd_pct
        document["uncertainty"] = (f"95% intervals of each option's capacity ({intervals.covers}; "
                                   f"{intervals.draws} draws); size with the low end to be safe")
    margin = answer.speed_margin
    if margin is not None:
        document["speed_margin"] = margin_document(margin, capacity_other_side(answer.other_speed)) | {
            "other_side": _other_speed_document(answer.other_speed, margin.applied)}
    document |= choice_document(cap, answer.slos, options)
    fleet = answer.fleet
    if fleet is not None:
        document["fleet"] = {
            "target_rate_rps": fleet.target_rate_rps,
            "no_sd": _fleet_document(fleet.no_sd),
            "best_sd": _fleet_document(fleet.best_sd),
            "replicas_saved_by_sd": fleet.replicas_saved_by_sd,
        }
    document["num_speculative_tokens_per_batch_size"] = [list(item) for item in answer.schedule.tiers]
    return document


def margin_document(margin: SpeedMargin, other: str | None, verb: str = "sized") -> dict[str, Any]:
    """The servers' speed an answer is for (:class:`sdplan.planning.uncertainty.SpeedMargin`), as JSON."""
    return {
        "u": margin.factor,
        "sigma_pct": margin.sd_pct,
        "instances": margin.instances,
        "z": margin.z,
        "applied": margin.applied,
        "rule": "costs times u = exp(z sigma / sqrt(instances)): servers as much slower than the calibration's as "
                "its own speed error allows, one-sided 95%; u = 1 without a measured sigma",
        "caveat": speed_caveat(margin, other, verb),
    }


def _other_speed_document(other: OtherSpeed | None, applied: bool) -> dict[str, Any] | None:
    if other is None:
        return None
    fleet = other.fleet
    return {
        "at": "calibration's speed" if applied else "slower server (u)",
        "best_max_rate_under_slo_rps": other.best_rate_rps,
        "fleet": None if fleet is None else {"no_sd": _fleet_document(fleet.no_sd),
                                             "best_sd": _fleet_document(fleet.best_sd),
                                             "replicas_saved_by_sd": fleet.replicas_saved_by_sd},
    }


def capacity_interval_note(answer: CapacityAnswer) -> str | None:
    """For standard error: the best option's capacity with its 95% interval (None without intervals)."""
    cap, intervals = answer.capacity, answer.intervals
    best = cap.best
    if intervals is None or best < 0:
        return None
    low, high = (float(value) for value in intervals.bounds_rps[:, best])
    margin = answer.speed_margin
    if margin is not None and margin.applied:  # the interval is the calibration's, not shifted by the margin
        return (f"capacity of {cap.label(best)}: {float(cap.max_rate_rps[best]):.4g} req/s per replica on servers\n"
                f"  {margin.slower_pct:.2g}% slower than the calibration's; 95% interval at the calibration's\n"
                f"  speed {low:.4g}-{high:.4g} ({intervals.covers})")
    return (f"capacity of {cap.label(best)}: {float(cap.max_rate_rps[best]):.4g} req/s per replica, "
            f"95% interval {low:.4g}-{high:.4g}\n  ({intervals.covers})")


def method_phrase(method: object) -> str:
    """``EAGLE-3 head (eagle3)``: the SD method a result is for, in words and vLLM's name."""
    if not method:
        return "unknown"
    return f"{METHODS[str(method)].label} ({method})" if str(method) in METHODS else str(method)


def print_fleet(console: Any, style: Style, per_replica_header: str,
                rows: list[tuple[str, Any, str | None]], target: str, assumption: str, saved: int | None) -> None:
    """The fleet table of a capacity answer (a rate's or a closed loop's) and what SD saves.

    ``rows`` are ``(name, fleet or None, what one replica holds)``; a fleet has ``option``, ``replicas``,
    ``gpus``, ``cost_per_hour_usd`` and ``cost_per_million_output_tokens_usd``; None is an option that meets
    no SLO.
    """
    plan = Table(box=table_box(style))
    for header in ("option", per_replica_header, "replicas", "GPUs", "USD/hour", "USD per 1M output tokens"):
        plan.add_column(header, justify="left" if header == "option" else "right")
    for name, item, per_replica in rows:
        if item is None:
            plan.add_row(name, "infeasible", "-", "-", "-", "-")
            continue
        plan.add_row(item.option, per_replica, str(item.replicas), "-" if item.gpus is None else str(item.gpus),
                     "-" if item.cost_per_hour_usd is None else f"{item.cost_per_hour_usd:.2f}",
                     "-" if item.cost_per_million_output_tokens_usd is None
                     else f"{item.cost_per_million_output_tokens_usd:.3f}")
    console.print()
    print_table(console, plan, title=f"Fleet for {target}, {assumption}")
    if saved is not None:
        console.print(replicas_saved_phrase(saved, target))


def render_capacity(answer: CapacityAnswer, fmt: OutputFormat, style: Style, terminal: bool) -> str:
    """The answer of ``sdplan capacity``: JSON, or the decision in words, the capacity and fleet tables."""
    if fmt is OutputFormat.JSON:
        return to_json(capacity_document(answer))
    cap, scenario, fleet = answer.capacity, answer.scenario, answer.fleet

    def draw(console: Any) -> None:
        assumption = print_capacity_head(console, capacity_answer(answer), scenario, answer.slos, cap.alpha,
                                         f"; {answer.evaluated_by}" if answer.evaluated_by else "")
        table = Table(box=table_box(style))
        for header in ("option", "max rate under SLO (req/s)", "binding SLO", "latency at capacity (s)",
                       "saturation (req/s)", "break-even (req/s)"):
            table.add_column(header, justify="left" if header in ("option", "binding SLO") else "right")
        for index in range(len(cap.c1_s)):
            best = index == cap.best
            latency = finite_or_none(cap.latency_at_capacity_s[index])
            saturation = finite_or_none(cap.saturation_rate_rps[index])
            even = finite_or_none(cap.break_even_rate_rps[index - 1]) if index else None
            table.add_row(
                best_option_cell(cap.label(index), best),
                f"{float(cap.max_rate_rps[index]):.4g}" if cap.feasible[index] else "infeasible",
                cap.binding_slo[index] or "-",
                "-" if latency is None else f"{latency:.4g}",
                "-" if saturation is None else f"{saturation:.4g}",
                "-" if index == 0 else ("none" if even is None else f"{even:.4g}"),
            )
        print_table(console, table, title=f"Capacity per replica under the SLOs, {assumption}",
                    caption="* highest capacity. Capacity = highest request rate meeting every SLO "
                    + ("(simulated; latency column: the model's mean there)." if answer.simulated
                       else "(model means).")
                    + " break-even: rate where SD and no SD have equal mean latency (none: they never cross)."
                    + (" saturation: where the option's mean batch reaches the engine's batch cap (max_num_seqs, or "
                       "what the KV cache holds), below 1/C2." if set(cap.saturation_limit) == {"cap"} else ""))
        if fleet is not None:
            print_fleet(console, style, "per replica (req/s)",
                        [(name, item, None if item is None else f"{item.per_replica_rate_rps:.4g}")
                         for name, item in (("no SD", fleet.no_sd), ("best SD", fleet.best_sd))],
                        f"{fleet.target_rate_rps:g} req/s", assumption, fleet.replicas_saved_by_sd)
        tiers = answer.schedule.tiers
        if tiers:
            console.print(f"best k by batch size for {method_phrase(scenario.method)} "
                          "(vLLM num_speculative_tokens_per_batch_size): "
                          + ", ".join(f"{a}-{b}: {k}" for a, b, k in tiers)
                          + (f" (sizes past {answer.schedule.reachable} keep its k: with SD the KV cache holds no "
                             "more requests)" if answer.schedule.reachable < answer.schedule.max_num_seqs else ""))

    return render_rich(draw, style, terminal)


def capacity_plots(answer: CapacityAnswer, plot: bool, plot_file: str | None, width: int, color: bool) -> str:
    """Each option's capacity as bars: drawn for the terminal (returned, with ``plot``) and/or written to
    ``plot_file``; ``width`` and ``color`` are the terminal's."""
    cap, scenario = answer.capacity, answer.scenario
    labels = [cap.label(index) for index in range(len(cap.c1_s))]
    values = [float(rate) for rate in cap.max_rate_rps]
    title = (f"Highest request rate under {', '.join(slo.text for slo in answer.slos)} per replica, "
             f"{alpha_phrase(scenario.alpha, scenario.workload.acceptance.source)}")
    return option_bars(labels, values, title, ("request rate (req/s)", "max request rate under SLO (req/s)"),
                       scenario.calibration.name, cap.label(cap.best) if cap.best >= 0 else None,
                       (plot, plot_file, width, color))


def option_bars(labels: list[str], values: list[float], title: str, axes: tuple[str, str], calibration: str,
                highlight: str | None, where: tuple[bool, str | None, int, bool]) -> str:
    """A capacity per option as bars: returned for the terminal where ``where``'s plot flag is set, written to
    its plot file where one is given (``where``: plot, plot file, terminal width, colour; ``axes``: the
    terminal's axis label, the file's)."""
    plot, plot_file, width, color = where
    text = ""
    if plot:
        text = "\n" + terminal_bars(labels, values, title, axes[0], width, color)
    if plot_file is not None:
        file_bars(labels, values, title + f"\n{calibration}", axes[1], Path(plot_file), highlight=highlight)
    return text


def print_capacity_head(console: Any, lines: list[str], scenario: Scenario, slos: Sequence[SLO], alpha: float,
                        how: str) -> str:
    """A capacity answer's opening (rates or clients): the answer in words, then the scenario head with the SLOs,
    the acceptance assumed and ``how`` (appended to it). Returns the acceptance phrase, which the tables' titles
    repeat."""
    for line in lines:
        print_paragraph(console, line)
    acceptance = scenario.workload.acceptance
    assumption = alpha_phrase(alpha, acceptance.source, given_positions(acceptance))
    print_scenario_head(console, scenario, ", ".join(slo.text for slo in slos), assumption + how)
    return assumption


def best_option_cell(label: str, best: bool) -> Text:
    """An option's first cell in a capacity table: starred and green where it is the best."""
    return Text(label + ("*" if best else ""), style="bold green" if best else "")


def print_scenario_head(console: Any, scenario: Scenario, slos: str, how: str) -> None:
    """The two lines under an answer: the calibration and SD method, then the SLOs, acceptance and how."""
    calibration = scenario.calibration
    console.print(f"calibration {calibration.name} ({METHOD_LABELS.get(calibration.method, '')}); SD method "
                  f"{method_phrase(scenario.method)}", markup=False)
    console.print(f"SLOs {slos}; {how}")


def engine_config_summary(answer: EngineConfigAnswer) -> str:
    """For standard error: the k per batch-size tier and how to use the configuration, or why none is written."""
    label, schedule = METHODS[answer.method].label, answer.schedule
    if answer.config is None:
        return (f"sdplan capacity: SD off: {label} does not beat no SD at any batch size "
                f"1-{schedule.max_num_seqs} at this acceptance; serve without a speculative config (nothing written)")
    return (f"sdplan capacity: {label} ({answer.method}), k by batch size 1-{schedule.max_num_seqs}: "
            + ", ".join(f"{a}-{b}: {k}" for a, b, k in schedule.tiers) + f"\nuse: {answer.config.usage}")
