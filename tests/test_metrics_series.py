"""A point's stored quantities (:class:`sdplan.metrics.series.Values`) and what a series of points holds in memory."""

from __future__ import annotations

import gc
import math
import tracemalloc
from pathlib import Path

import pytest

from sdplan.metrics import names
from sdplan.metrics.series import QUANTITIES, Point, Values, arrivals, clean, finished_so_far
from sdplan.metrics.textfile import read_scrapes

DATA = Path(__file__).parent / "data" / "prometheus-cpu"


def test_values_read_as_the_mapping_they_were_made_from() -> None:
    given = {"e2e_sum": 12.5, "e2e_count": 0.0, "running": 3.0, "kv_cache": 0.25}
    values = Values(given)
    assert dict(values) == given and values == given and len(values) == 4
    assert values["e2e_count"] == 0.0 and "e2e_count" in values  # a zero is a value, not an absence
    assert "waiting" not in values and values.get("waiting") is None and values.get("waiting", 7.0) == 7.0
    with pytest.raises(KeyError):
        values["waiting"]
    assert list(values) == [q for q in QUANTITIES if q in given]  # the order of sdplan.metrics.names
    assert set(QUANTITIES) == set(names.COUNTERS) | set(names.GAUGES)


def test_values_refuse_a_name_that_is_not_a_quantity() -> None:
    with pytest.raises(KeyError, match="vllm:e2e_request_latency_seconds_sum"):
        Values({"vllm:e2e_request_latency_seconds_sum": 1.0})  # a sample name, not the quantity it maps to
    with pytest.raises(KeyError):
        Values({})["no such quantity"]


def test_a_nan_is_an_absence() -> None:
    """Points are made without NaN values (they are dropped first), so NaN is free to mark a quantity absent."""
    values = Values({"e2e_sum": math.nan, "e2e_count": 4.0})
    assert dict(values) == {"e2e_count": 4.0}


def test_a_series_holds_well_under_a_kibibyte_per_scrape() -> None:
    """The points of a recording are held until windows are cut: each must stay small (1.8 KiB each as dicts)."""
    read_scrapes(DATA / "sd.scrapes.xz", "warm-up")  # the parser's imports and caches, not the points
    gc.collect()
    tracemalloc.start()
    try:
        servers, _, scrapes = read_scrapes(DATA / "sd.scrapes.xz", "sd")
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    points = sum(len(found) for found in servers.values())
    assert points == scrapes > 200
    assert held / points < 1024  # measured 651 B: 8 bytes a quantity, the SD positions, the time


def test_finished_requests_come_from_one_counter_across_a_stretch() -> None:
    """The success counter dropping out at one point must not mix it with E2E's count in a difference.

    Successes 10 -> (missing) -> 30 while E2E counts every finish, failures too (12 -> 24 -> 36): read
    point by point, the first interval would count 24 - 10 = 14 finished and the second 30 - 24 = 6.
    """
    def point(t: float, e2e: float, completed: float | None) -> Point:
        values = {"e2e_sum": e2e * 0.1, "e2e_count": e2e, "running": 2.0, "waiting": 0.0}
        if completed is not None:
            values["completed"] = completed
        return Point(t, Values(values))

    stretches = clean([point(0.0, 12.0, 10.0), point(15.0, 24.0, None), point(30.0, 36.0, 30.0)])
    (stretch,) = stretches.stretches
    finished = [finished_so_far(p) for p in stretch]
    assert finished == [12.0, 24.0, 36.0]
    assert arrivals(list(stretch)) == [12.0, 12.0]
    # with the counter at every point, it is the one used
    (whole,) = clean([point(0.0, 12.0, 10.0), point(15.0, 24.0, 20.0), point(30.0, 36.0, 30.0)]).stretches
    assert [finished_so_far(p) for p in whole] == [10.0, 20.0, 30.0]
