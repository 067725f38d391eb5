"""The compute-bound knee of the target's step: ``C1`` and ``C2`` that change once the batch is large.

A decode or verification step of the target streams its weights once (a
cost that does not grow with the rows it multiplies) and multiplies every
token row of the step by them. While the rows are few the step is bound by
memory and each further row costs little; once the rows exceed what the
matrix units finish in the time the weights stream, the step is bound by
compute and each further row costs its FLOPs. Measured and priced steps show
this as a knee (``docs/model.md#compute-bound-knee``): a step of ``T`` token
rows costs its linear step model plus

    knee_per_token_s * max(0, T - knee_tokens).

A tagged request with ``B`` others in flight is in steps of
``T = t (1 + B)`` rows, ``t = 1`` for a plain decode step and ``t = k + 1``
for a verification step, and it runs ``n`` of them (``g - 1`` steps, ``g/E``
cycles). Its latency is ``L = C1 + B C2 + n b max(0, t (1 + B) - R)``, with
``b`` the slope and ``R`` the knee. Past the knee this is again linear in
``B``, with

    C1_above = C1 - n b (R - t),    C2_above = C2 + n b t,

so with Little's law ``B = lambda L`` the latency is ``C1/(1 - lambda C2)``
while the batch stays below the knee batch ``B* = R/t - 1``, and
``C1_above/(1 - lambda C2_above)`` beyond it. The right-hand side is convex
in ``L``, so the smaller fixed point, the stable operating point, is the
first of the two whose batch lies in its own region. A file without a knee
(``knee_per_token_s = 0``) has
``C1_above = C1``, ``C2_above = C2``, and the model is Kong et al.'s.

The other bend is the concave load law of fitted calibrations (``docs/model.md#concave-load``): the first
requests in flight cost more each than later ones,

    L = C1 + C2 h(B),   h(B) = B + psi sqrt(B),

with ``psi`` the calibration's ``load_concavity_sqrt_requests``. Saturation stays at ``1/C2``. With ``u = sqrt(B)`` and
``B = lambda L`` an open loop solves ``(1 - lambda C2) u^2 - lambda C2 psi u - lambda C1 = 0``
(:func:`concave_batch`). Its demands at a batch ``B`` are the secant ``(C1, C2 h(B)/B)``
(:func:`concave_demands`), for which ``C1/(1 - lambda C2_B)`` is the exact latency at the rate whose batch
is ``B``: so every function here that takes "the demands that hold" serves both bends. A calibration has
one or the other, never both (:mod:`sdplan.calibration.checks`).

An open loop also queues prefills (``docs/model.md#prefills-queued-ahead``). Processor sharing charges a request
for the prefills that arrive during its life (``B c2p``), not for those already queued ahead of it when it
arrives, which the engine runs first. Poisson arrivals find the mean M/G/1 wait of that queue,

    W = lambda E[S^2] / (2 (1 - lambda E[S])),   E[S] = c2p,   E[S^2] = c2p^2 (1 + cv^2),

with ``cv`` the prompts' coefficient of variation (:func:`prefill_wait_s`). The wait delays the first token
and lengthens the request's life, in which more prefills arrive and stall its decode, so ``L = (C1 + W)/(1 -
lambda C2)``: the demands that hold at a rate carry ``C1 + W`` (:func:`demands_at`). ``W`` is the same for
every option at one rate and vanishes at zero load; the saturation ``1/C2`` does not move (``c2p <= C2``).
A closed loop has no Poisson arrivals and no such term.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import EllipsisType

    import numpy.typing as npt

    from sdplan.latency.coefficients import Coefficients

    FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class KneeDemands:
    """The demands past the knee and the batch where they take over, per option (broadcast shapes).

    Attributes
    ----------
    c1_above_s, c2_above_s : ndarray
        ``C1 - n b (R - t)`` and ``C2 + n b t`` (s): the demands once the step is bound by compute. With a
        concave load law, ``C1`` and ``C2`` themselves (``C2`` is its asymptote).
    knee_batch : ndarray
        Others in flight at the knee, ``R/t - 1`` (requests; inf without a knee).
    concavity : float
        ``psi`` of the concave load law (module notes); 0: none.
    prefill_s : array_like
        ``c2p``, the step time one request's prefill takes (s): the service time of the queue of prefills whose
        wait an open loop adds (module notes); 0: none.
    prefill_cv : float
        The prompts' coefficient of variation, which sets that service's second moment.
    """

    c1_above_s: FloatArray
    c2_above_s: FloatArray
    knee_batch: FloatArray
    concavity: float = 0.0
    prefill_s: FloatArray | float = 0.0
    prefill_cv: float = 0.0


def has_knee(coefficients: Coefficients) -> bool:
    """Whether the coefficients carry a compute-bound knee (a positive slope past it)."""
    return coefficients.knee_per_token_s > 0.0


def has_bend(coefficients: Coefficients) -> bool:
    """Whether the load law is not Kong et al.'s straight line: a compute-bound knee, a concave law, or prefills
    that queue (module notes; every file that prices a prefill)."""
    return has_knee(coefficients) or coefficients.load_concavity_sqrt_requests > 0.0 or coefficients.c2p_s > 0.0


def rate_dependent(knee: KneeDemands) -> bool:
    """Whether the demands change with the rate in a way no closed form inverts: a concave law or a prefill
    queue's wait. A knee alone has two straight pieces, each with its closed forms."""
    return knee.concavity > 0.0 or bool(np.any(np.asarray(knee.prefill_s) > 0.0))


