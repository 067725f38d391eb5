"""What ``sdplan show`` and ``sdplan calibrations`` answer: one calibration at a workload, and the shipped list.

:func:`show_calibration` resolves a calibration and evaluates it at a
workload (its reference workload unless lengths are given): the coefficients
and the no-SD demand that sets its saturation. :func:`list_shipped` loads
every shipped calibration, keeping the error of one that does not load.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sdplan.calibration import (
    DEFAULT_CALIBRATION,
    Calibration,
    load_calibration,
    resolve_calibration,
    shipped_calibrations,
)
from sdplan.calibration.records import StepModel
from sdplan.calibration.scaling import mean_context
from sdplan.errors import InputFileError, InvalidValueError
from sdplan.inputs.serving import LimitOptions, engine_name, resolve_limits
from sdplan.latency import model
from sdplan.latency.coefficients import SPECULATIVE_PARAMETERS, Coefficients


@dataclass(frozen=True, slots=True, kw_only=True)
class ShowRequest:
    """What ``sdplan show`` was given: the calibration (None: the default) and the lengths to evaluate it at
    (None: its reference workload's)."""

    calibration: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    #: Sequences in flight and draft lengths to price the engine step at (None: STEP_BATCHES, and the file's
    #: priced draft lengths up to four).
    batch_sizes: tuple[int, ...] | None = None
    draft_lengths: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationShown:
    """A calibration with its coefficients at the workload, and its no-SD demand ``(C1, C2)``, in s.

    ``baseline_demand`` is the C2 past the compute-bound knee where the file has one
    (:func:`sdplan.latency.model.baseline_knee`): the demand that sets the no-SD saturation.
    """

    calibration: Calibration
    coefficients: Coefficients
    baseline_demand: tuple[float, float]
    #: The engine step the calibration prices at the workload: batch sizes, the draft lengths (0, no SD, first)
    #: and the seconds of one step, ``step_times_s[i][j]`` at ``step_batches[i]`` and ``step_draft_lengths[j]``
    #: (:func:`sdplan.latency.model.step_times`; an SD cycle drafts and verifies).
    step_batches: tuple[int, ...] = ()
    step_draft_lengths: tuple[int, ...] = ()
    step_times_s: tuple[tuple[float, ...], ...] = field(default=())
    #: Of each step, the engine's overheads the file prices beside the op timings (``[step_model.engine]
    #: step_overhead_s``, the host's scheduling; for an SD cycle also ``[step_model.speculation]``'s per cycle and
    #: per sequence: the drafting phase's launch, rejection sampling, bookkeeping, an n-gram lookup), so a kernel
    #: timing is held against ``step_times_s`` less these. Empty but for a derived file (priced from op timings).
    step_overhead_s: tuple[tuple[float, ...], ...] = field(default=())
    #: Of each step, the drafting phase's device work: the drafter's ``c k`` steps
    #: (:func:`sdplan.latency.model.drafted_tokens`), each ``[step_model.draft]`` at one token a sequence
    #: (:meth:`sdplan.calibration.records.StepCost.at`); 0 without SD. The rest of an SD cycle is the verification
    #: pass and the engine's overheads. Empty but for a file with a step model (a fitted one prices a drafted token
    #: and its verified row as one cost).
    step_drafting_s: tuple[tuple[float, ...], ...] = field(default=())
    #: Requests of the workload each option's engine holds at once, with what binds (``batch cap of 213
    #: sequences: KV cache of ...``), for ``step_draft_lengths`` (:func:`sdplan.inputs.serving.resolve_limits`
    #: with no flags and no workload file).
    batch_caps: tuple[tuple[int, int, str], ...] = ()
    #: ``max_num_seqs`` and where it comes from (``the max_num_seqs the derived calibration was priced for``).
    max_num_seqs: tuple[int, str] = (0, "")
    #: How the calibration's engine fills its KV cache, a sentence (``vLLM fills the cache as requests run, ...``;
    #: :attr:`sdplan.inputs.serving.KvHold.rule`).
    kv_rule: str = ""


#: Batch sizes ``sdplan show`` prices an engine step at: one sequence to a full default ``max_num_seqs``.
STEP_BATCHES = (1, 4, 16, 64, 128, 256)
#: Draft lengths it prices an SD cycle at where the file names none (``[derivation] draft_lengths``).
STEP_DRAFT_LENGTHS = (1, 2, 3, 4)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShippedCalibration:
    """One shipped calibration file: loaded, or the error that kept it from loading."""

    path: str
    calibration: Calibration | None
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ShippedListing:
    """Every shipped calibration, and the name of the default one."""

    entries: list[ShippedCalibration]
    default_name: str


def show_calibration(request: ShowRequest) -> CalibrationShown:
    """The calibration of ``request`` evaluated at its workload.

    Raises
    ------
    InputFileError
        The calibration cannot be read or is invalid.
    """
    cal = resolve_calibration(request.calibration)
    prompt = request.prompt_tokens or cal.reference_prompt_tokens
    output = request.output_tokens or cal.reference_output_tokens
    coefficients = cal.coefficients_at(prompt, output)
    c1_d, c2_d = model.baseline_demand(coefficients)
    # the no-SD demand that sets its saturation: past the compute-bound knee where the file has one
    past = model.baseline_knee(coefficients, c1_d, c2_d)
    derivation = cal.records.derivation
    no_sd = set(cal.without_runs) >= set(SPECULATIVE_PARAMETERS)
    if no_sd and request.draft_lengths:
        raise InvalidValueError(f"--draft-lengths: {cal.name} prices no SD (its file has no speculative "
                                "parameters); leave the option out")
    lengths = () if no_sd else request.draft_lengths or tuple(
        (derivation.draft_lengths if derivation is not None and derivation.draft_lengths else STEP_DRAFT_LENGTHS)[:4])
    batches = request.batch_sizes or STEP_BATCHES
    times = model.step_times(coefficients, list(lengths), np.asarray(batches, dtype=np.float64),
                             cal.moe_at(prompt, output))
    costs = cal.records.costs
    drafting: tuple[tuple[float, ...], ...] = ()
    if isinstance(costs, StepModel):
        drafted = model.drafted_tokens(coefficients, np.asarray((0, *lengths), dtype=np.float64))
        context = mean_context(prompt, output)  # the draft's KV context is taken equal to the target's
        drafting = tuple(tuple(float(tokens) * costs.draft.at(batch, 1.0, context) for tokens in drafted)
                         for batch in batches)
    # only a file priced from op timings tells its kernels from the engine's overheads; a fitted one has one sum
    overheads: tuple[tuple[float, ...], ...] = ()
    if isinstance(costs, StepModel) and cal.records.provenance.method == "derived":
        cycle = costs.step_overhead_s + costs.overhead_fixed_s
        overheads = tuple((costs.step_overhead_s, *(cycle + batch * costs.overhead_per_sequence_s for _ in lengths))
                          for batch in batches)
    limits = resolve_limits(cal, None, LimitOptions(), (0, *lengths), prompt, output)
    caps = tuple((k, int(cap), limits.cap_phrase(k)) for k, cap in zip((0, *lengths), limits.caps(lengths)))
    return CalibrationShown(calibration=cal, coefficients=coefficients, baseline_demand=(c1_d, float(past.c2_above_s)),
                            step_batches=batches, step_draft_lengths=(0, *lengths),
                            step_times_s=tuple(tuple(float(t) for t in row) for row in times),
                            step_overhead_s=overheads, step_drafting_s=drafting, batch_caps=caps,
                            max_num_seqs=(limits.max_num_seqs, limits.max_num_seqs_source),
                            kv_rule=f"{engine_name(cal.records.provenance.engine)} {limits.kv_hold.rule}")


def list_shipped() -> ShippedListing:
    """Every shipped calibration, loaded; one that fails to load is listed with its error, not raised."""
    entries = []
    for path in shipped_calibrations():
        try:
            entries.append(ShippedCalibration(path=str(path), calibration=load_calibration(path), error=None))
        except InputFileError as error:
            entries.append(ShippedCalibration(path=str(path), calibration=None, error=str(error)))
    return ShippedListing(entries=entries, default_name=DEFAULT_CALIBRATION)
