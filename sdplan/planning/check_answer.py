"""``sdplan check`` as one use case: a typed query in, a typed answer out.

The command parses its options into a :class:`CheckQuery`, resolves the
scenario (:func:`sdplan.planning.scenario.resolve_scenario`) and calls
:func:`answer_check`; the text and JSON views, the summary line and the
GitHub annotations are built from the :class:`CheckAnswer` alone
(``sdplan/render/check.py``), and its exit status is the verdict's.

The rules of the gate live here or in :mod:`sdplan.planning.check`: the load (the
command line's rate or concurrency, else the workload file's ``traffic.request_rate_rps`` or
``traffic.concurrency``), the
draft length (the command line, else the workload file's speculation mode,
else the best), the servers' speed margin, the pessimistic end of each
prediction's 95% interval, the simulator's verdicts, and the warnings where
the answer leaves the model's domain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sdplan.errors import ExitStatus, InvalidValueError
from sdplan.inputs.serving import EngineLimits, batch_cap_warning
from sdplan.inputs.slo import SLO, Metric, resolve_slos
from sdplan.inputs.workload import measured_draft_lengths
from sdplan.latency import model
from sdplan.latency.coefficients import Coefficients
from sdplan.limits import check_simulation
from sdplan.planning.check import CheckReport, run_check, run_closed_loop_check, simulated_verdicts
from sdplan.planning.closed_loop_answer import opening_wave_warning
from sdplan.planning.scenario import Scenario
from sdplan.planning.simulation_inputs import SimulationSettings, simulation_config
from sdplan.planning.uncertainty import (
    LEVEL,
    SpeedMargin,
    coefficient_draws,
    covers,
    on_slower_server,
    pessimistic_verdicts,
    server_spread_pct,
    speed_margin,
)
from sdplan.simulate import replicate


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckQuery:
    """What ``sdplan check`` asks of a scenario; None where not given (the workload file's value then holds).

    Attributes
    ----------
    rate_rps : float, optional
        The request rate to check, req/s (>= 0); None: the workload file's.
    clients : int, optional
        Check a closed loop of this many clients instead of a rate
        (:func:`sdplan.planning.check.run_closed_loop_check`).
    requests : int, optional
        The requests the closed-loop run sends in all (``--num-prompts``), whose opening wave the means
        include; None: the workload file's, else a long run's steady state.
    slos : tuple of str
        SLO expressions; empty: the workload file's.
    draft_length : str, optional
        ``best`` (the latency-optimal option), ``off`` or a draft length as text; None: the workload
        file's speculation mode, else ``best``.
    use_simulator : bool
        Take every latency verdict from the simulator (percentile SLOs allowed), with ``simulation``.
    pessimistic : bool
        Gate on the pessimistic end of each prediction's 95% interval (needs a covariance).
    at_calibrated_speed : bool
        Check on the calibration's own costs, without its speed margin (:func:`answer_check`).
    """

    rate_rps: float | None = None
    clients: int | None = None
    requests: int | None = None
    slos: tuple[str, ...] = ()
    draft_length: str | None = None
    use_simulator: bool = False
    pessimistic: bool = False
    simulation: SimulationSettings = SimulationSettings(requests=20_000, seeds=3, seed=0, arrival_cv=1.0)
    at_calibrated_speed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class VerdictIntervals:
    """The 95% interval of each SLO's prediction, whose pessimistic end ``check --pessimistic`` gates on.

    Attributes
    ----------
    intervals : dict of str to (low, high)
        Per SLO text; ``high`` is ``inf`` where some draws are unstable.
    server_sd_pct : float or None
        The spread between server instances the draws include; None: none.
    level : float
        The interval's coverage.
    """

    intervals: dict[str, tuple[float, float]]
    server_sd_pct: float | None
    level: float = LEVEL

    @property
    def covers(self) -> str:
        """What the intervals cover, in words."""
        return covers(self.server_sd_pct)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckAnswer:
    """Everything ``sdplan check`` reports: the views and the exit status read this and nothing else.

    Attributes
    ----------
    scenario : Scenario
        What was evaluated: calibration, workload, acceptance, engine limits.
    report : CheckReport
        The operating point and one verdict per SLO (simulated or pessimistic ones where asked).
    warnings : tuple of str
        Where the answer leaves the model's domain, and candidates left out.
    pessimistic : VerdictIntervals or None
        The intervals the verdicts were checked at (``pessimistic`` queries only).
    speed_margin : SpeedMargin or None
        The servers' speed the rate is checked on; None for calibrations not measured on servers.
    other_speed : CheckReport or None
        The model's check on the other side of the margin (at the calibration's speed when the margin is
        applied, on the slower server when not); None without a measured spread or when simulated.
    """

    scenario: Scenario
    report: CheckReport
    warnings: tuple[str, ...]
    pessimistic: VerdictIntervals | None = None
    speed_margin: SpeedMargin | None = None
    other_speed: CheckReport | None = None

    @property
    def exit_status(self) -> ExitStatus:
        """0 when every SLO is met, 1 when one is missed."""
        return self.report.exit_status


def answer_check(scenario: Scenario, query: CheckQuery) -> CheckAnswer:
    """Predict the operating point at the rate (or of ``query.clients`` in a closed loop) and check every SLO
    against it.

    As ``capacity`` (:func:`sdplan.planning.capacity_answer.answer_capacity`), a calibration that measured its servers'
    spread is checked on a server ``u = exp(z sigma / sqrt(n))`` times slower than its own
    (:func:`sdplan.planning.uncertainty.calibration_speed_margin`): a rate that ``capacity`` says a replica serves
    passes ``check`` there, and no faster. ``query.at_calibrated_speed`` checks at the calibration's speed.
    ``pessimistic`` gates on the 95% intervals of the calibration's draws, which are not shifted by ``u``:
    each draw already runs on a server of its own speed with the whole spread ``sigma``, so shifting them
    as well would count the spread twice.

    Raises
    ------
    InvalidValueError
        Without a rate or an SLO, for a draft length past the measured acceptance, ``pessimistic`` without a
        covariance, ``use_simulator`` with an MoE calibration or a zero rate, ``clients`` beside a rate,
        ``use_simulator`` or ``pessimistic``, or more work than the budgets allow.
    """
    file = scenario.file
    rate = 0.0  # a closed loop's rate is what its clients complete (run_closed_loop_check)
    if query.clients is None and query.rate_rps is None and file is not None and file.concurrency is not None:
        query = replace(query, clients=file.concurrency)  # the file's closed loop, where no flag gives the load
        if query.requests is None:
            query = replace(query, requests=file.num_prompts)
    if query.clients is not None:
        _closed_loop_usage(query)
    else:
        given = query.rate_rps if query.rate_rps is not None else (file.request_rate_rps if file else None)
        if given is None:
            raise InvalidValueError("no request rate to check; give --rate RPS (or --concurrency N) or "
                                    "traffic.request_rate_rps in the workload")
        if given < 0:
            raise InvalidValueError(f"the request rate must be >= 0 req/s, not {given:g}")
        rate = given
        if query.requests is not None:
            raise InvalidValueError("--num-prompts gives the requests a closed-loop run sends: check it with "
                                    "--concurrency N, or drop it")
    choice = query.draft_length
    if choice is None and file is not None and file.mode is not None:
        choice = {"best": "best", "off": "off", "fixed": str(file.draft_length)}[file.mode]
    choice = choice or "best"
    mode = choice if choice in ("best", "off") else "fixed"
    fixed = int(choice) if mode == "fixed" else None
    if fixed:
        measured_draft_lengths(scenario.workload.acceptance, [fixed], given=True)  # past the measured k: an error
    tokens = scenario.workload.acceptance.tokens_per_cycle([fixed] if fixed else scenario.draft_lengths)
    slos = resolve_slos(query.slos, file, allow_percentiles=query.use_simulator)
    margin = speed_margin(scenario.calibration, query.at_calibrated_speed)
    calibrated = scenario
    if margin is not None and margin.measured:
        slower = replace(scenario, coefficients=on_slower_server(scenario.coefficients, margin.factor))
        scenario, other = (slower, calibrated) if margin.applied else (calibrated, slower)
    else:
        other = None

    def check_on(evaluated: Scenario) -> CheckReport:
        if query.clients is not None:
            return run_closed_loop_check(evaluated, query.clients, mode, fixed, slos, query.requests)
        return run_check(evaluated.coefficients, rate, evaluated.alpha, mode, fixed, evaluated.draft_lengths, slos,
                         tokens_per_cycle=tokens, moe=evaluated.moe, limits=evaluated.limits)

    report = check_on(scenario)
    intervals = None
    if query.pessimistic:
        if query.use_simulator:
            raise InvalidValueError("--pessimistic and --simulate do not combine: intervals come from the analytic "
                                    "model over the calibration's covariance")
        report, intervals = _pessimistic(scenario, report, slos)
    limits = scenario.limits_for([report.draft_length])  # the server that runs the chosen option
    limits.require_fit(scenario.request_tokens)
    if query.use_simulator:
        report = _simulated(scenario, report, slos, limits, query.simulation)
    return CheckAnswer(scenario=scenario, report=report,
                       warnings=tuple(_warnings(scenario, report, limits, query.requests)),
                       pessimistic=intervals, speed_margin=margin,
                       other_speed=None if other is None or query.use_simulator else check_on(other))


def _closed_loop_usage(query: CheckQuery) -> None:
    """Refuse what a closed loop's check does not combine with (one line naming the option)."""
    if query.rate_rps is not None:
        raise InvalidValueError("--rate and --concurrency: give one, a request rate (open loop) or the clients kept "
                                "in flight (closed loop)")
    if query.use_simulator:
        raise InvalidValueError("--simulate runs an open loop (arrivals at a rate), not --concurrency's closed loop: "
                                "drop --simulate, or check a --rate")
    if query.pessimistic:
        raise InvalidValueError("--pessimistic: the 95% intervals are computed at a request rate; drop it, or check "
                                "a --rate")


