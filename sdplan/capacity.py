"""Capacity under SLOs: the highest request rate each option sustains, and fleet sizing.

An *option* is "no SD" or SD with one draft length. For each option the
highest rate meeting every SLO follows in closed form from the model
(:func:`sdplan.slo.max_rate_under`); replicas follow from the per-replica
capacity, assuming the target rate is spread evenly over replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from sdplan import model
from sdplan.errors import InfeasibleError, InvalidValueError
from sdplan.slo import SLO

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from sdplan.model import Coefficients

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
    saturation_rate_rps : (k+1,)
    latency_at_capacity_s : (k+1,) mean latency at ``max_rate_rps``.
    break_even_rate_rps : (k,) nan where SD and no SD never cross.
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

    def label(self, index: int) -> str:
        return "off" if index == 0 else f"k={self.draft_lengths[index - 1]}"

    @property
    def best_speculative(self) -> int:
        """Index of the best SD option (>= 1), or -1 if no SD option is feasible."""
        import numpy as np

        rates = np.where(self.feasible[1:], self.max_rate_rps[1:], -1.0)
        return int(np.argmax(rates)) + 1 if np.any(self.feasible[1:]) else -1


def capacity(coefficients: Coefficients, draft_lengths: list[int], alpha: float, slos: list[SLO],
             tokens_per_cycle: FloatArray | None = None) -> Capacity:
    """Highest request rate meeting all SLOs, per option.

    Raises
    ------
    InvalidValueError
        If no SLO bounds the rate (capacity would be the saturation rate,
        where latency is unbounded).
    """
    import numpy as np

    if not any(slo.metric.bounds_rate for slo in slos):
        raise InvalidValueError(
            "capacity needs an SLO that bounds the request rate: e2e:mean<=..., tpot:mean<=... or utilisation<=..."
        )
    c1_d, c2_d = model.baseline_demand(coefficients)
    ks = np.asarray(draft_lengths, dtype=np.float64)
    if tokens_per_cycle is None:
        c1_sd, c2_sd = model.speculative_demand(coefficients, alpha, ks)
    else:
        c1_sd, c2_sd = model.demand_from_tokens(coefficients, np.asarray(tokens_per_cycle, dtype=np.float64), ks)
    c1 = np.concatenate([[c1_d], np.atleast_1d(c1_sd)])
    c2 = np.concatenate([[c2_d], np.atleast_1d(c2_sd)])
    ttft = model.time_to_first_token(coefficients)
    g = coefficients.output_tokens

    from sdplan.slo import max_rate_under

    highest = np.full(c1.shape, np.inf)
    lowest = np.zeros(c1.shape)
    binding: list[str | None] = [None] * c1.size
    for slo in slos:
        low, high = max_rate_under(slo, c1, c2, ttft, g)
        tighter = high < highest
        for index in np.flatnonzero(tighter):
            binding[int(index)] = slo.text
        highest = np.minimum(highest, high)
        lowest = np.maximum(lowest, low)
    saturation = model.saturation_rate(c2)
    highest = np.minimum(highest, saturation)
    feasible = (highest > 0) & (highest >= lowest)
    max_rate = np.where(feasible, highest, 0.0)
    latency = np.where(feasible, model.mean_latency(c1, c2, max_rate), np.nan)
    even = model.break_even(c1_d, c2_d, np.atleast_1d(c1_sd), np.atleast_1d(c2_sd))
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
        break_even_rate_rps=even.rate_rps,
        best=best,
    )


def search_rate(feasible: Callable[[float], str | None], upper_rps: float, iterations: int = 8) -> tuple[float, str | None]:
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


def with_simulated_rates(cap: Capacity, rates_rps: list[float], binding: list[str | None]) -> Capacity:
    """The analytic capacity table with its rates replaced by simulated ones."""
    import numpy as np

    rates = np.asarray(rates_rps, dtype=np.float64)
    feasible = rates > 0
    ranked = np.where(feasible, rates, -1.0)
    from sdplan import model

    return replace(cap, max_rate_rps=rates, binding_slo=list(binding), feasible=feasible,
                   latency_at_capacity_s=np.where(feasible, model.mean_latency(cap.c1_s, cap.c2_s, rates), np.nan),
                   best=int(np.argmax(ranked)) if np.any(feasible) else -1)


#: Largest fleet sized (more is no deployment: a typo in the target rate or an SLO).
MAX_REPLICAS = 1e15


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
