"""Engine exports of the k schedule : vLLM, SGLang, TensorRT-LLM, checked against each engine's rules.

The engines' rules are re-stated here from their source, independently of sdplan's code:

* vLLM 0.33 ``vllm/v1/spec_decode/dynamic/utils.py`` (``validate_and_normalize_dynamic_sd_schedule``,
  ``build_dynamic_sd_schedule_lookup``), byte-identical in 0.24-0.33
  (docs/engines.md#vllm-per-batch-size-schedule); with vLLM installed, ``-m vllm`` runs the real functions;
* SGLang ``python/sglang/srt/speculative/adaptive_spec_params.py`` (``_load_adaptive_config``) and
  ``adaptive_step_router.py`` (``batch_size_key_for_batch``), sgl-project/sglang@015c8726 / #24055;
* TensorRT-LLM ``tensorrt_llm/llmapi/llm_args.py`` (``validate_draft_len_schedule_and_sort``) and
  ``get_draft_len_for_batch_size`` (``bisect_left``; upper-bound keys, implicit 0), NVIDIA/TensorRT-LLM#10860.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Any

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdplan.calibration import resolve_calibration, shipped_directory
from sdplan.errors import ExitStatus
from sdplan.inputs.serving import engine_max_num_seqs
from sdplan.planning.schedule import engine_schedule, goodput_per_size, vllm_lookup
from sdplan.schema import read_toml

DEFAULT = "h100-sxm_llama-3.1-8b_llama-3.2-1b_derived"


# ----------------------------------------------------------------------------- the engines' rules, restated


def vllm_dense(schedule: list[list[int]], max_num_seqs: int, num_speculative_tokens: int) -> list[int]:
    """vLLM's validation and lookup (dynamic/utils.py:21-72, 106-146), restated."""
    assert isinstance(schedule, list) and schedule
    previous_end = 0
    for entry in schedule:
        assert isinstance(entry, list) and len(entry) == 3 and all(isinstance(v, int) for v in entry)
        start, end, k = entry
        assert 0 < start <= end and k >= 0
        assert start > previous_end  # sorted, non-overlapping
        previous_end = end
    assert schedule[0][0] == 1
    dense = [0] * (max_num_seqs + 1)
    for n in range(1, max_num_seqs + 1):
        covering = [k for start, end, k in schedule if start <= n <= end]
        before = [k for start, end, k in schedule if end < n]
        k = covering[0] if covering else before[-1]
        dense[n] = min(num_speculative_tokens, k)
    return dense


def sglang_k(config: dict[str, Any], batch_size: int) -> int:
    """SGLang's _load_adaptive_config checks and its routing (no CUDA-graph padding)."""
    entries = {}
    for key, entry in config.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps")
        assert isinstance(steps, list) and steps and all(isinstance(s, int) and s >= 0 for s in steps)
        entries[int(key)] = steps
    assert entries
    keys = sorted(entries)
    chosen = keys[max(0, bisect.bisect_right(keys, batch_size) - 1)]
    assert len(entries[chosen]) == 1  # pinned: the EMA has nothing to choose
    return entries[chosen][0]


def parse_trtllm(text: str) -> dict[str, Any]:
    """The YAML we write (two levels of block mappings, scalars), read with PyYAML's rules for these scalars."""
    config: dict[str, Any] = {}
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert lines[0] == "speculative_config:"
    schedule: dict[int, int] | None = None
    for line in lines[1:]:
        indent = len(line) - len(line.lstrip())
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if indent == 2:
            if key == "draft_len_schedule":
                schedule = config["draft_len_schedule"] = {}
                continue
            config[key] = json.loads(value) if value.startswith('"') or value.isdigit() else value
        else:
            assert indent == 4 and schedule is not None and key.isdigit() and value.isdigit()
            schedule[int(key)] = int(value)
    return config


def trtllm_k(config: dict[str, Any], batch_size: int) -> int:
    """TensorRT-LLM's validator and get_draft_len_for_batch_size, restated."""
    schedule = config["draft_len_schedule"]
    assert all(b >= 1 and d >= 0 for b, d in schedule.items())
    assert schedule[min(schedule)] == config["max_draft_len"]
    assert all(d <= config["max_draft_len"] for d in schedule.values())
    keys = sorted(schedule)
    index = bisect.bisect_left(keys, batch_size)
    return schedule[keys[index]] if index < len(keys) else 0


