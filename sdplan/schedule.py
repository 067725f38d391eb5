"""The goodput-adaptive draft length per batch size, in vLLM's dynamic-SD format.

vLLM's ``speculative_config.num_speculative_tokens_per_batch_size`` takes
``[[start_bs, end_bs, k], ...]`` (inclusive batch-size ranges; ``k = 0``
disables SD for that range), and looks ``k`` up by the number of requests
scheduled in the step, prefill chunks included. A step with ``n`` sequences
costs, in sdplan's step model (:func:`sdplan.calibration._coefficients_from_steps`;
the simulator's ``tau``)::

    tau_k(n) = (c1v + k c1d) + (n - 1)(c2v + k c2d),   tau_0(n) = c1_step + (n - 1) c2_step,

because ``c1`` already holds one sequence's cost. Each sequence commits
``E_k`` tokens per step, so the goodput is ``n E_k / tau_k(n)`` and the
schedule picks ``argmax_k E_k / tau_k(n)`` (SmartSpec's rule). For a
mixture-of-experts target each step also streams the experts its
``n (k + 1)`` routed tokens touch: ``phi(n (k + 1))`` times the coverage
increments of ``c1v``/``c1_step`` (per step) and ``c2v``/``c2_step`` (per
other sequence) (:mod:`sdplan.moe`).

In the mean-value model the running batch is ``B + 1`` at ``B = lambda L``
others, so this schedule is also the latency-optimal ``k`` per rate
(``argmin_k C1_k + B C2_k``, :mod:`sdplan.policy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from sdplan.model import Coefficients
    from sdplan.moe import MoESpec

    FloatArray = npt.NDArray[np.float64]


def step_times(coefficients: Coefficients, draft_lengths: list[int], sizes: FloatArray,
               moe: MoESpec | None = None) -> FloatArray:
    """Step time ``tau_k(n)`` in seconds, shape ``(n, 1 + len(draft_lengths))``; column 0 is no SD."""
    import numpy as np

    c = coefficients
    ks = np.asarray(draft_lengths, dtype=np.float64)
    n = np.asarray(sizes, dtype=np.float64)[:, None]
    fixed = np.concatenate([[c.baseline_c1_step_s], c.c1v_s + ks * c.c1d_s])[None, :]
    per_other = np.concatenate([[c.baseline_c2_step_s], c.c2v_s + ks * c.c2d_s])[None, :]
    tau = fixed + (n - 1.0) * per_other
    if moe is not None:
        cover = moe.coverage
        phi = moe.phi(n * np.concatenate([[1.0], ks + 1.0])[None, :])
        cover_fixed = np.array([cover.get("baseline_c1_step_s", 0.0)] + [cover.get("c1v_s", 0.0)] * ks.size)
        cover_other = np.array([cover.get("baseline_c2_step_s", 0.0)] + [cover.get("c2v_s", 0.0)] * ks.size)
        tau = tau + phi * (cover_fixed[None, :] + (n - 1.0) * cover_other[None, :])
    return tau


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
    import numpy as np

    from sdplan.acceptance import expected_tokens_per_cycle

    ks = np.asarray(draft_lengths, dtype=np.float64)
    tokens = expected_tokens_per_cycle(alpha, ks) if tokens_per_cycle is None else np.asarray(tokens_per_cycle)
    sizes = np.arange(1, max_batch_size + 1, dtype=np.float64)
    goodput = np.concatenate([[1.0], np.atleast_1d(tokens)])[None, :] / step_times(coefficients, draft_lengths,
                                                                                     sizes, moe)
    choice = np.argmax(goodput, axis=1)
    k_with_off = np.concatenate([[0], np.asarray(draft_lengths, dtype=np.int64)])
    per_size = k_with_off[choice]
    ranges: list[tuple[int, int, int]] = []
    start = 0
    for index in range(1, sizes.size + 1):
        if index == sizes.size or per_size[index] != per_size[start]:
            ranges.append((start + 1, index, int(per_size[start])))
            start = index
    return ranges
