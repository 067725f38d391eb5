"""``sdplan check``: an SLO gate for CI (exit 0 met, 1 violated)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from sdplan.cli._inputs import ScenarioFlags, command_scenario, workload_file_option
from sdplan.cli._options import (
    DraftLengths,
    OutputRequest,
    calibration_option,
    draft_choice_callback,
    output_options,
    workload_options,
)
from sdplan.cli._simulation import simulation_options
from sdplan.errors import ExitStatus

if TYPE_CHECKING:
    from sdplan.planning.check_answer import CheckQuery


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckRequest:
    """What ``sdplan check`` was given: the scenario's options, the query, and where the answer goes."""

    scenario: ScenarioFlags
    draft_lengths: tuple[int, ...] | None
    query: CheckQuery
    output: OutputRequest


def _nonnegative_rate(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """``--rate``'s callback: a request rate is >= 0 req/s (the workload file's schema says so of its rate)."""
    if value is not None and value < 0:
        raise click.BadParameter("must be >= 0 req/s", param_hint="'--rate'")
    return value


@click.command()
@workload_file_option
@calibration_option
@click.option("-r", "--rate", "rate", type=float, callback=_nonnegative_rate, metavar="RPS",
              help="Request rate to check, req/s. Default: traffic.request_rate_rps of the workload file.")
@click.option("--concurrency", "clients", type=click.IntRange(1, 1_000_000), metavar="N",
              help="Check with N clients kept in flight instead of a rate: a closed loop, as vllm bench serve "
              "--max-concurrency and GuideLLM's concurrent profile load a server (sdplan plan --concurrency prices "
              "it the same way). Past the option's batch cap the other clients wait for admission; utilisation is "
              "the share of the most it completes.")
@click.option("--num-prompts", type=click.IntRange(1, 1_000_000_000), metavar="N",
              help="With --concurrency: the requests a run sends in all (vllm bench serve --num-prompts, 1000 by "
              "default there). The means then include its opening wave: the clients' first prompts, sent at once, "
              "queue for prefill. Default: the workload file's traffic.num_prompts, else a long run's steady "
              "state.")
@click.option("--slo", "slos", multiple=True, metavar="EXPR",
              help="SLO, repeatable: 'e2e:mean<=2s', 'ttft:mean<=300ms', 'tpot:mean<=40ms', "
              "'throughput>=2000tok/s', 'utilisation<=0.8'. Units required. Replaces the file's SLOs.")
@click.option("--draft-length", "draft_length", callback=draft_choice_callback, metavar="K|best|off",
              help="Draft length to check: a number, 'off' (no SD), or 'best' (the planner's latency-optimal "
              "choice among --draft-lengths). Default: the workload file's speculation mode, else best.")
@click.option("-k", "--draft-lengths", "draft_lengths", type=DraftLengths(), metavar="KS",
              help="Candidate draft lengths for 'best' (list or range). Default: the file's, else 1-8.")
@workload_options
@click.option("--simulate", "use_simulator", is_flag=True,
              help="Check with the simulator (sdplan-simulate(1)) instead of the model's means: percentile SLOs "
              "(e2e:p99<=5s) become available, and every latency verdict uses simulated statistics.")
@click.option("--pessimistic", is_flag=True,
              help="Gate on the pessimistic end of each prediction's 95% interval (the 97.5th percentile for "
              "<= SLOs) from the calibration's covariance; needs a fitted or served calibration.")
@click.option("--at-calibrated-speed", is_flag=True,
              help="Check on servers exactly as fast as the calibration's. By default a calibration that measured "
              "its servers' spread (repeat_sd_pct) is checked on servers as much slower as its own speed error "
              "allows (one-sided 95%), as capacity sizes; this gives that margin up and can pass a rate the "
              "servers miss.")
@simulation_options
@output_options(formats=("table", "json"))
def check(workload_path: str | None, calibration: str | None, rate: float | None, clients: int | None,
          num_prompts: int | None, slos: tuple[str, ...],
          draft_length: str | None, draft_lengths: tuple[int, ...] | None,
          prompt_tokens: int | None, output_tokens: int | None,
          acceptance_alpha: list[float] | None, acceptance_length: list[float] | None, acceptance_profile: str | None,
          draft_acceptance_rate: list[float] | None, acceptance_k: int | None, position_acceptance: list[float] | None,
          use_simulator: bool, pessimistic: bool, at_calibrated_speed: bool, requests: int, seeds: int, seed: int,
          arrival_cv: float,
          max_num_seqs: int | None, max_num_batched_tokens: int | None, kv_cache_tokens: float | None,
          lengths_file: str | None, fmt: str, output: str | None, ascii_only: bool) -> ExitStatus:
    """Check SLOs at one request rate or concurrency; exit 1 if any is missed.

    Predicts the mean end-to-end latency, TTFT, TPOT, throughput and
    utilisation of the configuration at the rate (or with --concurrency N
    clients in flight) and compares each with its SLO. An unstable rate
    (past saturation) fails every SLO. Prints a verdict
    table (or JSON) on stdout and a summary on stderr; under GitHub
    Actions also ::error annotations. Percentile SLOs are refused: the model
    predicts means.

    A calibration that measured how far its server instances lie apart
    ([uncertainty] repeat_sd_pct, sigma, over n instances per configuration)
    is checked on servers u = exp(1.645 sigma/sqrt(n)) times slower than its
    own, as capacity sizes; the caveat gives u and the verdict at the
    calibration's speed. --at-calibrated-speed checks there instead;
    --pessimistic gates on the 95% intervals, which already include the
    spread and are not shifted again.

    \b
    Exit status: 0 all SLOs met, 1 an SLO violated, 2 usage error,
    3 invalid input file, 70 internal error.

    \b
    Examples:
      sdplan check --rate 8 --slo 'e2e:mean<=5s' --slo 'tpot:mean<=15ms' \\
                   --acceptance 0.8
      sdplan check --concurrency 64 --slo 'tpot:mean<=20ms' --acceptance 0.8
      sdplan check -w deploy/chat.toml --format json
    """
    from sdplan.planning.check_answer import CheckQuery
    from sdplan.planning.simulation_inputs import SimulationSettings

    return _check(CheckRequest(
        scenario=ScenarioFlags(
            calibration=calibration, workload_path=workload_path, prompt_tokens=prompt_tokens,
            output_tokens=output_tokens, acceptance_alpha=acceptance_alpha, acceptance_length=acceptance_length,
            draft_acceptance_rate=draft_acceptance_rate, acceptance_k=acceptance_k,
            position_acceptance=position_acceptance, acceptance_profile=acceptance_profile, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, kv_cache_tokens=kv_cache_tokens,
            lengths_file=lengths_file),
        draft_lengths=draft_lengths,
        query=CheckQuery(
            rate_rps=rate, clients=clients, requests=num_prompts, slos=slos, draft_length=draft_length,
            use_simulator=use_simulator, pessimistic=pessimistic, at_calibrated_speed=at_calibrated_speed,
            simulation=SimulationSettings(requests=requests, seeds=seeds, seed=seed, arrival_cv=arrival_cv)),
        output=OutputRequest(fmt=fmt, output=output, ascii_only=ascii_only)))


def _check(request: CheckRequest) -> ExitStatus:
    """Parse, answer, render; the verdict's exit status is returned for sdplan.cli to map (1: an SLO missed)."""
    from sdplan.planning.check_answer import answer_check
    from sdplan.render import OutputFormat, Style, emit, say, stdout_is_terminal, warn
    from sdplan.render.check import check_summary, github_annotations, pessimistic_lines, render_check

    out = request.output
    scenario = command_scenario(request.scenario, request.draft_lengths)
    answer = answer_check(scenario, request.query)
    warn(answer.warnings)
    say(pessimistic_lines(answer))
    terminal = out.output in (None, "-") and stdout_is_terminal()
    emit(render_check(answer, OutputFormat(out.fmt), Style(ascii=out.ascii_only), terminal), out.output)
    if os.environ.get("GITHUB_ACTIONS") == "true":
        for line in github_annotations(answer.report):  # workflow commands: one line each, for the runner
            click.echo(line, err=True)
    say(check_summary(answer.report))
    return answer.exit_status