# ----------------------------------------------------------------------------- helpers


@pytest.fixture
def method_calibration(write_calibration):
    """The default roofline calibration relabelled as another SD method (costs are not the point here)."""

    def make(method: str, draft_model: str) -> Path:
        document = read_toml(shipped_directory() / f"{DEFAULT}.toml")
        document["provenance"]["speculative_method"] = method
        document["provenance"]["draft_model"] = draft_model
        document["name"] = f"test-{method}"
        return write_calibration(document, f"test-{method}")

    return make


def per_size_optimum(max_num_seqs: int, ks: list[int], alpha: float) -> list[int]:
    """Brute force: the k of highest goodput E_k / tau_k(n) at each n (tau from the step model)."""
    from sdplan.inputs.acceptance import expected_tokens_per_cycle

    c = resolve_calibration(DEFAULT).coefficients_at(1024, 512)
    best = []
    def past_knee(rows: int) -> float:  # the target's compute-bound knee: each row past it costs this much more
        return c.knee_per_token_s * max(rows - c.knee_tokens, 0.0)

    for n in range(1, max_num_seqs + 1):
        options = [(1.0 / (c.baseline_c1_step_s + (n - 1) * c.baseline_c2_step_s + past_knee(n)), 0)]
        for k in ks:
            tau = c.c1v_s + k * c.c1d_s + (n - 1) * (c.c2v_s + k * c.c2d_s) + past_knee(n * (k + 1))
            options.append((float(expected_tokens_per_cycle(alpha, k)) / tau, k))
        best.append(max(options, key=lambda item: (item[0], -item[1]))[1])
    return best


# ----------------------------------------------------------------------------- vLLM


def test_vllm_config_default_covers_the_max_num_seqs_the_calibration_was_priced_for(sdplan) -> None:
    result = sdplan("capacity", "--acceptance", "0.8", "-f", "vllm-config")
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    assert config["method"] == "draft_model" and config["model"] == "meta-llama/Llama-3.2-1B-Instruct"
    schedule = config["num_speculative_tokens_per_batch_size"]
    priced = resolve_calibration(DEFAULT).document["derivation"]["max_num_seqs"]  # vLLM's H100 default
    assert schedule[-1][1] == priced == engine_max_num_seqs("NVIDIA H100 SXM 80GB") == 1024
    assert config["num_speculative_tokens"] == max(k for _, _, k in schedule)
    dense = vllm_dense(schedule, priced, config["num_speculative_tokens"])
    assert dense[1:] == vllm_lookup([tuple(t) for t in schedule], priced, config["num_speculative_tokens"])[1:]
    assert "PIECEWISE" in result.stderr and "--max-num-seqs 1024" in result.stderr
    # a smaller engine cap when asked for
    narrow = json.loads(sdplan("capacity", "--acceptance", "0.8", "--max-num-seqs", "256", "-f", "vllm-config").stdout)
    assert narrow["num_speculative_tokens_per_batch_size"][-1][1] == 256


def test_vllm_schedule_without_merging_is_the_per_size_optimum(sdplan) -> None:
    result = sdplan("capacity", "--acceptance", "0.8", "-k", "1-6", "--min-tier-width", "1", "--max-num-seqs", "300",
                    "-f", "vllm-config")
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    dense = vllm_dense(config["num_speculative_tokens_per_batch_size"], 300, config["num_speculative_tokens"])
    assert dense[1:] == per_size_optimum(300, list(range(1, 7)), 0.8)


