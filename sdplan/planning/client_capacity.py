"""``sdplan capacity --closed-loop``: the most clients a replica keeps in flight under the SLOs, per option.

A closed loop (``vllm bench serve --max-concurrency N``, GuideLLM's concurrent profile, a chat service sized
in concurrent users) holds ``N`` requests in flight instead of arriving at a rate. Each option is priced as
``sdplan plan --concurrency`` prices it (:func:`sdplan.planning.closed_loop_answer.steady_point`: past
the engine's cap the other clients wait for admission, and their wait is priced), and its capacity is the
largest ``N`` at which every SLO holds: latency, TTFT and TPOT grow with ``N``, so each upper SLO holds on
``1..N*``; ``throughput>=X`` holds from the ``N`` whose output tokens a second first reach ``X``. A
``--target-concurrency`` sizes the fleet: ``ceil(target / N*)`` replicas, each holding its share.

The answer is the long run's steady state (no opening wave), as ``plan --concurrency`` gives it without
``--num-prompts``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from sdplan.errors import InvalidValueError
from sdplan.inputs.slo import SLO, Metric, resolve_slos
from sdplan.latency import model
from sdplan.latency.closed_loop import ClosedLoopPoint
from sdplan.planning.capacity import replicas_needed, replicas_saved
from sdplan.planning.closed_loop_answer import steady_point
from sdplan.planning.planner import option_label
from sdplan.planning.uncertainty import SpeedMargin, on_slower_server, speed_margin

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.planning.scenario import Scenario

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

#: The most clients searched (2**20): an SLO that still holds there bounds nothing a replica can be sized by.
MAX_CLIENTS = 1 << 20

#: Why a closed-loop capacity needs an SLO that grows with the clients.
NEEDS_BOUND = ("capacity --closed-loop needs an SLO that bounds the clients: e2e:mean<=..., ttft:mean<=..., "
               "tpot:mean<=... or utilisation<=... (below 1)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientCapacity:
    """Per option (index 0 no SD, then ``draft_lengths``) the most clients in flight under the SLOs.

    Attributes
    ----------
    max_clients : (options,) int
        Largest ``N`` meeting every SLO; 0 where none does.
    min_clients : (options,) int
        Smallest ``N`` a ``throughput>=`` SLO needs (1 without one).
    binding_slo : list of str or None
        The SLO first missed at ``max_clients + 1`` (for an infeasible option: the one that rules it out).
    latency_s, ttft_s, tpot_s, throughput_rps : (options,) float
        Means at ``max_clients`` (NaN where infeasible).
    running : (options,) int
        Requests the engine runs at ``max_clients``: the rest wait for admission.
    caps : (options,) float
        Each option's engine cap (``max_num_seqs`` or what its KV cache holds; smaller with a draft).
    best : int
        The option holding the most clients (ties: the higher throughput, then no SD and the shorter draft);
        -1 if none is feasible.
    """

    draft_lengths: list[int]
    alpha: float
    output_tokens: float
    max_clients: IntArray
    min_clients: IntArray
    binding_slo: list[str | None]
    latency_s: FloatArray
    ttft_s: FloatArray
    tpot_s: FloatArray
    throughput_rps: FloatArray
    running: IntArray
    caps: FloatArray
    best: int

    @property
    def at_cap(self) -> npt.NDArray[np.bool_]:
        """Whether an option's capacity is its engine cap: one client more would wait for admission, and the
        wait it adds (to TTFT above all) is what misses the binding SLO."""
        at: npt.NDArray[np.bool_] = self.feasible & (self.max_clients == np.floor(self.caps))
        return at

    @property
    def feasible(self) -> npt.NDArray[np.bool_]:
        """Whether some ``N`` meets every SLO, per option."""
        return self.max_clients > 0

    @property
    def output_throughput_tok_s(self) -> FloatArray:
        """Output tokens a second at ``max_clients``, ``g N / L``."""
        return self.output_tokens * self.throughput_rps

    def label(self, index: int) -> str:
        return option_label(self.draft_lengths[index - 1] if index else 0)

    @property
    def best_speculative(self) -> int:
        """Index of the SD option holding the most clients (>= 1), or -1 if none is feasible."""
        if not self.feasible[1:].any():
            return -1
        return 1 + _ranked(self.max_clients[1:], self.throughput_rps[1:])


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientFleet:
    """Replicas for ``target`` clients in flight with one option, each replica holding its share.

    ``output_throughput_tok_s`` is the fleet's at that share; ``cost_per_million_output_tokens_usd`` follows
    from it (None without a GPU-hour cost).
    """

    option: str
    per_replica_clients: int
    replicas: int
    gpus: int | None
    cost_per_hour_usd: float | None
    output_throughput_tok_s: float
    cost_per_million_output_tokens_usd: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientFleetPlan:
    """Replicas for a target concurrency without SD and with the best SD option (None: it meets no SLO)."""

    target_clients: int
    no_sd: ClientFleet | None
    best_sd: ClientFleet | None

    @property
    def replicas_saved_by_sd(self) -> int | None:
        """Replicas SD saves at the target concurrency; None unless both options can serve it."""
        return replicas_saved(self.no_sd, self.best_sd)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientCapacityAnswer:
    """Everything ``sdplan capacity --closed-loop`` reports (the views read this and nothing else)."""

    scenario: Scenario
    capacity: ClientCapacity
    slos: tuple[SLO, ...]
    warnings: tuple[str, ...]
    fleet: ClientFleetPlan | None
    speed_margin: SpeedMargin | None

    @property
    def feasible(self) -> bool:
        return self.capacity.best >= 0


def _ranked(clients: IntArray, throughput: FloatArray) -> int:
    """Index of the most clients, ties to the higher throughput, then the first."""
    order = sorted(range(clients.size), key=lambda i: (-int(clients[i]), -float(np.nan_to_num(throughput[i]))))
    return order[0]


class _Evaluator:
    """Each option's closed-loop means at given client counts, and the SLOs they miss."""

    def __init__(self, scenario: Scenario, slos: list[SLO]) -> None:
        self.scenario, self.slos = scenario, slos
        self.caps = scenario.limits.caps(scenario.draft_lengths)
        self.options = len(self.caps)
        self.lengths = (0, *scenario.draft_lengths)
        self.per_cycle = (1.0, *(float(e) for e in np.atleast_1d(scenario.tokens_per_cycle[0])))
        # each option's points by the number its engine runs: every search step past the cap reuses them
        self.served: list[dict[int, ClosedLoopPoint]] = [{} for _ in range(self.options)]
        # what a full engine completes a second, for the utilisation SLO (check --concurrency's rule)
        beyond = int(max(cap for cap in self.caps if math.isfinite(cap))) + 1
        self.full_rps: FloatArray = self.at(np.full(self.options, beyond))["throughput"]

    def point(self, option: int, clients: int) -> ClosedLoopPoint:
        """Option ``option``'s steady state with ``clients`` in flight (:func:`steady_point`)."""
        return steady_point(self.scenario, self.lengths[option], self.per_cycle[option], clients,
                            self.caps[option], self.served[option])

    def at(self, clients: IntArray) -> dict[str, FloatArray]:
        """Option ``j``'s means at ``clients[j]`` clients."""
        points = [self.point(j, int(n)) for j, n in enumerate(clients)]
        latency = np.array([point.latency_s for point in points])
        ttft = np.array([point.ttft_s for point in points])
        g = float(self.scenario.workload.output_tokens)
        return {"e2e": latency, "ttft": ttft, "tpot": model.time_per_output_token(latency, ttft, g),
                "throughput": np.array([point.throughput_rps for point in points]),
                "running": np.array([float(point.running) for point in points])}

    def missed(self, values: dict[str, FloatArray]) -> list[str | None]:
        """Per option, the first upper SLO missed (an option that serves nothing misses the first one)."""
        found: list[str | None] = []
        with np.errstate(invalid="ignore", divide="ignore"):
            utilisation = values["throughput"] / self.full_rps
        for j in range(self.options):
            miss = None
            for slo in self.slos:
                if not slo.upper_bound:
                    continue
                value = utilisation[j] if slo.metric is Metric.UTILISATION else values[slo.metric.value][j]
                if not (math.isfinite(values["e2e"][j]) and value <= slo.limit):
                    miss = slo.text
                    break
            found.append(miss)
        return found


