"""Views of a :class:`~sdplan.planning.planner.Plan`: the rich tables, and the JSON document and CSV rows of
:mod:`sdplan.render.plan_data` by format."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from rich.table import Table
from rich.text import Text

from sdplan.inputs.methods import METHODS, provenance_method
from sdplan.planning.planner import NONE_STABLE, SD_OFF
from sdplan.render import OutputFormat, Style, print_paragraph, print_table, render_rich, table_box, to_json
from sdplan.render.answer import alpha_phrase, caveat_lines, caveats, plan_answer
from sdplan.render.plan_data import TPOT_NOTE, TTFT_NOTE, plan_csv, plan_document, regime

if TYPE_CHECKING:
    from sdplan.planning.planner import Plan, PlanInputs
    from sdplan.planning.uncertainty import PlanIntervals

METHOD_LABELS = {
    "measured": "measured with sdplan calibrate",
    "fit": "fitted from benchmark results",
    "roofline": "derived from datasheets, NOT measured",
    "derived": "priced by AIConfigurator's silicon op database",
}


def render_plan(plan: Plan, inputs: PlanInputs, fmt: OutputFormat, style: Style, terminal: bool,
                wide: bool = False, batch_cap: float | None = None) -> str:
    """Text of ``plan`` in the requested format (``wide``: a latency column per k in the table)."""
    if fmt is OutputFormat.JSON:
        return to_json(plan_document(plan, inputs))
    if fmt is OutputFormat.CSV:
        return plan_csv(plan)
    return render_rich(lambda console: draw_plan(console, plan, inputs, style, wide, batch_cap), style, terminal)


# ----------------------------------------------------------------------------- tables


def _interval_line(plan: Plan, intervals: PlanIntervals, ia: int) -> str:
    """One line of 95% intervals: the best option's latency at the most loaded stable rate, and its break-even."""
    stable = [ir for ir in range(len(plan.rates_rps)) if int(plan.best_k[ia, ir]) != NONE_STABLE]
    if not stable:
        return f"95% intervals ({intervals.covers}): nothing stable on this grid."
    ir = stable[-1]
    best = int(plan.best_k[ia, ir])
    if best == SD_OFF:
        low, high = intervals.baseline_latency_s[:, ir]
        name = "no SD"
    else:
        ik = list(plan.draft_lengths).index(best)
        low, high = intervals.latency_s[:, ia, ir, ik]
        name = f"k={best}"
    text = (f"95% intervals ({intervals.covers}, {intervals.draws} draws): {name} at "
            f"{_num(float(plan.rates_rps[ir]))} req/s {_num(float(low))}-"
            f"{'unstable' if not np.isfinite(high) else _num(float(high))} s")
    k0 = int(np.argmin(plan.c1_s[ia]))
    even = intervals.break_even_rate_rps[:, ia, k0]
    if np.all(np.isfinite(even)):
        text += f"; break-even of k={int(plan.draft_lengths[k0])} {_num(float(even[0]))}-{_num(float(even[1]))} req/s"
    return text + "."



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
    return "-" if k == NONE_STABLE else ("off" if k == SD_OFF else str(k))


def draw_plan(console: Any, plan: Plan, inputs: PlanInputs, style: Style, wide: bool = False,
              batch_cap: float | None = None) -> None:
    """Header, the answer in words, then per acceptance value the rate table and the per-k table.

    The default rate table is compact (best option per rate) and fits 80
    columns; ``wide`` adds one latency column per draft length.
    """
    method = inputs.calibration_method
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
    print_inputs(console, inputs)
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
                          f"k={_zero_load_k_text(plan, ia)} always: the k tuned at zero load, kept at "
                          "every load.")
        if inputs.intervals is not None:
            console.print(_interval_line(plan, inputs.intervals, ia), markup=False)
        console.print()
        print_table(console, _per_k_table(plan, ia, style), title=f"Per draft length, {assumption}",
                    caption="E = mean acceptance length (tokens per cycle, bonus included). SD faster: the rates "
                    "where SD beats no SD, split at the break-even rate (equal mean latency).")
    console.print(f"TTFT {TTFT_NOTE}. TPOT {TPOT_NOTE}. Mean latency only: the model does not predict "
                  "percentiles (sdplan simulate does).")


