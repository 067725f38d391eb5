"""The step cost as measured: a load curve on the line ``L = C1 + B C2``.

The linear model charges every other request in flight the same ``C2``. A
served sweep is not that straight: on a CPU the closed-loop latency rises
faster than the line between its first few levels and then along it
(throughput concave in ``N``), on a GPU it stays flat before it rises. A line
fitted through a whole sweep (``N = 1 .. 64``) then lies on the wrong side of
the measured latency between its ends, which is exactly where 30-80% load
puts ``B`` (``docs/model.md#load-curve``).

The curve is a factor on the line, a function of the others in flight::

    L(B) = s(B) (C1 + B C2),

``s`` piecewise linear through knots ``(B_j, s_j)`` measured on the closed-loop
sweep at the calibration's reference workload (:func:`from_sweep`), 1 at the
sweep's smallest and largest level and beyond: the line keeps its ends, so
zero-load latency and saturation ``1/C2`` are the line's. ``C1`` and ``C2`` stay
the interpretable summary; the curve says how far the measured sweep bent
away from them in between.

An open loop has ``B = lambda L`` (Little's law), so ``L`` solves
``B / lambda = s(B) (C1 + B C2)``. On each segment ``s = p + q B`` that is a
quadratic in ``B``; :func:`first_root` solves it exactly, segment by segment,
and every question the planner asks of the line (latency at a rate, the rate
under an SLO, at a batch cap, at break-even) becomes such a root.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sdplan.frozen import frozen, replace

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from sdplan.model import BreakEven

    FloatArray = npt.NDArray[np.float64]

#: A sweep needs this many closed-loop levels in one configuration for a curve: two fix the line's ends, a
#: third is the first point that can bend away from it.
MIN_LEVELS = 3


@frozen
class LoadCurve:
    """``s(B)``: the factor on ``C1 + B C2`` at ``B`` others in flight (``[load_curve]`` of a calibration).

    Attributes
    ----------
    others_requests : tuple of float
        The knots ``B_j`` (requests), increasing, from the sweep's smallest level to its largest.
    latency_factor : tuple of float
        ``s_j`` at the knots: 1 at the first and the last. ``s = 1`` outside the knots.
    configurations : int
        How many configurations' sweeps the factors average.
    """

    others_requests: tuple[float, ...]
    latency_factor: tuple[float, ...]
    configurations: int = 1

    def at(self, others: Any) -> FloatArray:
        """``s(B)``, 1 outside the knots."""
        import numpy as np

        return np.interp(np.asarray(others, dtype=np.float64), self.others_requests, self.latency_factor,
                         left=1.0, right=1.0)

    @property
    def largest_deviation(self) -> float:
        """The factor farthest from 1, minus 1 (``+0.09``: 9% above the line at one knot)."""
        return max((s - 1.0 for s in self.latency_factor), key=abs, default=0.0)

    def document(self) -> dict[str, Any]:
        """The ``[load_curve]`` table of a calibration."""
        return {"others_requests": [_stored(b) for b in self.others_requests],
                "latency_factor": [_stored(s) for s in self.latency_factor],
                "configurations": self.configurations,
                "source": "closed-loop sweep at the reference workload: measured over fitted mean latency, "
                          "over the line between the sweep's ends, averaged over configurations"}

    @classmethod
    def from_table(cls, table: Any) -> LoadCurve:
        return cls(others_requests=tuple(float(b) for b in table["others_requests"]),
                   latency_factor=tuple(float(s) for s in table["latency_factor"]),
                   configurations=int(table.get("configurations", 1)))


def _segments(curve: LoadCurve | None) -> list[tuple[float, float, float, float]]:
    """``(start, end, p, q)`` per segment of ``s = p + q B`` on ``[start, end]``, covering ``[0, inf)``."""
    import math

    if curve is None or len(curve.others_requests) < 2:
        return [(0.0, math.inf, 1.0, 0.0)]
    knots, factors = curve.others_requests, curve.latency_factor
    segments = [(0.0, knots[0], 1.0, 0.0)] if knots[0] > 0 else []
    for (b0, s0), (b1, s1) in zip(zip(knots, factors), zip(knots[1:], factors[1:])):
        slope = (s1 - s0) / (b1 - b0)
        segments.append((b0, b1, s0 - slope * b0, slope))
    segments.append((knots[-1], math.inf, 1.0, 0.0))
    return segments


def first_root(c1: Any, c2: Any, level: Any, slope: Any, curve: LoadCurve | None) -> FloatArray:
    """Smallest ``B >= 0`` with ``s(B) (C1 + B C2) = level + slope B``; ``inf`` where there is none.

    Parameters
    ----------
    c1, c2 : array_like
        The line (s; s per other request).
    level, slope : array_like
        The other side (s; s per other request), broadcast with ``c1``, ``c2``.
    curve : LoadCurve or None
        None: the line itself (``s = 1``).

    Notes
    -----
    On a segment ``s = p + q B``::

        q C2 B^2 + (p C2 + q C1 - slope) B + (p C1 - level) = 0,

    solved in the stable form (``x = -(b + sign(b) sqrt(d)) / 2``, roots ``x/a`` and ``c/x``), the
    segments in order, so the first root found is the smallest.
    """
    import numpy as np

    c1, c2, level, slope = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (c1, c2, level, slope)))
    found = np.full(c1.shape, np.inf)
    for start, end, p, q in _segments(curve):
        a, b, c = q * c2, p * c2 + q * c1 - slope, p * c1 - level
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # masked below
            discriminant = b * b - 4.0 * a * c
            x = -0.5 * (b + np.where(b >= 0, 1.0, -1.0) * np.sqrt(np.maximum(discriminant, 0.0)))
            quadratic = np.abs(a) > 1e-300
            first = np.where(quadratic, x / a, -c / b)
            second = np.where(quadratic, c / x, np.inf)
        tolerance = 1e-12 * (1.0 + (start if np.isinf(end) else end))
        here = np.full(c1.shape, np.inf)
        for root in (first, second):
            inside = (discriminant >= 0) & np.isfinite(root) & (root >= start - tolerance) & (root <= end + tolerance)
            here = np.minimum(here, np.where(inside, np.maximum(root, 0.0), np.inf))
        found = np.where(np.isinf(found), here, found)  # segments in order: the first with a root has the smallest
    return found


def latency_at(c1: Any, c2: Any, others: Any, curve: LoadCurve | None) -> FloatArray:
    """``L(B) = s(B) (C1 + B C2)`` (s)."""
    import numpy as np

    line = np.asarray(c1, dtype=np.float64) + np.asarray(others, dtype=np.float64) * np.asarray(c2, dtype=np.float64)
    return line if curve is None else curve.at(others) * line


def rate_at(c1: Any, c2: Any, others: Any, curve: LoadCurve | None) -> FloatArray:
    """The arrival rate (req/s) at which ``B`` others are in flight on average: ``B / L(B)`` (Little's law)."""
    import numpy as np

    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(others, dtype=np.float64) / latency_at(c1, c2, others, curve)


def mean_latency(c1: Any, c2: Any, rate_rps: Any, curve: LoadCurve | None) -> FloatArray:
    """Mean latency (s) of an open loop at ``rate_rps``: ``L`` with ``L = s(lambda L) (C1 + lambda L C2)``.

    Without a curve :func:`sdplan.model.mean_latency`, ``C1 / (1 - lambda C2)``. ``inf`` where no
    steady state exists (``lambda C2 >= 1``: the curve is 1 beyond the sweep, so saturation is the line's).
    """
    import numpy as np

    from sdplan import model

    if curve is None:
        return model.mean_latency(c1, c2, rate_rps)
    rate = np.asarray(rate_rps, dtype=np.float64)
    positive = rate > 0
    with np.errstate(divide="ignore"):
        others = first_root(c1, c2, 0.0, np.where(positive, 1.0 / np.where(positive, rate, 1.0), np.inf), curve)
        latency = np.where(positive, others / np.where(positive, rate, 1.0),
                           latency_at(c1, c2, 0.0, curve))
    stable = (np.isfinite(others) | ~positive) & (model.utilisation(c2, rate) < 1.0)
    return np.where(stable, latency, np.inf)


def break_even(c1_d: float, c2_d: float, c1_sd: Any, c2_sd: Any, curve: LoadCurve | None) -> BreakEven:
    """:func:`sdplan.model.break_even` with the curve.

    Two options have equal latency only at equal ``B``, where ``s`` is common: the crossing's
    ``B* = lambda* L*`` is the line's, and the rate there is ``B* / (s(B*) L*) = lambda* / s(B*)``.
    """
    import numpy as np

    from sdplan import model

    linear = model.break_even(c1_d, c2_d, c1_sd, c2_sd)
    if curve is None:
        return linear
    crosses = np.isfinite(linear.rate_rps)
    rate = np.where(crosses, linear.rate_rps, 0.0)
    others = rate * model.mean_latency(c1_d, c2_d, rate)
    return replace(linear, rate_rps=np.where(crosses, rate / curve.at(others), np.nan))


def from_sweep(points: list[tuple[Any, int, float, float, float]]) -> LoadCurve | None:
    """The curve of a calibration's closed-loop sweep, or None where no configuration has :data:`MIN_LEVELS`.

    Parameters
    ----------
    points : list of (configuration, clients, others, measured_s, line_s)
        One per closed-loop run at the reference workload: its configuration (any hashable), ``N``,
        the others it loads the server with (``f (N - 1)``), its measured mean latency and the
        fitted line's ``C1 + f (N - 1) C2``.

    Notes
    -----
    Per configuration and level, ``r_N`` = mean measured / mean line (repeats pooled). The bulge over the
    chord between the sweep's ends, ``r_N / chord(B_N)`` with the chord through ``(B_first, r_first)`` and
    ``(B_last, r_last)``, is what the line misses between them; it is 1 at the ends. The curve's knots are
    the levels of every configuration, each factor the mean bulge of the configurations whose sweep spans
    that knot: a single configuration's interior level is one measurement of one server, and the bend is
    the machine's. On the served runs acc40-43, from which this rule was chosen, the average took the
    validation runs' E2E MAPE from the line's 22.1% to 21.4% and their signed bias from -12.8% to -2.8%;
    each configuration's own bulge gave 23.9% (benchmarks/RESULTS-accuracy-served-2026-11.md).
    """
    from collections import defaultdict

    import numpy as np

    levels: dict[Any, dict[int, list[tuple[float, float, float]]]] = defaultdict(lambda: defaultdict(list))
    for configuration, clients, others, measured, line in points:
        if line > 0 and measured > 0:
            levels[configuration][clients].append((others, measured, line))
    bulges: dict[float, list[float]] = defaultdict(list)
    spans = []
    for by_clients in levels.values():
        if len(by_clients) < MIN_LEVELS:
            continue
        knots = np.array([np.mean([b for b, _, _ in by_clients[n]]) for n in sorted(by_clients)])
        ratio = np.array([sum(m for _, m, _ in by_clients[n]) / sum(li for _, _, li in by_clients[n])
                          for n in sorted(by_clients)])
        chord = np.interp(knots, [knots[0], knots[-1]], [ratio[0], ratio[-1]])
        spans.append((knots[0], knots[-1], knots, ratio / chord))
    if not spans:
        return None
    every = sorted({round(float(b), 6) for _, _, knots, _ in spans for b in knots})
    for knot in every:
        for low, high, knots, bulge in spans:
            if low - 1e-6 * (1.0 + knot) <= knot <= high + 1e-6 * (1.0 + knot):  # the knots are rounded to 1e-6
                bulges[knot].append(float(np.interp(knot, knots, bulge)))
    if len(every) < MIN_LEVELS:
        return None
    factor = [_stored(float(np.mean(bulges[b]))) for b in every]
    factor[0] = factor[-1] = 1.0
    return LoadCurve(others_requests=tuple(_stored(b) for b in every), latency_factor=tuple(factor),
                     configurations=len(spans))


def _stored(value: float) -> float:
    """``value`` at the four significant digits a calibration file keeps, so that a fit predicts as its file."""
    return float(f"{value:.4g}")

