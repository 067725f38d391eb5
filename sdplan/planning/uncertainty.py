"""95% intervals from a fitted calibration's covariance: latency, break-even rate, capacity.

A fitted or served calibration stores the covariance of its eight direct-form
coefficients (``[uncertainty]``, :mod:`sdplan.fitting.fit`). The intervals here are
parametric-bootstrap intervals: draw coefficient vectors from the normal
distribution with that mean and covariance, keep the draws whose demands are
physical (:func:`physical`), push every draw through the same vectorised
model the planner uses, and take the 2.5th and 97.5th percentiles of each
prediction.
Unlike a delta-method interval this follows the model's non-linearity near
saturation, where a draw may be unstable: unstable draws count as ``inf``, so
an upper bound past saturation reads "unstable", which is the answer.

The intervals cover the uncertainty of the fit (finite, noisy benchmark
points), the share of ``c2_step`` that does not grow with the context where
the fit profiled it (``[uncertainty] step_share_sd_pct``, which matters away
from the reference context) and, where the calibration repeated points on
fresh server instances, the spread between instances (``[uncertainty]
repeat_sd_pct``): each draw also runs on a server of its own speed. They do
not cover a model-form error or a different machine
(``docs/model.md#uncertainty``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from sdplan.fitting.runmodel import PARAMETERS, coefficients_from_vector, fixed_step_share, values_from_table
from sdplan.inputs.acceptance import expected_tokens_per_cycle
from sdplan.inputs.slo import Verdict
from sdplan.latency import knee, model

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.calibration import Calibration
    from sdplan.latency.coefficients import Coefficients

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

#: Draws per interval; the 2.5th/97.5th percentiles of 400 draws move by about 1% of the interval's width.
DRAWS = 400
LEVEL = 0.95
#: Rounds of DRAWS draws at most, to find DRAWS with physical demands (:func:`physical`).
MAX_DRAW_ROUNDS = 10
#: One-sided standard normal quantile of :func:`calibration_speed_margin`: 95%, the intervals' level, one-sided
#: (scipy.stats.norm.ppf(0.95)), chosen with the intervals' level, not on any measurement.
MARGIN_Z = 1.6448536269514722


def coefficient_draws(calibration: Calibration, prompt_tokens: float, output_tokens: float,
                      options: tuple[Any, Any] | None = None, draws: int = DRAWS,
                      seed: int = 0) -> list[Coefficients] | None:
    """Coefficients at a workload for ``draws`` samples of the fitted coefficients; None without a covariance.

    ``options`` is ``(draft_lengths, tokens_per_cycle)`` of the SD options the caller evaluates
    (broadcastable arrays); only draws with physical demands there are kept (:func:`physical`),
    drawing more (up to :data:`MAX_DRAW_ROUNDS` rounds) until ``draws`` are. None also when fewer
    than a quarter of that are physical: the covariance says little about those options then.
    """
    uncertainty = calibration.records.uncertainty
    if uncertainty is None or calibration.form != "direct":
        return None
    names = list(uncertainty.parameters)
    if sorted(names) != sorted(PARAMETERS):
        return None
    covariance = np.asarray(uncertainty.covariance_s2, dtype=np.float64)
    fitted = values_from_table(calibration.document["coefficients"])
    mean = np.array([fitted[name] for name in names])
    covariance = 0.5 * (covariance + covariance.T)
    values, vectors = np.linalg.eigh(covariance)
    root = vectors * np.sqrt(np.clip(values, 0.0, None))  # a PSD square root, robust to round-off
    rng = np.random.default_rng(seed)

    reference = (calibration.reference_prompt_tokens, calibration.reference_output_tokens)
    template = calibration.coefficients_at(prompt_tokens, output_tokens)  # TTFT weights, closed-loop factor
    order = [names.index(name) for name in PARAMETERS]
    # The length scaling is linear in the coefficients: map the unit vectors once, then every draw is a product.
    costs = [field.name for field in fields(template)
             if field.name.endswith("_s") and not field.name.startswith("ttft_")]

    def basis_at(share: float) -> FloatArray:
        basis = np.zeros((len(costs), len(PARAMETERS)))
        for j in range(len(PARAMETERS)):
            unit = np.zeros(len(PARAMETERS))
            unit[j] = 1.0
            scaled = coefficients_from_vector(unit, reference, prompt_tokens, output_tokens, fixed_step_share=share)
            basis[:, j] = [getattr(scaled, name) for name in costs]
        return basis

    # The scaled costs are affine in the step share too (only c2_step(s) = c2_step (phi + (1 - phi) s/s_ref)
    # moves with it): where the fit profiled the share, each draw also draws its share, N(phi, sd) within [0, 1].
    share = fixed_step_share(calibration.document["coefficients"])
    share_sd = (uncertainty.step_share_sd_pct or 0.0) / 100.0
    per_share = None
    if share_sd > 0:
        at_zero = basis_at(0.0)
        per_share = basis_at(1.0) - at_zero
        basis = at_zero + share * per_share
    else:
        basis = basis_at(share)
    share_rng = np.random.default_rng([seed, 1])  # its own stream: the other draws are as without a share spread
    ks, tokens = (np.ravel(a).astype(np.float64) for a in np.broadcast_arrays(*options)) if options else ([], [])
    kept = np.empty((0, len(costs)))
    for _ in range(MAX_DRAW_ROUNDS):
        samples = mean + rng.standard_normal((draws, len(names))) @ root.T
        drawn = samples[:, order] @ basis.T
        if per_share is not None:
            shares = np.clip(share + share_sd * share_rng.standard_normal(draws), 0.0, 1.0)
            drawn += (shares - share)[:, None] * (samples[:, order] @ per_share.T)
        keep = physical(replace(template, **{name: drawn[:, i] for i, name in enumerate(costs)}), ks, tokens)
        kept = np.vstack([kept, drawn[keep]])
        if len(kept) >= draws:
            break
    if len(kept) < draws // 4:
        return None
    rows = kept[:draws]
    speed = server_speeds(uncertainty.repeat_sd_pct, len(rows), rng)
    ttft_costs = {name: getattr(template, name) for name in ("ttft_offset_s", "ttft_prefill_s")}
    return [replace(template, **{name: float(value) * factor for name, value in zip(costs, row)},
                    **{name: value * factor for name, value in ttft_costs.items()})
            for row, factor in zip(rows, speed)]


def server_spread_pct(calibration: Calibration) -> float | None:
    """The calibration's spread between server instances (``[uncertainty] repeat_sd_pct``), None without one."""
    uncertainty = calibration.records.uncertainty
    return None if uncertainty is None else uncertainty.repeat_sd_pct


