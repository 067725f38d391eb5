"""Reading a scrape file (``sdplan scrape``'s output) as a stream.

Layout (:mod:`sdplan.metrics.scrape`): scrapes of vLLM's ``/metrics`` in Prometheus' text exposition
format, each opened by ``# sdplan-scrape time=<unix seconds> ...`` and closed by ``# sdplan-scrape-end``.
Files of other origin work the same way: ``curl`` outputs each preceded by the header line (the end
line is optional then; a header closes the scrape before it). A file may be compressed with gzip or xz
(``.gz``/``.xz``, found by its first bytes); it is read line by line, never whole.

Only the lines of the series read (:data:`sdplan.metrics.names.SAMPLE_QUANTITY`) are kept, by a
prefix test on each line, and those are parsed by the maintained parser of the ``prometheus_client``
package (``text_string_to_metric_families``); the buckets, the ``# HELP``/``# TYPE`` lines and every
other family are passed over. The reader holds one scrape's kept lines and yields one :class:`Point` per
server and scrape (:func:`scrape_points`), its quantities packed as doubles
(:class:`~sdplan.metrics.series.Values`): about 0.65 KiB a scrape of an SD server, measured (1.8 KiB as a
dict of floats). What is held then is the consumer's: windows are cut as the points arrive and hold the
open window's points (:class:`sdplan.metrics.windows.Windows`), whatever the file's length; a
consumer that held them all would hold about 3 MiB for a day of 15-second scrapes of one server.

What else the text may be, as exporters write it, read by the same parser:

* OpenMetrics (``Accept: application/openmetrics-text``): ``# EOF``, ``# UNIT`` and ``_created`` lines are
  passed over like other families; an exemplar after a value (`` # {trace_id="..."} 0.5``) is read past.
  vLLM answers it with ``vllm_`` for ``vllm:`` unless the request asks ``escaping=allow-utf-8``
  (prometheus_client's default escaping); those names, and Ray Serve's ``ray_vllm:``, are read as ``vllm:``
  (:data:`~sdplan.metrics.names.ALIAS_PREFIXES`).
* Prometheus 3's UTF-8 names, quoted inside the braces (``{"vllm:e2e_request_latency_seconds_sum",
  model_name="m"} 1.5``), and label values with escapes (``\\"``, ``\\\\``, ``\\n``).
* ``NaN``, ``+Inf``, ``-Inf`` values: the quantity is dropped from that scrape, counted.
* The header's ``url=`` gives every sample of its scrape the label ``instance`` (the URL's ``host:port``, as
  Prometheus labels a target's series), unless the sample has one: recordings of several servers appended to
  one file are then several servers, picked with ``--select instance=HOST:PORT``.
* Sample timestamps: within a scrape the header's time wins (the scrape's moment). A file without
  headers whose samples carry timestamps is a series too, each sample at its own time: ``promtool tsdb
  dump`` (``{__name__="vllm:...", ...} value milliseconds``), a concatenation of Prometheus ``/federate``
  answers, ``promtool tsdb dump-openmetrics`` (seconds). Such a dump is sorted by series, not time, so
  its values are held by column until the file ends (:func:`_add_stamped`,
  :class:`~sdplan.metrics.series.SeriesBuilder`), and its points made afterwards, one at a time.
"""

from __future__ import annotations

import gzip
import io
import lzma
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast
from urllib.parse import urlsplit

from sdplan.errors import InputFileError, MissingDependencyError
from sdplan.metrics import names
from sdplan.metrics.scrape import END_MARK, SCRAPE_MARK
from sdplan.metrics.series import REPEATED, Identity, Point, SeriesBuilder, SeriesSpans

