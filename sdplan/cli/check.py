"""``sdplan check``: an SLO gate for CI (exit 0 met, 1 violated)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from sdplan.cli._inputs import ScenarioFlags, command_scenario, draft_lengths_given, workload_file_option
from sdplan.cli._options import (
    OutputRequest,
    calibration_option,
    draft_choice_callback,
    output_options,
    workload_options,
)
from sdplan.cli._simulation import simulation_options
from sdplan.errors import ExitStatus, InvalidValueError
from sdplan.limits import check_simulation
from sdplan.serving import batch_cap_warning

if TYPE_CHECKING:
    from sdplan.check import CheckReport
    from sdplan.coefficients import Coefficients
    from sdplan.scenario import Scenario, SimulationSettings
    from sdplan.serving import EngineLimits
    from sdplan.slo import SLO


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckRequest:
    """What ``sdplan check`` was given."""

    scenario: ScenarioFlags
    rate: float | None
    slos: tuple[str, ...]
    draft_length: str | None
    draft_lengths: str | None
    use_simulator: bool
    pessimistic: bool
    simulation: SimulationSettings
    output: OutputRequest


@click.command()
@workload_file_option
@calibration_option
@click.option("-r", "--rate", "rate", type=float, metavar="RPS",
              help="Request rate to check, req/s. Default: traffic.request_rate_rps of the workload file.")
@click.option("--slo", "slos", multiple=True, metavar="EXPR",
              help="SLO, repeatable: 'e2e:mean<=2s', 'ttft:mean<=300ms', 'tpot:mean<=40ms', "
              "'throughput>=2000tok/s', 'utilisation<=0.8'. Units required. Replaces the file's SLOs.")
@click.option("--draft-length", "draft_length", callback=draft_choice_callback, metavar="K|best|off",
              help="Draft length to check: a number, 'off' (no SD), or 'best' (the planner's latency-optimal "
              "choice among --draft-lengths). Default: the workload file's speculation mode, else best.")
@click.option("-k", "--draft-lengths", "draft_lengths", metavar="KS",
              help="Candidate draft lengths for 'best' (list or range). Default: the file's, else 1-8.")
@workload_options
@click.option("--simulate", "use_simulator", is_flag=True,
              help="Check with the simulator (sdplan-simulate(1)) instead of the model's means: percentile SLOs "
              "(e2e:p99<=5s) become available, and every latency verdict uses simulated statistics.")
@click.option("--pessimistic", is_flag=True,
              help="Gate on the pessimistic end of each prediction's 95% interval (the 97.5th percentile for "
              "<= SLOs) from the calibration's covariance; needs a fitted or served calibration.")
@simulation_options
@output_options(formats=("table", "json"))
def check(workload_path: str | None, calibration: str | None, rate: float | None, slos: tuple[str, ...],
          draft_length: str | None, draft_lengths: str | None, prompt_tokens: int | None, output_tokens: int | None,
          acceptance_alpha: list[float] | None, acceptance_length: list[float] | None, acceptance_profile: str | None,
          draft_acceptance_rate: list[float] | None, acceptance_k: int | None, position_acceptance: list[float] | None,
          use_simulator: bool, pessimistic: bool, requests: int, seeds: int, seed: int, arrival_cv: float,
          max_num_seqs: int | None, max_num_batched_tokens: int | None, kv_cache_tokens: float | None,
          lengths_file: str | None, fmt: str, output: str | None, ascii_only: bool) -> ExitStatus:
    """Check SLOs at one request rate; exit 1 if any is missed.

    Predicts the mean end-to-end latency, TTFT, TPOT, throughput and
    utilisation of the configuration at the rate and compares each with its
    SLO. An unstable rate (past saturation) fails every SLO. Prints a verdict
    table (or JSON) on stdout and a one-line summary on stderr; under GitHub
    Actions also ::error annotations. Percentile SLOs are refused: the model
    predicts means.

    \b
    Exit status: 0 all SLOs met, 1 an SLO violated, 2 usage error,
    3 invalid input file, 70 internal error.

    \b
    Examples:
      sdplan check --rate 8 --slo 'e2e:mean<=5s' --slo 'tpot:mean<=15ms' \\
                   --acceptance 0.8
      sdplan check -w deploy/chat.toml --format json
    """
    from sdplan.scenario import SimulationSettings

    return _check(CheckRequest(
        scenario=ScenarioFlags(
            calibration=calibration, workload_path=workload_path, prompt_tokens=prompt_tokens,
            output_tokens=output_tokens, acceptance_alpha=acceptance_alpha, acceptance_length=acceptance_length,
            draft_acceptance_rate=draft_acceptance_rate, acceptance_k=acceptance_k,
            position_acceptance=position_acceptance, acceptance_profile=acceptance_profile, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, kv_cache_tokens=kv_cache_tokens,
            lengths_file=lengths_file),
        rate=rate, slos=slos, draft_length=draft_length, draft_lengths=draft_lengths, use_simulator=use_simulator,
        pessimistic=pessimistic,
        simulation=SimulationSettings(requests=requests, seeds=seeds, seed=seed, arrival_cv=arrival_cv),
        output=OutputRequest(fmt=fmt, output=output, ascii_only=ascii_only)))


def _check(request: CheckRequest) -> ExitStatus:
    from sdplan.check import run_check
    from sdplan.render import OutputFormat, Style, emit, stdout_is_terminal, warn
    from sdplan.render.check import check_summary, github_annotations, render_check
    from sdplan.workload import measured_draft_lengths, resolve_slos

    rate, draft_length, use_simulator, out = request.rate, request.draft_length, request.use_simulator, request.output
    scenario = command_scenario(request.scenario, draft_lengths_given(request.draft_lengths))
    file = scenario.file
    if rate is None:
        rate = file.request_rate_rps if file is not None else None
    if rate is None:
        raise InvalidValueError("no request rate to check; give --rate RPS or traffic.request_rate_rps in the workload")
    if rate < 0:
        raise click.BadParameter("must be >= 0 req/s", param_hint="'--rate'")
    if draft_length is None and file is not None and file.mode is not None:
        draft_length = {"best": "best", "off": "off", "fixed": str(file.draft_length)}[file.mode]
    choice = draft_length or "best"
    mode = choice if choice in ("best", "off") else "fixed"
    fixed = int(choice) if mode == "fixed" else None
    if fixed:
        measured_draft_lengths(scenario.workload.acceptance, [fixed], given=True)  # past the measured k: an error
    tokens = scenario.workload.acceptance.tokens_per_cycle([fixed] if fixed else scenario.draft_lengths)
    parsed = resolve_slos(request.slos, file, allow_percentiles=use_simulator)
    report = run_check(scenario.coefficients, rate, scenario.alpha, mode, fixed, scenario.draft_lengths, parsed,
                       tokens_per_cycle=tokens, moe=scenario.moe, limits=scenario.limits)
    intervals = None
    if request.pessimistic:
        if use_simulator:
            raise click.UsageError("--pessimistic and --simulate do not combine: intervals come from the analytic "
                                   "model over the calibration's covariance")
        report, intervals = _pessimistic(scenario, report, parsed)
    limits = scenario.limits_for([report.draft_length])  # the server that runs the chosen option
    limits.require_fit(scenario.request_tokens)
    if use_simulator:
        report = _simulated(scenario, report, parsed, limits, request.simulation)
    warnings = _warnings(scenario, report, limits)
    warn(warnings)
    context = scenario.context()
    context["warnings"] = warnings
    if intervals is not None:
        context["pessimistic"] = _pessimistic_context(scenario, intervals)
    terminal = out.output in (None, "-") and stdout_is_terminal()
    emit(render_check(report, context, OutputFormat(out.fmt), Style(ascii=out.ascii_only), terminal), out.output)
    if os.environ.get("GITHUB_ACTIONS") == "true":
        for line in github_annotations(report):
            click.echo(line, err=True)
    click.echo(check_summary(report), err=True)
    return report.exit_status  # 1 when an SLO is missed: sdplan.cli maps it to the exit code


def _pessimistic_context(scenario: Scenario, intervals: dict[str, Any]) -> dict[str, Any]:
    """The report's ``pessimistic`` table (each interval also said on standard error)."""
    from sdplan.uncertainty import covers, server_spread_pct

    for text, (low, high) in intervals.items():
        click.echo(f"pessimistic: {text}: 95% interval {low:.4g}-{high:.4g}; checked at the worse end", err=True)
    spread = server_spread_pct(scenario.calibration)
    return {"level": 0.95, "rule": f"each SLO checked at the pessimistic end of its 95% interval ({covers(spread)})",
            "server_sd_pct": spread, "intervals": {text: [low, high if high != float("inf") else None]
                                                   for text, (low, high) in intervals.items()}}


