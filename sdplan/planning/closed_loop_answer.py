"""``sdplan plan --concurrency`` as one use case: a closed loop of ``N`` clients per option.

Most SD benchmarks hold the load by its concurrency, not its rate: ``vllm bench serve --max-concurrency N``,
GuideLLM's concurrent profile, a static batch of ``N`` streams. They report the throughput of SD against no SD
at each ``N``. This answers the same question from a calibration: per concurrency and option, the mean
latency, TTFT, TPOT and throughput of :func:`sdplan.latency.closed_loop.closed_loop_point`, the option with the
highest throughput (the shortest latency: at one ``N`` both pick the same), and the speedup, no SD's latency
over the option's (equal to the ratio of their throughputs). Each option runs at most its engine's cap of
requests (:meth:`sdplan.inputs.serving.EngineLimits.caps`: ``max_num_seqs``, or what its KV cache holds, smaller
with a draft); the other clients wait for admission, and their wait is priced. The means are a long run's steady
state; given the requests a benchmark sends in all (``vllm bench serve --num-prompts``), they are the run's, its
opening wave included (:meth:`sdplan.latency.closed_loop.ClosedLoopPoint.with_opening_wave`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sdplan.errors import InvalidValueError
from sdplan.inputs import serving
from sdplan.latency import model
from sdplan.latency.closed_loop import ClosedLoopPoint, admitted_clients, closed_loop_point
from sdplan.limits import check_grid, check_table
from sdplan.planning import planner
from sdplan.planning.plan_answer import check_speculation_identified, plan_inputs

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.planning.scenario import Scenario

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

#: The concurrencies planned when none are given: a sweep's usual powers of two.
DEFAULT_CLIENTS = (1, 2, 4, 8, 16, 32, 64, 128)
#: Requests ``vllm bench serve`` sends when its ``--num-prompts`` is not given: the run the steady-state
#: warning prices the opening wave of (:func:`opening_wave_warning`).
BENCHMARK_REQUESTS = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class ClosedLoopQuery:
    """What ``sdplan plan --concurrency`` asks: the concurrencies (clients), the requests each run sends in all
    (``--num-prompts``; None: a long run's steady state) and whether a table shows the answer."""

    clients: tuple[int, ...] = DEFAULT_CLIENTS
    requests: int | None = None
    for_table: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ClosedLoopPlan:
    """Predictions per (acceptance, concurrency, option). Option 0 is no SD, then ``draft_lengths`` in order.

    Attributes
    ----------
    clients : (n,) int
        Concurrencies ``N``.
    draft_lengths : (k,) int
        Draft lengths of the SD options.
    alphas : (a,) float
        Per-token acceptance per row (or the alpha equivalent of the given acceptance).
    tokens_per_cycle : (a, k) float
        ``E`` of each SD option, draft coverage applied.
    output_tokens : float
        ``g`` per request.
    latency_s, ttft_s : (a, n, 1 + k) float
        Mean end-to-end latency and TTFT, the wait for admission included.
    running : (n, 1 + k) int
        Requests each option's engine runs at once: ``min(N, cap)``.
    best : (a, n) int
        Index of the option with the shortest latency (0: no SD).
    requests : int or None
        Requests each run sends in all, whose opening wave the means include (None: a long run's steady state,
        or a calibration whose fitted TTFT holds its own runs' waves: :func:`wave_budget_tokens`).
    moe : bool
        Whether the target is a mixture of experts, whose steps are priced at the experts their token rows read
        (``docs/model.md``, the MoE section).
    """

    clients: IntArray
    draft_lengths: IntArray
    alphas: FloatArray
    tokens_per_cycle: FloatArray
    output_tokens: float
    latency_s: FloatArray
    ttft_s: FloatArray
    running: IntArray
    best: IntArray
    requests: int | None = None
    moe: bool = False

    def best_gains(self, ia: int) -> FloatArray:
        """The best option's throughput over no SD's at each ``N`` for acceptance row ``ia`` (n,); 1 where no SD
        is the best."""
        gains = self.speedup[ia, np.arange(self.clients.size), self.best[ia]]
        return np.where(self.best[ia] > 0, gains, 1.0)

    @property
    def throughput_rps(self) -> FloatArray:
        """Completed requests a second, ``N / L`` (a, n, 1 + k)."""
        return self.clients[None, :, None] / self.latency_s

    @property
    def output_throughput_tok_s(self) -> FloatArray:
        """Output tokens a second, ``g N / L`` (a, n, 1 + k)."""
        return self.output_tokens * self.throughput_rps

    @property
    def tpot_s(self) -> FloatArray:
        """Mean TPOT, ``(L - TTFT)/(g - 1)``, vLLM's definition (:func:`sdplan.latency.model.time_per_output_token`):
        inf where the option serves nothing, NaN for one output token (a, n, 1 + k)."""
        return model.time_per_output_token(self.latency_s, self.ttft_s, self.output_tokens)

    @property
    def speedup(self) -> FloatArray:
        """No SD's latency over each option's at the same ``N``: the ratio of their throughputs (a, n, 1 + k); 0 for an
        option that serves nothing, NaN where neither serves."""
        throughput = self.throughput_rps
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(throughput[:, :, :1] > 0, throughput / throughput[:, :, :1], np.nan)

    @property
    def best_k(self) -> IntArray:
        """Draft length of the best option per (a, n); 0 is no SD."""
        lengths = np.concatenate(([0], self.draft_lengths))
        return lengths[self.best]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClosedLoopAnswer:
    """Everything ``sdplan plan --concurrency`` reports: the plan and what it was computed from.

    ``inputs.cap_phrases`` names each option's cap, no SD first (``batch cap of 213 sequences: KV cache ...``).
    """

    plan: ClosedLoopPlan
    inputs: planner.PlanInputs


def wave_budget_tokens(scenario: Scenario) -> int | None:
    """The prefill budget a step of ``scenario``'s engine fills with an opening wave's prompts, tokens; None where
    the calibration prices no wave.

    As ``sdplan validate`` prices a derived file's closed-loop runs (``docs/model.md#ttft-and-tpot``): its engine
    (:func:`sdplan.inputs.serving.derived_prefill_scheduling`) takes ``max_num_batched_tokens`` of the scenario's
    limits where it chunks prefills as vLLM does, else its own budget (SGLang's). A measured or fitted
    calibration's TTFT weights already hold the waves of the runs it was fitted to, and a roofline file records
    no engine (None).
    """
    scheduling = serving.derived_prefill_scheduling(scenario.calibration)
    if scheduling is None:
        return None
    return scheduling.budget_tokens if scheduling.prefill_first else scenario.limits.max_num_batched_tokens


def check_requests(requests: int | None, clients: tuple[int, ...]) -> None:
    """Refuse a run of fewer requests than its clients: each client sends its first request at once.

    Raises
    ------
    InvalidValueError
        ``requests`` is below the largest of ``clients``.
    """
    if requests is not None and requests < max(clients):
        raise InvalidValueError(f"--num-prompts {requests} is fewer than the {max(clients)} clients: a closed-loop "
                                f"run sends every client's first request at once; give at least {max(clients)}")


def opening_wave_warning(scenario: Scenario, requests: int | None, clients: tuple[int, ...]) -> str | None:
    """What the means leave out or cannot add about a run's opening wave (None: nothing to say).

    Without ``requests`` a derived calibration's means are a long run's steady state, and a benchmark's first
    prompts, all sent at once, queue for prefill on top of them; with ``requests`` on a fitted calibration,
    the wave is already in its TTFT weights and nothing is added.
    """
    budget = wave_budget_tokens(scenario)
    if requests is not None and budget is None:
        return (f"--num-prompts {requests}: nothing added to {scenario.calibration.name}'s means: only a derived "
                "calibration prices a run's opening wave (a measured or fitted one holds its own runs' waves in "
                "its TTFT weights)")
    if requests is not None or budget is None:
        return None
    largest = max(clients)
    sent = max(BENCHMARK_REQUESTS, largest)
    wave, _ = model.closed_loop_waves_s(scenario.coefficients, admitted_clients(largest, scenario.limits.caps([])[0]),
                                        budget, sent / largest, recurs=False)
    if wave <= 0.0:
        return None
    return (f"means of a long run's steady state: a benchmark sends its clients' first prompts at once, and that "
            f"wave adds to its mean TTFT (no SD at {largest} clients: {wave * 1e3:.3g} ms over "
            f"{sent:,} requests); --num-prompts gives the requests a run sends")


def steady_point(scenario: Scenario, draft_length: int, tokens_per_cycle: float, clients: int, cap: float,
                 served: dict[int, ClosedLoopPoint] | None = None) -> ClosedLoopPoint:
    """One option's long-run steady state with ``clients`` in flight and its engine cap ``cap``.

    The engine runs ``min(N, cap)`` of them (:func:`sdplan.latency.closed_loop.admitted_clients`) and the others
    wait for admission (:meth:`~sdplan.latency.closed_loop.ClosedLoopPoint.with_clients`); ``served`` caches the
    point of each number the engine runs, for callers that price many ``N`` of one option. A cap below one
    request (a KV cache that holds no whole request) admits nobody, as the rate plan says: infinite latency.
    """
    if cap < 1:
        return ClosedLoopPoint(clients=clients, running=0, latency_s=math.inf, ttft_s=math.inf)
    held = admitted_clients(clients, cap)
    cache = {} if served is None else served
    if held not in cache:
        cache[held] = closed_loop_point(scenario.coefficients, draft_length, tokens_per_cycle, held, scenario.moe,
                                        cap)
    return cache[held].with_clients(clients)


def closed_loop_plan(scenario: Scenario, clients: tuple[int, ...], requests: int | None = None) -> ClosedLoopPlan:
    """Every option of ``scenario`` in closed loops of ``clients``: :func:`sdplan.latency.closed_loop.closed_loop_point`
    at each option's engine cap (:meth:`sdplan.inputs.serving.EngineLimits.caps`), with runs of ``requests`` in all
    their opening wave (:func:`wave_budget_tokens`; None: a long run's steady state).

    Raises
    ------
    InvalidValueError
        ``requests`` fewer than the clients (:func:`check_requests`).
    """
    check_requests(requests, clients)
    budget = wave_budget_tokens(scenario) if requests is not None else None
    alphas = np.asarray(scenario.workload.acceptance.alphas, dtype=np.float64)
    ks = np.asarray(scenario.draft_lengths, dtype=np.int64)
    tokens = np.broadcast_to(np.asarray(scenario.tokens_per_cycle, dtype=np.float64), (alphas.size, ks.size))
    caps = scenario.limits.caps([int(k) for k in ks])
    counts = np.asarray(clients, dtype=np.int64)
    shape = (alphas.size, counts.size, ks.size + 1)
    latency, ttft = np.empty(shape), np.empty(shape)
    running = np.empty(shape[1:], dtype=np.int64)
    for ia in range(alphas.size):
        for option, k in enumerate((0, *ks)):
            per_cycle = 1.0 if k == 0 else float(tokens[ia, option - 1])
            served: dict[int, ClosedLoopPoint] = {}  # past the cap every N shares the state of the full engine
            for i_n, n in enumerate(counts):
                point = steady_point(scenario, int(k), per_cycle, int(n), caps[option], served)
                if budget is not None and requests is not None:
                    point = point.with_opening_wave(scenario.coefficients, budget, requests)
                latency[ia, i_n, option], ttft[ia, i_n, option] = point.latency_s, point.ttft_s
                running[i_n, option] = point.running
    return ClosedLoopPlan(clients=counts, draft_lengths=ks, alphas=alphas, tokens_per_cycle=tokens,
                          output_tokens=float(scenario.workload.output_tokens), latency_s=latency, ttft_s=ttft,
                          running=running, best=np.argmin(latency, axis=2),
                          requests=requests if budget is not None else None, moe=scenario.moe is not None)


def _waiting_warnings(plan: ClosedLoopPlan, cap_phrases: tuple[str, ...]) -> list[str]:
    """Where clients wait for admission: for no SD and each option that is best somewhere, the first concurrency
    past its cap; and, in one line, the options whose engine admits no request of the workload at all."""
    found, none_served = [], []
    shown = {0} | {int(option) for option in np.unique(plan.best)}
    for option, phrase in enumerate(cap_phrases):
        name = "no SD" if option == 0 else f"k={int(plan.draft_lengths[option - 1])}"
        past = np.flatnonzero(plan.running[:, option] < plan.clients)
        if not plan.running[:, option].any():
            none_served.append((name, phrase))
        elif past.size and option in shown:
            found.append(f"{name} from {int(plan.clients[past[0]])} clients: its {phrase} holds, the other clients "
                         "wait for admission (priced: latency x N/cap, the wait added to TTFT)")
    if none_served:
        names = ", ".join(name for name, _ in none_served)
        found.append(f"{names} serve{'s' if len(none_served) == 1 else ''} no request of this workload (the "
                     f"first's {none_served[0][1]}): unstable at every concurrency")
    return found


def answer_closed_loop(scenario: Scenario, query: ClosedLoopQuery) -> ClosedLoopAnswer:
    """Plan ``scenario`` over closed loops of ``query.clients``: the plan, its inputs and warnings.

    Raises
    ------
    LimitError
        The grid (or, for a table, its rows) is over the work budget.
    InputFileError
        The calibration was fitted without SD runs (:func:`sdplan.planning.plan_answer.check_speculation_identified`).
    """
    cal, workload, draft_lengths = scenario.calibration, scenario.workload, scenario.draft_lengths
    alphas = workload.acceptance.alphas
    check_grid(len(query.clients) * (len(draft_lengths) + 1) * len(alphas),
               f"{len(query.clients)} concurrencies x {len(draft_lengths) + 1} draft lengths x {len(alphas)} "
               "acceptances", "give fewer --concurrency, --draft-lengths or --acceptance values")
    if query.for_table:
        check_table(len(alphas), len(alphas) * len(query.clients),
                    "give fewer --concurrency or --acceptance values")
    check_speculation_identified(cal)
    result = closed_loop_plan(scenario, query.clients, query.requests)
    cap_phrases = scenario.limits.cap_phrases(draft_lengths)
    # the steady state's caveat is check's, which gates on TTFT; the plan's table shows latency, which the wave
    # moves by little (its definitions say what run_requests adds), so it warns only where nothing is added
    wave = opening_wave_warning(scenario, query.requests, query.clients) if query.requests is not None else None
    inputs = plan_inputs(scenario, largest_batch=float(result.running.max()),
                         best_draft_lengths={int(k) for k in np.unique(result.best_k) if k > 0},
                         load_warnings=_waiting_warnings(result, cap_phrases) + ([wave] if wave else []))
    return ClosedLoopAnswer(plan=result, inputs=inputs)
