"""The model of one measured run, shared by the fit and the validation.

A run is predicted with the model's own relation, ``L = C1 + B C2`` (Kong et
al. eq. 1), at its configuration (draft length, acceptance and its measured
draft coverage) and workload (prompt and output lengths), with ``B`` the load
it was fitted at (:func:`fitted_load`). ``C1`` and ``C2`` are linear in the
eight direct-form coefficients of :data:`PARAMETERS`, so the rows of a fit's
design are the model evaluated on unit coefficient vectors
(:func:`design_rows`). Runs of one configuration are grouped by
:func:`configuration_groups`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from sdplan.calibration import scale_direct
from sdplan.inputs.acceptance import expected_tokens_per_cycle, with_coverage
from sdplan.latency import knee, model
from sdplan.latency.coefficients import DEFAULT_TTFT_LOAD_STEPS, DEFAULT_TTFT_WAIT_STEPS

if TYPE_CHECKING:
    from sdplan.latency.coefficients import Coefficients
    from sdplan.runs import BenchmarkRun

#: Direct-form coefficients fitted by the pooled fit, in order.
PARAMETERS = ("c1p_s", "c2p_s", "baseline_c1_step_s", "baseline_c2_step_s", "c1v_s", "c2v_s", "c1d_s", "c2d_s")
#: Acceptance values closer than this (per-token alpha) are one configuration.
ALPHA_GROUP_TOLERANCE = 0.03
#: Mean lengths within this factor of each other are one workload (random datasets vary run to run).
LENGTH_GROUP_TOLERANCE = 1.1


#: Where each fitted coefficient lives in a calibration's ``[coefficients]`` table.
COEFFICIENT_PATHS = {"c1p_s": ("c1p_s",), "c2p_s": ("c2p_s",), "baseline_c1_step_s": ("baseline", "c1_step_s"),
                     "baseline_c2_step_s": ("baseline", "c2_step_s"), "c1v_s": ("speculative", "c1v_s"),
                     "c2v_s": ("speculative", "c2v_s"), "c1d_s": ("speculative", "c1d_s"),
                     "c2d_s": ("speculative", "c2d_s")}


def coefficients_table(values: dict[str, float], fixed_step_share: float = 0.0) -> dict[str, Any]:
    """The ``[coefficients]`` table (direct form, proportional scaling) of named coefficient values.

    ``fixed_step_share``: the share of ``c2_step`` that does not grow with the
    context (``c2_step_fixed_s``, :func:`sdplan.calibration.scale_direct`); 0
    writes no such key.
    """
    table: dict[str, Any] = {"scaling": "proportional"}
    for name, path in COEFFICIENT_PATHS.items():
        node = table
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = float(values[name])
    if fixed_step_share:
        table["baseline"]["c2_step_fixed_s"] = float(fixed_step_share * values["baseline_c2_step_s"])
    return table


def fixed_step_share(table: dict[str, Any]) -> float:
    """The share of ``c2_step`` a ``[coefficients]`` table keeps fixed in the context (0 without the key)."""
    base = table.get("baseline") or {}
    step = float(base.get("c2_step_s", 0.0))
    return min(float(base.get("c2_step_fixed_s", 0.0)) / step, 1.0) if step > 0 else 0.0


def values_from_table(table: dict[str, Any]) -> dict[str, float]:
    """Named coefficient values of a ``[coefficients]`` table (the inverse of :func:`coefficients_table`)."""
    values = {}
    for name, path in COEFFICIENT_PATHS.items():
        node: Any = table
        for key in path:
            node = node[key]
        values[name] = float(node)
    return values


def coefficients_from_vector(theta: Any, reference: tuple[int, int], prompt_tokens: float, output_tokens: float,
                             ttft: tuple[float, float] = (DEFAULT_TTFT_WAIT_STEPS, DEFAULT_TTFT_LOAD_STEPS),
                             fixed_step_share: float = 0.0) -> Coefficients:
    """Direct-form coefficients ``theta`` (at ``reference``) scaled to a workload.

    Scaling is the calibration file's own (``sdplan.calibration``), so a fitted
    calibration predicts exactly what the fit assumed. With a given
    ``fixed_step_share`` the map stays linear in ``theta``: ``c2_step(s) =
    c2_step (share + (1 - share) s/s_ref)``.
    """

    document = {
        "reference_workload": {"prompt_tokens": reference[0], "output_tokens": reference[1]},
        "coefficients": coefficients_table(dict(zip(PARAMETERS, theta)), fixed_step_share),
    }
    coefficients = scale_direct(document, prompt_tokens, output_tokens)
    return replace(coefficients, ttft_wait_steps=ttft[0], ttft_load_steps=ttft[1])


def run_demand(coefficients: Coefficients, run: BenchmarkRun) -> tuple[float, float]:
    """``(C1, C2)`` of a run's configuration: the baseline's without SD, else at the run's tokens per cycle."""
    if run.draft_length == 0:
        return model.baseline_demand(coefficients)
    c1, c2 = model.demand_from_tokens(run_coefficients(coefficients, run), np.asarray(run_tokens_per_cycle(run)),
                                      run.draft_length)
    return float(c1), float(c2)


