"""Calibration files: shipped files, both coefficient forms, and every validation error."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sdplan.calibration import (
    DEFAULT_CALIBRATION,
    load_calibration,
    parse_calibration,
    resolve_calibration,
    shipped_calibrations,
)
from sdplan.errors import ExitStatus, InputFileError

REPO = Path(__file__).resolve().parent.parent


def test_shipped_calibrations_are_valid_and_include_the_default() -> None:
    paths = shipped_calibrations()
    assert len(paths) >= 4
    names = set()
    for path in paths:
        cal = load_calibration(path)
        assert cal.name == path.stem
        names.add(cal.name)
        coeffs = cal.coefficients_at(cal.reference_prompt_tokens, cal.reference_output_tokens)
        assert all(value >= 0 for value in (coeffs.c1p_s, coeffs.c1v_s, coeffs.c2v_s, coeffs.c1d_s))
        if cal.method == "roofline":
            assert cal.provenance["assumptions"]
    assert DEFAULT_CALIBRATION in names


def test_roofline_calibrations_are_reproducible(tmp_path: Path) -> None:
    """The shipped roofline files are exactly what the derivation script writes, and each says why it stays."""
    subprocess.run([sys.executable, str(REPO / "scripts" / "derive_roofline.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    generated = sorted(tmp_path.glob("*.toml"))
    assert generated
    for path in generated:
        shipped = REPO / "calibrations" / path.name
        assert shipped.read_text() == path.read_text(), f"{path.name} drifted: rerun scripts/derive_roofline.py"
    shipped_rooflines = {path.name for path in (REPO / "calibrations").glob("*_roofline.toml")}
    assert shipped_rooflines == {path.name for path in generated}, "a shipped roofline file has no derivation"
    for path in generated:  # a roofline stays only where sdplan derive cannot build the pair, and says so
        assert "cannot build" in load_calibration(path).provenance["notes"]


def test_direct_form_at_reference_is_verbatim(direct_document: dict[str, Any]) -> None:
    cal = parse_calibration(direct_document, "x.toml")
    c = cal.coefficients_at(1000, 500)
    assert (c.c1p_s, c.c2p_s, c.c1v_s, c.c2v_s, c.c1d_s, c.c2d_s) == (0.05, 0.01, 0.009, 0.0001, 0.001, 0.00005)
    assert (c.baseline_c1_step_s, c.baseline_c2_step_s) == (0.008, 0.0001)


def test_direct_form_scales_proportionally(direct_document: dict[str, Any]) -> None:
    cal = parse_calibration(direct_document, "x.toml")
    c = cal.coefficients_at(2000, 1000)  # prompt x2, mean context (p + g/2) x2
    assert c.c1p_s == pytest.approx(0.10) and c.c2p_s == pytest.approx(0.02)
    assert c.c2v_s == pytest.approx(0.0002)
    # one drafted token's compute: not scaled with the context (docs/model.md#length-scaling)
    assert c.c2d_s == pytest.approx(0.00005)
    assert c.baseline_c2_step_s == pytest.approx(0.0002)
    assert c.c1v_s == 0.009 and c.c1d_s == 0.001  # fixed costs do not scale
    direct_document["coefficients"]["scaling"] = "none"
    fixed = parse_calibration(direct_document, "x.toml").coefficients_at(2000, 1000)
    assert fixed.c2v_s == 0.0001 and fixed.c1p_s == 0.05


def test_step_form_maps_to_kong_coefficients(direct_document: dict[str, Any]) -> None:
    document = copy.deepcopy(direct_document)
    del document["coefficients"]
    document["step_model"] = {
        "target": {"fixed_s": 0.006, "per_sequence_s": 1e-5, "per_query_token_s": 3e-5, "per_context_token_s": 5e-8},
        "draft": {"fixed_s": 0.001, "per_sequence_s": 2e-6, "per_query_token_s": 5e-6, "per_context_token_s": 1e-8},
        "prefill": {"fixed_s": 0.006, "per_prompt_token_s": 3e-5, "load_per_prompt_token_s": 2e-5},
        "speculation": {"overhead_fixed_s": 5e-4, "overhead_per_sequence_s": 1e-6},
    }
    cal = parse_calibration(document, "x.toml")
    c = cal.coefficients_at(1000, 500)
    s = 1000 + 250  # mean context p + g/2
    assert c.c1p_s == pytest.approx(0.006 + 1000 * 3e-5)
    assert c.c2p_s == pytest.approx(1000 * 2e-5)
    c2v = 1e-5 + 3e-5 + s * 5e-8 + 1e-6
    c2d = 3e-5 + 2e-6 + 5e-6 + s * 1e-8
    assert c.c2v_s == pytest.approx(c2v)
    assert c.c2d_s == pytest.approx(c2d)
    # C1 is the batch-1 latency: it carries the request's own per-sequence cost
    assert c.c1v_s == pytest.approx(0.006 + 5e-4 + c2v)
    assert c.c1d_s == pytest.approx(0.001 + c2d)
    assert c.baseline_c2_step_s == pytest.approx(1e-5 + 3e-5 + s * 5e-8)
    assert c.baseline_c1_step_s == pytest.approx(0.006 + c.baseline_c2_step_s)
    # longer contexts cost more per concurrent request
    assert cal.coefficients_at(4000, 500).c2v_s > c.c2v_s
    # a prefill's attention over its own prefix: the squared terms add p^2 each, and must not be negative
    document["step_model"]["prefill"] |= {"per_prompt_token_sq_s": 1e-9, "load_per_prompt_token_sq_s": 2e-9}
    squared = parse_calibration(document, "x.toml").coefficients_at(1000, 500)
    assert squared.c1p_s == pytest.approx(c.c1p_s + 1000**2 * 1e-9)
    assert squared.c2p_s == pytest.approx(c.c2p_s + 1000**2 * 2e-9)
    document["step_model"]["prefill"]["load_per_prompt_token_sq_s"] = -2e-9
    with pytest.raises(InputFileError, match="step_model.prefill.load_per_prompt_token_sq_s: must be >= 0"):
        parse_calibration(document, "x.toml")


def _mutate(document: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    document = copy.deepcopy(document)
    *parents, leaf = dotted.split(".")
    table = document
    for key in parents:
        table = table[key]
    if value is _DELETE:
        del table[leaf]
    else:
        table[leaf] = value
    return document


_DELETE = object()

BAD_DOCUMENTS = [
    ("coefficients.c1p_ss", 0.1, "coefficients.c1p_ss", "did you mean 'coefficients.c1p_s'"),
    ("extra_top", 1, "extra_top", "unknown key"),
    ("coefficients.c1p_s", _DELETE, "coefficients.c1p_s", "missing"),
    ("provenance", _DELETE, "provenance", "missing"),
    ("coefficients.c1p_s", "fast", "coefficients.c1p_s", "expected a number"),
    ("coefficients.c1p_s", True, "coefficients.c1p_s", "expected a number"),
    ("coefficients.speculative.c2v_s", -1e-4, "coefficients.speculative.c2v_s", "must be >= 0"),
    ("coefficients.speculative.c2v_s", float("nan"), "coefficients.speculative.c2v_s", "finite"),
    ("coefficients.speculative.c2v_s", float("inf"), "coefficients.speculative.c2v_s", "finite"),
    ("reference_workload.prompt_tokens", 0, "reference_workload.prompt_tokens", "must be >= 1"),
    ("reference_workload.prompt_tokens", 10.5, "reference_workload.prompt_tokens", "expected an integer"),
    ("provenance.method", "guessed", "provenance.method", "not one of"),
    ("provenance.date", "last tuesday", "provenance.date", "not a date"),
    ("schema_version", 2, "schema_version", "not supported"),
    ("schema_version", "1", "schema_version", "expected an integer"),
    ("acceptance", {"per_token_alpha": 1.3, "source": "x"}, "acceptance.per_token_alpha", "must be <= 1"),
    ("acceptance", {"per_token_alpha": -0.1, "source": "x"}, "acceptance.per_token_alpha", "must be >= 0"),
    ("fit_quality", _DELETE, "fit_quality", "must report its fit quality"),
    ("coefficients", _DELETE, "coefficients|step_model", "neither is present"),
    ("coefficients.baseline", 3, "coefficients.baseline", "expected a table"),
    ("validity", {"prompt_tokens": [500, 100]}, "validity.prompt_tokens", "min <= max"),
]


@pytest.mark.parametrize(("key", "value", "where", "message"), BAD_DOCUMENTS,
                         ids=[row[0] + ":" + row[3] for row in BAD_DOCUMENTS])
def test_invalid_documents_name_file_key_and_fix(direct_document, key, value, where, message) -> None:
    document = _mutate(direct_document, key, value)
    with pytest.raises(InputFileError) as info:
        parse_calibration(document, "bad.toml")
    text = str(info.value)
    assert text.startswith(f"bad.toml: {where}: "), text
    assert message in text
    assert "\n" not in text
    assert info.value.exit_status is ExitStatus.BAD_INPUT


def test_both_forms_is_an_error(direct_document) -> None:
    document = copy.deepcopy(direct_document)
    document["step_model"] = {}
    with pytest.raises(InputFileError, match="both are present"):
        parse_calibration(document, "x.toml")


def test_roofline_needs_assumptions(direct_document) -> None:
    document = _mutate(direct_document, "provenance.method", "roofline")
    with pytest.raises(InputFileError, match="provenance.assumptions"):
        parse_calibration(document, "x.toml")


def test_malformed_toml_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("schema_version = 1\nname = \n")
    with pytest.raises(InputFileError) as info:
        load_calibration(path)
    assert str(info.value).startswith(f"{path}: invalid TOML")
    assert "\n" not in str(info.value)


def test_unreadable_inputs(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="no such file"):
        load_calibration(tmp_path / "missing.toml")
    with pytest.raises(InputFileError, match="is a directory"):
        load_calibration(tmp_path)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputFileError):
        load_calibration(binary)


def test_resolve_by_name_path_and_unknown(write_calibration, direct_document) -> None:
    assert resolve_calibration(None).name == DEFAULT_CALIBRATION
    assert resolve_calibration(DEFAULT_CALIBRATION).name == DEFAULT_CALIBRATION
    path = write_calibration(direct_document)
    assert resolve_calibration(str(path)).name == "test-direct"
    with pytest.raises(InputFileError, match="shipped names"):
        resolve_calibration("no-such-calibration")


def test_validity_warnings(direct_document) -> None:
    document = copy.deepcopy(direct_document)
    document["validity"] = {"prompt_tokens": [128, 2048]}
    cal = parse_calibration(document, "x.toml")
    assert cal.validity_warnings(1000, 500) == []
    assert "outside the calibrated range" in cal.validity_warnings(4096, 500)[0]


def test_a_file_derived_for_another_engine_than_vllm_says_its_sd_cycle_is_vllms(tmp_path: Path, sdplan) -> None:
    """sdplan derive prices SGLang and TensorRT-LLM with vLLM's measured overheads; an answer that turns SD on
    with such a file says so, with what SGLang's measured SD runs showed, and a vLLM file says nothing of it."""
    from sdplan.calibration import load_calibration

    shipped = resolve_calibration("h100-sxm_llama-3.1-8b_eagle3_derived")
    text = Path(shipped.path).read_text()
    for engine in ("sglang", "trtllm"):
        path = tmp_path / f"{engine}.toml"
        path.write_text(text.replace('engine = "vllm"', f'engine = "{engine}"')
                        .replace('backend = "vllm"', f'backend = "{engine}"'))
        warnings = load_calibration(path).validity_warnings(1024, 512, None, [3])
        assert any("SD cycle takes vLLM's engine overheads, assumed for" in w for w in warnings)
        assert any("10-50% above the measured" in w for w in warnings) == (engine == "sglang")
        assert any("16.2% above the measured on average" in w for w in warnings) == (engine == "trtllm")
        assert not load_calibration(path).validity_warnings(1024, 512, None, [0])  # no SD: nothing to say
    assert not shipped.validity_warnings(1024, 512, None, [3])
    answer = sdplan("plan", "-c", str(tmp_path / "sglang.toml"), "--rates", "2").stdout
    assert "SD cycle takes vLLM's engine" in " ".join(answer.split())
    # the simulator's answer runs a draft length too, and says so (it named no draft length before)
    simulated = sdplan("simulate", "-c", str(tmp_path / "sglang.toml"), "--rates", "2", "-k", "7",
                       "--requests", "200")
    assert simulated.exit_code == 0, simulated.output
    said = " ".join(simulated.output.split())
    assert "SD cycle takes vLLM's engine" in said and "k=7 is beyond the draft lengths" in said


