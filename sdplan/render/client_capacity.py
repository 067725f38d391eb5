"""Views of ``sdplan capacity --closed-loop``: the answer in words, the table, JSON and the bars.

They read :class:`sdplan.planning.client_capacity.ClientCapacityAnswer` and nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from sdplan import __version__
from sdplan.render import (
    JSON_SCHEMA_VERSION,
    OutputFormat,
    Style,
    print_table,
    render_rich,
    table_box,
    to_json,
)
from sdplan.render.answer import (
    alpha_phrase,
    caveat_lines,
    caveats,
    speed_caveat,
)
from sdplan.render.check import (
    best_option_cell,
    choice_document,
    margin_document,
    option_bars,
    option_head,
    print_capacity_head,
    print_fleet,
    scenario_document,
)
from sdplan.render.plan_data import cap_fields
from sdplan.units import finite_or_none

if TYPE_CHECKING:
    from sdplan.planning.client_capacity import ClientCapacityAnswer, ClientFleet

#: What the JSON's per-option fields mean.
DEFINITIONS = {
    "max_clients": "most requests the clients keep in flight (a closed loop: vllm bench serve --max-concurrency N) "
                   "at which every SLO holds; 0: none",
    "min_clients": "fewest clients a throughput>= SLO needs (1 without one)",
    "running_requests": "requests the engine runs at max_clients; the rest wait for admission (priced)",
    "at_batch_cap": "max_clients is the engine's cap (max_num_seqs or what its KV cache holds): one client more "
                    "waits for admission, and that wait misses the binding SLO",
    "means": "the long run's steady state at max_clients, as sdplan plan --concurrency prices it",
}


def client_capacity_answer(answer: ClientCapacityAnswer) -> list[str]:
    """The decision in words, then the caveat."""
    cap, fleet = answer.capacity, answer.fleet
    best, best_sd = cap.best, cap.best_speculative
    slos = ", ".join(slo.text for slo in answer.slos)
    lines = []
    if best < 0:
        lines.append(f"Answer: no option meets {slos} with any number of clients; relax the SLOs or use faster "
                     "hardware.")
    else:
        most = int(cap.max_clients[best])
        if best == 0:
            head = f"Answer: SD off. Without SD a replica holds {most} clients under {slos}"
            if best_sd > 0:
                head += f"; the best SD option ({cap.label(best_sd)}) {int(cap.max_clients[best_sd])}"
        else:
            method = answer.scenario.method
            head = (f"Answer: SD on with {cap.label(best)}" + (f" ({method})" if method else "")
                    + f": {most} clients in flight per replica under {slos}")
            off = int(cap.max_clients[0])
            head += (f" vs {off} without SD ({most / off:.2f}x)" if off > 0
                     else "; without SD the SLOs cannot be met")
        lines.append(head + f" (binding: {cap.binding_slo[best] or '-'}).")
        if fleet is not None and fleet.no_sd is not None and fleet.best_sd is not None:
            lines.append(f"  for {fleet.target_clients:,} clients: {fleet.no_sd.replicas} replicas without SD, "
                         f"{fleet.best_sd.replicas} with {fleet.best_sd.option}.")
    margin = answer.speed_margin
    lines.extend(caveat_lines(caveats(answer.scenario.calibration.method or "",
                                      answer.scenario.workload.acceptance.source, cap.alpha,
                                      () if margin is None else (speed_caveat(margin, None),))))
    return lines


def _fleet_document(item: ClientFleet | None) -> dict[str, Any] | None:
    if item is None:
        return None
    return {"option": item.option, "per_replica_clients": item.per_replica_clients, "replicas": item.replicas,
            "gpus": item.gpus, "cost_per_hour_usd": item.cost_per_hour_usd,
            "output_throughput_tok_s": item.output_throughput_tok_s,
            "cost_per_million_output_tokens_usd": item.cost_per_million_output_tokens_usd}


def client_capacity_document(answer: ClientCapacityAnswer) -> dict[str, Any]:
    """The answer as JSON."""
    cap, scenario = answer.capacity, answer.scenario
    batch_caps = scenario.limits.batch_caps(scenario.draft_lengths)
    options = []
    for index in range(len(cap.max_clients)):
        options.append(option_head(cap, index) | {
            "max_clients": int(cap.max_clients[index]),
            "min_clients": int(cap.min_clients[index]),
            "binding_slo": cap.binding_slo[index],
            "at_batch_cap": bool(cap.at_cap[index]),
            **cap_fields(batch_caps[index]),
            "running_requests": int(cap.running[index]),
            "mean_e2e_latency_s": finite_or_none(cap.latency_s[index]),
            "mean_ttft_s": finite_or_none(cap.ttft_s[index]),
            "mean_tpot_s": finite_or_none(cap.tpot_s[index]),
            "throughput_rps": finite_or_none(cap.throughput_rps[index]),
            "output_throughput_tok_s": finite_or_none(cap.output_throughput_tok_s[index]),
        })
    document: dict[str, Any] = {
        "schema_version": JSON_SCHEMA_VERSION,
        "sdplan_version": __version__,
        "command": "capacity",
        "mode": "closed_loop",
        **scenario_document(scenario),
        "speculative_method": scenario.method,
        "definitions": DEFINITIONS,
        "warnings": list(answer.warnings),
        "batch_caps_sequences": [float(cap_) for cap_ in scenario.limits.caps(scenario.draft_lengths)],
    }
    if answer.speed_margin is not None:
        document["speed_margin"] = margin_document(answer.speed_margin, None)
    document |= choice_document(cap, answer.slos, options)
    fleet = answer.fleet
    if fleet is not None:
        document["fleet"] = {"target_clients": fleet.target_clients, "no_sd": _fleet_document(fleet.no_sd),
                             "best_sd": _fleet_document(fleet.best_sd),
                             "replicas_saved_by_sd": fleet.replicas_saved_by_sd}
    return document


def _cell(value: float, digits: int = 4, scale: float = 1.0) -> str:
    shown = finite_or_none(value)
    return "-" if shown is None else f"{shown * scale:.{digits}g}"


def render_client_capacity(answer: ClientCapacityAnswer, fmt: OutputFormat, style: Style, terminal: bool) -> str:
    """JSON, or the decision in words, the clients per option and the fleet."""
    if fmt is OutputFormat.JSON:
        return to_json(client_capacity_document(answer))
    cap, scenario, fleet = answer.capacity, answer.scenario, answer.fleet

    def draw(console: Any) -> None:
        assumption = print_capacity_head(console, client_capacity_answer(answer), scenario, answer.slos, cap.alpha,
                                         "; analytic model (means), closed loops searched over the clients")
        table = Table(box=table_box(style))
        for header in ("option", "max clients under SLO", "binding SLO", "latency (s)", "TTFT (ms)", "TPOT (ms)",
                       "output (tok/s)"):
            table.add_column(header, justify="left" if header in ("option", "binding SLO") else "right")
        for index in range(len(cap.max_clients)):
            best = index == cap.best
            table.add_row(
                best_option_cell(cap.label(index), best),
                (f"{int(cap.max_clients[index])}" + (" (cap)" if cap.at_cap[index] else ""))
                if cap.feasible[index] else "infeasible",
                cap.binding_slo[index] or "-",
                _cell(cap.latency_s[index]), _cell(cap.ttft_s[index], scale=1e3), _cell(cap.tpot_s[index], scale=1e3),
                _cell(cap.output_throughput_tok_s[index], 5))
        print_table(console, table, title=f"Clients in flight per replica under the SLOs, {assumption}",
                    caption="* most clients. A closed loop of N clients (vllm bench serve --max-concurrency N); "
                            "the means are at the largest N meeting every SLO (model means, steady state). "
                            "(cap): one client more waits for admission (caps: "
                            + ", ".join(f"{cap.label(j)} {cap.caps[j]:g}" for j in range(len(cap.caps))) + ").")
        if fleet is not None:
            print_fleet(console, style, "per replica (clients)",
                        [(name, item, None if item is None else str(item.per_replica_clients))
                         for name, item in (("no SD", fleet.no_sd), ("best SD", fleet.best_sd))],
                        f"{fleet.target_clients:,} clients", assumption, fleet.replicas_saved_by_sd)

    return render_rich(draw, style, terminal)


def client_capacity_plots(answer: ClientCapacityAnswer, plot: bool, plot_file: str | None, width: int,
                          color: bool) -> str:
    """Each option's clients as bars, for the terminal (returned, with ``plot``) and/or ``plot_file``."""
    cap, scenario = answer.capacity, answer.scenario
    labels = [cap.label(index) for index in range(len(cap.max_clients))]
    values = [float(clients) for clients in cap.max_clients]
    title = (f"Most clients in flight under {', '.join(slo.text for slo in answer.slos)} per replica, "
             f"{alpha_phrase(scenario.alpha, scenario.workload.acceptance.source)}")
    return option_bars(labels, values, title, ("clients", "max clients under SLO"), scenario.calibration.name,
                       cap.label(cap.best) if cap.best >= 0 else None, (plot, plot_file, width, color))