def test_sizes_past_the_kv_cache_keep_the_k_of_the_largest_batch_it_holds(sdplan) -> None:
    # 128,000 tokens hold about 100 requests of 1,024 + 512 tokens (a prompt and half the output each, in vLLM):
    # sizes past that never run, so they keep its k, where the per-size optimum would go on to k = 2 from 176
    result = sdplan("capacity", "--acceptance", "0.8", "-k", "1-6", "--min-tier-width", "1", "--max-num-seqs", "300",
                    "--kv-cache-tokens", "128000", "-f", "vllm-config")
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    dense = vllm_dense(config["num_speculative_tokens_per_batch_size"], 300, config["num_speculative_tokens"])
    note = next(line for line in result.stderr.split("warning: ") if line.startswith("batch sizes "))
    reachable = int(note.split(" keep the k of ")[1].split(":")[0])
    assert note.startswith(f"batch sizes {reachable + 1}-300 ") and 90 <= reachable <= 128000 // 1280
    optimum = per_size_optimum(300, list(range(1, 7)), 0.8)
    assert dense[1:reachable + 1] == optimum[:reachable]
    assert set(dense[reachable + 1:]) == {optimum[reachable - 1]} != set(optimum[reachable:])
    # the capacity table says the same of its schedule; a cache that holds every slot changes nothing
    table = sdplan("capacity", "--acceptance", "0.8", "-k", "1-6", "--max-num-seqs", "300", "--kv-cache-tokens",
                   "128000", "--slo", "tpot:mean<=50ms")
    assert f"(sizes past {reachable} keep its k" in " ".join(table.stdout.split())
    roomy = sdplan("capacity", "--acceptance", "0.8", "-k", "1-6", "--min-tier-width", "1", "--max-num-seqs", "300",
                   "--kv-cache-tokens", "1e9", "-f", "vllm-config")
    assert "keep the k of" not in roomy.stderr
    assert vllm_dense(json.loads(roomy.stdout)["num_speculative_tokens_per_batch_size"], 300, 6)[1:] == optimum


def test_vllm_tiers_are_wide_and_cost_little(sdplan) -> None:
    result = sdplan("capacity", "--acceptance", "0.8", "-k", "1-8", "-f", "vllm-config")
    assert result.exit_code == 0, result.output
    schedule = json.loads(result.stdout)["num_speculative_tokens_per_batch_size"]
    for start, end, _ in schedule:
        assert end - start + 1 >= max(4, 0.25 * start), schedule
    ks = [k for _, _, k in schedule]
    assert all(a != b for a, b in zip(ks, ks[1:]))


def test_all_zero_schedule_is_sd_off_and_writes_nothing(sdplan, tmp_path) -> None:
    out = tmp_path / "spec.json"
    for fmt in ("vllm-config", "sglang", "trtllm"):
        result = sdplan("capacity", "--acceptance", "0.02", "-f", fmt, "-o", str(out))
        assert result.exit_code == 0, result.output
        assert result.stdout == "" and "SD off" in result.stderr and not out.exists()


def test_min_k_keeps_sd_on(sdplan) -> None:
    plain = sdplan("capacity", "--acceptance", "0.4", "--max-num-seqs", "1024", "-f", "vllm-config")
    assert any(k == 0 for _, _, k in json.loads(plain.stdout)["num_speculative_tokens_per_batch_size"])
    assert "k = 0" in plain.stderr
    result = sdplan("capacity", "--acceptance", "0.4", "--max-num-seqs", "1024", "--min-k", "1", "-f", "vllm-config")
    floored = json.loads(result.stdout)["num_speculative_tokens_per_batch_size"]
    assert all(k >= 1 for _, _, k in floored) and "k = 0" not in result.stderr
    assert "--min-k costs up to" in result.stderr
    too_high = sdplan("capacity", "--acceptance", "0.4", "-k", "1-3", "--min-k", "4", "-f", "vllm-config")
    assert too_high.exit_code == ExitStatus.USAGE


def test_data_parallel_warning(sdplan) -> None:
    result = sdplan("capacity", "--acceptance", "0.8", "--data-parallel-size", "2", "-f", "vllm-config")
    assert result.exit_code == 0 and "data parallel size 2" in result.stderr and "disables" in result.stderr


@pytest.mark.parametrize("command", [["capacity", "-f", "vllm-config"], ["plan"]])
def test_unknown_method_exits_2_with_the_list(sdplan, command) -> None:
    result = sdplan(*command, "--acceptance", "0.8", "--spec-method", "foo")
    assert result.exit_code == ExitStatus.USAGE
    assert "draft_model, eagle, eagle3, mtp, ngram" in result.stderr and result.stdout == ""


