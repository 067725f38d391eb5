"""The load-aware latency model of speculative decoding, vectorised.

Everything here is pure numpy on arrays that broadcast against each other:
arrays in, arrays out, SI units (seconds, requests per second, tokens). No I/O.
The cost coefficients it runs on are :class:`sdplan.latency.coefficients.Coefficients`.

The model (Kong et al., "An Interpretable Latency Model for Speculative
Decoding in LLM Serving", arXiv:2605.15051; derived in
``docs/model.md#latency-law``): mean end-to-end latency is a load-independent
demand plus a demand per concurrent request, ``L = C1 + B*C2``, and the
effective batch follows Little's law ``B = lambda*L``, so

    L(lambda) = C1 / (1 - lambda*C2),    stable while lambda*C2 < 1.

Speculative decoding with draft length ``k`` and per-token acceptance
``alpha`` commits ``E(alpha, k)`` tokens per cycle, so a request of ``g``
output tokens needs ``g/E`` cycles (eq. 3; ``docs/model.md#demand-decomposition``):

    C1 = c1p + (g/E)*(c1v + k*c1d),    C2 = c2p + (g/E)*(c2v + k*c2d).

The baseline without speculation has the same form with its own one-token
decode step costs, but ``g - 1`` decode steps: the prefill emits the first
token (vLLM; ``calibrate`` times prefill with ``max_tokens=1`` and the
simulator runs ``g - 1`` steps after it). With SD the ``g/E`` cycles are
kept: the cycles that produce the remaining ``g - 1`` tokens overshoot by
about one token on average (renewal overshoot), so their mean is close to
``g/E`` (``docs/model.md#cycles``; simulated 4.91 cycles at g=16, alpha=0.8,
k=4 against g/E = 4.76 and (g-1)/E = 4.46).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from sdplan.errors import InvalidValueError
from sdplan.inputs.acceptance import expected_tokens_per_cycle
from sdplan.latency import knee
from sdplan.latency.knee import KneeDemands, knee_demands, step_excess_s

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.latency.coefficients import Coefficients
    from sdplan.latency.moe import MoESpec

    FloatArray = npt.NDArray[np.float64]

#: Utilisation lambda*C2 above which a point is labelled "near saturation".
NEAR_SATURATION_UTILISATION = 0.9


def speculative_demand(
    coeffs: Coefficients, alpha: FloatArray | float, k: FloatArray | int
) -> tuple[FloatArray, FloatArray]:
    """Load-independent and load-dependent demand ``(C1, C2)`` with speculation.

    Parameters
    ----------
    coeffs : Coefficients
        Cost coefficients at the workload.
    alpha : array_like
        Per-token acceptance, in [0, 1].
    k : array_like
        Draft length in tokens; broadcasts with ``alpha``.

    Returns
    -------
    (C1, C2) : tuple of numpy.ndarray
        ``C1`` in seconds, ``C2`` in seconds per concurrent request.

    Notes
    -----
    Kong et al. eq. (3)::

        C1 = c1p + (g/E)(c1v + k c1d),   C2 = c2p + (g/E)(c2v + k c2d),
        E  = (1 - alpha**(k+1)) / (1 - alpha).
    """
    return demand_from_tokens(coeffs, expected_tokens_per_cycle(alpha, k), k)


def demand_from_tokens(
    coeffs: Coefficients, tokens_per_cycle: FloatArray, k: FloatArray | int
) -> tuple[FloatArray, FloatArray]:
    """``(C1, C2)`` of eq. (3) for a given ``E`` (tokens per cycle) rather than an alpha.

    Used for per-position acceptance, where ``E(k) = 1 + sum_{i<=k} r_i``. ``C2`` is no lower than the
    frontend's work for the answer's ``g/E`` streamed chunks (:func:`frontend_floor`).
    """
    cycles = coeffs.output_tokens / tokens_per_cycle
    drafted = drafted_tokens(coeffs, k)
    c1 = coeffs.c1p_s + cycles * (coeffs.c1v_s + drafted * coeffs.c1d_s)
    c2 = coeffs.c2p_s + cycles * (coeffs.c2v_s + drafted * coeffs.c2d_s)
    return c1, frontend_floor(coeffs, c2, tokens_per_cycle)


def drafted_tokens(coeffs: Coefficients, k: FloatArray | float) -> FloatArray:
    """Tokens a sequence drafts per SD cycle of draft length ``k``, on average: ``c k``.

    Parameters
    ----------
    coeffs : Coefficients
        Holds the draft coverage ``c`` (``draft_coverage``), the share of cycles in which the proposer drafts.
    k : array_like
        Draft length (0: no SD, 0 tokens).

    Returns
    -------
    numpy.ndarray
        ``c k``. Each drafted token costs ``c1d`` (``c2d`` per other request), and puts one more token row
        into the verification step, which so has ``1 + c k`` rows per sequence (:func:`verified_rows`).

    Notes
    -----
    vLLM's prompt-lookup proposer (``ngram``) drafts for a sequence only where its last n tokens recur in
    its context; otherwise it proposes nothing and the sequence's verification is a one-token decode (vLLM
    V1's scheduler gives a request ``num_tokens_with_spec`` minus its computed tokens, ``1 +
    len(spec_token_ids)`` in decode, ``vllm/v1/core/sched/scheduler.py``; SpecDecode-Bench's simulator
    prices such a sequence at one verified token and no draft time, ``simulator.py`` ``get_input_len``).
    A proposer that runs a model drafts ``k`` tokens every cycle (``c = 1``). See
    ``docs/model.md#draft-coverage``.
    """
    return coeffs.draft_coverage * np.asarray(k, dtype=np.float64)


def verified_rows(coeffs: Coefficients, k: FloatArray | float) -> FloatArray:
    """Token rows a sequence puts into the target's step, ``1 + c k`` (1 without SD; :func:`drafted_tokens`)."""
    return 1.0 + drafted_tokens(coeffs, k)


