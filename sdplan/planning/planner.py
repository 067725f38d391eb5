"""The planner: the model evaluated over a (acceptance x rate x draft length) grid.

:func:`plan` takes cost coefficients and the grid axes and returns a
:class:`Plan` holding every quantity as numpy arrays of shape
``(n_alpha, n_rate, n_k)`` (or a prefix of it). One vectorised pass, no loop
per grid point. The latency at each point comes from :mod:`sdplan.latency.latency_grid`
(closed form for a dense target, fixed point for MoE). Renderers turn a
:class:`Plan` into tables, JSON or CSV.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from sdplan.errors import InvalidValueError
from sdplan.inputs.acceptance import AcceptanceSpec, expected_tokens_per_cycle
from sdplan.inputs.serving import BatchCap, batch_cap_warning
from sdplan.latency import knee, model
from sdplan.latency import moe as moe_model
from sdplan.latency.latency_grid import SolvedGrid, dense_grid, moe_grid, with_batch_caps
from sdplan.latency.model import step_times
from sdplan.latency.policy import goodput_latency

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.inputs.serving import EngineLimits
    from sdplan.latency.coefficients import Coefficients
    from sdplan.latency.moe import MoESpec
    from sdplan.planning.uncertainty import PlanIntervals

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

#: ``best_k`` value meaning "speculative decoding off is best".
SD_OFF = 0
#: ``best_k`` value meaning "nothing is stable at this rate".
NONE_STABLE = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """Model predictions over the grid. Units are in the attribute names' docs.

    Axes: ``a`` = acceptance (``alphas``), ``r`` = request rate (``rates_rps``),
    ``k`` = draft length (``draft_lengths``).

    ``step_batches`` (n,) and ``step_speedup`` (a, k, n): SD's speedup per engine step at a fixed batch
    (:func:`step_speedup`), what a closed loop of that many requests measures.

    Attributes
    ----------
    coefficients : Coefficients
        The cost coefficients used (at the planned workload).
    alphas : (a,) per-token acceptance.
    rates_rps : (r,) request rates, requests/s.
    draft_lengths : (k,) draft lengths, tokens.
    baseline_c1_s, baseline_c2_s : float
        No-SD demand: seconds; seconds per concurrent request.
    baseline_latency_s, baseline_batch, baseline_utilisation, baseline_tpot_s : (r,)
        No-SD mean latency (s), effective batch (requests), utilisation, TPOT (s/token).
    tokens_per_cycle : (a, k) E(alpha, k), tokens per cycle.
    c1_s, c2_s : (a, k) SD demand.
    latency_s, batch, utilisation, tpot_s, speedup : (a, r, k)
        SD predictions; ``inf`` latency/batch where unstable.
    ttft_s : float
        Mean TTFT (s) of no SD at zero load (see :func:`model.time_to_first_token`).
    baseline_ttft_load_s : (r,); ttft_load_s : (a, r, k)
        Mean TTFT (s) under load, ``c1p + w_wait tau1 + B w_load tau2`` with each
        option's own step costs and effective batch; ``inf`` where unstable.
    best_k : (a, r) int
        Best draft length; :data:`SD_OFF` if no SD is best, :data:`NONE_STABLE` if nothing is stable.
    best_latency_s, best_speedup : (a, r)
    saturation_rate_rps : (a, k); baseline_saturation_rate_rps : float
        The lower of ``1/C2`` and the rate where the option's batch reaches its engine cap (``batch_caps``).
    saturation_limit : (a, k) str; baseline_saturation_limit : str
        Which of the two binds: ``"compute"`` (``1/C2``) or ``"cap"`` (the engine's batch or KV cap).
    break_even_rate_rps : (a, k), ``nan`` where SD and no SD never cross.
    sd_faster_below_break_even : (a, k) bool
        For MoE the break-even fields hold the *first* crossing on the solved
        curves; every crossing is in ``moe_break_even_rates_rps`` (a, k, 4),
        nan-padded. ``c1_s``/``baseline_c1_s`` are the zero-load latencies
        with the coverage of the request's own step, ``c2_s`` the
        load-dependent demand at full coverage, ``utilisation`` the
        dense-equivalent ``1 - L(0)/L`` (:mod:`sdplan.latency.moe`).
    """

    coefficients: Coefficients
    alphas: FloatArray
    rates_rps: FloatArray
    draft_lengths: IntArray
    baseline_c1_s: float
    baseline_c2_s: float
    baseline_latency_s: FloatArray
    baseline_batch: FloatArray
    baseline_utilisation: FloatArray
    baseline_tpot_s: FloatArray
    baseline_saturation_rate_rps: float
    baseline_saturation_limit: str
    tokens_per_cycle: FloatArray
    c1_s: FloatArray
    c2_s: FloatArray
    latency_s: FloatArray
    batch: FloatArray
    utilisation: FloatArray
    tpot_s: FloatArray
    speedup: FloatArray
    ttft_s: float
    baseline_ttft_load_s: FloatArray
    ttft_load_s: FloatArray
    best_k: IntArray
    best_latency_s: FloatArray
    best_speedup: FloatArray
    saturation_rate_rps: FloatArray
    saturation_limit: npt.NDArray[np.str_]
    break_even_rate_rps: FloatArray
    sd_faster_below_break_even: npt.NDArray[np.bool_]
    goodput_latency_s: FloatArray | None = None
    goodput_k: IntArray | None = None
    zero_load_k: IntArray | None = None
    zero_load_k_latency_s: FloatArray | None = None
    moe_speedup_lost: FloatArray | None = None
    moe_max_residual: float | None = None
    moe_break_even_rates_rps: FloatArray | None = None
    step_batches: FloatArray | None = None
    step_speedup: FloatArray | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return (len(self.alphas), len(self.rates_rps), len(self.draft_lengths))


def plan(
    coefficients: Coefficients,
    rates_rps: FloatArray | list[float],
    draft_lengths: IntArray | list[int],
    alphas: FloatArray | Sequence[float],
    tokens_per_cycle: FloatArray | None = None,
    goodput_policy: bool = False,
    moe: MoESpec | None = None,
    batch_caps: Sequence[float] | None = None,
) -> Plan:
    """Evaluate the SD latency model over the whole grid at once.

    Parameters
    ----------
    coefficients : Coefficients
        Costs at the workload (from :meth:`Calibration.coefficients_at`).
    rates_rps : array_like, shape (r,)
        Arrival rates in requests per second, >= 0.
    draft_lengths : array_like of int, shape (k,)
        Draft lengths to consider, >= 1 (no SD is always considered).
    alphas : array_like, shape (a,)
        Per-token acceptance probabilities in [0, 1].
    tokens_per_cycle : array_like, shape (a, k), optional
        ``E`` per acceptance row and draft length, overriding ``E(alpha, k)``
        (per-position acceptance); ``alphas`` then only label the rows.
    moe : MoESpec, optional
        The target is a mixture of experts: ``C1``, ``C2`` depend on expert
        coverage at the operating batch and the latency is the fixed point of
        :func:`sdplan.latency.moe.solve` (``C1``/``C2`` reported are at zero load and
        at full coverage; break-even rates are not computed).
    goodput_policy : bool
        Also solve the goodput-adaptive policy (:mod:`sdplan.latency.policy`) and the
        single draft length a user would tune at zero load.
    batch_caps : sequence of float, optional
        Requests each option's engine holds at once, no SD first, then one per draft length
        (:meth:`sdplan.inputs.serving.EngineLimits.option_caps`); inf for no cap. Each option saturates at the
        lower of ``1/C2`` and the rate where its batch reaches its cap
        (:func:`sdplan.latency.latency_grid.with_batch_caps`; an MoE target's at the experts a batch of that
        size covers).

    Returns
    -------
    Plan

    Notes
    -----
    Per point: ``L = C1/(1 - lambda C2)``, ``B = lambda L`` (Kong et al. eq. 1),
    ``C1, C2`` from eq. 3; the best draft length minimises ``L`` over the
    draft lengths and "off" (``docs/model.md#best-draft-length``); ties go to "off", then to
    the shorter draft.
    """
    rates, ks, alpha = _axes(rates_rps, draft_lengths, alphas)
    if tokens_per_cycle is None:
        tokens = expected_tokens_per_cycle(alpha[:, None], ks[None, :].astype(np.float64))  # (a, k)
    else:
        tokens = np.broadcast_to(np.asarray(tokens_per_cycle, dtype=np.float64), (alpha.size, ks.size))
    solved = dense_grid(coefficients, rates, ks, tokens) if moe is None else \
        moe_grid(coefficients, rates, ks, tokens, moe)
    if batch_caps is not None:
        solved = with_batch_caps(solved, coefficients, rates, ks, tokens, batch_caps, moe)
    result = _assemble(coefficients, alpha, rates, ks, tokens, solved, goodput_policy, moe)
    # up to the largest batch an SD option's engine holds (its cap itself the last point)
    largest = max((cap for cap in (batch_caps or ())[1:] if math.isfinite(cap)), default=max(STEP_BATCHES))
    kept = [b for b in STEP_BATCHES if b < largest] + [min(largest, max(STEP_BATCHES))]
    batches = np.asarray(kept if largest >= 1 else [1], dtype=np.float64)
    return replace(result, step_batches=batches, step_speedup=step_speedup(coefficients, ks, tokens, batches, moe))


#: Batch sizes at which a plan reports SD's speedup per engine step, as closed-loop benchmarks measure it
#: (SpecDecode-Bench: batch 1, 16, 64, 128).
STEP_BATCHES = (1, 16, 64, 128, 256)


def step_speedup(coefficients: Coefficients, ks: IntArray, tokens: FloatArray, batches: FloatArray,
                 moe: MoESpec | None = None) -> FloatArray:
    """SD's speedup per engine step with ``n`` requests in flight: ``E tau_0(n) / tau_k(n)``, shape (a, k, n).

    Notes
    -----
    A step of ``n`` sequences commits ``n`` tokens without SD in ``tau_0(n)`` and ``n E`` with it in
    ``tau_k(n)`` (the step costs of ``docs/model.md#per-step-form``, past the compute-bound knee where the
    rows are): the throughput ratio of a closed loop of ``n`` requests, prefill aside. It shrinks with
    ``n`` where SD's ``k + 1`` rows per sequence cost more than they save; an open loop's latency ratio can
    still grow near no SD's saturation where SD saturates later.
    """
    taus = step_times(coefficients, [int(k) for k in ks], batches, moe)  # (n, 1 + k)
    with np.errstate(divide="ignore", invalid="ignore"):  # a file whose SD steps cost nothing: inf, not a warning
        return np.asarray(tokens)[:, :, None] * (taus[:, 0][None, None, :] / taus[:, 1:].T[None, :, :])


def _axes(rates_rps: FloatArray | list[float], draft_lengths: IntArray | list[int],
          alphas: FloatArray | Sequence[float]) -> tuple[FloatArray, IntArray, FloatArray]:
    """The grid axes as flat arrays, each checked against its domain."""
    rates = np.asarray(rates_rps, dtype=np.float64).reshape(-1)
    ks = np.asarray(draft_lengths, dtype=np.int64).reshape(-1)
    alpha = np.asarray(alphas, dtype=np.float64).reshape(-1)
    if rates.size == 0 or ks.size == 0 or alpha.size == 0:
        raise InvalidValueError("the grid needs at least one rate, one draft length and one acceptance value")
    if np.any(~np.isfinite(rates)) or np.any(rates < 0):
        raise InvalidValueError("request rates must be finite and >= 0 req/s")
    if np.any(ks < 1):
        raise InvalidValueError("draft lengths must be >= 1 token (no SD is always included)")
    if np.any(~np.isfinite(alpha)) or np.any((alpha < 0) | (alpha > 1)):
        raise InvalidValueError("per-token acceptance must lie in [0, 1]")
    return rates, ks, alpha


@dataclass(frozen=True, slots=True)
class _Goodput:
    """The goodput-adaptive policy beside the single k tuned at zero load (see the :class:`Plan` fields)."""

    latency_s: FloatArray
    k: IntArray
    zero_load_k: IntArray
    zero_load_k_latency_s: FloatArray


def _goodput(coefficients: Coefficients, ks: IntArray, tokens: FloatArray, rates: FloatArray,
             option_latency: FloatArray, zero_load_c1: FloatArray | None = None) -> _Goodput:
    """The goodput policy (:func:`sdplan.latency.policy.goodput_latency`) and the zero-load-tuned option at every rate.

    ``option_latency`` is the static latency per option, shape ``(a, r, 1 + k)`` with "off" in column 0.
    ``zero_load_c1`` is each option's latency alone, shape ``(a, 1 + k)``, where it is not the straight-line
    ``C1`` (an MoE target's, at the coverage of the request's own steps); its latencies are then fixed points of
    curves, not of straight lines.
    """
    options = model.option_demands(coefficients, ks, tokens)
    alone = options.c1_s if zero_load_c1 is None else zero_load_c1
    zero_load = np.argmin(alone, axis=1)  # the option tuned at batch size 1, kept at every load
    static = np.take_along_axis(option_latency, np.broadcast_to(zero_load[:, None, None],
                                                                option_latency.shape[:2] + (1,)), axis=2)[..., 0]
    if zero_load_c1 is not None or knee.has_bend(coefficients):
        # Each option's latency is the smallest fixed point of an increasing h_k(B) (two pieces past a knee; an
        # MoE target's grows with the experts the batch covers), and the smallest fixed point of min_k h_k is the
        # least of them (docs/model.md#goodput-adaptive-draft-length).
        chosen = np.argmin(option_latency, axis=2)
        best = np.take_along_axis(option_latency, chosen[..., None], axis=2)[..., 0]
        return _Goodput(latency_s=best, k=np.where(np.isfinite(best), options.draft_lengths[chosen], NONE_STABLE),
                        zero_load_k=options.draft_lengths[zero_load], zero_load_k_latency_s=static)
    adaptive = goodput_latency(options.c1_s, options.c2_s, rates)
    return _Goodput(latency_s=adaptive.latency_s,
                    k=np.where(np.isfinite(adaptive.latency_s), options.draft_lengths[adaptive.option], NONE_STABLE),
                    zero_load_k=options.draft_lengths[zero_load], zero_load_k_latency_s=static)


def _assemble(coefficients: Coefficients, alpha: FloatArray, rates: FloatArray, ks: IntArray, tokens: FloatArray,
              solved: SolvedGrid, goodput_policy: bool, moe: MoESpec | None = None) -> Plan:
    """The :class:`Plan` of a solved grid: speedups, TTFT/TPOT, the best draft length per point, the policy."""
    s, g = solved, coefficients.output_tokens
    k_ak = ks[None, :].astype(np.float64)
    def ttft(*load: Any) -> FloatArray:
        """TTFT at (k, others, E, rate); a MoE target's at the steps' coverage of that load."""
        if moe is None:
            return model.time_to_first_token(coefficients, *load)
        return moe_model.time_to_first_token(coefficients, moe, *load)

    base_ttft = ttft(0, s.base_batch, None, rates)
    load_ttft = ttft(k_ak[:, None, :], s.batch, tokens[:, None, :], rates[None, :, None])
    # Best draft length: column 0 is "off", columns 1.. are the draft lengths.
    option_latency = np.concatenate(
        [np.broadcast_to(s.base_latency[None, :, None], (alpha.size, rates.size, 1)), s.latency], axis=2)
    best_column = np.argmin(option_latency, axis=2)
    best_latency = np.take_along_axis(option_latency, best_column[..., None], axis=2)[..., 0]
    alone = None if moe is None else np.concatenate(  # an MoE option alone pays the coverage of its own steps
        [np.full((alpha.size, 1), s.c1_d), np.broadcast_to(s.c1, (alpha.size, ks.size))], axis=1)
    policy = _goodput(coefficients, ks, tokens, rates, option_latency, alone) if goodput_policy else None
    return Plan(
        coefficients=coefficients,
        alphas=alpha,
        rates_rps=rates,
        draft_lengths=ks,
        baseline_c1_s=s.c1_d,
        baseline_c2_s=s.c2_d,
        baseline_latency_s=s.base_latency,
        baseline_batch=s.base_batch,
        baseline_utilisation=s.base_utilisation,
        baseline_tpot_s=model.time_per_output_token(s.base_latency, base_ttft, g),
        baseline_saturation_rate_rps=min(float(model.saturation_rate(s.c2_d)), s.base_cap_rate),
        baseline_saturation_limit="compute" if s.base_cap_rate > float(model.saturation_rate(s.c2_d)) else "cap",
        tokens_per_cycle=tokens,
        c1_s=s.c1,
        c2_s=s.c2,
        latency_s=s.latency,
        batch=s.batch,
        utilisation=s.rho,
        tpot_s=model.time_per_output_token(s.latency, load_ttft, g),
        speedup=model.speedup(s.base_latency[None, :, None], s.latency),
        ttft_s=float(ttft()),
        baseline_ttft_load_s=base_ttft,
        ttft_load_s=load_ttft,
        best_k=np.where(np.isfinite(best_latency), model.option_lengths(ks)[best_column], NONE_STABLE),
        best_latency_s=best_latency,
        best_speedup=model.speedup(np.broadcast_to(s.base_latency[None, :], best_latency.shape), best_latency),
        saturation_rate_rps=np.minimum(model.saturation_rate(s.c2), np.inf if s.cap_rate is None else s.cap_rate),
        saturation_limit=np.where((s.cap_rate if s.cap_rate is not None else np.inf) > model.saturation_rate(s.c2),
                                  "compute", "cap"),
        break_even_rate_rps=s.even.rate_rps,
        sd_faster_below_break_even=s.even.sd_faster_below,
        goodput_latency_s=policy.latency_s if policy else None,
        goodput_k=policy.k if policy else None,
        zero_load_k=policy.zero_load_k if policy else None,
        zero_load_k_latency_s=policy.zero_load_k_latency_s if policy else None,
        moe_speedup_lost=s.moe.speedup_lost if s.moe else None,
        moe_max_residual=s.moe.max_residual if s.moe else None,
        moe_break_even_rates_rps=s.moe.break_even_rates_rps if s.moe else None,
    )


def domain_warnings(result: Plan, limits: EngineLimits) -> list[str]:
    """Warnings where the closed form is outside the domain it was checked on (see :mod:`sdplan.latency.model`).

    ``limits`` are the engine's (:func:`sdplan.inputs.serving.resolve_limits`): where the plan's effective batch reaches
    their batch cap, or not one request of the workload fits (a cap of 0),
    :func:`sdplan.inputs.serving.batch_cap_warning` says so.
    """
    c2p = result.coefficients.c2p_s
    rho = np.concatenate([np.ravel(result.baseline_utilisation), np.ravel(result.utilisation)])
    c2 = np.concatenate([np.full(np.size(result.baseline_utilisation), result.baseline_c2_s),
                         np.ravel(np.broadcast_to(result.c2_s[:, None, :], result.utilisation.shape))])
    stable = rho < 1.0
    warnings = []
    largest = largest_batch(result)
    if limits.batch_cap.requests < 1 or (largest is not None and limits.reached(largest)):
        warnings.append(batch_cap_warning(limits, f"at the highest rates (effective batch up to {largest or 0:.4g} "
                                          "requests)"))
    warning = model.prefill_interference_warning(c2p, c2[stable], rho[stable])
    bound = frontend_bound_options(
        result.coefficients, [0, *result.draft_lengths],
        np.concatenate([np.full(result.c2_s.shape[:-1] + (1,), result.baseline_c2_s), result.c2_s], axis=-1),
        np.concatenate([np.ones(result.c2_s.shape[:-1] + (1,)), result.tokens_per_cycle], axis=-1))
    if bound:
        warnings.append(f"{', '.join(bound)}: the serving frontend's work per streamed chunk "
                        f"({result.coefficients.frontend_chunk_s * 1e3:.3g} ms a chunk, frontend_chunk_s), not the "
                        "model's steps, sets C2 and the saturation rate (docs/model.md#frontend-floor)")
    return warnings + ([warning] if warning else [])


def frontend_bound_options(coeffs: Coefficients, draft_lengths: Sequence[int], c2: FloatArray | float,
                           tokens_per_cycle: FloatArray | float) -> list[str]:
    """The options whose ``C2`` is the frontend's floor (:func:`sdplan.latency.model.frontend_floor`): ``"off"``,
    ``"k=2"``, ...

    ``draft_lengths`` (n,) with 0 for no SD, ``c2`` and ``tokens_per_cycle`` broadcast to (..., n); an
    option is named where its ``C2`` equals ``g/E`` chunks times ``frontend_chunk_s`` at any acceptance.
    """
    if not coeffs.frontend_chunk_s:
        return []
    c2_arr, tokens = np.broadcast_arrays(np.asarray(c2, dtype=np.float64),
                                         np.asarray(tokens_per_cycle, dtype=np.float64))
    floor = model.frontend_floor_s(coeffs, tokens)
    bound = np.isclose(c2_arr, floor, rtol=1e-9, atol=0.0).reshape(-1, len(draft_lengths)).any(axis=0)
    return ["off" if k == 0 else f"k={k}" for k, flag in zip(draft_lengths, bound) if flag]


def largest_batch(result: Plan) -> float | None:
    """Largest finite effective batch ``B = lambda L`` over the plan's points (requests), None if none is finite."""
    values = np.concatenate([np.ravel(result.baseline_batch), np.ravel(result.batch)])
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else None


def option_label(draft_length: int) -> str:
    """An option's name in answers and JSON: ``off`` for no SD (draft length 0), else ``k=<draft length>``."""
    return "off" if draft_length == 0 else f"k={draft_length}"


def last_saturating(saturation_rps: FloatArray | Sequence[float]) -> int | None:
    """Index of the option that saturates last: the largest finite saturation rate (None if none is finite)."""
    rates = np.asarray(saturation_rps, dtype=np.float64)
    finite = np.isfinite(rates)
    return int(np.argmax(np.where(finite, rates, -np.inf))) if finite.any() else None


def named_draft_lengths(result: Plan) -> set[int]:
    """The draft lengths a plan's answer names (k >= 1): the best at each rate, the best at zero load (the
    smallest ``C1``) and the one that saturates last, per acceptance.

    The caveats on draft lengths a calibration did not price are for each of these: the answer's first line
    names the zero-load and last-saturating ones even where no rate of the grid picks them.
    """
    ks = np.asarray(result.draft_lengths, dtype=int)
    named = {int(k) for k in np.ravel(result.best_k) if k > 0}
    if ks.size:
        named.update(int(ks[i]) for i in np.argmin(result.c1_s, axis=1))
        last = (last_saturating(row) for row in result.saturation_rate_rps)
        named.update(int(ks[i]) for i in last if i is not None)
    return named


def default_rates(
    coefficients: Coefficients, draft_lengths: list[int], alphas: list[float], count: int = 12,
    tokens_per_cycle: FloatArray | None = None, batch_caps: Sequence[float] | None = None,
) -> list[float]:
    """A rate grid spanning zero load to the highest saturation rate of any option.

    Returns ``count`` evenly spaced rates from ``max_sat/count`` to ``max_sat``
    (requests/s) rounded to 3 significant digits, where ``max_sat`` is the
    largest saturation rate (:class:`Plan`: ``1/C2``, or the engine cap's rate where it is lower) over no SD
    and every (alpha, k), less 0.5% so that rounding never lifts the last row past it (that row would be
    unstable for every option). The last rows therefore show where each option saturates.
    """
    at_zero = plan(coefficients, [0.0], draft_lengths, alphas, tokens_per_cycle=tokens_per_cycle,
                   batch_caps=batch_caps)
    saturation = np.append(at_zero.saturation_rate_rps.ravel(), at_zero.baseline_saturation_rate_rps)
    finite = saturation[np.isfinite(saturation)]
    top = float(finite.max()) if finite.size else 1.0
    top *= 0.995
    return [float(f"{top * (i + 1) / count:.3g}") for i in range(count)]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanInputs:
    """What a plan was computed from, for headers and machine-readable output."""

    calibration_name: str
    calibration_path: str
    calibration_method: str
    calibration_provenance: dict[str, object]
    acceptance_description: str
    acceptance: AcceptanceSpec
    prompt_tokens: int
    output_tokens: int
    warnings: tuple[str, ...] = ()
    #: The workload's lengths outside what the calibration measured, e.g. ``prompt tokens 256, measured 123-134``:
    #: the answer is an extrapolation, and says so first.
    extrapolated: tuple[str, ...] = ()
    #: 95% intervals from the calibration's covariance (:class:`sdplan.planning.uncertainty.PlanIntervals`), if it has
    #: one.
    intervals: PlanIntervals | None = None
    #: Each option's engine cap, no SD first then the draft lengths, for the answer to say which limit a
    #: saturation is (:attr:`Plan.saturation_limit`) and what sets it.
    batch_caps: tuple[BatchCap, ...] = ()

    @property
    def cap_phrases(self) -> tuple[str, ...]:
        """:attr:`batch_caps` as phrases (``batch cap of 256 sequences: ...``)."""
        return tuple(cap.phrase for cap in self.batch_caps)
