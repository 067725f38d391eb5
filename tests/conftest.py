"""Shared fixtures: a CLI runner with a pinned environment and calibration builders."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from sdplan.cli import cli
from sdplan.fileio import dumps_toml

#: A direct-form calibration whose numbers are easy to check by hand.
DIRECT_DOCUMENT: dict[str, Any] = {
    "schema_version": 1,
    "name": "test-direct",
    "description": "hand-made test calibration",
    "provenance": {
        "method": "fit",
        "hardware": "test GPU",
        "target_model": "target",
        "draft_model": "draft",
        "engine": "vllm",
        "engine_version": "0.0.0",
        "date": "2026-11-22",
    },
    "reference_workload": {"prompt_tokens": 1000, "output_tokens": 500},
    "fit_quality": {"r2": 0.99},
    "coefficients": {
        "c1p_s": 0.05,
        "c2p_s": 0.01,
        "baseline": {"c1_step_s": 0.008, "c2_step_s": 0.0001},
        "speculative": {"c1v_s": 0.009, "c2v_s": 0.0001, "c1d_s": 0.001, "c2d_s": 0.00005},
    },
}


@pytest.fixture(autouse=True)
def _pinned_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    for name in ("SDPLAN_CALIBRATION", "SDPLAN_DEBUG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def sdplan() -> Callable[..., Result]:
    """Run ``sdplan ARGS`` in-process; returns click's Result (stdout and stderr apart)."""
    runner = CliRunner()

    def run(*args: str, input: str | None = None) -> Result:
        return runner.invoke(cli, list(args), input=input, catch_exceptions=False, prog_name="sdplan")

    return run


@pytest.fixture
def direct_document() -> dict[str, Any]:
    return copy.deepcopy(DIRECT_DOCUMENT)


@pytest.fixture
def write_calibration(tmp_path: Path) -> Callable[[dict[str, Any], str], Path]:
    """Write a calibration document to ``tmp_path/NAME.toml`` and return the path."""

    def write(document: dict[str, Any], name: str = "cal") -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(dumps_toml(document), encoding="utf-8")
        return path

    return write
