"""``sdplan validate``'s use case: a calibration's error against result files, and the ``--max-error`` gate.

:func:`validate_runs` takes one typed :class:`ValidateRequest` and returns a
:class:`Validated` result; the CLI renders it and maps its verdict to the exit
status. Acceptance, in order: the runs' own, else the one value given for
result files (:func:`sdplan.measure.result_files.result_alpha`), else the
calibration's measured per-token alpha for SD runs that record none.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sdplan.calibration import resolve_calibration
from sdplan.fitting.validation import derived_waves, validate
from sdplan.measure.result_files import ResultFiles, read_runs, result_alpha

if TYPE_CHECKING:
    from sdplan.calibration import Calibration
    from sdplan.fitting.validation import Validation


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidateRequest:
    """What ``sdplan validate`` was given: the calibration (None: the default), the result files, and the
    largest mean absolute percentage error that passes (None: no gate)."""

    calibration: str | None
    files: ResultFiles
    max_error_pct: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Validated:
    """The calibration validated, the per-run errors and summary, and the gate's verdict.

    ``warnings`` are about the gate itself (a limit below the runs' own spread), said after the result.
    """

    calibration: Calibration
    validation: Validation
    max_error_pct: float | None
    passed: bool
    warnings: list[str]


def passes(mape_pct: float, max_error_pct: float | None) -> bool:
    """The ``--max-error`` gate: no limit passes; an infinite error (an unstable prediction) never does."""
    return max_error_pct is None or (math.isfinite(mape_pct) and mape_pct <= max_error_pct)


def validate_runs(request: ValidateRequest,
                  on_read: Callable[[list[str]], None] = lambda warnings: None) -> Validated:
    """The calibration's predictions against the runs of ``request.files`` (:func:`sdplan.fitting.validation.validate`).

    ``on_read`` hears the readers' warnings once the runs are read, before they are validated (so that they
    are said even when no run is usable).

    Raises
    ------
    InfeasibleError
        No run left after the steady-state screen.
    """
    cal = resolve_calibration(request.calibration)
    alpha = result_alpha(request.files.acceptance)
    alpha_default = cal.acceptance.per_token_alpha if alpha is None and cal.acceptance is not None else None
    runs, warnings = read_runs(request.files, alpha)
    if alpha_default is not None:
        runs = [replace(r, alpha=alpha_default) if r.draft_length > 0 and r.alpha is None else r for r in runs]
    on_read(warnings)
    # A derived file has no fitted TTFT weights to hold its closed loops' waves of prompts: price them.
    waves = derived_waves(cal, max((run.draft_length for run in runs), default=0))
    result = validate(cal.coefficients_at, runs, cal.moe_at, waves=waves)
    spread, limit = result.repeat_spread, request.max_error_pct
    gate = []
    if limit is not None and spread is not None and limit < spread.exact_model_mape_pct:
        gate.append(f"--max-error {limit:g}% is below the {spread.exact_model_mape_pct:.1f}% an exact model "
                    f"would score on these runs (the spread of their {spread.runs} repeats): the gate fails on "
                    "noise; measure longer or more runs, or raise the limit")
    return Validated(calibration=cal, validation=result, max_error_pct=limit, passed=passes(result.mape_pct, limit),
                     warnings=gate)
