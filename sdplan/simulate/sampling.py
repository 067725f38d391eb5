"""Sampling the decode: the cycles a request needs, at a fixed draft length or per stretch of constant ``k``.

Each verification cycle commits ``1 + A`` tokens with ``P(A >= j) = r_j``
(``r_j = alpha**j`` for i.i.d. acceptance, or vLLM's per-position rates).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Iterator

    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]

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


def _token_sums(rates: FloatArray, top: int) -> Iterator[FloatArray]:
    """Distribution of the token sum ``S_c`` after ``c = 1, 2, ...`` cycles, mass at ``>= top`` lumped in cell ``top``.

    A cycle commits ``1 + A`` tokens with ``P(A = a) = r_a - r_{a+1}``
    (``r_0 = 1``, ``r_{k+1} = 0``), so ``S_c`` is the ``c``-fold convolution
    of that step. Stops once ``P(S_c >= top) >= 1 - 1e-12`` (or after
    ``4 top + 64`` cycles).
    """
    step = np.concatenate([[1.0], rates]) - np.concatenate([rates, [0.0]])  # P(A = a), a = 0..k
    step = np.concatenate([[0.0], np.clip(step, 0.0, None)])  # tokens per cycle: 1 + A
    distribution = np.zeros(top + 1)
    distribution[0] = 1.0  # S_0 = 0
    for cycle in range(4 * top + 65):
        distribution = np.convolve(distribution, step)
        distribution[top] += distribution[top + 1:].sum()
        distribution = distribution[: top + 1]
        yield distribution
        if distribution[top] >= 1.0 - 1e-12 or cycle >= 4 * top + 64:
            return


def _cycles_exact(remaining: npt.NDArray[np.int64], rates: FloatArray, uniforms: FloatArray) -> FloatArray:
    """Inverse-CDF draw of ``N(m)`` per request from the exact first-passage distribution."""
    top = int(remaining.max())
    levels, index = np.unique(remaining, return_inverse=True)
    positive = levels > 0
    cdf_rows = []
    for distribution in _token_sums(rates, top):
        tail = np.cumsum(distribution[::-1])[::-1]  # P(S_c >= m), m = 0..top
        cdf_rows.append(tail[levels])
    cdf = np.asarray(cdf_rows)  # (cycles, levels): P(N(m) <= c)
    cycles = np.zeros(remaining.size)
    for level in np.flatnonzero(positive):
        members = index == level
        cycles[members] = 1 + np.searchsorted(cdf[:, level], uniforms[members], side="right")
    return np.minimum(cycles, len(cdf_rows))


def _cycles_sampled(remaining: npt.NDArray[np.int64], rates: FloatArray, rng: np.random.Generator) -> FloatArray:
    """``N(m)`` by drawing the tokens of every cycle (long outputs)."""
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


class AdaptiveDecode:
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
        self.rates, self.rng = rates, rng
        self.ids = np.empty(max(capacity, 1), dtype=np.int64)
        self.left = np.empty(max(capacity, 1), dtype=np.float64)
        self.size = 0
        self.uniforms = np.empty(0)
        self.position = 0
        self.tokens: dict[int, FloatArray] = {}  # draft length -> tokens per cycle of each uniform in the block

    def add(self, request: int, tokens_left: float) -> None:
        if self.size == self.ids.size:
            self.ids = np.concatenate([self.ids, np.empty_like(self.ids)])
            self.left = np.concatenate([self.left, np.empty_like(self.left)])
        self.ids[self.size] = request
        self.left[self.size] = tokens_left
        self.size += 1

    def _cycle_tokens(self, draft: int, count: int) -> FloatArray:
        """Tokens per cycle at ``draft`` for the next ``count`` uniforms of the stream."""
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


#: Most cells (cycles x tokens) of one draft length's tables under the goodput policy; longer outputs fall back to
#: drawing every cycle (:class:`AdaptiveDecode`).
STRETCH_TABLE_CELLS = 4_000_000


class StretchTables:
    """Exact draws for the goodput policy, handling each stretch of constant ``k`` like a fixed ``k``.

    Within a stretch at draft length ``k`` a sequence with ``m`` tokens left
    finishes after ``N_k(m) = min{c : S_c >= m}`` cycles, drawn by inverse CDF
    from ``P(N_k(m) <= c) = P(S_c >= m)`` (:meth:`first_passage`). When ``k``
    changes after ``c`` cycles of the stretch, a sequence still running has
    ``N_k(m) > c``, i.e. ``S_c < m``; its tokens produced are drawn from
    ``P(S_c = j | S_c < m) = P(S_c = j) / P(S_c < m)``, ``j < m``
    (:meth:`produced`), and the rest of its output is drawn afresh at the new
    ``k``. Cycles are independent, so given the past only ``S_c`` matters
    (the Markov property of the token sum) and the draws have the same
    distribution as sampling every cycle. Tables are built per draft length
    on first use; ``k = 0`` commits one token per cycle (``S_c = c``).
    """

    def __init__(self, rates: FloatArray, top: int) -> None:
        self.rates, self.top = rates, max(int(top), 1)
        self.passage: dict[int, FloatArray] = {}  # k -> (m, c - 1): P(N_k(m) <= c)
        self.below: dict[int, FloatArray] = {}  # k -> (c, j): P(S_c <= j)

    @staticmethod
    def fits(rates: FloatArray, options: list[int], top: int) -> bool:
        """Whether every option's tables stay within :data:`STRETCH_TABLE_CELLS`."""
        positive = [1.0 + float(rates[:o].sum()) for o in options if o]
        if not positive:
            return True
        cycles = math.ceil(top / min(positive) * 1.5) + 64  # the horizon at the fewest tokens per cycle
        return cycles * (top + 1) <= STRETCH_TABLE_CELLS

    def _build(self, draft: int) -> None:
        rows = np.asarray(list(_token_sums(self.rates[:draft], self.top)))  # (c - 1, j): P(S_c = j), c = 1..
        self.below[draft] = np.cumsum(np.vstack([np.eye(1, self.top + 1), rows]), axis=1)  # row c = 0 too
        tails = np.cumsum(rows[:, ::-1], axis=1)[:, ::-1]  # P(S_c >= m)
        self.passage[draft] = np.ascontiguousarray(tails.T)

    def first_passage(self, draft: int, tokens: int, uniform: float) -> int:
        """Cycles to produce ``tokens`` (>= 1) at ``draft``, from one uniform in [0, 1)."""
        if draft == 0:
            return tokens
        table = self.passage.get(draft)
        if table is None:
            self._build(draft)
            table = self.passage[draft]
        row = table[tokens]
        cycles = 1 + int(np.searchsorted(row, uniform, side="right"))
        return min(cycles, int(row.size))

    def first_passages(self, draft: int, tokens: npt.NDArray[np.int64],
                       uniforms: FloatArray) -> npt.NDArray[np.int64]:
        """:meth:`first_passage` of many sequences at once."""
        if draft == 0:
            return tokens.copy()
        table = self.passage.get(draft)
        if table is None:
            self._build(draft)
            table = self.passage[draft]
        rows = table[tokens]
        counted: npt.NDArray[np.int64] = np.minimum(1 + (rows <= uniforms[:, None]).sum(axis=1), rows.shape[1])
        return counted

    def produced(self, draft: int, cycles: npt.NDArray[np.int64], tokens: npt.NDArray[np.int64],
                 uniforms: FloatArray) -> npt.NDArray[np.int64]:
        """Tokens produced in ``cycles`` at ``draft`` by sequences with ``tokens`` left that have not finished.

        Inverse CDF of ``S_c`` restricted to ``S_c < m``: with ``U`` in
        (0, 1], the smallest ``j`` with ``P(S_c <= j) >= U P(S_c <= m - 1)``.
        """
        if draft == 0:
            return cycles.copy()
        below = self.below[draft]  # built with the stretch's first passages
        rows = below[cycles]
        target = uniforms * rows[np.arange(cycles.size), tokens - 1]
        counted: npt.NDArray[np.int64] = (rows < target[:, None]).sum(axis=1)
        return counted
