"""Service-level objectives: parsing, evaluation at an operating point, and inversion.

Syntax (also used in workload files)::

    METRIC:STATISTIC OP VALUE UNIT     e2e:mean<=2s  ttft:mean<=300ms  tpot:mean<=40ms
    throughput OP VALUE tok/s          throughput>=2000tok/s   (output tokens/s per replica)
    utilisation OP VALUE               utilisation<=0.8        (lambda*C2; headroom)

The model predicts means, so percentile SLOs (``e2e:p99<=5s``) are refused
with a message saying so rather than guessed from a rule of thumb.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np

from sdplan.errors import InputFileError, InvalidValueError
from sdplan.units import Dimension, format_seconds, parse_quantity

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.inputs.workload import WorkloadFile

    FloatArray = npt.NDArray[np.float64]


class Metric(str, Enum):
    """What an SLO constrains."""

    @property
    def bounds_rate(self) -> bool:
        """Whether an upper bound on this metric caps the request rate (TTFT grows with load: it does)."""
        return self in (Metric.E2E, Metric.TTFT, Metric.TPOT, Metric.UTILISATION)

    E2E = "e2e"
    TTFT = "ttft"
    TPOT = "tpot"
    THROUGHPUT = "throughput"
    UTILISATION = "utilisation"


_LATENCY = (Metric.E2E, Metric.TTFT, Metric.TPOT)
_ALIASES = {"latency": Metric.E2E, "e2el": Metric.E2E, "utilization": Metric.UTILISATION, "util": Metric.UTILISATION}
_SLO = re.compile(r"^\s*(?P<metric>[a-zA-Z_][a-zA-Z0-9_]*)\s*(:\s*(?P<stat>[a-zA-Z0-9.]+))?"
                  r"\s*(?P<op><=|>=|<|>)\s*(?P<value>.+?)\s*$")
SUPPORTED = "e2e:mean<=2s, ttft:mean<=300ms, tpot:mean<=40ms, throughput>=2000tok/s, utilisation<=0.8"


@dataclass(frozen=True, slots=True)
class SLO:
    """One objective. ``limit`` is in SI units (s, tok/s, or a fraction)."""

    metric: Metric
    upper_bound: bool
    strict: bool
    limit: float
    text: str
    statistic: str = "mean"

    def holds(self, value: float) -> bool:
        """Whether a predicted ``value`` meets the objective."""
        if math.isnan(value):
            return False
        if self.upper_bound:
            return value < self.limit if self.strict else value <= self.limit
        return value > self.limit if self.strict else value >= self.limit

    def margin(self, value: float) -> float:
        """Relative headroom: positive when met, ``(limit - value)/limit`` for upper bounds."""
        if not math.isfinite(value):
            return -math.inf if self.upper_bound else -1.0
        gap = self.limit - value if self.upper_bound else value - self.limit
        return gap / self.limit if self.limit else (0.0 if gap == 0 else math.copysign(math.inf, gap))

    def format_value(self, value: float) -> str:
        """A predicted or limit value in the SLO's natural unit."""
        if self.metric in _LATENCY:
            return format_seconds(value)
        if not math.isfinite(value):
            return "unstable"
        if self.metric is Metric.THROUGHPUT:
            return f"{value:.5g} tok/s"
        return f"{value:.3g}"


