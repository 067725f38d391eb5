"""The one place that turns results into text: rich tables, JSON and CSV.

Commands build a result in the core, then call a ``render_*`` function of a
submodule, which returns a :class:`Rendered` (text for the chosen format);
:func:`emit` writes it to stdout or, atomically, to ``--output``. Rich is
imported lazily so that ``--help`` stays light.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable

from sdplan.fileio import atomic_write_text

#: Version of every JSON document sdplan prints; bump on incompatible changes.
JSON_SCHEMA_VERSION = 1
#: Width used when the output is not a terminal: tables take their natural width, never wrapped or cut.
LOG_WIDTH = 1000


class OutputFormat(str, Enum):
    """Output formats offered by ``--format``."""

    TABLE = "table"
    JSON = "json"
    CSV = "csv"


@dataclass(frozen=True, slots=True)
class Style:
    """How tables are drawn: ASCII boxes and no colour for logs, or rich defaults."""

    ascii: bool = False
    color: bool = True


def make_console(style: Style, stream: Any, terminal: bool) -> Any:
    """A rich Console writing to ``stream``.

    On a terminal it uses the terminal's width and colour (unless ``--ascii``
    or ``NO_COLOR``); otherwise (pipes, files, CI logs) it draws without
    colour at :data:`LOG_WIDTH` columns so that tables never wrap.
    """
    import shutil

    from rich.console import Console

    color = terminal and style.color and not style.ascii and "NO_COLOR" not in os.environ
    return Console(
        file=stream,
        width=shutil.get_terminal_size((120, 24)).columns if terminal else LOG_WIDTH,
        force_terminal=color,
        no_color=not color,
        color_system="auto" if color else None,
        highlight=False,
        soft_wrap=False,
        emoji=False,
    )


def table_box(style: Style) -> Any:
    """The box style for tables: plain ASCII with ``--ascii``, rounded otherwise."""
    from rich import box

    return box.ASCII if style.ascii else box.ROUNDED


def render_rich(draw: Callable[[Any], None], style: Style, terminal: bool) -> str:
    """Render with rich into a string; ``draw`` receives the Console."""
    buffer = io.StringIO()
    draw(make_console(style, buffer, terminal))
    return "\n".join(line.rstrip() for line in buffer.getvalue().split("\n"))


def to_json(document: dict[str, Any]) -> str:
    """Serialise with ``allow_nan=False``: a NaN or inf slipping through is a bug, not output."""
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


def finite_or_none(value: float) -> float | None:
    """A float for JSON/CSV, ``None`` where it is not finite (unstable or undefined)."""
    number = float(value)
    return number if math.isfinite(number) else None


def emit(text: str, output: str | None) -> None:
    """Write ``text`` to stdout, or atomically to ``output`` (``-`` means stdout)."""
    if output is None or output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        atomic_write_text(Path(output), text)


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


class _Progress:
    """Context manager yielding ``advance(done, total, label)`` for the core's progress callback."""

    def __init__(self, description: str, total: int) -> None:
        self.description = description
        self.total = total

    def __enter__(self) -> Callable[[int, int, str], None]:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        console = Console(stderr=True, no_color="NO_COLOR" in os.environ)
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[label]}"),
            console=console, transient=False, disable=not console.is_terminal,
        )
        self.progress.start()
        self.task = self.progress.add_task(self.description, total=self.total, label="")

        def advance(done: int, total: int, label: str) -> None:
            self.progress.update(self.task, completed=done, total=total, label=label)

        return advance

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def progress_bar(description: str, total: int) -> _Progress:
    """A rich progress bar with ETA on stderr (silent when stderr is not a terminal)."""
    return _Progress(description, total)