def run_coefficients(coefficients: Coefficients, run: BenchmarkRun) -> Coefficients:
    """The coefficients with the run's measured draft coverage: its cycles draft ``c k`` tokens
    (sdplan.latency.model)."""
    coverage = run.draft_coverage if run.draft_coverage is not None and run.draft_length else 1.0
    return coefficients if coverage == coefficients.draft_coverage else replace(coefficients, draft_coverage=coverage)


def run_tokens_per_cycle(run: BenchmarkRun) -> float:
    """Tokens per decode step of a run: ``E(alpha, k)``, with its measured draft coverage applied."""
    if run.draft_length == 0:
        return 1.0
    tokens = expected_tokens_per_cycle(run.alpha if run.alpha is not None else 0.0, run.draft_length)
    return float(with_coverage(tokens, run.draft_coverage if run.draft_coverage is not None else 1.0))


def ttft_parts(coefficients: Coefficients, run: BenchmarkRun) -> tuple[float, float, float]:
    """(c1p, tau1, C2/steps) of a run: TTFT = c1p + w_wait tau1 + w_load B (C2/steps), the linear parts of
    :func:`run_ttft` that the fit's TTFT rows are built from, at the same coverage and tokens per cycle."""
    coefficients = run_coefficients(coefficients, run)
    tau1, _ = model.step_costs(coefficients, run.draft_length)
    per_other = model.ttft_load_cost(coefficients, run.draft_length, run_tokens_per_cycle(run))
    return coefficients.c1p_s, float(tau1), float(per_other)


def run_ttft(coefficients: Coefficients, run: BenchmarkRun, others: float, alone: bool = False) -> float:
    """Model mean TTFT (s) of a run with ``others`` in flight: :func:`sdplan.latency.model.time_to_first_token`
    at the run's configuration, as :func:`run_demand` prices its E2E and :func:`ttft_parts` its fitted rows:
    its measured draft coverage (:func:`run_coefficients`: a cycle drafts ``c k`` tokens,
    docs/model.md#draft-coverage) and its tokens per cycle (:func:`run_tokens_per_cycle`); an open loop's
    at its arrival rate, whose prefill queue it waits for (:func:`open_loop_rate`), unless ``alone``."""
    return float(model.time_to_first_token(run_coefficients(coefficients, run), run.draft_length, others,
                                           run_tokens_per_cycle(run), 0.0 if alone else open_loop_rate(run)))


def open_loop_rate(run: BenchmarkRun) -> float:
    """The Poisson arrival rate whose prefill queue a run's requests wait for (req/s; 0 for a closed loop, whose
    clients send one request at a time: ``docs/model.md#prefills-queued-ahead``)."""
    return run.arrival_rate_rps if run.concurrency is None else 0.0


def fitted_load(run: BenchmarkRun) -> float:
    """The ``B`` a run is fitted with: ``lambda L`` at the arrival rate for open loops (the planner's
    own relation, Kong et al. eq. 1), the measured others in flight for closed loops (``N - 1``)."""
    if run.concurrency is None:
        return run.arrival_rate_rps * run.mean_e2e_latency_s
    return run.mean_others


def fitted_first_token_load(run: BenchmarkRun) -> float:
    if run.concurrency is None:
        return run.arrival_rate_rps * run.mean_e2e_latency_s
    return run.mean_others_at_first_token