def covers(sd_pct: float | None) -> str:
    """What the intervals cover, in words: the caption of every command that shows them."""
    if not sd_pct:
        return "fit uncertainty"
    return f"fit uncertainty and server-to-server spread {sd_pct:.2g}%"


def server_speeds(sd_pct: float | None, count: int, rng: Any) -> FloatArray:
    """Cost factors of ``count`` server instances: ``exp(sigma z)``, ``z ~ N(0, 1)``, all 1 without a spread.

    Parameters
    ----------
    sd_pct : float or None
        ``sigma`` in percent: the standard deviation of a point's log mean latency between server instances
        (:attr:`sdplan.fitting.validation.RepeatSpread.sd_pct`, ``[uncertainty] repeat_sd_pct``).
    count : int
        Draws.
    rng : numpy.random.Generator

    Notes
    -----
    A server instance slower by a factor ``u`` takes ``u`` times every cost, so its latency is
    ``L = u C1 / (1 - lambda u C2)``: near saturation the factor moves the upper bound far more than the
    lower, as it does on real servers. On a 2-core CPU the quick grid's repeats lay about 9% apart
    (``sigma`` 4.5-15.5% over seven calibrations), while the fit's own standard errors were a few percent;
    without this term the 95% intervals held 49% of 189 served runs at other times, workloads and loads,
    with it 77% (``benchmarks/RESULTS-accuracy-served-2026-11.md``).
    """
    if not sd_pct:
        return np.ones(count)
    return np.asarray(np.exp(rng.standard_normal(count) * sd_pct / 100.0))


