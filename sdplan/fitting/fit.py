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
relative residuals, checked against Monte Carlo; ``docs/model.md#fitting``);
the numerical tools are in :mod:`sdplan.fitting.regression`, the result in
:mod:`sdplan.fitting.fit_result`.
Coefficients the data cannot determine (e.g. the draft's share
with a single draft length) are reported as not identified.

Time to first token has its own load term (:func:`sdplan.latency.model.time_to_first_token`,
``TTFT = c1p + offset + w_wait tau1 + B w_load C2/steps``), fitted in a second
stage with the coefficients fixed (:mod:`sdplan.fitting.ttft_fit`), so TTFT's noisier
data never pull the E2E coefficients.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from sdplan.errors import InfeasibleError
from sdplan.fitting.fit_result import PointResidual, PooledFit, weakly_determined
from sdplan.fitting.regression import (
    RIDGE,
    column_scale,
    huber_weights,
    identified_parameters,
    nonnegative_solve,
    sandwich_covariance,
)
from sdplan.fitting.runmodel import (
    PARAMETERS,
    DesignRows,
    configuration_groups,
    design_rows,
    floor_notes,
    r2,
    verify_floor,
)
from sdplan.fitting.step_share import profile_fixed_step_share, spans_several_contexts
from sdplan.fitting.ttft_fit import fit_ttft
from sdplan.fitting.validation import repeat_spread
from sdplan.latency.coefficients import SPECULATIVE_PARAMETERS

if TYPE_CHECKING:
    from sdplan.runs import BenchmarkRun

#: Fewest runs a pooled fit takes.
MIN_FIT_RUNS = 3
#: Bounds of the closed-loop load factor f (see :func:`fit_pooled`). A closed loop never loads the server more
#: per other request than an open loop: its measured others already exclude the clients' gaps between requests,
#: while in an open loop requests meet more others than lambda*L (the sojourn-weighted count exceeds it by 6-15%
#: under batching, tested against the step simulator), so f <= 1. An f above 1 is noise fitted, e.g. a slow
#: instance at low N, and it inflates the open-loop saturation 1/C2 by as much (measured on a served calibration:
#: benchmarks/RESULTS-accuracy-served-2026-11.md).
CLOSED_LOOP_FACTOR_BOUNDS = (0.5, 1.0)
#: ``psi`` of the concave load law ``L = C1 + C2 (B + psi sqrt(B))`` at which the pooled fit is profiled
#: (``docs/model.md#concave-load``; 0 is Kong et al.'s straight line). The bend is the servers' own: on
#: fifteen served CPU calibrations their closed loops ran 12-15% under the line at 4 and 16 clients and 6-8%
#: over it at 64 (benchmarks/RESULTS-accuracy-served-2026-11.md, "a concave load term").
LOAD_CONCAVITIES = (0.0, 0.5, 1.0, 2.0)


def prefill_bound(runs: list[BenchmarkRun], reference: tuple[int, int]) -> float:
    """Upper bound on ``c1p`` (s, at the reference prompt): no prefill outlasts its request's first token.

    ``c1p <= min_r TTFT_r p_ref / p_r`` over the runs that measured TTFT (``inf`` if none). When every
    run has one workload shape the E2E rows hardly tell the prefill from the decode steps, and a noisy
    sweep could otherwise put the whole zero-load latency on ``c1p`` and none on the steps.
    """
    bounds = [r.mean_ttft_s * reference[0] / r.prompt_tokens for r in runs
              if r.mean_ttft_s is not None and r.mean_ttft_s > 0 and r.prompt_tokens > 0]
    return min(bounds) if bounds else math.inf


