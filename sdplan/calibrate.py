"""Measuring a calibration: the grid, a resumable measurement store, the fits.

This module never imports vLLM. It drives any :class:`StepRunner` (the real
one lives in :mod:`sdplan._vllm`; tests use synthetic ones), saves every
measurement as it arrives so an interrupted run keeps what it measured, and
fits the per-step form of ``sdplan-calibration(5)``:

* target step (plain decode ``q = 1`` and verification ``q = k + 1``, the
  latter with a zero-cost proposer so no draft cost is included)::

      T_t(B, q, s) = fixed + B (per_sequence + q per_query_token + s per_context_token)
                     + [q > 1] (switch_on_fixed + B switch_on_per_sequence)

  The last term is the cost of having SD switched on (rejection sampler and
  speculative bookkeeping), which verification steps pay and plain decode
  does not; without it that cost is smeared into ``fixed`` and
  ``per_query_token``, overstating the no-SD step (+9.6% at B = 1 with a
  0.4 ms switch-on cost on the standard grid). It is identified when the
  grid measures both plain decode and verification steps, and is written
  into ``[step_model.speculation]`` with the rest of the per-cycle SD
  overhead, which only SD options pay (``sdplan-calibration(5)``).

* the draft's real share, from full SD steps minus the target's verify step
  (standalone draft timings overestimate it,
  ``docs/engines.md#measuring-steps-in-process``)::

      T_sd(B, k, s) - T_t(B, k+1, s) = o_fixed + B o_seq + k D.fixed + B k (D.seq + s D.ctx)

* prefill of one request: ``T_p(p) = fixed + p per_prompt_token``.

All fits are linear least squares with non-negative coefficients
(``scipy.optimize.lsq_linear``), reporting R² and residuals per term.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from sdplan.errors import InputFileError, InvalidValueError

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
        return f"{self.kind}:B={self.batch}:k={self.draft_length}:p={self.prompt_tokens}"


@dataclass(frozen=True, slots=True)
class Measurement:
    """The median step time of one task, in seconds, with its mean context."""

    kind: str
    batch: int
    draft_length: int
    prompt_tokens: int
    context_tokens: float
    seconds: float
    samples: int

    @property
    def key(self) -> str:
        return Task(self.kind, self.batch, self.draft_length, self.prompt_tokens).key


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


# ----------------------------------------------------------------------------- fitting


@dataclass(frozen=True, slots=True)
class TermFit:
    """One least-squares fit: coefficients (s), R², residuals (s)."""

    names: tuple[str, ...]
    values: tuple[float, ...]
    r2: float
    rmse_s: float
    max_abs_residual_s: float
    points: int

    def as_dict(self) -> dict[str, float]:
        return dict(zip(self.names, self.values))


@dataclass(frozen=True, slots=True)
class CalibrationFit:
    target: TermFit
    speculative: TermFit | None
    prefill: TermFit
    notes: list[str] = field(default_factory=list)

    @property
    def r2(self) -> float:
        """The weakest term's R² (the file's headline fit quality)."""
        fits = [self.target, self.prefill] + ([self.speculative] if self.speculative else [])
        return min(fit.r2 for fit in fits)


def _nonnegative_fit(columns: list[list[float]], names: tuple[str, ...], y: list[float]) -> TermFit:
    import numpy as np
    from scipy.optimize import lsq_linear

    design = np.array(columns, dtype=np.float64).T
    target = np.asarray(y, dtype=np.float64)
    if design.shape[0] < design.shape[1]:
        raise InvalidValueError(f"too few measurements ({design.shape[0]}) to fit {', '.join(names)}; "
                                "use a larger --grid")
    scale = np.where(np.abs(design).max(axis=0) > 0, np.abs(design).max(axis=0), 1.0)
    solution = lsq_linear(design / scale, target, bounds=(0.0, np.inf), method="bvls")
    values = solution.x / scale
    predicted = design @ values
    residual = target - predicted
    total = float(((target - target.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0
    return TermFit(names=names, values=tuple(float(v) for v in values), r2=r2,
                   rmse_s=float(np.sqrt((residual**2).mean())), max_abs_residual_s=float(np.abs(residual).max()),
                   points=int(target.size))


def target_step_prediction(fit: TermFit, batch: float, query: float, context: float) -> float:
    """``T_t(B, q, s)`` of the module docstring, the switch-on term included for verification (``q > 1``)."""
    c = fit.as_dict()
    switch_on = c.get("switch_on_fixed_s", 0.0) + batch * c.get("switch_on_per_sequence_s", 0.0) if query > 1 else 0.0
    return c["fixed_s"] + batch * (c["per_sequence_s"] + query * c["per_query_token_s"]
                                   + context * c["per_context_token_s"]) + switch_on


def fit_calibration(measurements: list[Measurement]) -> CalibrationFit:
    """Fit the per-step model from measurements (see the module docstring).

    Raises
    ------
    InvalidValueError
        If a kind of measurement is missing or too sparse to fit.
    """
    target = [m for m in measurements if m.kind == "target"]
    prefill = [m for m in measurements if m.kind == "prefill"]
    spec = [m for m in measurements if m.kind == "speculative"]
    if not target or not prefill:
        raise InvalidValueError("calibration needs target and prefill measurements")
    columns: list[list[float]] = [[1.0] * len(target), [m.batch for m in target],
                                  [m.batch * (m.draft_length + 1) for m in target],
                                  [m.batch * m.context_tokens for m in target]]
    names: tuple[str, ...] = ("fixed_s", "per_sequence_s", "per_query_token_s", "per_context_token_s")
    notes = []
    if any(m.draft_length > 0 for m in target) and any(m.draft_length == 0 for m in target):
        # [k > 0] and [k > 0] B: the cost of SD being on, apart from the verified tokens' own cost
        columns += [[float(m.draft_length > 0) for m in target], [m.batch * float(m.draft_length > 0) for m in target]]
        names += ("switch_on_fixed_s", "switch_on_per_sequence_s")
    else:
        notes.append("the cost of switching SD on is not identified (the grid measured "
                     f"{'only verification' if target and target[0].draft_length else 'no verification'} steps): "
                     "it stays in the target step's fixed cost")
    target_fit = _nonnegative_fit(columns, names, [m.seconds for m in target])
    prefill_fit = _nonnegative_fit(
        [[1.0] * len(prefill), [m.prompt_tokens for m in prefill]], ("fixed_s", "per_prompt_token_s"),
        [m.seconds for m in prefill],
    )
    spec_fit = None
    if spec:
        # The draft's share: the measured SD step minus the target's verify step at the same point.
        verify = {(m.batch, m.draft_length, m.prompt_tokens): m.seconds for m in target}
        extra, rows = [], []
        for m in spec:
            base = verify.get((m.batch, m.draft_length, m.prompt_tokens))
            if base is None:
                base = target_step_prediction(target_fit, m.batch, m.draft_length + 1, m.context_tokens)
            extra.append(m.seconds - base)
            rows.append(m)
        draft = _nonnegative_fit(
            [[1.0] * len(rows), [m.batch for m in rows], [m.draft_length for m in rows],
             [m.batch * m.draft_length for m in rows], [m.batch * m.draft_length * m.context_tokens for m in rows]],
            ("overhead_fixed_s", "overhead_per_sequence_s", "draft_fixed_s", "draft_per_sequence_s",
             "draft_per_context_token_s"),
            extra,
        )
        # Report the quality of the whole SD step prediction, which is what the planner uses.
        import numpy as np

        c = draft.as_dict()
        predicted = np.array([
            target_step_prediction(target_fit, m.batch, m.draft_length + 1, m.context_tokens)
            + c["overhead_fixed_s"] + m.batch * c["overhead_per_sequence_s"] + m.draft_length * c["draft_fixed_s"]
            + m.batch * m.draft_length * (c["draft_per_sequence_s"] + m.context_tokens * c["draft_per_context_token_s"])
            for m in rows
        ])
        measured = np.array([m.seconds for m in rows])
        residual = measured - predicted
        total = float(((measured - measured.mean()) ** 2).sum())
        spec_fit = TermFit(names=draft.names, values=draft.values,
                           r2=1.0 - float((residual**2).sum()) / total if total > 0 else 1.0,
                           rmse_s=float(np.sqrt((residual**2).mean())),
                           max_abs_residual_s=float(np.abs(residual).max()), points=len(rows))
    else:
        notes.append("no draft model measured: draft costs are zero (an n-gram-like proposer)")
    return CalibrationFit(target=target_fit, speculative=spec_fit, prefill=prefill_fit, notes=notes)


def _significant(value: float) -> float:
    return float(f"{value:.6g}")


def step_model_document(fit: CalibrationFit) -> dict[str, Any]:
    """The ``[step_model]`` table of a calibration from a fit (6 significant digits)."""
    t = {key: _significant(value) for key, value in fit.target.as_dict().items()}
    d = dict(fit.speculative.as_dict()) if fit.speculative else {}
    for key in ("fixed_s", "per_sequence_s"):  # the switch-on cost is per-cycle SD overhead (module docstring)
        d[f"overhead_{key}"] = d.get(f"overhead_{key}", 0.0) + fit.target.as_dict().get(f"switch_on_{key}", 0.0)
    d = {key: _significant(value) for key, value in d.items()}
    p = {key: _significant(value) for key, value in fit.prefill.as_dict().items()}
    return {
        "target": {key: t[key] for key in ("fixed_s", "per_sequence_s", "per_query_token_s", "per_context_token_s")},
        "draft": {
            "fixed_s": d.get("draft_fixed_s", 0.0),
            "per_sequence_s": d.get("draft_per_sequence_s", 0.0),
            "per_query_token_s": 0.0,
            "per_context_token_s": d.get("draft_per_context_token_s", 0.0),
        },
        "prefill": {
            "fixed_s": p["fixed_s"],
            "per_prompt_token_s": p["per_prompt_token_s"],
            "load_per_prompt_token_s": p["per_prompt_token_s"],
        },
        "speculation": {
            "overhead_fixed_s": d.get("overhead_fixed_s", 0.0),
            "overhead_per_sequence_s": d.get("overhead_per_sequence_s", 0.0),
        },
    }


def fit_quality_document(fit: CalibrationFit) -> dict[str, Any]:
    parts = [("target", fit.target), ("speculative step", fit.speculative), ("prefill", fit.prefill)]
    detail = "; ".join(
        f"{name}: R2={term.r2:.4f}, rmse={term.rmse_s * 1e3:.3g} ms, max|residual|={term.max_abs_residual_s * 1e3:.3g} ms, "
        f"n={term.points}"
        for name, term in parts if term is not None
    )
    points = sum(term.points for _, term in parts if term is not None)
    return {"r2": round(fit.r2, 6), "points": points, "detail": detail}


# ----------------------------------------------------------------------------- acceptance


@dataclass(frozen=True, slots=True)
class AcceptanceCounts:
    """vLLM's speculative-decoding counters over a run (differences of before/after snapshots)."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: tuple[int, ...]

    @property
    def draft_length(self) -> int:
        return len(self.accepted_per_position)

    @property
    def draft_acceptance_rate(self) -> float:
        """Fraction of drafted tokens accepted (vLLM's acceptance rate, as a fraction)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per cycle, bonus included: ``1 + accepted/drafts``."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def per_position_rates(self) -> tuple[float, ...]:
        """Conditional per-position rates ``a_i`` = accepted at i / accepted at i-1 (drafts for i = 1)."""
        rates = []
        previous = self.num_drafts
        for accepted in self.accepted_per_position:
            rates.append(accepted / previous if previous else 0.0)
            previous = accepted
        return tuple(rates)

    @property
    def per_token_alpha(self) -> float:
        """The i.i.d. alpha with the same mean acceptance length at this draft length."""
        from sdplan.acceptance import alpha_from_mean_length

        k = self.draft_length
        tau = min(max(self.mean_acceptance_length, 1.0), k + 1.0)
        return float(alpha_from_mean_length(tau, k))

    def document(self, source: str) -> dict[str, Any]:
        """The ``[acceptance]`` table of a calibration."""
        return {
            "per_token_alpha": round(self.per_token_alpha, 6),
            "measured_at_k": self.draft_length,
            "per_position_rates": [round(rate, 6) for rate in self.per_position_rates],
            "source": f"{source}; {self.num_drafts} drafts, {self.num_draft_tokens} draft tokens, "
            f"{self.num_accepted_tokens} accepted (draft acceptance rate {self.draft_acceptance_rate:.4f}, "
            f"mean acceptance length {self.mean_acceptance_length:.4f})",
        }


def calibration_document(
    *,
    name: str,
    fit: CalibrationFit,
    engine: dict[str, Any],
    target: str,
    draft: str | None,
    dtype: str,
    tensor_parallel_size: int,
    grid_name: str,
    grid: Grid,
    load_format: str,
    wall_seconds: float,
    measurements_path: str,
    acceptance: dict[str, Any] | None,
    today: Any,
    version: str,
) -> dict[str, Any]:
    """A complete ``method = "measured"`` calibration document (schema version 1)."""
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
            "dtype": dtype,
            "tensor_parallel_size": tensor_parallel_size,
            "sources": [f"raw step timings: {measurements_path}"],
            "notes": (
                f"grid '{grid_name}': batch sizes {list(grid.batch_sizes)}, draft lengths {list(grid.draft_lengths)}, "
                f"prompt tokens {list(grid.prompt_tokens)}, prefill tokens {list(grid.prefill_tokens)}, "
                f"{grid.decode_steps} decode steps per point; load format {load_format}; "
                f"{wall_seconds:.1f} s wall for this invocation (a resumed run counts only its own part). Verify steps timed with a zero-cost fixed-k proposer; the draft's share "
                "is the real SD step minus the verify step. " + " ".join(fit.notes)
            ).strip(),
        },
        "reference_workload": {"prompt_tokens": max(grid.prompt_tokens), "output_tokens": 128},
        "validity": {
            "prompt_tokens": [min(grid.prompt_tokens + grid.prefill_tokens), max(grid.prompt_tokens + grid.prefill_tokens)],
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