def _pessimistic(scenario: Scenario, report: CheckReport, slos: list[SLO]) -> tuple[CheckReport, VerdictIntervals]:
    """The report re-checked at the pessimistic end of each prediction's 95% interval, and the intervals."""
    calibration, workload, candidates = scenario.calibration, scenario.workload, scenario.draft_lengths
    if "uncertainty" not in calibration.document:
        raise InvalidValueError(f"--pessimistic needs a calibration with a covariance ([uncertainty]); "
                                f"{calibration.name} has none: fit one (sdplan fit, sdplan calibrate)")
    chosen = report.draft_length
    option_tokens = workload.acceptance.tokens_per_cycle([chosen] if chosen else candidates)
    draws = coefficient_draws(calibration, workload.prompt_tokens, workload.output_tokens,
                              options=([chosen] if chosen else candidates, option_tokens))
    if draws is None:
        option = f"SD k={chosen}" if chosen else "the candidate draft lengths"
        raise InvalidValueError(f"--pessimistic: {calibration.name}'s covariance gives positive demands "
                                f"in under a quarter of its draws at {option}, so the fit does not determine "
                                "it; measure that draft length (sdplan calibrate --draft-lengths)")

    def check_draw(drawn: Coefficients) -> CheckReport:
        return run_check(drawn, report.rate_rps, scenario.alpha, "fixed" if chosen else "off", chosen or None,
                         candidates, slos, tokens_per_cycle=option_tokens, moe=scenario.moe, limits=scenario.limits)

    checked, intervals = pessimistic_verdicts(report, slos, draws, check_draw)
    return checked, VerdictIntervals(intervals=intervals, server_sd_pct=server_spread_pct(calibration))


