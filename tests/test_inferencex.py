"""InferenceX benchmark rows: the fixtures against InferenceX's published shapes, the reader, fit/validate on them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sdplan.errors import ExitStatus, InputFileError
from sdplan.inputs.acceptance import alpha_from_mean_length
from sdplan.runs import load_runs, read_results
from sdplan.runs.inferencex import read as read_row
from tests.inferencex_schema import API_FIELDS, RUNNER_FIELDS, api_row, runner_row

DATA = Path(__file__).parent / "data" / "inferencex"
ROWS = DATA / "rows.json"
RUNNER = DATA / "runner"
SERVED = Path(__file__).parent / "data" / "served-cpu"
#: The runner environment of the fixtures (the README says which values are ours).
ENV = {"RUNNER_TYPE": "cpu-epyc-2core", "FRAMEWORK": "vllm", "PRECISION": "fp32", "RESULT_FILENAME": "-",
       "ISL": "128", "OSL": "64", "DISAGG": "false", "MODEL_PREFIX": "tiny", "IMAGE": "vllm-cpu:0.32.0", "TP": "1",
       "EP_SIZE": "1", "DP_ATTENTION": "false"}


def _rows() -> list[dict[str, Any]]:
    return json.loads(ROWS.read_text())


def _served(name: str) -> dict[str, Any]:
    """The ``vllm bench serve`` result a runner row ``agg_NAME`` was converted from."""
    return json.loads((SERVED / name.removeprefix("agg_")).read_text())


def _vllm_acceptance_length(name: str) -> float:
    """vLLM's own mean acceptance length of the run (its spec_decode counters), which the row does not keep."""
    return float(_served(name)["spec_decode_acceptance_length"])


def test_fixtures_are_inferencex_conversions_of_real_vllm_results() -> None:
    """Each runner row is what process_result.py writes for its vLLM result; rows.json what the API returns."""
    runner = sorted(RUNNER.glob("agg_*.json"))
    assert len(runner) == 12
    for path in runner:
        row = json.loads(path.read_text())
        sd = "none" if path.name.startswith("agg_nosd") else "draft_model"
        assert row == runner_row(_served(path.name), {**ENV, "SPEC_DECODING": sd}), path.name
        measured = {key for key in row if key not in RUNNER_FIELDS}
        assert measured == {key.removesuffix("_ms") for key in _served(path.name) if key.endswith("ms")} | {
            key.removesuffix("_ms").replace("tpot", "intvty") for key in _served(path.name) if "tpot" in key}
        assert not any("spec" in key or "accept" in key or "draft" in key for key in measured)
    api = _rows()
    assert all(tuple(row) == API_FIELDS for row in api)
    expected = [api_row(json.loads((RUNNER / f"agg_{arm}_c{n}_r0.json").read_text()), model="tiny",
                        hardware="cpu-epyc-2core", date="2026-11-22") for arm in ("nosd", "k4") for n in (1, 2, 4, 8)]
    assert api == expected


def test_rows_read_as_the_vllm_files_they_came_from() -> None:
    api, api_warnings = read_results(ROWS)
    runner, _ = read_results(RUNNER)
    assert not api_warnings and len(api) == 8 and len(runner) == 12
    by_source = {run.source.split("/")[-1]: run for run in runner}
    for name, row in by_source.items():
        original = read_results(SERVED / name.removeprefix("agg_"))[0][0]
        assert row.concurrency == original.concurrency and row.closed_loop
        assert row.mean_e2e_latency_s == pytest.approx(original.mean_e2e_latency_s, rel=1e-6)
        assert row.mean_ttft_s == pytest.approx(original.mean_ttft_s, abs=1e-6)  # vLLM: from 1-us-rounded lists
        assert (row.prompt_tokens, row.output_tokens) == (128, 64)  # the configured lengths, as InferenceX writes
        if original.draft_length:
            # SD on, its draft length and acceptance unrecorded: left for the user to give, not read as no SD
            assert row.speculation_unrecorded is not None and "spec_decoding draft_model" in row.speculation_unrecorded
            assert not row.records_draft_length and row.alpha is None
        else:
            assert row.speculation_unrecorded is None and row.records_draft_length and row.draft_length == 0
    assert sum(run.speculation_unrecorded is not None for run in api) == 4
    assert all("spec_method draft_model" in run.speculation_unrecorded for run in api if run.speculation_unrecorded)
    assert all(r.source.startswith("rows.json#") for r in api)


