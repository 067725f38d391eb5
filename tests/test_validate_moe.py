"""``sdplan validate`` predicts a mixture-of-experts target as the planner solves it.

The calibration is the shipped MoE one (Qwen3-30B-A3B on an H100, ``[moe]`` 8 of 128 experts); the runs are
the real served runs of ``tests/data/served-cpu`` (vLLM ``bench serve`` files: closed loops of 1-8 clients and
open loops at two rates, without SD and with k = 2 and 4). No MoE target has measured rows in the test data,
so the checks are that validate's prediction of each run is the planner's own prediction at the run's rate
(open loops), satisfies the planner's fixed point at the closed loop's load (closed loops), and differs from
the prediction without expert coverage.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdplan.calibration import load_calibration
from sdplan.fitting.runmodel import run_tokens_per_cycle
from sdplan.fitting.validation import derived_waves, predict_latency, predict_ttft, validate
from sdplan.planning.planner import plan
from sdplan.runs import read_results

ROOT = Path(__file__).parent.parent
CALIBRATION = ROOT / "calibrations" / "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived.toml"
RUNS = sorted((ROOT / "tests" / "data" / "served-cpu").glob("*.json"))


def served_runs() -> list:
    return [run for path in RUNS for run in read_results(path)[0]]


def planner_latency(run, rate_rps: float) -> float:
    """The planner's mean latency of a run's option (no SD or its k and E) at a rate, the MoE fixed point."""
    cal = load_calibration(CALIBRATION)
    coefficients = cal.coefficients_at(run.prompt_tokens, run.output_tokens)
    moe = cal.moe_at(run.prompt_tokens, run.output_tokens)
    assert moe is not None
    k = max(run.draft_length, 1)
    tokens = [[run_tokens_per_cycle(run) if run.draft_length else 2.0]]
    result = plan(coefficients, [rate_rps], [k], [run.alpha or 0.5], tokens_per_cycle=tokens, moe=moe)
    return float(result.baseline_latency_s[0] if run.draft_length == 0 else result.latency_s[0, 0, 0])


def test_the_calibration_is_moe_and_the_runs_cover_both_loops() -> None:
    runs = served_runs()
    assert load_calibration(CALIBRATION).moe_at(128, 64) is not None
    assert {run.draft_length for run in runs} == {0, 2, 4}
    assert any(run.concurrency is None for run in runs) and any(run.concurrency is not None for run in runs)


@pytest.mark.parametrize("run", [r for r in served_runs() if r.concurrency is None], ids=lambda r: r.source[-16:])
def test_open_loop_is_the_planners_fixed_point(run) -> None:
    cal = load_calibration(CALIBRATION)
    coefficients = cal.coefficients_at(run.prompt_tokens, run.output_tokens)
    moe = cal.moe_at(run.prompt_tokens, run.output_tokens)
    predicted = predict_latency(coefficients, run, moe)
    assert predicted == pytest.approx(planner_latency(run, run.arrival_rate_rps), rel=1e-7)
    # expert coverage rises with the load: the coverage-free prediction is well below
    assert predicted > 1.2 * predict_latency(coefficients, run)


@pytest.mark.parametrize("run", [r for r in served_runs() if r.concurrency is not None], ids=lambda r: r.source[-16:])
def test_closed_loop_is_the_planners_fixed_point_at_its_load(run, monkeypatch) -> None:
    """A closed loop of N predicting L has B = N - 1 others: the planner at lambda = (N - 1)/L gives the same L,
    once the open loop's prefill queue is taken away (clients that send one request at a time queue none)."""
    from sdplan.latency import moe as moe_model

    monkeypatch.setattr(moe_model, "prefill_queue", lambda coefficients, moe: (0.0, 0.0))
    cal = load_calibration(CALIBRATION)
    coefficients = cal.coefficients_at(run.prompt_tokens, run.output_tokens)
    assert coefficients.closed_loop_factor == 1.0
    moe = cal.moe_at(run.prompt_tokens, run.output_tokens)
    predicted = predict_latency(coefficients, run, moe)
    assert predicted == pytest.approx(planner_latency(run, (run.concurrency - 1) / predicted), rel=1e-7)
    assert predicted > predict_latency(coefficients, run)


def test_ttft_uses_the_coverage_of_the_load() -> None:
    cal = load_calibration(CALIBRATION)
    for run in served_runs():
        coefficients = cal.coefficients_at(run.prompt_tokens, run.output_tokens)
        moe = cal.moe_at(run.prompt_tokens, run.output_tokens)
        dense = predict_latency(coefficients, run)
        covered = predict_latency(coefficients, run, moe)
        assert predict_ttft(coefficients, run, covered, moe) > predict_ttft(coefficients, run, dense)


def test_validate_applies_moe_at_and_the_cli_passes_it(sdplan) -> None:
    cal = load_calibration(CALIBRATION)
    runs = served_runs()
    with_coverage = validate(cal.coefficients_at, runs, cal.moe_at)
    without = validate(cal.coefficients_at, runs)
    assert [e.predicted_s for e in with_coverage.errors] != pytest.approx([e.predicted_s for e in without.errors])
    # the CLI also gives a derived file's closed loops their opening wave (the runs record their request counts):
    # in TTFT, not in E2E (the wave does the run's prefills first, not more of them)
    waves = derived_waves(cal, max(run.draft_length for run in runs))
    waved = validate(cal.coefficients_at, runs, cal.moe_at, waves=waves)
    assert [e.predicted_ttft_s for e in waved.errors] != pytest.approx(
        [e.predicted_ttft_s for e in with_coverage.errors])
    assert [e.predicted_s for e in waved.errors] == [e.predicted_s for e in with_coverage.errors]
    result = sdplan("validate", "-c", str(CALIBRATION), *map(str, RUNS), "--format", "json")
    assert result.exit_code == 0, result.stderr
    printed = json.loads(result.stdout)["runs"]
    assert [run["predicted_e2e_latency_s"] for run in printed] == pytest.approx(
        [e.predicted_s for e in waved.errors], rel=1e-9)
    assert [run["predicted_ttft_s"] for run in printed] == pytest.approx(
        [e.predicted_ttft_s for e in waved.errors], rel=1e-9)
