"""The time series of one vLLM server, from either source, cleaned into stretches windows can be cut from.

A source (a scrape file, a ``query_range`` export) yields samples ``(time, sample name, labels, value)``.
:class:`SeriesBuilder` sums them per server and moment into :class:`Point` records of quantities
(:mod:`sdplan.metrics.names`); :class:`StreamCleaner` then drops, point by point, what cannot be used and
cuts the series where differences of counters would mean nothing, counting each case for the report:

* a point without E2E latency (a scrape that missed the series), or whose counters are NaN: skipped;
* a time not after the one before (a clock stepped back, a scrape written twice): skipped;
* a counter lower than before (the server restarted and counted from zero again): the series is cut there;
* a gap of more than :data:`GAP_FACTOR` typical intervals (the scraper or the server was down): cut there.

Nothing is extrapolated across a cut: a window lies within one stretch.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from sdplan.metrics import names

#: A stretch ends where the time between two points exceeds this many times the median interval (:data:`GAP_HISTORY`).
GAP_FACTOR = 5.0
#: A gap is judged against the median of this many intervals before it (about 16 minutes of 15-second scrapes: a
#: few late scrapes do not move it, and a changed scrape interval is followed after 32 intervals, 8 minutes).
GAP_HISTORY = 63
RESET_REASON = "counter resets (a restarted server): series cut there"
#: A counter is taken to have restarted when it falls by more than this fraction (floating noise aside).
RESET_TOLERANCE = 1e-9

#: A server's identity: its labels other than :data:`~sdplan.metrics.names.SUMMED_LABELS`, sorted.
Identity = tuple[tuple[str, str], ...]


#: Every quantity a point may hold, in the order of its stored values (:class:`Values`).
QUANTITIES: tuple[str, ...] = (*names.COUNTERS, *names.GAUGES)
_SLOT = {quantity: index for index, quantity in enumerate(QUANTITIES)}


class Values(Mapping[str, float]):
    """A point's quantities, read-only, stored as one array of doubles with NaN for a quantity absent.

    Windows hold their open window's points (:class:`sdplan.metrics.windows.Windows`), so each point's
    storage counts: as a dict of its 27 quantities, a float object each, a point of an SD server held 1.8 KiB;
    as an array of 8 bytes a quantity it holds 0.65 KiB
    (measured with ``tracemalloc`` on tests/data/prometheus-cpu, tests/test_metrics_series.py). NaN
    can stand for "absent" because a NaN value is dropped before a point is made (:func:`_resolve`).
    """

    __slots__ = ("_array",)

    def __init__(self, values: Mapping[str, float]) -> None:
        unknown = set(values) - _SLOT.keys()
        if unknown:
            raise KeyError(f"not a quantity of sdplan.metrics.names: {sorted(unknown)}")
        self._array = array("d", (values.get(quantity, math.nan) for quantity in QUANTITIES))

    def __getitem__(self, quantity: str) -> float:
        value = self._array[_SLOT[quantity]]
        if math.isnan(value):
            raise KeyError(quantity)
        return value

    def __iter__(self) -> Iterator[str]:
        return (quantity for quantity, value in zip(QUANTITIES, self._array) if not math.isnan(value))

    def __len__(self) -> int:
        return sum(not math.isnan(value) for value in self._array)

    def __repr__(self) -> str:
        return f"Values({dict(self.items())!r})"


@dataclass(frozen=True, slots=True)
class Point:
    """One moment of one server: each quantity's value then (counters since the server started).

    Attributes
    ----------
    time_s : float
        Unix time of the scrape (s).
    values : Values
        Quantity (:mod:`sdplan.metrics.names`) -> value; a quantity the source lacks is absent.
    failed : float or None
        Requests finished as ``abort`` or ``error`` (a counter), None without ``vllm:request_success_total``.
    positions : tuple of float
        Accepted draft tokens per position (counters; empty without SD).
    """

    time_s: float
    values: Values
    failed: float | None = None
    positions: tuple[float, ...] = ()

    def counter(self, quantity: str) -> float | None:
        return self.values.get(quantity)


#: A cell of :class:`SeriesBuilder` that no sample reached.
_ABSENT = math.nan
#: A cell that a NaN or infinite sample reached: the sum means nothing, and the point drops the quantity. Stored as
#: ``+inf``, which stays ``+inf`` whatever finite value is added to it, so that "absent" (NaN) stays apart.
_POISONED = math.inf


def _add_cell(column: array[float], row: int, value: float) -> None:
    """Add ``value`` (finite, or :data:`_POISONED`) to a column's cell ``row``, growing the column as needed."""
    if len(column) <= row:
        column.extend([_ABSENT] * (row + 1 - len(column)))
    held = column[row]
    column[row] = value if math.isnan(held) else held + value


