"""Views of ``sdplan check`` and ``sdplan capacity`` results."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from sdplan import __version__
from sdplan.methods import METHODS
from sdplan.render import (
    JSON_SCHEMA_VERSION,
    OutputFormat,
    Style,
    finite_or_none,
    print_paragraph,
    print_table,
    render_rich,
    table_box,
    to_json,
)
from sdplan.render.answer import alpha_phrase, capacity_answer, check_answer, document_positions
from sdplan.render.plan import METHOD_LABELS
from sdplan.render.plan_data import TPOT_NOTE, TTFT_NOTE

if TYPE_CHECKING:
    from sdplan.capacity import Capacity, Fleet
    from sdplan.check import CheckReport
    from sdplan.slo import SLO, Verdict

_SUFFIX = {"e2e": "_s", "ttft": "_s", "tpot": "_s", "throughput": "_tok_s", "utilisation": "_fraction"}


def _option(draft_length: int) -> str:
    return "SD off" if draft_length == 0 else f"SD k={draft_length}"


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


def check_summary(report: CheckReport) -> str:
    """The one-line summary printed on stderr."""
    met = sum(v.passed for v in report.verdicts)
    head = "PASS" if report.passed else "FAIL"
    where = f"at {report.rate_rps:g} req/s with {_option(report.draft_length)}"
    line = f"sdplan check: {head}: {met}/{len(report.verdicts)} SLOs met {where}"
    if report.simulated:
        line += " (simulated)"
    if report.regime == "unstable":
        return line + f" (unstable: the rate exceeds {report.limit})"
    failed = [v for v in report.verdicts if not v.passed]
    if failed:
        line += ": " + "; ".join(f"{v.slo.text} predicted {v.slo.format_value(v.predicted)}" for v in failed)
    return line


def github_annotations(report: CheckReport) -> list[str]:
    """``::error`` workflow commands for failed SLOs (GitHub Actions)."""
    return [
        f"::error title=sdplan check: SLO violated::{v.slo.text} predicted {v.slo.format_value(v.predicted)} "
        f"at {report.rate_rps:g} req/s ({_option(report.draft_length)})"
        for v in report.verdicts
        if not v.passed
    ]


def render_check(report: CheckReport, context: dict[str, Any], fmt: OutputFormat, style: Style, terminal: bool) -> str:
    if fmt is OutputFormat.JSON:
        point = report.point
        stable = report.regime != "unstable"
        return to_json({
            "schema_version": JSON_SCHEMA_VERSION,
            "sdplan_version": __version__,
            "command": "check",
            "passed": report.passed,
            "exit_status": int(report.exit_status),
            **context,
            "request_rate_rps": report.rate_rps,
            "per_token_alpha": report.alpha,
            "evaluated_by": report.simulated or "analytic model (means)",
            "speculation": {
                "mode": report.mode,
                "enabled": report.draft_length > 0,
                "draft_length_tokens": report.draft_length or None,
                "candidates_tokens": list(report.candidates) if report.mode == "best" else None,
            },
            "operating_point": {
                "regime": report.regime,
                "mean_e2e_latency_s": finite_or_none(point.e2e_s),
                "mean_ttft_s": point.ttft_s if stable else None,
                "mean_tpot_s": finite_or_none(point.tpot_s) if stable else None,
                "output_throughput_tok_s": point.throughput_tok_s if stable else None,
                "utilisation": point.utilisation,
                "effective_batch_size": finite_or_none(report.batch),
            },
            "definitions": {"mean_ttft_s": TTFT_NOTE, "mean_tpot_s": TPOT_NOTE,
                            "margin_pct": "headroom relative to the limit; negative when violated"},
            "verdicts": [verdict_document(v) for v in report.verdicts],
        })

    def draw(console: Any) -> None:
        calibration = context["calibration"]
        acceptance = context.get("workload", {}).get("acceptance", {})
        source = str(acceptance.get("source", ""))
        positions = document_positions(acceptance)
        failed = [f"{v.slo.text} predicted {v.slo.format_value(v.predicted)}" for v in report.verdicts if not v.passed]
        where = f"at {report.rate_rps:g} req/s with {_option(report.draft_length)}"
        for line in check_answer(report.passed, sum(v.passed for v in report.verdicts), len(report.verdicts), where,
                                 report.regime, calibration.get("method", ""), source, report.alpha, failed,
                                 report.limit):
            print_paragraph(console, line)
        console.print(f"calibration {calibration['name']} ({METHOD_LABELS.get(calibration['method'], '')})")
        best_of = f" (best of k={','.join(map(str, report.candidates))})" if report.mode == "best" else ""
        console.print(f"operating point: {report.rate_rps:g} req/s, {_option(report.draft_length)}{best_of}, "
                      f"{alpha_phrase(report.alpha, source, positions)}: regime {report.regime.replace('_', ' ')}, "
                      f"utilisation {report.point.utilisation:.2f}, B = {report.batch:.3g} requests in flight")
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
        print_table(console, table, title=f"SLO verdicts at {report.rate_rps:g} req/s, {_option(report.draft_length)}, "
                    f"{alpha_phrase(report.alpha, source, positions)} ({how})")
        if report.simulated:
            console.print("Simulated values are means over replications of each statistic (sdplan-simulate(1)).")
        else:
            console.print(f"TTFT {TTFT_NOTE}.\nTPOT {TPOT_NOTE}.")

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


def capacity_document(cap: Capacity, slos: list[SLO], context: dict[str, Any], target_rate: float | None,
                      fleets: tuple[Fleet | None, Fleet | None] | None,
                      schedule: list[tuple[int, int, int]] | None) -> dict[str, Any]:
    options = []
    for index in range(len(cap.c1_s)):
        options.append({
            "option": cap.label(index),
            "speculation": index > 0,
            "draft_length_tokens": cap.draft_lengths[index - 1] if index else None,
            "feasible": bool(cap.feasible[index]),
            "max_rate_under_slo_rps": float(cap.max_rate_rps[index]),
            "binding_slo": cap.binding_slo[index],
            "mean_e2e_latency_at_capacity_s": finite_or_none(cap.latency_at_capacity_s[index]),
            "c1_s": float(cap.c1_s[index]),
            # the demand that sets the saturation: past the target's compute-bound knee where it has one
            "c2_s": float(cap.c2_s[index] if cap.knee is None else cap.knee.c2_above_s[index]),
            "saturation_rate_rps": finite_or_none(cap.saturation_rate_rps[index]),
            "break_even_rate_rps": finite_or_none(cap.break_even_rate_rps[index - 1]) if index else None,
        })
    document: dict[str, Any] = {
        "schema_version": JSON_SCHEMA_VERSION,
        "sdplan_version": __version__,
        "command": "capacity",
        **context,
        "per_token_alpha": cap.alpha,
        "slos": [slo.text for slo in slos],
        "evaluated_by": context.get("evaluated_by"),
        "options": options,
        "best": cap.label(cap.best) if cap.best >= 0 else None,
        "best_speculative": cap.label(cap.best_speculative) if cap.best_speculative > 0 else None,
    }
    if target_rate is not None and fleets is not None:
        no_sd, with_sd = fleets
        saving = (no_sd.replicas - with_sd.replicas) if no_sd is not None and with_sd is not None else None
        document["fleet"] = {
            "target_rate_rps": target_rate,
            "no_sd": _fleet_document(no_sd),
            "best_sd": _fleet_document(with_sd),
            "replicas_saved_by_sd": saving,
        }
    if schedule is not None:
        document["num_speculative_tokens_per_batch_size"] = [list(item) for item in schedule]
    return document


def method_phrase(method: object) -> str:
    """``EAGLE-3 head (eagle3)``: the SD method a result is for, in words and vLLM's name."""
    if not method:
        return "unknown"
    return f"{METHODS[str(method)].label} ({method})" if str(method) in METHODS else str(method)


