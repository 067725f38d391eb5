"""Views of a :class:`~sdplan.planning.closed_loop_answer.ClosedLoopAnswer` (``sdplan plan --concurrency``): the
answer in words, the table, the JSON document and the CSV rows."""

from __future__ import annotations

import csv
import io
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
from sdplan.render.plan import print_inputs
from sdplan.render.plan_data import TPOT_NOTE, calibration_block, workload_block
from sdplan.units import finite_or_none

if TYPE_CHECKING:
    from sdplan.planning.closed_loop_answer import ClosedLoopAnswer, ClosedLoopPlan

#: What each field of the JSON document means (its ``definitions`` table).
DEFINITIONS = {
    "clients": "N: requests the clients keep in flight (a closed loop: vllm bench serve --max-concurrency N)",
    "running_requests": "requests the option's engine runs at once: N, or its batch cap (max_num_seqs or what "
                        "its KV cache holds) where the clients are more",
    "waiting_requests": "clients whose request waits for admission: N - running",
    "batch_caps_sequences": "each option's batch cap, no SD first, then each draft length; batch_cap_limits says "
                            "which limit sets it (kv_cache or max_num_seqs), batch_caps where it comes from",
    "mean_e2e_latency_s": "C1 + f (N' - 1) C2 at N' running (the demands past the compute-bound knee there), "
                          "times N/N' where clients wait for admission",
    "mean_ttft_s": "the prefill and the mixed step with f (N' - 1) others, plus the wait for admission",
    "run_requests": "requests each run sends in all (--num-prompts): its opening wave, the clients' first prompts "
                    "queued for prefill, adds (m(N') - 1) c2p / (run_requests / N) to mean TTFT (not to the mean "
                    "latency: the run's prefills come first, not more of them); null: a long run's steady state",
    "mean_tpot_s": TPOT_NOTE,
    "throughput_rps": "completed requests a second, N / latency (Little's law)",
    "output_throughput_tok_s": "output tokens a second, output_tokens x N / latency",
    "speedup": "no-SD latency / the option's latency at the same N, which equals the ratio of their throughputs",
    "tokens_per_cycle": "tokens per decode step: mean acceptance length E(alpha, k), bonus token included, at "
                        "draft coverage c: c E + (1 - c)",
}
CSV_COLUMNS = ("per_token_alpha", "clients", "speculation", "draft_length_tokens", "tokens_per_cycle",
               "running_requests", "mean_e2e_latency_s", "mean_ttft_s", "mean_tpot_s", "throughput_rps",
               "output_throughput_tok_s", "speedup", "best")


def render_closed_loop(answer: ClosedLoopAnswer, fmt: OutputFormat, style: Style, terminal: bool) -> str:
    """Text of the answer in the requested format."""
    if fmt is OutputFormat.JSON:
        return to_json(closed_loop_document(answer))
    if fmt is OutputFormat.CSV:
        return closed_loop_csv(answer.plan)
    return render_rich(lambda console: draw_closed_loop(console, answer, style), style, terminal)


def _clients_range(first: int, last: int) -> str:
    return f"{first} client{'s' if first > 1 else ''}" if first == last else f"{first}-{last} clients"


#: why the best gain falls with the clients, wherever it falls
_FALLS = ("SD's longer steps (k + 1 token rows to verify, and the drafting) grow faster with the batch than a "
          "decode step")


