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
  refused up front. A prefill chunk of ``q`` tokens after the first ``d``
  of its prompt adds ``l q + l2 ((d + q)^2 - d^2)`` to its step, so that a
  whole prompt adds the analytic model's interference at its own length,
  ``c2p(p) = l p + l2 p^2`` (``l2``: its attention over its own prefix,
  ``docs/model.md#per-step-form``), and a forward
  pass of an idle engine also pays the prefill's fixed part ``c1p - c2p``
  less the server's share of ``c1p`` (``server_prefill_s``: the time around
  a request's prefill that no step waits for), by which each request
  instead reaches the engine after it arrives;
  the step that completes a prompt emits the request's first token;
* every step, each running request verifies ``k`` drafted tokens and keeps
  ``A + 1`` (accepted plus the bonus token), with ``P(A >= j) = r_j``
  (``r_j = alpha**j`` for i.i.d. acceptance, or vLLM's per-position rates);
* a step with ``B`` running requests lasts
  ``tau(B) = (c1v + k c1d) + (B - 1)(c2v + k c2d)`` (``c1_step + (B - 1) c2_step``
  without SD) plus its prefill chunks: the per-step form behind eq. 3, where
  ``C1`` is the batch-1 latency and ``C2`` the cost of each other request
  (``docs/model.md#per-step-form``); for a mixture-of-experts target, plus
  ``phi(B (k + 1))`` times the coverage increments, the experts its routed
  tokens touch, and its prefill at ``phi(p)`` (:mod:`sdplan.latency.moe`), as
  the planner prices them.

Because ``k`` is fixed within a run, the cycles each request needs to emit
its ``g - 1`` tokens after the prefill are drawn when it arrives (from their
exact distribution, one uniform each), every running request advances one
cycle per step, and a heap of finishing steps gives the next completion:
the loop leaps over runs of identical steps, so its cost grows with the
number of requests, not of steps. Under the goodput policy (k chosen per
step as a function of the sequences in the step) each stretch of constant
``k`` is handled the same way, and when ``k`` changes every running
sequence's remaining output is redrawn given that it has not finished
(:class:`sdplan.simulate.sampling.StretchTables`); outputs too long for its
tables are sampled cycle by cycle (:class:`sdplan.simulate.sampling.AdaptiveDecode`). A run whose queue keeps growing is
flagged as not at steady state (:func:`is_steady`). Everything takes an
explicit ``numpy.random.Generator``; a seed gives identical results.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from sdplan.latency.model import concave_load
from sdplan.latency.moe import at_coverage
from sdplan.latency.policy import step_choices
from sdplan.simulate.config import SimulationConfig, SimulationResult, is_steady
from sdplan.simulate.sampling import AdaptiveDecode, StretchTables, cycles_needed

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.latency.coefficients import Coefficients
    from sdplan.latency.moe import MoESpec

    FloatArray = npt.NDArray[np.float64]


def simulate(coefficients: Coefficients, config: SimulationConfig, rng: np.random.Generator,
             on_progress: Callable[[int, int], None] | None = None,
             uniforms: FloatArray | None = None,
             draft_trace: list[tuple[int, int]] | None = None) -> SimulationResult:
    """Run one replication (see the module docstring).

    ``uniforms`` (shape ``(requests,)``), when given, replace the arrival
    process's own draws: inter-arrival gaps are their inverse-CDF transform,
    so runs at different rates share one random stream (common random
    numbers) and the rate only rescales the gaps. Under the goodput policy,
    ``draft_trace`` (when given) receives ``(sequences in the step, k)`` at
    every step where the chosen ``k`` changes.

    Raises
    ------
    InvalidValueError
        On an impossible configuration, or a request larger than the KV
        budget (it could never be admitted).
    """
    config.validate()
    n = int(config.requests)
    k = config.draft_length
    prompt, output = config.lengths()
    arrival = arrival_times(config.rate_rps, config.arrival_cv, n, rng, uniforms)
    adaptive = config.adaptive_draft_lengths is not None
    moe = config.moe
    # an MoE target's prefill at the experts its prompt touches; each step's experts follow its own routed tokens
    c = coefficients if moe is None else at_coverage(coefficients, moe, 0.0)
    rates_all = np.asarray(config.position_rates, dtype=np.float64)

    knee_tokens, knee_slope = c.knee_tokens, c.knee_per_token_s
    lookahead = int(config.draft_length)  # KV slots a running request keeps for the drafted tokens

    psi = c.load_concavity_sqrt_requests  # batch - 1 others cost concave_load(batch - 1, psi) per-sequence costs

    def knee_excess(rows: float) -> float:
        """Seconds a step of ``rows`` decode token rows costs past the compute-bound knee (sdplan.latency.knee)."""
        return knee_slope * (rows - knee_tokens) if rows > knee_tokens and knee_slope > 0.0 else 0.0

    def step_costs(draft: int) -> tuple[float, float]:
        if draft:  # a share c of the sequences drafts (sdplan.latency.model.drafted_tokens); its rates carry c as well
            drafted = draft * c.draft_coverage
            return c.c1v_s + drafted * c.c1d_s, c.c2v_s + drafted * c.c2d_s
        return c.baseline_c1_step_s, c.baseline_c2_step_s

    def rows(sequences: int, draft: int) -> float:
        """Decode token rows of a step: ``1 + c k`` a sequence (sdplan.latency.model.verified_rows)."""
        return sequences * (1.0 + c.draft_coverage * draft)

    def experts_s(moe: MoESpec, sequences: int, draft: int, others: float) -> float:
        """Seconds the experts a step's ``n (k + 1)`` routed tokens touch add to it (``others``: what the other
        sequences cost, ``h(n - 1)``): ``phi`` times the coverage increments, as
        :func:`sdplan.latency.model.step_times` prices them."""
        fixed_key, other_key = ("c1v_s", "c2v_s") if draft else ("baseline_c1_step_s", "baseline_c2_step_s")
        return float(moe.phi(sequences * (draft + 1.0))) * (moe.coverage.get(fixed_key, 0.0)
                                                            + others * moe.coverage.get(other_key, 0.0))

    def decode_step_s(sequences: int) -> float:
        """A decode step (an SD cycle) of ``sequences`` at the current ``k``: the per-step form, the knee and an MoE
        target's experts."""
        others = concave_load(sequences - 1, psi)
        step = fixed + others * per_sequence + knee_excess(rows(sequences, k))
        return float(step if moe is None else step + experts_s(moe, sequences, k, float(others)))

    decode: AdaptiveDecode | None = None
    stretch: StretchTables | None = None  # the goodput policy's exact draws per stretch of constant k
    option = -1
    if adaptive:
        options = sorted(set(config.adaptive_draft_lengths or ()))
        costs = [step_costs(o) for o in options]
        expected_by_option = [1.0 + float(rates_all[:o].sum()) for o in options]
        choice_by_batch: list[int] = []  # option index by sequences in the step, grown on demand
        expected = math.nan
        top = int(np.max(output)) - 1
        if StretchTables.fits(rates_all, options, top):
            stretch = StretchTables(rates_all, top)
            stretch_start = np.zeros(n, dtype=np.int64)  # the step count at which each sequence's stretch began
            stretch_left = np.zeros(n, dtype=np.int64)  # and its tokens left then
        else:
            decode = AdaptiveDecode(rates_all, rng, min(int(config.max_num_seqs), n))
    else:
        cycles, expected = cycles_needed(output - 1, config.position_rates if k else (), rng)
    fixed, per_sequence = step_costs(k)
    # Prefill: a chunk of q prompt tokens after the first d of its prompt adds l q + l2 ((d + q)^2 - d^2) to its
    # step, so that a whole prompt of p tokens adds c2p(p) = l p + l2 p^2, its own length's interference (l2: its
    # attention over its own prefix, sdplan.latency.coefficients); c2p and its squared part c2p_sq are the mean
    # over prompts of coefficient of variation cv, E[p^2] = p^2 (1 + cv^2). A forward pass of an idle engine
    # also pays the prefill's fixed part, c1p - c2p.
    per_prompt_token = (c.c2p_s - c.c2p_sq_s) / max(c.prompt_tokens, 1.0)
    per_prompt_token_sq = c.c2p_sq_s / max(c.prompt_tokens**2 * (1.0 + c.prompt_cv**2), 1.0)

    def chunk_s(done: float, take: float) -> float:
        """What a prefill chunk of ``take`` prompt tokens after the first ``done`` adds to its step."""
        return take * (per_prompt_token + per_prompt_token_sq * (2.0 * done + take))

    idle_overhead = max(c.c1p_s - c.server_prefill_s - c.c2p_s, 0.0)
    budget_cap = int(config.max_num_batched_tokens)
    seq_cap = int(config.max_num_seqs)
    kv_cap = float(config.kv_cache_tokens)

    prompt_list, output_list = prompt.tolist(), output.tolist()
    # the server's time around a prefill delays a request's reaching the engine, not the engine; its TTFT and
    # latency still count from its arrival (_summarise)
    arrival_list = (arrival + c.server_prefill_s).tolist()
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

    held = [0.0] * n  # what each admitted request holds of the KV cache, released when it completes

    def complete(requests: list[int], when: float) -> None:
        nonlocal kv_used, completed
        for request in requests:
            finish[request] = when
            kv_used -= held[request]
        before = completed
        completed += len(requests)
        if on_progress is not None and completed // report_every != before // report_every:
            on_progress(completed, n)

    # Fixed k (and each stretch of constant k under the goodput policy): every running request advances one cycle
    # per step, so it finishes at a known step count; a heap of (finishing step, request) gives the next completion
    # in O(log B).
    heap: list[tuple[int, int]] = []
    finish_step = [] if adaptive else cycles.astype(np.int64).tolist()
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
                choice_by_batch = step_choices(expected_by_option, costs, max(2 * n_step, 16),
                                               [o + 1.0 for o in options], (knee_tokens, knee_slope), psi,
                                               None if moe is None else lambda i, m: experts_s(
                                                   moe, m, options[i], float(concave_load(m - 1, psi))))
            if choice_by_batch[n_step] != option:
                previous, option = k, choice_by_batch[n_step]
                k = options[option]
                fixed, per_sequence = costs[option]
                if draft_trace is not None:
                    draft_trace.append((n_step, k))
                if stretch is not None and heap:  # redraw what each running sequence has left, at the new k
                    running = np.fromiter((entry[1] for entry in heap), dtype=np.int64, count=len(heap))
                    elapsed = counter - stretch_start[running]
                    left = stretch_left[running]
                    moved = elapsed > 0
                    if moved.any():
                        left[moved] -= stretch.produced(previous, elapsed[moved], left[moved],
                                                        1.0 - rng.random(int(moved.sum())))
                    ends = counter + stretch.first_passages(k, left, rng.random(running.size))
                    stretch_start[running] = counter
                    stretch_left[running] = left
                    heap = list(zip(ends.tolist(), running.tolist()))
                    heapq.heapify(heap)
        # Token budget: decode tokens first, then prefill chunks (partial prefills first, then new admissions).
        budget: float = budget_cap - rows(batch, k)
        if prefilling and 0 < budget < prefilling[0][1]:
            # The oldest partial prefill takes the whole budget for several steps: nothing else changes (no
            # admission, no other chunk) until its last chunk or the next completion; leap over those steps
            # (a prompt of 10^8 tokens is 10^4 steps of chunked prefill).
            repeats = math.ceil(prefilling[0][1] / budget) - 1
            decode_s = decode_step_s(batch) if batch else idle_overhead
            done_tokens = prompt_list[int(prefilling[0][0])] - prefilling[0][1]  # of the oldest prompt, prefilled
            # the last of these steps, the dearest: its chunk attends to the longest prefix
            last = done_tokens + (repeats - 1) * budget
            step = decode_s + chunk_s(last, budget)
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
                leapt = repeats * budget
                span = repeats * decode_s + chunk_s(done_tokens, leapt)
                prefilling[0][1] -= leapt
                t += span
                busy_area += (batch + len(prefilling)) * span
                busy_time += span
                if batch:
                    k_area += k * span
                if done:
                    complete(done, t)
                continue
        chunk_tokens = 0.0
        chunks_s = 0.0  # what the step's prefill chunks add to it
        for entry in prefilling:
            if budget <= 0:
                break
            take = min(entry[1], budget)
            chunks_s += chunk_s(prompt_list[int(entry[0])] - entry[1], take)
            entry[1] -= take
            budget -= take
            chunk_tokens += take
        while queue and budget > 0 and batch + len(prefilling) < seq_cap:
            request = queue[0]
            need = config.kv_hold.tokens(prompt_list[request], output_list[request], lookahead)  # k lookahead slots
            if kv_used + need > kv_cap:
                break
            queue.popleft()
            kv_used += need
            held[request] = need
            admit_time[request] = t
            take = min(prompt_list[request], budget)
            budget -= take
            chunk_tokens += take
            chunks_s += chunk_s(0.0, take)
            prefilling.append([request, prompt_list[request] - take])
        step = decode_step_s(batch) if batch else 0.0
        engine = batch + len(prefilling)
        if chunk_tokens > 0:
            step += chunks_s + (idle_overhead if batch == 0 else 0.0)
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
                elif stretch is not None:
                    tokens = int(output_list[request]) - 1
                    stretch_start[request], stretch_left[request] = counter, tokens
                    heappush(heap, (counter + stretch.first_passage(k, tokens, rng.random()), request))
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

    return _summarise(config, arrival, output, (admit_time, first_token, finish), t,
                      (busy_area, busy_time, k_area), expected, k if not adaptive else None, c.server_prefill_s)


def arrival_times(rate_rps: float, arrival_cv: float, n: int, rng: np.random.Generator,
                  uniforms: FloatArray | None = None) -> FloatArray:
    """Arrival times (s): gamma inter-arrivals of mean ``1/rate`` and coefficient of variation ``arrival_cv``.

    With ``uniforms`` the gaps are their inverse-CDF transform (Poisson:
    ``-log(1 - U)/rate``), so every rate reuses the same stream.
    """
    shape = 1.0 / arrival_cv**2
    if uniforms is None:
        gaps = rng.gamma(shape, 1.0 / (rate_rps * shape), size=n)
    elif shape == 1.0:
        gaps = -np.log1p(-np.asarray(uniforms, dtype=np.float64)[:n]) / rate_rps
    else:
        from scipy.special import gammaincinv

        gaps = gammaincinv(shape, np.asarray(uniforms, dtype=np.float64)[:n]) / (rate_rps * shape)
    return np.cumsum(gaps)


def _summarise(config: SimulationConfig, arrival: FloatArray, output: FloatArray,
               times: tuple[list[float], list[float], list[float]], t: float,
               areas: tuple[float, float, float], expected: float, fixed_k: int | None,
               server_s: float = 0.0) -> SimulationResult:
    """One replication's result from its per-request times (admission, first token, finish) and time integrals.

    Latency and TTFT count from each request's arrival; its queueing delay from its reaching the engine,
    ``server_s`` later (the server's time around its prefill, ``Coefficients.server_prefill_s``).

    ``areas`` are the integrals of the sequences in the engine and of the
    draft length over busy time, and the busy time; ``fixed_k`` is ``None``
    under the goodput policy (its ``k`` is then the time average).
    """
    n = arrival.size
    admit_time, first_token, finish = times
    busy_area, busy_time, k_area = areas
    finish_arr = np.asarray(finish)
    first_arr = np.asarray(first_token)
    admit_arr = np.asarray(admit_time)
    first_kept = min(int(config.warmup_fraction * n), n - 1)
    keep = np.arange(n) >= first_kept
    e2e = (finish_arr - arrival)[keep]
    ttft = (first_arr - arrival)[keep]
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(output[keep] > 1, (finish_arr - first_arr)[keep] / (output[keep] - 1), np.nan)
    window_start, window_end = float(arrival[first_kept]), float(arrival[-1])
    in_window = (finish_arr >= window_start) & (finish_arr <= window_end)
    span = window_end - window_start
    throughput = float(output[in_window].sum()) / span if span > 0 else float(output.sum()) / t
    return SimulationResult(
        e2e_s=e2e, ttft_s=ttft, tpot_s=tpot, queue_s=(admit_arr - (arrival + server_s))[keep], duration_s=t,
        mean_running=busy_area / t, mean_in_system=float((finish_arr - arrival).sum()) / t,
        throughput_tok_s=throughput, arrival_rate_rps=n / float(arrival[-1]), tokens_per_cycle=expected,
        mean_draft_length=(float(fixed_k) if fixed_k is not None
                           else k_area / busy_time if busy_time > 0 else math.nan),
        steady=is_steady(arrival, finish_arr),
    )