#: Bytes read from the head of a file to recognise it.
HEAD_BYTES = 1 << 16
#: Prefixes of the lines kept: every sample name read, as a line starts with it; of a histogram's buckets only
#: the ``+Inf`` one (it stands in for a missing ``_count``): the other ~20 per histogram would be most of the
#: parsing (the parser takes 80% of a read; keeping every bucket made a day of scrapes 4x slower to read).
_BUCKETS = tuple(names.INF_BUCKETS.values())
_KEPT = tuple(name for name in names.SAMPLE_QUANTITY if name not in _BUCKETS)
#: The same names quoted inside the braces, as Prometheus 3's UTF-8 exposition may write any name
#: (``{"vllm:e2e_request_latency_seconds_sum",model_name="m"} 1.5``), and as ``promtool tsdb dump`` writes them
#: (``{__name__="vllm:...",...}``); the parser reads every form.
_BRACED_BUCKETS = tuple(f'{{"{name}"' for name in _BUCKETS) + tuple(f'{{__name__="{name}"' for name in _BUCKETS)
_BRACED_KEPT = tuple(f'{{"{name}"' for name in _KEPT) + tuple(f'{{__name__="{name}"' for name in _KEPT)
#: Kept lines outside any scrape header are parsed in chunks of this many (:func:`_add_stamped`).
LOOSE_CHUNK = 4096
#: A sample timestamp read as milliseconds that comes out before this Unix time (s; March 1973) was written in
#: seconds, as OpenMetrics writes them (the text format writes milliseconds).
SECONDS_BEFORE = 1e8
_GZIP, _XZ = b"\x1f\x8b", b"\xfd7zXZ\x00"


def open_binary(path: Path) -> IO[bytes]:
    """``path``'s bytes, decompressed when it starts with gzip's or xz's magic bytes.

    Raises
    ------
    InputFileError
        If it cannot be opened.
    """
    try:
        with path.open("rb") as raw:
            magic = raw.read(6)
        if magic.startswith(_GZIP):
            return cast(IO[bytes], gzip.open(path, "rb"))
        if magic.startswith(_XZ):
            return cast(IO[bytes], lzma.open(path, "rb"))
        return path.open("rb")
    except FileNotFoundError:
        raise InputFileError(str(path), None, "no such file; check the path") from None
    except OSError as error:
        raise InputFileError(str(path), None, f"cannot read ({error.strerror}); check the path and permissions") \
            from None


def open_text(path: Path) -> IO[str]:
    """``path`` as text (:func:`open_binary` decoded as UTF-8, undecodable bytes replaced).

    Raises
    ------
    InputFileError
        If it cannot be opened.
    """
    return io.TextIOWrapper(open_binary(path), encoding="utf-8", errors="replace")


def head_text(path: Path) -> str:
    """The first :data:`HEAD_BYTES` of ``path``'s text (decompressed), '' if it cannot be read as text."""
    try:
        with open_text(path) as stream:
            return stream.read(HEAD_BYTES)
    except (InputFileError, OSError, EOFError, lzma.LZMAError, UnicodeDecodeError):
        return ""


def is_scrape_text(head: str) -> bool:
    """Whether a file's head is a scrape file: an ``# sdplan-scrape`` header, vLLM's bare exposition text, or a dump
    of timestamped samples."""
    return (head.startswith(SCRAPE_MARK) or f"\n{SCRAPE_MARK} " in head
            or "# TYPE vllm:" in head or "\nvllm:" in head or head.startswith("vllm:")
            or '{"vllm:' in head or '{__name__="vllm:' in head
            or "\nvllm_" in head or "\nray_vllm" in head  # names.ALIAS_PREFIXES
            or head.startswith('{__name__="'))  # a promtool tsdb dump: vllm: sorts after go_, process_, up


@dataclass
class ReadCounts:
    """What a scrape file's reading counted, complete once :func:`scrape_points` is exhausted."""

    #: reason -> scrapes (or samples, lines) skipped
    skipped: Counter[str] = field(default_factory=Counter)
    #: Scrapes read (a header's scrape, or a moment of stamped samples).
    scrapes: int = 0


