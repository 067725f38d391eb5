"""Answers for the options a server is not running: a calibration scaled to reproduce its metrics.

A server's metrics measure the option it runs (no SD, or SD at one draft length). A calibration from
elsewhere (derived from AIConfigurator's op database, measured on a similar box, or any other) knows
every option's costs relative to each other but not this server's speed. :func:`scale_prior` keeps
the prior's shape and fits two factors to the metrics' windows, one on every load-independent cost
(the ``C1`` side) and one on every per-request-in-flight cost (the ``C2`` side)::

    L_r = s1 C1_r + s2 B_r C2_r,      B_r = lambda_r L_r (Little's law)

with ``C1_r``, ``C2_r`` the prior's demand for window ``r``'s option, acceptance and lengths
(:func:`sdplan.fitting.runmodel.run_demand`). Scaling every ``C1`` coefficient (prefill, plain step, verify
step, draft step) by ``s1`` and every ``C2`` one by ``s2`` keeps the prior's ratio of each SD step to
the plain step, so the options not measured move with the one that was: they are anchored, not
measured. Where the windows' loads cannot tell the two sides apart, one factor scales both: one load
level, loads whose ``B C2 / C1`` spans less than a factor 1.5, or loads so light that the ``C2`` side's
factor is not measured (its 95% interval, from the fit's residuals, reaches 0; two windows leave no
residual to judge by). The scaled file's ``[validity]`` is the windows' lengths and batch sizes, so
``plan`` says where it extrapolates from them.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sdplan.calibration import parse_calibration
from sdplan.errors import InfeasibleError, InvalidValueError
from sdplan.fitting.fit import validity_table
from sdplan.fitting.runmodel import PARAMETERS, coefficients_table, r2, run_demand
from sdplan.fitting.validation import predict_latency

if TYPE_CHECKING:
    from sdplan.calibration import Calibration
    from sdplan.latency.coefficients import Coefficients
    from sdplan.runs.record import BenchmarkRun

#: The C1 side of the direct form (load-independent seconds) and the C2 side (seconds per other request).
C1_SIDE = ("c1p_s", "baseline_c1_step_s", "c1v_s", "c1d_s")
C2_SIDE = ("c2p_s", "baseline_c2_step_s", "c2v_s", "c2d_s")
#: Two factors need loads that tell the sides apart: the windows' ``B C2 / C1`` must span this ratio.
MIN_LOAD_SPREAD = 1.5


@dataclass(frozen=True)
class Gap:
    """How far a calibration's mean E2E predictions lie from the windows (%, each error capped at 100%)."""

    mape_pct: float
    bias_pct: float
    worst_pct: float
    #: Coefficient of determination of the predictions (unstable ones at ten times the measured latency).
    r2: float


@dataclass(frozen=True)
class PriorScaling:
    """The scaled calibration and what the scaling did."""

    c1_scale: float
    c2_scale: float
    #: One factor on both sides: the windows' loads could not tell them apart.
    one_factor: bool
    before: Gap
    after: Gap
    #: Draft lengths the windows measured (0: no SD); every other option is anchored through the prior.
    measured_options: tuple[int, ...]
    prior_name: str
    runs: int
    reference: tuple[int, int]
    document: dict[str, Any]


def demand(coefficients: Coefficients, run: BenchmarkRun) -> tuple[float, float]:

    return run_demand(coefficients, run)


