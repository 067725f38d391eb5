"""``sdplan validate``: the model's error against real benchmark results."""

from __future__ import annotations

from pathlib import Path

import click

from sdplan.cli._options import (
    calibration_option,
    check_plot_request,
    output_options,
    parse_number,
    plot_options,
    terminal_plot_settings,
)
from sdplan.cli._results import result_files, results_options
from sdplan.errors import ExitStatus
from sdplan.limits import MAX_BATCH_SIZE


def _percent(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    text = value.strip()
    number = parse_number(text, "error limit") * (100.0 if text.endswith("%") else 1.0)
    if not text.endswith("%") and number < 1:
        number *= 100.0  # 0.1 means 10%
    if number <= 0:
        raise click.BadParameter("must be > 0, e.g. 10%")
    return number


@click.command()
@calibration_option
@results_options
@click.option("--max-error", callback=_percent, metavar="PERCENT",
              help="Exit 1 when the mean absolute percentage error exceeds this (10% or 0.1).")
@click.option("--max-num-seqs", type=click.IntRange(1, MAX_BATCH_SIZE), metavar="N",
              help="Requests the measured server ran at once (vLLM --max-num-seqs, SGLang --max-running-requests): "
                   "a closed loop of more clients keeps the rest waiting for admission. Default: SGLang's 48 for "
                   "its SD runs (its limit under SD), else none.")
@output_options(formats=("table", "json"))
@plot_options
def validate(calibration: str | None, results: tuple[str, ...], input_format: str, select: tuple[str, ...],
             window: float | None, draft_length: int | None,
             acceptance_alpha: list[float] | None, acceptance_length: list[float] | None,
             draft_acceptance_rate: list[float] | None, acceptance_k: int | None,
             position_acceptance: list[float] | None, max_error: float | None, max_num_seqs: int | None,
             fmt: str, output: str | None, ascii_only: bool, plot: bool, plot_file: str | None) -> ExitStatus:
    """Compare the model's predictions with measured mean latencies.

    For every run: measured and predicted mean end-to-end latency at the
    arrival rate (closed loops: at their N) and the error. Summary: MAPE, signed bias, R2, worst run,
    quality grade, whether the fastest draft length per rate agrees, and, where runs repeat a load
    level, the MAPE an exact model would score against them (their own spread).
    Runs not at steady state or not under Poisson arrivals are skipped with
    the reason.

    \b
    Exit status: 0 (and within --max-error), 1 error above --max-error,
    2 usage, 3 invalid file, 4 no usable run.

    \b
    Examples:
      sdplan validate -c mybox.toml results/*.json
      sdplan validate -c mybox.toml runs.csv --max-error 10% --format json
      sdplan validate -c qwen3-32b-h100-tp4.toml aic:silicon_sample \\
                      --select model=Qwen3-32B,system=h100_sxm,backend=vllm,tp=4
    """
    from sdplan.measure.validate_runs import ValidateRequest, validate_runs
    from sdplan.render import OutputFormat, Style, emit, say, stdout_is_terminal, warn
    from sdplan.render.fit import render_validated
    from sdplan.render.plots import file_scatter, terminal_scatter

    check_plot_request(plot, plot_file, fmt)
    outcome = validate_runs(ValidateRequest(
        calibration=calibration,
        files=result_files(results, input_format, select, window, draft_length, acceptance_alpha, acceptance_length,
                           draft_acceptance_rate, acceptance_k, position_acceptance),
        max_error_pct=max_error, max_num_seqs=max_num_seqs), on_read=warn)
    warn(outcome.warnings)
    result = outcome.validation
    terminal = output in (None, "-") and stdout_is_terminal()
    text = render_validated(outcome, OutputFormat(fmt), Style(ascii=ascii_only), terminal)
    finite = [e for e in result.errors if e.error_pct is not None]
    measured = [e.run.mean_e2e_latency_s for e in finite]
    predicted = [e.predicted_s for e in finite]
    title = f"Measured vs predicted ({outcome.calibration.name}): MAPE {result.mape_pct:.1f}%"
    if plot and finite:
        text += "\n" + terminal_scatter(measured, predicted, title, *terminal_plot_settings(ascii_only))
    if plot_file is not None and finite:
        labels = ["no SD" if e.run.draft_length == 0 else f"k={e.run.draft_length}" for e in finite]
        file_scatter(measured, predicted, labels, title, Path(plot_file))
    emit(text, output)
    if not outcome.passed:
        say(f"sdplan validate: FAIL: MAPE {result.mape_pct:.2f}% exceeds {max_error:g}%")
        return ExitStatus.SLO_VIOLATED  # a verdict, not an error: sdplan.cli maps it to the exit code
    return ExitStatus.OK
