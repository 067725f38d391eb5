"""``sdplan capacity``: highest request rate under SLOs per draft length, replicas, k schedule."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from sdplan.cli._inputs import ScenarioFlags, command_scenario, workload_file_option
from sdplan.cli._options import (
    DraftLengths,
    OutputRequest,
    calibration_option,
    check_plot_request,
    output_options,
    plot_options,
    terminal_plot_settings,
    workload_options,
)
from sdplan.cli._simulation import progress_reporter, simulation_options
from sdplan.errors import InfeasibleError

if TYPE_CHECKING:

    from sdplan.planning.capacity_answer import CapacityQuery
    from sdplan.planning.scenario import Scenario

#: The engine configurations ``--format`` writes (:data:`sdplan.planning.capacity_answer.ENGINES`; not imported here,
#: so that help does not load the core).
ENGINE_FORMATS = ("vllm-config", "sglang", "trtllm")


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityRequest:
    """What ``sdplan capacity`` was given: the scenario's options, the query, and where the answer goes."""

    scenario: ScenarioFlags
    draft_lengths: tuple[int, ...] | None
    query: CapacityQuery
    output: OutputRequest
    #: Answer in clients kept in flight (--closed-loop), for ``target_clients`` in all where given.
    closed_loop: bool = False
    target_clients: int | None = None


@click.command()
@workload_file_option
@calibration_option
@click.option("--slo", "slos", multiple=True, metavar="EXPR",
              help="SLO, repeatable (see sdplan check). "
                   "At least one must bound the rate: e2e, ttft, tpot or utilisation.")
@click.option("-k", "--draft-lengths", "draft_lengths", type=DraftLengths(), metavar="KS",
              help="Draft lengths to evaluate (list or range). Default: the file's, else 1-8.")
@click.option("--target-rate", type=click.FloatRange(min=0), metavar="RPS",
              help="Total request rate to serve, req/s: prints replicas for no SD and the best SD option.")
@click.option("--closed-loop", is_flag=True,
              help="Answer in clients kept in flight (a closed loop: vllm bench serve --max-concurrency, GuideLLM's "
                   "concurrent profile) instead of a request rate: the most clients per replica under the SLOs.")
@click.option("--target-concurrency", type=click.IntRange(min=1), metavar="N",
              help="Total clients to serve at once: prints replicas for no SD and the best SD option (implies "
                   "--closed-loop).")
@click.option("--gpus-per-replica", type=click.IntRange(1, 1_000_000), metavar="N",
              help="GPUs per replica, for GPU counts. "
                   "Default: the file's, else the calibration's tensor parallel size.")
@click.option("--gpu-hour-cost", type=click.FloatRange(0, 1e6), metavar="USD",
              help="Cost of one GPU-hour in USD, for cost per hour and per million output tokens.")
@click.option("--max-batch-size", type=click.IntRange(min=1), metavar="N", hidden=True,
              help="Deprecated alias of --max-num-seqs.")
@click.option("--spec-method", metavar="METHOD",
              help="SD method (vLLM's names): draft_model, eagle, eagle3, mtp or ngram. Default: the calibration's; "
              "another method is refused (its costs differ).")
@click.option("--min-k", type=click.IntRange(0, 64), default=0, show_default=True, metavar="K",
              help="Engine formats: floor on k in every tier (1 keeps SD on; safer for MTP and TensorRT-LLM).")
@click.option("--min-tier-width", type=click.IntRange(1, 1_000_000), default=4, show_default=True, metavar="N",
              help="Engine formats: narrowest batch-size tier (also >= 25% of its start) so k does not flap; "
              "1 keeps the per-size optimum.")
@click.option("--data-parallel-size", type=click.IntRange(1, 100_000), default=1, show_default=True, metavar="N",
              help="vLLM data parallel size the config is for (> 1: vLLM ignores the schedule; warned).")
@click.option("--at-calibrated-speed", is_flag=True,
              help="Size on servers exactly as fast as the calibration's. By default a calibration that measured "
              "its servers' spread (repeat_sd_pct) is sized on servers as much slower as its own speed error "
              "allows (one-sided 95%); this gives that margin up and can buy too few replicas.")
