"""Calibration files: reading, checking, and the queries the planner asks of them.

A calibration holds the cost coefficients of one (hardware, target model,
draft model) pair, with its provenance. Two forms are accepted (exactly one
per file), both documented in ``sdplan-calibration(5)``:

``[coefficients]`` (direct form)
    Kong et al.'s six coefficients plus the baseline decode step, valid at
    ``[reference_workload]``; scaled to other lengths by proportional rules
    (:func:`~sdplan.calibration.scaling.direct_coefficients_at`).
``[step_model]`` (per-step form)
    Linear step-time models of the target, the draft and prefill
    (``docs/model.md#per-step-form``), from which the coefficients follow at any
    prompt/output length (:func:`~sdplan.calibration.scaling.coefficients_from_steps`).

The package reads a file in three steps, each a module: the declarative
schema (:mod:`~sdplan.calibration.schema`), the rules beyond it
(:mod:`~sdplan.calibration.checks`), and the typed records every query reads
(:mod:`~sdplan.calibration.records`). So a file that loads is consistent, and
no query fails on it later. :mod:`~sdplan.calibration.scaling` holds the
coefficient maths; this module the :class:`Calibration` and where files come
from (a path, a shipped name, or the default).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sdplan.calibration.checks import MAX_COST_S, MIN_STEP_S, check_document, check_plausible
from sdplan.calibration.records import (
    CalibrationAcceptance,
    CalibrationRecords,
    Derivation,
    DirectCoefficients,
    read_records,
)
from sdplan.calibration.scaling import costs_at, mean_context, scale_direct
from sdplan.calibration.schema import CALIBRATION_SCHEMA, METHODS, SCHEMA_VERSION
from sdplan.errors import InputFileError
from sdplan.inputs.serving import assumed_overheads_warning
from sdplan.latency.coefficients import Coefficients
from sdplan.latency.moe import MoESpec
from sdplan.schema import read_toml

__all__ = [
    "CALIBRATION_SCHEMA", "DEFAULT_CALIBRATION", "MAX_COST_S", "METHODS", "MIN_STEP_S", "SCHEMA_VERSION",
    "Calibration", "CalibrationAcceptance", "check_plausible", "load_calibration", "mean_context",
    "parse_calibration", "resolve_calibration", "scale_direct", "shipped_calibrations", "shipped_directory",
]

#: Shipped calibration used when none is given.
DEFAULT_CALIBRATION = "h100-sxm_llama-3.1-8b_llama-3.2-1b_derived"


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """A validated calibration file.

    Attributes
    ----------
    document : dict
        The validated TOML document, as parsed: for ``show`` and the writers, which print the
        file's own tables.
    path : str
        Where it was read from (or ``<name>`` for an in-memory one).
    records : CalibrationRecords
        The same file, typed (:mod:`sdplan.calibration.records`); every query below reads these.
    """

    document: dict[str, Any]
    path: str
    records: CalibrationRecords

    @property
    def name(self) -> str:
        return self.records.name

    @property
    def provenance(self) -> dict[str, Any]:
        """The ``[provenance]`` table as written (a copy), for renderers; typed: ``records.provenance``."""
        return dict(self.document["provenance"])

    @property
    def method(self) -> str:
        return self.records.provenance.method

    def origin(self) -> dict[str, Any]:
        """What in this file was measured, what was derived and what was assumed, with versions.

        One home for the answer ``sdplan calibrations`` and ``sdplan show`` give per file:
        ``measured`` and ``derived`` are sentences, ``assumed`` a list, ``versions`` the engine and
        the tools (and for a derived file the estimator's package and database) that produced it.
        """
        records = self.records
        provenance, measurement, quality = records.provenance, records.measurement, records.fit_quality
        assumed = list(provenance.assumptions)
        if records.acceptance is None:
            assumed = assumed if any("acceptance" in item for item in assumed) else [
                *assumed, "acceptance is not part of this file: given per workload"]
        versions = [f"{provenance.engine} {provenance.engine_version}"]
        if provenance.created_by:
            versions.append(provenance.created_by)
        fitted_points: object = "?" if quality is None or quality.points is None else quality.points
        r2: object = "?" if quality is None else quality.r2
        if provenance.method == "derived" and records.derivation is not None:
            measured, derived, tools = _derived_origin(records.derivation)
            versions.append(tools)
        elif provenance.method == "roofline":
            measured = "nothing"
            derived = "every cost, from datasheet bandwidth and FLOP/s and the models' shapes (a roofline)"
        elif provenance.method == "measured":
            how = "engine" if measurement is None else measurement.method
            points = fitted_points if measurement is None or measurement.points is None else measurement.points
            measured = (f"{points} load points timed on the hardware "
                        f"({'vllm serve under vllm bench serve' if how == 'served' else 'in-process engine steps'})")
            derived = f"the coefficients, fitted to those points (R2 {r2})"
        else:
            measured = f"{fitted_points} benchmark runs ({len(provenance.sources)} source files)"
            derived = f"the coefficients, fitted to those runs (R2 {r2})"
        if records.acceptance is not None:
            measured += f"; acceptance: {records.acceptance.source}"
        return {"measured": measured, "derived": derived, "assumed": assumed, "versions": versions}

    @property
    def form(self) -> str:
        """``"direct"`` or ``"step_model"``."""
        return "direct" if isinstance(self.records.costs, DirectCoefficients) else "step_model"

    @property
    def reference_prompt_tokens(self) -> int:
        return int(self.records.reference.prompt_tokens)

    @property
    def reference_output_tokens(self) -> int:
        return int(self.records.reference.output_tokens)

    @property
    def acceptance(self) -> CalibrationAcceptance | None:
        return self.records.acceptance

    def coefficients_at(self, prompt_tokens: float, output_tokens: float) -> Coefficients:
        """Cost coefficients for a workload of ``prompt_tokens`` in and ``output_tokens`` out."""
        records = self.records
        coefficients = costs_at(records.costs, records.reference, prompt_tokens, output_tokens)
        ttft = records.ttft
        if ttft is not None:
            coefficients = replace(coefficients, ttft_wait_steps=ttft.wait_steps, ttft_load_steps=ttft.load_steps,
                                   ttft_offset_s=ttft.offset_s,
                                   ttft_prefill_s=ttft.prefill_per_prompt_token_s * prompt_tokens)
        if records.closed_loop_factor is not None:
            coefficients = replace(coefficients, closed_loop_factor=records.closed_loop_factor)
        return coefficients

    @property
    def not_identified(self) -> tuple[str, ...]:
        """Coefficients a fitted calibration's data did not determine (``[uncertainty]``)."""
        uncertainty = self.records.uncertainty
        return () if uncertainty is None else uncertainty.not_identified

    @property
    def without_runs(self) -> tuple[str, ...]:
        """The coefficients no run of the fit could tell: :attr:`not_identified` less those that were fitted
        but with a standard error above their value (``[uncertainty] stderr_above_value``)."""
        uncertainty = self.records.uncertainty
        return () if uncertainty is None else uncertainty.without_runs

    def moe_at(self, prompt_tokens: float, output_tokens: float) -> MoESpec | None:
        """The MoE routing and coverage increments at a workload; None for a dense target.

        Increments follow the proportional length scaling of the direct form
        (prefill terms with ``p``, per-concurrent-request step terms with the
        mean context), relative to the reference workload.
        """
        routing = self.records.moe
        if routing is None:
            return None
        reference = self.records.reference
        prefill = prompt_tokens / reference.prompt_tokens
        context = mean_context(prompt_tokens, output_tokens) / mean_context(
            reference.prompt_tokens, reference.output_tokens)
        scale = {"c1p_s": prefill, "c2p_s": prefill, "baseline_c2_step_s": context, "c2v_s": context}
        coverage = {key: value * scale.get(key, 1.0) for key, value in routing.coverage.items()}
        return MoESpec(experts_per_token=int(routing.experts_per_token), experts=int(routing.experts),
                       coverage=coverage)

    def outside_measured(self, prompt_tokens: float, output_tokens: float) -> list[tuple[str, float, float, float]]:
        """The lengths of a workload outside the calibration's ``[validity]`` ranges: ``(name, value, low,
        high)`` each (``("prompt tokens", 256, 123, 134)``); empty where the workload lies inside what was
        measured (or the file gives no range)."""
        validity = self.records.validity
        found = []
        for name, span, value in (("prompt tokens", validity.prompt_tokens, prompt_tokens),
                                  ("output tokens", validity.output_tokens, output_tokens)):
            if span is not None and not span[0] <= value <= span[1]:
                found.append((name, float(value), float(span[0]), float(span[1])))
        return found

    def priced_ttft_warning(self, gated: Iterable[str]) -> str | None:
        """Why a TTFT verdict of this file may over-promise: None where TTFT was measured or fitted, or where
        none of the ``gated`` metrics (an SLO's ``metric`` values: ``ttft``, ``tpot``, ...) is TTFT.

        A derived or roofline file has no ``[ttft]`` weights fitted to measured TTFT: its TTFT is the priced
        prefill plus the default wait and load weights, and on AIConfigurator's measured closed loops that was
        25% off vLLM's measured TTFT (unbiased) and 58% below SGLang's (``sdplan-calibration(5)``, ``[ttft]``;
        ``benchmarks/RESULTS-accuracy-silicon-2026-11.md``).
        """
        if "ttft" not in gated or self.records.ttft is not None or self.method not in ("derived", "roofline"):
            return None
        return (f"TTFT of {self.name} is priced from op timings, not measured: such TTFT has been a quarter off "
                "measured vLLM servers' and well below SGLang's (sdplan-calibration(5), [ttft]), so a TTFT SLO it "
                "meets may be missed; measure TTFT before gating on it (sdplan validate compares this file with "
                "your runs; sdplan fit fits TTFT to them)")

    def validity_warnings(self, prompt_tokens: float, output_tokens: float, batch: float | None = None,
                          draft_lengths: Iterable[int] = ()) -> list[str]:
        """Warnings for a workload (and optionally an effective batch and chosen draft lengths) outside the
        calibrated ranges.

        ``batch`` is the largest finite effective batch ``B = lambda L``
        (requests) the caller reports; it is checked against
        ``validity.batch_size`` (the batch sizes the step model was fitted or
        derived on: beyond them the linear step model is extrapolated).
        ``draft_lengths`` are the ``k`` the answer recommends or was asked for;
        a derived file's are checked against the draft lengths it priced
        (``[derivation] draft_lengths``): past them the verification step's
        rows, ``B (k + 1)``, and the drafting phase are extrapolated.
        """
        warnings = [f"{name} {value:g} is outside the calibrated range [{low:g}, {high:g}] of {self.name}; "
                    "predictions are extrapolated"
                    for name, value, low, high in self.outside_measured(prompt_tokens, output_tokens)]
        span = self.records.validity.batch_size
        if span is not None and batch is not None and math.isfinite(batch) and batch > span[1]:
            warnings.append(
                f"effective batch up to {batch:.4g} requests exceeds the calibrated batch sizes "
                f"[{span[0]:g}, {span[1]:g}] of {self.name}; the step model is extrapolated there"
            )
        derivation = self.records.derivation
        top = max(derivation.draft_lengths, default=None) if derivation is not None else None
        beyond = sorted({int(k) for k in draft_lengths if top is not None and int(k) > top})
        if beyond:
            warnings.append(
                f"{', '.join(f'k={k}' for k in beyond)} {'is' if len(beyond) == 1 else 'are'} beyond the draft "
                f"lengths {self.name} priced (up to k={top}): verification and drafting are extrapolated "
                f"there (sdplan derive --draft-lengths 1-{beyond[-1]} prices them)"
            )
        assumed = assumed_overheads_warning(derivation.backend, self.name) if derivation is not None else None
        if assumed is not None and any(int(k) > 0 for k in draft_lengths):
            warnings.append(assumed)
        return warnings


def _derived_origin(derivation: Derivation) -> tuple[str, str, str]:
    """What a derived calibration measured, how it derived the rest, and the estimator's versions."""
    derived = (f"every step cost, priced by {derivation.source} from its {derivation.backend} "
               f"{derivation.database_version} op database on {derivation.system} and fitted to the step model "
               f"(target mean/max error {float(derivation.target_mean_error_pct):.1f}/"
               f"{float(derivation.target_max_error_pct):.1f}%)")
    tools = (f"{derivation.package} {derivation.package_version} ({derivation.licence}), {derivation.backend} "
             f"database {derivation.database_version}")
    return derivation.measured, derived, tools


def parse_calibration(document: dict[str, Any], path: str) -> Calibration:
    """Check a parsed calibration document and read its records.

    Raises
    ------
    InputFileError
        On the first problem (:func:`~sdplan.calibration.checks.check_document`, then the records'
        own consistency), naming ``path`` and the key.
    """
    check_document(document, path)
    return Calibration(document=document, path=path, records=read_records(document, path))


def load_calibration(path: Path) -> Calibration:
    """Read and validate a calibration TOML file."""
    return parse_calibration(read_toml(path), str(path))


def shipped_directory() -> Path:
    """Folder of the calibrations shipped with sdplan.

    In a wheel they are installed as package data (``sdplan/calibrations``);
    in a source checkout or an editable install they live in the repository's
    top-level ``calibrations/``.
    """
    package = Path(__file__).resolve().parent.parent
    packaged = package / "calibrations"
    if packaged.is_dir():
        return packaged
    return package.parent / "calibrations"


def shipped_calibrations() -> list[Path]:
    """Paths of the shipped calibration files, sorted by name."""
    return sorted(shipped_directory().glob("*.toml"))


def resolve_calibration(reference: str | None) -> Calibration:
    """Load a calibration from a path or a shipped name; ``None`` means the default.

    Raises
    ------
    InputFileError
        If the path does not exist and no shipped calibration has that name.
    """
    name = reference or DEFAULT_CALIBRATION
    candidate = Path(name)
    if candidate.exists():
        return load_calibration(candidate)
    shipped = {path.stem: path for path in shipped_calibrations()}
    if name in shipped:
        return load_calibration(shipped[name])
    if candidate.suffix == ".toml" or "/" in name:
        raise InputFileError(name, None, "no such file; check the path, or run 'sdplan calibrations' for shipped names")
    known = ", ".join(sorted(shipped)) or "(none installed)"
    raise InputFileError(name, None, f"no such file or shipped calibration; shipped names: {known}")
