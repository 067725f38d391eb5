"""The model's error against measured runs: mean E2E and TTFT per run, best draft length per load level.

Predictions use each run's *controlled* load (``sdplan validate``, hold-outs,
the accuracy benchmark): a closed loop of ``N`` clients is predicted as
``C1 + f (N - 1) C2`` and an open loop at its arrival rate ``lambda`` as
``C1/(1 - lambda C2)``, the planner's own formula (:mod:`sdplan.fitting.fit` explains
``f``). TTFT follows :func:`sdplan.latency.model.time_to_first_token` at the ``B`` the
model predicts. A mixture-of-experts target is predicted at the expert coverage
of that load, as the planner solves it (:func:`predict_latency`, :mod:`sdplan.latency.moe`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sdplan.errors import InfeasibleError
from sdplan.fitting.runmodel import (
    ALPHA_GROUP_TOLERANCE,
    LENGTH_GROUP_TOLERANCE,
    configuration_groups,
    r2,
    run_coefficients,
    run_demand,
    run_tokens_per_cycle,
    run_ttft,
)
from sdplan.fitting.steady_state import screen
from sdplan.inputs import serving
from sdplan.latency import closed_loop, knee, model
from sdplan.latency import moe as moe_model
from sdplan.latency.coefficients import Coefficients

if TYPE_CHECKING:
    from sdplan.calibration import Calibration
    from sdplan.inputs.serving import PrefillScheduling
    from sdplan.latency.moe import MoESpec
    from sdplan.runs import BenchmarkRun


def predict_latency(coefficients: Coefficients, run: BenchmarkRun, moe: MoESpec | None = None,
                    batch_cap: float | None = None) -> float:
    """Model mean latency (s) of a run from its controlled load; ``inf`` if unstable.

    Parameters
    ----------
    coefficients : Coefficients
        Cost coefficients at the run's workload.
    run : BenchmarkRun
        The measured run: its draft length, acceptance and controlled load.
    moe : MoESpec, optional
        A mixture-of-experts target's routing and coverage increments at the
        run's workload (:meth:`sdplan.calibration.Calibration.moe_at`); None
        for a dense target.
    batch_cap : float, optional
        Requests the engine holds at once for the run's workload (``max_num_seqs``, or what its KV cache
        holds). A closed loop of more clients than that keeps ``N_cap`` in flight and the rest waiting:
        each admitted request takes ``L_cap = C1 + f (N_cap - 1) C2``, the server completes ``N_cap / L_cap``
        a second, so by Little's law a client's request takes ``N L_cap / N_cap``
        (``docs/model.md#saturation-and-batch-cap``).

    Returns
    -------
    float
        Closed loop of ``N``: ``C1 + f (N - 1) C2`` (``f`` the calibration's
        closed-loop factor). Open loop: ``(C1 + W)/(1 - lambda C2)`` at the
        *arrival* rate (the achieved rate only when the file has no arrival
        rate), Kong et al. eq. 1 with the wait ``W`` for the prefills queued
        ahead. Past the target's compute-bound knee, with the demands above it
        (:mod:`sdplan.latency.knee`).

    Notes
    -----
    With ``moe`` the run is predicted as the planner solves the target
    (:mod:`sdplan.latency.moe`, Kong et al. eq. 4)::

        C(B) = C_u + phi(T) C_s,   T = t (1 + B),   phi(T) = 1 - (1 - m/M)**T,

    with ``t`` the tokens a sequence routes per step: 1 without SD, ``k + 1``
    for verification. A closed loop of ``N`` has ``B = N - 1`` others, so
    ``C1`` and ``C2`` are taken at ``phi(t N)`` (:func:`sdplan.latency.moe.at_coverage`).
    An open loop has ``B = lambda L``: ``L`` is the smallest fixed point of
    ``L = (C1(lambda L) + W)/(1 - lambda C2(lambda L))`` (:func:`sdplan.latency.moe.solve`; ``W`` the wait for the
    prefills queued ahead, :func:`sdplan.latency.knee.prefill_wait_s`).
    The prefill's terms are at ``phi(p)`` either way.
    """
    if run.concurrency is None and moe is not None:
        a1, a2 = run_demand(moe_model.at_coverage(coefficients, moe, 0.0), run)
        full1, full2 = run_demand(moe_model.at_coverage(coefficients, moe, 1.0), run)
        solved = moe_model.solve(a1, full1 - a1, a2, full2 - a2, closed_loop.routed_per_sequence(run.draft_length),
                                 run.arrival_rate_rps, moe, *moe_model.prefill_queue(coefficients, moe))
        return float(solved.latency_s)
    if run.concurrency is not None:
        return closed_loop.closed_loop_latency(run_coefficients(coefficients, run), run.draft_length,
                                               run_tokens_per_cycle(run), run.concurrency, moe, batch_cap)
    c1, c2 = run_demand(coefficients, run)
    return float(knee.mean_latency(c1, c2, run_knee(coefficients, run, c1, c2), run.arrival_rate_rps))


def run_knee(coefficients: Coefficients, run: BenchmarkRun, c1: float, c2: float) -> knee.KneeDemands:
    """The demands past the target's compute-bound knee of a run's configuration (:mod:`sdplan.latency.knee`):
    ``1 + c k`` rows a sequence at the run's measured draft coverage ``c`` (:func:`run_coefficients`), as
    ``c1`` and ``c2`` (:func:`run_demand`) are priced."""
    if run.draft_length == 0:
        return model.baseline_knee(coefficients, c1, c2)
    return model.speculative_knee(run_coefficients(coefficients, run), c1, c2, run_tokens_per_cycle(run),
                                  run.draft_length)


def predict_ttft(coefficients: Coefficients, run: BenchmarkRun, latency_s: float,
                 moe: MoESpec | None = None, batch_cap: float | None = None) -> float:
    """Model mean TTFT (s) of a run, at the ``B`` the model predicts for it.

    :func:`sdplan.fitting.runmodel.run_ttft` (the run's draft coverage and tokens per cycle, as
    :func:`predict_latency` and the fit's rows take them) with ``B = f (N - 1)`` for a
    closed loop and ``B = lambda L`` for an open loop; with ``moe``, on the
    coefficients at the coverage of that load, ``phi(t (1 + B))``
    (:func:`predict_latency`). A closed loop past its engine's ``batch_cap`` adds the wait for admission,
    the predicted latency less the admitted request's own ``L_cap`` (``latency_s (1 - N_cap / N)``).
    """
    if not math.isfinite(latency_s):
        return math.inf
    if run.concurrency is not None:
        return closed_loop.closed_loop_ttft(run_coefficients(coefficients, run), run.draft_length,
                                            run_tokens_per_cycle(run), run.concurrency, latency_s, moe, batch_cap)
    others = run.arrival_rate_rps * latency_s
    return run_ttft(covered(coefficients, run, moe, others), run, others)


def predict_ttft_alone(coefficients: Coefficients, run: BenchmarkRun, moe: MoESpec | None = None) -> float:
    """Model mean TTFT (s) of a run's request with no other in flight: the part of :func:`predict_ttft` that does
    not grow with load, ``c1p + offset + prefill + w_wait tau1`` (:func:`sdplan.latency.model.time_to_first_token`
    at ``B = 0`` and no prefill queued ahead); the rest of :func:`predict_ttft` is the queue's (the accuracy
    benchmark's TTFT floor needs that share, ``benchmarks/accuracy_served.py``)."""
    return run_ttft(covered(coefficients, run, moe, 0.0), run, 0.0, alone=True)


def covered(coefficients: Coefficients, run: BenchmarkRun, moe: MoESpec | None, others: float) -> Coefficients:
    """The coefficients of a run at the expert coverage of its steps with ``others`` in flight (dense: as given;
    :func:`sdplan.latency.closed_loop.covered_coefficients`)."""
    return closed_loop.covered_coefficients(coefficients, run.draft_length, others, moe)


@dataclass(frozen=True, slots=True)
class ClosedLoopWaves:
    """What prices a closed loop's waves of prompts for a calibration without fitted TTFT weights.

    A fitted calibration's TTFT weights hold the waves of the runs it was fitted to; a derived one
    has none, so its closed loops take :func:`sdplan.latency.model.closed_loop_waves_s`
    (``docs/model.md#ttft-and-tpot``).

    Attributes
    ----------
    scheduling : PrefillScheduling
        How the calibration's engine schedules waiting prompts
        (:func:`sdplan.inputs.serving.derived_prefill_scheduling`).
    kv_cache_tokens : float or None
        The KV cache the engine admits requests against, tokens (None: unlimited).
    rounds : float or None
        Requests each client sent, for runs that do not record how many requests they completed
        (None: such a run's opening wave is left out).
    fixed_lengths : bool
        Whether the runs' clients sent one prompt length and one output length (``ignore_eos``), so that a
        round's requests can finish in the same step; False where that is not known (result files do not
        record it): only the opening wave is priced then, whatever the engine.
    """

    scheduling: PrefillScheduling
    kv_cache_tokens: float | None = None
    rounds: float | None = None
    fixed_lengths: bool = False


def derived_waves(calibration: Calibration, draft_length: int = 0, rounds: float | None = None,
                  fixed_lengths: bool = False) -> ClosedLoopWaves | None:
    """The :class:`ClosedLoopWaves` of a derived calibration's engine and KV cache (None: not a derived calibration).

    The KV cache is the one the file was priced with for ``draft_length``
    (:func:`sdplan.inputs.serving.derived_kv_cache_tokens`); ``rounds`` and ``fixed_lengths`` as
    :class:`ClosedLoopWaves` takes them.
    """
    scheduling = serving.derived_prefill_scheduling(calibration)
    if scheduling is None:
        return None
    found = serving.derived_kv_cache_tokens(calibration, draft_length)
    return ClosedLoopWaves(scheduling, found[0] if found else None, rounds, fixed_lengths)


def run_rounds(run: BenchmarkRun, default: float | None) -> float | None:
    """Requests per client of a closed-loop run: its completed requests over its clients, else ``default``."""
    if run.concurrency and run.completed and run.completed >= run.concurrency:
        return run.completed / run.concurrency
    return default


def run_waves(coefficients: Coefficients, run: BenchmarkRun, waves: ClosedLoopWaves,
              batch_cap: float | None = None) -> tuple[float, float]:
    """``(TTFT, E2E)`` seconds a closed-loop run's waves of prompts add to its prediction; ``(0, 0)`` for an open loop.

    The wave is over the requests the engine holds at once of the run's ``N`` clients (``batch_cap``,
    :func:`sdplan.latency.closed_loop.admitted_clients`). Under a prefill-first engine and fixed lengths it
    recurs every round, over the requests of a round the engine admits together
    (:meth:`sdplan.inputs.serving.PrefillScheduling.admitted_together`: where the KV cache cannot take the whole
    round, the rest also wait for admission, which is not priced here); otherwise it opens the run only, spread
    over :func:`run_rounds`.
    """
    if run.concurrency is None:
        return 0.0, 0.0
    clients = closed_loop.admitted_clients(run.concurrency, batch_cap)
    scheduling = waves.scheduling
    recurs = scheduling.prefill_first and waves.fixed_lengths
    if recurs:
        clients = scheduling.admitted_together(clients, run.prompt_tokens, run.output_tokens, waves.kv_cache_tokens)
    return model.closed_loop_waves_s(coefficients, clients, scheduling.budget_tokens, run_rounds(run, waves.rounds),
                                     recurs=recurs)


def predict_run(coefficients: Coefficients, run: BenchmarkRun, moe: MoESpec | None = None,
                batch_cap: float | None = None, waves: ClosedLoopWaves | None = None) -> tuple[float, float]:
    """Model mean E2E and TTFT of a run (s), as :func:`validate` predicts them.

    :func:`predict_latency` and :func:`predict_ttft` at the run's engine cap ``batch_cap``; with ``waves`` (a
    calibration without fitted TTFT weights), each closed loop's waves of prompts added (:func:`run_waves`).
    """
    latency = predict_latency(coefficients, run, moe, batch_cap)
    ttft = predict_ttft(coefficients, run, latency, moe, batch_cap)
    if waves is not None and math.isfinite(latency):
        wave_ttft, wave_e2e = run_waves(coefficients, run, waves, batch_cap)
        latency, ttft = latency + wave_e2e, ttft + wave_ttft
    return latency, ttft


@dataclass(frozen=True, slots=True)
class RunError:
    run: BenchmarkRun
    predicted_s: float
    error_pct: float | None
    predicted_ttft_s: float | None = None
    ttft_error_pct: float | None = None


@dataclass(frozen=True, slots=True)
class BestKComparison:
    """At one configuration's load level: the fastest draft length measured and predicted."""

    load_level: str
    prompt_tokens: float
    output_tokens: float
    measured_best: int
    predicted_best: int
    options: tuple[int, ...]

    @property
    def agrees(self) -> bool:
        return self.measured_best == self.predicted_best


@dataclass(frozen=True, slots=True)
class RepeatSpread:
    """What the runs' own repeats say about the least error any prediction can show against them."""

    #: Mean E2E MAPE (%) a model exact on each repeated level's true mean would score against one run.
    exact_model_mape_pct: float
    #: Load levels (workload, draft length, acceptance, N or requested rate) measured two or more times.
    repeated_levels: int
    #: Runs at those levels.
    runs: int

    @property
    def sd_pct(self) -> float:
        """The standard deviation of one run's log mean latency between repeats, percent.

        A run measures ``mu exp(eps)`` with ``eps ~ N(0, sigma^2)``, and
        :attr:`exact_model_mape_pct` estimates ``E|eps| = sigma sqrt(2/pi)``
        (:func:`exact_model_error_pct`), so

        .. math:: sigma = E sqrt(pi/2).

        Where the repeats ran on fresh server instances (``sdplan calibrate``), it is how far one server's
        speed lies from another's: the spread :func:`sdplan.planning.uncertainty.coefficient_draws` adds to the
        intervals.
        """
        return self.exact_model_mape_pct * math.sqrt(math.pi / 2.0)


@dataclass(frozen=True, slots=True)
class Validation:
    errors: list[RunError]
    skipped: list[tuple[BenchmarkRun, str]]
    mape_pct: float
    bias_pct: float
    r2: float
    worst: RunError | None
    best_k: tuple[BestKComparison, ...] = ()
    ttft_mape_pct: float | None = None
    repeat_spread: RepeatSpread | None = None

    @property
    def best_k_agreement(self) -> tuple[int, int]:
        return sum(c.agrees for c in self.best_k), len(self.best_k)

    @property
    def quality(self) -> str:
        """Grade of the fit: by MAPE (excellent < 5%, good < 10%, fair < 20%), capped at ``poor`` when R2 < 0.8."""
        if not math.isfinite(self.mape_pct):
            return "poor"
        grade = "poor"
        for limit, name in ((5.0, "excellent"), (10.0, "good"), (20.0, "fair")):
            if self.mape_pct < limit:
                grade = name
                break
        if len(self.errors) >= 3 and self.r2 < 0.8 and grade in ("excellent", "good"):
            grade = "fair" if self.r2 >= 0.5 else "poor"
        return grade


def exact_model_error_pct(repeats: list[list[float]]) -> float | None:
    """Mean absolute percentage error an exact model scores against one run, from repeated runs.

    A level measured ``n`` times (fresh servers, the same controlled load)
    gives ``m_i = mu exp(eps_i)``, ``eps_i ~ N(0, sigma^2)`` the machine's
    noise. A model predicting ``mu`` exactly errs against one run by
    ``|exp(-eps) - 1|``, on average ``sigma sqrt(2/pi)`` to first order in
    ``sigma``. Two runs differ by ``ln(m_i/m_l) ~ N(0, 2 sigma^2)``, whose mean
    absolute value is ``2 sigma/sqrt(pi)``, so

    .. math:: E = |ln(m_i/m_l)| / sqrt(2)

    estimates it without bias from any pair of runs. The estimate is averaged
    over the pairs of each level, then over the levels (each level its own
    ``sigma``: noise grows with load). It is the floor under any model's MAPE
    against these runs; a prediction that scores near it is as good as the
    runs can show.

    Parameters
    ----------
    repeats
        Per level, its measurements (> 0, e.g. mean E2E latency in s); levels
        with fewer than two are skipped.

    Returns
    -------
    float or None
        The estimate in percent; None when no level has two measurements.
    """
    estimates = []
    for values in repeats:
        logs = [math.log(v) for v in values if v > 0 and math.isfinite(v)]
        pairs = [abs(a - b) / math.sqrt(2.0) for i, a in enumerate(logs) for b in logs[i + 1:]]
        if pairs:
            estimates.append(sum(pairs) / len(pairs))
    return 100.0 * sum(estimates) / len(estimates) if estimates else None


def _same_measurement(a: BenchmarkRun, b: BenchmarkRun) -> bool:
    """One run read twice (the same file given twice): equal means to the last bit. Names do not tell,
    since passes in folders of their own often share file names."""
    return (a.mean_e2e_latency_s, a.mean_ttft_s, a.achieved_rate_rps, a.prompt_tokens, a.output_tokens) == (
        b.mean_e2e_latency_s, b.mean_ttft_s, b.achieved_rate_rps, b.prompt_tokens, b.output_tokens)


def repeat_spread(runs: list[BenchmarkRun]) -> RepeatSpread | None:
    """:func:`exact_model_error_pct` of the runs' mean E2E latency, over the levels measured more than once.

    Runs repeat one another when they are of one configuration
    (:func:`sdplan.fitting.runmodel.configuration_groups`: draft length, mean lengths
    within 10%, per-token alpha within
    :data:`~sdplan.fitting.runmodel.ALPHA_GROUP_TOLERANCE`) and share the controlled load
    (``N`` clients, or the requested rate). None when no level was measured twice.
    """
    repeated: list[list[BenchmarkRun]] = []
    for members in configuration_groups(runs):
        by_level: dict[str, list[BenchmarkRun]] = defaultdict(list)
        for run in members:
            level = by_level[run.load_level]
            if not any(_same_measurement(run, other) for other in level):  # the same run given twice is no repeat
                level.append(run)
        repeated += [level for level in by_level.values() if len(level) > 1]
    estimate = exact_model_error_pct([[r.mean_e2e_latency_s for r in group] for group in repeated])
    if estimate is None:
        return None
    return RepeatSpread(exact_model_mape_pct=estimate, repeated_levels=len(repeated),
                        runs=sum(len(group) for group in repeated))


def compare_best_k(errors: list[RunError]) -> tuple[BestKComparison, ...]:
    """Best draft length measured vs predicted, per (lengths, acceptance, controlled load level).

    Runs are grouped by what the experimenter set (concurrency ``N`` or the
    requested rate), not by the achieved rate, so noise in throughput does not
    split the comparison (``docs/model.md#validation``); SD runs of one acceptance (within
    :data:`ALPHA_GROUP_TOLERANCE`) compete with each other and with the
    baseline at the same level.
    """
    # workloads: mean lengths within 10% are one (random datasets vary a little from run to run)
    workloads: list[tuple[float, float]] = []
    by_level: dict[tuple[Any, ...], list[RunError]] = defaultdict(list)
    for e in sorted(errors, key=lambda e: (e.run.prompt_tokens, e.run.output_tokens)):
        p, g = e.run.prompt_tokens, e.run.output_tokens
        match = next((w for w in workloads if p <= w[0] * LENGTH_GROUP_TOLERANCE
                      and w[1] / LENGTH_GROUP_TOLERANCE <= g <= w[1] * LENGTH_GROUP_TOLERANCE), None)
        if match is None:
            match = (p, g)
            workloads.append(match)
        by_level[(round(match[0]), round(match[1]), e.run.load_level)].append(e)
    comparisons = []
    for (p, g, level), members in sorted(by_level.items(), key=lambda item: str(item[0])):
        baseline = [m for m in members if m.run.draft_length == 0]
        speculative = sorted((m for m in members if m.run.draft_length > 0),
                             key=lambda m: (m.run.alpha or 0.0, m.run.draft_length, m.run.source))
        groups: list[list[RunError]] = []
        for m in speculative:
            if groups and (m.run.alpha or 0.0) - (groups[-1][0].run.alpha or 0.0) <= ALPHA_GROUP_TOLERANCE:
                groups[-1].append(m)
            else:
                groups.append([m])
        for group in groups or [[]]:
            best_per_k: dict[int, RunError] = {}
            for m in sorted(baseline + group, key=lambda m: (m.run.source, m.run.mean_e2e_latency_s)):
                best_per_k.setdefault(m.run.draft_length, m)
            if len(best_per_k) < 2:
                continue
            options = list(best_per_k.values())
            measured = min(options, key=lambda m: m.run.mean_e2e_latency_s).run.draft_length
            predicted = min(options, key=lambda m: m.predicted_s).run.draft_length
            comparisons.append(BestKComparison(load_level=level, prompt_tokens=p, output_tokens=g,
                                               measured_best=measured, predicted_best=predicted,
                                               options=tuple(sorted(best_per_k))))
    return tuple(comparisons)


def validate(coefficients_at: Callable[[float, float], Coefficients], runs: list[BenchmarkRun],
             moe_at: Callable[[float, float], MoESpec | None] | None = None,
             batch_cap_at: Callable[[BenchmarkRun], float | None] | None = None,
             waves: ClosedLoopWaves | None = None) -> Validation:
    """Predicted vs measured mean latency (and TTFT) for every run.

    ``moe_at(prompt, output)`` gives a mixture-of-experts target's coverage at a
    workload (:meth:`sdplan.calibration.Calibration.moe_at`); with it every run is
    predicted as the planner solves the target (:func:`predict_latency`). ``batch_cap_at(run)`` gives
    the requests the run's engine holds at once (None: no cap), so a closed loop past it waits for
    admission. ``waves`` (a calibration without fitted TTFT weights) adds each closed loop's waves of
    prompts (:func:`run_waves`).

    Runs the screen rejects are skipped with their reason; an unstable
    prediction for a measured run counts as an infinite error and is the worst.
    """
    errors, skipped = [], []
    for run in sorted(runs, key=lambda r: (r.source, r.draft_length, r.load_level, r.mean_e2e_latency_s)):
        reasons = screen(run)
        if reasons:
            skipped.append((run, "; ".join(reasons)))
            continue
        coefficients = coefficients_at(run.prompt_tokens, run.output_tokens)
        moe = None if moe_at is None else moe_at(run.prompt_tokens, run.output_tokens)
        cap = None if batch_cap_at is None else batch_cap_at(run)
        predicted, ttft = predict_run(coefficients, run, moe, cap, waves)
        error = ((predicted - run.mean_e2e_latency_s) / run.mean_e2e_latency_s * 100
                 if math.isfinite(predicted) else None)
        ttft_error = ((ttft - run.mean_ttft_s) / run.mean_ttft_s * 100
                      if run.mean_ttft_s and math.isfinite(ttft) else None)
        errors.append(RunError(run=run, predicted_s=predicted, error_pct=error,
                               predicted_ttft_s=ttft if math.isfinite(ttft) else None, ttft_error_pct=ttft_error))
    if not errors:
        listed = "; ".join(f"{run.source}: {why}" for run, why in skipped[:5])
        raise InfeasibleError(f"no usable run to validate against ({listed})")
    finite = [e.error_pct for e in errors if e.error_pct is not None]
    mape = sum(abs(value) for value in finite) / len(finite) if len(finite) == len(errors) else math.inf
    bias = sum(finite) / len(finite) if finite else math.nan
    worst = max(errors, key=lambda e: math.inf if e.error_pct is None else abs(e.error_pct))
    measured_s = [e.run.mean_e2e_latency_s for e in errors]
    predicted_s = [e.predicted_s if math.isfinite(e.predicted_s) else 10 * e.run.mean_e2e_latency_s for e in errors]
    ttft_errors = [abs(e.ttft_error_pct) for e in errors if e.ttft_error_pct is not None]
    return Validation(errors=errors, skipped=skipped, mape_pct=mape, bias_pct=bias,
                      r2=float(r2(measured_s, predicted_s)),
                      worst=worst, best_k=compare_best_k(errors),
                      ttft_mape_pct=sum(ttft_errors) / len(ttft_errors) if ttft_errors else None,
                      repeat_spread=repeat_spread([e.run for e in errors]))




def option_regret(measured_s: Mapping[int, float], picked: int | None) -> float:
    """How much slower the option a planner picked ran than the fastest option measured at the same load.

    .. math:: R = L_m(\\hat k) / \\min_k L_m(k) - 1

    with ``L_m`` the measured mean latency of each option (draft length, 0 for
    no SD) at one controlled load and ``\\hat k`` the planner's pick: 0 when it
    picked the fastest, ``inf`` when it picked nothing (no option predicted
    stable). A wrong pick between two options that ran alike costs little; the
    regret says so where agreement on the best option (:class:`BestKComparison`)
    cannot.

    Raises
    ------
    KeyError
        If ``picked`` was not measured.
    """
    if picked is None:
        return math.inf
    return measured_s[picked] / min(measured_s.values()) - 1.0
