"""``sdplan derive`` on mixture-of-experts and large targets: the KV cache, the experts' kernels, a target too big."""

from __future__ import annotations

from typing import Any

import pytest

from sdplan.calibration import load_calibration
from sdplan.derive.pricing import checkpoint_quant_modes, kv_bytes_per_token, kv_cache_dtype, kv_cache_modes
from sdplan.errors import InvalidValueError


def _aic() -> Any:
    return pytest.importorskip("aiconfigurator_core.sdk.engine",
                               reason="aiconfigurator-core is not installed (pip install -e '.[test]' on Python 3.11+)")


def test_kv_bytes_per_token_is_the_memory_models_own_value_when_its_count_agrees() -> None:
    # 10 GB free at 128 KiB a token: 76,293 tokens, and that is the count the model gives
    estimate = {"total_kv_size_bytes": 10e9, "kv_size_per_token_bytes": 131072, "total_kv_size_tokens": 76293}
    assert kv_bytes_per_token(estimate) == 131072
    # an estimate without its own count
    assert kv_bytes_per_token({"total_kv_size_bytes": 10e9, "kv_size_per_token_bytes": 131072}) == 131072


def test_a_hybrid_models_per_sequence_state_is_not_charged_per_token() -> None:
    # Gated DeltaNet layers keep 24 MB of state per sequence: the model's count of 7.7 M tokens holds, not 4,910
    estimate = {"total_kv_size_bytes": 117_971_000_000.0, "kv_size_per_token_bytes": 24_023_040,
                "total_kv_size_tokens": 7_678_477}
    per_token = kv_bytes_per_token(estimate)
    assert per_token == pytest.approx(117_971_000_000.0 / 7_678_477)
    assert int(estimate["total_kv_size_bytes"] / per_token) == pytest.approx(7_678_477, abs=1)


def test_a_block_scaled_fp8_checkpoint_prices_its_experts_block_scaled() -> None:
    block = {"num_experts": 128, "topk": 8, "raw_config": {"quant_algo": "fp8_block"}}
    assert checkpoint_quant_modes("fp8", block) == {"gemm_quant_mode": "fp8", "moe_quant_mode": "fp8_block"}
    # what the request says holds for a per-tensor checkpoint, a dense target, and another precision
    per_tensor = {"num_experts": 128, "topk": 8, "raw_config": {"quant_algo": "fp8"}}
    assert checkpoint_quant_modes("fp8", per_tensor) == {"gemm_quant_mode": "fp8", "moe_quant_mode": "fp8"}
    dense = {"num_experts": 0, "raw_config": {"quant_algo": "fp8_block"}}
    assert checkpoint_quant_modes("fp8", dense) == {"gemm_quant_mode": "fp8", "moe_quant_mode": "fp8"}
    assert checkpoint_quant_modes("bf16", block) == {"gemm_quant_mode": "bfloat16", "moe_quant_mode": "bfloat16"}


def test_an_unquantised_moe_checkpoint_at_fp8_is_priced_as_vllm_quantises_it() -> None:
    """vLLM's --quantization fp8 runs Fp8MoEMethod on an unquantised checkpoint, whose kernels AIConfigurator's
    vLLM databases time as fp8_block; its fp8 rows time ModelOpt's method (a ModelOpt checkpoint's), which on
    an H200 costs 3-4x the bf16 kernel for Qwen3-30B-A3B's experts. Another engine keeps what was asked."""
    unquantised = {"num_experts": 128, "topk": 8, "raw_config": {}}
    assert checkpoint_quant_modes("fp8", unquantised) == {"gemm_quant_mode": "fp8", "moe_quant_mode": "fp8_block"}
    assert checkpoint_quant_modes("fp8", unquantised, "sglang") == {"gemm_quant_mode": "fp8",
                                                                    "moe_quant_mode": "fp8"}
    assert checkpoint_quant_modes("bf16", unquantised)["moe_quant_mode"] == "bfloat16"
    _aic()
    from sdplan.derive import DeriveRequest, Models, Pricer, load_aic

    engine, models = load_aic(), Models()
    try:
        steps = {}
        for precision in ("bf16", "fp8"):
            request = DeriveRequest(target_model="Qwen/Qwen3-30B-A3B", system="h200_sxm", method="ngram",
                                    precision=precision, draft_lengths=(1,), anchor=False)
            pricer = Pricer(engine, request, models)
            steps[precision] = [pricer.target_decode(batch, 1536) for batch in (1, 8, 32, 128)]
    finally:
        models.close()
    # fp8 experts read half the bytes of bf16 ones: no decode step of them costs more
    assert all(fp8 <= bf16 * 1.01 for fp8, bf16 in zip(steps["fp8"], steps["bf16"]))


