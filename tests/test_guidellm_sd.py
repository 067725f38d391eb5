"""GuideLLM reports of SD runs: tokens per streamed iteration are the acceptance length; the draft length is given.

The base is a real GuideLLM 0.8.1 report (tests/data/guidellm-cpu/gl-concurrent8.json, a closed loop of 8,
no SD). Its ``metrics`` were trimmed to what sdplan read before; the tests add GuideLLM 0.8's per-iteration
entries in its documented shape (``metrics.<name>.successful.mean``, ``guidellm/benchmark/schemas/metrics.py``)
with the acceptance length of a real vLLM run: 2.9494 tokens per cycle, ``draft_model`` at k = 4
(tests/data/served-cpu/k4_c4_r0.json, ``spec_decode_acceptance_length``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sdplan.acceptance import alpha_from_mean_length
from sdplan.errors import ExitStatus
from sdplan.runs import load_runs, read_results, screen

REPORT = Path(__file__).parent / "data" / "guidellm-cpu" / "gl-concurrent8.json"
VLLM_K4 = Path(__file__).parent / "data" / "served-cpu" / "k4_c4_r0.json"
LENGTH = json.loads(VLLM_K4.read_text())["spec_decode_acceptance_length"]


def _report(tmp_path: Path, **metrics: float) -> Path:
    document = json.loads(REPORT.read_text())
    for name, mean in metrics.items():
        document["benchmarks"][0]["metrics"][name] = {"successful": {"mean": mean}}
    path = tmp_path / "sd.json"
    path.write_text(json.dumps(document))
    return path


def test_tokens_per_iteration_show_sd_and_the_draft_length_is_asked_for(tmp_path: Path, sdplan: Any) -> None:
    path = _report(tmp_path, iter_tokens_per_iteration=LENGTH)
    (run,), _ = read_results(path)
    assert run.draft_length == 0 and run.mean_acceptance_length == pytest.approx(LENGTH)
    assert "2.95 output tokens per streamed iteration" in run.speculation_unrecorded
    assert any("FILE:k=K" in reason and "--draft-length" in reason for reason in screen(run))
    result = sdplan("fit", str(path), "-o", str(tmp_path / "c.toml"))
    assert result.exit_code == ExitStatus.INFEASIBLE  # no usable run
    assert "SD was on" in result.stderr and "--draft-length" in result.stderr


@pytest.mark.parametrize("how", ["per file", "flag"])
def test_with_the_draft_length_alpha_follows_from_the_tokens_per_iteration(tmp_path: Path, how: str) -> None:
    path = _report(tmp_path, iter_tokens_per_iteration=LENGTH)
    if how == "per file":
        (run,), _ = load_runs([f"{path}:k=4"], "auto", None, None)
    else:
        (run,), _ = load_runs([str(path)], "auto", 4, 0.5)  # a flag alpha does not override the measured length
    assert run.draft_length == 4 and run.speculation_unrecorded is None
    assert run.alpha == pytest.approx(float(alpha_from_mean_length(LENGTH, 4)), abs=1e-12)
    (vllm_run,), _ = read_results(VLLM_K4)
    assert run.alpha == pytest.approx(vllm_run.alpha, abs=1e-9)  # what vLLM's own counters give
    assert not any("SD" in reason for reason in screen(run))


def test_output_tokens_per_iteration_alone_gives_the_same_length(tmp_path: Path) -> None:
    # sum g / sum n over all chunks, the first chunk's single token included: o = g / (1 + (g - 1)/E)
    (plain,), _ = read_results(REPORT)
    g = plain.output_tokens
    path = _report(tmp_path, output_tokens_per_iteration=g / (1.0 + (g - 1.0) / LENGTH))
    (run,), _ = read_results(path)
    assert run.mean_acceptance_length == pytest.approx(LENGTH, rel=1e-9)


@pytest.mark.parametrize("metrics", [{"iter_tokens_per_iteration": 1.0}, {"iter_tokens_per_iteration": 1.04},
                                     {"output_tokens_per_iteration": 1.0}, {}])
def test_one_token_per_iteration_or_no_record_is_read_as_no_sd(tmp_path: Path, metrics: dict[str, float]) -> None:
    (run,), _ = read_results(_report(tmp_path, **metrics))
    assert run.draft_length == 0 and run.speculation_unrecorded is None and screen(run) == []


def test_a_length_past_the_given_draft_length_is_noted(tmp_path: Path) -> None:
    (run,), _ = load_runs([f"{_report(tmp_path, iter_tokens_per_iteration=LENGTH)}:k=1"], "auto", None, None)
    assert run.alpha is None and any("does not fit draft length 1" in note for note in run.notes)
    assert any(reason.startswith("SD run without acceptance") for reason in screen(run))
