"""``sdplan calibrate``'s use cases: measure, fit, check and write a calibration.

:func:`calibrate_served` (``--method served``) measures a served vLLM
(:func:`sdplan.measure.run.measure_served`), fits the points
(:func:`sdplan.measure.document.served_calibration`) and writes the file only
if ``sdplan`` itself would read it; a fit that predicts its own points poorly
is written but reported poor (exit 7) unless accepted.
:func:`calibrate_engine` (``--method engine``) times bare engine steps
in-process (:mod:`sdplan._vllm.engine`), measures acceptance on given prompts,
fits the steps (:func:`sdplan.measure.stepfit.fit_calibration`) and writes the file.

Both return typed outcomes; the CLI draws the progress (the ``progress``
callbacks here) and says what happened.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdplan import __version__
from sdplan._vllm import engine as vllm_engine
from sdplan.calibration import parse_calibration
from sdplan.errors import InputFileError, InvalidValueError
from sdplan.fileio import atomic_write_text, dumps_toml
from sdplan.measure.document import served_calibration
from sdplan.measure.engine import EngineOptions, MeasurementStore, calibration_document, measure, plan_tasks
from sdplan.measure.levels import concurrency_levels
from sdplan.measure.options import ServedOptions, check_options
from sdplan.measure.run import interruptible, measure_served
from sdplan.measure.stepfit import fit_calibration
from sdplan.measure.sweep import SweepEvents

#: ``advance(done, total, label)``: how a measurement reports its progress.
Advance = Callable[[int, int, str], None]
#: ``progress(description, total)``: a context that draws progress while it is open, yielding its
#: :data:`Advance` (the CLI's progress bar).
Progress = Callable[[str, int], AbstractContextManager[Advance]]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServedOutcome:
    """What a served calibration measured and wrote.

    ``rejected`` is the problem (``key: problem``) that kept the fit from being a usable calibration, in which
    case nothing was written; ``poor_reasons`` why a written one predicts its own points poorly; ``poor``
    whether to exit 7 (rejected, or poor and not accepted).
    """

    output: Path
    results_dir: Path
    points: int
    wall_s: float
    fit: Any
    rejected: str | None
    poor_reasons: tuple[str, ...]
    poor: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineOutcome:
    """What an engine calibration measured and wrote: its fit's R2 over ``measurements`` step timings."""

    output: Path
    r2: float
    measurements: int
    seconds: float


def planned_points(options: ServedOptions) -> int:
    """The points a served calibration plans (more come when a sweep goes past its grid or re-measures)."""
    configurations = 1 if options.endpoint else 1 + len(options.draft_lengths)
    levels = concurrency_levels(options.grid, options.max_clients())
    return configurations * (len(levels) + len(options.grid.poisson_fractions)) * options.rounds


def calibrate_served(options: ServedOptions, out: Path, name: str | None, accept_poor_fit: bool,
                     events_for: Callable[[int], AbstractContextManager[SweepEvents]]) -> ServedOutcome:
    """Measure a served vLLM, fit and write the calibration ``out`` (named ``name``, else its stem).

    ``events_for(planned)`` opens the sweep's listeners (:class:`sdplan.measure.sweep.SweepEvents`) for the
    :func:`planned_points`; it is closed before the fit. Ctrl-C stops the servers and keeps the results
    (:func:`sdplan.measure.run.interruptible`).

    Raises
    ------
    InvalidValueError
        Options that cannot be measured (:func:`sdplan.measure.options.check_options`), before anything starts.
    InfeasibleError
        Too few usable points to fit.
    """
    check_options(options)
    with interruptible(), events_for(planned_points(options)) as events:
        measurement = measure_served(options, events)
    result = served_calibration(options, measurement, name=name or out.stem, version=__version__)
    try:
        parse_calibration(result.document, str(out))  # never write a file sdplan itself would reject
    except InputFileError as error:
        return ServedOutcome(output=out, results_dir=options.results_dir, points=len(measurement.records),
                             wall_s=measurement.wall_s, fit=result.fit, rejected=f"{error.key}: {error.problem}",
                             poor_reasons=tuple(result.poor_reasons), poor=True)
    atomic_write_text(out, dumps_toml(result.document, header="Measured with 'sdplan calibrate' on a served vLLM; "
                                                               f"raw results in {options.results_dir.name}/."))
    return ServedOutcome(output=out, results_dir=options.results_dir, points=len(measurement.records),
                         wall_s=measurement.wall_s, fit=result.fit, rejected=None,
                         poor_reasons=tuple(result.poor_reasons),
                         poor=bool(result.poor_reasons) and not accept_poor_fit)