def test_suffix_is_refused_with_the_reason(sdplan) -> None:
    result = sdplan("plan", "--acceptance", "0.8", "--spec-method", "suffix")
    assert result.exit_code == ExitStatus.USAGE
    assert "not supported" in result.stderr and "different number of tokens at every step" in result.stderr


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp", "ngram"])
def test_method_other_than_the_calibrations_is_refused(sdplan, method) -> None:
    result = sdplan("capacity", "--acceptance", "0.8", "--spec-method", method, "-f", "vllm-config")
    assert result.exit_code == ExitStatus.USAGE
    assert "holds the costs of separate draft model" in result.stderr and result.stdout == ""


@pytest.mark.parametrize(("method", "weights", "model", "extra"), [
    ("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", {}),
    ("eagle", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", {}),
    ("mtp", "mtp", None, {}),
    ("ngram", "ngram", None, {"prompt_lookup_min": 2, "prompt_lookup_max": 5}),
])
def test_vllm_model_is_method_correct(sdplan, method_calibration, method, weights, model, extra) -> None:
    path = method_calibration(method, weights)
    result = sdplan("capacity", "-c", str(path), "--acceptance", "0.8", "-f", "vllm-config")
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    assert config["method"] == method and config.get("model") == model
    assert {key: config[key] for key in extra} == extra
    allowed = {"method", "model", "prompt_lookup_min", "prompt_lookup_max", "num_speculative_tokens",
               "num_speculative_tokens_per_batch_size"}
    assert set(config) <= allowed  # SpeculativeConfig has extra="forbid"


def test_eagle_calibration_without_a_head_is_refused(sdplan, method_calibration) -> None:
    path = method_calibration("eagle3", "none")
    result = sdplan("capacity", "-c", str(path), "--acceptance", "0.8", "-f", "vllm-config")
    assert result.exit_code == ExitStatus.USAGE and "EAGLE head" in result.stderr


def test_outputs_name_the_method(sdplan, method_calibration) -> None:
    path = method_calibration("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    doc = json.loads(sdplan("capacity", "-c", str(path), "--acceptance", "0.8", "--slo", "e2e:mean<=10s",
                            "-f", "json").stdout)
    assert doc["speculative_method"] == "eagle3" and doc["calibration"]["speculative_method"] == "eagle3"
    plan = json.loads(sdplan("plan", "-c", str(path), "--acceptance", "0.8", "-f", "json").stdout)
    assert plan["calibration"]["speculative_method"] == "eagle3"
    table = sdplan("plan", "-c", str(path), "--acceptance", "0.8").stdout
    assert "EAGLE-3 head yuhuili/EAGLE3-LLaMA3.1-Instruct-8B (eagle3)" in table
    capacity = sdplan("capacity", "-c", str(path), "--acceptance", "0.8", "--slo", "e2e:mean<=10s").stdout
    assert "(eagle3)" in capacity


# ----------------------------------------------------------------------------- SGLang and TensorRT-LLM


