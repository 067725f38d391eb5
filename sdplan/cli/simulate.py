"""``sdplan simulate``: tails and queueing from a discrete-event simulation of one replica."""

from __future__ import annotations

import click

from sdplan.cli._options import (
    calibration_option,
    draft_choice_callback,
    output_options,
    plot_options,
    workload_options,
)
from sdplan.cli._simulation import simulation_options


@click.command()
@calibration_option
@workload_options
@click.option("-r", "--rates", metavar="RATES",
              help="Request rates in req/s (list or START:STOP:STEP). Default: 25%, 50%, 75% and 90% of the "
              "no-SD saturation rate.")
@click.option("--draft-length", "draft_length", default="best", show_default=True, callback=draft_choice_callback,
              metavar="K|best|off|goodput", help="Draft length: a number, off, best (the model's best static k per "
              "rate), or goodput (SmartSpec-style: k chosen every step by E(k)/step time at the current batch).")
@click.option("-k", "--draft-lengths", "draft_lengths", default="1-8", show_default=True, metavar="KS",
              help="Candidates for best.")
@simulation_options
@output_options()
@plot_options
def simulate(calibration: str | None, prompt_tokens: int | None, output_tokens: int | None,
             acceptance_alpha: list[float] | None, acceptance_length: list[float] | None,
             draft_acceptance_rate: list[float] | None, acceptance_k: int | None,
             position_acceptance: list[float] | None, rates: str | None, draft_length: str, draft_lengths: str,
             requests: int, seeds: int, seed: int, arrival_cv: float, max_num_seqs: int, max_num_batched_tokens: int,
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
    import numpy as np

    from sdplan import planner
    from sdplan.calibration import resolve_calibration
    from sdplan.cli._options import (check_plot_request, option_given, parse_int_list, parse_number_list,
                                     terminal_plot_settings)
    from sdplan.cli._simulation import (build_config, calibrated_kv_cache_tokens, calibrated_max_num_seqs,
                                       histogram_means, read_lengths)
    from sdplan.errors import InvalidValueError
    from sdplan.render import OutputFormat, Style, emit, progress_bar, stdout_is_terminal
    from sdplan.render.simulate import render_simulate, simulate_document
    from sdplan.simulate import replicate
    from sdplan.workload import measured_draft_lengths, resolve_workload

    check_plot_request(plot, plot_file, fmt)
    lengths = read_lengths(lengths_file) if lengths_file else None
    cal = resolve_calibration(calibration)
    prompt_tokens, output_tokens = histogram_means(lengths, prompt_tokens, output_tokens)
    workload = resolve_workload(cal, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                                alpha=acceptance_alpha, mean_length=acceptance_length,
                                draft_rate=draft_acceptance_rate, measured_at_k=acceptance_k,
                                position_rates=position_acceptance)
    if len(workload.acceptance.alphas) != 1:
        raise InvalidValueError("simulate takes a single acceptance value")
    if cal.moe_at(workload.prompt_tokens, workload.output_tokens) is not None:
        raise InvalidValueError("simulate does not model MoE expert coverage yet; use plan for MoE calibrations")
    coefficients = cal.coefficients_at(workload.prompt_tokens, workload.output_tokens)
    max_num_seqs = calibrated_max_num_seqs(max_num_seqs, cal)
    candidates = sorted({k for k in parse_int_list(draft_lengths, "draft lengths") if k > 0}) or [1]
    if draft_length not in ("best", "off", "goodput"):
        candidates = [int(draft_length)]
    candidates, lengths_note = measured_draft_lengths(
        workload.acceptance, candidates, given=option_given("draft_lengths") or len(candidates) == 1)
    tokens = workload.acceptance.tokens_per_cycle(candidates)
    if rates is None:
        from sdplan import model

        _, c2_d = model.baseline_demand(coefficients)
        rate_list = [round(f / c2_d, 4) for f in (0.25, 0.5, 0.75, 0.9)]
    else:
        rate_list = sorted(set(parse_number_list(rates, "request rates in req/s")))
        if any(r <= 0 for r in rate_list):
            raise click.BadParameter("simulated rates must be > 0 req/s", param_hint="'--rates'")
    from sdplan.limits import check_simulation, check_table

    check_simulation(requests, seeds, len(rate_list), "rates")
    if fmt == "table":
        check_table(1, len(rate_list), "give fewer --rates")
    result = planner.plan(coefficients, rate_list, candidates, workload.acceptance.alphas, tokens_per_cycle=tokens)
    summaries, kv_used = [], []
    with progress_bar("simulating", len(rate_list) * seeds * requests) as advance:
        done = 0
        for ir, rate in enumerate(rate_list):
            if draft_length == "off":
                k = 0
            elif draft_length in ("best", "goodput"):
                best = int(result.best_k[0, ir])
                k = best if best > 0 else 0
            else:
                k = int(draft_length)
            analytic = float(result.baseline_latency_s[ir] if k == 0 else result.latency_s[0, ir, candidates.index(k)])
            # the KV cache of the calibrated server that runs this draft length (the longest, for goodput)
            kv = calibrated_kv_cache_tokens(kv_cache_tokens, cal, max(candidates) if draft_length == "goodput"
                                            else k)
            config = build_config(rate, k, workload.acceptance, workload.prompt_tokens, workload.output_tokens,
                                  requests, arrival_cv, max_num_seqs, max_num_batched_tokens, kv[0], lengths, seed)
            if draft_length == "goodput":
                from dataclasses import replace

                longest = max(candidates)
                config = replace(build_config(rate, longest, workload.acceptance, workload.prompt_tokens,
                                              workload.output_tokens, requests, arrival_cv, max_num_seqs,
                                              max_num_batched_tokens, kv[0], lengths, seed),
                                 adaptive_draft_lengths=(0, *candidates))
            kv_used.append(kv)

            def progress(completed: int, total: int, base: int = done) -> None:
                advance(base + completed, len(rate_list) * seeds * requests, f"{rate:g} req/s")

            summary = replicate(coefficients, config, seeds, seed, analytic, progress)
            if draft_length == "goodput":  # report the model's best static k beside the policy
                from dataclasses import replace

                summary = replace(summary, draft_length=k)
            summaries.append(summary)
            done += seeds * requests
    from sdplan.cli._simulation import echo_warnings, engine_batch_cap

    analytic_batch = [float(summary.rate_rps * summary.analytic_e2e_s) for summary in summaries]
    finite = [b for b in analytic_batch if np.isfinite(b)]
    warnings = cal.validity_warnings(workload.prompt_tokens, workload.output_tokens, max(finite) if finite else None)
    caps = [engine_batch_cap(max_num_seqs, kv[0], workload.prompt_tokens, workload.output_tokens, kv[1])
            for kv in kv_used]
    over = [(f"{s.rate_rps:g}", cap) for s, b, cap in zip(summaries, analytic_batch, caps)
            if not np.isfinite(b) or b >= cap[0]]
    for cap in dict.fromkeys(cap for _, cap in over):
        at = ", ".join(rate for rate, its in over if its == cap)
        warnings.append(f"at {at} req/s the mean model's batch reaches the batch cap of {cap[0]:g} sequences "
                        f"({cap[1]}) or saturates: requests queue for a slot, and the analytic mean beside the "
                        "simulation is outside its regime")
    unsteady = [f"{s.rate_rps:g}" for s in summaries if not s.steady]
    if unsteady:
        warnings.append(f"not at steady state at {', '.join(unsteady)} req/s: the queue kept growing during the "
                        "run (past saturation), so those statistics grow with --requests and are no steady-state "
                        "values")
    warnings += [lengths_note] if lengths_note else []
    echo_warnings(warnings)
    context = {"calibration": {"name": cal.name, "path": cal.path, "method": cal.method},
               "workload": {"prompt_tokens": workload.prompt_tokens, "output_tokens": workload.output_tokens,
                            "acceptance": workload.acceptance.describe(), "lengths_file": lengths_file,
                            "per_token_alpha": workload.acceptance.alphas[0],
                            "position_acceptance_rates": (list(workload.acceptance.position_rates)
                                                          if workload.acceptance.position_rates else None),
                            "acceptance_source": workload.acceptance.source},
               "warnings": warnings}
    settings = {"replications": seeds, "requests": requests, "seed": seed, "arrival_cv": arrival_cv,
                "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                "kv_cache_tokens": kv_cache_tokens, "warmup_fraction": 0.1}
    document = simulate_document(summaries, context, settings)
    for row, kv in zip(document["rates"], kv_used):  # the KV cache each rate was simulated with (None: unlimited)
        row["kv_cache_tokens"] = kv[0]
    terminal = output in (None, "-") and stdout_is_terminal()
    text = render_simulate(summaries, document, OutputFormat(fmt), Style(ascii=ascii_only), terminal)
    series = [(f"{s.rate_rps:g} req/s", np.sort(s.e2e_samples_s)) for s in summaries]
    from sdplan.render.answer import alpha_phrase

    assumption = alpha_phrase(workload.acceptance.alphas[0], workload.acceptance.source,
                              workload.acceptance.position_rates)
    if plot:
        from sdplan.render.plots import terminal_cdf

        text += "\n" + terminal_cdf(series, f"E2E latency CDF (first replication), {assumption}",
                                     *terminal_plot_settings(ascii_only))
    if plot_file is not None:
        from pathlib import Path

        from sdplan.render.plots import file_cdf

        file_cdf(series, f"E2E latency CDF, {cal.name}, {assumption}", Path(plot_file))
    emit(text, output)
