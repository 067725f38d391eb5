"""The pure parts of benchmarks/accuracy_served.py (sdplan.accuracy), on real served runs (tests/data/served-*-cpu).

Regret, the workload and rate choice, the time budget, the records and their summary, and pooling
several benchmark runs' summaries; then the benchmark program itself, on the fake served engine. Nothing here
starts vLLM.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from sdplan.accuracy import summary as bench
from sdplan.calibration import load_calibration
from sdplan.fitting.validation import option_regret, validate
from sdplan.runs import read_results

ROOT = Path(__file__).resolve().parent.parent
#: The benchmark program, run as ``python benchmarks/accuracy_served.py`` runs it.
BENCHMARK = ROOT / "benchmarks" / "accuracy_served.py"
DATA = Path(__file__).parent / "data"
#: acc35's k=2 runs: three passes at 25/55/80% load on fresh servers, and the calibration of the same run.
PASSES = DATA / "served-passes-cpu"
#: Closed loops of N = 1, 2, 4, 8 clients without SD and at k = 2, 4: the options at common loads.
CLOSED = DATA / "served-cpu"


def closed_loops() -> dict[int, dict[int, float]]:
    """Per N, the measured mean E2E (s) of each option, from the files' own ``mean_e2el_ms``."""
    found: dict[int, dict[int, float]] = {}
    for path in sorted(CLOSED.glob("*_c*_r0.json")):
        option, clients = path.stem.split("_")[:2]
        k = 0 if option == "nosd" else int(option[1:])
        found.setdefault(int(clients[1:]), {})[k] = json.loads(path.read_text())["mean_e2el_ms"] / 1e3
    return found


def test_regret_of_real_options_at_a_common_load() -> None:
    loops = closed_loops()
    assert sorted(loops) == [1, 2, 4, 8] and all(sorted(v) == [0, 2, 4] for v in loops.values())
    for latencies in loops.values():
        best = min(latencies, key=latencies.get)
        assert option_regret(latencies, best) == 0.0
        for k, latency in latencies.items():
            assert option_regret(latencies, k) == pytest.approx(latency / latencies[best] - 1)
            assert option_regret(latencies, k) >= 0.0
    # measured: no SD ran 43% (N = 1) and 55% (N = 2) slower than k=2; at N = 8 the options lie within 4%
    assert option_regret(loops[1], 0) > 0.3 and option_regret(loops[2], 0) > 0.3
    assert max(option_regret(loops[8], k) for k in loops[8]) < 0.05
    assert option_regret(loops[1], None) == math.inf
    with pytest.raises(KeyError):
        option_regret(loops[1], 3)


def test_contrast_workloads_and_their_roles() -> None:
    assert bench.contrast_workloads(128, 64) == [(256, 32), (16, 192)]
    assert bench.contrast_workloads(64, 64) == [(256, 32), (16, 192)]
    assert bench.contrast_workloads(512, 128) == [(1024, 64), (64, 384)]
    roles = [bench.workload_role(w, (128, 64)) for w in [(128, 64), *bench.contrast_workloads(128, 64)]]
    assert roles == ["calibrated", "prompt-heavy", "decode-heavy"]
    assert bench.workload_role((256, 128), (128, 64)) == "same mix"
    assert bench.parse_workloads(" 256/32, 16/192 ") == [(256, 32), (16, 192)]
    for bad in ("256", "256/x", "0/32", ""):
        with pytest.raises(ValueError, match="--workloads"):
            bench.parse_workloads(bad)


def test_common_rates_keep_every_option_at_or_below_its_load() -> None:
    # real closed-loop throughputs of the three options at N = 8 as their plateaus
    plateaus = {}
    for path in sorted(CLOSED.glob("*_c8_r0.json")):
        run = read_results(path)[0][0]
        plateaus[run.draft_length] = run.achieved_rate_rps
    loads = [0.3, 0.55, 0.8]
    rates = bench.common_rates(plateaus, loads)
    slowest = min(plateaus.values())
    assert rates == [float(f"{load * slowest:.3g}") for load in loads]
    for rate, load in zip(rates, loads):
        assert all(rate / plateau <= load * 1.005 for plateau in plateaus.values())
    assert max(plateaus.values()) > slowest  # so the faster options run below the load named
    assert all(rates[-1] / plateau < 0.8 for k, plateau in plateaus.items() if plateau > slowest)
    with pytest.raises(ValueError):
        bench.common_rates({0: 0.0, 2: 10.0}, loads)