def calibrate_engine(options: EngineOptions, out: Path, name: str | None, progress: Progress) -> EngineOutcome:
    """Time bare engine steps, measure acceptance on ``options.acceptance_prompts``, fit and write ``out``.

    Raises
    ------
    MissingDependencyError
        vLLM is not installed (nothing is written).
    InputFileError
        An unreadable or malformed prompts file.
    InvalidValueError
        Acceptance prompts without a draft model.
    """
    chosen = options.grid
    store_path = options.measurements_path
    prompts = read_prompts(options.acceptance_prompts) if options.acceptance_prompts else None
    if prompts and not options.draft:  # refused before the engine starts, not after its measurements
        raise InvalidValueError("--acceptance-prompts needs --draft")
    settings = vllm_engine.EngineSettings(
        target=options.target, draft=options.draft, dtype=options.dtype,
        tensor_parallel_size=options.tensor_parallel_size, max_model_len=options.context_tokens(prompts),
        max_num_seqs=max(max(chosen.batch_sizes), len(prompts or [])), load_format=options.load_format,
        enforce_eager=options.enforce_eager, seed=options.seed, synthetic_acceptance=options.synthetic_acceptance,
    )
    started = time.perf_counter()
    runner = vllm_engine.VllmRunner(settings)  # imports vLLM first: nothing is written when it is missing
    store = MeasurementStore(store_path, options.store_config())
    done = store.start(options.resume)
    try:
        tasks = plan_tasks(chosen, with_draft=options.draft is not None)
        with progress("measuring", len(tasks)) as advance:
            measurements = measure(tasks, runner, chosen, store, done, on_progress=advance)
        acceptance = None
        if prompts:
            counts = runner.acceptance(prompts, max(chosen.draft_lengths), options.acceptance_output_tokens,
                                       options.temperature)
            acceptance = counts.document(f"{len(prompts)} prompts from {options.acceptance_prompts}, temperature "
                                         f"{options.temperature:g}")
        engine = runner.describe()
    finally:
        runner.close()
    fit = fit_calibration(measurements)
    document = calibration_document(
        options, name=name or out.stem, fit=fit, engine=engine, wall_seconds=time.perf_counter() - started,
        measurements_path=relative(store_path, out), acceptance=acceptance, today=datetime.date.today(),
        version=__version__)
    parse_calibration(document, str(out))  # never write a file sdplan itself would reject
    atomic_write_text(out, dumps_toml(document, header="Measured with 'sdplan calibrate'; raw timings in "
                                                       f"{store_path.name}."))
    return EngineOutcome(output=out, r2=fit.r2, measurements=len(measurements),
                         seconds=time.perf_counter() - started)


def read_prompts(path: str) -> list[list[int]]:
    """Prompt token ids from a JSON Lines file: one {"prompt_token_ids": [...]} per line."""
    prompts = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise InputFileError(path, None, f"cannot read ({error.strerror}); check the path") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            ids = json.loads(line)["prompt_token_ids"]
            if not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            raise InputFileError(path, f"line {number}",
                                 'expected {"prompt_token_ids": [non-negative integers, ...]}') from None
        prompts.append(ids)
    if not prompts:
        raise InputFileError(path, None, "no prompts; add JSON lines with prompt_token_ids")
    return prompts


def relative(path: Path, output: Path) -> str:
    """``path`` relative to the calibration's folder when it lies there (keeps the file portable)."""
    try:
        return str(path.resolve().relative_to(output.resolve().parent))
    except ValueError:
        return str(path)
