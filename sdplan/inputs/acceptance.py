"""Acceptance metrics of speculative decoding and the conversions between them.

Three metrics are in use and tools mix their names up, so sdplan names each
one explicitly (``docs/model.md#acceptance-metrics``):

* **per-token acceptance** ``alpha``: probability that a drafted token is
  accepted given that every earlier token of the draft was; modelled i.i.d.
  This is what the latency model consumes.
* **mean acceptance length** ``tau``: tokens committed per verification cycle,
  bonus token included, ``tau = E(alpha, k)`` (vLLM: ``1 + accepted/drafts``).
* **draft acceptance rate** ``r``: fraction of drafted tokens that are kept,
  ``r = (E(alpha, k) - 1) / k`` (vLLM: ``accepted/draft_tokens``).

The latter two depend on the draft length ``k`` they were measured at, so
converting them to ``alpha`` needs that ``k``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from sdplan.errors import InvalidValueError

if TYPE_CHECKING:
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]

#: Bisection steps for inverting E(alpha, k); 2**-64 is below float64 resolution on [0, 1].
_BISECTION_STEPS = 64


class AcceptanceMetric(str, Enum):
    """Which acceptance metric a number is."""

    PER_TOKEN = "per-token"
    MEAN_LENGTH = "mean-length"
    DRAFT_RATE = "draft-rate"
    PER_POSITION = "per-position"

    @property
    def description(self) -> str:
        return {
            AcceptanceMetric.PER_TOKEN: "per-token acceptance probability alpha",
            AcceptanceMetric.MEAN_LENGTH: "mean acceptance length (tokens per cycle, bonus token included)",
            AcceptanceMetric.DRAFT_RATE: "draft acceptance rate (fraction of drafted tokens accepted)",
            AcceptanceMetric.PER_POSITION: "per-position acceptance rates (fraction of drafts accepted up to "
            "position i, as vLLM reports them)",
        }[self]


def expected_tokens_per_cycle(alpha: FloatArray | float, k: FloatArray | int) -> FloatArray:
    """Expected tokens committed per speculative cycle, bonus token included.

    Parameters
    ----------
    alpha : array_like
        Per-token acceptance probability, in [0, 1].
    k : array_like
        Draft length (tokens proposed per cycle), >= 0. Broadcasts with ``alpha``.

    Returns
    -------
    numpy.ndarray
        ``E(alpha, k)`` in tokens per cycle, in [1, k + 1].

    Notes
    -----
    With i.i.d. acceptance the accepted run is a truncated geometric variable
    and the verifier always adds one token (Leviathan et al., 2023)::

        E(alpha, k) = sum_{j=0..k} alpha**j = (1 - alpha**(k+1)) / (1 - alpha),

    which is ``k + 1`` at ``alpha = 1``. ``k = 0`` gives 1 (plain decoding).

    Examples
    --------
    >>> float(expected_tokens_per_cycle(0.8, 3).round(4))
    2.952
    >>> float(expected_tokens_per_cycle(1.0, 4))
    5.0
    """
    alpha_arr = np.asarray(alpha, dtype=np.float64)
    k_arr = np.asarray(k, dtype=np.float64)
    is_one = alpha_arr >= 1.0
    safe_alpha = np.where(is_one, 0.5, alpha_arr)
    # 1 - alpha**(k+1) = -expm1((k+1) log alpha): no cancellation as alpha -> 1 (log(0) = -inf gives 1).
    with np.errstate(divide="ignore"):
        geometric = -np.expm1((k_arr + 1.0) * np.log(safe_alpha)) / (1.0 - safe_alpha)
    return np.where(is_one, k_arr + 1.0, geometric)


def expected_tokens_per_position(position_rates: FloatArray) -> FloatArray:
    """Expected tokens per cycle from per-position conditional acceptance rates.

    Parameters
    ----------
    position_rates : array_like, shape (..., k)
        ``a_i``: probability that draft position ``i`` is accepted given that
        positions ``1..i-1`` were (vLLM's per-position rates are the running
        products of these).

    Returns
    -------
    numpy.ndarray, shape (...)
        ``E = 1 + sum_{i=1..k} prod_{j<=i} a_j`` tokens per cycle.

    Notes
    -----
    With every ``a_j = alpha`` this equals :func:`expected_tokens_per_cycle`.
    """
    rates = np.asarray(position_rates, dtype=np.float64)
    tokens: FloatArray = 1.0 + np.cumprod(rates, axis=-1).sum(axis=-1)
    return tokens


def tokens_from_position_rates(position_rates: tuple[float, ...], draft_lengths: FloatArray) -> FloatArray:
    """Expected tokens per cycle at each draft length from vLLM's per-position rates.

    Parameters
    ----------
    position_rates : tuple of float, length K
        ``r_i``: the fraction of drafts whose position ``i`` was accepted (so
        positions ``1..i`` all were), vLLM's
        ``spec_decode_per_position_acceptance_rates``; non-increasing.
    draft_lengths : array_like of int, each in [1, K]

    Returns
    -------
    numpy.ndarray
        ``E(k) = 1 + sum_{i<=k} r_i``. With conditional rates ``a_j`` this is
        ``1 + sum_i prod_{j<=i} a_j`` since ``r_i = prod_{j<=i} a_j``
        (``docs/model.md#per-position-acceptance``); equal ``a_j = alpha`` gives
        ``E(alpha, k)``.
    """
    ks = np.asarray(draft_lengths, dtype=np.int64)
    if np.any(ks < 1) or np.any(ks > len(position_rates)):
        raise InvalidValueError(
            f"per-position acceptance covers draft lengths 1..{len(position_rates)}; "
            "restrict --draft-lengths to that range (positions beyond it were not measured)"
        )
    cumulative = np.concatenate([[0.0], np.cumsum(np.asarray(position_rates, dtype=np.float64))])
    return 1.0 + cumulative[ks]


def validate_position_rates(rates: tuple[float, ...]) -> tuple[float, ...]:
    """Check per-position rates: each in [0, 1] and non-increasing (accepting i needs i-1)."""
    if not rates:
        raise InvalidValueError("per-position acceptance needs at least one rate")
    for index, rate in enumerate(rates):
        if not 0.0 <= rate <= 1.0 or rate != rate:
            raise InvalidValueError(f"per-position rate {index + 1} must lie in [0, 1], got {rate}")
        if index and rate > rates[index - 1] + 1e-12:
            raise InvalidValueError(
                "per-position rates must not increase: position i is accepted only if position i-1 was "
                "(give vLLM's spec_decode_per_position_acceptance_rates, not conditional rates)"
            )
    return tuple(float(rate) for rate in rates)


def position_rates_from_conditional(conditional: Sequence[float]) -> tuple[float, ...]:
    """vLLM's per-position rates ``r_i = a_1 ... a_i`` from a calibration's conditional ``a_i``.

    A calibration stores ``[acceptance] per_position_rates`` conditionally (``a_i``: position
    ``i`` accepted given ``1..i-1`` were); ``--position-acceptance`` and vLLM's
    ``spec_decode_per_position_acceptance_rates`` are the running products.
    """
    rates: list[float] = []
    for rate in conditional:
        rates.append(float(rate) * (rates[-1] if rates else 1.0))
    return tuple(rates)


def conditional_from_position_rates(rates: Sequence[float]) -> tuple[float, ...]:
    """A calibration's conditional ``a_i = r_i / r_(i-1)`` from vLLM's per-position rates ``r_i``.

    The inverse of :func:`position_rates_from_conditional`; a position after one never accepted is 0.
    """
    return tuple(float(rate) / previous if previous > 0 else 0.0
                 for rate, previous in zip(rates, [1.0, *rates[:-1]]))


#: Share of decode steps carrying a draft below which a measured acceptance records its draft coverage: a
#: draft model drafts on every step, prompt lookup only where the context repeats.
FULL_DRAFT_COVERAGE = 0.98


def measured_acceptance_table(alpha: float, measured_at_k: int, position_rates: Sequence[float] | None,
                              coverage: float | None) -> tuple[dict[str, object], str]:
    """A calibration's ``[acceptance]`` keys from what one measurement pooled, and the text that says it.

    Parameters
    ----------
    alpha : float
        The per-token alpha (i.i.d.) of the pooled mean acceptance length at ``measured_at_k``.
    measured_at_k : int
        The draft length ``K`` measured.
    position_rates : sequence of float, optional
        vLLM's per-position rates ``r_1..r_K`` (the share of drafts accepted up to position ``i``), pooled;
        written as the schema's conditional rates ``a_i = r_i / r_(i-1)``
        (:func:`conditional_from_position_rates`).
    coverage : float, optional
        The share of decode steps that carried a draft; written only below :data:`FULL_DRAFT_COVERAGE`.

    Returns
    -------
    table, text : dict, str
        The keys (``per_token_alpha``, ``measured_at_k``, ``per_position_rates``, ``draft_coverage``; the
        caller adds ``source``) and the words for the per-position rates and the coverage, to end the source
        with. Values are written to six digits (the coverage to four), as every calibration writes them.
    """
    table: dict[str, object] = {"per_token_alpha": round(float(alpha), 6), "measured_at_k": measured_at_k}
    text = ""
    if position_rates:
        table["per_position_rates"] = [round(rate, 6) for rate in conditional_from_position_rates(position_rates)]
    if coverage is not None and coverage < FULL_DRAFT_COVERAGE:
        table["draft_coverage"] = round(coverage, 4)
        text = f", drafts on {coverage:.0%} of decode steps"
    return table, text


def mean_length_from_alpha(alpha: FloatArray | float, k: int) -> FloatArray:
    """Mean acceptance length ``tau = E(alpha, k)`` (tokens per cycle)."""
    return expected_tokens_per_cycle(alpha, k)


def draft_rate_from_alpha(alpha: FloatArray | float, k: int) -> FloatArray:
    """Draft acceptance rate ``(E(alpha, k) - 1) / k`` (fraction of drafted tokens kept)."""
    if k < 1:
        raise InvalidValueError("a draft acceptance rate needs a draft length k >= 1")
    return (expected_tokens_per_cycle(alpha, k) - 1.0) / k


def alpha_from_mean_length(tau: FloatArray | float, k: int) -> FloatArray:
    """Per-token acceptance ``alpha`` whose ``E(alpha, k)`` equals ``tau``.

    Parameters
    ----------
    tau : array_like
        Mean acceptance length in tokens per cycle, bonus token included,
        in [1, k + 1].
    k : int
        Draft length the length was measured at, >= 1.

    Returns
    -------
    numpy.ndarray
        ``alpha`` in [0, 1].

    Notes
    -----
    ``E(alpha, k)`` is strictly increasing in ``alpha`` on [0, 1] for k >= 1,
    so a vectorised bisection converges to the unique root
    (``docs/model.md#acceptance-metrics``).
    """
    if k < 1:
        raise InvalidValueError("converting a mean acceptance length needs a draft length k >= 1")
    tau_arr = np.asarray(tau, dtype=np.float64)
    if np.any(~np.isfinite(tau_arr)) or np.any(tau_arr < 1.0) or np.any(tau_arr > k + 1.0):
        raise InvalidValueError(
            f"mean acceptance length must lie in [1, {k + 1}] tokens per cycle at k={k} "
            "(it counts the bonus token, so 1 means nothing was accepted)"
        )
    low = np.zeros_like(tau_arr)
    high = np.ones_like(tau_arr)
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (low + high)
        too_small = expected_tokens_per_cycle(mid, k) < tau_arr
        low = np.where(too_small, mid, low)
        high = np.where(too_small, high, mid)
    # the ends exactly: E(0, k) = 1 and E(1, k) = k + 1 (bisection's midpoint stops an ulp short of them)
    return np.where(tau_arr >= k + 1.0, 1.0, np.where(tau_arr <= 1.0, 0.0, 0.5 * (low + high)))


def alpha_from_draft_rate(rate: FloatArray | float, k: int) -> FloatArray:
    """Per-token acceptance ``alpha`` from a draft acceptance rate measured at ``k``.

    The draft acceptance rate ``r`` relates to the mean acceptance length by
    ``tau = 1 + k * r``; the conversion then follows :func:`alpha_from_mean_length`.
    """
    rate_arr = np.asarray(rate, dtype=np.float64)
    if np.any(~np.isfinite(rate_arr)) or np.any(rate_arr < 0.0) or np.any(rate_arr > 1.0):
        raise InvalidValueError("draft acceptance rate must lie in [0, 1] (a fraction; write 62% or 0.62)")
    return alpha_from_mean_length(1.0 + k * rate_arr, k)


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptanceSpec:
    """Acceptance as the user gave it, and the per-token alphas it converts to.

    Attributes
    ----------
    metric : AcceptanceMetric
        Which metric ``values`` are.
    values : tuple of float
        The numbers as given (fractions for rates, tokens/cycle for lengths).
    measured_at_k : int or None
        Draft length the values were measured at (required for the two
        k-dependent metrics).
    alphas : tuple of float
        Per-token acceptance, one per value.
    source : str
        Where the values came from ("command line", a file, "default assumption").
    """

    metric: AcceptanceMetric
    values: tuple[float, ...]
    measured_at_k: int | None
    alphas: tuple[float, ...]
    source: str
    position_rates: tuple[float, ...] | None = None
    #: Fraction of decode steps that carry a draft (:func:`with_coverage`); 1 for draft models.
    coverage: float = 1.0
    #: The draft length the per-position rates hold at, where they hold at no other (a block-parallel drafter
    #: re-plans the whole block when k changes); None where every k up to ``len(position_rates)`` is covered.
    only_draft_length: int | None = None

    def tokens_per_cycle(self, draft_lengths: FloatArray | Sequence[int]) -> FloatArray:
        """``E`` per (acceptance row, draft length), shape (a, k), with the draft coverage applied."""
        ks = np.asarray(draft_lengths)
        if self.position_rates is not None:
            tokens = tokens_from_position_rates(self.position_rates, ks)[None, :]
        else:
            tokens = expected_tokens_per_cycle(np.asarray(self.alphas)[:, None], ks[None, :].astype(np.float64))
        return with_coverage(tokens, self.coverage)

    def document(self) -> dict[str, object]:
        """The acceptance as JSON: what was given, in which metric, and the alphas used."""
        return {
            "metric_given": self.metric.value,
            "values_given": list(self.values),
            "measured_at_k": self.measured_at_k,
            "per_token_alpha": list(self.alphas),
            "draft_coverage": self.coverage,
            "source": self.source,
        }

    def describe(self) -> str:
        """One line saying what was received and what it became."""
        text = self._describe()
        if self.coverage < 1.0:
            text += f"; drafts on {self.coverage:.0%} of decode steps (measured draft coverage)"
        return text

    def _describe(self) -> str:
        alphas = ", ".join(f"{a:.3f}" for a in self.alphas)
        if self.position_rates is not None:
            rates = ", ".join(f"{r:.3g}" for r in self.position_rates)
            return (f"per-position rates [{rates}] (E(k) = 1 + sum of the first k; i.i.d.-equivalent alpha at "
                    f"k={len(self.position_rates)}: {alphas}) ({self.source})")
        if self.metric is AcceptanceMetric.PER_TOKEN:
            return f"per-token alpha = {alphas} ({self.source})"
        given = ", ".join(f"{v:g}" for v in self.values)
        return (
            f"per-token alpha = {alphas}, converted from {self.metric.description} "
            f"{given} at k={self.measured_at_k} ({self.source})"
        )


def with_coverage(tokens: FloatArray, coverage: FloatArray | float) -> FloatArray:
    """Tokens per decode step when only a fraction of the steps carries a draft.

    .. math:: E_{eff} = c E + (1 - c)

    Prompt-lookup proposers (vLLM ``ngram``, ``suffix``) draft only where the
    context repeats the current suffix; a step without a proposal emits one
    token, as without SD. vLLM's acceptance counters count drafted steps only
    (``Scheduler.make_spec_decoding_stats``), so ``c`` is measured apart from
    the acceptance: :func:`sdplan.runs.vllm_bench.draft_coverage`.
    """
    return np.asarray(coverage) * np.asarray(tokens) + (1.0 - np.asarray(coverage))


def make_acceptance(
    metric: AcceptanceMetric, values: tuple[float, ...], measured_at_k: int | None, source: str
) -> AcceptanceSpec:
    """Validate acceptance values of any metric and convert them to per-token alphas.

    Raises
    ------
    InvalidValueError
        If a value is outside its metric's domain or ``measured_at_k`` is missing
        for a k-dependent metric.
    """
    if not values:
        raise InvalidValueError("acceptance needs at least one value")
    arr = np.asarray(values, dtype=np.float64)
    if metric is AcceptanceMetric.PER_POSITION:
        rates = validate_position_rates(tuple(float(v) for v in values))
        equivalent = alpha_from_mean_length(1.0 + sum(rates), len(rates))
        return AcceptanceSpec(metric=metric, values=rates, measured_at_k=len(rates),
                              alphas=(float(equivalent),), source=source, position_rates=rates)
    if metric is AcceptanceMetric.PER_TOKEN:
        if np.any(~np.isfinite(arr)) or np.any(arr < 0.0) or np.any(arr > 1.0):
            raise InvalidValueError(
                "per-token acceptance alpha must lie in [0, 1]; for a mean acceptance length "
                "use --acceptance-length with --acceptance-k"
            )
        alphas = arr
    else:
        if measured_at_k is None:
            raise InvalidValueError(
                f"a {metric.description} depends on the draft length it was measured at; give --acceptance-k"
            )
        if metric is AcceptanceMetric.MEAN_LENGTH:
            alphas = alpha_from_mean_length(arr, measured_at_k)
        else:
            alphas = alpha_from_draft_rate(arr, measured_at_k)
    return AcceptanceSpec(
        metric=metric,
        values=tuple(float(v) for v in arr),
        measured_at_k=measured_at_k,
        alphas=tuple(float(a) for a in alphas),
        source=source,
    )