def _cell(column: array[float], row: int) -> float:
    return column[row] if row < len(column) else _ABSENT


@dataclass(slots=True)
class _Server:
    """One server's samples by column: a row per moment, a column of doubles per sample name (8 bytes a value)."""

    #: time -> row, in the order the source gave the times
    rows: dict[float, int] = field(default_factory=dict)
    #: sample name -> summed value per row (:data:`_ABSENT`, :data:`_POISONED`)
    sums: dict[str, array[float]] = field(default_factory=dict)
    #: averaged sample name -> how many series were summed per row (the gauges averaged over engines)
    terms: dict[str, array[float]] = field(default_factory=dict)
    #: requests finished as failures per row (absent where no such series was given)
    failed: array[float] = field(default_factory=lambda: array("d"))
    #: draft position -> accepted tokens per row
    positions: dict[int, array[float]] = field(default_factory=dict)

    def row(self, time_s: float) -> int:
        return self.rows.setdefault(time_s, len(self.rows))

    def point(self, time_s: float, row: int) -> Point | None:
        """The point of one row; None for a row without any quantity (per-position samples alone)."""
        sums: dict[str, float] = {}
        for name, column in self.sums.items():
            value = _cell(column, row)
            if not math.isnan(value):
                terms = _cell(self.terms[name], row) if name in self.terms else math.nan
                # a fraction of each engine's own cache: their mean, not their sum
                sums[name] = math.nan if value == _POISONED else value / terms if terms > 0 else value
        if not sums:
            return None
        values = _resolve(sums)
        given = {position: value for position, column in self.positions.items()
                 if not math.isnan(value := _cell(column, row))}
        ordered = tuple(given[i] if math.isfinite(given.get(i, math.nan)) else math.nan
                        for i in range(max(given) + 1)) if given else ()
        failed = _cell(self.failed, row)
        failed_or_none = None if "completed" not in values or math.isnan(failed) else \
            math.nan if failed == _POISONED else failed
        return Point(time_s, Values(values), failed_or_none, ordered)


@dataclass
class SeriesBuilder:
    """Accumulates samples into points, per server and time; then :meth:`points` or :meth:`stream`.

    The samples are held by column (:class:`_Server`: a double per sample name and moment), not as a point per
    moment, so a source ordered by series rather than time (a ``query_range`` export, a ``promtool tsdb dump``),
    which must be read to its end before its first moment is complete, holds about 8 bytes a value kept until
    then; :meth:`stream` then makes the points one at a time. Read into runs, a 5 MB export peaked at 9.1 MiB
    with a point held per moment (1.9 times the file) and peaks at 2.6 MiB by column
    (tests/test_metrics_formats.py).
    """

    _servers: dict[Identity, _Server] = field(default_factory=dict)
    #: Samples with a value that is not a finite number, per sample name.
    non_finite: Counter[str] = field(default_factory=Counter)

    def add(self, time_s: float, name: str, labels: dict[str, str], value: float) -> None:
        """One sample; ``name`` is a sample name of :data:`~sdplan.metrics.names.SAMPLE_QUANTITY`."""
        quantity = names.SAMPLE_QUANTITY.get(name)
        if quantity is None and name.startswith(names.ALIAS_PREFIXES):  # vllm_x, ray_vllm:x (a Prometheus export)
            name = names.canonical(name)
            quantity = names.SAMPLE_QUANTITY.get(name)
        if quantity is None:
            return
        if quantity == "inf_bucket" and labels.get("le") not in ("+Inf", "Inf", "inf"):
            return
        identity = tuple(sorted((key, text) for key, text in labels.items() if key not in names.SUMMED_LABELS))
        if not math.isfinite(value):
            self.non_finite[name] += 1
            value = _POISONED  # poisons the sum: the point drops this quantity
        server = self._servers.get(identity)
        if server is None:
            server = self._servers[identity] = _Server()
        row = server.row(time_s)
        if quantity == "per_position":
            try:
                position = int(labels.get("position", ""))
            except ValueError:
                return
            _add_cell(server.positions.setdefault(position, array("d")), row, value)
            return
        _add_cell(server.sums.setdefault(name, array("d")), row, value)
        if name in names.AVERAGED_NAMES:
            _add_cell(server.terms.setdefault(name, array("d")), row, 1.0)
        if name in names.COUNTERS["completed"] and labels.get("finished_reason") in names.FAILED_REASONS:
            _add_cell(server.failed, row, value)

    def moments(self) -> int:
        """How many distinct times the samples gave, over every server."""
        return len({time_s for server in self._servers.values() for time_s in server.rows})

    def points(self) -> dict[Identity, list[Point]]:
        """Each server's points, in the order the source gave their times (not sorted: see :class:`StreamCleaner`)."""
        servers: dict[Identity, list[Point]] = {}
        for identity, server in self._servers.items():
            found = [point for time_s, row in server.rows.items() if (point := server.point(time_s, row))]
            if found:
                servers[identity] = found
        return servers

    def stream(self) -> Iterator[tuple[Identity, Point]]:
        """Each server's points in time order, made one at a time; a server's columns are let go once it is done."""
        while self._servers:
            identity = next(iter(self._servers))
            server = self._servers.pop(identity)
            for time_s, row in sorted(server.rows.items()):
                point = server.point(time_s, row)
                if point is not None:
                    yield identity, point

    def clear(self) -> None:
        self._servers.clear()


