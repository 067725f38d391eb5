"""Capacity under SLOs: the highest request rate each option sustains, and fleet sizing.

An *option* is "no SD" or SD with one draft length. For each option the
highest rate meeting every SLO follows in closed form from the model
(:func:`sdplan.inputs.slo.max_rate_under`); replicas follow from the per-replica
capacity, assuming the target rate is spread evenly over replicas.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from sdplan.errors import InfeasibleError, InvalidValueError
from sdplan.inputs.acceptance import expected_tokens_per_cycle
from sdplan.inputs.slo import SLO, Metric, max_rate_under
from sdplan.latency import knee, model
from sdplan.planning.check import simulated_value
from sdplan.planning.planner import option_label
from sdplan.simulate import replicate

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.latency.coefficients import Coefficients
    from sdplan.latency.knee import KneeDemands
    from sdplan.latency.moe import MoESpec

    FloatArray = npt.NDArray[np.float64]

#: Relative slack when rounding replicas up, so 10.0/2.5 is 4 replicas, not 5.
_ROUNDING_SLACK = 1e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class Capacity:
    """Per-option capacity. Index 0 is "no SD"; index i >= 1 is ``draft_lengths[i-1]``.

    Attributes
    ----------
    draft_lengths : (k,) int
    alpha : float
        Per-token acceptance used.
    c1_s, c2_s : (k+1,) demand per option.
    max_rate_rps : (k+1,) highest rate meeting every SLO; 0 where no rate does.
    min_rate_rps : (k+1,) lowest rate some SLO (throughput) requires.
    binding_slo : list of str or None: the SLO that sets ``max_rate_rps``.
    feasible : (k+1,) bool
    saturation_rate_rps : (k+1,) the rate past which the option has no steady state: the lower of ``1/C2`` and
        the rate at which its mean batch reaches its batch cap (as :func:`sdplan.planning.planner.plan` says it).
    saturation_limit : list of str
        Which of the two sets ``saturation_rate_rps``, per option: ``compute`` (``1/C2``) or ``cap`` (the batch
        cap, ``max_num_seqs`` or what the KV cache holds), as :attr:`sdplan.planning.planner.Plan.saturation_limit`
        names them.
    latency_at_capacity_s : (k+1,) mean latency at ``max_rate_rps``.
    break_even_rate_rps : (k,) nan where SD and no SD never cross; SD's saturation where it comes first
        (:func:`sdplan.latency.model.break_even_within_limits`, as plan says it).
    knee : KneeDemands, optional
        The demands past the target's compute-bound knee (:mod:`sdplan.latency.knee`); None is no knee.
    best : int
        Index of the option with the highest capacity (ties: no SD, then the
        shorter draft); -1 if none is feasible.
    """

    draft_lengths: list[int]
    alpha: float
    c1_s: FloatArray
    c2_s: FloatArray
    max_rate_rps: FloatArray
    min_rate_rps: FloatArray
    binding_slo: list[str | None]
    feasible: npt.NDArray[np.bool_]
    saturation_rate_rps: FloatArray
    latency_at_capacity_s: FloatArray
    break_even_rate_rps: FloatArray
    best: int
    saturation_limit: list[str]
    knee: KneeDemands | None = None
    #: An MoE target's answer (:func:`moe_capacity`): ``c1_s`` at zero load and ``c2_s`` at full expert coverage.
    expert_coverage: bool = False

    def label(self, index: int) -> str:
        return option_label(self.draft_lengths[index - 1] if index else 0)

    @property
    def c2_past_knee_s(self) -> FloatArray:
        """``C2`` per option as it sets the saturation: past the target's compute-bound knee where it has one.

        Past the knee ``B*`` a step is bound by compute and each request adds ``C2_above = C2 + n b t``
        (:func:`sdplan.latency.knee.knee_demands`); the saturation ``1/C2`` is reached there, so this is the ``C2``
        that capacity's answer and JSON report.
        """
        return self.c2_s if self.knee is None else self.knee.c2_above_s

    @property
    def best_speculative(self) -> int:
        """Index of the best SD option (>= 1), or -1 if no SD option is feasible."""
        rates = np.where(self.feasible[1:], self.max_rate_rps[1:], -1.0)
        return int(np.argmax(rates)) + 1 if np.any(self.feasible[1:]) else -1


def require_rate_bound(slos: list[SLO]) -> None:
    """Refuse SLOs none of which bounds the request rate: capacity would be the saturation, where latency is
    unbounded.

    Raises
    ------
    InvalidValueError
        No e2e, TTFT, TPOT or utilisation SLO among ``slos``.
    """
    if not any(slo.metric.bounds_rate for slo in slos):
        raise InvalidValueError(
            "capacity needs an SLO that bounds the request rate: e2e:mean<=..., ttft:mean<=..., tpot:mean<=... or "
            "utilisation<=..."
        )


def capacity(coefficients: Coefficients, draft_lengths: list[int], alpha: float, slos: list[SLO],
             tokens_per_cycle: FloatArray | None = None,
             max_batch: float | Sequence[float] | None = None, break_even: bool = True) -> Capacity:
    """Highest request rate meeting all SLOs, per option (and the break-even rates unless ``break_even`` is
    False: nan, for the intervals' draws, which read only the capacity).

    With ``max_batch`` (the engine's batch cap, vLLM ``max_num_seqs``, or the
    sequences the KV budget holds) no capacity beyond the rate where the
    mean batch ``lambda L`` reaches it is reported
    (:func:`sdplan.latency.model.batch_cap_rate`): past it the mean model is outside
    its regime. The binding SLO then reads ``batch cap (N sequences)``.

    Raises
    ------
    InvalidValueError
        If no SLO bounds the rate (capacity would be the saturation rate,
        where latency is unbounded).
    """
    require_rate_bound(slos)
    ks = np.asarray(draft_lengths, dtype=np.float64)
    if tokens_per_cycle is None:
        tokens_per_cycle = expected_tokens_per_cycle(alpha, ks)
    demands = model.option_demands(coefficients, draft_lengths, np.atleast_1d(tokens_per_cycle))
    c1, c2 = demands.c1_s, demands.c2_s
    options, option_tokens = demands.draft_lengths.astype(np.float64), demands.tokens_per_cycle
    ttft = model.time_to_first_token(coefficients, options, 0.0, option_tokens)  # zero-load TTFT per option
    # TTFT = ttft + B * ttft_per_other
    ttft_per_other = coefficients.ttft_load_steps * model.ttft_load_cost(coefficients, options, option_tokens)
    g = coefficients.output_tokens

    highest = np.full(c1.shape, np.inf)
    lowest = np.zeros(c1.shape)
    binding: list[str | None] = [None] * c1.size
    above = demands.knee
    for slo in slos:
        # the utilisation lambda C2 does not hold the prefill queue's wait (1 - (C1 + W)/L): closed form, as the
        # throughput floor; under a concave law C2 itself bends
        scanned = slo.metric is not Metric.THROUGHPUT and (
            above.concavity > 0.0 or (knee.rate_dependent(above) and slo.metric is not Metric.UTILISATION))
        if scanned:
            low, high = scanned_rate_bounds(slo, c1, c2, above, ttft, g, ttft_per_other)
        else:
            low, high = max_rate_under(slo, c1, c2, ttft, g, ttft_per_other)
            if knee.has_knee(coefficients):  # a rate whose batch is past the knee: the demands above it hold there
                low_above, high_above = max_rate_under(slo, above.c1_above_s, above.c2_above_s, ttft, g,
                                                       ttft_per_other)
                high = np.where(knee.past_knee(c1, c2, above, high), high_above, high)
                low = np.where(knee.past_knee(c1, c2, above, low), low_above, low)
        tighter = high < highest
        for index in np.flatnonzero(tighter):
            binding[int(index)] = slo.text
        highest = np.minimum(highest, high)
        lowest = np.maximum(lowest, low)
    saturation = model.saturation_rate(above.c2_above_s)
    highest = np.minimum(highest, saturation)
    limit = ["compute"] * c1.size
    if max_batch is not None:  # one cap for every option, or one each (no SD first)
        caps = np.broadcast_to(np.asarray(max_batch, dtype=np.float64), c1.shape)
        cap_rate = knee.batch_cap_rate(c1, c2, above, caps)
        for index in np.flatnonzero(cap_rate < highest):
            binding[int(index)] = batch_cap_label(float(caps[index]))
        highest = np.minimum(highest, cap_rate)
        limit = ["cap" if at else "compute" for at in cap_rate <= saturation]  # as planner.plan names it
        saturation = np.minimum(saturation, cap_rate)
    feasible = (highest > 0) & (highest >= lowest)
    max_rate = np.where(feasible, highest, 0.0)
    latency = np.where(feasible, knee.mean_latency(c1, c2, above, max_rate), np.nan)
    even_rate = np.full(c1.size - 1, np.nan)
    if break_even:
        even_rate, faster_below = knee.break_even(float(c1[0]), float(c2[0]), knee.take(above, slice(0, 1)),
                                                  c1[1:], c2[1:], knee.take(above, slice(1, None)))
        even_rate = model.break_even_within_limits(even_rate, faster_below, float(saturation[0]), saturation[1:])
    ranked = np.where(feasible, max_rate, -1.0)
    best = int(np.argmax(ranked)) if np.any(feasible) else -1
    return Capacity(
        draft_lengths=[int(k) for k in draft_lengths],
        alpha=float(alpha),
        c1_s=c1,
        c2_s=c2,
        max_rate_rps=max_rate,
        min_rate_rps=lowest,
        binding_slo=binding,
        feasible=feasible,
        saturation_rate_rps=saturation,
        latency_at_capacity_s=latency,
        break_even_rate_rps=even_rate,
        best=best,
        saturation_limit=limit,
        knee=above,
    )


#: Rates below saturation on which a rate-dependent law's SLO bounds are bracketed before they are bisected, and the
#: halvings of a bracket (a 512th of the saturation rate): 2**-32 of it is 5e-13 of the saturation rate.
SLO_SCAN_RATES = 512
SLO_BISECTIONS = 32


def scanned_rate_bounds(slo: SLO, c1: FloatArray, c2: FloatArray, demands: KneeDemands, ttft_s: FloatArray,
                        output_tokens: float, ttft_per_other_s: FloatArray) -> tuple[FloatArray, FloatArray]:
    """:func:`sdplan.inputs.slo.max_rate_under` where the demands change with the rate: a concave load law
    (``docs/model.md#concave-load``) or an open loop's prefill queue (``docs/model.md#prefills-queued-ahead``).

    Its latency has no closed-form inverse in every metric, so each option's SLO value is evaluated on
    :data:`SLO_SCAN_RATES` rates below saturation, with ``L`` from :func:`sdplan.latency.knee.mean_latency`,
    ``B = lambda L``, ``TTFT = t0 + a B + W``, ``TPOT = (L - TTFT)/(g - 1)`` and the utilisation ``1 - (C1 +
    W)/L`` (``lambda C2`` on a straight law); the first and last rates where it holds are bisected
    (:func:`sdplan.latency.knee.bisect_boundary`). The SLO is taken to hold on one interval of rates, as it
    does on a straight law. ``highest = -1`` where it holds nowhere.
    """
    if slo.metric is Metric.TPOT and output_tokens <= 1:
        raise InvalidValueError(f"SLO '{slo.text}': TPOT is undefined for 1 output token")
    c1, c2 = np.asarray(c1, dtype=np.float64), np.asarray(c2, dtype=np.float64)
    t0, per_other = np.asarray(ttft_s, dtype=np.float64), np.asarray(ttft_per_other_s, dtype=np.float64)
    columns = knee.with_rate_axis(demands)

    def holds(rates: FloatArray) -> npt.NDArray[np.bool_]:
        # the demands that hold carry the wait, C1 + W: L from them, and 1 - (C1 + W)/L the utilisation
        c1_at, c2_at = knee.demands_at(c1[:, None], c2[:, None], columns, rates)
        latency = model.mean_latency(c1_at, c2_at, rates)
        with np.errstate(invalid="ignore", divide="ignore"):
            if slo.metric is Metric.E2E:
                value = latency
            elif slo.metric is Metric.UTILISATION:
                value = 1.0 - c1_at / latency
            else:
                first = (t0[:, None] + per_other[:, None] * model.effective_batch(rates, latency)
                         + knee.wait_at(columns, rates))
                value = first if slo.metric is Metric.TTFT else (latency - first) / (output_tokens - 1.0)
        return np.isfinite(latency) & (value <= slo.limit)

    with np.errstate(divide="ignore"):
        top = np.where(demands.c2_above_s > 0, 1.0 / demands.c2_above_s, 1e9)
    rates = top[:, None] * np.linspace(0.0, 1.0, SLO_SCAN_RATES + 1)[:-1]
    ok = holds(rates)
    anywhere = ok.any(axis=1)
    first = np.argmax(ok, axis=1)
    last = ok.shape[1] - 1 - np.argmax(ok[:, ::-1], axis=1)
    step = top / SLO_SCAN_RATES

    def edge(inside: FloatArray, outside: FloatArray) -> FloatArray:
        return knee.bisect_boundary(lambda middle: holds(middle[:, None])[:, 0], inside, outside, SLO_BISECTIONS)[0]

    at_first, at_last = first * step, last * step
    # an edge is bisected only where some option has one (an upper SLO holds from rate 0: no lower edge)
    low = np.where(first > 0, edge(at_first, at_first - step), 0.0) if np.any(anywhere & (first > 0)) else \
        np.zeros(first.shape)
    high = np.where(last < SLO_SCAN_RATES - 1, edge(at_last, at_last + step), top)
    return np.where(anywhere, low, 0.0), np.where(anywhere, high, -1.0)


#: Bisection steps that refine an MoE option's capacity between two scanned rates (to 2**-30 of the step).
MOE_BISECTIONS = 30


def moe_capacity(coefficients: Coefficients, draft_lengths: list[int], alpha: float, slos: list[SLO],
                 tokens_per_cycle: FloatArray, moe: MoESpec, max_batch: Sequence[float]) -> Capacity:
    """:func:`capacity` for an MoE target, whose ``C1``, ``C2`` depend on the load: no closed-form inverse.

    Notes
    -----
    Each option's latency, TTFT, TPOT and utilisation at a rate are the planner's
    (:func:`sdplan.planning.planner.plan`: the fixed point of :func:`sdplan.latency.moe.solve` over the experts
    a batch covers, each option held at its engine cap ``max_batch``, no SD first). They are evaluated on
    :data:`SLO_SCAN_RATES` rates up to the highest saturation; an option's capacity is the last scanned rate where
    every upper SLO holds (they are taken to hold on one interval of rates, as on a straight law), refined by
    bisection towards the next. Where that is the option's saturation at its engine cap, the cap binds;
    otherwise the SLO that fails first past it. ``c1_s`` and ``c2_s`` are the planner's zero-load latency and
    the demand at full coverage, for the answer's "why"; the break-even rate is the planner's first crossing.
    """
    from sdplan.planning import planner

    require_rate_bound(slos)
    tokens = np.atleast_2d(np.asarray(tokens_per_cycle, dtype=np.float64))
    g = coefficients.output_tokens

    def evaluated(rates: FloatArray) -> dict[str, FloatArray]:
        """(options, rates) arrays of each metric, no SD first; latency inf where the option is unstable."""
        result = planner.plan(coefficients, rates, draft_lengths, [alpha], tokens, moe=moe, batch_caps=max_batch)
        return {"e2e": np.vstack([result.baseline_latency_s, result.latency_s[0].T]),
                "ttft": np.vstack([result.baseline_ttft_load_s, result.ttft_load_s[0].T]),
                "tpot": np.vstack([result.baseline_tpot_s, result.tpot_s[0].T]),
                "utilisation": np.vstack([result.baseline_utilisation, result.utilisation[0].T])}

    def violated(metrics: dict[str, FloatArray]) -> list[list[str | None]]:
        """Per option and rate, the first upper SLO missed (None: every one holds, on a stable point)."""
        shape = metrics["e2e"].shape
        found: list[list[str | None]] = [[None] * shape[1] for _ in range(shape[0])]
        for slo in slos:
            if not slo.metric.bounds_rate:  # throughput>= is a floor, applied below
                continue
            missed = ~(metrics[slo.metric.value] <= slo.limit)
            for i, j in zip(*np.nonzero(missed & np.isfinite(metrics["e2e"]))):
                if found[i][j] is None:
                    found[i][j] = slo.text
        return found

    zero = planner.plan(coefficients, [0.0], draft_lengths, [alpha], tokens, moe=moe, batch_caps=max_batch)
    saturation = np.concatenate(([zero.baseline_saturation_rate_rps], zero.saturation_rate_rps[0]))
    at_cap = np.concatenate(([zero.baseline_saturation_limit == "cap"], zero.saturation_limit[0] == "cap"))
    options = saturation.size
    top = float(np.nanmax(saturation)) if np.isfinite(saturation).any() else 0.0
    scan = top * np.linspace(0.0, 1.0, SLO_SCAN_RATES + 1)[1:-1]
    metrics = evaluated(scan)
    misses = violated(metrics)
    holds = np.isfinite(metrics["e2e"]) & np.array([[miss is None for miss in row] for row in misses])
    found = holds.any(axis=1)
    last = np.where(found, holds.shape[1] - 1 - np.argmax(holds[:, ::-1], axis=1), 0)
    low = np.where(found, scan[last], 0.0)
    high = np.where(last + 1 < scan.size, scan[np.minimum(last + 1, scan.size - 1)], saturation)
    high = np.where(found, high, 0.0)

    def on_diagonal(rates: FloatArray) -> tuple[dict[str, FloatArray], list[str | None]]:
        """Each option's metrics at its own rate, and the first upper SLO it misses there."""
        at = evaluated(rates)
        return {name: np.diagonal(values)[:, None] for name, values in at.items()}, \
            [row[index] for index, row in enumerate(violated(at))]

    for _ in range(MOE_BISECTIONS):  # every option's bracket at once: one planner call a step
        middle = 0.5 * (low + high)
        point, missed = on_diagonal(middle)
        ok = np.isfinite(point["e2e"][:, 0]) & np.array([miss is None for miss in missed])
        low, high = np.where(ok, middle, low), np.where(ok, high, middle)
    highest = np.where(found, low, 0.0)
    _, beyond = on_diagonal(high)
    caps = np.broadcast_to(np.asarray(max_batch, dtype=np.float64), (options,))
    binding: list[str | None] = []
    for index in range(options):
        if not found[index]:
            binding.append(next((miss for miss in misses[index] if miss is not None), None))
        elif beyond[index] is None and at_cap[index]:  # stable up to the cap's saturation: the cap binds
            binding.append(batch_cap_label(float(caps[index])))
        else:
            binding.append(beyond[index])
    lowest = np.zeros(options)
    for slo in slos:
        if slo.metric is Metric.THROUGHPUT:  # output tokens a second: g lambda >= X in steady state
            lowest = np.maximum(lowest, slo.limit / g)
    feasible = (highest > 0) & (highest >= lowest)
    max_rate = np.where(feasible, highest, 0.0)
    at_capacity, _ = on_diagonal(max_rate)
    latency = np.where(feasible, at_capacity["e2e"][:, 0], np.nan)
    ranked = np.where(feasible, max_rate, -1.0)
    return Capacity(
        draft_lengths=[int(k) for k in draft_lengths], alpha=float(alpha),
        c1_s=np.concatenate(([zero.baseline_c1_s], zero.c1_s[0])),
        c2_s=np.concatenate(([zero.baseline_c2_s], zero.c2_s[0])),
        max_rate_rps=max_rate, min_rate_rps=lowest, binding_slo=binding, feasible=feasible,
        saturation_rate_rps=saturation, latency_at_capacity_s=latency,
        break_even_rate_rps=np.asarray(zero.break_even_rate_rps[0], dtype=np.float64),
        best=int(np.argmax(ranked)) if np.any(feasible) else -1, expert_coverage=True,
        saturation_limit=[zero.baseline_saturation_limit, *zero.saturation_limit[0].tolist()])


def latency_at(cap: Capacity, rates_rps: FloatArray) -> FloatArray:
    """Mean latency (s) of every option at ``rates_rps`` (one rate per option), past the knee where it is."""
    if cap.knee is None:
        return model.mean_latency(cap.c1_s, cap.c2_s, rates_rps)
    return knee.mean_latency(cap.c1_s, cap.c2_s, cap.knee, rates_rps)


def batch_cap_label(max_batch: float) -> str:
    """Binding-constraint text when the batch cap limits capacity."""
    return f"batch cap ({max_batch:g} sequences)"


def search_rate(feasible: Callable[[float], str | None], upper_rps: float,
                iterations: int = 8) -> tuple[float, str | None]:
    """Highest rate in ``(0, upper)`` at which ``feasible`` reports no violated SLO, by bisection.

    ``feasible(rate)`` returns None when every SLO holds, else the violated
    SLO's text. Assumes the SLOs get harder with load (true of latency
    statistics); the answer is resolved to ``upper / 2**iterations`` and is
    the last rate found feasible, so it never overstates capacity.
    Returns (rate, the SLO that binds just above it).
    """
    low, high = 0.0, upper_rps
    binding = feasible(high)
    if binding is None:
        return high, None
    for _ in range(iterations):
        middle = 0.5 * (low + high)
        violated = feasible(middle)
        if violated is None:
            low = middle
        else:
            high, binding = middle, violated
    return low, binding


@dataclass(frozen=True, slots=True)
class Excess:
    """How far a simulated point is past its upper-bound SLOs: ``max_i value_i/limit_i - 1`` (> 0 violated)."""

    excess: float
    binding: str | None


def search_root(excess: Callable[[float], Excess], guess_rps: float, upper_rps: float, tolerance: float = 0.01,
                max_evaluations: int = 14,
                predict: Callable[[float, float], float] | None = None) -> tuple[float, str | None, int]:
    """Highest rate in ``(0, upper]`` with ``excess(rate) <= 0``, by bracketing then regula falsi.

    ``excess`` rises with the rate (latency statistics under common random
    numbers are smooth in the rate), so from ``guess_rps`` (e.g. the
    closed-form capacity) the root is bracketed in a step or two and refined
    by the Illinois variant of regula falsi, falling back to bisection where
    the excess is infinite (unstable). Stops when the bracket is within
    ``tolerance`` (relative) of its upper end. The answer is the highest rate
    found feasible, so it never overstates capacity (to the tolerance).
    ``predict(rate, excess)``, when given, estimates the root from one point
    (e.g. from the mean model's shape); the bracketing step then aims just
    past that estimate instead of stepping by a fixed factor.

    Returns
    -------
    (rate, binding, evaluations)
        ``binding`` is the SLO violated just above the rate (None if
        ``upper`` itself is feasible).
    """
    evaluations = 0

    def evaluate(rate: float) -> Excess:
        nonlocal evaluations
        evaluations += 1
        return excess(rate)

    low, low_value = 0.0, -1.0
    high, high_value, binding = math.inf, math.inf, None
    rate = min(max(guess_rps, upper_rps * 1e-3), upper_rps)
    while evaluations < max_evaluations:  # bracket
        point = evaluate(rate)
        if point.excess <= 0.0:
            low, low_value = rate, point.excess
            if rate >= upper_rps:
                return upper_rps, None, evaluations
        else:
            high, high_value, binding = rate, point.excess, point.binding
        if low > 0.0 and math.isfinite(high):
            break
        if high <= upper_rps * 1e-3:
            return 0.0, binding, evaluations
        if predict is not None and math.isfinite(point.excess):
            aim = 1.0 + tolerance if point.excess <= 0.0 else 1.0 - tolerance
            estimate = predict(rate, point.excess) * aim
            rate = min(max(estimate, rate * 1.002), rate * 2.0) if point.excess <= 0.0 else \
                max(min(estimate, rate * 0.998), rate * 0.5)
            rate = min(rate, upper_rps)
        else:
            step = 1.25 if math.isfinite(point.excess) and abs(point.excess) < 0.2 else 2.0
            rate = min(rate * step, upper_rps) if point.excess <= 0.0 else rate / step
    side = 0
    while evaluations < max_evaluations and high - low > tolerance * high:
        width = high - low
        if math.isfinite(high_value) and low > 0.0:
            weight_low = low_value / 2.0 if side == 1 else low_value
            weight_high = high_value / 2.0 if side == -1 else high_value
            rate = low + width * (-weight_low) / (weight_high - weight_low)
            rate = min(max(rate, low + 0.05 * width), high - 0.05 * width)
        else:
            rate = 0.5 * (low + high)
        point = evaluate(rate)
        if point.excess <= 0.0:
            low, low_value, side = rate, point.excess, -1
        else:
            high, high_value, binding, side = rate, point.excess, point.binding, 1
    return low, binding, evaluations


def simulated_capacity(cap: Capacity, coefficients: Coefficients, slos: list[SLO],
                       configure: Callable[[float, int], object], seeds: int, seed: int,
                       tolerance: float = 0.01,
                       on_evaluation: Callable[[int, float], None] | None = None) -> tuple[Capacity, int]:
    """Per option, the highest rate whose simulated statistics meet every SLO.

    Upper-bound SLOs (latency, utilisation) get harder with load: their
    highest rate is found by :func:`search_root`, started at the closed-form
    capacity corrected by the simulated-to-analytic ratio of the option
    before. Lower-bound SLOs (``throughput>=``) hold only *above* some rate,
    so they are checked at that rate: if one fails there, no rate meets
    every SLO. A point whose queue keeps growing
    (:attr:`sdplan.simulate.SimulationResult.steady` false) is unstable.

    Every evaluation uses common random numbers: each replication's arrival
    stream (one uniform per request) and acceptance draws are the same at
    every rate and option, so the statistics are smooth in the rate and the
    search needs few evaluations.

    ``configure(rate, k)`` returns a :class:`sdplan.simulate.SimulationConfig`.
    Returns the capacity table with simulated rates, and the evaluations run.
    """
    upper_slos = [slo for slo in slos if slo.upper_bound]
    lower_slos = [slo for slo in slos if not slo.upper_bound]
    options = [0, *cap.draft_lengths]
    streams = [np.random.default_rng([seed + index, 7]).random(int(configure(1.0, 0).requests))  # type: ignore[attr-defined]
               for index in range(seeds)]
    rates: list[float] = []
    binding: list[str | None] = []
    total = 0
    correction = 1.0
    for index, k in enumerate(options):
        c2 = float(cap.c2_s[index])
        saturation = float(cap.saturation_rate_rps[index]) * 0.999
        cache: dict[float, object] = {}

        def summary_at(rate: float, k: int = k, index: int = index, cache: dict[float, object] = cache) -> object:
            if rate not in cache:
                cache[rate] = replicate(coefficients, configure(rate, k), seeds, seed, math.nan,  # type: ignore[arg-type]
                                        uniforms=streams)
                if on_evaluation is not None:
                    on_evaluation(index, rate)
            return cache[rate]

        def excess(rate: float, c2: float = c2) -> Excess:
            return upper_slo_excess(upper_slos, summary_at(rate), rate, c2)

        def predict(rate: float, over: float, c2: float = c2) -> float:
            return mean_model_root(rate, over, c2)

        analytic = float(cap.max_rate_rps[index]) if cap.feasible[index] else saturation * 0.5
        guess = min(analytic * correction, saturation) if analytic > 0 else saturation * 0.5
        rate, bound, count = search_root(excess, guess, saturation, tolerance, predict=predict)
        total += count
        if rate > 0 and lower_slos:
            summary = summary_at(rate)
            failed = [slo.text for slo in lower_slos if not slo.holds(simulated_value(slo, summary, rate * c2))]
            if failed:
                rate, bound = 0.0, failed[0]
        if rate > 0 and analytic > 0:
            correction = rate / analytic
        rates.append(rate)
        binding.append(bound)
    return with_simulated_rates(cap, rates, binding), total


def upper_slo_excess(slos: list[SLO], summary: object, rate_rps: float, c2_s: float) -> Excess:
    """How far a simulated point is past its upper-bound SLOs (:class:`Excess`); infinite where not steady.

    Each SLO's excess is ``value/limit - 1`` (with a zero limit, 0 for a value at or below it, else
    infinite), at least ``1e-12`` where the SLO does not hold; the point's excess is the largest, and its
    SLO the binding one. ``summary`` is a :class:`sdplan.simulate.RateSummary`; ``rate_rps * c2_s`` is
    the utilisation that ``utilisation<=`` SLOs read.
    """
    if not summary.steady:  # type: ignore[attr-defined]
        return Excess(math.inf, "not steady (queue grows)")
    worst, worst_slo = -math.inf, None
    for slo in slos:
        value = simulated_value(slo, summary, rate_rps * c2_s)
        over = value / slo.limit - 1.0 if slo.limit > 0 else (0.0 if value <= 0 else math.inf)
        if not slo.holds(value):
            over = max(over, 1e-12)
        if over > worst:
            worst, worst_slo = over, slo.text
    return Excess(worst, worst_slo)


def mean_model_root(rate_rps: float, excess: float, c2_s: float) -> float:
    """The rate where the excess reaches 0, from one point and the mean model's shape.

    A latency statistic ``v(r)`` scales as ``1/(1 - r C2)`` (:func:`sdplan.latency.model.mean_latency`), so through
    the point ``(rate, 1 + excess)`` it reaches 1 at ``r* = (1 - (1 - rate C2)(1 + excess)) / C2``; with
    ``C2 = 0`` at ``rate / (1 + excess)``.
    """
    if c2_s > 0:
        return (1.0 - (1.0 - rate_rps * c2_s) * (1.0 + excess)) / c2_s
    return rate_rps / (1.0 + excess)


def with_simulated_rates(cap: Capacity, rates_rps: list[float], binding: list[str | None]) -> Capacity:
    """The analytic capacity table with its rates replaced by simulated ones."""
    rates = np.asarray(rates_rps, dtype=np.float64)
    feasible = rates > 0
    ranked = np.where(feasible, rates, -1.0)
    return replace(cap, max_rate_rps=rates, binding_slo=list(binding), feasible=feasible,
                   latency_at_capacity_s=np.where(feasible, latency_at(cap, rates), np.nan),
                   best=int(np.argmax(ranked)) if np.any(feasible) else -1)


#: Largest fleet sized (more is no deployment: a typo in the target rate or an SLO).
MAX_REPLICAS = 1e15


def replicas_saved(no_sd: Any, best_sd: Any) -> int | None:
    """Replicas SD saves (negative: costs) between two fleets with ``replicas``; None unless both serve."""
    if no_sd is None or best_sd is None:
        return None
    return int(no_sd.replicas - best_sd.replicas)


def replicas_needed(target_rate_rps: float, per_replica_rps: float) -> int | None:
    """``ceil(target / per_replica)``, ``None`` if a replica sustains no rate under the SLOs."""
    if per_replica_rps <= 0:
        return None
    if target_rate_rps <= 0:
        return 0
    replicas = target_rate_rps / per_replica_rps * (1.0 - _ROUNDING_SLACK)
    if not replicas <= MAX_REPLICAS:
        raise InfeasibleError(f"serving {target_rate_rps:g} req/s at {per_replica_rps:.3g} req/s per replica needs "
                              f"more than {MAX_REPLICAS:.0e} replicas; check --target-rate and the SLOs")
    return max(1, math.ceil(replicas))


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    """Replicas for one option at a target rate, with optional GPU and cost figures."""

    option: str
    per_replica_rate_rps: float
    replicas: int
    gpus: int | None
    cost_per_hour_usd: float | None
    cost_per_million_output_tokens_usd: float | None


def fleet(
    option: str,
    per_replica_rps: float,
    target_rate_rps: float,
    output_tokens: float,
    gpus_per_replica: int | None,
    gpu_hour_cost_usd: float | None,
) -> Fleet | None:
    """Size a fleet for ``option``; ``None`` if it cannot meet the SLOs at any rate.

    Cost per million output tokens is the fleet's hourly cost divided by the
    output tokens it serves per hour at the target rate, ``target * g * 3600``.
    """
    count = replicas_needed(target_rate_rps, per_replica_rps)
    if count is None:
        return None
    gpus = count * gpus_per_replica if gpus_per_replica is not None else None
    per_hour = gpus * gpu_hour_cost_usd if gpus is not None and gpu_hour_cost_usd is not None else None
    tokens_per_hour = target_rate_rps * output_tokens * 3600.0
    per_million = per_hour / tokens_per_hour * 1e6 if per_hour is not None and tokens_per_hour > 0 else None
    return Fleet(
        option=option,
        per_replica_rate_rps=float(per_replica_rps),
        replicas=count,
        gpus=gpus,
        cost_per_hour_usd=per_hour,
        cost_per_million_output_tokens_usd=per_million,
    )