def test_each_benchmark_run_draws_arrival_paths_of_its_own() -> None:
    seeds = {(run, i, level): bench.poisson_seed(run, i, level)
             for run in ("acc44/0", "acc45/0", "acc44/1") for i in range(3) for level in range(3)}
    assert len(set(seeds.values())) == len(seeds)  # runs, passes, workloads and loads all differ
    assert bench.poisson_seed("acc44/0", 2, 1) == seeds[("acc44/0", 2, 1)]  # and the options of one run share
    assert all(0 <= seed < 2**32 for seed in seeds.values())  # numpy's seed range


def test_the_budget_sets_the_length_of_the_poisson_runs() -> None:
    rates = [3.0, 6.0, 9.0] * 9
    overhead = 2.0

    def total(seconds: float) -> float:
        return sum(bench.poisson_requests(r, seconds) / r + overhead for r in rates)

    assert bench.poisson_seconds(10_000.0, rates, overhead, 25.0) == 25.0  # ample: the longest
    assert bench.poisson_seconds(100.0, rates, overhead, 25.0) is None  # not even 60 requests each
    fitted = bench.poisson_seconds(600.0, rates, overhead, 25.0)
    assert fitted is not None and 0 < fitted < 25
    assert total(fitted) <= 600.0 + len(rates)  # whole requests: within a second per run
    assert total(fitted + 1.0) > 600.0
    assert bench.poisson_requests(3.0, 5.0) == bench.MIN_POISSON_REQUESTS


@pytest.fixture(scope="module")
def passes() -> tuple[list, object]:
    runs = [read_results(path)[0][0] for path in sorted(PASSES.glob("pass*.json"))]
    return runs, load_calibration(PASSES / "served.toml")


def records_of(runs: list, calibration) -> list[dict]:
    """The benchmark's records of real runs, each pass as a benchmark run of its own."""
    found = []
    for run in runs:
        attempt, _, load = Path(run.source).stem.split("-")
        found.append(bench.run_record(run, calibration.coefficients_at, planned_e2e_s=None, run=attempt,
                                      **{"pass": 1}, workload="128/64", load=float(load.removeprefix("poisson")),
                                      rate_rps=run.requested_rate_rps))
    return found


def test_records_predict_as_sdplan_validate_does(passes) -> None:
    runs, calibration = passes
    records = records_of(runs, calibration)
    check = validate(calibration.coefficients_at, runs)
    summary = bench.summarize(records, [], [], [257.0])
    assert summary["benchmark_runs"] == 3 and summary["all"]["poisson_runs"] == 9
    assert summary["all"]["e2e_mape_pct"] == pytest.approx(check.mape_pct)
    assert summary["all"]["e2e_bias_pct"] == pytest.approx(check.bias_pct)
    assert summary["all"]["ttft_mape_pct"] == pytest.approx(check.ttft_mape_pct)
    assert summary["workloads"]["128/64"]["e2e_mape_pct"] == pytest.approx(check.mape_pct)
    # per benchmark run, and its spread
    per_run = [validate(calibration.coefficients_at, [r for r in runs if name in r.source]).bias_pct
               for name in ("pass1", "pass2", "pass3")]
    assert summary["e2e_bias_per_run_pct"] == pytest.approx(per_run)
    assert summary["e2e_bias_per_run_median_pct"] == pytest.approx(sorted(per_run)[1])
    assert summary["e2e_bias_per_run_negative_share"] == pytest.approx(sum(b < 0 for b in per_run) / 3)
    errors = [100 * (r["predicted_e2e_s"] / r["e2e_s"] - 1) for r in records]
    assert summary["all"]["e2e_median_error_pct"] == pytest.approx(sorted(errors)[4])
    assert summary["all"]["e2e_negative_share"] == pytest.approx(sum(e < 0 for e in errors) / 9)
    mean = sum(per_run) / 3
    assert summary["e2e_bias_standard_error_pct"] == pytest.approx(
        math.sqrt(sum((b - mean) ** 2 for b in per_run) / 2 / 3))
    # the highest load alone
    top = validate(calibration.coefficients_at, [r for r in runs if r.requested_rate_rps > 15])
    assert summary["top_load"] == 0.8 and summary["top_load_e2e_mape_pct"] == pytest.approx(top.mape_pct)
    # the measured side is the file's own
    first = json.loads((PASSES / "pass1-k2-poisson0.8.json").read_text())
    record = next(r for r in records if r["run"] == "pass1" and r["load"] == 0.8)
    assert record["e2e_s"] == pytest.approx(first["mean_e2el_ms"] / 1e3)
    assert record["ttft_s"] == pytest.approx(first["mean_ttft_ms"] / 1e3)
    assert record["option"] == 2 and record["flags"] == []