def test_sglang_adaptive_config(sdplan, method_calibration) -> None:
    path = method_calibration("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    vllm = json.loads(sdplan("capacity", "-c", str(path), "--acceptance", "0.8", "-f", "vllm-config").stdout)
    result = sdplan("capacity", "-c", str(path), "--acceptance", "0.8", "-f", "sglang")
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    dense = vllm_dense(vllm["num_speculative_tokens_per_batch_size"], 1024, vllm["num_speculative_tokens"])
    assert [sglang_k(config, n) for n in range(1, 1025)] == dense[1:]
    first = max(dense[1:])
    for flag in ("--speculative-algorithm EAGLE3", "--speculative-draft-model-path yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                 f"--speculative-num-steps {first}", "--speculative-eagle-topk 1",
                 f"--speculative-num-draft-tokens {first + 1}", "--speculative-adaptive"):
        assert flag in result.stderr


def test_sglang_refuses_methods_it_cannot_tier(sdplan) -> None:
    result = sdplan("capacity", "--acceptance", "0.8", "-f", "sglang")
    assert result.exit_code == ExitStatus.USAGE and "EAGLE/EAGLE3" in result.stderr


@pytest.mark.parametrize(("method", "weights", "decoding_type"), [
    ("draft_model", None, "Draft_Target"), ("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "Eagle3"),
    ("mtp", "mtp", "MTP"), ("ngram", "ngram", "NGram"),
])
def test_trtllm_draft_len_schedule(sdplan, method_calibration, method, weights, decoding_type) -> None:
    calibration = DEFAULT if weights is None else str(method_calibration(method, weights))
    args = ("capacity", "-c", calibration, "--acceptance", "0.7", "--max-num-seqs", "512")
    vllm = json.loads(sdplan(*args, "-f", "vllm-config").stdout)
    result = sdplan(*args, "-f", "trtllm")
    assert result.exit_code == 0, result.output
    config = parse_trtllm(result.stdout)
    assert config["decoding_type"] == decoding_type
    if method in ("draft_model", "eagle3"):
        assert config["speculative_model"] == (weights or "meta-llama/Llama-3.2-1B-Instruct")
    else:
        assert "speculative_model" not in config
    dense = vllm_dense(vllm["num_speculative_tokens_per_batch_size"], 512, vllm["num_speculative_tokens"])
    assert [trtllm_k(config, n) for n in range(1, 513)] == dense[1:]
    assert trtllm_k(config, 513) == 0  # TensorRT-LLM drafts nothing past the last key


# ----------------------------------------------------------------------------- the schedule core


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 120), st.integers(1, 5), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_engine_schedule_properties(size: int, count: int, width: int, seed: int) -> None:
    rng = numpy.random.default_rng(seed)
    goodput = rng.uniform(0.5, 1.5, size=(size, count + 1))
    ks = list(range(1, count + 1))
    schedule = engine_schedule(goodput, ks, min_tier_width=width)
    tiers = schedule.tiers
    assert tiers[0][0] == 1 and tiers[-1][1] == size
    assert all(b + 1 == c for (_, b, _), (c, _, _) in zip(tiers, tiers[1:]))
    assert all(x[2] != y[2] for x, y in zip(tiers, tiers[1:]))
    if len(tiers) > 1 and width > 1:
        assert all(b - a + 1 >= max(width, 0.25 * a) for a, b, _ in tiers)
    per_size = numpy.concatenate([[k] * (b - a + 1) for a, b, k in tiers])
    kept = goodput[numpy.arange(size), per_size]
    assert schedule.goodput_loss_pct == pytest.approx(float(numpy.max(1 - kept / goodput.max(axis=1)) * 100))
    if width == 1:
        assert tiers == schedule.optimal and schedule.goodput_loss_pct == 0.0


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 120), st.integers(1, 4), st.integers(1, 6), st.integers(1, 130), st.integers(0, 2**32 - 1))
def test_sizes_past_reach_keep_its_k(size: int, count: int, width: int, reach: int, seed: int) -> None:
    goodput = numpy.random.default_rng(seed).uniform(0.5, 1.5, size=(size, count + 1))
    schedule = engine_schedule(goodput, list(range(1, count + 1)), min_tier_width=width, reachable=reach)
    per_size = [k for a, b, k in schedule.tiers for _ in range(a, b + 1)]
    assert len(per_size) == size == schedule.max_num_seqs and schedule.reachable == min(reach, size)
    assert set(per_size[schedule.reachable - 1:]) == {per_size[schedule.reachable - 1]}
    if width == 1:  # below the reach, the per-size optimum of the goodput given
        assert per_size[:schedule.reachable] == list(numpy.argmax(goodput[:schedule.reachable], axis=1))


def test_engine_schedule_matches_goodput_per_size_of_a_calibration() -> None:
    c = resolve_calibration(DEFAULT).coefficients_at(1024, 512)
    goodput = goodput_per_size(c, [1, 2, 3, 4], 0.8, 200)
    schedule = engine_schedule(goodput, [1, 2, 3, 4], min_tier_width=1)
    assert [k for a, b, k in schedule.tiers for _ in range(a, b + 1)] == per_size_optimum(200, [1, 2, 3, 4], 0.8)