def test_the_kv_cache_follows_what_the_checkpoint_declares_not_its_weights() -> None:
    """vLLM's --kv-cache-dtype auto: fp8 where the checkpoint declares an fp8 cache, bf16 otherwise, fp8
    weights or not (AIConfigurator alone prices fp8 for every fp8 checkpoint)."""
    declared = {"raw_config": {"quant_algo": "nvfp4", "kv_cache_quant_algo": "fp8"}}
    weights_only = {"raw_config": {"quant_algo": "fp8_block", "kv_cache_quant_algo": None}}
    assert kv_cache_dtype("auto", declared) == "fp8"
    assert kv_cache_dtype("auto", weights_only) == "bf16"
    assert kv_cache_dtype("auto", {}) == "bf16"
    # what the user asks for wins either way
    assert kv_cache_dtype("fp8", weights_only) == "fp8" and kv_cache_dtype("bf16", declared) == "bf16"
    assert kv_cache_modes("bf16") == {"kvcache_quant_mode": "bfloat16", "fmha_quant_mode": "bfloat16"}
    assert kv_cache_modes("fp8") == {"kvcache_quant_mode": "fp8"}


def test_deepseeks_fp8_weights_keep_a_bfloat16_cache_unless_asked(sdplan, tmp_path) -> None:
    """DeepSeek-V3's block-scaled fp8 checkpoint declares no KV quantisation: its cache is bf16 and holds half
    the tokens an fp8 one does; the file says which. SGLang prices it too (its database has no fp8 MLA)."""
    _aic()
    tokens, dtypes = {}, {}
    for dtype in ("auto", "fp8"):
        out = tmp_path / f"{dtype}.toml"
        done = sdplan("derive", "--target-model", "deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--tp", "8",
                      "--method", "mtp", "--precision", "fp8_block", "--draft-lengths", "1", "--kv-cache-dtype",
                      dtype, "--no-anchor", "-o", str(out))
        assert done.exit_code == 0, done.output
        document = load_calibration(out).document
        tokens[dtype] = document["derivation"]["kv_cache_tokens"]
        dtypes[dtype] = document["provenance"]["dtype"]
        # the flag the server needs is recorded where it was chosen, not where the checkpoint's own is priced
        assert document["derivation"].get("kv_cache_dtype") == (None if dtype == "auto" else dtype)
    assert 1.9 < tokens["fp8"] / tokens["auto"] < 2.1
    assert dtypes == {"auto": "float8 weights (blockwise), bfloat16 KV cache",
                      "fp8": "float8 weights (blockwise), float8 KV cache"}
    out = tmp_path / "sglang.toml"
    done = sdplan("derive", "--target-model", "deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--tp", "8",
                  "--method", "mtp", "--precision", "fp8_block", "--draft-lengths", "1", "--backend", "sglang",
                  "--no-anchor", "-o", str(out))
    assert done.exit_code == 0, done.output
    assert any("declares no KV-cache quantisation" in line
               for line in load_calibration(out).document["provenance"]["assumptions"])