def test_planner_picks_are_what_sdplan_plan_picks(sdplan) -> None:
    calibration = str(PASSES / "served.toml")
    for workload in [(128, 64), (256, 32), (16, 192)]:
        rates = [4.0, 8.0, 11.0, 30.0]
        picks = bench.planner_picks(calibration, workload, [2, 4], rates)
        result = sdplan("plan", "-c", calibration, "--prompt-tokens", str(workload[0]), "--output-tokens",
                        str(workload[1]), "--draft-lengths", "2,4", "--rates", ",".join(map(str, rates)), "-f", "json")
        assert result.exit_code == 0, result.stderr
        for (picked, planned), row in zip(picks, json.loads(result.stdout)["results"][0]["rates"]):
            best = row["best"]
            if best is None or best.get("mean_e2e_latency_s") is None:
                assert picked is None
                continue
            assert picked == (0 if best["speculation"] == "off" else best["draft_length_tokens"]), (workload, row)
            assert planned[picked] == pytest.approx(best["mean_e2e_latency_s"])
            assert planned[0] == pytest.approx(row["baseline"]["mean_e2e_latency_s"])


def test_regret_rows_from_records_and_picks() -> None:
    loops = closed_loops()
    runs = [{"run": "a", "pass": 1, "workload": "128/64", "load": float(n), "option": k, "e2e_s": latency}
            for n, latencies in loops.items() for k, latency in latencies.items()]
    # a planner that always picks no SD, and one that picks nothing at N = 8
    picks = [{"run": "a", "workload": "128/64", "load": float(n), "rate_rps": float(n),
              "picked": None if n == 8 else 0} for n in loops]
    rows = {row["load"]: row for row in bench.regrets(runs, picks)}
    assert sorted(rows) == [1.0, 2.0, 4.0, 8.0]
    for n, latencies in loops.items():
        row = rows[float(n)]
        assert row["best"] == min(latencies, key=latencies.get)
        if n == 8:
            assert row["regret_pct"] is None
        else:
            assert row["regret_pct"] == pytest.approx(100 * (latencies[0] / min(latencies.values()) - 1))


def document(name: str, records: list[dict], calibrate_s: float, saturation: list[dict]) -> dict:
    runs = [r for r in records if r["run"] == name]
    own = [s for s in saturation if s["run"] == name]
    return {"version": bench.SUMMARY_VERSION, "run_id": name, "calibrate_wall_s": calibrate_s, "wall_s": 2000.0,
            "records": {"runs": runs, "saturation": own, "picks": []},
            "summary": bench.summarize(runs, own, [], [calibrate_s])}