def calibration_speed_margin(sd_pct: float | None, instances: int, z: float = MARGIN_Z) -> float:
    """Cost factor of a server as much slower than the calibration's as its own speed error allows, one-sided.

    Servers of one configuration run at ``exp(d)`` times the mean server's costs, ``d ~ N(0, sigma^2)``
    (:func:`server_speeds`). A calibration rests on ``n`` of them, so its costs are those of a server
    ``exp(d_c)``, ``d_c ~ N(0, sigma^2 / n)``, and every replica sized on it inherits that one draw: unlike
    each replica's own speed, it does not average out over a fleet. The mean server is slower than the
    calibration's by at most

    .. math:: u = \\exp(z \\sigma / \\sqrt{n})

    with probability ``Phi(z)`` (:data:`MARGIN_Z`: 95%, the level of the intervals, one-sided).

    Parameters
    ----------
    sd_pct : float or None
        ``sigma`` in percent (``[uncertainty] repeat_sd_pct``); None or 0: no margin.
    instances : int
        Server instances per configuration the calibration measured (``[measurement]
        server_instances_per_configuration``).
    z : float
        The one-sided standard normal quantile.

    Returns
    -------
    float
        ``u >= 1`` (1 without a spread); the costs to plan with are ``u`` times the calibration's
        (:func:`on_slower_server`).

    Notes
    -----
    Measured on served quick grids of a 2-core CPU VM (``benchmarks/overpromise_causes.py``):
    the validation's fresh servers ran -4% to +18% from their calibration's at the same load, two instances
    of one calibration -19% to +36% apart, with ``sigma`` 8.6-16.3%; at ``sigma`` 13% and two instances
    ``u`` is 1.16.
    """
    if not sd_pct or sd_pct <= 0 or instances < 1:
        return 1.0
    return math.exp(z * sd_pct / 100.0 / math.sqrt(instances))


def calibration_margin(calibration: Calibration, z: float = MARGIN_Z) -> float:
    """:func:`calibration_speed_margin` of a calibration: 1 unless it measured its servers' spread."""
    measurement = calibration.records.measurement
    return calibration_speed_margin(server_spread_pct(calibration),
                                    1 if measurement is None else measurement.server_instances, z)


#: Calibration methods measured on real servers, whose answers say how fast they assume the servers
#: (:class:`SpeedMargin`); roofline and derived calibrations already say they were not measured at all.
MEASURED_METHODS = ("measured", "fit")


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeedMargin:
    """How much slower than the calibration's servers ``capacity`` and ``check`` answer for.

    Attributes
    ----------
    factor : float
        ``u = exp(z sigma / sqrt(n))`` (:func:`calibration_speed_margin`); 1 without a measured spread.
    sd_pct : float or None
        ``sigma``, the spread between server instances (``[uncertainty] repeat_sd_pct``); None: not measured.
    instances : int
        ``n``, server instances per configuration the calibration measured.
    z : float
        The one-sided normal quantile (:data:`MARGIN_Z`, 95%).
    applied : bool
        Whether the answer is on the slower server: ``u > 1`` and not opted out (``--at-calibrated-speed``).
    """

    factor: float
    sd_pct: float | None
    instances: int
    z: float = MARGIN_Z
    applied: bool

    @property
    def slower_pct(self) -> float:
        """How much slower, in percent of the calibration's costs: ``100 (u - 1)``."""
        return 100.0 * (self.factor - 1.0)

    @property
    def measured(self) -> bool:
        """Whether the calibration measured its servers' spread (``u > 1``)."""
        return self.factor > 1.0


