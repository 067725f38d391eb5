"""A point's stored quantities (:class:`sdplan.metrics.series.Values`) and what a series of points holds in memory."""

from __future__ import annotations

import gc
import math
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest

from sdplan.metrics import names
from sdplan.metrics.series import (
    GAP_HISTORY,
    QUANTITIES,
    Point,
    SeriesBuilder,
    StreamCleaner,
    Values,
    arrivals,
    finished_so_far,
    one_finished_counter,
)
from sdplan.metrics.windows import AUTO_HOLD_S, AUTO_PIECE_S, AutoWindows, WindowSettings
from sdplan.runs import read_results
from tests.prometheus_recording import blocks, points_by_server, replayed, write

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
    points_by_server(DATA / "sd.scrapes.xz", "warm-up")  # the parser's imports and caches, not the points
    gc.collect()
    tracemalloc.start()
    try:
        servers, counts = points_by_server(DATA / "sd.scrapes.xz", "sd")
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    points = sum(len(found) for found in servers.values())
    assert points == counts.scrapes > 200
    assert held / points < 1024  # measured 651 B: 8 bytes a quantity, the SD positions, the time


def _point(t: float, e2e: float, completed: float | None = None) -> Point:
    values = {"e2e_sum": e2e * 0.1, "e2e_count": e2e, "running": 2.0, "waiting": 0.0}
    if completed is not None:
        values["completed"] = completed
    return Point(t, Values(values))


def test_the_builder_sums_engines_and_lets_a_bad_sample_drop_its_quantity() -> None:
    """Samples are summed per server and moment across the labels that split a server (engines, finish reasons),
    in whatever order they come; a NaN from one engine drops that moment's quantity, not its others, and the
    KV cache usage is the engines' mean. A moment's points come out once, in time order per server."""
    builder = SeriesBuilder()
    server = {"model_name": "m"}
    samples = [  # (time, name, extra labels, value), given by series as an export orders them
        (2.0, "vllm:e2e_request_latency_seconds_sum", {"engine": "0"}, 3.0),
        (1.0, "vllm:e2e_request_latency_seconds_sum", {"engine": "0"}, 1.0),
        (1.0, "vllm:e2e_request_latency_seconds_sum", {"engine": "1"}, 0.5),
        (2.0, "vllm:e2e_request_latency_seconds_sum", {"engine": "1"}, math.nan),
        (1.0, "vllm:e2e_request_latency_seconds_count", {"engine": "0"}, 4.0),
        (2.0, "vllm:e2e_request_latency_seconds_count", {"engine": "0"}, 6.0),
        (1.0, "vllm:kv_cache_usage_perc", {"engine": "0"}, 0.2),
        (1.0, "vllm:kv_cache_usage_perc", {"engine": "1"}, 0.4),
        (1.0, "vllm:request_success_total", {"finished_reason": "stop"}, 3.0),
        (1.0, "vllm:request_success_total", {"finished_reason": "abort"}, 1.0),
        (2.0, "vllm:request_success_total", {"finished_reason": "stop"}, 5.0),
        (1.0, "vllm:spec_decode_num_accepted_tokens_per_pos_total", {"position": "1"}, 7.0),
    ]
    for time_s, name, labels, value in samples:
        builder.add(time_s, name, {**server, **labels}, value)
    first, second = [point for _, point in builder.stream()]
    assert (first.time_s, second.time_s) == (1.0, 2.0)
    assert dict(first.values) == {"e2e_sum": 1.5, "e2e_count": 4.0, "kv_cache": pytest.approx(0.3),
                                  "completed": 4.0}
    assert first.failed == 1.0 and len(first.positions) == 2 and math.isnan(first.positions[0]) \
        and first.positions[1] == 7.0
    assert dict(second.values) == {"e2e_count": 6.0, "completed": 5.0}  # the NaN dropped e2e_sum only
    assert second.failed is None and second.positions == ()
    assert builder.non_finite == Counter({"vllm:e2e_request_latency_seconds_sum": 1})
    assert list(builder.stream()) == []  # let go once made


def test_finished_requests_come_from_one_counter_across_a_window() -> None:
    """The success counter dropping out at one point must not mix it with E2E's count in a difference.

    Successes 10 -> (missing) -> 30 while E2E counts every finish, failures too (12 -> 24 -> 36): read
    point by point, the first interval would count 24 - 10 = 14 finished and the second 30 - 24 = 6.
    """
    window = one_finished_counter([_point(0.0, 12.0, 10.0), _point(15.0, 24.0, None), _point(30.0, 36.0, 30.0)])
    assert [finished_so_far(p) for p in window] == [12.0, 24.0, 36.0]
    assert arrivals(window) == [12.0, 12.0]
    # with the counter at every point, it is the one used
    whole = one_finished_counter([_point(0.0, 12.0, 10.0), _point(15.0, 24.0, 20.0), _point(30.0, 36.0, 30.0)])
    assert [finished_so_far(p) for p in whole] == [10.0, 20.0, 30.0]


