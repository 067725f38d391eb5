"""``sdplan fit`` and ``sdplan validate``: readers, screening, recovery, errors."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import pytest

from sdplan.calibration import load_calibration, resolve_calibration
from sdplan.errors import ExitStatus, InfeasibleError
from sdplan.fileio import dumps_toml
from sdplan.fitting.fit import fit_configurations, fit_pooled
from sdplan.fitting.runmodel import PARAMETERS
from sdplan.fitting.validation import ClosedLoopWaves, run_waves, validate
from sdplan.inputs.serving import prefill_scheduling
from sdplan.latency import model
from sdplan.latency.coefficients import Coefficients
from sdplan.runs import BenchmarkRun, load_runs, read_results, screen
from tests.results_fixtures import TRUE, write_csv, write_guidellm, write_vllm

FITTED = ("c2p_s", "baseline_c1_step_s", "baseline_c2_step_s", "c1v_s", "c2v_s", "c1d_s", "c2d_s")
#: AIConfigurator's measured rows of Qwen3-32B on 4x H100 (vLLM), and a derived file of that target and GPU.
DATA = Path(__file__).parent / "data"
SILICON_SELECT = "model=Qwen3-32B,system=h100_sxm,backend=vllm,tp=4"
DERIVED_QWEN = "4xh100-sxm_qwen3-32b_eagle3_derived"


def test_vllm_reader_normalises_units_and_acceptance(tmp_path) -> None:
    paths = write_vllm(tmp_path)
    runs = [read_results(path)[0][0] for path in paths]
    base = next(r for r in runs if r.draft_length == 0)
    assert base.prompt_tokens == 1024 and base.output_tokens == 512 and base.alpha is None
    spec = next(r for r in runs if r.draft_length == 4 and r.alpha is not None and r.alpha > 0.8)
    assert spec.alpha == pytest.approx(0.85, abs=2e-3)  # from spec_decode_acceptance_length at k = 4
    assert spec.mean_e2e_latency_s > 1.0  # ms converted to s
    assert spec.position_rates == pytest.approx([0.85 ** (i + 1) for i in range(4)], abs=1e-3)


def test_vllm_per_position_rates_are_kept_monotone_and_checked(tmp_path, sdplan) -> None:
    path = write_vllm(tmp_path / "runs")[0]
    document = json.loads(path.read_text())
    for key in [key for key in document if key.startswith("spec_decode")]:
        del document[key]
    document.update({"spec_decode_acceptance_length": 2.0, "spec_decode_num_drafts": 10,
                     "spec_decode_draft_tokens": 20, "spec_decode_per_position_acceptance_rates": [0.6, 0.6000001]})
    path.write_text(json.dumps(document))
    run = read_results(path, "vllm")[0][0]
    assert run.draft_length == 2 and run.position_rates == (0.6, 0.6)  # rounding never makes a later one larger
    document["spec_decode_per_position_acceptance_rates"] = [60.0, 40.0]  # percent, not vLLM's fractions
    path.write_text(json.dumps(document))
    result = sdplan("validate", str(path))
    assert result.exit_code == ExitStatus.BAD_INPUT
    assert "spec_decode_per_position_acceptance_rates[0]" in result.stderr and "[0, 1]" in result.stderr


def test_vllm_reader_old_versions_and_missing_e2el(tmp_path) -> None:
    paths = write_vllm(tmp_path, with_e2el=False, old_goodput_key=True)
    run = read_results(paths[0])[0][0]
    assert any("derived" in note for note in run.notes)
    document = json.loads(paths[0].read_text())
    assert run.mean_e2e_latency_s == pytest.approx(
        (document["mean_ttft_ms"] + document["mean_tpot_ms"] * (512 - 1)) / 1e3)
    document["request_rate"] = "inf"
    paths[0].write_text(json.dumps(document))
    run = read_results(paths[0])[0][0]
    assert run.open_loop_unbounded and run.requested_rate_rps is None
    assert "max-load run" in screen(run)[0]


def test_guidellm_reader_units(tmp_path) -> None:
    path = write_guidellm(tmp_path / "g.json", 0, None)
    runs, warnings = read_results(path)
    assert warnings == [] and len(runs) == 6
    assert 0.03 < runs[0].mean_ttft_s < 0.2  # ms -> s
    assert runs[0].mean_concurrency == pytest.approx(runs[0].achieved_rate_rps * runs[0].mean_e2e_latency_s)
    old = write_guidellm(tmp_path / "old.json", 0, None, version=None)
    assert "of an unchecked schema (metadata.version None" in read_results(old)[1][0]


def test_guidellm_constant_rate_runs_are_left_out(tmp_path) -> None:
    """GuideLLM's sweep schedules constant-rate arrivals by default; the model (and ``lambda L`` as the load a
    request sees) is for Poisson arrivals, so those runs are left out with the rate type to use instead."""
    poisson, _ = read_results(write_guidellm(tmp_path / "p.json", 0, None))
    constant, _ = read_results(write_guidellm(tmp_path / "c.json", 0, None, strategy="constant"))
    assert all(run.burstiness == 1.0 and screen(run) == [] for run in poisson)
    assert all(math.isinf(run.burstiness) for run in constant)
    reasons = [screen(run) for run in constant]
    assert all(len(r) == 1 and r[0].startswith("constant-rate arrivals, which lowers mean latency") for r in reasons)
    assert "GuideLLM's poisson profile" in reasons[0][0]


def test_fit_of_a_constant_rate_guidellm_sweep_says_how_many_were_left_out(sdplan, tmp_path) -> None:
    path = write_guidellm(tmp_path / "sweep.json", 0, None, strategy="constant")
    result = sdplan("fit", str(path), "-o", str(tmp_path / "x.toml"))
    assert result.exit_code == ExitStatus.INFEASIBLE, result.output
    assert result.stderr.count("constant-rate arrivals") == 6
    assert "only 0 of 6 runs usable, the other 6 left out (reasons above)" in result.stderr
    assert not (tmp_path / "x.toml").exists()


def test_screen_reasons(tmp_path) -> None:
    runs, _ = read_results(write_guidellm(tmp_path / "g.json", 0, None, little_off=True, throughput_run=True))
    reasons = [screen(run) for run in runs]
    assert all(any("Little's law" in r for r in rs) for rs in reasons)
    assert any("max-load" in r for r in reasons[-1])


def test_pooled_fit_recovers_exact_coefficients_and_ttft_weights(tmp_path) -> None:
    runs = [read_results(p)[0][0] for p in write_vllm(tmp_path, noise=0.0)]
    pooled = fit_pooled(runs)
    for name in ("c1p_s", *FITTED):
        assert pooled.values[name] == pytest.approx(getattr(TRUE, name), rel=1e-3), name
    # TTFT: stage 2 recovers the load weight; the offset and the wait weight may trade (both are
    # nearly constant per option), so the check is on what they predict
    assert pooled.ttft_fitted and pooled.ttft_mape_pct < 0.5
    assert pooled.ttft_load_steps == pytest.approx(TRUE.ttft_load_steps, rel=0.05)
    assert pooled.r2 > 0.999999 and pooled.reference_prompt_tokens == 1024 and all(pooled.identified.values())
    configurations = fit_configurations(runs)
    assert len(configurations) == 6 and all(c.r2 > 0.99 for c in configurations)


def test_pooled_fit_with_noise_lies_within_its_standard_errors(tmp_path) -> None:
    runs = [read_results(p)[0][0] for p in write_vllm(tmp_path, noise=0.02)]
    pooled = fit_pooled(runs)
    for name in ("c1p_s", *FITTED):
        assert abs(pooled.values[name] - getattr(TRUE, name)) <= 4 * pooled.stderr[name], name
    assert pooled.ttft_load_steps == pytest.approx(TRUE.ttft_load_steps, rel=0.3)


def test_the_robust_fit_down_weights_a_disturbed_run(tmp_path) -> None:
    """A run slowed 3x by a foreign process weighs least, under half, and the coefficients stay near where the
    undisturbed runs put them, which a plain least-squares fit does not; the note counts it."""
    from dataclasses import replace

    runs = [read_results(p)[0][0] for p in write_vllm(tmp_path, noise=0.02, seed=7)]
    undisturbed = fit_pooled(runs)
    victim = next(i for i, r in enumerate(runs) if r.draft_length == 0 and r.concurrency is None)
    slowed = replace(runs[victim], mean_e2e_latency_s=3.0 * runs[victim].mean_e2e_latency_s)
    disturbed = [slowed if i == victim else r for i, r in enumerate(runs)]
    robust, plain = fit_pooled(disturbed), fit_pooled(disturbed, robust=False)
    weights = [r.weight for r in robust.residuals]
    assert weights[victim] < 0.5 and weights[victim] == min(weights)
    assert [r.weight for r in plain.residuals] == [1.0] * len(runs)
    assert any("run(s) down-weighted" in note for note in robust.notes)
    for name in ("baseline_c1_step_s", "baseline_c2_step_s"):
        robust_shift = abs(robust.values[name] / undisturbed.values[name] - 1)
        plain_shift = abs(plain.values[name] / undisturbed.values[name] - 1)
        assert robust_shift < plain_shift / 2, (name, robust_shift, plain_shift)


def test_standard_errors_match_the_estimator_monte_carlo(tmp_path) -> None:
    """B10: the reported standard errors equal the spread of the estimates over noise draws (within 35%)."""
    import numpy as np

    estimates, reported = [], []
    for seed in range(30):
        paths = write_vllm(tmp_path / str(seed), noise=0.02, seed=seed)
        runs = [read_results(p)[0][0] for p in paths]
        pooled = fit_pooled(runs, robust=False)
        estimates.append([pooled.values[name] for name in ("baseline_c2_step_s", "c2v_s", "c1v_s")])
        reported.append([pooled.stderr[name] for name in ("baseline_c2_step_s", "c2v_s", "c1v_s")])
    spread = np.std(np.array(estimates), axis=0, ddof=1)
    typical = np.median(np.array(reported), axis=0)
    assert np.all(typical / spread > 0.65) and np.all(typical / spread < 1.5), (typical, spread)


def test_unidentified_coefficients_are_reported(tmp_path) -> None:
    runs = [read_results(p)[0][0] for p in write_vllm(tmp_path)]
    one_k = [r for r in runs if r.draft_length in (0, 4) and (r.alpha is None or r.alpha > 0.8)]
    pooled = fit_pooled(one_k)
    assert not pooled.identified["c1d_s"] and not pooled.identified["c1v_s"]
    assert any("not identified" in note for note in pooled.notes)
    assert pooled.uncertainty_document()["not_identified"]
    baseline_only = fit_pooled([r for r in runs if r.draft_length == 0])
    assert not baseline_only.speculative_identified


def test_a_coefficient_whose_standard_error_exceeds_its_value_is_not_identified(sdplan, tmp_path) -> None:
    """Real served runs at one workload (tests/data/served-cpu, 128/64 tokens): the design has full rank, but
    the prefill c1p sits at its bound with a standard error far above it. It is listed as not identified
    (with the reason), the fit says so, and plan warns instead of refusing SD."""
    folder = Path(__file__).parent / "data" / "served-cpu"
    runs = [run for path in sorted(folder.glob("*.json")) for run in read_results(path)[0]]
    pooled = fit_pooled(runs)
    assert all(pooled.identified.values())  # in the row space ...
    assert pooled.stderr["c1p_s"] > pooled.values["c1p_s"]  # ... but free to move by more than its value
    assert "c1p_s" in pooled.stderr_above_value and "c1p_s" in pooled.not_identified
    assert [n for n in pooled.not_identified] == [n for n in PARAMETERS
                                                  if pooled.stderr[n] > abs(pooled.values[n])]
    document = pooled.uncertainty_document()
    assert document["not_identified"] == document["stderr_above_value"] == pooled.not_identified
    assert any(note.startswith("standard error above the value") and "c1p_s" in note for note in pooled.notes)
    out = tmp_path / "one.toml"
    assert sdplan("fit", str(folder), "-o", str(out)).exit_code == 0
    plan = sdplan("plan", "-c", str(out), "--rates", "3", "--acceptance", "0.7")
    assert plan.exit_code == 0, plan.output  # SD runs were fitted: planned, with the warning
    assert "have standard errors above their values" in plan.stderr or \
        "have standard errors above their values" in " ".join(plan.stdout.split())


def test_plan_refuses_sd_only_where_no_run_could_tell_the_sd_coefficients(sdplan, write_calibration) -> None:
    import tomllib

    document = tomllib.loads((Path(__file__).parent / "data" / "served-passes-cpu" / "served.toml").read_text())
    sd = ["c1v_s", "c2v_s", "c1d_s", "c2d_s"]
    document["uncertainty"]["not_identified"] = sd
    document["uncertainty"]["stderr_above_value"] = sd  # fitted from SD runs, loosely
    assert sdplan("plan", "-c", str(write_calibration(document, "loose")), "--rates", "3").exit_code == 0
    del document["uncertainty"]["stderr_above_value"]  # no SD run at all
    refused = sdplan("plan", "-c", str(write_calibration(document, "nosd")), "--rates", "3")
    assert refused.exit_code != 0 and "fitted from runs without SD" in refused.stderr


def test_fit_needs_a_baseline_and_enough_runs(tmp_path) -> None:
    runs = [read_results(p)[0][0] for p in write_vllm(tmp_path)]
    with pytest.raises(InfeasibleError, match="baseline"):
        fit_pooled([r for r in runs if r.draft_length > 0])
    with pytest.raises(InfeasibleError, match="at least 3"):
        fit_pooled(runs[:2])


def test_validate_exact_model_has_zero_error(tmp_path) -> None:
    runs, _ = read_results(write_csv(tmp_path / "runs.csv"))
    result = validate(lambda p, g: TRUE, runs)
    assert result.mape_pct == pytest.approx(0.0, abs=1e-9) and result.r2 == pytest.approx(1.0)
    agree, total = result.best_k_agreement
    assert total > 0 and agree == total
    assert result.quality == "excellent"


# ----------------------------------------------------------------------------- CLI


def test_cli_fit_writes_a_calibration_plan_can_use(sdplan, tmp_path) -> None:
    paths = write_vllm(tmp_path / "runs", noise=0.01)
    out = tmp_path / "fitted.toml"
    result = sdplan("fit", *map(str, paths), "-o", str(out), "--hardware", "1x H100", "--target-model", "llama-8b",
                    "--draft-model", "llama-1b", "-f", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["command"] == "fit" and report["pooled"]["r2"] > 0.99 and report["runs_dropped"] == []
    cal = load_calibration(out)
    assert cal.method == "fit" and cal.provenance["hardware"] == "1x H100"
    assert all("sha256:" in source for source in cal.provenance["sources"])
    assert cal.document["fit_quality"]["points"] == 36
    plan = sdplan("plan", "-c", str(out), "--rates", "1", "--acceptance", "0.85")
    assert plan.exit_code == 0
    check = sdplan("validate", "-c", str(out), *map(str, paths), "--max-error", "5%", "-f", "json")
    assert check.exit_code == 0, check.output
    summary = json.loads(check.stdout)["summary"]
    assert summary["mape_pct"] < 5 and summary["best_k_agreement"]["compared"] > 0


def test_cli_fit_reports_dropped_runs(sdplan, tmp_path) -> None:
    saturated = json.loads(write_vllm(tmp_path / "a")[5].read_text())
    saturated["request_rate"] = saturated["request_throughput"] * 2  # asked for twice what it got
    failed = dict(saturated, request_rate=saturated["request_throughput"], failed=50)
    paths = write_vllm(tmp_path / "b", extra_runs=[saturated, failed])
    result = sdplan("fit", *map(str, paths), "-o", str(tmp_path / "f.toml"), "--ascii")
    assert result.exit_code == 0, result.output
    assert "saturated" in result.stdout and "requests failed" in result.stdout


def test_cli_fit_guidellm_with_per_file_facts(sdplan, tmp_path) -> None:
    base = write_guidellm(tmp_path / "base.json", 0, None)
    spec = write_guidellm(tmp_path / "spec.json", 4, 0.85)
    out = tmp_path / "g.toml"
    # B5: GuideLLM records no SD settings; they are given per file, and the baseline file stays a baseline
    result = sdplan("fit", str(base), f"{spec}:k=4,alpha=0.85", "-o", str(out), "-f", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["pooled"]["points"] == 12
    # flags fill in only what files do not record: a vLLM SD file keeps its own k and acceptance
    vllm = write_vllm(tmp_path / "v")
    runs, _ = load_runs([str(p) for p in vllm], "auto", 6, 0.1)
    assert {r.draft_length for r in runs} == {0, 2, 4, 6} and all(r.alpha is None or r.alpha > 0.5 for r in runs)
    csv_path = write_csv(tmp_path / "runs.csv", noise=0.01)
    result = sdplan("fit", str(csv_path), "-o", str(out), "--holdout", "0.25", "-f", "json")
    assert result.exit_code == 0, result.output
    holdout = json.loads(result.stdout)["holdout"]
    assert holdout["runs"] == 9 and holdout["mape_pct"] < 5


def test_cli_validate_max_error_gate(sdplan, tmp_path) -> None:
    paths = write_vllm(tmp_path, noise=0.0)
    # the default roofline calibration is a different machine: far off, and the gate says so
    result = sdplan("validate", *map(str, paths), "--max-error", "10%")
    assert result.exit_code == ExitStatus.SLO_VIOLATED
    assert "FAIL: MAPE" in result.stderr
    result = sdplan("validate", *map(str, paths), "--ascii")
    assert result.exit_code == 0 and "MAPE" in result.stdout and "measured (s)" in result.stdout


#: A minimal vLLM open-loop result (10 requests at 1 req/s) for the malformed-field cases.
_RUN = ('{"completed": 10, "request_rate": 1, "burstiness": 1, "duration": 10, "request_throughput": 1, '
        '"total_input_tokens": 100, "total_output_tokens": 100, "mean_e2el_ms": 500}')


@pytest.mark.parametrize(("content", "suffix", "where"), [
    ("{not json", ".json", "invalid JSON"),
    ('{"hello": 1}', ".json", "unrecognised result format"),
    ('{"completed": 10, "request_throughput": 1.0, "total_output_tokens": 5}', ".json", "total_input_tokens"),
    ('{"completed": "ten"}', ".json", "completed: expected a number"),
    ('{"completed": 10, "request_throughput": 1, "total_input_tokens": 1, "total_output_tokens": 1}', ".json",
     "mean_e2el_ms"),
    ('{"benchmarks": [{"metrics": {}}]}', ".json", "requests_per_second.successful.mean: missing"),
    (_RUN.replace('"duration": 10', '"duration": -10'), ".json", "duration: must be > 0 s, got -10"),
    (_RUN.replace('"burstiness": 1', '"burstiness": 0'), ".json", "burstiness: must be > 0 (1 for Poisson"),
    (_RUN.replace('"burstiness": 1', '"burstiness": "often"'), ".json", "burstiness: expected a number"),
    ("request_rate_rps,draft_length\n1,0\n", ".csv", "acceptance: missing column"),
    ("request_rate_rps,draft_length,acceptance,prompt_tokens,output_tokens,mean_e2e_latency_s\n1,0,1.5,10,10,1\n",
     ".csv", "line 2: acceptance"),
    ("request_rate_rps,draft_length,acceptance,prompt_tokens,output_tokens,mean_e2e_latency_s\n1,0,0.5,10,10,abc\n",
     ".csv", "line 2: mean_e2e_latency_s"),
    # a field over the csv module's 128 KiB limit, in a row and in the header (exit 70 before)
    ("request_rate_rps,draft_length,acceptance,prompt_tokens,output_tokens,mean_e2e_latency_s\n1,0,0.5,10,10,"
     + "1" * 200_000 + "\n", ".csv", "not valid CSV (field larger than field limit"),
    ("request_rate_rps" + "x" * 200_000 + "\n1\n", ".csv", "not valid CSV"),
    ("[]", ".json", "an empty JSON array"),
    ("a\rb,c\n1,2\n", ".json", "invalid JSON"),  # a carriage return in the CSV header probe (exit 70 before)
])
def test_malformed_results_exit_3_with_file_and_field(sdplan, tmp_path, content, suffix, where) -> None:
    path = tmp_path / f"bad{suffix}"
    path.write_text(content)
    for command in (["fit", str(path), "-o", str(tmp_path / "x.toml")], ["validate", str(path)]):
        result = sdplan(*command)
        assert result.exit_code == ExitStatus.BAD_INPUT, result.output
        assert str(path) in result.stderr and where in result.stderr
        assert result.stderr.count("\n") == 1
    assert not (tmp_path / "x.toml").exists()


def test_capped_open_loop_without_per_request_times_is_read_with_a_note(tmp_path) -> None:
    path = tmp_path / "capped.json"
    path.write_text(_RUN.replace('"burstiness": 1', '"burstiness": 1, "max_concurrency": 4'))
    run = read_results(path)[0][0]
    assert run.client_cap == 4 and run.concurrency is None and run.held_back_by_cap is None
    assert screen(run) == [] and "cannot tell whether the cap held arrivals back" in run.notes[0]
    path.write_text(_RUN)
    assert read_results(path)[0][0].notes == () and read_results(path)[0][0].burstiness == 1.0


def test_per_request_list_that_is_not_numbers_is_noted_not_dropped_silently(tmp_path) -> None:
    path = tmp_path / "odd.json"
    document = json.loads(_RUN)
    document["latencies"] = [0.5] * 9 + ["n/a"]
    path.write_text(json.dumps(document))
    run = read_results(path)[0][0]
    assert run.mean_e2e_latency_s == 0.5 and run.others_in_flight is None  # from the summary
    assert run.notes == ("latencies: not all finite numbers; read without this per-request list",)


def test_missing_results_file(sdplan, tmp_path) -> None:
    result = sdplan("validate", str(tmp_path / "none.json"))
    assert result.exit_code == ExitStatus.BAD_INPUT and "no such file" in result.stderr


def test_input_format_choices_are_the_reader_registry() -> None:
    """``--input-format`` lists every registered reader (kept literal so ``--help`` imports no reader)."""
    from sdplan.cli.fit import fit
    from sdplan.cli.validate import validate as validate_command
    from sdplan.runs import FORMATS

    for command in (fit, validate_command):
        option = next(param for param in command.params if param.name == "input_format")
        assert tuple(option.type.choices) == FORMATS


def test_validate_of_latencies_near_the_float_range_is_refused_not_overflowed(sdplan, tmp_path) -> None:
    """A damaged file's mean E2E of 1e308 ms: R2's squares overflowed Python floats (exit 70 once); it is past
    any real server (sdplan.limits.MAX_LATENCY_S), so the file is refused, naming the quantity."""
    document = json.loads((Path(__file__).parent / "data" / "served-cpu" / "k4_c4_r0.json").read_text())
    for key in ("latencies", "ttfts", "start_times"):
        document.pop(key)
    document["mean_e2el_ms"] = 1e308
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(document))
    result = sdplan("validate", str(path), "-f", "json")
    assert result.exit_code == 3, result.output
    assert f"{path}: mean E2E latency of 1e+305 s is past any real server" in result.stderr
    assert result.stdout == ""


def closed_run(clients: int, completed: int | None = None) -> BenchmarkRun:
    return BenchmarkRun(source="closed", draft_length=0, prompt_tokens=4096, output_tokens=512, alpha=None,
                        mean_e2e_latency_s=20.0, concurrency=clients, mean_ttft_s=1.0, requested_rate_rps=None,
                        achieved_rate_rps=clients / 20.0, completed=completed)


def test_a_closed_loops_waves_follow_the_engines_scheduling() -> None:
    c = Coefficients(c1p_s=0.13, c2p_s=0.13, c1v_s=0.01, c2v_s=1e-4, c1d_s=0.0, c2d_s=0.0,
                     baseline_c1_step_s=0.01, baseline_c2_step_s=1e-4, prompt_tokens=4096.0, output_tokens=512.0)
    run = closed_run(64, completed=640)
    wave = (model.opening_wave_prompts(64, 4096, 8192) - 1.0) * 0.13
    sglang = ClosedLoopWaves(prefill_scheduling("sglang", "NVIDIA H100 SXM 80GB"), kv_cache_tokens=1e6,
                             fixed_lengths=True)
    # SGLang admits the round (64 x 4,608 tokens < 1e6): the wave recurs, E2E keeps the steady model's
    assert run_waves(c, run, sglang) == (pytest.approx(wave), 0.0)
    # lengths not known to be fixed: the round need not finish together, only the opening wave (10 rounds)
    unknown = dataclasses.replace(sglang, fixed_lengths=False)
    assert run_waves(c, run, unknown) == (pytest.approx(wave / 10), 0.0)
    # a cache of 32 such requests: the wave is the 32 it admits together, every round
    small = dataclasses.replace(sglang, kv_cache_tokens=32 * 4608.0)
    assert run_waves(c, run, small) == (pytest.approx((model.opening_wave_prompts(32, 4096, 8192) - 1.0) * 0.13),
                                        0.0)
    vllm = ClosedLoopWaves(prefill_scheduling("vllm", "NVIDIA H100 SXM 80GB"), rounds=20.0)
    assert run_waves(c, run, vllm) == (pytest.approx(wave / 10), 0.0)  # the run's own count
    assert run_waves(c, closed_run(64), vllm) == (pytest.approx(wave / 20), 0.0)
    assert run_waves(c, closed_run(64), ClosedLoopWaves(vllm.scheduling)) == (0.0, 0.0)  # rounds unknown
    open_loop = dataclasses.replace(run, concurrency=None, requested_rate_rps=3.0)
    assert run_waves(c, open_loop, sglang) == (0.0, 0.0)


def test_validate_adds_the_opening_wave_to_ttft_not_to_e2e() -> None:
    """The wave does a run's prefills first, not more of them: its mean latency stays the steady one."""
    c = Coefficients(c1p_s=0.13, c2p_s=0.13, c1v_s=0.01, c2v_s=1e-4, c1d_s=0.0, c2d_s=0.0,
                     baseline_c1_step_s=0.01, baseline_c2_step_s=1e-4, prompt_tokens=4096.0, output_tokens=512.0)
    runs = [closed_run(16, completed=32)]
    plain = validate(lambda p, g: c, runs).errors[0]
    vllm = ClosedLoopWaves(prefill_scheduling("vllm", "NVIDIA H100 SXM 80GB"))
    waved = validate(lambda p, g: c, runs, waves=vllm).errors[0]
    ttft_wave, e2e_wave = run_waves(c, runs[0], vllm)
    assert ttft_wave > 0.0 and e2e_wave == 0.0
    assert waved.predicted_s == plain.predicted_s
    assert waved.predicted_ttft_s == pytest.approx((plain.predicted_ttft_s or 0.0) + ttft_wave)