def closed_loop_lines(plan: ClosedLoopPlan, ia: int, extrapolated: tuple[str, ...] = ()) -> list[str]:
    """'Answer:' and 'Why:' for acceptance row ``ia``: the best option per run of concurrencies, and the trend;
    the answer says first where the workload lies past the calibration's measured lengths (``extrapolated``)."""
    runs: list[tuple[int, int, int]] = []  # (best option index, first i_n, last i_n)
    for i_n, option in enumerate(plan.best[ia]):
        if runs and runs[-1][0] == int(option):
            runs[-1] = (runs[-1][0], runs[-1][1], i_n)
        else:
            runs.append((int(option), i_n, i_n))
    speedup, ks = plan.speedup[ia], (0, *(int(k) for k in plan.draft_lengths))
    parts = []
    for option, first, last in runs:
        where = _clients_range(int(plan.clients[first]), int(plan.clients[last]))
        if not np.isfinite(plan.latency_s[ia, first, option]):
            parts.append(f"nothing serves at {where} (no option's engine admits a request of this workload)")
            continue
        if option == 0:
            parts.append(f"SD off at {where}")
            continue
        moved = f"{speedup[first, option]:.2f}x" + ("" if first == last else f" -> {speedup[last, option]:.2f}x")
        parts.append(f"k={ks[option]} at {where} ({moved} the throughput of no SD)")
    gains = plan.best_gains(ia)
    low, high = float(gains[0]), float(gains[-1])
    peak = int(np.argmax(np.where(np.isfinite(gains), gains, -np.inf)))
    trend = ""
    if plan.clients.size > 1 and (plan.best[ia, 0] or plan.best[ia, -1]) and np.isfinite(low) and np.isfinite(high):
        if 0 < peak < plan.clients.size - 1 and gains[peak] > 1.02 * max(low, high):
            # an MoE target's gain can rise at medium batch (docs/model.md, Mixture of experts)
            why = (" (an MoE target: a small batch reads few experts and verifying k + 1 tokens a sequence reads "
                   "more; once the batch reads most experts, SD's fewer steps pay)") if plan.moe else ""
            moves = f"rises to {gains[peak]:.2f}x at {int(plan.clients[peak])} clients{why}, then falls: {_FALLS}"
        elif high < 0.98 * low:
            moves = f"falls: {_FALLS}"
        else:
            moves = "grows with the batch here" if high > 1.02 * low else "holds"
        trend = (f" The best option's gain goes {low:.2f}x at {int(plan.clients[0])} -> {high:.2f}x at "
                 f"{int(plan.clients[-1])} clients: it {moves}.")
    head = "Answer: " if not extrapolated else ("Answer, extrapolated past the measured workloads ("
                                                 + "; ".join(extrapolated) + "): ")
    return [head + "; ".join(parts) + ".",
            "Why: a closed loop of N clients keeps N requests in flight, so each option completes N / L a "
            "second with L = C1 + f (N - 1) C2 (past an engine's batch cap the other clients wait for "
            "admission)." + trend]


def draw_closed_loop(console: Any, answer: ClosedLoopAnswer, style: Style) -> None:
    """The answer in words, the caveats, then per acceptance value the concurrency table."""
    plan, inputs = answer.plan, answer.inputs
    source = inputs.acceptance.source
    for ia, alpha in enumerate(plan.alphas):
        for line in closed_loop_lines(plan, ia, inputs.extrapolated):
            if plan.alphas.size > 1:
                line = line.replace("Answer:", f"Answer at alpha {alpha:.3f}:", 1).replace(
                    "Why:", f"Why at alpha {alpha:.3f}:", 1)
            print_paragraph(console, line)
    for line in caveat_lines(caveats(inputs.calibration_method, source, float(plan.alphas[0]),
                                     list(inputs.warnings))):
        print_paragraph(console, line, style="yellow" if "ASSUMED" in line or "NOT" in line else None)
    console.print()
    print_inputs(console, inputs)
    for ia, alpha in enumerate(plan.alphas):
        console.print()
        assumption = alpha_phrase(float(alpha), source, inputs.acceptance.position_rates)
        run = f", runs of {plan.requests:,} requests" if plan.requests is not None else ""
        print_table(console, _table(plan, ia, style), title=f"Closed loop of N clients{run}, {assumption}",
                    caption="speedup = no-SD latency / best latency at the same N = the ratio of their "
                    "throughputs. running: requests the engine runs (the others wait). Every k: -f json/csv.")
    console.print(f"TPOT {TPOT_NOTE}. Mean latency only: the model does not predict percentiles.")


def _num(value: float, digits: int = 4) -> str:
    """A cell: ``-`` where the option serves nothing (an infinite latency, a zero or undefined speedup)."""
    value = float(value)
    return f"{value:.{digits}g}" if np.isfinite(value) and value > 0 else "-"


