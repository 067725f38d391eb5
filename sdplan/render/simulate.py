"""Views of ``sdplan simulate``: per-rate statistics with confidence intervals, beside the model."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.table import Table

from sdplan import __version__
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
from sdplan.render.answer import alpha_phrase, caveat_lines, caveats
from sdplan.render.plots import file_cdf, terminal_cdf
from sdplan.simulate import METRICS, STATISTICS, WARMUP_FRACTION
from sdplan.units import finite_or_none

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sdplan.planning.simulate_answer import SimulateAnswer
    from sdplan.simulate import Estimate, RateSummary

LABELS = {"e2e": "E2E latency", "ttft": "TTFT", "tpot": "TPOT", "queue": "queueing delay"}


def _estimate(estimate: Estimate) -> dict[str, Any]:
    return {"value": finite_or_none(estimate.value), "ci95_half_width": finite_or_none(estimate.half_width)}


def simulate_document(answer: SimulateAnswer) -> dict[str, Any]:
    """The JSON document of ``sdplan simulate``: what was simulated, how, and per rate the statistics."""
    scenario, settings = answer.scenario, answer.query.settings
    workload, calibration = scenario.workload, scenario.calibration
    acceptance = workload.acceptance
    context = {"calibration": {"name": calibration.name, "path": calibration.path, "method": calibration.method},
               "workload": {"prompt_tokens": workload.prompt_tokens, "output_tokens": workload.output_tokens,
                            "acceptance": acceptance.describe(),
                            "lengths_file": answer.query.lengths_file,
                            "per_token_alpha": acceptance.alphas[0],
                            "position_acceptance_rates": (list(acceptance.position_rates)
                                                          if acceptance.position_rates else None),
                            "acceptance_source": acceptance.source},
               "warnings": list(answer.warnings)}
    settings_document = {"replications": settings.seeds, "requests": settings.requests, "seed": settings.seed,
                         "arrival_cv": settings.arrival_cv, "max_num_seqs": scenario.limits.max_num_seqs,
                         "max_num_batched_tokens": scenario.limits.max_num_batched_tokens,
                         "kv_cache_tokens": scenario.given_limits.kv_cache_tokens,
                         "warmup_fraction": WARMUP_FRACTION}
    rates = []
    for summary, its in zip(answer.summaries, answer.limits):
        stats = {f"{metric}_{statistic}_s": _estimate(summary.stats[(metric, statistic)])
                 for metric in METRICS for statistic in STATISTICS}
        rates.append({
            "request_rate_rps": summary.rate_rps,
            "draft_length_tokens": summary.draft_length or None,
            "speculation": "on" if summary.draft_length else "off",
            "policy": "goodput" if summary.mean_draft_length is not None else "static",
            "goodput_mean_draft_length_tokens": _estimate(summary.mean_draft_length)
            if summary.mean_draft_length is not None else None,
            "statistics": stats,
            "output_throughput_tok_s": _estimate(summary.throughput_tok_s),
            "mean_running_batch": _estimate(summary.mean_running),
            "mean_requests_in_system": _estimate(summary.mean_in_system),
            "littles_law_lambda_times_latency": _estimate(summary.little_batch),
            "steady_state": summary.steady,
            "analytic_mean_e2e_latency_s": finite_or_none(summary.analytic_e2e_s),
            "simulated_vs_analytic_pct": finite_or_none(
                (summary.stats[("e2e", "mean")].value / summary.analytic_e2e_s - 1) * 100
                if math.isfinite(summary.analytic_e2e_s) else math.inf),
            "max_num_seqs": its.max_num_seqs,
            "kv_cache_tokens": its.kv_cache_tokens,
        })
    return {"schema_version": JSON_SCHEMA_VERSION, "sdplan_version": __version__, "command": "simulate",
            **context, "settings": settings_document, "rates": rates}


def simulate_csv(summaries: Sequence[RateSummary]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["request_rate_rps", "draft_length_tokens", "metric", "statistic", "value_s", "ci95_half_width_s"])
    for summary in summaries:
        for metric in METRICS:
            for statistic in STATISTICS:
                estimate = summary.stats[(metric, statistic)]
                writer.writerow([summary.rate_rps, summary.draft_length, metric, statistic, repr(estimate.value),
                                 "" if not math.isfinite(estimate.half_width) else repr(estimate.half_width)])
    return buffer.getvalue()


def _unit(estimate: Estimate) -> tuple[float, str]:
    """Milliseconds below one second, else seconds (chosen per metric from its mean)."""
    value = estimate.value
    return (1e3, "ms") if math.isfinite(value) and abs(value) < 1 else (1.0, "s")


def _cell(estimate: Estimate, scale: float, plus_minus: str) -> str:
    value = estimate.value
    if not math.isfinite(value):
        return "-"
    if math.isfinite(estimate.half_width):
        return f"{value * scale:.4g}{plus_minus}{estimate.half_width * scale:.2g}"
    return f"{value * scale:.4g}"


def render_simulate(answer: SimulateAnswer, fmt: OutputFormat, style: Style, terminal: bool) -> str:
    """The answer as JSON, CSV, or the text tables (one per rate)."""
    if fmt is OutputFormat.CSV:
        return simulate_csv(answer.summaries)
    document = simulate_document(answer)
    if fmt is OutputFormat.JSON:
        return to_json(document)
    summaries = answer.summaries

    def draw(console: Any) -> None:
        settings = document["settings"]
        workload = document.get("workload", {})
        alpha = workload.get("per_token_alpha")
        source = str(workload.get("acceptance_source", ""))
        assumption = (alpha_phrase(alpha, source, workload.get("position_acceptance_rates"))
                      if alpha is not None else "acceptance as given")
        console.print(f"calibration {document['calibration']['name']}; {workload.get('prompt_tokens')} prompt / "
                      f"{workload.get('output_tokens')} output tokens; {assumption}", markup=False)
        # admission: max_num_seqs running requests, and as many as the KV cache holds (each option its own)
        caches = sorted({rate["kv_cache_tokens"] for rate in document["rates"]
                         if rate["kv_cache_tokens"] is not None and math.isfinite(rate["kv_cache_tokens"])})
        kv = (f"; KV cache {caches[0]:,.0f}" + (f"-{caches[-1]:,.0f}" if len(caches) > 1 else "") + " tokens"
              if caches else "")
        seqs = sorted({rate["max_num_seqs"] for rate in document["rates"]}) or [settings["max_num_seqs"]]
        console.print(f"{settings['replications']} replications x {settings['requests']} requests per rate (first "
                      f"10% discarded); arrivals CV {settings['arrival_cv']:g}; max_num_seqs "
                      f"{seqs[0]}" + (f"-{seqs[-1]}" if len(seqs) > 1 else "") + kv)
        if alpha is not None:
            for line in caveat_lines(caveats(document["calibration"].get("method", ""), source, alpha)):
                if not line.startswith("Caveat: mean latencies"):
                    print_paragraph(console, line)
        for summary, row in zip(summaries, document["rates"]):
            option = f"SD k={summary.draft_length}" if summary.draft_length else "SD off"
            if summary.mean_draft_length is not None:
                option = (f"goodput policy (k per step by E(k)/step time; "
                          f"mean k {summary.mean_draft_length.value:.2f}, "
                          f"best static k={summary.draft_length})")
            table = Table(box=table_box(style))
            table.add_column("metric")
            for statistic in STATISTICS:
                table.add_column(statistic, justify="right")
            plus_minus = "+-" if style.ascii else "\u00b1"
            for metric in METRICS:
                scale, unit = _unit(summary.stats[(metric, "mean")])
                table.add_row(f"{LABELS[metric]} ({unit})",
                              *[_cell(summary.stats[(metric, s)], scale, plus_minus) for s in STATISTICS])
            console.print()
            print_table(console, table, title=f"{summary.rate_rps:g} req/s, {option}, {assumption}: simulated "
                        f"(value{plus_minus}95% CI half-width over replications)")
            diff = row["simulated_vs_analytic_pct"]
            analytic = row["analytic_mean_e2e_latency_s"]
            console.print(
                f"  analytic mean E2E{' (best static k)' if summary.mean_draft_length is not None else ''} "
                f"{'unstable' if analytic is None else format(analytic, '.4g') + ' s'}"
                f"{'' if diff is None else f' (simulated mean {diff:+.1f}%)'}; throughput "
                f"{summary.throughput_tok_s.value:.5g} tok/s; mean running batch {summary.mean_running.value:.3g}; "
                f"requests in system {summary.mean_in_system.value:.3g} vs lambda x latency "
                f"{summary.little_batch.value:.3g} (Little's law)")
        console.print("TPOT = (E2E - TTFT)/(output - 1); queueing delay = arrival to admission into the batch.")

    return render_rich(draw, style, terminal)


def simulate_plots(answer: SimulateAnswer, plot: bool, plot_file: str | None, width: int, color: bool) -> str:
    """The E2E latency CDF per rate: drawn for the terminal (returned) and/or written to ``plot_file``."""
    acceptance = answer.scenario.workload.acceptance
    series = [(f"{s.rate_rps:g} req/s", np.sort(s.e2e_samples_s)) for s in answer.summaries]
    assumption = alpha_phrase(acceptance.alphas[0], acceptance.source, acceptance.position_rates)
    if plot_file is not None:
        file_cdf(series, f"E2E latency CDF, {answer.scenario.calibration.name}, {assumption}", Path(plot_file))
    if not plot:
        return ""
    return "\n" + terminal_cdf(series, f"E2E latency CDF (first replication), {assumption}",
                                 width, color)
