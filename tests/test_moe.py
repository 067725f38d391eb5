"""Mixture-of-experts: coverage, fixed point, limits, and the CLI."""

from __future__ import annotations

import copy
import json

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdplan import planner
from sdplan.calibration import parse_calibration
from sdplan.errors import ExitStatus, InputFileError
from sdplan.model import Coefficients
from sdplan.moe import MoESpec, solve

BASE = Coefficients(c1p_s=0.04, c2p_s=0.01, c1v_s=0.006, c2v_s=1e-4, c1d_s=0.001, c2d_s=5e-5,
                    baseline_c1_step_s=0.005, baseline_c2_step_s=1e-4, prompt_tokens=1000.0, output_tokens=500.0)
COVERAGE = {"c1v_s": 0.01, "baseline_c1_step_s": 0.01, "c2v_s": 2e-5, "baseline_c2_step_s": 2e-5, "c1p_s": 0.02}


def with_coverage(c: Coefficients, phi: float) -> Coefficients:
    """The dense model whose coefficients include phi times the coverage increments."""
    values = {name: getattr(c, name) for name in c.__dataclass_fields__}
    for key, value in COVERAGE.items():
        values[key] += phi * value
    return Coefficients(**values)


def test_coverage_values_match_published_table() -> None:
    spec = MoESpec(8, 128, {})  # Qwen3-30B-A3B: model.md §2.1
    assert numpy.allclose(spec.phi([1, 2, 4, 8, 16, 32, 64]), [0.062, 0.121, 0.228, 0.403, 0.644, 0.873, 0.984],
                          atol=1e-3)
    assert float(MoESpec(4, 32, {}).phi(1)) == pytest.approx(0.125)


def test_all_experts_per_token_reduces_to_the_dense_model() -> None:
    rates = numpy.linspace(0, 10, 21)
    ks = [1, 2, 4]
    moe = planner.plan(BASE, rates, ks, [0.8], moe=MoESpec(16, 16, COVERAGE))
    dense = planner.plan(with_coverage(BASE, 1.0), rates, ks, [0.8])
    numpy.testing.assert_allclose(moe.latency_s, dense.latency_s, rtol=1e-8)
    numpy.testing.assert_allclose(moe.baseline_latency_s, dense.baseline_latency_s, rtol=1e-8)
    assert numpy.array_equal(moe.best_k, dense.best_k)


def test_saturated_coverage_approaches_the_dense_model_of_total_size() -> None:
    # Many experts per token: phi(B) ~ 1 already at small B, so the MoE behaves like the full dense model.
    moe = planner.plan(BASE, [8.0], [2], [0.8], moe=MoESpec(60, 64, COVERAGE))
    dense = planner.plan(with_coverage(BASE, 1.0), [8.0], [2], [0.8])
    assert moe.latency_s[0, 0, 0] == pytest.approx(dense.latency_s[0, 0, 0], rel=1e-6)


def test_sparse_moe_is_faster_than_its_dense_equivalent_at_low_load() -> None:
    moe = planner.plan(BASE, [0.5], [2], [0.8], moe=MoESpec(8, 128, COVERAGE))
    dense = planner.plan(with_coverage(BASE, 1.0), [0.5], [2], [0.8])
    assert moe.latency_s[0, 0, 0] < dense.latency_s[0, 0, 0]
    assert moe.moe_speedup_lost[0, 0, 0] > 0  # drafted tokens touch more experts


@settings(max_examples=60)
@given(st.integers(1, 16), st.integers(16, 256), st.floats(0.3, 0.95), st.floats(0.0, 1.5))
def test_fixed_point_residual_below_tolerance(m: int, experts: int, alpha: float, load: float) -> None:
    spec = MoESpec(min(m, experts), experts, COVERAGE)
    dense_c2 = 0.01 + 500 * 1.2e-4
    rates = numpy.linspace(0, load / dense_c2, 9)
    result = planner.plan(BASE, rates, [1, 2, 3, 4, 6], [alpha], moe=spec)
    assert result.moe_max_residual is not None and result.moe_max_residual < 1e-8
    for column in result.latency_s[0].T:  # latency rises with load until the option becomes unstable
        stable = column[numpy.isfinite(column)]
        assert numpy.all(numpy.diff(stable) >= -1e-9 * stable[1:])
    assert not numpy.any(numpy.isnan(result.latency_s))


def test_solver_reports_unstable_points() -> None:
    spec = MoESpec(8, 128, {})
    result = solve(1.0, 0.0, 0.1, 0.0, 1.0, numpy.array([5.0, 10.0, 20.0]), spec)
    assert result.latency_s[0] == pytest.approx(2.0) and numpy.all(numpy.isinf(result.latency_s[1:]))


def test_moe_schema(direct_document) -> None:
    document = copy.deepcopy(direct_document)
    document["moe"] = {"experts_per_token": 8, "experts": 128, "coverage": {"c1v_s": 0.01}}
    cal = parse_calibration(document, "x.toml")
    spec = cal.moe_at(1000, 500)
    assert spec is not None and spec.coverage == {"c1v_s": 0.01}
    document["moe"]["experts_per_token"] = 256
    with pytest.raises(InputFileError, match="moe.experts_per_token"):
        parse_calibration(document, "x.toml")
    document["moe"] = {"experts_per_token": 8, "experts": 128, "coverage": {"c1d_s": 0.01}}
    with pytest.raises(InputFileError, match="moe.coverage.c1d_s: unknown key"):
        parse_calibration(document, "x.toml")


def test_cli_plan_moe(sdplan) -> None:
    name = "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_roofline"
    result = sdplan("plan", "-c", name, "--acceptance", "0.8", "--rates", "2,8", "-k", "1-4", "-f", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["moe"]["max_relative_residual"] < 1e-8
    point = doc["results"][0]["rates"][0]["speculative"][2]
    assert point["speedup_lost_to_expert_coverage"] > 0
    table = sdplan("plan", "-c", name, "--acceptance", "0.8", "--rates", "2,8")
    assert "speedup lost to coverage (x)" in table.stdout and "n/a for MoE" in table.stdout
    assert sdplan("plan", "-c", name, "--policy", "goodput").exit_code == ExitStatus.USAGE
    assert sdplan("capacity", "-c", name, "--slo", "e2e:mean<=10s").exit_code == ExitStatus.USAGE
    check = sdplan("check", "-c", name, "--rate", "2", "--slo", "e2e:mean<=30s", "--acceptance", "0.8")
    assert check.exit_code == 0, check.output