def speed_margin(calibration: Calibration, at_calibrated_speed: bool = False) -> SpeedMargin | None:
    """The margin an answer on ``calibration`` carries; None for a calibration not measured on servers.

    ``at_calibrated_speed`` keeps the factor for the caveat but answers at the calibration's speed.
    """
    if calibration.method not in MEASURED_METHODS:
        return None
    measurement = calibration.records.measurement
    factor = calibration_margin(calibration)
    return SpeedMargin(factor=factor, sd_pct=server_spread_pct(calibration),
                       instances=1 if measurement is None else measurement.server_instances,
                       applied=factor > 1.0 and not at_calibrated_speed)


def on_slower_server(coefficients: Coefficients, factor: float) -> Coefficients:
    """The coefficients of a server ``factor`` times slower: every cost (``*_s``) times ``factor``.

    The server-speed model of :func:`coefficient_draws`: a slower instance takes ``u`` times every cost,
    TTFT's own included, so ``L = u C1 / (1 - lambda u C2)``.
    """
    return replace(coefficients, **{item.name: getattr(coefficients, item.name) * factor
                                    for item in fields(coefficients) if item.name.endswith("_s")})


def physical(drawn: Coefficients, draft_lengths: Any, tokens_per_cycle: Any) -> Any:
    """Which draws have physical demands: ``C1 > 0`` and ``C2 >= 0`` without SD and at every SD option.

    Parameters
    ----------
    drawn : Coefficients
        The draws, each cost field an array of shape (draws,) (the model's functions broadcast).
    draft_lengths, tokens_per_cycle : ndarray, shape (options,)
        Each SD option's ``k`` and ``E``.

    Notes
    -----
    The draws are not clipped coefficient by coefficient. One workload cannot split the prefill
    ``c1p`` from the per-step costs, so the fit's covariance is wide and correlated along that
    direction while the sums the model uses, ``C1 = c1p + (g/E)(c1v + k c1d)`` (``C1_D = c1p +
    (g-1) c1_step``; ``C2`` alike), stay well determined. A clip at 0 (the fit's own bound) breaks
    the correlation and biases every draw upward: on a served calibration with ``c1p`` at its bound
    it put a capacity's whole 95% interval (0.53-19.5 req/s) below the estimate (20.3). Keeping
    the draws whose sums are physical is the normal truncated to where the model is defined.
    """
    c1_off, c2_off = model.baseline_demand(drawn)
    ok = np.asarray((c1_off > 0) & (c2_off >= 0))
    for k, tokens in zip(np.atleast_1d(draft_lengths), np.atleast_1d(tokens_per_cycle)):
        c1, c2 = model.demand_from_tokens(drawn, tokens, k)
        ok &= (c1 > 0) & (c2 >= 0)
    return ok


def interval(samples: FloatArray, level: float = LEVEL) -> FloatArray:
    """``[low, high]`` percentiles along axis 0 (``inf`` samples allowed: an unstable upper bound is ``inf``)."""
    tail = (1.0 - level) / 2.0 * 100.0
    values = np.sort(np.asarray(samples, dtype=np.float64), axis=0)
    with np.errstate(invalid="ignore"):  # inf - inf between two unstable draws: the bound is inf, set below
        bounds = np.percentile(values, [tail, 100.0 - tail], axis=0, method="linear")
    # a percentile at or past the first unstable draw is unstable (inf), not nan
    count = values.shape[0]
    unstable_from = np.sum(np.isfinite(values), axis=0)  # index of the first inf in each sorted column
    for row, q in enumerate((tail, 100.0 - tail)):
        position = q / 100.0 * (count - 1)
        bounds[row] = np.where(np.ceil(position) >= unstable_from, np.inf, bounds[row])
    return bounds


