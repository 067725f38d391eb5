"""Reading a Prometheus HTTP API export: the JSON of ``/api/v1/query_range``.

What to export: the raw vLLM series, not rates or sums of them (a result must carry its ``__name__``),
over the time to calibrate from, with a step of about the scrape interval, e.g.::

    curl -G http://127.0.0.1:9090/api/v1/query_range \\
         --data-urlencode 'query={__name__=~"vllm:.+",__name__!~".+_(bucket|created)"}' \\
         --data-urlencode start=2026-11-29T00:00:00Z --data-urlencode end=2026-11-29T01:00:00Z \\
         --data-urlencode step=15s > export.json

The file (plain, gzip or xz) may hold one response, a JSON array of responses (one per query, e.g. one per metric), or
one response per line; or the series alone, a JSON array of them, as ``promtool query range -o json
http://PROMETHEUS:9090 QUERY --start ... --end ... --step 15s`` prints them. Prometheus returns each series'
values at the same step times, so the values at one time are one moment of the server
(:class:`sdplan.metrics.series.Point`). Values are strings; ``"NaN"`` and ``"+Inf"`` are read as such and
skipped like a scrape's.

As Prometheus answers: ``status: error`` is a one-line error naming its ``errorType`` and ``error``;
``warnings`` (and ``infos``), sent with data that may be partial (a remote store that did not answer), are
counted in the summary line with the first of them; a ``vector`` (an instant query) is one moment, so a file of
instant queries at several times reads as a series and a single one is refused (a window needs two moments);
``scalar`` and ``string`` results have no series and are refused.
"""

from __future__ import annotations

import lzma
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdplan.errors import InputFileError, MissingDependencyError
from sdplan.metrics.series import REPEATED, Identity, Point, SeriesBuilder, SeriesSpans
from sdplan.metrics.textfile import open_binary

_BOM = b"\xef\xbb\xbf"


#: The head of a bare list of series, as ``promtool query range -o json`` writes the matrix alone (Go encodes a
#: series' ``metric`` first; ``jq -S`` sorts it first too).
_BARE_SERIES = re.compile(r'\A(?:\ufeff)?\s*\[\s*\{\s*"metric"\s*:')
#: The keys that make an object of a top-level list a series rather than a response.
_SERIES_KEYS = frozenset({"metric", "values", "value", "histograms"})


def is_query_range(head: str) -> bool:
    """Whether a file's head looks like a Prometheus API response (a matrix, or vectors of instant queries), or
    the series of one alone, as ``promtool query range -o json`` prints them."""
    return ('"resultType"' in head and ('"matrix"' in head or '"vector"' in head)) or bool(_BARE_SERIES.match(head))


def read_query_range(path: Path, where: str) -> tuple[Iterator[tuple[Identity, Point]], Counter[str], int]:
    """Each server's points in an export (made as they are taken), the samples skipped by reason, and the number
    of step times.

    The file is parsed as it is read (``ijson``, a maintained iterative JSON parser): one series at a time
    is held as JSON, and its samples go at once into columns of doubles (:class:`SeriesBuilder`), so what is
    held grows with the values kept (8 bytes each), not with the file's text. An export is ordered by series,
    so no moment is complete before the file ends; the points are then made one at a time, each server's in
    time order, for the windows to take as they come (:func:`sdplan.metrics.windows.streamed_runs`).

    Raises
    ------
    InputFileError
        For a file that is not JSON, an error response, an instant query (no range), or results without a
        metric name (a ``rate()`` or ``sum()`` query): each names the fix.
    MissingDependencyError
        Without the ``ijson`` package.
    """
    builder = SeriesBuilder()
    skipped: Counter[str] = Counter()
    spans = SeriesSpans()  # a series given twice is read once
    warnings: list[str] = []

    def add(series: Any, label: str) -> None:
        metric = series.get("metric")
        if not isinstance(metric, dict) or "__name__" not in metric:
            raise InputFileError(where, f"{label}: metric", "a result without __name__ (a rate(), sum() or "
                                 "other computed query); export the raw series, e.g. "
                                 "query={__name__=~\"vllm:.+\"}")
        name = str(metric["__name__"])
        labels = {str(key): str(value) for key, value in metric.items()}
        # a range query's series has its values, an instant query's (a vector) one value
        values = series.get("values") if "values" in series else [series["value"]] if "value" in series else None
        if not isinstance(values, list):
            raise InputFileError(where, f"{label}: {name}: values", "expected a list of [time, \"value\"]")
        key = spans.series(labels)
        check = spans.seen(key)  # the common case, a series given once, takes no test per sample
        low, high = math.inf, -math.inf
        for pair in values:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise InputFileError(where, f"{label}: {name}: values", "expected [time, \"value\"] pairs")
            time_s, value = _number(pair[0]), _number(pair[1])
            if time_s is None or not math.isfinite(time_s):
                raise InputFileError(where, f"{label}: {name}: values", f"time {pair[0]!r} is not a number")
            if check and spans.repeats(key, time_s):
                skipped[REPEATED] += 1
                continue
            if time_s < low:
                low = time_s
            if time_s > high:
                high = time_s
            builder.add(time_s, name, labels, math.nan if value is None else value)
        if not check and low <= high:
            spans.read(key, low, high)

    for response in _responses(path, where, add):
        warnings += response.warnings
    steps = builder.moments()
    if steps == 1:
        raise InputFileError(where, None, "one moment only (an instant query, or a range of one step): a window needs "
                                          "two; export /api/v1/query_range over a span of time")
    skipped.update({f"samples of {name} that were NaN or infinite": count
                    for name, count in builder.non_finite.items()})
    if warnings:  # e.g. partial data from a remote store: the export may lack samples
        skipped[f"warnings from Prometheus with the data (the first: {warnings[0][:160]})"] = len(warnings)
    return builder.stream(), skipped, steps


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)  # "NaN", "+Inf" and "-Inf" included
        except ValueError:
            return None
    return None


