"""The workload a plan is for: prompt and output lengths and acceptance.

Resolves what the user gave (any of the three acceptance metrics, or none)
against a calibration's defaults, so every command applies the same rules:

* lengths default to the calibration's reference workload;
* acceptance defaults to the calibration's measured acceptance, else to
  :data:`DEFAULT_ALPHA`, and the output says which one was used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from sdplan.acceptance import AcceptanceMetric, AcceptanceSpec, make_acceptance
from sdplan.errors import InvalidValueError

if TYPE_CHECKING:
    from sdplan.calibration import Calibration

#: Per-token acceptance assumed when neither the user nor the calibration gives one.
DEFAULT_ALPHA = 0.7


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """Lengths in tokens and the acceptance they are served with."""

    prompt_tokens: int
    output_tokens: int
    acceptance: AcceptanceSpec


def resolve_acceptance(
    calibration: Calibration,
    *,
    alpha: Sequence[float] | None = None,
    mean_length: Sequence[float] | None = None,
    draft_rate: Sequence[float] | None = None,
    measured_at_k: int | None = None,
    source: str = "command line",
) -> AcceptanceSpec:
    """Acceptance from at most one metric, or the calibration's, or the default.

    Raises
    ------
    InvalidValueError
        If more than one metric is given, ``measured_at_k`` is missing for a
        k-dependent metric (or given for alpha), or a value is out of range.
    """
    given = [
        (metric, values)
        for metric, values in (
            (AcceptanceMetric.PER_TOKEN, alpha),
            (AcceptanceMetric.MEAN_LENGTH, mean_length),
            (AcceptanceMetric.DRAFT_RATE, draft_rate),
        )
        if values is not None
    ]
    if len(given) > 1:
        raise InvalidValueError(
            "give acceptance in one metric only: --acceptance (per-token alpha), "
            "--acceptance-length or --draft-acceptance-rate"
        )
    if given:
        metric, values = given[0]
        if metric is AcceptanceMetric.PER_TOKEN and measured_at_k is not None:
            raise InvalidValueError("--acceptance-k applies to --acceptance-length or --draft-acceptance-rate only")
        return make_acceptance(metric, tuple(values), measured_at_k, source)
    if measured_at_k is not None:
        raise InvalidValueError("--acceptance-k needs --acceptance-length or --draft-acceptance-rate")
    measured = calibration.acceptance
    if measured is not None:
        return make_acceptance(
            AcceptanceMetric.PER_TOKEN, (measured.per_token_alpha,), None, f"from the calibration: {measured.source}"
        )
    return make_acceptance(
        AcceptanceMetric.PER_TOKEN, (DEFAULT_ALPHA,), None, "default assumption; set --acceptance for your workload"
    )


def resolve_workload(
    calibration: Calibration,
    *,
    prompt_tokens: int | None = None,
    output_tokens: int | None = None,
    alpha: Sequence[float] | None = None,
    mean_length: Sequence[float] | None = None,
    draft_rate: Sequence[float] | None = None,
    measured_at_k: int | None = None,
    source: str = "command line",
) -> Workload:
    """The workload with every default applied (see the module docstring)."""
    prompt = prompt_tokens if prompt_tokens is not None else calibration.reference_prompt_tokens
    output = output_tokens if output_tokens is not None else calibration.reference_output_tokens
    if prompt < 1 or output < 1:
        raise InvalidValueError("prompt and output lengths must be >= 1 token")
    acceptance = resolve_acceptance(
        calibration,
        alpha=alpha,
        mean_length=mean_length,
        draft_rate=draft_rate,
        measured_at_k=measured_at_k,
        source=source,
    )
    return Workload(prompt_tokens=int(prompt), output_tokens=int(output), acceptance=acceptance)