@dataclass(frozen=True, slots=True)
class PlanIntervals:
    """95% intervals of the planner's predictions (axis 0: low, high)."""

    baseline_latency_s: FloatArray  # (2, r)
    latency_s: FloatArray  # (2, a, r, k)
    break_even_rate_rps: FloatArray  # (2, a, k); nan where no crossing
    draws: int
    #: The spread between server instances the draws include, percent (:func:`server_speeds`); None: none.
    server_sd_pct: float | None = None

    @property
    def covers(self) -> str:
        return covers(self.server_sd_pct)


def _bent_break_even(draws: list[tuple[Any, ...]]) -> FloatArray:
    """The break-even rates ``(draws, a, k)`` of draws whose load law bends, in one scan where the demands
    change with the rate (a concave law, a prefill queue: :func:`sdplan.latency.knee.rate_dependent`)."""
    if not all(knee.rate_dependent(draw[2]) for draw in draws):  # a compute-bound knee alone: piece by piece
        return np.array([knee.break_even(float(c1_d), float(c2_d), knee_d, c1, c2, knee_sd)[0]
                         for c1_d, c2_d, knee_d, c1, c2, knee_sd in draws])
    c1_d = np.array([float(draw[0]) for draw in draws])[:, None, None]
    c2_d = np.array([float(draw[1]) for draw in draws])[:, None, None]
    c1, c2 = np.stack([draw[3] for draw in draws]), np.stack([draw[4] for draw in draws])
    line = _stacked([draw[2] for draw in draws], (slice(None), None, None))
    options = _stacked([draw[5] for draw in draws], (slice(None), Ellipsis))
    return knee.scanned_break_even(c1_d, c2_d, line, c1, c2, options)[0]


def _stacked(demands: list[knee.KneeDemands], index: tuple[Any, ...]) -> knee.KneeDemands:
    """One :class:`~sdplan.latency.knee.KneeDemands` of the draws' demands along a first axis (draws' prefills
    differ with their ``c2p``), indexed to broadcast with the options ``(draws, a, k)``."""
    def stack(name: str) -> FloatArray:
        stacked: FloatArray = np.stack([np.asarray(getattr(d, name), dtype=np.float64) for d in demands])[index]
        return stacked

    return knee.KneeDemands(c1_above_s=stack("c1_above_s"), c2_above_s=stack("c2_above_s"),
                            knee_batch=stack("knee_batch"), concavity=demands[0].concavity,
                            prefill_s=stack("prefill_s"), prefill_cv=demands[0].prefill_cv)


