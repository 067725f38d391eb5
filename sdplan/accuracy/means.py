"""Means and medians of per-run figures and their standard error, shared by the summary and the floors."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def mean_or_none(values: Iterable[float]) -> float | None:
    """The mean of ``values``, None when there are none."""
    found = list(values)
    return sum(found) / len(found) if found else None


def median_or_none(values: Iterable[float]) -> float | None:
    """The median of ``values``, None when there are none."""
    found = sorted(values)
    if not found:
        return None
    middle = len(found) // 2
    return found[middle] if len(found) % 2 else 0.5 * (found[middle - 1] + found[middle])


def standard_error(values: Sequence[float]) -> float | None:
    """Standard error of the mean of per-run values (None below two)."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))
