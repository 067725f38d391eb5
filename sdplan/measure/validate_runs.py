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
from sdplan.inputs.serving import engine_name, sd_max_num_seqs
from sdplan.measure.result_files import ResultFiles, read_runs, result_alpha

if TYPE_CHECKING:
    from sdplan.calibration import Calibration
    from sdplan.fitting.validation import Validation
    from sdplan.runs import BenchmarkRun


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidateRequest:
    """What ``sdplan validate`` was given: the calibration (None: the default), the result files, and the
    largest mean absolute percentage error that passes (None: no gate)."""

    calibration: str | None
    files: ResultFiles
    max_error_pct: float | None = None
    #: The requests the measured server ran at once (vLLM ``--max-num-seqs``, SGLang ``--max-running-requests``);
    #: None: only the engine's own limit under SD where it has one (SGLang's 48), else none.
    max_num_seqs: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Validated:
    """The calibration validated, the per-run errors and summary, and the gate's verdict.

    ``warnings`` are said after the result: about the gate itself (a limit below the runs' own spread), and
    about SD runs predicted past the engine's own limit under SD (SGLang's 48) where no ``--max-num-seqs`` says
    the server's.
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
    engine = cal.records.provenance.engine
    sd_cap = sd_max_num_seqs(engine)

    def batch_cap(run: BenchmarkRun) -> float | None:
        """A closed loop past the server's limit keeps the rest of its clients waiting for admission."""
        return request.max_num_seqs or (sd_cap if run.draft_length > 0 else None)

    result = validate(cal.coefficients_at, runs, cal.moe_at, batch_cap_at=batch_cap, waves=waves)
    spread, limit = result.repeat_spread, request.max_error_pct
    after: list[str] = []
    capped = [e.run for e in result.errors
              if e.run.concurrency and (cap := batch_cap(e.run)) and e.run.concurrency > cap]
    if capped and request.max_num_seqs is None:
        after.append(f"{len(capped)} SD run(s) had more clients than the {sd_cap} requests {engine_name(engine)} runs "
                     "at once under SD unless --max-running-requests is set: predicted with the rest waiting for "
                     "admission; give --max-num-seqs if the server ran with another limit")
    if limit is not None and spread is not None and limit < spread.exact_model_mape_pct:
        after.append(f"--max-error {limit:g}% is below the {spread.exact_model_mape_pct:.1f}% an exact model "
                     f"would score on these runs (the spread of their {spread.runs} repeats): the gate fails on "
                     "noise; measure longer or more runs, or raise the limit")
    return Validated(calibration=cal, validation=result, max_error_pct=limit, passed=passes(result.mape_pct, limit),
                     warnings=after)
