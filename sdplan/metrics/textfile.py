"""Reading a scrape file (``sdplan scrape``'s output) as a stream, in bounded memory.

Layout (:mod:`sdplan.metrics.scrape`): scrapes of vLLM's ``/metrics`` in Prometheus' text exposition
format, each opened by ``# sdplan-scrape time=<unix seconds> ...`` and closed by ``# sdplan-scrape-end``.
Files of other origin work the same way: ``curl`` outputs each preceded by the header line (the end
line is optional then; a header closes the scrape before it). A file may be compressed with gzip or xz
(``.gz``/``.xz``, found by its first bytes); it is read line by line, never whole.

Only the lines of the series read (:data:`sdplan.metrics.names.SAMPLE_QUANTITY`) are kept, by a
prefix test on each line, and those are parsed by the maintained parser of the ``prometheus_client``
package (``text_string_to_metric_families``); the buckets, the ``# HELP``/``# TYPE`` lines and every
other family are passed over. Memory holds one scrape's kept lines and one :class:`Point` per scrape,
its quantities packed as doubles (:class:`~sdplan.metrics.series.Values`): about 0.65 KiB a scrape of
an SD server, measured (1.8 KiB as a dict of floats), so a day of 15-second scrapes of one server,
5,800, holds about 4 MiB of points whatever the scrapes' size. It grows with the scrapes, not the
windows: every point may end a window, and the windows are cut once the series is read.
"""

from __future__ import annotations

import gzip
import io
import lzma
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from sdplan.errors import InputFileError, MissingDependencyError
from sdplan.metrics import names
from sdplan.metrics.scrape import END_MARK, SCRAPE_MARK
from sdplan.metrics.series import Identity, Point, SeriesBuilder

#: Bytes read from the head of a file to recognise it.
HEAD_BYTES = 1 << 16
#: Prefixes of the lines kept: every sample name read, as a line starts with it; of a histogram's buckets only
#: the ``+Inf`` one (it stands in for a missing ``_count``): the other ~20 per histogram would be most of the
#: parsing (the parser takes 80% of a read; keeping every bucket made a day of scrapes 4x slower to read).
_BUCKETS = tuple(names.INF_BUCKETS.values())
_KEPT = tuple(name for name in names.SAMPLE_QUANTITY if name not in _BUCKETS)
_GZIP, _XZ = b"\x1f\x8b", b"\xfd7zXZ\x00"


def open_text(path: Path) -> IO[str]:
    """``path`` as text, decompressed when it starts with gzip's or xz's magic bytes.

    Raises
    ------
    InputFileError
        If it cannot be opened.
    """
    try:
        with path.open("rb") as raw:
            magic = raw.read(6)
        if magic.startswith(_GZIP):
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
        if magic.startswith(_XZ):
            return io.TextIOWrapper(lzma.open(path, "rb"), encoding="utf-8", errors="replace")
        return path.open("r", encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise InputFileError(str(path), None, "no such file; check the path") from None
    except OSError as error:
        raise InputFileError(str(path), None, f"cannot read ({error.strerror}); check the path and permissions") \
            from None


def head_text(path: Path) -> str:
    """The first :data:`HEAD_BYTES` of ``path``'s text (decompressed), '' if it cannot be read as text."""
    try:
        with open_text(path) as stream:
            return stream.read(HEAD_BYTES)
    except (InputFileError, OSError, EOFError, lzma.LZMAError, UnicodeDecodeError):
        return ""


def is_scrape_text(head: str) -> bool:
    """Whether a file's head is a scrape file: an ``# sdplan-scrape`` header, or vLLM's bare exposition text."""
    return (head.startswith(SCRAPE_MARK) or f"\n{SCRAPE_MARK} " in head
            or "# TYPE vllm:" in head or "\nvllm:" in head or head.startswith("vllm:"))


def read_scrapes(path: Path, where: str) -> tuple[dict[Identity, list[Point]], Counter[str], int]:
    """Each server's points in a scrape file, the scrapes skipped by reason, and the scrapes read.

    Raises
    ------
    InputFileError
        For a file without any ``# sdplan-scrape`` header (a single scrape has no time), a header without a
        readable ``time=``, or no vLLM series at all; each names the file, the line and the fix.
    MissingDependencyError
        Without the ``prometheus_client`` package.
    """
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:  # pragma: no cover - a dependency of sdplan
        raise MissingDependencyError("reading Prometheus text needs the prometheus_client package; "
                                     "pip install prometheus_client") from None
    builder = SeriesBuilder()
    servers: dict[Identity, list[Point]] = {}
    skipped: Counter[str] = Counter()
    scrapes = 0
    try:
        with open_text(path) as stream:
            for time_s, line_number, kept, closed in _blocks(stream, where):
                if not closed:
                    skipped["scrapes cut short (no end line: the recording was stopped mid-write)"] += 1
                    continue
                scrapes += 1
                try:
                    for family in text_string_to_metric_families("".join(kept)):
                        for sample in family.samples:
                            builder.add(time_s, sample.name, sample.labels, float(sample.value))
                except (ValueError, TypeError, IndexError):
                    skipped[f"scrapes with a malformed line (the first at line {line_number})"] += 1
                for identity, found in builder.points().items():  # one point per scrape is all that is kept
                    servers.setdefault(identity, []).extend(found)
                builder.clear()
    except (EOFError, lzma.LZMAError, OSError) as error:
        raise InputFileError(where, None, f"compressed stream broken ({error}); recompress or decompress it") \
            from None
    for name, count in builder.non_finite.items():
        skipped[f"samples of {name} that were NaN or infinite (their scrapes skip the quantity)"] += count
    return servers, skipped, scrapes


def _blocks(stream: IO[str], where: str) -> Iterator[tuple[float, int, list[str], bool]]:
    """``(time, header line number, kept lines, closed)`` per scrape, read line by line."""
    time_s: float | None = None
    header_line = 0
    kept: list[str] = []
    saw_samples = ends = False
    for number, line in enumerate(stream, start=1):
        if line.startswith(SCRAPE_MARK):
            if line.startswith(END_MARK):
                if time_s is not None:
                    yield time_s, header_line, kept, True
                time_s, kept = None, []
                continue
            if time_s is not None:  # a header closes the scrape before it in files written without end lines;
                yield time_s, header_line, kept, not ends  # sdplan scrape writes them, so one missing was cut short
            time_s, header_line, kept = _header_time(line, where, number), number, []
            ends = " url=" in line  # sdplan scrape's headers name the URL, and its scrapes end with END_MARK
            continue
        if line.startswith(_KEPT) or (line.startswith(_BUCKETS) and 'le="+Inf"' in line):
            if time_s is None:
                saw_samples = True
                continue
            kept.append(line)
    if time_s is not None:
        yield time_s, header_line, kept, False
    if header_line == 0:
        hint = ("a single scrape has no time" if saw_samples else "no '# sdplan-scrape time=...' line")
        raise InputFileError(where, None, f"{hint}; record a series with 'sdplan scrape URL -o FILE', or put "
                                          "'# sdplan-scrape time=<unix seconds>' before each scrape")


def _header_time(line: str, where: str, number: int) -> float:
    """The ``time=`` of a header line (Unix seconds)."""

    for item in line[len(SCRAPE_MARK):].split():
        if item.startswith("time="):
            try:
                value = float(item[5:])
            except ValueError:
                break
            if math.isfinite(value) and value > 0:
                return value
            break
    raise InputFileError(where, f"line {number}", "header without a valid time=<unix seconds>; fix or remove "
                                                  "the line")