@workload_options
@click.option("--simulate", "use_simulator", is_flag=True,
              help="Find each option's capacity with the simulator (bisection on rate) so percentile SLOs "
              "(e2e:p99<=5s) can be used; slower: many simulations.")
@(lambda fn: simulation_options(fn, requests=4000, seeds=2))
@output_options(formats=("table", "json", *ENGINE_FORMATS))
@plot_options
def capacity(workload_path: str | None, calibration: str | None, slos: tuple[str, ...],
             draft_lengths: tuple[int, ...] | None,
             target_rate: float | None, closed_loop: bool, target_concurrency: int | None,
             gpus_per_replica: int | None, gpu_hour_cost: float | None,
             max_batch_size: int | None, spec_method: str | None, min_k: int, min_tier_width: int,
             data_parallel_size: int, at_calibrated_speed: bool, prompt_tokens: int | None,
             output_tokens: int | None,
             acceptance_alpha: list[float] | None, acceptance_length: list[float] | None,
             draft_acceptance_rate: list[float] | None, acceptance_k: int | None,
             position_acceptance: list[float] | None,
             acceptance_profile: str | None,
             use_simulator: bool, requests: int, seeds: int, seed: int, arrival_cv: float, max_num_seqs: int | None,
             max_num_batched_tokens: int | None, kv_cache_tokens: float | None, lengths_file: str | None,
             fmt: str, output: str | None, ascii_only: bool, plot: bool, plot_file: str | None) -> None:
    """Highest request rate per replica that meets the SLOs, for no SD and each k.

    Inverts the model in closed form (e.g. lambda = (1 - C1/L_SLO)/C2 for a
    mean-latency SLO) per option and reports the binding SLO, the saturation
    and break-even rates. With --target-rate: replicas needed without SD and
    with the best SD option (and GPUs and cost with --gpus-per-replica and
    --gpu-hour-cost). --format vllm-config prints the goodput-optimal k per
    batch size as a vLLM --speculative-config; --format sglang an SGLang
    --speculative-adaptive-config; --format trtllm a TensorRT-LLM
    speculative_config with draft_len_schedule. Engine formats cover the
    engine's max_num_seqs (--max-num-seqs, else the workload file's
    max_batch_size, else the one a served calibration's servers ran with,
    else vLLM's default for the calibration's hardware) and merge narrow
    tiers so k does not flap.

    A calibration that measured how far its server instances lie apart
    ([uncertainty] repeat_sd_pct, sigma, over n instances per configuration)
    is answered on servers u = exp(1.645 sigma/sqrt(n)) times slower than its
    own: the calibration's speed is one draw that every replica inherits. The
    caveat gives u and the answer at the calibration's speed;
    --at-calibrated-speed answers there instead.

    --closed-loop answers in clients kept in flight instead (a closed loop,
    priced as plan --concurrency prices it): the most clients per replica
    under the SLOs, and with --target-concurrency the replicas for that
    many.

    \b
    Examples:
      sdplan capacity --slo 'e2e:mean<=4s' --acceptance 0.8
      sdplan capacity -w chat.toml --target-rate 120 --gpu-hour-cost 2.5
      sdplan capacity --slo 'tpot:mean<=20ms' --target-concurrency 500
      sdplan capacity --slo 'tpot:mean<=20ms' --format vllm-config
      sdplan capacity -c h100-sxm_llama-3.1-8b_eagle3_derived --acceptance 0.7 \\
                      -f sglang -o spec.json
    """
    from sdplan.planning.capacity_answer import CapacityQuery
    from sdplan.planning.simulation_inputs import SimulationSettings

    _capacity(CapacityRequest(
        scenario=ScenarioFlags(
            calibration=calibration, workload_path=workload_path, prompt_tokens=prompt_tokens,
            output_tokens=output_tokens, acceptance_alpha=acceptance_alpha, acceptance_length=acceptance_length,
            draft_acceptance_rate=draft_acceptance_rate, acceptance_k=acceptance_k,
            position_acceptance=position_acceptance, acceptance_profile=acceptance_profile, spec_method=spec_method,
            # --max-batch-size: the old alias of --max-num-seqs, which it replaces when given
            max_num_seqs=max_batch_size if max_batch_size is not None else max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, kv_cache_tokens=kv_cache_tokens,
            lengths_file=lengths_file),
        draft_lengths=draft_lengths,
        closed_loop=closed_loop or target_concurrency is not None,
        target_clients=target_concurrency,
        query=CapacityQuery(
            slos=slos, target_rate_rps=target_rate, gpus_per_replica=gpus_per_replica, gpu_hour_cost_usd=gpu_hour_cost,
            min_k=min_k, min_tier_width=min_tier_width, data_parallel_size=data_parallel_size,
            use_simulator=use_simulator, at_calibrated_speed=at_calibrated_speed,
            simulation=SimulationSettings(requests=requests, seeds=seeds, seed=seed, arrival_cv=arrival_cv)),
        output=OutputRequest(fmt=fmt, output=output, ascii_only=ascii_only, plot=plot, plot_file=plot_file)))


