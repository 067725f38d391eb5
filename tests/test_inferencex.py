"""InferenceX benchmark rows: the reader, and fit/validate on them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sdplan.errors import ExitStatus, InputFileError
from sdplan.runs import load_runs, read_results
from sdplan.runs.inferencex import read as read_row

DATA = Path(__file__).parent / "data" / "inferencex"
ROWS = DATA / "rows.json"
RUNNER = DATA / "runner"
SERVED = Path(__file__).parent / "data" / "served-cpu"


def _rows() -> list[dict[str, Any]]:
    return json.loads(ROWS.read_text())


def test_api_rows_and_runner_rows_read_as_the_vllm_files_they_came_from() -> None:
    api, api_warnings = read_results(ROWS)
    runner, _ = read_results(RUNNER)
    assert not api_warnings and len(api) == len(runner) == 12
    vllm = {path.name: read_results(path)[0][0] for path in sorted(SERVED.glob("*_c*_r0.json"))}
    by_source = {run.source.split("/")[-1].removeprefix("agg_"): run for run in runner}
    for name, original in vllm.items():
        row = by_source[name]
        assert row.concurrency == original.concurrency and row.closed_loop
        assert row.draft_length == original.draft_length
        assert row.mean_e2e_latency_s == pytest.approx(original.mean_e2e_latency_s, rel=1e-6)
        assert row.mean_ttft_s == pytest.approx(original.mean_ttft_s, abs=1e-6)  # vLLM: from 1-us-rounded lists
        assert row.prompt_tokens == pytest.approx(original.prompt_tokens, abs=0.5)
        if original.draft_length:
            # the acceptance length converts to the same alpha as vLLM's own fields
            assert row.alpha == pytest.approx(original.alpha, abs=1e-5)
            assert row.mean_acceptance_length == pytest.approx(original.mean_acceptance_length, rel=1e-6)
    assert sorted((r.draft_length, r.concurrency) for r in api) == sorted((r.draft_length, r.concurrency)
                                                                           for r in runner)
    assert all(r.source.startswith("rows.json#") for r in api)


def test_fit_on_rows_gives_coefficients_validate_accepts(sdplan: Any, tmp_path: Path) -> None:
    calibration = tmp_path / "ix.toml"
    fit = sdplan("fit", str(ROWS), "-o", str(calibration), "-f", "json")
    assert fit.exit_code == 0, fit.output
    assert json.loads(fit.stdout)["pooled"]["points"] == 12
    result = sdplan("validate", "-c", str(calibration), str(RUNNER), "--max-error", "25%", "-f", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["passed"] and len(document["runs"]) == 12
    assert document["summary"]["mape_pct"] < 25


def test_sd_rows_without_the_draft_length_are_left_out_not_read_as_no_sd(sdplan: Any, tmp_path: Path) -> None:
    rows = _rows()
    for row in rows:
        row.pop("num_speculative_tokens", None)
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    runs, _ = read_results(path)
    unknown = [run for run in runs if run.speculation_unrecorded]
    assert len(unknown) == 8 and all(run.draft_length == 0 for run in unknown)
    result = sdplan("fit", str(path), "-o", str(tmp_path / "c.toml"))
    assert "num_speculative_tokens" in result.stderr and "FILE:k=K" in result.stderr
    # per-file facts supply it (a file holding one arm's rows); alpha then comes from the rows' acceptance length
    k4_latencies = {r["metrics"]["mean_e2el"] for r in _rows() if r.get("num_speculative_tokens") == 4}
    only_k4 = tmp_path / "k4.json"
    only_k4.write_text(json.dumps([row for row in rows if row["metrics"]["mean_e2el"] in k4_latencies]))
    recorded = {run.concurrency: run.alpha for run in read_results(ROWS)[0] if run.draft_length == 4}
    filled, _ = load_runs([f"{only_k4}:k=4"], "auto", None, None)
    assert len(filled) == 4 and all(run.speculation_unrecorded is None and run.draft_length == 4 for run in filled)
    assert {run.concurrency: run.alpha for run in filled} == pytest.approx(recorded, abs=1e-12)
    # so do the flags, for the rows that do not record it
    flagged, _ = load_runs([str(only_k4)], "auto", 4, None)
    assert {run.concurrency: run.alpha for run in flagged} == pytest.approx(recorded, abs=1e-12)


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
    ({"num_speculative_tokens": 4, "acceptance_length": 9.0}, "acceptance_length"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
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
