"""The one place that turns results into text: rich tables, JSON and CSV.

Commands build a result in the core, then call a ``render_*`` function of a
submodule, which returns a :class:`Rendered` (text for the chosen format);
:func:`emit` writes it to stdout or, atomically, to ``--output``. Commands
import this package inside their bodies (:mod:`sdplan.cli`), so ``--help``
never loads rich.
"""

from __future__ import annotations

import io
import json
import os
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.text import Text

from sdplan.fileio import atomic_write_text

#: Version of every JSON document sdplan prints; bump on incompatible changes.
JSON_SCHEMA_VERSION = 1
#: Width when neither a terminal nor ``COLUMNS`` says otherwise (pipes, files, CI logs).
DEFAULT_WIDTH = 80


class OutputFormat(str, Enum):
    """Output formats offered by ``--format``."""

    TABLE = "table"
    JSON = "json"
    CSV = "csv"


@dataclass(frozen=True, slots=True)
class Style:
    """How tables are drawn: ASCII boxes and no colour for logs, or rich defaults; ``width``: the columns to draw
    in, where the text goes elsewhere than standard output (None: :func:`output_width` of standard output)."""

    ascii: bool = False
    color: bool = True
    width: int | None = None


def make_console(style: Style, stream: Any, terminal: bool) -> Any:
    """A rich Console writing to ``stream``.

    The width is the style's, else :func:`output_width` (``COLUMNS``, else the
    terminal's, else 80 columns). Colour only on a terminal, unless ``--ascii`` or ``NO_COLOR``.
    Tables printed with :func:`print_table` are never cut to fit.
    """
    color = terminal and style.color and not style.ascii and "NO_COLOR" not in os.environ
    return Console(
        file=stream,
        width=style.width or output_width(terminal),
        force_terminal=color,
        no_color=not color,
        color_system="auto" if color else None,
        highlight=False,
        soft_wrap=False,
        emoji=False,
    )


def output_width(terminal: bool = True, stream: Any = None) -> int:
    """Columns to draw in: ``COLUMNS`` when set (also when piped), else the terminal's, else 80.

    ``stream`` is the terminal measured (standard output unless given): standard
    error may be a terminal while standard output is piped, and the reverse.
    """
    raw = os.environ.get("COLUMNS", "")
    if raw.strip().isdigit() and int(raw) > 0:
        return max(int(raw), 20)
    if not terminal:
        return DEFAULT_WIDTH
    try:
        return max(os.get_terminal_size((stream or sys.__stdout__).fileno()).columns, 20)  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        return DEFAULT_WIDTH


def print_table(console: Any, table: Any, title: str | None = None, caption: str | None = None) -> None:
    """Print ``table`` without cutting anything.

    The title and caption are printed as paragraphs at the console's width
    (wrapped between words, not by the table's own width). When the table is
    wider than the console, headers and cells wrap between words, the column
    with the most room to spare giving way first; no word is ever cut or
    shortened with an ellipsis. If even the narrowest such layout is wider
    than the console, the table keeps its natural layout, one line per row
    (the terminal then wraps the line; nothing is lost).
    """
    if title:
        console.print(Text(title, style="bold"))
    width = _fit_columns(console, table)
    saved = console.width
    console.width = width  # print() clamps its width to the console's: widen the console itself
    try:
        console.print(table)
    finally:
        console.width = saved
    if caption:
        console.print(caption)


def print_paragraph(console: Any, text: str, style: str | None = None) -> None:
    """Print ``text`` wrapped between words at the console's width, continuation lines indented.

    A line that starts with spaces keeps them and its continuations go two
    further in, so that "Answer:"/"Why:"/"Caveat:" blocks read as blocks.
    """
    lead = len(text) - len(text.lstrip(" "))
    lines = textwrap.wrap(text, width=max(console.width, 20), subsequent_indent=" " * (lead + 2),
                          break_long_words=False, break_on_hyphens=False)
    for line in lines or [""]:
        console.print(line, markup=False, highlight=False, style=style, soft_wrap=True)


