"""The per-step model of ``sdplan-calibration(5)``, fitted to timed engine steps.

``sdplan calibrate --method engine`` (:mod:`sdplan.measure.engine`) times bare
engine steps; this module fits them:

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

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sdplan.errors import InvalidValueError
from sdplan.fitting.regression import bounded_solve, column_scale
from sdplan.units import written_number


def step_key(kind: str, batch: int, draft_length: int, prompt_tokens: int) -> str:
    """The key of one timed point (a task to measure, or its measurement): ``target:B=4:k=2:p=128``."""
    return f"{kind}:B={batch}:k={draft_length}:p={prompt_tokens}"


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
        return step_key(self.kind, self.batch, self.draft_length, self.prompt_tokens)


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
    design = np.array(columns, dtype=np.float64).T
    target = np.asarray(y, dtype=np.float64)
    if design.shape[0] < design.shape[1]:
        raise InvalidValueError(f"too few measurements ({design.shape[0]}) to fit {', '.join(names)}; "
                                "use a larger --grid")
    scale = column_scale(design)
    values = bounded_solve(design / scale, target, 0.0, np.inf) / scale
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


def step_model_document(fit: CalibrationFit) -> dict[str, Any]:
    """The ``[step_model]`` table of a calibration from a fit (6 significant digits)."""
    t = {key: written_number(value) for key, value in fit.target.as_dict().items()}
    d = dict(fit.speculative.as_dict()) if fit.speculative else {}
    for key in ("fixed_s", "per_sequence_s"):  # the switch-on cost is per-cycle SD overhead (module docstring)
        d[f"overhead_{key}"] = d.get(f"overhead_{key}", 0.0) + fit.target.as_dict().get(f"switch_on_{key}", 0.0)
    d = {key: written_number(value) for key, value in d.items()}
    p = {key: written_number(value) for key, value in fit.prefill.as_dict().items()}
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
        f"{name}: R2={term.r2:.4f}, rmse={term.rmse_s * 1e3:.3g} ms, "
        f"max|residual|={term.max_abs_residual_s * 1e3:.3g} ms, "
        f"n={term.points}"
        for name, term in parts if term is not None
    )
    points = sum(term.points for _, term in parts if term is not None)
    return {"r2": round(fit.r2, 6), "points": points, "detail": detail}