def fit_pooled(runs: list[BenchmarkRun], reference: tuple[int, int] | None = None,
               robust: bool = True, fixed_step_share: float | None = None,
               load_concavity_sqrt_requests: float | None = None) -> PooledFit:
    """Pooled fit: the eight coefficients and the closed-loop factor from E2E, then TTFT's own terms.

    The no-SD decode step costs each other running sequence ``c2_step(s) =
    c2_step (share + (1 - share) s/s_ref)`` at mean context ``s`` (the
    ``c2_step_fixed_s`` of :func:`sdplan.calibration.scale_direct`). Where the
    no-SD runs span mean contexts more than 10% apart and no
    ``fixed_step_share`` is given, the share is profiled and the mean of its
    profile likelihood kept (:mod:`sdplan.fitting.step_share`). One context cannot
    tell the parts apart, and keeps share 0. On
    AIConfigurator's measured rows (79 GPU configurations, every other
    interior concurrency held out; benchmarks/RESULTS-accuracy-silicon-2026-11.md)
    a fixed part took held-out E2E MAPE from 9.9% to 6.1% and TPOT from 10.3% to 6.6%.

    The load law may be concave, ``L = C1 + C2 h(f B)`` with ``h(B) = B + psi sqrt(B)``: ``psi =
    load_concavity_sqrt_requests``, or where None the one of :data:`LOAD_CONCAVITIES` whose fit leaves the
    runs the lowest E2E MAPE (over every run); ``psi = 0`` is Kong et al.'s straight
    line. It is profiled only where open- and closed-loop runs are fitted together: the planner predicts open loops, and
    closed loops alone show a bend of their own (fitted to tests/data/served-cpu's closed loops, ``psi = 2``
    took its Poisson runs from 9.5% to 13.7% MAPE), which the open-loop runs of a joint fit hold in check.

    Stage 1 (mean E2E): ``theta`` (eight coefficients, s) and the closed-loop
    load factor ``f`` in [0.5, 1] (fitted only when open- and closed-loop runs
    are both present, else 1; :data:`CLOSED_LOOP_FACTOR_BOUNDS`). Linear in ``theta`` given ``f`` and in ``f`` given
    ``theta``: alternating solves give a start, a bounded joint least squares
    with the analytic Jacobian finishes, Huber weights are updated until they
    settle. Stage 2 (mean TTFT, ``theta`` fixed): the offset and the two
    weights of ``TTFT = c1p + offset + w_wait tau1 + w_load B C2/steps``, a
    bounded linear least squares, Huber-reweighted (:func:`sdplan.fitting.ttft_fit.fit_ttft`). TTFT is noisier than E2E
    and has terms of its own, so it never pulls the E2E coefficients.

    Runs that repeat a load level also give the spread between repeats (``repeat_sd_pct``,
    :func:`sdplan.fitting.validation.repeat_spread`), which widens the planner's intervals.

    Raises
    ------
    InfeasibleError
        With fewer runs than needed or no no-SD run (the baseline cannot be fitted).
    """
    if len(runs) < MIN_FIT_RUNS:
        raise InfeasibleError(f"only {len(runs)} usable runs; a fit needs at least {MIN_FIT_RUNS} (several loads "
                              "per configuration)")
    if not any(run.draft_length == 0 for run in runs):
        raise InfeasibleError("no run without SD: the no-SD baseline cannot be fitted; include baseline runs, or "
                              "scale a calibration to these runs with sdplan fit --prior CALIBRATION")
    runs = sorted(runs, key=lambda r: (r.source, r.draft_length, r.load_level, r.mean_e2e_latency_s))
    if reference is None:
        reference = _reference_workload(runs)
    if load_concavity_sqrt_requests is None and not both_loops(runs):
        load_concavity_sqrt_requests = 0.0  # closed loops alone bend by their own waves (docs/model.md#concave-load)
    if load_concavity_sqrt_requests is not None:
        return _fit_with_law(runs, reference, robust, fixed_step_share, load_concavity_sqrt_requests)
    # profiled: the law under which the runs' own E2E MAPE is lowest (0 keeps Kong et al.'s line)
    fits = [_fit_with_law(runs, reference, robust, fixed_step_share, psi) for psi in LOAD_CONCAVITIES]
    errors = [fit.mape_pct for fit in fits]
    best = fits[errors.index(min(errors))]
    psi = best.load_concavity_sqrt_requests
    law = (f"load law: concave, psi {psi:g} (B others in flight cost C2 (B + psi sqrt(B)), "
           f"docs/model.md#concave-load)" if psi else "load law: a straight line (L = C1 + B C2)")
    note = (f"{law}: of psi {', '.join(f'{psi:g}' for psi in LOAD_CONCAVITIES)}, the one whose fit leaves the "
            f"runs the lowest E2E MAPE ({', '.join(f'{e:.3g}%' for e in errors)})")
    return replace(best, notes=(*best.notes, note))


