"""The goodput-adaptive draft-length policy (SmartSpec-style) under the load model.

SmartSpec (Liu et al., arXiv:2406.14066;
``docs/model.md#goodput-adaptive-draft-length``) picks, at every engine step,
the draft length ``k`` (0 = SD off) that maximises goodput, the tokens
committed per second of the batch::

    goodput(k; B) = B * E(k) / tau(B, k),   tau(B, k) = (c1v + k c1d) + B (c2v + k c2d)

(``tau`` is the plain decode step for ``k = 0`` and ``E(0) = 1``). At a fixed
batch ``B`` this is the ``k`` minimising a request's decode time
``g * tau(B, k) / E(k)``, i.e. minimising ``C1_k + B C2_k`` (the prefill
terms do not depend on ``k``). Under load the batch follows Little's law,
``B = lambda L``, so the policy's mean latency is the smallest fixed point of

    L = h(lambda L),   h(B) = min_k (C1_k + B C2_k).

:func:`goodput_latency` finds it by following the monotone iteration from
``L = 0`` along the envelope, segment by segment (exact, at most one step per
option). Because
``h`` is the lower envelope of lines, that fixed point equals
``min_k C1_k/(1 - lambda C2_k)``: in the mean-value model, adapting ``k`` per
step reaches exactly the best static ``k`` of each rate. Its gains are over a
single ``k`` kept across loads, and from batch-size fluctuations around the
mean (which a mean model cannot show).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sdplan.latency.model import concave_load

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]


def step_choices(expected_tokens: Sequence[float], step_costs_s: Sequence[tuple[float, float]],
                 largest_batch: int, rows_per_sequence: Sequence[float] | None = None,
                 knee: tuple[float, float] = (0.0, 0.0), concavity: float = 0.0,
                 extra_s: Callable[[int, int], float] | None = None) -> list[int]:
    """The goodput policy's option index for every batch size ``n = 0 .. largest_batch``.

    At a step with ``n`` sequences the policy picks the option with the
    highest goodput (Liu et al., SmartSpec, arXiv:2406.14066)::

        goodput(k; n) = E(k) / (f_k + (n - 1) s_k)

    where ``E(k)`` is the expected tokens per cycle and ``(f_k, s_k)`` the
    step's fixed and per-sequence seconds at draft length ``k``; ties go to
    the lower index. ``n = 0`` is scored as ``n = 1`` (an engine step always
    runs at least one sequence). The choice depends only on ``n`` and the
    fixed coefficients, so a simulator can look it up instead of scoring
    every option at every step; the expression is evaluated exactly as a
    per-step evaluation would, so the decisions are the same. With ``knee``
    ``(R, b)`` and each option's token rows per sequence ``t``, a step also
    pays ``b max(0, n t - R)`` past the target's compute-bound knee
    (:mod:`sdplan.latency.knee`). With ``concavity`` ``psi`` the ``n - 1`` others
    cost ``h(n - 1)`` per-sequence costs (``docs/model.md#concave-load``). ``extra_s(option, n)`` adds what
    else a step of that option costs at ``n`` sequences (an MoE target's experts, :mod:`sdplan.latency.moe`).
    """
    rows = list(rows_per_sequence) if rows_per_sequence is not None else [1.0] * len(expected_tokens)
    knee_tokens, knee_slope = knee
    choices = []
    for batch in range(largest_batch + 1):
        scheduled = max(batch, 1)
        others = concave_load(scheduled - 1, concavity)
        goodput = [e / (fixed + others * per_sequence + knee_slope * max(scheduled * t - knee_tokens, 0.0)
                        + (extra_s(option, scheduled) if extra_s is not None else 0.0))
                   for option, (e, (fixed, per_sequence), t) in enumerate(zip(expected_tokens, step_costs_s, rows))]
        choices.append(goodput.index(max(goodput)))
    return choices


def goodput_choice(c1: FloatArray, c2: FloatArray, batch: FloatArray) -> IntArray:
    """Index of the option (column 0 = SD off) with the highest goodput at batch ``B``.

    ``c1``, ``c2``: shape (..., options); ``batch``: shape (...). Ties go to the
    lower index (SD off, then the shorter draft).
    """
    chosen: IntArray = np.argmin(c1 + np.asarray(batch)[..., None] * c2, axis=-1)
    return chosen


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """Mean latency (s), chosen option index and batch under the goodput policy, shape (a, r)."""

    latency_s: FloatArray
    option: IntArray
    batch: FloatArray
    iterations: int


def goodput_latency(c1: FloatArray, c2: FloatArray, rates_rps: FloatArray) -> PolicyResult:
    """Smallest fixed point of ``L = min_k (C1_k + lambda L C2_k)`` for every (a, rate).

    Parameters
    ----------
    c1, c2 : array_like, shape (a, options)
        Demand per option; column 0 is SD off.
    rates_rps : array_like, shape (r,)

    Returns
    -------
    PolicyResult
        ``inf`` latency where every option is unstable (then ``h(lambda L) > L``
        for all ``L``: no steady state).

    Notes
    -----
    ``f(L) = h(lambda L) - L`` is concave (``h`` is a lower envelope of lines)
    and ``f(0) > 0``, so it has at most one root, the answer, and ``f > 0``
    before it. The iterates ``L <- h(lambda L)`` rise along the envelope; the
    solver follows them exactly, segment by segment, from ``L = 0``: on the
    current lowest line ``i`` the iterates head for that line's own fixed
    point ``C1_i / (1 - lambda C2_i)``. If line ``i`` is still the lowest there,
    that point is the root. Otherwise the iterates reach the breakpoint where a
    flatter line becomes the lowest (``f > 0`` there, so the root lies beyond),
    and the walk continues on that line. The slope falls at every step, so it
    ends within ``options`` steps.
    """
    c1 = np.asarray(c1, dtype=np.float64)[:, None, :]  # (a, 1, o)
    c2 = np.asarray(c2, dtype=np.float64)[:, None, :]
    lam = np.asarray(rates_rps, dtype=np.float64)[None, :, None]  # (1, r, 1)
    shape = np.broadcast_shapes(c1.shape, lam.shape)[:2]
    c1b = np.broadcast_to(c1, (*shape, c1.shape[-1]))
    c2b = np.broadcast_to(c2, (*shape, c2.shape[-1]))
    lam2 = lam[..., 0]

    def pick(array: FloatArray, index: IntArray) -> FloatArray:
        return np.take_along_axis(array, index[..., None], axis=-1)[..., 0]

    # Start on the lowest line at L = 0 (ties: the flatter one, which stays lowest beyond 0).
    order = np.lexsort((c2b, c1b), axis=-1)
    option = order[..., 0]
    position = np.zeros(shape)
    latency = np.full(shape, np.inf)
    done = np.zeros(shape, dtype=bool)
    iterations = 0
    for _ in range(c1.shape[-1] + 1):
        if np.all(done):
            break
        iterations += 1
        seg_c1, seg_c2 = pick(c1b, option), pick(c2b, option)
        rho = lam2 * seg_c2
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # parallel lines and rho = 1 are masked
            jump = np.where(rho < 1.0, seg_c1 / (1.0 - rho), np.inf)
            # breakpoints: where a flatter line j crosses below line i, beyond the current position
            cross = (c1b - seg_c1[..., None]) / (lam * (seg_c2[..., None] - c2b))
        flatter = (c2b < seg_c2[..., None]) & (cross > position[..., None]) & np.isfinite(cross)
        cross = np.where(flatter, cross, np.inf)
        next_option = np.argmin(cross, axis=-1)
        breakpoint = cross.min(axis=-1)
        root_here = np.isfinite(jump) & (jump <= breakpoint)  # line i is still the lowest at its fixed point
        finish = ~done & (root_here | ~np.isfinite(breakpoint))
        latency = np.where(finish & root_here, jump, latency)  # no breakpoint and no root: unstable (inf)
        done = done | finish
        position = np.where(done, position, breakpoint)
        option = np.where(done, option, next_option)
    batch = np.where(np.isfinite(latency), lam2 * latency, np.inf)
    chosen = goodput_choice(c1b, c2b, np.where(np.isfinite(batch), batch, 0.0))
    return PolicyResult(latency_s=latency, option=chosen, batch=batch, iterations=iterations)