def factors(prior_at: Any, runs: list[BenchmarkRun]) -> tuple[float, float, bool]:
    """``(s1, s2, one_factor)``: the least relative squared error of ``L = s1 C1 + s2 B C2`` over the runs.

    Parameters
    ----------
    prior_at : callable
        ``(prompt_tokens, output_tokens) -> Coefficients`` of the prior.
    runs : list of BenchmarkRun
        The windows, each with its mean latency ``L`` and load ``B`` (:attr:`BenchmarkRun.mean_others`).

    Returns
    -------
    tuple
        Non-negative factors; with ``one_factor`` both equal the single factor ``s`` minimising
        ``sum (s (C1 + B C2)/L - 1)^2``, i.e. ``s = sum x / sum x^2`` with ``x = (C1 + B C2)/L``.
    """
    from scipy.optimize import nnls

    rows = []
    for run in runs:
        c1, c2 = demand(prior_at(run.prompt_tokens, run.output_tokens), run)
        latency = run.mean_e2e_latency_s
        rows.append((c1 / latency, run.mean_others * c2 / latency))
    design = np.asarray(rows)
    ratios = design[:, 1] / np.maximum(design[:, 0], 1e-300)
    if len(runs) >= 2 and ratios.max() > 0 and (ratios.max() + 1e-12) / max(ratios.min(), 1e-12) >= MIN_LOAD_SPREAD:
        solved, _ = nnls(design, np.ones(len(runs)))
        if solved[0] > 0 and solved[1] > 0 and load_side_measured(design, solved):
            return float(solved[0]), float(solved[1]), False
    total = design.sum(axis=1)
    single = float(total.sum() / (total ** 2).sum())
    return single, single, True


def load_side_measured(design: np.ndarray, solved: np.ndarray) -> bool:
    """Whether the windows measure the ``C2`` side's factor: its 95% interval excludes 0.

    The interval is ``s2 +- t(0.975, n - 2) se(s2)``, with ``se`` from the least-squares covariance
    ``sigma^2 (X^T X)^-1`` and ``sigma^2`` the residuals' sum of squares over ``n - 2``. Windows that barely
    load the server (``B C2`` a few percent of ``C1``) fit any ``s2`` about as well, and a saturation taken
    from such an ``s2`` is not measured. Two windows leave no residual, so they never measure it.
    """
    from scipy.stats import t as student_t

    freedom = design.shape[0] - 2
    if freedom < 1:
        return False
    residual = design @ solved - 1.0
    variance = float(residual @ residual) / freedom
    try:
        spread = variance * np.linalg.inv(design.T @ design)[1, 1]
    except np.linalg.LinAlgError:
        return False
    return bool(solved[1] - float(student_t.ppf(0.975, freedom)) * math.sqrt(max(spread, 0.0)) > 0.0)


def shape_kept(table: dict[str, Any], base: Coefficients, s2: float) -> dict[str, Any]:
    """``table`` (the scaled direct-form coefficients) with the prior's shape in the load carried over.

    The compute-bound knee keeps its token rows and has its cost per row past them scaled with the ``C2``
    side (``docs/model.md#compute-bound-knee``): it is what makes a verify step of ``B (k + 1)`` rows dearer
    than a decode step at large batch, so the options not measured keep the prior's SD-to-no-SD ratio there.
    The concave load law's ``psi`` (``docs/model.md#concave-load``) is a shape in requests, carried as it is.
    """
    if base.knee_per_token_s > 0:
        table["knee_tokens"] = float(base.knee_tokens)
        table["knee_per_token_s"] = float(base.knee_per_token_s) * s2
    if base.load_concavity_sqrt_requests > 0:
        table["load_concavity_sqrt_requests"] = float(base.load_concavity_sqrt_requests)
    return table


def gap(coefficients_at: Any, runs: list[BenchmarkRun]) -> Gap:
    """Mean absolute and signed error of the predicted mean E2E (:func:`sdplan.fitting.validation.predict_latency`);
    a prediction past saturation counts 100%, and so does any error above it."""

    errors, signed, predictions = [], [], []
    for run in runs:
        predicted = predict_latency(coefficients_at(run.prompt_tokens, run.output_tokens), run)
        predictions.append(predicted if math.isfinite(predicted) else 10.0 * run.mean_e2e_latency_s)
        if not math.isfinite(predicted):
            errors.append(100.0)
            continue
        error = (predicted / run.mean_e2e_latency_s - 1.0) * 100.0
        errors.append(min(abs(error), 100.0))
        signed.append(error)
    return Gap(mape_pct=sum(errors) / len(errors), bias_pct=sum(signed) / len(signed) if signed else math.nan,
               worst_pct=max(errors), r2=float(r2([r.mean_e2e_latency_s for r in runs], predictions)))