def test_runs_whose_streams_stalled_are_scored_apart(passes) -> None:
    """The summary scores the runs known to have reached the client on time beside all runs (acc40's real runs:
    77%, 16% and 0% of their streams stalled); runs without chunk times are not known to be on time."""
    _, calibration = passes
    stalled = [read_results(path)[0][0] for path in sorted((DATA / "served-stalled-streams-cpu").glob("*.json"))]
    records = [bench.run_record(run, calibration.coefficients_at, planned_e2e_s=None, run="acc40", **{"pass": 1},
                                workload=f"{run.prompt_tokens:.0f}/{run.output_tokens:.0f}", load=0.3,
                                rate_rps=run.requested_rate_rps) for run in stalled]
    assert sorted(round(r["stalled_streams"], 2) for r in records) == [0.0, 0.16, 0.77]
    summary = bench.summarize(records, [], [], [415.0])
    on_time = [r for r in records if r["stalled_streams"] == 0.0]
    assert summary["streams_on_time"]["poisson_runs"] == 1
    assert summary["streams_on_time"]["ttft_mape_pct"] == pytest.approx(
        bench.summarize(on_time, [], [], [415.0])["all"]["ttft_mape_pct"])
    assert any(line.strip().startswith("on time") for line in bench.report_lines(summary))
    unknown = records_of(*passes)  # files without itls
    assert all(r["stalled_streams"] is None for r in unknown)
    assert bench.summarize(unknown, [], [], [415.0])["streams_on_time"]["poisson_runs"] == 0
    older = [{key: value for key, value in r.items() if key != "stalled_streams"} for r in records]  # before acc40
    assert bench.summarize(older, [], [], [415.0])["streams_on_time"]["poisson_runs"] == 0


