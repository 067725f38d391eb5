"""The fit's floor ``c2v >= c2_step`` (docs/model.md#fitting), on real served runs.

Data: tests/data/served-quick-floor-cpu (a quick-grid calibration whose SD prompt probes, fitted without
the floor, put none of SD's per-sequence cost on the context-scaled ``c2v``) and
tests/data/served-context-cpu (each configuration's own server measured at 128/64 and at 512/256 tokens,
4x the mean context), both README.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import sdplan.fitting.fit
from sdplan.fitting.fit import fit_pooled
from sdplan.fitting.runmodel import PARAMETERS, verify_floor
from sdplan.fitting.validation import predict_latency
from sdplan.runs import read_results

DATA = Path(__file__).parent / "data"


def quick_grid() -> list:
    return read_results(DATA / "served-quick-floor-cpu", "vllm")[0]


def growth(fit, configuration: str) -> tuple[float, float]:
    """Mean E2E at 512/256 over the mean of the two 128/64 runs on one server: (measured, predicted)."""
    runs = {name: read_results(DATA / "served-context-cpu" / f"{configuration}_{name}.json", "vllm")[0][0]
            for name in ("128-64_first", "512-256", "128-64_again")}
    predicted = {name: predict_latency(fit.coefficients_at(r.prompt_tokens, r.output_tokens), r)
                 for name, r in runs.items()}

    def ratio(values: dict) -> float:
        return values["512-256"] / ((values["128-64_first"] + values["128-64_again"]) / 2)

    return ratio({name: r.mean_e2e_latency_s for name, r in runs.items()}), ratio(predicted)


def test_the_floor_couples_c2v_to_c2_step_only_where_runs_have_both() -> None:
    runs = quick_grid()
    step, verify = PARAMETERS.index("baseline_c2_step_s"), PARAMETERS.index("c2v_s")
    both = verify_floor(runs)
    assert both[verify, step] == 1.0 and np.count_nonzero(both - np.eye(len(PARAMETERS))) == 1
    assert np.array_equal(verify_floor([r for r in runs if r.draft_length > 0]), np.eye(len(PARAMETERS)))
    assert np.array_equal(verify_floor([r for r in runs if r.draft_length == 0]), np.eye(len(PARAMETERS)))


def test_the_floor_holds_c2v_at_c2_step_and_says_so() -> None:
    fit = fit_pooled(quick_grid())
    assert fit.values["c2v_s"] == pytest.approx(fit.values["baseline_c2_step_s"], rel=1e-9)
    assert fit.values["c2v_s"] > 4e-4  # 0.55 ms; 2.7e-23 s without the floor
    assert any(note.startswith("c2v held at c2_step") for note in fit.notes), fit.notes
    assert fit.identified["c2v_s"] and math.isfinite(fit.stderr["c2v_s"])  # the covariance mapped back


def test_without_the_floor_the_same_runs_zero_c2v(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdplan.fitting.fit, "verify_floor", lambda runs: np.eye(len(PARAMETERS)))
    fit = fit_pooled(quick_grid())
    assert fit.values["c2v_s"] < 1e-6 < fit.values["baseline_c2_step_s"]
    assert not any(note.startswith("c2v held") for note in fit.notes)


@pytest.mark.parametrize("configuration", ["k2", "k4"])
def test_sd_at_four_times_the_context_grows_as_measured(configuration: str) -> None:
    measured, predicted = growth(fit_pooled(quick_grid()), configuration)
    # measured 6.75x (k=2) and 6.56x (k=4); predicted 6.59x and 5.92x with the floor
    assert predicted == pytest.approx(measured, rel=0.15)


@pytest.mark.parametrize("configuration", ["k2", "k4"])
def test_without_the_floor_sd_at_four_times_the_context_is_far_too_cheap(
        configuration: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdplan.fitting.fit, "verify_floor", lambda runs: np.eye(len(PARAMETERS)))
    measured, predicted = growth(fit_pooled(quick_grid()), configuration)
    assert predicted < 0.7 * measured  # 3.97x and 4.01x: SD's cost flat in the context


def test_no_sd_grows_as_measured_with_or_without_sd_runs() -> None:
    measured, predicted = growth(fit_pooled(quick_grid()), "nosd")
    assert predicted == pytest.approx(measured, rel=0.2)  # measured 7.59x, predicted 8.81x