def _simulated(scenario: Scenario, report: CheckReport, slos: list[SLO], limits: EngineLimits,
               settings: SimulationSettings) -> CheckReport:
    """The report with every latency verdict from the simulator's statistics."""
    if report.rate_rps <= 0:
        raise InvalidValueError("--simulate needs a rate > 0 req/s")
    check_simulation(settings.requests, settings.seeds, 1, "rate")
    config = simulation_config(scenario, report.rate_rps, report.draft_length, limits, settings)
    summary = replicate(scenario.coefficients, config, settings.seeds, settings.seed, report.point.e2e_s)
    return simulated_verdicts(report, slos, summary)


def _warnings(scenario: Scenario, report: CheckReport, limits: EngineLimits,
              requests: int | None = None) -> list[str]:
    """Where the answer is outside the model's domain: calibrated range, batch cap (for a closed loop, the clients
    that wait for admission, and the opening wave of a run of ``requests``), prefill load, no steady state, and a
    TTFT SLO judged on a file whose TTFT was priced, not measured.

    An unstable rate fails every SLO anyway, so the batch cap is only said of a finite batch; the prefill
    interference warning reads the model's utilisation, so simulated answers leave it out.
    """
    rate = report.rate_rps
    warnings = scenario.calibration.validity_warnings(scenario.workload.prompt_tokens,
                                                      scenario.workload.output_tokens, report.batch,
                                                      (report.draft_length,))
    priced_ttft = scenario.calibration.priced_ttft_warning([verdict.slo.metric.value for verdict in report.verdicts])
    if priced_ttft is not None:
        warnings.append(priced_ttft)
    if report.clients is not None:
        if report.regime == "waiting_for_admission":
            option = f"k={report.draft_length}" if report.draft_length else "no SD"  # as plan --concurrency says
            warnings.append(f"at {report.clients} clients {option} runs {report.batch:.0f} "
                            f"({limits.cap_phrase(report.draft_length)}); the other "
                            f"{report.clients - int(report.batch)} wait for admission (priced: latency x N/cap, the "
                            "wait added to TTFT)")
        # the wave moves TTFT, and TPOT = (L - TTFT)/(g - 1) with it; not the latency or the throughput N/L
        moved = any(verdict.slo.metric in (Metric.TTFT, Metric.TPOT) for verdict in report.verdicts)
        wave = opening_wave_warning(scenario, requests, (report.clients,)) if moved or requests else None
        if wave is not None:
            warnings.append(wave)
    elif report.simulated is None:
        if math.isfinite(report.batch) and limits.reached(report.batch):
            warnings.append(batch_cap_warning(limits, f"at {rate:g} req/s (effective batch {report.batch:.4g} "
                                              "requests)"))
        if report.point.utilisation < 1.0:
            c2 = report.point.utilisation / rate if rate > 0 else 0.0
            interference = model.prefill_interference_warning(scenario.coefficients.c2p_s, c2,
                                                              report.point.utilisation)
            if interference is not None:
                warnings.append(interference)
    if report.simulated is not None and not report.steady:
        warnings.append("the simulation did not reach a steady state at this rate (the queue keeps growing): "
                        "every SLO fails")
    return warnings + scenario.notes()