@dataclass(frozen=True, slots=True)
class DesignRows:
    """The fit's linear structure, per run and unit coefficient (rows x 8).

    ``L = (c1 + h(f B) c2) @ theta`` and ``TTFT = (c1p + w_wait tau1 + w_load f B_t tau2) @ theta``
    with ``f`` the closed-loop load factor on closed-loop rows and 1 on open-loop rows, and ``h`` the
    concave load law of ``concavity`` (:func:`sdplan.latency.model.concave_load`; ``h(B) = B`` at 0).
    Both exclude an open loop's wait for the prefills queued ahead, ``W(c2p @ theta, lambda)``
    (:meth:`wait`), which is not linear in ``theta``.
    """

    c1: Any
    c2: Any
    load: Any
    closed: Any
    c1p: Any
    tau1: Any
    tau2: Any
    load_first: Any
    concavity: float = 0.0
    #: Each run's ``c2p`` per unit coefficient, and the arrival rate whose prefill queue it waits for (0: closed).
    c2p: Any = None
    rate: Any = None

    def times(self, matrix: Any) -> DesignRows:
        """The rows in other coefficients ``theta'`` with ``theta = matrix @ theta'`` (each row times ``matrix``)."""
        return replace(self, c1=self.c1 @ matrix, c2=self.c2 @ matrix, c1p=self.c1p @ matrix,
                        tau1=self.tau1 @ matrix, tau2=self.tau2 @ matrix,
                        c2p=None if self.c2p is None else self.c2p @ matrix)

    def wait(self, theta: Any) -> Any:
        """Each run's wait for the prefills queued ahead at ``theta`` (s; :func:`sdplan.latency.knee.prefill_wait_s`,
        one prompt length a run): 0 for closed loops, and where ``theta``'s prefill queue would not be stable at the
        run's rate (the run's measured latency then says ``c2p`` is lower)."""
        if self.c2p is None:
            return np.zeros(len(self.closed))
        wait = knee.prefill_wait_s(np.maximum(self.c2p @ theta, 0.0), 0.0, self.rate)
        return np.where(np.isfinite(wait), wait, 0.0)

    def factor(self, closed_loop_factor: float) -> Any:
        return np.where(self.closed, closed_loop_factor, 1.0)

    def loaded(self, closed_loop_factor: float = 1.0) -> Any:
        """``h(f B)`` of every run: what its others in flight cost in units of ``C2``."""
        return model.concave_load(self.factor(closed_loop_factor) * self.load, self.concavity)

    def loaded_slope(self, closed_loop_factor: float = 1.0) -> Any:
        """``d h(f B) / d f``: ``B h'(f B)`` on closed-loop rows, 0 on open-loop rows."""
        slope = model.concave_load_slope(self.factor(closed_loop_factor) * self.load, self.concavity)
        return np.where(self.closed, self.load * slope, 0.0)

    def e2e(self, closed_loop_factor: float = 1.0) -> Any:
        if self.concavity == 0.0:
            return self.c1 + (self.factor(closed_loop_factor) * self.load)[:, None] * self.c2
        return self.c1 + self.loaded(closed_loop_factor)[:, None] * self.c2


def verify_floor(runs: list[BenchmarkRun]) -> Any:
    """The map ``theta = T theta'`` that keeps ``c2v >= c2_step`` in a fit with ``theta' >= 0``.

    Notes
    -----
    In the per-step form (``docs/model.md#per-step-form``) ``c2v = T.seq +
    T.tok + s T.ctx + o_seq`` and ``c2_step = T.seq + T.tok + s T.ctx``: an SD
    cycle's verify pass does at least the work of a plain decode step for each
    other sequence (the same weights and KV context, with more query tokens),
    so ``c2v = c2_step + o_seq`` with ``o_seq >= 0``. The fit solves for
    ``o_seq`` in the place of ``c2v``. Without the floor, SD runs at several
    prompt lengths moved all of a CPU calibration's ``c2v`` into ``c2d``
    (0 and 0.48 ms; c2_step 0.50 ms), which does not grow with the context:
    at 4x the context SD's latency was predicted to grow 4.0x where it was
    measured growing 6.6-6.8x (benchmarks/RESULTS-accuracy-served-2026-11.md).

    The identity where the runs lack SD or no-SD: then one side alone
    determines its coefficients.
    """
    matrix = np.eye(len(PARAMETERS))
    kinds = {run.draft_length > 0 for run in runs}
    if kinds == {True, False}:
        matrix[PARAMETERS.index("c2v_s"), PARAMETERS.index("baseline_c2_step_s")] = 1.0
    return matrix


def floor_notes(floor: Any, solved: Any) -> tuple[str, ...]:
    """The fit's note where :func:`verify_floor` held ``c2v`` at ``c2_step`` (``solved``: ``theta'``)."""
    step, verify = PARAMETERS.index("baseline_c2_step_s"), PARAMETERS.index("c2v_s")
    if not floor[verify, step] or solved[verify] > 1e-9 * max(solved[step], 1e-300):
        return ()
    return (f"c2v held at c2_step ({solved[step]:.3g} s): the runs put less on each other sequence's verify "
            "pass than on its plain decode step, which it cannot cost (docs/model.md#fitting)",)


