"""``sdplan calibrations``: list the shipped calibrations with their provenance."""

from __future__ import annotations

import click

from sdplan.cli._options import output_options


@click.command()
@output_options(formats=("table", "json"))
def calibrations(fmt: str, output: str | None, ascii_only: bool) -> None:
    """List the calibrations shipped with sdplan.

    Each row gives the (hardware, target, draft) pair, how the numbers were
    obtained (measured, fit, derived = priced by AIConfigurator's silicon op
    database, or roofline = derived from datasheets, not measured), what was
    measured, derived and assumed with versions, the date and the fit
    quality. Any name listed works with -c.

    \b
    Examples:
      sdplan calibrations
      sdplan calibrations --format json
    """
    from sdplan.calibration.views import list_shipped
    from sdplan.render import OutputFormat, Style, emit, stdout_is_terminal
    from sdplan.render.calibration import render_listing

    listing = list_shipped()
    terminal = output in (None, "-") and stdout_is_terminal()
    emit(render_listing(listing, OutputFormat(fmt), Style(ascii=ascii_only), terminal), output)