def scrape_points(path: Path, where: str, counts: ReadCounts) -> Iterator[tuple[Identity, Point]]:
    """Each server's points of a scrape file as they are read, in the file's order; ``counts`` filled on the way.

    A scrape's points are yielded as soon as its end is read, so a consumer that keeps only what it needs holds
    memory bounded by that. Stamped samples outside any header are yielded last, each server's sorted by time
    (such a dump is sorted by series: its values are held by column until the file ends, its points made one at
    a time).

    Raises
    ------
    InputFileError
        For a file without any ``# sdplan-scrape`` header and without sample timestamps (a single scrape has no
        time), a header without a readable ``time=``, or no vLLM series at all; each names the file, the line and
        the fix.
    MissingDependencyError
        Without the ``prometheus_client`` package.
    """
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:  # pragma: no cover - a dependency of sdplan
        raise MissingDependencyError("reading Prometheus text needs the prometheus_client package; "
                                     "pip install prometheus_client") from None
    builder = SeriesBuilder()
    stamped = SeriesBuilder()  # samples outside any header, each at its own timestamp
    spans = SeriesSpans()  # of the stamped samples: a series given twice is read once
    skipped = counts.skipped
    headers = 0
    loose = False
    try:
        with open_text(path) as stream:
            for time_s, line_number, kept, closed, instance in _blocks(stream, where):
                if time_s is None:
                    loose = True
                    _add_stamped(stamped, spans, kept, skipped, text_string_to_metric_families)
                    continue
                headers += 1
                if not closed:
                    skipped["scrapes cut short (no end line: the recording was stopped mid-write)"] += 1
                    continue
                counts.scrapes += 1
                try:
                    for family in text_string_to_metric_families("".join(kept)):
                        for sample in family.samples:
                            labels = sample.labels if instance is None or "instance" in sample.labels else \
                                {**sample.labels, "instance": instance}
                            builder.add(time_s, sample.name, labels, float(sample.value))
                except (ValueError, TypeError, IndexError):
                    skipped[f"scrapes with a malformed line (the first at line {line_number})"] += 1
                for identity, found in builder.points().items():  # one point per server and scrape
                    for point in found:
                        yield identity, point
                builder.clear()
    except (EOFError, lzma.LZMAError, OSError) as error:
        raise InputFileError(where, None, f"compressed stream broken ({error}); recompress or decompress it") \
            from None
    moments = stamped.moments()
    if not headers and not moments:
        hint = "a single scrape has no time" if loose else "no '# sdplan-scrape time=...' line"
        raise InputFileError(where, None, f"{hint}; record a series with 'sdplan scrape URL -o FILE', or put "
                                          "'# sdplan-scrape time=<unix seconds>' before each scrape")
    counts.scrapes += moments
    for name, count in (builder.non_finite + stamped.non_finite).items():
        skipped[f"samples of {name} that were NaN or infinite (their scrapes skip the quantity)"] += count
    yield from stamped.stream()


def _add_stamped(builder: SeriesBuilder, spans: SeriesSpans, lines: list[str], skipped: Counter[str],
                 parse: Callable[[str], Iterable[Any]]) -> None:
    """Samples outside any ``# sdplan-scrape`` header, each at its own timestamp.

    Such files are exports that stamp every sample: ``promtool tsdb dump`` (``{__name__="vllm:x", ...} value
    ms``), Prometheus' ``/federate`` (text format, milliseconds) and ``promtool tsdb dump-openmetrics``
    (OpenMetrics, seconds). The text parser reads a timestamp as milliseconds (it divides by 1000); one that
    comes out before :data:`SECONDS_BEFORE` was written in seconds, as OpenMetrics does, and is read so.
    A sample without a timestamp has no time here and is counted; one of a series already read at its time
    (dumps put together twice, :class:`~sdplan.metrics.series.SeriesSpans`) is counted and read once.
    """
    try:
        samples = [sample for family in parse("".join(lines)) for sample in family.samples]
    except (ValueError, TypeError, IndexError):  # find the malformed lines one by one
        samples = []
        for line in lines:
            try:
                samples += [sample for family in parse(line) for sample in family.samples]
            except (ValueError, TypeError, IndexError):
                skipped["malformed lines outside a scrape (not Prometheus text)"] += 1
    for sample in samples:
        if sample.timestamp is None:
            skipped["samples outside a '# sdplan-scrape' header without a timestamp (no time to put them at)"] += 1
            continue
        time_s = float(sample.timestamp)
        time_s = time_s * 1000.0 if time_s < SECONDS_BEFORE else time_s
        if spans.repeats(spans.series({**sample.labels, "__name__": sample.name}), time_s):
            skipped[REPEATED] += 1
        else:
            builder.add(time_s, sample.name, sample.labels, float(sample.value))