@pytest.mark.parametrize(("hardware", "expected"), [
    ("NVIDIA H100 SXM 80GB", 1024), ("4x NVIDIA H100 SXM 80GB, tensor parallel", 1024), ("NVIDIA H200", 1024),
    ("NVIDIA B200", 1024), ("NVIDIA A100 SXM 80GB", 256), ("NVIDIA L40S 48GB", 256), ("cpu-epyc 2 cores", 128),
])
def test_engine_max_num_seqs(hardware: str, expected: int) -> None:
    assert engine_max_num_seqs(hardware) == expected


# ----------------------------------------------------------------------------- vLLM's own validator


@pytest.mark.vllm
def test_vllm_accepts_the_schedule(sdplan) -> None:
    import dataclasses
    import typing

    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod
    from vllm.v1.spec_decode.dynamic import utils  # run with -m vllm where vLLM is installed

    def names(literal: object) -> set[str]:
        found: set[str] = set()
        for arg in typing.get_args(literal):
            found |= {arg} if isinstance(arg, str) else names(arg)
        return found

    fields = {field.name for field in dataclasses.fields(SpeculativeConfig)}
    assert {"draft_model", "eagle", "eagle3", "mtp", "ngram"} <= names(SpeculativeMethod)
    runs = [(DEFAULT, alpha) for alpha in ("0.8", "0.6", "0.4")] + [(name, "0.7") for name in METHOD_CALIBRATIONS]
    for calibration, alpha in runs:
        config = json.loads(sdplan("capacity", "-c", calibration, "--acceptance", alpha, "-f", "vllm-config").stdout)
        assert set(config) <= fields and config["method"] in names(SpeculativeMethod)  # extra="forbid"
        schedule = config["num_speculative_tokens_per_batch_size"]
        utils.validate_and_normalize_dynamic_sd_schedule(schedule)
        for cap in (128, 256, 1024):
            lookup = utils.build_dynamic_sd_schedule_lookup(schedule, cap, config["num_speculative_tokens"])
            assert lookup[1:] == vllm_dense(schedule, cap, config["num_speculative_tokens"])[1:]


# ----------------------------------------------------------------------------- shipped calibrations per method

