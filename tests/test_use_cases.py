"""The use cases behind ``fit``, ``validate``, ``show`` and ``calibrations``, called without the CLI.

Each command parses its options into one typed request and calls one function; these tests call the functions
directly, so that what a command does is checked apart from how its options are spelled.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sdplan.calibration.views import ShowRequest, list_shipped, show_calibration
from sdplan.errors import InvalidValueError
from sdplan.fitting.steady_state import screen
from sdplan.inputs.acceptance import expected_tokens_per_cycle
from sdplan.measure.fit_runs import FitRequest, Fitted, ProvenanceGiven, fit_runs
from sdplan.measure.result_files import ResultFiles, result_alpha
from sdplan.measure.validate_runs import ValidateRequest, passes, validate_runs
from sdplan.planning.scenario import AcceptanceGiven
from sdplan.runs import load_runs

DATA = Path(__file__).parent / "data"
UNKNOWN = ProvenanceGiven(hardware="unknown (set --hardware)", target_model="unknown (set --target-model)",
                          draft_model="unknown (set --draft-model)", engine_version="unknown")


def test_result_alpha_takes_one_value_in_one_metric() -> None:
    assert result_alpha(AcceptanceGiven()) is None
    assert result_alpha(AcceptanceGiven(alpha=[0.7])) == pytest.approx(0.7)
    # a mean acceptance length at k converts to the alpha that commits that many tokens per cycle
    alpha = result_alpha(AcceptanceGiven(mean_length=[2.8], measured_at_k=4))
    assert alpha is not None and float(expected_tokens_per_cycle(alpha, 4)) == pytest.approx(2.8, rel=1e-6)
    for refused in (AcceptanceGiven(alpha=[0.7, 0.8]), AcceptanceGiven(alpha=[0.7], mean_length=[2.0]),
                    AcceptanceGiven(measured_at_k=4), AcceptanceGiven(position_rates=[0.9, 0.8])):
        with pytest.raises(InvalidValueError):
            result_alpha(refused)


def test_the_max_error_gate() -> None:
    assert passes(50.0, None)
    assert passes(10.0, 10.0) and not passes(10.01, 10.0)
    assert not passes(math.inf, 1e9)  # an unstable prediction never passes


def test_fit_reports_every_run_the_screen_leaves_out_as_it_goes() -> None:
    runs, _ = load_runs([str(DATA / "served-cpu")], "auto", None, None)
    expected = [f"left out {run.source}: {'; '.join(screen(run))}" for run in runs if screen(run)]
    heard: list[str] = []
    outcome = fit_runs(FitRequest(files=ResultFiles(results=(str(DATA / "served-cpu"),)), output=None, name=None,
                                  given=UNKNOWN), on_left_out=heard.append)
    assert isinstance(outcome, Fitted)
    assert expected and heard == expected
    assert len(outcome.kept) + len(outcome.dropped) == len(runs)
    assert outcome.document["provenance"]["notes"].startswith(
        f"{len(outcome.kept)} runs fitted, {len(outcome.dropped)} left out by the screen")
    assert outcome.written == "-" and outcome.document["name"] == "fitted"


def test_a_held_out_fit_records_the_held_out_error_in_its_quality() -> None:
    request = FitRequest(files=ResultFiles(results=(str(DATA / "served-cpu"),)), output=Path("box.toml"),
                         name=None, given=UNKNOWN, holdout_by="highest-load")
    outcome = fit_runs(request)
    assert isinstance(outcome, Fitted) and outcome.holdout is not None
    held = len(outcome.holdout.errors) + len(outcome.holdout.skipped)
    detail = outcome.document["fit_quality"]["detail"]
    assert detail.endswith(f"; held-out {held} runs (highest-load): MAPE={outcome.holdout.mape_pct:.2f}%")
    assert outcome.document["name"] == "box" and outcome.written == "box.toml"
    assert outcome.calibration_toml.startswith("# Fitted with 'sdplan fit'")


def test_validate_uses_the_calibrations_acceptance_for_sd_runs_without_one(tmp_path: Path) -> None:
    box, alpha = tmp_path / "box.toml", 0.61
    fitted = fit_runs(FitRequest(files=ResultFiles(results=(str(DATA / "served-cpu"),)), output=box, name=None,
                                 given=UNKNOWN))
    assert "[acceptance]" not in fitted.calibration_toml
    box.write_text(fitted.calibration_toml + f'\n[acceptance]\nper_token_alpha = {alpha}\nsource = "a test"\n')
    heard: list[list[str]] = []
    # GuideLLM reports do not record SD: --draft-length 4 makes them SD runs with no acceptance of their own
    # (the folder's vLLM files record no SD and stay so)
    files = ResultFiles(results=(str(DATA / "guidellm-cpu"),), draft_length=4)
    outcome = validate_runs(ValidateRequest(calibration=str(box), files=files, max_error_pct=1e-9),
                            on_read=heard.append)
    assert len(heard) == 1  # the readers' warnings, said once the runs are read
    assert not outcome.passed and outcome.max_error_pct == 1e-9
    runs = [e.run for e in outcome.validation.errors] + [run for run, _ in outcome.validation.skipped]
    sd = [run for run in runs if run.draft_length > 0]
    assert sd and all(run.alpha == pytest.approx(alpha) for run in sd)
    assert all(run.alpha is None for run in runs if run.draft_length == 0)  # no SD: nothing to fill in


def test_show_evaluates_at_the_lengths_given_else_the_reference() -> None:
    reference = show_calibration(ShowRequest())
    cal = reference.calibration
    assert reference.coefficients == cal.coefficients_at(cal.reference_prompt_tokens, cal.reference_output_tokens)
    longer = show_calibration(ShowRequest(prompt_tokens=4 * cal.reference_prompt_tokens))
    assert longer.coefficients == cal.coefficients_at(4 * cal.reference_prompt_tokens, cal.reference_output_tokens)
    assert longer.coefficients != reference.coefficients
    c1, c2 = reference.baseline_demand
    assert c1 > 0 and c2 > 0


def test_every_shipped_calibration_is_listed_and_loads() -> None:
    listing = list_shipped()
    assert listing.entries and all(entry.error is None and entry.calibration is not None
                                   for entry in listing.entries)
    assert listing.default_name in {entry.calibration.name for entry in listing.entries if entry.calibration}
