#!/usr/bin/env python3
"""Is the line ``L = C1 + B C2`` too straight? A concave load term, tried on stored runs (an experiment).

Usage::

    python benchmarks/concave_load.py --runs /work/acc-runs --ids 60 80 --psi 0 0.5 1 2   # served CPU runs
    python benchmarks/concave_load.py --silicon --psi 0 0.5 1 2                  # AIConfigurator's GPU rows

The calibrations' own closed loops and the fresh servers' plateaus show the measured latency growing with the
number in flight less than linearly (benchmarks/RESULTS-accuracy-served-2026-11.md, "what the pooled E2E bias
is made of"). This script tries one concave form with the same asymptote,

    L = C1 + C2 h(B),    h(B) = B + psi sqrt(B),

so the marginal cost of one more request in flight is ``C2 (1 + psi / (2 sqrt B))``, falling to ``C2``, and
saturation stays at ``1/C2``. With Little's law ``B = lambda L`` and ``u = sqrt(lambda L)``, an open loop
solves ``u^2 (1/lambda - C2) - psi C2 u - C1 = 0``; a closed loop of ``N`` loads the server like
``f h(N - 1)`` others. ``psi = 0`` is today's model exactly.

Since 2026-11-29 (fifth session) the product solves this law (:mod:`sdplan.latency.knee`) and its pooled fit
profiles ``psi`` over :data:`sdplan.fitting.fit.LOAD_CONCAVITIES` where open and closed loops are fitted
together, keeping the one whose fit leaves its own runs the lowest E2E MAPE. Here every fit takes one ``psi``
instead (``--psi``; ``product``: the product's own choice), the closed-loop-only fits of ``--silicon`` included;
``picked by own fit`` re-makes the product's rule from the numeric ones. Served: each stored run's calibration
is refitted from a copy of its own ``served.runs`` (``sdplan calibrate --resume``: no server starts) and its
validation re-predicted (:func:`sdplan.accuracy.repredict.repredict`); needs the run folders of
``benchmarks/summaries/accNN.json`` (not in the repository: ``--runs``). Silicon:
``benchmarks/accuracy_silicon.py``'s fitted section.
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

HERE = Path(__file__).resolve().parent


@contextlib.contextmanager
def concave(psi: float | None) -> Iterator[None]:
    """Within the block every pooled fit takes ``psi`` (None: the product's own choice, which keeps the line
    for closed loops alone); the planner and the validation then solve the law the file records."""
    from sdplan.fitting import fit

    saved = fit.LOAD_CONCAVITIES, fit.both_loops
    if psi is not None:
        fit.LOAD_CONCAVITIES, fit.both_loops = (psi,), lambda runs: True
    try:
        yield
    finally:
        fit.LOAD_CONCAVITIES, fit.both_loops = saved


def label(psi: float | None) -> str:
    return "product" if psi is None else f"{psi:g}"


def refit(run_folder: Path, psi: float | None, out: Path) -> float:
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


def served(runs_root: Path, psis: list[float | None], work: Path, ids: range) -> None:
    """Each run refitted and re-predicted at every ``psi``; pooled per ``psi``, then with each run at the ``psi``
    (of the numeric ones) whose fit leaves its own runs the lowest E2E MAPE (``picked by own fit``: the product's
    rule, over the values given)."""
    from sdplan.accuracy.repredict import repredict

    own: dict[tuple[float | None, int], float] = {}
    remade: dict[tuple[float | None, int], dict[str, list[dict[str, Any]]]] = {}
    for psi in psis:
        for n in ids:
            summary = HERE / "summaries" / f"acc{n}.json"
            document = json.loads(summary.read_text())
            calibration = work / f"acc{n}-psi{label(psi)}.toml"
            own[psi, n] = refit(runs_root / f"acc{n}", psi, calibration)
            document["calibration"] = str(calibration)
            document["workdir"] = str(runs_root / f"acc{n}")
            with concave(psi):
                remade[psi, n] = repredict(document, summary)["records"]
        report(f"psi {label(psi)}", [remade[psi, n] for n in ids], [own[psi, n] for n in ids])
    numeric = [psi for psi in psis if psi is not None]
    if len(numeric) > 1:
        picks = [min(numeric, key=lambda psi: own[psi, n]) for n in ids]
        report("picked by own fit", [remade[psi, n] for psi, n in zip(picks, ids)],
               [own[psi, n] for psi, n in zip(picks, ids)])
        print("  psi picked: " + " ".join(f"{psi:g}" for psi in picks))


def report(name: str, per_run_records: list[dict[str, list[dict[str, Any]]]], own: list[float]) -> None:
    """One line of pooled figures over runs: the mean of each run's mean signed E2E error, its standard error,
    median and sign count; the E2E MAPE over every Poisson run; the saturation bias per workload."""
    per_run, records, plateaus = [], [], []
    for document in per_run_records:
        runs = [r for r in document["runs"] if r["predicted_e2e_s"]]
        per_run.append(statistics.mean(r["predicted_e2e_s"] / r["e2e_s"] - 1.0 for r in runs))
        records += runs
        plateaus += [s for s in document["saturation"] if s.get("predicted_rps")]
    error = [r["predicted_e2e_s"] / r["e2e_s"] - 1.0 for r in records]
    kept = [e for e, r in zip(error, records) if not r["flags"]]
    saturation = defaultdict(list)
    for s in plateaus:
        saturation[s["workload"]].append(s["predicted_rps"] / s["measured_rps"] - 1.0)
    print(f"{name}: own fit E2E MAPE {statistics.mean(own):.2f}%; pooled E2E bias "
          f"{100 * statistics.mean(per_run):+.1f}% "
          f"(SE {100 * statistics.stdev(per_run) / math.sqrt(len(per_run)):.1f}), median run "
          f"{100 * statistics.median(per_run):+.1f}%, {sum(b < 0 for b in per_run)} of {len(per_run)} runs "
          f"negative; E2E MAPE {100 * statistics.mean(abs(e) for e in error):.1f}%; unflagged median "
          f"{100 * statistics.median(kept):+.1f}% ({len(kept)} runs); saturation bias "
          + ", ".join(f"{w} {100 * statistics.mean(v):+.1f}%" for w, v in sorted(saturation.items()))
          + f", all {100 * statistics.mean(sum(saturation.values(), [])):+.1f}%")
    print("  per run: " + " ".join(f"{100 * b:+.0f}" for b in per_run))


def silicon(psis: list[float | None]) -> None:
    import runpy

    for psi in psis:
        sys.argv = ["accuracy_silicon.py"]
        with concave(psi), contextlib.redirect_stdout(io.StringIO()) as output, contextlib.suppress(SystemExit):
            runpy.run_path(str(HERE / "accuracy_silicon.py"), run_name="__main__")
        pooled = next(line for line in output.getvalue().splitlines() if line.startswith("| **pooled"))
        print(f"psi {label(psi)}: {pooled}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--psi", type=lambda text: None if text == "product" else float(text), nargs="+",
                        default=[0.0, 0.5, 1.0, 2.0, None], help="values of psi, or 'product' (the product's choice)")
    parser.add_argument("--runs", type=Path, help="folder holding the served runs accNN (served part)")
    parser.add_argument("--ids", type=int, nargs=2, default=[60, 74], metavar=("FIRST", "LAST"),
                        help="the runs accFIRST..accLAST, with summaries in benchmarks/summaries (default 60 74)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/concave-load"), help="where refitted files go")
    parser.add_argument("--silicon", action="store_true", help="AIConfigurator's measured GPU rows instead")
    args = parser.parse_args()
    if args.silicon:
        silicon(args.psi)
    elif args.runs is None:
        parser.error("give --runs FOLDER (the stored served runs) or --silicon")
    else:
        args.work.mkdir(parents=True, exist_ok=True)
        served(args.runs, args.psi, args.work, range(args.ids[0], args.ids[1] + 1))


if __name__ == "__main__":
    main()
