"""``sdplan capacity``: highest request rate under SLOs per draft length, replicas, k schedule."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sdplan.cli._inputs import ScenarioFlags, command_scenario, draft_lengths_given, workload_file_option
from sdplan.cli._options import (
    OutputRequest,
    calibration_option,
    check_plot_request,
    output_options,
    plot_options,
    terminal_plot_settings,
    workload_options,
)
from sdplan.cli._simulation import simulation_options
from sdplan.errors import InfeasibleError, InvalidValueError
from sdplan.limits import check_grid, check_simulation
from sdplan.methods import METHODS, draft_weights
from sdplan.serving import batch_cap_warning

if TYPE_CHECKING:
    from sdplan.calibration import Calibration
    from sdplan.capacity import Capacity
    from sdplan.scenario import Scenario, SimulationSettings
    from sdplan.schedule import EngineSchedule
    from sdplan.simulate import SimulationConfig
    from sdplan.slo import SLO


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityRequest:
    """What ``sdplan capacity`` was given (``--max-batch-size``, the old alias, folded into ``--max-num-seqs``)."""

    scenario: ScenarioFlags
    slos: tuple[str, ...]
    draft_lengths: str | None
    target_rate: float | None
    gpus_per_replica: int | None
    gpu_hour_cost: float | None
    min_k: int
    min_tier_width: int
    data_parallel_size: int
    use_simulator: bool
    simulation: SimulationSettings
    output: OutputRequest


@click.command()
@workload_file_option
@calibration_option
@click.option("--slo", "slos", multiple=True, metavar="EXPR",
              help="SLO, repeatable (see sdplan check). "
                   "At least one must bound the rate: e2e, ttft, tpot or utilisation.")
@click.option("-k", "--draft-lengths", "draft_lengths", metavar="KS",
              help="Draft lengths to evaluate (list or range). Default: the file's, else 1-8.")
@click.option("--target-rate", type=click.FloatRange(min=0), metavar="RPS",
              help="Total request rate to serve, req/s: prints replicas for no SD and the best SD option.")
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
@workload_options
@click.option("--simulate", "use_simulator", is_flag=True,
              help="Find each option's capacity with the simulator (bisection on rate) so percentile SLOs "
              "(e2e:p99<=5s) can be used; slower: many simulations.")
@(lambda fn: simulation_options(fn, requests=4000, seeds=2))
@output_options(formats=("table", "json", "vllm-config", "sglang", "trtllm"))
@plot_options
def capacity(workload_path: str | None, calibration: str | None, slos: tuple[str, ...], draft_lengths: str | None,
             target_rate: float | None, gpus_per_replica: int | None, gpu_hour_cost: float | None,
             max_batch_size: int | None, spec_method: str | None, min_k: int, min_tier_width: int,
             data_parallel_size: int, prompt_tokens: int | None, output_tokens: int | None,
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

    \b
    Examples:
      sdplan capacity --slo 'e2e:mean<=4s' --acceptance 0.8
      sdplan capacity -w chat.toml --target-rate 120 --gpu-hour-cost 2.5
      sdplan capacity --slo 'tpot:mean<=20ms' --format vllm-config
      sdplan capacity -c h100-sxm_llama-3.1-8b_eagle3_derived --acceptance 0.7 \\
                      -f sglang -o spec.json
    """
    from sdplan.scenario import SimulationSettings

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
        slos=slos, draft_lengths=draft_lengths, target_rate=target_rate, gpus_per_replica=gpus_per_replica,
        gpu_hour_cost=gpu_hour_cost, min_k=min_k, min_tier_width=min_tier_width,
        data_parallel_size=data_parallel_size, use_simulator=use_simulator,
        simulation=SimulationSettings(requests=requests, seeds=seeds, seed=seed, arrival_cv=arrival_cv),
        output=OutputRequest(fmt=fmt, output=output, ascii_only=ascii_only, plot=plot, plot_file=plot_file)))


