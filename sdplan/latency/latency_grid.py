"""The latency model solved at every point of the plan's (acceptance x rate x draft length) grid.

A dense target has the closed form ``L = C1/(1 - lambda C2)`` with closed-form
break-even rates (:func:`dense_grid`), or, with a knee, a concave law or a prefill
queue's wait (every file that prices a prefill), the demands that hold at each rate
(:func:`knee_grid`). A mixture of experts has ``C1`` and
``C2`` that depend on the experts the batch covers, so its latency is the fixed
point of :func:`sdplan.latency.moe.solve` and its break-even rates are found on the
solved curves (:func:`moe_grid`). Either way the result is a :class:`SolvedGrid`,
from which :func:`sdplan.planning.planner.plan` assembles the :class:`~sdplan.planning.planner.Plan`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from sdplan.latency import knee, model
from sdplan.latency import moe as moe_model

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.latency.coefficients import Coefficients
    from sdplan.latency.moe import MoESpec

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

#: Speedup differences below this are the MoE fixed-point solver's round-off, reported as 0.
SPEEDUP_RESOLUTION = 1e-6
#: Rates per option on which the MoE break-even is bracketed before bisection.
MOE_GRID_RATES = 256
#: Break-even crossings kept per MoE option (the speedup can cross 1 at several rates).
MOE_CROSSINGS = 4


@dataclass(frozen=True, slots=True)
class MoEResult:
    """What only a mixture-of-experts grid has (see the :class:`sdplan.planning.planner.Plan` fields of the same
    names)."""

    speedup_lost: FloatArray
    max_residual: float
    break_even_rates_rps: FloatArray


@dataclass(frozen=True, slots=True)
class SolvedGrid:
    """The model on the grid: no SD per rate ``(r,)``, SD per option ``(a, k)`` and point ``(a, r, k)``.

    ``base_cap_rate`` and ``cap_rate`` (a, k): the rate at which each option's batch reaches its engine cap
    (:func:`with_batch_caps`); inf / None where no cap was applied.
    """

    c1_d: float
    c2_d: float
    base_latency: FloatArray
    base_batch: FloatArray
    base_utilisation: FloatArray
    c1: FloatArray
    c2: FloatArray
    latency: FloatArray
    batch: FloatArray
    rho: FloatArray
    even: model.BreakEven
    moe: MoEResult | None = None
    base_cap_rate: float = math.inf
    cap_rate: FloatArray | None = None


def dense_grid(coefficients: Coefficients, rates: FloatArray, ks: IntArray, tokens: FloatArray) -> SolvedGrid:
    """``L = C1/(1 - lambda C2)`` per point of a dense target, with the closed-form break-even rates."""
    if knee.has_bend(coefficients):
        return knee_grid(coefficients, rates, ks, tokens)
    c1_d, c2_d = model.baseline_demand(coefficients)
    c1, c2 = model.demand_from_tokens(coefficients, tokens, ks[None, :].astype(float))  # (a, k)
    lam = rates[None, :, None]  # (1, r, 1)
    base_latency = model.mean_latency(c1_d, c2_d, rates)
    latency = model.mean_latency(c1[:, None, :], c2[:, None, :], lam)  # (a, r, k)
    return SolvedGrid(c1_d=float(c1_d), c2_d=float(c2_d), base_latency=base_latency,
                      base_batch=model.effective_batch(rates, base_latency),
                      base_utilisation=model.utilisation(c2_d, rates), c1=c1, c2=c2, latency=latency,
                      batch=model.effective_batch(lam, latency), rho=model.utilisation(c2[:, None, :], lam),
                      even=model.break_even(c1_d, c2_d, c1, c2))


def knee_grid(coefficients: Coefficients, rates: FloatArray, ks: IntArray, tokens: FloatArray) -> SolvedGrid:
    """A dense target whose step has a compute-bound knee (:mod:`sdplan.latency.knee`): two pieces per option;
    or whose load law is concave (the same module; the demands that hold at a rate are the secant there); and
    an open loop's wait for the prefills queued ahead, added to ``C1`` at each rate.

    The latency at each point is ``C1/(1 - lambda C2)`` with the demands that hold at that rate, the
    utilisation ``lambda C2`` with the same demands, and the break-even found piece by piece
    (:func:`sdplan.latency.knee.break_even`). ``c1``/``c1_d`` are the zero-load demands, ``c2``/``c2_d`` the
    demands past the knee: the ones that set the saturation rate ``1/C2``.
    """
    k_ak = ks[None, :].astype(np.float64)
    c1_d, c2_d = model.baseline_demand(coefficients)
    c1, c2 = model.demand_from_tokens(coefficients, tokens, k_ak)  # (a, k)
    knee_d = model.baseline_knee(coefficients, c1_d, c2_d)
    knee_sd = model.speculative_knee(coefficients, c1, c2, tokens, k_ak)
    lam = rates[None, :, None]  # (1, r, 1)
    per_point = knee.take(knee_sd, (slice(None), None, slice(None)))
    base_c1, base_c2 = knee.demands_at(c1_d, c2_d, knee_d, rates)
    point_c1, point_c2 = knee.demands_at(c1[:, None, :], c2[:, None, :], per_point, lam)
    base_latency = model.mean_latency(base_c1, base_c2, rates)
    latency = model.mean_latency(point_c1, point_c2, lam)  # (a, r, k)
    rate, faster_below = knee.break_even(float(c1_d), float(c2_d), knee_d, c1, c2, knee_sd)
    return SolvedGrid(c1_d=float(c1_d), c2_d=float(knee_d.c2_above_s), base_latency=base_latency,
                      base_batch=model.effective_batch(rates, base_latency),
                      base_utilisation=model.utilisation(base_c2, rates), c1=c1, c2=knee_sd.c2_above_s,
                      latency=latency, batch=model.effective_batch(lam, latency),
                      rho=model.utilisation(point_c2, lam),
                      even=model.BreakEven(rate_rps=rate, sd_faster_below=faster_below))


def dense_cap_rates(coefficients: Coefficients, ks: IntArray, tokens: FloatArray,
                    caps: Sequence[float]) -> tuple[float, FloatArray]:
    """``(no SD, SD (a, k))`` rates at which a dense target's batch ``lambda L`` reaches each option's cap ``N``.

    ``lambda_N = N / (C1_N + W(lambda_N) + N C2_N)`` (:func:`sdplan.latency.knee.batch_cap_rate`) with the
    demands that hold at a batch of ``N``: past the compute-bound knee where ``N`` is, and the prefill queue's
    wait at that rate. inf for an infinite cap.
    """
    caps_array = np.asarray(caps, dtype=np.float64)
    c1_d, c2_d = model.baseline_demand(coefficients)
    knee_d = model.baseline_knee(coefficients, c1_d, c2_d)
    base_cap = float(caps_array[0])
    base_rate = float(knee.batch_cap_rate(c1_d, c2_d, knee_d, base_cap)) if math.isfinite(base_cap) else math.inf
    k_ak = ks[None, :].astype(np.float64)
    c1, c2 = model.demand_from_tokens(coefficients, tokens, k_ak)
    knee_sd = model.speculative_knee(coefficients, c1, c2, tokens, k_ak)
    sd_caps = np.broadcast_to(caps_array[1:][None, :], c1.shape)
    with np.errstate(invalid="ignore"):  # an infinite cap has no cap rate
        sd_rate = np.where(np.isfinite(sd_caps), knee.batch_cap_rate(
            c1, c2, knee_sd, np.where(np.isfinite(sd_caps), sd_caps, 1.0)), np.inf)
    return base_rate, sd_rate


def moe_cap_rates(coefficients: Coefficients, ks: IntArray, tokens: FloatArray, caps: Sequence[float],
                  moe: MoESpec) -> tuple[float, FloatArray]:
    """``(no SD, SD (a, k))`` rates at which an MoE target's batch ``lambda L`` reaches each option's cap ``N``.

    The fixed point of :func:`sdplan.latency.moe.solve` with ``B = lambda L = N`` is
    ``L_N = a1 + b1 phi_N + N (a2 + b2 phi_N)``, ``phi_N = phi(t (1 + N))`` (``t`` = 1 without SD, ``k + 1``
    with it), so ``lambda_N = N / (L_N + W(lambda_N))``: the batch-cap rate of the dense case with the demands at
    the experts a batch of ``N`` covers (:func:`sdplan.latency.knee.waited_cap_rate`). inf for an infinite cap.
    """
    caps_array = np.asarray(caps, dtype=np.float64)
    (base_a1, base_b1, base_a2, base_b2), (a1, b1, a2, b2) = moe_demands(coefficients, ks, tokens, moe)
    queue = moe_model.prefill_queue(coefficients, moe)
    base_cap = float(caps_array[0])
    base_rate = math.inf
    if math.isfinite(base_cap):
        phi = float(moe.phi(moe_model.routed_tokens(1.0, base_cap)))
        base_rate = float(knee.waited_cap_rate(base_a1 + base_b1 * phi, base_a2 + base_b2 * phi, base_cap, *queue))
    sd_caps = np.broadcast_to(caps_array[1:][None, :], a1.shape)
    held = np.where(np.isfinite(sd_caps), sd_caps, 1.0)
    phi_sd = moe.phi(moe_model.routed_tokens(ks[None, :].astype(np.float64) + 1.0, held))
    sd_rate = np.where(np.isfinite(sd_caps), knee.waited_cap_rate(a1 + b1 * phi_sd, a2 + b2 * phi_sd, held, *queue),
                       np.inf)
    return base_rate, sd_rate


def with_batch_caps(solved: SolvedGrid, coefficients: Coefficients, rates: FloatArray, ks: IntArray,
                    tokens: FloatArray, caps: Sequence[float], moe: MoESpec | None = None) -> SolvedGrid:
    """The grid with each option's engine cap as a throughput bound (``docs/model.md#saturation-and-batch-cap``).

    ``caps`` are the requests each option's engine holds at once, no SD first then ``ks`` (``max_num_seqs``,
    or what its KV cache holds; inf for none). An option's batch reaches its cap ``N`` at ``lambda_N``
    (:func:`dense_cap_rates`; an MoE target's at the experts a batch of ``N`` covers, :func:`moe_cap_rates`).
    From there requests wait for admission and the queue grows without bound once the engine completes no
    more than it admits, which a server held at ``N`` in flight does within ``C2_N / (C1_N + N C2_N)`` of
    ``lambda_N``: the points past it are unstable (the cap rate itself is admitted), and the utilisation is
    ``max(lambda C2, lambda / lambda_N)``.
    """
    base_rate, sd_rate = dense_cap_rates(coefficients, ks, tokens, caps) if moe is None else \
        moe_cap_rates(coefficients, ks, tokens, caps, moe)
    base_cap = float(np.asarray(caps, dtype=np.float64)[0])
    sd_caps = np.broadcast_to(np.asarray(caps, dtype=np.float64)[1:][None, :], sd_rate.shape)
    lam = rates[None, :, None]
    # A cap below one request (a prompt and output longer than the KV cache holds) admits nobody: that
    # option is unstable at every rate, zero included, and its utilisation is infinite rather than 0/0.
    base_full, full = base_cap < 1.0, (sd_caps < 1.0)[:, None, :]
    base_over = (rates > base_rate) | base_full  # at lambda_N the batch is N: admitted
    over = (lam > sd_rate[:, None, :]) | full
    base_latency = np.where(base_over, np.inf, solved.base_latency)
    latency = np.where(over, np.inf, solved.latency)
    with np.errstate(divide="ignore", invalid="ignore"):
        base_rho = np.where(base_full, np.inf, np.maximum(solved.base_utilisation, rates / base_rate))
        rho = np.where(full, np.inf, np.maximum(solved.rho, lam / sd_rate[:, None, :]))
    return replace(
        solved, base_latency=base_latency, base_batch=np.where(base_over, np.inf, solved.base_batch),
        base_utilisation=base_rho, latency=latency, batch=np.where(over, np.inf, solved.batch), rho=rho,
        even=capped_break_even(solved, base_rate, sd_rate), base_cap_rate=base_rate, cap_rate=sd_rate)


def capped_break_even(solved: SolvedGrid, base_rate: float, sd_rate: FloatArray) -> model.BreakEven:
    """The break-even once the caps bound each option: where SD's cap comes first, SD loses from there.

    An option past its cap rate is unstable; where SD wins below its break-even (or everywhere) but its cap
    rate lies below both that break-even and no SD's own limit, no SD is the faster one from SD's cap rate on.
    """
    even = solved.even
    base_limit = min(base_rate, 1.0 / solved.c2_d if solved.c2_d > 0 else math.inf)
    sd_limit = np.minimum(sd_rate, np.where(solved.c2 > 0, 1.0 / np.where(solved.c2 > 0, solved.c2, 1.0), np.inf))
    return model.BreakEven(rate_rps=model.break_even_within_limits(even.rate_rps, even.sd_faster_below, base_limit,
                                                                   sd_limit),
                           sd_faster_below=even.sd_faster_below)


def moe_demands(coefficients: Coefficients, ks: IntArray, tokens: FloatArray,
                moe: MoESpec) -> tuple[tuple[float, float, float, float], tuple[FloatArray, ...]]:
    """``(a1, b1, a2, b2)`` of no SD (floats) and of each SD option ``(a, k)``: ``C1 = a1 + b1 phi``,
    ``C2 = a2 + b2 phi``.

    The demands are linear in the coefficients, so ``C(phi) = C(at phi 0) + phi [C(at phi 1) - C(at phi 0)]``
    (:func:`sdplan.latency.moe.at_coverage`).
    """
    k_ak = ks[None, :].astype(np.float64)
    low, full = moe_model.at_coverage(coefficients, moe, 0.0), moe_model.at_coverage(coefficients, moe, 1.0)
    (c1_low, c2_low), (c1_full, c2_full) = model.baseline_demand(low), model.baseline_demand(full)
    (a1, a2), (f1, f2) = model.demand_from_tokens(low, tokens, k_ak), model.demand_from_tokens(full, tokens, k_ak)
    return (float(c1_low), float(c1_full - c1_low), float(c2_low), float(c2_full - c2_low)), (a1, f1 - a1, a2, f2 - a2)


def moe_grid(coefficients: Coefficients, rates: FloatArray, ks: IntArray, tokens: FloatArray,
             moe: MoESpec) -> SolvedGrid:
    """The MoE fixed point per point (:func:`sdplan.latency.moe.solve`), break-even rates found on the solved curves.

    ``C1`` is the zero-load latency with the coverage of the request's own step, ``C2`` the load-dependent
    demand at full coverage. The speedup lost is against verification that routed only ``B`` tokens.
    """
    k_ak = ks[None, :].astype(np.float64)
    lam = rates[None, :, None]
    base_args, (a1, b1, a2, b2) = moe_demands(coefficients, ks, tokens, moe)
    queue = moe_model.prefill_queue(coefficients, moe)
    base = moe_model.solve(*base_args, 1.0, rates, moe, *queue)
    args = (a1[:, None, :], b1[:, None, :], a2[:, None, :], b2[:, None, :])
    solved = moe_model.solve(*args, (k_ak + 1.0)[:, None, :], lam, moe, *queue)
    frozen = moe_model.solve(*args, 1.0, lam, moe, *queue)  # as if verification routed only B tokens
    frozen_speedup = model.speedup(base.latency_s[None, :, None], frozen.latency_s)
    moe_speedup = model.speedup(base.latency_s[None, :, None], solved.latency_s)
    comparable = np.isfinite(frozen_speedup) & np.isfinite(moe_speedup)
    lost = np.where(comparable, frozen_speedup, 0.0) - np.where(comparable, moe_speedup, 0.0)
    # Below the solver's resolution the difference is round-off (values like 4e-13), not a loss.
    lost = np.where(np.abs(lost) < SPEEDUP_RESOLUTION, 0.0, lost)
    even, crossings = _moe_break_even(base_args, (a1, b1, a2, b2), k_ak + 1.0, moe, queue)
    return SolvedGrid(c1_d=float(base_args[0] + base_args[1] * moe.phi(1.0)),
                      c2_d=float(base_args[2] + base_args[3]),
                      base_latency=base.latency_s, base_batch=base.batch, base_utilisation=base.utilisation,
                      c1=a1 + b1 * moe.phi(k_ak + 1.0), c2=a2 + b2, latency=solved.latency_s, batch=solved.batch,
                      rho=solved.utilisation, even=even,
                      moe=MoEResult(speedup_lost=np.where(comparable, lost, np.nan),
                                    max_residual=max(solved.max_residual, base.max_residual),
                                    break_even_rates_rps=crossings))


def _moe_break_even(base_args: tuple[float, float, float, float], sd_args: tuple[FloatArray, ...],
                    tokens_per_sequence: FloatArray, moe: MoESpec,
                    queue: tuple[float, float] = (0.0, 0.0)) -> tuple[model.BreakEven, FloatArray]:
    """Break-even rates of each SD option against no SD on the solved MoE curves.

    With coverage ``C1`` and ``C2`` depend on the load, so the closed form
    ``r* = (C1_R - 1)/(C1_R - C2_R)`` does not hold, and the speedup can cross
    1 more than once (SD slower at zero load, faster in a middle band, slower
    again near saturation). The speedup ``L_D(lambda)/L_SD(lambda)`` is
    evaluated on a grid from zero load to the lower full-coverage saturation
    rate of the pair; every sign change is bracketed and refined by bisection.

    Returns
    -------
    (BreakEven, crossings)
        ``BreakEven`` holds the first crossing and whether SD is faster at zero
        load (without a crossing: whether it wins at every stable rate);
        ``crossings`` has shape ``(..., MOE_CROSSINGS)``, ascending, nan-padded.
    """
    a1, b1, a2, b2 = (np.asarray(x, dtype=np.float64) for x in sd_args)
    shape = a1.shape
    top = 1.0 / np.maximum(np.maximum(a2 + b2, base_args[2] + base_args[3]), 1e-300)  # lower saturation of the pair
    fractions = np.linspace(0.0, 1.0 - 1e-6, MOE_GRID_RATES)

    def log_speedup(rates: FloatArray) -> FloatArray:
        """log(L_D / L_SD) at ``rates`` (shape ``shape + (n,)``); +inf/-inf where one side is unstable."""
        base = moe_model.solve(*base_args, 1.0, rates, moe, *queue).latency_s
        spec = moe_model.solve(a1[..., None], b1[..., None], a2[..., None], b2[..., None],
                               tokens_per_sequence[..., None], rates, moe, *queue).latency_s
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.log(base) - np.log(spec)
        return np.where(np.isnan(value), 0.0, value)

    grid = top[..., None] * fractions
    sign = np.sign(log_speedup(grid))
    faster_at_zero = sign[..., 0] > 0.0
    # A crossing between grid points i-1 and i: the sign differs from the last non-zero sign before i.
    change = (sign[..., 1:] * sign[..., :-1] < 0)
    crossings = np.full(shape + (MOE_CROSSINGS,), np.nan)
    order = np.cumsum(change, axis=-1)
    for j in range(MOE_CROSSINGS):
        hit = change & (order == j + 1)
        exists = hit.any(axis=-1)
        if not exists.any():
            break
        index = np.argmax(hit, axis=-1)
        low = np.take_along_axis(grid, index[..., None], axis=-1)[..., 0]
        high = np.take_along_axis(grid, index[..., None] + 1, axis=-1)[..., 0]
        low_sign = np.take_along_axis(sign, index[..., None], axis=-1)[..., 0]
        for _ in range(40):
            middle = 0.5 * (low + high)
            same = np.sign(log_speedup(middle[..., None])[..., 0]) == low_sign
            low, high = np.where(same, middle, low), np.where(same, high, middle)
        crossings[..., j] = np.where(exists, 0.5 * (low + high), np.nan)
    even = model.BreakEven(rate_rps=crossings[..., 0], sd_faster_below=faster_at_zero.reshape(shape))
    return even, crossings
