"""Every class of bad input gets its documented exit status and a one-line message.

Each test names the bad input it guards against. The property-based sweep over all commands is
``tests/test_fuzz_cli.py``.
"""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sdplan.errors import ExitStatus
from sdplan.fileio import dumps_toml

Run = Callable[..., Any]


def error_line(result: Any) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


# ----------------------------------------------------------------------------- output paths


@pytest.mark.parametrize("target", ["", ".", "..", "/", "{tmp}", "{tmp}/"])
def test_output_naming_a_folder_is_an_io_error(sdplan: Run, tmp_path: Path, target: str) -> None:
    result = sdplan("plan", "-f", "json", "-o", target.format(tmp=tmp_path))
    assert result.exit_code == ExitStatus.BAD_INPUT
    assert "folder" in error_line(result) and "file name" in error_line(result)
    assert not list(tmp_path.glob(".*.tmp"))


def _device_link(tmp_path: Path, name: str) -> Path:
    """A link to /dev/NAME in ``tmp_path``: a regression replacing the target would replace the link only."""
    device = Path("/dev") / name
    if not (device.exists() and stat.S_ISCHR(device.stat().st_mode)):
        pytest.skip(f"no {device} character device here")
    link = tmp_path / name
    link.symlink_to(device)
    return link


def test_full_disk_is_an_io_error_and_devices_are_written_in_place(sdplan: Run, tmp_path: Path) -> None:
    full, null = _device_link(tmp_path, "full"), _device_link(tmp_path, "null")
    result = sdplan("plan", "-o", str(full))
    assert result.exit_code == ExitStatus.BAD_INPUT
    assert "No space left on device" in error_line(result)
    assert full.is_symlink() and stat.S_ISCHR(full.stat().st_mode)  # written to, never replaced
    assert sdplan("plan", "-o", str(null)).exit_code == 0
    assert null.is_symlink() and stat.S_ISCHR(null.stat().st_mode)
    assert not list(tmp_path.glob(".*.tmp"))


