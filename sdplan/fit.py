"""Calibrations from served benchmark results, and the model's error against them.

The relation fitted is the model's own, ``L = C1 + B C2`` (Kong et al. eq. 1;
``docs/model.md#open-and-closed-loops``), with ``B`` the mean number of *other* requests in flight
during a request, measured per run (:attr:`sdplan.runs.record.BenchmarkRun.mean_others`).
That one relation covers both kinds of runs:

* open loop (Poisson arrivals at ``lambda``): ``B = lambda L`` by Little's law,
  so ``L = C1/(1 - lambda C2)``, the planner's form;
* closed loop of ``N`` clients (``vllm bench serve --max-concurrency N``):
  every request shares the server with ``N - 1`` others, so
  ``L = C1 + (N - 1) C2`` and throughput ``X = N/L``. (Derivation: in a closed
  system the number in flight is ``N`` at all times, the request itself
  included; with per-request times ``B`` is measured, drain included.)

With ``B`` measured, ``C1`` and ``C2`` are *linear* in the eight direct-form
coefficients (eq. 3 and the length scaling of ``sdplan-calibration(5)``), so
the pooled fit is a non-negative weighted linear least squares on relative
errors, made robust to disturbed points by Huber reweighting. The standard
errors follow from the same estimator (a sandwich covariance of the weighted
relative residuals, checked against Monte Carlo; ``docs/model.md#fitting``).
Coefficients the data cannot determine (e.g. the draft's share
with a single draft length) are reported as not identified.

Time to first token has its own load term (:func:`sdplan.model.time_to_first_token`,
``TTFT = c1p + offset + w_wait tau1 + B w_load C2/steps``), fitted in a second
stage with the coefficients fixed, so TTFT's noisier data never pull the E2E
coefficients.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sdplan.coefficients import Coefficients
from sdplan.errors import InfeasibleError
from sdplan.runmodel import (LENGTH_GROUP_TOLERANCE, PARAMETERS, SPECULATIVE_PARAMETERS, DesignRows,
                             coefficients_from_vector, coefficients_table, configuration_groups, design_rows, r2)

if TYPE_CHECKING:
    from sdplan.runs import BenchmarkRun

#: Fewest runs a pooled fit takes.
MIN_FIT_RUNS = 3
#: Huber constant (in robust standard deviations) of the reweighting: 1.345, 95% efficiency under Gaussian
#: noise; 3 predicted independent served runs no better (benchmarks/RESULTS-accuracy-runs-2026-11.md,
#: docs/model.md#huber-reweighting).
HUBER_K = 1.345
#: Relative standard error above which a fitted coefficient is reported as weakly determined.
WEAK_RELATIVE_STDERR = 0.5
#: Largest TTFT weight (in steps) a fit may return; the defaults are 0.5 and 1.5.
MAX_TTFT_WEIGHT = 50.0
#: Open-loop runs with a measured TTFT needed before they set the TTFT load weight on their own.
MIN_OPEN_LOOP_TTFT_RUNS = 3
#: Weight of the faint ridge that settles the fit's unidentified directions (relative to one run's residual).
RIDGE = 1e-9
#: Bounds of the closed-loop load factor f (see :func:`fit_pooled`). A closed loop never loads the server more
#: per other request than an open loop: its measured others already exclude the clients' gaps between requests,
#: while in an open loop requests meet more others than lambda*L (the sojourn-weighted count exceeds it by 6-15%
#: under batching, tested against the step simulator), so f <= 1. An f above 1 is noise fitted, e.g. a slow
#: instance at low N, and it inflates the open-loop saturation 1/C2 by as much (measured on a served calibration:
#: benchmarks/RESULTS-accuracy-served-2026-11.md).
CLOSED_LOOP_FACTOR_BOUNDS = (0.5, 1.0)


# ----------------------------------------------------------------------------- the linear structure


def identified_parameters(design: Any, tolerance: float = 1e-7) -> list[bool]:
    """Which coefficients the design determines: ``e_j`` lies in the row space of ``X``.

    A coefficient outside the row space can move without changing any fitted
    value (e.g. ``c1v`` against ``c1d`` with one draft length): its value is
    an artefact of the solver and must not be used to extrapolate.
    """
    import numpy as np

    scale = np.abs(design).max(axis=0)
    scale[scale == 0] = 1.0
    normalised = design / scale
    _, singular, vt = np.linalg.svd(normalised, full_matrices=True)
    rank = int((singular > tolerance * max(singular.max(initial=0.0), 1e-300)).sum())
    null = vt[rank:]
    if null.size == 0:
        return [True] * design.shape[1]
    return [bool(np.linalg.norm(null[:, j]) < 1e-6) for j in range(design.shape[1])]


def weakly_determined(values: dict[str, float], stderr: dict[str, float], identified: dict[str, bool]) -> list[str]:
    """The coefficients inside the design's row space whose standard error exceeds their value
    (:attr:`PooledFit.stderr_above_value`), in :data:`PARAMETERS` order."""
    return [name for name in PARAMETERS if identified[name] and stderr[name] > abs(values[name])]


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class PointResidual:
    """One run's measured and fitted mean latency (and TTFT), with its robust weight."""

    source: str
    load_level: str
    draft_length: int
    measured_s: float
    predicted_s: float
    measured_ttft_s: float | None
    predicted_ttft_s: float | None
    weight: float

    @property
    def error_pct(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s * 100.0

    @property
    def ttft_error_pct(self) -> float | None:
        if self.measured_ttft_s is None or self.predicted_ttft_s is None or self.measured_ttft_s <= 0:
            return None
        return (self.predicted_ttft_s - self.measured_ttft_s) / self.measured_ttft_s * 100.0


@dataclass(frozen=True, slots=True)
class PooledFit:
    """The pooled direct-form fit with its uncertainty.

    Attributes
    ----------
    values, stderr : dict
        Coefficients at the reference workload (seconds) and their standard errors.
    covariance : list of list of float
        Covariance of the eight coefficients (s^2), in :data:`PARAMETERS` order.
    identified : dict
        Whether the data determine each coefficient (:func:`identified_parameters`).
    ttft_wait_steps, ttft_load_steps : float
        The TTFT weights (fitted when TTFT was measured, else the defaults).
    """

    values: dict[str, float]
    stderr: dict[str, float]
    covariance: list[list[float]]
    identified: dict[str, bool]
    reference_prompt_tokens: int
    reference_output_tokens: int
    r2: float
    rmse_s: float
    mape_pct: float
    points: int
    ttft_wait_steps: float = 0.5
    ttft_load_steps: float = 1.5
    ttft_offset_s: float = 0.0
    ttft_fitted: bool = False
    ttft_mape_pct: float | None = None
    ttft_closed_load_steps: float | None = None
    ttft_prefill_per_token_s: float | None = None
    closed_loop_factor: float = 1.0
    closed_loop_factor_fitted: bool = False
    #: The share of ``c2_step`` that does not grow with the context (``c2_step_fixed_s``; see :func:`fit_pooled`).
    fixed_step_share: float = 0.0
    residuals: tuple[PointResidual, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def reference(self) -> tuple[int, int]:
        return (self.reference_prompt_tokens, self.reference_output_tokens)

    @property
    def stderr_above_value(self) -> list[str]:
        """The coefficients the runs let move by more than their own value: a standard error above the
        fitted value (one at its bound of 0 with any error).

        The design can have full rank while a direction of it is all but flat: runs at one workload fix the
        sums ``C1 = c1p + (g - 1) c1_step`` and ``C2 = c2p + (g - 1) c2_step`` but hardly how each splits,
        and the bounded solver then puts ``c1p`` at 1e-21 s with a standard error of 0.17 s
        (tests/data/served-passes-cpu). Such a value is no measurement, however well the sums fit.
        """
        return weakly_determined(self.values, self.stderr, self.identified)

    @property
    def not_identified(self) -> list[str]:
        """The coefficients the runs do not determine: outside the design's row space
        (:func:`identified_parameters`) or with a standard error above their value (:attr:`stderr_above_value`)."""
        weak = set(self.stderr_above_value)
        return [name for name in PARAMETERS if not self.identified[name] or name in weak]

    @property
    def speculative_identified(self) -> bool:
        """Whether any SD coefficient is determined (False for a no-SD-only fit)."""
        return any(self.identified[name] for name in SPECULATIVE_PARAMETERS)

    def coefficients_at(self, prompt_tokens: float, output_tokens: float) -> Coefficients:
        """Direct-form coefficients scaled to a workload (the calibration file's rules)."""
        coefficients = coefficients_from_vector([self.values[name] for name in PARAMETERS], self.reference,
                                                prompt_tokens, output_tokens,
                                                (self.ttft_wait_steps, self.ttft_load_steps), self.fixed_step_share)
        return replace(coefficients, closed_loop_factor=self.closed_loop_factor, ttft_offset_s=self.ttft_offset_s,
                       ttft_prefill_s=(self.ttft_prefill_per_token_s or 0.0) * prompt_tokens)

    def coefficients_document(self) -> dict[str, Any]:
        """The ``[coefficients]`` table of a calibration."""
        return coefficients_table(self.values, self.fixed_step_share)

    def closed_loop_document(self) -> dict[str, Any]:
        """The ``[closed_loop]`` table: how a closed loop of N clients compares with an open loop."""
        return {"factor": round(self.closed_loop_factor, 6),
                "source": "fitted from closed- and open-loop runs together" if self.closed_loop_factor_fitted
                else "default 1 (no open- and closed-loop runs to compare)"}

    def ttft_document(self) -> dict[str, Any]:
        """The ``[ttft]`` table of a calibration."""
        return {"wait_steps": round(self.ttft_wait_steps, 6), "load_steps": round(self.ttft_load_steps, 6),
                "offset_s": float(f"{self.ttft_offset_s:.6g}"),
                **({"prefill_per_prompt_token_s": float(f"{self.ttft_prefill_per_token_s:.6g}")}
                   if self.ttft_prefill_per_token_s is not None else {}),
                **({"closed_loop_load_steps": round(self.ttft_closed_load_steps, 6)}
                   if self.ttft_closed_load_steps is not None else {}),
                "source": ("fitted to measured TTFT" + (f" (MAPE {self.ttft_mape_pct:.1f}%)"
                                                       if self.ttft_mape_pct is not None else ""))
                if self.ttft_fitted else "default: half a step of wait, then one mixed step (not measured)"}

    def uncertainty_document(self) -> dict[str, Any]:
        """The ``[uncertainty]`` table: parameters, covariance, what is not identified."""
        return {
            "parameters": list(PARAMETERS),
            "covariance_s2": [[float(f"{value:.6g}") for value in row] for row in self.covariance],
            "not_identified": self.not_identified,
            "stderr_above_value": self.stderr_above_value,
            "method": "weighted least squares on relative errors, Huber-reweighted; HC1 sandwich covariance",
        }



def _robust_weights(relative: Any) -> Any:
    """Huber weights from relative residuals, scaled by their median absolute deviation."""
    import numpy as np

    scale = 1.4826 * float(np.median(np.abs(relative - np.median(relative))))
    scale = max(scale, 0.01)  # never trust residuals below 1% noise more than that
    z = np.abs(relative) / scale
    return np.where(z <= HUBER_K, 1.0, HUBER_K / np.maximum(z, 1e-12))


def _sandwich_covariance(jacobian: Any, residual: Any, parameters: int) -> Any:
    """Heteroscedasticity-consistent covariance (HC1) of a least-squares estimate.

    ``cov = n/(n-p) (J'J)^-1 J' diag(r^2) J (J'J)^-1``. Relative residuals of
    latency are not of equal variance (with ``B`` measured from ``L``, the
    noise shrinks by ``1 - rho`` at high load), so the textbook ``s^2 (J'J)^-1``
    overstates some errors by up to 1.6x (Monte Carlo, tests); the sandwich
    matches the spread of the estimates.
    """
    import numpy as np

    n = jacobian.shape[0]
    bread = np.linalg.pinv(jacobian.T @ jacobian)
    meat = (jacobian * (residual**2)[:, None]).T @ jacobian
    return n / max(n - parameters, 1) * (bread @ meat @ bread)


def _column_scale(design: Any) -> Any:
    """Each column's largest magnitude (1 for an empty column): the solvers' units."""
    import numpy as np

    scale = np.abs(design).max(axis=0)
    scale[scale == 0] = 1.0
    return scale


def _nonnegative_solve(design: Any, target: Any, upper: Any = None) -> Any:
    import numpy as np
    from scipy.optimize import lsq_linear

    scale = _column_scale(design)
    high = np.inf if upper is None else upper * scale
    # A faint ridge (in scaled units) settles the directions the runs leave free -- one draft length cannot
    # tell the verify step from the k draft steps -- between them (the minimum-norm split), rather than at a
    # vertex of the bounds that gives one all the cost and the other none; identified directions move by
    # about RIDGE relative.
    count = design.shape[1]
    solution = lsq_linear(np.vstack([design / scale, np.sqrt(RIDGE * len(target)) * np.eye(count)]),
                          np.concatenate([target, np.zeros(count)]), bounds=(0.0, high), method="bvls")
    return solution.x / scale


def prefill_bound(runs: list[BenchmarkRun], reference: tuple[int, int]) -> float:
    """Upper bound on ``c1p`` (s, at the reference prompt): no prefill outlasts its request's first token.

    ``c1p <= min_r TTFT_r p_ref / p_r`` over the runs that measured TTFT (``inf`` if none). When every
    run has one workload shape the E2E rows hardly tell the prefill from the decode steps, and a noisy
    sweep could otherwise put the whole zero-load latency on ``c1p`` and none on the steps.
    """
    bounds = [r.mean_ttft_s * reference[0] / r.prompt_tokens for r in runs
              if r.mean_ttft_s is not None and r.mean_ttft_s > 0 and r.prompt_tokens > 0]
    return min(bounds) if bounds else math.inf


#: Shares of ``c2_step`` that do not grow with the context, profiled by :func:`fit_pooled` where the no-SD runs
#: span several contexts (0: all of it scales with the context, the default of one workload).
FIXED_STEP_SHARES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def fit_pooled(runs: list[BenchmarkRun], reference: tuple[int, int] | None = None,
               robust: bool = True, fixed_step_share: float | None = None) -> PooledFit:
    """Pooled fit: the eight coefficients and the closed-loop factor from E2E, then TTFT's own terms.

    The no-SD decode step costs each other running sequence ``c2_step(s) =
    c2_step (share + (1 - share) s/s_ref)`` at mean context ``s`` (the
    ``c2_step_fixed_s`` of :func:`sdplan.calibration.scale_direct`). Where the
    no-SD runs span mean contexts more than :data:`LENGTH_GROUP_TOLERANCE`
    apart and no ``fixed_step_share`` is given, the share is profiled: the fit
    is made at each of :data:`FIXED_STEP_SHARES` and the one with the lowest
    mean absolute relative E2E error on these runs is kept (the smallest on a
    tie). One context cannot tell the parts apart, and keeps share 0. On
    AIConfigurator's measured rows (79 GPU configurations, every other
    interior concurrency held out; benchmarks/RESULTS-accuracy-silicon-2026-11.md)
    a fixed part took held-out E2E MAPE from 9.9% to 6.1% and TPOT from 10.3% to 6.6%.

    Stage 1 (mean E2E): ``theta`` (eight coefficients, s) and the closed-loop
    load factor ``f`` in [0.5, 1] (fitted only when open- and closed-loop runs
    are both present, else 1; :data:`CLOSED_LOOP_FACTOR_BOUNDS`). Linear in ``theta`` given ``f`` and in ``f`` given
    ``theta``: alternating solves give a start, a bounded joint least squares
    with the analytic Jacobian finishes, Huber weights are updated until they
    settle. Stage 2 (mean TTFT, ``theta`` fixed): the offset and the two
    weights of ``TTFT = c1p + offset + w_wait tau1 + w_load B C2/steps``, a
    bounded linear least squares, Huber-reweighted. TTFT is noisier than E2E
    and has terms of its own, so it never pulls the E2E coefficients.

    Raises
    ------
    InfeasibleError
        With fewer runs than needed or no no-SD run (the baseline cannot be fitted).
    """
    import numpy as np
    from scipy.optimize import least_squares

    if len(runs) < MIN_FIT_RUNS:
        raise InfeasibleError(f"only {len(runs)} usable runs; a fit needs at least {MIN_FIT_RUNS} (several loads "
                              "per configuration)")
    if not any(run.draft_length == 0 for run in runs):
        raise InfeasibleError("no run without SD: the no-SD baseline cannot be fitted; include baseline runs")
    runs = sorted(runs, key=lambda r: (r.source, r.draft_length, r.load_level, r.mean_e2e_latency_s))
    if reference is None:
        counts: dict[tuple[int, int], int] = defaultdict(int)
        for run in runs:
            counts[(round(run.prompt_tokens), round(run.output_tokens))] += 1
        reference = max(counts, key=lambda item: (counts[item], item))
    if fixed_step_share is None:
        from sdplan.calibration import mean_context

        contexts = [mean_context(r.prompt_tokens, r.output_tokens) for r in runs if r.draft_length == 0]
        if max(contexts) <= LENGTH_GROUP_TOLERANCE * min(contexts):
            fixed_step_share = 0.0
        else:
            best: PooledFit | None = None
            for share in FIXED_STEP_SHARES:
                candidate = fit_pooled(runs, reference, robust, share)
                if best is None or candidate.mape_pct < best.mape_pct - 1e-9:
                    best = candidate
            assert best is not None
            note = (f"c2_step: {best.fixed_step_share:.0%} of it does not grow with the context (c2_step_fixed_s; "
                    f"profiled over {FIXED_STEP_SHARES[0]:.0%}-{FIXED_STEP_SHARES[-1]:.0%} on runs at several "
                    "contexts)")
            return replace(best, notes=(*best.notes, note))
    latency = np.array([r.mean_e2e_latency_s for r in runs])
    rows = design_rows(runs, reference, fixed_step_share)
    fit_factor = bool(rows.closed.any() and (~rows.closed).any())
    # The planner predicts open loops: when both kinds are present, open-loop runs weigh as much in total
    # as closed-loop runs (a sweep has many more closed-loop points).
    balance = np.ones(len(runs))
    if fit_factor:
        balance[~rows.closed] = max(1.0, rows.closed.sum() / max((~rows.closed).sum(), 1))
    weights = balance.copy()

    def design_at(factor: float) -> Any:
        return rows.e2e(factor) / latency[:, None] * np.sqrt(weights)[:, None]

    def residual_vector(x: Any) -> Any:
        return design_at(x[8]) @ x[:8] - np.sqrt(weights)

    def jacobian_of(x: Any) -> Any:
        """Analytic Jacobian of :func:`residual_vector` in (theta, f)."""
        column = np.where(rows.closed, rows.load * (rows.c2 @ x[:8]), 0.0) / latency * np.sqrt(weights)
        return np.column_stack([design_at(x[8]), column])

    theta_upper = np.full(8, np.inf)
    theta_upper[PARAMETERS.index("c1p_s")] = prefill_bound(runs, reference)
    x = np.concatenate([np.zeros(8), [1.0]])
    for iteration in range(6 if robust else 1):
        for _ in range(3):  # alternating linear stages give a start ...
            x[:8] = _nonnegative_solve(design_at(x[8]), np.sqrt(weights), theta_upper)
            if fit_factor:
                closed_part = np.where(rows.closed, rows.load * (rows.c2 @ x[:8]), 0.0) / latency * np.sqrt(weights)
                rest = (rows.c1 + np.where(rows.closed, 0.0, rows.load)[:, None] * rows.c2) @ x[:8] / latency \
                    * np.sqrt(weights)
                if np.any(closed_part > 0):
                    x[8] = float(np.clip(np.dot(closed_part, np.sqrt(weights) - rest) / np.dot(closed_part,
                                                                                                closed_part),
                                         *CLOSED_LOOP_FACTOR_BOUNDS))
        if fit_factor:  # ... then both jointly (the problem is bilinear)
            lower = np.concatenate([np.zeros(8), [CLOSED_LOOP_FACTOR_BOUNDS[0]]])
            upper = np.concatenate([theta_upper, [CLOSED_LOOP_FACTOR_BOUNDS[1]]])
            start = np.clip(x, lower + 1e-15, upper - 1e-15)
            scale = np.where(np.abs(start) > 0, np.abs(start), 1e-6)
            # the same faint ridge as the linear stage, or this stage drifts along the free directions
            ridge = np.sqrt(RIDGE * len(runs)) * _column_scale(design_at(start[8]))

            def ridged_residual(x: Any) -> Any:
                return np.concatenate([residual_vector(x), ridge * x[:8]])

            def ridged_jacobian(x: Any) -> Any:
                return np.vstack([jacobian_of(x), np.column_stack([np.diag(ridge), np.zeros(8)])])

            x = least_squares(ridged_residual, start, jac=ridged_jacobian, bounds=(lower, upper), x_scale=scale,
                              method="trf", xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=200).x
        relative = (rows.e2e(x[8]) @ x[:8] - latency) / latency
        if not robust:
            break
        new_weights = balance * _robust_weights(relative)
        settled = iteration > 0 and np.allclose(new_weights, weights, atol=1e-3)
        weights = new_weights
        if settled:
            break
    theta, factor = x[:8], float(x[8])
    design = design_at(factor)
    identified = identified_parameters(design)
    residual = residual_vector(x)
    jacobian = jacobian_of(x) if fit_factor else design
    covariance = _sandwich_covariance(jacobian, residual, sum(identified) + (1 if fit_factor else 0))
    covariance = covariance[:len(PARAMETERS), :len(PARAMETERS)]
    stderr = [float(math.sqrt(max(covariance[j, j], 0.0))) if identified[j] else math.inf
              for j in range(len(PARAMETERS))]
    predicted = rows.e2e(factor) @ theta
    mape = float(np.mean(np.abs(predicted - latency) / latency) * 100.0)
    ttft = _fit_ttft(runs, rows, theta, factor, robust)
    notes = []
    unidentified = [name for name, ok in zip(PARAMETERS, identified) if not ok]
    if unidentified:
        notes.append("not identified by these runs: " + ", ".join(unidentified)
                     + (" (SD runs at two or more draft lengths determine the draft's share)"
                        if set(unidentified) & set(SPECULATIVE_PARAMETERS) else ""))
    values, errors = dict(zip(PARAMETERS, (float(v) for v in theta))), dict(zip(PARAMETERS, stderr))
    weak = weakly_determined(values, errors, dict(zip(PARAMETERS, identified)))
    if weak:
        notes.append("standard error above the value, so not identified either: "
                     + ", ".join(f"{name} {values[name]:.3g} +- {errors[name]:.2g} s" for name in weak)
                     + (" (runs at one prompt and output length cannot split the prefill from the decode steps)"
                        if {"c1p_s", "c2p_s"} & set(weak) else ""))
    if fit_factor:
        notes.append(f"closed-loop load factor {factor:.3f}: a closed loop of N clients loads the server like "
                     f"{factor:.3f} x (N - 1) others of an open loop")
    down = int((weights < 0.999 * balance).sum())
    if down:
        notes.append(f"{down} run(s) down-weighted as outliers by the robust fit (see the residuals)")
    residuals = tuple(
        PointResidual(source=run.source, load_level=run.load_level, draft_length=run.draft_length,
                      measured_s=float(latency[i]), predicted_s=float(predicted[i]),
                      measured_ttft_s=run.mean_ttft_s if run.mean_ttft_s and run.mean_ttft_s > 0 else None,
                      predicted_ttft_s=float(ttft.predicted[i]), weight=float(weights[i] / balance[i]))
        for i, run in enumerate(runs))
    return PooledFit(
        values={name: float(value) for name, value in zip(PARAMETERS, theta)},
        stderr=dict(zip(PARAMETERS, stderr)),
        covariance=[[float(v) for v in row] for row in covariance],
        identified=dict(zip(PARAMETERS, identified)),
        reference_prompt_tokens=int(reference[0]), reference_output_tokens=int(reference[1]),
        r2=float(r2(list(latency), list(predicted))),
        rmse_s=float(np.sqrt(np.mean((predicted - latency) ** 2))),
        mape_pct=mape, points=len(runs), ttft_wait_steps=ttft.wait_steps, ttft_load_steps=ttft.load_steps,
        ttft_offset_s=ttft.offset_s, ttft_fitted=ttft.fitted, ttft_mape_pct=ttft.mape_pct,
        ttft_closed_load_steps=ttft.closed_load_steps, ttft_prefill_per_token_s=ttft.prefill_per_token_s,
        closed_loop_factor=factor, fixed_step_share=fixed_step_share,
        closed_loop_factor_fitted=fit_factor, residuals=residuals, notes=tuple(notes),
    )


@dataclass(frozen=True, slots=True)
class TtftFit:
    wait_steps: float
    load_steps: float
    offset_s: float
    fitted: bool
    mape_pct: float | None
    predicted: Any
    #: The closed-loop runs' own load weight (None: one weight for all runs).
    closed_load_steps: float | None = None
    #: TTFT's own prefill per prompt token beyond c1p (s; None: not fitted, one prompt length).
    prefill_per_token_s: float | None = None


def _fit_ttft(runs: list[BenchmarkRun], rows: DesignRows, theta: Any, factor: float, robust: bool) -> TtftFit:
    """Stage 2: ``TTFT - c1p = offset + q p + w_wait tau1 + w_load f B (C2/steps)`` with ``theta`` fixed.

    Bounded linear least squares on relative errors (``offset >= -c1p``, weights in
    ``[0, MAX_TTFT_WEIGHT]``), Huber-reweighted; with fewer than 3 measured TTFTs
    the defaults (0 offset, weights 0.5 and 1.5) are kept.

    When both open-loop runs (at least :data:`MIN_OPEN_LOOP_TTFT_RUNS`) and
    closed-loop runs measured TTFT, the closed-loop runs get a load weight of
    their own (``closed_load_steps``) and ``w_load`` comes from the open-loop
    runs, the regime the planner predicts. In a closed loop a request arrives
    the moment another finishes, at the end of a step, so it waits for a whole
    step (often two, with several arriving together), where a Poisson arrival
    waits half of one on average: on real served sweeps the closed-loop TTFT
    was about twice the open-loop TTFT at the same load (tests/data/served-*).

    Where TTFT was measured at prompt lengths more than
    :data:`LENGTH_GROUP_TOLERANCE` apart, ``q`` (s per prompt token, >= 0) is
    fitted too: the request's own prefill beyond ``c1p``. Stage 1 hardly
    determines ``c1p``, a few percent of the end-to-end latency, and may leave
    it near 0, while TTFT at low load is mostly that prefill (AIConfigurator's
    measured Qwen3-32B rows on H100, tests/data/aic-silicon: 0.13 s at 1024
    and 0.42 s at 4096 prompt tokens, 8 clients, with ``c1p = 0``).
    """
    import numpy as np
    from scipy.optimize import lsq_linear

    measured = np.array([r.mean_ttft_s if r.mean_ttft_s is not None else np.nan for r in runs])
    has = np.isfinite(measured) & (measured > 0)
    c1p = rows.c1p @ theta
    tau1 = rows.tau1 @ theta
    load = rows.factor(factor) * rows.load_first * (rows.tau2 @ theta)
    open_loop = has & ~rows.closed
    split = int(open_loop.sum()) >= MIN_OPEN_LOOP_TTFT_RUNS and bool((has & rows.closed).any())
    columns = [np.ones(len(runs)), tau1, np.where(rows.closed, 0.0, load) if split else load]
    if split:
        columns.append(np.where(rows.closed, load, 0.0))
    prompts = np.array([r.prompt_tokens for r in runs])
    by_prompt = bool(has.any() and prompts[has].max() > LENGTH_GROUP_TOLERANCE * prompts[has].min())
    if by_prompt:
        columns.append(prompts)
    offset, wait, per_load, fitted = 0.0, 0.5, 1.5, False
    closed_load = prefill = None
    solution_x = np.array([offset, wait, per_load] + [per_load] * split + [0.0] * by_prompt)
    if has.sum() >= len(columns):
        c1p_reference = float(theta[0])
        basis = np.column_stack(columns)[has] / measured[has, None]
        goal = (measured[has] - c1p[has]) / measured[has]
        weights = np.ones(int(has.sum()))
        scale = np.abs(basis).max(axis=0)
        scale[scale == 0] = 1.0
        lower = np.array([-c1p_reference] + [0.0] * (len(columns) - 1)) * scale
        upper = np.array([np.inf] + [MAX_TTFT_WEIGHT] * (len(columns) - 1 - by_prompt) + [1.0] * by_prompt) * scale
        for _ in range(5 if robust else 1):
            root = np.sqrt(weights)[:, None]
            solution = lsq_linear(basis / scale * root, goal * root[:, 0], bounds=(lower, upper), method="bvls")
            solution_x = solution.x / scale
            relative = basis @ solution_x - goal
            if not robust:
                break
            weights = _robust_weights(relative)
        offset, wait, per_load = (float(v) for v in solution_x[:3])
        closed_load = float(solution_x[3]) if split else None
        prefill = float(solution_x[-1]) if by_prompt else None
        fitted = True
    predicted = c1p + np.column_stack(columns) @ solution_x
    mape = (float(np.mean(np.abs(predicted[has] - measured[has]) / measured[has]) * 100.0) if has.any() else None)
    return TtftFit(wait_steps=wait, load_steps=per_load, offset_s=offset, fitted=fitted, mape_pct=mape,
                   predicted=predicted, closed_load_steps=closed_load, prefill_per_token_s=prefill)


# ----------------------------------------------------------------------------- per configuration


@dataclass(frozen=True, slots=True)
class ConfigurationFit:
    """``L = C1 + B C2`` fitted to the runs of one configuration (two coefficients, linear)."""

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



def fit_configurations(runs: list[BenchmarkRun]) -> list[ConfigurationFit]:
    """Per-configuration fits of ``L = C1 + B C2`` (configurations with at least two load levels)."""
    import numpy as np

    fits = []
    for members in configuration_groups(runs):
        others = np.array([m.mean_others for m in members])
        latency = np.array([m.mean_e2e_latency_s for m in members])
        if len(members) < 2 or np.ptp(others) <= 0:
            continue
        design = np.column_stack([np.ones_like(others), others]) / latency[:, None]
        theta = _nonnegative_solve(design, np.ones_like(latency))
        predicted = theta[0] + theta[1] * others
        residual = design @ theta - 1.0
        dof = max(len(members) - 2, 1)
        covariance = np.linalg.pinv(design.T @ design) * float((residual**2).sum()) / dof
        alphas = [m.alpha for m in members if m.alpha is not None]
        fits.append(ConfigurationFit(
            draft_length=members[0].draft_length, alpha=round(sum(alphas) / len(alphas), 4) if alphas else None,
            prompt_tokens=round(sum(m.prompt_tokens for m in members) / len(members)),
            output_tokens=round(sum(m.output_tokens for m in members) / len(members)),
            c1_s=float(theta[0]), c2_s=float(theta[1]),
            c1_stderr_s=float(math.sqrt(max(covariance[0, 0], 0.0))),
            c2_stderr_s=float(math.sqrt(max(covariance[1, 1], 0.0))),
            r2=float(r2(list(latency), list(predicted))), points=len(members)))
    return fits


# ----------------------------------------------------------------------------- hold-out


def holdout_split(runs: list[BenchmarkRun], how: str, fraction: float,
                  seed: int) -> tuple[list[BenchmarkRun], list[BenchmarkRun]]:
    """``(train, held)``: ``random`` (a seeded fraction, independent of file order) or
    ``highest-load`` (the most loaded run of every configuration: extrapolation).
    """
    import random

    if how == "highest-load":
        held = []
        for members in configuration_groups(runs):
            if len(members) >= 3:
                held.append(max(members, key=lambda r: r.mean_others))
        chosen = {id(r) for r in held}
        return [r for r in runs if id(r) not in chosen], held
    ordered = sorted(runs, key=lambda r: (r.source, r.draft_length, r.load_level))
    random.Random(seed).shuffle(ordered)
    cut = max(1, round(fraction * len(ordered)))
    held_ids = {id(r) for r in ordered[:cut]}
    return [r for r in runs if id(r) not in held_ids], [r for r in runs if id(r) in held_ids]


# ----------------------------------------------------------------------------- the calibration document


def fitted_document(fit: PooledFit, runs: list[BenchmarkRun], *, name: str, provenance: dict[str, Any],
                    description: str, extra: dict[str, Any] | None = None,
                    acceptance: dict[str, Any] | None = None) -> dict[str, Any]:
    """A complete calibration (schema 1, direct form) from a pooled fit.

    Holds the coefficients, the TTFT weights, the covariance and which
    coefficients the data did not identify, the fit quality, and the ranges
    of lengths and concurrency the runs covered.
    """
    others = [r.mean_others for r in runs]
    detail = (f"pooled over {fit.points} runs: R2={fit.r2:.4f}, MAPE={fit.mape_pct:.2f}%"
              + (f", TTFT MAPE={fit.ttft_mape_pct:.2f}%" if fit.ttft_mape_pct is not None else "")
              + (f"; {'; '.join(fit.notes)}" if fit.notes else ""))
    document: dict[str, Any] = {
        "schema_version": 1,
        "name": name,
        "description": description,
        "provenance": provenance,
        "reference_workload": {"prompt_tokens": fit.reference_prompt_tokens,
                               "output_tokens": fit.reference_output_tokens},
        "validity": {
            "prompt_tokens": [max(1, round(min(r.prompt_tokens for r in runs))),
                              max(1, round(max(r.prompt_tokens for r in runs)))],
            "output_tokens": [max(1, round(min(r.output_tokens for r in runs))),
                              max(1, round(max(r.output_tokens for r in runs)))],
            "batch_size": [max(1, math.floor(min(others)) + 1), max(1, math.ceil(max(others)) + 1)],
        },
        "fit_quality": {"r2": round(max(min(fit.r2, 1.0), -1e6), 6), "rmse_s": fit.rmse_s,
                        "mape_pct": round(fit.mape_pct, 4), "points": fit.points, "detail": detail},
    }
    if acceptance is not None:
        document["acceptance"] = acceptance
    document["coefficients"] = fit.coefficients_document()
    document["ttft"] = fit.ttft_document()
    document["closed_loop"] = fit.closed_loop_document()
    document["uncertainty"] = fit.uncertainty_document()
    document.update(extra or {})
    return document
