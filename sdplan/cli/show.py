"""``sdplan show``: validate and pretty-print one calibration."""

from __future__ import annotations

import click

from sdplan.cli._options import DraftLengths, calibration_option, counts_callback, output_options, positive_tokens


@click.command()
@calibration_option
@click.option("--prompt-tokens", type=int, callback=positive_tokens, metavar="TOKENS",
              help="Show coefficients at this prompt length. Default: the reference workload.")
@click.option("--output-tokens", type=int, callback=positive_tokens, metavar="TOKENS",
              help="Show coefficients at this output length. Default: the reference workload.")
@click.option("--batch-sizes", callback=counts_callback("sequences in flight", "a step runs at least 1 sequence"),
              metavar="LIST",
              help="Price the engine step table at these sequences in flight: a list (1,8,32) or a range (1-8). "
                   "Default: 1,4,16,64,128,256.")
@click.option("-k", "--draft-lengths", type=DraftLengths(), metavar="KS",
              help="Price the engine step table's SD cycles at these draft lengths: a list (1,3,5) or a range "
                   "(1-8). Default: the file's priced ones, up to four.")
@output_options(formats=("table", "json"))
def show(calibration: str | None, prompt_tokens: int | None, output_tokens: int | None,
         batch_sizes: tuple[int, ...] | None, draft_lengths: tuple[int, ...] | None,
         fmt: str, output: str | None, ascii_only: bool) -> None:
    """Validate a calibration and print it with its derived coefficients.

    Exits 0 if the file is valid and 3 (with a one-line error naming the key)
    if it is not, so it doubles as a linter for calibration files.

    \b
    Examples:
      sdplan show -c calibrations/h100-sxm_llama-3.1-8b_llama-3.2-1b_derived.toml
      sdplan show -c mybox.toml --prompt-tokens 4096 --format json
      sdplan show -c mybox.toml --batch-sizes 1,8,32 -k 3
    """
    from sdplan.calibration.views import ShowRequest, show_calibration
    from sdplan.render import OutputFormat, Style, emit, stdout_is_terminal
    from sdplan.render.calibration import render_calibration

    shown = show_calibration(ShowRequest(calibration=calibration, prompt_tokens=prompt_tokens,
                                         output_tokens=output_tokens, batch_sizes=batch_sizes,
                                         draft_lengths=draft_lengths))
    terminal = output in (None, "-") and stdout_is_terminal()
    emit(render_calibration(shown, OutputFormat(fmt), Style(ascii=ascii_only), terminal), output)
