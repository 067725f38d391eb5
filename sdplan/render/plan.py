"""Views of a :class:`~sdplan.planner.Plan`: rich tables, JSON document, CSV rows."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from sdplan import __version__
from sdplan.methods import METHODS, provenance_method
from sdplan.render import JSON_SCHEMA_VERSION, OutputFormat, Style, finite_or_none, render_rich, table_box, to_json

if TYPE_CHECKING:
    from sdplan.planner import Plan, PlanInputs

METHOD_LABELS = {
    "measured": "measured with sdplan calibrate",
    "fit": "fitted from benchmark results",
    "roofline": "derived from datasheets, NOT measured",
    "derived": "priced by AIConfigurator's silicon op database",
}
TTFT_NOTE = ("c1p + w_wait x step + B x w_load x per-request step cost: the own prefill, the wait for the running "
             "step and the mixed step with B others (weights fitted where TTFT was measured); queueing beyond the "
             "batch cap is not modelled")
TPOT_NOTE = "approximation: (L - TTFT)/(g - 1), vLLM's definition (first token excluded)"


def render_plan(plan: Plan, inputs: PlanInputs, fmt: OutputFormat, style: Style, terminal: bool,
                wide: bool = False, batch_cap: float | None = None) -> str:
    """Text of ``plan`` in the requested format (``wide``: a latency column per k in the table)."""
    if fmt is OutputFormat.JSON:
        return to_json(plan_document(plan, inputs))
    if fmt is OutputFormat.CSV:
        return plan_csv(plan)
    return render_rich(lambda console: draw_plan(console, plan, inputs, style, wide, batch_cap), style, terminal)


# ----------------------------------------------------------------------------- JSON


def _sd_faster(rate: float, faster_below: bool) -> str:
    if rate == rate:  # finite break-even
        return "below_break_even" if faster_below else "above_break_even"
    return "at_every_rate" if faster_below else "never"


def _interval_line(plan: Plan, intervals: Any, ia: int) -> str:
    """One line of 95% intervals: the best option's latency at the most loaded stable rate, and its break-even."""
    import numpy as np

    from sdplan.planner import NONE_STABLE, SD_OFF

    stable = [ir for ir in range(len(plan.rates_rps)) if int(plan.best_k[ia, ir]) != NONE_STABLE]
    if not stable:
        return "95% intervals (fit uncertainty): nothing stable on this grid."
    ir = stable[-1]
    best = int(plan.best_k[ia, ir])
    if best == SD_OFF:
        low, high = intervals.baseline_latency_s[:, ir]
        name = "no SD"
    else:
        ik = list(plan.draft_lengths).index(best)
        low, high = intervals.latency_s[:, ia, ir, ik]
        name = f"k={best}"
    text = (f"95% intervals (fit uncertainty, {intervals.draws} draws of the covariance): {name} at "
            f"{_num(float(plan.rates_rps[ir]))} req/s {_num(float(low))}-"
            f"{'unstable' if not np.isfinite(high) else _num(float(high))} s")
    k0 = int(np.argmin(plan.c1_s[ia]))
    even = intervals.break_even_rate_rps[:, ia, k0]
    if np.all(np.isfinite(even)):
        text += f"; break-even of k={int(plan.draft_lengths[k0])} {_num(float(even[0]))}-{_num(float(even[1]))} req/s"
    return text + "."


def _pair(values: Any) -> list[float | None] | None:
    """A 95% interval as [low, high] (None for an unstable or absent bound), or None when there is none."""
    low, high = (float(v) for v in values)
    if low != low and high != high:
        return None
    return [finite_or_none(low), finite_or_none(high)]


def _point(latency: float, batch: float, rho: float, tpot: float, ttft: float, rate: float, g: float) -> dict[str, Any]:
    stable = latency != float("inf")
    return {
        "mean_e2e_latency_s": finite_or_none(latency),
        "effective_batch_size": finite_or_none(batch),
        "utilisation": float(rho),
        "mean_ttft_s": ttft if stable else None,
        "mean_tpot_s": finite_or_none(tpot),
        "output_throughput_tok_s": rate * g if stable else None,
        "regime": _regime(rho),
    }


