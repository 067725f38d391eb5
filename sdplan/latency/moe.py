"""Mixture-of-experts targets: expert coverage makes the latency model a fixed point.

Each routed token picks ``m`` of ``M`` experts per MoE layer. Under uniform
routing the expected fraction of experts a forward pass touches is
(Kong et al. eq. 4; ``docs/model.md#mixture-of-experts``)::

    phi(T) = 1 - (1 - m/M)**T,

with ``T`` the tokens routed in that forward: ``B`` for a plain decode step,
``B (k + 1)`` for a verification step, ``p`` for a prefill, where ``B`` is
the number of sequences in the step. With ``B = lambda L`` counting the
*other* requests in flight (``docs/model.md#per-step-form``; the request's own cost is
in ``C1``), a tagged request's step holds ``1 + lambda L`` sequences, so a
step routes ``t (1 + lambda L)`` tokens (``t = 1`` for plain decode, ``k + 1``
for verification); at zero load that is the request's own ``t``. Each target
coefficient splits into a low-coverage part (the calibration's
coefficients) and a coverage increment (``[moe.coverage]``) weighted by
``phi`` (eq. 4)::

    C1(B) = C1_u + phi(T(B)) C1_s,   C2(B) = C2_u + phi(T(B)) C2_s,

and since ``B = lambda L`` the mean latency solves
``L = F(L) = C1(lambda L) / (1 - lambda C2(lambda L))``. ``F`` increases
with ``L``, so iterating from ``L = 0`` rises monotonically to the smallest
fixed point, the stable operating point (``docs/model.md#mixture-of-experts``); a denominator
reaching zero, or no convergence within the iteration budget, is reported as
unstable. The draft model is taken as dense (no coverage split).

Utilisation. For a dense target ``rho = lambda C2 = 1 - C1/L``: the share of
the latency caused by the other requests. With coverage ``C1`` itself rises
with the load, so ``lambda C2(B)`` understates how loaded the replica is (a
point can read 0.84 with a batch of a thousand). The solver reports the
dense-equivalent utilisation ``rho = 1 - L(0)/L(lambda)``, with
``L(0) = a1 + b1 phi(t)`` the zero-load latency: ``L = L(0)/(1 - rho)`` as in
the dense model, and ``rho -> 1`` as the fixed point runs away.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from sdplan.latency import model
from sdplan.latency.knee import prefill_wait_s

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.latency.coefficients import Coefficients

    FloatArray = npt.NDArray[np.float64]

#: Relative change between iterates below which a point has converged.
TOLERANCE = 1e-10
#: Iterations before a point that is still rising is declared unstable.
MAX_ITERATIONS = 20_000
#: Coefficients that may carry a coverage increment (target terms only).
COVERAGE_KEYS = ("c1p_s", "c2p_s", "baseline_c1_step_s", "baseline_c2_step_s", "c1v_s", "c2v_s")


@dataclass(frozen=True, slots=True)
class MoESpec:
    """Routing of the target and the coverage increments (seconds at phi = 1)."""

    experts_per_token: int
    experts: int
    coverage: dict[str, float]

    def phi(self, tokens: FloatArray | float) -> FloatArray:
        """Expected fraction of experts touched by ``tokens`` routed tokens."""
        miss = 1.0 - self.experts_per_token / self.experts
        return 1.0 - np.power(miss, np.maximum(np.asarray(tokens, dtype=np.float64), 0.0))


@dataclass(frozen=True, slots=True)
class FixedPoint:
    """Solution of ``L = F(L)`` per point: latency (s; inf if unstable), batch, utilisation.

    ``utilisation`` is the dense-equivalent ``1 - L(0)/L`` (see the module
    notes); ``zero_load_latency_s`` is ``L(0) = a1 + b1 phi(t)``.
    """

    latency_s: FloatArray
    batch: FloatArray
    utilisation: FloatArray
    iterations: int
    max_residual: float
    zero_load_latency_s: FloatArray


def routed_tokens(tokens_per_sequence: FloatArray | float, others: FloatArray | float) -> FloatArray:
    """Tokens routed by the step a tagged request is in: ``t (1 + B)`` with ``B`` the others in flight."""
    return np.asarray(tokens_per_sequence, dtype=np.float64) * (1.0 + np.asarray(others, dtype=np.float64))


#: Step coefficients whose coverage follows the tokens a decode or verification step routes.
STEP_KEYS = ("baseline_c1_step_s", "baseline_c2_step_s", "c1v_s", "c2v_s")
#: Prefill coefficients, whose coverage follows the prompt's tokens.
PREFILL_KEYS = ("c1p_s", "c2p_s")


def at_coverage(coefficients: Coefficients, moe: MoESpec, step_coverage: float) -> Coefficients:
    """Target coefficients at a step's expert coverage: each step term ``c_u + phi c_s``, the prefill at ``phi(p)``.

    Parameters
    ----------
    coefficients : Coefficients
        The low-coverage coefficients at the workload (the calibration's).
    moe : MoESpec
        Routing and the coverage increments ``c_s`` at the same workload.
    step_coverage : float
        ``phi`` of the decode or verification steps, in [0, 1]: ``phi(t (1 + B))``
        (:func:`routed_tokens`) at the load of interest.

    Returns
    -------
    Coefficients
        ``c = c_u + phi c_s`` for the step terms (:data:`STEP_KEYS`),
        ``c = c_u + phi(p) c_s`` for the prefill terms (:data:`PREFILL_KEYS`,
        a prefill routes its ``p`` prompt tokens); the draft's terms unchanged
        (dense). Eq. 4 of Kong et al., as in the module notes.

    Notes
    -----
    The demands ``C1``, ``C2`` (:mod:`sdplan.latency.model`) are linear in the
    coefficients, so ``C(phi) = C(at_coverage(., 0)) + phi [C(at_coverage(., 1))
    - C(at_coverage(., 0))]``: the ``a + phi b`` split :func:`solve` takes.
    """

    prefill = float(moe.phi(coefficients.prompt_tokens))
    changes = {key: getattr(coefficients, key) + step_coverage * moe.coverage.get(key, 0.0) for key in STEP_KEYS}
    changes.update({key: getattr(coefficients, key) + prefill * moe.coverage.get(key, 0.0) for key in PREFILL_KEYS})
    return replace(coefficients, **changes)


def prefill_queue(coefficients: Coefficients, moe: MoESpec) -> tuple[float, float]:
    """``(c2p, cv)`` of an open loop's prefill queue (:func:`sdplan.latency.knee.prefill_wait_s`): the prefill at
    the experts its prompt covers, ``phi(p)`` (:func:`at_coverage`; the same at any step coverage)."""
    return float(at_coverage(coefficients, moe, 0.0).c2p_s), float(coefficients.prompt_cv)


def time_to_first_token(coefficients: Coefficients, moe: MoESpec, k: FloatArray | int = 0,
                        others: FloatArray | float = 0.0,
                        tokens_per_cycle: FloatArray | float | None = None,
                        rate_rps: FloatArray | float = 0.0) -> FloatArray:
    """Mean time to first token (s) of a MoE target with ``others`` requests in flight (and an open loop's
    prefill queue at ``rate_rps``).

    :func:`sdplan.latency.model.time_to_first_token` at the coverage of the step the request's prefill joins,
    ``phi(t (1 + B))`` with ``t = k + 1`` (:func:`routed_tokens`), the prefill at ``phi(p)``
    (:func:`at_coverage`). TTFT is linear in the coefficients, so
    ``TTFT(phi) = TTFT(at_coverage(., 0)) + phi [TTFT(at_coverage(., 1)) - TTFT(at_coverage(., 0))]``,
    evaluated per point; ``others`` of ``inf`` (unstable) gives ``inf``.
    """
    load = np.asarray(others, dtype=np.float64)
    low = model.time_to_first_token(at_coverage(coefficients, moe, 0.0), k, load, tokens_per_cycle, rate_rps)
    full = model.time_to_first_token(at_coverage(coefficients, moe, 1.0), k, load, tokens_per_cycle, rate_rps)
    phi = moe.phi(routed_tokens(np.asarray(k, dtype=np.float64) + 1.0, np.where(np.isinf(load), 0.0, load)))
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(full), np.inf, low + phi * (full - low))


def solve(a1: FloatArray | float, b1: FloatArray | float, a2: FloatArray | float, b2: FloatArray | float,
          tokens_per_sequence: FloatArray | float, rates_rps: FloatArray | float, moe: MoESpec,
          prefill_s: float = 0.0, prefill_cv: float = 0.0) -> FixedPoint:
    """Smallest fixed point of ``L = (a1 + b1 phi + W) / (1 - lambda (a2 + b2 phi))``, ``phi = phi(t (1 + lambda L))``.

    All arguments broadcast together; ``t`` is the tokens each sequence routes
    per forward (1 for plain decode, ``k + 1`` for verification). ``W`` is the wait for the prefills queued
    ahead at the rate, of a prefill of ``prefill_s`` (``c2p``; :func:`sdplan.latency.knee.prefill_wait_s`).
    """
    wait = prefill_wait_s(prefill_s, prefill_cv, rates_rps)
    a1, b1, a2, b2, t, lam, wait = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in
                                                         (a1, b1, a2, b2, tokens_per_sequence, rates_rps, wait)))
    shape = a1.shape
    a1, b1, a2, b2, t, lam, wait = (x.ravel() for x in (a1, b1, a2, b2, t, lam, wait))
    waited = a1 + wait  # what a request pays alone, and the wait for the prefills queued ahead
    latency = np.zeros(a1.size)
    unstable = np.zeros(a1.size, dtype=bool)
    active = np.arange(a1.size)
    iterations = 0
    while active.size and iterations < MAX_ITERATIONS:
        iterations += 1
        phi = moe.phi(routed_tokens(t[active], lam[active] * latency[active]))
        denominator = 1.0 - lam[active] * (a2[active] + b2[active] * phi)
        blown = (denominator <= 0.0) | ~np.isfinite(waited[active])  # saturated, or its prefill queue is
        new = np.where(blown, np.inf, (waited[active] + b1[active] * phi) / np.where(blown, 1.0, denominator))
        converged = ~blown & (np.abs(new - latency[active]) <= TOLERANCE * new)
        unstable[active[blown]] = True
        latency[active] = new
        active = active[~blown & ~converged]
    unstable[active] = True  # still rising after the budget: no stable operating point found
    latency = np.where(unstable, np.inf, latency)
    batch = np.where(unstable, np.inf, lam * latency)
    phi = moe.phi(routed_tokens(t, np.where(unstable, 0.0, batch)))
    zero_load = a1 + b1 * moe.phi(t)
    with np.errstate(divide="ignore", invalid="ignore"):
        equivalent = np.where(unstable, 1.0, 1.0 - (zero_load + wait) / np.where(unstable, 1.0, latency))
    utilisation = np.where(unstable, np.maximum(lam * (a2 + b2), 1.0), np.clip(equivalent, 0.0, None))
    finite = ~unstable
    residual = 0.0
    if finite.any():
        p, lf = phi[finite], latency[finite]
        fixed = (waited[finite] + b1[finite] * p) / (1.0 - lam[finite] * (a2[finite] + b2[finite] * p))
        residual = float(np.max(np.abs(fixed - lf) / lf))
    return FixedPoint(latency_s=latency.reshape(shape), batch=batch.reshape(shape),
                      utilisation=utilisation.reshape(shape), iterations=iterations, max_residual=residual,
                      zero_load_latency_s=zero_load.reshape(shape))
