"""``sdplan plan``: latency, speedup and best draft length over a rate grid."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sdplan.cli._inputs import ScenarioFlags, command_scenario
from sdplan.cli._options import (
    OutputRequest,
    calibration_option,
    check_plot_request,
    grid_options,
    output_options,
    plot_options,
    terminal_plot_settings,
    workload_options,
)
from sdplan.errors import InputFileError
from sdplan.limits import check_grid, check_table

if TYPE_CHECKING:
    from sdplan.planner import Plan
    from sdplan.scenario import Scenario
    from sdplan.uncertainty import PlanIntervals


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRequest:
    """What ``sdplan plan`` was given."""

    scenario: ScenarioFlags
    rates: list[float] | None
    draft_lengths: list[int] | None
    policy: str
    wide: bool
    output: OutputRequest


def check_speculation_identified(cal: object) -> None:
    """Planning SD from a calibration fitted without SD runs is an error, not an extrapolation."""
    missing = set(getattr(cal, "without_runs", ()))
    if not missing:
        return
    from sdplan.runmodel import SPECULATIVE_PARAMETERS

    if missing >= set(SPECULATIVE_PARAMETERS):
        raise InputFileError(getattr(cal, "path", "calibration"), "uncertainty.not_identified",
                             "was fitted from runs without SD, so SD cannot be planned with it; fit SD runs at two "
                             "or more draft lengths too (sdplan fit, sdplan calibrate --draft-lengths)")


def identification_warnings(cal: object) -> list[str]:
    name = getattr(cal, "name", "the calibration")
    missing = list(getattr(cal, "without_runs", ()))
    weak = [n for n in getattr(cal, "not_identified", ()) if n not in missing]
    found = []
    if missing:
        found.append(f"{', '.join(missing)} of {name} were not identified by its benchmark runs: draft lengths "
                     "other than those measured are extrapolated")
    if weak:
        found.append(f"{', '.join(weak)} of {name} have standard errors above their values: its runs did not "
                     "determine them" + (", so how the latency splits between prefill and decode steps, and "
                                         "with it any other prompt or output length, is a guess; calibrate at "
                                         "two or more workloads (sdplan calibrate measures probes of its own)"
                                         if {"c1p_s", "c2p_s"} & set(weak) else ""))
    return found


@click.command()
@calibration_option
@workload_options
@grid_options
@click.option("--policy", type=click.Choice(("best-static", "goodput")), default="best-static", show_default=True,
              help="best-static: the best draft length per rate. goodput: also the SmartSpec-style policy that picks "
              "k per step by goodput at the load's batch size (Little's law), beside the single k tuned at zero load.")
@click.option("--wide", is_flag=True, help="One latency column per draft length in the rate table (default: "
              "the compact table, best k per rate, that fits 80 columns).")
@click.option("--spec-method", metavar="METHOD",
              help="SD method to plan (draft_model, eagle, eagle3, mtp, ngram); must be the calibration's. "
              "Default: the calibration's.")
@output_options()
@plot_options
def plan(calibration: str | None, prompt_tokens: int | None, output_tokens: int | None,
         acceptance_alpha: list[float] | None, acceptance_length: list[float] | None,
         draft_acceptance_rate: list[float] | None, acceptance_k: int | None, position_acceptance: list[float] | None,
         acceptance_profile: str | None,
         rates: list[float] | None, draft_lengths: list[int] | None, policy: str, wide: bool, spec_method: str | None,
         fmt: str, output: str | None, ascii_only: bool, plot: bool, plot_file: str | None) -> None:
    """Predict latency with and without SD at each request rate.

    For every request rate and draft length k: mean end-to-end latency,
    effective batch size, utilisation, approximate TTFT/TPOT and speedup over
    no SD; per rate the best k (or "off"); per k the saturation rate and the
    break-even rate above which SD stops paying.

    \b
    Examples:
      sdplan plan
      sdplan plan -c calibrations/my.toml --rates 0.5:16:0.5 --draft-lengths 0-8 \\
                  --acceptance 0.8 --prompt-tokens 1024 --output-tokens 512
      sdplan plan --acceptance-length 2.9 --acceptance-k 3 --format json \\
                  -o plan.json
    """
    _plan(PlanRequest(
        scenario=ScenarioFlags(
            calibration=calibration, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
            acceptance_alpha=acceptance_alpha, acceptance_length=acceptance_length,
            draft_acceptance_rate=draft_acceptance_rate, acceptance_k=acceptance_k,
            position_acceptance=position_acceptance, acceptance_profile=acceptance_profile, spec_method=spec_method),
        rates=rates, draft_lengths=draft_lengths, policy=policy, wide=wide,
        output=OutputRequest(fmt=fmt, output=output, ascii_only=ascii_only, plot=plot, plot_file=plot_file)))


def _plan(request: PlanRequest) -> None:
    from sdplan import planner
    from sdplan.render import OutputFormat, Style, emit, stdout_is_terminal, warn
    from sdplan.render.plan import render_plan
    from sdplan.render.plots import file_plan, terminal_plan

    rates, policy, out = request.rates, request.policy, request.output
    fmt, output, ascii_only = out.fmt, out.output, out.ascii_only
    check_plot_request(out.plot, out.plot_file, fmt)
    scenario = command_scenario(request.scenario, request.draft_lengths, single_acceptance=False)
    cal, workload, draft_lengths = scenario.calibration, scenario.workload, scenario.draft_lengths
    alphas = list(workload.acceptance.alphas)
    tokens = scenario.tokens_per_cycle
    if rates is None:
        rates = planner.default_rates(scenario.coefficients, draft_lengths, alphas, tokens_per_cycle=tokens,
                                      batch_caps=scenario.limits.caps(draft_lengths))
    check_grid(len(rates) * (len(draft_lengths) + 1) * len(alphas),
               f"{len(rates)} rates x {len(draft_lengths) + 1} draft lengths x {len(alphas)} acceptances",
               "give fewer --rates (a larger STEP), --draft-lengths or --acceptance values")
    if fmt == "table":
        check_table(len(alphas), len(alphas) * len(rates), "give fewer --rates or --acceptance values")
    result = planner.plan(scenario.coefficients, rates, draft_lengths, alphas, tokens_per_cycle=tokens,
                          goodput_policy=policy == "goodput", moe=scenario.moe,
                          batch_caps=scenario.limits.caps(draft_lengths))
    check_speculation_identified(cal)
    inputs = planner.PlanInputs(
        calibration_name=cal.name,
        calibration_path=cal.path,
        calibration_method=cal.method,
        calibration_provenance=cal.provenance,
        acceptance_description=workload.acceptance.describe(),
        acceptance=workload.acceptance,
        prompt_tokens=workload.prompt_tokens,
        output_tokens=workload.output_tokens,
        warnings=tuple(cal.validity_warnings(workload.prompt_tokens, workload.output_tokens,
                                             planner.largest_batch(result))
                       + planner.domain_warnings(result, scenario.limits)
                       + identification_warnings(cal) + scenario.notes()),
        extrapolated=tuple(f"{name} {value:g}, measured {low:g}-{high:g}" for name, value, low, high
                           in cal.outside_measured(workload.prompt_tokens, workload.output_tokens)),
        cap_phrases=tuple(scenario.limits.cap_phrase(k) for k in (0, *draft_lengths)),
        intervals=(_intervals(scenario, result)  # only a fitted calibration has draws
                   if scenario.moe is None and policy != "goodput" and "uncertainty" in cal.document else None),
    )
    if fmt != "table":
        warn(inputs.warnings)
    terminal = output in (None, "-") and stdout_is_terminal()
    batch_cap = (cal.document.get("validity") or {}).get("batch_size", [None, None])[-1]
    text = render_plan(result, inputs, OutputFormat(fmt), Style(ascii=ascii_only), terminal, wide=request.wide,
                       batch_cap=batch_cap)
    if out.plot:
        text += "\n" + terminal_plan(result, inputs, *terminal_plot_settings(ascii_only))
    if out.plot_file is not None:
        file_plan(result, inputs, Path(out.plot_file))
    emit(text, output)


def _intervals(scenario: Scenario, result: Plan) -> PlanIntervals | None:
    """95% intervals of the plan from the calibration's covariance and server spread; None without a covariance."""
    from sdplan.uncertainty import coefficient_draws, plan_intervals, server_spread_pct

    workload = scenario.workload
    draws = coefficient_draws(scenario.calibration, workload.prompt_tokens, workload.output_tokens,
                              options=(scenario.draft_lengths, scenario.tokens_per_cycle))
    if draws is None:
        return None
    return plan_intervals(draws, result.alphas, result.rates_rps, result.draft_lengths, scenario.tokens_per_cycle,
                          server_sd_pct=server_spread_pct(scenario.calibration))