def _regime(rho: float) -> str:
    from sdplan.model import NEAR_SATURATION_UTILISATION

    if rho >= 1.0:
        return "unstable"
    return "near_saturation" if rho > NEAR_SATURATION_UTILISATION else "stable"


def plan_document(plan: Plan, inputs: PlanInputs) -> dict[str, Any]:
    """The JSON document of a plan (``schema_version`` 1; units in every key)."""
    from dataclasses import asdict

    from sdplan.planner import NONE_STABLE, SD_OFF

    acceptance = inputs.acceptance
    g = plan.coefficients.output_tokens
    results = []
    for ia, alpha in enumerate(plan.alphas):
        per_k = []
        for ik, k in enumerate(plan.draft_lengths):
            c1, c2 = float(plan.c1_s[ia, ik]), float(plan.c2_s[ia, ik])
            per_k.append(
                {
                    "draft_length_tokens": int(k),
                    "tokens_per_cycle": float(plan.tokens_per_cycle[ia, ik]),
                    "c1_s": c1,
                    "c2_s": c2,
                    "zero_load_latency_s": c1,
                    "zero_load_speedup": plan.baseline_c1_s / c1,
                    "saturation_rate_rps": finite_or_none(plan.saturation_rate_rps[ia, ik]),
                    "max_output_throughput_tok_s": finite_or_none(g * plan.saturation_rate_rps[ia, ik]),
                    "break_even_rate_rps": finite_or_none(plan.break_even_rate_rps[ia, ik]),
                    "sd_faster": _sd_faster(
                        float(plan.break_even_rate_rps[ia, ik]), bool(plan.sd_faster_below_break_even[ia, ik])
                    ),
                }
            )
            intervals = inputs.intervals
            if intervals is not None:
                per_k[-1]["break_even_rate_ci95_rps"] = _pair(intervals.break_even_rate_rps[:, ia, ik])  # type: ignore[attr-defined]
            if plan.moe_break_even_rates_rps is not None:  # MoE: the speedup can cross 1 several times
                per_k[-1]["break_even_rates_rps"] = [float(x) for x in plan.moe_break_even_rates_rps[ia, ik] if x == x]
        rows = []
        for ir, rate in enumerate(plan.rates_rps):
            lam = float(rate)
            baseline = _point(
                plan.baseline_latency_s[ir], plan.baseline_batch[ir], plan.baseline_utilisation[ir],
                plan.baseline_tpot_s[ir], plan.baseline_ttft_load_s[ir], lam, g,
            )
            if inputs.intervals is not None:
                baseline["mean_e2e_latency_ci95_s"] = _pair(inputs.intervals.baseline_latency_s[:, ir])  # type: ignore[attr-defined]
            speculative = []
            for ik, k in enumerate(plan.draft_lengths):
                point = _point(
                    plan.latency_s[ia, ir, ik], plan.batch[ia, ir, ik], plan.utilisation[ia, ir, ik],
                    plan.tpot_s[ia, ir, ik], plan.ttft_load_s[ia, ir, ik], lam, g,
                )
                point["speedup"] = finite_or_none(plan.speedup[ia, ir, ik]) if point["mean_e2e_latency_s"] else None
                if inputs.intervals is not None:
                    point["mean_e2e_latency_ci95_s"] = _pair(inputs.intervals.latency_s[:, ia, ir, ik])  # type: ignore[attr-defined]
                if baseline["mean_e2e_latency_s"] is None:
                    point["speedup"] = None
                if plan.moe_speedup_lost is not None:
                    lost = plan.moe_speedup_lost[ia, ir, ik]
                    point["speedup_lost_to_expert_coverage"] = finite_or_none(lost) if point["speedup"] else None
                speculative.append({"draft_length_tokens": int(k), **point})
            best_k = int(plan.best_k[ia, ir])
            policies = None
            if plan.goodput_latency_s is not None:
                gk = int(plan.goodput_k[ia, ir])  # type: ignore[index]
                zk = int(plan.zero_load_k[ia])  # type: ignore[index]
                policies = {
                    "goodput": {
                        "mean_e2e_latency_s": finite_or_none(plan.goodput_latency_s[ia, ir]),
                        "draft_length_tokens": gk if gk > 0 else None,
                        "speculation": "unstable" if gk == NONE_STABLE else ("off" if gk == SD_OFF else "on"),
                    },
                    "zero_load_static": {
                        "draft_length_tokens": zk if zk > 0 else None,
                        "mean_e2e_latency_s": finite_or_none(plan.zero_load_k_latency_s[ia, ir]),  # type: ignore[index]
                    },
                }
            rows.append(
                {
                    "request_rate_rps": lam,
                    "policies": policies,
                    "baseline": baseline,
                    "speculative": speculative,
                    "best": {
                        "speculation": "unstable" if best_k == NONE_STABLE else ("off" if best_k == SD_OFF else "on"),
                        "draft_length_tokens": best_k if best_k > 0 else None,
                        "mean_e2e_latency_s": finite_or_none(plan.best_latency_s[ia, ir]),
                        "speedup": finite_or_none(plan.best_speedup[ia, ir])
                        if baseline["mean_e2e_latency_s"] is not None
                        else None,
                    },
                }
            )
        results.append({"per_token_alpha": float(alpha), "draft_lengths": per_k, "rates": rows})

    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "sdplan_version": __version__,
        "command": "plan",
        "calibration": {
            "name": inputs.calibration_name,
            "path": inputs.calibration_path,
            "method": inputs.calibration_method,
            "hardware": inputs.calibration_provenance.get("hardware"),
            "target_model": inputs.calibration_provenance.get("target_model"),
            "draft_model": inputs.calibration_provenance.get("draft_model"),
            "speculative_method": provenance_method(inputs.calibration_provenance),
        },
        "workload": {
            "prompt_tokens": inputs.prompt_tokens,
            "output_tokens": inputs.output_tokens,
            "acceptance": acceptance.document(),
        },
        "definitions": {
            "mean_e2e_latency_s": "mean end-to-end latency, arrival to last token (Kong et al. eq. 1)",
            "effective_batch_size": "mean requests in flight, lambda * L (Little's law)",
            "utilisation": "lambda * C2 = 1 - C1/L (MoE: 1 - L(0)/L, the dense-equivalent load share); stable below "
            "1, near_saturation above 0.9",
            "mean_ttft_s": TTFT_NOTE,
            "mean_tpot_s": TPOT_NOTE,
            "mean_e2e_latency_ci95_s": "95% interval [low, high] from the calibration's covariance (parametric "
            "bootstrap over the fitted coefficients); null high: unstable in some draws. Fit uncertainty only",
            "speedup": "no-SD latency / SD latency at the same request rate; null where either is unstable",
            "per_token_alpha": "per-token acceptance probability (i.i.d.)",
            "tokens_per_cycle": "tokens per decode step: mean acceptance length E(alpha, k), bonus token "
                                "included, at draft coverage c (share of steps with a draft): c E + (1 - c)",
            "speedup_lost_to_expert_coverage": "MoE only: speedup if verification routed only 1 + B tokens, minus "
            "the speedup with (1 + B)(k+1) routed tokens (extra experts loaded by the drafted tokens)",
        },
        "moe": None if plan.moe_speedup_lost is None else {
            "solver": "monotone fixed-point iteration from L = 0 (smallest fixed point)",
            "max_relative_residual": plan.moe_max_residual,
            "c1_s": "at zero load", "c2_s": "at full expert coverage (saturation uses it)",
            "break_even_rate_rps": "first rate where the solved speedup crosses 1; every crossing is in "
            "break_even_rates_rps",
        },
        "coefficients": asdict(plan.coefficients),
        "baseline": {
            "c1_s": plan.baseline_c1_s,
            "c2_s": plan.baseline_c2_s,
            "saturation_rate_rps": finite_or_none(plan.baseline_saturation_rate_rps),
            "max_output_throughput_tok_s": finite_or_none(g * plan.baseline_saturation_rate_rps),
        },
        "warnings": list(inputs.warnings),
        "extrapolated": list(inputs.extrapolated),
        "results": results,
    }