def plan_intervals(draws: list[Coefficients], alphas: FloatArray, rates: FloatArray,
                   draft_lengths: FloatArray | IntArray,
                   tokens_per_cycle: FloatArray | None = None, server_sd_pct: float | None = None) -> PlanIntervals:
    """Latency and break-even intervals over the grid (dense targets); ``server_sd_pct`` says what spread
    between server instances the ``draws`` include (:func:`coefficient_draws`)."""
    alpha = np.asarray(alphas, dtype=np.float64).reshape(-1)
    rate = np.asarray(rates, dtype=np.float64).reshape(-1)
    ks = np.asarray(draft_lengths, dtype=np.float64).reshape(-1)
    tokens = (expected_tokens_per_cycle(alpha[:, None], ks[None, :]) if tokens_per_cycle is None
              else np.broadcast_to(np.asarray(tokens_per_cycle, dtype=np.float64), (alpha.size, ks.size)))
    base, options, even = [], [], []
    bent: list[tuple[Any, ...]] = []
    for coefficients in draws:
        c1_d, c2_d = model.baseline_demand(coefficients)
        c1, c2 = model.demand_from_tokens(coefficients, tokens, ks[None, :])
        if knee.has_bend(coefficients):  # the load law the plan itself solves (sdplan.latency.latency_grid.knee_grid)
            knee_d = model.baseline_knee(coefficients, c1_d, c2_d)
            knee_sd = model.speculative_knee(coefficients, c1, c2, tokens, ks[None, :])
            base.append(knee.mean_latency(c1_d, c2_d, knee_d, rate))
            options.append(knee.mean_latency(c1[:, None, :], c2[:, None, :],
                                             knee.take(knee_sd, (slice(None), None, slice(None))), rate[None, :, None]))
            bent.append((c1_d, c2_d, knee_d, c1, c2, knee_sd))
            continue
        base.append(model.mean_latency(c1_d, c2_d, rate))
        options.append(model.mean_latency(c1[:, None, :], c2[:, None, :], rate[None, :, None]))
        crossing = model.break_even(float(c1_d), float(c2_d), c1, c2).rate_rps
        even.append(crossing)
    if bent:  # every draw's break-even at once (a concave law's is scanned: sdplan.latency.knee.break_even)
        even = list(_bent_break_even(bent))
    even_samples = np.array(even)
    crossed = np.mean(np.isfinite(even_samples), axis=0) >= 0.5  # a crossing in most draws
    filled = np.where(np.isfinite(even_samples), even_samples, np.inf)
    # among the draws that cross: sort, with the others (inf) at the end, and read the percentiles of the crossing ones
    ordered = np.sort(filled, axis=0)
    counts = np.isfinite(even_samples).sum(axis=0)
    low_index = np.clip(np.floor(0.025 * (counts - 1)).astype(int), 0, None)
    high_index = np.clip(np.ceil(0.975 * (counts - 1)).astype(int), 0, None)
    low = np.take_along_axis(ordered, low_index[None], axis=0)[0]
    high = np.take_along_axis(ordered, high_index[None], axis=0)[0]
    even_interval = np.where(crossed[None], np.stack([low, high]), np.nan)
    return PlanIntervals(baseline_latency_s=interval(np.array(base)), latency_s=interval(np.array(options)),
                         break_even_rate_rps=even_interval, draws=len(draws), server_sd_pct=server_sd_pct)


def pessimistic_verdicts(report: Any, slos: list[Any], draws: list[Coefficients],
                         check: Any) -> tuple[Any, dict[str, Any]]:
    """Re-check ``slos`` at the pessimistic end of each metric's 95% interval.

    ``check(coefficients)`` returns the :class:`sdplan.planning.check.CheckReport` of one
    coefficient draw for the option ``report`` chose. An upper-bound SLO
    (``e2e:mean<=``) is checked at the 97.5th percentile of its prediction, a
    lower-bound one at the 2.5th. Returns the new report and, per SLO text,
    its interval ``(low, high)``.
    """
    values: dict[str, list[float]] = {slo.text: [] for slo in slos}
    for coefficients in draws:
        drawn = check(coefficients)
        stable = drawn.point.utilisation < 1.0
        for slo in slos:
            value = drawn.point.value(slo.metric) if stable else (math.inf if slo.upper_bound else 0.0)
            values[slo.text].append(float(value))
    intervals, verdicts = {}, []
    for slo in slos:
        low, high = (float(v) for v in interval(np.array(values[slo.text])))
        intervals[slo.text] = (low, high)
        worst = high if slo.upper_bound else low
        passed = math.isfinite(worst) and slo.holds(worst) if slo.upper_bound else slo.holds(worst)
        verdicts.append(Verdict(slo=slo, predicted=worst, passed=bool(passed), margin=slo.margin(worst)))
    return replace(report, verdicts=tuple(verdicts)), intervals


def capacity_intervals(draws: list[Coefficients], capacity_of: Any) -> FloatArray:
    """``(2, options)`` interval of the capacity (req/s per replica) over coefficient draws."""
    return interval(np.array([capacity_of(coefficients).max_rate_rps for coefficients in draws]))
