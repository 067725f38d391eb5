"""Views of a :class:`~sdplan.planner.Plan`: rich tables, JSON document, CSV rows."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Any

from sdplan import __version__
from sdplan.render import JSON_SCHEMA_VERSION, OutputFormat, Style, finite_or_none, render_rich, table_box, to_json

if TYPE_CHECKING:
    from sdplan.planner import Plan, PlanInputs

METHOD_LABELS = {
    "measured": "measured with sdplan calibrate",
    "fit": "fitted from benchmark results",
    "roofline": "derived from datasheets, NOT measured",
}
TTFT_NOTE = "approximation: the request's own prefill (c1p); queueing before admission is not modelled"
TPOT_NOTE = "approximation: (L - TTFT)/(g - 1), vLLM's definition (first token excluded)"
#: Show at most this many draft-length columns in the main table.
MAX_K_COLUMNS = 8


def render_plan(plan: Plan, inputs: PlanInputs, fmt: OutputFormat, style: Style, terminal: bool) -> str:
    """Text of ``plan`` in the requested format."""
    if fmt is OutputFormat.JSON:
        return to_json(plan_document(plan, inputs))
    if fmt is OutputFormat.CSV:
        return plan_csv(plan)
    return render_rich(lambda console: draw_plan(console, plan, inputs, style), style, terminal)


# ----------------------------------------------------------------------------- JSON


def _sd_faster(rate: float, faster_below: bool) -> str:
    if rate == rate:  # finite break-even
        return "below_break_even" if faster_below else "above_break_even"
    return "at_every_rate" if faster_below else "never"


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
            if plan.moe_break_even_rates_rps is not None:  # MoE: the speedup can cross 1 several times
                per_k[-1]["break_even_rates_rps"] = [float(x) for x in plan.moe_break_even_rates_rps[ia, ik] if x == x]
        rows = []
        for ir, rate in enumerate(plan.rates_rps):
            lam = float(rate)
            baseline = _point(
                plan.baseline_latency_s[ir], plan.baseline_batch[ir], plan.baseline_utilisation[ir],
                plan.baseline_tpot_s[ir], plan.ttft_s, lam, g,
            )
            speculative = []
            for ik, k in enumerate(plan.draft_lengths):
                point = _point(
                    plan.latency_s[ia, ir, ik], plan.batch[ia, ir, ik], plan.utilisation[ia, ir, ik],
                    plan.tpot_s[ia, ir, ik], plan.ttft_s, lam, g,
                )
                point["speedup"] = finite_or_none(plan.speedup[ia, ir, ik]) if point["mean_e2e_latency_s"] else None
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
            "speedup": "no-SD latency / SD latency at the same request rate; null where either is unstable",
            "per_token_alpha": "per-token acceptance probability (i.i.d.)",
            "tokens_per_cycle": "mean acceptance length E(alpha, k), bonus token included",
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
                plan.baseline_tpot_s[ir], plan.ttft_s, float(rate), g,
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
                    plan.tpot_s[ia, ir, ik], plan.ttft_s, float(rate), g,
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


def _shown_draft_lengths(plan: Plan, ia: int) -> list[int]:
    """Indices of the k columns to show: all if few, else the best ones plus the ends."""
    count = len(plan.draft_lengths)
    if count <= MAX_K_COLUMNS:
        return list(range(count))
    wanted = {0, count - 1}
    for k in plan.best_k[ia]:
        if k > 0:
            wanted.add(int(list(plan.draft_lengths).index(k)))
    ranked = sorted(range(count), key=lambda ik: float(plan.c1_s[ia, ik]))
    for ik in ranked:
        if len(wanted) >= MAX_K_COLUMNS:
            break
        wanted.add(ik)
    return sorted(wanted)[:MAX_K_COLUMNS]


def _break_even_text(rate: float, faster_below: bool, moe: bool = False, crossings: Any = None) -> str:
    if moe and crossings is not None:
        rates = [f"{x:.4g}" for x in crossings if x == x]
        if rates:
            return f"{', '.join(rates)} (SD {'faster' if faster_below else 'slower'} at zero load)"
        return "never (SD faster at every stable rate)" if faster_below else "none (SD never faster)"
    if moe:
        return "n/a for MoE (read the table)"
    if rate == rate:
        return f"{rate:.4g} (SD faster {'below' if faster_below else 'above'})"
    return "never (SD faster at every stable rate)" if faster_below else "none (SD never faster)"


def draw_plan(console: Any, plan: Plan, inputs: PlanInputs, style: Style) -> None:
    """Header, then per acceptance value the rate table and the per-k table."""
    from rich.table import Table
    from rich.text import Text

    from sdplan.planner import NONE_STABLE, SD_OFF

    method = inputs.calibration_method
    console.print(
        Text.assemble(
            ("calibration ", "bold"), inputs.calibration_name, f" ({METHOD_LABELS.get(method, method)})",
        )
    )
    provenance = inputs.calibration_provenance
    console.print(
        f"  {provenance.get('target_model')} + draft {provenance.get('draft_model')} on {provenance.get('hardware')}"
    )
    console.print(
        f"workload    {inputs.prompt_tokens} prompt tokens, {inputs.output_tokens} output tokens; "
        f"acceptance {inputs.acceptance_description}"
    )
    console.print(
        f"no SD       saturates at {_num(plan.baseline_saturation_rate_rps)} req/s; "
        f"zero-load latency {_num(plan.baseline_c1_s)} s; TTFT ~ {_num(plan.ttft_s * 1e3)} ms ({TTFT_NOTE})"
    )
    for warning in inputs.warnings:
        console.print(f"warning: {warning}", style="yellow")
    marker = "*"
    for ia, alpha in enumerate(plan.alphas):
        shown = _shown_draft_lengths(plan, ia)
        table = Table(
            title=f"Mean end-to-end latency (s) by request rate, per-token alpha = {alpha:.3f}",
            box=table_box(style),
            caption=f"{marker} best per row; speedup = no-SD latency / best latency; "
            "B = mean requests in flight (Little's law); rho = utilisation of the best option",
            title_justify="left",
            caption_justify="left",
        )
        table.add_column("rate (req/s)", justify="right")
        table.add_column("no SD (s)", justify="right")
        for ik in shown:
            table.add_column(f"k={plan.draft_lengths[ik]} (s)", justify="right")
        for header in ("best k", "speedup (x)", "B (req)", "rho", "TPOT (ms)", "regime"):
            table.add_column(header, justify="right" if header != "regime" else "left")
        moe = plan.moe_speedup_lost is not None
        if moe:
            table.add_column("speedup lost to coverage (x)", justify="right")
        goodput = plan.goodput_latency_s is not None
        if goodput:
            zero_k = int(plan.zero_load_k[ia])  # type: ignore[index]
            table.add_column("goodput (s)", justify="right")
            table.add_column("goodput k", justify="right")
            table.add_column(f"k={zero_k if zero_k else 'off'} always (s)", justify="right")
        for ir, rate in enumerate(plan.rates_rps):
            best = int(plan.best_k[ia, ir])
            cells = [f"{rate:.4g}", _cell(plan.baseline_latency_s[ir], best == SD_OFF, marker)]
            for ik in shown:
                cells.append(_cell(plan.latency_s[ia, ir, ik], best == int(plan.draft_lengths[ik]), marker))
            if best == NONE_STABLE:
                cells += ["-", "-", "-", "-", "-", "unstable"] + (["-"] if moe else [])
            else:
                if best == SD_OFF:
                    batch, rho, tpot = plan.baseline_batch[ir], plan.baseline_utilisation[ir], plan.baseline_tpot_s[ir]
                else:
                    ik = list(plan.draft_lengths).index(best)
                    batch, rho, tpot = plan.batch[ia, ir, ik], plan.utilisation[ia, ir, ik], plan.tpot_s[ia, ir, ik]
                speed = plan.best_speedup[ia, ir]
                cells += [
                    "off" if best == SD_OFF else str(best),
                    "no-SD unstable" if speed == float("inf") else _num(speed, 3),
                    _num(batch, 3),
                    f"{rho:.2f}",
                    _num(tpot * 1e3, 3),
                    _regime(rho).replace("_", " "),
                ]
                if moe:
                    lost = plan.moe_speedup_lost[ia, ir, list(plan.draft_lengths).index(best)] if best > 0 else 0.0  # type: ignore[index]
                    cells.append(_num(lost, 3) if speed != float("inf") else "-")
            if goodput:
                gk = int(plan.goodput_k[ia, ir])  # type: ignore[index]
                cells += [_num(plan.goodput_latency_s[ia, ir]),  # type: ignore[index]
                          "-" if gk == NONE_STABLE else ("off" if gk == SD_OFF else str(gk)),
                          _num(plan.zero_load_k_latency_s[ia, ir])]  # type: ignore[index]
            table.add_row(*cells)
        console.print()
        console.print(table)
        if goodput:
            console.print("goodput: k chosen per step by goodput E/step time at the batch size the load implies "
                          "(SmartSpec); in this mean model it equals the best static k of each rate. "
                          f"k={int(plan.zero_load_k[ia]) or 'off'} always: the k tuned at zero load, kept at "  # type: ignore[index]
                          "every load.")

        per_k = Table(
            title=f"Per draft length, per-token alpha = {alpha:.3f}",
            box=table_box(style),
            title_justify="left",
            caption="E = mean acceptance length (tokens per cycle, bonus included); "
            "break-even = request rate where SD and no SD have equal mean latency",
            caption_justify="left",
        )
        for header in ("k", "E (tok/cycle)", "C1 (s)", "C2 (s/req)", "zero-load speedup (x)",
                       "saturation (req/s)", "max throughput (tok/s)", "break-even (req/s)"):
            per_k.add_column(header, justify="right" if header != "break-even (req/s)" else "left")
        g = plan.coefficients.output_tokens
        per_k.add_row(
            "off", "1", _num(plan.baseline_c1_s), _num(plan.baseline_c2_s), "1",
            _num(plan.baseline_saturation_rate_rps), _num(g * plan.baseline_saturation_rate_rps, 5), "-",
        )
        for ik, k in enumerate(plan.draft_lengths):
            per_k.add_row(
                str(k),
                f"{plan.tokens_per_cycle[ia, ik]:.3f}",
                _num(plan.c1_s[ia, ik]),
                _num(plan.c2_s[ia, ik]),
                _num(plan.baseline_c1_s / plan.c1_s[ia, ik], 3),
                _num(plan.saturation_rate_rps[ia, ik]),
                _num(g * plan.saturation_rate_rps[ia, ik], 5),
                _break_even_text(float(plan.break_even_rate_rps[ia, ik]), bool(plan.sd_faster_below_break_even[ia, ik]),
                                 moe, None if plan.moe_break_even_rates_rps is None
                                 else plan.moe_break_even_rates_rps[ia, ik]),
            )
        console.print()
        console.print(per_k)
    console.print(f"TPOT: {TPOT_NOTE}. Mean latency only: the model does not predict percentiles.")


def _cell(value: float, best: bool, marker: str) -> Any:
    from rich.text import Text

    text = _num(value)
    if best:
        return Text(f"{text}{marker}", style="bold green")
    return Text(text, style="dim" if value == float("inf") else "")