# ----------------------------------------------------------------------------- CSV

CSV_COLUMNS = (
    "per_token_alpha",
    "request_rate_rps",
    "speculation",
    "draft_length_tokens",
    "tokens_per_cycle",
    "mean_e2e_latency_s",
    "effective_batch_size",
    "utilisation",
    "mean_ttft_s",
    "mean_tpot_s",
    "output_throughput_tok_s",
    "speedup",
    "regime",
    "is_best",
)


def plan_csv(plan: Plan) -> str:
    """One row per (alpha, rate, k), plus a ``speculation=off`` row per (alpha, rate)."""
    import csv

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    g = plan.coefficients.output_tokens

    def cell(value: float | None) -> str:
        return "" if value is None else repr(float(value))

    for ia, alpha in enumerate(plan.alphas):
        for ir, rate in enumerate(plan.rates_rps):
            best = int(plan.best_k[ia, ir])
            base = _point(
                plan.baseline_latency_s[ir], plan.baseline_batch[ir], plan.baseline_utilisation[ir],
                plan.baseline_tpot_s[ir], plan.baseline_ttft_load_s[ir], float(rate), g,
            )
            writer.writerow(
                [cell(alpha), cell(rate), "off", 0, cell(1.0), cell(base["mean_e2e_latency_s"]),
                 cell(base["effective_batch_size"]), cell(base["utilisation"]), cell(base["mean_ttft_s"]),
                 cell(base["mean_tpot_s"]), cell(base["output_throughput_tok_s"]), "", base["regime"],
                 str(best == 0).lower()]
            )
            for ik, k in enumerate(plan.draft_lengths):
                point = _point(
                    plan.latency_s[ia, ir, ik], plan.batch[ia, ir, ik], plan.utilisation[ia, ir, ik],
                    plan.tpot_s[ia, ir, ik], plan.ttft_load_s[ia, ir, ik], float(rate), g,
                )
                speed = finite_or_none(plan.speedup[ia, ir, ik])
                if point["mean_e2e_latency_s"] is None or base["mean_e2e_latency_s"] is None:
                    speed = None
                writer.writerow(
                    [cell(alpha), cell(rate), "on", int(k), cell(plan.tokens_per_cycle[ia, ik]),
                     cell(point["mean_e2e_latency_s"]), cell(point["effective_batch_size"]),
                     cell(point["utilisation"]), cell(point["mean_ttft_s"]), cell(point["mean_tpot_s"]),
                     cell(point["output_throughput_tok_s"]), cell(speed), point["regime"],
                     str(best == int(k)).lower()]
                )
    return buffer.getvalue()


