"""Where a busy stretch of a server's metrics changes load: change points of its arrival rate.

:func:`rate_changes` cuts the ``auto`` windows of :mod:`sdplan.metrics.windows` where the arrival rate
changes without the server going idle in between (one load level running into the next).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sdplan.metrics.series import Point, arrivals


def rate_changes(stretch: Sequence[Point], first: int, last: int) -> list[tuple[int, int]]:
    """A busy stretch cut where its arrival rate changes (binary segmentation of Poisson counts).

    Arrivals per scrape interval (:func:`sdplan.metrics.series.arrivals`) are Poisson counts at a rate
    constant between change points. A split at interval ``j`` gains ``LL(left) + LL(right) - LL(all)`` in
    log-likelihood,
    ``LL(C, D) = C ln(C/D) - C`` for ``C`` arrivals over ``D`` seconds; the best split is kept when it gains
    more than :data:`CHANGE_PENALTY`, both sides last :data:`CHANGE_MIN_S` and their rates differ by
    :data:`CHANGE_MIN_RATIO`, and each side is searched again. Without the gauges nothing is cut.
    """
    counts = arrivals(stretch[first:last + 1])
    if counts is None:
        return [(first, last)]
    widths = [b.time_s - a.time_s for a, b in zip(stretch[first:last], stretch[first + 1:last + 1])]
    cuts = sorted({_snap_to_lull(counts, widths, cut) for cut in _best_splits(counts, widths, 0, len(counts))})
    bounds = [0, *cuts, len(counts)]
    pieces: list[list[int]] = []
    for lo, hi in zip(bounds, bounds[1:]):
        if pieces and sum(counts[lo:hi]) == 0:  # a lull between loads: it ends the piece before (its drain)
            pieces[-1][1] = hi
        elif pieces and sum(counts[pieces[-1][0]:pieces[-1][1]]) == 0:  # a lull first: it starts this piece
            pieces[-1][1] = hi
        else:
            pieces.append([lo, hi])
    return [(first + lo, first + hi) for lo, hi in pieces]


#: Log-likelihood gain a change of arrival rate must show to cut a window (about a 1-in-10^5 chance under one
#: rate for the 30-300 intervals of a window; the counts are estimates, a little over-dispersed).
CHANGE_PENALTY = 15.0
#: Shortest side of a cut (s), and the least ratio between the two sides' rates. A side without arrivals (a lull
#: between loads) may be as short as :data:`LULL_MIN_S`; it is then joined to the piece before it.
CHANGE_MIN_S = 10.0
LULL_MIN_S = 3.0
CHANGE_MIN_RATIO = 1.2


def _best_splits(counts: Sequence[float], widths: Sequence[float], lo: int, hi: int) -> list[int]:
    """Interval indices where the rate changes within ``counts[lo:hi]`` (see :func:`_rate_changes`)."""
    def likelihood(c: float, d: float) -> float:
        return c * math.log(c / d) - c if c > 0 and d > 0 else 0.0

    total_c, total_d = sum(counts[lo:hi]), sum(widths[lo:hi])
    whole = likelihood(total_c, total_d)
    best, at, left_c, left_d = 0.0, None, 0.0, 0.0
    for j in range(lo, hi - 1):
        left_c, left_d = left_c + counts[j], left_d + widths[j]
        right_c, right_d = total_c - left_c, total_d - left_d
        if left_d < (CHANGE_MIN_S if left_c else LULL_MIN_S) or right_d < (CHANGE_MIN_S if right_c else LULL_MIN_S):
            continue
        gain = likelihood(left_c, left_d) + likelihood(right_c, right_d) - whole
        rates = sorted((left_c / left_d, right_c / right_d))
        if gain > best and rates[1] > CHANGE_MIN_RATIO * rates[0] + 1e-12:
            best, at = gain, j + 1
    if at is None or best < CHANGE_PENALTY:
        return []
    return [*_best_splits(counts, widths, lo, at), at, *_best_splits(counts, widths, at, hi)]


def _snap_to_lull(counts: Sequence[float], widths: Sequence[float], cut: int) -> int:
    """A cut moved to the end of a lull (:data:`LULL_MIN_S` or more without arrivals) within three intervals of
    it, if there is one: the likelihood hardly tells the intervals around a change apart, and a load that went
    quiet before the next began changed where the quiet ended."""
    def lull_before(end: int) -> float:
        start = end
        while start > 0 and counts[start - 1] == 0:
            start -= 1
        return sum(widths[start:end])

    ends = [end for end in range(max(cut - 3, 1), min(cut + 4, len(counts)))
            if counts[end] > 0 and counts[end - 1] == 0 and lull_before(end) >= LULL_MIN_S]
    return min(ends, key=lambda end: abs(end - cut)) if ends else cut


