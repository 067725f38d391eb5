"""AIConfigurator's measured silicon rows: reading, selecting, fitting and validating.

The fixture is 76 real rows of NVIDIA AIConfigurator 0.12.0's silicon_sample.csv
(tests/data/aic-silicon/README.md): vLLM 0.12.0 with Qwen3-32B on H100 at TP 2 and 4, vLLM with
Llama-3.1-70B FP8 on H200 at TP 2, and one disaggregated row.
"""

from __future__ import annotations

import csv
import importlib.util
import math
from pathlib import Path

import pytest

from sdplan.calibration import load_calibration
from sdplan.errors import InputFileError, InvalidValueError, MissingDependencyError
from sdplan.fitting.fit import fit_pooled
from sdplan.fitting.validation import predict_latency, predict_ttft
from sdplan.runs import load_runs, read_results, silicon

DATA = Path(__file__).parent / "data" / "aic-silicon" / "silicon_sample.csv"
QWEN_TP4 = "model=Qwen3-32B,system=h100_sxm,backend=vllm,tp=4"


def raw_rows() -> list[dict[str, str]]:
    with DATA.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_rows_become_closed_loops_with_e2e_from_ttft_and_tpot() -> None:
    runs, warnings = load_runs([str(DATA)], "auto", None, None, silicon.Selection.parse([QWEN_TP4]))
    expected = [row for row in raw_rows() if row["model_path"] == "Qwen/Qwen3-32B" and row["tp_size"] == "4"
                and row["mode"] == "agg" and row["backend"] == "vllm"]
    assert len(runs) == len(expected) == 30 and warnings == []
    for run, row in zip(runs, expected):
        ttft, tpot, osl = float(row["silicon_ttft_ms"]) / 1e3, float(row["silicon_tpot_ms"]) / 1e3, float(row["osl"])
        assert run.concurrency == int(row["batch_size"]) and run.closed_loop and run.mean_others == run.concurrency - 1
        assert run.draft_length == 0 and run.alpha is None
        assert (run.prompt_tokens, run.output_tokens) == (float(row["isl"]), osl)
        assert run.mean_ttft_s == pytest.approx(ttft) and run.mean_tpot_s == pytest.approx(tpot)
        assert run.mean_e2e_latency_s == pytest.approx(ttft + (osl - 1) * tpot)
        assert run.achieved_rate_rps == pytest.approx(run.concurrency / run.mean_e2e_latency_s)


def test_selection_matches_short_names_and_picks_one_configuration() -> None:
    short = silicon.Selection.parse(["model=qwen3-32b", "system=h100,tp=2"])
    full = silicon.Selection.parse(["model=Qwen/Qwen3-32B,system=h100_sxm,backend=vllm,version=0.12.0,tp=2"])
    a, _ = read_results(DATA, "auto", short)
    b, _ = read_results(DATA, "aic-silicon", full)
    assert [r.source for r in a] == [r.source for r in b] and len(a) == 30
    llama, _ = read_results(DATA, "auto", silicon.Selection.parse(["model=Llama-3.1-70B"]))
    assert len(llama) == 15 and {r.prompt_tokens for r in llama} == {1024.0, 8192.0}


def test_disaggregated_rows_are_not_read() -> None:
    rows = silicon.parse_rows(str(DATA), DATA.read_text())
    assert len(rows) == sum(row["mode"] == "agg" for row in raw_rows()) == 75


@pytest.mark.parametrize(("select", "named"), [
    ("model=Qwen3-33B", "model is one of meta-llama/Llama-3.1-70B, Qwen/Qwen3-32B"),
    ("model=Qwen3-32B,tp=8", "tp is one of 2, 4"),
    ("model=Qwen3-32B", "matches 2 configurations"),
])
def test_a_selection_that_matches_none_or_several_names_the_choices(select: str, named: str) -> None:
    with pytest.raises(InputFileError, match=named) as caught:
        read_results(DATA, "auto", silicon.Selection.parse([select]))
    assert "\n" not in str(caught.value) and str(DATA) in str(caught.value)


def test_a_file_of_several_configurations_needs_a_selection() -> None:
    with pytest.raises(InputFileError, match=r"holds 3 configurations .* --select \(model: .*; tp: 2, 4"):
        read_results(DATA)