def test_sd_rows_are_refused_with_how_to_give_the_draft_length(sdplan: Any, tmp_path: Path) -> None:
    result = sdplan("fit", str(RUNNER / "agg_k4_c1_r0.json"), str(RUNNER / "agg_k4_c2_r0.json"),
                    "-o", str(tmp_path / "c.toml"))
    assert result.exit_code == ExitStatus.INFEASIBLE, result.output  # fit: too few usable runs
    assert "spec_decoding draft_model" in result.stderr and "num_speculative_tokens" in result.stderr
    assert "FILE:k=K" in result.stderr and "--draft-length" in result.stderr
    assert "Traceback" not in result.output


def test_per_file_facts_give_draft_length_and_vllms_acceptance() -> None:
    """A runner row is one run of one arm: FILE:k=K,len=L gives both, L from the server's own counters."""
    arguments = [f"{path}:k={path.name[5]},len={_vllm_acceptance_length(path.name)!r}"
                 for path in sorted(RUNNER.glob("agg_k*.json"))]
    runs, _ = load_runs(arguments, "auto", None, None)
    assert len(runs) == 8
    for run in runs:
        original = read_results(SERVED / Path(run.source).name.removeprefix("agg_"))[0][0]
        assert run.speculation_unrecorded is None and run.draft_length == original.draft_length
        assert run.alpha == pytest.approx(original.alpha, abs=1e-9)


def test_flags_fill_only_the_sd_rows_of_an_array_that_mixes_arms() -> None:
    k4 = [_vllm_acceptance_length(f"k4_c{n}_r0.json") for n in (1, 2, 4, 8)]
    length = sum(k4) / len(k4)
    runs, _ = load_runs([str(ROWS)], "auto", 4, float(alpha_from_mean_length(length, 4)))
    assert sorted(run.draft_length for run in runs) == [0, 0, 0, 0, 4, 4, 4, 4]
    assert all(run.alpha is None for run in runs if run.draft_length == 0)
    assert all(run.speculation_unrecorded is None and run.alpha == pytest.approx(float(
        alpha_from_mean_length(length, 4))) for run in runs if run.draft_length == 4)


def test_fit_on_rows_given_their_sd_gives_coefficients_validate_accepts(sdplan: Any, tmp_path: Path) -> None:
    calibration = tmp_path / "ix.toml"
    given = [f"{path}:k={path.name[5]},len={_vllm_acceptance_length(path.name)!r}" if "_k" in path.name
             else str(path) for path in sorted(RUNNER.glob("agg_*.json"))]
    fit = sdplan("fit", *given, "-o", str(calibration), "-f", "json")
    assert fit.exit_code == 0, fit.output
    assert json.loads(fit.stdout)["pooled"]["points"] == 12
    result = sdplan("validate", "-c", str(calibration), *given, "--max-error", "25%", "-f", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["passed"] and len(document["runs"]) == 12
    assert document["summary"]["mape_pct"] < 25


@pytest.mark.parametrize(("change", "method"), [
    ({"spec_decoding": ""}, None), ({"spec_decoding": None}, None), ({"spec_decoding": "NONE"}, None),
    ({"spec_decoding": "MTP"}, "mtp"), ({"spec_decoding": "eagle3"}, "eagle3"),
])
def test_the_sd_method_is_read_as_inferencex_normalises_it(change: dict[str, Any], method: str | None) -> None:
    row = {**json.loads((RUNNER / "agg_nosd_c1_r0.json").read_text()), **change}
    run = read_row("agg.json", row)[0][0]
    assert (run.speculation_unrecorded is None) == (method is None)
    if method:
        assert f"spec_decoding {method};" in run.speculation_unrecorded


@pytest.mark.parametrize(("change", "message"), [
    ({"error": "server crashed"}, "failed run"),
    ({"isl": None}, "agentic"),
    ({"disagg": True}, "disaggregated"),
])
def test_rows_one_replica_does_not_describe_are_left_out_with_a_warning(change: dict[str, Any], message: str) -> None:
    row = {**_rows()[0], **change}
    runs, warnings = read_row("rows.json#[0]", row)
    assert runs == [] and message in warnings[0]


@pytest.mark.parametrize(("change", "key"), [
    ({"conc": 0}, "conc"),
    ({"conc": "many"}, "conc"),
    ({"osl": -5}, "osl"),
    ({"metrics": {"mean_e2el": 0}}, "metrics.mean_e2el"),
    ({"metrics": {"mean_e2el": "NaN"}}, "metrics.mean_e2el"),
])
def test_malformed_rows_name_the_field(change: dict[str, Any], key: str) -> None:
    row = {**next(r for r in _rows() if r["spec_method"] != "none"), **change}
    with pytest.raises(InputFileError) as error:
        read_row("rows.json#[3]", row)
    assert error.value.key == key


def test_an_empty_array_is_refused(sdplan: Any, tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text("[]")
    result = sdplan("validate", str(path))
    assert result.exit_code == ExitStatus.BAD_INPUT
    assert "empty" in result.stderr
