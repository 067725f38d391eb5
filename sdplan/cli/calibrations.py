"""``sdplan calibrations``: list the shipped calibrations with their provenance."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from sdplan.cli._options import output_options
from sdplan.errors import InputFileError


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
    from sdplan.calibration import DEFAULT_CALIBRATION, load_calibration, shipped_calibrations
    from sdplan.render import OutputFormat, Style, emit, stdout_is_terminal
    from sdplan.render.calibration import render_listing

    if TYPE_CHECKING:
        from sdplan.calibration import Calibration

    entries: list[tuple[str, Calibration | None, str | None]] = []
    for path in shipped_calibrations():
        try:
            entries.append((str(path), load_calibration(path), None))
        except InputFileError as error:
            entries.append((str(path), None, str(error)))
    terminal = output in (None, "-") and stdout_is_terminal()
    emit(render_listing(entries, OutputFormat(fmt), Style(ascii=ascii_only), terminal, DEFAULT_CALIBRATION), output)
