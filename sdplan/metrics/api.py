"""Reading a Prometheus HTTP API export: the JSON of ``/api/v1/query_range``.

What to export: the raw vLLM series, not rates or sums of them (a result must carry its ``__name__``),
over the time to calibrate from, with a step of about the scrape interval, e.g.::

    curl -G http://127.0.0.1:9090/api/v1/query_range \\
         --data-urlencode 'query={__name__=~"vllm:.+",__name__!~".+_(bucket|created)"}' \\
         --data-urlencode start=2026-11-29T00:00:00Z --data-urlencode end=2026-11-29T01:00:00Z \\
         --data-urlencode step=15s > export.json

The file (plain, gzip or xz) may hold one response, a JSON array of responses (one per query, e.g. one per metric), or
one response per line. Prometheus returns each series' values at the same step times, so the values
at one time are one moment of the server (:class:`sdplan.metrics.series.Point`). Values are strings;
``"NaN"`` and ``"+Inf"`` are read as such and skipped like a scrape's.

As Prometheus answers: ``status: error`` is a one-line error naming its ``errorType`` and ``error``;
``warnings`` (and ``infos``), sent with data that may be partial (a remote store that did not answer), are
counted in the summary line with the first of them; a ``vector`` (an instant query) is one moment, so a file of
instant queries at several times reads as a series and a single one is refused (a window needs two moments);
``scalar`` and ``string`` results have no series and are refused.
"""

from __future__ import annotations

import json
import lzma
import math
from collections import Counter
from pathlib import Path
from typing import Any

from sdplan.errors import InputFileError
from sdplan.metrics.series import Identity, Point, SeriesBuilder
from sdplan.metrics.textfile import open_text
from sdplan.runs.record import MAX_RESULT_BYTES


def is_query_range(head: str) -> bool:
    """Whether a file's head looks like a Prometheus API response: a matrix, or vectors of instant queries."""
    return '"resultType"' in head and ('"matrix"' in head or '"vector"' in head)


def read_query_range(path: Path, where: str) -> tuple[dict[Identity, list[Point]], Counter[str], int]:
    """Each server's points in an export, the samples skipped by reason, and the number of step times.

    Raises
    ------
    InputFileError
        For a file that is not JSON, an error response, an instant query (no range), or results without a
        metric name (a ``rate()`` or ``sum()`` query): each names the fix.
    """
    try:
        size = path.stat().st_size
        if size > MAX_RESULT_BYTES:
            raise InputFileError(where, None, f"{size / 2**20:.0f} MiB is larger than the {MAX_RESULT_BYTES // 2**20}"
                                              " MiB read limit; export a shorter range or a longer step")
        with open_text(path) as stream:
            text = stream.read(MAX_RESULT_BYTES + 1).lstrip("\ufeff")
    except OSError as error:
        raise InputFileError(where, None, f"cannot read ({error.strerror or error}); check the path") from None
    except (EOFError, lzma.LZMAError) as error:
        raise InputFileError(where, None, f"compressed stream broken ({error}); recompress it") from None
    if len(text) > MAX_RESULT_BYTES:
        raise InputFileError(where, None, f"over {MAX_RESULT_BYTES // 2**20} MiB of text; export a shorter range "
                                          "or a longer step")
    builder = SeriesBuilder()
    times: set[float] = set()
    skipped: Counter[str] = Counter()
    warnings: list[str] = []
    for index, response in enumerate(_responses(text, where)):
        label = f"response {index + 1}"
        warnings += _warnings(response)
        for series in _series(response, where, label):
            metric = series.get("metric")
            if not isinstance(metric, dict) or "__name__" not in metric:
                raise InputFileError(where, f"{label}: metric", "a result without __name__ (a rate(), sum() or "
                                     "other computed query); export the raw series, e.g. "
                                     "query={__name__=~\"vllm:.+\"}")
            name = str(metric["__name__"])
            labels = {str(key): str(value) for key, value in metric.items()}
            values = series.get("values")
            if not isinstance(values, list):
                raise InputFileError(where, f"{label}: {name}: values", "expected a list of [time, \"value\"]")
            for pair in values:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise InputFileError(where, f"{label}: {name}: values", "expected [time, \"value\"] pairs")
                time_s, value = _number(pair[0]), _number(pair[1])
                if time_s is None or not math.isfinite(time_s):
                    raise InputFileError(where, f"{label}: {name}: values", f"time {pair[0]!r} is not a number")
                builder.add(time_s, name, labels, math.nan if value is None else value)
                times.add(time_s)
    if len(times) == 1:
        raise InputFileError(where, None, "one moment only (an instant query, or a range of one step): a window needs "
                                          "two; export /api/v1/query_range over a span of time")
    servers = {identity: sorted(points, key=lambda p: p.time_s) for identity, points in builder.points().items()}
    skipped.update({f"samples of {name} that were NaN or infinite": count
                    for name, count in builder.non_finite.items()})
    if warnings:  # e.g. partial data from a remote store: the export may lack samples
        skipped[f"warnings from Prometheus with the data (the first: {warnings[0][:160]})"] = len(warnings)
    return servers, skipped, len(times)


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


def _responses(text: str, where: str) -> list[Any]:
    """The responses of a file: one, an array of them, or one per line."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as whole:
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) < 2:
            raise InputFileError(where, None, f"invalid JSON ({whole.msg} at line {whole.lineno}); save the "
                                              "query_range response as it came") from None
        documents = []
        for number, line in enumerate(lines, start=1):
            try:
                documents.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise InputFileError(where, f"line {number}", f"invalid JSON ({error.msg}); one response per "
                                                              "line") from None
        return documents
    return document if isinstance(document, list) else [document]


def _warnings(response: Any) -> list[str]:
    """The ``warnings`` (and ``infos``) Prometheus sent with a response's data, e.g. of a remote store that answered
    in part: the data came back, but may lack samples."""
    if not isinstance(response, dict):
        return []
    return [str(item) for key in ("warnings", "infos") if isinstance(response.get(key), list)
            for item in response[key]]


def _series(response: Any, where: str, label: str) -> list[dict[str, Any]]:
    """The series of one response as ``{"metric", "values"}``: a ``query_range`` matrix as it is, and the vector of an
    instant query as one value each (a file of instant queries at several times is a series too)."""
    if not isinstance(response, dict):
        raise InputFileError(where, label, "expected a query_range response object")
    if response.get("status") == "error":
        raise InputFileError(where, label, f"Prometheus answered an error ({response.get('errorType')}: "
                                           f"{response.get('error')}); fix the query and export again")
    data = response.get("data", response)
    if not isinstance(data, dict) or "result" not in data:
        raise InputFileError(where, f"{label}: data.result", "missing; save the whole query_range response")
    kind = data.get("resultType")
    if kind not in ("matrix", "vector"):
        raise InputFileError(where, f"{label}: data.resultType", f"is {kind!r}, not 'matrix': a {kind} has no "
                             "series; export /api/v1/query_range of the raw series over a span of time")
    result = data["result"]
    if not isinstance(result, list):
        raise InputFileError(where, f"{label}: data.result", "expected a list of series")
    series = [item for item in result if isinstance(item, dict)]
    if kind == "vector":
        return [{"metric": item.get("metric"), "values": [item["value"]] if "value" in item else None}
                for item in series]
    return series
