"""The use cases behind ``plan``, ``simulate`` and ``derive``, called without the CLI.

Each command parses its options into one typed query and calls one function; these tests call the functions
directly, so that the rules of a command (defaults, refusals, warnings, intervals) are checked apart from how its
options are spelled and how its answer is drawn.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdplan.derive
from sdplan.derive import Derivation, DeriveRequest, derive_file
from sdplan.derive.document import HEADER, file_text
from sdplan.errors import InputFileError, InvalidValueError
from sdplan.latency import model
from sdplan.latency.coefficients import SPECULATIVE_PARAMETERS
from sdplan.planning import planner
from sdplan.planning.plan_answer import PlanQuery, answer_plan
from sdplan.planning.plan_intervals import with_intervals
from sdplan.planning.scenario import AcceptanceGiven, ScenarioOptions, resolve_scenario
from sdplan.planning.simulate_answer import DEFAULT_RATE_FRACTIONS, SimulateQuery, answer_simulate
from sdplan.planning.simulation_inputs import SimulationSettings
from sdplan.render.simulate import simulate_document
from sdplan.schema import read_toml

#: A diagonal covariance: every coefficient's standard error 5% of its value (``DIRECT_DOCUMENT`` in conftest).
DIRECT_VALUES = {"c1p_s": 0.05, "c2p_s": 0.01, "baseline_c1_step_s": 0.008, "baseline_c2_step_s": 0.0001,
                 "c1v_s": 0.009, "c2v_s": 0.0001, "c1d_s": 0.001, "c2d_s": 0.00005}


def _with_uncertainty(direct: dict[str, Any], not_identified: tuple[str, ...] = ()) -> dict[str, Any]:
    """A copy of ``direct`` with an ``[uncertainty]`` table naming ``not_identified``."""
    document, names = copy.deepcopy(direct), list(DIRECT_VALUES)
    document["uncertainty"] = {
        "parameters": names, "not_identified": list(not_identified),
        "covariance_s2": [[(0.05 * DIRECT_VALUES[a]) ** 2 if a == b else 0.0 for b in names] for a in names]}
    return document


def _scenario(calibration: str | None = None, alpha: float = 0.8, draft_lengths: list[int] | None = None):
    return resolve_scenario(ScenarioOptions(calibration=calibration, acceptance=AcceptanceGiven(alpha=[alpha]),
                                            draft_lengths=draft_lengths, single_acceptance=False))


def test_plan_defaults_to_the_rate_grid_up_to_saturation_and_says_intervals_do_not_apply() -> None:
    scenario = _scenario()
    answer = answer_plan(scenario, PlanQuery())
    expected = planner.default_rates(scenario.coefficients, scenario.draft_lengths, [0.8],
                                     tokens_per_cycle=scenario.tokens_per_cycle,
                                     batch_caps=scenario.limits.caps(scenario.draft_lengths))
    assert answer.plan.rates_rps.tolist() == expected and len(expected) == 12
    assert answer.inputs.calibration_name == scenario.calibration.name
    assert len(answer.inputs.cap_phrases) == len(scenario.draft_lengths) + 1
    assert not answer.intervals_apply and answer.inputs.intervals is None  # a derived calibration has no covariance
    given = answer_plan(scenario, PlanQuery(rates_rps=(1.0, 2.0)))
    assert given.plan.rates_rps.tolist() == [1.0, 2.0]


def test_only_a_table_bounds_the_rows_of_a_plan() -> None:
    scenario = _scenario(draft_lengths=[1])
    rates = tuple(float(r) for r in np.linspace(0.01, 1.0, 6000))
    assert len(answer_plan(scenario, PlanQuery(rates_rps=rates)).plan.rates_rps) == 6000
    with pytest.raises(InvalidValueError, match="table report"):
        answer_plan(scenario, PlanQuery(rates_rps=rates, for_table=True))


def test_plan_refuses_sd_from_a_calibration_fitted_without_sd_runs(write_calibration, direct_document) -> None:
    path = write_calibration(_with_uncertainty(direct_document, not_identified=SPECULATIVE_PARAMETERS))
    with pytest.raises(InputFileError, match="fitted from runs without SD"):
        answer_plan(_scenario(str(path), draft_lengths=[2]), PlanQuery(rates_rps=(1.0,)))


def test_plan_warns_of_the_coefficients_the_runs_did_not_identify(write_calibration, direct_document) -> None:
    path = write_calibration(_with_uncertainty(direct_document, not_identified=("c1d_s",)))
    answer = answer_plan(_scenario(str(path), draft_lengths=[2]), PlanQuery(rates_rps=(1.0,)))
    assert any(w.startswith("c1d_s of test-direct were not identified") for w in answer.inputs.warnings)
    plain = answer_plan(_scenario(str(write_calibration(direct_document, "plain")), draft_lengths=[2]),
                        PlanQuery(rates_rps=(1.0,)))
    assert not any("not identified" in w for w in plain.inputs.warnings)


def test_plan_intervals_hold_the_estimate_and_apply_only_without_goodput(write_calibration, direct_document) -> None:
    scenario = _scenario(str(write_calibration(_with_uncertainty(direct_document))), draft_lengths=[2, 4])
    answer = answer_plan(scenario, PlanQuery(rates_rps=(1.0, 5.0)))
    assert answer.intervals_apply and answer.inputs.intervals is None
    bounded = with_intervals(scenario, answer)
    intervals = bounded.inputs.intervals
    assert intervals is not None and bounded.plan is answer.plan
    low, high = intervals.latency_s[0], intervals.latency_s[1]
    estimate = answer.plan.latency_s
    assert np.all(low <= estimate * (1 + 1e-9)) and np.all(estimate <= high * (1 + 1e-9))
    assert np.any(high > low)
    assert not answer_plan(scenario, PlanQuery(rates_rps=(1.0,), goodput_policy=True)).intervals_apply


def test_a_plain_plan_loads_no_interval_model() -> None:
    """The intervals' modules stay off the path of a plan whose calibration has no covariance (cold start)."""
    probe = ("import io, json, sys\nfrom sdplan.cli import cli\nsys.stdout = io.StringIO()\n"
             "try:\n    cli.main(args=['plan'], prog_name='sdplan')\nexcept SystemExit as exit:\n"
             "    assert not exit.code\nsys.stdout = sys.__stdout__\nprint(json.dumps(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert "sdplan.planning.plan_answer" in loaded
    assert not {"sdplan.planning.plan_intervals", "sdplan.planning.uncertainty", "sdplan.fitting.runmodel"} & loaded


SMALL = SimulationSettings(requests=200, seeds=2, seed=5, arrival_cv=1.0)


def test_simulate_defaults_to_fractions_of_the_no_sd_saturation_rate() -> None:
    scenario = resolve_scenario(ScenarioOptions(acceptance=AcceptanceGiven(alpha=[0.8])))
    heard: list[tuple[int, int, str]] = []
    answer = answer_simulate(scenario, SimulateQuery(settings=SMALL, draft_length="off"),
                             progress=lambda *report: heard.append(report))
    # plan's no-SD saturation: the default file's KV cache fills (14.98 req/s) before 1/C2 (17.0 req/s)
    _, c2 = model.baseline_demand(scenario.coefficients)
    planned = answer_plan(scenario, PlanQuery(rates_rps=(1.0,))).plan.baseline_saturation_rate_rps
    assert planned < 1 / c2
    assert [s.rate_rps for s in answer.summaries] == pytest.approx([f * planned for f in DEFAULT_RATE_FRACTIONS],
                                                                   rel=1e-3)
    assert all(s.draft_length == 0 for s in answer.summaries)
    assert len(answer.limits) == len(answer.summaries) == len(DEFAULT_RATE_FRACTIONS)
    total = len(DEFAULT_RATE_FRACTIONS) * SMALL.seeds * SMALL.requests
    assert heard and all(t == total for _, t, _ in heard)
    assert max(d for d, _, _ in heard) <= total
    assert list(dict.fromkeys(label for _, _, label in heard)) == [f"{s.rate_rps:g} req/s" for s in answer.summaries]


def test_simulate_runs_the_models_best_k_and_reports_its_own_warnings() -> None:
    scenario = resolve_scenario(ScenarioOptions(acceptance=AcceptanceGiven(alpha=[0.8]), draft_lengths=[1, 3]))
    query = SimulateQuery(settings=SMALL, rates_rps=(1.0, 4.0), lengths_file="lengths.csv")
    answer = answer_simulate(scenario, query)
    best = planner.plan(scenario.coefficients, [1.0, 4.0], [1, 3], [0.8],
                        tokens_per_cycle=scenario.tokens_per_cycle).best_k[0]
    assert [s.draft_length for s in answer.summaries] == [max(int(k), 0) for k in best]
    document = simulate_document(answer)
    assert document["warnings"] == list(answer.warnings)
    assert document["workload"]["lengths_file"] == "lengths.csv"
    assert [row["request_rate_rps"] for row in document["rates"]] == [1.0, 4.0]
    assert document["settings"]["replications"] == SMALL.seeds and document["settings"]["seed"] == SMALL.seed


def test_simulate_runs_moe_and_refuses_over_budget_work() -> None:
    moe = resolve_scenario(ScenarioOptions(calibration="h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived",
                                           acceptance=AcceptanceGiven(alpha=[0.7])))
    assert moe.moe is not None
    answer = answer_simulate(moe, SimulateQuery(settings=SMALL, rates_rps=(1.0,)))
    assert len(answer.summaries) == 1 and math.isfinite(answer.summaries[0].analytic_e2e_s)
    dense = resolve_scenario(ScenarioOptions(acceptance=AcceptanceGiven(alpha=[0.8])))
    with pytest.raises(InvalidValueError, match="exceeds the budget"):
        answer_simulate(dense, SimulateQuery(settings=SimulationSettings(requests=1_000_000, seeds=3, seed=0,
                                                                         arrival_cv=1.0), rates_rps=(1.0,)))


def test_a_derived_file_is_its_document_under_the_header(monkeypatch, direct_document, tmp_path: Path) -> None:
    text = file_text(direct_document)
    (tmp_path / "written.toml").write_text(text)
    assert text.startswith(f"# {HEADER}\n") and read_toml(tmp_path / "written.toml") == direct_document
    seen: list[DeriveRequest] = []

    def fake_derive(request: DeriveRequest, progress: Any = None, measured: Any = None) -> Derivation:
        seen.append(request)
        return Derivation(document=direct_document, errors={}, anchor=None)

    monkeypatch.setattr(sdplan.derive, "derive", fake_derive)
    request = DeriveRequest(target_model="t", system="h100_sxm", method="ngram")
    derived = derive_file(request, str(tmp_path / "out.toml"))
    assert seen == [request] and derived.text == text
    assert derived.calibration.path == str(tmp_path / "out.toml") and derived.calibration.name == "test-direct"
