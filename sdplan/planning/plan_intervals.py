"""The 95% intervals of ``sdplan plan``, added to a :class:`sdplan.planning.plan_answer.PlanAnswer`.

A module of its own so that a plain plan, whose calibration has no
covariance, does not load :mod:`sdplan.planning.uncertainty` and the fit's parameter
tables (cold start); the command calls :func:`with_intervals` only when
:attr:`~sdplan.planning.plan_answer.PlanAnswer.intervals_apply`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from sdplan.planning.uncertainty import coefficient_draws, plan_intervals, server_spread_pct

if TYPE_CHECKING:
    from sdplan.planning.plan_answer import PlanAnswer
    from sdplan.planning.scenario import Scenario


def with_intervals(scenario: Scenario, answer: PlanAnswer) -> PlanAnswer:
    """``answer`` with 95% intervals from the calibration's covariance and server spread (unchanged without draws)."""
    workload, result = scenario.workload, answer.plan
    draws = coefficient_draws(scenario.calibration, workload.prompt_tokens, workload.output_tokens,
                              options=(scenario.draft_lengths, scenario.tokens_per_cycle))
    if draws is None:
        return answer
    intervals = plan_intervals(draws, result.alphas, result.rates_rps, result.draft_lengths,
                               scenario.tokens_per_cycle, server_sd_pct=server_spread_pct(scenario.calibration))
    return replace(answer, inputs=replace(answer.inputs, intervals=intervals))