def _fit_columns(console: Any, table: Any) -> int:
    """Fix each column's width so that the table fits the console without breaking a word; returns the width."""
    columns = table.columns
    options = console.options.update_width(100_000)  # measure whole words, however narrow the console
    limits = []
    for index, column in enumerate(columns):
        column.overflow = "fold"
        padding = table._get_padding_width(index)
        header = Measurement.get(console, options, column.header)
        body = [Measurement.get(console, options, cell) for cell in column.cells]
        widest_cell = max((m.maximum for m in body), default=1)
        longest_word = max([header.minimum, *(m.minimum for m in body)])
        floor = max(longest_word, column.min_width or 0)
        # first wrap headers only (down to the widest cell), then cells between words
        limits.append((floor, max(floor, widest_cell), max(header.maximum, widest_cell, floor), padding))
    borders = table._extra_width
    widths = [maximum for *_, maximum, _ in limits]
    excess = sum(widths) + sum(padding for *_, padding in limits) + borders - console.width
    for phase in (1, 0):
        while excess > 0:
            slack = [widths[i] - limits[i][phase] for i in range(len(widths))]
            index = max(range(len(widths)), key=slack.__getitem__)
            if slack[index] <= 0:
                break
            widths[index] -= 1
            excess -= 1
    if excess > 0:  # cannot fit without breaking words: keep the natural layout, one line per row
        widths = [maximum for *_, maximum, _ in limits]
    for column, width in zip(columns, widths):
        column.width = width
        column.no_wrap = False
    return max(console.width, sum(widths) + sum(padding for *_, padding in limits) + borders)


def table_box(style: Style) -> Any:
    """The box style for tables: plain ASCII with ``--ascii``, rounded otherwise."""
    return box.ASCII if style.ascii else box.ROUNDED


def render_rich(draw: Callable[[Any], None], style: Style, terminal: bool) -> str:
    """Render with rich into a string; ``draw`` receives the Console."""
    buffer = io.StringIO()
    draw(make_console(style, buffer, terminal))
    return "\n".join(line.rstrip() for line in buffer.getvalue().split("\n"))


def to_json(document: dict[str, Any]) -> str:
    """Serialise with ``allow_nan=False``: a NaN or inf slipping through is a bug, not output."""
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


def emit(text: str, output: str | None) -> None:
    """Write ``text`` to stdout, or atomically to ``output`` (``-`` means stdout)."""
    if output is None or output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        atomic_write_text(Path(output), text)


def paragraph_text(text: str, width: int) -> str:
    """``text`` wrapped to ``width`` columns between words, each line of it a paragraph whose continuation
    lines are indented two spaces, so a reader sees where one note ends and the next begins.

    The rule is rich's for standard output: a terminal's width, else ``COLUMNS``, else 80 columns, also
    in pipes and logs. A word longer than the width (a path) is kept whole on a line of its own.
    """
    return "\n".join(line if len(line) <= width else
                     "\n".join(textwrap.wrap(line, width, subsequent_indent="  ", break_long_words=False,
                                             break_on_hyphens=False))
                     for line in text.split("\n"))


def stderr_width() -> int:
    """Columns for notes on standard error: :func:`output_width` of standard error's terminal."""
    return output_width(sys.stderr.isatty(), sys.__stderr__)


def say(notes: list[str] | tuple[str, ...] | str) -> None:
    """Write each note (a warning, a caveat, a verdict's summary) to standard error as a paragraph that
    fits :func:`stderr_width`. Lines for machines (GitHub workflow commands) and error messages are
    not notes: they stay one line."""
    width = stderr_width()
    for note in (notes,) if isinstance(notes, str) else notes:
        click.echo(paragraph_text(note, width), err=True)


def warn(warnings: list[str] | tuple[str, ...]) -> None:
    """Write each warning to standard error as ``warning: ...`` (:func:`say`): its first line starts with
    ``warning:``, so ``grep '^warning:'`` finds each warning once."""
    say([f"warning: {message}" for message in warnings])


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def report_target(to_stderr: bool, ascii_only: bool) -> tuple[Style, bool]:
    """The style and terminal flag of a report written to standard error (when standard output carries the file
    itself, ``-o -``) or to standard output: drawn at the width, and in the colours, of the stream it goes to."""
    if to_stderr:
        return Style(ascii=ascii_only, width=stderr_width()), sys.stderr.isatty()
    return Style(ascii=ascii_only), stdout_is_terminal()