def _capacity(request: CapacityRequest) -> None:
    """Parse, answer, render: the capacity table (text or JSON), or an engine's configuration."""
    from sdplan.planning.capacity_answer import NO_OPTION_MEETS, answer_capacity, engine_config_answer
    from sdplan.planning.client_capacity import asks_for_clients
    from sdplan.render import OutputFormat, Style, emit, say, stdout_is_terminal, warn
    from sdplan.render.check import capacity_interval_note, capacity_plots, engine_config_summary, render_capacity

    out = request.output
    check_plot_request(out.plot, out.plot_file, out.fmt)
    scenario = command_scenario(request.scenario, request.draft_lengths)
    if asks_for_clients(scenario, request.closed_loop, request.query.target_rate_rps,
                        out.fmt if out.fmt in ENGINE_FORMATS else None):
        _client_capacity(request, scenario)
        return
    if out.fmt in ENGINE_FORMATS:
        config = engine_config_answer(scenario, request.query, out.fmt)
        if config.config is not None:
            warn(config.warnings)
            emit(config.config.text, out.output)
        say(engine_config_summary(config))
        return
    with ExitStack() as bars:
        answer = answer_capacity(scenario, request.query, progress=progress_reporter(bars, "simulating capacity"))
    warn(answer.warnings)
    note = capacity_interval_note(answer)
    if note is not None:
        say(note)
    terminal = out.output in (None, "-") and stdout_is_terminal()
    text = render_capacity(answer, OutputFormat(out.fmt), Style(ascii=out.ascii_only), terminal)
    emit(text + capacity_plots(answer, out.plot, out.plot_file, *terminal_plot_settings(out.ascii_only)), out.output)
    if not answer.feasible:
        raise InfeasibleError(NO_OPTION_MEETS)


def _client_capacity(request: CapacityRequest, scenario: Scenario) -> None:
    """``--closed-loop``: the most clients per replica under the SLOs, and the fleet for a target concurrency."""
    from sdplan.planning.client_capacity import answer_client_capacity, refuse_with_closed_loop
    from sdplan.render import OutputFormat, Style, emit, stdout_is_terminal, warn
    from sdplan.render.client_capacity import client_capacity_plots, render_client_capacity

    out, query = request.output, request.query
    refuse_with_closed_loop(engine_format=out.fmt if out.fmt in ENGINE_FORMATS else None,
                            target_rate=query.target_rate_rps, simulate=query.use_simulator)
    answer = answer_client_capacity(scenario, query.slos, request.target_clients, query.gpus_per_replica,
                                    query.gpu_hour_cost_usd, query.at_calibrated_speed)
    warn(answer.warnings)
    terminal = out.output in (None, "-") and stdout_is_terminal()
    text = render_client_capacity(answer, OutputFormat(out.fmt), Style(ascii=out.ascii_only), terminal)
    emit(text + client_capacity_plots(answer, out.plot, out.plot_file, *terminal_plot_settings(out.ascii_only)),
         out.output)
    if not answer.feasible:
        raise InfeasibleError("no option meets the SLOs with any number of clients (see the binding SLO per option)")
