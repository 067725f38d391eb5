"""The rules a calibration passes at load beyond its schema: one form, its method's tables, plausible costs.

:func:`check_document` runs them in order on a parsed TOML document, so the
first problem a file has is the one reported; each raises
:class:`~sdplan.errors.InputFileError` naming the key and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdplan.calibration.records import DirectCoefficients, ReferenceWorkload, Uncertainty, read_costs
from sdplan.calibration.scaling import costs_at
from sdplan.calibration.schema import CALIBRATION_SCHEMA, SCHEMA_VERSION
from sdplan.errors import InputFileError, NoLoadCostError
from sdplan.latency.model import baseline_demand
from sdplan.limits import MAX_TOKENS
from sdplan.schema import validate

#: Longest time any one cost may take, seconds: a step or a prefill of an hour describes no hardware.
MAX_COST_S = 3600.0
#: Shortest plain decode step, seconds: no accelerator runs a forward pass of a model in under 100 ns.
MIN_STEP_S = 1e-7


def check_document(document: Mapping[str, Any], path: str) -> None:
    """Check a parsed calibration document: version, form, schema, its method's tables, plausibility.

    Raises
    ------
    InputFileError
        On the first violation, naming ``path`` and the key.
    """
    version = document.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version != SCHEMA_VERSION:
        raise InputFileError(
            path,
            "schema_version",
            f"version {version} is not supported; this sdplan reads version {SCHEMA_VERSION} (upgrade sdplan)",
        )
    forms = [key for key in ("coefficients", "step_model") if key in document]
    if len(forms) != 1:
        problem = "both are present; keep one" if forms else "neither is present; add one"
        raise InputFileError(path, "coefficients|step_model", f"exactly one coefficient form is required, {problem}")
    validate(document, CALIBRATION_SCHEMA, path)
    check_method_tables(document, path)
    check_plausible(document, path)


def check_method_tables(document: Mapping[str, Any], path: str) -> None:
    """The tables a schema-valid document needs for its method, and MoE routing with ``m <= M``.

    Raises
    ------
    InputFileError
        For ``experts_per_token > experts``; a roofline or derived file without
        assumptions; a derived one without ``[derivation]``; a measured or fitted
        one without ``[fit_quality]``.
    """
    provenance = document["provenance"]
    moe = document.get("moe")
    if isinstance(moe, dict) and isinstance(moe.get("experts"), int) and isinstance(moe.get("experts_per_token"), int) \
            and moe["experts_per_token"] > moe["experts"]:
        raise InputFileError(path, "moe.experts_per_token", "cannot exceed moe.experts (m <= M)")
    for table, pair in (("step_model.target", ("knee_tokens", "per_token_above_knee_s")),
                        ("coefficients", ("knee_tokens", "knee_per_token_s"))):
        keys = document.get(table.split(".")[0], {})
        keys = keys.get("target", {}) if table == "step_model.target" and isinstance(keys, dict) else keys
        if isinstance(keys, dict) and (pair[0] in keys) != (pair[1] in keys):
            given, missing = pair if pair[0] in keys else pair[::-1]
            raise InputFileError(path, f"{table}.{missing}",
                                 f"a knee needs both keys: {given} is given; add {missing} or remove {given}")
    coefficients = document.get("coefficients")
    if isinstance(coefficients, dict) and coefficients.get("load_concavity_sqrt_requests") \
            and (coefficients.get("knee_per_token_s") or isinstance(moe, dict)):
        # one bend of the load law at a time: the knee's pieces and the MoE fixed point assume a straight line
        raise InputFileError(path, "coefficients.load_concavity_sqrt_requests",
                             "a concave load law cannot be combined with a compute-bound knee or [moe]; "
                             "remove one")
    if provenance["method"] in ("roofline", "derived") and not provenance.get("assumptions"):
        raise InputFileError(
            path, "provenance.assumptions", f"a {provenance['method']} calibration must list its assumptions; add them"
        )
    if provenance["method"] == "derived" and "derivation" not in document:
        raise InputFileError(path, "derivation", "a derived calibration must say how it was derived; add [derivation] "
                             "(sdplan derive writes it)")
    if provenance["method"] in ("measured", "fit") and "fit_quality" not in document:
        raise InputFileError(path, "fit_quality",
                             f"a '{provenance['method']}' calibration must report its fit quality; add [fit_quality]")


def check_plausible(document: Mapping[str, Any], path: str) -> None:
    """Refuse a schema-valid calibration that cannot describe hardware.

    Every cost in seconds must be at most :data:`MAX_COST_S`; at the
    reference workload a plain decode step and a verification cycle must
    take at least :data:`MIN_STEP_S` (an all-zero file would predict zero
    latency and infinite capacity); counts (lengths, experts, GPUs) must be
    within the bounds of :mod:`sdplan.limits`.

    Raises
    ------
    InputFileError
        Naming the key and the range it must be in.
    """
    def walk(table: Mapping[str, Any], prefix: str) -> None:
        for key, value in table.items():
            dotted = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(value, f"{dotted}.")
            elif key.endswith("_s") and isinstance(value, (int, float)) and value > MAX_COST_S:
                raise InputFileError(path, dotted, f"{value:g} s is not a plausible cost (at most {MAX_COST_S:g} s); "
                                     "costs are in seconds: check the unit (ms or us written as s?)")

    for section in ("coefficients", "step_model", "moe"):
        if isinstance(document.get(section), dict):
            walk(document[section], f"{section}.")
    for key in ("prompt_tokens", "output_tokens"):
        if document["reference_workload"][key] > MAX_TOKENS:
            raise InputFileError(path, f"reference_workload.{key}", f"must be at most {MAX_TOKENS} tokens")
    moe = document.get("moe")
    if isinstance(moe, dict) and moe.get("experts", 0) > 100_000:
        raise InputFileError(path, "moe.experts", "must be at most 100000 experts per layer")
    if document["provenance"].get("tensor_parallel_size", 1) > 1_000_000:
        raise InputFileError(path, "provenance.tensor_parallel_size", "must be at most 1000000 GPUs")
    _check_costs_take_time(document, path)


def _check_costs_take_time(document: Mapping[str, Any], path: str) -> None:
    """A plain decode step (and, where the fit had SD runs, a verification cycle) takes time and load.

    Raises
    ------
    InputFileError
        Where one takes less than :data:`MIN_STEP_S` at the reference workload, or costs nothing per
        concurrent request.
    """
    reference = ReferenceWorkload.from_table(document["reference_workload"])
    costs = read_costs(document)
    direct = isinstance(costs, DirectCoefficients)
    coefficients = costs_at(costs, reference, reference.prompt_tokens, reference.output_tokens)
    where = "coefficients" if direct else "step_model.target"
    # A fit without SD runs leaves the SD coefficients undetermined (listed, and refused when planning SD).
    table = document.get("uncertainty")
    without_runs = Uncertainty.from_table(table, path).without_runs if table is not None else ()
    speculative = not {"c1v_s", "c2v_s"} <= set(without_runs)
    checks = [("a plain decode step", coefficients.baseline_c1_step_s,
               "coefficients.baseline.c1_step_s" if direct else where)]
    if speculative:
        checks.append(("a verification cycle", coefficients.c1v_s,
                       "coefficients.speculative.c1v_s" if direct else where))
    for name, value, key in checks:
        if not value >= MIN_STEP_S:
            raise InputFileError(path, key, f"{name} would take {value:g} s at the reference workload; a calibration "
                                 f"must describe hardware that takes time (>= {MIN_STEP_S:g} s per step); fill in "
                                 "the measured costs")
    # The load-dependent demand C2 (prefill interference plus the per-request step cost) must be positive: a
    # fit may put all of it in c2p, so the parts are not checked one by one.
    loads = [("no SD", float(baseline_demand(coefficients)[1]),
              "coefficients.baseline.c2_step_s" if direct else where)]
    if speculative:
        loads.append(("a verification cycle", coefficients.c2p_s + coefficients.c2v_s,
                      "coefficients.speculative.c2v_s" if direct else where))
    for name, value, key in loads:
        if not value > 0:
            raise NoLoadCostError(path, key, f"{name} would cost nothing per concurrent request (0 s), so latency "
                                 "would never grow with load and the replica would never saturate; no hardware "
                                 "works so: fill in the per-sequence or per-context-token cost")