def print_inputs(console: Any, inputs: PlanInputs) -> None:
    """The calibration line (name, how made, target, proposer, hardware) and the workload line."""
    provenance, method = inputs.calibration_provenance, inputs.calibration_method
    sd_method = provenance_method(provenance)
    proposer = METHODS[sd_method].label if sd_method in METHODS else sd_method
    weights = f" {provenance.get('draft_model')}" if METHODS.get(sd_method) and METHODS[sd_method].weights else ""
    console.print(f"calibration {inputs.calibration_name} ({METHOD_LABELS.get(method, method)}): "
                  f"{provenance.get('target_model')} + {proposer}{weights} ({sd_method}) "
                  f"on {provenance.get('hardware')}", markup=False)
    console.print(f"workload: {inputs.prompt_tokens} prompt tokens, {inputs.output_tokens} output tokens; "
                  f"acceptance {inputs.acceptance_description}", markup=False)


def _rate_table(plan: Plan, ia: int, style: Style, wide: bool) -> Any:
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
        _add_goodput_columns(table, plan, ia)
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
            cells.append(regime(rho).replace("_", " "))
            if moe:
                cells.append(_coverage_loss_text(plan, ia, ir))
        if goodput:
            cells += _goodput_cells(plan, ia, ir)
        table.add_row(*cells)
    return table


def _coverage_loss_text(plan: Plan, ia: int, ir: int) -> str:
    """Speedup the best option loses to MoE expert coverage at rate ``ir`` ('-' where nothing compares)."""
    best = int(plan.best_k[ia, ir])
    if best == NONE_STABLE or plan.best_speedup[ia, ir] == float("inf"):
        return "-"
    assert plan.moe_speedup_lost is not None, "called for MoE plans only"
    lost = plan.moe_speedup_lost[ia, ir, list(plan.draft_lengths).index(best)] if best > 0 else 0.0
    return _num(lost, 3)


def _zero_load_k_text(plan: Plan, ia: int) -> str:
    """The draft length tuned at zero load (``--policy goodput``), 'off' for no SD."""
    assert plan.zero_load_k is not None, "called for goodput plans only"
    return str(int(plan.zero_load_k[ia]) or "off")


def _add_goodput_columns(table: Any, plan: Plan, ia: int) -> None:
    """The columns :func:`_goodput_cells` fills."""
    table.add_column("goodput (s)", justify="right")
    table.add_column("goodput k", justify="right")
    table.add_column(f"k={_zero_load_k_text(plan, ia)} always (s)", justify="right")


def _goodput_cells(plan: Plan, ia: int, ir: int) -> list[str]:
    """Goodput-policy latency and k, and the zero-load k kept at every load, at rate ``ir``."""
    assert plan.goodput_k is not None and plan.goodput_latency_s is not None \
        and plan.zero_load_k_latency_s is not None, "called for goodput plans only"
    gk = int(plan.goodput_k[ia, ir])
    return [_num(plan.goodput_latency_s[ia, ir]), _k_text(gk), _num(plan.zero_load_k_latency_s[ia, ir])]


def _extras_table(plan: Plan, ia: int, style: Style) -> Any:
    """Compact mode's second table: speedup lost to MoE expert coverage and the goodput policy, per rate."""
    table = Table(box=table_box(style))
    table.add_column("rate (req/s)", justify="right")
    table.add_column("best k", justify="right")
    moe = plan.moe_speedup_lost is not None
    goodput = plan.goodput_latency_s is not None
    if moe:
        table.add_column("speedup lost to coverage (x)", justify="right")
    if goodput:
        _add_goodput_columns(table, plan, ia)
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
    text = _num(value)
    if best:
        return Text(f"{text}{marker}", style="bold green")
    return Text(text, style="dim" if value == float("inf") else "")