def design_rows(runs: list[BenchmarkRun], reference: tuple[int, int], fixed_step_share: float = 0.0,
                concavity: float = 0.0) -> DesignRows:
    """The rows of ``L`` and of TTFT, linear in the eight coefficients.

    Built by evaluating the model on unit coefficient vectors, so the rows are
    the model's own equations whatever its details (eq. 3, the baseline's
    decode steps, the length scaling): ``C1(theta) = sum_j theta_j C1(e_j)``.
    """
    shape = (len(runs), len(PARAMETERS))
    c1, c2, c1p, tau1, tau2, c2p = (np.zeros(shape) for _ in range(6))
    for j in range(len(PARAMETERS)):
        unit = np.zeros(len(PARAMETERS))
        unit[j] = 1.0
        for i, run in enumerate(runs):
            coefficients = coefficients_from_vector(unit, reference, run.prompt_tokens, run.output_tokens,
                                                    fixed_step_share=fixed_step_share)
            c1[i, j], c2[i, j] = run_demand(coefficients, run)
            c1p[i, j], tau1[i, j], tau2[i, j] = ttft_parts(coefficients, run)
            c2p[i, j] = coefficients.c2p_s
    return DesignRows(c1=c1, c2=c2, load=np.array([fitted_load(r) for r in runs]),
                      closed=np.array([r.concurrency is not None for r in runs]), c1p=c1p, tau1=tau1, tau2=tau2,
                      load_first=np.array([fitted_first_token_load(r) for r in runs]), concavity=concavity,
                      c2p=c2p, rate=np.array([open_loop_rate(r) for r in runs]))


def r2(measured: list[float], predicted: list[float]) -> float:
    """Coefficient of determination, ``1 - sum (m - p)^2 / sum (m - mean m)^2`` (1 or 0 when ``m`` is constant).

    Computed on values divided by the largest finite one (R² does not change with the unit), so that
    latencies near the float range (1e305 s in a damaged file) do not overflow the squares.
    """
    scale = max((abs(v) for v in (*measured, *predicted) if math.isfinite(v)), default=0.0) or 1.0
    measured = [m / scale for m in measured]
    predicted = [p / scale for p in predicted]
    mean = sum(measured) / len(measured)
    total = sum((m - mean) ** 2 for m in measured)
    residual = sum((m - p) ** 2 for m, p in zip(measured, predicted))
    return 1.0 - residual / total if total > 0 else (1.0 if residual == 0 else 0.0)


def length_groups(runs: list[BenchmarkRun]) -> list[list[BenchmarkRun]]:
    """Runs grouped by draft length and mean lengths within :data:`LENGTH_GROUP_TOLERANCE`.

    ``vllm bench serve`` draws random lengths per request, so two runs of one
    workload differ in their mean lengths by a token or two: they are one workload.
    """
    ordered = sorted(runs, key=lambda r: (r.draft_length, r.prompt_tokens, r.output_tokens, r.source))
    groups: list[list[BenchmarkRun]] = []
    for run in ordered:
        if groups:
            first = groups[-1][0]
            if (run.draft_length == first.draft_length
                    and run.prompt_tokens <= first.prompt_tokens * LENGTH_GROUP_TOLERANCE
                    and first.output_tokens / LENGTH_GROUP_TOLERANCE <= run.output_tokens
                    <= first.output_tokens * LENGTH_GROUP_TOLERANCE):
                groups[-1].append(run)
                continue
        groups.append([run])
    return groups


def configuration_groups(runs: list[BenchmarkRun]) -> list[list[BenchmarkRun]]:
    """Runs grouped by (draft length, lengths within 10%, acceptance within :data:`ALPHA_GROUP_TOLERANCE`).

    Measured acceptance varies from run to run (0.740-0.758 for one
    configuration is typical); values are clustered, not compared exactly.
    """
    groups = []
    for bucket in length_groups(runs):
        members = sorted(bucket, key=lambda r: r.alpha if r.alpha is not None else -1.0)
        current: list[BenchmarkRun] = []
        for run in members:
            if current and run.alpha is not None and current[0].alpha is not None \
                    and run.alpha - current[0].alpha > ALPHA_GROUP_TOLERANCE:
                groups.append(current)
                current = []
            current.append(run)
        if current:
            groups.append(current)
    return groups