def test_the_stream_cleaner_cuts_at_gaps_resets_and_skips_clocks_set_back() -> None:
    """Point by point: 15 s scrapes, one 80 s gap (over 5 x 15 s), a counter reset, a scrape back in time."""
    times = [15.0 * i for i in range(10)] + [135.0 + 80.0] + [215.0 + 15.0 * i for i in range(1, 5)]
    e2e = [10.0 * i for i in range(len(times))]
    points = [_point(t, e) for t, e in zip(times, e2e)]
    points.insert(12, _point(times[11] - 1.0, e2e[11]))  # written twice, a second early
    points.append(_point(times[-1] + 15.0, 1.0))  # restarted: counts from zero again
    cleaner = StreamCleaner()
    starts = [cleaner.add(point) for point in points]
    assert [i for i, s in enumerate(starts) if s] == [0, 10, 16]
    assert starts[12] is None and starts.count(None) == 1
    assert cleaner.interval_s == 15.0
    assert cleaner.skipped() == {
        "scrapes whose time is not after the one before (a clock set back, or written twice)": 1,
        "gaps over 5x the 15 s interval: series cut there": 1,
        "counter resets (a restarted server): series cut there": 1}


def test_the_gap_rule_follows_a_changed_scrape_interval() -> None:
    """From 15 s to 90 s scrapes: 90 s is a gap against 15 s, until the recent intervals' median is 90 s."""
    times = [15.0 * i for i in range(GAP_HISTORY + 1)]
    times += [times[-1] + 90.0 * i for i in range(1, GAP_HISTORY + 1)]
    cleaner = StreamCleaner()
    cuts = [i for i, point in enumerate(_point(t, float(i)) for i, t in enumerate(times)) if cleaner.add(point)]
    first_slow = GAP_HISTORY + 1
    assert cuts[0] == 0 and cuts[1] == first_slow
    assert cuts[-1] == first_slow + GAP_HISTORY // 2  # the median turns to 90 s with 32 of the 63 intervals
    assert cleaner.interval_s == 90.0


def _held_while_reading(path: Path, window_s: float | None) -> int:
    """Bytes the reading of ``path`` into windows held at its peak beyond what it returned (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    try:
        runs, _ = read_results(path, window_s=window_s)
        gc.collect()
        returned, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert runs
    return peak - returned


@pytest.mark.parametrize("window_s", [300.0, None])
def test_windows_hold_a_window_not_the_file(tmp_path: Path, window_s: float | None) -> None:
    """Reading 4x the scrapes into windows (5-minute ones; auto ones) must not hold 4x the memory: points are
    dropped once their window is cut. The scrapes are the real recording's, replayed with counters carried on (as
    a day of them is built by benchmarks/bench_metrics_day.py); before windows were cut while reading, every point
    was held (about 512 B a scrape) and the ratio was about 3."""
    scrapes = len(blocks("nosd"))
    short = write(tmp_path / "short.scrapes", replayed("nosd", scrapes))
    long = write(tmp_path / "long.scrapes", replayed("nosd", 4 * scrapes))
    read_results(short, window_s=window_s)  # the parser's imports and caches, not the reading
    held_short, held_long = _held_while_reading(short, window_s), _held_while_reading(long, window_s)
    assert held_long < 1.5 * held_short, (held_short, held_long)


def test_a_server_that_never_idles_holds_an_hour_of_auto_windows() -> None:
    """Two hours without a lull (requests always in flight): the spell is ended at AUTO_HOLD_S, so at most an
    hour's points are held, and its windows are still pieces of about AUTO_PIECE_S."""
    def point(i: int) -> Point:  # 2 requests a second, always 4 in flight, 100 tokens in, 50 out
        done = 30.0 * i
        return Point(15.0 * i, Values({"e2e_sum": 2.0 * done, "e2e_count": done, "running": 4.0, "waiting": 0.0,
                                       "prompt_sum": 100.0 * done, "prompt_count": done,
                                       "output_sum": 50.0 * done, "output_count": done}))

    windows = AutoWindows("busy", WindowSettings())
    most = 0
    for i in range(2 * 240 + 1):
        windows.add(point(i))
        most = max(most, windows.held)
    result = windows.finish("busy", Counter(), 481, ())
    assert most <= AUTO_HOLD_S / 15.0 + 2
    spans = [float(run.notes[0].split("(")[1].split(" s,")[0]) for run in result.runs]
    assert result.windows == len(result.runs) == round(2 * AUTO_HOLD_S / AUTO_PIECE_S)
    assert all(abs(span - AUTO_PIECE_S) <= 15.0 for span in spans), spans