def both_loops(runs: list[BenchmarkRun]) -> bool:
    """Whether the runs hold closed loops (``N`` clients) and open loops (a Poisson rate) both."""
    closed = {run.concurrency is not None for run in runs}
    return closed == {True, False}


def _fit_with_law(runs: list[BenchmarkRun], reference: tuple[int, int], robust: bool,
                  fixed_step_share: float | None, psi: float) -> PooledFit:
    """:func:`fit_pooled` under one load law: the step share profiled where the runs span contexts, the
    repeats' spread."""
    share_note: tuple[str, ...] = ()
    share_sd: float | None = None
    if fixed_step_share is None:
        if not spans_several_contexts(runs):
            fixed_step_share = 0.0
        else:
            fixed_step_share, share_sd, note = profile_fixed_step_share(
                lambda phi: _fit_at_share(runs, reference, robust, phi, psi), len(runs))
            share_note = (note,)
    fit = _fit_at_share(runs, reference, robust, fixed_step_share, psi)
    spread = repeat_spread(runs)
    spread_note = () if spread is None else (
        f"{spread.runs} runs repeating {spread.repeated_levels} load levels lay {spread.sd_pct:.2g}% apart (standard "
        "deviation, repeat_sd_pct); the 95% intervals of plan, capacity and check --pessimistic include it",)
    return replace(fit, notes=(*fit.notes, *share_note, *spread_note),
                   repeat_sd_pct=None if spread is None else spread.sd_pct,
                   step_share_sd_pct=None if share_sd is None else 100.0 * share_sd)


def _reference_workload(runs: list[BenchmarkRun]) -> tuple[int, int]:
    """The (prompt, output) lengths most runs share (the longer on a tie): the coefficients' reference."""
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for run in runs:
        counts[(round(run.prompt_tokens), round(run.output_tokens))] += 1
    return max(counts, key=lambda item: (counts[item], item))


def _fit_at_share(runs: list[BenchmarkRun], reference: tuple[int, int], robust: bool,
                  fixed_step_share: float, psi: float) -> PooledFit:
    """Both stages of :func:`fit_pooled` at one share of ``c2_step`` that does not grow with the context."""
    latency = np.array([r.mean_e2e_latency_s for r in runs])
    rows, floor = design_rows(runs, reference, fixed_step_share, psi), verify_floor(runs)
    fit_factor = bool(rows.closed.any() and (~rows.closed).any())
    balance = _balance_weights(rows.closed, fit_factor)
    theta_upper = np.full(8, np.inf)
    theta_upper[PARAMETERS.index("c1p_s")] = prefill_bound(runs, reference)
    # The open loops' measured latencies include the wait for the prefills queued ahead, which the planner adds to
    # the law (docs/model.md#prefills-queued-ahead): the straight part is fitted to what is left. The wait depends on
    # the fitted c2p, so the fit is repeated with the wait of the last pass until it settles.
    wait = np.zeros(len(runs))
    for fitted_pass in range(1, WAIT_PASSES + 1):
        problem = _E2EProblem(rows.times(floor), latency - wait)
        x, weights = _solve_e2e(problem, balance, theta_upper, fit_factor, robust)
        theta = floor @ x[:8]
        following = np.minimum(rows.wait(theta), WAIT_SHARE_LIMIT * latency)
        if fitted_pass == WAIT_PASSES or np.allclose(following, wait, rtol=WAIT_TOLERANCE, atol=0.0):
            break  # theta is fitted with `wait`, which predicts with it
        wait = following
    factor = float(x[8])
    identified, covariance, stderr = _covariance_and_stderr(problem, x, weights, fit_factor, floor)
    predicted = rows.e2e(factor) @ theta + wait
    ttft = fit_ttft(runs, rows, theta, factor, robust, wait)
    values, errors = dict(zip(PARAMETERS, (float(v) for v in theta))), dict(zip(PARAMETERS, stderr))
    notes = _fit_notes(values, errors, dict(zip(PARAMETERS, identified)), factor if fit_factor else None,
                       int((weights < 0.999 * balance).sum())) + floor_notes(floor, x[:8])
    return PooledFit(
        values=values, stderr=errors, covariance=[[float(v) for v in row] for row in covariance],
        identified=dict(zip(PARAMETERS, identified)),
        reference_prompt_tokens=int(reference[0]), reference_output_tokens=int(reference[1]),
        r2=float(r2(list(latency), list(predicted))),
        rmse_s=float(np.sqrt(np.mean((predicted - latency) ** 2))),
        mape_pct=float(np.mean(np.abs(predicted - latency) / latency) * 100.0), points=len(runs),
        ttft_wait_steps=ttft.wait_steps, ttft_load_steps=ttft.load_steps,
        ttft_offset_s=ttft.offset_s, ttft_fitted=ttft.fitted, ttft_mape_pct=ttft.mape_pct,
        ttft_closed_load_steps=ttft.closed_load_steps, ttft_prefill_per_token_s=ttft.prefill_per_token_s,
        closed_loop_factor=factor, fixed_step_share=fixed_step_share, load_concavity_sqrt_requests=psi,
        closed_loop_factor_fitted=fit_factor, notes=notes,
        residuals=_residuals(runs, latency, predicted, ttft.predicted, weights / balance),
    )


