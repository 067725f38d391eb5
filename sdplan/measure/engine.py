"""``sdplan calibrate --method engine``: the grid, a resumable measurement store, the document.

This module never imports vLLM. It drives any :class:`StepRunner` (the real
one lives in :mod:`sdplan._vllm`; tests use synthetic ones), saves every
measurement as it arrives so an interrupted run keeps what it measured, and
writes the calibration of the per-step model fitted to them
(:mod:`sdplan.measure.stepfit`).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from sdplan.errors import InputFileError, InvalidValueError
from sdplan.measure.stepfit import CalibrationFit, Measurement, fit_quality_document, step_key, step_model_document

MEASUREMENT_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Grid:
    """What to measure. Lengths in tokens."""

    batch_sizes: tuple[int, ...]
    draft_lengths: tuple[int, ...]
    prompt_tokens: tuple[int, ...]
    prefill_tokens: tuple[int, ...]
    decode_steps: int
    repeats: int = 1


GRIDS = {
    "quick": Grid(batch_sizes=(1, 2, 4), draft_lengths=(2, 4), prompt_tokens=(32, 128), prefill_tokens=(32, 96, 192),
                  decode_steps=12),
    "standard": Grid(batch_sizes=(1, 2, 4, 8, 16), draft_lengths=(1, 2, 4, 6), prompt_tokens=(64, 256, 1024),
                     prefill_tokens=(64, 256, 512, 1024), decode_steps=24),
    "thorough": Grid(batch_sizes=(1, 2, 4, 8, 16, 32, 64), draft_lengths=(1, 2, 3, 4, 6, 8),
                     prompt_tokens=(128, 512, 1024, 2048, 4096), prefill_tokens=(128, 512, 1024, 2048, 4096),
                     decode_steps=32, repeats=2),
}


@dataclass(frozen=True, slots=True)
class Task:
    """One measurement to take. ``kind`` is ``target``, ``speculative`` or ``prefill``."""

    kind: str
    batch: int
    draft_length: int
    prompt_tokens: int

    @property
    def key(self) -> str:
        return step_key(self.kind, self.batch, self.draft_length, self.prompt_tokens)




class StepRunner(Protocol):
    """What the calibrator needs from an engine. Times are wall seconds per engine step."""

    def target_steps(self, batch: int, draft_length: int, prompt_tokens: int, steps: int) -> list[float]:
        """Decode steps of the target with ``batch`` sequences; ``draft_length > 0`` verifies
        ``draft_length + 1`` tokens per sequence per step with a zero-cost proposer."""

    def speculative_steps(self, batch: int, draft_length: int, prompt_tokens: int, steps: int) -> list[float]:
        """Decode steps with the real draft model proposing ``draft_length`` tokens."""

    def prefill_seconds(self, prompt_tokens: int) -> float:
        """Wall time of one request's prefill of ``prompt_tokens`` tokens."""


def plan_tasks(grid: Grid, with_draft: bool = True) -> list[Task]:
    """Every task of a grid, grouped so that each engine configuration is started once.

    Order: prefill and plain decode (target engine), then per draft length the
    verify-shaped target steps and the real SD steps.
    """
    points = [(b, p) for p in grid.prompt_tokens for b in grid.batch_sizes]
    tasks = [Task("prefill", 1, 0, p) for p in grid.prefill_tokens]
    tasks += [Task("target", b, 0, p) for b, p in points]
    for k in grid.draft_lengths:
        tasks += [Task("target", b, k, p) for b, p in points]
        if with_draft:
            tasks += [Task("speculative", b, k, p) for b, p in points]
    return tasks


# ----------------------------------------------------------------------------- store