def render_capacity(document: dict[str, Any], fmt: OutputFormat, style: Style, terminal: bool) -> str:
    if fmt is OutputFormat.JSON:
        return to_json(document)

    def draw(console: Any) -> None:
        for line in capacity_answer(document):
            print_paragraph(console, line)
        acceptance = document.get("workload", {}).get("acceptance", {})
        source = str(acceptance.get("source", ""))
        assumption = alpha_phrase(document["per_token_alpha"], source, document_positions(acceptance))
        console.print(f"calibration {document['calibration']['name']} "
                      f"({METHOD_LABELS.get(document['calibration']['method'], '')}); SD method "
                      f"{method_phrase(document.get('speculative_method'))}")
        console.print(f"SLOs {', '.join(document['slos'])}; {assumption}"
                      + (f"; {document['evaluated_by']}" if document.get("evaluated_by") else ""))
        table = Table(box=table_box(style))
        for header in ("option", "max rate under SLO (req/s)", "binding SLO", "latency at capacity (s)",
                       "saturation (req/s)", "break-even (req/s)"):
            table.add_column(header, justify="left" if header in ("option", "binding SLO") else "right")
        for option in document["options"]:
            best = option["option"] == document["best"]
            rate = f"{option['max_rate_under_slo_rps']:.4g}" if option["feasible"] else "infeasible"
            even = option["break_even_rate_rps"]
            table.add_row(
                Text(option["option"] + ("*" if best else ""), style="bold green" if best else ""),
                rate,
                option["binding_slo"] or "-",
                "-" if option["mean_e2e_latency_at_capacity_s"] is None
                else f"{option['mean_e2e_latency_at_capacity_s']:.4g}",
                "-" if option["saturation_rate_rps"] is None else f"{option['saturation_rate_rps']:.4g}",
                "-" if option["option"] == "off" else ("none" if even is None else f"{even:.4g}"),
            )
        simulated = str(document.get("evaluated_by", "")).startswith("simulated")
        print_table(console, table, title=f"Capacity per replica under the SLOs, {assumption}",
                    caption="* highest capacity. Capacity = highest request rate meeting every SLO "
                    + ("(simulated; latency column: the model's mean there)." if simulated else "(model means).")
                    + " break-even: rate where SD and no SD have equal mean latency (none: they never cross).")
        fleet = document.get("fleet")
        if fleet:
            plan = Table(box=table_box(style))
            for header in ("option", "per replica (req/s)", "replicas", "GPUs", "USD/hour", "USD per 1M output tokens"):
                plan.add_column(header, justify="left" if header == "option" else "right")
            for key in ("no_sd", "best_sd"):
                item = fleet[key]
                if item is None:
                    plan.add_row("no SD" if key == "no_sd" else "best SD", "infeasible", "-", "-", "-", "-")
                    continue
                plan.add_row(
                    item["option"], f"{item['per_replica_rate_rps']:.4g}", str(item["replicas"]),
                    "-" if item["gpus"] is None else str(item["gpus"]),
                    "-" if item["cost_per_hour_usd"] is None else f"{item['cost_per_hour_usd']:.2f}",
                    "-" if item["cost_per_million_output_tokens_usd"] is None
                    else f"{item['cost_per_million_output_tokens_usd']:.3f}",
                )
            console.print()
            print_table(console, plan, title=f"Fleet for {fleet['target_rate_rps']:g} req/s, {assumption}")
            if fleet["replicas_saved_by_sd"] is not None:
                console.print(f"SD saves {fleet['replicas_saved_by_sd']} replica(s) "
                              f"at {fleet['target_rate_rps']:g} req/s")
        schedule = document.get("num_speculative_tokens_per_batch_size")
        if schedule:
            console.print(f"best k by batch size for {method_phrase(document.get('speculative_method'))} "
                          "(vLLM num_speculative_tokens_per_batch_size): "
                          + ", ".join(f"{a}-{b}: {k}" for a, b, k in schedule))

    return render_rich(draw, style, terminal)