def scale_prior(prior: Calibration, runs: list[BenchmarkRun], *, name: str, provenance: dict[str, Any],
                acceptance: dict[str, Any] | None = None) -> PriorScaling:
    """The prior scaled to reproduce the runs (see the module notes), as a calibration document.

    The document is the direct form at the runs' most common lengths (the prior's own scaling in the
    lengths is not carried over: a step model is evaluated there), with the prior's TTFT terms and
    acceptance unless the runs measured one (``acceptance``). Its provenance records the factors and
    the gap before and after, and says which options are anchored, not measured.

    Raises
    ------
    InfeasibleError
        Without a run to scale to.
    InvalidValueError
        For a mixture-of-experts prior (its coverage terms are not scaled).
    """


    if not runs:
        raise InfeasibleError("no usable window to scale the prior to")
    if prior.moe_at(1.0, 1.0) is not None:
        raise InvalidValueError(f"--prior {prior.name}: a mixture-of-experts calibration; scaling keeps no MoE "
                                "coverage terms, give a dense one")
    counts = Counter((round(r.prompt_tokens), round(r.output_tokens)) for r in runs)
    reference = max(counts, key=lambda item: (counts[item], item))
    s1, s2, one = factors(prior.coefficients_at, runs)
    base = prior.coefficients_at(*reference)
    values = {key: float(getattr(base, key)) * (s1 if key in C1_SIDE else s2) for key in PARAMETERS}
    measured = tuple(sorted({r.draft_length for r in runs}))
    shown = ", ".join("no SD" if k == 0 else f"k={k}" for k in measured)
    before = gap(prior.coefficients_at, runs)
    note = (f"scaled from {prior.name} to {len(runs)} metrics windows of {shown}: C1 side x{s1:.4g}, C2 side x{s2:.4g}"
            + (" (one factor: the windows' loads did not measure the C2 side apart from the C1 side)" if one else "")
            + f"; mean E2E gap {before.mape_pct:.1f}% before (bias {before.bias_pct:+.1f}%)")
    document: dict[str, Any] = {
        "schema_version": 1, "name": name,
        "description": f"{prior.name} scaled to reproduce a server's metrics ({shown} measured; the other "
                       "options anchored through the prior's step ratios, not measured)",
        "provenance": {**provenance, "notes": note,
                       "assumptions": [f"options other than {shown} are anchored, not measured: their steps keep "
                                       f"{prior.name}'s ratios to the measured option's"]},
        "reference_workload": {"prompt_tokens": reference[0], "output_tokens": reference[1]},
        "validity": validity_table(runs),
        "fit_quality": {"r2": 0.0, "points": len(runs), "detail": note},
        "coefficients": shape_kept(coefficients_table(values), base, s2),
        "ttft": {"wait_steps": base.ttft_wait_steps, "load_steps": base.ttft_load_steps,
                 "offset_s": base.ttft_offset_s * s1, "source": f"from {prior.name}, offset scaled x{s1:.4g}"},
    }
    prior_acceptance = prior.document.get("acceptance")
    if acceptance is not None:
        document["acceptance"] = acceptance
    elif isinstance(prior_acceptance, dict):
        document["acceptance"] = dict(prior_acceptance)
    scaled = parse_calibration(document, name)
    after = gap(scaled.coefficients_at, runs)
    document["provenance"]["notes"] += f", {after.mape_pct:.1f}% after (bias {after.bias_pct:+.1f}%)"
    document["fit_quality"] = {"r2": round(max(min(after.r2, 1.0), -1e6), 6), "mape_pct": round(after.mape_pct, 4),
                               "points": len(runs), "detail": document["provenance"]["notes"]}
    return PriorScaling(c1_scale=s1, c2_scale=s2, one_factor=one, before=before, after=after,
                        measured_options=measured, prior_name=prior.name, runs=len(runs), reference=reference,
                        document=document)