def test_a_kv_cache_dtype_chosen_at_derive_is_handed_to_the_server(sdplan, tmp_path: Path) -> None:
    """A file priced with ``derive --kv-cache-dtype`` names the flag its server needs; one priced at the
    checkpoint's own cache (no key) adds none; an unknown dtype is a one-line schema error."""
    shipped = (REPO / "calibrations" / "h100-sxm_llama-3.1-8b_eagle3_derived.toml").read_text()
    assert "kv_cache_dtype" not in shipped
    plain = sdplan("capacity", "-c", "h100-sxm_llama-3.1-8b_eagle3_derived", "--acceptance", "0.7",
                   "-f", "vllm-config")
    assert plain.exit_code == 0, plain.output
    assert "--kv-cache-dtype" not in plain.stderr
    chosen = tmp_path / "fp8.toml"
    chosen.write_text(shipped.replace("[derivation]\n", "[derivation]\nkv_cache_dtype = \"fp8\"\n", 1))
    exported = sdplan("capacity", "-c", str(chosen), "--acceptance", "0.7", "-f", "vllm-config")
    assert exported.exit_code == 0, exported.output
    said = " ".join(exported.stderr.split())
    assert "--kv-cache-dtype fp8" in said and "priced with a float8 KV cache" in said
    bad = tmp_path / "fp16.toml"
    bad.write_text(shipped.replace("[derivation]\n", "[derivation]\nkv_cache_dtype = \"fp16\"\n", 1))
    shown = sdplan("show", "-c", str(bad))
    assert shown.exit_code == 3 and "kv_cache_dtype" in shown.stderr and "Traceback" not in shown.stderr


