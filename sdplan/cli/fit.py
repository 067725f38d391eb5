"""``sdplan fit``: a calibration from real benchmark results."""

from __future__ import annotations

import click

from sdplan.cli._options import output_options
from sdplan.cli._results import override_alpha, results_options


@click.command()
@results_options
@click.option("-o", "--output", "calibration_out", required=True, metavar="FILE",
              help="Calibration TOML to write (atomically). The fit report goes to stdout.")
@click.option("--name", metavar="NAME", help="Calibration name. Default: the output file's stem.")
@click.option("--hardware", default="unknown (set --hardware)", show_default=True, help="Provenance: hardware.")
@click.option("--target-model", default="unknown (set --target-model)", show_default=True, help="Provenance: target.")
@click.option("--draft-model", default="unknown (set --draft-model)", show_default=True, help="Provenance: draft.")
@click.option("--engine-version", default="unknown", show_default=True, help="Provenance: serving engine version.")
@click.option("--holdout", type=click.FloatRange(0, 1, min_open=True, max_open=True), metavar="FRACTION",
              help="Fit on the other runs and report the error on this random fraction of them.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the --holdout split.")
@output_options(formats=("table", "json"), to_file=False)
def fit(results: tuple[str, ...], input_format: str, draft_length: int | None, acceptance_alpha: list[float] | None,
        acceptance_length: list[float] | None, draft_acceptance_rate: list[float] | None, acceptance_k: int | None,
        position_acceptance: list[float] | None,
        calibration_out: str, name: str | None, hardware: str, target_model: str, draft_model: str,
        engine_version: str, holdout: float | None, seed: int, fmt: str, ascii_only: bool) -> None:
    """Fit a calibration to real benchmark results.

    Reads vLLM bench serve JSON, GuideLLM reports or CSV; screens every run
    (failed requests, max-load runs, achieved below requested rate, Little's
    law where concurrency is reported, missing acceptance) and says which it
    leaves out and why; fits L = C1/(1 - lambda C2) per configuration and the
    pooled coefficients across all (acceptance, k, lengths); writes a
    method = "fit" calibration with the sources' names and hashes.

    \b
    Examples:
      sdplan fit results/*.json -o mybox.toml --hardware "1x H100 SXM" --target-model meta-llama/Llama-3.1-8B-Instruct
      sdplan fit guidellm-sd.json --draft-length 4 --acceptance-length 2.8 --acceptance-k 4 base.json -o fit.toml
      sdplan fit runs.csv -o fit.toml --holdout 0.25
    """
    import datetime
    import random
    from pathlib import Path

    from sdplan import __version__
    from sdplan.calibration import parse_calibration
    from sdplan.fileio import atomic_write_text, dumps_toml
    from sdplan.fit import fit_configurations, fit_pooled, validate
    from sdplan.render import OutputFormat, Style, emit, stdout_is_terminal
    from sdplan.render.fit import fit_document, render_fit
    from sdplan.results import file_digest, load_runs, screen

    alpha = override_alpha(acceptance_alpha, acceptance_length, draft_acceptance_rate, acceptance_k,
                           position_acceptance)
    runs, warnings = load_runs(list(results), input_format, draft_length, alpha)
    kept, dropped = [], []
    for run in runs:
        reasons = screen(run)
        (dropped.append((run, "; ".join(reasons))) if reasons else kept.append(run))
    held = []
    if holdout:
        # sorted first: the split must depend on the seed, not on the order the files were given in
        shuffled = sorted(kept, key=lambda run: repr((run.source, run.requested_rate_rps, run.draft_length,
                                                      run.mean_e2e_latency_s)))
        random.Random(seed).shuffle(shuffled)
        cut = max(1, round(holdout * len(shuffled)))
        held, kept = shuffled[:cut], shuffled[cut:]
    pooled = fit_pooled(kept)
    configurations = fit_configurations(kept)
    holdout_result = validate(pooled.coefficients_at, held) if held else None
    out = Path(calibration_out)
    v = pooled.values
    detail = (f"pooled over {pooled.points} runs: R2={pooled.r2:.4f}, MAPE={pooled.mape_pct:.2f}%; "
              + "; ".join(f"k={c.draft_length} alpha={c.alpha} p={c.prompt_tokens:g} g={c.output_tokens:g}: "
                          f"R2={c.r2:.4f} (n={c.points})" for c in configurations))
    if holdout_result:
        detail += f"; held-out {len(held)} runs: MAPE={holdout_result.mape_pct:.2f}%, R2={holdout_result.r2:.4f}"
    document = {
        "schema_version": 1,
        "name": name or out.stem,
        "description": f"fitted from {len(results)} benchmark file(s) with sdplan fit",
        "provenance": {
            "method": "fit", "hardware": hardware, "target_model": target_model, "draft_model": draft_model,
            "engine": "vllm", "engine_version": engine_version, "date": datetime.date.today(),
            "created_by": f"sdplan fit (sdplan {__version__})",
            "sources": [f"{Path(path).name} {file_digest(Path(path))}" for path in results],
            "notes": f"{len(kept)} runs fitted, {len(dropped)} left out by the steady-state screen"
                     + (f", {len(held)} held out" if held else ""),
        },
        "reference_workload": {"prompt_tokens": pooled.reference_prompt_tokens,
                               "output_tokens": pooled.reference_output_tokens},
        "validity": {
            "prompt_tokens": [round(min(r.prompt_tokens for r in kept)), round(max(r.prompt_tokens for r in kept))],
            "output_tokens": [round(min(r.output_tokens for r in kept)), round(max(r.output_tokens for r in kept))],
        },
        "fit_quality": {"r2": round(pooled.r2, 6), "rmse_s": pooled.rmse_s, "mape_pct": round(pooled.mape_pct, 4),
                        "points": pooled.points, "detail": detail},
        "coefficients": {
            "scaling": "proportional",
            "c1p_s": v["c1p_s"], "c2p_s": v["c2p_s"],
            "baseline": {"c1_step_s": v["baseline_c1_step_s"], "c2_step_s": v["baseline_c2_step_s"]},
            "speculative": {"c1v_s": v["c1v_s"], "c2v_s": v["c2v_s"], "c1d_s": v["c1d_s"], "c2d_s": v["c2d_s"]},
        },
    }
    parse_calibration(document, str(out))
    atomic_write_text(out, dumps_toml(document, header="Fitted with 'sdplan fit' from benchmark results."))
    report = fit_document(pooled, configurations, kept, dropped, holdout_result, str(out), warnings)
    emit(render_fit(report, OutputFormat(fmt), Style(ascii=ascii_only), stdout_is_terminal()), None)