def _pessimistic(scenario: Scenario, report: CheckReport, slos: list[SLO]) -> tuple[CheckReport, dict[str, Any]]:
    """The report re-checked at the pessimistic end of each prediction's 95% interval, and the intervals."""
    from sdplan.check import run_check
    from sdplan.uncertainty import coefficient_draws, pessimistic_verdicts

    calibration, workload, candidates = scenario.calibration, scenario.workload, scenario.draft_lengths
    if "uncertainty" not in calibration.document:
        raise InvalidValueError(f"--pessimistic needs a calibration with a covariance ([uncertainty]); "
                                f"{calibration.name} has none: fit one (sdplan fit, sdplan calibrate)")
    chosen = report.draft_length
    option_tokens = workload.acceptance.tokens_per_cycle([chosen] if chosen else candidates)
    draws = coefficient_draws(calibration, workload.prompt_tokens, workload.output_tokens,
                              options=([chosen] if chosen else candidates, option_tokens))
    if draws is None:
        option = f"SD k={chosen}" if chosen else "the candidate draft lengths"
        raise InvalidValueError(f"--pessimistic: {calibration.name}'s covariance gives positive demands "
                                f"in under a quarter of its draws at {option}, so the fit does not determine "
                                "it; measure that draft length (sdplan calibrate --draft-lengths)")

    def check_draw(drawn: Coefficients) -> CheckReport:
        return run_check(drawn, report.rate_rps, scenario.alpha, "fixed" if chosen else "off", chosen or None,
                         candidates, slos, tokens_per_cycle=option_tokens, moe=scenario.moe, limits=scenario.limits)

    return pessimistic_verdicts(report, slos, draws, check_draw)


