"""The goodput-adaptive draft length per batch size, in vLLM's dynamic-SD format.

vLLM's ``speculative_config.num_speculative_tokens_per_batch_size`` takes
``[[start_bs, end_bs, k], ...]`` (inclusive batch-size ranges; ``k = 0``
disables SD for that range), and looks ``k`` up by the number of requests
scheduled in the step, prefill chunks included. A step with ``n`` sequences
costs, in sdplan's step model (:func:`sdplan.calibration.scaling.coefficients_from_steps`;
the simulator's ``tau``)::

    tau_k(n) = (c1v + k c1d) + (n - 1)(c2v + k c2d),   tau_0(n) = c1_step + (n - 1) c2_step,

because ``c1`` already holds one sequence's cost. Each sequence commits
``E_k`` tokens per step, so the goodput is ``n E_k / tau_k(n)`` and the
schedule picks ``argmax_k E_k / tau_k(n)`` (SmartSpec's rule). For a
mixture-of-experts target each step also streams the experts its
``n (k + 1)`` routed tokens touch: ``phi(n (k + 1))`` times the coverage
increments of ``c1v``/``c1_step`` (per step) and ``c2v``/``c2_step`` (per
other sequence) (:mod:`sdplan.latency.moe`).

In the mean-value model the running batch is ``B + 1`` at ``B = lambda L``
others, so this schedule is also the latency-optimal ``k`` per rate
(``argmin_k C1_k + B C2_k``, :mod:`sdplan.latency.policy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sdplan.inputs.acceptance import expected_tokens_per_cycle
from sdplan.latency.model import option_demands, option_lengths, step_times

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.latency.coefficients import Coefficients
    from sdplan.latency.moe import MoESpec

    FloatArray = npt.NDArray[np.float64]


def batch_size_schedule(
    coefficients: Coefficients, draft_lengths: list[int], alpha: float, max_batch_size: int,
    tokens_per_cycle: object = None, moe: MoESpec | None = None,
) -> list[tuple[int, int, int]]:
    """Goodput-optimal draft length per batch size ``1..max_batch_size``, as inclusive ranges.

    Parameters
    ----------
    coefficients : Coefficients
    draft_lengths : list of int
        Candidate draft lengths (no SD is always a candidate, written as 0).
    alpha : float
        Per-token acceptance (ignored when ``tokens_per_cycle`` is given).
    max_batch_size : int
        Largest batch size to cover (vLLM's ``max_num_seqs``).
    tokens_per_cycle : array_like, shape (k,), optional
        ``E`` per draft length (per-position acceptance).
    moe : MoESpec, optional
        Expert coverage of a mixture-of-experts target.

    Notes
    -----
    ``k(n) = argmax_k E_k / tau_k(n)`` over ``n = 1..max_batch_size``
    sequences in the step (see the module notes); ties go to no SD, then to
    the shorter draft.
    """
    goodput = goodput_per_size(coefficients, draft_lengths, alpha, max_batch_size, tokens_per_cycle, moe)
    return _ranges(option_lengths(draft_lengths)[np.argmax(goodput, axis=1)])


def goodput_per_size(coefficients: Coefficients, draft_lengths: list[int], alpha: float, max_batch_size: int,
                     tokens_per_cycle: object = None, moe: MoESpec | None = None) -> FloatArray:
    """Tokens per second per sequence, ``E_k / tau_k(n)``, shape ``(max_batch_size, 1 + len(draft_lengths))``.

    Row ``n - 1`` is a step of ``n`` sequences; column 0 is no SD (``E = 1``).
    """
    ks = np.asarray(draft_lengths, dtype=np.float64)
    tokens = expected_tokens_per_cycle(alpha, ks) if tokens_per_cycle is None else np.asarray(tokens_per_cycle)
    options = option_demands(coefficients, draft_lengths, np.atleast_1d(tokens))
    sizes = np.arange(1, max_batch_size + 1, dtype=np.float64)
    return options.tokens_per_cycle[None, :] / step_times(coefficients, draft_lengths, sizes, moe)


def _ranges(per_size: object) -> list[tuple[int, int, int]]:
    """Inclusive ``(start, end, k)`` runs of a k per batch size ``1..n``."""
    values = [int(k) for k in per_size]  # type: ignore[attr-defined]
    ranges: list[tuple[int, int, int]] = []
    start = 0
    for index in range(1, len(values) + 1):
        if index == len(values) or values[index] != values[start]:
            ranges.append((start + 1, index, values[start]))
            start = index
    return ranges


# ----------------------------------------------------------------------------- schedules engines run

#: Relative width a tier must span: ``end - start + 1 >= TIER_WIDTH_FRACTION * start`` (and the minimum width).
TIER_WIDTH_FRACTION = 0.25


@dataclass(frozen=True, slots=True)
class EngineSchedule:
    """A draft length per batch size an engine can run without flapping.

    Attributes
    ----------
    tiers : list of (start, end, k)
        Inclusive batch-size ranges covering ``1..max_num_seqs``.
    optimal : list of (start, end, k)
        The per-size optimum before merging (``--min-tier-width 1`` output).
    max_num_seqs : int
        Largest batch size covered (the engine's ``max_num_seqs``).
    goodput_loss_pct : float
        Largest goodput given up at any batch size by merging and the k floor,
        percent of that size's optimum.
    merged : int
        Tiers absorbed into a neighbour for being narrower than the minimum width.
    reachable : int
        Largest batch the engine runs: its KV cache holds no more requests of the workload. Larger sizes,
        up to ``max_num_seqs``, keep this size's k. Equal to ``max_num_seqs`` where the cache holds every slot.
    """

    tiers: list[tuple[int, int, int]]
    optimal: list[tuple[int, int, int]]
    max_num_seqs: int
    goodput_loss_pct: float
    merged: int
    reachable: int

    @property
    def off(self) -> bool:
        """True when no batch size drafts: the answer is to serve without SD."""
        return all(k == 0 for _, _, k in self.tiers)

    @property
    def max_k(self) -> int:
        return max(k for _, _, k in self.tiers)


def engine_schedule(goodput: FloatArray, draft_lengths: list[int], min_tier_width: int = 4,
                    min_k: int = 0, reachable: int | None = None) -> EngineSchedule:
    """Per-size optimum of ``goodput`` made safe to run: a k floor and no narrow tiers.

    Parameters
    ----------
    goodput : ndarray, shape (max_num_seqs, 1 + len(draft_lengths))
        From :func:`goodput_per_size`.
    draft_lengths : list of int
    min_tier_width : int
        Narrowest tier kept, in batch sizes; a tier starting at ``s`` must also
        span ``TIER_WIDTH_FRACTION * s``. 1 keeps the per-size optimum.
    min_k : int
        Floor on k (1: never switch SD off inside a schedule).
    reachable : int, optional
        Largest batch the engine runs (the KV cache's batch cap). The engine's format still covers
        ``1..max_num_seqs``, but sizes past the cap never run, so they keep the cap's k: a tier there would
        be an answer about batches that never form. Default: every size runs.

    Notes
    -----
    vLLM looks k up by the number of requests *scheduled* in the step,
    prefill chunks included (``vllm==0.33.0:vllm/v1/core/sched/scheduler.py:1709-1714``),
    a count that moves by a few requests from step to step as prefills join.
    At the edge of a narrow tier k then changes nearly every step, which
    vLLM users report as a throughput collapse: MTP with ``[[1,4,2],[5,512,0]]``
    fell from ~232 to 24-157 tok/s at 8 concurrent requests
    (vllm-project/vllm#49548). Tiers narrower than the minimum width are
    therefore absorbed, narrowest first, into the neighbour whose k gives up
    the least goodput over the tier (``sum_n 1 - G_k(n)/max_k G(n)``); equal
    neighbours merge. Near a crossing the two ks' goodputs are close, so the
    loss is small; it is reported.
    """
    sizes = goodput.shape[0]
    reachable = sizes if reachable is None else min(max(int(reachable), 1), sizes)
    goodput = goodput[np.minimum(np.arange(sizes), reachable - 1)]
    k_with_off = option_lengths(draft_lengths)
    allowed = k_with_off >= min_k
    if not allowed.any():
        raise ValueError(f"no candidate draft length is >= {min_k}")
    masked = np.where(allowed[None, :], goodput, -np.inf)
    column = {int(k): index for index, k in enumerate(k_with_off) if allowed[index]}
    best = goodput.max(axis=1)
    optimal = _ranges(k_with_off[np.argmax(goodput, axis=1)])
    tiers = [list(tier) for tier in _ranges(k_with_off[np.argmax(masked, axis=1)])]

    def loss(start: int, end: int, k: int) -> float:
        return float(np.sum(1.0 - goodput[start - 1:end, column[k]] / best[start - 1:end]))

    def narrow(tier: list[int]) -> bool:
        return tier[1] - tier[0] + 1 < max(min_tier_width, TIER_WIDTH_FRACTION * tier[0])

    merged = 0
    while len(tiers) > 1 and min_tier_width > 1:
        candidates = [i for i, tier in enumerate(tiers) if narrow(tier)]
        if not candidates:
            break
        i = min(candidates, key=lambda j: (tiers[j][1] - tiers[j][0], j))
        start, end, _ = tiers[i]
        neighbours = [j for j in (i - 1, i + 1) if 0 <= j < len(tiers)]
        j = min(neighbours, key=lambda n: (loss(start, end, tiers[n][2]), n))
        tiers[j] = [min(tiers[j][0], start), max(tiers[j][1], end), tiers[j][2]]
        del tiers[i]
        merged += 1
        joined: list[list[int]] = []
        for tier in tiers:
            if joined and joined[-1][2] == tier[2]:
                joined[-1][1] = tier[1]
            else:
                joined.append(tier)
        tiers = joined
    chosen = np.concatenate([np.full(end - start + 1, column[k]) for start, end, k in tiers])
    kept = goodput[np.arange(goodput.shape[0]), chosen]
    return EngineSchedule(tiers=[(a, b, k) for a, b, k in tiers], optimal=optimal, max_num_seqs=sizes,
                          goodput_loss_pct=float(np.max(1.0 - kept / best) * 100.0), merged=merged,
                          reachable=reachable)


def check_vllm_schedule(schedule: list[tuple[int, int, int]]) -> None:
    """Refuse a schedule vLLM's own validator would refuse.

    The rules of ``validate_and_normalize_dynamic_sd_schedule``
    (``vllm==0.33.0:vllm/v1/spec_decode/dynamic/utils.py:21-72``): a non-empty
    list of 3-item entries, positive ranges with start <= end, k >= 0,
    sorted and non-overlapping, the first starting at 1.

    Raises
    ------
    ValueError
        Naming the broken rule (an internal error: sdplan built the schedule).
    """
    if not schedule:
        raise ValueError("num_speculative_tokens_per_batch_size must not be empty")
    previous_end = 0
    for entry in schedule:
        if len(entry) != 3:
            raise ValueError(f"entry {entry} is not (range_start, range_end, num_speculative_tokens)")
        start, end, k = entry
        if start <= 0 or end <= 0 or start > end or k < 0:
            raise ValueError(f"entry {entry}: ranges must be positive with start <= end and k >= 0")
        if start <= previous_end:
            raise ValueError(f"entry {entry}: ranges must be sorted and non-overlapping")
        previous_end = end
    if schedule[0][0] != 1:
        raise ValueError("the first batch-size range must start at 1")


def vllm_lookup(schedule: list[tuple[int, int, int]], max_num_seqs: int, num_speculative_tokens: int) -> list[int]:
    """The k vLLM runs per batch size ``0..max_num_seqs`` (index 0 unused).

    vLLM's ``build_dynamic_sd_schedule_lookup`` semantics
    (``vllm==0.33.0:vllm/v1/spec_decode/dynamic/utils.py:106-146``): gaps take
    the previous k, sizes past the last range the last k, every k is clamped
    to ``num_speculative_tokens``, ranges past ``max_num_seqs`` are ignored.
    """
    check_vllm_schedule(schedule)
    dense = [0] * (max_num_seqs + 1)
    last = schedule[0][2]
    position = 1
    for start, end, k in schedule:
        for n in range(position, min(start, max_num_seqs + 1)):
            dense[n] = min(num_speculative_tokens, last)
        for n in range(max(start, position), min(end, max_num_seqs) + 1):
            dense[n] = min(num_speculative_tokens, k)
        position = max(position, end + 1)
        last = k
    for n in range(position, max_num_seqs + 1):
        dense[n] = min(num_speculative_tokens, last)
    return dense
