"""Calibrations derived from NVIDIA AIConfigurator's silicon-measured step estimator.

``sdplan derive`` prices the steps of sdplan's per-step form
(``sdplan-calibration(5)``, ``[step_model]``) with ``aiconfigurator-core``'s
compiled estimator (``AicEngine``: decode, prefill and mixed prefill+decode
step latency composed from a per-operation database measured on the GPU, for
one serving engine and version), fits the linear step model to them, records
how well the linear form represents AIConfigurator's curve, and, where the
package's measured end-to-end rows (``systems/silicon_sample.csv``) exist for
the same target, GPU, tensor parallelism and precision, anchors the no-SD part
to them. This is the only package that imports ``aiconfigurator_core``, and it
does so lazily (:func:`load_aic`); an absent package is a
:class:`~sdplan.errors.MissingDependencyError` (exit 5) naming the install line.

Its modules, in the order a derivation runs: :mod:`~sdplan.derive.request`
(what is asked, the grids and assumed costs), :mod:`~sdplan.derive.pricing`
(AIConfigurator's step costs), :mod:`~sdplan.derive.fitting` (the step model
fitted to them), :mod:`~sdplan.derive.anchoring` (the no-SD part scaled to
measured rows) and :mod:`~sdplan.derive.document` (the file). Apart from them,
:mod:`~sdplan.derive.roofline` prices the same form from datasheets alone, without
AIConfigurator (``scripts/derive_roofline.py``).

The step model fitted (``sdplan/calibration.py`` ``_coefficients_from_steps``)::

    T(B, q, s) = fixed + B (per_sequence + q per_query_token + s per_context_token)

with ``B`` running sequences, ``q`` query tokens per sequence and ``s`` the
mean KV context. What is priced, and how:

* target decode (``q = 1``) and verification (``q = k + 1``) at batch ``B``:
  AIConfigurator's decode step, its non-attention ops at ``B q`` token rows
  (its own verification model: ``nextn`` multiplies the decode batch by
  ``k + 1``) and its attention at ``B`` sequences (:meth:`Pricer.verify`);
* the draft's own step (``q = 1``): a draft LM's decode step; an EAGLE/EAGLE-3
  head as a one-layer decoder with the target's shapes and a draft
  vocabulary; MTP as AIConfigurator's own MTP layers (the difference between
  its ``nextn = k`` step and the plain verification step, per draft token);
  n-gram lookup as no device work;
* prefill per prompt length (``c1p``) and its interference with decode
  (``c2p``): AIConfigurator's mixed step with a prompt's tokens minus the
  decode-only step, per prompt token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sdplan.calibration import Calibration, parse_calibration
from sdplan.derive.anchoring import MeasuredRows, fit_anchor, measured_rows
from sdplan.derive.document import document, file_text
from sdplan.derive.fitting import fit_linear, fit_steps
from sdplan.derive.pricing import Models, Pricer, eagle_head_config
from sdplan.derive.request import (
    AIC_DISTRIBUTION,
    AIC_LICENCE,
    AIC_VERSION,
    ARCHITECTURES,
    INSTALL_HINT,
    METHODS,
    MODEL_ALIASES,
    PRECISIONS,
    SYSTEMS,
    DeriveRequest,
    aic_version,
    file_stem,
    load_aic,
    model_key,
)
from sdplan.errors import InvalidValueError

__all__ = [
    "AIC_DISTRIBUTION",
    "AIC_LICENCE",
    "AIC_VERSION",
    "ARCHITECTURES",
    "INSTALL_HINT",
    "METHODS",
    "MODEL_ALIASES",
    "PRECISIONS",
    "SYSTEMS",
    "Derivation",
    "DeriveRequest",
    "DerivedFile",
    "MeasuredRows",
    "Models",
    "Pricer",
    "aic_version",
    "derive",
    "derive_file",
    "eagle_head_config",
    "file_stem",
    "fit_anchor",
    "fit_linear",
    "load_aic",
    "measured_rows",
    "model_key",
]


@dataclass(frozen=True, slots=True)
class Derivation:
    """A derived calibration document and what the derivation found."""

    document: dict[str, Any]
    errors: dict[str, tuple[float, float]]  # component -> (mean, max) relative error of the fitted form, percent
    anchor: dict[str, Any] | None


def derive(request: DeriveRequest, progress: Callable[[str], None] | None = None,
           measured: MeasuredRows | None = None) -> Derivation:
    """Price a pair with AIConfigurator and fit sdplan's per-step form to it.

    Parameters
    ----------
    request : DeriveRequest
        What to derive; ``request.anchor = False`` derives without measured rows.
    progress : callable, optional
        Called with a line of progress now and then.
    measured : MeasuredRows, optional
        The measured rows to anchor on; by default the installed ``silicon_sample.csv``'s rows of the
        request's configuration (:func:`~sdplan.derive.anchoring.measured_rows`).

    Raises
    ------
    MissingDependencyError
        If ``aiconfigurator-core`` is not installed (exit 5).
    InvalidValueError
        If AIConfigurator cannot build the pair (a model, system or engine version its database lacks).
    """
    request.check()
    engine = load_aic()
    note = progress or (lambda _text: None)
    models = Models()
    try:
        try:
            pricer = Pricer(engine, request, models)
            fitted = fit_steps(request, pricer, note)
            anchor = None
            if request.anchor:
                rows = measured if measured is not None else measured_rows(request, pricer.quant)
                anchor = fit_anchor(rows, pricer, fitted.kv_tokens)
        # AIConfigurator's own errors, its invariant checks on the layout included (an AssertionError such as
        # "num_heads 64 should be divisible by tp_size 3"); sdplan's derive code asserts nothing
        except (ValueError, KeyError, FileNotFoundError, RuntimeError, AssertionError) as error:
            reason = (str(error).splitlines() or [type(error).__name__])[0].strip().rstrip(".")
            raise InvalidValueError(f"AIConfigurator {aic_version()} cannot price {request.target_model} + "
                                    f"{request.draft_model or request.method} on {request.system} with "
                                    f"{request.backend} {request.backend_version or 'current'}: {reason}"
                                    f"{layout_hint(reason)}") from None
    finally:
        models.close()
    note(f"fitted; anchor: {'none' if anchor is None else str(anchor['rows']) + ' measured rows'}")
    return Derivation(document=document(request, pricer, fitted, anchor), errors=fitted.errors, anchor=anchor)


def layout_hint(reason: str) -> str:
    """What to change where AIConfigurator refuses how the model splits over the GPUs (its checks on heads,
    experts or quantisation blocks per tensor-parallel rank); empty otherwise."""
    if any(word in reason for word in ("tp_size", "divisible", "weight_block_size")):
        return "; the model does not split so over the GPUs: choose another --tensor-parallel-size or --precision"
    return ""


@dataclass(frozen=True, slots=True, kw_only=True)
class DerivedFile:
    """What ``sdplan derive`` writes and reports: the derivation, its file's text, and the calibration it reads as.

    Attributes
    ----------
    derivation : Derivation
        The document and what the derivation found.
    text : str
        The TOML file, under its header (:func:`sdplan.derive.document.file_text`).
    calibration : Calibration
        The document read as the calibration at the path it is written to, for the report.
    """

    derivation: Derivation
    text: str
    calibration: Calibration


def derive_file(request: DeriveRequest, path: str, progress: Callable[[str], None] | None = None,
                measured: MeasuredRows | None = None) -> DerivedFile:
    """:func:`derive` a calibration and build the file to write at ``path`` (what :func:`derive` raises)."""
    derivation = derive(request, progress, measured)
    calibration = parse_calibration(derivation.document, path)
    return DerivedFile(derivation=derivation, text=file_text(derivation.document), calibration=calibration)