def _blocks(stream: IO[str], where: str) -> Iterator[tuple[float | None, int, list[str], bool, str | None]]:
    """``(time, header line number, kept lines, closed, instance)`` per scrape, read line by line; ``instance``
    is the ``host:port`` of the header's ``url=`` (None without one).

    Kept lines outside any scrape come in chunks of :data:`LOOSE_CHUNK` with time None: their samples carry
    their own timestamps, or no time at all (:func:`_add_stamped`).
    """
    time_s: float | None = None
    instance: str | None = None
    header_line = loose_line = 0
    kept: list[str] = []
    loose: list[str] = []
    ends = False
    aliases = names.ALIAS_PREFIXES
    for number, line in enumerate(stream, start=1):
        if line.startswith(SCRAPE_MARK):
            if line.startswith(END_MARK):
                if time_s is not None:
                    yield time_s, header_line, kept, True, instance
                time_s, kept = None, []
                continue
            if time_s is not None:  # a header closes the scrape before it in files written without end lines;
                yield time_s, header_line, kept, not ends, instance  # sdplan scrape writes them: one missing was cut
            time_s, header_line, kept = _header_time(line, where, number), number, []
            instance = header_instance(line)
            ends = " url=" in line  # sdplan scrape's headers name the URL, and its scrapes end with END_MARK
            continue
        # the tests below run on every line of a file of gigabytes: comments out first, the rare forms apart
        if line.startswith("#"):
            continue
        if line.startswith("{"):
            keep = line.startswith(_BRACED_KEPT) or (line.startswith(_BRACED_BUCKETS) and 'le="+Inf"' in line)
        else:
            if line.startswith(aliases):
                line = names.canonical(line)  # vllm_x, ray_vllm:x: read as vllm:x
            keep = line.startswith(_KEPT) or (line.startswith(_BUCKETS) and 'le="+Inf"' in line)
        if not keep:
            continue
        if time_s is not None:
            kept.append(line)
            continue
        loose_line = loose_line if loose else number
        loose.append(line)
        if len(loose) >= LOOSE_CHUNK:
            yield None, loose_line, loose, True, None
            loose = []
    if loose:
        yield None, loose_line, loose, True, None
    if time_s is not None:
        yield time_s, header_line, kept, False, instance


def _header_field(line: str, key: str) -> str | None:
    """The value of a header line's ``key=`` item (None without one)."""
    for item in line[len(SCRAPE_MARK):].split():
        if item.startswith(key + "="):
            return item[len(key) + 1:]
    return None


def header_instance(line: str) -> str | None:
    """The ``host:port`` of a header's ``url=``, as Prometheus names a target's ``instance`` (None without one)."""
    url = _header_field(line, "url")
    try:
        return (urlsplit(url).netloc or None) if url is not None else None
    except ValueError:  # not a URL (an unclosed IPv6 bracket): no server named
        return None


def _header_time(line: str, where: str, number: int) -> float:
    """The ``time=`` of a header line (Unix seconds)."""
    text = _header_field(line, "time")
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value > 0:
        return value
    raise InputFileError(where, f"line {number}", "header without a valid time=<unix seconds>; fix or remove "
                                                  "the line")