def test_stdout_on_a_full_disk_is_an_io_error_not_a_bug(tmp_path: Path) -> None:
    with open(_device_link(tmp_path, "full"), "w") as full:
        done = subprocess.run([sys.executable, "-m", "sdplan", "plan"], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    assert done.returncode == ExitStatus.BAD_INPUT, done.stderr
    assert "No space left on device" in done.stderr and "internal error" not in done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr


def test_closed_pipe_stops_quietly() -> None:
    # the reader is gone before sdplan writes (as with 'sdplan plan | head' once head has exited)
    process = subprocess.Popen([sys.executable, "-m", "sdplan", "plan"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    with process.stderr:
        stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == ExitStatus.BROKEN_PIPE
    assert stderr == ""


def test_long_file_names(sdplan: Run, tmp_path: Path) -> None:
    result = sdplan("plan", "-c", str(tmp_path / ("a" * 300 + ".toml")))
    assert result.exit_code == ExitStatus.BAD_INPUT and "File name too long" in error_line(result)
    longest = tmp_path / ("b" * 250 + ".txt")  # legal, though the temporary file's name would not be
    assert sdplan("plan", "-o", str(longest)).exit_code == 0
    assert longest.read_text().startswith("Answer:")  # the decision first


def test_failed_write_keeps_the_previous_file(sdplan: Run, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    out.write_text("previous\n")
    result = sdplan("plan", "-f", "json", "-o", str(out), "-r", "0:99999:1")
    assert result.exit_code == ExitStatus.USAGE
    assert out.read_text() == "previous\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads mode-000 folders")
def test_calibration_in_an_unreadable_folder(sdplan: Run, tmp_path: Path, direct_document: dict) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    (folder / "cal.toml").write_text(dumps_toml(direct_document))
    folder.chmod(0)
    try:
        result = sdplan("plan", "-c", str(folder / "cal.toml"))
    finally:
        folder.chmod(stat.S_IRWXU)
    assert result.exit_code == ExitStatus.BAD_INPUT and "ermission" in error_line(result)


# ----------------------------------------------------------------------------- percentiles


def test_any_percentile_under_simulate(sdplan: Run) -> None:
    result = sdplan("check", "--rate", "4", "--simulate", "--requests", "300", "--seeds", "2", "-f", "json",
                    "--slo", "e2e:p99.9<=60s", "--slo", "ttft:p95<=10s", "--slo", "tpot:p12.5<=1s")
    assert result.exit_code == 0, result.stderr
    verdicts = json.loads(result.stdout)["verdicts"]
    assert [verdict["slo"] for verdict in verdicts] == ["e2e:p99.9<=60s", "ttft:p95<=10s", "tpot:p12.5<=1s"]
    values = [verdict["predicted_s"] for verdict in verdicts]
    assert all(value is not None and value > 0 for value in values)


@pytest.mark.parametrize("statistic", ["p0", "p100", "p-1", "pnan", "pinf", "p1e3"])
def test_percentiles_outside_zero_hundred_are_refused(sdplan: Run, statistic: str) -> None:
    result = sdplan("check", "--rate", "4", "--simulate", "--slo", f"e2e:{statistic}<=10s")
    assert result.exit_code == ExitStatus.USAGE and f"e2e:{statistic}<=10s" in error_line(result)


# ----------------------------------------------------------------------------- numbers and budgets


@pytest.mark.parametrize("args", [
    ["capacity", "--slo", "e2e:mean<=4s", "--target-rate", "inf"],
    ["check", "--rate", "nan", "--slo", "e2e:mean<=4s"],
    ["simulate", "--seed", "-1"],
    ["check", "--rate", "6", "--simulate", "--arrival-cv", "1e6", "--slo", "e2e:mean<=10s"],
    ["show", "--prompt-tokens", "1" + "0" * 400],
    ["simulate", "-k", "99999999999999999999"],
    ["simulate", "--draft-length", "99999999999999999999"],
    ["simulate", "--requests", "99999999999999999999"],
    ["capacity", "--slo", "e2e:mean<=4s", "--max-batch-size", "99999999999999999999"],
    ["plan", "--rates", "0:1e308:1e-300"],
    ["plan", "-k", "1-100000"],
])
def test_out_of_range_numbers_are_usage_errors(sdplan: Run, args: list[str]) -> None:
    result = sdplan(*args)
    assert result.exit_code == ExitStatus.USAGE, result.stderr
    assert len(error_line(result)) < 300


@pytest.mark.parametrize("args, size", [
    (["plan", "--rates", "0:99999:1"], "900,000 grid points"),
    (["plan", "--rates", "1,6", "--acceptance", "0:1:0.0001"], "180,018 grid points"),
    (["plan", "--rates", "0:9999:1"], "10,000 rows"),
    (["capacity", "--slo", "e2e:mean<=4s", "-k", "1-1000"], "1,024,000 grid points"),  # derived: max_num_seqs 1024
    (["capacity", "--slo", "e2e:mean<=4s", "--max-batch-size", "123456789"], "987,654,312 grid points"),
    (["check", "--rate", "5", "--simulate", "--slo", "e2e:p99<=9s", "--requests", "1000000"], "3,000,150 requests"),
    (["simulate", "--requests", "10", "--seeds", "1", "--rates", "1:100000:1"], "6,000,000 requests"),
    (["check", "--rate", "0.001", "--simulate", "--slo", "e2e:p99<=9s", "--output-tokens", "10000000",
      "--draft-length", "3", "--requests", "100", "--seeds", "1", "--kv-cache-tokens", "1e12"], "GiB of memory"),
])
def test_work_over_budget_is_refused_before_allocation(sdplan: Run, args: list[str], size: str) -> None:
    result = sdplan(*args)
    assert result.exit_code == ExitStatus.USAGE, result.stderr
    line = error_line(result)
    assert size in line and "budget" in line and "SDPLAN_WORK_LIMIT=" in line


def test_work_limit_scales_the_budget(sdplan: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ("plan", "--rates", "0:11999:1", "-f", "csv")  # 108,000 points: just over the budget
    assert sdplan(*args).exit_code == ExitStatus.USAGE
    monkeypatch.setenv("SDPLAN_WORK_LIMIT", "1.2")
    assert sdplan(*args).exit_code == 0
    monkeypatch.setenv("SDPLAN_WORK_LIMIT", "lots")
    assert "SDPLAN_WORK_LIMIT" in error_line(sdplan(*args))


@pytest.mark.parametrize("args", [
    ["--target-rate", "1e300", "--gpu-hour-cost", "1e6", "--gpus-per-replica", "8", "-f", "json"],
    ["--target-rate", "1e10", "--slo", "utilisation<=1e-300"],
])
def test_fleets_beyond_any_deployment_are_infeasible(sdplan: Run, args: list[str]) -> None:
    result = sdplan("capacity", "--slo", "e2e:mean<=4s", *args)
    assert result.exit_code == ExitStatus.INFEASIBLE and "replicas" in error_line(result)


def test_slo_count_is_bounded(sdplan: Run) -> None:
    result = sdplan("check", "--rate", "1", *[arg for _ in range(101) for arg in ("--slo", "e2e:mean<=4s")])
    assert result.exit_code == ExitStatus.USAGE and "at most 100" in error_line(result)


def test_workload_batch_size_is_bounded(sdplan: Run, tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text('schema_version = 1\nslos = ["e2e:mean<=4s"]\n[deployment]\nmax_batch_size = 123456789\n')
    result = sdplan("capacity", "-w", str(path))
    assert result.exit_code == ExitStatus.BAD_INPUT and "deployment.max_batch_size" in error_line(result)


# ----------------------------------------------------------------------------- calibrations


def _zeroed(document: dict) -> dict:
    coefficients = document["coefficients"]
    for table in (coefficients, coefficients["baseline"], coefficients["speculative"]):
        for key, value in table.items():
            if isinstance(value, float):
                table[key] = 0.0
    return document


@pytest.mark.parametrize("change, key", [
    (_zeroed, "coefficients.baseline.c1_step_s"),
    (lambda d: {**d, "coefficients": {**d["coefficients"], "c1p_s": 1e308}}, "coefficients.c1p_s"),
    # no load cost at all (prefill interference and per-request step cost both zero): never saturates
    (lambda d: {**d, "coefficients": {**d["coefficients"], "c2p_s": 0.0,
                                      "baseline": {"c1_step_s": 0.008, "c2_step_s": 0.0}}},
     "coefficients.baseline.c2_step_s"),
])
def test_calibrations_that_describe_no_hardware_are_refused(sdplan: Run, write_calibration: Any,
                                                           direct_document: dict, change: Any, key: str) -> None:
    path = write_calibration(change(direct_document))
    for command in (["show", "-f", "json"], ["plan"]):
        result = sdplan(*command, "-c", str(path))
        assert result.exit_code == ExitStatus.BAD_INPUT
        assert f"{path}: {key}:" in error_line(result)
        assert "RuntimeWarning" not in result.stderr


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16"])
def test_toml_with_a_byte_order_mark_is_read(sdplan: Run, tmp_path: Path, direct_document: dict,
                                             encoding: str) -> None:
    direct_document["description"] = "caf\u00e9 \u2014 \u03b1 measured"  # non-ASCII: the encoding must be honoured
    path = tmp_path / "cal.toml"
    path.write_bytes(dumps_toml(direct_document).encode(encoding))
    result = sdplan("show", "-c", str(path), "-f", "json")
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["valid"] is True
    assert shown["document"] == direct_document  # every key and value survives the mark and the encoding


def test_latin1_toml_is_refused_clearly(sdplan: Run, tmp_path: Path, direct_document: dict) -> None:
    direct_document["description"] = "caf\u00e9"
    path = tmp_path / "cal.toml"
    path.write_bytes(dumps_toml(direct_document).encode("latin-1"))
    result = sdplan("show", "-c", str(path))
    assert result.exit_code == ExitStatus.BAD_INPUT and "save the file as UTF-8" in error_line(result)


# ----------------------------------------------------------------------------- lengths files


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16"])
def test_lengths_file_in_any_utf_with_a_mark(sdplan: Run, tmp_path: Path, encoding: str) -> None:
    path = tmp_path / "lengths.csv"
    path.write_bytes("prompt_tokens,output_tokens,weight\n512,128,3\n2048,256,1\n".encode(encoding))
    result = sdplan("simulate", "--lengths-file", str(path), "--requests", "100", "--seeds", "1", "-r", "2",
                    "-f", "json")
    assert result.exit_code == 0, result.stderr
    workload = json.loads(result.stdout)["workload"]
    # the weighted means of the two rows (3:1): the file was read, not replaced by the defaults
    assert workload["prompt_tokens"] == pytest.approx((3 * 512 + 2048) / 4)
    assert workload["output_tokens"] == pytest.approx((3 * 128 + 256) / 4)


@pytest.mark.parametrize("content, message", [
    ("prompt_tokens,output_tokens,weight\n100,50,1 caf\u00e9\n".encode("latin-1"), "not UTF-8"),
    (b"prompt_tokens,output_tokens,weight\n100,50,1e400\n", "finite"),
    (b"prompt_tokens,output_tokens,weight\n100,50,0\n", "positive weight"),
    (b"prompt_tokens,output_tokens,weight\n100,1e9,1\n", "between 1 and"),
])
def test_bad_lengths_files(sdplan: Run, tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "lengths.csv"
    path.write_bytes(content)
    result = sdplan("check", "--rate", "1", "--simulate", "--slo", "e2e:p99<=9s", "--lengths-file", str(path))
    assert result.exit_code == ExitStatus.BAD_INPUT and message in error_line(result)


def test_huge_weights_do_not_overflow(sdplan: Run, tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("prompt_tokens,output_tokens,weight\n100,50,1e308\n300,60,1e308\n")
    result = sdplan("simulate", "--lengths-file", str(path), "--requests", "50", "--seeds", "1", "-r", "1",
                    "-f", "json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    # equal huge weights are an even mix: the normalisation did not overflow to inf/inf = nan
    assert document["workload"]["prompt_tokens"] == pytest.approx(200)
    assert document["workload"]["output_tokens"] == pytest.approx(55)
    (row,) = document["rates"]
    values = [entry["value"] for entry in row["statistics"].values()] + [row["output_throughput_tok_s"]["value"]]
    assert all(value is not None and math.isfinite(value) and value >= 0 for value in values), values
    assert row["statistics"]["e2e_mean_s"]["value"] > 0


# ----------------------------------------------------------------------------- messages


def test_values_with_newlines_are_echoed_on_one_line(sdplan: Run) -> None:
    result = sdplan("check", "--rate", "4", "--slo", "e2e:mean<=4s\nrm -rf /")
    assert result.exit_code == ExitStatus.USAGE
    assert "e2e:mean<=4s\\nrm -rf /" in error_line(result)


def optional_derivation_keys() -> list[str]:
    from sdplan.calibration.schema import CALIBRATION_SCHEMA

    table = CALIBRATION_SCHEMA.fields["derivation"]
    return sorted(name for name, spec in table.fields.items() if not spec.required)


@pytest.mark.parametrize("key", optional_derivation_keys())
def test_a_derivation_without_an_optional_key_still_shows(sdplan: Run, tmp_path: Path, key: str) -> None:
    """Each optional key of ``[derivation]`` may be missing on its own (a hand-edited file, another
    deriver): show prints what is there. Leaving out the draft's largest error alone was an internal error."""
    import tomllib

    from sdplan.calibration import resolve_calibration

    # each has every optional key, the anchor's too; a draft model's GPUs only a draft model's file has
    anchored = ("4xh100-sxm_llama-3.1-70b-fp8_llama-3.1-8b_derived" if key == "draft_tensor_parallel_size"
                else "2xh100-sxm_qwen3-32b_eagle3_derived")
    document = tomllib.loads(Path(resolve_calibration(anchored).path).read_text())
    if key == "kv_cache_dtype":  # only derive --kv-cache-dtype writes it, so no shipped file has it: set it first
        document["derivation"][key] = "fp8"
    assert key in document["derivation"]
    del document["derivation"][key]
    path = tmp_path / "cal.toml"
    path.write_text(dumps_toml(document))
    result = sdplan("show", "-c", str(path), "--ascii")
    assert result.exit_code == 0, result.stderr
    assert "measured vs derived" in result.stdout or key == "anchor_rows"


@pytest.mark.parametrize(("key", "value", "quantity"), [
    ("request_rate", 1e308, "request rate of 1e+308 req/s"),
    ("total_input_tokens", 1e308, "mean prompt length"),
    ("total_output_tokens", 1e300, "mean output length"),
])
def test_finite_but_impossible_numbers_in_a_result_are_refused(sdplan: Run, tmp_path: Path, key: str, value: float,
                                                                quantity: str) -> None:
    """Finite values past any server overflowed the fit's products: 1e308 req/s made its load lambda L
    infinite (an SVD that did not converge), 1e308 prompt tokens its length scaling (exit 70, both)."""
    import shutil

    folder = tmp_path / "runs"
    shutil.copytree(Path(__file__).parent / "data" / "served-quick-floor-cpu", folder)
    poisson = folder / "k2_p40_r0.json"
    document = json.loads(poisson.read_text())
    document[key] = value
    poisson.write_text(json.dumps(document))
    for command in (["fit", str(folder), "-o", str(tmp_path / "fit.toml")], ["validate", str(poisson)]):
        result = sdplan(*command)
        assert result.exit_code == ExitStatus.BAD_INPUT, result.stderr
        assert f"{poisson}: {quantity}" in error_line(result) and "past any real server" in error_line(result)
    assert not (tmp_path / "fit.toml").exists()
