"""``sdplan plan``: latency, speedup and best draft length over a rate grid."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from sdplan.cli._inputs import ScenarioFlags, command_scenario
from sdplan.cli._options import (
    OutputRequest,
    calibration_option,
    check_plot_request,
    concurrency_callback,
    grid_options,
    output_options,
    plot_options,
    terminal_plot_settings,
    usage_error,
    workload_options,
)
from sdplan.cli._simulation import LENGTHS_FILE_OPTION, engine_limit_options


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRequest:
    """What ``sdplan plan`` was given."""

    scenario: ScenarioFlags
    rates: list[float] | None
    concurrency: tuple[int, ...] | None
    num_prompts: int | None
    draft_lengths: tuple[int, ...] | None
    policy: str
    wide: bool
    output: OutputRequest


@click.command()
@calibration_option
@workload_options
@grid_options
@click.option("--concurrency", callback=concurrency_callback, metavar="CLIENTS",
              help="Plan closed loops of N clients instead of request rates (vllm bench serve --max-concurrency N, "
              "GuideLLM's concurrent profile): per N the latency, throughput and speedup of every k, each engine "
              "at its batch cap. A list (1,16,64) or range (1-8).")
@click.option("--num-prompts", type=click.IntRange(1, 1_000_000_000), metavar="N",
              help="With --concurrency: the requests a run sends in all (vllm bench serve --num-prompts, 1000 by "
              "default there). The means then include its opening wave: the clients' first prompts, sent at once, "
              "queue for prefill. Default: a long run's steady state.")
@click.option("--policy", type=click.Choice(("best-static", "goodput")), default="best-static", show_default=True,
              help="best-static: the best draft length per rate. goodput: also the SmartSpec-style policy that picks "
              "k per step by goodput at the load's batch size (Little's law), beside the single k tuned at zero load.")
@click.option("--wide", is_flag=True, help="One latency column per draft length in the rate table (default: "
              "the compact table, best k per rate, that fits 80 columns).")
@click.option("--spec-method", metavar="METHOD",
              help="SD method to plan (draft_model, eagle, eagle3, mtp, ngram); must be the calibration's. "
              "Default: the calibration's.")
@engine_limit_options
@LENGTHS_FILE_OPTION
@output_options()
@plot_options
def plan(calibration: str | None, prompt_tokens: int | None, output_tokens: int | None,
         acceptance_alpha: list[float] | None, acceptance_length: list[float] | None,
         draft_acceptance_rate: list[float] | None, acceptance_k: int | None, position_acceptance: list[float] | None,
         acceptance_profile: str | None,
         rates: list[float] | None, concurrency: tuple[int, ...] | None, num_prompts: int | None,
         draft_lengths: tuple[int, ...] | None, policy: str, wide: bool, spec_method: str | None,
         max_num_seqs: int | None, max_num_batched_tokens: int | None, kv_cache_tokens: float | None,
         lengths_file: str | None, fmt: str, output: str | None, ascii_only: bool, plot: bool,
         plot_file: str | None) -> None:
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
      sdplan plan --concurrency 1,16,64,128 --acceptance-length 2.4 \\
                  --acceptance-k 3
    """
    _plan(PlanRequest(
        scenario=ScenarioFlags(
            calibration=calibration, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
            acceptance_alpha=acceptance_alpha, acceptance_length=acceptance_length,
            draft_acceptance_rate=draft_acceptance_rate, acceptance_k=acceptance_k,
            position_acceptance=position_acceptance, acceptance_profile=acceptance_profile, spec_method=spec_method,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, kv_cache_tokens=kv_cache_tokens,
            lengths_file=lengths_file),
        rates=rates, concurrency=concurrency, num_prompts=num_prompts, draft_lengths=draft_lengths, policy=policy,
        wide=wide,
        output=OutputRequest(fmt=fmt, output=output, ascii_only=ascii_only, plot=plot, plot_file=plot_file)))


def _plan(request: PlanRequest) -> None:
    """Parse, answer, render: one call to :func:`sdplan.planning.plan_answer.answer_plan`, intervals where they
    apply."""
    from sdplan.planning.plan_answer import PlanQuery, answer_plan
    from sdplan.render import OutputFormat, Style, emit, stdout_is_terminal, warn
    from sdplan.render.plan import render_plan

    out = request.output
    check_plot_request(out.plot, out.plot_file, out.fmt)
    if request.concurrency is not None:
        _closed_loop(request, request.concurrency)
        return
    if request.num_prompts is not None:
        raise usage_error("--num-prompts gives the requests a closed-loop run sends: give --concurrency with it, "
                          "or drop it")
    scenario = command_scenario(request.scenario, request.draft_lengths, single_acceptance=False)
    answer = answer_plan(scenario, PlanQuery(
        rates_rps=tuple(request.rates) if request.rates is not None else None,
        goodput_policy=request.policy == "goodput", for_table=out.fmt == "table"))
    if answer.intervals_apply:
        from sdplan.planning.plan_intervals import with_intervals  # not on a plain plan's path: loads the fit's tables

        answer = with_intervals(scenario, answer)
    result, inputs = answer.plan, answer.inputs
    if out.fmt != "table":
        warn(inputs.warnings)
    terminal = out.output in (None, "-") and stdout_is_terminal()
    text = render_plan(result, inputs, OutputFormat(out.fmt), Style(ascii=out.ascii_only), terminal,
                       wide=request.wide, batch_cap=answer.batch_cap)
    if out.plot or out.plot_file is not None:
        from sdplan.render.plots import file_plan, terminal_plan  # only when a plot is asked for

        if out.plot:
            text += "\n" + terminal_plan(result, inputs, *terminal_plot_settings(out.ascii_only))
        if out.plot_file is not None:
            file_plan(result, inputs, Path(out.plot_file))
    emit(text, out.output)


def _closed_loop(request: PlanRequest, clients: tuple[int, ...]) -> None:
    """``--concurrency``: one call to :func:`sdplan.planning.closed_loop_answer.answer_closed_loop`, rendered."""
    from sdplan.planning.closed_loop_answer import ClosedLoopQuery, answer_closed_loop
    from sdplan.render import OutputFormat, Style, emit, stdout_is_terminal, warn
    from sdplan.render.closed_loop import render_closed_loop

    out = request.output
    given = [flag for flag, used in (("--rates", request.rates is not None), ("--policy goodput",
             request.policy == "goodput"), ("--wide", request.wide), ("--plot", out.plot),
             ("--plot-file", out.plot_file is not None)) if used]
    if given:
        raise usage_error(f"--concurrency plans closed loops; {', '.join(given)} belong to the request-rate plan: "
                          "drop them, or drop --concurrency")
    scenario = command_scenario(request.scenario, request.draft_lengths, single_acceptance=False)
    answer = answer_closed_loop(scenario, ClosedLoopQuery(clients=clients, requests=request.num_prompts,
                                                          for_table=out.fmt == "table"))
    if out.fmt != "table":
        warn(answer.inputs.warnings)
    terminal = out.output in (None, "-") and stdout_is_terminal()
    emit(render_closed_loop(answer, OutputFormat(out.fmt), Style(ascii=out.ascii_only), terminal), out.output)