@pytest.mark.parametrize("text", ["gpu.kind=h100", "model", "model=a,model=b"])
def test_malformed_selections_are_usage_errors(text: str) -> None:
    with pytest.raises(InvalidValueError):
        silicon.Selection.parse([text])


def test_a_label_that_is_not_a_silicon_key_is_refused_on_silicon_rows() -> None:
    """``gpu=h100`` reads as a server label (any Prometheus label name picks a server of a metrics file); on a
    silicon file it is a usage error that names the keys rows are picked by."""
    with pytest.raises(InvalidValueError, match="server labels pick a server .*picked by model, system"):
        read_results(DATA, "auto", silicon.Selection.parse(["gpu=h100"]))


def test_a_selection_for_another_format_is_refused() -> None:
    served = Path(__file__).parent / "data" / "served-cpu"
    first = min(served.rglob("*.json"))
    with pytest.raises(InvalidValueError, match="silicon"):
        read_results(first, "auto", silicon.Selection.parse(["tp=1"]))


def test_bad_files_name_the_line_and_column(tmp_path: Path) -> None:
    lines = DATA.read_text().splitlines()
    header = lines[0].split(",")
    row = next(line for line in lines[1:] if ",agg," in line).split(",")
    row[header.index("silicon_tpot_ms")] = "fast"
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([lines[0], ",".join(row)]) + "\n")
    with pytest.raises(InputFileError, match=r"line 2: silicon_tpot_ms: expected a number, got 'fast'"):
        read_results(bad, "aic-silicon")
    no_tp = tmp_path / "no_tp.csv"
    no_tp.write_text("\n".join(",".join(c for i, c in enumerate(line.split(",")) if i != header.index("tp_size"))
                               for line in lines[:3]) + "\n")
    with pytest.raises(InputFileError, match="tp_size: missing column"):
        read_results(no_tp, "aic-silicon")