#: Passes of the E2E fit that settle the open loops' prefill wait, and the relative change that counts as settled.
WAIT_PASSES = 4
WAIT_TOLERANCE = 1e-3
#: The most of a run's measured latency the wait may take: a pass whose c2p would queue prefills near saturation
#: at a run's rate is not let to fit that run with nothing left for its own prefill and decode.
WAIT_SHARE_LIMIT = 0.5


def _balance_weights(closed: Any, fit_factor: bool) -> Any:
    """Per-run weights under which open-loop runs weigh as much in total as closed-loop runs.

    The planner predicts open loops, and a sweep has many more closed-loop points: when both kinds are present
    (``fit_factor``), each open-loop run weighs ``max(1, closed/open)``; otherwise every run weighs 1.
    """
    balance = np.ones(len(closed))
    if fit_factor:
        balance[~closed] = max(1.0, closed.sum() / max((~closed).sum(), 1))
    return balance


@dataclass(frozen=True, slots=True)
class _E2EProblem:
    """Stage 1's weighted relative residuals ``sqrt(w) (X(f) theta / L - 1)`` in ``x = (theta, f)``."""

    rows: DesignRows
    latency: Any

    def design(self, factor: float, weights: Any) -> Any:
        """``sqrt(w) X(f) / L``: the design at load factor ``f`` in relative units."""
        return self.rows.e2e(factor) / self.latency[:, None] * np.sqrt(weights)[:, None]

    def residual(self, x: Any, weights: Any) -> Any:
        return self.design(x[8], weights) @ x[:8] - np.sqrt(weights)

    def factor_column(self, theta: Any, weights: Any, factor: float) -> Any:
        """``d residual / d f``: the closed-loop runs' load term ``B C2 / L`` (0 for open-loop runs), times
        ``h'(f B)`` under a concave load law."""
        rows = self.rows
        if rows.concavity == 0.0:
            return np.where(rows.closed, rows.load * (rows.c2 @ theta), 0.0) / self.latency * np.sqrt(weights)
        return rows.loaded_slope(factor) * (rows.c2 @ theta) / self.latency * np.sqrt(weights)

    def jacobian(self, x: Any, weights: Any) -> Any:
        """Analytic Jacobian of :meth:`residual` in (theta, f)."""
        return np.column_stack([self.design(x[8], weights), self.factor_column(x[:8], weights, x[8])])


def _solve_e2e(problem: _E2EProblem, balance: Any, theta_upper: Any, fit_factor: bool,
               robust: bool) -> tuple[Any, Any]:
    """Stage 1, iteratively reweighted: ``x = (theta, f)`` and the final weights (``balance`` times Huber's).

    Each pass solves with the weights fixed (:func:`_alternate`, then :func:`_joint_solve` when ``f`` is
    fitted), then updates the Huber weights from the relative residuals; it stops when they settle
    (within 1e-3) or after 6 passes (1 without ``robust``).
    """
    weights = balance.copy()
    x = np.concatenate([np.zeros(8), [1.0]])
    for iteration in range(6 if robust else 1):
        x = _alternate(problem, x, weights, theta_upper, fit_factor)
        if fit_factor:
            x = _joint_solve(problem, x, weights, theta_upper)
        if not robust:
            break
        relative = (problem.rows.e2e(x[8]) @ x[:8] - problem.latency) / problem.latency
        new_weights = balance * huber_weights(relative)
        settled = iteration > 0 and np.allclose(new_weights, weights, atol=1e-3)
        weights = new_weights
        if settled:
            break
    return x, weights


