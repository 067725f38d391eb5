"""Plots: terminal (plotext) and files (matplotlib), checked for content, not just existence."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sdplan.errors import ExitStatus
from tests.results_fixtures import write_vllm

PLAN = ["plan", "--acceptance", "0.8", "--draft-lengths", "1-4", "--rates", "0.5:13:0.5"]


def test_terminal_plan_plot_has_every_series(sdplan) -> None:
    result = sdplan(*PLAN, "--plot", "--ascii")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for needle in ("no SD", "k=1", "k=4", "mean E2E latency (s) vs request rate", "speedup over no SD (x)",
                   "best draft length vs request rate", "request rate (req/s)", "best k (0 = SD off)"):
        assert needle in out, needle
    assert "\x1b[" not in out  # no colour codes in logs
    assert max(len(line) for line in out.split("Mean end-to-end")[0].splitlines() if line) < 300


def test_plan_plot_files(sdplan, tmp_path: Path) -> None:
    png, svg = tmp_path / "plan.png", tmp_path / "plan.svg"
    assert sdplan(*PLAN, "--plot-file", str(png), "-f", "json").exit_code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    result = sdplan(*PLAN, "--acceptance", "0.85", "--plot-file", str(svg))
    assert result.exit_code == 0, result.output
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    for label in ("request rate (req/s)", "mean E2E latency (s)", "speedup over no SD (x)", "best draft length k",
                  "h100-sxm_llama-3.1-8b_llama-3.2-1b_derived", "break-even (1x)", "no SD", "k=3"):
        assert label in text, label
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # written atomically


def test_capacity_plots(sdplan, tmp_path: Path) -> None:
    args = ["capacity", "--slo", "e2e:mean<=5s", "--acceptance", "0.8", "-k", "1-4"]
    result = sdplan(*args, "--plot", "--ascii")
    assert result.exit_code == 0, result.output
    assert "Highest request rate under e2e:mean<=5s" in result.stdout and "k=3" in result.stdout
    svg = tmp_path / "capacity.svg"
    assert sdplan(*args, "--plot-file", str(svg)).exit_code == 0
    assert "max request rate under SLO (req/s)" in svg.read_text()


def test_validate_plots(sdplan, tmp_path: Path) -> None:
    paths = [str(p) for p in write_vllm(tmp_path / "runs")]
    svg = tmp_path / "validate.svg"
    result = sdplan("validate", *paths, "--plot", "--plot-file", str(svg), "--ascii")
    assert result.exit_code == 0, result.output
    assert "predicted = measured" in result.stdout and "runs" in result.stdout
    text = svg.read_text()
    assert "measured mean E2E latency (s)" in text and "+/-10%" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--plot", "-f", "json"], "--plot-file"),
    (["--plot-file", "out.pdf"], ".png or .svg"),
])
def test_plot_usage_errors(sdplan, args, message) -> None:
    result = sdplan("plan", *args)
    assert result.exit_code == ExitStatus.USAGE and message in result.stderr


def test_plot_file_without_matplotlib_exits_5(sdplan, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = sdplan("plan", "--plot-file", str(tmp_path / "x.png"))
    assert result.exit_code == ExitStatus.MISSING_DEPENDENCY
    assert "pip install -e '.[plot]'" in result.stderr
    assert not (tmp_path / "x.png").exists()
