"""Acceptance from a ``speculation_profile.json`` (NVIDIA Model-Optimizer, schema 1.0).

Model-Optimizer's ``specdec_bench`` writes this file next to an exported draft
checkpoint (``examples/specdec_bench/specdec_bench/speculation_profile.py`` in
NVIDIA/Model-Optimizer). The fields sdplan reads:

``schema_version``
    ``"1.0"``; any other version is refused (the schema is still under review
    upstream, and a later one may change what the vectors mean).
``measured``
    ``false`` marks a stub written when nothing was measured: refused.
``num_speculative_tokens``
    The draft length ``K`` the rates were measured at.
``conditional_accept_rates``
    ``a_i``: P(draft position ``i`` accepted | positions ``1..i-1`` were),
    ``i = 1..K``. sdplan plans with their running products
    ``r_i = a_1 ... a_i`` (:func:`sdplan.inputs.acceptance.position_rates_from_conditional`),
    so ``E(k) = 1 + r_1 + ... + r_k`` for ``k <= K``. ``null`` under block
    verification (``vectors_unavailable_reason``): refused.
``marginal_accept_rates``
    ``r_i`` as the producer computed them; where present they must agree with
    the running products of the conditional rates (within
    :data:`RATE_TOLERANCE`).
``mean_accept_length``
    Per-step mean tokens per cycle, bonus token included; where present it must
    equal ``1 + sum r_i`` within :data:`MEAN_TOLERANCE` (the producer's own
    consistency check), else the vector was cut short.
``accept_length_model``
    ``chain_analytic``: the draft at ``k`` is a prefix of the draft at ``K``
    (EAGLE, draft models), so the rates give ``E(k)`` at every ``k <= K``.
    ``measured_per_k``: block-parallel drafters re-plan the block when ``k``
    changes, so the rates hold at ``K`` only.
``method``, ``measurement_conditions``, ``max_supported_k``
    Reported with the acceptance (what was measured, where).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sdplan.errors import InputFileError
from sdplan.inputs.acceptance import AcceptanceMetric, AcceptanceSpec, make_acceptance, position_rates_from_conditional
from sdplan.limits import MAX_DRAFT_LENGTH
from sdplan.schema import decode_text

#: Schema versions this sdplan reads.
SUPPORTED_VERSIONS = ("1.0",)
#: Largest profile file read (a profile is a few KiB; a histogram of lengths is small).
MAX_PROFILE_BYTES = 16 * 2**20
#: Largest difference allowed between a marginal rate and the product of the conditional ones.
RATE_TOLERANCE = 0.01
#: The producer's own tolerance on ``mean_accept_length = 1 + sum(marginal_accept_rates)`` (tokens per cycle).
MEAN_TOLERANCE = 0.02
#: ``measurement_conditions`` keys shown, in this order, when present.
_CONDITION_KEYS = ("dataset", "engine", "gpu", "hardware", "concurrency", "temperature", "target_model")


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculationProfile:
    """A validated speculation profile.

    Attributes
    ----------
    path : str
    measured_at_k : int
        ``num_speculative_tokens``: the draft length ``K`` of the measurement.
    conditional_rates : tuple of float
        ``a_1..a_K``.
    position_rates : tuple of float
        ``r_i = a_1 ... a_i``, the form the planner uses.
    mean_accept_length : float or None
        Tokens per cycle at ``K``, bonus token included.
    method : str or None
    prefix_extrapolates : bool
        ``accept_length_model == "chain_analytic"``: the rates hold at every ``k <= K``.
    conditions : dict
        ``measurement_conditions`` as given (``{}`` if absent).
    """

    path: str
    measured_at_k: int
    conditional_rates: tuple[float, ...]
    position_rates: tuple[float, ...]
    mean_accept_length: float | None
    method: str | None
    prefix_extrapolates: bool
    conditions: dict[str, Any]

    def describe(self) -> str:
        """Where and how the rates were measured, in a few words."""
        parts = [f"speculation profile {self.path}", f"measured at k={self.measured_at_k}"]
        if self.method:
            parts.append(f"method {self.method}")
        shown = [f"{key} {self.conditions[key]}" for key in _CONDITION_KEYS
                 if isinstance(self.conditions.get(key), (str, int, float))
                 and not isinstance(self.conditions[key], bool)]
        if shown:
            parts.append("conditions: " + ", ".join(str(item)[:80] for item in shown))
        if not self.prefix_extrapolates:
            parts.append(f"valid at k={self.measured_at_k} only (accept_length_model measured_per_k)")
        return "; ".join(parts)

    def acceptance(self) -> AcceptanceSpec:
        """The acceptance the planner uses: per-position rates ``r_1..r_K``."""
        spec = make_acceptance(AcceptanceMetric.PER_POSITION, self.position_rates, None, self.describe())
        return spec if self.prefix_extrapolates else replace(spec, only_draft_length=self.measured_at_k)


def _rates(document: dict[str, Any], key: str, path: str, length: int) -> tuple[float, ...] | None:
    values = document.get(key)
    if values is None:
        return None
    if not isinstance(values, list) or len(values) != length:
        raise InputFileError(path, key, f"expected a list of {length} rates (one per draft position up to "
                             f"num_speculative_tokens = {length})")
    rates = []
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise InputFileError(path, f"{key}[{index}]", f"expected a probability in [0, 1], got {str(value)[:40]}")
        rates.append(float(value))
    return tuple(rates)


def parse_speculation_profile(document: object, path: str) -> SpeculationProfile:
    """Validate a decoded profile (see the module docstring for the fields).

    Raises
    ------
    InputFileError
        Naming the field: an unknown ``schema_version``, an unmeasured stub, missing
        or out-of-range rates, or rates that disagree with the marginals or the mean.
    """
    if not isinstance(document, dict):
        raise InputFileError(path, None, "is not a speculation profile (a JSON object with schema_version, "
                             "num_speculative_tokens and conditional_accept_rates)")
    version = document.get("schema_version")
    if version is None:
        raise InputFileError(path, "schema_version", "missing; a speculation_profile.json carries one (this sdplan "
                             f"reads {', '.join(SUPPORTED_VERSIONS)})")
    if str(version) not in SUPPORTED_VERSIONS:
        raise InputFileError(path, "schema_version", f"version {str(version)[:40]!r} is not supported; this sdplan "
                             f"reads {', '.join(SUPPORTED_VERSIONS)} (give the acceptance with --position-acceptance "
                             "or --acceptance-length instead)")
    if document.get("measured") is False:
        raise InputFileError(path, "measured", "is false: this profile is a stub written without a measurement; "
                             "measure the draft (specdec_bench) or give --acceptance")
    k = document.get("num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_DRAFT_LENGTH:
        raise InputFileError(path, "num_speculative_tokens", f"expected the draft length measured at, an integer in "
                             f"1..{MAX_DRAFT_LENGTH}, got {str(k)[:40]}")
    conditional = _rates(document, "conditional_accept_rates", path, k)
    marginal = _rates(document, "marginal_accept_rates", path, k)
    if conditional is None and marginal is None:
        reason = document.get("vectors_unavailable_reason")
        why = f" ({str(reason)[:120]})" if reason else ""
        raise InputFileError(path, "conditional_accept_rates", f"is null{why}; a profile without per-position "
                             "rates cannot be planned per position; give --acceptance-length with --acceptance-k")
    if conditional is None:
        assert marginal is not None
        if any(later > earlier + 1e-9 for earlier, later in zip(marginal, marginal[1:])):
            raise InputFileError(path, "marginal_accept_rates", "must not increase (a survival function)")
        conditional = tuple(m / prev if prev > 0 else 0.0 for prev, m in zip((1.0,) + marginal, marginal))
    products = position_rates_from_conditional(conditional)
    if marginal is not None:
        worst = max(range(k), key=lambda i: abs(products[i] - marginal[i]))
        if abs(products[worst] - marginal[worst]) > RATE_TOLERANCE:
            raise InputFileError(path, f"marginal_accept_rates[{worst}]",
                                 f"{marginal[worst]:.4g} disagrees with the product of the conditional rates up to "
                                 f"that position ({products[worst]:.4g}); the two vectors describe different "
                                 "measurements")
    mean = document.get("mean_accept_length")
    if mean is not None:
        if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not 1.0 <= mean <= k + 1:
            raise InputFileError(path, "mean_accept_length", f"expected tokens per cycle in [1, {k + 1}], "
                                 f"got {str(mean)[:40]}")
        implied = 1.0 + sum(products)
        if abs(implied - mean) > MEAN_TOLERANCE:
            raise InputFileError(path, "mean_accept_length",
                                 f"{mean:.4g} tokens per cycle, but the rates imply {implied:.4g} (1 + the sum of the "
                                 "per-position rates); the vectors were cut short or measured apart from the mean")
    conditions = document.get("measurement_conditions")
    method = document.get("method")
    return SpeculationProfile(
        path=path,
        measured_at_k=k,
        conditional_rates=conditional,
        position_rates=products,
        mean_accept_length=float(mean) if mean is not None else None,
        method=str(method)[:40] if method is not None else None,
        prefix_extrapolates=document.get("accept_length_model", "chain_analytic") == "chain_analytic",
        conditions=conditions if isinstance(conditions, dict) else {},
    )


def load_speculation_profile(path: str) -> SpeculationProfile:
    """Read and validate a ``speculation_profile.json``.

    Raises
    ------
    InputFileError
        If the file cannot be read, is not JSON, or fails :func:`parse_speculation_profile`.
    """
    file = Path(path)
    try:
        if file.is_dir():
            candidate = file / "speculation_profile.json"
            if not candidate.is_file():
                raise InputFileError(path, None, "is a folder without a speculation_profile.json; pass the file")
            file, path = candidate, str(candidate)
        size = file.stat().st_size
        if size > MAX_PROFILE_BYTES:
            raise InputFileError(path, None, f"{size / 2**20:.0f} MiB is larger than a speculation profile can be "
                                 f"({MAX_PROFILE_BYTES // 2**20} MiB); check the path")
        raw = file.read_bytes()
    except OSError as error:
        raise InputFileError(path, None, f"cannot read ({error.strerror}); check the path") from None
    text = decode_text(raw, path, "JSON")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise InputFileError(path, None, f"not valid JSON ({str(error)[:120]}); a speculation_profile.json is one "
                             "JSON object") from None
    return parse_speculation_profile(document, path)