# ----------------------------------------------------------------------------- tables


def _num(value: float, digits: int = 4) -> str:
    value = float(value)
    if value != value:
        return "-"
    if value == float("inf"):
        return "unstable"
    return f"{value:.{digits}g}"


def _sd_faster_text(rate: float, faster_below: bool, moe: bool = False, crossings: Any = None) -> str:
    """Where SD beats no SD, from the break-even rate: 'below 9.3', 'above 2', 'always', 'never'.

    For MoE the speedup can cross 1 more than once: the crossings on the solved curves are listed.
    """
    if moe:
        if crossings is None:
            return "n/a for MoE"
        rates = [f"{x:.4g}" for x in crossings if x == x]
        if rates:
            return f"crosses 1x at {', '.join(rates)} ({'faster' if faster_below else 'slower'} at zero load)"
        return "always" if faster_below else "never"
    if rate == rate:
        return f"{'below' if faster_below else 'above'} {rate:.4g}"
    return "always" if faster_below else "never"


def _k_text(k: int) -> str:
    from sdplan.planner import NONE_STABLE, SD_OFF

    return "-" if k == NONE_STABLE else ("off" if k == SD_OFF else str(k))


def draw_plan(console: Any, plan: Plan, inputs: PlanInputs, style: Style, wide: bool = False,
              batch_cap: float | None = None) -> None:
    """Header, the answer in words, then per acceptance value the rate table and the per-k table.

    The default rate table is compact (best option per rate) and fits 80
    columns; ``wide`` adds one latency column per draft length.
    """
    from sdplan.render import print_paragraph, print_table
    from sdplan.render.answer import alpha_phrase, caveat_lines, caveats, plan_answer

    method = inputs.calibration_method
    provenance = inputs.calibration_provenance
    source = inputs.acceptance.source
    for ia, alpha in enumerate(plan.alphas):
        lines = plan_answer(plan, inputs, ia, batch_cap)
        body = [line for line in lines if not line.startswith(("Caveat:", "  also:"))]
        if len(plan.alphas) > 1:
            body = [line.replace("Answer:", f"Answer at alpha {alpha:.3f}:", 1).replace(
                "Why:", f"Why at alpha {alpha:.3f}:", 1) for line in body]
        for line in body:
            print_paragraph(console, line)
    # the caveats are the same for every alpha; print them once
    caveat = [line for line in plan_answer(plan, inputs, 0, batch_cap) if line.startswith(("Caveat:", "  also:"))]
    if len(plan.alphas) > 1:
        caveat = caveat_lines(caveats(method, source, float(plan.alphas[0]), list(inputs.warnings)))
    for line in caveat:
        print_paragraph(console, line, style="yellow" if "ASSUMED" in line or "NOT" in line else None)
    console.print()
    sd_method = provenance_method(provenance)
    proposer = METHODS[sd_method].label if sd_method in METHODS else sd_method
    weights = f" {provenance.get('draft_model')}" if METHODS.get(sd_method) and METHODS[sd_method].weights else ""
    console.print(f"calibration {inputs.calibration_name} ({METHOD_LABELS.get(method, method)}): "
                  f"{provenance.get('target_model')} + {proposer}{weights} ({sd_method}) "
                  f"on {provenance.get('hardware')}")
    console.print(f"workload: {inputs.prompt_tokens} prompt tokens, {inputs.output_tokens} output tokens; "
                  f"acceptance {inputs.acceptance_description}")
    console.print(f"no SD: saturates at {_num(plan.baseline_saturation_rate_rps)} req/s; zero-load latency "
                  f"{_num(plan.baseline_c1_s)} s; TTFT {_num(plan.ttft_s * 1e3)} ms at zero load, growing with B")
    for ia, alpha in enumerate(plan.alphas):
        assumption = alpha_phrase(float(alpha), source, inputs.acceptance.position_rates)
        console.print()
        table = _rate_table(plan, ia, style, wide)
        print_table(console, table, title=f"Mean end-to-end latency by request rate, {assumption}",
                    caption="* best per row. speedup = no-SD latency / best latency. rho = utilisation of the best "
                    "option (unstable at 1)." + ("" if wide else " Every k: --wide (or -f json/csv)."))
        if not wide and (plan.moe_speedup_lost is not None or plan.goodput_latency_s is not None):
            console.print()
            print_table(console, _extras_table(plan, ia, style),
                        title=f"{'MoE expert coverage' if plan.goodput_latency_s is None else 'Policies'} by request "
                        f"rate, {assumption}")
        if plan.goodput_latency_s is not None:
            console.print(f"goodput: k chosen per step by goodput E/step time at the batch size the load implies "
                          f"(SmartSpec); in this mean model it equals the best static k of each rate. "
                          f"k={int(plan.zero_load_k[ia]) or 'off'} always: the k tuned at zero load, kept at "  # type: ignore[index]
                          "every load.")
        if inputs.intervals is not None:
            console.print(_interval_line(plan, inputs.intervals, ia), markup=False)
        console.print()
        print_table(console, _per_k_table(plan, ia, style), title=f"Per draft length, {assumption}",
                    caption="E = mean acceptance length (tokens per cycle, bonus included). SD faster: the rates "
                    "where SD beats no SD, split at the break-even rate (equal mean latency).")
    console.print(f"TTFT {TTFT_NOTE}. TPOT {TPOT_NOTE}. Mean latency only: the model does not predict "
                  "percentiles (sdplan simulate does).")


