"""The real recording of tests/data/prometheus-cpu (README there) as the metrics tests read and rewrite it.

Shared by tests/test_prometheus.py (the readers, and production's bad input) and tests/test_metrics_formats.py
(other vLLM versions and exporters): the folder, its provenance, and the ``sdplan scrape`` text format.
"""

from __future__ import annotations

import json
import lzma
from collections.abc import Iterable, Iterator
from pathlib import Path

from sdplan.metrics.series import Identity, Point
from sdplan.metrics.textfile import ReadCounts, scrape_points

DATA = Path(__file__).parent / "data" / "prometheus-cpu"
#: The same recording made again with the client on a CPU of its own (README there).
PINNED = DATA.parent / "prometheus-cpu-pinned"
#: The recording's own account of its runs (benchmarks/record_prometheus.py wrote it as it ran them).
PROVENANCE = json.loads((DATA / "provenance.json").read_text())
MARK, END = "# sdplan-scrape", "# sdplan-scrape-end"


def blocks(option: str, folder: Path = DATA) -> list[tuple[float, str]]:
    """A recording's scrapes of one option (``nosd``, ``sd``): (time, body)."""
    text = lzma.open(folder / f"{option}.scrapes.xz", "rt").read()
    found: list[tuple[float, str]] = []
    for part in text.split(MARK + " time=")[1:]:
        header, _, rest = part.partition("\n")
        found.append((float(header.split()[0]), rest.rsplit(END, 1)[0]))
    return found


def through_run(option: str, runs: int, folder: Path = DATA) -> list[tuple[float, str]]:
    """A recording's scrapes of one option up to 3 s after its first ``runs`` runs ended: a server seen so far."""
    record = next(entry for entry in json.loads((folder / "provenance.json").read_text())["options"]
                  if entry["option"] == option)
    end_s = record["runs"][runs - 1]["ended_unix_s"] + 3.0
    return [(time_s, body) for time_s, body in blocks(option, folder) if time_s <= end_s]


def points_by_server(path: Path, where: str) -> tuple[dict[Identity, list[Point]], ReadCounts]:
    """Each server's points of a scrape file, every one held (:func:`~sdplan.metrics.textfile.scrape_points`,
    which sdplan reads through, streams them), and what the reading counted."""
    counts = ReadCounts()
    servers: dict[Identity, list[Point]] = {}
    for identity, point in scrape_points(path, where, counts):
        servers.setdefault(identity, []).append(point)
    return servers, counts


def write(path: Path, scrapes: Iterable[tuple[float, str]], end_lines: bool = True) -> Path:
    """``scrapes`` as a scrape file at ``path``, each closed by its end line unless ``end_lines`` is False."""
    with path.open("w") as stream:
        for time_s, body in scrapes:
            stream.write(f"{MARK} time={time_s:.3f} url=http://127.0.0.1:8000/metrics\n{body}")
            if end_lines:
                stream.write(END + "\n")
    return path


#: Sample names that only grow while a server runs (counters and histogram parts): a replay carries them on.
COUNTER_ENDINGS = ("_total", "_sum", "_count", "_bucket")


def replayed(option: str, count: int, every_s: float = 15.0,
             start: float = 1_795_900_000.0) -> Iterator[tuple[float, str]]:
    """``count`` scrapes ``every_s`` apart replaying the recording end to end, as benchmarks/bench_metrics_day.py
    builds a day: each replay shifts every counter by what the whole recording added to it, so the series keeps
    counting up; gauges stay as recorded. Nothing is generated from the model."""
    parsed: list[list[tuple[str, float | None]]] = []
    for _, body in blocks(option):
        lines: list[tuple[str, float | None]] = []
        for line in body.splitlines():
            head, _, value = line.rpartition(" ")
            if line and not line.startswith("#") and head.split("{", 1)[0].endswith(COUNTER_ENDINGS):
                lines.append((head, float(value)))
            else:
                lines.append((line, None))
        parsed.append(lines)
    first = {head: value for head, value in parsed[0] if value is not None}
    added = {head: value - first.get(head, value) for head, value in parsed[-1] if value is not None}
    for index in range(count):
        replay, position = divmod(index, len(parsed))
        yield start + index * every_s, "".join(
            f"{head}\n" if value is None else f"{head} {value + replay * added.get(head, 0.0)!r}\n"
            for head, value in parsed[position])
