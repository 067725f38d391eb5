"""The SLO gate: predict one operating point and check every SLO against it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sdplan.errors import ExitStatus, InvalidValueError
from sdplan.inputs.slo import SLO, OperatingPoint, Verdict, evaluate
from sdplan.latency import model
from sdplan.latency.closed_loop import admitted_clients, closed_loop_point
from sdplan.planning import planner
from sdplan.planning.closed_loop_answer import closed_loop_plan

if TYPE_CHECKING:
    from sdplan.inputs.serving import BatchCap, EngineLimits
    from sdplan.latency.coefficients import Coefficients
    from sdplan.planning.scenario import Scenario


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckReport:
    """Outcome of ``sdplan check``.

    Attributes
    ----------
    draft_length : int
        The draft length evaluated; 0 means SD off.
    mode : str
        ``best`` (chosen by the planner among ``candidates``), ``fixed`` or ``off``.
    """

    rate_rps: float
    alpha: float
    mode: str
    draft_length: int
    candidates: tuple[int, ...]
    point: OperatingPoint
    batch: float
    regime: str
    verdicts: tuple[Verdict, ...]
    simulated: str | None = None
    #: With --simulate: whether every replication reached a steady state (the simulator's own stability).
    steady: bool = True
    #: What an unstable rate exceeds: ``saturation`` (1/C2), or the option's engine cap as a phrase
    #: (``the batch cap of 64 sequences: ...``, :meth:`sdplan.inputs.serving.EngineLimits.cap_phrase`).
    limit: str = "saturation"
    #: The checked option's engine cap and what sets it (None: checked without engine limits).
    batch_cap: BatchCap | None = None
    #: For ``best`` where no option is stable at the rate: the option that saturates last (0: SD off) and its
    #: saturation rate, req/s; None otherwise.
    most_stable: tuple[int, float] | None = None
    #: A closed loop's clients (``check --concurrency``), whose ``rate_rps`` is then the rate they complete;
    #: None for an open loop at ``rate_rps``.
    clients: int | None = None
    #: Requests the closed-loop run sends in all, whose opening wave the means include (None: a long run's steady
    #: state, or a calibration whose fitted TTFT holds its runs' waves).
    requests: int | None = None

    @property
    def passed(self) -> bool:
        return all(verdict.passed for verdict in self.verdicts)

    @property
    def exit_status(self) -> ExitStatus:
        return ExitStatus.OK if self.passed else ExitStatus.SLO_VIOLATED


def checked_lengths(slos: list[SLO], mode: str, draft_length: int | None, candidates: list[int]) -> list[int]:
    """The draft lengths a check evaluates: ``[draft_length]`` for ``fixed``, else ``candidates``.

    Raises
    ------
    InvalidValueError
        Without an SLO, or for a fixed draft length below 1.
    """
    if not slos:
        raise InvalidValueError("no SLO to check; give --slo (e.g. --slo 'e2e:mean<=2s') or slos in the workload file")
    if mode != "fixed":
        return candidates
    if draft_length is None or draft_length < 1:
        raise InvalidValueError("a fixed draft length must be >= 1")
    return [draft_length]


def run_check(
    coefficients: Coefficients,
    rate_rps: float,
    alpha: float,
    mode: str,
    draft_length: int | None,
    candidates: list[int],
    slos: list[SLO],
    tokens_per_cycle: object = None,
    moe: object = None,
    limits: EngineLimits | None = None,
) -> CheckReport:
    """Evaluate the configuration at ``rate_rps`` and check ``slos``.

    ``mode`` is ``best`` (the latency-optimal option among no SD and
    ``candidates``), ``fixed`` (``draft_length``) or ``off`` (no SD). With ``limits``, each option
    saturates at its engine cap too (:func:`sdplan.planning.planner.plan`'s ``batch_caps``).
    """
    ks = checked_lengths(slos, mode, draft_length, candidates)
    result = planner.plan(coefficients, [rate_rps], ks, [alpha], tokens_per_cycle=tokens_per_cycle,  # type: ignore[arg-type]
                          moe=moe, batch_caps=None if limits is None else limits.caps(ks))  # type: ignore[arg-type]
    most_stable = None
    if mode == "off":
        chosen = 0
    elif mode == "fixed":
        chosen = int(draft_length)  # type: ignore[arg-type]
    else:
        best = int(result.best_k[0, 0])
        chosen = best if best != planner.NONE_STABLE else 0
        if best == planner.NONE_STABLE:  # past every option's saturation: say how far the best one goes
            rates = [result.baseline_saturation_rate_rps, *result.saturation_rate_rps[0].tolist()]
            last = planner.last_saturating(rates)
            most_stable = None if last is None else ((0, *ks)[last], float(rates[last]))
    if chosen == 0:
        latency, batch, rho = (result.baseline_latency_s[0], result.baseline_batch[0], result.baseline_utilisation[0])
        ttft = float(result.baseline_ttft_load_s[0])
        bound = result.baseline_saturation_limit
    else:
        ik = ks.index(chosen)
        latency, batch, rho = result.latency_s[0, 0, ik], result.batch[0, 0, ik], result.utilisation[0, 0, ik]
        ttft = float(result.ttft_load_s[0, 0, ik])
        bound = str(result.saturation_limit[0, ik])
    limit = f"the {limits.cap_phrase(chosen)}" if bound == "cap" and limits is not None else "saturation"
    g = coefficients.output_tokens
    tpot = float(model.time_per_output_token(latency, ttft, g)) if g > 1 else float("nan")
    point = OperatingPoint(
        e2e_s=float(latency),
        ttft_s=ttft,
        tpot_s=tpot,
        throughput_tok_s=rate_rps * g,
        utilisation=float(rho),
    )
    return CheckReport(
        rate_rps=float(rate_rps),
        alpha=float(alpha),
        mode=mode,
        draft_length=chosen,
        candidates=tuple(ks),
        point=point,
        batch=float(batch),
        regime=str(model.regime(rho)),
        verdicts=tuple(evaluate(slos, point)),
        limit=limit,
        batch_cap=None if limits is None else limits.cap_of(chosen),
        most_stable=most_stable,
    )


def run_closed_loop_check(scenario: Scenario, clients: int, mode: str, draft_length: int | None,
                          slos: list[SLO], requests: int | None = None) -> CheckReport:
    """Evaluate the configuration with ``clients`` requests kept in flight (a closed loop) and check ``slos``.

    Each option is priced as ``sdplan plan --concurrency`` prices it
    (:func:`sdplan.planning.closed_loop_answer.closed_loop_plan`), over a run of ``requests`` in all where given
    (its opening wave included); ``best`` takes the one with the shortest
    latency among no SD and ``scenario.draft_lengths``. The point's rate is what the clients complete,
    ``X = N / L``, its throughput ``g X``, and its utilisation ``X`` over the most the option completes (a
    closed loop at its engine cap): 1 from the cap on, where the other clients wait for admission. A closed
    loop has a steady state at every concurrency, so only an option that serves no request of the workload
    fails every SLO as unstable.
    """
    ks = checked_lengths(slos, mode, draft_length, [] if mode == "off" else list(scenario.draft_lengths))
    acceptance = scenario.workload.acceptance
    evaluated = replace(scenario, draft_lengths=ks, tokens_per_cycle=acceptance.tokens_per_cycle(ks))
    result = closed_loop_plan(evaluated, (clients,), requests)
    option = int(result.best[0, 0]) if mode == "best" else (1 if mode == "fixed" else 0)
    chosen = 0 if option == 0 else ks[option - 1]
    latency, ttft = float(result.latency_s[0, 0, option]), float(result.ttft_s[0, 0, option])
    running = int(result.running[0, option])
    cap = evaluated.limits.caps(ks)[option]
    per_cycle = 1.0 if chosen == 0 else float(result.tokens_per_cycle[0, option - 1])
    served = latency < float("inf")
    rate = float(result.throughput_rps[0, 0, option])  # N / L: 0 where the option serves nothing
    if served:
        full_engine = admitted_clients(int(cap) + 1, cap)  # more clients than the cap: it runs full
        full = closed_loop_point(evaluated.coefficients, chosen, per_cycle, full_engine, evaluated.moe, cap)
        utilisation = min(rate / full.throughput_rps, 1.0)
    else:
        utilisation = float("inf")
    point = OperatingPoint(e2e_s=latency, ttft_s=ttft, tpot_s=float(result.tpot_s[0, 0, option]),
                           throughput_tok_s=float(result.output_throughput_tok_s[0, 0, option]),
                           utilisation=utilisation)
    regime = "unstable" if not served else ("waiting_for_admission" if running < clients else "stable")
    return CheckReport(
        rate_rps=rate, alpha=float(evaluated.alpha), mode=mode, draft_length=chosen, candidates=tuple(ks), point=point,
        batch=float(running), regime=regime, verdicts=tuple(evaluate(slos, point, stable=served)),
        limit=f"the {evaluated.limits.cap_phrase(chosen)}", batch_cap=evaluated.limits.cap_of(chosen), clients=clients,
        requests=result.requests)


def simulated_value(slo: SLO, summary: object, utilisation: float) -> float:
    """The simulated counterpart of an SLO's metric (``sdplan.simulate.RateSummary``).

    Latency SLOs use the simulated mean or percentile (averaged over
    replications); throughput the simulated output tokens per second;
    utilisation stays the model's ``lambda C2``.
    """
    metric = slo.metric.value
    if metric in ("e2e", "ttft", "tpot"):
        return float(summary.stats[(metric, slo.statistic)].value)  # type: ignore[attr-defined]
    if metric == "throughput":
        return float(summary.throughput_tok_s.value)  # type: ignore[attr-defined]
    return utilisation


def simulated_verdicts(report: CheckReport, slos: list[SLO], summary: object) -> CheckReport:
    """Re-check ``slos`` with statistics from the simulator (``sdplan.simulate.RateSummary``).

    Values come from :func:`simulated_value`. Stability is the simulator's
    own (a queue that keeps growing, :attr:`sdplan.simulate.RateSummary.steady`),
    not the analytic ``lambda C2 < 1`` at the nominal lengths: with a length
    histogram or a batch cap the two differ.
    """

    steady = bool(summary.steady)  # type: ignore[attr-defined]
    verdicts = []
    for slo in slos:
        value = simulated_value(slo, summary, report.point.utilisation)
        passed = steady and slo.holds(value)
        verdicts.append(Verdict(slo=slo, predicted=value, passed=passed, margin=slo.margin(value)))
    description = f"simulated, {summary.replications} x {summary.requests} requests"  # type: ignore[attr-defined]
    regime = "unstable" if not steady else ("stable" if report.regime == "unstable" else report.regime)
    return replace(report, verdicts=tuple(verdicts), simulated=description, steady=steady, regime=regime)