def test_the_packaged_file_without_the_package_is_exit_5(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'aiconfigurator-core==0.12.0'"):
        silicon.resolve_path("aic:silicon_sample")
    assert silicon.resolve_path(str(DATA)) == DATA


def test_cli_fit_then_validate_on_measured_rows(sdplan, tmp_path: Path) -> None:
    out = tmp_path / "qwen3-32b-h100-tp4.toml"
    fitted = sdplan("fit", str(DATA), "--select", QWEN_TP4, "-o", str(out))
    assert fitted.exit_code == 0, fitted.stderr
    calibration = load_calibration(out)
    provenance = calibration.document["provenance"]
    assert (provenance["hardware"], provenance["target_model"], provenance["engine"],
            provenance["engine_version"], provenance["tensor_parallel_size"]) == (
        "4x h100_sxm", "Qwen/Qwen3-32B", "vllm", "0.12.0", 4)
    assert calibration.document["ttft"]["prefill_per_prompt_token_s"] > 0  # two prompt lengths measured
    checked = sdplan("validate", "-c", str(out), str(DATA), "--select", QWEN_TP4, "--max-error", "10%")
    assert checked.exit_code == 0, checked.stderr
    other = sdplan("validate", "-c", str(out), str(DATA), "--select", QWEN_TP4.replace("tp=4", "tp=2"),
                   "--max-error", "10%")
    assert other.exit_code == 1  # a TP 4 calibration does not predict TP 2


@pytest.mark.parametrize(("select", "status"), [("model=Qwen3-33B", 3), ("gpu=h100", 2), (None, 3)])
def test_cli_bad_selections_are_one_line_errors(sdplan, tmp_path: Path, select: str | None, status: int) -> None:
    result = sdplan("fit", str(DATA), *(["--select", select] if select else []), "-o", str(tmp_path / "x.toml"))
    assert result.exit_code == status
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("select", [QWEN_TP4, "model=Llama-3.1-70B"])
def test_held_out_concurrencies_meet_the_goal(select: str) -> None:
    """Fit on every other concurrency (lowest and highest included), check the rest: the issue's goal limits."""
    runs, _ = load_runs([str(DATA)], "auto", None, None, silicon.Selection.parse([select]))
    levels = sorted({run.concurrency for run in runs})
    held_levels = set(levels[1:-1:2])
    train = [run for run in runs if run.concurrency not in held_levels]
    held = [run for run in runs if run.concurrency in held_levels]
    assert held and len(train) > len(held)
    fit = fit_pooled(train)
    e2e, tpot, ttft = [], [], []
    for run in held:
        coefficients = fit.coefficients_at(run.prompt_tokens, run.output_tokens)
        latency = predict_latency(coefficients, run)
        first = predict_ttft(coefficients, run, latency)
        e2e.append(abs(latency / run.mean_e2e_latency_s - 1))
        tpot.append(abs((latency - first) / (run.output_tokens - 1) / run.mean_tpot_s - 1))
        ttft.append(abs(first / run.mean_ttft_s - 1))
    assert all(math.isfinite(v) for v in e2e + tpot + ttft)
    e2e_pct, tpot_pct, ttft_pct = (100 * sum(v) / len(v) for v in (e2e, tpot, ttft))
    assert e2e_pct <= 10 and tpot_pct <= 10 and ttft_pct <= 25, (e2e_pct, tpot_pct, ttft_pct)


def test_a_fixed_part_of_the_step_cost_is_fitted_where_contexts_vary() -> None:
    """Qwen3-32B TP4 spans mean contexts 1088-4608: the per-sequence step cost is affine in the context."""
    runs, _ = load_runs([str(DATA)], "auto", None, None, silicon.Selection.parse([QWEN_TP4]))
    fit = fit_pooled(runs)
    assert 0.2 < fit.fixed_step_share < 0.4  # 30%: a sharp profile keeps its minimum
    assert any("the runs determine it" in note for note in fit.notes), fit.notes
    proportional = fit_pooled(runs, fixed_step_share=0.0)
    assert fit.mape_pct < 0.5 * proportional.mape_pct  # 0.8% against 3.4%
    one_shape = [r for r in runs if (r.prompt_tokens, r.output_tokens) == (1024.0, 1024.0)]
    assert fit_pooled(one_shape).fixed_step_share == 0.0  # one context cannot tell the parts apart


def test_the_written_calibration_predicts_what_the_fit_did(sdplan, tmp_path: Path) -> None:
    import json

    out = tmp_path / "fit.toml"
    report = sdplan("fit", str(DATA), "--select", QWEN_TP4, "-o", str(out), "-f", "json")
    assert report.exit_code == 0, report.stderr
    calibration = load_calibration(out)
    baseline = calibration.document["coefficients"]["baseline"]
    assert 0 < baseline["c2_step_fixed_s"] <= baseline["c2_step_s"]
    pooled = json.loads(report.stdout)["pooled"]
    share = pooled["c2_step_fixed_share"]
    assert baseline["c2_step_fixed_s"] == pytest.approx(share * baseline["c2_step_s"])
    # a sharp profile: the share's spread is small, and written where the intervals read it
    sd_pct = calibration.document["uncertainty"]["step_share_sd_pct"]
    assert sd_pct == pytest.approx(pooled["c2_step_fixed_share_sd_pct"], abs=0.01) and 0 < sd_pct < 10
    runs, _ = load_runs([str(DATA)], "auto", None, None, silicon.Selection.parse([QWEN_TP4]))
    fit = fit_pooled(runs)
    for run in runs:
        written = calibration.coefficients_at(run.prompt_tokens, run.output_tokens)
        fitted = fit.coefficients_at(run.prompt_tokens, run.output_tokens)
        assert written.baseline_c2_step_s == pytest.approx(fitted.baseline_c2_step_s, rel=1e-5)
        assert predict_latency(written, run) == pytest.approx(predict_latency(fitted, run), rel=1e-5)
    # scale_direct's rule, by hand: the fixed part stays, the rest scales with the mean context p + g/2
    reference = calibration.document["reference_workload"]
    s_ref = reference["prompt_tokens"] + reference["output_tokens"] / 2
    at = calibration.coefficients_at(1024, 128)
    expected = baseline["c2_step_fixed_s"] + (baseline["c2_step_s"] - baseline["c2_step_fixed_s"]) * (1024 + 64) / s_ref
    assert at.baseline_c2_step_s == pytest.approx(expected)


def test_intervals_of_a_fitted_calibration_centre_on_its_prediction(tmp_path: Path, sdplan) -> None:
    """The uncertainty draws scale c2_step as the file does, away from the reference workload too."""
    import numpy as np

    from sdplan.planning.uncertainty import coefficient_draws

    out = tmp_path / "fit.toml"
    assert sdplan("fit", str(DATA), "--select", QWEN_TP4, "-o", str(out)).exit_code == 0
    calibration = load_calibration(out)
    draws = coefficient_draws(calibration, 1024, 512)
    assert draws is not None
    point = calibration.coefficients_at(1024, 512).baseline_c2_step_s
    assert float(np.median([d.baseline_c2_step_s for d in draws])) == pytest.approx(point, rel=0.05)


def test_a_utf16_file_fits_with_its_provenance(sdplan, tmp_path: Path) -> None:
    """The reader takes UTF-16 with its mark; the provenance lookup reads it the same way (was exit 70)."""
    utf16 = tmp_path / "silicon_utf16.csv"
    utf16.write_bytes(DATA.read_text(encoding="utf-8").encode("utf-16"))
    out = tmp_path / "fit.toml"
    result = sdplan("fit", str(utf16), "--select", QWEN_TP4, "-o", str(out))
    assert result.exit_code == 0, result.output
    assert load_calibration(out).document["provenance"]["tensor_parallel_size"] == 4


def test_a_measurement_listed_twice_is_one_run(tmp_path: Path) -> None:
    """AIConfigurator lists some runs under several ids, some rounded (338.3364 / 6.3327 ms and 338.34 / 6.33 for
    one Qwen3.5-397B row): such a repeat is one run and said so; a run of the same point that differs is kept."""
    rows = raw_rows()
    first = next(i for i, row in enumerate(rows) if row["model_path"] == "Qwen/Qwen3-32B" and row["tp_size"] == "4"
                 and row["mode"] == "agg" and row["backend"] == "vllm")
    relisted = dict(rows[first], id=rows[first]["id"] + "_relisted",
                    silicon_ttft_ms=f"{float(rows[first]['silicon_ttft_ms']):.2f}",
                    silicon_tpot_ms=f"{float(rows[first]['silicon_tpot_ms']):.2f}")
    rerun = dict(rows[first], id=rows[first]["id"] + "_rerun",
                 silicon_ttft_ms=str(1.03 * float(rows[first]["silicon_ttft_ms"])))
    path = tmp_path / "silicon_sample.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows[:first + 1] + [relisted, rerun] + rows[first + 1:])
    runs, warnings = load_runs([str(path)], "auto", None, None, silicon.Selection.parse([QWEN_TP4]))
    assert len(runs) == 31
    assert len(warnings) == 1 and "1 of 32 rows repeat a measurement" in warnings[0] and "counted once" in warnings[0]
    points = [(r.prompt_tokens, r.output_tokens, r.concurrency) for r in runs]
    assert points.count(points[0]) == 2  # the first row and its rerun, not its relisting


def test_rows_whose_requests_waited_for_admission_are_told_by_their_ttft() -> None:
    """A closed loop whose mean TTFT is over 5x that of the fewest clients at the same lengths had requests
    waiting for admission; the fewest clients themselves, other lengths and 5x exactly are not flagged."""
    from sdplan.runs.record import BenchmarkRun

    def run(clients: int, prompt: float, ttft_s: float) -> BenchmarkRun:
        e2e = ttft_s + 1023 * 0.01
        return BenchmarkRun(source=f"N={clients}", requested_rate_rps=None, achieved_rate_rps=clients / e2e,
                            draft_length=0, alpha=None, prompt_tokens=prompt, output_tokens=1024.0,
                            mean_e2e_latency_s=e2e, mean_ttft_s=ttft_s, mean_tpot_s=0.01, concurrency=clients)

    runs = [run(64, 1024, 0.169), run(4, 1024, 0.0593), run(512, 1024, 23.8), run(16, 1024, 5 * 0.0593),
            run(512, 8192, 1.2), run(8, 8192, 0.3056)]
    assert silicon.waited_for_admission(runs) == [False, False, True, False, False, False]
    assert silicon.waited_for_admission([run(8, 1024, 0.07)]) == [False]