def _alternate(problem: _E2EProblem, x: Any, weights: Any, theta_upper: Any, fit_factor: bool) -> Any:
    """Three alternating linear solves, ``theta`` given ``f`` then ``f`` given ``theta``: the joint solve's start."""
    x = x.copy()
    rows, latency, root = problem.rows, problem.latency, np.sqrt(weights)
    for _ in range(3):
        x[:8] = nonnegative_solve(problem.design(x[8], weights), root, theta_upper)
        if fit_factor:
            closed_part = problem.factor_column(x[:8], weights, x[8])
            if rows.concavity == 0.0:
                rest = (rows.c1 + np.where(rows.closed, 0.0, rows.load)[:, None] * rows.c2) @ x[:8] / latency * root
            else:  # linearised at the current f: a Gauss-Newton step for f
                rest = problem.design(x[8], weights) @ x[:8] - x[8] * closed_part
            if np.any(closed_part > 0):
                x[8] = float(np.clip(np.dot(closed_part, root - rest) / np.dot(closed_part, closed_part),
                                     *CLOSED_LOOP_FACTOR_BOUNDS))
    return x


def _joint_solve(problem: _E2EProblem, x: Any, weights: Any, theta_upper: Any) -> Any:
    """``(theta, f)`` jointly (the problem is bilinear): bounded least squares with the analytic Jacobian."""
    from scipy.optimize import least_squares

    lower = np.concatenate([np.zeros(8), [CLOSED_LOOP_FACTOR_BOUNDS[0]]])
    upper = np.concatenate([theta_upper, [CLOSED_LOOP_FACTOR_BOUNDS[1]]])
    start = np.clip(x, lower + 1e-15, upper - 1e-15)
    scale = np.where(np.abs(start) > 0, np.abs(start), 1e-6)
    # the same faint ridge as the linear stage, or this stage drifts along the free directions
    ridge = np.sqrt(RIDGE * len(problem.latency)) * column_scale(problem.design(start[8], weights))

    def ridged_residual(x: Any) -> Any:
        return np.concatenate([problem.residual(x, weights), ridge * x[:8]])

    def ridged_jacobian(x: Any) -> Any:
        return np.vstack([problem.jacobian(x, weights), np.column_stack([np.diag(ridge), np.zeros(8)])])

    return least_squares(ridged_residual, start, jac=ridged_jacobian, bounds=(lower, upper), x_scale=scale,
                         method="trf", xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=200).x


def _covariance_and_stderr(problem: _E2EProblem, x: Any, weights: Any, fit_factor: bool,
                           floor: Any) -> tuple[list[bool], Any, list[float]]:
    """Which coefficients are identified, their HC1 sandwich covariance (s^2) and standard errors (s).

    The covariance is that of the weighted relative residuals at the final weights, in ``(theta', f)`` when
    ``f`` was fitted (cut to ``theta'`` and mapped by ``floor`` to ``theta = floor theta'``,
    :func:`~sdplan.fitting.runmodel.verify_floor`); an unidentified coefficient's standard error is ``inf``.
    """
    design = problem.design(float(x[8]), weights)
    identified = identified_parameters(design @ np.linalg.inv(floor))
    jacobian = problem.jacobian(x, weights) if fit_factor else design
    covariance = sandwich_covariance(jacobian, problem.residual(x, weights),
                                     sum(identified) + (1 if fit_factor else 0))
    covariance = floor @ covariance[:len(PARAMETERS), :len(PARAMETERS)] @ floor.T
    stderr = [float(math.sqrt(max(covariance[j, j], 0.0))) if identified[j] else math.inf
              for j in range(len(PARAMETERS))]
    return identified, np.asarray(covariance), stderr


