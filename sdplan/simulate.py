"""A discrete-event simulator of one serving replica with continuous batching and SD.

It shares its inputs with the analytic model (the calibration's coefficients
at the workload) and shows what the mean model cannot: tails, queueing, and
where the mean model stops being right.

Model of one replica (vLLM-like, iteration level):

* requests arrive as a Poisson process (or gamma inter-arrivals with a given
  coefficient of variation, for bursty traffic) and queue FCFS;
* at every step boundary waiting requests are admitted while the batch cap
  (``max_num_seqs``), the KV budget (prompt + output tokens reserved per
  running request) and the step's token budget (``max_num_batched_tokens``
  minus the decode tokens ``B (k+1)``) allow; their prefills run chunked
  inside that step, each adding ``c2p`` (the interference cost of the
  analytic model), and a prefill into an idle engine costs ``c1p`` (the
  request's own prefill latency, fixed costs included);
* every step, each running request verifies ``k`` drafted tokens and keeps
  ``A + 1`` (accepted plus the bonus token), with ``P(A >= j) = r_j``
  (``r_j = alpha**j`` for i.i.d. acceptance, or vLLM's per-position rates),
  sampled with one uniform per cycle;
* a step with ``B`` running requests lasts
  ``tau(B) = (c1v + k c1d) + (B - 1)(c2v + k c2d)`` (``c1_step + (B - 1) c2_step``
  without SD): the per-step form behind eq. 3, where ``C1`` is the batch-1
  latency and ``C2`` the cost of each other request in flight.

Because ``k`` is fixed within a run, the cycles each request needs are drawn
when it arrives, and batch membership changes only at arrivals and
completions: the loop leaps over runs of identical steps, so its cost grows
with the number of requests, not of steps. Everything takes an explicit
``numpy.random.Generator``; a seed gives identical results.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from sdplan.errors import InvalidValueError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from sdplan.model import Coefficients

    FloatArray = npt.NDArray[np.float64]

#: Fraction of the earliest requests discarded as warm-up (the empty system is not steady state).
WARMUP_FRACTION = 0.1
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulationConfig:
    """What to simulate. Times in seconds, lengths in tokens."""

    rate_rps: float
    draft_length: int  # 0: SD off
    position_rates: tuple[float, ...]  # P(A >= j), j = 1..k (alpha**j for i.i.d.)
    requests: int = 20_000
    prompt_tokens: int | FloatArray = 1024
    output_tokens: int | FloatArray = 512
    arrival_cv: float = 1.0  # 1: Poisson; > 1 bursty (gamma inter-arrivals)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_cache_tokens: float = math.inf
    #: Goodput-adaptive policy: candidate draft lengths (0 = off allowed) chosen per step by E(k)/tau_k(B)
    #: (SmartSpec); ``draft_length`` and ``position_rates`` then only give the rates for the longest k.
    adaptive_draft_lengths: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """Per-request samples after warm-up, and time averages."""

    e2e_s: FloatArray
    ttft_s: FloatArray
    tpot_s: FloatArray
    queue_s: FloatArray
    duration_s: float
    mean_running: float
    mean_in_system: float
    throughput_tok_s: float
    arrival_rate_rps: float
    tokens_per_cycle: float
    mean_draft_length: float = math.nan  # time-averaged k under the adaptive policy

    def statistic(self, metric: str, statistic: str) -> float:
        import numpy as np

        values = {"e2e": self.e2e_s, "ttft": self.ttft_s, "tpot": self.tpot_s, "queue": self.queue_s}[metric]
        values = values[np.isfinite(values)]
        if values.size == 0:
            return math.nan
        if statistic == "mean":
            return float(values.mean())
        return float(np.percentile(values, float(statistic.lstrip("p"))))


def cycles_needed(tokens_after_prefill: FloatArray, position_rates: tuple[float, ...],
                  rng: np.random.Generator) -> tuple[FloatArray, float]:
    """Verification cycles each request needs to produce its remaining tokens, and mean tokens per cycle.

    Each cycle commits ``1 + A`` tokens with ``A = #{j : U < r_j}`` for one
    uniform ``U``, so ``P(A >= j) = r_j`` and the mean is ``E = 1 + sum r_j``.
    """
    import numpy as np

    remaining = np.asarray(tokens_after_prefill, dtype=np.int64)
    k = len(position_rates)
    if k == 0:
        return remaining.astype(np.float64), 1.0
    rates = np.asarray(position_rates, dtype=np.float64)
    expected = 1.0 + float(rates.sum())
    cycles = np.zeros(remaining.size, dtype=np.float64)
    todo = np.flatnonzero(remaining > 0)
    left = remaining.copy()
    block = int(max(8, math.ceil(float(np.max(remaining, initial=0)) / expected * 1.3) + 8))
    while todo.size:
        draws = rng.random((todo.size, block))
        tokens = 1 + (draws[..., None] < rates).sum(axis=-1)  # (n, block)
        total = np.cumsum(tokens, axis=1)
        reached = total >= left[todo, None]
        done = reached.any(axis=1)
        first = np.argmax(reached, axis=1)
        cycles[todo[done]] += first[done] + 1
        cycles[todo[~done]] += block
        left[todo[~done]] -= total[~done, -1]
        todo = todo[~done]
    return cycles, expected


def simulate(coefficients: Coefficients, config: SimulationConfig, rng: np.random.Generator,
             on_progress: Callable[[int, int], None] | None = None) -> SimulationResult:
    """Run one replication (see the module docstring)."""
    import numpy as np

    n = int(config.requests)
    if n < 10:
        raise InvalidValueError("simulate at least 10 requests")
    if config.rate_rps <= 0:
        raise InvalidValueError("the request rate must be > 0 req/s")
    k = config.draft_length
    if k and config.adaptive_draft_lengths is None and len(config.position_rates) != k:
        raise InvalidValueError(f"acceptance must cover the draft length {k}")
    prompt = np.broadcast_to(np.asarray(config.prompt_tokens, dtype=np.float64), (n,)).copy()
    output = np.broadcast_to(np.asarray(config.output_tokens, dtype=np.float64), (n,)).copy()
    if np.any(output < 1) or np.any(prompt < 1):
        raise InvalidValueError("prompt and output lengths must be >= 1 token")
    shape = 1.0 / config.arrival_cv**2  # gamma with mean 1/rate and the given coefficient of variation
    gaps = rng.gamma(shape, 1.0 / (config.rate_rps * shape), size=n)
    arrival = np.cumsum(gaps)
    adaptive = config.adaptive_draft_lengths is not None
    c = coefficients
    rates_all = np.asarray(config.position_rates, dtype=np.float64)

    def step_costs(draft: int) -> tuple[float, float]:
        if draft:
            return c.c1v_s + draft * c.c1d_s, c.c2v_s + draft * c.c2d_s
        return c.baseline_c1_step_s, c.baseline_c2_step_s

    if adaptive:
        options = sorted(set(config.adaptive_draft_lengths or ()))
        if any(o > len(rates_all) for o in options):
            raise InvalidValueError("acceptance must cover every candidate draft length")
        costs = np.array([step_costs(o) for o in options])  # (options, 2)
        expected_by_option = np.array([1.0 + rates_all[:o].sum() for o in options])
        expected = math.nan  # progress is counted in tokens still to produce after the prefill token
    else:
        cycles, expected = cycles_needed(output - 1, config.position_rates if k else (), rng)
    fixed, per_sequence = step_costs(k)

    def choose(batch: int) -> int:
        """SmartSpec: the option with the highest goodput E(k)/tau_k(B) at this batch size."""
        tau = costs[:, 0] + max(batch - 1, 0) * costs[:, 1]
        return int(np.argmax(expected_by_option / tau))

    def sample_tokens(count: int, cycles_ahead: int, draft: int) -> FloatArray:
        """Tokens committed per cycle, shape (count, cycles_ahead), at draft length ``draft``."""
        if draft == 0:
            return np.ones((count, cycles_ahead))
        draws = rng.random((count, cycles_ahead))
        return 1.0 + (draws[..., None] < rates_all[:draft]).sum(axis=-1)

    admit_time = np.full(n, np.nan)
    first_token = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    run_ids = np.empty(0, dtype=np.int64)
    run_left = np.empty(0, dtype=np.float64)
    queue: deque[int] = deque()
    next_arrival = 0
    kv_used = 0.0
    t = 0.0
    busy_area = 0.0  # integral of running requests over time
    system_area = 0.0  # integral of requests in the system over time
    k_area = 0.0  # integral of the draft length over busy time
    busy_time = 0.0
    in_system = 0
    completed = 0

    def advance(duration: float, running: int, draft: int) -> None:
        nonlocal t, busy_area, system_area, k_area, busy_time
        busy_area += running * duration
        system_area += in_system * duration
        if running:
            k_area += draft * duration
            busy_time += duration
        t += duration

    while completed < n:
        while next_arrival < n and arrival[next_arrival] <= t:
            queue.append(next_arrival)
            next_arrival += 1
            in_system += 1
        batch = run_ids.size
        if batch == 0 and not queue:
            advance(arrival[next_arrival] - t, 0, 0)  # idle until the next arrival
            continue
        if adaptive:
            option = choose(max(batch, 1))
            k = options[option]
            fixed, per_sequence = float(costs[option, 0]), float(costs[option, 1])
        decode_tokens = k + 1
        # Admission at this step boundary.
        budget = config.max_num_batched_tokens - batch * decode_tokens
        admitted: list[int] = []
        while queue and batch + len(admitted) < config.max_num_seqs:
            request = queue[0]
            need = prompt[request] + output[request]
            if kv_used + need > config.kv_cache_tokens and (batch or admitted):
                break
            if admitted and prompt[request] > budget:
                break
            queue.popleft()
            admitted.append(request)
            kv_used += need
            budget -= prompt[request]
        step = (fixed + (batch - 1) * per_sequence) if batch else 0.0
        if admitted:
            step += len(admitted) * c.c2p_s + (max(c.c1p_s - c.c2p_s, 0.0) if batch == 0 else 0.0)
            advance(step, batch, k)
            ids = np.asarray(admitted, dtype=np.int64)
            admit_time[ids] = t - step
            first_token[ids] = t
            if adaptive:
                run_left = run_left - sample_tokens(batch, 1, k)[:, 0]  # the running requests decoded one cycle
                new_left = output[ids] - 1
            else:
                run_left = run_left - 1.0
                new_left = cycles[ids]
            run_ids = np.concatenate([run_ids, ids])
            run_left = np.concatenate([run_left, new_left])
        else:
            # Leap over identical steps until a completion or the next arrival's step boundary.
            until_arrival = math.inf
            if next_arrival < n:
                until_arrival = max(1.0, math.ceil((arrival[next_arrival] - t) / step))
            if adaptive:
                horizon = max(1, int(min(until_arrival, math.ceil(float(run_left.max())))))
                produced = np.cumsum(sample_tokens(batch, horizon, k), axis=1)
                reached = produced >= run_left[:, None]
                first = np.where(reached.any(axis=1), np.argmax(reached, axis=1) + 1, horizon)
                leap = float(min(int(first.min()), horizon))
                run_left = run_left - produced[:, int(leap) - 1]
            else:
                leap = max(1.0, min(float(run_left.min()), until_arrival))
                run_left = run_left - leap
            advance(leap * step, batch, k)
        done = run_left <= 0
        if np.any(done):
            ids = run_ids[done]
            finish[ids] = t
            kv_used -= float((prompt[ids] + output[ids]).sum())
            completed += ids.size
            in_system -= ids.size
            run_ids, run_left = run_ids[~done], run_left[~done]
            if on_progress is not None and completed % 1000 < ids.size:
                on_progress(completed, n)

    keep = np.arange(n) >= int(WARMUP_FRACTION * n)
    e2e = (finish - arrival)[keep]
    ttft = (first_token - arrival)[keep]
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(output[keep] > 1, (finish - first_token)[keep] / (output[keep] - 1), np.nan)
    return SimulationResult(
        e2e_s=e2e, ttft_s=ttft, tpot_s=tpot, queue_s=(admit_time - arrival)[keep], duration_s=t,
        mean_running=busy_area / t, mean_in_system=system_area / t, throughput_tok_s=float(output.sum()) / t,
        arrival_rate_rps=n / float(arrival[-1]), tokens_per_cycle=expected,
        mean_draft_length=k_area / busy_time if adaptive and busy_time > 0 else float(k),
    )


# ----------------------------------------------------------------------------- replications

#: Two-sided 95% Student-t quantiles by degrees of freedom (normal beyond the table).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}
STATISTICS = ("mean", "p50", "p90", "p99")
METRICS = ("e2e", "ttft", "tpot", "queue")


def t_quantile(dof: int) -> float:
    if dof <= 0:
        return math.inf
    eligible = [d for d in _T95 if d <= dof]
    return _T95[max(eligible)] if dof <= 30 else 1.96


@dataclass(frozen=True, slots=True)
class Estimate:
    """Mean over replications and the half-width of its 95% confidence interval (inf with one seed)."""

    value: float
    half_width: float


@dataclass(frozen=True, slots=True)
class RateSummary:
    rate_rps: float
    draft_length: int
    replications: int
    requests: int
    stats: dict[tuple[str, str], Estimate]
    throughput_tok_s: Estimate
    mean_running: Estimate
    mean_in_system: Estimate
    little_batch: Estimate  # lambda * mean latency, to compare with mean_in_system
    analytic_e2e_s: float
    e2e_samples_s: FloatArray  # the first replication's latencies, for CDF plots
    mean_draft_length: Estimate | None = None  # the goodput policy's time-averaged k


def _estimate(samples: list[float]) -> Estimate:
    import numpy as np

    values = np.asarray(samples, dtype=np.float64)
    if values.size == 1:
        return Estimate(float(values[0]), math.inf)
    half = t_quantile(values.size - 1) * float(values.std(ddof=1)) / math.sqrt(values.size)
    return Estimate(float(values.mean()), half)


class _Statistics(dict):  # type: ignore[type-arg]
    """``(metric, statistic) -> Estimate`` over replications; any percentile ``pX`` (0 < X < 100) on demand."""

    def __init__(self, runs: list[SimulationResult]) -> None:
        super().__init__()
        self._runs = runs
        for metric in METRICS:
            for statistic in STATISTICS:
                self[metric, statistic]

    def __missing__(self, key: tuple[str, str]) -> Estimate:
        metric, statistic = key
        estimate = _estimate([run.statistic(metric, statistic) for run in self._runs])
        self[key] = estimate
        return estimate


def replicate(coefficients: Coefficients, config: SimulationConfig, seeds: int, seed: int,
              analytic_e2e_s: float, on_progress: Callable[[int, int], None] | None = None) -> RateSummary:
    """Independent replications with seeds ``seed .. seed + seeds - 1``."""
    import numpy as np

    runs = []
    for index in range(seeds):
        runs.append(simulate(coefficients, config, np.random.default_rng(seed + index), on_progress))
    stats = _Statistics(runs)
    return RateSummary(
        rate_rps=config.rate_rps, draft_length=config.draft_length, replications=seeds, requests=config.requests,
        stats=stats, throughput_tok_s=_estimate([run.throughput_tok_s for run in runs]),
        mean_running=_estimate([run.mean_running for run in runs]),
        mean_in_system=_estimate([run.mean_in_system for run in runs]),
        little_batch=_estimate([run.arrival_rate_rps * run.statistic("e2e", "mean") for run in runs]),
        analytic_e2e_s=analytic_e2e_s, e2e_samples_s=runs[0].e2e_s,
        mean_draft_length=_estimate([run.mean_draft_length for run in runs])
        if config.adaptive_draft_lengths is not None else None,
    )
