"""Stage 2 of the pooled fit: time to first token's own terms, with the E2E coefficients fixed.

``TTFT = c1p + offset + q p + w_wait tau1 + w_load f B C2/steps``
(:func:`sdplan.latency.model.time_to_first_token`): the coefficients ``theta`` and the
closed-loop factor ``f`` come from stage 1 (:func:`sdplan.fitting.fit.fit_pooled`), so
TTFT's noisier data never pull the E2E coefficients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sdplan.fitting.regression import bounded_solve, column_scale, huber_weights
from sdplan.fitting.runmodel import LENGTH_GROUP_TOLERANCE, DesignRows
from sdplan.latency.coefficients import DEFAULT_TTFT_LOAD_STEPS, DEFAULT_TTFT_WAIT_STEPS

if TYPE_CHECKING:
    from sdplan.runs import BenchmarkRun

#: Largest TTFT weight (in steps) a fit may return; the defaults are 0.5 and 1.5.
MAX_TTFT_WEIGHT = 50.0
#: Open-loop runs with a measured TTFT needed before they set the TTFT load weight on their own.
MIN_OPEN_LOOP_TTFT_RUNS = 3


@dataclass(frozen=True, slots=True)
class TtftFit:
    """TTFT's own terms (see :func:`fit_ttft`), the defaults where TTFT was not measured, and the fitted TTFT
    of every run (s)."""

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


def fit_ttft(runs: list[BenchmarkRun], rows: DesignRows, theta: Any, factor: float, robust: bool,
             queue_wait_s: Any = None) -> TtftFit:
    """Stage 2: ``TTFT - c1p - W = offset + q p + w_wait tau1 + w_load f B (C2/steps)`` with ``theta`` fixed.

    ``W`` is each run's wait for the prefills queued ahead (an open loop's; ``queue_wait_s``, 0 where None), which the
    model adds to TTFT (:func:`sdplan.latency.model.time_to_first_token`).

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
    measured = np.array([r.mean_ttft_s if r.mean_ttft_s is not None else np.nan for r in runs])
    has = np.isfinite(measured) & (measured > 0)
    c1p = rows.c1p @ theta + (0.0 if queue_wait_s is None else np.asarray(queue_wait_s, dtype=np.float64))
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
    offset, wait, per_load, fitted = 0.0, DEFAULT_TTFT_WAIT_STEPS, DEFAULT_TTFT_LOAD_STEPS, False
    closed_load = prefill = None
    solution_x = np.array([offset, wait, per_load] + [per_load] * split + [0.0] * by_prompt)
    if has.sum() >= len(columns):
        c1p_reference = float(theta[0])
        basis = np.column_stack(columns)[has] / measured[has, None]
        goal = (measured[has] - c1p[has]) / measured[has]
        weights = np.ones(int(has.sum()))
        scale = column_scale(basis)
        lower = np.array([-c1p_reference] + [0.0] * (len(columns) - 1)) * scale
        upper = np.array([np.inf] + [MAX_TTFT_WEIGHT] * (len(columns) - 1 - by_prompt) + [1.0] * by_prompt) * scale
        for _ in range(5 if robust else 1):
            root = np.sqrt(weights)[:, None]
            solution_x = bounded_solve(basis / scale * root, goal * root[:, 0], lower, upper) / scale
            relative = basis @ solution_x - goal
            if not robust:
                break
            weights = huber_weights(relative)
        offset, wait, per_load = (float(v) for v in solution_x[:3])
        closed_load = float(solution_x[3]) if split else None
        prefill = float(solution_x[-1]) if by_prompt else None
        fitted = True
    predicted = c1p + np.column_stack(columns) @ solution_x
    mape = (float(np.mean(np.abs(predicted[has] - measured[has]) / measured[has]) * 100.0) if has.any() else None)
    return TtftFit(wait_steps=wait, load_steps=per_load, offset_s=offset, fitted=fitted, mape_pct=mape,
                   predicted=predicted, closed_load_steps=closed_load, prefill_per_token_s=prefill)