def test_a_target_that_leaves_no_kv_cache_is_refused() -> None:
    """Qwen3-235B-A22B-FP8 (235 GB of weights) on one H200: no step of it can be served."""
    _aic()
    from sdplan.derive import DeriveRequest, derive

    request = DeriveRequest(target_model="Qwen/Qwen3-235B-A22B-FP8", system="h200_sxm", method="ngram",
                            tensor_parallel_size=1, precision="fp8", draft_lengths=(1,), anchor=False)
    with pytest.raises(InvalidValueError, match="does not fit 1x h200_sxm.*no KV cache"):
        derive(request)


def test_a_hybrid_targets_kv_cache_holds_the_batches_it_serves() -> None:
    """Qwen3.5-397B-A17B on 8x B200: the batches priced reach the engine's cap (SGLang: the grid's
    largest, 1,024), not the 1-2 a per-sequence state allows."""
    _aic()
    from sdplan.derive import DeriveRequest, Models, Pricer, load_aic
    from sdplan.derive.fitting import batch_sizes
    from sdplan.derive.request import BATCH_GRID

    request = DeriveRequest(target_model="Qwen/Qwen3.5-397B-A17B", system="b200_sxm", method="ngram",
                            backend="sglang", tensor_parallel_size=8, precision="fp8_block", draft_lengths=(1,),
                            anchor=False)
    models = Models()
    try:
        pricer = Pricer(load_aic(), request, models)
        tokens = pricer.kv_cache_tokens()
        estimate = pricer._kv_estimate(pricer.target_path, 8)
    finally:
        models.close()
    assert estimate is not None and tokens == estimate["total_kv_size_tokens"]
    assert batch_sizes(request, tokens)[-1] == max(b for b in BATCH_GRID if b <= request.batch_cap) == 1024


def test_a_block_scaled_checkpoint_says_how_its_experts_were_priced() -> None:
    _aic()
    from sdplan.derive import DeriveRequest, derive

    request = DeriveRequest(target_model="Qwen/Qwen3-235B-A22B-FP8", system="h200_sxm", method="ngram",
                            tensor_parallel_size=4, precision="fp8", draft_lengths=(1,), anchor=False)
    assumptions = derive(request).document["provenance"]["assumptions"]
    assert any("block-scaled fp8" in line and "fp8_block MoE kernels" in line for line in assumptions)


def test_a_smaller_batch_never_costs_more_than_a_larger_one() -> None:
    """Padding to a larger batch bounds a step's cost: noisy small-batch timings are replaced by the least larger."""
    from sdplan.derive.fitting import padded

    points = [(1, 1, 256), (4, 1, 256), (16, 1, 256), (64, 1, 256), (1, 2, 256), (4, 2, 256),
              (1, 1, 1024), (4, 1, 1024)]
    values = [13.0, 11.7, 9.0, 10.9, 5.0, 6.0, 8.0, 9.0]
    # independently: each value is the least over its own and every larger batch at the same (q, s)
    expected = [min(v for (b2, q2, s2), v in zip(points, values) if (q2, s2) == (q, s) and b2 >= b)
                for b, q, s in points]
    assert padded(points, values) == expected == [9.0, 9.0, 9.0, 10.9, 5.0, 6.0, 8.0, 9.0]
    # a curve that already rises with the batch is left as priced
    assert padded(points[:4], [1.0, 2.0, 3.0, 4.0]) == [1.0, 2.0, 3.0, 4.0]


def test_the_coverage_column_is_the_expected_share_of_experts_a_step_touches() -> None:
    """step_rows' last column against an independent count: 1 - (1 - m/M)^(B q) for m of M experts per token."""
    from sdplan.derive.fitting import step_rows

    points = [(1, 1, 256), (4, 2, 1024), (16, 1, 2048), (64, 3, 256)]
    rows = step_rows(points, (8, 128))
    for (b, q, s), row in zip(points, rows):
        untouched = 1.0
        for _ in range(b * q):  # each routed token misses a given expert with probability 1 - 8/128
            untouched *= 1.0 - 8 / 128
        assert row == pytest.approx([1.0, b, b * q, b * s, 1.0 - untouched], rel=1e-12)
    assert [len(row) for row in step_rows(points)] == [4, 4, 4, 4]  # a dense target has no coverage column


