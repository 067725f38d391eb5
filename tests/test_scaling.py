"""Direct-form scaling between workloads against the structural step model (docs/model.md#length-scaling)."""

from __future__ import annotations

import copy
from dataclasses import fields

import pytest

from sdplan.calibration import resolve_calibration, scale_direct
from sdplan.latency import model

WORKLOADS = [(128, 128), (4096, 256), (8192, 64), (64, 1024), (1024, 512)]


def direct_document(name: str, slopes: bool) -> tuple[object, dict]:
    """A step-model calibration expressed in direct form at 1024/512 (optionally with context slopes)."""
    cal = resolve_calibration(name)
    ref = cal.coefficients_at(1024, 512)
    target, draft = cal.document["step_model"]["target"], cal.document["step_model"]["draft"]
    spec = {"c1v_s": ref.c1v_s, "c2v_s": ref.c2v_s, "c1d_s": ref.c1d_s, "c2d_s": ref.c2d_s}
    base = {"c1_step_s": ref.baseline_c1_step_s, "c2_step_s": ref.baseline_c2_step_s}
    if slopes:
        spec |= {"c2v_per_context_token_s": target["per_context_token_s"],
                 "c2d_per_context_token_s": draft["per_context_token_s"]}
        base |= {"c2_step_per_context_token_s": target["per_context_token_s"]}
    document = {"reference_workload": {"prompt_tokens": 1024, "output_tokens": 512},
                "coefficients": {"c1p_s": ref.c1p_s, "c2p_s": ref.c2p_s, "speculative": spec, "baseline": base,
                                 "knee_tokens": ref.knee_tokens, "knee_per_token_s": ref.knee_per_token_s}}
    return cal, document


@pytest.mark.parametrize(("p", "g"), WORKLOADS)
def test_direct_form_with_slopes_equals_the_step_model(p: int, g: int) -> None:
    cal, document = direct_document("h100-sxm_llama-3.1-8b_llama-3.2-1b_derived", slopes=True)
    truth, scaled = cal.coefficients_at(p, g), scale_direct(document, p, g)
    for name in (field.name for field in fields(truth)):
        # the prefill intercept (P.fixed, and the server's share of it) and its squared term (its attention over
        # its prefix) are not in the direct form: c1p and c2p scale with p
        if name in ("c1p_s", "c2p_s", "c1p_sq_s", "c2p_sq_s", "server_prefill_s"):
            continue
        assert getattr(scaled, name) == pytest.approx(getattr(truth, name), rel=1e-9), name
    # c2p = l p + l2 p^2 in the step model, c2p_ref p / p_ref in the direct form: they part by l2 p (p - p_ref)
    squared = cal.document["step_model"]["prefill"]["load_per_prompt_token_sq_s"]
    assert squared > 0.0
    assert truth.c2p_s - scaled.c2p_s == pytest.approx(squared * p * (p - 1024), rel=1e-6, abs=1e-15)


@pytest.mark.parametrize(("p", "g"), WORKLOADS)
def test_drafted_token_cost_does_not_scale_with_context_without_slopes(p: int, g: int) -> None:
    cal, document = direct_document("a100-sxm-80gb_llama-3.1-8b_llama-3.2-1b_roofline", slopes=False)
    scaled = scale_direct(document, p, g)
    assert scaled.c2d_s == pytest.approx(document["coefficients"]["speculative"]["c2d_s"], rel=1e-12)
    # SD's saturation stays within 10% of the step model's (it was 2.1x too high at p = g = 128 with c2d scaled)
    _, c2_true = model.speculative_demand(cal.coefficients_at(p, g), 0.8, 4)
    _, c2_scaled = model.speculative_demand(scaled, 0.8, 4)
    assert float(c2_scaled) == pytest.approx(float(c2_true), rel=0.10)


def test_scaling_none_keeps_the_reference_values() -> None:
    _, document = direct_document("h100-sxm_llama-3.1-8b_llama-3.2-1b_derived", slopes=True)
    fixed = copy.deepcopy(document)
    fixed["coefficients"]["scaling"] = "none"
    at_ref, elsewhere = scale_direct(fixed, 1024, 512), scale_direct(fixed, 128, 128)
    assert (at_ref.c2v_s, at_ref.c2d_s, at_ref.baseline_c2_step_s, at_ref.c1p_s) == \
        (elsewhere.c2v_s, elsewhere.c2d_s, elsewhere.baseline_c2_step_s, elsewhere.c1p_s)
