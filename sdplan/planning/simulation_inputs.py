"""What a simulation of a :class:`~sdplan.planning.scenario.Scenario` runs on: the settings and the
:class:`sdplan.simulate.SimulationConfig` of one rate and draft length.

Kept apart from :mod:`sdplan.planning.scenario` because only ``simulate`` and
``capacity``/``check --simulate`` need the simulator: ``plan`` resolves a
scenario without loading :mod:`sdplan.simulate` (its start-up goal,
``benchmarks/bench_planner.py --cold-only``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sdplan.limits import check_simulation_memory
from sdplan.simulate import SimulationConfig

if TYPE_CHECKING:
    from sdplan.inputs.serving import EngineLimits
    from sdplan.planning.scenario import Scenario


@dataclass(frozen=True, slots=True)
class SimulationSettings:
    """How to simulate: requests per replication, replications, the first seed, arrival variability."""

    requests: int
    seeds: int
    seed: int
    arrival_cv: float


def simulation_config(scenario: Scenario, rate_rps: float, draft_length: int, limits: EngineLimits,
                      settings: SimulationSettings, adaptive: bool = False) -> SimulationConfig:
    """The :class:`sdplan.simulate.SimulationConfig` of one rate and draft length of the scenario.

    Request lengths are drawn from the scenario's histogram when it has one (seeded with ``seed + 10000``),
    else every request has the workload's lengths. ``adaptive`` runs the goodput policy over "off" and every
    candidate (drafting up to the longest) instead of ``draft_length``.

    Raises
    ------
    InvalidValueError
        If the simulation would need more memory than :func:`sdplan.limits.check_simulation_memory` allows.
    """
    acceptance, lengths = scenario.workload.acceptance, scenario.lengths
    k = max(scenario.draft_lengths) if adaptive else draft_length
    per_cycle = float(acceptance.tokens_per_cycle([k])[0, 0]) if k else 1.0
    longest = max(lengths[1]) if lengths is not None else scenario.workload.output_tokens
    check_simulation_memory(settings.requests, longest, k, per_cycle, limits.max_num_seqs)
    # a cycle without a draft accepts nothing: P(A >= j) = c r_j, so E = c E_d + 1 - c (with_coverage)
    if not k:
        rates: tuple[float, ...] = ()
    elif acceptance.position_rates is not None:
        rates = tuple(acceptance.coverage * r for r in acceptance.position_rates[:k])
    else:
        rates = tuple(acceptance.coverage * acceptance.alphas[0] ** (j + 1) for j in range(k))
    prompts: Any = scenario.workload.prompt_tokens
    outputs: Any = scenario.workload.output_tokens
    if lengths is not None:
        rng = np.random.default_rng(settings.seed + 10_000)
        weights = np.asarray(lengths[2]) / sum(lengths[2])
        pick = rng.choice(len(weights), size=settings.requests, p=weights)
        prompts, outputs = np.asarray(lengths[0])[pick], np.asarray(lengths[1])[pick]
    return SimulationConfig(
        rate_rps=rate_rps, draft_length=k, position_rates=rates, requests=settings.requests,
        prompt_tokens=prompts, output_tokens=outputs, arrival_cv=settings.arrival_cv,
        max_num_seqs=limits.max_num_seqs, max_num_batched_tokens=limits.max_num_batched_tokens,
        kv_cache_tokens=limits.kv_cache_tokens if limits.kv_cache_tokens is not None else math.inf,
        kv_hold=limits.kv_hold, moe=scenario.moe,
        adaptive_draft_lengths=(0, *scenario.draft_lengths) if adaptive else None)
