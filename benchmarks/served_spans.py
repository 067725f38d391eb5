"""What the client's span does to served accuracy: the same fit judged on the client's and on the server's means.

A served accuracy run (``benchmarks/accuracy_served.py``, from 2026-11-29's second session) keeps, beside each
``vllm bench serve`` result file, two scrapes of the server's ``/metrics`` taken before and after the run
(``*.metrics.scrapes``). So every run is measured twice: by the client (HTTP, detokenisation, streaming and, on a
2-core VM, a client short of CPU included) and by the server's own histograms.

For each run folder this fits one calibration per span from the same runs, the benchmark's closed loops
(``k*-w*-peak-c*``: every option and workload, 8 to 64 clients; ``--calibrated-only``: the calibrated workload's,
``w0``; ``sdplan.fitting.fit.fit_pooled``, what ``sdplan fit`` runs), and predicts every Poisson run from it, as
``sdplan validate`` does: the
client fit against the client's means (bench files), the server fit against the server's (scrape windows). The
difference between the two columns is what the client's span does to the pooled bias, with the model held the
same. Neither fit is ``sdplan calibrate``'s own (its grid is another set of closed loops); the benchmark's
``--pool`` judges that one.

    python benchmarks/served_spans.py RUN_FOLDER [RUN_FOLDER ...]
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from accuracy_served import SERVER_SCRAPES, one_run  # the benchmark that writes the files, beside this script

from sdplan.fitting.fit import fit_pooled
from sdplan.fitting.validation import predict_run


def errors(folder: Path, server: bool, fitted: str) -> dict[str, list[float]] | None:
    """Per workload (``w0``, ``w1``, ...), the E2E errors (%) of the Poisson runs from a fit of the closed loops
    ``k*-{fitted}-peak-c*``."""
    suffix = SERVER_SCRAPES if server else ".json"
    closed = [run for path in sorted(folder.glob(f"k*-{fitted}-peak-c*{suffix}")) for run in [one_run(path)] if run]
    if len(closed) < 4:
        return None
    coefficients_at = fit_pooled(closed).coefficients_at
    found: dict[str, list[float]] = {}
    for path in sorted(folder.glob(f"k*-w*-poisson*{suffix}")):
        run = one_run(path)
        if run is None:
            continue
        latency, _ = predict_run(coefficients_at(run.prompt_tokens, run.output_tokens), run)
        if math.isfinite(latency):
            label = path.name.split("-")[1]  # k{K}-w{I}-poisson{load}
            found.setdefault(label, []).append(100.0 * (latency / run.mean_e2e_latency_s - 1.0))
    return found


def cell(values: list[float]) -> str:
    if not values:
        return "-"
    mape = statistics.fmean(abs(v) for v in values)
    return (f"{mape:.1f}% ({statistics.fmean(values):+.1f}%, {sum(v < 0 for v in values)}/{len(values)} under)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="run folders (WORKDIR of accuracy_served.py)")
    parser.add_argument("--calibrated-only", action="store_true",
                        help="fit the calibrated workload's closed loops only (w0), as calibrate would")
    args = parser.parse_args(argv)
    fitted = "w0" if args.calibrated_only else "w*"
    print("| run | workload (w0: calibrated) | client fit, client means: E2E MAPE (bias, runs under) "
          "| server fit, server means |")
    print("|---|---|---|---|")
    pooled: dict[bool, list[float]] = {False: [], True: []}
    for folder in args.folders:
        validation = folder / "validation" if (folder / "validation").is_dir() else folder
        sides = {server: errors(validation, server, fitted) for server in (False, True)}
        for label in sorted({w for side in sides.values() if side for w in side}):
            cells = [cell((sides[server] or {}).get(label, [])) for server in (False, True)]
            print(f"| {folder.name} | {label} | {cells[0]} | {cells[1]} |")
        for server, side in sides.items():
            pooled[server] += [e for values in (side or {}).values() for e in values]
    print(f"| **pooled** | all | **{cell(pooled[False])}** | **{cell(pooled[True])}** |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