def parse_slo(text: str, allow_percentiles: bool = False) -> SLO:
    """Parse one SLO expression.

    Raises
    ------
    InvalidValueError
        On a malformed expression, an unknown metric or unit, a percentile
        statistic (not predicted by the mean model) or a bound in the wrong
        direction.
    """
    match = _SLO.match(text)
    if not match:
        raise InvalidValueError(f"SLO '{text}' is not METRIC:STATISTIC<=VALUE UNIT; e.g. {SUPPORTED}")
    name = match.group("metric").lower()
    try:
        metric = _ALIASES.get(name) or Metric(name)
    except ValueError:
        raise InvalidValueError(f"SLO '{text}': unknown metric '{name}'; supported: {SUPPORTED}") from None
    stat = (match.group("stat") or "").lower()
    if metric in _LATENCY:
        if stat in ("", None):
            raise InvalidValueError(
                f"SLO '{text}': say which statistic, e.g. '{metric.value}:mean{match.group('op')}...'")
        percentile = stat in ("median", "p50") or (stat.startswith("p") and _is_percentile(stat[1:]))
        if stat != "mean" and not percentile:
            raise InvalidValueError(f"SLO '{text}': unknown statistic '{stat}'; use mean or a percentile like p99")
        if percentile and not allow_percentiles:
            raise InvalidValueError(
                f"SLO '{text}': '{stat}' is not predicted by the analytic model, which gives means only (sdplan does "
                f"not invent tails from rules of thumb); check it with 'sdplan check --simulate', or use "
                f"'{metric.value}:mean' ({SUPPORTED})"
            )
        stat = "p50" if stat == "median" else stat
    elif stat not in ("", "mean"):
        raise InvalidValueError(f"SLO '{text}': {metric.value} takes no statistic; e.g. {SUPPORTED}")
    op = match.group("op")
    upper = op.startswith("<")
    if metric is Metric.THROUGHPUT and upper:
        raise InvalidValueError(f"SLO '{text}': a throughput SLO is a lower bound; write throughput>=VALUE tok/s")
    if metric is not Metric.THROUGHPUT and not upper:
        raise InvalidValueError(f"SLO '{text}': {metric.value} SLOs are upper bounds; write {metric.value}...<=VALUE")
    dimension = {Metric.THROUGHPUT: Dimension.TOKEN_RATE, Metric.UTILISATION: Dimension.FRACTION}.get(
        metric, Dimension.TIME
    )
    try:
        limit = parse_quantity(match.group("value"), dimension)
    except InvalidValueError as error:
        raise InvalidValueError(f"SLO '{text}': {error}") from None
    if limit <= 0:
        raise InvalidValueError(f"SLO '{text}': the limit must be > 0")
    if metric is Metric.UTILISATION and limit >= 1:
        raise InvalidValueError(f"SLO '{text}': utilisation must stay below 1 (1 is saturation); e.g. utilisation<=0.8")
    return SLO(metric=metric, upper_bound=upper, strict=op in ("<", ">"), limit=limit, text=text.strip(),
               statistic=stat if metric in _LATENCY else "mean")


def _is_percentile(text: str) -> bool:
    try:
        return 0.0 < float(text) < 100.0
    except ValueError:
        return False


#: Most SLOs one command checks (each is a row of the verdict table).
MAX_SLOS = 100


def resolve_slos(cli_slos: Sequence[str], file: WorkloadFile | None,
                 allow_percentiles: bool = False) -> list[SLO]:
    """SLOs from the command line if any were given, else from the workload file.

    A bad expression on the command line is a usage error (exit 2); in a file
    it is an invalid input file (exit 3) naming ``slos[i]``.
    """
    if len(cli_slos) > MAX_SLOS:
        raise InvalidValueError(f"{len(cli_slos)} SLOs given; at most {MAX_SLOS} (one per metric and statistic)")
    if not cli_slos and file is not None and len(file.slos) > MAX_SLOS:
        raise InputFileError(file.path, "slos", f"{len(file.slos)} SLOs; at most {MAX_SLOS}")
    if cli_slos:
        return [parse_slo(text, allow_percentiles) for text in cli_slos]
    slos = []
    for index, text in enumerate(file.slos if file is not None else ()):
        try:
            slos.append(parse_slo(text, allow_percentiles))
        except InvalidValueError as error:
            raise InputFileError(file.path, f"slos[{index}]", str(error)) from None  # type: ignore[union-attr]
    return slos


@dataclass(frozen=True, slots=True, kw_only=True)
class OperatingPoint:
    """Predicted means at one (rate, option); ``inf`` latencies when unstable."""

    e2e_s: float
    ttft_s: float
    tpot_s: float
    throughput_tok_s: float
    utilisation: float

    def value(self, metric: Metric) -> float:
        return {
            Metric.E2E: self.e2e_s,
            Metric.TTFT: self.ttft_s,
            Metric.TPOT: self.tpot_s,
            Metric.THROUGHPUT: self.throughput_tok_s,
            Metric.UTILISATION: self.utilisation,
        }[metric]


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """One SLO checked at one operating point."""

    slo: SLO
    predicted: float
    passed: bool
    margin: float


def evaluate(slos: list[SLO], point: OperatingPoint, stable: bool | None = None) -> list[Verdict]:
    """Check every SLO; an unstable point fails every SLO (it has no steady state).

    ``stable`` defaults to an open loop's rule, utilisation below 1. A closed loop has a steady state at
    every concurrency (past the engine's cap the other clients wait), so its caller says.
    """
    stable = point.utilisation < 1.0 if stable is None else stable
    verdicts = []
    for slo in slos:
        value = point.value(slo.metric) if stable else (math.inf if slo.upper_bound else 0.0)
        verdicts.append(Verdict(slo=slo, predicted=value, passed=stable and slo.holds(value), margin=slo.margin(value)))
    return verdicts