class MeasurementStore:
    """Measurements saved one line at a time (JSON Lines, or CSV for a ``.csv`` path).

    The first line records the run's configuration; ``--resume`` refuses a
    store whose configuration differs, so measurements of two setups never mix.
    """

    def __init__(self, path: Path, config: dict[str, Any]) -> None:
        self.path = path
        self.config = config
        self.is_csv = path.suffix == ".csv"

    def load(self) -> list[Measurement]:
        """Measurements already in the store (for ``--resume``)."""
        if not self.path.exists():
            return []
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            why = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
            raise InputFileError(str(self.path), None, f"cannot read ({why}); remove it or choose another "
                                 "--measurements-out") from None
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            return []
        try:
            if self.is_csv:
                header = json.loads(lines[0].lstrip("# "))
                rows = list(csv.DictReader(lines[1:]))
                found = [_measurement({key: row[key] for key in row}) for row in rows]
            else:
                header = json.loads(lines[0])
                found = [_measurement(json.loads(line)) for line in lines[1:]]
            if not isinstance(header, dict):
                raise TypeError("its first line is not a JSON object")
        except (ValueError, KeyError, TypeError, AttributeError, csv.Error) as error:
            raise InputFileError(str(self.path), None,
                                 f"not a measurement store ({str(error)[:120]}); remove it or choose another "
                                 "--measurements-out") from None
        if header.get("config") != self.config:
            raise InputFileError(str(self.path), "config",
                                 "was measured with another configuration (models, dtype or grid); "
                                 "use the same options, or start afresh without --resume")
        return found

    def start(self, resume: bool) -> list[Measurement]:
        """Open for a run: load on resume, else start a new file (keeping none of an old one)."""
        if resume:
            return self.load()
        header = {"format": "sdplan-measurements", "version": MEASUREMENT_FORMAT_VERSION, "config": self.config}
        with self.path.open("w", encoding="utf-8") as stream:
            if self.is_csv:
                stream.write("# " + json.dumps(header) + "\n")
                stream.write(",".join(_FIELDS) + "\n")
            else:
                stream.write(json.dumps(header) + "\n")
            stream.flush()
            os.fsync(stream.fileno())
        return []

    def append(self, measurement: Measurement) -> None:
        """Append one measurement durably (flushed and fsynced)."""
        row = asdict(measurement)
        with self.path.open("a", encoding="utf-8") as stream:
            if self.is_csv:
                stream.write(",".join(str(row[name]) for name in _FIELDS) + "\n")
            else:
                stream.write(json.dumps(row) + "\n")
            stream.flush()
            os.fsync(stream.fileno())


_FIELDS = ("kind", "batch", "draft_length", "prompt_tokens", "context_tokens", "seconds", "samples")


def _measurement(row: dict[str, Any]) -> Measurement:
    return Measurement(kind=str(row["kind"]), batch=int(row["batch"]), draft_length=int(row["draft_length"]),
                       prompt_tokens=int(row["prompt_tokens"]), context_tokens=float(row["context_tokens"]),
                       seconds=float(row["seconds"]), samples=int(row["samples"]))


# ----------------------------------------------------------------------------- running


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])


def measure(
    tasks: Iterable[Task],
    runner: StepRunner,
    grid: Grid,
    store: MeasurementStore,
    done: list[Measurement],
    on_progress: Callable[[int, int, str], None] | None = None,
) -> list[Measurement]:
    """Take every task not already ``done``, saving each result as it comes.

    Step times are summarised by their median after dropping the first
    decode step (warm-up; the runner also warms each fresh engine with an
    unrecorded decode); the mean context of a decode run of ``n`` steps
    from a prompt of ``p`` tokens is ``p + n/2``.
    """
    todo = list(tasks)
    finished = {m.key: m for m in done}
    results = [m for m in done if m.key in {t.key for t in todo}]
    total = len(todo)
    count = len(results)
    for task in todo:
        if task.key in finished:
            continue
        if on_progress:
            on_progress(count, total, task.key)
        if task.kind == "prefill":
            samples = [runner.prefill_seconds(task.prompt_tokens) for _ in range(max(grid.repeats, 1) + 1)][1:]
            context = float(task.prompt_tokens)
        else:
            samples = []
            for _ in range(max(grid.repeats, 1)):
                step = runner.target_steps if task.kind == "target" else runner.speculative_steps
                times = step(task.batch, task.draft_length, task.prompt_tokens, grid.decode_steps)
                samples.extend(times[1:] if len(times) > 2 else times)
            context = task.prompt_tokens + grid.decode_steps / 2.0
        if not samples or any(not (s > 0) for s in samples):
            raise InvalidValueError(f"the engine returned no usable timings for {task.key}")
        measurement = Measurement(kind=task.kind, batch=task.batch, draft_length=task.draft_length,
                                  prompt_tokens=task.prompt_tokens, context_tokens=context,
                                  seconds=_median(samples), samples=len(samples))
        store.append(measurement)
        results.append(measurement)
        count += 1
    if on_progress:
        on_progress(count, total, "done")
    return results


