"""``sdplan check`` and ``sdplan capacity`` through the CLI: exit codes, formats, workload files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdplan.errors import ExitStatus
from sdplan.fileio import dumps_toml

PASSING = ["--rate", "4", "--slo", "e2e:mean<=4s", "--slo", "tpot:mean<=10ms", "--acceptance", "0.8"]


@pytest.fixture
def workload(tmp_path: Path, write_calibration, direct_document):
    """A workload file next to its calibration (referenced by relative path)."""

    def make(**overrides) -> Path:
        write_calibration(direct_document, "mycal")
        document = {
            "schema_version": 1,
            "name": "chat",
            "calibration": "mycal.toml",
            "slos": ["e2e:mean<=5s", "ttft:mean<=300ms"],
            "traffic": {"request_rate_rps": 2.0, "target_rate_rps": 50.0, "prompt_tokens": 1000, "output_tokens": 500},
            "acceptance": {"mean_length": 2.5, "measured_at_k": 3},
            "speculation": {"mode": "best", "draft_lengths": [1, 2, 3, 4]},
            "deployment": {"gpus_per_replica": 2, "gpu_hour_cost_usd": 2.0, "max_batch_size": 64},
        }
        for key, value in overrides.items():
            document[key] = value
        path = tmp_path / "workload.toml"
        path.write_text(dumps_toml(document))
        return path

    return make


def test_check_pass_exits_0_with_summary_on_stderr(sdplan) -> None:
    result = sdplan("check", *PASSING)
    assert result.exit_code == ExitStatus.OK, result.output
    assert "pass" in result.stdout and "FAIL" not in result.stdout
    assert result.stderr.startswith("sdplan check: PASS: 2/2 SLOs met at 4 req/s")
    assert result.stderr.count("\n") == 1


def test_check_violation_exits_1(sdplan) -> None:
    result = sdplan("check", "--rate", "14", "--slo", "e2e:mean<=5s", "--slo", "ttft:mean<=300ms",
                    "--acceptance", "0.8")
    assert result.exit_code == ExitStatus.SLO_VIOLATED, result.output
    assert "FAIL" in result.stdout
    assert "FAIL: 1/2 SLOs met" in result.stderr and "e2e:mean<=5s predicted" in result.stderr


def test_check_unstable_rate_is_a_violation_not_a_crash(sdplan) -> None:
    result = sdplan("check", "--rate", "1000", "--slo", "ttft:mean<=1s", "-f", "json")
    assert result.exit_code == ExitStatus.SLO_VIOLATED
    doc = json.loads(result.stdout)
    assert doc["operating_point"]["regime"] == "unstable"
    assert doc["operating_point"]["mean_e2e_latency_s"] is None
    assert doc["verdicts"][0]["passed"] is False
    assert "unstable" in result.stderr


def test_check_json_verdicts(sdplan) -> None:
    result = sdplan("check", *PASSING, "--slo", "throughput>=1000tok/s", "--slo", "utilisation<=0.9", "-f", "json")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 1 and doc["passed"] is True and doc["exit_status"] == 0
    keys = [set(v) for v in doc["verdicts"]]
    assert "limit_s" in keys[0] and "predicted_s" in keys[0]
    assert "limit_tok_s" in keys[2] and "limit_fraction" in keys[3]
    assert all(v["margin_pct"] >= 0 for v in doc["verdicts"])
    assert doc["speculation"]["mode"] == "best" and doc["speculation"]["enabled"] is True


def test_check_fixed_and_off(sdplan) -> None:
    fixed = json.loads(sdplan("check", *PASSING, "--draft-length", "5", "-f", "json").stdout)
    assert fixed["speculation"] == {"mode": "fixed", "enabled": True, "draft_length_tokens": 5,
                                    "candidates_tokens": None, "most_stable": None}
    off = sdplan("check", *PASSING, "--draft-length", "off", "-f", "json")
    assert json.loads(off.stdout)["speculation"]["enabled"] is False
    # no SD at 4 req/s misses the 5 s SLO on the default calibration: the gate says so
    assert off.exit_code == ExitStatus.SLO_VIOLATED
    zero = json.loads(sdplan("check", *PASSING, "--draft-length", "0", "-f", "json").stdout)
    assert zero["speculation"]["enabled"] is False
    best = json.loads(sdplan("check", *PASSING, "-k", "1,2", "-f", "json").stdout)
    assert best["speculation"]["candidates_tokens"] == [1, 2]


def test_check_github_annotations(sdplan, monkeypatch) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    result = sdplan("check", "--rate", "14", "--slo", "e2e:mean<=5s", "--acceptance", "0.8")
    assert result.exit_code == ExitStatus.SLO_VIOLATED
    assert result.stderr.startswith("::error title=sdplan check: SLO violated::e2e:mean<=5s predicted")


@pytest.mark.parametrize(("args", "message"), [
    (["--slo", "e2e:mean<=5s"], "no request rate"),
    (["--rate", "4"], "no SLO to check"),
    (["--rate", "4", "--slo", "e2e:p99<=5s"], "means only"),
    (["--rate", "4", "--slo", "e2e:mean<=5"], "needs a unit"),
    (["--rate", "-1", "--slo", "e2e:mean<=5s"], ">= 0"),
    (["--rate", "4", "--slo", "e2e:mean<=5s", "--draft-length", "lots"], "not a draft length"),
    (["--rate", "4", "--slo", "e2e:mean<=5s", "--acceptance", "0.6,0.8"], "single acceptance"),
    (["--rate", "4", "--slo", "e2e:mean<=5s", "-k", "0"], "at least one draft length"),
])
def test_check_usage_errors_exit_2(sdplan, args, message) -> None:
    result = sdplan("check", *args)
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert message in result.stderr


def test_check_internal_error_is_70_not_1(sdplan, monkeypatch) -> None:
    from sdplan.planning import check as check_module

    monkeypatch.setattr(check_module, "evaluate", lambda *a: 1 / 0)
    result = sdplan("check", *PASSING)
    assert result.exit_code == ExitStatus.INTERNAL
    assert "internal error" in result.stderr


def test_check_from_workload_file(sdplan, workload) -> None:
    path = workload()
    result = sdplan("check", "-w", str(path), "-f", "json")
    assert result.exit_code == ExitStatus.OK, result.output
    doc = json.loads(result.stdout)
    assert doc["calibration"]["name"] == "test-direct"  # relative calibration path resolved
    assert doc["request_rate_rps"] == 2.0
    assert doc["workload"]["acceptance"]["metric_given"] == "mean-length"
    assert doc["workload"]["file"] == str(path)
    assert [v["slo"] for v in doc["verdicts"]] == ["e2e:mean<=5s", "ttft:mean<=300ms"]
    # flags override the file
    override = json.loads(sdplan("check", "-w", str(path), "--rate", "3", "--slo", "e2e:mean<=60s",
                                 "--acceptance", "0.9", "-f", "json").stdout)
    assert override["request_rate_rps"] == 3 and [v["slo"] for v in override["verdicts"]] == ["e2e:mean<=60s"]
    assert override["per_token_alpha"] == 0.9


@pytest.mark.parametrize(("overrides", "where"), [
    ({"slos": ["e2e:p99<=5s"]}, "slos[0]"),
    ({"traffic": {"request_rate_rps": -2.0}}, "traffic.request_rate_rps"),
    ({"traffic": {"rate": 2.0}}, "traffic.rate"),
    ({"acceptance": {"mean_length": 2.5}}, "acceptance.measured_at_k"),
    ({"acceptance": {"per_token_alpha": 0.7, "draft_rate": 0.5}}, "acceptance"),
    ({"acceptance": {"per_token_alpha": 1.7}}, "acceptance.per_token_alpha"),
    ({"speculation": {"mode": "fixed"}}, "speculation.draft_length"),
    ({"speculation": {"mode": "sometimes"}}, "speculation.mode"),
    ({"schema_version": 7}, "schema_version"),
])
def test_invalid_workload_file_exits_3_naming_the_key(sdplan, workload, overrides, where) -> None:
    path = workload(**overrides)
    result = sdplan("check", "-w", str(path))
    assert result.exit_code == ExitStatus.BAD_INPUT, result.output
    assert result.stderr.startswith(f"Error: {path}: {where}")
    assert result.stderr.count("\n") == 1


def test_missing_workload_file_exits_3(sdplan, tmp_path) -> None:
    result = sdplan("check", "-w", str(tmp_path / "nope.toml"))
    assert result.exit_code == ExitStatus.BAD_INPUT and "no such file" in result.stderr


# ----------------------------------------------------------------------------- capacity


def test_capacity_table_and_fleet(sdplan) -> None:
    result = sdplan("capacity", "--slo", "e2e:mean<=5s", "--acceptance", "0.8", "--target-rate", "100",
                    "--gpus-per-replica", "1", "--gpu-hour-cost", "2.5", "--ascii")
    assert result.exit_code == 0, result.output
    assert "max rate under SLO (req/s)" in result.stdout and "Fleet for 100 req/s" in result.stdout
    assert "SD saves" in result.stdout


def test_capacity_json_is_consistent_with_check(sdplan) -> None:
    doc = json.loads(sdplan("capacity", "--slo", "e2e:mean<=5s", "--acceptance", "0.8", "--target-rate", "100",
                            "--gpu-hour-cost", "2", "-f", "json").stdout)
    assert doc["command"] == "capacity" and doc["best"] == doc["best_speculative"]
    best = next(o for o in doc["options"] if o["option"] == doc["best"])
    assert best["mean_e2e_latency_at_capacity_s"] == pytest.approx(5.0)
    fleet = doc["fleet"]
    assert fleet["best_sd"]["replicas"] == -(-100 // best["max_rate_under_slo_rps"])
    assert fleet["replicas_saved_by_sd"] == fleet["no_sd"]["replicas"] - fleet["best_sd"]["replicas"]
    assert fleet["best_sd"]["gpus"] == fleet["best_sd"]["replicas"]  # TP = 1 from the calibration
    # feeding the capacity back into check meets the SLO (just) and a bit more load fails it
    k = best["draft_length_tokens"]
    rate = best["max_rate_under_slo_rps"]
    ok = sdplan("check", "--rate", str(rate * 0.999), "--slo", "e2e:mean<=5s", "--acceptance", "0.8",
                "--draft-length", str(k))
    over = sdplan("check", "--rate", str(rate * 1.001), "--slo", "e2e:mean<=5s", "--acceptance", "0.8",
                  "--draft-length", str(k))
    assert (ok.exit_code, over.exit_code) == (ExitStatus.OK, ExitStatus.SLO_VIOLATED)


def test_capacity_vllm_config_export(sdplan, tmp_path) -> None:
    out = tmp_path / "spec.json"
    result = sdplan("capacity", "--acceptance", "0.8", "--max-batch-size", "128", "-f", "vllm-config", "-o", str(out))
    assert result.exit_code == 0, result.output
    config = json.loads(out.read_text())
    assert config["method"] == "draft_model"  # the calibration's method (tests/test_export.py covers the others)
    schedule = config["num_speculative_tokens_per_batch_size"]
    assert schedule[0][0] == 1 and schedule[-1][1] == 128
    assert all(len(item) == 3 and item[0] <= item[1] for item in schedule)
    assert config["num_speculative_tokens"] == max(k for _, _, k in schedule)


def test_ttft_slo_bounds_capacity(sdplan) -> None:
    """B11: TTFT grows with load, so a TTFT SLO alone sizes the fleet, tighter as it tightens."""
    rates = []
    for limit in ("100ms", "60ms"):
        result = sdplan("capacity", "-c", "cpu-epyc-2core_tiny-llama-h256-l4_tiny-llama-h128-l1_measured",
                        "--prompt-tokens", "256", "--output-tokens", "64", "--slo", f"ttft:mean<={limit}",
                        "--acceptance", "0.8", "-f", "json")
        assert result.exit_code == 0, result.output
        options = json.loads(result.stdout)["options"]
        assert all(o["binding_slo"] == f"ttft:mean<={limit}" for o in options if o["feasible"])
        rates.append(max(o["max_rate_under_slo_rps"] for o in options))
    assert rates[1] < rates[0]


def test_capacity_infeasible_exits_4(sdplan) -> None:
    result = sdplan("capacity", "--slo", "e2e:mean<=1s")
    assert result.exit_code == ExitStatus.INFEASIBLE
    assert "infeasible" in result.stdout and "no option meets the SLOs" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    ([], "capacity needs SLOs"),
    (["--slo", "throughput>=100tok/s"], "bounds the request rate"),
    (["--slo", "e2e:mean<=5s", "--target-rate", "-3"], "-3"),
    (["--slo", "e2e:mean<=5s", "--gpus-per-replica", "0"], "0"),
    (["--slo", "e2e:mean<=5s", "--format", "yaml"], "yaml"),
])
def test_capacity_usage_errors(sdplan, args, message) -> None:
    result = sdplan("capacity", *args)
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert message in result.stderr


def test_capacity_from_workload_file(sdplan, workload) -> None:
    path = workload()
    doc = json.loads(sdplan("capacity", "-w", str(path), "-f", "json").stdout)
    assert [o["option"] for o in doc["options"]] == ["off", "k=1", "k=2", "k=3", "k=4"]
    assert doc["fleet"]["target_rate_rps"] == 50.0
    assert doc["fleet"]["no_sd"]["gpus"] == 2 * doc["fleet"]["no_sd"]["replicas"]
    assert doc["num_speculative_tokens_per_batch_size"][-1][1] == 64


def test_shipped_example_workload_passes(sdplan) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "chat-workload.toml"
    result = sdplan("check", "-w", str(example))
    assert result.exit_code == ExitStatus.OK, result.output
    assert "3/3 SLOs met" in result.stderr


@pytest.mark.parametrize("command", [["check", "--rate", "8"], ["capacity"]])
def test_a_ttft_slo_on_a_priced_file_says_its_ttft_was_not_measured(sdplan, command: list[str]) -> None:
    """The default file is derived: its TTFT is priced, and derived TTFT has been a quarter off measured servers'.
    Where an SLO bounds TTFT the answer says so (and names the commands that measure it); an E2E SLO, or a
    file whose TTFT was measured (the shipped CPU calibration), gets no such warning."""
    said = "is priced from op timings, not measured"
    bounded = sdplan(*command, "--slo", "ttft:mean<=100ms", "-f", "json")
    assert bounded.exit_code == 0, bounded.output
    warnings = json.loads(bounded.stdout)["warnings"]
    assert [w for w in warnings if said in w and "sdplan validate" in w and "sdplan fit" in w]
    assert said not in " ".join(json.loads(sdplan(*command, "--slo", "e2e:mean<=10s", "-f", "json").stdout)
                                ["warnings"])
    measured = sdplan(*command, "-c", "cpu-epyc-2core_tiny-llama-h256-l4_tiny-llama-h128-l1_measured",
                      "--slo", "ttft:mean<=1s", "-f", "json")
    assert measured.exit_code in (0, 1), measured.output
    assert said not in " ".join(json.loads(measured.stdout)["warnings"])


def test_capacity_says_which_limit_sets_each_saturation_as_plan_does(sdplan) -> None:
    """The default file's KV cache caps every option's batch below 1/C2: capacity's JSON names the limit of each
    saturation rate with plan's word and value, and its table's caption says the rates are the cap's."""
    args = ["--slo", "e2e:mean<=60s", "--acceptance", "0.7", "-k", "1-4"]
    capacity = json.loads(sdplan("capacity", *args, "-f", "json").stdout)
    plan = json.loads(sdplan("plan", "--acceptance", "0.7", "-k", "1-4", "--rates", "1", "-f", "json").stdout)
    expected = [(plan["baseline"]["saturation_limit"], plan["baseline"]["saturation_rate_rps"])] + [
        (entry["saturation_limit"], entry["saturation_rate_rps"]) for entry in plan["results"][0]["draft_lengths"]]
    got = [(option["saturation_limit"], option["saturation_rate_rps"]) for option in capacity["options"]]
    assert [limit for limit, _ in got] == [limit for limit, _ in expected] == ["cap"] * 5
    assert [rate for _, rate in got] == pytest.approx([rate for _, rate in expected], rel=1e-9)
    table = " ".join(sdplan("capacity", *args).stdout.split())
    assert "saturation: where the option's mean batch reaches the engine's batch cap" in table


