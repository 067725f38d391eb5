"""sdplan's step model fitted to the step costs AIConfigurator prices.

The step model (``sdplan-calibration(5)``, ``[step_model]``)::

    T(B, q, s) = fixed + B (per_sequence + q per_query_token + s per_context_token)

with ``B`` running sequences, ``q`` query tokens per sequence and ``s`` the
mean KV context, is fitted by :func:`fit_linear` to the target's steps, the
draft's, the prefill of one prompt and its interference with decode
(:func:`fit_steps`), each with the mean and largest relative error of the
fitted form against the priced curve.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sdplan.derive.pricing import Pricer
from sdplan.derive.request import (
    BATCH_GRID,
    CONTEXT_GRID,
    INTERFERENCE_BATCHES,
    PROMPT_GRID,
    DeriveRequest,
)


def fit_linear(rows: Sequence[Sequence[float]], values: Sequence[float]) -> tuple[list[float], float, float]:
    """Non-negative least squares in relative error: the coefficients and the mean and max error (%).

    Notes
    -----
    Minimises ``sum_i ((x_i . c - y_i) / y_i)^2`` over ``c >= 0`` (every cost of
    the step model is a time, ``sdplan-calibration(5)``), by
    :func:`scipy.optimize.nnls` on the rows scaled by ``1 / y_i``.
    """
    from scipy.optimize import nnls

    x = np.asarray(rows, dtype=float)
    y = np.asarray(values, dtype=float)
    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    solution, _ = nnls((x / scale) / y[:, None], np.ones_like(y))
    coefficients = solution / scale
    errors = np.abs(x @ coefficients - y) / y * 100.0
    return [float(c) for c in coefficients], float(errors.mean()), float(errors.max())


def rounded(value: float) -> float:
    """A cost as the derived file writes it: six significant digits."""
    return float(f"{value:.6g}")


def batch_sizes(request: DeriveRequest, kv_tokens: int | None) -> list[int]:
    """Batch sizes priced: up to max_num_seqs and what the KV cache holds at the reference workload."""
    cap = request.max_num_seqs
    if kv_tokens:
        cap = min(cap, max(kv_tokens // (request.prompt_tokens + request.output_tokens), 1))
    return [b for b in BATCH_GRID if b <= cap] or [1]


def fits_cache(batch: int, context: int, kv_tokens: int | None) -> bool:
    """Whether ``batch`` sequences of ``context`` tokens fit the KV cache (one sequence always is priced)."""
    return kv_tokens is None or batch * context <= kv_tokens or batch == 1


def step_rows(points: list[tuple[int, int, int]], routing: tuple[int, int] | None = None) -> list[list[float]]:
    """Design rows of T(B, q, s) = fixed + B seq + B q tok + B s ctx [+ phi(B q) experts].

    For an MoE target routing ``m`` of ``M`` experts per token, the last column
    is the expected fraction of experts a step of ``B q`` tokens touches,
    ``phi(T) = 1 - (1 - m/M)^T`` (:mod:`sdplan.moe`), whose coefficient is the
    time to stream every expert: ``[moe.coverage]`` of ``sdplan-calibration(5)``.
    """
    rows = [[1.0, float(b), float(b * q), float(b * s)] for b, q, s in points]
    if routing is not None:
        miss = 1.0 - routing[0] / routing[1]
        for row, (b, q, _) in zip(rows, points):
            row.append(1.0 - miss ** (b * q))
    return rows


@dataclass(frozen=True, slots=True)
class FittedSteps:
    """The step model fitted to one request's priced steps (seconds), before any anchoring.

    Attributes
    ----------
    target, draft : list of float
        ``fixed_s, per_sequence_s, per_query_token_s, per_context_token_s`` of the target's and the
        draft's step.
    prefill : tuple of float
        ``fixed_s, per_prompt_token_s, load_per_prompt_token_s`` (own prefill and its interference).
    experts_s : float
        An MoE target's time to stream every expert (0 for a dense one).
    errors : dict
        component -> (mean, max) relative error of the fitted form, percent.
    batches : list of int
        Batch sizes priced.
    kv_tokens : int or None
        KV cache tokens AIConfigurator's memory model allows (None where it cannot say).
    points : int
        Target steps priced.
    """

    target: list[float]
    draft: list[float]
    prefill: tuple[float, float, float]
    experts_s: float
    errors: dict[str, tuple[float, float]]
    batches: list[int]
    kv_tokens: int | None
    points: int


def fit_steps(request: DeriveRequest, pricer: Pricer, note: Callable[[str], None]) -> FittedSteps:
    """Price the grids (:mod:`sdplan.derive.request`) and fit each component of the step model."""
    kv_tokens = pricer.kv_cache_tokens()
    batches = batch_sizes(request, kv_tokens)
    longest = max(request.draft_lengths)
    note(f"pricing {len(batches)} batch sizes up to {batches[-1]} (KV cache {kv_tokens or 'unknown'} tokens)")
    points = [(b, q, s) for b in batches for q in range(1, longest + 2) for s in CONTEXT_GRID
              if fits_cache(b, s, kv_tokens)]
    target_values = [pricer.verify(b, q, s) for b, q, s in points]
    target, target_mean, target_max = fit_linear(step_rows(points, pricer.routing), target_values)
    experts = target[4] if pricer.routing is not None else 0.0
    errors = {"target": (target_mean, target_max)}

    draft = [0.0, 0.0, 0.0, 0.0]
    if request.method != "ngram":
        draft_points = [(b, 1, s) for b in batches for s in CONTEXT_GRID if fits_cache(b, s, kv_tokens)]
        if request.method == "mtp":  # one draft token's cost, averaged over the draft lengths priced
            values = [sum(pricer.draft_step(b, s, k) for k in request.draft_lengths) / len(request.draft_lengths)
                      for b, _, s in draft_points]
        else:
            values = [pricer.draft_step(b, s, 1) for b, _, s in draft_points]
        rows = [[1.0, float(b), float(b * s)] for b, _, s in draft_points]
        (d_fixed, d_seq, d_ctx), d_mean, d_max = fit_linear(rows, values)
        draft = [d_fixed, d_seq, 0.0, d_ctx]
        errors["draft"] = (d_mean, d_max)

    prompts = [p for p in PROMPT_GRID if fits_cache(1, p, kv_tokens)]
    (p_fixed, p_tok), p_mean, p_max = fit_linear([[1.0, float(p)] for p in prompts],
                                                 [pricer.prefill(p) for p in prompts])
    errors["prefill"] = (p_mean, p_max)
    mix = [(p, b) for p in (512, 1024, 2048, 4096) for b in INTERFERENCE_BATCHES
           if b in batches and fits_cache(b, p + request.output_tokens, kv_tokens)]
    mix = mix or [(request.prompt_tokens, 1)]
    (load_tok,), l_mean, l_max = fit_linear([[float(p)] for p, _ in mix],
                                            [max(pricer.interference(p, b, p + request.output_tokens), 1e-9)
                                             for p, b in mix])
    errors["interference"] = (l_mean, l_max)
    return FittedSteps(target=target[:4], draft=draft, prefill=(p_fixed, p_tok, load_tok), experts_s=experts,
                       errors=errors, batches=batches, kv_tokens=kv_tokens, points=len(points))
