"""Independent replications of the simulator and their statistics: means with Student-t confidence intervals."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sdplan.simulate.config import SimulationConfig, SimulationResult
from sdplan.simulate.engine import simulate

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.latency.coefficients import Coefficients

    FloatArray = npt.NDArray[np.float64]


#: Two-sided 95% Student-t quantiles by degrees of freedom (normal beyond the table).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}
STATISTICS = ("mean", "p50", "p90", "p99")
METRICS = ("e2e", "ttft", "tpot", "queue")


def t_quantile(dof: int) -> float:
    if dof <= 0:
        return math.inf
    eligible = [d for d in _T95 if d <= dof]
    return _T95[max(eligible)] if dof <= 30 else 1.96


@dataclass(frozen=True, slots=True)
class Estimate:
    """Mean over replications and the half-width of its 95% confidence interval (inf with one seed)."""

    value: float
    half_width: float


@dataclass(frozen=True, slots=True)
class RateSummary:
    rate_rps: float
    draft_length: int
    replications: int
    requests: int
    stats: dict[tuple[str, str], Estimate]
    throughput_tok_s: Estimate
    mean_running: Estimate
    mean_in_system: Estimate
    little_batch: Estimate  # lambda * mean latency, to compare with mean_in_system
    analytic_e2e_s: float
    e2e_samples_s: FloatArray  # the first replication's latencies, for CDF plots
    mean_draft_length: Estimate | None = None  # the goodput policy's time-averaged k
    steady: bool = True  # every replication reached a steady state


def _estimate(samples: list[float]) -> Estimate:
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 1:
        return Estimate(float(values[0]), math.inf)
    half = t_quantile(values.size - 1) * float(values.std(ddof=1)) / math.sqrt(values.size)
    return Estimate(float(values.mean()), half)


class _Statistics(dict):  # type: ignore[type-arg]
    """``(metric, statistic) -> Estimate`` over replications; any percentile ``pX`` (0 < X < 100) on demand."""

    def __init__(self, runs: list[SimulationResult]) -> None:
        super().__init__()
        self._runs = runs
        for metric in METRICS:
            for statistic in STATISTICS:
                self[metric, statistic]

    def __missing__(self, key: tuple[str, str]) -> Estimate:
        metric, statistic = key
        estimate = _estimate([run.statistic(metric, statistic) for run in self._runs])
        self[key] = estimate
        return estimate


def replicate(coefficients: Coefficients, config: SimulationConfig, seeds: int, seed: int,
              analytic_e2e_s: float, on_progress: Callable[[int, int], None] | None = None,
              uniforms: list[FloatArray] | None = None) -> RateSummary:
    """Independent replications with seeds ``seed .. seed + seeds - 1``.

    ``uniforms`` (one array per replication) fix each replication's arrival
    stream, for common random numbers across rates (see :func:`simulate`).
    """
    runs = []
    for index in range(seeds):
        runs.append(simulate(coefficients, config, np.random.default_rng(seed + index), on_progress,
                             uniforms=None if uniforms is None else uniforms[index]))
    stats = _Statistics(runs)
    return RateSummary(
        rate_rps=config.rate_rps, draft_length=config.draft_length, replications=seeds, requests=config.requests,
        stats=stats, throughput_tok_s=_estimate([run.throughput_tok_s for run in runs]),
        mean_running=_estimate([run.mean_running for run in runs]),
        mean_in_system=_estimate([run.mean_in_system for run in runs]),
        little_batch=_estimate([run.arrival_rate_rps * run.statistic("e2e", "mean") for run in runs]),
        analytic_e2e_s=analytic_e2e_s, e2e_samples_s=runs[0].e2e_s,
        mean_draft_length=_estimate([run.mean_draft_length for run in runs])
        if config.adaptive_draft_lengths is not None else None,
        steady=all(run.steady for run in runs),
    )