@dataclass
class _Response:
    """What one response says besides its series, checked when it ends (:meth:`check`)."""

    label: str
    status: Any = None
    error_type: Any = None
    error: Any = None
    kind: Any = None
    result: str | None = None  # the JSON type of data.result: "array", "object" or a scalar's event
    warnings: list[str] = field(default_factory=list)

    def check(self, where: str) -> None:
        """Raises the response's error, as Prometheus answered or as its data is not a query_range matrix."""
        if self.status == "error":
            raise InputFileError(where, self.label, f"Prometheus answered an error ({self.error_type}: "
                                                    f"{self.error}); fix the query and export again")
        if self.result is None:
            raise InputFileError(where, f"{self.label}: data.result", "missing; save the whole query_range response")
        if self.kind not in ("matrix", "vector"):
            raise InputFileError(where, f"{self.label}: data.resultType", f"is {self.kind!r}, not 'matrix': a "
                                 f"{self.kind} has no series; export /api/v1/query_range of the raw series over a "
                                 "span of time")
        if self.result != "array":
            raise InputFileError(where, f"{self.label}: data.result", "expected a list of series")


#: Keys of a response (after its ``data.``, which a bare data object lacks) and what they set.
_SCALARS = {"status": "status", "errorType": "error_type", "error": "error", "resultType": "kind"}


def _responses(path: Path, where: str, add: Callable[[Any, str], None]) -> Iterator[_Response]:
    """The responses of a file (one, a JSON array of them, or one per line), each once it ends and is checked;
    ``add(series, label)`` is given every series object of their ``data.result`` as it is parsed, and every
    series of a top-level list of series alone (``promtool query range -o json`` prints the matrix so).

    Notes
    -----
    Prometheus writes ``status`` before ``data`` and ``resultType`` before ``result``, but a file saved through
    ``jq -S`` sorts them the other way, so nothing is decided before a response ends: a series is read as a
    range query's (``values``) or an instant query's (``value``) by its own keys. Items of ``data.result`` that
    are not objects are passed over, as before; a ``scalar`` or ``string`` result is refused at the end.
    """
    try:
        import ijson
    except ImportError:  # pragma: no cover - a dependency of sdplan
        raise MissingDependencyError("reading a Prometheus API export needs the ijson package; pip install ijson") \
            from None
    count = 0
    bare = 0  # series of a top-level list, outside any response
    fresh = False  # an object of the top level has begun and shown no key yet
    in_array = False  # the file's top level is an array (of responses, or of series alone)
    response: _Response | None = None
    series: Any = None  # the series object being built, and its prefix
    series_prefix = series_label = ""
    try:
        with open_binary(path) as stream:
            if stream.peek(3)[:3] == _BOM:  # type: ignore[attr-defined]
                stream.read(3)
            if not stream.peek(1):  # type: ignore[attr-defined]
                raise InputFileError(where, None, "empty: no query_range response in it; save the response of "
                                                  "/api/v1/query_range as it came")
            for prefix, event, value in ijson.parse(stream, multiple_values=True, use_float=True):
                if series is not None:
                    series.event(event, value)
                    if prefix == series_prefix and event == "end_map":
                        add(series.value, series_label)
                        series = None
                    continue
                base = "item" if in_array else ""
                if prefix == "" and event in ("start_array", "end_array") and response is None:
                    in_array = event == "start_array"
                    continue
                if prefix == base and event != "map_key":  # a response starts or ends, or is not an object
                    if event == "start_map":
                        count += 1
                        response = _Response(f"response {count}")
                        fresh = True
                    elif event == "end_map" and response is not None:
                        response.check(where)
                        yield response
                        response = None
                    else:
                        raise InputFileError(where, f"response {count + 1}",
                                             "expected a query_range response object")
                    continue
                if event == "map_key":
                    if fresh and in_array and value in _SERIES_KEYS:  # not a response: a series alone
                        count, bare, response = count - 1, bare + 1, None
                        series = ijson.ObjectBuilder()
                        series.event("start_map", None)
                        series.event(event, value)
                        series_prefix, series_label = base, f"series {bare}"
                    fresh = False
                    continue
                key = prefix[len(base) + 1:] if base else prefix
                key = key.removeprefix("data.")
                if key in _SCALARS and response is not None:
                    setattr(response, _SCALARS[key], value)
                elif key in ("warnings.item", "infos.item") and response is not None:
                    response.warnings.append(str(value))
                elif key == "result" and response is not None and event != "end_array" and event != "end_map":
                    response.result = event.removeprefix("start_")
                elif key == "result.item" and event == "start_map":
                    series = ijson.ObjectBuilder()
                    series.event(event, value)
                    series_prefix = prefix
                    series_label = response.label if response is not None else ""
    except ijson.JSONError as error:
        raise InputFileError(where, None, f"invalid JSON ({str(error).splitlines()[0][:120]}); save the "
                                          "query_range response as it came, one response or one per line") from None
    except OSError as error:
        raise InputFileError(where, None, f"cannot read ({error.strerror or error}); check the path") from None
    except (EOFError, lzma.LZMAError) as error:
        raise InputFileError(where, None, f"compressed stream broken ({error}); recompress it") from None
    if count == 0 and not bare:
        raise InputFileError(where, None, "no query_range response in it; save the response of "
                                          "/api/v1/query_range as it came")