def _capacity(request: CapacityRequest) -> None:
    from sdplan.capacity import capacity as solve_capacity
    from sdplan.render import OutputFormat, Style, emit, stdout_is_terminal, warn
    from sdplan.render.check import capacity_document, render_capacity
    from sdplan.workload import resolve_slos

    out, use_simulator, simulation = request.output, request.use_simulator, request.simulation
    fmt, output, ascii_only = out.fmt, out.output, out.ascii_only
    check_plot_request(out.plot, out.plot_file, fmt)
    scenario = command_scenario(request.scenario, draft_lengths_given(request.draft_lengths))
    candidates, limits, file = scenario.draft_lengths, scenario.limits, scenario.file
    schedule = _schedule(scenario, request.min_k, request.min_tier_width)
    if fmt in ("vllm-config", "sglang", "trtllm"):
        _export(fmt, schedule, scenario.method, scenario.calibration, request.data_parallel_size, output)
        return
    if scenario.moe is not None:
        raise InvalidValueError("capacity is not available for MoE calibrations yet: expert coverage makes C1, C2 "
                                "depend on the load, so the closed-form inverse does not hold; use plan or check")
    parsed = resolve_slos(request.slos, file, allow_percentiles=use_simulator)
    if not parsed:
        raise InvalidValueError("capacity needs SLOs; give --slo (e.g. --slo 'e2e:mean<=4s') or slos in the workload")
    limits.require_fit(scenario.request_tokens)
    tokens = scenario.tokens_per_cycle[0]
    cap = solve_capacity(scenario.coefficients, candidates, scenario.alpha, parsed, tokens_per_cycle=tokens,
                         max_batch=limits.caps(candidates))
    if use_simulator:
        cap = _simulated_capacity(scenario, cap, parsed, simulation)
    warnings = _warnings(scenario, cap, use_simulator)
    warn(warnings)
    context = scenario.context()
    context["speculative_method"] = scenario.method
    context["warnings"] = warnings
    context["batch_cap_sequences"] = float(limits.batch_cap)
    context["evaluated_by"] = (f"simulated: bisection on rate, {simulation.seeds} x {simulation.requests} requests "
                               "per point"
                               if use_simulator else "analytic model (means), closed-form inverse")
    if not use_simulator:
        context.update(_intervals(scenario, cap, parsed))
    target = request.target_rate if request.target_rate is not None else (file.target_rate_rps if file else None)
    fleets = _fleets(scenario, cap, target, request.gpus_per_replica, request.gpu_hour_cost)
    document = capacity_document(cap, parsed, context, target, fleets, schedule.tiers)
    terminal = output in (None, "-") and stdout_is_terminal()
    text = render_capacity(document, OutputFormat(fmt), Style(ascii=ascii_only), terminal)
    emit(text + _plots(scenario, document, out.plot, out.plot_file, ascii_only), output)
    if cap.best < 0:
        raise InfeasibleError("no option meets the SLOs at any request rate (see the binding SLO per option)")


def _schedule(scenario: Scenario, min_k: int, min_tier_width: int) -> EngineSchedule:
    """The goodput-optimal k per batch size 1..max_num_seqs, merged so k does not flap."""
    from sdplan.schedule import engine_schedule, goodput_per_size

    candidates, cap = scenario.draft_lengths, scenario.limits.max_num_seqs
    check_grid(cap * len(candidates), f"{cap} batch sizes x {len(candidates)} draft lengths",
               "lower --max-num-seqs or give fewer --draft-lengths")
    if min_k > max(candidates):
        raise InvalidValueError(f"--min-k {min_k} exceeds every draft length ({max(candidates)} at most)")
    goodput = goodput_per_size(scenario.coefficients, candidates, scenario.alpha, cap,
                               tokens_per_cycle=scenario.tokens_per_cycle[0], moe=scenario.moe)
    return engine_schedule(goodput, candidates, min_tier_width=min_tier_width, min_k=min_k)


