"""``sdplan simulate``: tails and queueing from a discrete-event simulation of one replica."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from sdplan.cli._inputs import ScenarioFlags, command_scenario
from sdplan.cli._options import (
    DraftLengths,
    OutputRequest,
    calibration_option,
    check_plot_request,
    draft_choice_callback,
    output_options,
    parse_number_list,
    plot_options,
    terminal_plot_settings,
    workload_options,
)
from sdplan.cli._simulation import progress_reporter, simulation_options

if TYPE_CHECKING:
    from sdplan.planning.simulation_inputs import SimulationSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulateRequest:
    """What ``sdplan simulate`` was given."""

    scenario: ScenarioFlags
    rates: str | None
    draft_length: str
    draft_lengths: tuple[int, ...] | None
    simulation: SimulationSettings
    output: OutputRequest


@click.command()
@calibration_option
@workload_options
@click.option("-r", "--rates", metavar="RATES",
              help="Request rates in req/s (list or START:STOP:STEP). Default: 25%, 50%, 75% and 90% of the "
              "no-SD saturation rate.")
@click.option("--draft-length", "draft_length", default="best", show_default=True, callback=draft_choice_callback,
              metavar="K|best|off|goodput", help="Draft length: a number, off, best (the model's best static k per "
              "rate), or goodput (SmartSpec-style: k chosen every step by E(k)/step time at the current batch).")
@click.option("-k", "--draft-lengths", "draft_lengths", type=DraftLengths(), metavar="KS",
              help="Candidates for best and goodput (list or range). Default: 1-8.")
@simulation_options
@output_options()
@plot_options
def simulate(calibration: str | None, prompt_tokens: int | None, output_tokens: int | None,
             acceptance_alpha: list[float] | None, acceptance_length: list[float] | None,
             draft_acceptance_rate: list[float] | None, acceptance_k: int | None,
             position_acceptance: list[float] | None,
             acceptance_profile: str | None, rates: str | None, draft_length: str,
             draft_lengths: tuple[int, ...] | None,
             requests: int, seeds: int, seed: int, arrival_cv: float, max_num_seqs: int | None,
             max_num_batched_tokens: int | None,
             kv_cache_tokens: float | None, lengths_file: str | None, fmt: str, output: str | None,
             ascii_only: bool, plot: bool, plot_file: str | None) -> None:
    """Simulate one replica with continuous batching and SD: percentiles and queueing.

    A discrete-event simulation at iteration level (vLLM-like): Poisson or
    bursty arrivals, a batch cap, a KV budget and a per-step token budget,
    chunked prefill, and random acceptance per cycle; step times from the
    same calibration as the model. Per rate: mean, p50, p90, p99 of E2E
    latency, TTFT, TPOT and queueing delay with 95% confidence intervals
    from independent replications, throughput, mean batch, a Little's-law
    check, and the analytic mean beside it.

    \b
    Examples:
      sdplan simulate --acceptance 0.8 --rates 4,8,11
      sdplan simulate --draft-length 3 --seeds 5 --arrival-cv 2 -f json
    """
    from sdplan.planning.simulation_inputs import SimulationSettings

    _simulate(SimulateRequest(
        scenario=ScenarioFlags(
            calibration=calibration, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
            acceptance_alpha=acceptance_alpha, acceptance_length=acceptance_length,
            draft_acceptance_rate=draft_acceptance_rate, acceptance_k=acceptance_k,
            position_acceptance=position_acceptance, acceptance_profile=acceptance_profile, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, kv_cache_tokens=kv_cache_tokens,
            lengths_file=lengths_file),
        rates=rates, draft_length=draft_length, draft_lengths=draft_lengths,
        simulation=SimulationSettings(requests=requests, seeds=seeds, seed=seed, arrival_cv=arrival_cv),
        output=OutputRequest(fmt=fmt, output=output, ascii_only=ascii_only, plot=plot, plot_file=plot_file)))


def _simulate(request: SimulateRequest) -> None:
    """Parse, answer, render: one call to :func:`sdplan.planning.simulate_answer.answer_simulate`."""
    from sdplan.planning.simulate_answer import SimulateQuery, answer_simulate
    from sdplan.render import OutputFormat, Style, emit, stdout_is_terminal, warn
    from sdplan.render.simulate import render_simulate, simulate_plots

    draft_length, out = request.draft_length, request.output
    check_plot_request(out.plot, out.plot_file, out.fmt)
    if draft_length not in ("best", "off", "goodput"):
        candidates: list[int] | None = [int(draft_length)]
    elif request.draft_lengths is not None:
        candidates = list(request.draft_lengths)
    else:
        candidates = None
    scenario = command_scenario(request.scenario, candidates)
    query = SimulateQuery(settings=request.simulation, rates_rps=_rates(request.rates), draft_length=draft_length,
                          for_table=out.fmt == "table", lengths_file=request.scenario.lengths_file)
    with ExitStack() as bars:
        answer = answer_simulate(scenario, query, progress=progress_reporter(bars, "simulating"))
    warn(answer.warnings)
    terminal = out.output in (None, "-") and stdout_is_terminal()
    text = render_simulate(answer, OutputFormat(out.fmt), Style(ascii=out.ascii_only), terminal)
    emit(text + simulate_plots(answer, out.plot, out.plot_file, *terminal_plot_settings(out.ascii_only)), out.output)


def _rates(rates: str | None) -> tuple[float, ...] | None:
    """``--rates`` parsed (each > 0), None when not given (the use case's default then holds)."""
    if rates is None:
        return None
    rate_list = sorted(set(parse_number_list(rates, "request rates in req/s")))
    if any(r <= 0 for r in rate_list):
        raise click.BadParameter("simulated rates must be > 0 req/s", param_hint="'--rates'")
    return tuple(rate_list)