def frontend_floor_s(coeffs: Coefficients, tokens_per_cycle: FloatArray | float = 1.0) -> FloatArray | float:
    """The floor of ``C2`` (:func:`frontend_floor`), ``(g/E) frontend_chunk_s`` (s; ``E = 1`` without SD)."""
    return coeffs.output_tokens / tokens_per_cycle * coeffs.frontend_chunk_s


@overload
def frontend_floor(coeffs: Coefficients, c2: float, tokens_per_cycle: float = 1.0) -> float: ...
@overload
def frontend_floor(coeffs: Coefficients, c2: FloatArray, tokens_per_cycle: FloatArray | float = 1.0) -> FloatArray: ...
def frontend_floor(coeffs: Coefficients, c2: Any, tokens_per_cycle: Any = 1.0) -> Any:
    """``C2`` no lower than the serving frontend's work for the answer's streamed chunks.

    ``C2_eff = max(C2, (g/E) frontend_chunk_s)``: one chunk per step that emits tokens (``E = 1`` without
    SD), on each of which vLLM's API server and engine core work beside the steps; where the steps are
    cheap per chunk that work sets the saturation (``docs/model.md#frontend-floor``, with the measurement).
    ``frontend_chunk_s = 0`` returns ``c2`` as it is, a negative draw included; a scalar stays a float.
    """
    if not np.any(coeffs.frontend_chunk_s):
        return c2
    floored = np.maximum(c2, frontend_floor_s(coeffs, tokens_per_cycle))
    return floored if np.ndim(floored) else float(floored)


@dataclass(frozen=True, slots=True)
class OptionDemands:
    """The options a replica can run: "off" (no SD) in column 0, ``draft_lengths[i-1]`` in column i.

    ``draft_lengths`` (n+1,): 0, then the draft lengths; ``tokens_per_cycle`` (..., n+1): 1 for "off", else
    ``E``; ``c1_s, c2_s`` (..., n+1): :func:`baseline_demand` for "off", else :func:`demand_from_tokens`;
    ``knee``: past the compute-bound knee (:func:`sdplan.latency.knee.knee_demands`).
    """

    draft_lengths: npt.NDArray[np.int64]
    tokens_per_cycle: FloatArray
    c1_s: FloatArray
    c2_s: FloatArray
    knee: KneeDemands


