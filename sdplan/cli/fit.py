"""``sdplan fit``: a calibration from real benchmark results."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from sdplan.cli._options import output_options
from sdplan.cli._results import result_files, results_options
from sdplan.fileio import atomic_write_text


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
    from sdplan.measure.fit_runs import FitRequest, ProvenanceGiven, fit_runs
    from sdplan.render import OutputFormat, report_target, say
    from sdplan.render.fit import render_fit_outcome

    to_stdout = calibration_out == "-"
    request = FitRequest(
        files=result_files(results, input_format, select, window, draft_length, acceptance_alpha, acceptance_length,
                           draft_acceptance_rate, acceptance_k, position_acceptance),
        output=None if to_stdout else Path(calibration_out), name=name,
        given=ProvenanceGiven(hardware=hardware, target_model=target_model, draft_model=draft_model,
                              engine_version=engine_version),
        holdout=holdout, holdout_by=holdout_by, seed=seed, prior=prior)
    outcome = fit_runs(request, on_left_out=say)
    style, terminal = report_target(to_stdout, ascii_only)
    report = render_fit_outcome(outcome, OutputFormat(fmt), style, terminal)
    _write(outcome.calibration_toml, report, request.output)


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