def test_a_derived_moe_step_reproduces_aiconfigurators_within_its_recorded_error() -> None:
    """The file's T(B, q, s) with its coverage, at every point priced, within the fit error the file records."""
    _aic()
    from sdplan.derive import DeriveRequest, Models, Pricer, derive, load_aic
    from sdplan.derive.fitting import padded

    request = DeriveRequest(target_model="Qwen/Qwen3-30B-A3B", system="h100_sxm", method="ngram",
                            draft_lengths=(1,), max_num_seqs=64, anchor=False)
    document = derive(request).document
    target, moe = document["step_model"]["target"], document["moe"]
    worst = document["derivation"]["target_max_error_pct"]
    models = Models()
    try:
        pricer = Pricer(load_aic(), request, models)
        points = [(b, q, s) for b in (1, 4, 16, 64) for q in (1, 2) for s in (256, 2048)]
        priced = padded(points, [pricer.verify(b, q, s) for b, q, s in points])
    finally:
        models.close()
    share = moe["experts_per_token"] / moe["experts"]
    for (b, q, s), cost in zip(points, priced):
        fitted = (target["fixed_s"] + b * (target["per_sequence_s"] + q * target["per_query_token_s"]
                                           + s * target["per_context_token_s"])
                  + (1.0 - (1.0 - share) ** (b * q)) * moe["coverage"]["baseline_c1_step_s"])
        assert abs(fitted / cost - 1.0) * 100.0 <= worst * 1.001, (b, q, s)


def test_an_mla_targets_eagle_head_is_priced_at_a_head_size_the_database_times() -> None:
    """Kimi-K2's 64 heads of 112 (its hidden size over its heads): no decode-attention table holds 112."""
    from sdplan.derive.pricing import HEAD_ATTENTION_DIM, TIMED_HEAD_DIMS, eagle_head_config

    kimi = {"hidden_size": 7168, "n": 64, "n_kv": 64, "d": 112, "inter_size": 18432}
    head = eagle_head_config(kimi)
    assert head["head_dim"] == HEAD_ATTENTION_DIM in TIMED_HEAD_DIMS
    # the query width (heads x head size) is kept: 64 x 112 = 56 x 128
    assert head["num_attention_heads"] * head["head_dim"] == 64 * 112
    assert head["num_key_value_heads"] == 56
    # the head's GEMM widths are the target's, whatever its attention is priced at
    assert head["hidden_size"] == 7168 and head["intermediate_size"] > 18432
    # a target of a timed head size keeps its own heads
    llama = eagle_head_config({"hidden_size": 4096, "n": 32, "n_kv": 8, "d": 128, "inter_size": 14336})
    assert (llama["num_attention_heads"], llama["num_key_value_heads"], llama["head_dim"]) == (32, 8, 128)


def test_an_nvfp4_target_reads_half_the_bytes_of_fp8_and_anchors_to_the_fp4_rows() -> None:
    """Llama-3.1-70B on 2x B200: AIConfigurator's measured rows include NVFP4 runs of it on vLLM."""
    _aic()
    from sdplan.calibration import parse_calibration
    from sdplan.derive import DeriveRequest, derive

    steps = {}
    for precision in ("fp8", "nvfp4"):
        request = DeriveRequest(target_model="meta-llama/Llama-3.1-70B-Instruct", system="b200_sxm", method="ngram",
                                tensor_parallel_size=2, precision=precision, draft_lengths=(1,), anchor=False)
        calibration = parse_calibration(derive(request).document, f"<{precision}>")
        steps[precision] = calibration.coefficients_at(1024, 512).baseline_c1_step_s
    # a one-sequence decode step is bound by reading the weights: 4.5 bits a weight against 8
    assert 0.4 < steps["nvfp4"] / steps["fp8"] < 0.8
    anchored = derive(DeriveRequest(target_model="meta-llama/Llama-3.1-70B-Instruct", system="b200_sxm",
                                    method="ngram", tensor_parallel_size=2, precision="nvfp4", draft_lengths=(1,)))
    text = str(anchored.document)
    assert "NVFP4 weights" in text and "anchored_mape_pct" in text
    assert "none: silicon_sample.csv has no measured rows" not in text


