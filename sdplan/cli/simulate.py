"""``sdplan simulate``: tails and queueing from a discrete-event simulation of one replica."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sdplan.cli._inputs import ScenarioFlags, command_scenario
from sdplan.cli._options import (
    OutputRequest,
    calibration_option,
    check_plot_request,
    draft_choice_callback,
    output_options,
    parse_int_list,
    parse_number_list,
    plot_options,
    terminal_plot_settings,
    workload_options,
)
from sdplan.cli._simulation import simulation_options
from sdplan.errors import InvalidValueError
from sdplan.limits import check_simulation, check_table
from sdplan.serving import batch_cap_warning

if TYPE_CHECKING:
    from sdplan.planner import Plan
    from sdplan.scenario import Scenario, SimulationSettings
    from sdplan.serving import EngineLimits
    from sdplan.simulate import RateSummary


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulateRequest:
    """What ``sdplan simulate`` was given."""

    scenario: ScenarioFlags
    rates: str | None
    draft_length: str
    draft_lengths: str | None
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
@click.option("-k", "--draft-lengths", "draft_lengths", metavar="KS",
              help="Candidates for best and goodput (list or range). Default: 1-8.")
@simulation_options
@output_options()
@plot_options
def simulate(calibration: str | None, prompt_tokens: int | None, output_tokens: int | None,
             acceptance_alpha: list[float] | None, acceptance_length: list[float] | None,
             draft_acceptance_rate: list[float] | None, acceptance_k: int | None,
             position_acceptance: list[float] | None,
             acceptance_profile: str | None, rates: str | None, draft_length: str, draft_lengths: str | None,
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
    from sdplan.scenario import SimulationSettings

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
    from sdplan import planner
    from sdplan.render import OutputFormat, Style, emit, stdout_is_terminal, warn
    from sdplan.render.simulate import render_simulate, simulate_document

    draft_length, settings, out = request.draft_length, request.simulation, request.output
    fmt, output, ascii_only = out.fmt, out.output, out.ascii_only
    check_plot_request(out.plot, out.plot_file, fmt)
    if draft_length not in ("best", "off", "goodput"):
        candidates: list[int] | None = [int(draft_length)]
    elif request.draft_lengths is not None:
        candidates = sorted({k for k in parse_int_list(request.draft_lengths, "draft lengths") if k > 0}) or [1]
    else:
        candidates = None
    scenario = command_scenario(request.scenario, candidates)
    if scenario.moe is not None:
        raise InvalidValueError("simulate does not model MoE expert coverage yet; use plan for MoE calibrations")
    rate_list = _rates(scenario, request.rates)
    check_simulation(settings.requests, settings.seeds, len(rate_list), "rates")
    if fmt == "table":
        check_table(1, len(rate_list), "give fewer --rates")
    result = planner.plan(scenario.coefficients, rate_list, scenario.draft_lengths, scenario.workload.acceptance.alphas,
                          tokens_per_cycle=scenario.tokens_per_cycle)
    summaries, limits = _simulate_rates(scenario, result, draft_length, settings)
    warnings = _warnings(scenario, summaries, limits)
    warn(warnings)
    workload = scenario.workload
    context = {"calibration": {"name": scenario.calibration.name, "path": scenario.calibration.path,
                               "method": scenario.calibration.method},
               "workload": {"prompt_tokens": workload.prompt_tokens, "output_tokens": workload.output_tokens,
                            "acceptance": workload.acceptance.describe(),
                            "lengths_file": request.scenario.lengths_file,
                            "per_token_alpha": workload.acceptance.alphas[0],
                            "position_acceptance_rates": (list(workload.acceptance.position_rates)
                                                          if workload.acceptance.position_rates else None),
                            "acceptance_source": workload.acceptance.source},
               "warnings": warnings}
    settings_document = {"replications": settings.seeds, "requests": settings.requests, "seed": settings.seed,
                         "arrival_cv": settings.arrival_cv, "max_num_seqs": scenario.limits.max_num_seqs,
                         "max_num_batched_tokens": scenario.limits.max_num_batched_tokens,
                         "kv_cache_tokens": request.scenario.kv_cache_tokens, "warmup_fraction": 0.1}
    document = simulate_document(summaries, context, settings_document, limits)
    terminal = output in (None, "-") and stdout_is_terminal()
    text = render_simulate(summaries, document, OutputFormat(fmt), Style(ascii=ascii_only), terminal)
    emit(text + _plots(scenario, summaries, out.plot, out.plot_file, ascii_only), output)


def _rates(scenario: Scenario, rates: str | None) -> list[float]:
    """The rates to simulate: given, else 25%, 50%, 75% and 90% of the no-SD saturation rate."""
    from sdplan import model
    if rates is None:
        _, c2_d = model.baseline_demand(scenario.coefficients)
        return [round(f / c2_d, 4) for f in (0.25, 0.5, 0.75, 0.9)]
    rate_list = sorted(set(parse_number_list(rates, "request rates in req/s")))
    if any(r <= 0 for r in rate_list):
        raise click.BadParameter("simulated rates must be > 0 req/s", param_hint="'--rates'")
    return rate_list


def _simulate_rates(scenario: Scenario, result: Plan, draft_length: str,
                    settings: SimulationSettings) -> tuple[list[RateSummary], list[EngineLimits]]:
    """Simulate every rate of ``result`` with the draft length chosen there; with each rate's engine limits."""
    from sdplan.render.progress import progress_bar
    from sdplan.scenario import simulation_config
    from sdplan.simulate import replicate

    rates = [float(rate) for rate in result.rates_rps]
    total = len(rates) * settings.seeds * settings.requests
    candidates = scenario.draft_lengths
    summaries, limits = [], []
    with progress_bar("simulating", total) as advance:
        for ir, rate in enumerate(rates):
            if draft_length == "off":
                k = 0
            elif draft_length in ("best", "goodput"):
                k = max(int(result.best_k[0, ir]), 0)
            else:
                k = int(draft_length)
            analytic = float(result.baseline_latency_s[ir] if k == 0 else result.latency_s[0, ir, candidates.index(k)])
            adaptive = draft_length == "goodput"
            # the server that runs this draft length (the longest, for goodput)
            limits.append(scenario.limits_for([max(candidates)] if adaptive else [k]))
            config = simulation_config(scenario, rate, k, limits[-1], settings, adaptive=adaptive)

            def progress(completed: int, _: int, base: int = ir * settings.seeds * settings.requests,
                         rate: float = rate) -> None:
                advance(base + completed, total, f"{rate:g} req/s")

            summary = replicate(scenario.coefficients, config, settings.seeds, settings.seed, analytic, progress)
            # the goodput policy is reported beside the model's best static k
            summaries.append(replace(summary, draft_length=k) if adaptive else summary)
    return summaries, limits