def prefill_wait_s(prefill_s: FloatArray | float, prefill_cv: float, rate_rps: FloatArray | float) -> FloatArray:
    """Mean wait of an arrival for the prefills queued ahead of it (s): M/G/1, Pollaczek-Khinchine.

    Parameters
    ----------
    prefill_s : array_like
        ``E[S] = c2p``, the step time one prefill takes (s).
    prefill_cv : float
        Coefficient of variation of the prompts: ``E[S^2] = E[S]^2 (1 + cv^2)`` (a prefill linear in the
        prompt; 0 for one prompt length, which gives M/D/1).
    rate_rps : array_like
        Arrival rate (requests/s).

    Returns
    -------
    numpy.ndarray
        ``W = lambda E[S^2] / (2 (1 - lambda E[S]))`` (Kleinrock, *Queueing Systems* vol. 1, eq. 5.72);
        inf where ``lambda E[S] >= 1``. ``docs/model.md#prefills-queued-ahead``.

    Examples
    --------
    >>> float(prefill_wait_s(0.2, 0.0, 2.5))  # rho_p = 0.5: half a prefill
    0.1
    """
    service = np.asarray(prefill_s, dtype=np.float64)
    lam = np.asarray(rate_rps, dtype=np.float64)
    rho = lam * service
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # saturated queues are masked
        wait = lam * service * service * (1.0 + prefill_cv * prefill_cv) / (2.0 * (1.0 - rho))
    return np.where(rho < 1.0, np.where(lam > 0.0, wait, 0.0), np.inf)


def wait_at(knee: KneeDemands, rate_rps: FloatArray | float) -> FloatArray:
    """:func:`prefill_wait_s` of the demands' prefill queue at ``rate_rps``."""
    return prefill_wait_s(knee.prefill_s, knee.prefill_cv, rate_rps)