def _warnings(scenario: Scenario, cap: Capacity, use_simulator: bool) -> list[str]:
    """Calibrated range, prefill interference at capacity, and options whose capacity the batch cap sets."""
    import numpy as np

    from sdplan import model
    from sdplan.capacity import batch_cap_label, latency_at

    at_capacity = cap.max_rate_rps * latency_at(cap, cap.max_rate_rps)
    finite = at_capacity[np.isfinite(at_capacity) & cap.feasible]
    warnings = scenario.calibration.validity_warnings(scenario.workload.prompt_tokens,
                                                      scenario.workload.output_tokens,
                                                      float(finite.max()) if finite.size else None)
    if not use_simulator:
        interference = model.prefill_interference_warning(scenario.coefficients.c2p_s, cap.c2_s[cap.feasible],
                                                          (cap.max_rate_rps * cap.c2_s)[cap.feasible])
        if interference is not None:
            warnings.append(interference)
    label = batch_cap_label(scenario.limits.batch_cap)
    capped = [cap.label(index) for index, binding in enumerate(cap.binding_slo) if binding == label]
    if capped:  # the batch reaches the cap at those options' capacity
        warnings.append(batch_cap_warning(scenario.limits, f"at the capacity of {', '.join(capped)}"))
    return warnings + scenario.notes()


def _intervals(scenario: Scenario, cap: Capacity, slos: list[SLO]) -> dict[str, Any]:
    """95% intervals of each option's capacity from the calibration's covariance (none without one)."""
    from sdplan.capacity import capacity as solve_capacity
    from sdplan.uncertainty import capacity_intervals, coefficient_draws, covers, server_spread_pct

    workload, candidates, tokens = scenario.workload, scenario.draft_lengths, scenario.tokens_per_cycle[0]
    draws = coefficient_draws(scenario.calibration, workload.prompt_tokens, workload.output_tokens,
                              options=(candidates, tokens))
    if draws is None:
        return {}
    bounds = capacity_intervals(draws, lambda c: solve_capacity(c, candidates, scenario.alpha, slos,
                                                                tokens_per_cycle=tokens,
                                                                max_batch=scenario.limits.caps(candidates)))
    best, spread = cap.best, server_spread_pct(scenario.calibration)
    if best >= 0:
        click.echo(f"capacity of {cap.label(best)}: {float(cap.max_rate_rps[best]):.4g} req/s per replica, "
                   f"95% interval {float(bounds[0, best]):.4g}-{float(bounds[1, best]):.4g}\n  ({covers(spread)})",
                   err=True)
    return {"max_rate_under_slo_ci95_rps": {cap.label(i): [float(bounds[0, i]), float(bounds[1, i])]
                                            for i in range(bounds.shape[1])},
            "server_sd_pct": spread,
            "uncertainty": (f"95% intervals of each option's capacity ({covers(spread)}; {len(draws)} draws); "
                            "size with the low end to be safe")}


def _fleets(scenario: Scenario, cap: Capacity, target: float | None, gpus_per_replica: int | None,
            gpu_hour_cost: float | None) -> tuple[Any, Any] | None:
    """Replicas (GPUs, cost) for ``target`` req/s without SD and with the best SD option; None without a target."""
    from sdplan.capacity import fleet

    if target is None:
        return None
    file = scenario.file
    gpus = gpus_per_replica or (file.gpus_per_replica if file else None) or \
        scenario.calibration.provenance.get("tensor_parallel_size")
    cost = gpu_hour_cost if gpu_hour_cost is not None else (file.gpu_hour_cost_usd if file else None)
    g = scenario.coefficients.output_tokens
    no_sd = fleet("off", float(cap.max_rate_rps[0]), target, g, gpus, cost)
    best_sd = cap.best_speculative
    with_sd = (fleet(cap.label(best_sd), float(cap.max_rate_rps[best_sd]), target, g, gpus, cost)
               if best_sd > 0 else None)
    return no_sd, with_sd


