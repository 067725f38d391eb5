"""What ``plan``, ``check``, ``capacity`` and ``simulate`` start from, resolved once.

A :class:`Scenario` is the calibration, the workload file (if any), the
workload (lengths and acceptance), the SD method, the candidate draft lengths
with their tokens per cycle ``E``, the cost coefficients and MoE routing at the
workload, and the engine limits (:mod:`sdplan.inputs.serving`). Every command builds
it with :func:`resolve_scenario` from what the user gave, then runs its own
core function on it.

Precedence, as everywhere in sdplan: a value given on the command line, then
the workload file, then the calibration (its reference workload, measured
acceptance, the limits its servers ran with), then the default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from sdplan.calibration import resolve_calibration
from sdplan.errors import InvalidValueError
from sdplan.inputs.methods import resolve_method
from sdplan.inputs.serving import EngineLimits, LimitOptions, resolve_limits
from sdplan.inputs.workload import load_workload_file, measured_draft_lengths, resolve_workload
from sdplan.latency.coefficients import over_prompts

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.calibration import Calibration
    from sdplan.inputs.workload import Workload, WorkloadFile
    from sdplan.latency.coefficients import Coefficients
    from sdplan.latency.moe import MoESpec

    FloatArray = npt.NDArray[np.float64]

#: A histogram of request lengths: prompt tokens, output tokens, weights (``sdplan.inputs.workload.load_lengths_file``).
LengthHistogram = tuple[list[float], list[float], list[float]]

#: Candidate draft lengths when neither the command line nor the workload file gives any.
DEFAULT_DRAFT_LENGTHS = tuple(range(1, 9))


@dataclass(frozen=True, slots=True)
class AcceptanceGiven:
    """Acceptance as given on the command line, in any one metric (see
    :func:`sdplan.inputs.workload.resolve_workload`)."""

    alpha: list[float] | None = None
    mean_length: list[float] | None = None
    draft_rate: list[float] | None = None
    measured_at_k: int | None = None
    position_rates: list[float] | None = None
    #: A ``speculation_profile.json`` path (:mod:`sdplan.inputs.speculation_profile`).
    profile: str | None = None

    @property
    def given(self) -> bool:
        return any(value is not None for value in (self.alpha, self.mean_length, self.draft_rate,
                                                   self.measured_at_k, self.position_rates, self.profile))


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioOptions:
    """What the user gave; None (or empty) where not given.

    ``draft_lengths`` are the candidates given (None: the workload file's, else
    :data:`DEFAULT_DRAFT_LENGTHS`); ``single_acceptance`` refuses more than one
    acceptance value (one operating point is evaluated).
    """

    calibration: str | None = None
    workload_path: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    acceptance: AcceptanceGiven = field(default_factory=AcceptanceGiven)
    draft_lengths: Sequence[int] | None = None
    lengths: LengthHistogram | None = None
    limits: LimitOptions = field(default_factory=LimitOptions)
    spec_method: str | None = None
    single_acceptance: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """Everything a command evaluates, resolved.

    Attributes
    ----------
    draft_lengths : list of int
        Candidate draft lengths (>= 1), those the acceptance covers.
    lengths_note : str or None
        Why candidates were left out (per-position acceptance measured up to a shorter k).
    tokens_per_cycle : (a, k) array
        ``E`` per acceptance value and candidate.
    limits : EngineLimits
        The engine limits for no SD and every candidate (:func:`sdplan.inputs.serving.resolve_limits`).
    """

    calibration: Calibration
    file: WorkloadFile | None
    workload: Workload
    method: str
    draft_lengths: list[int]
    draft_lengths_given: bool
    lengths_note: str | None
    tokens_per_cycle: FloatArray
    coefficients: Coefficients
    moe: MoESpec | None
    limits: EngineLimits
    lengths: LengthHistogram | None
    given_limits: LimitOptions

    @property
    def alpha(self) -> float:
        """The (first) per-token acceptance."""
        return float(self.workload.acceptance.alphas[0])

    @property
    def request_tokens(self) -> int:
        """Tokens one request reserves in the KV cache, ``p + g``."""
        return self.workload.prompt_tokens + self.workload.output_tokens

    def limits_for(self, draft_lengths: Sequence[int]) -> EngineLimits:
        """The engine limits of the server(s) that run ``draft_lengths`` (0: no SD)."""
        return resolve_limits(self.calibration, self.file, self.given_limits, draft_lengths,
                              self.workload.prompt_tokens, self.workload.output_tokens)

    def notes(self) -> list[str]:
        """Notes every command shows as warnings: candidates left out."""
        return [self.lengths_note] if self.lengths_note else []


def histogram_means(lengths: LengthHistogram | None, prompt_tokens: int | None,
                    output_tokens: int | None) -> tuple[int | None, int | None]:
    """Prompt/output lengths for the model: the histogram's weighted means where none is given."""
    if lengths is None:
        return prompt_tokens, output_tokens
    total = sum(lengths[2])
    if prompt_tokens is None:
        prompt_tokens = round(sum(p * w for p, w in zip(lengths[0], lengths[2])) / total)
    if output_tokens is None:
        output_tokens = round(sum(g * w for g, w in zip(lengths[1], lengths[2])) / total)
    return prompt_tokens, output_tokens


