"""Calibrations from benchmark results, and the model's error against them.

Two fits, both on steady-state runs only (:func:`sdplan.results.screen`):

* per configuration (draft length, acceptance, lengths): ``L = C1/(1 - lambda C2)``
  by bounded least squares on relative residuals, with ``lambda C2 < 1`` at
  every measured rate (Kong et al. eq. 1; ``model.md`` §6.1 step 5);
* pooled over all configurations: the eight direct-form coefficients
  (``c1p, c2p``, the baseline step ``c1_step, c2_step`` and ``c1v, c2v, c1d,
  c2d``) so that ``C1, C2`` follow eq. 3 for every (alpha, k), with the
  proportional length scaling of ``sdplan-calibration(5)`` between workloads
  (``model.md`` §1.4, §6.1 step 6).

Parameter uncertainties are the standard errors from the Jacobian at the
optimum, ``sqrt(diag(s^2 (J^T J)^-1))``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sdplan.errors import InfeasibleError
from sdplan.model import Coefficients

if TYPE_CHECKING:
    from sdplan.results import BenchmarkRun

#: Direct-form coefficients fitted by the pooled fit, in order.
PARAMETERS = ("c1p_s", "c2p_s", "baseline_c1_step_s", "baseline_c2_step_s", "c1v_s", "c2v_s", "c1d_s", "c2d_s")
#: Residual assigned to a point the candidate parameters make unstable.
_UNSTABLE_PENALTY = 10.0


@dataclass(frozen=True, slots=True)
class ConfigurationFit:
    """``L = C1/(1 - lambda C2)`` fitted to the runs of one configuration."""

    draft_length: int
    alpha: float | None
    prompt_tokens: float
    output_tokens: float
    c1_s: float
    c2_s: float
    c1_stderr_s: float
    c2_stderr_s: float
    r2: float
    points: int


@dataclass(frozen=True, slots=True)
class PooledFit:
    values: dict[str, float]
    stderr: dict[str, float]
    reference_prompt_tokens: int
    reference_output_tokens: int
    r2: float
    rmse_s: float
    mape_pct: float
    points: int

    def coefficients_at(self, prompt_tokens: float, output_tokens: float) -> Coefficients:
        """Direct-form coefficients scaled to a workload (proportional rules)."""
        prefill = prompt_tokens / self.reference_prompt_tokens
        context = (prompt_tokens + output_tokens / 2.0) / (self.reference_prompt_tokens + self.reference_output_tokens / 2.0)
        v = self.values
        return Coefficients(
            c1p_s=v["c1p_s"] * prefill, c2p_s=v["c2p_s"] * prefill, c1v_s=v["c1v_s"], c2v_s=v["c2v_s"] * context,
            c1d_s=v["c1d_s"], c2d_s=v["c2d_s"] * context, baseline_c1_step_s=v["baseline_c1_step_s"],
            baseline_c2_step_s=v["baseline_c2_step_s"] * context, prompt_tokens=float(prompt_tokens),
            output_tokens=float(output_tokens),
        )


def predict_latency(coefficients: Coefficients, run: BenchmarkRun) -> float:
    """Model mean latency (s) of a run at its achieved rate; ``inf`` if unstable."""
    from sdplan import model

    if run.draft_length == 0:
        c1, c2 = model.baseline_demand(coefficients)
    else:
        c1, c2 = model.speculative_demand(coefficients, run.alpha if run.alpha is not None else 0.0, run.draft_length)
    return float(model.mean_latency(c1, c2, run.achieved_rate_rps))


def _r2(measured: list[float], predicted: list[float]) -> float:
    mean = sum(measured) / len(measured)
    total = sum((m - mean) ** 2 for m in measured)
    residual = sum((m - p) ** 2 for m, p in zip(measured, predicted))
    return 1.0 - residual / total if total > 0 else (1.0 if residual == 0 else 0.0)


def _stderr(jacobian: Any, residuals: Any, count: int) -> list[float]:
    import numpy as np

    dof = max(len(residuals) - count, 1)
    variance = float((residuals**2).sum()) / dof
    try:
        covariance = np.linalg.pinv(jacobian.T @ jacobian) * variance
    except np.linalg.LinAlgError:
        return [math.inf] * count
    return [float(math.sqrt(max(value, 0.0))) for value in np.diag(covariance)]


def configuration_key(run: BenchmarkRun) -> tuple[int, float | None, float, float]:
    alpha = round(run.alpha, 4) if run.alpha is not None else None
    return (run.draft_length, alpha, round(run.prompt_tokens), round(run.output_tokens))


def fit_configurations(runs: list[BenchmarkRun]) -> list[ConfigurationFit]:
    """Per-configuration fits (configurations with at least two runs)."""
    import numpy as np
    from scipy.optimize import least_squares

    groups: dict[tuple[Any, ...], list[BenchmarkRun]] = defaultdict(list)
    for run in runs:
        groups[configuration_key(run)].append(run)
    fits = []
    for key, members in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1] or 0.0, item[0][2:])):
        if len(members) < 2:
            continue
        lam = np.array([m.achieved_rate_rps for m in members])
        latency = np.array([m.mean_e2e_latency_s for m in members])
        # Linearised start: 1/L = 1/C1 - (C2/C1) lambda.
        slope, intercept = np.polyfit(lam, 1.0 / latency, 1)
        c1_0 = 1.0 / intercept if intercept > 0 else latency.min()
        c2_0 = min(max(-slope * c1_0, 0.0), 0.99 / lam.max())
        ceiling = 1.0 / lam.max() * (1 - 1e-9)

        def residual(theta: Any) -> Any:
            predicted = theta[0] / (1.0 - lam * theta[1])
            return (predicted - latency) / latency

        solution = least_squares(residual, x0=[c1_0, min(c2_0, ceiling * 0.99)],
                                 bounds=([0.0, 0.0], [np.inf, ceiling]))
        c1, c2 = (float(v) for v in solution.x)
        predicted = c1 / (1.0 - lam * c2)
        errors = _stderr(solution.jac * latency[:, None], predicted - latency, 2)
        fits.append(ConfigurationFit(draft_length=key[0], alpha=key[1], prompt_tokens=key[2], output_tokens=key[3],
                                     c1_s=c1, c2_s=c2, c1_stderr_s=errors[0], c2_stderr_s=errors[1],
                                     r2=float(_r2(list(latency), list(predicted))), points=len(members)))
    return fits


def fit_pooled(runs: list[BenchmarkRun], reference: tuple[int, int] | None = None) -> PooledFit:
    """Pooled direct-form fit over every run (see the module docstring).

    Raises
    ------
    InfeasibleError
        With fewer runs than needed or no no-SD run (the baseline cannot be fitted).
    """
    import numpy as np
    from scipy.optimize import least_squares

    if len(runs) < 4:
        raise InfeasibleError(f"only {len(runs)} usable runs; a fit needs at least 4 (several rates per configuration)")
    if not any(run.draft_length == 0 for run in runs):
        raise InfeasibleError("no run without SD: the no-SD baseline cannot be fitted; include baseline runs")
    if reference is None:
        counts: dict[tuple[int, int], int] = defaultdict(int)
        for run in runs:
            counts[(round(run.prompt_tokens), round(run.output_tokens))] += 1
        reference = max(counts, key=lambda item: counts[item])
    p0, g0 = reference
    latency = np.array([r.mean_e2e_latency_s for r in runs])
    lam = np.array([r.achieved_rate_rps for r in runs])
    p = np.array([r.prompt_tokens for r in runs])
    g = np.array([r.output_tokens for r in runs])
    k = np.array([float(r.draft_length) for r in runs])
    alpha = np.array([r.alpha if r.alpha is not None else 0.0 for r in runs])
    spec = k > 0
    from sdplan.acceptance import expected_tokens_per_cycle

    cycles = np.where(spec, g / expected_tokens_per_cycle(alpha, k), np.maximum(g - 1.0, 0.0))  # no SD: g-1 steps (B14)
    prefill = p / p0
    context = (p + g / 2.0) / (p0 + g0 / 2.0)

    def demand(theta: Any) -> tuple[Any, Any]:
        c1p, c2p, b1, b2, c1v, c2v, c1d, c2d = theta
        c1 = c1p * prefill + cycles * np.where(spec, c1v + k * c1d, b1)
        c2 = c2p * prefill + cycles * context * np.where(spec, c2v + k * c2d, b2)
        return c1, c2

    def residual(theta: Any) -> Any:
        c1, c2 = demand(theta)
        utilisation = lam * c2
        with np.errstate(divide="ignore", invalid="ignore"):
            predicted = c1 / (1.0 - utilisation)
        relative = (predicted - latency) / latency
        return np.where(utilisation < 1.0, relative, _UNSTABLE_PENALTY * (1.0 + utilisation))

    # Start: everything from the smallest latency and rate, split evenly; then refine.
    base = latency.min()
    theta0 = np.array([base * 0.1, 0.1 / max(lam.max(), 1e-9) * 0.1, base / g0, 0.5 / (g0 * max(lam.max(), 1e-9)),
                       base / g0, 0.5 / (g0 * max(lam.max(), 1e-9)), base / g0 * 0.1, 0.05 / (g0 * max(lam.max(), 1e-9))])
    best = None
    for scale in (1.0, 0.3, 3.0):
        start = theta0 * scale
        c1, c2 = demand(start)
        if np.any(lam * c2 >= 1.0):
            start = start * np.array([1, 1e-3, 1, 1e-3, 1, 1e-3, 1, 1e-3])
        solution = least_squares(residual, x0=start, bounds=(0.0, np.inf), x_scale="jac", max_nfev=4000)
        if best is None or solution.cost < best.cost:
            best = solution
    assert best is not None
    c1, c2 = demand(best.x)
    predicted = c1 / (1.0 - lam * c2)
    errors = _stderr(best.jac * latency[:, None], predicted - latency, len(PARAMETERS))
    finite = np.isfinite(predicted)
    mape = float(np.mean(np.abs(predicted[finite] - latency[finite]) / latency[finite]) * 100.0) if finite.any() else math.inf
    return PooledFit(
        values={name: float(value) for name, value in zip(PARAMETERS, best.x)},
        stderr=dict(zip(PARAMETERS, errors)),
        reference_prompt_tokens=int(p0), reference_output_tokens=int(g0),
        r2=float(_r2(list(latency), list(np.where(finite, predicted, latency * 10)))),
        rmse_s=float(np.sqrt(np.mean((np.where(finite, predicted, latency * 10) - latency) ** 2))),
        mape_pct=mape, points=len(runs),
    )


# ----------------------------------------------------------------------------- validation


@dataclass(frozen=True, slots=True)
class RunError:
    run: BenchmarkRun
    predicted_s: float
    error_pct: float | None


@dataclass(frozen=True, slots=True)
class Validation:
    errors: list[RunError]
    skipped: list[tuple[BenchmarkRun, str]]
    mape_pct: float
    bias_pct: float
    r2: float
    worst: RunError | None
    best_k_agreement: tuple[int, int]

    @property
    def quality(self) -> str:
        """BLIS-style grade of the MAPE: excellent < 5%, good < 10%, fair < 20%, else poor."""
        for limit, grade in ((5.0, "excellent"), (10.0, "good"), (20.0, "fair")):
            if self.mape_pct < limit:
                return grade
        return "poor"


def validate(coefficients_at: Any, runs: list[BenchmarkRun]) -> Validation:
    """Predicted vs measured mean latency for every run.

    ``coefficients_at(prompt, output)`` gives the calibration's coefficients.
    Runs the screen rejects are skipped with their reason; an unstable
    prediction for a measured run counts as an infinite error and is the worst.
    Best-k agreement compares, among runs of equal lengths and acceptance at
    the same rate (3 significant digits) with at least two draft lengths, the
    fastest measured draft length with the fastest predicted one.
    """
    from sdplan.results import screen

    errors, skipped = [], []
    for run in runs:
        reasons = screen(run)
        if reasons:
            skipped.append((run, "; ".join(reasons)))
            continue
        predicted = predict_latency(coefficients_at(run.prompt_tokens, run.output_tokens), run)
        error = (predicted - run.mean_e2e_latency_s) / run.mean_e2e_latency_s * 100 if math.isfinite(predicted) else None
        errors.append(RunError(run=run, predicted_s=predicted, error_pct=error))
    if not errors:
        raise InfeasibleError("no usable run to validate against (see the reasons per run)")
    finite = [e for e in errors if e.error_pct is not None]
    mape = sum(abs(e.error_pct) for e in finite) / len(finite) if len(finite) == len(errors) else math.inf  # type: ignore[arg-type]
    bias = sum(e.error_pct for e in finite) / len(finite) if finite else math.nan  # type: ignore[misc]
    worst = max(errors, key=lambda e: math.inf if e.error_pct is None else abs(e.error_pct))
    measured = [e.run.mean_e2e_latency_s for e in errors]
    predicted = [e.predicted_s if math.isfinite(e.predicted_s) else 10 * e.run.mean_e2e_latency_s for e in errors]
    agree = total = 0
    by_rate: dict[tuple[Any, ...], list[RunError]] = defaultdict(list)
    for e in errors:  # baseline runs join every acceptance group at the same rate and lengths
        by_rate[(round(e.run.prompt_tokens), round(e.run.output_tokens), float(f"{e.run.achieved_rate_rps:.3g}"))].append(e)
    for members in by_rate.values():
        alphas = {m.run.alpha for m in members if m.run.draft_length > 0}
        for alpha in alphas or {None}:
            options = [m for m in members if m.run.draft_length == 0 or m.run.alpha == alpha]
            if len({m.run.draft_length for m in options}) < 2:
                continue
            total += 1
            fastest_measured = min(options, key=lambda m: m.run.mean_e2e_latency_s).run.draft_length
            fastest_predicted = min(options, key=lambda m: m.predicted_s).run.draft_length
            agree += fastest_measured == fastest_predicted
    return Validation(errors=errors, skipped=skipped, mape_pct=mape, bias_pct=bias, r2=float(_r2(measured, predicted)),
                      worst=worst, best_k_agreement=(agree, total))
