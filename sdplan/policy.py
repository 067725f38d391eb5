"""The goodput-adaptive draft-length policy (SmartSpec-style) under the load model.

SmartSpec (Liu et al., arXiv:2406.14066; ``model.md`` §3) picks, at every
engine step, the draft length ``k`` (0 = SD off) that maximises goodput, the
tokens committed per second of the batch::

    goodput(k; B) = B * E(k) / tau(B, k),   tau(B, k) = (c1v + k c1d) + B (c2v + k c2d)

(``tau`` is the plain decode step for ``k = 0`` and ``E(0) = 1``). At a fixed
batch ``B`` this is the ``k`` minimising a request's decode time
``g * tau(B, k) / E(k)``, i.e. minimising ``C1_k + B C2_k`` (the prefill
terms do not depend on ``k``). Under load the batch follows Little's law,
``B = lambda L``, so the policy's mean latency is the smallest fixed point of

    L = h(lambda L),   h(B) = min_k (C1_k + B C2_k).

:func:`goodput_latency` finds it by monotone iteration from ``h(0)`` (the
iterates rise to the smallest fixed point), jumping to the fixed point of the
current best segment as soon as that point is itself consistent. Because
``h`` is the lower envelope of lines, that fixed point equals
``min_k C1_k/(1 - lambda C2_k)``: in the mean-value model, adapting ``k`` per
step reaches exactly the best static ``k`` of each rate. Its gains are over a
single ``k`` kept across loads, and from batch-size fluctuations around the
mean (which a mean model cannot show).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

#: Relative tolerance of the fixed point.
TOLERANCE = 1e-12
#: Plain iterations allowed before the solver gives up on a point (never reached in practice:
#: the segment jump ends the search once the best segment is found).
MAX_ITERATIONS = 10_000


def goodput_choice(c1: FloatArray, c2: FloatArray, batch: FloatArray) -> IntArray:
    """Index of the option (column 0 = SD off) with the highest goodput at batch ``B``.

    ``c1``, ``c2``: shape (..., options); ``batch``: shape (...). Ties go to the
    lower index (SD off, then the shorter draft).
    """
    import numpy as np

    return np.argmin(c1 + np.asarray(batch)[..., None] * c2, axis=-1)


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
    """
    import numpy as np

    c1 = np.asarray(c1, dtype=np.float64)[:, None, :]  # (a, 1, o)
    c2 = np.asarray(c2, dtype=np.float64)[:, None, :]
    lam = np.asarray(rates_rps, dtype=np.float64)[None, :, None]  # (1, r, 1)
    shape = np.broadcast_shapes(c1.shape, lam.shape)[:2]
    unstable = np.all(lam * c2 >= 1.0, axis=-1) & np.ones(shape, dtype=bool)

    def h(latency: FloatArray) -> FloatArray:
        return np.min(c1 + lam * latency[..., None] * c2, axis=-1)

    latency = np.where(unstable, np.inf, np.min(c1, axis=-1) * np.ones(shape))  # h(0)
    done = unstable.copy()
    iterations = 0
    while not np.all(done) and iterations < MAX_ITERATIONS:
        iterations += 1
        option = np.argmin(c1 + lam * np.where(done, 0.0, latency)[..., None] * c2, axis=-1)
        seg_c1 = np.take_along_axis(np.broadcast_to(c1, (*shape, c1.shape[-1])), option[..., None], axis=-1)[..., 0]
        seg_c2 = np.take_along_axis(np.broadcast_to(c2, (*shape, c2.shape[-1])), option[..., None], axis=-1)[..., 0]
        rho = lam[..., 0] * seg_c2
        with np.errstate(divide="ignore", invalid="ignore"):
            jump = np.where(rho < 1.0, seg_c1 / (1.0 - rho), np.inf)
        # The jump is the answer iff it is consistent: h(lambda jump) >= jump (otherwise it overshoots).
        consistent = np.isfinite(jump) & (h(np.where(np.isfinite(jump), jump, 0.0)) >= jump * (1.0 - TOLERANCE))
        step = h(np.where(done, 0.0, latency))
        new = np.where(consistent, jump, step)
        converged = consistent | (np.abs(new - latency) <= TOLERANCE * np.abs(new))
        latency = np.where(done, latency, new)
        done = done | converged
    latency = np.where(done, latency, np.inf)
    batch = np.where(np.isfinite(latency), lam[..., 0] * latency, np.inf)
    option = goodput_choice(np.broadcast_to(c1, (*shape, c1.shape[-1])), np.broadcast_to(c2, (*shape, c2.shape[-1])),
                            np.where(np.isfinite(batch), batch, 0.0))
    return PolicyResult(latency_s=latency, option=option, batch=batch, iterations=iterations)
