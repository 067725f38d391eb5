"""The goodput-adaptive draft length per batch size, in vLLM's dynamic-SD format.

vLLM's ``speculative_config.num_speculative_tokens_per_batch_size`` takes
``[[start_bs, end_bs, k], ...]`` (inclusive batch-size ranges; ``k = 0``
disables SD for that range). For every batch size ``B`` the policy of
:mod:`sdplan.policy` picks the ``k`` with the highest goodput,
``argmin_k (C1_k + B C2_k)``; under load the running batch is ``B = lambda L``
(Little's law), so this schedule is also the latency-optimal ``k`` per rate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sdplan.model import Coefficients


def batch_size_schedule(
    coefficients: Coefficients, draft_lengths: list[int], alpha: float, max_batch_size: int,
    tokens_per_cycle: object = None,
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
    """
    import numpy as np

    from sdplan import model
    from sdplan.acceptance import expected_tokens_per_cycle
    from sdplan.policy import goodput_choice

    ks = np.asarray(draft_lengths, dtype=np.float64)
    tokens = expected_tokens_per_cycle(alpha, ks) if tokens_per_cycle is None else np.asarray(tokens_per_cycle)
    c1_sd, c2_sd = model.demand_from_tokens(coefficients, tokens, ks)
    c1_d, c2_d = model.baseline_demand(coefficients)
    c1 = np.concatenate([[c1_d], np.atleast_1d(c1_sd)])
    c2 = np.concatenate([[c2_d], np.atleast_1d(c2_sd)])
    sizes = np.arange(1, max_batch_size + 1, dtype=np.float64)
    choice = goodput_choice(np.broadcast_to(c1, (sizes.size, c1.size)), np.broadcast_to(c2, (sizes.size, c2.size)),
                            sizes)
    k_with_off = np.concatenate([[0], np.asarray(draft_lengths, dtype=np.int64)])
    per_size = k_with_off[choice]
    ranges: list[tuple[int, int, int]] = []
    start = 0
    for index in range(1, sizes.size + 1):
        if index == sizes.size or per_size[index] != per_size[start]:
            ranges.append((start + 1, index, int(per_size[start])))
            start = index
    return ranges
