"""Views of ``sdplan fit`` and ``sdplan validate`` reports."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from sdplan import __version__
from sdplan.measure.fit_runs import Scaled
from sdplan.planning.planner import option_label
from sdplan.render import (
    JSON_SCHEMA_VERSION,
    OutputFormat,
    Style,
    output_width,
    paragraph_text,
    print_table,
    render_rich,
    table_box,
    to_json,
)
from sdplan.units import finite_or_none

if TYPE_CHECKING:
    from rich.console import JustifyMethod

    from sdplan.fitting.fit import ConfigurationFit
    from sdplan.fitting.fit_result import PooledFit
    from sdplan.fitting.validation import Validation
    from sdplan.measure.fit_runs import Fitted
    from sdplan.measure.validate_runs import Validated
    from sdplan.metrics.prior import PriorScaling
    from sdplan.runs import BenchmarkRun


def _run(run: BenchmarkRun) -> dict[str, Any]:
    return {
        "source": run.source,
        "request_rate_rps": run.requested_rate_rps,
        "achieved_rate_rps": run.achieved_rate_rps,
        "scheduled_rate_rps": run.scheduled_rate_rps,
        "draft_length_tokens": run.draft_length,
        "per_token_alpha": run.alpha,
        "prompt_tokens": run.prompt_tokens,
        "output_tokens": run.output_tokens,
        "mean_e2e_latency_s": run.mean_e2e_latency_s,
        "mean_ttft_s": run.mean_ttft_s,
        "mean_tpot_s": run.mean_tpot_s,
        "closed_loop_clients": run.concurrency,
        "mean_others_in_flight": run.mean_others,
        "load_level": run.load_level,
        "percentiles_s": dict(run.percentiles_s),
        "stalled_stream_share": run.stalled_streams,
        "notes": list(run.notes),
    }


def _option(run: BenchmarkRun) -> str:
    label = option_label(run.draft_length)
    return f"{label} a={run.alpha:.3f}" if run.draft_length and run.alpha is not None else label


def fit_document(pooled: PooledFit, configurations: list[ConfigurationFit], kept: list[BenchmarkRun],
                 dropped: list[tuple[BenchmarkRun, str]], holdout: Validation | None, output: str,
                 warnings: list[str]) -> dict[str, Any]:
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "sdplan_version": __version__,
        "command": "fit",
        "calibration_written": output,
        "pooled": {
            "coefficients_s": pooled.values,
            "stderr_s": {name: finite_or_none(value) for name, value in pooled.stderr.items()},
            "not_identified": pooled.not_identified,
            "stderr_above_value": pooled.stderr_above_value,
            "c2_step_fixed_share": pooled.fixed_step_share,
            "c2_step_fixed_share_sd_pct": pooled.step_share_sd_pct,
            "ttft": {"wait_steps": pooled.ttft_wait_steps, "load_steps": pooled.ttft_load_steps,
                     "offset_s": pooled.ttft_offset_s, "closed_loop_load_steps": pooled.ttft_closed_load_steps,
                     "prefill_per_prompt_token_s": pooled.ttft_prefill_per_token_s,
                     "fitted": pooled.ttft_fitted, "mape_pct": pooled.ttft_mape_pct},
            "notes": list(pooled.notes),
            "residuals": [{"source": r.source, "load_level": r.load_level, "draft_length_tokens": r.draft_length,
                           "measured_s": r.measured_s, "predicted_s": r.predicted_s, "error_pct": r.error_pct,
                           "ttft_error_pct": r.ttft_error_pct, "robust_weight": r.weight}
                          for r in pooled.residuals],
            "reference_workload": {"prompt_tokens": pooled.reference_prompt_tokens,
                                   "output_tokens": pooled.reference_output_tokens},
            "r2": pooled.r2, "rmse_s": pooled.rmse_s, "mape_pct": pooled.mape_pct, "points": pooled.points,
        },
        "configurations": [
            {"draft_length_tokens": c.draft_length, "per_token_alpha": c.alpha, "prompt_tokens": c.prompt_tokens,
             "output_tokens": c.output_tokens, "c1_s": c.c1_s, "c2_s": c.c2_s,
             "c1_stderr_s": finite_or_none(c.c1_stderr_s),
             "c2_stderr_s": finite_or_none(c.c2_stderr_s), "r2": c.r2, "points": c.points}
            for c in configurations
        ],
        "runs_used": [_run(run) for run in kept],
        "runs_dropped": [{**_run(run), "reason": reason} for run, reason in dropped],
        "holdout": validation_summary(holdout) if holdout else None,
        "warnings": warnings,
    }


def validation_summary(result: Validation) -> dict[str, Any]:
    worst = result.worst
    agree, total = result.best_k_agreement
    return {
        "runs": len(result.errors),
        "mape_pct": finite_or_none(result.mape_pct),
        "bias_pct": finite_or_none(result.bias_pct),
        "bias_direction": "neutral" if not math.isfinite(result.bias_pct) or abs(result.bias_pct) < 1
        else ("over-predict" if result.bias_pct > 0 else "under-predict"),
        "r2": result.r2,
        "quality": result.quality,
        "worst": {"source": worst.run.source,
                  "error_pct": finite_or_none(worst.error_pct) if worst.error_pct is not None else None}
        if worst else None,
        "best_k_agreement": {"agree": agree, "compared": total},
        "best_k": [{"load_level": c.load_level, "prompt_tokens": c.prompt_tokens, "output_tokens": c.output_tokens,
                    "measured_best_k": c.measured_best, "predicted_best_k": c.predicted_best,
                    "draft_lengths_compared": list(c.options), "agrees": c.agrees} for c in result.best_k],
        "ttft_mape_pct": finite_or_none(result.ttft_mape_pct) if result.ttft_mape_pct is not None else None,
        "repeat_spread": None if result.repeat_spread is None else {
            "exact_model_mape_pct": round(result.repeat_spread.exact_model_mape_pct, 3),
            "repeated_levels": result.repeat_spread.repeated_levels, "runs": result.repeat_spread.runs},
    }


def _pm(value: float | None, error: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    if error is None or not math.isfinite(error):
        return f"{value:.{digits}g}"
    return f"{value:.{digits}g}+-{error:.2g}"


def _r2(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


#: Columns of the per-configuration table: header, and the cell from a configuration of the JSON document.
#: Data-driven so that new fields of ``fit`` documents need one line here.
CONFIGURATION_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("k", lambda c: "off" if c["draft_length_tokens"] == 0 else str(c["draft_length_tokens"])),
    ("alpha", lambda c: "-" if c.get("per_token_alpha") is None else f"{c['per_token_alpha']:.3f}"),
    ("tokens in/out", lambda c: f"{c['prompt_tokens']:g}/{c['output_tokens']:g}"),
    ("C1+-std. error (s)", lambda c: _pm(c["c1_s"], c.get("c1_stderr_s"))),
    ("C2+-std. error (s/req)", lambda c: _pm(c["c2_s"], c.get("c2_stderr_s"))),
    ("R2", lambda c: _r2(c.get("r2"))),
    ("runs", lambda c: str(c["points"])),
)


def render_fit(document: dict[str, Any], fmt: OutputFormat, style: Style, terminal: bool) -> str:
    if fmt is OutputFormat.JSON:
        return to_json(document)

    def draw(console: Any) -> None:
        pooled = document["pooled"]
        ref = pooled["reference_workload"]
        holdout = document.get("holdout")
        head = (f"Fit: R2 {pooled['r2']:.4f}, MAPE {pooled['mape_pct']:.2f}% over {pooled['points']} runs"
                + (f"; held-out {holdout['runs']} runs: MAPE {holdout['mape_pct']:.2f}%, R2 {holdout['r2']:.4f} "
                   f"({holdout['quality']})" if holdout and holdout.get("mape_pct") is not None else "")
                + f"; wrote {document['calibration_written']}.")
        console.print(head, markup=False)
        table = Table(box=table_box(style))
        for header in ("coefficient", "value (s)", "std. error (s)"):
            table.add_column(header, justify="left" if header == "coefficient" else "right")
        for name, value in pooled["coefficients_s"].items():
            error = pooled["stderr_s"].get(name)
            weak = name in pooled.get("stderr_above_value", ())
            table.add_row(name, f"{value:.6g}", "not identified" if name in pooled.get("not_identified", ())
                          and not weak else "-" if error is None
                          else f"{error:.3g}" + (" > value: not identified" if weak else ""))
        ttft = pooled.get("ttft") or {}
        closed = ttft.get("closed_loop_load_steps")
        offset = ttft.get("offset_s") or 0.0
        prefill = ttft.get("prefill_per_prompt_token_s")
        ttft_line = (f"TTFT = c1p {'-' if offset < 0 else '+'} {abs(offset):.3g} s"
                     + (f" + {prefill * 1e6:.3g} us x prompt tokens" if prefill is not None else "")
                     + f" + {ttft['wait_steps']:.3g} x step"
                     f" + B x {ttft['load_steps']:.3g} x step per request"
                     + (f" (open loop; closed loops {closed:.3g})" if closed is not None else "")
                     + (f" (fitted; TTFT MAPE {ttft['mape_pct']:.1f}%)" if ttft.get("fitted")
                                  and ttft.get("mape_pct") is not None else " (default weights: TTFT not measured)"))
        console.print()
        print_table(console, table, caption=ttft_line,
                    title=f"Pooled fit at {ref['prompt_tokens']} prompt / {ref['output_tokens']} "
                    f"output tokens (R2 {pooled['r2']:.4f}, MAPE {pooled['mape_pct']:.2f}%, {pooled['points']} runs)")
        per = Table(box=table_box(style))
        for header, _ in CONFIGURATION_COLUMNS:
            per.add_column(header, justify="right")
        for c in document["configurations"]:
            per.add_row(*[cell(c) for _, cell in CONFIGURATION_COLUMNS])
        console.print()
        print_table(console, per, title="Per configuration: L = C1 + B C2 (B: other requests in flight)")
        for note in pooled.get("notes", ()):
            console.print(f"note: {note}", markup=False)
        if document["runs_dropped"]:
            dropped = Table(box=table_box(style))
            dropped.add_column("run")
            dropped.add_column("reason")
            folder = _shared_folder([run["source"] for run in document["runs_dropped"]])
            for run in document["runs_dropped"]:
                dropped.add_row(_run_cell(run["source"], folder), run["reason"])
            console.print()
            print_table(console, dropped, title="Runs left out, and why" + (f" (runs in {folder})" if folder else ""))
        if holdout:
            console.print(f"held-out runs: {holdout['runs']}, MAPE {holdout['mape_pct']:.2f}%, R2 {holdout['r2']:.4f} "
                          f"({holdout['quality']})")
        for warning in document["warnings"]:
            console.print(f"warning: {warning}", markup=False)
        console.print(f"wrote {document['calibration_written']}", markup=False)

    return render_rich(draw, style, terminal)


def validate_document(result: Validation, context: dict[str, Any], max_error_pct: float | None,
                      passed: bool) -> dict[str, Any]:
    """The report of ``sdplan validate`` as data; ``passed`` is the gate's verdict
    (:func:`sdplan.measure.validate_runs.passes`)."""
    summary = validation_summary(result)
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "sdplan_version": __version__,
        "command": "validate",
        **context,
        "summary": summary,
        "max_error_pct": max_error_pct,
        "passed": passed,
        "runs": [{**_run(e.run), "predicted_e2e_latency_s": finite_or_none(e.predicted_s),
                  "error_pct": e.error_pct, "predicted_ttft_s": e.predicted_ttft_s,
                  "ttft_error_pct": e.ttft_error_pct} for e in result.errors],
        "runs_skipped": [{**_run(run), "reason": reason} for run, reason in result.skipped],
    }


def _option_text(run: dict[str, Any]) -> str:
    k = run["draft_length_tokens"]
    if k == 0:
        return "off"
    alpha = run.get("per_token_alpha")
    return f"k={k} a={alpha:.3f}" if alpha is not None else f"k={k}"


def _error_cell(run: dict[str, Any]) -> Any:
    error = run["error_pct"]
    if error is None:
        return Text("unstable", style="red")
    return Text(f"{error:+.1f}%", style="red" if abs(error) > 10 else "")


#: Columns of the validation table: header, justification and the cell from a run of the JSON document.
VALIDATE_COLUMNS: tuple[tuple[str, JustifyMethod, Any], ...] = (
    ("run: option at load", "left",
     lambda r: f"{r['source']}\n  {_option_text(r)} at {r['load_level']}"),
    ("tokens in/out", "right", lambda r: f"{r['prompt_tokens']:.4g}/{r['output_tokens']:.4g}"),
    ("measured (s)", "right", lambda r: f"{r['mean_e2e_latency_s']:.4g}"),
    ("predicted (s)", "right", lambda r: "unstable" if r["predicted_e2e_latency_s"] is None
     else f"{r['predicted_e2e_latency_s']:.4g}"),
    ("error", "right", _error_cell),
)


def _shared_folder(sources: list[str]) -> str:
    """The folder prefix (ending in ``/``) that every source shares, or ``""``."""
    folders = {source.rpartition("/")[0] for source in sources}
    return f"{folders.pop()}/" if len(folders) == 1 and "" not in folders else ""


def _run_cell(source: str, folder: str) -> str:
    """A run's name in a table: without the folder every run shares (it goes in the title), and with a
    space before a position in its file (``report.json #benchmarks[2]``), where the cell may wrap: a
    name does not wrap anywhere else."""
    return source[len(folder):].replace("#", " #", 1)


def render_validate(document: dict[str, Any], fmt: OutputFormat, style: Style, terminal: bool) -> str:
    if fmt is OutputFormat.JSON:
        return to_json(document)

    def draw(console: Any) -> None:
        s = document["summary"]
        agree = s["best_k_agreement"]
        worst = s["worst"]
        summary = (
            f"MAPE {s['mape_pct']:.2f}% ({s['quality']}), bias {s['bias_pct']:+.2f}% ({s['bias_direction']}), "
            f"R2 {s['r2']:.4f}, worst {worst['source']} "
            f"{'unstable' if worst['error_pct'] is None else format(worst['error_pct'], '+.1f') + '%'}; "
            f"best k agrees at {agree['agree']} of {agree['compared']} load levels"
            + (f"; TTFT MAPE {s['ttft_mape_pct']:.1f}%" if s.get("ttft_mape_pct") is not None else "")
            if s["mape_pct"] is not None else "MAPE: infinite (some measured runs are predicted unstable)")
        spread = s.get("repeat_spread")
        if spread is not None:
            summary += (f"; an exact model would score about {spread['exact_model_mape_pct']:.1f}% "
                        f"(the spread of {spread['runs']} runs repeating {spread['repeated_levels']} load levels)")
        verdict = ""
        if document["max_error_pct"] is not None:
            verdict = ("PASS" if document["passed"] else "FAIL") + f" (MAPE limit {document['max_error_pct']:g}%): "
        console.print(f"Answer: {verdict}{summary}.", markup=False)
        table = Table(box=table_box(style))
        for header, justify, _ in VALIDATE_COLUMNS:
            table.add_column(header, justify=justify)
        # a folder shared by every run goes in the title once: a path does not wrap, and the cells stay narrow
        folder = _shared_folder([run["source"] for run in document["runs"]])
        for run in document["runs"]:
            table.add_row(*[cell({**run, "source": _run_cell(run["source"], folder)}) for *_, cell in VALIDATE_COLUMNS])
        console.print()
        print_table(console, table,
                    title=f"Measured vs predicted mean E2E latency ({document['calibration']['name']})"
                          + (f", runs in {folder}" if folder else ""),
                    caption="alpha (a) as each run recorded it, or as given on the command line.")
        for run in document["runs_skipped"]:
            console.print(f"skipped {run['source']}: {run['reason']}", markup=False)
        console.print(summary, markup=False)
        if document["max_error_pct"] is not None:
            console.print(("PASS" if document["passed"] else "FAIL") + f": MAPE limit {document['max_error_pct']:g}%")

    return render_rich(draw, style, terminal)


def render_fit_outcome(outcome: Fitted | Scaled, fmt: OutputFormat, style: Style, terminal: bool) -> str:
    """``sdplan fit``'s report of its result: the fit (:func:`render_fit`) or the scaling (:func:`render_scaling`)."""
    if isinstance(outcome, Scaled):
        return render_scaling(outcome.scaling, outcome.written, outcome.dropped, outcome.warnings, fmt.value,
                              style.width or output_width(terminal))
    return render_fit(fit_document(outcome.pooled, outcome.configurations, outcome.kept, outcome.dropped,
                                   outcome.holdout, outcome.written, outcome.warnings), fmt, style, terminal)


def render_validated(outcome: Validated, fmt: OutputFormat, style: Style, terminal: bool) -> str:
    """``sdplan validate``'s report of its result (:func:`render_validate`)."""
    calibration = outcome.calibration
    context = {"calibration": {"name": calibration.name, "path": calibration.path, "method": calibration.method}}
    return render_validate(validate_document(outcome.validation, context, outcome.max_error_pct, outcome.passed),
                           fmt, style, terminal)


def scaling_document(scaled: PriorScaling, written: str, dropped: list[tuple[BenchmarkRun, str]],
                     warnings: list[str]) -> dict[str, Any]:
    """The report of ``sdplan fit --prior`` as data (``--format json``)."""
    def gap(g: Any) -> dict[str, float]:
        return {"mape_pct": round(g.mape_pct, 3), "bias_pct": round(g.bias_pct, 3), "worst_pct": round(g.worst_pct, 3),
                "r2": round(g.r2, 4)}

    return {"command": "fit --prior", "calibration_written": written, "prior": scaled.prior_name,
            "c1_scale": scaled.c1_scale, "c2_scale": scaled.c2_scale, "one_factor": scaled.one_factor,
            "runs": scaled.runs, "measured_options": list(scaled.measured_options),
            "anchored": "every other option: scaled with the measured one, not measured",
            "gap_before": gap(scaled.before), "gap_after": gap(scaled.after),
            "runs_dropped": [{"source": run.source, "reason": why} for run, why in dropped], "warnings": warnings}


def render_scaling(scaled: PriorScaling, written: str, dropped: list[tuple[BenchmarkRun, str]], warnings: list[str],
                   fmt: str, width: int) -> str:
    """The report of ``sdplan fit --prior``: the factors, the gap before and after, and what is anchored rather
    than measured; text wrapped to ``width`` columns."""

    document = scaling_document(scaled, written, dropped, warnings)
    if fmt == "json":
        return json.dumps(document, indent=1, allow_nan=False) + "\n"
    measured = ", ".join("no SD" if k == 0 else f"k={k}" for k in scaled.measured_options)
    before, after = scaled.before, scaled.after
    sides = (f"one factor x{scaled.c1_scale:.4g} on both C1 and C2 (the runs' loads could not tell them apart)"
             if scaled.one_factor else f"C1 side x{scaled.c1_scale:.4g}, C2 side x{scaled.c2_scale:.4g}")
    lines = [
        f"Answer: {scaled.prior_name} scaled to {scaled.runs} runs of {measured}: {sides}; wrote {written}.",
        f"Gap (mean E2E, {scaled.runs} runs): {before.mape_pct:.1f}% before (bias {before.bias_pct:+.1f}%, worst "
        f"{before.worst_pct:.1f}%), {after.mape_pct:.1f}% after (bias {after.bias_pct:+.1f}%, worst "
        f"{after.worst_pct:.1f}%).",
        f"Caveat: only {measured} was measured; every other option is anchored, not measured: its steps keep "
        f"{scaled.prior_name}'s ratios to the measured option's, scaled with it.",
    ]
    lines += [f"left out {run.source}: {why}" for run, why in dropped]
    lines += [f"warning: {text}" for text in warnings]
    return paragraph_text("\n".join(lines), width) + "\n"
