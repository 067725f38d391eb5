"""The speculative-decoding methods sdplan models and exports, and which one a calibration describes.

A calibration's costs belong to one way of drafting: a separate draft LM
(``draft_model``), an EAGLE/EAGLE-3 head on the target's hidden states
(``eagle``, ``eagle3``), the target's own multi-token-prediction layers
(``mtp``) or host-side n-gram lookup (``ngram``). The names are vLLM's
``speculative_config.method`` values (``vllm==0.33.0:vllm/config/speculative.py``
``SpeculativeMethod``); the same five run vLLM's per-batch-size schedule on
Model Runner V1 (``config/vllm.py:1088-1108``). A schedule or an engine
config is only as right as the costs behind it, so an export for another
method than the calibration's is refused rather than written with the wrong
costs (``docs/engines.md#vllm-per-batch-size-schedule``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sdplan.errors import InvalidValueError

if TYPE_CHECKING:
    from sdplan.calibration import Calibration


@dataclass(frozen=True, slots=True)
class Method:
    """One SD method: its vLLM name, a label for people, and whether it loads weights of its own."""

    name: str
    label: str
    #: the ``model`` an engine needs: ``"draft"`` (a separate LM), ``"head"`` (an EAGLE head), None (no weights)
    weights: str | None


METHODS: dict[str, Method] = {
    "draft_model": Method("draft_model", "separate draft model", "draft"),
    "eagle": Method("eagle", "EAGLE head", "head"),
    "eagle3": Method("eagle3", "EAGLE-3 head", "head"),
    "mtp": Method("mtp", "the target's MTP layers", None),
    "ngram": Method("ngram", "n-gram prompt lookup", None),
}
#: vLLM methods sdplan refuses before anything starts, and why.
UNSUPPORTED_METHODS: dict[str, str] = {
    "suffix": "vLLM's suffix decoding (Arctic Inference) drafts a different number of tokens at every step, up to "
    "num_speculative_tokens and scaled by each request's suffix match (suffix_decoding_max_spec_factor), so its "
    "cycle is not the k-token cycle that sdplan's model, calibrations and exports describe; ngram is the "
    "prompt-lookup proposer sdplan models",
}
#: n-gram window that ``sdplan calibrate`` measures with and the exports write (vLLM's prompt_lookup_min/max).
NGRAM_LOOKUP_TOKENS = (2, 5)
#: ``provenance.draft_model`` values that name a proposer, not weights (what ``sdplan calibrate`` writes).
_PROPOSER_NAMES = {"ngram": "ngram", "mtp": "mtp", "[ngram]": "ngram"}


def supported() -> str:
    return ", ".join(METHODS)


def check_method(requested: str) -> str:
    """``requested`` if sdplan models it.

    Raises
    ------
    InvalidValueError
        (exit 2) naming why a known vLLM method is not modelled
        (:data:`UNSUPPORTED_METHODS`), or listing the supported ones.
    """
    shown = requested[:40] if requested.isprintable() else repr(requested[:40])
    if requested in UNSUPPORTED_METHODS:
        raise InvalidValueError(f"--spec-method {shown}: not supported: {UNSUPPORTED_METHODS[requested]}")
    if requested not in METHODS:
        raise InvalidValueError(f"--spec-method {shown}: unknown; supported: {supported()}")
    return requested


def calibration_method(calibration: Calibration) -> str:
    """The SD method a calibration's costs describe.

    ``provenance.speculative_method`` when the file names it; otherwise
    ``provenance.draft_model`` when it names a proposer (``ngram``, ``mtp``),
    else ``draft_model`` (the calibrations of sdplan before methods existed).
    """
    return provenance_method(calibration.provenance)


def provenance_method(provenance: dict[str, object]) -> str:
    """:func:`calibration_method` from a ``[provenance]`` table."""
    named = provenance.get("speculative_method")
    if named:
        return str(named)
    return _PROPOSER_NAMES.get(str(provenance.get("draft_model", "")).strip().lower(), "draft_model")


def resolve_method(requested: str | None, calibration: Calibration) -> str:
    """The method to plan and export: ``requested`` checked against the list and the calibration.

    Raises
    ------
    InvalidValueError
        (exit 2) for a method sdplan does not know (the message lists the
        supported ones), or for one whose costs the calibration does not
        hold (an EAGLE export from a draft-model calibration would name a
        plain LM as the head and use the LM's costs).
    """
    own = calibration_method(calibration)
    if requested is None:
        return own
    check_method(requested)
    if requested != own:
        raise InvalidValueError(
            f"--spec-method {requested}: calibration {calibration.name} holds the costs of "
            f"{METHODS[own].label} ({own}), not of {METHODS[requested].label}; its schedule and model would be "
            f"wrong for {requested}. Give a calibration of {requested} (provenance.speculative_method = "
            f"\"{requested}\"; 'sdplan calibrations' lists the shipped ones) or drop --spec-method")
    return own


def draft_weights(method: str, calibration: Calibration) -> str | None:
    """The ``model`` an engine loads for ``method``: the draft LM or the EAGLE head; None for MTP and n-gram.

    Raises
    ------
    InvalidValueError
        When the method needs weights and the calibration does not name them.
    """
    if METHODS[method].weights is None:
        return None
    name = str(calibration.provenance.get("draft_model", "")).strip()
    if not name or name.lower() in ("none", *_PROPOSER_NAMES):
        what = "EAGLE head" if METHODS[method].weights == "head" else "draft model"
        raise InvalidValueError(f"calibration {calibration.name} does not name the {what} for {method} "
                                "(provenance.draft_model); add it to the file")
    return name