def test_check_past_every_saturation_names_the_option_that_goes_furthest(sdplan) -> None:
    """At a rate no option sustains, ``check`` (best of the candidates) fails with SD off, as before, and says which
    option saturates last and where: plan's highest saturation rate. Where an option is stable it says nothing
    of the kind."""
    plan = json.loads(sdplan("plan", "--acceptance", "0.7", "--rates", "1", "-f", "json").stdout)
    rates = {entry["draft_length_tokens"]: entry["saturation_rate_rps"]
             for entry in plan["results"][0]["draft_lengths"]} | {0: plan["baseline"]["saturation_rate_rps"]}
    furthest = max(rates, key=lambda k: rates[k])
    past = 1.05 * rates[furthest]
    args = ["--rate", f"{past:.6g}", "--slo", "e2e:mean<=60s", "--acceptance", "0.7"]
    result = sdplan("check", *args, "-f", "json")
    assert result.exit_code == ExitStatus.SLO_VIOLATED, result.output
    document = json.loads(result.stdout)
    assert document["operating_point"]["regime"] == "unstable"
    most = document["speculation"]["most_stable"]
    assert most["draft_length_tokens"] == (furthest or None) and furthest > 0
    assert most["saturation_rate_rps"] == pytest.approx(rates[furthest], rel=1e-9)
    said = f"the most any sustains is {rates[furthest]:.4g} req/s, with SD k={furthest}"
    table = sdplan("check", *args)
    assert said in " ".join(table.stdout.split()) and said in " ".join(table.stderr.split())  # answer and summary
    stable = json.loads(sdplan("check", "--rate", f"{0.5 * rates[furthest]:.6g}", "--slo", "e2e:mean<=60s",
                               "--acceptance", "0.7", "-f", "json").stdout)
    assert stable["speculation"]["most_stable"] is None