def _simulated(scenario: Scenario, report: CheckReport, slos: list[SLO], limits: EngineLimits,
               settings: SimulationSettings) -> CheckReport:
    """The report with every latency verdict from the simulator's statistics."""
    from sdplan.check import simulated_verdicts
    from sdplan.scenario import simulation_config
    from sdplan.simulate import replicate

    if scenario.moe is not None:
        raise InvalidValueError("--simulate does not model MoE expert coverage yet")
    if report.rate_rps <= 0:
        raise click.BadParameter("--simulate needs a rate > 0 req/s", param_hint="'--rate'")
    check_simulation(settings.requests, settings.seeds, 1, "rate")
    config = simulation_config(scenario, report.rate_rps, report.draft_length, limits, settings)
    summary = replicate(scenario.coefficients, config, settings.seeds, settings.seed, report.point.e2e_s)
    return simulated_verdicts(report, slos, summary)


def _warnings(scenario: Scenario, report: CheckReport, limits: EngineLimits) -> list[str]:
    """Where the answer is outside the model's domain: calibrated range, batch cap, prefill load, no steady state."""
    from sdplan import model
    rate = report.rate_rps
    warnings = scenario.calibration.validity_warnings(scenario.workload.prompt_tokens,
                                                      scenario.workload.output_tokens, report.batch)
    if report.simulated is None:
        if math.isfinite(report.batch) and limits.reached(report.batch):  # unstable: every SLO fails anyway
            warnings.append(batch_cap_warning(limits, f"at {rate:g} req/s (effective batch {report.batch:.4g} "
                                              "requests)"))
        if report.point.utilisation < 1.0:
            c2 = report.point.utilisation / rate if rate > 0 else 0.0
            interference = model.prefill_interference_warning(scenario.coefficients.c2p_s, c2,
                                                              report.point.utilisation)
            if interference is not None:
                warnings.append(interference)
    if report.simulated is not None and not report.steady:
        warnings.append("the simulation did not reach a steady state at this rate (the queue keeps growing): "
                        "every SLO fails")
    return warnings + scenario.notes()
