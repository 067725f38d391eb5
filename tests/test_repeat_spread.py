"""What repeated runs say about the least error any model can show against them (sdplan validate)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sdplan.fitting.validation import exact_model_error_pct, repeat_spread
from sdplan.runs import read_results

#: Real served runs: k=2 at 25/55/80% load, three passes on fresh servers (acc35), and the calibration.
PASSES = Path(__file__).parent / "data" / "served-passes-cpu"


def real_runs() -> list:
    return [read_results(path)[0][0] for path in sorted(PASSES.glob("pass*.json"))]


def test_two_runs_give_the_log_ratio_over_root_two() -> None:
    assert exact_model_error_pct([[1.0, 1.2]]) == pytest.approx(100 * math.log(1.2) / math.sqrt(2))
    # levels average; a level measured once says nothing
    assert exact_model_error_pct([[1.0, 1.0], [2.0, 2.0 * math.exp(0.2)], [5.0]]) == pytest.approx(
        100 * 0.1 / math.sqrt(2))
    assert exact_model_error_pct([[0.4, 0.4, 0.4]]) == 0.0
    assert exact_model_error_pct([[0.4], []]) is None


@pytest.mark.parametrize("passes", [2, 3, 5])
def test_it_estimates_an_exact_models_error_against_one_noisy_run(passes: int) -> None:
    """Log-normal noise of 12%: the estimate matches what the true means score, E|mu/m - 1|."""
    rng = np.random.default_rng(7)
    sigma = 0.12
    truth = rng.uniform(0.2, 3.0, size=4000)
    measured = truth[:, None] * np.exp(rng.normal(0.0, sigma, size=(4000, passes)))
    exact_error = 100 * float(np.mean(np.abs(truth[:, None] / measured - 1)))
    estimate = exact_model_error_pct(measured.tolist())
    assert estimate == pytest.approx(exact_error, rel=0.05)
    assert estimate == pytest.approx(100 * sigma * math.sqrt(2 / math.pi), rel=0.05)
    # the noise floor (one run as the prediction of another) is sqrt(2) larger: it is not this estimate
    floor = 100 * float(np.mean(np.abs(measured[:, 0] / measured[:, 1] - 1)))
    assert floor > 1.3 * estimate


def test_real_passes_repeat_three_levels() -> None:
    runs = real_runs()
    spread = repeat_spread(runs)
    assert spread is not None and spread.repeated_levels == 3 and spread.runs == 9
    # independently, from the files' own mean E2E (ms) grouped by load
    by_load: dict[str, list[float]] = {}
    for path in sorted(PASSES.glob("pass*.json")):
        by_load.setdefault(path.stem.split("-", 1)[1], []).append(json.loads(path.read_text())["mean_e2el_ms"])
    expected = np.mean([np.mean([abs(math.log(a / b)) / math.sqrt(2) for i, a in enumerate(v) for b in v[i + 1:]])
                        for v in by_load.values()]) * 100
    assert spread.exact_model_mape_pct == pytest.approx(expected, rel=1e-3)
    assert 3 < spread.exact_model_mape_pct < 20


def test_only_runs_of_one_level_repeat_each_other() -> None:
    runs = real_runs()
    assert repeat_spread([r for r in runs if "pass1" in r.source]) is None  # one pass: nothing repeats
    twice = [r for r in runs if "pass1" in r.source] * 2
    assert repeat_spread(twice) is None  # the same run given twice is no repeat
    # another draft length, or another acceptance, is another level
    other_k = [replace(r, draft_length=4) if "pass2" in r.source else r for r in runs]
    assert repeat_spread(other_k).runs == 6
    other_alpha = [replace(r, alpha=0.5) if "pass2" in r.source else r for r in runs]
    assert repeat_spread(other_alpha).runs == 6
    # another workload (prompts 50% longer) too
    longer = [replace(r, prompt_tokens=r.prompt_tokens * 1.5) if "pass3" in r.source else r for r in runs]
    assert repeat_spread(longer).runs == 6


def test_passes_in_folders_of_their_own_repeat_each_other(tmp_path, sdplan) -> None:
    """The benchmark's layout: validation/, validation-2/, ... with the same file names in each."""
    import shutil

    files = []
    for path in sorted(PASSES.glob("pass*.json")):
        folder = tmp_path / path.stem.split("-", 1)[0]
        folder.mkdir(exist_ok=True)
        files.append(str(shutil.copy(path, folder / path.name.split("-", 1)[1])))
    result = sdplan("validate", "-c", str(PASSES / "served.toml"), *files, "-f", "json")
    assert result.exit_code == 0, result.stderr
    spread = json.loads(result.stdout)["summary"]["repeat_spread"]
    assert spread is not None and spread["repeated_levels"] == 3 and spread["runs"] == 9
    assert spread["exact_model_mape_pct"] == pytest.approx(repeat_spread(real_runs()).exact_model_mape_pct, abs=1e-3)


