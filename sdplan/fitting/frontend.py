"""The serving frontend's floor under ``C2``, as a pooled fit finds it in measured runs.

A streamed answer arrives in one chunk per step that emits tokens (``g`` without SD, ``g/E`` with it), and
the serving frontend (vLLM's API server and the engine core's output handling) works on every chunk beside
the model's steps. Where the steps are cheap per chunk (short prompts, long answers, no SD) that work, not
the steps, sets how many requests a server sustains, and the model's ``C2`` is floored at the answer's
chunks times the frontend's seconds per chunk (:func:`sdplan.latency.model.frontend_floor`,
``docs/model.md#frontend-floor``). On a 2-core CPU it set the plateau of no SD at 16/192 tokens: 9.5 req/s
where the fitted steps allow 12.2 (benchmarks/RESULTS-accuracy-served-2026-11.md). A calibration's decode
probe at the sweep's top level measures it (:data:`sdplan.measure.levels.PROBES`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from sdplan.fitting.fit_result import PointResidual, PooledFit
from sdplan.fitting.runmodel import fitted_load, r2, run_demand, run_tokens_per_cycle
from sdplan.fitting.validation import predict_ttft
from sdplan.latency import model

if TYPE_CHECKING:
    from sdplan.runs import BenchmarkRun

#: A floor is kept only when it lowers the fit's E2E MAPE by at least this many points: a floor that one
#: run's noise sets moves that run alone (one run of 30 that is 3% off: a tenth of a point), while a
#: measured one moves every run of the workloads it binds.
FRONTEND_MIN_GAIN_PCT = 0.25
#: The floor binds at a run where it lengthens the predicted latency by more than this share.
FLOOR_BINDS = 0.01


@dataclass(frozen=True, slots=True)
class FloorParts:
    """Per run: measured ``L``, fitted ``C1`` and ``C2`` without a floor, the load ``h(f B)`` (``f B`` on a
    straight load law), streamed chunks."""

    latency: Any
    c1: Any
    c2: Any
    load: Any
    chunks: Any

    def predicted(self, per_chunk_s: float) -> Any:
        """``L = C1 + f B max(C2, n phi)`` of every run (s)."""
        return self.c1 + self.load * np.maximum(self.c2, self.chunks * per_chunk_s)

    def binding(self, per_chunk_s: float) -> Any:
        """Where the floor lengthens the prediction by more than :data:`FLOOR_BINDS`: the runs that measured
        the frontend (a run of one client never binds: it has no others in flight)."""
        return self.predicted(per_chunk_s) > (1.0 + FLOOR_BINDS) * self.predicted(0.0)

    def mape_pct(self, per_chunk_s: float) -> float:
        return float(np.mean(np.abs(self.predicted(per_chunk_s) - self.latency) / self.latency) * 100.0)


def floor_parts(fit: PooledFit, runs: list[BenchmarkRun]) -> FloorParts:
    """The runs' measured latency, and ``C1``, ``C2``, load and chunks under ``fit``'s coefficients."""
    demands = np.array([run_demand(fit.coefficients_at(r.prompt_tokens, r.output_tokens), r) for r in runs])
    closed = np.array([r.concurrency is not None for r in runs])
    return FloorParts(latency=np.array([r.mean_e2e_latency_s for r in runs]), c1=demands[:, 0], c2=demands[:, 1],
                      load=model.concave_load(np.array([fitted_load(r) for r in runs])
                                              * np.where(closed, fit.closed_loop_factor, 1.0),
                                              fit.load_concavity_sqrt_requests),
                      chunks=np.array([r.output_tokens / run_tokens_per_cycle(r) for r in runs]))


def floor_per_chunk(parts: FloorParts, proposers: Any) -> float:
    """The frontend's seconds per streamed chunk the runs show (0: none).

    Each closed-loop run of streamed answers (``proposers``) that took longer than its ``C1 + f B C2``
    proposes the per-chunk cost that explains it, ``phi = (L - C1) / (f B n)``; the proposal with the
    lowest E2E MAPE over every run is kept if it gains :data:`FRONTEND_MIN_GAIN_PCT` on no floor (the
    smallest on a tie).
    """
    usable = proposers & (parts.load > 0) & (parts.chunks > 0) & (parts.latency > parts.c1)
    denominator = np.where(usable, parts.load * parts.chunks, 1.0)
    implied = np.where(usable, (parts.latency - parts.c1) / denominator, 0.0)
    best_phi, best = 0.0, math.inf
    for phi in sorted(float(v) for v in implied[usable & (implied * parts.chunks > parts.c2)]):
        value = parts.mape_pct(phi)
        if value < best:
            best_phi, best = phi, value
    return best_phi if best < parts.mape_pct(0.0) - FRONTEND_MIN_GAIN_PCT else 0.0


def with_frontend_floor(fit: PooledFit, runs: list[BenchmarkRun],
                        refit: Callable[[list[BenchmarkRun]], PooledFit | None]) -> PooledFit:
    """``fit`` with the floor of ``C2`` at the frontend's work per streamed chunk, where ``runs`` show one.

    The floor is chosen with ``fit``'s coefficients fixed (:func:`floor_per_chunk`). The runs it then binds
    measured the frontend, not the steps: ``refit(rest)`` fits the coefficients again without them (None:
    too few runs left) and the floor is chosen again over every run. The result's quality figures and
    residuals are over every run, with the floor; a run left out of the refit has weight 0.
    """
    # only closed loops whose answers were streamed measure the frontend's work per chunk
    proposers = np.array([r.concurrency is not None and r.streamed for r in runs])
    parts = floor_parts(fit, runs)
    phi = floor_per_chunk(parts, proposers)
    if phi == 0.0:
        return fit
    fitted = np.ones(len(runs), dtype=bool)  # the runs the coefficients were fitted to
    rest = ~parts.binding(phi)
    again = refit([run for run, kept in zip(runs, rest) if kept])
    if again is not None:
        again_parts = floor_parts(again, runs)
        again_phi = floor_per_chunk(again_parts, proposers)
        if again_phi > 0.0:
            fit, parts, phi, fitted = again, again_parts, again_phi, rest
    floored = replace(fit, frontend_chunk_s=phi)
    prediction = parts.predicted(phi)
    residuals = _residuals(floored, runs, fitted, prediction)
    note = (f"C2 at least {phi * 1e3:.3g} ms per streamed chunk (the serving frontend's work), binding at "
            f"{int(parts.binding(phi).sum())} of {len(runs)} runs (coefficients fitted without them)")
    return replace(floored, mape_pct=parts.mape_pct(phi), r2=float(r2(list(parts.latency), list(prediction))),
                   rmse_s=float(np.sqrt(np.mean((prediction - parts.latency) ** 2))), points=len(runs),
                   residuals=residuals, notes=(*fit.notes, note))


def _residuals(fit: PooledFit, runs: list[BenchmarkRun], fitted: Any, prediction: Any) -> tuple[PointResidual, ...]:
    """Every run's residual under the floored fit: the fit's own for the runs it was ``fitted`` to (in
    order), else (a run left out of the refit) one with its TTFT from the fit's terms and weight 0."""
    own = iter(fit.residuals)
    residuals = []
    for run, was_fitted, value in zip(runs, fitted, prediction):
        if was_fitted:
            residuals.append(replace(next(own), predicted_s=float(value)))
            continue
        ttft = predict_ttft(fit.coefficients_at(run.prompt_tokens, run.output_tokens), run, float(value))
        residuals.append(PointResidual.of(run, float(value), ttft, 0.0))
    return tuple(residuals)