def test_a_served_calibration_knows_the_batch_cap_its_servers_ran_with(write_calibration, direct_document,
                                                                        sdplan) -> None:
    from sdplan.calibration import load_calibration
    from sdplan.inputs.serving import served_batch_cap

    assert served_batch_cap(load_calibration(write_calibration(copy.deepcopy(direct_document), "plain"))) is None
    served = copy.deepcopy(direct_document)
    served["provenance"]["hardware"] = "AMD EPYC (CPU, 2 cores)"
    served["measurement"] = {"method": "served", "server_commands": [
        "vllm serve /m --dtype float32 --max-num-seqs 96",
        "vllm serve /m --max-num-seqs=48 --speculative-config '{\"method\":\"draft_model\"}'",
        "vllm serve /m --max_num_seqs 64"]}
    cal = load_calibration(write_calibration(served, "served"))
    assert served_batch_cap(cal) == (48, "the calibrated server's max_num_seqs")
    served["measurement"]["server_commands"] = ["vllm serve /m --dtype float32"]
    cap, what = served_batch_cap(load_calibration(write_calibration(served, "default")))
    assert cap == 128 and "default" in what  # vLLM's default on a CPU, which that server ran with
    # plan's caveat names that cap, not vLLM's GPU default of 256
    result = sdplan("plan", "-c", str(write_calibration(served, "default")), "--acceptance", "0.7")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "batch cap of 128 sequences" in text and "256" not in text
    # simulate, check and capacity default to it too; --max-num-seqs still wins
    path = str(write_calibration(served, "default"))
    simulated = sdplan("simulate", "-c", path, "--acceptance", "0.7", "--rates", "1", "--requests", "100",
                       "--seeds", "1", "-f", "json")
    assert simulated.exit_code == 0, simulated.output
    assert json.loads(simulated.stdout)["settings"]["max_num_seqs"] == 128
    given = sdplan("simulate", "-c", path, "--acceptance", "0.7", "--rates", "1", "--requests", "100", "--seeds", "1",
                   "--max-num-seqs", "32", "-f", "json")
    assert json.loads(given.stdout)["settings"]["max_num_seqs"] == 32
    capacity = sdplan("capacity", "-c", path, "--acceptance", "0.7", "--slo", "e2e:mean<=60s", "-f", "json")
    assert capacity.exit_code == 0, capacity.output
    assert json.loads(capacity.stdout)["batch_cap_sequences"] == 128
    exported = sdplan("capacity", "-c", path, "--acceptance", "0.7", "-f", "vllm-config")
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["num_speculative_tokens_per_batch_size"][-1][1] == 128  # the served cap