def test_validate_reports_it_and_warns_of_a_gate_below_it(sdplan) -> None:
    files = [str(path) for path in sorted(PASSES.glob("pass*.json"))]
    calibration = str(PASSES / "served.toml")
    result = sdplan("validate", "-c", calibration, *files, "-f", "json")
    assert result.exit_code == 0, result.stderr
    spread = json.loads(result.stdout)["summary"]["repeat_spread"]
    assert spread["repeated_levels"] == 3 and spread["runs"] == 9
    floor = spread["exact_model_mape_pct"]
    table = sdplan("validate", "-c", calibration, *files)
    assert f"an exact model would score about {floor:.1f}%" in " ".join(table.stdout.split())
    below = sdplan("validate", "-c", calibration, *files, "--max-error", f"{floor / 2:.2f}%")
    assert below.exit_code == 1
    assert "below the" in below.stderr and "fails on noise" in below.stderr
    above = sdplan("validate", "-c", calibration, *files, "--max-error", "90%")
    assert above.exit_code == 0 and "fails on noise" not in above.stderr
    single = sdplan("validate", "-c", calibration, files[0], "-f", "json")
    assert json.loads(single.stdout)["summary"]["repeat_spread"] is None


def test_runs_of_equally_named_files_are_named_apart(tmp_path, sdplan) -> None:
    """validate names each run by its path relative to the folder all inputs share, so the passes'
    k2-poisson0.25.json in pass1/, pass2/, pass3/ are three rows that can be told apart."""
    import shutil

    files = []
    for path in sorted(PASSES.glob("pass*.json")):
        folder = tmp_path / "runs" / path.stem.split("-", 1)[0]
        folder.mkdir(parents=True, exist_ok=True)
        files.append(str(shutil.copy(path, folder / path.name.split("-", 1)[1])))
    result = sdplan("validate", "-c", str(PASSES / "served.toml"), *files, "-f", "json")
    sources = [run["source"] for run in json.loads(result.stdout)["runs"]]
    assert len(set(sources)) == len(sources) == 9
    assert "pass2/k2-poisson0.25.json" in sources and "pass3/k2-poisson0.8.json" in sources
    table = sdplan("validate", "-c", str(PASSES / "served.toml"), *files).stdout
    assert "│ pass1/k2-poisson0.55.json" in table and "│ pass2/k2-poisson0.55.json" in table


@pytest.mark.parametrize("passes", [2, 3])
def test_its_standard_deviation_recovers_the_noise(passes: int) -> None:
    """sd_pct = E sqrt(pi/2): the log-normal noise's own sigma (12%), from any number of repeats."""
    rng = np.random.default_rng(11)
    truth = rng.uniform(0.2, 3.0, size=3000)
    measured = truth[:, None] * np.exp(rng.normal(0.0, 0.12, size=(3000, passes)))
    template = real_runs()[0]  # one real run, copied to 3000 levels (requested rates) of `passes` repeats
    runs = [replace(template, mean_e2e_latency_s=float(value), requested_rate_rps=float(level + 1),
                    source=f"{level}-{index}")
            for level, values in enumerate(measured) for index, value in enumerate(values)]
    spread = repeat_spread(runs)
    assert spread is not None and spread.repeated_levels == 3000
    assert spread.sd_pct == pytest.approx(12.0, rel=0.05)


def test_a_fit_of_repeated_real_runs_stores_their_spread() -> None:
    """The real quick-grid calibration of acc41 (tests/data/served-frontend-floor-cpu): N = 1 and 64 on two
    server instances of each configuration."""
    from sdplan.fitting.fit import fit_pooled, fitted_document

    runs = read_results(Path(__file__).parent / "data" / "served-frontend-floor-cpu", "vllm")[0]
    fit = fit_pooled(runs)
    spread = repeat_spread(runs)
    assert spread is not None and spread.repeated_levels == 6 and spread.runs == 12
    assert fit.repeat_sd_pct == pytest.approx(spread.sd_pct)
    assert 3.0 < fit.repeat_sd_pct < 20.0
    assert any("6 load levels" in note and "repeat_sd_pct" in note for note in fit.notes)
    provenance = {"method": "fit", "hardware": "cpu", "target_model": "t", "draft_model": "d", "engine": "vllm",
                  "engine_version": "0.32.0", "date": "2026-11-27"}
    document = fitted_document(fit, runs, name="f", provenance=provenance, description="test")
    assert document["uncertainty"]["repeat_sd_pct"] == pytest.approx(fit.repeat_sd_pct, abs=0.005)
    # one instance per configuration: nothing repeats, and the file says nothing
    once = [run for run in runs if not run.source.endswith("_r1.json")]
    assert fit_pooled(once).repeat_sd_pct is None
    assert "repeat_sd_pct" not in fitted_document(fit_pooled(once), once, name="f", provenance=provenance,
                                                  description="test")["uncertainty"]
