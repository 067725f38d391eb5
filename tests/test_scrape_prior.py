"""``sdplan scrape`` (recording a live /metrics) and ``sdplan fit --prior`` (a calibration scaled to metrics)."""

from __future__ import annotations

import contextlib
import http.server
import json
import lzma
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sdplan.cli import cli
from sdplan.errors import EngineError, InvalidValueError
from sdplan.metrics.scrape import END_MARK, SCRAPE_MARK, ScrapeRequest, metrics_url, record_scrapes
from sdplan.runs import read_results
from tests.prometheus_recording import PINNED, through_run, write

DATA = Path(__file__).parent / "data" / "prometheus-cpu"
CPU_PRIOR = "cpu-epyc-2core_tiny-llama-h256-l4_tiny-llama-h128-l1_measured"


def real_scrape() -> bytes:
    """One scrape of the real server, as it served it (the fixture's first)."""
    text = lzma.open(DATA / "nosd.scrapes.xz", "rt").read()
    body = text.split("\n", 1)[1].split(END_MARK, 1)[0]
    return body.encode()


@contextlib.contextmanager
def serving(body: bytes) -> Iterator[str]:
    """A loopback HTTP server answering ``/metrics`` with ``body`` (404 elsewhere); yields its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            status = 200 if self.path == "/metrics" else 404
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            if status == 200:
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def server() -> Iterator[str]:
    with serving(real_scrape()) as url:
        yield url


def test_scrape_appends_whole_scrapes_with_their_times(server: str, tmp_path: Path) -> None:
    out = tmp_path / "live.scrapes"
    result = CliRunner().invoke(cli, ["scrape", server, "--every", "200ms", "--for", "0.6s", "-o", str(out)])
    assert result.exit_code == 0, result.output
    first = out.read_text()
    assert first.count(SCRAPE_MARK + " time=") == first.count(END_MARK) == 4
    result = CliRunner().invoke(cli, ["scrape", server, "--every", "200ms", "--for", "0.2s", "-o", str(out)])
    assert result.exit_code == 0 and "appended to" in result.output
    text = out.read_text()
    assert text.startswith(first) and text.count(END_MARK) == 6
    times = [float(line.split("time=")[1].split()[0]) for line in text.splitlines()
             if line.startswith(SCRAPE_MARK + " ")]
    assert times == sorted(times)
    assert real_scrape().decode() in text  # as served, byte for byte


def test_ctrl_c_stops_cleanly_after_the_write(server: str, tmp_path: Path) -> None:
    calls = []

    def sleep(seconds: float) -> None:
        calls.append(seconds)
        if len(calls) == 3:
            raise KeyboardInterrupt

    out = tmp_path / "stopped.scrapes"
    result = record_scrapes(ScrapeRequest(url=server, every_s=0.01, for_s=None, output=out), sleep=sleep)
    assert result.interrupted and result.scrapes == 3
    assert out.read_text().count(END_MARK) == 3


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["terminal", "background-of-a-script"])
def test_sigterm_stops_a_recording_cleanly(server: str, tmp_path: Path, sigint_ignored: bool) -> None:
    """``kill``, ``timeout`` and systemd send SIGTERM; a script's background job starts with SIGINT ignored.

    Either way the recording ends as Ctrl-C ends it: exit 0, whole scrapes, a last line naming the signal.
    """
    import os
    import signal
    import subprocess
    import sys
    import time

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    out = tmp_path / "stopped.scrapes"
    scraper = subprocess.Popen([sys.executable, "-m", "sdplan", "scrape", server, "--every", "100ms", "-o", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=ignore_sigint if sigint_ignored else None)
    try:
        deadline = time.monotonic() + 30.0
        while (not out.exists() or out.read_text().count(END_MARK) < 3) and time.monotonic() < deadline:
            time.sleep(0.05)
        if sigint_ignored:  # what the shell's background job would ignore, it ignores
            os.kill(scraper.pid, signal.SIGINT)
            time.sleep(0.3)
            assert scraper.poll() is None
        scraper.send_signal(signal.SIGTERM)
        stdout, stderr = scraper.communicate(timeout=30.0)
    finally:
        if scraper.poll() is None:
            scraper.kill()
            scraper.wait()
    assert scraper.returncode == 0, stderr
    assert "stopped by SIGTERM:" in stdout + stderr
    text = out.read_text()
    assert text.count(SCRAPE_MARK + " time=") == text.count(END_MARK) >= 3 and text.endswith(END_MARK + "\n")


def test_only_loopback_or_named_hosts(tmp_path: Path) -> None:
    assert metrics_url("127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://[::1]:8000/custom") == "http://[::1]:8000/custom"
    with pytest.raises(InvalidValueError, match="--allow-host 10.0.0.7"):
        metrics_url("http://10.0.0.7:8000")
    assert metrics_url("http://gpu7.lab:8000", ("gpu7.lab",)) == "http://gpu7.lab:8000/metrics"
    with pytest.raises(InvalidValueError, match="http and https"):
        metrics_url("file:///etc/passwd")
    result = CliRunner().invoke(cli, ["scrape", "http://example.com", "-o", str(tmp_path / "x")])
    assert result.exit_code == 2 and "not a loopback" in result.output


def test_nothing_serving_is_an_engine_error(tmp_path: Path) -> None:
    def refuse(url: str, timeout: float) -> bytes:
        raise OSError("connection refused")

    with pytest.raises(EngineError, match="no metrics"):
        record_scrapes(ScrapeRequest(url="http://127.0.0.1:9", every_s=1, for_s=1, output=tmp_path / "x"),
                       fetch=refuse)
    result = CliRunner().invoke(cli, ["scrape", "http://127.0.0.1:9", "--for", "1s", "--timeout", "1s",
                                      "-o", str(tmp_path / "y")])
    assert result.exit_code == 6 and result.output.startswith("Error:")


def test_a_failed_scrape_is_counted_and_the_recording_goes_on(tmp_path: Path) -> None:
    answers = iter([b"vllm:x 1\n", OSError("timeout"), b"vllm:x 2\n"])

    def fetch(url: str, timeout: float) -> bytes:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    result = record_scrapes(ScrapeRequest(url="http://localhost:1", every_s=0.01, for_s=0.02, output=tmp_path / "z"),
                            fetch=fetch, sleep=lambda s: None)
    assert (result.scrapes, result.failed, result.last_failure) == (2, 1, "timeout")


# ----------------------------------------------------------------------------- --prior


def test_a_prior_scaled_to_no_sd_metrics_predicts_the_sd_server_better(tmp_path: Path) -> None:
    """The shipped CPU calibration (another tiny model, another day) scaled to the no-SD server's windows,
    then asked about the SD server's windows, which it never saw."""
    from sdplan.calibration import load_calibration, resolve_calibration
    from sdplan.metrics.prior import gap

    out = tmp_path / "scaled.toml"
    result = CliRunner().invoke(cli, ["fit", str(DATA / "nosd.scrapes.xz"), "--prior", CPU_PRIOR, "-o", str(out),
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["measured_options"] == [0] and "not measured" in report["anchored"]
    assert report["gap_after"]["mape_pct"] < report["gap_before"]["mape_pct"]
    sd_windows, _ = read_results(DATA / "sd.scrapes.xz")
    scaled, prior = load_calibration(out), resolve_calibration(CPU_PRIOR)
    after, before = gap(scaled.coefficients_at, sd_windows), gap(prior.coefficients_at, sd_windows)
    assert after.mape_pct <= before.mape_pct  # measured: 12.9% against 85.0%
    assert "anchored, not measured" in out.read_text()


def test_one_load_level_scales_both_sides_by_one_factor() -> None:
    from sdplan.calibration import resolve_calibration
    from sdplan.metrics.prior import scale_prior

    windows, _ = read_results(DATA / "nosd.scrapes.xz")
    scaled = scale_prior(resolve_calibration(CPU_PRIOR), windows[:1], name="one", provenance={
        "method": "fit", "hardware": "cpu", "target_model": "t", "draft_model": "d", "engine": "vllm",
        "engine_version": "0.32.0", "date": "2026-11-29"})
    assert scaled.one_factor and scaled.c1_scale == scaled.c2_scale
    assert scaled.after.mape_pct < 0.1  # one window, one factor: reproduced (to the rounding of its lengths)


PROVENANCE = {"method": "fit", "hardware": "cpu", "target_model": "t", "draft_model": "d", "engine": "vllm",
              "engine_version": "0.32.0", "date": "2026-11-30"}


def test_windows_that_barely_load_the_server_do_not_set_its_saturation(tmp_path: Path) -> None:
    """A deployment seen only at light load: its C2 side is not measured, so one factor scales both sides
    and the file's validity is the batch sizes the windows reached, which ``plan`` names when it goes past.

    The second recording's server (one core) at 2, 4 and 7 req/s ran 1-3 requests at a time and its latency
    did not grow (0.209, 0.188, 0.202 s). Two factors fitted it with the C2 side x0.084, which put no SD's
    saturation at 286 req/s; with the measured 10 req/s window the fit of that server gives 73 req/s.
    """
    from sdplan.calibration import load_calibration, resolve_calibration
    from sdplan.metrics.prior import scale_prior

    windows, _ = read_results(PINNED / "nosd.scrapes.xz")
    light = scale_prior(resolve_calibration(CPU_PRIOR), windows[:3], name="light", provenance=PROVENANCE)
    assert light.one_factor and light.c1_scale == light.c2_scale
    assert light.document["validity"]["batch_size"] == [1, 3]
    # the first recording's server slowed with load (0.131 -> 0.209 s): there both factors are measured
    loaded, _ = read_results(DATA / "nosd.scrapes.xz")
    both = scale_prior(resolve_calibration(CPU_PRIOR), loaded, name="loaded", provenance=PROVENANCE)
    assert not both.one_factor and both.c2_scale > both.c1_scale
    # the same through the commands: the recording up to its third run, as a deployment seen so far
    windows_file, out = write(tmp_path / "light.scrapes", through_run("nosd", 3, PINNED)), tmp_path / "light.toml"
    result = CliRunner().invoke(cli, ["fit", str(windows_file), "--prior", CPU_PRIOR, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "one factor" in result.output
    plan = CliRunner().invoke(cli, ["plan", "-c", str(out), "-f", "json"])
    assert plan.exit_code == 0, plan.output
    assert load_calibration(out).coefficients_at(128, 64).baseline_c2_step_s > 0
    assert "beyond the calibrated batch sizes" in plan.output or "calibrated batch sizes [1, 3]" in plan.output


def test_a_scaled_prior_keeps_its_knee_so_sd_stays_dear_at_large_batch() -> None:
    """A derived prior's compute-bound knee prices a verify step of B (k + 1) rows above a decode step's once the
    rows pass it; the scaled file must keep it, or the options not measured flatter SD at large batch.

    With one factor (light windows) every cost scales alike, so the SD cycle over the decode step must be the
    prior's at every batch. Without the knee the scaled file gained 1.21x per step at 256 sequences where the
    prior gains 0.93x (k = 3, 128/65 tokens, acceptance 0.7 as plan assumes by default): SD on where it loses.
    """
    import numpy as np

    from sdplan.calibration import parse_calibration, resolve_calibration
    from sdplan.latency.model import step_times
    from sdplan.metrics.prior import scale_prior

    prior = resolve_calibration("h100-sxm_llama-3.1-8b_llama-3.2-1b_derived")
    windows, _ = read_results(PINNED / "nosd.scrapes.xz")
    scaled = scale_prior(prior, windows[:3], name="light", provenance=PROVENANCE)
    assert scaled.one_factor
    table = scaled.document["coefficients"]
    assert table["knee_tokens"] == prior.coefficients_at(*scaled.reference).knee_tokens
    mine = parse_calibration(scaled.document, "light").coefficients_at(*scaled.reference)
    theirs = prior.coefficients_at(*scaled.reference)
    batches = np.asarray([1.0, 16.0, 64.0, 128.0, 256.0])
    ours, base = step_times(mine, [3], batches), step_times(theirs, [3], batches)
    assert ours[:, 1] / ours[:, 0] == pytest.approx(base[:, 1] / base[:, 0], rel=1e-9)
    assert ours[-1, 1] / ours[-1, 0] > 1.1 * ours[0, 1] / ours[0, 0]  # past the knee the cycle grows dearer


def test_a_fit_of_windows_that_never_slowed_says_what_to_add(tmp_path: Path) -> None:
    """Both options seen only at light load: no C2, so no saturation; the fit says so and what to do (exit 4),
    where it used to name the output file and ask to "fill in" a cost, as for a hand-written file (exit 3)."""
    # each option's first three runs: 2, 4 and 7 req/s
    files = [write(tmp_path / f"{option}.scrapes", through_run(option, 3, PINNED)) for option in ("nosd", "sd")]
    out = tmp_path / "light.toml"
    result = CliRunner().invoke(cli, ["fit", *map(str, files), "-o", str(out)])
    assert result.exit_code == 4, result.output
    assert "did not grow with their load (batch sizes 1-3)" in result.output and "--prior" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_the_scaling_report_fits_the_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report names the prior three times (its names run to 60 characters): at 80 columns it wraps."""
    monkeypatch.setenv("COLUMNS", "80")
    result = CliRunner().invoke(cli, ["fit", str(DATA / "nosd.scrapes.xz"), "--prior", CPU_PRIOR, "-o",
                                      str(tmp_path / "a.toml")], env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert " ".join(result.output.split()).count("anchored, not measured") == 1


def test_the_text_report_says_what_is_anchored(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["fit", str(DATA / "nosd.query_range.json"), "--prior",
                                      "l40s_qwen3-8b_qwen3-0.6b_derived", "-o", str(tmp_path / "a.toml")])
    assert result.exit_code == 0, result.output
    assert "anchored, not measured" in result.output and "before" in result.output and "after" in result.output