def _fit_notes(values: dict[str, float], errors: dict[str, float], identified: dict[str, bool],
               factor: float | None, down_weighted: int) -> tuple[str, ...]:
    """The fit's notes in English: what the runs do not identify, the closed-loop factor (None: not fitted),
    and how many runs the robust fit down-weighted."""
    notes = []
    unidentified = [name for name in PARAMETERS if not identified[name]]
    if unidentified:
        notes.append("not identified by these runs: " + ", ".join(unidentified)
                     + (" (SD runs at two or more draft lengths determine the draft's share)"
                        if set(unidentified) & set(SPECULATIVE_PARAMETERS) else ""))
    weak = weakly_determined(values, errors, identified)
    if weak:
        notes.append("standard error above the value, so not identified either: "
                     + ", ".join(f"{name} {values[name]:.3g} +- {errors[name]:.2g} s" for name in weak)
                     + (" (runs at one prompt and output length cannot split the prefill from the decode steps)"
                        if {"c1p_s", "c2p_s"} & set(weak) else ""))
    if factor is not None:
        notes.append(f"closed-loop load factor {factor:.3f}: a closed loop of N clients loads the server like "
                     f"{factor:.3f} x (N - 1) others of an open loop")
    if down_weighted:
        notes.append(f"{down_weighted} run(s) down-weighted as outliers by the robust fit (see the residuals)")
    return tuple(notes)


def _residuals(runs: list[BenchmarkRun], latency: Any, predicted: Any, predicted_ttft: Any,
               weight: Any) -> tuple[PointResidual, ...]:
    """Each run's measured and fitted E2E and TTFT, with its robust weight (balance divided out)."""
    return tuple(PointResidual.of(run, float(predicted[i]), float(predicted_ttft[i]), float(weight[i]))
                 for i, run in enumerate(runs))


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
    fits = []
    for members in configuration_groups(runs):
        others = np.array([m.mean_others for m in members])
        latency = np.array([m.mean_e2e_latency_s for m in members])
        if len(members) < 2 or np.ptp(others) <= 0:
            continue
        design = np.column_stack([np.ones_like(others), others]) / latency[:, None]
        theta = nonnegative_solve(design, np.ones_like(latency))
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


def validity_table(runs: list[BenchmarkRun]) -> dict[str, list[int]]:
    """The ``[validity]`` of a calibration made from ``runs``: the lengths they ran and the batch sizes they
    reached (the others in flight plus the request itself), so that ``plan`` says where it extrapolates."""
    others = [r.mean_others for r in runs]
    return {
        "prompt_tokens": [max(1, round(min(r.prompt_tokens for r in runs))),
                          max(1, round(max(r.prompt_tokens for r in runs)))],
        "output_tokens": [max(1, round(min(r.output_tokens for r in runs))),
                          max(1, round(max(r.output_tokens for r in runs)))],
        "batch_size": [max(1, math.floor(min(others)) + 1), max(1, math.ceil(max(others)) + 1)],
    }


def fitted_document(fit: PooledFit, runs: list[BenchmarkRun], *, name: str, provenance: dict[str, Any],
                    description: str, extra: dict[str, Any] | None = None,
                    acceptance: dict[str, Any] | None = None, holdout: str = "") -> dict[str, Any]:
    """A complete calibration (schema 1, direct form) from a pooled fit.

    Holds the coefficients, the TTFT weights, the covariance and which
    coefficients the data did not identify, the fit quality (``holdout``, when
    given, ends its detail: the error on runs held out of the fit), and the
    ranges of lengths and concurrency the runs covered.
    """
    detail = (f"pooled over {fit.points} runs: R2={fit.r2:.4f}, MAPE={fit.mape_pct:.2f}%"
              + (f", TTFT MAPE={fit.ttft_mape_pct:.2f}%" if fit.ttft_mape_pct is not None else "")
              + (f"; {'; '.join(fit.notes)}" if fit.notes else "")
              + (f"; {holdout}" if holdout else ""))
    document: dict[str, Any] = {
        "schema_version": 1,
        "name": name,
        "description": description,
        "provenance": provenance,
        "reference_workload": {"prompt_tokens": fit.reference_prompt_tokens,
                               "output_tokens": fit.reference_output_tokens},
        "validity": validity_table(runs),
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