def test_pooling_judges_the_bias_only_over_three_runs(passes, tmp_path) -> None:
    runs, calibration = passes
    records = records_of(runs, calibration)
    # saturation of k=2 as the three passes' plateaus would give it (hand-made figures: only arithmetic is tested)
    saturation = [{"run": name, "pass": 1, "workload": "128/64", "option": 2, "measured_rps": measured,
                   "predicted_rps": 19.0, "uncapped_rps": 20.0}
                  for name, measured in (("pass1", 20.0), ("pass2", 19.0), ("pass3", 18.0))]
    documents = [document(name, records, wall, saturation)
                 for name, wall in (("pass1", 257.0), ("pass2", 300.0), ("pass3", 380.0))]
    pooled = bench.pool(documents)
    assert pooled["benchmark_runs"] == 3
    assert pooled["all"]["e2e_bias_pct"] == pytest.approx(validate(calibration.coefficients_at, runs).bias_pct)
    assert pooled["saturation_bias_pct"] == pytest.approx(100 * (19 / 20 + 19 / 19 + 19 / 18 - 3) / 3)
    met = {what: verdict for what, _, _, verdict in bench.goals(pooled)}
    assert met["calibrate wall time, slowest run"] == "NO"  # 380 s > 360 s
    bias = pooled["all"]["e2e_bias_pct"]
    assert met["signed E2E bias, pooled"] == ("yes" if abs(bias) <= 5 else "NO")
    single = {what: verdict for what, _, _, verdict in bench.goals(documents[0]["summary"])}
    assert single["signed E2E bias, pooled"].startswith("n/a")
    assert single["calibrate wall time, slowest run"] == "yes"
    with pytest.raises(ValueError, match="twice"):
        bench.pool([documents[0], documents[0]])

    # the script's --pool mode: the same figures, without vLLM
    paths = []
    for item in documents:
        path = tmp_path / f"{item['run_id']}.json"
        path.write_text(json.dumps(item))
        paths.append(str(path))
    out = tmp_path / "pooled.json"
    script = str(BENCHMARK)
    # these hand-made summaries have no calibration or result files beside them: no re-made predictions, so no pool
    unmade = subprocess.run([sys.executable, script, "--pool", *paths], capture_output=True, text=True, timeout=120)
    assert unmade.returncode == 2 and unmade.stderr.strip().count("\n") == 0, unmade.stderr
    assert "cannot re-predict 3 of 3 runs" in unmade.stderr and "--stored-predictions" in unmade.stderr
    done = subprocess.run([sys.executable, script, "--pool", *paths, "--summary", str(out), "--stored-predictions"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{bias:+.1f}%" in done.stdout and "signed E2E bias, pooled" in done.stdout
    assert done.stdout.startswith("run pass1") and "predictions as stored" in done.stdout
    assert json.loads(out.read_text())["summary"]["all"]["e2e_bias_pct"] == pytest.approx(bias)
    assert "vllm" not in done.stderr
    again = subprocess.run([sys.executable, script, "--pool", paths[0], paths[0], "--stored-predictions"],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and again.stderr.strip().count("\n") == 0 and "twice" in again.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    refused = subprocess.run([sys.executable, script, "--pool", str(bad)], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "not written by" in refused.stderr


def test_the_benchmark_end_to_end_on_the_fake_served_engine(tmp_path, monkeypatch, capsys) -> None:
    """The orchestration, with the step-level fake server and client of the calibrate tests standing in for vLLM
    and the real acc35 calibration standing in for ``sdplan calibrate``: every option at every workload's common
    rates, with the same requests, and a summary that --pool reads back.

    The program runs as ``python benchmarks/accuracy_served.py ARGS`` would (:func:`runpy.run_path`, as
    ``__main__``), in this process so that the fakes stand in for what it imports from the package."""
    import runpy
    import shutil

    import sdplan.measure.client
    import sdplan.measure.quiet
    import sdplan.measure.server
    import sdplan.testing.tiny_models
    from tests import served_fakes

    served_fakes.FakeServer.registry = []
    monkeypatch.setattr(sdplan.measure.server, "ServedEngine", served_fakes.FakeServer)
    monkeypatch.setattr(sdplan.measure.client, "BenchClient",
                        lambda log_path: served_fakes.FakeClient(log_path=log_path))

    class Quiet:
        def __init__(self, groups) -> None:
            pass

        def start(self) -> None:
            pass

        def stop(self) -> float:
            return 0.0

    monkeypatch.setattr(sdplan.measure.quiet, "ForeignCpu", Quiet)
    monkeypatch.setattr(sdplan.testing.tiny_models, "served_pair",
                        lambda root, **_: {"target": root / "t", "draft": root / "d"})
    calls = []

    def calibrate(command, **kwargs):
        calls.append(command)
        shutil.copy(PASSES / "served.toml", command[command.index("-o") + 1])
        kwargs["stdout"].write("wrote served.toml\n")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", calibrate)

    def benchmark(*args: str) -> object:
        """``python benchmarks/accuracy_served.py ARGS``: its exit status."""
        monkeypatch.setattr(sys, "argv", [str(BENCHMARK), *args])
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(BENCHMARK), run_name="__main__")
        return done.value.code

    work = tmp_path / "acc"
    assert benchmark("--workdir", str(work), "--loads", "0.3,0.8", "--max-num-seqs", "16", "--seconds-per-run", "1",
                     "--run-id", "fake1") == 0
    out = capsys.readouterr().out
    assert len(calls) == 1 and "--grid" in calls[0]  # calibrated once
    document = json.loads((work / "accuracy-summary.json").read_text())
    runs = document["records"]["runs"]
    assert {r["workload"] for r in runs} == {"128/64", "256/32", "16/192"}
    assert len(runs) == 3 * 3 * 2 and len(document["records"]["saturation"]) == 3 * 3
    for workload in ("128/64", "256/32", "16/192"):
        rates = {(r["load"], r["rate_rps"]) for r in runs if r["workload"] == workload}
        assert len(rates) == 2  # every option at the same two absolute rates
        plateaus = [s["measured_rps"] for s in document["records"]["saturation"] if s["workload"] == workload]
        assert sorted(rate for _, rate in rates) == [float(f"{load * min(plateaus):.3g}") for load in (0.3, 0.8)]
    # the same requests for every option: the fake client saw one seed per (workload, load)
    seeds = {}
    for r in runs:
        bench_file = json.loads(Path(work / "validation" / Path(r["file"]).name).read_text())
        seeds.setdefault((r["workload"], r["load"]), set()).add(
            (bench_file["num_prompts"], tuple(sorted(bench_file["output_lens"]))))
    assert all(len(counts) == 1 for counts in seeds.values())
    assert {(r["workload"], r["load"], r["seed"]) for r in runs} \
        == {(w, load, bench.poisson_seed("fake1/0", i, level)) for i, w in enumerate(("128/64", "256/32", "16/192"))
            for level, load in enumerate((0.3, 0.8))}
    summary = document["summary"]
    assert summary["rates_compared"] == 6 and len(document["records"]["picks"]) == 6
    assert "best-option regret, worst rate" in out and "whole benchmark" in out
    assert all(not server.live for server in served_fakes.FakeServer.registry)
    # 3 options x (plateau server + Poisson server)
    assert sum(s.start_order is not None for s in served_fakes.FakeServer.registry) == 6
    assert bench.pool([document])["all"]["e2e_mape_pct"] == pytest.approx(summary["all"]["e2e_mape_pct"])
    check_repredict(document, work / "accuracy-summary.json")
    met = {what: verdict for what, _, _, verdict in bench.goals(summary)}
    assert met["best-option regret, worst rate"] == ("yes" if summary["rates_over_regret_goal"] == 0 else "NO")

    # two passes at the first pass's rates, one other workload, a budget too small for 60-request runs
    again = tmp_path / "acc2"
    assert benchmark("--workdir", str(again), "--loads", "0.5", "--max-num-seqs", "8", "--workloads", "256/32",
                     "--passes", "2", "--budget-s", "1") == 0
    out = capsys.readouterr().out
    assert "the budget will overrun" in out and "noise floor" in out and "an exact model" in out
    second = json.loads((again / "accuracy-summary.json").read_text())
    runs = second["records"]["runs"]
    assert len(runs) == 2 * 3 * 2 and second["poisson_seconds"] == 0.0
    assert all(json.loads(Path(again / folder / Path(r["file"]).name).read_text())["num_prompts"]
               == bench.MIN_POISSON_REQUESTS
               for r in runs for folder in ["validation" if r["pass"] == 1 else "validation-2"])
    by_pass = {p: sorted((r["workload"], r["option"], r["rate_rps"]) for r in runs if r["pass"] == p) for p in (1, 2)}
    assert by_pass[1] == by_pass[2]  # the same rates in both passes
    assert len(second["summary"]["regret"]) == 2 * 2  # per pass and rate

    # cut short (Ctrl-C in the second server's plateaus): every server stopped, the first server's records kept
    cut = tmp_path / "acc3"
    monkeypatch.setattr(sdplan.measure.client, "BenchClient",
                        lambda log_path: served_fakes.FakeClient(log_path=log_path, interrupt_after=6))
    with pytest.raises(KeyboardInterrupt):
        benchmark("--workdir", str(cut), "--max-num-seqs", "8")
    assert all(not server.live for server in served_fakes.FakeServer.registry)
    kept = json.loads((cut / "accuracy-summary.json").read_text())["records"]
    assert [s["option"] for s in kept["saturation"]] == [0, 0, 0] and kept["runs"] == []


def check_repredict(document: dict, path: Path) -> None:
    """Re-made predictions: the same as stored where the code is the same, and stored predictions of other code
    (here: tampered) replaced, not pooled."""
    from sdplan.accuracy.repredict import missing_inputs, repredict

    assert missing_inputs(document, path) == [] and document["predicted_by"].startswith("sdplan ")
    tampered = json.loads(json.dumps(document))
    for r in tampered["records"]["runs"]:
        r["predicted_e2e_s"] = 2 * r["predicted_e2e_s"] if r["predicted_e2e_s"] else r["predicted_e2e_s"]
        r["planned_e2e_s"] = None
    for s in tampered["records"]["saturation"]:
        s["predicted_rps"], s["uncapped_rps"] = 1.0, 2.0
    for p in tampered["records"]["picks"]:
        p["picked"] = -1
    tampered["predicted_by"] = "older code"
    tampered["summary"] = {"all": {}}  # the run's own summary, as older code made it: made again too
    remade = repredict(tampered, path)
    for key in ("runs", "saturation", "picks"):
        assert remade["records"][key] == document["records"][key], key
    assert remade["summary"] == document["summary"]
    assert remade["predicted_by"] == document["predicted_by"]
    pooled = bench.pool([remade])
    assert pooled["all"]["e2e_mape_pct"] == pytest.approx(document["summary"]["all"]["e2e_mape_pct"])
    assert pooled["predicted_by"] == [document["predicted_by"]]
    assert not any("predictions as stored" in line for line in bench.report_lines(pooled))
    mixed = bench.pool([tampered, {**remade, "run_id": "fake1-remade"}])  # two versions of the model in one pool
    assert mixed["predicted_by"] == sorted([document["predicted_by"], "older code"])
    assert any(line.startswith("predictions as stored") and "older code; sdplan" in line
               for line in bench.report_lines(mixed))
    moved = {**document, "workdir": str(path.parent / "gone"), "calibration": "gone.toml"}  # found beside the file
    assert missing_inputs(moved, path) == [] and missing_inputs(moved, None)
    with pytest.raises(ValueError, match="cannot re-predict"):
        repredict(moved, None)


def test_planned_intervals_are_what_sdplan_plan_prints_and_are_scored(sdplan, passes) -> None:
    """acc35's real k=2 passes against the 95% intervals of their calibration at their own rates."""
    runs, calibration = passes
    path = str(PASSES / "served.toml")
    rates = sorted({run.requested_rate_rps for run in runs})
    bands = bench.planned_intervals(path, (128, 64), [2, 4], rates)
    result = sdplan("plan", "-c", path, "--prompt-tokens", "128", "--output-tokens", "64", "--draft-lengths", "2,4",
                    "--rates", ",".join(map(str, rates)), "-f", "json")
    assert result.exit_code == 0, result.stderr
    for band, row in zip(bands, json.loads(result.stdout)["results"][0]["rates"]):
        assert band[0] == pytest.approx(row["baseline"]["mean_e2e_latency_ci95_s"])
        for point in row["speculative"]:
            assert band[point["draft_length_tokens"]] == pytest.approx(point["mean_e2e_latency_ci95_s"])
    records = records_of(runs, calibration)
    for record in records:
        record["planned_e2e_ci95_s"] = bands[rates.index(record["rate_rps"])][2]
    inside = sum(low <= r["e2e_s"] and (high is None or r["e2e_s"] <= high)
                 for r in records for low, high in [r["planned_e2e_ci95_s"]])
    summary = bench.summarize(records, [], [], [257.0])
    assert summary["all"]["ci95_runs"] == 9
    assert summary["all"]["ci95_coverage_pct"] == pytest.approx(100 * inside / 9)
    assert any("95% intervals hold" in line for line in bench.report_lines(summary))
    # records written before the intervals were (acc38-45) are left out, not counted as misses
    older = [{key: value for key, value in r.items() if key != "planned_e2e_ci95_s"} for r in records]
    assert bench.summarize(older, [], [], [257.0])["all"]["ci95_coverage_pct"] is None


def test_a_runs_server_side_means_are_its_histograms_deltas(passes, tmp_path) -> None:
    """An open-loop run's /metrics before and after it (the real recording's scrapes at two times) give the
    server's own mean E2E and TTFT, its histograms' sum over count between them; the summary judges the same
    predictions on them and says how far the client's means lay above them. A file without a window gives none."""
    import runpy

    from tests.prometheus_recording import blocks, write

    served = runpy.run_path(str(BENCHMARK))  # its functions, not its __main__
    scrapes = blocks("nosd")
    first, last = scrapes[40], scrapes[90]

    def value(body: str, name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(name + "{"))

    def mean(name: str) -> float:
        return ((value(last[1], f"{name}_sum") - value(first[1], f"{name}_sum"))
                / (value(last[1], f"{name}_count") - value(first[1], f"{name}_count")))

    found = served["server_means"](write(tmp_path / f"run{served['SERVER_SCRAPES']}", [first, last]))
    assert found["server_e2e_s"] == pytest.approx(mean("vllm:e2e_request_latency_seconds"), rel=1e-9)
    assert found["server_ttft_s"] == pytest.approx(mean("vllm:time_to_first_token_seconds"), rel=1e-9)
    assert served["server_means"](write(tmp_path / "one.scrapes", [first])) == {}
    assert served["server_means"](tmp_path / "absent.scrapes") == {}

    runs, calibration = passes
    records = records_of(runs, calibration)
    records[0].update(server_e2e_s=records[0]["e2e_s"] / 1.1, server_ttft_s=records[0]["ttft_s"] / 1.5)
    summary = bench.summarize(records, [], [], [1.0], {})
    figures = summary["all"]
    assert any(line.startswith("all, against the server's own histograms (1 runs)")
               for line in bench.report_lines(summary))
    assert figures["server_runs"] == 1
    assert figures["server_e2e_bias_pct"] == pytest.approx(
        100 * (records[0]["predicted_e2e_s"] / records[0]["server_e2e_s"] - 1))
    assert figures["client_over_server_e2e_pct"] == pytest.approx(10.0)
    assert figures["client_over_server_ttft_pct"] == pytest.approx(50.0)
    assert "server_runs" not in bench.summarize(records[1:], [], [], [1.0], {})["all"]
