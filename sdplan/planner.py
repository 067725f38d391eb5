"""The planner: the model evaluated over a (acceptance x rate x draft length) grid.

:func:`plan` takes cost coefficients and the grid axes and returns a
:class:`Plan` holding every quantity as numpy arrays of shape
``(n_alpha, n_rate, n_k)`` (or a prefix of it). One vectorised pass, no loop
per grid point. Renderers turn a :class:`Plan` into tables, JSON or CSV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sdplan import model
from sdplan.acceptance import AcceptanceSpec, expected_tokens_per_cycle
from sdplan.errors import InvalidValueError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from sdplan.coefficients import Coefficients
    from sdplan.moe import MoESpec
    from sdplan.serving import EngineLimits

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

#: ``best_k`` value meaning "speculative decoding off is best".
SD_OFF = 0
#: ``best_k`` value meaning "nothing is stable at this rate".
NONE_STABLE = -1
#: Speedup differences below this are the MoE fixed-point solver's round-off, reported as 0.
SPEEDUP_RESOLUTION = 1e-6
#: Rates per option on which the MoE break-even is bracketed before bisection.
_MOE_GRID = 256
#: Break-even crossings kept per MoE option (the speedup can cross 1 at several rates).
MOE_CROSSINGS = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """Model predictions over the grid. Units are in the attribute names' docs.

    Axes: ``a`` = acceptance (``alphas``), ``r`` = request rate (``rates_rps``),
    ``k`` = draft length (``draft_lengths``).

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
    break_even_rate_rps : (a, k), ``nan`` where SD and no SD never cross.
    sd_faster_below_break_even : (a, k) bool
        For MoE the break-even fields hold the *first* crossing on the solved
        curves; every crossing is in ``moe_break_even_rates_rps`` (a, k, 4),
        nan-padded. ``c1_s``/``baseline_c1_s`` are the zero-load latencies
        with the coverage of the request's own step, ``c2_s`` the
        load-dependent demand at full coverage, ``utilisation`` the
        dense-equivalent ``1 - L(0)/L`` (:mod:`sdplan.moe`).
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
    break_even_rate_rps: FloatArray
    sd_faster_below_break_even: npt.NDArray[np.bool_]
    goodput_latency_s: FloatArray | None = None
    goodput_k: IntArray | None = None
    zero_load_k: IntArray | None = None
    zero_load_k_latency_s: FloatArray | None = None
    moe_speedup_lost: FloatArray | None = None
    moe_max_residual: float | None = None
    moe_break_even_rates_rps: FloatArray | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return (len(self.alphas), len(self.rates_rps), len(self.draft_lengths))