def _rate_table(plan: Plan, ia: int, style: Style, wide: bool) -> Any:
    from rich.table import Table

    from sdplan.planner import NONE_STABLE, SD_OFF

    marker = "*"
    table = Table(box=table_box(style))
    table.add_column("rate (req/s)", justify="right")
    table.add_column("no SD (s)", justify="right")
    shown = range(len(plan.draft_lengths)) if wide else range(0)
    for ik in shown:
        table.add_column(f"k={plan.draft_lengths[ik]} (s)", justify="right")
    table.add_column("best k", justify="right")
    if not wide:
        table.add_column("best (s)", justify="right")
    for header in ("speedup (x)", "TPOT (ms)", "rho"):
        table.add_column(header, justify="right")
    if wide:
        table.add_column("B (req)", justify="right")
    table.add_column("regime")
    moe = plan.moe_speedup_lost is not None and wide  # compact: in the extras table
    if moe:
        table.add_column("speedup lost to coverage (x)", justify="right")
    goodput = plan.goodput_latency_s is not None and wide
    if goodput:
        zero_k = int(plan.zero_load_k[ia])  # type: ignore[index]
        table.add_column("goodput (s)", justify="right")
        table.add_column("goodput k", justify="right")
        table.add_column(f"k={zero_k if zero_k else 'off'} always (s)", justify="right")
    for ir, rate in enumerate(plan.rates_rps):
        best = int(plan.best_k[ia, ir])
        cells: list[Any] = [f"{rate:.4g}", _cell(plan.baseline_latency_s[ir], wide and best == SD_OFF, marker)]
        for ik in shown:
            cells.append(_cell(plan.latency_s[ia, ir, ik], best == int(plan.draft_lengths[ik]), marker))
        cells.append(_k_text(best))
        if not wide:
            cells.append(_cell(plan.best_latency_s[ia, ir], False, marker) if best != NONE_STABLE else "unstable")
        if best == NONE_STABLE:
            cells += ["-", "-", "-"] + (["-"] if wide else []) + ["unstable"] + (["-"] if moe else [])
        else:
            if best == SD_OFF:
                batch, rho, tpot = plan.baseline_batch[ir], plan.baseline_utilisation[ir], plan.baseline_tpot_s[ir]
            else:
                ik = list(plan.draft_lengths).index(best)
                batch, rho, tpot = plan.batch[ia, ir, ik], plan.utilisation[ia, ir, ik], plan.tpot_s[ia, ir, ik]
            speed = plan.best_speedup[ia, ir]
            cells += ["no SD unstable" if speed == float("inf") else _num(speed, 3), _num(tpot * 1e3, 3),
                      f"{rho:.2f}"]
            if wide:
                cells.append(_num(batch, 3))
            cells.append(_regime(rho).replace("_", " "))
            if moe:
                cells.append(_coverage_loss_text(plan, ia, ir))
        if goodput:
            cells += _goodput_cells(plan, ia, ir)
        table.add_row(*cells)
    return table


