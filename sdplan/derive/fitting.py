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

from sdplan.calibration.records import PrefillCost
from sdplan.derive.pricing import Pricer
from sdplan.derive.request import (
    BATCH_GRID,
    CONTEXT_GRID,
    INTERFERENCE_BATCHES,
    INTERFERENCE_PROMPTS,
    PREFILL_GRID,
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


def batch_sizes(request: DeriveRequest, kv_tokens: int | None) -> list[int]:
    """Batch sizes priced: up to max_num_seqs and what the KV cache holds at the reference workload."""
    cap = request.batch_cap
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
    ``phi(T) = 1 - (1 - m/M)^T`` (:mod:`sdplan.latency.moe`), whose coefficient is the
    time to stream every expert: ``[moe.coverage]`` of ``sdplan-calibration(5)``.
    """
    rows = [[1.0, float(b), float(b * q), float(b * s)] for b, q, s in points]
    if routing is not None:
        miss = 1.0 - routing[0] / routing[1]
        for row, (b, q, _) in zip(rows, points):
            row.append(1.0 - miss ** (b * q))
    return rows


def padded(points: list[tuple[int, int, int]], values: list[float]) -> list[float]:
    """Each step's cost at most that of any larger batch priced at the same query tokens and context.

    Notes
    -----
    ``T(B, q, s) <= T(B', q, s)`` for every ``B' > B``: an engine can run ``B`` sequences as a batch of
    ``B'`` padded with idle rows, as vLLM does when it replays the CUDA graph captured for the next batch
    size, so a smaller batch never has to cost more. AIConfigurator's op database breaks this at small
    batches where its GEMM timings are noisy (Llama-3.1-70B FP8 on 4x B200, vLLM 0.24.0 database: a decode
    step at 1,500 tokens of context costs 13.0 ms at batch 1, 11.7 ms at 4, 9.0 ms at 16); each value is
    replaced by the least over its own batch and the larger ones priced, ``T(B) = min_{B' >= B} T(B')``.
    """
    least: dict[tuple[int, int, int], float] = {}
    for (b, q, s), value in sorted(zip(points, values), key=lambda item: -item[0][0]):
        larger = [cost for (b2, q2, s2), cost in least.items() if q2 == q and s2 == s and b2 > b]
        least[(b, q, s)] = min([value, *larger])
    return [least[point] for point in points]


#: Token rows per step tried as the target's knee (:func:`fit_knee`): a step of B sequences of q query
#: tokens has B q rows; the grids price up to 256 x 6.
KNEE_CANDIDATES = (32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 768)
#: A knee is kept only where it lowers the mean relative error of the target's fit by at least this share:
#: a straight line that fits as well needs no second slope.
KNEE_MIN_GAIN = 0.2


@dataclass(frozen=True)
class KneeFit:
    """The target's step fitted with a compute-bound knee (:func:`fit_knee`)."""

    target: list[float]
    knee_tokens: float
    per_token_above_knee_s: float
    mean_error_pct: float
    max_error_pct: float


def fit_knee(points: list[tuple[int, int, int]], values: list[float], floor_s: float = 0.0) -> KneeFit | None:
    """The target's step with a knee: ``T = fixed + B (seq + q tok + s ctx) + b max(0, B q - R)``.

    Notes
    -----
    A step streams the weights once and multiplies its ``B q`` token rows by them: flat while memory
    bound, then ``b`` more per row once the rows keep the matrix units busy longer than the weights take
    to stream (``docs/model.md#compute-bound-knee``). AIConfigurator's GEMM timings show it (Llama-3.1-8B
    on H100, vLLM 0.24 database: the non-attention ops cost 5.7 ms at 1 row, 6.7 ms at 128, 11.2 ms at 512,
    21.6 ms at 1,024 rows, 20 us a row past the knee), and one slope over all rows prices small batches too
    dear and large ones too cheap. For each knee ``R`` of :data:`KNEE_CANDIDATES` within the rows priced,
    the five costs are fitted by :func:`fit_linear`; the knee of least mean relative error is kept if it
    lowers the straight line's by :data:`KNEE_MIN_GAIN` or more, or if the straight line's slope is below
    ``floor_s`` (it cannot hold at large batches). None otherwise.

    Past the knee a row costs at least ``floor_s``, what the matrix units need for it at peak
    (:meth:`~sdplan.derive.pricing.Pricer.row_compute_floor_s`): a fit that weighs the many small batches
    can bend the slope below it. Then the slope is held there, ``tok + b = floor + e`` with ``e >= 0``: the
    rows past the knee are priced at the floor first and the rest fitted,
    ``T - floor max(0, Bq - R) = fixed + B seq + tok min(Bq, R) + B s ctx + e max(0, Bq - R)``.
    """
    straight_rows = step_rows(points)
    straight, straight_mean, _ = fit_linear(straight_rows, values)
    # a straight line whose slope is below the matrix units' floor cannot hold at large batches: take a knee
    needed = straight[2] < floor_s
    most = max(b * q for b, q, _ in points)
    best: KneeFit | None = None
    for knee in KNEE_CANDIDATES:
        if knee >= most:
            break
        rows = [[*row, float(max(b * q - knee, 0))] for row, (b, q, _) in zip(straight_rows, points)]
        coefficients, mean, worst = fit_linear(rows, values)
        if coefficients[2] + coefficients[4] < floor_s:
            coefficients, mean, worst = _fit_at_floor(points, values, knee, floor_s)
        if coefficients[4] > 0.0 and (best is None or mean < best.mean_error_pct):
            best = KneeFit(target=coefficients[:4], knee_tokens=float(knee), per_token_above_knee_s=coefficients[4],
                           mean_error_pct=mean, max_error_pct=worst)
    if best is None or (best.mean_error_pct > (1.0 - KNEE_MIN_GAIN) * straight_mean and not needed):
        return None
    return best


def _fit_at_floor(points: list[tuple[int, int, int]], values: list[float], knee: int,
                  floor_s: float) -> tuple[list[float], float, float]:
    """The knee's fit with the slope past it held at ``floor_s`` or above (:func:`fit_knee`'s notes)."""
    above = [float(max(b * q - knee, 0)) for b, q, _ in points]
    rows = [[1.0, float(b), float(min(b * q, knee)), float(b * s), extra] for (b, q, s), extra in zip(points, above)]
    rest = [max(value - floor_s * extra, 1e-9) for value, extra in zip(values, above)]
    (fixed, seq, tok, ctx, excess), _, _ = fit_linear(rows, rest)
    coefficients = [fixed, seq, tok, ctx, floor_s - tok + excess]
    priced = [fixed + b * seq + b * q * tok + b * s * ctx + coefficients[4] * extra
              for (b, q, s), extra in zip(points, above)]
    errors = [abs(p - v) / v * 100.0 for p, v in zip(priced, values)]
    return coefficients, sum(errors) / len(errors), max(errors)


@dataclass(frozen=True, slots=True)
class FittedSteps:
    """The step model fitted to one request's priced steps (seconds), before any anchoring.

    Attributes
    ----------
    target, draft : list of float
        ``fixed_s, per_sequence_s, per_query_token_s, per_context_token_s`` of the target's and the
        draft's step.
    prefill : PrefillCost
        A prompt's own prefill and what it adds to the decode steps it joins (its interference), each with the
        squared term of its attention over its own prefix (:func:`fit_prefill`).
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
    prompts : list of int
        Prompt lengths whose prefill was priced (:data:`~sdplan.derive.request.PREFILL_GRID`, where the KV
        cache holds one).
    knee : tuple of float
        ``knee_tokens, per_token_above_knee_s`` of the target's step (:func:`fit_knee`); ``(0, 0)``
        where a straight line fits as well, or for an MoE target.
    """

    target: list[float]
    draft: list[float]
    prefill: PrefillCost
    experts_s: float
    errors: dict[str, tuple[float, float]]
    batches: list[int]
    kv_tokens: int | None
    points: int
    prompts: list[int]
    knee: tuple[float, float] = (0.0, 0.0)


def fit_steps(request: DeriveRequest, pricer: Pricer, note: Callable[[str], None]) -> FittedSteps:
    """Price the grids (:mod:`sdplan.derive.request`) and fit each component of the step model."""
    kv_tokens = pricer.kv_cache_tokens()
    batches = batch_sizes(request, kv_tokens)
    longest = max(request.draft_lengths)
    note(f"pricing {len(batches)} batch sizes up to {batches[-1]} (KV cache {kv_tokens or 'unknown'} tokens)")
    points = [(b, q, s) for b in batches for q in range(1, longest + 2) for s in CONTEXT_GRID
              if fits_cache(b, s, kv_tokens)]
    target_values = padded(points, [pricer.verify(b, q, s) for b, q, s in points])
    for (b, q, s), value in zip(points, target_values):
        if not value > 0.0:  # a step of no time is a database the step model cannot be fitted to
            raise ValueError(f"its database prices the target's step of {b} sequences x {q} tokens at {s} tokens "
                             f"of context at {value * 1e3:.3g} ms")
    target, target_mean, target_max = fit_linear(step_rows(points, pricer.routing), target_values)
    experts = target[4] if pricer.routing is not None else 0.0
    errors = {"target": (target_mean, target_max)}
    knee = (0.0, 0.0)
    if pricer.routing is None:
        found = fit_knee(points, target_values, pricer.row_compute_floor_s())
        if found is not None:
            target, knee = found.target, (found.knee_tokens, found.per_token_above_knee_s)
            errors["target_linear"] = errors["target"]
            errors["target"] = (found.mean_error_pct, found.max_error_pct)

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

    prompts = [p for p in PREFILL_GRID if fits_cache(1, p, kv_tokens)]
    prefill = fit_prefill(request, pricer, prompts, batches, kv_tokens, errors)
    return FittedSteps(target=target[:4], draft=draft, prefill=prefill, experts_s=experts, errors=errors,
                       batches=batches, kv_tokens=kv_tokens, points=len(points), prompts=prompts, knee=knee)


def fit_prefill(request: DeriveRequest, pricer: Pricer, prompts: list[int], batches: list[int],
                kv_tokens: int | None, errors: dict[str, tuple[float, float]]) -> PrefillCost:
    """A prompt's own prefill and its interference, fitted with the squared term of its attention.

    Notes
    -----
    A prefill of ``p`` tokens multiplies them by the weights (``p`` rows) and lets each attend to the ones
    before it: ``p (p + 1) / 2`` query-key pairs, FLOPs that grow as ``p^2``. Its own cost is fitted as
    ``fixed + a p + a2 p^2`` over ``prompts``, and what it adds to a decode step of ``b`` sequences
    (AIConfigurator's mixed step less its decode step, :meth:`Pricer.interference`) as ``l p + l2 p^2`` over
    :data:`~sdplan.derive.request.INTERFERENCE_PROMPTS` and :data:`~sdplan.derive.request.INTERFERENCE_BATCHES`,
    each where the KV cache holds it. A straight line in ``p`` was 9.5% off AIConfigurator's prefill of
    Llama-3.1-8B with Llama-3.2-1B on an H100 on average at 128-8,192 tokens and 43% low at 32,768
    (benchmarks/RESULTS-accuracy-silicon-2026-11.md, "a prefill's attention over its prefix"). The mean and
    largest error of each fit go to ``errors`` (``prefill``, ``interference``).
    """
    (fixed, per_token, per_token_sq), p_mean, p_max = fit_linear(
        [[1.0, float(p), float(p) ** 2] for p in prompts], [pricer.prefill(p) for p in prompts])
    errors["prefill"] = (p_mean, p_max)
    mix = [(p, b) for p in INTERFERENCE_PROMPTS for b in INTERFERENCE_BATCHES
           if b in batches and fits_cache(b, p + request.output_tokens, kv_tokens)]
    mix = mix or [(request.prompt_tokens, 1)]
    (load, load_sq), l_mean, l_max = fit_linear(
        [[float(p), float(p) ** 2] for p, _ in mix],
        [max(pricer.interference(p, b, p + request.output_tokens), 1e-9) for p, b in mix])
    errors["interference"] = (l_mean, l_max)
    return PrefillCost(fixed_s=fixed, per_prompt_token_s=per_token, load_per_prompt_token_s=load,
                       per_prompt_token_sq_s=per_token_sq, load_per_prompt_token_sq_s=load_sq)