#: What the samples of a series given again for a time already read are counted as (:class:`SeriesSpans`).
REPEATED = "samples of a series given again for times already read (overlapping exports or queries): read once"


class SeriesSpans:
    """The spans of time read per series (its exact labels), so that a series given twice is read once.

    A series has one value per time. Sources that give it again (two queries of one export that match it,
    exports of overlapping spans put together, a dump concatenated twice) must not have it summed, as the
    series of another engine or finish reason are (:class:`SeriesBuilder`), nor have it reset the counters.
    A sample at a time within a span read for its series is a repeat. A sample after the series' latest
    span extends it: a series is read in time order, by scrapes or within an export, so each keeps one span
    per stretch read; a gap between two exports read out of order is taken as read (their later samples are
    still read, but a third export filling that gap would be counted as repeats).
    """

    def __init__(self) -> None:
        self._spans: dict[tuple[tuple[str, str], ...], list[list[float]]] = {}

    @staticmethod
    def series(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """A series' key: its labels (its name among them), sorted."""
        return tuple(sorted(labels.items()))

    def seen(self, series: tuple[tuple[str, str], ...]) -> bool:
        """Whether any time of ``series`` was read yet."""
        return series in self._spans

    def read(self, series: tuple[tuple[str, str], ...], low_s: float, high_s: float) -> None:
        """Take ``[low_s, high_s]`` of a series not :meth:`seen` before as read (its samples were taken at once)."""
        self._spans[series] = [[low_s, high_s]]

    def repeats(self, series: tuple[tuple[str, str], ...], time_s: float) -> bool:
        """Whether ``series`` (:meth:`series`) was already read at ``time_s``; if not, it is now."""
        spans = self._spans.setdefault(series, [])
        if any(low <= time_s <= high for low, high in spans):
            return True
        if spans and time_s > spans[-1][1]:
            spans[-1][1] = time_s
        else:
            spans.append([time_s, time_s])
        return False


def _resolve(sums: dict[str, float]) -> dict[str, float]:
    """Sample names -> quantities: each quantity's first name present (newest vLLM first); NaN drops it.

    A histogram's ``+Inf`` bucket stands in for its ``_count`` where that is missing (the same number).
    """
    values: dict[str, float] = {}
    for quantity, candidates in (*names.COUNTERS.items(), *names.GAUGES.items()):
        for name in candidates:
            if name not in sums and names.INF_BUCKETS.get(name) in sums:
                name = names.INF_BUCKETS[name]
            if name in sums:
                value = sums[name]
                if math.isfinite(value):
                    values[quantity] = value
                break
    return values


# ----------------------------------------------------------------------------- cleaning


class StreamCleaner:
    """The rules of the module notes applied one point at a time, holding the last point and the recent intervals.

    :meth:`add` tells what a point is: skipped (None), the start of a stretch (True), or the next point of the
    stretch (False). A stretch may end with one point; it holds no window.

    The gap rule's typical interval is the median of the :data:`GAP_HISTORY` intervals before the point (a gap
    then joins them, one of many), not the whole series' median, which needs every interval held and so grows with
    the file (it did until 2026-11-29). For a scraper at a steady interval the two are the same; they differ
    where the interval changes (the rule follows the new one after :data:`GAP_HISTORY` / 2 intervals) and at a
    series' first interval, which has none before it and is never a gap.
    """

    def __init__(self) -> None:
        #: points skipped by reason (reported before the cuts)
        self._dropped: Counter[str] = Counter()
        #: "reset" or "gap" -> cuts, in the order first met
        self._cuts: Counter[str] = Counter()
        self._last: Point | None = None
        self._recent: deque[float] = deque()
        self._sorted: list[float] = []

    def add(self, point: Point) -> bool | None:
        """Whether ``point`` starts a stretch (True), continues it (False), or is skipped (None)."""
        reason = _unusable(point, self._last)
        if reason is not None:
            self._dropped[reason] += 1
            return None
        last, self._last = self._last, point
        if last is None:
            return True
        interval = point.time_s - last.time_s
        typical = self.interval_s
        self._remember(interval)
        if _restarted(last, point):
            self._cuts["reset"] += 1
            return True
        if typical > 0 and interval > GAP_FACTOR * typical:
            self._cuts["gap"] += 1
            return True
        return False

    @property
    def interval_s(self) -> float:
        """Median of the recent intervals (s; the upper one of an even count); 0 before any."""
        return self._sorted[len(self._sorted) // 2] if self._sorted else 0.0

    def skipped(self) -> dict[str, int]:
        """Reason -> points skipped or cuts made so far (the gaps named with the recent median interval)."""
        found = dict(self._dropped)
        for kind, count in self._cuts.items():
            found[RESET_REASON if kind == "reset" else gap_reason(self.interval_s)] = count
        return found

    def _remember(self, interval: float) -> None:
        self._recent.append(interval)
        bisect.insort(self._sorted, interval)
        if len(self._recent) > GAP_HISTORY:
            del self._sorted[bisect.bisect_left(self._sorted, self._recent.popleft())]


def _unusable(point: Point, last: Point | None) -> str | None:
    """Why ``point`` is skipped after the usable point ``last``, or None."""
    missing = [names.SHOWN[q] for q in names.REQUIRED if q not in point.values]
    if missing:
        return f"scrapes without {missing[0]} (or with NaN in it)"
    if last is not None and point.time_s <= last.time_s:
        return "scrapes whose time is not after the one before (a clock set back, or written twice)"
    return None


def gap_reason(interval_s: float) -> str:
    return f"gaps over {GAP_FACTOR:g}x the {interval_s:.3g} s interval: series cut there"


def one_finished_counter(stretch: list[Point]) -> list[Point]:
    """The points (a window's), counting finished requests by E2E's count throughout where the success counter comes
    and goes.

    :func:`finished_so_far` falls back on the E2E histogram's count at a point without
    ``vllm:request_success_total`` (a series that drops out of a ``query_range`` export for a while); a
    difference between two points must come from one counter, or it mixes successes with all finished requests.
    """
    present = ["completed" in point.values for point in stretch]
    if all(present) or not any(present):
        return stretch
    return [replace(point, values=Values({q: v for q, v in point.values.items() if q != "completed"}))
            for point in stretch]


def _restarted(before: Point, after: Point) -> bool:
    """Whether a counter present in both points fell (the server counted from zero again)."""
    for quantity in names.COUNTERS:
        old, new = before.values.get(quantity), after.values.get(quantity)
        if old is not None and new is not None and new < old - RESET_TOLERANCE * max(abs(old), 1.0):
            return True
    return any(new < old - RESET_TOLERANCE * max(abs(old), 1.0)
               for old, new in zip(before.positions, after.positions) if math.isfinite(old) and math.isfinite(new))


# ----------------------------------------------------------------------------- load at a point


def in_flight(point: Point) -> float | None:
    """Requests running, waiting and swapped out (vLLM V0) at a point (None without the gauges).

    A request V0 swapped out to CPU memory under KV pressure has arrived and not finished: it is in flight.
    """
    running, waiting = point.values.get("running"), point.values.get("waiting")
    return None if running is None else running + (waiting or 0.0) + point.values.get("swapped", 0.0)


def finished_so_far(point: Point) -> float:
    """Requests finished so far, failures included (E2E's count without the success counter)."""
    return point.values.get("completed", point.values["e2e_count"])


def arrivals(points: Sequence[Point]) -> list[float] | None:
    """Arrivals per interval between points, ``Delta finished + Delta in flight`` (>= 0); None without gauges."""
    flights = [in_flight(p) for p in points]
    if any(f is None for f in flights):
        return None
    return [max(finished_so_far(b) - finished_so_far(a) + (flights[i + 1] or 0.0) - (flights[i] or 0.0), 0.0)
            for i, (a, b) in enumerate(zip(points, points[1:]))]
