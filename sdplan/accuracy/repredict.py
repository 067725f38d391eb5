"""Re-make a stored benchmark summary's predictions with the current code, so that pooled figures never mix models.

A summary of ``benchmarks/accuracy_served.py`` stores what each run measured beside what the code of that day
predicted for it. Pooling several summaries as stored mixes the predictions of as many versions of the model.
:func:`repredict` re-makes every prediction of one summary from what it rests on, which the summary names but
does not hold:

- the calibration (``calibration``, else ``served.toml`` in the run's folder);
- each Poisson run's ``vllm bench serve`` result (``file`` in ``validation/``, ``validation-2/``, ... of the
  run's folder, one per pass), re-read and predicted as :func:`sdplan.accuracy.summary.run_record` predicts;
- each plateau's result (``k{option}-w{workload}-peak-c{clients}.json``), predicted as
  :func:`saturation_prediction`;
- the picks and intervals ``sdplan plan`` gives at the run's rates (:func:`~sdplan.accuracy.summary.planner_picks`).

The run's folder is the summary's ``workdir``, else the folder the summary file is in (where the benchmark
writes it). :func:`missing_inputs` lists what is absent; the summaries in ``benchmarks/summaries`` hold neither
the calibrations nor the result files, so they cannot be re-predicted, only pooled as stored and said so.
"""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sdplan
from sdplan.accuracy.floors import calibration_spread
from sdplan.accuracy.summary import (
    contrast_workloads,
    parse_workloads,
    planned_intervals,
    planner_picks,
    run_record,
    summarize,
    workload_label,
)
from sdplan.calibration import load_calibration
from sdplan.fitting.runmodel import run_demand
from sdplan.latency import knee, model
from sdplan.runs import read_results
from sdplan.units import finite_or_none


