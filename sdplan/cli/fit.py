"""``sdplan fit``: a calibration from real benchmark results."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sdplan.cli._options import output_options
from sdplan.cli._results import override_alpha, results_options
from sdplan.errors import InfeasibleError
from sdplan.fileio import atomic_write_text, dumps_toml

if TYPE_CHECKING:
    from sdplan.runs import BenchmarkRun
    from sdplan.runs.silicon import Selection


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
@click.option("--holdout-by", type=click.Choice(("random", "highest-load")), default="random", show_default=True,
              help="random: a seeded fraction (--holdout). highest-load: leave out the most loaded run of every "
              "configuration with 3+ runs (tests extrapolation in load).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random --holdout split.")
@click.option("--prior", metavar="CALIBRATION", help="Instead of fitting, scale this calibration (file or shipped "
              "name, e.g. a derived one) to reproduce the runs: one factor on its C1 side, one on its C2 side, "
              "keeping its ratios of every SD step to the plain step; the options the runs did not measure are "
              "anchored, not measured. Records the gap before and after.")
@output_options(formats=("table", "json"), to_file=False)
def fit(results: tuple[str, ...], input_format: str, select: tuple[str, ...], window: float | None,
        draft_length: int | None, acceptance_alpha: list[float] | None, acceptance_length: list[float] | None,
        draft_acceptance_rate: list[float] | None, acceptance_k: int | None, position_acceptance: list[float] | None,
        calibration_out: str, name: str | None, hardware: str, target_model: str, draft_model: str,
        engine_version: str, holdout: float | None, holdout_by: str, seed: int, prior: str | None, fmt: str,
        ascii_only: bool) -> None:
    """Fit a calibration to real benchmark results.

    Reads vLLM bench serve JSON (one run, --append-result JSON Lines, or a vllm
    bench sweep output folder), GuideLLM reports, CSV, or a vLLM server's metrics
    (sdplan scrape; Prometheus query_range). Fits L = C1 + B*C2 with B the mean
    number of other requests in flight (an open loop: lambda*L at its arrival rate,
    the planner's relation; a closed loop of N clients: measured from per-request
    times when the file has them, else N-1), and TTFT under load, pooled over every
    (k, acceptance, lengths); prints per-coefficient standard errors and what the
    data do not identify; leaves out runs not at steady state or not under Poisson
    arrivals and says why. Writes a method = "fit" calibration with the sources'
    hashes and the covariance, only after the report succeeded.

    AIConfigurator's measured rows (silicon_sample.csv, or aic:silicon_sample
    for the installed package's own) are closed loops of N clients at given
    lengths; --select picks one configuration, and the calibration's
    provenance (hardware, target, engine and version, TP) comes from it.

    A file that does not record its SD settings (GuideLLM, CSV without them)
    takes them per file as FILE:k=4,alpha=0.8 (or len=2.8, rate=62%), or from
    the flags, which fill in only what a file does not record.

    \b
    Examples:
      sdplan fit results/*.json -o mybox.toml --hardware "1x H100 SXM" \\
                 --target-model meta-llama/Llama-3.1-8B-Instruct
      sdplan fit base.json guidellm-sd.json:k=4,len=2.8 -o fit.toml
      sdplan fit sweep-output/ -o fit.toml --holdout-by highest-load
      sdplan fit runs.csv -o - --holdout 0.25 > fit.toml
      sdplan fit nosd.scrapes -o anchored.toml \\
                 --prior l40s_qwen3-8b_qwen3-0.6b_derived
      sdplan fit aic:silicon_sample -o qwen3-32b-h100-tp4.toml \\
                 --select model=Qwen3-32B,system=h100_sxm,backend=vllm,tp=4
    """
    from sdplan.calibration import parse_calibration
    from sdplan.cli._prior import fit_to_prior, provenance_table
    from sdplan.fit import fit_configurations, fit_pooled, fitted_document
    from sdplan.metrics.acceptance import acceptance_document
    from sdplan.render import OutputFormat, Style, stdout_is_terminal
    from sdplan.render.fit import fit_document, render_fit
    from sdplan.runs import load_runs, silicon, split_file_facts
    from sdplan.validation import validate

    alpha = override_alpha(acceptance_alpha, acceptance_length, draft_acceptance_rate, acceptance_k,
                           position_acceptance)
    runs, warnings = load_runs(list(results), input_format, draft_length, alpha, silicon.Selection.parse(select),
                               window)
    (kept, dropped), given = _screened(runs), _given(hardware, target_model, engine_version, draft_model)
    if prior is not None:  # scale a calibration to the runs instead of fitting one (sdplan/metrics/prior.py)
        return fit_to_prior(prior, results, kept, dropped, warnings, given, name, calibration_out, fmt)
    to_stdout, out = calibration_out == "-", Path("fitted.toml" if calibration_out == "-" else calibration_out)
    paths = [silicon.resolve_path(split_file_facts(argument)[0]) for argument in results]
    kept, held = _held_out(kept, holdout, holdout_by, seed)
    pooled, configurations = fit_pooled(kept), fit_configurations(kept)
    holdout_result = validate(pooled.coefficients_at, held) if held else None
    provenance = provenance_table(paths, given, f"{len(kept)} runs fitted, {len(dropped)} left out by the screen "
                             "(sdplan-fit(1))" + (f", {len(held)} held out ({holdout_by})" if held else ""))
    provenance.update(_measured_provenance(paths, input_format, silicon.Selection.parse(select), given))
    document = fitted_document(pooled, kept, name=name or (out.stem if not to_stdout else "fitted"),
                               provenance=provenance, acceptance=acceptance_document(kept),
                               description=f"fitted from {len(results)} benchmark source(s) with sdplan fit")
    if holdout_result:
        document["fit_quality"]["detail"] += (f"; held-out {len(held)} runs ({holdout_by}): "
                                              f"MAPE={holdout_result.mape_pct:.2f}%")
    parse_calibration(document, str(out))
    text = dumps_toml(document, header="Fitted with 'sdplan fit' from benchmark results.")
    report = fit_document(pooled, configurations, kept, dropped, holdout_result, "-" if to_stdout else str(out),
                          warnings)
    _write(text, render_fit(report, OutputFormat(fmt), Style(ascii=ascii_only), stdout_is_terminal() and not to_stdout),
           None if to_stdout else out)


def _given(hardware: str, target_model: str, engine_version: str, draft_model: str) -> dict[str, str]:
    """The provenance options as given."""
    return {"hardware": hardware, "target_model": target_model, "engine_version": engine_version,
            "draft_model": draft_model}


def _write(calibration: str, report: str, out: Path | None) -> None:
    """The calibration to ``out`` (atomically) and the report to stdout; without ``out``, the calibration on
    stdout and the report on stderr."""
    from sdplan.render import emit

    if out is None:
        sys.stdout.write(calibration)
        click.echo(report, err=True, nl=False)
        return
    atomic_write_text(out, calibration)
    emit(report, None)


def _screened(runs: list[BenchmarkRun]) -> tuple[list[BenchmarkRun], list[tuple[BenchmarkRun, str]]]:
    """The runs the steady-state screen keeps, and those it leaves out with why (said on stderr).

    Too few kept runs is an error here, before any hold-out, so that the counts are the screen's.
    """
    from sdplan.fit import MIN_FIT_RUNS
    from sdplan.runs import screen

    kept: list[BenchmarkRun] = []
    dropped: list[tuple[BenchmarkRun, str]] = []
    for run in runs:
        reasons = screen(run)
        if reasons:
            dropped.append((run, "; ".join(reasons)))
            click.echo(f"left out {run.source}: {'; '.join(reasons)}", err=True)
        else:
            kept.append(run)
    if len(kept) < MIN_FIT_RUNS and dropped:
        raise InfeasibleError(f"only {len(kept)} of {len(runs)} runs usable, the other {len(dropped)} left out "
                              f"(reasons above); a fit needs at least {MIN_FIT_RUNS} (several loads per "
                              "configuration)")
    return kept, dropped


def _measured_provenance(paths: list[Path], input_format: str, selection: Selection,
                         given: dict[str, str]) -> dict[str, Any]:
    """What AIConfigurator's rows say about themselves, for the keys the options (``given``) left at "unknown"."""
    from sdplan.runs import silicon

    measured = [(found, path) for path in paths
                if (found := silicon.configuration_in(path, input_format, selection)) is not None]
    if not measured:
        return {}
    taken: dict[str, Any] = {key: value for key, value in silicon.provenance(*measured[0]).items()
                             if given.get(key, "unknown").startswith("unknown")}
    if given["draft_model"].startswith("unknown"):
        taken["draft_model"] = "none (no SD rows)"
    return taken


def _held_out(kept: list[BenchmarkRun], holdout: float | None, holdout_by: str,
              seed: int) -> tuple[list[BenchmarkRun], list[BenchmarkRun]]:
    """The runs to fit and the runs held out (none unless --holdout or --holdout-by highest-load)."""
    from sdplan.fit import holdout_split

    if not holdout and holdout_by != "highest-load":
        return kept, []
    fitted, held = holdout_split(kept, holdout_by, holdout or 0.0, seed)
    if not held:
        raise click.UsageError("--holdout-by highest-load needs configurations with 3 or more runs")
    return fitted, held