def _plots(scenario: Scenario, document: dict[str, Any], plot: bool, plot_file: str | None, ascii_only: bool) -> str:
    """Each option's capacity as bars: drawn for the terminal (returned) and/or written to ``plot_file``."""
    from sdplan.render.answer import alpha_phrase
    from sdplan.render.plots import file_bars, terminal_bars

    labels = [option["option"] for option in document["options"]]
    values = [option["max_rate_under_slo_rps"] for option in document["options"]]
    title = (f"Highest request rate under {', '.join(document['slos'])} per replica, "
             f"{alpha_phrase(scenario.alpha, scenario.workload.acceptance.source)}")
    text = ""
    if plot:
        text = "\n" + terminal_bars(labels, values, title, "request rate (req/s)", *terminal_plot_settings(ascii_only))
    if plot_file is not None:
        file_bars(labels, values, title + f"\n{scenario.calibration.name}", "max request rate under SLO (req/s)",
                  Path(plot_file), highlight=document["best"])
    return text


def _export(fmt: str, plan: EngineSchedule, method: str, calibration: Calibration, data_parallel_size: int,
            output: str | None) -> None:
    """Write the engine config of ``plan`` (or say "SD off" and write nothing)."""
    from sdplan import export
    from sdplan.render import emit, warn

    if plan.off:
        click.echo(f"sdplan capacity: SD off: {METHODS[method].label} does not beat no SD at any batch size "
                   f"1-{plan.max_num_seqs} at this acceptance; serve without a speculative config (nothing written)",
                   err=True)
        return
    weights = draft_weights(method, calibration)
    if fmt == "vllm-config":
        config = export.vllm_config(plan, method, weights, data_parallel_size,
                                    calibration.provenance.get("tensor_parallel_size"))
    elif fmt == "sglang":
        config = export.sglang_config(plan, method, weights)
    else:
        config = export.trtllm_config(plan, method, weights)
    notes = []
    if plan.merged:
        notes.append(f"merged {plan.merged} tier(s) narrower than --min-tier-width so k does not flap at tier "
                     f"edges (vllm-project/vllm#49548); goodput within {plan.goodput_loss_pct:.2g}% of the per-size "
                     "optimum")
    elif plan.goodput_loss_pct > 0:
        notes.append(f"--min-k costs up to {plan.goodput_loss_pct:.2g}% goodput at some batch sizes")
    warn(config.warnings + notes)
    emit(config.text, output)
    click.echo(f"sdplan capacity: {METHODS[method].label} ({method}), k by batch size 1-{plan.max_num_seqs}: "
               + ", ".join(f"{a}-{b}: {k}" for a, b, k in plan.tiers) + f"\nuse: {config.usage}", err=True)


def _simulated_capacity(scenario: Scenario, cap: Capacity, slos: list[SLO],
                        settings: SimulationSettings) -> Capacity:
    """Per option, the highest rate whose simulated statistics meet every SLO (see capacity.simulated_capacity)."""
    from sdplan.capacity import simulated_capacity
    from sdplan.render.progress import progress_bar
    from sdplan.scenario import simulation_config

    def configure(rate: float, k: int) -> SimulationConfig:
        return simulation_config(scenario, rate, k, scenario.limits, settings)

    options = len(scenario.draft_lengths) + 1
    check_simulation(settings.requests, settings.seeds, options * 12, "search steps (about 12 per option)")
    with progress_bar("simulating capacity", options) as advance:
        def progress(index: int, rate: float) -> None:
            advance(index, options, f"{cap.label(index)} at {rate:.3g} req/s")

        result, _ = simulated_capacity(cap, scenario.coefficients, slos, configure, settings.seeds, settings.seed,
                                       on_evaluation=progress)
    return result
