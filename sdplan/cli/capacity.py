"""``sdplan capacity``: highest request rate under SLOs per draft length, replicas, k schedule."""

from __future__ import annotations

import click

from sdplan.cli._inputs import candidate_lengths, resolve_inputs, workload_file_option
from sdplan.cli._options import calibration_option, option_given, output_options, plot_options, workload_options
from sdplan.cli._simulation import simulation_options
from sdplan.workload import measured_draft_lengths


@click.command()
@workload_file_option
@calibration_option
@click.option("--slo", "slos", multiple=True, metavar="EXPR",
              help="SLO, repeatable (see sdplan check). At least one must bound the rate: e2e, ttft, tpot or utilisation.")
@click.option("-k", "--draft-lengths", "draft_lengths", metavar="KS",
              help="Draft lengths to evaluate (list or range). Default: the file's, else 1-8.")
@click.option("--target-rate", type=click.FloatRange(min=0), metavar="RPS",
              help="Total request rate to serve, req/s: prints replicas for no SD and the best SD option.")
@click.option("--gpus-per-replica", type=click.IntRange(1, 1_000_000), metavar="N",
              help="GPUs per replica, for GPU counts. Default: the file's, else the calibration's tensor parallel size.")
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
             draft_acceptance_rate: list[float] | None, acceptance_k: int | None, position_acceptance: list[float] | None,
             use_simulator: bool, requests: int, seeds: int, seed: int, arrival_cv: float, max_num_seqs: int,
             max_num_batched_tokens: int, kv_cache_tokens: float | None, lengths_file: str | None,
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
    engine's max_num_seqs (--max-num-seqs, else the one a served
    calibration's servers ran with, else vLLM's default for the
    calibration's hardware) and merge narrow tiers so k does not flap.

    \b
    Examples:
      sdplan capacity --slo 'e2e:mean<=4s' --acceptance 0.8
      sdplan capacity -w chat.toml --target-rate 120 --gpu-hour-cost 2.5
      sdplan capacity --slo 'tpot:mean<=20ms' --format vllm-config
      sdplan capacity -c h100-sxm_llama-3.1-8b_eagle3_derived --acceptance 0.7 \\
                      -f sglang -o spec.json
    """
    from sdplan.capacity import capacity as solve_capacity
    from sdplan.capacity import batch_cap_label, fleet
    from sdplan.errors import InfeasibleError, InvalidValueError
    from sdplan.render import OutputFormat, Style, emit, stdout_is_terminal
    from sdplan.methods import resolve_method
    from sdplan.render.check import capacity_document, render_capacity
    from sdplan.schedule import engine_max_num_seqs, engine_schedule, goodput_per_size
    from sdplan.workload import resolve_slos

    from sdplan.cli._options import check_plot_request, terminal_plot_settings

    from sdplan.cli._simulation import (echo_warnings, engine_batch_cap, histogram_means, read_lengths,
                                       smallest_served_kv_cache)

    check_plot_request(plot, plot_file, fmt)
    lengths = read_lengths(lengths_file) if lengths_file else None
    prompt_tokens, output_tokens = histogram_means(lengths, prompt_tokens, output_tokens)
    inputs = resolve_inputs(workload_path, calibration, prompt_tokens, output_tokens, acceptance_alpha,
                            acceptance_length, draft_acceptance_rate, acceptance_k, position_acceptance)
    file = inputs.file
    method = resolve_method(spec_method, inputs.calibration)
    candidates, lengths_note = measured_draft_lengths(
        inputs.workload.acceptance, candidate_lengths(draft_lengths, file),
        given=draft_lengths is not None or (file is not None and file.draft_lengths is not None))
    alpha = inputs.workload.acceptance.alphas[0]
    coefficients = inputs.calibration.coefficients_at(inputs.workload.prompt_tokens, inputs.workload.output_tokens)
    # one batch cap, vLLM's max_num_seqs: the simulator's and the k schedule's (--max-batch-size: old alias)
    given = option_given("max_num_seqs")
    served = inputs.calibration.served_batch_cap()  # the max_num_seqs a served calibration's servers ran with
    max_batch = (max_batch_size or (max_num_seqs if given else None)
                 or (file.max_batch_size if file and file.max_batch_size else None)
                 or (served[0] if served else None) or max_num_seqs)
    # the k schedule covers the engine's own max_num_seqs unless one is given (vLLM 0.33: 1024 on H100/H200/B200)
    schedule_cap = ((max_batch if (max_batch_size or given or (file and file.max_batch_size) or served) else None)
                    or engine_max_num_seqs(str(inputs.calibration.provenance.get("hardware", ""))))
    max_num_seqs = max_batch
    tokens = inputs.workload.acceptance.tokens_per_cycle(candidates)[0]
    from sdplan.limits import check_grid

    check_grid(schedule_cap * len(candidates), f"{schedule_cap} batch sizes x {len(candidates)} draft lengths",
               "lower --max-num-seqs or give fewer --draft-lengths")
    if min_k > max(candidates):
        raise InvalidValueError(f"--min-k {min_k} exceeds every draft length ({max(candidates)} at most)")
    moe = inputs.calibration.moe_at(inputs.workload.prompt_tokens, inputs.workload.output_tokens)
    goodput = goodput_per_size(coefficients, candidates, alpha, schedule_cap, tokens_per_cycle=tokens, moe=moe)
    plan = engine_schedule(goodput, candidates, min_tier_width=min_tier_width, min_k=min_k)
    if fmt in ("vllm-config", "sglang", "trtllm"):
        _export(fmt, plan, method, inputs.calibration, data_parallel_size, output)
        return
    schedule = plan.tiers
    if moe is not None:
        raise InvalidValueError("capacity is not available for MoE calibrations yet: expert coverage makes C1, C2 "
                                "depend on the load, so the closed-form inverse does not hold; use plan or check")
    parsed = resolve_slos(slos, file, allow_percentiles=use_simulator)
    if not parsed:
        raise InvalidValueError("capacity needs SLOs; give --slo (e.g. --slo 'e2e:mean<=4s') or slos in the workload")
    p, g = inputs.workload.prompt_tokens, inputs.workload.output_tokens
    kv_cache_tokens, kv_source = smallest_served_kv_cache(kv_cache_tokens, inputs.calibration, candidates)
    batch_cap, cap_source = engine_batch_cap(min(max_num_seqs, max_batch), kv_cache_tokens, p, g, kv_source)
    cap = solve_capacity(coefficients, candidates, alpha, parsed, tokens_per_cycle=tokens, max_batch=batch_cap)
    if use_simulator:
        cap = _simulated_capacity(cap, coefficients, candidates, inputs.workload, parsed, requests, seeds, seed,
                                  arrival_cv, max_num_seqs, max_num_batched_tokens, kv_cache_tokens, lengths)
    import numpy as np

    from sdplan import model

    at_capacity = cap.max_rate_rps * model.mean_latency(cap.c1_s, cap.c2_s, cap.max_rate_rps)
    finite = at_capacity[np.isfinite(at_capacity) & cap.feasible]
    warnings = inputs.calibration.validity_warnings(p, g, float(finite.max()) if finite.size else None)
    if not use_simulator:
        interference = model.prefill_interference_warning(coefficients.c2p_s, cap.c2_s[cap.feasible],
                                                          (cap.max_rate_rps * cap.c2_s)[cap.feasible])
        if interference is not None:
            warnings.append(interference)
    if any(binding == batch_cap_label(batch_cap) for binding in cap.binding_slo):
        warnings.append(f"capacity is limited by the batch cap of {batch_cap:g} sequences ({cap_source}) for some "
                        "options: the mean model is outside its regime beyond it (check with --simulate)")
    warnings += [lengths_note] if lengths_note else []
    echo_warnings(warnings)
    target = target_rate if target_rate is not None else (file.target_rate_rps if file else None)
    gpus = gpus_per_replica or (file.gpus_per_replica if file else None) or \
        inputs.calibration.provenance.get("tensor_parallel_size")
    cost = gpu_hour_cost if gpu_hour_cost is not None else (file.gpu_hour_cost_usd if file else None)
    fleets = None
    if target is not None:
        g = coefficients.output_tokens
        no_sd = fleet("off", float(cap.max_rate_rps[0]), target, g, gpus, cost)
        best_sd = cap.best_speculative
        with_sd = (fleet(cap.label(best_sd), float(cap.max_rate_rps[best_sd]), target, g, gpus, cost)
                   if best_sd > 0 else None)
        fleets = (no_sd, with_sd)
    context = inputs.context()
    context["speculative_method"] = method
    context["warnings"] = warnings
    context["batch_cap_sequences"] = batch_cap
    context["evaluated_by"] = (f"simulated: bisection on rate, {seeds} x {requests} requests per point"
                               if use_simulator else "analytic model (means), closed-form inverse")
    if not use_simulator:
        from sdplan.uncertainty import capacity_intervals, coefficient_draws

        draws = coefficient_draws(inputs.calibration, p, g, options=(candidates, tokens))
        if draws is not None:
            bounds = capacity_intervals(draws, lambda c: solve_capacity(c, candidates, alpha, parsed,
                                                                        tokens_per_cycle=tokens,
                                                                        max_batch=batch_cap))
            context["max_rate_under_slo_ci95_rps"] = {
                cap.label(i): [float(bounds[0, i]), float(bounds[1, i])] for i in range(bounds.shape[1])}
            context["uncertainty"] = ("95% intervals of each option's capacity from the calibration's covariance "
                                      f"({len(draws)} draws); size with the low end to be safe")
            best = cap.best
            if best >= 0:
                click.echo(f"capacity of {cap.label(best)}: {float(cap.max_rate_rps[best]):.4g} req/s per replica, "
                           f"95% interval {float(bounds[0, best]):.4g}-{float(bounds[1, best]):.4g} (fit uncertainty)",
                           err=True)
    document = capacity_document(cap, parsed, context, target, fleets, schedule)
    terminal = output in (None, "-") and stdout_is_terminal()
    text = render_capacity(document, OutputFormat(fmt), Style(ascii=ascii_only), terminal)
    labels = [option["option"] for option in document["options"]]
    values = [option["max_rate_under_slo_rps"] for option in document["options"]]
    from sdplan.render.answer import alpha_phrase

    title = (f"Highest request rate under {', '.join(document['slos'])} per replica, "
             f"{alpha_phrase(alpha, inputs.workload.acceptance.source)}")
    if plot:
        from sdplan.render.plots import terminal_bars

        text += "\n" + terminal_bars(labels, values, title, "request rate (req/s)", *terminal_plot_settings(ascii_only))
    if plot_file is not None:
        from pathlib import Path

        from sdplan.render.plots import file_bars

        file_bars(labels, values, title + f"\n{inputs.calibration.name}", "max request rate under SLO (req/s)",
                  Path(plot_file), highlight=document["best"])
    emit(text, output)
    if cap.best < 0:
        raise InfeasibleError("no option meets the SLOs at any request rate (see the binding SLO per option)")


def _export(fmt: str, plan, method: str, calibration, data_parallel_size: int,  # type: ignore[no-untyped-def]
            output: str | None) -> None:
    """Write the engine config of ``plan`` (or say "SD off" and write nothing)."""
    from sdplan import export
    from sdplan.cli._simulation import echo_warnings
    from sdplan.methods import METHODS, draft_weights
    from sdplan.render import emit

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
    echo_warnings(config.warnings + notes)
    emit(config.text, output)
    click.echo(f"sdplan capacity: {METHODS[method].label} ({method}), k by batch size 1-{plan.max_num_seqs}: "
               + ", ".join(f"{a}-{b}: {k}" for a, b, k in plan.tiers) + f"\nuse: {config.usage}", err=True)


def _simulated_capacity(cap, coefficients, candidates, workload, slos, requests, seeds, seed, arrival_cv,
                        max_num_seqs, max_num_batched_tokens, kv_cache_tokens, lengths):  # type: ignore[no-untyped-def]
    """Per option, the highest rate whose simulated statistics meet every SLO (see capacity.simulated_capacity)."""
    from sdplan.capacity import simulated_capacity
    from sdplan.cli._simulation import build_config
    from sdplan.render import progress_bar

    def configure(rate: float, k: int):  # type: ignore[no-untyped-def]
        return build_config(rate, k, workload.acceptance, workload.prompt_tokens, workload.output_tokens, requests,
                            arrival_cv, max_num_seqs, max_num_batched_tokens, kv_cache_tokens, lengths, seed)

    options = len(candidates) + 1
    from sdplan.limits import check_simulation

    check_simulation(requests, seeds, options * 12, "search steps (about 12 per option)")
    with progress_bar("simulating capacity", options) as advance:
        def progress(index: int, rate: float) -> None:
            advance(index, options, f"{cap.label(index)} at {rate:.3g} req/s")

        result, _ = simulated_capacity(cap, coefficients, slos, configure, seeds, seed, on_evaluation=progress)
    return result
