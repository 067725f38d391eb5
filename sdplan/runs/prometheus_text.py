"""A series of Prometheus text scrapes of vLLM's ``/metrics`` (``sdplan scrape``), as runs: one per window.

The reading is in :mod:`sdplan.metrics` (:mod:`~sdplan.metrics.textfile` streams the file, bounded in
memory; :mod:`~sdplan.metrics.windows` turns windows into runs). This module is the format's entry in
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
    from sdplan.metrics.textfile import read_scrapes
    from sdplan.metrics.windows import WindowSettings, runs_of

    servers, skipped, scrapes = read_scrapes(path, where)
    return runs_of(where, path.name, servers, skipped, scrapes, labels, WindowSettings(length_s=window_s))
