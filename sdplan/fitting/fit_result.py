"""What a pooled fit returns: coefficients, their uncertainty, the TTFT terms and each run's residual.

:class:`PooledFit` is the result of :func:`sdplan.fitting.fit.fit_pooled`; its
``*_document`` methods write the calibration tables it fills
(``sdplan-calibration(5)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sdplan.fitting.runmodel import PARAMETERS, coefficients_from_vector, coefficients_table
from sdplan.latency.coefficients import (
    DEFAULT_TTFT_LOAD_STEPS,
    DEFAULT_TTFT_WAIT_STEPS,
    SPECULATIVE_PARAMETERS,
    Coefficients,
)

if TYPE_CHECKING:
    from sdplan.runs import BenchmarkRun


def weakly_determined(values: dict[str, float], stderr: dict[str, float], identified: dict[str, bool]) -> list[str]:
    """The coefficients inside the design's row space whose standard error exceeds their value
    (:attr:`PooledFit.stderr_above_value`), in :data:`PARAMETERS` order."""
    return [name for name in PARAMETERS if identified[name] and stderr[name] > abs(values[name])]




@dataclass(frozen=True, slots=True)
class PointResidual:
    """One run's measured and fitted mean latency (and TTFT), with its robust weight."""

    source: str
    load_level: str
    draft_length: int
    measured_s: float
    predicted_s: float
    measured_ttft_s: float | None
    predicted_ttft_s: float | None
    weight: float

    @classmethod
    def of(cls, run: BenchmarkRun, predicted_s: float, predicted_ttft_s: float, weight: float) -> PointResidual:
        """A run's residual: its measured mean latency and TTFT (None when not recorded) beside the fit's."""
        return cls(source=run.source, load_level=run.load_level, draft_length=run.draft_length,
                   measured_s=run.mean_e2e_latency_s, predicted_s=predicted_s,
                   measured_ttft_s=run.mean_ttft_s if run.mean_ttft_s and run.mean_ttft_s > 0 else None,
                   predicted_ttft_s=predicted_ttft_s, weight=weight)

    @property
    def error_pct(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s * 100.0

    @property
    def ttft_error_pct(self) -> float | None:
        if self.measured_ttft_s is None or self.predicted_ttft_s is None or self.measured_ttft_s <= 0:
            return None
        return (self.predicted_ttft_s - self.measured_ttft_s) / self.measured_ttft_s * 100.0


@dataclass(frozen=True, slots=True)
class PooledFit:
    """The pooled direct-form fit with its uncertainty.

    Attributes
    ----------
    values, stderr : dict
        Coefficients at the reference workload (seconds) and their standard errors.
    covariance : list of list of float
        Covariance of the eight coefficients (s^2), in :data:`PARAMETERS` order.
    identified : dict
        Whether the data determine each coefficient (:func:`sdplan.fitting.regression.identified_parameters`).
    ttft_wait_steps, ttft_load_steps : float
        The TTFT weights (fitted when TTFT was measured, else the defaults).
    """

    values: dict[str, float]
    stderr: dict[str, float]
    covariance: list[list[float]]
    identified: dict[str, bool]
    reference_prompt_tokens: int
    reference_output_tokens: int
    r2: float
    rmse_s: float
    mape_pct: float
    points: int
    ttft_wait_steps: float = DEFAULT_TTFT_WAIT_STEPS
    ttft_load_steps: float = DEFAULT_TTFT_LOAD_STEPS
    ttft_offset_s: float = 0.0
    ttft_fitted: bool = False
    ttft_mape_pct: float | None = None
    ttft_closed_load_steps: float | None = None
    ttft_prefill_per_token_s: float | None = None
    closed_loop_factor: float = 1.0
    closed_loop_factor_fitted: bool = False
    #: The share of ``c2_step`` that does not grow with the context (``c2_step_fixed_s``;
    #: see :func:`sdplan.fitting.fit.fit_pooled`).
    fixed_step_share: float = 0.0
    #: ``psi`` of the concave load law the fit assumed (:data:`sdplan.fitting.fit.LOAD_CONCAVITY`), 0: none.
    load_concavity_sqrt_requests: float = 0.0
    #: The spread between repeats of one point (:attr:`sdplan.fitting.validation.RepeatSpread.sd_pct`), None
    #: without repeats: on fresh servers, how far one server instance's speed lies from another's.
    repeat_sd_pct: float | None = None
    #: The standard deviation of :attr:`fixed_step_share` over its profile, percentage points
    #: (:func:`sdplan.fitting.step_share.profile_mean`), None where it was not profiled.
    step_share_sd_pct: float | None = None
    residuals: tuple[PointResidual, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def reference(self) -> tuple[int, int]:
        return (self.reference_prompt_tokens, self.reference_output_tokens)

    @property
    def stderr_above_value(self) -> list[str]:
        """The coefficients the runs let move by more than their own value: a standard error above the
        fitted value (one at its bound of 0 with any error).

        The design can have full rank while a direction of it is all but flat: runs at one workload fix the
        sums ``C1 = c1p + (g - 1) c1_step`` and ``C2 = c2p + (g - 1) c2_step`` but hardly how each splits,
        and the bounded solver then puts ``c1p`` at 1e-21 s with a standard error of 0.17 s
        (tests/data/served-passes-cpu). Such a value is no measurement, however well the sums fit.
        """
        return weakly_determined(self.values, self.stderr, self.identified)

    @property
    def not_identified(self) -> list[str]:
        """The coefficients the runs do not determine: outside the design's row space
        (:func:`sdplan.fitting.regression.identified_parameters`) or with a standard error above their value
        (:attr:`stderr_above_value`)."""
        weak = set(self.stderr_above_value)
        return [name for name in PARAMETERS if not self.identified[name] or name in weak]

    @property
    def speculative_identified(self) -> bool:
        """Whether any SD coefficient is determined (False for a no-SD-only fit)."""
        return any(self.identified[name] for name in SPECULATIVE_PARAMETERS)

    def coefficients_at(self, prompt_tokens: float, output_tokens: float) -> Coefficients:
        """Direct-form coefficients scaled to a workload (the calibration file's rules)."""
        coefficients = coefficients_from_vector([self.values[name] for name in PARAMETERS], self.reference,
                                                prompt_tokens, output_tokens,
                                                (self.ttft_wait_steps, self.ttft_load_steps), self.fixed_step_share)
        return replace(coefficients, closed_loop_factor=self.closed_loop_factor, ttft_offset_s=self.ttft_offset_s,
                       ttft_prefill_s=(self.ttft_prefill_per_token_s or 0.0) * prompt_tokens,
                       load_concavity_sqrt_requests=self.load_concavity_sqrt_requests)

    def coefficients_document(self) -> dict[str, Any]:
        """The ``[coefficients]`` table of a calibration."""
        table = coefficients_table(self.values, self.fixed_step_share)
        if self.load_concavity_sqrt_requests > 0:
            table["load_concavity_sqrt_requests"] = self.load_concavity_sqrt_requests
        return table

    def closed_loop_document(self) -> dict[str, Any]:
        """The ``[closed_loop]`` table: how a closed loop of N clients compares with an open loop."""
        return {"factor": round(self.closed_loop_factor, 6),
                "source": "fitted from closed- and open-loop runs together" if self.closed_loop_factor_fitted
                else "default 1 (no open- and closed-loop runs to compare)"}

    def ttft_document(self) -> dict[str, Any]:
        """The ``[ttft]`` table of a calibration."""
        return {"wait_steps": round(self.ttft_wait_steps, 6), "load_steps": round(self.ttft_load_steps, 6),
                "offset_s": float(f"{self.ttft_offset_s:.6g}"),
                **({"prefill_per_prompt_token_s": float(f"{self.ttft_prefill_per_token_s:.6g}")}
                   if self.ttft_prefill_per_token_s is not None else {}),
                **({"closed_loop_load_steps": round(self.ttft_closed_load_steps, 6)}
                   if self.ttft_closed_load_steps is not None else {}),
                "source": ("fitted to measured TTFT" + (f" (MAPE {self.ttft_mape_pct:.1f}%)"
                                                       if self.ttft_mape_pct is not None else ""))
                if self.ttft_fitted else "default: half a step of wait, then one mixed step (not measured)"}

    def uncertainty_document(self) -> dict[str, Any]:
        """The ``[uncertainty]`` table: parameters, covariance, what is not identified, the repeats' spread."""
        return {
            "parameters": list(PARAMETERS),
            "covariance_s2": [[float(f"{value:.6g}") for value in row] for row in self.covariance],
            "not_identified": self.not_identified,
            "stderr_above_value": self.stderr_above_value,
            "method": "weighted least squares on relative errors, Huber-reweighted; HC1 sandwich covariance",
            **({"repeat_sd_pct": round(self.repeat_sd_pct, 2)} if self.repeat_sd_pct is not None else {}),
            **({"step_share_sd_pct": round(self.step_share_sd_pct, 2)}
               if self.step_share_sd_pct is not None else {}),
        }