def option_lengths(draft_lengths: Sequence[int] | npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``[0, *draft_lengths]``: the draft length of every option, "off" (0) first."""
    return np.concatenate([[0], np.asarray(draft_lengths, dtype=np.int64).reshape(-1)]).astype(np.int64)


def option_demands(coeffs: Coefficients, draft_lengths: Sequence[int] | npt.NDArray[np.int64],
                   tokens_per_cycle: FloatArray) -> OptionDemands:
    """Demand of no SD and of each draft length, "off" in column 0 (:class:`OptionDemands`).

    ``tokens_per_cycle`` is ``E`` per draft length, shape ``(..., n)``; "off" is broadcast along the leading
    axes (e.g. one row per acceptance). Eq. (3) of Kong et al. for SD, ``C1 = c1p + (g/E)(c1v + k c1d)``,
    and ``g - 1`` one-token steps for "off".
    """
    ks = option_lengths(draft_lengths)
    tokens = np.atleast_1d(np.asarray(tokens_per_cycle, dtype=np.float64))
    lead = tokens.shape[:-1]
    c1_sd, c2_sd = demand_from_tokens(coeffs, tokens, ks[1:].astype(np.float64))
    c1_d, c2_d = baseline_demand(coeffs)

    def with_off(off: float, columns: FloatArray) -> FloatArray:
        return np.concatenate([np.full(lead + (1,), off), np.broadcast_to(columns, lead + (ks.size - 1,))], axis=-1)

    c1, c2, per_cycle = with_off(c1_d, c1_sd), with_off(c2_d, c2_sd), with_off(1.0, tokens)
    steps = np.where(ks == 0, baseline_steps(coeffs.output_tokens), coeffs.output_tokens / per_cycle)  # g-1, g/E
    return OptionDemands(draft_lengths=ks, tokens_per_cycle=per_cycle, c1_s=c1, c2_s=c2,
                         knee=knee_demands(coeffs, c1, c2, steps, verified_rows(coeffs, ks.astype(np.float64))))


def baseline_steps(output_tokens: float) -> float:
    """Decode steps of a request without SD, ``g - 1``: the prefill step emits the first token."""
    return max(float(output_tokens) - 1.0, 0.0)


def baseline_demand(coeffs: Coefficients) -> tuple[float, float]:
    """Demand ``(C1_D, C2_D)`` without speculation: ``g - 1`` one-token decode steps after the prefill.

    ``C1_D = c1p + (g-1) c1_step`` and ``C2_D = c2p + (g-1) c2_step``
    (``docs/model.md#demand-decomposition``; the prefill emits the first token), ``C2_D`` no lower than
    the frontend's work for the answer's ``g`` streamed chunks (:func:`frontend_floor`).
    """
    steps = baseline_steps(coeffs.output_tokens)
    return (coeffs.c1p_s + steps * coeffs.baseline_c1_step_s,
            frontend_floor(coeffs, coeffs.c2p_s + steps * coeffs.baseline_c2_step_s))


def baseline_knee(coeffs: Coefficients, c1_d: float, c2_d: float) -> KneeDemands:
    """No SD's demands past the compute-bound knee: ``g - 1`` steps of one token row (:mod:`sdplan.latency.knee`)."""
    return knee_demands(coeffs, c1_d, c2_d, baseline_steps(coeffs.output_tokens), 1.0)


def speculative_knee(coeffs: Coefficients, c1: FloatArray | float, c2: FloatArray | float,
                     tokens_per_cycle: FloatArray | float, k: FloatArray | float) -> KneeDemands:
    """SD's demands past the compute-bound knee: ``g/E`` cycles of ``1 + c k`` token rows
    (:mod:`sdplan.latency.knee`)."""
    return knee_demands(coeffs, c1, c2, coeffs.output_tokens / np.asarray(tokens_per_cycle, dtype=np.float64),
                        verified_rows(coeffs, k))


def utilisation(c2: FloatArray | float, rate_rps: FloatArray | float) -> FloatArray:
    """Utilisation ``rho = lambda*C2`` (dimensionless; the system is stable below 1)."""
    return np.asarray(rate_rps, dtype=np.float64) * np.asarray(c2, dtype=np.float64)


def mean_latency(c1: FloatArray | float, c2: FloatArray | float, rate_rps: FloatArray | float) -> FloatArray:
    """Mean end-to-end latency ``L = C1 / (1 - lambda*C2)`` in seconds.

    Parameters
    ----------
    c1 : array_like
        Load-independent demand in seconds.
    c2 : array_like
        Load-dependent demand in seconds per concurrent request.
    rate_rps : array_like
        Arrival rate in requests per second, >= 0.

    Returns
    -------
    numpy.ndarray
        Latency in seconds; ``inf`` where ``lambda*C2 >= 1`` (unstable: the
        queue grows without bound, there is no steady-state mean).

    Notes
    -----
    From ``L = C1 + B*C2`` and Little's law ``B = lambda*L`` (Kong et al.
    eq. 1; ``docs/model.md#latency-law``). At ``lambda = 0`` this is ``C1``,
    the synchronous latency.

    Examples
    --------
    >>> float(mean_latency(2.0, 0.1, 5.0))
    4.0
    """
    rho = utilisation(c2, rate_rps)
    stable = rho < 1.0
    with np.errstate(divide="ignore", invalid="ignore"):  # unstable points are masked below
        latency = np.asarray(c1, dtype=np.float64) / (1.0 - rho)
    return np.where(stable, latency, np.inf)


def effective_batch(rate_rps: FloatArray | float, latency_s: FloatArray | float) -> FloatArray:
    """Mean number of requests in flight, ``B = lambda*L`` (Little's law); ``inf`` when unstable."""
    rate = np.asarray(rate_rps, dtype=np.float64)
    latency = np.asarray(latency_s, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # 0 * inf at lambda = 0 cannot happen: L is finite there
        return np.where(np.isfinite(latency), rate * latency, np.inf)


def batch_cap_rate(c1: FloatArray | float, c2: FloatArray | float, max_batch: FloatArray | float) -> FloatArray:
    """Rate at which the mean number of requests in flight ``B = lambda L`` reaches ``max_batch``.

    From ``lambda C1 / (1 - lambda C2) = N``: ``lambda_N = N / (C1 + N C2)``
    (requests/s). Beyond it the engine's batch cap (vLLM ``max_num_seqs``) or
    its KV budget holds requests back, which the mean model does not
    represent: its latency is then a lower bound
    (``docs/model.md#saturation-and-batch-cap``).
    """
    return knee.straight_cap_rate(c1, c2, max_batch)


def closed_loop_others(clients: int, closed_loop_factor: float = 1.0) -> float:
    """Open-loop others in flight that a closed loop of ``clients`` loads the server like: ``f (N - 1)``.

    Each request of a closed loop shares the server with the ``N - 1`` other
    clients' requests; per other it loads the server ``f`` times as much as an
    open loop's (``docs/model.md#open-and-closed-loops``).
    """
    return closed_loop_factor * max(clients - 1, 0)


def closed_loop_throughput(c1: float, c2: float, clients: int, closed_loop_factor: float = 1.0,
                           concavity: float = 0.0) -> float:
    """Throughput of a closed loop of ``clients`` (req/s): ``X = N / (C1 + f (N - 1) C2)``.

    Also the most a server whose batch is held full at ``N`` sequences (vLLM's
    ``max_num_seqs``) completes: a sweep's measured plateau
    (``docs/model.md#saturation-and-batch-cap``). Under a concave load law
    (``concavity`` ``psi``, ``docs/model.md#concave-load``) ``f (N - 1)`` others
    cost ``C2 h(f (N - 1))``, ``h(B) = B + psi sqrt(B)``.
    """
    others = closed_loop_others(clients, closed_loop_factor)
    return float(clients / (c1 + concave_load(others, concavity) * c2))


def concave_load(others: FloatArray | float, concavity: float) -> Any:
    """``h(B) = B + psi sqrt(B)``: what ``B`` others in flight cost in units of ``C2`` (``docs/model.md#concave-load``).

    ``psi = 0`` is ``B`` itself, Kong et al.'s straight line. A Python number gives a Python number, by
    :mod:`math`: the simulator and the step policy evaluate it once per engine step.
    """
    if concavity == 0.0:
        return others
    if isinstance(others, (int, float)):
        return others + concavity * math.sqrt(max(others, 0.0))
    return others + concavity * np.sqrt(np.maximum(others, 0.0))


def concave_load_slope(others: FloatArray, concavity: float) -> Any:
    """``h'(B) = 1 + psi / (2 sqrt(B))``, the marginal cost of one more request in flight in units of ``C2``.

    Taken as 1 at ``B = 0``, where it is infinite for ``psi > 0``: a fit's derivative in the closed-loop factor
    multiplies it by ``B`` (:meth:`sdplan.fitting.runmodel.DesignRows.loaded_slope`), so the point adds nothing.
    """
    b = np.asarray(others, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 + np.where(b > 0, concavity / (2.0 * np.sqrt(np.where(b > 0, b, 1.0))), 0.0)


#: Prefill share of C2 (c2p/C2) and utilisation from which the mean model departs from the simulator.
PREFILL_DOMINATED_SHARE = 0.5
PREFILL_DOMINATED_UTILISATION = 0.5


def prefill_interference_warning(c2p: float, c2: FloatArray | float, rho: FloatArray | float) -> str | None:
    """A warning where prefill interference dominates ``C2`` at load, else None.

    Notes
    -----
    The mean model prices the prefills queued ahead of a request by their mean
    M/G/1 wait (:func:`sdplan.latency.knee.prefill_wait_s`), not how a long
    prefill stalls every decode of its step. Measured with
    ``benchmarks/map_model_vs_simulator.py`` (default calibration, no batch
    cap): within 6% wherever ``c2p/C2 <= 0.5`` and ``rho <= 0.9``; -9% to
    +10% at ``c2p/C2`` 0.52-0.94 and rho 0.6-0.8 (p = 1,024 or 8,192); at
    rho 0.9 +18% (8,192/512, k = 3) to -33% (8,192/64, k = 3). Flags
    ``c2p/C2 >= 0.5`` with ``rho >= 0.5``.
    """
    c2_arr, rho_arr = np.broadcast_arrays(np.asarray(c2, dtype=np.float64), np.asarray(rho, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(c2_arr > 0, c2p / c2_arr, 0.0)
    flagged = (share >= PREFILL_DOMINATED_SHARE) & (rho_arr >= PREFILL_DOMINATED_UTILISATION)
    if not np.any(flagged):
        return None
    worst = float(np.max(np.where(flagged, share, 0.0)))
    return (f"prefill interference is {worst:.0%} of C2 at utilisation >= {PREFILL_DOMINATED_UTILISATION:g}: the "
            "mean model prices the prefills queued ahead by their mean wait, not each long prefill's stall (on the "
            "shipped calibrations within 10% of the simulator at rho 0.6-0.8, up to 33% off at 0.9); check with "
            "--simulate")


def saturation_rate(c2: FloatArray | float) -> FloatArray:
    """Largest sustainable arrival rate ``1/C2`` in requests per second (``inf`` if ``C2 = 0``)."""
    c2_arr = np.asarray(c2, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(c2_arr > 0.0, 1.0 / np.where(c2_arr > 0.0, c2_arr, 1.0), np.inf)


def step_costs(coeffs: Coefficients, k: FloatArray | int) -> tuple[FloatArray, FloatArray]:
    """Per-step cost of an option: fixed seconds ``tau1`` and seconds per other request ``tau2``.

    ``k = 0`` is a plain decode step (``c1_step, c2_step``); ``k > 0`` an SD
    cycle (``c1v + c k c1d, c2v + c k c2d``, ``c k`` the tokens drafted: :func:`drafted_tokens`),
    broadcasting over ``k``.
    """
    k_arr = np.asarray(k, dtype=np.float64)
    drafted = drafted_tokens(coeffs, k_arr)
    tau1 = np.where(k_arr > 0, coeffs.c1v_s + drafted * coeffs.c1d_s, coeffs.baseline_c1_step_s)
    tau2 = np.where(k_arr > 0, coeffs.c2v_s + drafted * coeffs.c2d_s, coeffs.baseline_c2_step_s)
    return tau1, tau2


def step_times(coefficients: Coefficients, draft_lengths: list[int], sizes: FloatArray,
               moe: MoESpec | None = None) -> FloatArray:
    """Step time ``tau_k(n)`` in seconds, shape ``(n, 1 + len(draft_lengths))``; column 0 is no SD.

    ``tau_k(n) = (c1v + c k c1d) + (n - 1)(c2v + c k c2d)`` for an SD cycle and
    ``tau_0(n) = c1_step + (n - 1) c2_step`` for a decode step (:func:`step_costs`), plus what each token row past
    the target's compute-bound knee adds (:func:`sdplan.latency.knee.step_excess_s`, ``n (1 + c k)`` rows), and for
    a mixture-of-experts target the experts its ``n (k + 1)`` routed tokens touch, ``phi`` times the coverage
    increments (:mod:`sdplan.latency.moe`). Used by the planner's goodput policy and schedules, ``sdplan show``
    and the benchmarks.
    """
    ks = option_lengths(draft_lengths).astype(np.float64)  # "off" (0) first
    n = np.asarray(sizes, dtype=np.float64)[:, None]
    fixed, per_other = step_costs(coefficients, ks)
    # past the target's compute-bound knee every further token row of the step costs more (sdplan.latency.knee); a
    # sequence puts 1 + c k rows into it (c: the draft coverage, 1 but for a prompt-lookup proposer)
    tau = fixed[None, :] + (n - 1.0) * per_other[None, :] + step_excess_s(coefficients,
                                                                          n * verified_rows(coefficients, ks)[None, :])
    if moe is not None:
        cover = moe.coverage
        phi = moe.phi(n * (ks + 1.0)[None, :])
        sd = ks > 0
        cover_fixed = np.where(sd, cover.get("c1v_s", 0.0), cover.get("baseline_c1_step_s", 0.0))
        cover_other = np.where(sd, cover.get("c2v_s", 0.0), cover.get("baseline_c2_step_s", 0.0))
        tau = tau + phi * (cover_fixed[None, :] + (n - 1.0) * cover_other[None, :])
    return tau


def ttft_load_cost(coeffs: Coefficients, k: FloatArray | int,
                   tokens_per_cycle: FloatArray | float | None = None) -> FloatArray:
    """Load-dependent demand of one other request per step of an option (s): ``C2 / steps``.

    ``tau2 + c2p/steps`` with ``steps = g - 1`` without SD and ``g/E`` with SD
    (``tokens_per_cycle = E``; default ``k + 1``, every draft accepted). It is
    what each other request in flight costs a step, prefill interference
    included, and does not depend on how a fit splits ``C2`` between ``c2p``
    and the step terms (one workload cannot tell them apart).
    """
    k_arr = np.asarray(k, dtype=np.float64)
    _, tau2 = step_costs(coeffs, k_arr)
    tokens = k_arr + 1.0 if tokens_per_cycle is None else np.asarray(tokens_per_cycle, dtype=np.float64)
    steps = np.where(k_arr > 0, coeffs.output_tokens / np.where(k_arr > 0, tokens, 1.0),
                     baseline_steps(coeffs.output_tokens))
    return tau2 + coeffs.c2p_s / np.maximum(steps, 1.0)


def time_to_first_token(coeffs: Coefficients, k: FloatArray | int = 0, others: FloatArray | float = 0.0,
                        tokens_per_cycle: FloatArray | float | None = None,
                        rate_rps: FloatArray | float = 0.0) -> FloatArray:
    """Mean time to first token (s) with ``others`` requests in flight.

    Parameters
    ----------
    coeffs : Coefficients
        Cost coefficients at the workload.
    k : array_like
        Draft length of the running option (0: no SD).
    others : array_like
        Mean number of other requests in flight, ``B = lambda L`` (``inf``
        gives ``inf``: unstable).
    tokens_per_cycle : array_like, optional
        ``E`` of the option (see :func:`ttft_load_cost`).
    rate_rps : array_like, optional
        An open loop's arrival rate, whose prefill queue's wait ``W`` the request also waits
        (:func:`sdplan.latency.knee.prefill_wait_s`); 0 for a closed loop, which has no such queue.

    Returns
    -------
    numpy.ndarray
        ``TTFT = c1p + offset + prefill + w_wait tau1 + B w_load (C2/steps) + W`` (seconds;
        ``prefill`` is :attr:`Coefficients.ttft_prefill_s`).

    Notes
    -----
    In the spirit of ``L = C1 + B C2``. An arriving request waits for the step
    in progress (half a step on average), then its prefill runs in a step that
    also serves the ``B`` running requests (chunked prefill mixes them), and
    the first token is sampled at its end. With per-step costs
    ``tau(B) = tau1 + B C2/steps`` (:func:`step_costs`, :func:`ttft_load_cost`)
    that is about ``c1p + 0.5 tau1 + 1.5 B C2/steps``: the defaults of
    ``ttft_wait_steps`` and ``ttft_load_steps``. Served calibrations fit both
    weights to measured TTFT (``sdplan fit``, ``sdplan calibrate``). Queueing
    for admission beyond the batch cap is not included (the analytic model
    excludes that regime). Derivation: ``docs/model.md#ttft-and-tpot``.
    """
    tau1, _ = step_costs(coeffs, k)
    per_other = ttft_load_cost(coeffs, k, tokens_per_cycle)
    load = np.asarray(others, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        load_part = np.where(np.isinf(load), np.inf, load * coeffs.ttft_load_steps * per_other)
    wait = knee.prefill_wait_s(coeffs.c2p_s, coeffs.prompt_cv, rate_rps)
    return (coeffs.c1p_s + coeffs.ttft_offset_s + coeffs.ttft_prefill_s + coeffs.ttft_wait_steps * tau1
            + load_part + wait)


def opening_wave_prompts(clients: int, prompt_tokens: float, chunk_tokens: float) -> float:
    """Mean prompts whose prefill is done when a request of an opening wave gets its first token.

    Parameters
    ----------
    clients : int
        ``N``: requests that arrive together (a closed loop's clients at its start), >= 1.
    prompt_tokens : float
        ``p``: tokens of each prompt, > 0.
    chunk_tokens : float
        ``M``: prefill tokens the engine schedules per step (vLLM's ``max_num_batched_tokens``), > 0.

    Returns
    -------
    float
        ``m(N) = (1/N) sum_{j=1..N} min(ceil(j p / M) M, N p) / p``, in prompts (1 for ``N = 1``).

    Notes
    -----
    Chunked prefill (vLLM's scheduler; ``docs/model.md#ttft-and-tpot``) fills each step's token budget
    ``M`` with the waiting prompts in arrival order, splitting a prompt across steps where it does not fit.
    The ``j``-th prompt of the wave is done at the end of step ``ceil(j p / M)``; every step before it
    was full, so by then ``min(ceil(j p/M) M, N p)`` prompt tokens have been prefilled, its own and
    those it shares a step with included. With ``M`` a multiple of ``p`` (``c = M/p`` prompts a step)
    this is ``[c^2 S(S-1)/2 + (N - (S-1)c) N] / N`` with ``S = ceil(N/c)``; with ``p >= M`` (one
    prompt at a time) it is ``(N + 1)/2``. The decode tokens of the requests already prefilled also
    take budget, and their steps time; both are left out (a lower bound).

    Raises
    ------
    InvalidValueError
        For no client, or a prompt or budget of no tokens.
    """
    if clients < 1 or prompt_tokens <= 0 or chunk_tokens <= 0:
        raise InvalidValueError("an opening wave needs at least one client and positive prompt and chunk sizes")
    order = np.arange(1, int(clients) + 1, dtype=np.float64)
    done = np.minimum(np.ceil(order * prompt_tokens / chunk_tokens) * chunk_tokens, clients * prompt_tokens)
    return float(np.mean(done)) / prompt_tokens


def closed_loop_wave_s(coeffs: Coefficients, clients: int, chunk_tokens: float, rounds: float) -> float:
    """Mean TTFT a closed loop adds for its opening wave, spread over its rounds (s).

    Parameters
    ----------
    coeffs : Coefficients
        Cost coefficients at the workload (``c2p_s``: what one prompt's prefill adds to a step).
    clients : int
        ``N``: clients of the closed loop, all sending their first request at once.
    chunk_tokens : float
        ``M``: the engine's prefill token budget per step.
    rounds : float
        ``R``: requests each client sends in the measured run (``requests / N``), >= 1.

    Returns
    -------
    float
        ``(m(N) - 1) c2p / R`` (:func:`opening_wave_prompts`).

    Notes
    -----
    A closed loop's ``N`` clients send at once, so the first request of each waits for the prefills of
    the ``m(N) - 1`` prompts done before or with its own, ``c2p`` each (the prefill interference per
    prompt, which the derived files price from AIConfigurator's mixed steps). Under chunked prefill the
    wave's queue does not recur: every request finishes ``g - 1`` steps after its prefill step, so the
    next round arrives as spread out as the prefills were done, and each later prompt finds no queue of
    the wave in front of it (prompts that shared a step could return together; a measured vLLM row shows
    none: ``docs/model.md#ttft-and-tpot``). Over ``R`` rounds the mean TTFT grows by
    this term over :func:`time_to_first_token`'s steady value: about ``(N - 1) c2p / (2 R)`` for prompts
    of a step's budget or more. Open loops have no wave.

    Raises
    ------
    InvalidValueError
        For ``rounds < 1``, or an empty wave (:func:`opening_wave_prompts`).
    """
    if rounds < 1:
        raise InvalidValueError("a closed loop runs at least one round (rounds = requests / clients >= 1)")
    return (opening_wave_prompts(clients, coeffs.prompt_tokens, chunk_tokens) - 1.0) * coeffs.c2p_s / rounds


def closed_loop_waves_s(coeffs: Coefficients, clients: int, chunk_tokens: float, rounds: float | None,
                        recurs: bool) -> tuple[float, float]:
    """Mean TTFT and E2E a closed loop's waves of prompts add to the steady model (s).

    Parameters
    ----------
    coeffs : Coefficients
        Cost coefficients at the workload (``c2p_s``, ``prompt_tokens``).
    clients : int
        ``N``: requests of the wave: the closed loop's clients the engine holds (where it caps them), and
        of those, for a recurring wave, the ones it admits together
        (:meth:`sdplan.inputs.serving.PrefillScheduling.admitted_together`).
    chunk_tokens : float
        ``M``: the engine's prefill token budget per step
        (:attr:`sdplan.inputs.serving.PrefillScheduling.budget_tokens`).
    rounds : float or None
        ``R``: requests each client sends in the run; None where the run does not say.
    recurs : bool
        Whether every round starts as a wave: a prefill-first engine
        (:attr:`sdplan.inputs.serving.PrefillScheduling.prefill_first`) under a benchmark of fixed lengths.

    Returns
    -------
    tuple of float
        ``(TTFT, E2E)``: ``((m(N) - 1) c2p, 0)`` where the wave recurs; ``(W, 0)`` with
        ``W = (m(N) - 1) c2p / R`` (:func:`closed_loop_wave_s`) where it opens the run only; ``(0, 0)`` where
        it opens the run only and ``R`` is not known.

    Notes
    -----
    A prefill-first scheduler (SGLang's) prefills every waiting prompt before it decodes the running
    requests again. The ``N`` requests of a closed loop's first round arrive together, are prefilled
    before any of them decodes, and then decode in step: where the benchmark fixes the lengths
    (``ignore_eos``, one output length), they finish in the same step, and the next round arrives
    together again (where it draws them, they finish apart and only the opening wave is left). Every
    round is then a wave, so a request's first token waits for the ``m(N) - 1`` prompts prefilled before
    or with its own, ``c2p`` each (:func:`opening_wave_prompts`). E2E does not
    change: from its arrival to its last token a request waits once for each of the ``N - 1`` other
    prompts' prefills, which ``C2``'s ``c2p`` already prices (``L = C1 + (N - 1) C2``); the wave only moves
    that wait in front of its first token. Where the KV cache cannot take the whole round, the wave is the
    part it admits together, and the rest of the round also waits for admission (the regime where the KV
    cache binds, not priced here). Under chunked prefill (vLLM's) the wave opens the run only
    (:func:`closed_loop_wave_s`; ``docs/model.md#ttft-and-tpot``), and E2E does not change either: the wave
    does the run's prefills first, not more of them, so by Little's law over the run (``N`` in flight,
    ``M`` requests) the mean latency stays the steady one. Real vLLM runs measure it so: the first round's
    latency excess is offset by the last round's drain: over 27 runs of three rounds at 16 and 64 clients
    the run's mean latency is +3.1% and -3.1% off its middle round's, where adding ``W`` to it would say
    +9.4% and +7.1%, and the wave takes mean TTFT to 2.06 and 1.87 times the middle round's
    (``benchmarks/closed_loop_wave.py``).
    """
    if recurs:
        return closed_loop_wave_s(coeffs, clients, chunk_tokens, 1.0), 0.0
    if rounds is None:
        return 0.0, 0.0
    return closed_loop_wave_s(coeffs, clients, chunk_tokens, rounds), 0.0


def time_per_output_token(latency_s: FloatArray, ttft_s: FloatArray | float, output_tokens: float) -> FloatArray:
    """Approximate mean TPOT in seconds per token, vLLM's definition.

    ``TPOT = (L - TTFT) / (g - 1)``: the first token is excluded, as in vLLM's
    ``bench serve``. Returns ``inf`` where ``L`` is infinite and ``nan`` for
    ``g <= 1`` (undefined; callers render it as absent).
    """
    latency = np.asarray(latency_s, dtype=np.float64)
    if output_tokens <= 1:
        return np.full_like(latency, np.nan)
    with np.errstate(invalid="ignore"):
        tpot = (latency - ttft_s) / (output_tokens - 1.0)
    return np.where(np.isinf(latency), np.inf, tpot)


def speedup(
    latency_baseline_s: FloatArray, latency_speculative_s: FloatArray
) -> FloatArray:
    """Speedup of SD over no SD at equal arrival rate, ``L_D / L_SD``.

    Returns ``inf`` where only the baseline is unstable, ``0`` where only SD is
    unstable and ``nan`` where both are (no comparison exists).

    Notes
    -----
    Equivalent to Kong et al. eq. (2):
    ``S = (C1_D/C1_SD) * (1 - lambda*C2_SD) / (1 - lambda*C2_D)``
    (``docs/model.md#speedup-and-break-even``).
    """
    base = np.asarray(latency_baseline_s, dtype=np.float64)
    spec = np.asarray(latency_speculative_s, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = base / spec
    ratio = np.where(np.isinf(base) & np.isfinite(spec), np.inf, ratio)
    ratio = np.where(np.isfinite(base) & np.isinf(spec), 0.0, ratio)
    return np.where(np.isinf(base) & np.isinf(spec), np.nan, ratio)


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakEven:
    """Where SD and no SD have equal mean latency.

    Attributes
    ----------
    rate_rps : numpy.ndarray
        The break-even arrival rate; ``nan`` where none exists below saturation.
    sd_faster_below : numpy.ndarray of bool
        True where SD wins below the break-even rate (the common case,
        ``C2_R > 1``), False where it wins above it (``C2_R < 1``). Where no
        break-even exists, whether SD is faster at every stable rate.
    """

    rate_rps: FloatArray
    sd_faster_below: npt.NDArray[np.bool_]


def break_even_within_limits(rate_rps: FloatArray, sd_faster_below: npt.NDArray[np.bool_], base_limit_rps: float,
                             sd_limit_rps: FloatArray) -> FloatArray:
    """The break-even once each option's own limit bounds it (its saturation, ``1/C2`` or its batch cap's rate).

    An option past its limit is unstable. Where SD wins below the break-even (or at every rate) but its limit
    comes before both that break-even and no SD's, no SD is the faster one from SD's limit on: the break-even
    is SD's limit there (``docs/model.md#saturation-and-batch-cap``).
    """
    earlier = sd_faster_below & (sd_limit_rps < base_limit_rps) & ~(rate_rps <= sd_limit_rps)
    return np.where(earlier, sd_limit_rps, rate_rps)


def break_even(c1_d: float, c2_d: float, c1_sd: FloatArray, c2_sd: FloatArray) -> BreakEven:
    """Arrival rate at which SD's speedup crosses 1.

    Parameters
    ----------
    c1_d, c2_d : float
        Baseline demand (seconds; seconds per concurrent request).
    c1_sd, c2_sd : array_like
        Speculative demand, same units, broadcast together.

    Returns
    -------
    BreakEven

    Notes
    -----
    With ``C1_R = C1_SD/C1_D``, ``C2_R = C2_SD/C2_D`` and ``r = lambda*C2_D``
    the speedup equals 1 at (Kong et al., App. A.3;
    ``docs/model.md#speedup-and-break-even``)::

        r* = (C1_R - 1) / (C1_R - C2_R),   lambda* = r* / C2_D,

    which exists when ``C1_R - 1`` and ``C2_R - 1`` have opposite signs. It
    always lies below both saturation rates, so the answer is stable.
    """
    c1_r = np.asarray(c1_sd, dtype=np.float64) / c1_d
    c2_r = np.asarray(c2_sd, dtype=np.float64) / c2_d
    crosses = (c1_r - 1.0) * (c2_r - 1.0) < 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        r_star = (c1_r - 1.0) / (c1_r - c2_r)
    rate = np.where(crosses, r_star / c2_d, np.nan)
    # Without a crossing SD is faster everywhere iff it is faster at zero load.
    faster_below = np.where(crosses, c1_r < 1.0, (c1_r < 1.0) | ((c1_r == 1.0) & (c2_r < 1.0)))
    return BreakEven(rate_rps=rate, sd_faster_below=faster_below)


def regime(rho: FloatArray) -> npt.NDArray[np.str_]:
    """Regime label per point: ``stable``, ``near_saturation`` (rho > 0.9) or ``unstable`` (rho >= 1)."""
    rho_arr = np.asarray(rho, dtype=np.float64)
    return np.where(
        rho_arr >= 1.0,
        "unstable",
        np.where(rho_arr > NEAR_SATURATION_UTILISATION, "near_saturation", "stable"),
    )
