"""A discrete-event simulator of one serving replica with continuous batching and SD.

It shares its inputs with the analytic model (the calibration's coefficients
at the workload) and shows what the mean model cannot: tails, queueing, and
where the mean model stops being right.

Model of one replica (vLLM-like, iteration level):

* requests arrive as a Poisson process (or gamma inter-arrivals with a given
  coefficient of variation, for bursty traffic) and queue FCFS;
* every step has a token budget (``max_num_batched_tokens``): the running
  decodes take ``B (k+1)`` tokens first, then prefills take chunks in FCFS
  order, partial prefills before new admissions, so a long prompt is
  prefilled over several steps (chunked prefill). A request is admitted when
  it gets its first chunk, while the batch cap (``max_num_seqs``, running
  plus prefilling) and the KV budget (prompt + output tokens reserved at
  admission; no preemption) allow; a request larger than the KV budget is
  refused up front. A prefill chunk of ``q`` tokens adds ``q c2p/p`` to its
  step (the analytic model's interference per prompt token), and a forward
  pass of an idle engine also pays the prefill's fixed part ``c1p - c2p``;
  the step that completes a prompt emits the request's first token;
* every step, each running request verifies ``k`` drafted tokens and keeps
  ``A + 1`` (accepted plus the bonus token), with ``P(A >= j) = r_j``
  (``r_j = alpha**j`` for i.i.d. acceptance, or vLLM's per-position rates);
* a step with ``B`` running requests lasts
  ``tau(B) = (c1v + k c1d) + (B - 1)(c2v + k c2d)`` (``c1_step + (B - 1) c2_step``
  without SD) plus its prefill chunks: the per-step form behind eq. 3, where
  ``C1`` is the batch-1 latency and ``C2`` the cost of each other request
  (``docs/model.md#per-step-form``).

Because ``k`` is fixed within a run, the cycles each request needs to emit
its ``g - 1`` tokens after the prefill are drawn when it arrives (from their
exact distribution, one uniform each), every running request advances one
cycle per step, and a heap of finishing steps gives the next completion:
the loop leaps over runs of identical steps, so its cost grows with the
number of requests, not of steps. Under the goodput policy (k chosen per
step) tokens are drawn per cycle instead. A run whose queue keeps growing is
flagged as not at steady state (:func:`is_steady`). Everything takes an
explicit ``numpy.random.Generator``; a seed gives identical results.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from sdplan.errors import InvalidValueError
from sdplan.limits import MAX_SIMULATED_RATE_RPS
from sdplan.policy import step_choices

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from sdplan.coefficients import Coefficients

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
    #: Fraction of the earliest requests left out of the statistics (0 to compare with a served benchmark,
    #: which starts from an empty engine and keeps every request).
    warmup_fraction: float = WARMUP_FRACTION


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
    #: False when the queue kept growing (past saturation): the statistics are not steady-state values.
    steady: bool = True

    def statistic(self, metric: str, statistic: str) -> float:
        import numpy as np

        values = {"e2e": self.e2e_s, "ttft": self.ttft_s, "tpot": self.tpot_s, "queue": self.queue_s}[metric]
        values = values[np.isfinite(values)]
        if values.size == 0:
            return math.nan
        if statistic == "mean":
            return float(values.mean())
        return float(np.percentile(values, float(statistic.lstrip("p"))))


#: Work bound (cycles x tokens x taps) of the exact first-passage distribution; beyond it cycles are sampled.
_EXACT_WORK = 5e7


def cycles_needed(tokens_after_prefill: FloatArray, position_rates: tuple[float, ...],
                  rng: np.random.Generator) -> tuple[FloatArray, float]:
    """Verification cycles each request needs to produce its remaining tokens, and mean tokens per cycle.

    Each cycle commits ``1 + A`` tokens with ``P(A >= j) = r_j`` (the rates
    sorted in decreasing order; ``r_j = alpha**j`` for i.i.d. acceptance), so
    ``E = 1 + sum r_j``. The cycles to produce ``m`` tokens are the first
    passage ``N(m) = min{c : S_c >= m}`` of the token sum; its distribution
    ``P(N(m) <= c) = P(S_c >= m)`` is computed exactly by convolution, and
    each request draws its count from one uniform (inverse CDF), which keeps
    random streams aligned across rates and draft lengths. Very long outputs
    fall back to drawing every cycle.
    """
    import numpy as np

    remaining = np.asarray(tokens_after_prefill, dtype=np.int64)
    k = len(position_rates)
    if k == 0:
        return remaining.astype(np.float64), 1.0
    rates = np.sort(np.asarray(position_rates, dtype=np.float64))[::-1]
    expected = 1.0 + float(rates.sum())
    top = int(np.max(remaining, initial=0))
    horizon = int(math.ceil(top / expected * 1.5)) + 32 if expected > 1.0 else top + 1
    if top <= 0:
        return np.zeros(remaining.size), expected
    if horizon * top * (k + 1) <= _EXACT_WORK or top <= 1:
        return _cycles_exact(remaining, rates, rng.random(remaining.size)), expected
    return _cycles_sampled(remaining, rates, rng), expected


def _cycles_exact(remaining: npt.NDArray[np.int64], rates: FloatArray, uniforms: FloatArray) -> FloatArray:
    """Inverse-CDF draw of ``N(m)`` per request from the exact first-passage distribution."""
    import numpy as np

    top = int(remaining.max())
    step = np.concatenate([[1.0], rates]) - np.concatenate([rates, [0.0]])  # P(A = a), a = 0..k
    step = np.concatenate([[0.0], np.clip(step, 0.0, None)])  # tokens per cycle: 1 + A
    levels, index = np.unique(remaining, return_inverse=True)
    positive = levels > 0
    distribution = np.zeros(top + 1)
    distribution[0] = 1.0  # S_0 = 0; mass at >= top is lumped in the last cell
    cdf_rows = []
    while True:
        distribution = np.convolve(distribution, step)
        distribution[top] += distribution[top + 1:].sum()
        distribution = distribution[: top + 1]
        tail = np.cumsum(distribution[::-1])[::-1]  # P(S_c >= m), m = 0..top
        cdf_rows.append(tail[levels])
        if tail[top] >= 1.0 - 1e-12 or len(cdf_rows) > 4 * top + 64:
            break
    cdf = np.asarray(cdf_rows)  # (cycles, levels): P(N(m) <= c)
    cycles = np.zeros(remaining.size)
    for level in np.flatnonzero(positive):
        members = index == level
        cycles[members] = 1 + np.searchsorted(cdf[:, level], uniforms[members], side="right")
    return np.minimum(cycles, len(cdf_rows))


def _cycles_sampled(remaining: npt.NDArray[np.int64], rates: FloatArray, rng: np.random.Generator) -> FloatArray:
    """``N(m)`` by drawing the tokens of every cycle (long outputs)."""
    import numpy as np

    cycles = np.zeros(remaining.size, dtype=np.float64)
    todo = np.flatnonzero(remaining > 0)
    left = remaining.copy()
    expected = 1.0 + float(rates.sum())
    block = int(max(8, math.ceil(float(np.max(remaining, initial=0)) / expected * 1.3) + 8))
    while todo.size:
        draws = rng.random((todo.size, block))
        tokens = 1 + np.searchsorted(-rates, -draws, side="left").astype(np.int32)  # #{j : U < r_j}, r decreasing
        total = np.cumsum(tokens, axis=1, dtype=np.int64)
        reached = total >= left[todo, None]
        done = reached[:, -1]
        first = np.argmax(reached, axis=1)
        cycles[todo[done]] += first[done] + 1
        cycles[todo[~done]] += block
        left[todo[~done]] -= total[~done, -1]
        todo = todo[~done]
    return cycles


#: Uniforms the goodput policy's decode draws per block ahead of use (a larger leap draws what it needs).
UNIFORM_BLOCK = 1 << 16


class _AdaptiveDecode:
    """Running sequences under the goodput policy: tokens left per sequence, sampled per cycle at the step's k.

    A leap of up to ``steps`` cycles at draft length ``k`` uses the next
    ``sequences x steps`` uniforms of the generator, row ``i`` (the ``i``-th
    running sequence, in admission order) taking ``steps`` consecutive ones,
    and a cycle whose uniform is ``U`` commits ``1 + #{j <= k : U < r_j}``
    tokens. The uniforms are drawn in blocks ahead of use and turned into
    tokens per cycle once per block and draft length, so a leap costs a few
    array operations on its own cycles; the stream is consumed in the same
    order as drawing each leap's block on its own (the generator ends up
    further along than that, by the unused rest of the last block).
    """

    def __init__(self, rates: FloatArray, rng: np.random.Generator, capacity: int) -> None:
        import numpy as np

        self.rates, self.rng = rates, rng
        self.ids = np.empty(max(capacity, 1), dtype=np.int64)
        self.left = np.empty(max(capacity, 1), dtype=np.float64)
        self.size = 0
        self.uniforms = np.empty(0)
        self.position = 0
        self.tokens: dict[int, FloatArray] = {}  # draft length -> tokens per cycle of each uniform in the block

    def add(self, request: int, tokens_left: float) -> None:
        import numpy as np

        if self.size == self.ids.size:
            self.ids = np.concatenate([self.ids, np.empty_like(self.ids)])
            self.left = np.concatenate([self.left, np.empty_like(self.left)])
        self.ids[self.size] = request
        self.left[self.size] = tokens_left
        self.size += 1

    def _cycle_tokens(self, draft: int, count: int) -> FloatArray:
        """Tokens per cycle at ``draft`` for the next ``count`` uniforms of the stream."""
        import numpy as np

        if self.position + count > self.uniforms.size:
            self.uniforms = np.concatenate([self.uniforms[self.position:], self.rng.random(max(UNIFORM_BLOCK, count))])
            self.position = 0
            self.tokens = {}
        tokens = self.tokens.get(draft)
        if tokens is None:  # 1 + #{j <= k : U < r_j}, one pass per position
            tokens = np.ones(self.uniforms.size)
            for rate in self.rates[:draft].tolist():
                tokens += self.uniforms < rate
            self.tokens[draft] = tokens
        start = self.position
        self.position += count
        return tokens[start:self.position]

    def leap(self, steps: int, draft: int) -> tuple[int, list[int]]:
        """Advance up to ``steps`` cycles at draft length ``draft``, stopping at the first completion.

        ``steps`` is capped at the cycles the longest sequence can still
        need (its tokens left, at one token per cycle).
        """
        import numpy as np

        size = self.size
        left = self.left[:size]
        if steps > 1:
            steps = max(1, min(steps, math.ceil(float(np.maximum.reduce(left)))))
            if draft:  # draw about the cycles the first completion needs (its expected count, with room), not
                # the longest sequence's: 10^5 tokens left would draw 10^5 cycles each for one completion
                per_cycle = 1.0 + float(self.rates[:draft].sum())
                steps = min(steps, int(float(np.minimum.reduce(left)) / per_cycle * 1.25) + 32)
        else:
            steps = 1
        if draft == 0:  # one token per cycle: the first completion is at the fewest tokens left
            taken = min(max(1, math.ceil(float(np.minimum.reduce(left)))), steps)
            left -= float(taken)
        elif steps == 1:
            taken = 1
            left -= self._cycle_tokens(draft, size)
        else:
            produced = np.cumsum(self._cycle_tokens(draft, size * steps).reshape(size, steps), axis=1)
            reached = np.flatnonzero(np.logical_or.reduce(produced >= left[:, None], axis=0))
            taken = int(reached[0]) + 1 if reached.size else steps  # the first cycle at which a sequence finishes
            left -= produced[:, taken - 1]
        if np.minimum.reduce(left) > 0:
            return taken, []
        done = left <= 0
        finished = self.ids[:size][done].tolist()
        kept = size - len(finished)
        self.ids[:kept] = self.ids[:size][~done]
        self.left[:kept] = left[~done]
        self.size = kept
        return taken, finished


def simulate(coefficients: Coefficients, config: SimulationConfig, rng: np.random.Generator,
             on_progress: Callable[[int, int], None] | None = None,
             uniforms: FloatArray | None = None) -> SimulationResult:
    """Run one replication (see the module docstring).

    ``uniforms`` (shape ``(requests,)``), when given, replace the arrival
    process's own draws: inter-arrival gaps are their inverse-CDF transform,
    so runs at different rates share one random stream (common random
    numbers) and the rate only rescales the gaps.

    Raises
    ------
    InvalidValueError
        On an impossible configuration, or a request larger than the KV
        budget (it could never be admitted).
    """
    import numpy as np

    n = int(config.requests)
    if n < 10:
        raise InvalidValueError("simulate at least 10 requests")
    if config.rate_rps <= 0:
        raise InvalidValueError("the request rate must be > 0 req/s")
    if not config.rate_rps <= MAX_SIMULATED_RATE_RPS:
        raise InvalidValueError(f"a simulated request rate must be at most {MAX_SIMULATED_RATE_RPS:g} req/s, got "
                                f"{config.rate_rps:g}; give a rate a replica could see")
    k = config.draft_length
    if k and config.adaptive_draft_lengths is None and len(config.position_rates) != k:
        raise InvalidValueError(f"acceptance must cover the draft length {k}")
    prompt = np.broadcast_to(np.asarray(config.prompt_tokens, dtype=np.float64), (n,)).copy()
    output = np.broadcast_to(np.asarray(config.output_tokens, dtype=np.float64), (n,)).copy()
    if np.any(output < 1) or np.any(prompt < 1):
        raise InvalidValueError("prompt and output lengths must be >= 1 token")
    largest = float(np.max(prompt + output))
    if largest > config.kv_cache_tokens:
        raise InvalidValueError(f"a request of {largest:g} tokens (prompt + output) does not fit the KV budget of "
                                f"{config.kv_cache_tokens:g} tokens and could never be admitted; raise "
                                "--kv-cache-tokens or shorten the requests")
    if not 0.0 <= config.warmup_fraction < 1.0:
        raise InvalidValueError("the warm-up fraction must lie in [0, 1)")
    if config.max_num_batched_tokens < config.max_num_seqs:
        raise InvalidValueError(f"the token budget per step ({config.max_num_batched_tokens}, max_num_batched_tokens) "
                                f"must be at least the batch cap ({config.max_num_seqs}, max_num_seqs), as vLLM "
                                "requires; raise --max-num-batched-tokens or lower --max-num-seqs")
    arrival = arrival_times(config.rate_rps, config.arrival_cv, n, rng, uniforms)
    adaptive = config.adaptive_draft_lengths is not None
    c = coefficients
    rates_all = np.asarray(config.position_rates, dtype=np.float64)

    def step_costs(draft: int) -> tuple[float, float]:
        if draft:
            return c.c1v_s + draft * c.c1d_s, c.c2v_s + draft * c.c2d_s
        return c.baseline_c1_step_s, c.baseline_c2_step_s

    decode: _AdaptiveDecode | None = None
    if adaptive:
        options = sorted(set(config.adaptive_draft_lengths or ()))
        if any(o > len(rates_all) for o in options):
            raise InvalidValueError("acceptance must cover every candidate draft length")
        costs = [step_costs(o) for o in options]
        expected_by_option = [1.0 + float(rates_all[:o].sum()) for o in options]
        choice_by_batch: list[int] = []  # option index by sequences in the step, grown on demand
        expected = math.nan
        decode = _AdaptiveDecode(rates_all, rng, min(int(config.max_num_seqs), n))
    else:
        cycles, expected = cycles_needed(output - 1, config.position_rates if k else (), rng)
    fixed, per_sequence = step_costs(k)
    # Prefill: c2p is the interference of one mean prompt, so c2p / p per prompt token in a busy step;
    # a forward pass of an idle engine also pays the prefill's fixed part, c1p - c2p.
    per_prompt_token = c.c2p_s / max(c.prompt_tokens, 1.0)
    idle_overhead = max(c.c1p_s - c.c2p_s, 0.0)
    budget_cap = int(config.max_num_batched_tokens)
    seq_cap = int(config.max_num_seqs)
    kv_cap = float(config.kv_cache_tokens)

    prompt_list, output_list = prompt.tolist(), output.tolist()
    arrival_list = arrival.tolist()
    admit_time = [math.nan] * n
    first_token = [math.nan] * n
    finish = [math.nan] * n
    queue: deque[int] = deque()
    prefilling: deque[list[float]] = deque()  # [request, prompt tokens still to prefill]
    next_arrival = 0
    kv_used = 0.0
    t = 0.0
    busy_area = 0.0  # integral of sequences in the engine over time
    k_area = 0.0  # integral of the draft length over busy time
    busy_time = 0.0
    completed = 0
    report_every = max(1, n // 20)

    def complete(requests: list[int], when: float) -> None:
        nonlocal kv_used, completed
        for request in requests:
            finish[request] = when
            kv_used -= prompt_list[request] + output_list[request]
        before = completed
        completed += len(requests)
        if on_progress is not None and completed // report_every != before // report_every:
            on_progress(completed, n)

    # Fixed k: every running request advances one cycle per step, so it finishes at a known step count;
    # a heap of (finishing step, request) gives the next completion in O(log B).
    heap: list[tuple[int, int]] = []
    finish_step = [] if decode is not None else cycles.astype(np.int64).tolist()
    counter = 0  # steps run
    heappush, heappop = heapq.heappush, heapq.heappop
    while completed < n:
        while next_arrival < n and arrival_list[next_arrival] <= t:
            queue.append(next_arrival)
            next_arrival += 1
        batch = len(heap) if decode is None else decode.size
        if batch == 0 and not queue and not prefilling:
            t = arrival_list[next_arrival]  # idle until the next arrival
            continue
        if adaptive:  # SmartSpec: highest goodput E(k)/tau_k(n) at the sequences scheduled in this step
            n_step = batch + len(prefilling) + (1 if queue else 0)
            if n_step >= len(choice_by_batch):
                choice_by_batch = step_choices(expected_by_option, costs, max(2 * n_step, 16))
            option = choice_by_batch[n_step]
            k = options[option]
            fixed, per_sequence = costs[option]
        # Token budget: decode tokens first, then prefill chunks (partial prefills first, then new admissions).
        budget = budget_cap - batch * (k + 1)
        if prefilling and 0 < budget < prefilling[0][1]:
            # The oldest partial prefill takes the whole budget for several steps: nothing else changes (no
            # admission, no other chunk) until its last chunk or the next completion; leap over those steps
            # (a prompt of 10^8 tokens is 10^4 steps of chunked prefill).
            repeats = math.ceil(prefilling[0][1] / budget) - 1
            step = ((fixed + (batch - 1) * per_sequence) if batch else idle_overhead) + budget * per_prompt_token
            if batch and decode is None:
                repeats = min(repeats, heap[0][0] - counter - 1)
            if adaptive and not queue and next_arrival < n:  # an arrival changes the goodput policy's choice of k
                repeats = min(repeats, math.ceil((arrival_list[next_arrival] - t) / step))
            if repeats >= 1:
                done: list[int] = []
                if batch and decode is not None:
                    repeats, done = decode.leap(repeats, k)
                elif batch:
                    counter += repeats
                span = repeats * step
                prefilling[0][1] -= repeats * budget
                t += span
                busy_area += (batch + len(prefilling)) * span
                busy_time += span
                if batch:
                    k_area += k * span
                if done:
                    complete(done, t)
                continue
        chunk_tokens = 0.0
        for entry in prefilling:
            if budget <= 0:
                break
            take = min(entry[1], budget)
            entry[1] -= take
            budget -= take
            chunk_tokens += take
        while queue and budget > 0 and batch + len(prefilling) < seq_cap:
            request = queue[0]
            need = prompt_list[request] + output_list[request]
            if kv_used + need > kv_cap:
                break
            queue.popleft()
            kv_used += need
            admit_time[request] = t
            take = min(prompt_list[request], budget)
            budget -= take
            chunk_tokens += take
            prefilling.append([request, prompt_list[request] - take])
        step = (fixed + (batch - 1) * per_sequence) if batch else 0.0
        engine = batch + len(prefilling)
        if chunk_tokens > 0:
            step += chunk_tokens * per_prompt_token + (idle_overhead if batch == 0 else 0.0)
            t += step
            busy_area += engine * step
            if batch:
                k_area += k * step
                if decode is None:
                    counter += 1
                    done = []
                    while heap and heap[0][0] <= counter:
                        done.append(heappop(heap)[1])
                else:
                    _, done = decode.leap(1, k)
                complete(done, t)
            busy_time += step
            while prefilling and prefilling[0][1] <= 0:
                request = int(prefilling.popleft()[0])
                first_token[request] = t
                if output_list[request] <= 1:
                    complete([request], t)
                elif decode is None:
                    heappush(heap, (counter + finish_step[request], request))
                else:
                    decode.add(request, output_list[request] - 1)
            continue
        if batch == 0:  # prefills blocked (cannot happen with budget >= 1), wait for an arrival
            t = arrival_list[next_arrival] if next_arrival < n else t
            continue
        # Leap over identical decode steps until a completion or the next arrival's step boundary.
        if decode is None:
            limit = heap[0][0] - counter
            if limit < 1:
                limit = 1
        else:
            limit = 1 << 62  # the leap caps it at the cycles the longest sequence can still need
        if next_arrival < n and (not queue or engine < seq_cap):
            until = math.ceil((arrival_list[next_arrival] - t) / step)
            if until < limit:
                limit = until if until > 1 else 1
        if decode is None:
            counter += limit
            taken = limit
            done = []
            while heap and heap[0][0] <= counter:
                done.append(heappop(heap)[1])
        else:
            taken, done = decode.leap(limit, k)
        span = taken * step
        t += span
        busy_area += engine * span
        k_area += k * span
        busy_time += span
        if done:
            complete(done, t)

    arrival_arr = arrival
    finish_arr = np.asarray(finish)
    first_arr = np.asarray(first_token)
    admit_arr = np.asarray(admit_time)
    first_kept = min(int(config.warmup_fraction * n), n - 1)
    keep = np.arange(n) >= first_kept
    e2e = (finish_arr - arrival_arr)[keep]
    ttft = (first_arr - arrival_arr)[keep]
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(output[keep] > 1, (finish_arr - first_arr)[keep] / (output[keep] - 1), np.nan)
    window_start, window_end = float(arrival_arr[first_kept]), float(arrival_arr[-1])
    in_window = (finish_arr >= window_start) & (finish_arr <= window_end)
    span = window_end - window_start
    throughput = float(output[in_window].sum()) / span if span > 0 else float(output.sum()) / t
    return SimulationResult(
        e2e_s=e2e, ttft_s=ttft, tpot_s=tpot, queue_s=(admit_arr - arrival_arr)[keep], duration_s=t,
        mean_running=busy_area / t, mean_in_system=float((finish_arr - arrival_arr).sum()) / t,
        throughput_tok_s=throughput, arrival_rate_rps=n / float(arrival_arr[-1]), tokens_per_cycle=expected,
        mean_draft_length=k_area / busy_time if adaptive and busy_time > 0 else float(k),
        steady=is_steady(arrival_arr, finish_arr),
    )


def arrival_times(rate_rps: float, arrival_cv: float, n: int, rng: np.random.Generator,
                  uniforms: FloatArray | None = None) -> FloatArray:
    """Arrival times (s): gamma inter-arrivals of mean ``1/rate`` and coefficient of variation ``arrival_cv``.

    With ``uniforms`` the gaps are their inverse-CDF transform (Poisson:
    ``-log(1 - U)/rate``), so every rate reuses the same stream.
    """
    import numpy as np

    shape = 1.0 / arrival_cv**2
    if uniforms is None:
        gaps = rng.gamma(shape, 1.0 / (rate_rps * shape), size=n)
    elif shape == 1.0:
        gaps = -np.log1p(-np.asarray(uniforms, dtype=np.float64)[:n]) / rate_rps
    else:
        from scipy.special import gammaincinv

        gaps = gammaincinv(shape, np.asarray(uniforms, dtype=np.float64)[:n]) / (rate_rps * shape)
    return np.cumsum(gaps)


#: A run is not at steady state when N(t) rises over the run by more than this many residual spreads ...
STEADY_RISE_SPREADS = 3.0
#: ... and by more than this fraction of its mean.
STEADY_RISE_FRACTION = 0.25


def is_steady(arrival: FloatArray, finish: FloatArray) -> bool:
    """Whether the number of requests in the system stopped growing during the arrivals.

    ``N(t) = #arrivals <= t - #finishes <= t`` is sampled at 80 times over
    [20%, 100%] of the arrival span and a line is fitted. An overloaded
    replica's ``N`` grows about linearly, so its rise over the window is large
    against the scatter around the line; a stable one wanders around its mean
    (slowly near saturation, with a spread of 20-25% of the mean), so the
    fitted rise is comparable to the scatter. Flags a rise above 3 residual
    standard deviations and above 25% of the mean. On the default calibration
    (k=3, 6 seeds x 1,500/4,000/8,000 requests): none flagged at rho 0.8, all
    at rho 1.05 and above; near rho = 1 (0.92 with the batch cap of 256
    binding) about half, and there the statistics are indeed still transient.
    """
    import numpy as np

    end = float(arrival[-1])
    times = np.linspace(0.2 * end, end, 80)
    in_system = (np.searchsorted(arrival, times, side="right")
                 - np.searchsorted(np.sort(finish), times, side="right")).astype(np.float64)
    slope, intercept = np.polyfit(times, in_system, 1)
    spread = float(np.std(in_system - (slope * times + intercept)))
    rise = float(slope) * 0.8 * end
    return not (rise > STEADY_RISE_SPREADS * spread and rise > STEADY_RISE_FRACTION * float(in_system.mean()))


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
    steady: bool = True  # every replication reached a steady state


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
              analytic_e2e_s: float, on_progress: Callable[[int, int], None] | None = None,
              uniforms: list[FloatArray] | None = None) -> RateSummary:
    """Independent replications with seeds ``seed .. seed + seeds - 1``.

    ``uniforms`` (one array per replication) fix each replication's arrival
    stream, for common random numbers across rates (see :func:`simulate`).
    """
    import numpy as np

    runs = []
    for index in range(seeds):
        runs.append(simulate(coefficients, config, np.random.default_rng(seed + index), on_progress,
                             uniforms=None if uniforms is None else uniforms[index]))
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
        steady=all(run.steady for run in runs),
    )