def test_sdplan_validate_assumes_no_lockstep_where_the_runs_do_not_say_their_lengths(sdplan, tmp_path: Path) -> None:
    """A derived file of an SGLang engine on rows that record neither their request counts nor fixed lengths:
    no wave recurs and no opening wave can be spread, so it is validated as its vLLM twin."""
    document = copy.deepcopy(resolve_calibration(DERIVED_QWEN).document)
    rows = [str(DATA / "aic-silicon" / "silicon_sample.csv"), "--select", SILICON_SELECT, "-f", "json"]
    as_vllm = json.loads(sdplan("validate", "-c", DERIVED_QWEN, *rows).stdout)["summary"]
    document["derivation"]["backend"] = "sglang"
    path = tmp_path / "sglang.toml"
    path.write_text(dumps_toml(document))
    as_sglang = json.loads(sdplan("validate", "-c", str(path), *rows).stdout)["summary"]
    assert as_sglang["mape_pct"] == pytest.approx(as_vllm["mape_pct"])
    assert as_sglang["ttft_mape_pct"] == pytest.approx(as_vllm["ttft_mape_pct"])
    document["derivation"]["backend"] = "vllm"  # the twin really is the same file
    assert document == resolve_calibration(DERIVED_QWEN).document


def test_validate_holds_sglang_sd_runs_to_its_48_requests_unless_told_the_servers_limit(sdplan, tmp_path) -> None:
    """SGLang runs at most 48 requests under SD unless --max-running-requests is set (its ServerArgs): an SD
    closed loop of 96 clients keeps 48 running and the rest waiting, which validate prices; --max-num-seqs gives
    the server's own limit instead, and without SD the 48 does not apply."""
    shipped = Path(__file__).resolve().parent.parent / "calibrations" / "h100-sxm_llama-3.1-8b_eagle3_derived.toml"
    text = shipped.read_text()
    assert text.count('engine = "vllm"') == 1
    calibration = tmp_path / "sglang.toml"
    calibration.write_text(text.replace('engine = "vllm"', 'engine = "sglang"'))
    runs = tmp_path / "runs.csv"
    runs.write_text("request_rate_rps,draft_length,acceptance,prompt_tokens,output_tokens,mean_e2e_latency_s,"
                    "max_concurrency\n16,3,0.7,1024,512,6.0,96\n16,0,0.0,1024,512,6.0,96\n5.33,3,0.7,1024,512,3.0,16\n")

    def predicted(*extra: str) -> tuple[dict[tuple[int, int], float], str]:
        found = sdplan("validate", "-c", str(calibration), str(runs), "-f", "json", *extra)
        assert found.exit_code == 0, found.output
        doc = json.loads(found.stdout)
        found_runs = doc["runs"]
        return {(r["draft_length_tokens"], r["closed_loop_clients"]): r["predicted_e2e_latency_s"]
                for r in found_runs}, found.stderr

    held, said = predicted()
    free, quiet = predicted("--max-num-seqs", "1024")
    # past 48 the SD run waits: N L(48) / 48, dearer than all 96 running at once
    assert held[3, 96] > 1.2 * free[3, 96]
    assert held[0, 96] == free[0, 96] and held[3, 16] == free[3, 16]
    assert "1 SD run(s) had more clients than the 48 requests SGLang runs at once under SD" in " ".join(said.split())
    assert "48 requests" not in quiet
    capped, _ = predicted("--max-num-seqs", "32")  # the server's own limit holds for every run
    assert capped[0, 96] > free[0, 96] and capped[3, 96] > held[3, 96]
