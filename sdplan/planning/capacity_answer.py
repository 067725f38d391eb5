"""``sdplan capacity`` as one use case: a typed query in, a typed answer out.

The command parses its options into a :class:`CapacityQuery`, resolves the
scenario (:func:`sdplan.planning.scenario.resolve_scenario`) and makes one call:
:func:`answer_capacity` for the capacity table, or :func:`engine_config_answer`
for an engine's speculative configuration. The text and JSON views are built
from the :class:`CapacityAnswer` alone (``sdplan/render/check.py``).

Every rule of the command lives here or in the modules it calls: which SLOs
apply (the command line, else the workload file), the MoE refusal, the
warnings (calibrated range at the load of each option's capacity, prefill
interference, the batch cap), the 95% intervals, the servers' speed margin
(:func:`answer_capacity`), and where the GPUs per
replica and their price come from (the command line, then the workload file,
then the calibration's tensor parallel size).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from sdplan.errors import InvalidValueError
from sdplan.inputs.methods import draft_weights
from sdplan.inputs.serving import KV_CACHE_DTYPE_NAMES, BatchCap, EngineLimits, batch_cap_warning
from sdplan.inputs.slo import SLO, resolve_slos
from sdplan.latency import model
from sdplan.limits import check_grid, check_simulation
from sdplan.planning import export
from sdplan.planning.capacity import (
    Capacity,
    Fleet,
    batch_cap_label,
    capacity,
    fleet,
    moe_capacity,
    replicas_saved,
    simulated_capacity,
)
from sdplan.planning.scenario import Scenario
from sdplan.planning.schedule import EngineSchedule, engine_schedule, goodput_per_size
from sdplan.planning.simulation_inputs import SimulationSettings, simulation_config
from sdplan.planning.uncertainty import (
    SpeedMargin,
    capacity_intervals,
    coefficient_draws,
    covers,
    on_slower_server,
    server_spread_pct,
    speed_margin,
)

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.calibration import Calibration
    from sdplan.planning.export import EngineConfig
    from sdplan.simulate import SimulationConfig

    FloatArray = npt.NDArray[np.float64]

#: Progress of a long search, for a progress bar: (options done, options in all, what is evaluated now).
Progress = Callable[[int, int, str], None]

#: The engines whose speculative configuration capacity writes (``--format``).
ENGINES = ("vllm-config", "sglang", "trtllm")

#: The message of the exit status "infeasible" when no option meets the SLOs.
NO_OPTION_MEETS = "no option meets the SLOs at any request rate (see the binding SLO per option)"


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityQuery:
    """What ``sdplan capacity`` asks of a scenario; None where not given (the workload file's value then holds).

    Attributes
    ----------
    slos : tuple of str
        SLO expressions; empty: the workload file's.
    target_rate_rps : float, optional
        Total request rate to size a fleet for; None: the workload file's, else no fleet.
    gpus_per_replica, gpu_hour_cost_usd : optional
        For GPU counts and cost (:func:`fleet_plan` says where they default from).
    min_k, min_tier_width : int
        The engine schedule's k floor and narrowest tier (:func:`sdplan.planning.schedule.engine_schedule`).
    data_parallel_size : int
        vLLM's data parallel size the engine configuration is for.
    use_simulator : bool
        Find each option's capacity with the simulator (percentile SLOs allowed), with ``simulation``.
    at_calibrated_speed : bool
        Size on the calibration's own costs, without its speed margin (:class:`SpeedMargin`).
    """

    slos: tuple[str, ...] = ()
    target_rate_rps: float | None = None
    gpus_per_replica: int | None = None
    gpu_hour_cost_usd: float | None = None
    min_k: int = 0
    min_tier_width: int = 4
    data_parallel_size: int = 1
    use_simulator: bool = False
    simulation: SimulationSettings = SimulationSettings(requests=4000, seeds=2, seed=0, arrival_cv=1.0)
    at_calibrated_speed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetPlan:
    """Replicas for a target rate without SD and with the best SD option (None: that option meets no SLO)."""

    target_rate_rps: float
    no_sd: Fleet | None
    best_sd: Fleet | None

    @property
    def replicas_saved_by_sd(self) -> int | None:
        """Replicas SD saves at the target rate; None unless both options can serve it."""
        return replicas_saved(self.no_sd, self.best_sd)


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityIntervals:
    """95% intervals of each option's capacity over the calibration's coefficient draws.

    Attributes
    ----------
    bounds_rps : (2, options) array
        Low and high end per option (index 0 no SD, as in :class:`sdplan.planning.capacity.Capacity`), req/s per
        replica.
    draws : int
        Coefficient draws the intervals come from (:func:`sdplan.planning.uncertainty.coefficient_draws`).
    server_sd_pct : float or None
        The spread between server instances the draws include; None: none.
    """

    bounds_rps: FloatArray
    draws: int
    server_sd_pct: float | None

    @property
    def covers(self) -> str:
        """What the intervals cover, in words."""
        return covers(self.server_sd_pct)


@dataclass(frozen=True, slots=True, kw_only=True)
class OtherSpeed:
    """The answer on the other side of a speed margin: at the calibration's speed when the margin is applied,
    on the slower server when not (:class:`sdplan.planning.uncertainty.SpeedMargin`), in closed form.

    Attributes
    ----------
    best_rate_rps : float or None
        The best option's capacity there; None: no option meets the SLOs.
    fleet : FleetPlan or None
        The fleet there; None without a target rate.
    """

    best_rate_rps: float | None
    fleet: FleetPlan | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityAnswer:
    """Everything ``sdplan capacity`` reports: the views (text, JSON, plots) read this and nothing else.

    Attributes
    ----------
    scenario : Scenario
        What was evaluated: calibration, workload, acceptance, SD method, engine limits.
    capacity : Capacity
        Per option the highest rate under the SLOs (simulated ones with ``simulated``).
    slos : tuple of SLO
        The SLOs applied.
    simulated : bool
        Whether the rates come from the simulator (bisection on rate) rather than the closed-form inverse.
    evaluated_by : str
        How, in words.
    warnings : tuple of str
        Where the answer leaves the model's domain, and candidates left out.
    intervals : CapacityIntervals or None
        95% intervals (analytic answers from a calibration with a covariance only).
    fleet : FleetPlan or None
        Replicas for the target rate; None without one.
    schedule : EngineSchedule
        The goodput-optimal k per batch size (vLLM ``num_speculative_tokens_per_batch_size``).
    speed_margin : SpeedMargin or None
        The servers' speed the answer is sized for; None for calibrations not measured on servers
        (roofline, derived).
    other_speed : OtherSpeed or None
        The answer on the other side of the margin; None without a measured spread, or when simulated.
    """

    scenario: Scenario
    capacity: Capacity
    slos: tuple[SLO, ...]
    simulated: bool
    evaluated_by: str
    warnings: tuple[str, ...]
    intervals: CapacityIntervals | None
    fleet: FleetPlan | None
    schedule: EngineSchedule
    speed_margin: SpeedMargin | None = None
    other_speed: OtherSpeed | None = None

    @property
    def feasible(self) -> bool:
        """Whether some option meets every SLO at some rate."""
        return self.capacity.best >= 0


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfigAnswer:
    """An engine's speculative configuration from the goodput-optimal k per batch size.

    ``config`` is None when no batch size drafts (serve without SD: nothing to write); ``notes`` say what the
    merged tiers and the k floor cost.
    """

    engine: str
    method: str
    schedule: EngineSchedule
    config: EngineConfig | None
    notes: tuple[str, ...]

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the engine does differently, then the notes."""
        return (*(self.config.warnings if self.config is not None else ()), *self.notes)


def answer_capacity(scenario: Scenario, query: CapacityQuery, progress: Progress | None = None) -> CapacityAnswer:
    """The highest request rate per option under the SLOs, with fleet, warnings and intervals.

    ``progress`` is called as the simulator's search advances (``query.use_simulator`` only).

    A calibration that measured its servers' spread (``[uncertainty] repeat_sd_pct``) is answered on a server
    ``u = exp(z sigma / sqrt(n))`` times slower than the calibration's
    (:func:`sdplan.planning.uncertainty.calibration_speed_margin`, ``z`` = 1.645): the calibration's speed is one draw
    of its ``n`` instances, which every replica sized on it inherits and which does not average out over a
    fleet, so the default answer errs on the user's side of it at 95%, one-sided. On served quick grids
    (``benchmarks/RESULTS-accuracy-served-2026-11.md``, E7) this planned two runs' fresh plateaus at
    -13.8% +- 3.4 of the measured, all six on the safe side, where at the calibration's speed two of six were
    over. ``query.at_calibrated_speed`` answers at the calibration's speed instead; either way the answer
    keeps the other side's figure for its caveat (:class:`SpeedMargin`).

    The 95% intervals are not shifted by ``u``: each of their draws already runs on a server of its own
    speed, with the whole spread ``sigma`` (:func:`sdplan.planning.uncertainty.coefficient_draws`), around the
    calibration's speed. Shifting them as well would count the spread twice. Their low end stays the
    pessimistic answer: ``u`` bounds the calibration's own speed error (``sigma / sqrt(n)``, one-sided), the
    draws each replica's whole spread, so the margined answer usually lies inside the interval (acc41's
    quick grid, no SD under e2e 3 s: 20.2 req/s, interval 19.5-28.6).

    Raises
    ------
    InvalidValueError
        For no SLO, no SLO that bounds the rate, or more work than the budgets allow.
    """
    margin = speed_margin(scenario.calibration, query.at_calibrated_speed)
    measured = margin is not None and margin.measured
    calibrated = scenario
    slower = replace(scenario, coefficients=on_slower_server(scenario.coefficients, margin.factor)) \
        if margin is not None and measured else scenario
    answered, other = (slower, calibrated) if margin is not None and margin.applied else (calibrated, slower)
    schedule, _ = _schedule(answered, query.min_k, query.min_tier_width)
    slos = resolve_slos(query.slos, scenario.file, allow_percentiles=query.use_simulator)
    if not slos:
        raise InvalidValueError("capacity needs SLOs; give --slo (e.g. --slo 'e2e:mean<=4s') or slos in the workload")
    scenario.limits.require_fit(scenario.request_tokens)
    table = _table(answered, slos)
    settings = query.simulation
    if query.use_simulator:
        table = _simulated(answered, table, slos, settings, progress)
        evaluated_by = f"simulated: bisection on rate, {settings.seeds} x {settings.requests} requests per point"
    elif scenario.moe is not None:
        evaluated_by = "analytic model (means), searched over rates (MoE expert coverage: no closed form)"
    else:
        evaluated_by = "analytic model (means), closed-form inverse"
    file = scenario.file
    target = query.target_rate_rps if query.target_rate_rps is not None else (file.target_rate_rps if file else None)
    return CapacityAnswer(
        scenario=answered, capacity=table, slos=tuple(slos), simulated=query.use_simulator,
        evaluated_by=evaluated_by, warnings=tuple(_warnings(answered, table, query.use_simulator, slos)),
        intervals=None if query.use_simulator else _intervals(calibrated, slos),
        fleet=None if target is None else fleet_plan(answered, table, target, query.gpus_per_replica,
                                                      query.gpu_hour_cost_usd),
        schedule=schedule, speed_margin=margin,
        other_speed=_other_speed(other, query, slos, target) if measured and not query.use_simulator else None)


def _table(scenario: Scenario, slos: list[SLO]) -> Capacity:
    """Each option's capacity under ``slos`` in closed form, on the scenario's coefficients."""
    candidates = scenario.draft_lengths
    if scenario.moe is not None:  # C1, C2 depend on the load: no closed form
        return moe_capacity(scenario.coefficients, candidates, scenario.alpha, slos, scenario.tokens_per_cycle[0],
                            scenario.moe, scenario.limits.caps(candidates))
    return capacity(scenario.coefficients, candidates, scenario.alpha, slos,
                    tokens_per_cycle=scenario.tokens_per_cycle[0], max_batch=scenario.limits.caps(candidates))


def _other_speed(other: Scenario, query: CapacityQuery, slos: list[SLO], target: float | None) -> OtherSpeed:
    """The best capacity and the fleet on the other side of the margin, in closed form (analytic answers only:
    a second simulated search would double the run time)."""
    table = _table(other, slos)
    return OtherSpeed(best_rate_rps=float(table.max_rate_rps[table.best]) if table.best >= 0 else None,
                      fleet=None if target is None else fleet_plan(other, table, target, query.gpus_per_replica,
                                                                    query.gpu_hour_cost_usd))


def engine_config_answer(scenario: Scenario, query: CapacityQuery, engine: str) -> EngineConfigAnswer:
    """The speculative configuration of ``engine`` (one of :data:`ENGINES`) for the scenario's schedule.

    The schedule is the goodput-optimal k per batch size up to the engine's ``max_num_seqs``, with narrow
    tiers merged so that k does not flap (vllm-project/vllm#49548).
    """
    schedule, widest = _schedule(scenario, query.min_k, query.min_tier_width)
    method, calibration = scenario.method, scenario.calibration
    if schedule.off:
        return EngineConfigAnswer(engine=engine, method=method, schedule=schedule, config=None, notes=())
    weights = draft_weights(method, calibration)
    draft = draft_serving(calibration)
    derivation = calibration.records.derivation
    kv_cache_dtype = derivation.kv_cache_dtype if derivation is not None else None
    if engine == "vllm-config":
        config = export.vllm_config(schedule, method, weights, query.data_parallel_size, draft, kv_cache_dtype)
    elif engine == "sglang":
        config = export.sglang_config(schedule, method, weights, draft)
    elif engine == "trtllm":
        config = export.trtllm_config(schedule, method, weights, draft)
    else:
        raise InvalidValueError(f"no engine configuration '{engine}'; one of {', '.join(ENGINES)}")
    notes = []
    if kv_cache_dtype is not None:
        notes.append(f"the calibration was priced with a {KV_CACHE_DTYPE_NAMES[kv_cache_dtype]} KV "
                     f"cache (sdplan derive --kv-cache-dtype {kv_cache_dtype}): serve with it, or the cache holds "
                     "other numbers of requests than planned")
    if schedule.reachable < schedule.max_num_seqs:
        notes.append(reach_note(scenario, schedule, widest))
    if schedule.merged:
        notes.append(f"merged {schedule.merged} tier(s) narrower than --min-tier-width so k does not flap at tier "
                     f"edges (vllm-project/vllm#49548); goodput within {schedule.goodput_loss_pct:.2g}% of the "
                     "per-size optimum")
    elif schedule.goodput_loss_pct > 0:
        notes.append(f"--min-k costs up to {schedule.goodput_loss_pct:.2g}% goodput at some batch sizes")
    return EngineConfigAnswer(engine=engine, method=method, schedule=schedule, config=config, notes=tuple(notes))


def widest_sd_cap(limits: EngineLimits, draft_lengths: Sequence[int]) -> BatchCap:
    """The largest batch cap among the SD options ``draft_lengths`` of the server that runs them (``limits``):
    the largest batch it forms."""
    return max(limits.batch_caps(draft_lengths)[1:], key=lambda cap: cap.requests)


def reach_note(scenario: Scenario, schedule: EngineSchedule, widest: BatchCap) -> str:
    """Why the schedule's sizes past ``schedule.reachable`` keep its k: the widest SD cap and its source."""
    return (f"batch sizes {schedule.reachable + 1}-{schedule.max_num_seqs} keep the k of {schedule.reachable}: "
            f"with SD the engine holds about that many requests of {scenario.workload.prompt_tokens:,} + "
            f"{scenario.workload.output_tokens:,} tokens at once ({widest.phrase})")


def draft_serving(calibration: Calibration) -> export.DraftServing:
    """The draft as the calibration priced it: ``[derivation] draft_tensor_parallel_size`` and ``draft_precision``.

    A file that does not record the draft's GPUs gives the target's where those are more than one, so that
    vLLM is told, not left to default.
    """
    derivation = calibration.records.derivation
    target_tp = calibration.provenance.get("tensor_parallel_size")
    draft_tp = derivation.draft_tensor_parallel_size if derivation is not None else None
    if draft_tp is None and isinstance(target_tp, int) and target_tp > 1:
        draft_tp = target_tp
    return export.DraftServing(tensor_parallel_size=draft_tp,
                               precision=derivation.draft_precision if derivation is not None else None)


def fleet_plan(scenario: Scenario, table: Capacity, target_rate_rps: float, gpus_per_replica: int | None,
               gpu_hour_cost_usd: float | None) -> FleetPlan:
    """Replicas (GPUs, cost) for ``target_rate_rps`` without SD and with the best SD option.

    Precedence, as everywhere in sdplan (:mod:`sdplan.planning.scenario`): GPUs per replica from the command line,
    then the workload file's ``deployment.gpus_per_replica``, then the calibration's tensor parallel size
    (one replica runs on that many GPUs); the GPU-hour cost from the command line, then the workload file,
    else none (no cost figures).
    """
    file = scenario.file
    gpus = gpus_per_replica or (file.gpus_per_replica if file else None) or \
        scenario.calibration.provenance.get("tensor_parallel_size")
    cost = gpu_hour_cost_usd if gpu_hour_cost_usd is not None else (file.gpu_hour_cost_usd if file else None)
    g = scenario.coefficients.output_tokens
    no_sd = fleet("off", float(table.max_rate_rps[0]), target_rate_rps, g, gpus, cost)
    best_sd = table.best_speculative
    with_sd = (fleet(table.label(best_sd), float(table.max_rate_rps[best_sd]), target_rate_rps, g, gpus, cost)
               if best_sd > 0 else None)
    return FleetPlan(target_rate_rps=target_rate_rps, no_sd=no_sd, best_sd=with_sd)


def _schedule(scenario: Scenario, min_k: int, min_tier_width: int) -> tuple[EngineSchedule, BatchCap]:
    """The goodput-optimal k per batch size 1..max_num_seqs of the server that runs SD (SGLang's: at most 48 where
    nothing sets it, :func:`sdplan.inputs.serving.resolve_limits`), merged so k does not flap, and the widest SD
    option's cap (:func:`widest_sd_cap`): sizes past it keep its k (:func:`engine_schedule`)."""
    candidates = scenario.draft_lengths
    limits = scenario.limits_for(list(candidates))
    cap = limits.max_num_seqs
    check_grid(cap * len(candidates), f"{cap} batch sizes x {len(candidates)} draft lengths",
               "lower --max-num-seqs or give fewer --draft-lengths")
    if min_k > max(candidates):
        raise InvalidValueError(f"--min-k {min_k} exceeds every draft length ({max(candidates)} at most)")
    goodput = goodput_per_size(scenario.coefficients, candidates, scenario.alpha, cap,
                               tokens_per_cycle=scenario.tokens_per_cycle[0], moe=scenario.moe)
    widest = widest_sd_cap(limits, candidates)
    return engine_schedule(goodput, candidates, min_tier_width=min_tier_width, min_k=min_k,
                           reachable=widest.requests), widest


def _warnings(scenario: Scenario, table: Capacity, simulated: bool, slos: list[SLO]) -> list[str]:
    """Calibrated range, prefill interference at capacity, options whose capacity the batch cap sets, and a TTFT
    SLO on a file whose TTFT nothing measured.

    The batch each option runs at its capacity is Little's law, ``B = lambda L``; the largest is checked
    against the batch sizes the calibration measured. The prefill interference warning reads the model's
    utilisation ``lambda C2`` at capacity, so it is left out of simulated answers.
    """
    at_capacity = table.max_rate_rps * table.latency_at_capacity_s
    finite = at_capacity[np.isfinite(at_capacity) & table.feasible]
    best = [table.draft_lengths[table.best - 1]] if table.best > 0 else []
    warnings = scenario.calibration.validity_warnings(scenario.workload.prompt_tokens,
                                                      scenario.workload.output_tokens,
                                                      float(finite.max()) if finite.size else None, best)
    if not simulated and not table.expert_coverage:  # an MoE answer's C2 is at full coverage, not at capacity
        interference = model.prefill_interference_warning(scenario.coefficients.c2p_s, table.c2_s[table.feasible],
                                                          (table.max_rate_rps * table.c2_s)[table.feasible])
        if interference is not None:
            warnings.append(interference)
    label = batch_cap_label(scenario.limits.batch_cap.requests)
    capped = [table.label(index) for index, binding in enumerate(table.binding_slo) if binding == label]
    if capped:  # the batch reaches the cap at those options' capacity
        warnings.append(batch_cap_warning(scenario.limits, f"at the capacity of {', '.join(capped)}"))
    priced_ttft = scenario.calibration.priced_ttft_warning([slo.metric.value for slo in slos])
    if priced_ttft is not None:
        warnings.append(priced_ttft)
    return warnings + scenario.notes()


def _intervals(scenario: Scenario, slos: list[SLO]) -> CapacityIntervals | None:
    """95% intervals of each option's capacity from the calibration's covariance (None without one)."""
    workload, candidates, tokens = scenario.workload, scenario.draft_lengths, scenario.tokens_per_cycle[0]
    if scenario.moe is not None:  # each draw would need the MoE search (moe_capacity): not offered
        return None
    draws = coefficient_draws(scenario.calibration, workload.prompt_tokens, workload.output_tokens,
                              options=(candidates, tokens))
    if draws is None:
        return None
    bounds = capacity_intervals(draws, lambda c: capacity(c, candidates, scenario.alpha, slos,
                                                          tokens_per_cycle=tokens,
                                                          max_batch=scenario.limits.caps(candidates),
                                                          break_even=False))
    return CapacityIntervals(bounds_rps=bounds, draws=len(draws), server_sd_pct=server_spread_pct(scenario.calibration))


def _simulated(scenario: Scenario, table: Capacity, slos: list[SLO], settings: SimulationSettings,
               progress: Progress | None) -> Capacity:
    """Per option, the highest rate whose simulated statistics meet every SLO (see capacity.simulated_capacity)."""
    def configure(rate: float, k: int) -> SimulationConfig:
        return simulation_config(scenario, rate, k, scenario.limits, settings)

    options = len(scenario.draft_lengths) + 1
    check_simulation(settings.requests, settings.seeds, options * 12, "search steps (about 12 per option)")

    def evaluated(index: int, rate: float) -> None:
        if progress is not None:
            progress(index, options, f"{table.label(index)} at {rate:.3g} req/s")

    result, _ = simulated_capacity(table, scenario.coefficients, slos, configure, settings.seeds, settings.seed,
                                   on_evaluation=evaluated)
    return result
