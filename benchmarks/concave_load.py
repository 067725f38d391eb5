#!/usr/bin/env python3
"""Is the line ``L = C1 + B C2`` too straight? A concave load term, tried on stored runs (an experiment).

Usage::

    python benchmarks/concave_load.py --runs /work/acc-runs --psi 0 0.5 1 2      # served CPU runs acc60-74
    python benchmarks/concave_load.py --silicon --psi 0 0.5 1 2                  # AIConfigurator's GPU rows

The calibrations' own closed loops and the fresh servers' plateaus show the measured latency growing with the
number in flight less than linearly (benchmarks/RESULTS-accuracy-served-2026-11.md, "what the pooled E2E bias
is made of"). This script tries one concave form with the same asymptote,

    L = C1 + C2 h(B),    h(B) = B + psi sqrt(B),

so the marginal cost of one more request in flight is ``C2 (1 + psi / (2 sqrt B))``, falling to ``C2``, and
saturation stays at ``1/C2``. With Little's law ``B = lambda L`` and ``u = sqrt(lambda L)``, an open loop
solves ``u^2 (1/lambda - C2) - psi C2 u - C1 = 0``; a closed loop of ``N`` loads the server like
``f h(N - 1)`` others. ``psi = 0`` is today's model exactly.

It is NOT the product's model: the term is put in by replacing three functions of the running process
(:func:`sdplan.fitting.runmodel.fitted_load`, also where the frontend floor's refit takes it,
:func:`sdplan.latency.model.closed_loop_others` and the open
loop's :func:`sdplan.latency.knee.mean_latency`, for calibrations without a knee), which is what the fit and
the validation call. Served: each stored run's calibration is refitted from its own ``served.runs`` at each
``psi`` (``sdplan calibrate --resume``: no server starts) and its validation re-predicted
(:func:`sdplan.accuracy.repredict.repredict`); needs the run folders of ``benchmarks/summaries/acc60-74.json``
(not in the repository: ``--runs``). Silicon: ``benchmarks/accuracy_silicon.py``'s fitted section at each ``psi``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import shlex
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
RUNS = range(60, 75)


@contextlib.contextmanager
def concave(psi: float) -> Iterator[None]:
    """Within the block the fit and the validation run on ``L = C1 + C2 h(B)`` (module docstring)."""
    from sdplan.fitting import frontend, runmodel
    from sdplan.latency import knee, model

    originals = runmodel.fitted_load, model.closed_loop_others, knee.mean_latency

    def fitted_load(run: Any) -> float:
        b = originals[0](run)
        return b + psi * math.sqrt(max(b, 0.0))

    def closed_loop_others(clients: int, closed_loop_factor: float = 1.0) -> float:
        b = max(clients - 1, 0)
        return closed_loop_factor * (b + psi * math.sqrt(b))

    def mean_latency(c1: Any, c2: Any, demands: Any, rate_rps: Any) -> Any:
        if np.any(np.isfinite(demands.knee_batch)):
            raise ValueError("the concave term is tried on calibrations without a knee only")
        c1, c2, rate = (np.asarray(x, dtype=np.float64) for x in (c1, c2, rate_rps))
        with np.errstate(divide="ignore", invalid="ignore"):
            a = 1.0 / rate - c2
            u = (psi * c2 + np.sqrt((psi * c2) ** 2 + 4.0 * c1 * a)) / (2.0 * a)
            latency = np.where(rate > 0, u * u / rate, c1)
        return np.where(rate * c2 < 1.0, latency, np.inf)

    def put(load: Any, others: Any, latency: Any) -> None:
        runmodel.fitted_load = frontend.fitted_load = load  # the frontend floor's refit takes it by name
        model.closed_loop_others, knee.mean_latency = others, latency

    put(fitted_load, closed_loop_others, mean_latency)
    try:
        yield
    finally:
        put(*originals)


def refit(run_folder: Path, psi: float, out: Path) -> float:
    """Refit one stored run's calibration from a copy of its ``served.runs`` at ``psi``; returns the fit's own
    E2E MAPE."""
    import shutil

    import tomllib

    from sdplan.cli import cli

    results = out.parent / f"{run_folder.name}.runs"
    if not results.is_dir():  # --resume records in its folder: never in the stored run's own
        shutil.copytree(run_folder / "served.runs", results)

    log = (run_folder.parent / f"{run_folder.name}.log").read_text().splitlines()
    command = shlex.split(next(line for line in log if " calibrate " in line).lstrip("$ "))
    args = command[command.index("calibrate"):]
    args[args.index("-o") + 1] = str(out)
    split = args.index("--") if "--" in args else len(args)
    args[split:split] = ["--results-dir", str(results), "--resume"]
    with concave(psi), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli.main(args=args, prog_name="sdplan", standalone_mode=False)
    with out.open("rb") as handle:
        return float(tomllib.load(handle)["fit_quality"]["mape_pct"])


def served(runs_root: Path, psis: list[float], work: Path) -> None:
    from sdplan.accuracy.repredict import repredict

    own: dict[float, list[float]] = defaultdict(list)
    for psi in psis:
        per_run, records, plateaus = [], [], []
        for n in RUNS:
            summary = HERE / "summaries" / f"acc{n}.json"
            document = json.loads(summary.read_text())
            calibration = work / f"acc{n}-psi{psi:g}.toml"
            own[psi].append(refit(runs_root / f"acc{n}", psi, calibration))
            document["calibration"] = str(calibration)
            document["workdir"] = str(runs_root / f"acc{n}")
            with concave(psi):
                remade = repredict(document, summary)
            runs = [r for r in remade["records"]["runs"] if r["predicted_e2e_s"]]
            errors = [r["predicted_e2e_s"] / r["e2e_s"] - 1.0 for r in runs]
            per_run.append(statistics.mean(errors))
            records += runs
            plateaus += [s for s in remade["records"]["saturation"] if s.get("predicted_rps")]
        error = [r["predicted_e2e_s"] / r["e2e_s"] - 1.0 for r in records]
        kept = [e for e, r in zip(error, records) if not r["flags"]]
        saturation = defaultdict(list)
        for s in plateaus:
            saturation[s["workload"]].append(s["predicted_rps"] / s["measured_rps"] - 1.0)
        pooled = statistics.mean(per_run)
        print(f"psi {psi:g}: own fit E2E MAPE {statistics.mean(own[psi]):.2f}% (lower than at psi 0 in "
              f"{sum(a < b for a, b in zip(own[psi], own[psis[0]]))} of {len(RUNS)}); pooled E2E bias "
              f"{100 * pooled:+.1f}% (SE {100 * statistics.stdev(per_run) / math.sqrt(len(per_run)):.1f}), median run "
              f"{100 * statistics.median(per_run):+.1f}%, {sum(b < 0 for b in per_run)} of {len(per_run)} runs "
              f"negative; E2E MAPE {100 * statistics.mean(abs(e) for e in error):.1f}%; unflagged median "
              f"{100 * statistics.median(kept):+.1f}% ({len(kept)} runs); saturation bias "
              + ", ".join(f"{w} {100 * statistics.mean(v):+.1f}%" for w, v in sorted(saturation.items()))
              + f", all {100 * statistics.mean(sum(saturation.values(), [])):+.1f}%")
        print("  per run: " + " ".join(f"{100 * b:+.0f}" for b in per_run))


def silicon(psis: list[float]) -> None:
    import runpy

    for psi in psis:
        sys.argv = ["accuracy_silicon.py"]
        with concave(psi), contextlib.redirect_stdout(io.StringIO()) as output, contextlib.suppress(SystemExit):
            runpy.run_path(str(HERE / "accuracy_silicon.py"), run_name="__main__")
        pooled = next(line for line in output.getvalue().splitlines() if line.startswith("| **pooled"))
        print(f"psi {psi:g}: {pooled}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--psi", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0])
    parser.add_argument("--runs", type=Path, help="folder holding the served runs acc60...acc74 (served part)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/concave-load"), help="where refitted files go")
    parser.add_argument("--silicon", action="store_true", help="AIConfigurator's measured GPU rows instead")
    args = parser.parse_args()
    if args.silicon:
        silicon(args.psi)
    elif args.runs is None:
        parser.error("give --runs FOLDER (the stored served runs) or --silicon")
    else:
        args.work.mkdir(parents=True, exist_ok=True)
        served(args.runs, args.psi, args.work)


if __name__ == "__main__":
    main()