METHOD_CALIBRATIONS = {
    "h100-sxm_llama-3.1-8b_eagle3_derived": ("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
    "4xh100-sxm_llama-3.3-70b_eagle3_derived": ("eagle3", "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"),
    "8xh200_deepseek-v3_mtp_derived": ("mtp", None),
    "h100-sxm_llama-3.1-8b_ngram_derived": ("ngram", None),
}


@pytest.mark.parametrize("name", sorted(METHOD_CALIBRATIONS))
def test_shipped_method_calibrations_export_their_method(sdplan, name) -> None:
    method, model = METHOD_CALIBRATIONS[name]
    result = sdplan("capacity", "-c", name, "--acceptance", "0.8", "-f", "vllm-config")
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    assert (config["method"], config.get("model")) == (method, model)
    priced = resolve_calibration(name).document["derivation"]["max_num_seqs"]  # what the file was priced for
    assert config["num_speculative_tokens_per_batch_size"][-1][1] == priced


def test_method_costs_have_their_shapes() -> None:
    """A one-layer head drafts far cheaper than a 1B LM; n-gram drafts for the price of verification only."""
    draft = resolve_calibration(DEFAULT).coefficients_at(1024, 512)
    eagle = resolve_calibration("h100-sxm_llama-3.1-8b_eagle3_derived").coefficients_at(1024, 512)
    ngram_cal = resolve_calibration("h100-sxm_llama-3.1-8b_ngram_derived")
    ngram = ngram_cal.coefficients_at(1024, 512)
    # same target, priced over the batches each server's KV cache holds (the draft LM's weights take some)
    assert eagle.baseline_c1_step_s == pytest.approx(draft.baseline_c1_step_s, rel=0.02)
    assert eagle.c1d_s < 0.5 * draft.c1d_s and eagle.c2d_s < draft.c2d_s
    target = ngram_cal.document["step_model"]["target"]
    assert ngram.c1d_s == ngram.c2d_s == pytest.approx(target["per_query_token_s"])  # verify the extra token only
    # n-gram matching on the host costs a small share of the step, per cycle and per sequence; a proposer that
    # runs a model pays the drafting phase's launch and bookkeeping per cycle instead
    assert ngram.c2v_s > eagle.c2v_s and ngram.c1v_s < eagle.c1v_s


def test_trtllm_cuts_longer_drafts_to_the_batch_1_length(sdplan) -> None:
    """Qwen3-30B-A3B's schedule drafts more at mid batch sizes than at 1 (expert coverage saturates);
    TensorRT-LLM needs the batch-1 length to be the longest, so later tiers are cut and equal ones merged."""
    name = "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived"
    vllm = json.loads(sdplan("capacity", "-c", name, "--acceptance", "0.8", "-f", "vllm-config").stdout)
    schedule = vllm["num_speculative_tokens_per_batch_size"]
    assert max(k for _, _, k in schedule) > schedule[0][2]
    result = sdplan("capacity", "-c", name, "--acceptance", "0.8", "-f", "trtllm")
    assert result.exit_code == 0 and "cut to" in result.stderr
    config = parse_trtllm(result.stdout)
    first = schedule[0][2]
    largest = schedule[-1][1]
    dense = vllm_dense(schedule, largest, vllm["num_speculative_tokens"])
    assert [trtllm_k(config, n) for n in range(1, largest + 1)] == [min(k, first) for k in dense[1:]]
    values = [config["draft_len_schedule"][key] for key in sorted(config["draft_len_schedule"])]
    assert all(a != b for a, b in zip(values, values[1:]))


def test_bare_model_name_and_draft_tp_are_explicit(sdplan) -> None:
    """A bare local name is flagged; a TP>1 draft's TP is written, not left to vLLM."""
    cpu = sdplan("capacity", "-c", "cpu-epyc-2core_tiny-llama-h256-l4_tiny-llama-h128-l1_measured", "--acceptance",
                 "0.8", "--prompt-tokens", "256", "--output-tokens", "64", "-f", "vllm-config")
    assert cpu.exit_code == 0, cpu.output
    assert "bare name" in cpu.stderr and json.loads(cpu.stdout)["model"] == "tiny-llama-h128-l1"
    assert json.loads(cpu.stdout)["num_speculative_tokens_per_batch_size"][-1][1] == 128  # vLLM's CPU default
    tp4 = json.loads(sdplan("capacity", "-c", "4xh100-sxm_llama-3.1-70b_llama-3.1-8b_derived", "--acceptance", "0.8",
                            "-f", "vllm-config").stdout)
    assert tp4["draft_tensor_parallel_size"] == 4


@pytest.mark.parametrize("precision", ["fp8", "fp8_block", "nvfp4", "bf16"])
def test_a_draft_is_served_at_the_precision_it_was_priced_at(sdplan, write_calibration, precision) -> None:
    """vLLM loads a draft at its checkpoint's precision unless the speculative config says ``quantization``:
    an FP8-priced draft is written so; NVFP4, which vLLM reads only from a checkpoint, is a warning."""
    document = read_toml(shipped_directory() / f"{DEFAULT}.toml")
    document["derivation"]["draft_precision"] = precision
    path = write_calibration(document, f"draft-{precision}")
    result = sdplan("capacity", "-c", str(path), "--acceptance", "0.8", "-f", "vllm-config")
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    assert config.get("quantization") == {"fp8": "fp8", "fp8_block": "fp8"}.get(precision)
    assert config["draft_tensor_parallel_size"] == document["derivation"]["draft_tensor_parallel_size"] == 1
    assert (f"priced at {precision}" in result.stderr) == (precision == "nvfp4")
    document["provenance"]["speculative_method"] = "eagle3"
    document["provenance"]["draft_model"] = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    head = write_calibration(document, f"head-{precision}")
    for engine in ("sglang", "trtllm"):  # neither config says the draft's precision: the warning does
        other = sdplan("capacity", "-c", str(head), "--acceptance", "0.8", "-f", engine)
        assert other.exit_code == 0, other.output
        assert (f"priced at {precision}" in other.stderr) == (precision != "bf16")