def test_one_rule_for_the_max_num_seqs_a_vllm_serve_runs_with() -> None:
    """calibrate's sweep and a served calibration's planner read a server's batch cap alike."""
    from sdplan.inputs.serving import serve_flag, served_max_num_seqs

    assert serve_flag(["--dtype", "float32", "--max_num_seqs", "96"], "--max-num-seqs") == "96"
    assert serve_flag(["--max-num-seqs=48"], "--max-num-seqs") == "48"
    assert serve_flag(["--max-model-len", "512"], "--max-num-seqs") is None
    assert served_max_num_seqs(["--max-num-seqs", "96"], "AMD EPYC (CPU, 2 cores)") == 96
    assert served_max_num_seqs([], "AMD EPYC (CPU, 2 cores)") == 128
    assert served_max_num_seqs(["--performance-mode", "throughput"], "1x NVIDIA H100 SXM") == 2048
    assert served_max_num_seqs(["--max-num-batched-tokens", "64"], "AMD EPYC (CPU, 2 cores)") == 64


def test_one_rule_for_the_requests_a_kv_cache_holds() -> None:
    """vLLM's "maximum concurrency": each running request reserves its prompt and output (the sweep's bound,
    check/simulate's batch cap and plan's caveat all read it)."""
    from sdplan.inputs.serving import kv_cache_requests

    assert kv_cache_requests(74_880, 512, 128) == 117
    assert kv_cache_requests(87_296, 2048, 256) == 37
    assert kv_cache_requests(1000, 900, 200) == 0
    assert kv_cache_requests(1100, 900, 200) == 1