def _coverage_loss_text(plan: Plan, ia: int, ir: int) -> str:
    """Speedup the best option loses to MoE expert coverage at rate ``ir`` ('-' where nothing compares)."""
    from sdplan.planner import NONE_STABLE

    best = int(plan.best_k[ia, ir])
    if best == NONE_STABLE or plan.best_speedup[ia, ir] == float("inf"):
        return "-"
    lost = plan.moe_speedup_lost[ia, ir, list(plan.draft_lengths).index(best)] if best > 0 else 0.0  # type: ignore[index]
    return _num(lost, 3)


def _goodput_cells(plan: Plan, ia: int, ir: int) -> list[str]:
    """Goodput-policy latency and k, and the zero-load k kept at every load, at rate ``ir``."""
    gk = int(plan.goodput_k[ia, ir])  # type: ignore[index]
    return [_num(plan.goodput_latency_s[ia, ir]), _k_text(gk),  # type: ignore[index]
            _num(plan.zero_load_k_latency_s[ia, ir])]  # type: ignore[index]


def _extras_table(plan: Plan, ia: int, style: Style) -> Any:
    """Compact mode's second table: speedup lost to MoE expert coverage and the goodput policy, per rate."""
    from rich.table import Table

    table = Table(box=table_box(style))
    table.add_column("rate (req/s)", justify="right")
    table.add_column("best k", justify="right")
    moe = plan.moe_speedup_lost is not None
    goodput = plan.goodput_latency_s is not None
    if moe:
        table.add_column("speedup lost to coverage (x)", justify="right")
    if goodput:
        zero_k = int(plan.zero_load_k[ia])  # type: ignore[index]
        table.add_column("goodput (s)", justify="right")
        table.add_column("goodput k", justify="right")
        table.add_column(f"k={zero_k if zero_k else 'off'} always (s)", justify="right")
    for ir, rate in enumerate(plan.rates_rps):
        best = int(plan.best_k[ia, ir])
        cells = [f"{rate:.4g}", _k_text(best)]
        if moe:
            cells.append(_coverage_loss_text(plan, ia, ir))
        if goodput:
            cells += _goodput_cells(plan, ia, ir)
        table.add_row(*cells)
    return table


