"""``sdplan show``: validate and pretty-print one calibration."""

from __future__ import annotations

import click

from sdplan.cli._options import calibration_option, output_options, positive_tokens


@click.command()
@calibration_option
@click.option("--prompt-tokens", type=int, callback=positive_tokens, metavar="TOKENS",
              help="Show coefficients at this prompt length. Default: the reference workload.")
@click.option("--output-tokens", type=int, callback=positive_tokens, metavar="TOKENS",
              help="Show coefficients at this output length. Default: the reference workload.")
@output_options(formats=("table", "json"))
def show(calibration: str | None, prompt_tokens: int | None, output_tokens: int | None,
         fmt: str, output: str | None, ascii_only: bool) -> None:
    """Validate a calibration and print it with its derived coefficients.

    Exits 0 if the file is valid and 3 (with a one-line error naming the key)
    if it is not, so it doubles as a linter for calibration files.

    \b
    Examples:
      sdplan show -c calibrations/h100-sxm_llama-3.1-8b_llama-3.2-1b_derived.toml
      sdplan show -c mybox.toml --prompt-tokens 4096 --format json
    """
    from sdplan.calibration.views import ShowRequest, show_calibration
    from sdplan.render import OutputFormat, Style, emit, stdout_is_terminal
    from sdplan.render.calibration import render_calibration

    shown = show_calibration(ShowRequest(calibration=calibration, prompt_tokens=prompt_tokens,
                                         output_tokens=output_tokens))
    terminal = output in (None, "-") and stdout_is_terminal()
    emit(render_calibration(shown, OutputFormat(fmt), Style(ascii=ascii_only), terminal), output)