# ----------------------------------------------------------------------------- options and the document


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """Everything ``sdplan calibrate --method engine`` needs, as the command line gave it."""

    target: str
    draft: str | None
    grid_name: str
    #: Where the raw step timings are saved (``.jsonl``, or ``.csv``).
    measurements_path: Path
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    #: The engine's context length (None: :meth:`context_tokens` decides).
    max_model_len: int | None = None
    load_format: str = "auto"
    #: Disable CUDA graphs and compilation (None: vLLM's default).
    enforce_eager: bool | None = None
    #: JSON Lines of prompt token ids to measure acceptance on (None: acceptance is not measured).
    acceptance_prompts: str | None = None
    acceptance_output_tokens: int = 128
    temperature: float = 0.0
    #: Per-token acceptance imposed by vLLM's synthetic rejection sampling (GPU only).
    synthetic_acceptance: float | None = None
    resume: bool = False
    seed: int = 0

    @property
    def grid(self) -> Grid:
        return GRIDS[self.grid_name]

    def store_config(self) -> dict[str, Any]:
        """What a measurement store records of the run: ``--resume`` refuses a store measured otherwise."""
        return {"target": self.target, "draft": self.draft, "dtype": self.dtype,
                "tensor_parallel_size": self.tensor_parallel_size, "grid": self.grid_name,
                "load_format": self.load_format, "synthetic_acceptance": self.synthetic_acceptance}

    def context_tokens(self, prompts: list[list[int]] | None) -> int:
        """The engine's context length: ``max_model_len``, else enough for the grid's longest point (its
        decode steps at the largest draft length, plus 32 tokens) and for the acceptance ``prompts``."""
        if self.max_model_len:
            return self.max_model_len
        grid = self.grid
        longest = max(grid.prompt_tokens + grid.prefill_tokens)
        needed = longest + grid.decode_steps * (max(grid.draft_lengths) + 1) + 32
        if prompts:
            needed = max(needed, max(len(p) for p in prompts) + self.acceptance_output_tokens
                         + max(grid.draft_lengths) + 16)
        return needed


def calibration_document(options: EngineOptions, *, name: str, fit: CalibrationFit, engine: dict[str, Any],
                         wall_seconds: float, measurements_path: str, acceptance: dict[str, Any] | None, today: Any,
                         version: str) -> dict[str, Any]:
    """A complete ``method = "measured"`` calibration document (schema version 1) of an engine calibration;
    ``measurements_path`` is where its raw step timings lie, as the document names it."""
    grid, target, draft = options.grid, options.target, options.draft
    document: dict[str, Any] = {
        "schema_version": 1,
        "name": name,
        "description": f"{target} with draft {draft or 'none'} on {engine['hardware']}, measured with sdplan calibrate",
        "provenance": {
            "method": "measured",
            "hardware": engine["hardware"],
            "target_model": target,
            "draft_model": draft or "none (draft costs zero)",
            "engine": engine["engine"],
            "engine_version": engine["engine_version"],
            "date": today,
            "created_by": f"sdplan calibrate --method engine (sdplan {version})",
            "dtype": options.dtype,
            "tensor_parallel_size": options.tensor_parallel_size,
            "sources": [f"raw step timings: {measurements_path}"],
            "notes": (
                f"grid '{options.grid_name}': batch sizes {list(grid.batch_sizes)}, draft lengths "
                f"{list(grid.draft_lengths)}, prompt tokens {list(grid.prompt_tokens)}, prefill tokens "
                f"{list(grid.prefill_tokens)}, {grid.decode_steps} decode steps per point; load format "
                f"{options.load_format}; {wall_seconds:.1f} s wall for this invocation (a resumed run counts only "
                "its own part). Verify steps timed with a zero-cost fixed-k proposer; the draft's share "
                "is the real SD step minus the verify step. " + " ".join(fit.notes)
            ).strip(),
        },
        "reference_workload": {"prompt_tokens": max(grid.prompt_tokens), "output_tokens": 128},
        "validity": {
            "prompt_tokens": [min(grid.prompt_tokens + grid.prefill_tokens),
                              max(grid.prompt_tokens + grid.prefill_tokens)],
            "batch_size": [min(grid.batch_sizes), max(grid.batch_sizes)],
        },
        "fit_quality": fit_quality_document(fit),
        "measurement": {
            "method": "engine",
            "excludes": "the serving stack: API server, detokenisation, streaming, engine-worker IPC, and the "
                        "wait of a new request for the running step; predicts bare engine steps, not a served "
                        "system (use the default --method served for that)",
            "wall_time_s": round(wall_seconds, 1),
        },
    }
    if acceptance is not None:
        document["acceptance"] = acceptance
    document["step_model"] = step_model_document(fit)
    return document