def test_a_served_calibration_knows_the_kv_cache_of_each_server(write_calibration, direct_document, sdplan) -> None:
    """check, simulate and capacity default --kv-cache-tokens to the KV cache the calibrated server of the draft
    length reported (the draft's KV shares the memory, so SD servers hold fewer tokens); the option still wins."""
    from sdplan.calibration import load_calibration
    from sdplan.inputs.serving import served_kv_cache_tokens

    served = copy.deepcopy(direct_document)
    served["measurement"] = {"method": "served", "server_commands": ["vllm serve /m --max-num-seqs 64"],
                             "kv_cache_configurations": ["nosd", "k2", "ep-k4"],
                             "kv_cache_tokens": [2000.0, 1000.0, 1200.0]}
    cal = load_calibration(write_calibration(served, "served-kv"))
    assert served_kv_cache_tokens(cal, 0) == (2000.0, "nosd")
    assert served_kv_cache_tokens(cal, 2) == (1000.0, "k2")
    assert served_kv_cache_tokens(cal, 4) == (1200.0, "ep-k4")
    assert served_kv_cache_tokens(cal, 3) == (1000.0, "k2")  # no server of its own: the smallest SD cache
    assert served_kv_cache_tokens(load_calibration(write_calibration(direct_document, "plain")), 2) is None
    path = str(write_calibration(served, "served-kv"))
    workload = ["-c", path, "--acceptance", "0.7", "--prompt-tokens", "100", "--output-tokens", "100"]

    def simulated(*extra: str) -> list[Any]:
        result = sdplan("simulate", *workload, "--rates", "0.5", "--requests", "100", "--seeds", "1", "-f", "json",
                        *extra)
        assert result.exit_code == 0, result.output
        return [row["kv_cache_tokens"] for row in json.loads(result.stdout)["rates"]]

    assert simulated("--draft-length", "off") == [2000.0]
    assert simulated("--draft-length", "2") == [1000.0]
    assert simulated("--draft-length", "2", "--kv-cache-tokens", "5000") == [5000.0]
    # capacity: the smallest cache of the servers its options run on: 1000 tokens keep 6 requests of 100 + 100
    # running, each holding its prompt, half its output and half a 16-token block on average (vLLM on a GPU)
    capacity = sdplan("capacity", *workload, "--slo", "e2e:mean<=600s", "-f", "json")
    assert capacity.exit_code == 0, capacity.output
    assert json.loads(capacity.stdout)["batch_cap_sequences"] == 1000 // (100 + 100 / 2 + 16 / 2) == 6
    given = sdplan("capacity", *workload, "--slo", "e2e:mean<=600s", "-f", "json", "--kv-cache-tokens", "1e6")
    assert json.loads(given.stdout)["batch_cap_sequences"] == 64
    # check names where its batch cap comes from
    checked = sdplan("check", *workload, "--rate", "20", "--draft-length", "off", "--slo", "e2e:mean<=600s")
    assert "KV cache of 2,000 tokens the calibrated nosd server reported" in " ".join(checked.output.split())
    # plan: each option saturates at its own server's cap, no SD at its 2,000 tokens: 12 requests of 158 tokens held
    planned = sdplan("plan", *workload, "--rates", "1,20", "-k", "2")
    assert planned.exit_code == 0, planned.output
    text = " ".join(planned.output.split())
    assert "without SD (its batch cap of 12 sequences: KV cache of 2,000 tokens the calibrated nosd server" in text
    # k = 2 at its 1,000 tokens: 6 requests, each holding k lookahead slots more (160 tokens)
    assert "with k=2 (its batch cap of 6 sequences: KV cache of 1,000 tokens the calibrated k2 server" in text
    # a workload that does not fit even once: plan answers, and says the server could not run it
    too_long = sdplan("plan", "-c", path, "--acceptance", "0.7", "--prompt-tokens", "900", "--output-tokens", "200",
                      "--rates", "0.1")
    assert too_long.exit_code == 0, too_long.output
    assert ("not one request of the workload fits the KV cache of 1,000 tokens the calibrated k2 server reported"
            in " ".join(too_long.output.split()))
    served["measurement"]["kv_cache_tokens"] = [2000.0]
    broken = sdplan("check", "-c", str(write_calibration(served, "broken-kv")), "--acceptance", "0.7",
                    "--rate", "1", "--slo", "e2e:mean<=600s")
    assert broken.exit_code == ExitStatus.BAD_INPUT and "measurement.kv_cache_tokens" in broken.output
