"""``sdplan plan`` as one use case: a typed query in, a typed answer out.

The command parses its options into a :class:`PlanQuery`, resolves the
scenario (:func:`sdplan.planning.scenario.resolve_scenario`) and calls
:func:`answer_plan`. Every rule of the command lives here: the default rate
grid, the work budgets, the refusal to plan SD from a calibration fitted
without SD runs, and the warnings (calibrated range, the model's domain,
coefficients the runs did not identify, the scenario's notes). The text,
JSON, CSV and plots are built from the :class:`PlanAnswer` alone
(``sdplan/render/plan.py``).

The 95% intervals are the one part kept apart: they need the coefficient
draws of :mod:`sdplan.planning.uncertainty`, which a plain plan does not load (cold
start). :attr:`PlanAnswer.intervals_apply` states when they apply, and
:func:`sdplan.planning.plan_intervals.with_intervals` adds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sdplan.errors import InputFileError
from sdplan.latency.coefficients import SPECULATIVE_PARAMETERS
from sdplan.limits import check_grid, check_table
from sdplan.planning import planner

if TYPE_CHECKING:
    from sdplan.calibration import Calibration
    from sdplan.planning.planner import Plan, PlanInputs
    from sdplan.planning.scenario import Scenario


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanQuery:
    """What ``sdplan plan`` asks of a scenario.

    Attributes
    ----------
    rates_rps : tuple of float, optional
        Request rates to evaluate; None: :func:`sdplan.planning.planner.default_rates`.
    goodput_policy : bool
        Also evaluate the goodput policy (k per step at the load's batch size).
    for_table : bool
        The answer is shown as a table, whose size is bounded (:func:`sdplan.limits.check_table`).
    """

    rates_rps: tuple[float, ...] | None = None
    goodput_policy: bool = False
    for_table: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanAnswer:
    """Everything ``sdplan plan`` reports: the views read this and nothing else.

    Attributes
    ----------
    plan : Plan
        Latency, batch, speedup and best k per (acceptance, rate, draft length).
    inputs : PlanInputs
        What the plan was computed from, its warnings, and its intervals once added.
    batch_cap : int or None
        The largest batch size the calibration measured (its ``[validity]``), for the table's note.
    intervals_apply : bool
        Whether 95% intervals apply: a calibration with a covariance, no MoE, no goodput policy
        (:func:`sdplan.planning.plan_intervals.with_intervals` computes them).
    """

    plan: Plan
    inputs: PlanInputs
    batch_cap: int | None
    intervals_apply: bool


def check_speculation_identified(cal: Calibration) -> None:
    """Planning SD from a calibration fitted without SD runs is an error, not an extrapolation."""
    if set(cal.without_runs) >= set(SPECULATIVE_PARAMETERS):
        raise InputFileError(cal.path, "uncertainty.not_identified",
                             "was fitted from runs without SD, so SD cannot be planned with it; fit SD runs at two "
                             "or more draft lengths too (sdplan fit, sdplan calibrate --draft-lengths)")


def identification_warnings(cal: Calibration) -> list[str]:
    """The coefficients of ``cal`` its runs did not determine, in words: no runs, or standard errors above values."""
    missing = list(cal.without_runs)
    weak = [n for n in cal.not_identified if n not in missing]
    found = []
    if missing:
        found.append(f"{', '.join(missing)} of {cal.name} were not identified by its benchmark runs: draft lengths "
                     "other than those measured are extrapolated")
    if weak:
        found.append(f"{', '.join(weak)} of {cal.name} have standard errors above their values: its runs did not "
                     "determine them" + (", so how the latency splits between prefill and decode steps, and "
                                         "with it any other prompt or output length, is a guess; calibrate at "
                                         "two or more workloads (sdplan calibrate measures probes of its own)"
                                         if {"c1p_s", "c2p_s"} & set(weak) else ""))
    return found


def plan_inputs(scenario: Scenario, *, largest_batch: float | None, best_draft_lengths: set[int],
                load_warnings: list[str]) -> planner.PlanInputs:
    """What a plan of ``scenario`` was computed from, with its warnings in order: the calibration's valid ranges
    at the largest batch the answer runs and the draft lengths it picks, then ``load_warnings`` (where the answer
    leaves the model's domain), the coefficients the runs did not identify, and the scenario's notes."""
    cal, workload = scenario.calibration, scenario.workload
    return planner.PlanInputs(
        calibration_name=cal.name,
        calibration_path=cal.path,
        calibration_method=cal.method,
        calibration_provenance=cal.provenance,
        acceptance_description=workload.acceptance.describe(),
        acceptance=workload.acceptance,
        prompt_tokens=workload.prompt_tokens,
        output_tokens=workload.output_tokens,
        warnings=tuple(cal.validity_warnings(workload.prompt_tokens, workload.output_tokens, largest_batch,
                                             best_draft_lengths)
                       + load_warnings + identification_warnings(cal) + scenario.notes()),
        extrapolated=tuple(f"{name} {value:g}, measured {low:g}-{high:g}" for name, value, low, high
                           in cal.outside_measured(workload.prompt_tokens, workload.output_tokens)),
        batch_caps=scenario.limits.batch_caps(scenario.draft_lengths),
    )


def answer_plan(scenario: Scenario, query: PlanQuery) -> PlanAnswer:
    """Plan ``scenario`` over the query's rates (or the default grid): the plan, its inputs and warnings.

    Raises
    ------
    LimitError
        The grid (or, for a table, its rows) is over the work budget.
    InputFileError
        The calibration was fitted without SD runs (:func:`check_speculation_identified`).
    """
    cal, workload, draft_lengths = scenario.calibration, scenario.workload, scenario.draft_lengths
    alphas = list(workload.acceptance.alphas)
    tokens = scenario.tokens_per_cycle
    caps = scenario.limits.caps(draft_lengths)
    rates = (list(query.rates_rps) if query.rates_rps is not None
             else planner.default_rates(scenario.coefficients, draft_lengths, alphas, tokens_per_cycle=tokens,
                                        batch_caps=caps))
    check_grid(len(rates) * (len(draft_lengths) + 1) * len(alphas),
               f"{len(rates)} rates x {len(draft_lengths) + 1} draft lengths x {len(alphas)} acceptances",
               "give fewer --rates (a larger STEP), --draft-lengths or --acceptance values")
    if query.for_table:
        check_table(len(alphas), len(alphas) * len(rates), "give fewer --rates or --acceptance values")
    result = planner.plan(scenario.coefficients, rates, draft_lengths, alphas, tokens_per_cycle=tokens,
                          goodput_policy=query.goodput_policy, moe=scenario.moe, batch_caps=caps)
    check_speculation_identified(cal)
    inputs = plan_inputs(scenario, largest_batch=planner.largest_batch(result),
                         best_draft_lengths=planner.named_draft_lengths(result),
                         load_warnings=planner.domain_warnings(result, scenario.limits))
    return PlanAnswer(
        plan=result, inputs=inputs,
        batch_cap=(cal.document.get("validity") or {}).get("batch_size", [None, None])[-1],
        # only a fitted calibration has draws; MoE and the goodput policy have no interval model
        intervals_apply=scenario.moe is None and not query.goodput_policy and "uncertainty" in cal.document)
