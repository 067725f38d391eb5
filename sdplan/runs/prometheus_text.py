"""A series of Prometheus text scrapes of vLLM's ``/metrics`` (``sdplan scrape``), as runs: one per window.

The reading is in :mod:`sdplan.metrics` (:mod:`~sdplan.metrics.textfile` streams the file;
:mod:`~sdplan.metrics.windows` cuts windows as it is read, in memory bounded by a window, and turns them into
runs). This module is the format's entry in
:data:`sdplan.runs.read.READERS`: a ``"stream"`` reader, given the file's path rather than its text.
"""

from __future__ import annotations

from pathlib import Path

from sdplan.runs.record import BenchmarkRun

NAME = "prometheus-text"
DESCRIPTION = "a series of Prometheus scrapes (sdplan scrape)"
SELECTS = True


def detects(path: Path, head: str) -> bool:
    from sdplan.metrics.textfile import is_scrape_text

    return is_scrape_text(head)


def read(where: str, path: Path, labels: tuple[tuple[str, str], ...],
         window_s: float | None) -> tuple[list[BenchmarkRun], list[str]]:
    from sdplan.metrics.textfile import ReadCounts, scrape_points
    from sdplan.metrics.windows import WindowSettings, streamed_runs

    counts = ReadCounts()  # windows are cut as the file is read: memory bounded by a window, not the file
    return streamed_runs(where, path.name, scrape_points(path, where, counts),
                         lambda: (counts.skipped, counts.scrapes), labels, WindowSettings(length_s=window_s))