@pytest.mark.parametrize(("system", "flag", "precision", "units"), [
    ("h100_sxm", "--precision", "nvfp4", "FP4"), ("l40s", "--draft-precision", "nvfp4", "FP4"),
    ("a100_sxm", "--precision", "fp8", "FP8"), ("a100_sxm", "--draft-precision", "fp8_block", "FP8")])
def test_a_precision_the_gpu_has_no_units_for_is_a_one_line_error(sdplan, tmp_path, system, flag, precision,
                                                                   units) -> None:
    """Refused before pricing, naming the units the GPU lacks and the GPUs that have them."""
    from sdplan.errors import ExitStatus

    out = tmp_path / "x.toml"
    result = sdplan("derive", "--target-model", "meta-llama/Llama-3.1-8B-Instruct", "--system", system,
                    "--method", "draft_model", "--draft-model", "meta-llama/Llama-3.2-1B-Instruct", flag, precision,
                    "-o", str(out))
    assert result.exit_code == ExitStatus.USAGE
    error = result.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"Error: {flag} {precision}: {system} has no {units} tensor cores")
    assert "b200_sxm" in error[0] and f"give {flag} bf16" in error[0]
    assert "Traceback" not in result.stderr and not out.exists()


def test_an_mxfp4_checkpoints_experts_are_priced_as_it_ships_them() -> None:
    from sdplan.derive.pricing import MXFP4_EXPERTS

    gpt_oss = {"num_experts": 128, "topk": 4, "raw_config": {"quant_algo": "mxfp4"}}
    for precision, gemm in (("bf16", "bfloat16"), ("fp8", "fp8")):
        assert checkpoint_quant_modes(precision, gpt_oss) == {"gemm_quant_mode": gemm, "moe_quant_mode": MXFP4_EXPERTS}
    # no experts, nothing to price at MXFP4
    assert checkpoint_quant_modes("bf16", {"num_experts": 0, "raw_config": {"quant_algo": "mxfp4"}}) == \
        {"gemm_quant_mode": "bfloat16", "moe_quant_mode": "bfloat16"}


def test_gpt_oss_anchors_to_its_measured_fp4_rows_and_says_how_its_experts_are_priced() -> None:
    """gpt-oss-120b on 2x H200: AIConfigurator's rows label its runs fp4, and derive asks for bf16 (its attention)."""
    _aic()
    from sdplan.derive import DeriveRequest, derive

    derivation = derive(DeriveRequest(target_model="openai/gpt-oss-120b", system="h200_sxm", method="ngram",
                                      tensor_parallel_size=2, draft_lengths=(1,)))
    text = str(derivation.document)
    assert derivation.anchor is not None and derivation.anchor["rows"] >= 10
    assert "ships its experts in MXFP4" in text and "8-bit activations" not in text
    on_b200 = derive(DeriveRequest(target_model="openai/gpt-oss-120b", system="b200_sxm", method="ngram",
                                   tensor_parallel_size=2, draft_lengths=(1,), anchor=False))
    assert "8-bit activations" in str(on_b200.document)