def _warnings(scenario: Scenario, summaries: list[RateSummary], limits: list[EngineLimits]) -> list[str]:
    """Calibrated range, the rates whose mean batch reaches the batch cap, and rates not at steady state."""
    workload = scenario.workload
    batches = [float(summary.rate_rps * summary.analytic_e2e_s) for summary in summaries]
    finite = [b for b in batches if math.isfinite(b)]
    warnings = scenario.calibration.validity_warnings(workload.prompt_tokens, workload.output_tokens,
                                                      max(finite) if finite else None)
    over = [(f"{s.rate_rps:g}", its) for s, b, its in zip(summaries, batches, limits)
            if its.reached(b)]
    for its in dict.fromkeys(its for _, its in over):
        at = ", ".join(rate for rate, other in over if other == its)
        warnings.append(batch_cap_warning(its, f"at {at} req/s"))
    unsteady = [f"{s.rate_rps:g}" for s in summaries if not s.steady]
    if unsteady:
        warnings.append(f"not at steady state at {', '.join(unsteady)} req/s: the queue kept growing during the "
                        "run (past saturation), so those statistics grow with --requests and are no steady-state "
                        "values")
    return warnings + scenario.notes()


def _plots(scenario: Scenario, summaries: list[RateSummary], plot: bool, plot_file: str | None,
           ascii_only: bool) -> str:
    """The E2E latency CDF per rate: drawn for the terminal (returned) and/or written to ``plot_file``."""
    import numpy as np

    from sdplan.render.answer import alpha_phrase
    from sdplan.render.plots import file_cdf, terminal_cdf

    acceptance = scenario.workload.acceptance
    series = [(f"{s.rate_rps:g} req/s", np.sort(s.e2e_samples_s)) for s in summaries]
    assumption = alpha_phrase(acceptance.alphas[0], acceptance.source, acceptance.position_rates)
    if plot_file is not None:
        file_cdf(series, f"E2E latency CDF, {scenario.calibration.name}, {assumption}", Path(plot_file))
    if not plot:
        return ""
    return "\n" + terminal_cdf(series, f"E2E latency CDF (first replication), {assumption}",
                                 *terminal_plot_settings(ascii_only))