def _per_k_table(plan: Plan, ia: int, style: Style) -> Any:
    from rich.table import Table

    per_k = Table(box=table_box(style))
    for header in ("k", "E (tok/ cycle)", "C1 (s)", "C2 (s/req)", "zero-load speedup (x)", "saturation (req/s)",
                   "max output (tok/s)", "SD faster (req/s)"):
        per_k.add_column(header, justify="right" if header != "SD faster (req/s)" else "left")
    g = plan.coefficients.output_tokens
    moe = plan.moe_speedup_lost is not None
    per_k.add_row("off", "1", _num(plan.baseline_c1_s), _num(plan.baseline_c2_s), "1",
                  _num(plan.baseline_saturation_rate_rps), _num(g * plan.baseline_saturation_rate_rps, 5), "-")
    for ik, k in enumerate(plan.draft_lengths):
        per_k.add_row(
            str(k), f"{plan.tokens_per_cycle[ia, ik]:.3f}", _num(plan.c1_s[ia, ik]), _num(plan.c2_s[ia, ik]),
            _num(plan.baseline_c1_s / plan.c1_s[ia, ik], 3), _num(plan.saturation_rate_rps[ia, ik]),
            _num(g * plan.saturation_rate_rps[ia, ik], 5),
            _sd_faster_text(float(plan.break_even_rate_rps[ia, ik]), bool(plan.sd_faster_below_break_even[ia, ik]),
                            moe, None if plan.moe_break_even_rates_rps is None
                            else plan.moe_break_even_rates_rps[ia, ik]),
        )
    return per_k


def _cell(value: float, best: bool, marker: str) -> Any:
    from rich.text import Text

    text = _num(value)
    if best:
        return Text(f"{text}{marker}", style="bold green")
    return Text(text, style="dim" if value == float("inf") else "")