def _table(plan: ClosedLoopPlan, ia: int, style: Style) -> Any:
    table = Table(box=table_box(style))
    for header in ("clients", "no SD (s)", "best k", "best (s)", "speedup (x)", "TPOT (ms)", "out (tok/s)",
                   "running"):
        table.add_column(header, justify="right")
    for i_n, clients in enumerate(plan.clients):
        option = int(plan.best[ia, i_n])
        running = int(plan.running[i_n, option])
        table.add_row(str(int(clients)), _num(plan.latency_s[ia, i_n, 0]), str(int(plan.best_k[ia, i_n])) if option
                      else "off", _num(plan.latency_s[ia, i_n, option]), _num(plan.speedup[ia, i_n, option], 3),
                      _num(plan.tpot_s[ia, i_n, option] * 1e3, 3),
                      f"{plan.output_throughput_tok_s[ia, i_n, option]:.0f}",
                      str(running) if running == clients else f"{running} (+{int(clients) - running} wait)")
    return table


def _arrays(plan: ClosedLoopPlan) -> dict[str, Any]:
    """The per-point quantities of the plan, each computed once (a, n, 1 + k)."""
    return {"mean_e2e_latency_s": plan.latency_s, "mean_ttft_s": plan.ttft_s, "mean_tpot_s": plan.tpot_s,
            "throughput_rps": plan.throughput_rps, "output_throughput_tok_s": plan.output_throughput_tok_s,
            "speedup": plan.speedup}


def _option(plan: ClosedLoopPlan, arrays: dict[str, Any], ia: int, i_n: int, option: int) -> dict[str, Any]:
    k = 0 if option == 0 else int(plan.draft_lengths[option - 1])
    return {
        "speculation": "off" if option == 0 else "on",
        "draft_length_tokens": k,
        "tokens_per_cycle": 1.0 if option == 0 else float(plan.tokens_per_cycle[ia, option - 1]),
        "running_requests": int(plan.running[i_n, option]),
        "waiting_requests": int(plan.clients[i_n]) - int(plan.running[i_n, option]),
        **{name: finite_or_none(values[ia, i_n, option]) for name, values in arrays.items()},
    }


def closed_loop_document(answer: ClosedLoopAnswer) -> dict[str, Any]:
    """The JSON document (``schema_version`` 1; units in every key): ``mode`` ``closed_loop``, per acceptance and
    concurrency every option and the best draft length."""
    plan, inputs = answer.plan, answer.inputs
    options, arrays = range(plan.draft_lengths.size + 1), _arrays(plan)
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "sdplan_version": __version__,
        "command": "plan",
        "mode": "closed_loop",
        "calibration": calibration_block(inputs),
        "workload": workload_block(inputs),
        "definitions": dict(DEFINITIONS),
        "run_requests": plan.requests,
        "batch_caps": list(inputs.cap_phrases),
        "batch_caps_sequences": [cap.requests for cap in inputs.batch_caps],
        "batch_cap_limits": [cap.limit for cap in inputs.batch_caps],
        "warnings": list(inputs.warnings),
        "extrapolated": list(inputs.extrapolated),
        "results": [{"per_token_alpha": float(alpha),
                     "concurrency": [{"clients": int(clients),
                                      "best_draft_length_tokens": int(plan.best_k[ia, i_n]),
                                      "options": [_option(plan, arrays, ia, i_n, option) for option in options]}
                                     for i_n, clients in enumerate(plan.clients)]}
                    for ia, alpha in enumerate(plan.alphas)],
    }


def closed_loop_csv(plan: ClosedLoopPlan) -> str:
    """One row per (alpha, clients, option), no SD first."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)

    def cell(value: Any) -> str:
        return "" if value is None else repr(value)

    arrays = _arrays(plan)
    for ia, alpha in enumerate(plan.alphas):
        for i_n, clients in enumerate(plan.clients):
            for option in range(plan.draft_lengths.size + 1):
                row = _option(plan, arrays, ia, i_n, option)
                writer.writerow([cell(float(alpha)), int(clients), row["speculation"], row["draft_length_tokens"],
                                 cell(row["tokens_per_cycle"]), row["running_requests"],
                                 *(cell(row[name]) for name in CSV_COLUMNS[6:12]),
                                 str(int(plan.best[ia, i_n]) == option).lower()])
    return buffer.getvalue()
