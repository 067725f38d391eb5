#!/usr/bin/env python3
"""A closed loop's opening wave: how much of it a calibration point and a measured plateau each carry.

Usage::

    python benchmarks/opening_wave.py RUN_FOLDER [RUN_FOLDER ...]

Each ``RUN_FOLDER`` is the ``--workdir`` of one ``benchmarks/accuracy_served.py`` run (not in the repository:
44 MB each). A closed loop of ``N`` clients sends ``N`` prompts at once; their prefills share the first
steps, so the first ``N`` requests (the first *round*) finish late, and the last round drains with fewer
others in flight. Calibrate's 64-client points at 128/64 have 3 rounds (192 requests), the benchmark's
plateaus 6 (384), and an open loop has no wave at all. Per (run, option) this prints the first round's mean
E2E over the middle rounds' (the wave's excess), and the calibration's mean E2E and throughput over the
plateau's, with the mean over all pairs and its standard error. Nothing is fitted or predicted here: the
figures are what the result files measured (``start_times``, ``latencies``, ``request_throughput``).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from sdplan.accuracy.means import standard_error

CLIENTS = 64
OPTIONS = (("nosd", "k0"), ("k2", "k2"), ("k4", "k4"))


def rounds_of(document: dict, clients: int, key: str = "latencies") -> list[float]:
    """The mean of a result file's per-request ``key`` (``latencies``, ``ttfts``; s) over each whole round of
    ``clients`` requests, in start order."""
    values = [value for _, value in sorted(zip(document["start_times"], document[key]))]
    return [statistics.mean(values[r * clients:(r + 1) * clients]) for r in range(len(values) // clients)]


def middle(rounds: list[float]) -> float:
    """The mean of the rounds between the first (the wave) and the last (the drain)."""
    return statistics.mean(rounds[1:-1] or rounds[1:])


def round_means(path: Path, clients: int = CLIENTS) -> tuple[list[float], float]:
    """Mean E2E of each round of ``clients`` requests in start order (s), and the run's throughput (req/s)."""
    document = json.loads(path.read_text())
    return rounds_of(document, clients), float(document["request_throughput"])


def wave_excess(rounds: list[float]) -> float:
    """The first round's mean E2E over the middle rounds' (the last round, which drains, left out), minus 1."""
    return rounds[0] / middle(rounds) - 1.0


def main(folders: list[str]) -> int:
    if not folders:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    columns: dict[str, list[float]] = {"wave, calibration": [], "wave, plateau": [], "E2E, calibration/plateau": [],
                                       "throughput, calibration/plateau": []}
    for folder in map(Path, folders):
        for calibrate_name, benchmark_name in OPTIONS:
            points = [round_means(p) for p in sorted(folder.glob(f"served.runs/{calibrate_name}_c{CLIENTS}_r*.json"))]
            plateau_file = folder / "validation" / f"{benchmark_name}-w0-peak-c{CLIENTS}.json"
            if not points or not plateau_file.is_file():
                print(f"{folder.name} {calibrate_name}: no {CLIENTS}-client points, skipped")
                continue
            plateau, plateau_x = round_means(plateau_file)
            values = (statistics.mean(wave_excess(r) for r, _ in points), wave_excess(plateau),
                      statistics.mean(statistics.mean(r) for r, _ in points) / statistics.mean(plateau) - 1.0,
                      statistics.mean(x for _, x in points) / plateau_x - 1.0)
            for key, share in zip(columns, values):
                columns[key].append(share)
            print(f"{folder.name} {calibrate_name:5s} " + ", ".join(f"{k} {v:+.1%}" for k, v in zip(columns, values)))
    for key, pairs in columns.items():
        error = standard_error(pairs)
        if pairs:
            print(f"{key:32s} mean {statistics.mean(pairs):+.1%}"
                  + (f" (SE {error:.1%}, n = {len(pairs)})" if error is not None else f" (n = {len(pairs)})"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
