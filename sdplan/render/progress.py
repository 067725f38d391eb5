"""The progress bar of the long commands (``calibrate``, ``simulate``, ``capacity --simulate``).

A module of its own because only those commands draw one: the others never
load rich's live display (``rich.progress``, some 5 ms of a cold start).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class _Progress:
    """Context manager yielding ``advance(done, total, label)`` for the core's progress callback."""

    def __init__(self, description: str, total: int) -> None:
        self.description = description
        self.total = total

    def __enter__(self) -> Callable[[int, int, str], None]:
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