def plan(
    coefficients: Coefficients,
    rates_rps: FloatArray | list[float],
    draft_lengths: IntArray | list[int],
    alphas: FloatArray | list[float],
    tokens_per_cycle: FloatArray | None = None,
    goodput_policy: bool = False,
    moe: MoESpec | None = None,
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
        :func:`sdplan.moe.solve` (``C1``/``C2`` reported are at zero load and
        at full coverage; break-even rates are not computed).
    goodput_policy : bool
        Also solve the goodput-adaptive policy (:mod:`sdplan.policy`) and the
        single draft length a user would tune at zero load.

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
    import numpy as np

    rates, ks, alpha = _axes(rates_rps, draft_lengths, alphas)
    if goodput_policy and moe is not None:
        raise InvalidValueError("--policy goodput is not available for MoE calibrations yet (coverage makes C1, C2 "
                                "depend on the batch); use best-static")
    if tokens_per_cycle is None:
        tokens = expected_tokens_per_cycle(alpha[:, None], ks[None, :].astype(np.float64))  # (a, k)
    else:
        tokens = np.broadcast_to(np.asarray(tokens_per_cycle, dtype=np.float64), (alpha.size, ks.size))
    solved = _dense_grid(coefficients, rates, ks, tokens) if moe is None else \
        _moe_grid(coefficients, rates, ks, tokens, moe)
    return _assemble(coefficients, alpha, rates, ks, tokens, solved, goodput_policy)


def _axes(rates_rps: FloatArray | list[float], draft_lengths: IntArray | list[int],
          alphas: FloatArray | list[float]) -> tuple[FloatArray, IntArray, FloatArray]:
    """The grid axes as flat arrays, each checked against its domain."""
    import numpy as np

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
class _MoEResult:
    """What only a mixture-of-experts grid has (see the :class:`Plan` fields of the same names)."""

    speedup_lost: FloatArray
    max_residual: float
    break_even_rates_rps: FloatArray


@dataclass(frozen=True, slots=True)
class _Solved:
    """The model on the grid: no SD per rate ``(r,)``, SD per option ``(a, k)`` and point ``(a, r, k)``."""

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
    moe: _MoEResult | None = None


def _dense_grid(coefficients: Coefficients, rates: FloatArray, ks: IntArray, tokens: FloatArray) -> _Solved:
    """``L = C1/(1 - lambda C2)`` per point of a dense target, with the closed-form break-even rates."""
    c1_d, c2_d = model.baseline_demand(coefficients)
    c1, c2 = model.demand_from_tokens(coefficients, tokens, ks[None, :].astype(float))  # (a, k)
    lam = rates[None, :, None]  # (1, r, 1)
    base_latency = model.mean_latency(c1_d, c2_d, rates)
    latency = model.mean_latency(c1[:, None, :], c2[:, None, :], lam)  # (a, r, k)
    return _Solved(c1_d=float(c1_d), c2_d=float(c2_d), base_latency=base_latency,
                   base_batch=model.effective_batch(rates, base_latency),
                   base_utilisation=model.utilisation(c2_d, rates), c1=c1, c2=c2, latency=latency,
                   batch=model.effective_batch(lam, latency), rho=model.utilisation(c2[:, None, :], lam),
                   even=model.break_even(c1_d, c2_d, c1, c2))


def _moe_grid(coefficients: Coefficients, rates: FloatArray, ks: IntArray, tokens: FloatArray,
              moe: MoESpec) -> _Solved:
    """The MoE fixed point per point (:func:`sdplan.moe.solve`), break-even rates found on the solved curves.

    ``C1`` is the zero-load latency with the coverage of the request's own step, ``C2`` the load-dependent
    demand at full coverage. The speedup lost is against verification that routed only ``B`` tokens.
    """
    import numpy as np

    from sdplan import moe as moe_model

    c, cover = coefficients, moe.coverage
    k_ak = ks[None, :].astype(np.float64)
    lam = rates[None, :, None]
    prefill_phi = float(moe.phi(c.prompt_tokens))
    a1_pre = c.c1p_s + prefill_phi * cover.get("c1p_s", 0.0)
    a2_pre = c.c2p_s + prefill_phi * cover.get("c2p_s", 0.0)
    steps = model.baseline_steps(c.output_tokens)  # the prefill emits the first token
    base_args = (a1_pre + steps * c.baseline_c1_step_s, steps * cover.get("baseline_c1_step_s", 0.0),
                 a2_pre + steps * c.baseline_c2_step_s, steps * cover.get("baseline_c2_step_s", 0.0))
    base = moe_model.solve(*base_args, 1.0, rates, moe)
    cycles = c.output_tokens / tokens
    a1 = a1_pre + cycles * (c.c1v_s + k_ak * c.c1d_s)
    a2 = a2_pre + cycles * (c.c2v_s + k_ak * c.c2d_s)
    b1, b2 = cycles * cover.get("c1v_s", 0.0), cycles * cover.get("c2v_s", 0.0)
    args = (a1[:, None, :], b1[:, None, :], a2[:, None, :], b2[:, None, :])
    solved = moe_model.solve(*args, (k_ak + 1.0)[:, None, :], lam, moe)
    frozen = moe_model.solve(*args, 1.0, lam, moe)  # as if verification routed only B tokens
    frozen_speedup = model.speedup(base.latency_s[None, :, None], frozen.latency_s)
    moe_speedup = model.speedup(base.latency_s[None, :, None], solved.latency_s)
    comparable = np.isfinite(frozen_speedup) & np.isfinite(moe_speedup)
    lost = np.where(comparable, frozen_speedup, 0.0) - np.where(comparable, moe_speedup, 0.0)
    # Below the solver's resolution the difference is round-off (values like 4e-13), not a loss.
    lost = np.where(np.abs(lost) < SPEEDUP_RESOLUTION, 0.0, lost)
    even, crossings = _moe_break_even(base_args, (a1, b1, a2, b2), k_ak + 1.0, moe)
    return _Solved(c1_d=float(base_args[0] + base_args[1] * moe.phi(1.0)), c2_d=float(base_args[2] + base_args[3]),
                   base_latency=base.latency_s, base_batch=base.batch, base_utilisation=base.utilisation,
                   c1=a1 + b1 * moe.phi(k_ak + 1.0), c2=a2 + b2, latency=solved.latency_s, batch=solved.batch,
                   rho=solved.utilisation, even=even,
                   moe=_MoEResult(speedup_lost=np.where(comparable, lost, np.nan),
                                  max_residual=max(solved.max_residual, base.max_residual),
                                  break_even_rates_rps=crossings))


@dataclass(frozen=True, slots=True)
class _Goodput:
    """The goodput-adaptive policy beside the single k tuned at zero load (see the :class:`Plan` fields)."""

    latency_s: FloatArray
    k: IntArray
    zero_load_k: IntArray
    zero_load_k_latency_s: FloatArray


def _goodput(coefficients: Coefficients, ks: IntArray, tokens: FloatArray, rates: FloatArray,
             option_latency: FloatArray) -> _Goodput:
    """The goodput policy (:func:`sdplan.policy.goodput_latency`) and the zero-load-tuned option at every rate.

    ``option_latency`` is the static latency per option, shape ``(a, r, 1 + k)`` with "off" in column 0.
    """
    import numpy as np

    from sdplan.policy import goodput_latency

    options = model.option_demands(coefficients, ks, tokens)
    adaptive = goodput_latency(options.c1_s, options.c2_s, rates)
    zero_load = np.argmin(options.c1_s, axis=1)  # the option tuned at batch size 1, kept at every load
    static = np.take_along_axis(option_latency, np.broadcast_to(zero_load[:, None, None],
                                                                option_latency.shape[:2] + (1,)), axis=2)[..., 0]
    return _Goodput(latency_s=adaptive.latency_s,
                    k=np.where(np.isfinite(adaptive.latency_s), options.draft_lengths[adaptive.option], NONE_STABLE),
                    zero_load_k=options.draft_lengths[zero_load], zero_load_k_latency_s=static)


def _assemble(coefficients: Coefficients, alpha: FloatArray, rates: FloatArray, ks: IntArray, tokens: FloatArray,
              solved: _Solved, goodput_policy: bool) -> Plan:
    """The :class:`Plan` of a solved grid: speedups, TTFT/TPOT, the best draft length per point, the policy."""
    import numpy as np

    s, g = solved, coefficients.output_tokens
    base_ttft = model.time_to_first_token(coefficients, 0, s.base_batch)
    k_ak = ks[None, :].astype(np.float64)
    load_ttft = model.time_to_first_token(coefficients, k_ak[:, None, :], s.batch, tokens[:, None, :])
    # Best draft length: column 0 is "off", columns 1.. are the draft lengths.
    option_latency = np.concatenate(
        [np.broadcast_to(s.base_latency[None, :, None], (alpha.size, rates.size, 1)), s.latency], axis=2)
    best_column = np.argmin(option_latency, axis=2)
    best_latency = np.take_along_axis(option_latency, best_column[..., None], axis=2)[..., 0]
    policy = _goodput(coefficients, ks, tokens, rates, option_latency) if goodput_policy else None
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
        baseline_saturation_rate_rps=float(model.saturation_rate(s.c2_d)),
        tokens_per_cycle=tokens,
        c1_s=s.c1,
        c2_s=s.c2,
        latency_s=s.latency,
        batch=s.batch,
        utilisation=s.rho,
        tpot_s=model.time_per_output_token(s.latency, load_ttft, g),
        speedup=model.speedup(s.base_latency[None, :, None], s.latency),
        ttft_s=float(model.time_to_first_token(coefficients)),
        baseline_ttft_load_s=base_ttft,
        ttft_load_s=load_ttft,
        best_k=np.where(np.isfinite(best_latency), model.option_lengths(ks)[best_column], NONE_STABLE),
        best_latency_s=best_latency,
        best_speedup=model.speedup(np.broadcast_to(s.base_latency[None, :], best_latency.shape), best_latency),
        saturation_rate_rps=model.saturation_rate(s.c2),
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


def _moe_break_even(base_args: tuple[float, float, float, float], sd_args: tuple[FloatArray, ...],
                    tokens_per_sequence: FloatArray, moe: MoESpec) -> tuple[model.BreakEven, FloatArray]:
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
    import numpy as np

    from sdplan import moe as moe_model

    a1, b1, a2, b2 = (np.asarray(x, dtype=np.float64) for x in sd_args)
    shape = a1.shape
    top = 1.0 / np.maximum(np.maximum(a2 + b2, base_args[2] + base_args[3]), 1e-300)  # lower saturation of the pair
    fractions = np.linspace(0.0, 1.0 - 1e-6, _MOE_GRID)

    def log_speedup(rates: FloatArray) -> FloatArray:
        """log(L_D / L_SD) at ``rates`` (shape ``shape + (n,)``); +inf/-inf where one side is unstable."""
        base = moe_model.solve(*base_args, 1.0, rates, moe).latency_s
        spec = moe_model.solve(a1[..., None], b1[..., None], a2[..., None], b2[..., None],
                               tokens_per_sequence[..., None], rates, moe).latency_s
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


def domain_warnings(result: Plan, limits: EngineLimits) -> list[str]:
    """Warnings where the closed form is outside the domain it was checked on (see :mod:`sdplan.model`).

    ``limits`` are the engine's (:func:`sdplan.serving.resolve_limits`): where the plan's effective batch reaches
    their batch cap, or not one request of the workload fits (a cap of 0), :func:`sdplan.serving.batch_cap_warning`
    says so.
    """
    import numpy as np

    from sdplan.serving import batch_cap_warning

    c2p = result.coefficients.c2p_s
    rho = np.concatenate([np.ravel(result.baseline_utilisation), np.ravel(result.utilisation)])
    c2 = np.concatenate([np.full(np.size(result.baseline_utilisation), result.baseline_c2_s),
                         np.ravel(np.broadcast_to(result.c2_s[:, None, :], result.utilisation.shape))])
    stable = rho < 1.0
    warnings = []
    largest = largest_batch(result)
    if limits.batch_cap < 1 or (largest is not None and limits.reached(largest)):
        warnings.append(batch_cap_warning(limits, f"at the highest rates (effective batch up to {largest or 0:.4g} "
                                          "requests)"))
    warning = model.prefill_interference_warning(c2p, c2[stable], rho[stable])
    return warnings + ([warning] if warning else [])


def largest_batch(result: Plan) -> float | None:
    """Largest finite effective batch ``B = lambda L`` over the plan's points (requests), None if none is finite."""
    import numpy as np

    values = np.concatenate([np.ravel(result.baseline_batch), np.ravel(result.batch)])
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else None


def default_rates(
    coefficients: Coefficients, draft_lengths: list[int], alphas: list[float], count: int = 12,
    tokens_per_cycle: FloatArray | None = None,
) -> list[float]:
    """A rate grid spanning zero load to the highest saturation rate of any option.

    Returns ``count`` evenly spaced rates from ``max_sat/count`` to ``max_sat``
    (requests/s) rounded to 3 significant digits, where ``max_sat`` is the
    largest of ``1/C2`` over no SD and every (alpha, k), less 0.5% so that
    rounding never lifts the last row past it (that row would be unstable for
    every option). The last rows therefore show where each option saturates.
    """
    import numpy as np

    _, c2_d = model.baseline_demand(coefficients)
    a = np.asarray(alphas, dtype=np.float64)[:, None]
    k = np.asarray(draft_lengths, dtype=np.float64)[None, :]
    tokens = expected_tokens_per_cycle(a, k) if tokens_per_cycle is None else np.asarray(tokens_per_cycle)
    _, c2 = model.demand_from_tokens(coefficients, tokens, k)
    saturation = np.concatenate([[model.saturation_rate(c2_d)], model.saturation_rate(c2).ravel()])
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
    #: 95% intervals from the calibration's covariance (:class:`sdplan.uncertainty.PlanIntervals`), if it has one.
    intervals: object | None = None