def test_b300_and_gb300_are_derived_at_their_own_memory_and_fp4_units(sdplan, tmp_path) -> None:
    _aic()
    out = tmp_path / "gb300.toml"
    result = sdplan("derive", "--target-model", "meta-llama/Llama-3.1-70B-Instruct", "--system", "gb300", "--tp", "2",
                    "--method", "ngram", "--precision", "nvfp4", "--draft-lengths", "1", "--no-anchor",
                    "-o", str(out), "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert "NVIDIA GB300" in out.read_text() and "nvfp4" in out.name + out.read_text().lower()
    from sdplan.calibration import parse_calibration
    from sdplan.derive import DeriveRequest, derive

    for system, hardware in (("b300_sxm", "NVIDIA B300 SXM 288GB"), ("gb300", "NVIDIA GB300")):
        request = DeriveRequest(target_model="meta-llama/Llama-3.1-70B-Instruct", system=system, method="ngram",
                                tensor_parallel_size=2, precision="nvfp4", draft_lengths=(1,), anchor=False)
        calibration = parse_calibration(derive(request).document, f"<{system}>")
        assert calibration.records.provenance.hardware.startswith(f"2x {hardware}")


def test_an_attention_block_with_its_projections_says_what_each_query_reads_alone() -> None:
    from sdplan.derive.pricing import per_query_context

    # DeepSeek sparse attention: every query token reads its own top-k entries
    assert per_query_context({"kv_lora_rank": 512, "index_topk": 2048}) == 2048
    # latent attention: the latents are read once a sequence, the projections run on every row
    assert per_query_context({"kv_lora_rank": 512}) == 1
    assert per_query_context({"text_config": {"kv_lora_rank": 512, "index_topk": None}}) == 1  # Kimi's nesting
    # a bare kernel (its projections are ops of their own): None, so verify keeps one read a sequence
    assert per_query_context({"num_key_value_heads": 8}) is None
    assert per_query_context({"kv_lora_rank": 0, "index_topk": 2048}) is None


@pytest.mark.parametrize(("target", "system", "precision", "backend", "own"), [
    ("zai-org/GLM-5-FP8", "b200_sxm", "fp8", "sglang", 2048),  # DSA
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", "fp8_block", "vllm", 1),  # MLA
])
def test_a_latent_attention_blocks_projections_are_verified_on_every_row(target, system, precision, backend,
                                                                        own) -> None:
    """verify(B, q, s) = A(B q, c0) + A(B, s) - A(B, c0) + the other ops at B q rows, ``c0 = min(s, c)``: more than
    one cache read a sequence (the bare kernel's rule), at most AIConfigurator's MTP verification of B q rows."""
    _aic()
    from sdplan.derive import DeriveRequest, Models, Pricer, load_aic

    request = DeriveRequest(target_model=target, system=system, method="mtp", tensor_parallel_size=8,
                            precision=precision, backend=backend,
                            kv_cache_dtype="fp8" if backend == "sglang" else "auto")
    models = Models()
    try:
        pricer = Pricer(load_aic(), request, models)
        assert pricer.query_context == own

        def ops(rows: int, context: int) -> tuple[float, float]:
            attention = other = 0.0
            for name, latency_ms, *_ in pricer.target.decode_step_per_op(rows, max(context - 2, 1), 2):
                if "attention" in name or "mla" in name:
                    attention += float(latency_ms) / 1e3
                else:
                    other += float(latency_ms) / 1e3
            return attention, other

        for batch, context in ((16, 1280), (64, 7834)):
            c0 = min(context, own)
            expected = ops(4 * batch, c0)[0] + ops(batch, context)[0] - ops(batch, c0)[0] + ops(4 * batch, context)[1]
            verify = pricer.verify(batch, 4, context)
            assert verify == pytest.approx(expected, rel=1e-12)
            once = ops(batch, context)[0] + ops(4 * batch, context)[1]
            whole = sum(ops(4 * batch, context))
            assert once < verify <= whole * (1 + 1e-12)
        # DSA below its top-k: every query reads the whole context on its own, AIConfigurator's MTP verification
        if own > 1:
            assert pricer.verify(16, 4, 1280) == pytest.approx(sum(ops(64, 1280)), rel=1e-12)
    finally:
        models.close()
