"""``sdplan simulate`` as one use case: a typed query in, a typed answer out.

The command parses its options into a :class:`SimulateQuery`, resolves the
scenario (:func:`sdplan.planning.scenario.resolve_scenario`) and calls
:func:`answer_simulate`. Every rule of the command lives here: the MoE
refusal, the default rates (fractions of the no-SD saturation rate), the work
budgets, which draft length each rate runs (given, off, the model's best
static k, or the goodput policy beside it), the engine limits of that
server, and the warnings. The text, JSON, CSV and plots are built from the
:class:`SimulateAnswer` alone (``sdplan/render/simulate.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sdplan.inputs.serving import batch_cap_warning
from sdplan.limits import check_simulation, check_table
from sdplan.planning import planner
from sdplan.planning.simulation_inputs import simulation_config
from sdplan.simulate import replicate

if TYPE_CHECKING:
    from sdplan.inputs.serving import EngineLimits
    from sdplan.planning.planner import Plan
    from sdplan.planning.scenario import Scenario
    from sdplan.planning.simulation_inputs import SimulationSettings
    from sdplan.simulate import RateSummary

#: Progress of the simulations, for a progress bar: (requests done, requests in all, the rate simulated now).
Progress = Callable[[int, int, str], None]

#: The default rates, as fractions of the no-SD saturation rate: light load to near saturation.
DEFAULT_RATE_FRACTIONS = (0.25, 0.5, 0.75, 0.9)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulateQuery:
    """What ``sdplan simulate`` asks of a scenario.

    Attributes
    ----------
    settings : SimulationSettings
        Requests, replications, first seed and arrival variability.
    rates_rps : tuple of float, optional
        Request rates (> 0) to simulate; None: :data:`DEFAULT_RATE_FRACTIONS` of the no-SD saturation rate.
    draft_length : str
        A number, ``off``, ``best`` (the model's best static k per rate) or ``goodput`` (k chosen every step).
    for_table : bool
        The answer is shown as a table, whose size is bounded (:func:`sdplan.limits.check_table`).
    lengths_file : str, optional
        The request-length histogram's file, reported with the answer (the scenario holds its contents).
    """

    settings: SimulationSettings
    rates_rps: tuple[float, ...] | None = None
    draft_length: str = "best"
    for_table: bool = False
    lengths_file: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulateAnswer:
    """Everything ``sdplan simulate`` reports: the views read this and nothing else.

    Attributes
    ----------
    scenario : Scenario
        What was simulated: calibration, workload, acceptance, engine limits as given.
    query : SimulateQuery
        What was asked (settings, draft length, lengths file).
    summaries : tuple of RateSummary
        Per rate, the statistics over replications with the analytic mean beside them.
    limits : tuple of EngineLimits
        The engine limits each rate was simulated with (those of the server running its draft length).
    warnings : tuple of str
        Calibrated range, rates whose mean batch reaches a cap, rates not at steady state, the scenario's notes.
    """

    scenario: Scenario
    query: SimulateQuery
    summaries: tuple[RateSummary, ...]
    limits: tuple[EngineLimits, ...]
    warnings: tuple[str, ...]


def _planned(scenario: Scenario, rates: list[float]) -> Plan:
    """The model at ``rates`` as ``plan`` gives it: the scenario's MoE coverage and engine batch caps."""
    return planner.plan(scenario.coefficients, rates, scenario.draft_lengths, scenario.workload.acceptance.alphas,
                        tokens_per_cycle=scenario.tokens_per_cycle, moe=scenario.moe,
                        batch_caps=scenario.limits.caps(scenario.draft_lengths))


def default_rates(scenario: Scenario) -> list[float]:
    """:data:`DEFAULT_RATE_FRACTIONS` of the no-SD saturation rate (req/s, 4 decimals) ``plan`` gives: ``1/C2``,
    or the rate at which the engine's batch cap fills where that is lower (a KV cache that holds few requests)."""
    saturation = _planned(scenario, [0.0]).baseline_saturation_rate_rps
    return [round(f * saturation, 4) for f in DEFAULT_RATE_FRACTIONS]


def answer_simulate(scenario: Scenario, query: SimulateQuery, progress: Progress | None = None) -> SimulateAnswer:
    """Simulate every rate of ``query`` with its draft length; the statistics, limits and warnings.

    Raises
    ------
    LimitError
        The simulations (or, for a table, its rows) are over the work budget.
    """
    rates = list(query.rates_rps) if query.rates_rps is not None else default_rates(scenario)
    settings = query.settings
    check_simulation(settings.requests, settings.seeds, len(rates), "rates")
    if query.for_table:
        check_table(1, len(rates), "give fewer --rates")
    result = _planned(scenario, rates)  # the model's best static k and mean at each rate
    summaries, limits = _simulate_rates(scenario, result, query.draft_length, settings, progress)
    return SimulateAnswer(scenario=scenario, query=query, summaries=tuple(summaries), limits=tuple(limits),
                          warnings=tuple(_warnings(scenario, summaries, limits)))


def _simulate_rates(scenario: Scenario, result: Plan, draft_length: str, settings: SimulationSettings,
                    progress: Progress | None) -> tuple[list[RateSummary], list[EngineLimits]]:
    """Simulate every rate of ``result`` with the draft length chosen there; with each rate's engine limits."""
    rates = [float(rate) for rate in result.rates_rps]
    total = len(rates) * settings.seeds * settings.requests
    candidates = scenario.draft_lengths
    summaries, limits = [], []
    for ir, rate in enumerate(rates):
        if draft_length == "off":
            k = 0
        elif draft_length in ("best", "goodput"):
            k = max(int(result.best_k[0, ir]), 0)
        else:
            k = int(draft_length)
        analytic = float(result.baseline_latency_s[ir] if k == 0 else result.latency_s[0, ir, candidates.index(k)])
        adaptive = draft_length == "goodput"
        # the server that runs this draft length (the longest, for goodput)
        limits.append(scenario.limits_for([max(candidates)] if adaptive else [k]))
        config = simulation_config(scenario, rate, k, limits[-1], settings, adaptive=adaptive)

        def report(completed: int, _: int, base: int = ir * settings.seeds * settings.requests,
                   rate: float = rate) -> None:
            if progress is not None:
                progress(base + completed, total, f"{rate:g} req/s")

        summary = replicate(scenario.coefficients, config, settings.seeds, settings.seed, analytic, report)
        # the goodput policy is reported beside the model's best static k
        summaries.append(replace(summary, draft_length=k) if adaptive else summary)
    return summaries, limits


def _warnings(scenario: Scenario, summaries: list[RateSummary], limits: list[EngineLimits]) -> list[str]:
    """Calibrated range, the rates whose mean batch reaches the batch cap, and rates not at steady state."""
    workload = scenario.workload
    batches = [float(summary.rate_rps * summary.analytic_e2e_s) for summary in summaries]
    finite = [b for b in batches if math.isfinite(b)]
    warnings = scenario.calibration.validity_warnings(workload.prompt_tokens, workload.output_tokens,
                                                      max(finite) if finite else None,
                                                      {summary.draft_length for summary in summaries})
    over = [(f"{s.rate_rps:g}", its) for s, b, its in zip(summaries, batches, limits)
            if its.reached(b)]
    for its in dict.fromkeys(its for _, its in over):
        at = ", ".join(rate for rate, other in over if other == its)
        warnings.append(batch_cap_warning(its, f"at {at} req/s"))
    unsteady = [f"{s.rate_rps:g}" for s in summaries if not s.steady]
    if unsteady:
        warnings.append(f"not at steady state at {', '.join(unsteady)} req/s: the queue kept growing during the "
                        "run (past saturation), so those statistics grow with --requests and are no steady-state "
                        "values")
    return warnings + scenario.notes()