def histogram_prompt_cv(lengths: LengthHistogram) -> float:
    """Coefficient of variation of a histogram's prompt lengths, ``sd(p) / mean(p)`` (weighted)."""
    prompts = np.asarray(lengths[0], dtype=np.float64)
    weights = np.asarray(lengths[2], dtype=np.float64)
    mean = float(np.average(prompts, weights=weights))
    return math.sqrt(float(np.average((prompts - mean) ** 2, weights=weights))) / mean


def _acceptance(given: AcceptanceGiven, file: WorkloadFile | None) -> tuple[AcceptanceGiven, str]:
    """The acceptance given, else the workload file's; with where it came from."""
    if file is None or given.given:
        return given, "command line"
    source = f"workload file {file.path}"
    if file.alpha is not None:
        return AcceptanceGiven(alpha=[file.alpha]), source
    if file.mean_length is not None:
        return AcceptanceGiven(mean_length=[file.mean_length], measured_at_k=file.measured_at_k), source
    if file.draft_rate is not None:
        return AcceptanceGiven(draft_rate=[file.draft_rate], measured_at_k=file.measured_at_k), source
    if file.position_rates is not None:
        return AcceptanceGiven(position_rates=list(file.position_rates)), source
    if file.profile is not None:
        return AcceptanceGiven(profile=file.profile), source
    return given, "command line"


def _candidates(given: Sequence[int] | None, file: WorkloadFile | None) -> tuple[list[int], bool]:
    """Candidate draft lengths (>= 1, sorted): given, else the file's, else the default; and whether chosen."""
    if given is not None:
        values, chosen = list(given), True
    elif file is not None and file.draft_lengths is not None:
        values, chosen = list(file.draft_lengths), True
    else:
        values, chosen = list(DEFAULT_DRAFT_LENGTHS), False
    positive = sorted({int(k) for k in values if k > 0})
    if not positive:
        raise InvalidValueError("give at least one draft length >= 1 (--draft-lengths, or speculation.draft_lengths "
                                "in the workload file)")
    return positive, chosen


def resolve_scenario(options: ScenarioOptions) -> Scenario:
    """Load and resolve everything a command evaluates (see the module notes for the precedence).

    Raises
    ------
    SdplanError
        For an unreadable or invalid file, or values out of their domain.
    """
    file = load_workload_file(options.workload_path) if options.workload_path else None
    calibration = resolve_calibration(options.calibration or (file.calibration if file else None))
    prompt, output = histogram_means(options.lengths, options.prompt_tokens, options.output_tokens)
    acceptance, source = _acceptance(options.acceptance, file)
    workload = resolve_workload(
        calibration,
        prompt_tokens=prompt if prompt is not None else (file.prompt_tokens if file else None),
        output_tokens=output if output is not None else (file.output_tokens if file else None),
        alpha=acceptance.alpha, mean_length=acceptance.mean_length, draft_rate=acceptance.draft_rate,
        measured_at_k=acceptance.measured_at_k, source=source, position_rates=acceptance.position_rates,
        profile=acceptance.profile)
    if options.single_acceptance and len(workload.acceptance.alphas) != 1:
        raise InvalidValueError("give a single acceptance value here (one operating point is evaluated)")
    method = resolve_method(options.spec_method, calibration)
    candidates, chosen = _candidates(options.draft_lengths, file)
    candidates, note = measured_draft_lengths(workload.acceptance, candidates, given=chosen)
    p, g = workload.prompt_tokens, workload.output_tokens
    # a proposer that drafts on a share of the cycles only verifies 1 + c k rows a sequence (sdplan.latency.model)
    coefficients = replace(calibration.coefficients_at(p, g), draft_coverage=workload.acceptance.coverage)
    if options.lengths is not None and options.prompt_tokens is None:  # the model's prompt is the histogram's mean
        coefficients = over_prompts(coefficients, histogram_prompt_cv(options.lengths))
    return Scenario(
        calibration=calibration, file=file, workload=workload, method=method, draft_lengths=candidates,
        draft_lengths_given=chosen, lengths_note=note,
        tokens_per_cycle=workload.acceptance.tokens_per_cycle(candidates),
        coefficients=coefficients,
        moe=calibration.moe_at(p, g),
        limits=resolve_limits(calibration, file, options.limits, [0, *candidates], p, g),
        lengths=options.lengths, given_limits=options.limits)