def concave_batch(c1: FloatArray | float, c2: FloatArray | float, psi: float,
                  rate_rps: FloatArray | float) -> FloatArray:
    """Others in flight at ``rate_rps`` under the concave law: ``B = u^2`` (inf where unstable).

    Notes
    -----
    ``L = C1 + C2 (B + psi sqrt(B))`` and ``B = lambda L`` give, with ``u = sqrt(B)``,
    ``(1 - lambda C2) u^2 - lambda C2 psi u - lambda C1 = 0``, whose positive root is
    ``u = (lambda C2 psi + sqrt((lambda C2 psi)^2 + 4 lambda C1 (1 - lambda C2))) / (2 (1 - lambda C2))``.
    """
    lam = np.asarray(rate_rps, dtype=np.float64)
    c1_arr, c2_arr = np.asarray(c1, dtype=np.float64), np.asarray(c2, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # unstable points are masked
        rest = 1.0 - lam * c2_arr
        linear = lam * c2_arr * psi
        u = (linear + np.sqrt(linear * linear + 4.0 * lam * c1_arr * rest)) / (2.0 * rest)
        return np.where(rest > 0.0, u * u, np.inf)


def concave_demands(c1: FloatArray | float, c2: FloatArray | float, psi: float,
                    batch: FloatArray | float) -> tuple[FloatArray, FloatArray]:
    """The secant demands ``(C1, C2 (1 + psi/sqrt(B)))`` at ``B`` others in flight: ``C1 + B C2_B = C1 + C2 h(B)``.

    ``B = 0`` and ``B = inf`` give ``C2`` (at zero load the slope does not enter; past saturation its limit).
    """
    c1_arr, c2_arr = np.asarray(c1, dtype=np.float64), np.asarray(c2, dtype=np.float64)
    b = np.asarray(batch, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        extra = np.where((b > 0.0) & np.isfinite(b), psi / np.sqrt(np.where(b > 0.0, b, 1.0)), 0.0)
    c1_out, c2_out = np.broadcast_arrays(c1_arr, c2_arr * (1.0 + extra))
    return c1_out.astype(np.float64), c2_out.astype(np.float64)


def knee_demands(coefficients: Coefficients, c1: FloatArray | float, c2: FloatArray | float,
                 steps: FloatArray | float, rows_per_sequence: FloatArray | float) -> KneeDemands:
    """The demands past the knee of an option of ``steps`` steps of ``rows_per_sequence`` rows each.

    Parameters
    ----------
    coefficients : Coefficients
        Holds the knee ``R`` (``knee_tokens``) and the slope ``b`` (``knee_per_token_s``).
    c1, c2 : array_like
        The option's demands below the knee (s): :func:`sdplan.latency.model.baseline_demand` or
        :func:`sdplan.latency.model.demand_from_tokens`.
    steps : array_like
        Target steps per request ``n``: ``g - 1`` without SD, ``g/E`` with it.
    rows_per_sequence : array_like
        Token rows each sequence puts in a step ``t``: 1 without SD, ``k + 1`` with it.

    Returns
    -------
    KneeDemands
        ``C1_above = C1 - n b (R - t)``, ``C2_above = C2 + n b t``, ``B* = R/t - 1`` (module notes).
    """
    c1_arr, c2_arr = np.asarray(c1, dtype=np.float64), np.asarray(c2, dtype=np.float64)
    n = np.asarray(steps, dtype=np.float64)
    t = np.asarray(rows_per_sequence, dtype=np.float64)
    # a prefill is part of C2, so its queue saturates no earlier than the option (a draw of uncertain coefficients
    # may put c2p above C2: its queue is then taken as the option's own)
    prefill, cv = np.minimum(float(coefficients.c2p_s), c2_arr), float(coefficients.prompt_cv)
    if not has_knee(coefficients):
        c1_b, c2_b, _, _ = np.broadcast_arrays(c1_arr, c2_arr, n, t)
        return KneeDemands(c1_above_s=c1_b.astype(np.float64), c2_above_s=c2_b.astype(np.float64),
                           knee_batch=np.full(c1_b.shape, np.inf), concavity=coefficients.load_concavity_sqrt_requests,
                           prefill_s=prefill, prefill_cv=cv)
    knee, slope = float(coefficients.knee_tokens), float(coefficients.knee_per_token_s)
    return KneeDemands(c1_above_s=c1_arr - n * slope * (knee - t), c2_above_s=c2_arr + n * slope * t,
                       knee_batch=np.broadcast_to(knee / t - 1.0, np.broadcast_shapes(c1_arr.shape, n.shape,
                                                                                        t.shape)).copy(),
                       prefill_s=prefill, prefill_cv=cv)


def batch_below_knee(c1: FloatArray | float, c2: FloatArray | float, rate_rps: FloatArray | float) -> FloatArray:
    """Others in flight at ``rate_rps`` with the demands below the knee, ``lambda C1/(1 - lambda C2)``;
    inf where that is unstable (such a point is past the knee too)."""
    lam = np.asarray(rate_rps, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # past saturation is past the knee
        rho = lam * np.asarray(c2, dtype=np.float64)
        return np.where(rho < 1.0, lam * np.asarray(c1, dtype=np.float64) / (1.0 - rho), np.inf)


def past_knee(c1: FloatArray | float, c2: FloatArray | float, knee: KneeDemands,
              rate_rps: FloatArray | float) -> npt.NDArray[np.bool_]:
    """Where the operating point at ``rate_rps`` lies past the knee (its batch below the knee, the prefill queue's
    wait included, is over ``B*``)."""
    waited = np.asarray(c1, dtype=np.float64) + wait_at(knee, rate_rps)
    return np.asarray(batch_below_knee(waited, c2, rate_rps) > knee.knee_batch)


def demands_at(c1: FloatArray | float, c2: FloatArray | float, knee: KneeDemands,
               rate_rps: FloatArray | float) -> tuple[FloatArray, FloatArray]:
    """``(C1 + W, C2)`` that hold at ``rate_rps``: below the knee the option's own, past it the ones above; under
    a concave law the secant at the rate's batch; ``W`` the wait for the prefills queued ahead (module notes)."""
    wait = wait_at(knee, rate_rps)
    if knee.concavity > 0.0:
        c1_at, c2_at = concave_demands(c1, c2, knee.concavity,
                                       concave_batch(np.asarray(c1, dtype=np.float64) + wait, c2, knee.concavity,
                                                     rate_rps))
    else:
        c1_at, c2_at = batch_cap_demands(c1, c2, knee, batch_below_knee(np.asarray(c1, dtype=np.float64) + wait,
                                                                        c2, rate_rps))
    return c1_at + wait, c2_at


def batch_cap_demands(c1: FloatArray | float, c2: FloatArray | float, knee: KneeDemands,
                      max_batch: FloatArray | float) -> tuple[FloatArray, FloatArray]:
    """``(C1, C2)`` that hold when ``max_batch`` requests are in flight (past the knee if it is over ``B*``;
    the secant there under a concave law), without the prefill queue's wait, which depends on the rate
    (:func:`batch_cap_rate`)."""
    if knee.concavity > 0.0:
        return concave_demands(c1, c2, knee.concavity, max_batch)
    past = np.asarray(max_batch > knee.knee_batch)
    return (np.where(past, knee.c1_above_s, np.asarray(c1, dtype=np.float64)),
            np.where(past, knee.c2_above_s, np.asarray(c2, dtype=np.float64)))


def step_excess_s(coefficients: Coefficients, rows: FloatArray | float) -> FloatArray:
    """Seconds a target step of ``rows`` token rows costs beyond its linear step model: ``b max(0, T - R)``."""
    if not has_knee(coefficients):
        return np.zeros(np.shape(rows))
    return coefficients.knee_per_token_s * np.maximum(np.asarray(rows, dtype=np.float64)
                                                      - coefficients.knee_tokens, 0.0)


def batch_cap_rate(c1: FloatArray | float, c2: FloatArray | float, knee: KneeDemands,
                   max_batch: FloatArray | float) -> FloatArray:
    """Rate at which an open loop's mean batch ``lambda L`` reaches ``max_batch`` (requests/s).

    With the demands ``(C1_N, C2_N)`` at that batch (:func:`batch_cap_demands`) it solves
    ``lambda (C1_N + W(lambda)) / (1 - lambda C2_N) = N``: without a prefill queue
    ``lambda_N = N / (C1_N + N C2_N)`` (:func:`sdplan.latency.model.batch_cap_rate`); with one, see
    :func:`waited_cap_rate` (``docs/model.md#saturation-and-batch-cap``).
    """
    cap = np.asarray(max_batch, dtype=np.float64)
    c1_n, c2_n = batch_cap_demands(c1, c2, knee, cap)
    return waited_cap_rate(c1_n, c2_n, cap, knee.prefill_s, knee.prefill_cv)


def straight_cap_rate(c1: FloatArray | float, c2: FloatArray | float, max_batch: FloatArray | float) -> FloatArray:
    """``lambda_N = N / (C1 + N C2)`` (requests/s): where ``lambda C1 / (1 - lambda C2)`` reaches ``N``, the batch
    cap's rate of the straight law without a prefill queue (:func:`sdplan.latency.model.batch_cap_rate`)."""
    cap = np.asarray(max_batch, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(cap / (np.asarray(c1, dtype=np.float64) + cap * np.asarray(c2, dtype=np.float64)),
                          dtype=np.float64)


def waited_cap_rate(c1_n: FloatArray | float, c2_n: FloatArray | float, max_batch: FloatArray | float,
                    prefill_s: FloatArray | float, prefill_cv: float) -> FloatArray:
    """``lambda`` with ``f(lambda) = lambda (C1_N + W(lambda) + N C2_N) - N = 0`` for the demands ``(C1_N, C2_N)``
    at a batch of ``N`` (:func:`batch_cap_rate`; an MoE target's at the experts that batch covers).

    ``f`` rises and is convex (``W`` is), and ``f >= 0`` at ``N / (C1_N + N C2_N)``, the rate without the wait,
    which lies below the prefill queue's saturation (``c2p <= C2_N``). Newton's steps from there descend to the
    root without overshooting it, :data:`NEWTON_STEPS` of them to float precision; with
    ``W' = E[S^2] / (2 (1 - lambda E[S])^2)``.
    """
    cap = np.asarray(max_batch, dtype=np.float64)
    c1_arr, c2_arr = np.asarray(c1_n, dtype=np.float64), np.asarray(c2_n, dtype=np.float64)
    upper = straight_cap_rate(c1_arr, c2_arr, cap)
    service = np.asarray(prefill_s, dtype=np.float64)
    if not np.any(service > 0.0):
        return upper
    finite = np.isfinite(upper)
    rate = np.where(finite, upper, 0.0)
    second = service * service * (1.0 + prefill_cv * prefill_cv)  # E[S^2]
    for _ in range(NEWTON_STEPS):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            wait = prefill_wait_s(service, prefill_cv, rate)
            slope = c1_arr + wait + cap * c2_arr + rate * second / (2.0 * (1.0 - rate * service) ** 2)
            step = (rate * (c1_arr + wait + cap * c2_arr) - cap) / slope
        rate = np.where(np.isfinite(step) & (step > 0.0), rate - step, rate)
    return np.where(finite, rate, upper)


#: Newton's steps of :func:`waited_cap_rate`: quadratic convergence from ``f``'s convex side.
NEWTON_STEPS = 12


def take(knee: KneeDemands, index: int | slice | tuple[slice | EllipsisType | None, ...]) -> KneeDemands:
    """The same demands indexed (e.g. ``(slice(None), None, slice(None))`` to insert a rate axis); a scalar
    ``prefill_s`` is every option's and stays as it is."""
    prefill = knee.prefill_s
    return replace(knee, c1_above_s=np.asarray(knee.c1_above_s)[index], c2_above_s=np.asarray(knee.c2_above_s)[index],
                   knee_batch=np.asarray(knee.knee_batch)[index],
                   prefill_s=np.asarray(prefill)[index] if np.ndim(prefill) else prefill)


def mean_latency(c1: FloatArray | float, c2: FloatArray | float, knee: KneeDemands,
                 rate_rps: FloatArray | float) -> FloatArray:
    """Mean latency (s): ``(C1 + W)/(1 - lambda C2)`` with the demands that hold at the rate (module notes).

    ``inf`` where unstable. Equals :func:`sdplan.latency.model.mean_latency` where the point stays below the knee
    and no prefill queues (``c2p = 0``).
    """
    c1_at, c2_at = demands_at(c1, c2, knee, rate_rps)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # unstable points are masked
        rho = np.asarray(rate_rps, dtype=np.float64) * c2_at
        return np.where(rho < 1.0, c1_at / (1.0 - rho), np.inf)


def break_even(c1_d: float, c2_d: float, knee_d: KneeDemands, c1_sd: FloatArray, c2_sd: FloatArray,
               knee_sd: KneeDemands) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """The lowest rate where SD's latency equals no SD's, with the knee; and whether SD wins below it.

    Notes
    -----
    Each side's latency is ``C1/(1 - lambda C2)`` on one of two pieces (below and past its knee). On a
    pair of pieces the latencies are equal at
    ``lambda* = (C1_SD - C1_D) / (C1_SD C2_D - C1_D C2_SD)`` (Kong et al., App. A.3, with the pieces'
    demands); a candidate counts where it is positive, both sides are stable there, and each side is on
    that piece at ``lambda*``. The lowest such rate is the break-even; ``nan`` where there is none. SD wins
    below it where it is faster at zero load (``C1_SD < C1_D``: at zero load both are below their knees);
    without a crossing, whether it is faster at zero load says whether it is faster at every stable rate.
    """
    c1_sd = np.asarray(c1_sd, dtype=np.float64)
    c2_sd = np.asarray(c2_sd, dtype=np.float64)
    if rate_dependent(knee_d) or rate_dependent(knee_sd):
        return scanned_break_even(c1_d, c2_d, knee_d, c1_sd, c2_sd, knee_sd)
    base_pieces = ((c1_d, c2_d, False), (knee_d.c1_above_s, knee_d.c2_above_s, True))
    sd_pieces = ((c1_sd, c2_sd, False), (knee_sd.c1_above_s, knee_sd.c2_above_s, True))
    first = np.full(np.broadcast_shapes(c1_sd.shape, c2_sd.shape), np.inf)
    for b1, b2, base_past in base_pieces:
        for s1, s2, sd_past in sd_pieces:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                rate = (s1 - b1) / (s1 * b2 - b1 * s2)
            usable = np.isfinite(rate) & (rate > 0.0) & (rate * b2 < 1.0) & (rate * s2 < 1.0)
            rate = np.where(usable, rate, 0.0)
            usable &= (past_knee(c1_d, c2_d, knee_d, rate) == base_past)
            usable &= (past_knee(c1_sd, c2_sd, knee_sd, rate) == sd_past)
            first = np.minimum(first, np.where(usable, rate, np.inf))
    faster_at_zero = (c1_sd < c1_d) | ((c1_sd == c1_d) & (c2_sd < c2_d))
    return np.where(np.isfinite(first), first, np.nan), np.asarray(faster_at_zero)


#: Rates per option on which a concave law's break-even is bracketed before :func:`bisect_boundary`.
BREAK_EVEN_SCAN_RATES = 128
#: Halvings of a bracketed rate: a bracket ends ``2**-48`` of its width wide, under float64's resolution of a rate.
BISECTIONS = 48


def bisect_boundary(holds: Callable[[FloatArray], npt.NDArray[np.bool_]], inside: FloatArray,
                    outside: FloatArray, halvings: int = BISECTIONS) -> tuple[FloatArray, FloatArray]:
    """Narrow brackets of the rate where a condition stops holding, by ``halvings`` halvings (:data:`BISECTIONS`).

    ``holds(rates)`` is evaluated elementwise on arrays of the brackets' shape; it holds at ``inside`` and not at
    ``outside`` (either may be the larger). Returns the narrowed ``(inside, outside)``: ``inside`` still holds.
    The concave load law's break-even and SLO bounds have no closed form, so both are found this way.
    """
    for _ in range(halvings):
        middle = 0.5 * (inside + outside)
        good = holds(middle)
        inside, outside = np.where(good, middle, inside), np.where(good, outside, middle)
    return inside, outside


def with_rate_axis(knee: KneeDemands) -> KneeDemands:
    """The same demands with a last axis of length 1 added, to broadcast against rates (:func:`take`)."""
    return take(knee, (Ellipsis, None))


def scanned_break_even(c1_d: FloatArray | float, c2_d: FloatArray | float, knee_d: KneeDemands,
                       c1_sd: FloatArray, c2_sd: FloatArray,
                       knee_sd: KneeDemands) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """:func:`break_even` where the demands change with the rate (a concave law, a prefill queue's wait), so the
    latencies have no pieces to equate: the first sign change of ``L_SD - L_D`` on
    :data:`BREAK_EVEN_SCAN_RATES` rates below the lower saturation rate, bisected. The no-SD side may be arrays
    that broadcast with SD's (the intervals' draws at once)."""
    c1_d, c2_d = np.asarray(c1_d, dtype=np.float64), np.asarray(c2_d, dtype=np.float64)
    sd, base = with_rate_axis(knee_sd), with_rate_axis(knee_d)
    with np.errstate(divide="ignore"):
        top = np.minimum(1.0 / np.asarray(knee_d.c2_above_s, dtype=np.float64), 1.0 / knee_sd.c2_above_s)

    def difference(rates: FloatArray) -> FloatArray:
        return (mean_latency(c1_sd[..., None], c2_sd[..., None], sd, rates)
                - mean_latency(c1_d[..., None], c2_d[..., None], base, rates))

    rates = top[..., None] * np.linspace(0.0, 1.0, BREAK_EVEN_SCAN_RATES + 1)[1:-1]
    sign = np.sign(difference(rates))
    changed = (sign != sign[..., :1]) & (sign != 0)
    crosses = changed.any(axis=-1)
    first = np.argmax(changed, axis=-1)
    low = np.take_along_axis(rates, np.maximum(first - 1, 0)[..., None], axis=-1)[..., 0]
    high = np.take_along_axis(rates, first[..., None], axis=-1)[..., 0]
    low = np.where(first > 0, low, 0.0)
    start = sign[..., 0]
    low, high = bisect_boundary(lambda middle: np.sign(difference(middle[..., None])[..., 0]) == start, low, high)
    faster_at_zero = (c1_sd < c1_d) | ((c1_sd == c1_d) & (c2_sd < c2_d))
    return np.where(crosses, 0.5 * (low + high), np.nan), np.asarray(faster_at_zero)
