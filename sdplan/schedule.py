"""The best draft length as a function of batch size, in vLLM's dynamic-SD format.

vLLM's ``speculative_config.num_speculative_tokens_per_batch_size`` takes
``[[start_bs, end_bs, k], ...]`` (inclusive batch-size ranges; ``k = 0``
disables SD for that range). The planner knows the best ``k`` per request
rate; Little's law ``B = lambda L`` at the best option turns rates into mean
running batch sizes, so the rate schedule becomes a batch-size schedule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sdplan import planner

if TYPE_CHECKING:
    from sdplan.model import Coefficients

#: Rate samples between zero load and saturation used to trace B(lambda).
SCHEDULE_SAMPLES = 4000


def batch_size_schedule(
    coefficients: Coefficients, draft_lengths: list[int], alpha: float, max_batch_size: int
) -> list[tuple[int, int, int]]:
    """Latency-optimal draft length per batch size, as inclusive ranges.

    Parameters
    ----------
    coefficients : Coefficients
    draft_lengths : list of int
        Candidate draft lengths (no SD is always a candidate, written as 0).
    alpha : float
        Per-token acceptance.
    max_batch_size : int
        Largest batch size to cover (vLLM's ``max_num_seqs``).

    Returns
    -------
    list of (start, end, k)
        Contiguous ranges covering ``1..max_batch_size``.

    Notes
    -----
    Rates are sampled densely from 0 to the largest saturation rate; at each
    the best option and its ``B = lambda L`` are computed in one vectorised
    :func:`planner.plan` call. Batch size ``b`` gets the best ``k`` at the
    lowest sampled rate whose ``B >= b``; sizes above the largest stable
    ``B`` keep the option that is best nearest saturation.
    """
    import numpy as np

    top = max(planner.default_rates(coefficients, draft_lengths, [alpha], count=1)[0], 1e-12)
    rates = np.linspace(0.0, top, SCHEDULE_SAMPLES, endpoint=False)[1:]
    result = planner.plan(coefficients, rates, draft_lengths, [alpha])
    best_k = result.best_k[0]
    stable = best_k != planner.NONE_STABLE
    rates, best_k = rates[stable], best_k[stable]
    latency = result.best_latency_s[0][stable]
    batch = np.maximum.accumulate(rates * latency)
    sizes = np.arange(1, max_batch_size + 1, dtype=np.float64)
    index = np.minimum(np.searchsorted(batch, sizes, side="left"), batch.size - 1)
    ks = best_k[index]
    ranges: list[tuple[int, int, int]] = []
    start = 1
    for size in range(2, max_batch_size + 2):
        if size == max_batch_size + 1 or ks[size - 1] != ks[start - 1]:
            ranges.append((start, size - 1, int(ks[start - 1])))
            start = size
    return ranges