def _largest(evaluate: _Evaluator, holds_one: list[bool]) -> tuple[IntArray, IntArray]:
    """Per option, the bracket ``low < high`` with the SLOs holding at ``low`` and missed at ``high``."""
    options = evaluate.options
    low = np.zeros(options, dtype=np.int64)
    high = np.full(options, MAX_CLIENTS, dtype=np.int64)
    open_ = np.array(holds_one)
    n = 1
    while open_.any() and n < MAX_CLIENTS:  # doubling: the first power of two the SLOs miss
        n *= 2
        missed = evaluate.missed(evaluate.at(np.full(options, n)))
        for j in np.flatnonzero(open_):
            if missed[j] is None:
                low[j] = n
            else:
                high[j], open_[j] = n, False
    low = np.where(np.array(holds_one), np.maximum(low, 1), 0)
    high = np.where(np.array(holds_one), high, 1)
    while ((high - low) > 1).any():  # bisection, every option at once
        middle = np.where(high - low > 1, (low + high) // 2, low)
        missed = evaluate.missed(evaluate.at(np.maximum(middle, 1)))
        ok = np.array([miss is None for miss in missed])
        moving = high - low > 1
        low = np.where(moving & ok, middle, low)
        high = np.where(moving & ~ok, middle, high)
    return low, high


def client_capacity(evaluate: _Evaluator) -> ClientCapacity:
    """The most clients each option keeps in flight under ``evaluate``'s SLOs (:class:`ClientCapacity`).

    Raises
    ------
    InvalidValueError
        No SLO bounds the clients (every one still holds at :data:`MAX_CLIENTS`).
    """
    scenario, slos, options = evaluate.scenario, evaluate.slos, evaluate.options
    first = evaluate.at(np.ones(options, dtype=np.int64))
    missed_one = evaluate.missed(first)
    low, high = _largest(evaluate, [miss is None for miss in missed_one])
    if (low >= MAX_CLIENTS).any():
        raise InvalidValueError(
            f"{', '.join(slo.text for slo in slos)} hold{'s' if len(slos) == 1 else ''} with any number of clients: "
            "past the engine's cap the others wait for admission, which adds to latency and TTFT but not to TPOT; "
            "add an e2e:mean or ttft:mean SLO to bound them")
    g = float(scenario.workload.output_tokens)
    floors = [slo.limit / g for slo in slos if slo.metric is Metric.THROUGHPUT]  # requests a second
    needed = np.ones(options, dtype=np.int64)
    binding: list[str | None] = []
    beyond = evaluate.missed(evaluate.at(np.maximum(high, 1)))
    for j in range(options):
        binding.append(missed_one[j] if low[j] == 0 else beyond[j])
    if floors:
        floor = max(floors)
        text = next(slo.text for slo in slos if slo.metric is Metric.THROUGHPUT and slo.limit / g == floor)
        reached = evaluate.at(np.maximum(low, 1))["throughput"] >= floor * (1 - 1e-12)
        for j in range(options):
            if low[j] == 0:
                continue
            if not reached[j]:  # throughput grows with N: not even the most clients reach it
                low[j], binding[j] = 0, text
                continue
            lo, hi = 0, int(low[j])  # the fewest clients that reach it
            while hi - lo > 1:
                middle = (lo + hi) // 2
                clients = np.ones(options, dtype=np.int64)
                clients[j] = middle
                if evaluate.at(clients)["throughput"][j] >= floor * (1 - 1e-12):
                    hi = middle
                else:
                    lo = middle
            needed[j] = hi
    served = evaluate.at(np.maximum(low, 1))
    feasible = low > 0
    nan = np.full(options, np.nan)
    capacity = ClientCapacity(
        draft_lengths=list(scenario.draft_lengths), alpha=float(scenario.alpha), output_tokens=g,
        max_clients=low.astype(np.int64), min_clients=needed, binding_slo=binding,
        latency_s=np.where(feasible, served["e2e"], nan), ttft_s=np.where(feasible, served["ttft"], nan),
        tpot_s=np.where(feasible, served["tpot"], nan), throughput_rps=np.where(feasible, served["throughput"], nan),
        running=np.where(feasible, served["running"], 0).astype(np.int64),
        caps=np.asarray(evaluate.caps, dtype=np.float64), best=-1)
    if feasible.any():
        best = _ranked(np.where(feasible, low, -1), np.where(feasible, served["throughput"], -1.0))
        capacity = replace(capacity, best=best)
    return capacity


def client_fleet(evaluate: _Evaluator, table: ClientCapacity, index: int, target_clients: int, gpus: int | None,
                 cost_usd: float | None) -> ClientFleet | None:
    """Replicas for ``target_clients`` with option ``index``, each replica holding its share (priced by
    ``evaluate``, the search's own); None where it meets no SLO."""
    if not table.feasible[index]:
        return None
    replicas = replicas_needed(float(target_clients), float(table.max_clients[index]))
    if replicas is None:
        return None
    share = max(1, math.ceil(target_clients / max(replicas, 1)))
    latency = evaluate.point(index, share).latency_s
    throughput = target_clients * table.output_tokens / latency if replicas else 0.0
    hourly = None if cost_usd is None or gpus is None else replicas * gpus * cost_usd
    per_million = None if hourly is None or throughput <= 0 else hourly / (throughput * 3600.0) * 1e6
    return ClientFleet(option=table.label(index), per_replica_clients=int(table.max_clients[index]),
                       replicas=replicas, gpus=None if gpus is None else replicas * gpus, cost_per_hour_usd=hourly,
                       output_throughput_tok_s=throughput, cost_per_million_output_tokens_usd=per_million)


def asks_for_clients(scenario: Scenario, closed_loop: bool, target_rate_rps: float | None,
                     engine_format: str | None) -> bool:
    """Whether ``capacity`` answers in clients: ``--closed-loop`` (or ``--target-concurrency``) says so, and so
    does a workload file's ``traffic.target_concurrency`` unless the command line asks for a rate or an engine
    format."""
    file = scenario.file
    from_file = file is not None and file.target_concurrency is not None and target_rate_rps is None \
        and engine_format is None
    return closed_loop or from_file


def refuse_with_closed_loop(engine_format: str | None, target_rate: float | None, simulate: bool) -> None:
    """Refuse what ``--closed-loop`` does not combine with (one line naming the option).

    Raises
    ------
    InvalidValueError
        An engine format (its k schedule is the same either way), a target rate, or the simulator (open loop).
    """
    if engine_format is not None:
        raise InvalidValueError(f"--format {engine_format} writes the k schedule per batch size, the same with or "
                                "without --closed-loop: leave --closed-loop and --target-concurrency out")
    if target_rate is not None:
        raise InvalidValueError("--target-rate and --closed-loop: size for a request rate (open loop) or for "
                                "--target-concurrency clients (closed loop), not both")
    if simulate:
        raise InvalidValueError("--simulate runs an open loop (arrivals at a rate), not --closed-loop's clients: "
                                "leave one out")


def answer_client_capacity(scenario: Scenario, slos_given: tuple[str, ...], target_clients: int | None,
                           gpus_per_replica: int | None, gpu_hour_cost_usd: float | None,
                           at_calibrated_speed: bool = False) -> ClientCapacityAnswer:
    """``sdplan capacity --closed-loop``: the table, its warnings and the fleet for ``target_clients`` (None: the
    workload file's ``traffic.target_concurrency``, else no fleet).

    A calibration that measured its servers' spread is answered on the slower server, as the rate's capacity
    is (:func:`sdplan.planning.capacity_answer.answer_capacity`).

    Raises
    ------
    InvalidValueError
        No SLO, percentile SLOs (means only), or none that bounds the clients.
    """
    slos = resolve_slos(slos_given, scenario.file, allow_percentiles=False)
    if not slos:
        raise InvalidValueError("capacity needs SLOs; give --slo (e.g. --slo 'e2e:mean<=4s') or slos in the workload")
    scenario.limits.require_fit(scenario.request_tokens)
    margin = speed_margin(scenario.calibration, at_calibrated_speed)
    answered = scenario
    if margin is not None and margin.measured and margin.applied:
        answered = replace(scenario, coefficients=on_slower_server(scenario.coefficients, margin.factor))
    if not any(slo.metric.bounds_rate for slo in slos):
        raise InvalidValueError(NEEDS_BOUND)
    evaluate = _Evaluator(answered, slos)
    table = client_capacity(evaluate)
    file = answered.file
    if target_clients is None and file is not None:
        target_clients = file.target_concurrency
    gpus = gpus_per_replica or (file.gpus_per_replica if file else None) or \
        answered.calibration.provenance.get("tensor_parallel_size")
    cost = gpu_hour_cost_usd if gpu_hour_cost_usd is not None else (file.gpu_hour_cost_usd if file else None)
    fleet = None
    if target_clients is not None:
        best_sd = table.best_speculative
        fleet = ClientFleetPlan(
            target_clients=target_clients,
            no_sd=client_fleet(evaluate, table, 0, target_clients, gpus, cost),
            best_sd=client_fleet(evaluate, table, best_sd, target_clients, gpus, cost) if best_sd > 0 else None)
    return ClientCapacityAnswer(scenario=answered, capacity=table, slos=tuple(slos),
                                warnings=tuple(_warnings(answered, table, slos)), fleet=fleet, speed_margin=margin)


def _warnings(scenario: Scenario, table: ClientCapacity, slos: list[SLO]) -> list[str]:
    """Calibrated batch sizes, clients waiting for admission at capacity, and a TTFT SLO on priced TTFT."""
    feasible = table.feasible
    best = [table.draft_lengths[table.best - 1]] if table.best > 0 else []
    running = float(table.running[feasible].max()) if feasible.any() else None
    warnings = scenario.calibration.validity_warnings(scenario.workload.prompt_tokens,
                                                      scenario.workload.output_tokens, running, best)
    waiting = [f"{table.label(j)} ({int(table.max_clients[j]) - int(table.running[j])} of "
               f"{int(table.max_clients[j])})" for j in range(len(table.max_clients))
               if feasible[j] and table.running[j] < table.max_clients[j]]
    if waiting:
        warnings.append("at capacity some clients wait for admission past the engine's cap (priced: latency x "
                        f"N/cap, the wait added to TTFT): {', '.join(waiting)}")
    priced_ttft = scenario.calibration.priced_ttft_warning([slo.metric.value for slo in slos])
    if priced_ttft is not None:
        warnings.append(priced_ttft)
    return warnings + scenario.notes()
