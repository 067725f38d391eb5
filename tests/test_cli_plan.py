"""``sdplan plan`` through the CLI: every option, every format, every error path."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import numpy
import pytest

from sdplan.calibration import DEFAULT_CALIBRATION, resolve_calibration
from sdplan.errors import ExitStatus
from sdplan.latency import knee, model


def strict_json(text: str) -> dict:
    def refuse(constant: str) -> None:
        raise AssertionError(f"JSON contains {constant}")

    return json.loads(text, parse_constant=refuse)


def test_bare_plan_prints_a_table_naming_its_calibration(sdplan) -> None:
    result = sdplan("plan")
    assert result.exit_code == ExitStatus.OK, result.output
    out = result.stdout
    assert DEFAULT_CALIBRATION in out
    assert "priced by AIConfigurator" in out  # a derived calibration is never presented as measured
    assert "default assumption" in out
    assert "rate (req/s)" in out and "no SD (s)" in out and "best k" in out and "SD faster (req/s)" in out
    assert "*" in out  # the best option per row is marked
    assert "unstable" in out  # the default grid reaches saturation


def test_plan_json_schema_and_values(sdplan) -> None:
    result = sdplan("plan", "--format", "json", "--rates", "1,5,40", "--draft-lengths", "1-3", "--acceptance", "0.8")
    assert result.exit_code == 0, result.output
    doc = strict_json(result.stdout)
    assert doc["schema_version"] == 1 and doc["command"] == "plan"
    assert set(doc) == {"schema_version", "sdplan_version", "command", "calibration", "workload", "definitions",
                        "moe", "coefficients", "baseline", "intervals", "warnings", "extrapolated", "results"}
    assert doc["moe"] is None and doc["intervals"] is None  # a derived calibration has no covariance
    assert doc["calibration"]["method"] == "derived"
    assert doc["workload"]["acceptance"]["metric_given"] == "per-token"
    (block,) = doc["results"]
    assert block["per_token_alpha"] == 0.8
    assert [k["draft_length_tokens"] for k in block["draft_lengths"]] == [1, 2, 3]
    assert set(block["draft_lengths"][0]) == {
        "draft_length_tokens", "tokens_per_cycle", "c1_s", "c2_s", "zero_load_latency_s", "zero_load_speedup",
        "saturation_rate_rps", "saturation_limit", "batch_cap_sequences", "batch_cap_limit",
        "max_output_throughput_tok_s", "break_even_rate_rps", "sd_faster", "step_speedup"}
    rows = block["rates"]
    assert [row["request_rate_rps"] for row in rows] == [1, 5, 40]
    assert set(rows[0]["baseline"]) == {"mean_e2e_latency_s", "effective_batch_size", "utilisation", "mean_ttft_s",
                                        "mean_tpot_s", "output_throughput_tok_s", "regime"}
    # the value agrees with the model computed independently
    cal = resolve_calibration(None)
    coeffs = cal.coefficients_at(1024, 512)
    c1, c2 = model.speculative_demand(coeffs, 0.8, 2)
    wait = knee.prefill_wait_s(coeffs.c2p_s, coeffs.prompt_cv, 5.0)  # the prefills queued ahead at 5 req/s
    assert rows[1]["speculative"][1]["mean_e2e_latency_s"] == pytest.approx(float((c1 + wait) / (1 - 5 * c2)),
                                                                            rel=1e-12)
    # past saturation: explicit, no NaN
    last = rows[2]
    assert last["baseline"]["regime"] == "unstable" and last["baseline"]["mean_e2e_latency_s"] is None
    assert last["best"]["speculation"] == "unstable"


def test_plan_csv_has_one_row_per_rate_and_k(sdplan) -> None:
    result = sdplan("plan", "--format", "csv", "--rates", "1:4:1", "--draft-lengths", "1,2,4",
                    "--acceptance", "0.6,0.9")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 2 * 4 * (1 + 3)
    assert {row["speculation"] for row in rows} == {"on", "off"}
    for rate in ("1.0", "2.0"):
        best = [r for r in rows
                if r["request_rate_rps"] == rate and r["per_token_alpha"] == "0.6" and r["is_best"] == "true"]
        assert len(best) == 1
    assert all(key.endswith(("_s", "_rps", "_tokens", "_tok_s")) or key in
               ("per_token_alpha", "speculation", "tokens_per_cycle", "effective_batch_size", "utilisation",
                "speedup", "regime", "is_best") for key in rows[0])


def test_plan_output_file_is_written_atomically(sdplan, tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_text("old")
    result = sdplan("plan", "--format", "json", "--output", str(target))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert strict_json(target.read_text())["command"] == "plan"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary left behind


def test_plan_output_to_missing_folder_is_bad_input(sdplan, tmp_path: Path) -> None:
    result = sdplan("plan", "-o", str(tmp_path / "nope" / "x.json"))
    assert result.exit_code == ExitStatus.BAD_INPUT
    assert "does not exist" in result.stderr


def test_plan_ascii_has_no_box_drawing(sdplan) -> None:
    result = sdplan("plan", "--ascii", "--rates", "1,2")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert any(re.fullmatch(r"\+-+\+", line) for line in lines), "no ASCII table border"
    for rate in ("1", "2"):  # one ASCII row per requested rate
        assert any(re.match(rf"\|\s+{rate} \|", line) for line in lines), f"no ASCII row for rate {rate}"
    assert not any(ch in result.stdout for ch in "╭─│╰")
    assert "\x1b[" not in result.stdout


def test_plan_several_acceptance_values_give_one_table_each(sdplan) -> None:
    result = sdplan("plan", "--acceptance", "0.5:0.9:0.2", "--rates", "1")
    assert result.exit_code == 0
    for alpha in ("0.500", "0.700", "0.900"):
        assert f"per-token alpha {alpha} (given)" in result.stdout


def test_plan_mean_acceptance_length_is_converted(sdplan) -> None:
    result = sdplan("plan", "-f", "json", "--acceptance-length", "3", "--acceptance-k", "3", "--rates", "1")
    assert result.exit_code == 0, result.output
    acceptance = strict_json(result.stdout)["workload"]["acceptance"]
    assert acceptance["metric_given"] == "mean-length" and acceptance["measured_at_k"] == 3
    alpha = acceptance["per_token_alpha"][0]
    assert 1 + alpha + alpha**2 + alpha**3 == pytest.approx(3.0, rel=1e-9)


def test_plan_draft_acceptance_rate_accepts_percent(sdplan) -> None:
    result = sdplan("plan", "-f", "json", "--draft-acceptance-rate", "62%", "--acceptance-k", "4", "--rates", "1")
    assert result.exit_code == 0, result.output
    acceptance = strict_json(result.stdout)["workload"]["acceptance"]
    assert acceptance["metric_given"] == "draft-rate" and acceptance["values_given"] == [0.62]
    alpha = acceptance["per_token_alpha"][0]
    assert (alpha + alpha**2 + alpha**3 + alpha**4) / 4 == pytest.approx(0.62, rel=1e-9)


def test_plan_lengths_and_out_of_range_warning(sdplan) -> None:
    result = sdplan("plan", "-f", "json", "--prompt-tokens", "16384", "--output-tokens", "128", "--rates", "1")
    assert result.exit_code == 0
    doc = strict_json(result.stdout)
    assert doc["workload"]["prompt_tokens"] == 16384 and doc["coefficients"]["prompt_tokens"] == 16384
    assert doc["warnings"] and "outside the calibrated range" in result.stderr
    assert doc["extrapolated"] and doc["extrapolated"][0].startswith("prompt tokens 16384, measured ")


def test_plan_says_first_when_its_answer_leaves_the_measured_workloads(sdplan) -> None:
    """A served calibration measured at 128/64 tokens (acc35): asked at 256/32, the answer itself says it is an
    extrapolation, before the caveats; asked at its own workload, it does not."""
    served = str(Path(__file__).parent / "data" / "served-passes-cpu" / "served.toml")
    result = sdplan("plan", "-c", served, "--prompt-tokens", "256", "--output-tokens", "32", "--rates", "3.4")
    assert result.exit_code == 0, result.output
    answer = " ".join(result.stdout.split("Why:")[0].split())
    assert answer.startswith("Answer, extrapolated past the measured workloads (prompt tokens 256, measured "
                             "123-134; output tokens 32, measured 60-67): SD on"), answer
    inside = sdplan("plan", "-c", served, "--prompt-tokens", "128", "--output-tokens", "64", "--rates", "3.4")
    assert inside.exit_code == 0 and inside.stdout.startswith("Answer: ") and "extrapolated" not in inside.stdout


def test_plan_calibration_by_path_name_and_env(sdplan, write_calibration, direct_document, monkeypatch) -> None:
    path = write_calibration(direct_document)
    assert "test-direct" in sdplan("plan", "-c", str(path), "--rates", "1").stdout
    assert "a100" in sdplan("plan", "--calibration", "a100-sxm-80gb_llama-3.1-8b_llama-3.2-1b_roofline",
                            "--rates", "1").stdout
    monkeypatch.setenv("SDPLAN_CALIBRATION", str(path))
    assert "test-direct" in sdplan("plan", "--rates", "1").stdout


def test_plan_uses_calibration_acceptance_when_none_given(sdplan, write_calibration, direct_document) -> None:
    direct_document["acceptance"] = {"per_token_alpha": 0.85, "source": "ShareGPT, T=0"}
    path = write_calibration(direct_document)
    doc = strict_json(sdplan("plan", "-c", str(path), "-f", "json", "--rates", "1").stdout)
    assert doc["workload"]["acceptance"]["per_token_alpha"] == [0.85]
    assert "ShareGPT" in doc["workload"]["acceptance"]["source"]


USAGE_ERRORS = [
    (["--rates", "fast"], "not a number"),
    (["--rates", "-1"], ">= 0"),
    (["--rates", "5:1:1"], "STOP >= START"),
    (["--rates", "1:2"], "START:STOP:STEP"),
    (["--rates", "0:1e9:1e-6"], "at most"),
    (["--draft-lengths", "x"], "not an integer"),
    (["--draft-lengths", "0"], "at least one draft length"),
    (["--draft-lengths", "-2"], ">= 0 tokens"),
    (["--acceptance", "1.5"], "[0, 1]"),
    (["--acceptance", "0.7", "--acceptance-length", "2"], "one metric only"),
    (["--acceptance-length", "2"], "--acceptance-k"),
    (["--acceptance-length", "9", "--acceptance-k", "3"], "[1, 4]"),
    (["--acceptance", "0.7", "--acceptance-k", "3"], "--acceptance-k applies"),
    (["--acceptance-k", "3"], "needs --acceptance-length"),
    (["--acceptance-k", "0", "--acceptance-length", "1"], "0"),
    (["--prompt-tokens", "0"], ">= 1"),
    (["--output-tokens", "-5"], ">= 1"),
    (["--format", "xml"], "xml"),
    (["--no-such-option"], "no-such-option"),
]


@pytest.mark.parametrize(("args", "message"), USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_plan_usage_errors_exit_2_with_one_message(sdplan, args, message) -> None:
    result = sdplan("plan", *args)
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


DRAFT_LENGTH_COMMANDS = [
    (["plan"], "-k", 1024),
    (["simulate"], "-k", 1024),  # "-k 0" was taken as k=1
    (["check", "--rate", "4", "--slo", "e2e:mean<=5s"], "-k", 1024),
    (["capacity", "--slo", "e2e:mean<=5s"], "-k", 1024),
    # what a server runs: calibrate serves it, derive prices its verification (derive took k=200)
    (["derive", "--target-model", "x", "--system", "h100_sxm", "--method", "ngram", "-o", "x.toml"], "--draft-lengths",
     64),
    (["calibrate", "-o", "x.toml"], "--draft-lengths", 64),
]


@pytest.mark.parametrize(("command", "flag", "maximum"), DRAFT_LENGTH_COMMANDS,
                         ids=[c[0] for c, _, _ in DRAFT_LENGTH_COMMANDS])
def test_every_command_reads_draft_lengths_by_one_rule(sdplan, tmp_path: Path, monkeypatch, command, flag,
                                                       maximum) -> None:
    """Lists and ranges, 0 (SD off) taken but not a length to run, the largest length each command can use."""
    monkeypatch.chdir(tmp_path)
    for given, message in ((f"1,{maximum + 1}", f"at most {maximum}"), ("-1", ">= 0 tokens"), ("2-x", "not an integer"),
                           *([] if command[0] == "calibrate" else [("0", "at least one draft length >= 1")])):
        result = sdplan(*command, flag, given)
        assert result.exit_code == ExitStatus.USAGE, (given, result.output)
        assert message in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "x.toml").exists()


def test_plan_bad_calibration_file_exits_3(sdplan, tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("schema_version = 1\n[provenance\n")
    for reference in (str(broken), str(tmp_path / "missing.toml")):
        result = sdplan("plan", "-c", reference)
        assert result.exit_code == ExitStatus.BAD_INPUT, result.output
        assert result.stderr.count("\n") == 1 and reference in result.stderr


def test_unexpected_exception_is_internal_error_not_1(sdplan, monkeypatch) -> None:
    from sdplan.planning import planner

    def explode(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(planner, "plan", explode)
    result = sdplan("plan")
    assert result.exit_code == ExitStatus.INTERNAL
    assert "internal error" in result.stderr and "SDPLAN_DEBUG" in result.stderr


def test_plan_default_grid_has_numbers_for_every_k(sdplan) -> None:
    doc = strict_json(sdplan("plan", "-f", "json").stdout)
    rows = doc["results"][0]["rates"]
    assert len(rows) == 12
    first = rows[0]
    assert first["best"]["speculation"] == "on" and first["best"]["speedup"] > 1
    latencies = numpy.array([p["mean_e2e_latency_s"] for p in first["speculative"]])
    assert numpy.all(latencies > 0)


def test_a_recommended_k_past_the_derived_draft_lengths_is_said(sdplan) -> None:
    """The default file priced verification at k = 1-5 and plan weighs k up to 8: where a k past 5 is best
    (high acceptance) the answer says it is extrapolated, in the table's caveats and the JSON's warnings;
    where every best k was priced (the default acceptance) it says nothing of the kind."""
    high = sdplan("plan", "--acceptance", "0.95", "-f", "json")
    assert high.exit_code == 0, high.output
    document = json.loads(high.stdout)
    best = {rate["best"]["draft_length_tokens"] for rate in document["results"][0]["rates"]
            if rate["best"].get("speculation") == "on"}
    assert max(best) > 5
    said = [w for w in document["warnings"] if "beyond the draft lengths" in w]
    assert len(said) == 1 and "priced (up to k=5)" in said[0] and f"k={max(best)}" in said[0]
    assert "--draft-lengths 1-" in said[0]
    plain = sdplan("plan", "-f", "json")
    assert not [w for w in json.loads(plain.stdout)["warnings"] if "beyond the draft lengths" in w]
    checked = sdplan("check", "--rate", "2", "--slo", "e2e:mean<=60s", "--acceptance", "0.95", "-k", "8")
    assert checked.exit_code == 0 and "k=8 is beyond the draft lengths" in checked.output.replace("\n", " ")


def test_the_zero_load_k_the_answer_names_is_checked_against_the_priced_draft_lengths(sdplan) -> None:
    """At acceptance 0.9 the answer's first line names k=8 at zero load while no rate of the grid picks it
    (the rates pick k=4-7): the caveat on draft lengths past the file's k=5 names k=8 too, and the command it
    suggests prices up to 8."""
    result = sdplan("plan", "--acceptance", "0.9", "-f", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    picked = {rate["best"]["draft_length_tokens"] for rate in document["results"][0]["rates"]
              if rate["best"].get("speculation") == "on"}
    table = sdplan("plan", "--acceptance", "0.9")
    named = re.search(r"k=(\d+) at zero load", table.output)
    assert named is not None and int(named.group(1)) not in picked, (picked, table.output[:300])
    said = [w for w in document["warnings"] if "beyond the draft lengths" in w]
    assert len(said) == 1 and f"k={named.group(1)}" in said[0] and f"--draft-lengths 1-{named.group(1)}" in said[0]


def test_the_first_screen_says_once_that_the_batches_pass_the_calibrated_range(sdplan) -> None:
    """The rate where the best option leaves the calibrated batch sizes and the calibration's own warning of it
    are one caveat, not two."""
    words = " ".join(sdplan("plan").stdout.split())
    assert words.count("exceeds the calibrated batch sizes") == 1
    assert "the best option has more than 128 requests in flight: effective batch up to" in words
    assert "maybe the engine's max_num_seqs" not in words