def _git(root: Path, *args: str) -> str:
    """``git -C root ARGS``'s output, '' where git fails (Popen: tests stand fakes in for ``subprocess.run``)."""
    try:
        with subprocess.Popen(["git", "-C", str(root), *args], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) as process:
            out, _ = process.communicate(timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.strip() if process.returncode == 0 else ""


def code_version() -> str:
    """``sdplan VERSION`` and, from a git checkout, its commit (``+dirty`` with uncommitted changes)."""

    root = Path(sdplan.__file__).resolve().parent.parent
    commit = _git(root, "rev-parse", "--short=12", "HEAD")
    dirty = commit and _git(root, "status", "--porcelain", "--untracked-files=no")
    return f"sdplan {sdplan.__version__}" + (f" {commit}{'+dirty' if dirty else ''}" if commit else "")


def saturation_prediction(coefficients_at: Any, run: Any, max_num_seqs: int) -> dict[str, float | None]:
    """A plateau's predictions: the model's closed-loop throughput at the level that reached it,
    ``N/(C1 + f (N - 1) C2)`` (a full batch runs as a closed loop), the open-loop cap rate ``min(1/C2, N/(C1 +
    N C2))`` (kept for the runs before acc37) and ``1/C2``; the acceptance is the one the run measured."""

    coefficients = coefficients_at(run.prompt_tokens, run.output_tokens)
    c1, c2 = run_demand(coefficients, run)
    uncapped = float(model.saturation_rate(c2))
    psi = coefficients.load_concavity_sqrt_requests
    predicted = model.closed_loop_throughput(c1, c2, run.concurrency, coefficients.closed_loop_factor, psi)
    open_loop_cap = min(uncapped, float(model.batch_cap_rate(*knee.concave_demands(c1, c2, psi, max_num_seqs),
                                                             max_num_seqs)))
    return {"predicted_rps": finite_or_none(float(predicted)), "open_loop_cap_rps": finite_or_none(open_loop_cap),
            "uncapped_rps": finite_or_none(uncapped)}


def _folder(document: Mapping[str, Any], path: Path | None) -> Path:
    work = Path(str(document.get("workdir") or ""))
    if document.get("workdir") and work.is_dir():
        return work
    return path.parent if path is not None else work


def _calibration(document: Mapping[str, Any], folder: Path) -> Path:
    """The recorded calibration, else ``served.toml`` in the run's folder; the recorded path where neither is."""
    named = Path(str(document.get("calibration") or ""))
    beside = folder / "served.toml"
    if document.get("calibration") and (named.is_file() or not beside.is_file()):
        return named
    return beside


def _pass_folder(folder: Path, attempt: int) -> Path:
    return folder / ("validation" if attempt == 1 else f"validation-{attempt}")


def _labels(document: Mapping[str, Any]) -> list[str]:
    """The workloads in the order the benchmark numbered them (``w0``, ``w1``, ...)."""

    settings = document.get("settings", {})
    p, g = int(settings.get("prompt_tokens", 128)), int(settings.get("output_tokens", 64))
    others = parse_workloads(settings["workloads"]) if settings.get("workloads") else contrast_workloads(p, g)
    return [workload_label(wp, wg) for wp, wg in [(p, g), *others]]


def _plateau_file(folder: Path, saturation: Mapping[str, Any], labels: list[str]) -> Path:
    index = labels.index(saturation["workload"]) if saturation["workload"] in labels else -1
    return (_pass_folder(folder, saturation["pass"])
            / f"k{saturation['option']}-w{index}-peak-c{saturation['clients']}.json")


def missing_inputs(document: Mapping[str, Any], path: Path | None = None) -> list[str]:
    """What :func:`repredict` needs and cannot find: the calibration and result files, as paths."""
    folder = _folder(document, path)
    labels = _labels(document)
    needed = [_calibration(document, folder)]
    needed += [_pass_folder(folder, r["pass"]) / Path(r["file"]).name for r in document["records"]["runs"]]
    needed += [_plateau_file(folder, s, labels) for s in document["records"]["saturation"] if s.get("clients")]
    return [str(item) for item in needed if not item.is_file()]


def repredict(document: Mapping[str, Any], path: Path | None = None) -> dict[str, Any]:
    """A copy of ``document`` whose predictions (runs, saturation, picks) the current code re-made, and its
    ``summary`` made again from them.

    Raises
    ------
    ValueError
        Naming the first input :func:`missing_inputs` finds absent.
    """

    missing = missing_inputs(document, path)
    if missing:
        raise ValueError(f"{document['run_id']}: cannot re-predict: {missing[0]} not found"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    folder = _folder(document, path)
    calibration_path = _calibration(document, folder)
    calibration = load_calibration(calibration_path)
    settings = document.get("settings", {})
    lengths = sorted(int(k) for k in str(settings.get("draft_lengths", "2,4")).split(","))
    found = copy.deepcopy(dict(document))
    records = found["records"]
    planned: dict[tuple[str, float], dict[int, float | None]] = {}
    bands: dict[tuple[str, float], dict[int, list[float | None]]] = {}
    for label in sorted({pick["workload"] for pick in records["picks"]}):
        picks = sorted((p for p in records["picks"] if p["workload"] == label), key=lambda p: p["load"])
        rates = [p["rate_rps"] for p in picks]
        prompt, output = (int(x) for x in label.split("/"))
        workload = (prompt, output)
        intervals = planned_intervals(str(calibration_path), workload, lengths, rates) or [{} for _ in rates]
        for pick, (picked, latencies), interval in zip(
                picks, planner_picks(str(calibration_path), workload, lengths, rates), intervals):
            pick["picked"] = picked
            pick["planned"] = [{"option": option, "e2e_s": value} for option, value in latencies.items()]
            planned[(label, pick["load"])], bands[(label, pick["load"])] = latencies, interval
    measured_keys = ("option", "e2e_s", "ttft_s", "tpot_s", "alpha", "flags", "stalled_streams", "file")
    remade = []
    for r in records["runs"]:
        run = read_results(_pass_folder(folder, r["pass"]) / Path(r["file"]).name, "vllm")[0][0]
        meta = {key: value for key, value in r.items() if key not in measured_keys
                and not key.startswith(("predicted_", "planned_"))}
        key = (r["workload"], r["load"])
        record = run_record(run, calibration.coefficients_at, planned_e2e_s=planned.get(key, {}).get(r["option"]),
                            planned_e2e_ci95_s=bands.get(key, {}).get(r["option"]), **meta)
        record["file"] = r["file"]
        remade.append(record)
    records["runs"] = remade
    for s in records["saturation"]:
        if s.get("clients"):
            run = read_results(_plateau_file(folder, s, _labels(document)), "vllm")[0][0]
            s.update(saturation_prediction(calibration.coefficients_at, run, int(settings.get("max_num_seqs", 64))))
    found["predicted_by"] = code_version()
    # the run's own summary from the re-made records, so that per-run figures judge the same model as the pool
    spread = calibration_spread(found)
    found["summary"] = summarize(records["runs"], records["saturation"], records["picks"],
                                 [found["calibrate_wall_s"]], {} if spread is None else {found["run_id"]: spread})
    return found