def max_rate_under(
    slo: SLO, c1_s: FloatArray, c2_s: FloatArray, ttft_s: FloatArray | float, output_tokens: float,
    ttft_per_other_s: FloatArray | float = 0.0,
) -> tuple[FloatArray, FloatArray]:
    """Rate bounds ``(lowest, highest)`` in req/s that one SLO allows, per option.

    Parameters
    ----------
    slo : SLO
    c1_s, c2_s : array_like
        Demand of each option (broadcast together).
    ttft_s : array_like
        Zero-load TTFT of each option (s).
    output_tokens : float
        ``g``.
    ttft_per_other_s : array_like
        What each other request in flight adds to TTFT, ``a = w_load tau2`` (s):
        ``TTFT = ttft_s + B a`` with ``B = lambda L`` (:func:`sdplan.latency.model.time_to_first_token`).

    Returns
    -------
    (lowest, highest) : numpy.ndarray
        The SLO holds for ``lowest <= lambda <= highest`` (below saturation);
        ``highest = -1`` where it holds at no rate.

    Notes
    -----
    Closed forms from ``L = C1/(1 - lambda C2)`` and ``B = lambda L``
    (``docs/model.md#slo-capacity``), with ``t0 = ttft_s``:

    * ``e2e:mean <= T``: ``lambda <= (1 - C1/T)/C2``, none if ``C1 > T``;
    * ``ttft:mean <= T``: ``B <= B* = (T - t0)/a``, i.e. ``lambda C1/(1 - lambda C2) <= B*``,
      ``lambda <= B*/(C1 + B* C2)``; none if ``t0 > T``, all if ``a = 0``;
    * ``tpot:mean <= T``: TPOT = (L - TTFT)/(g - 1) gives ``L (1 - lambda a) <= K`` with
      ``K = t0 + T (g - 1)``, so ``lambda (K C2 - a C1) <= K - C1``: an upper bound when
      ``K C2 > a C1``; otherwise TPOT does not grow with the rate;
    * ``utilisation <= u``: ``lambda <= u/C2``;
    * ``throughput >= X``: a lower bound, ``lambda >= X/g``.
    """
    c1 = np.asarray(c1_s, dtype=np.float64)
    c2 = np.asarray(c2_s, dtype=np.float64)
    t0 = np.asarray(ttft_s, dtype=np.float64)
    per_other = np.asarray(ttft_per_other_s, dtype=np.float64)
    c1, c2, t0, per_other = np.broadcast_arrays(c1, c2, t0, per_other)
    everything = np.full(c1.shape, np.inf)
    zero = np.zeros(c1.shape)

    def latency_bound(limit_s: Any) -> FloatArray:
        with np.errstate(divide="ignore", invalid="ignore"):
            highest = (1.0 - c1 / limit_s) / c2
        highest = np.where(c2 > 0, highest, np.inf)
        return np.where(c1 <= limit_s, highest, -1.0)

    if slo.metric is Metric.E2E:
        return zero, latency_bound(slo.limit)
    if slo.metric is Metric.TPOT:
        if output_tokens <= 1:
            raise InvalidValueError(f"SLO '{slo.text}': TPOT is undefined for 1 output token")
        k = t0 + slo.limit * (output_tokens - 1.0)
        slope = k * c2 - per_other * c1
        with np.errstate(divide="ignore", invalid="ignore"):
            bound = (k - c1) / slope
        upper = np.where(c1 <= k, np.where(slope > 0, bound, np.inf), np.where(slope < 0, np.inf, -1.0))
        lower = np.where((c1 > k) & (slope < 0), bound, 0.0)
        return lower, upper
    if slo.metric is Metric.TTFT:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            allowed = (slo.limit - t0) / per_other
            highest = np.where(np.isfinite(allowed), allowed / (c1 + allowed * c2), np.inf)
        highest = np.where(per_other > 0, highest, np.inf)
        return zero, np.where(t0 <= slo.limit, highest, -1.0)
    if slo.metric is Metric.UTILISATION:
        with np.errstate(divide="ignore"):
            return zero, np.where(c2 > 0, slo.limit / np.where(c2 > 0, c2, 1.0), np.inf)
    return np.full(c1.shape, slo.limit / output_tokens), everything
