"""The time series of one vLLM server, from either source, cleaned into stretches windows can be cut from.

A source (a scrape file, a ``query_range`` export) yields samples ``(time, sample name, labels, value)``.
:class:`SeriesBuilder` sums them per server and moment into :class:`Point` records of quantities
(:mod:`sdplan.metrics.names`); :func:`clean` then drops what cannot be used and cuts the series where
differences of counters would mean nothing, counting each case for the report:

* a point without E2E latency (a scrape that missed the series), or whose counters are NaN: skipped;
* a time not after the one before (a clock stepped back, a scrape written twice): skipped;
* a counter lower than before (the server restarted and counted from zero again): the series is cut there;
* a gap of more than :data:`GAP_FACTOR` typical intervals (the scraper or the server was down): cut there.

Nothing is extrapolated across a cut: a window lies within one stretch.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from sdplan.metrics import names

#: A stretch ends where the time between two points exceeds this many times the median interval.
GAP_FACTOR = 5.0
#: A counter is taken to have restarted when it falls by more than this fraction (floating noise aside).
RESET_TOLERANCE = 1e-9

#: A server's identity: its labels other than :data:`~sdplan.metrics.names.SUMMED_LABELS`, sorted.
Identity = tuple[tuple[str, str], ...]


#: Every quantity a point may hold, in the order of its stored values (:class:`Values`).
QUANTITIES: tuple[str, ...] = (*names.COUNTERS, *names.GAUGES)
_SLOT = {quantity: index for index, quantity in enumerate(QUANTITIES)}


class Values(Mapping[str, float]):
    """A point's quantities, read-only, stored as one array of doubles with NaN for a quantity absent.

    A series is held whole until its windows are cut (every point may end a window), so each point's
    storage is what a long recording's memory grows with: as a dict of its 27 quantities, a float object
    each, a point of an SD server held 1.8 KiB; as an array of 8 bytes a quantity it holds 0.65 KiB
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


@dataclass
class SeriesBuilder:
    """Accumulates samples into points, per server and time; then :meth:`points`."""

    #: (identity, time) -> sample name -> summed value
    _sums: dict[tuple[Identity, float], dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    _failed: dict[tuple[Identity, float], float] = field(default_factory=lambda: defaultdict(float))
    _positions: dict[tuple[Identity, float], dict[int, float]] = field(default_factory=lambda: defaultdict(dict))
    #: (identity, time) -> sample name -> how many series were summed, for the gauges averaged over engines
    _terms: dict[tuple[Identity, float], Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
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
        key = (identity, time_s)
        if not math.isfinite(value):
            self.non_finite[name] += 1
            value = math.nan  # poisons the sum: the point drops this quantity
        if quantity == "per_position":
            try:
                position = int(labels.get("position", ""))
            except ValueError:
                return
            positions = self._positions[key]
            positions[position] = positions.get(position, 0.0) + value
            return
        sums = self._sums[key]
        sums[name] = sums.get(name, 0.0) + value
        if name in names.AVERAGED_NAMES:
            self._terms[key][name] += 1
        if name in names.COUNTERS["completed"] and labels.get("finished_reason") in names.FAILED_REASONS:
            self._failed[key] += value

    def points(self) -> dict[Identity, list[Point]]:
        """Each server's points, in the order the source gave their times (not sorted: see :func:`clean`)."""
        servers: dict[Identity, list[Point]] = defaultdict(list)
        for (identity, time_s), sums in self._sums.items():
            terms = self._terms.get((identity, time_s))
            if terms:  # a fraction of each engine's own cache: their mean, not their sum
                sums = {name: value / terms[name] if name in terms else value for name, value in sums.items()}
            values = _resolve(sums)
            positions = self._positions.get((identity, time_s), {})
            ordered = tuple(positions.get(i, math.nan) for i in range(max(positions) + 1)) if positions else ()
            failed = self._failed.get((identity, time_s)) if "completed" in values else None
            servers[identity].append(Point(time_s, Values(values), failed, ordered))
        return dict(servers)

    def clear(self) -> None:
        self._sums.clear()
        self._failed.clear()
        self._positions.clear()
        self._terms.clear()


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


@dataclass(frozen=True)
class Stretches:
    """A server's usable stretches of points and what was skipped or cut, counted."""

    stretches: tuple[tuple[Point, ...], ...]
    #: reason -> how many points (or cuts)
    skipped: dict[str, int]
    #: Median time between points (s).
    interval_s: float


def clean(points: list[Point]) -> Stretches:
    """The stretches of ``points`` that windows can be cut from (see the module notes)."""
    skipped: Counter[str] = Counter()
    usable: list[Point] = []
    for point in points:
        missing = [names.SHOWN[q] for q in names.REQUIRED if q not in point.values]
        if missing:
            skipped[f"scrapes without {missing[0]} (or with NaN in it)"] += 1
            continue
        if usable and point.time_s <= usable[-1].time_s:
            skipped["scrapes whose time is not after the one before (a clock set back, or written twice)"] += 1
            continue
        usable.append(point)
    gaps = sorted(b.time_s - a.time_s for a, b in zip(usable, usable[1:]))
    interval = gaps[len(gaps) // 2] if gaps else 0.0
    stretches: list[list[Point]] = []
    for point in usable:
        if stretches:
            last = stretches[-1][-1]
            if _restarted(last, point):
                skipped["counter resets (a restarted server): series cut there"] += 1
            elif interval > 0 and point.time_s - last.time_s > GAP_FACTOR * interval:
                skipped[f"gaps over {GAP_FACTOR:g}x the {interval:.3g} s interval: series cut there"] += 1
            else:
                stretches[-1].append(point)
                continue
        stretches.append([point])
    kept = [_one_finished_counter(s) for s in stretches if len(s) >= 2]
    return Stretches(tuple(tuple(s) for s in kept), dict(skipped), interval)


def _one_finished_counter(stretch: list[Point]) -> list[Point]:
    """The stretch, counting finished requests by E2E's count throughout where the success counter comes and goes.

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
