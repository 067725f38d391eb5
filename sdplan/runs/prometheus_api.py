"""A Prometheus HTTP API export (``/api/v1/query_range`` JSON) of vLLM's series, as runs: one per window.

See :mod:`sdplan.metrics.api` for what to export; windows as in :mod:`sdplan.metrics.windows`. A
``"stream"`` reader of :data:`sdplan.runs.read.READERS`, given the file's path.
"""

from __future__ import annotations

from pathlib import Path

from sdplan.runs.record import BenchmarkRun

NAME = "prometheus-api"
DESCRIPTION = "a Prometheus query_range export"
SELECTS = True


def detects(path: Path, head: str) -> bool:
    from sdplan.metrics.api import is_query_range

    return is_query_range(head)


def read(where: str, path: Path, labels: tuple[tuple[str, str], ...],
         window_s: float | None) -> tuple[list[BenchmarkRun], list[str]]:
    from sdplan.metrics.api import read_query_range
    from sdplan.metrics.windows import WindowSettings, streamed_runs

    points, skipped, steps = read_query_range(path, where)
    return streamed_runs(where, path.name, points, lambda: (skipped, steps), labels, WindowSettings(length_s=window_s))
