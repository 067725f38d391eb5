"""The derived calibration file: provenance, ``[derivation]`` and the step model.

A derived file (``sdplan-calibration(5)``, ``provenance.method = "derived"``)
says what it rests on: the estimator's package, database and licence, the
grids priced, how well the fitted form represents the priced curve, the
measured rows it was anchored to (or that none exist), and every cost that
was assumed rather than priced (``provenance.assumptions``).
"""

from __future__ import annotations

from typing import Any

from sdplan import __version__
from sdplan.derive.fitting import FittedSteps
from sdplan.derive.pricing import MXFP4_EXPERTS, Pricer, shown_path
from sdplan.derive.request import (
    AIC_DISTRIBUTION,
    AIC_LICENCE,
    ARCHITECTURES,
    CONTEXT_GRID,
    EAGLE3_DRAFT_VOCAB,
    FP4_SYSTEMS,
    PREFILL_GRID,
    PROMPT_GRID,
    SYSTEMS,
    DeriveRequest,
    EngineOverheads,
    aic_version,
    draft_tp,
    file_stem,
    model_key,
)
from sdplan.fileio import dumps_toml
from sdplan.inputs.serving import KV_CACHE_DTYPE_NAMES, engine_name, sd_max_num_seqs
from sdplan.units import written_number

PRECISION_TEXT = {"bf16": "bfloat16 weights and activations",
                  "fp8": "float8 weights and activations (per tensor)",
                  "fp8_block": "float8 weights (blockwise)",
                  "nvfp4": "NVFP4 weights and activations (4-bit, an fp8 scale per 16 elements)"}
#: Checkpoint quantisations (AIConfigurator's ``quant_algo``) for which AIConfigurator, left to itself, prices a
#: float8 KV cache whether or not the checkpoint declares one.
AIC_FP8_CACHE_CHECKPOINTS = ("fp8", "fp8_block", "nvfp4")


def dtype_text(precision: str, kv_cache_dtype: str) -> str:
    """``provenance.dtype``: the target's weights at ``precision`` and its KV cache at ``kv_cache_dtype``."""
    if precision == "bf16" and kv_cache_dtype == "bf16":
        return "bfloat16 weights, activations and KV cache"
    return f"{PRECISION_TEXT[precision]}, {KV_CACHE_DTYPE_NAMES[kv_cache_dtype]} KV cache"


STEP_KEYS = ("fixed_s", "per_sequence_s", "per_query_token_s", "per_context_token_s")
#: ``[step_model.prefill]``'s keys, in the order written (:class:`~sdplan.calibration.records.PrefillCost`).
PREFILL_KEYS = ("fixed_s", "per_prompt_token_s", "per_prompt_token_sq_s", "load_per_prompt_token_s",
                "load_per_prompt_token_sq_s")
#: The comment at the head of a file ``sdplan derive`` writes: where its numbers come from.
HEADER = ("Derived with 'sdplan derive' from NVIDIA AIConfigurator's op database: see [derivation] and "
          "provenance.assumptions.")
ANCHOR_HOW = ("a closed loop's TPOT = a x AIConfigurator decode step + b x (N/g) x its prefill + the engine's "
              "step overhead, fitted to the measured rows; every step cost x a, every prefill cost x b "
              "(AIConfigurator's SD-to-no-SD step ratios kept)")


def hardware_of(request: DeriveRequest) -> str:
    """The hardware as sdplan files name it: ``2x NVIDIA H100 SXM 80GB, tensor parallel``."""
    hardware, _ = SYSTEMS[request.system]
    tp = request.tensor_parallel_size
    return f"{tp}x {hardware}, tensor parallel" if tp > 1 else hardware


def draft_name_of(request: DeriveRequest) -> str:
    return {"mtp": "mtp", "ngram": "ngram"}.get(request.method, str(request.draft_model))


def attention_block_assumption(own: int) -> str:
    """What a verification step of a latent-attention target reads (:func:`~sdplan.derive.pricing.per_query_context`:
    ``own`` tokens each query token reads on its own)."""
    if own > 1:
        return (f"the target's DeepSeek sparse attention is one op with its projections: each query token selects "
                f"and reads its own {own:,} cached entries, so verification prices the op at min(context, {own:,}) "
                "tokens on batch x (k+1) rows and the rest of the context (the indexer's scan) once a sequence")
    return ("the target's latent attention (MLA) is one op with its projections: verification prices its "
            "projections on batch x (k+1) rows (the op at 1 token of context) and its read of the cached latents "
            "once a sequence")


def assumptions(request: DeriveRequest, pricer: Pricer) -> list[str]:
    """What the file assumes rather than prices, one sentence each."""
    version, method, draft_name = aic_version(), request.method, draft_name_of(request)
    overheads = request.overheads
    found = [
        (f"step costs are AIConfigurator {version}'s estimates from its per-operation database measured on "
        f"{request.system} with {request.backend} {pricer.version}, plus the engine's overheads below; "
        "any other serving cost outside the GPU ops enters only through an anchor to measured rows "
        "([derivation] anchor)"),
        ("verification of k+1 tokens per sequence: every op but attention at batch x (k+1) token rows, as "
        "AIConfigurator prices MTP verification; attention at batch sequences (each sequence's KV read once per "
        "step, as multi-query attention kernels do)"),
        *([attention_block_assumption(pricer.query_context)] if pricer.query_context is not None else []),
        ("the target's step is fitted with a compute-bound knee where one fits AIConfigurator's step costs "
         "better than a straight line: flat in the token rows while bound by memory, then a second slope per row "
         "(step_model.target.knee_tokens; derivation.target_linear_* give the straight line's error)"),
        ("a dense target's GEMMs cost at most reading their weights at the GPU's empirical bandwidth (AIConfigurator's "
         "system file) and then computing their rows at the rate its database times them at 8,192 rows: a served "
         "kernel overlaps the two, so a small-batch timing above their sum is not what the engine runs"),
        "chain drafting (top-k 1): one token per draft step, k + 1 tokens verified; tree drafting is not modelled",
        *([f"{engine_name(request.backend)} runs at most {limit} requests at once under SD unless "
           "--max-running-requests is given (its ServerArgs): plan, check, capacity and simulate hold the SD "
           "options' batch cap to it where --max-num-seqs does not set one; the steps are priced past it for a "
           "server given more"] if (limit := sd_max_num_seqs(request.backend)) is not None else []),
        (f"the engine's host overhead per step, SD or not: {overheads.step_s * 1e3:.3g} ms "
         f"(step_model.engine; {overheads.source}), taken for every GPU and {request.backend} version"),
        (f"the server's time around a request's prefill that the op database does not time: "
         f"{overheads.prefill_per_layer_s * 1e3:.3g} ms per target layer, {int(pricer.shapes['layers'])} layers "
         "(step_model.engine prefill_overhead_s; fitted to AIConfigurator's measured vLLM rows at 4-8 clients, "
         "benchmarks/RESULTS-accuracy-silicon-2026-11.md"
         + ("" if overheads.measured else f", {request.backend} assumed to pay vLLM's") + "), in TTFT and latency, "
         "not in the steps other requests wait for"),
        (f"the SD cycle's own overhead (drafting-phase launch, rejection sampling, bookkeeping): "
         f"{overheads.sd_cycle_s * 1e3:.3g} ms per cycle for a proposer that runs a model ("
         + ("the same source's EAGLE-3 drafting phase less the head steps AIConfigurator prices)"
            if overheads.measured else f"{overheads.source}: its EAGLE-3 drafting phase less the head steps)")),
        ("chunked prefill: a concurrent prompt's prefill delays the decode step it joins by AIConfigurator's mixed "
         "step minus its decode step"),
        (f"a prompt of p tokens: its own prefill and that delay each fitted as a + b p + c p^2 (c: its attention "
         f"over its own prefix) to AIConfigurator's prices at {PREFILL_GRID[0]:,}-{PREFILL_GRID[-1]:,} tokens, where "
         "the KV cache holds them (step_model.prefill)"),
    ]
    # vLLM loads a draft at its own checkpoint's precision (speculative_config quantization, unset by default)
    own = (f"at {pricer.draft_precision}"
           + (" (--draft-precision)" if request.draft_precision is not None else
              " (vLLM loads a draft at its own checkpoint's precision, not the target's; --draft-precision "
              "says otherwise)"))
    if method in ("eagle", "eagle3"):
        found.append(f"{draft_name} is not in AIConfigurator's model set: priced as a one-layer decoder of "
                     f"the target's shapes with a {EAGLE3_DRAFT_VOCAB}-token draft vocabulary, its fc and "
                     f"doubled QKV input as extra MLP width of the same parameter count, {own}")
    elif method == "mtp":
        found.append("the MTP module is priced by AIConfigurator's own MTP model: its nextn = k step minus "
                     "the verification step, per draft token, averaged over the draft lengths priced")
    elif method == "ngram":
        found.append(f"n-gram lookup has no device work; its host cost per cycle is {overheads.ngram_share * 100:g}% "
                     "of the verification step (SpecDecode-Bench's n-gram share, vLLM ngram_proposer on the host)")
    else:
        if request.draft_tensor_parallel_size in (None, request.tensor_parallel_size):
            found.append(f"the draft model runs with the target's tensor parallelism ({request.tensor_parallel_size}) "
                         f"on the same GPUs {own}, sharing their memory; its prefill is paid with the target's")
        else:
            found.append(f"the draft model runs on {request.draft_tensor_parallel_size} of the target's "
                         f"{request.tensor_parallel_size} GPUs (draft_tensor_parallel_size) {own}, sharing their "
                         "memory; its prefill is paid with the target's")
    if pricer.quant["moe_quant_mode"] == MXFP4_EXPERTS:
        found.append(f"{request.target_model}'s checkpoint ships its experts in MXFP4 (config.json "
                     f"quantization_config.quant_method): they are priced with the engine's {MXFP4_EXPERTS} MoE "
                     "kernels (4-bit weights, 16-bit activations), the other GEMMs at "
                     f"{pricer.quant['gemm_quant_mode']}")
        if request.system in FP4_SYSTEMS:
            found.append(f"on {request.system} the engine can run MXFP4 experts with 8-bit activations, which "
                         f"AIConfigurator {aic_version()} does not time for this model: {MXFP4_EXPERTS} prices them "
                         "slower (gpt-oss-120b on B200: derived E2E 22-55% above AIConfigurator's measured rows, "
                         "benchmarks/RESULTS-accuracy-silicon-2026-11.md)")
    elif pricer.quant["moe_quant_mode"] != pricer.quant["gemm_quant_mode"]:
        block = (pricer.shapes.get("raw_config") or {}).get("quant_algo") == "fp8_block"
        by_name = pricer.target_name.quantised
        found.append((f"{request.target_model}'s checkpoint is block-scaled fp8 (config.json weight_block_size)"
                      if block else
                      f"{request.target_model}'s quantisation scheme is not at hand (its config.json is not), so it "
                      "is priced as vLLM runs a checkpoint it quantises to fp8 as it loads (Fp8MoEMethod)"
                      if by_name else
                      f"{request.target_model}'s checkpoint is unquantised and vLLM quantises it to fp8 as it loads, "
                      "with the method it runs for block-scaled checkpoints (Fp8MoEMethod), not ModelOpt's")
                     + f": its experts are priced with the engine's {pricer.quant['moe_quant_mode']} MoE kernels, the "
                     f"other GEMMs at {pricer.quant['gemm_quant_mode']}")
    found.extend(kv_cache_assumption(request, pricer))
    for resolved in (pricer.target_name, pricer.draft_name):
        if resolved is None:
            continue
        if resolved.note is not None:
            found.append(resolved.note)
        if resolved.name in ARCHITECTURES:
            found.append(f"{resolved.name} is not in AIConfigurator's model set: priced from its config.json shapes "
                         "(sdplan.derive.ARCHITECTURES)")
    found.append("acceptance is not part of this file: give it per workload (--acceptance)")
    return found


def derivation_table(request: DeriveRequest, pricer: Pricer, fitted: FittedSteps,
                     anchor: dict[str, Any] | None) -> dict[str, Any]:
    """``[derivation]``: the estimator, the grids priced, the fitted form's errors, the anchor."""
    version, method = aic_version(), request.method
    measured = ("nothing end to end: AIConfigurator's per-operation timings only" if anchor is None else
                f"{anchor['rows']} closed-loop rows of AIConfigurator's silicon_sample.csv ({request.backend} "
                f"{', '.join(anchor['row_versions'])}, concurrency {anchor['concurrency'][0]}-"
                f"{anchor['concurrency'][1]}) anchor the no-SD decode and prefill costs")
    table: dict[str, Any] = {
        "source": f"NVIDIA AIConfigurator ({AIC_DISTRIBUTION} {version}, {AIC_LICENCE})",
        "package": AIC_DISTRIBUTION,
        "package_version": version,
        "licence": AIC_LICENCE,
        "system": request.system,
        "backend": request.backend,
        "database_version": pricer.version,
        "precision": request.precision,
        **({"draft_precision": pricer.draft_precision} if pricer.draft_path is not None else {}),
        **({"draft_tensor_parallel_size": draft_tp(request)} if method == "draft_model" else {}),
        # the flag the server needs: without one it serves the checkpoint's own cache (auto)
        **({"kv_cache_dtype": pricer.kv_cache_dtype} if request.kv_cache_dtype != "auto" else {}),
        "target_priced_as": shown_path(pricer.target_path),
        "target_layers": int(pricer.shapes["layers"]),
        "draft_priced_as": shown_path(pricer.draft_path) if pricer.draft_path else "none (no device work)"
        if method == "ngram" else "the target's MTP layers",
        "draft_lengths": [float(k) for k in request.draft_lengths],
        "max_num_seqs": request.batch_cap,
        "batch_sizes": [float(b) for b in fitted.batches],
        "context_tokens": [float(s) for s in CONTEXT_GRID],
        "prompt_tokens": [float(p) for p in fitted.prompts],
        "points": fitted.points,
        "measured": measured,
    }
    if fitted.kv_tokens is not None:
        table["kv_cache_tokens"] = fitted.kv_tokens
    alone = pricer.kv_cache_tokens_without_draft() if pricer.draft_path is not None else None
    if alone is not None:
        table["kv_cache_tokens_without_draft"] = alone
    for component, (mean, worst) in fitted.errors.items():
        table[f"{component}_mean_error_pct"] = written_number(mean)
        table[f"{component}_max_error_pct"] = written_number(worst)
    if anchor is None:
        table["anchor"] = "none: silicon_sample.csv has no measured rows for this target, system, TP and precision"
        return table
    table["anchor"] = ANCHOR_HOW
    for key in ("rows", "decode_scale", "prefill_scale", "gap_mape_pct", "gap_bias_pct", "anchored_mape_pct",
                "anchored_max_error_pct"):
        value = anchor[key]
        table[f"anchor_{key}"] = value if isinstance(value, int) else written_number(value)
    return table


def step_model_table(method: str, fitted: FittedSteps, decode_scale: float, prefill_scale: float,
                     overheads: EngineOverheads, layers: int) -> dict[str, Any]:
    """``[step_model]``: every step cost x ``decode_scale``, every prefill cost x ``prefill_scale``; the engine's
    overheads as measured, unscaled (the prefill overhead for the target's ``layers``)."""
    # n-gram: its share of the verification step (k + 1 = 4 rows priced at the source's k = 3), no phase to
    # launch; a proposer that runs a model: the SD cycle's own overhead.
    verify_fixed, verify_per_sequence = fitted.target[0], fitted.target[1] + 4 * fitted.target[2]
    share = overheads.ngram_share
    spec_overhead = share * verify_fixed * decode_scale if method == "ngram" else overheads.sd_cycle_s
    per_sequence_overhead = share * verify_per_sequence * decode_scale if method == "ngram" else 0.0
    target = {key: written_number(value * decode_scale) for key, value in zip(STEP_KEYS, fitted.target)}
    knee_tokens, above_knee = fitted.knee
    if above_knee > 0.0:
        target.update(knee_tokens=knee_tokens, per_token_above_knee_s=written_number(above_knee * decode_scale))
    return {
        "target": target,
        "draft": {key: written_number(value * decode_scale) for key, value in zip(STEP_KEYS, fitted.draft)},
        "prefill": {key: written_number(getattr(fitted.prefill, key) * prefill_scale) for key in PREFILL_KEYS},
        "speculation": {"overhead_fixed_s": written_number(spec_overhead),
                        "overhead_per_sequence_s": written_number(per_sequence_overhead)},
        "engine": {"step_overhead_s": written_number(overheads.step_s),
                   "prefill_overhead_s": written_number(overheads.prefill_per_layer_s * layers)},
    }


def kv_cache_assumption(request: DeriveRequest, pricer: Pricer) -> list[str]:
    """Say which KV cache a derivation priced where the checkpoint's weights alone might suggest another.

    Nothing for an unquantised checkpoint served with the default cache (bfloat16 throughout, as
    ``provenance.dtype`` says); otherwise where the cache's dtype comes from (:func:`kv_cache_dtype`).
    """
    checkpoint = pricer.shapes.get("raw_config") or {}
    if request.kv_cache_dtype != "auto":
        return [f"KV cache in {KV_CACHE_DTYPE_NAMES[pricer.kv_cache_dtype]} (--kv-cache-dtype "
                f"{request.kv_cache_dtype}), for the target and its draft; it sets the cache's bytes a token, so the "
                "requests it holds"]
    if pricer.kv_cache_dtype == "fp8":
        return [f"KV cache in float8, as {request.target_model}'s checkpoint declares (kv_cache_quant_algo) and "
                "vLLM's --kv-cache-dtype auto follows; --kv-cache-dtype bf16 prices a bfloat16 cache"]
    if checkpoint.get("quant_algo") in AIC_FP8_CACHE_CHECKPOINTS:
        return [f"KV cache in bfloat16: {request.target_model}'s checkpoint quantises its weights but declares no "
                "KV-cache quantisation, and vLLM's --kv-cache-dtype auto then keeps the model's dtype "
                "(AIConfigurator's own default would price float8, twice the requests a cache holds); "
                "--kv-cache-dtype fp8 prices a float8 cache"]
    return []


def provenance(request: DeriveRequest, pricer: Pricer, anchor: dict[str, Any] | None) -> dict[str, Any]:
    """``[provenance]`` of a derived file."""
    version = aic_version()
    return {
        "method": "derived",
        "hardware": hardware_of(request),
        "target_model": request.target_model,
        "draft_model": draft_name_of(request),
        "speculative_method": request.method,
        "engine": request.backend,
        "engine_version": pricer.version,
        "date": request.date,
        "created_by": f"sdplan derive (sdplan {__version__}, {AIC_DISTRIBUTION} {version})",
        "dtype": dtype_text(request.precision, pricer.kv_cache_dtype),
        "tensor_parallel_size": request.tensor_parallel_size,
        "assumptions": assumptions(request, pricer),
        "sources": [(f"{AIC_DISTRIBUTION} {version} ({AIC_LICENCE}): systems/data/{request.system} "
                    f"{request.backend} {pricer.version} per-operation database, AicEngine step estimator")]
        + ([f"{AIC_DISTRIBUTION} {version}: systems/silicon_sample.csv ({anchor['rows']} rows)"] if anchor else []),
        "notes": "Derived from AIConfigurator's op database: check it against your own measurement "
                 "('sdplan validate') before relying on absolute numbers.",
    }


def document(request: DeriveRequest, pricer: Pricer, fitted: FittedSteps,
             anchor: dict[str, Any] | None) -> dict[str, Any]:
    """The whole derived calibration document (the step costs anchored where ``anchor`` says)."""
    decode_scale = anchor["decode_scale"] if anchor else 1.0
    prefill_scale = anchor["prefill_scale"] if anchor else 1.0
    described = {"eagle": "an EAGLE head", "eagle3": "an EAGLE-3 head", "mtp": "its MTP module",
                 "ngram": "n-gram lookup"}.get(request.method, model_key(draft_name_of(request)) + " as draft")
    result: dict[str, Any] = {
        "schema_version": 1,
        "name": request.name or file_stem(request),
        "description": f"{model_key(request.target_model)} with {described} on {hardware_of(request)}, "
                       f"{request.backend} {pricer.version}, priced by AIConfigurator "
                       + ("and anchored to measured rows" if anchor else "(not measured end to end)"),
        "provenance": provenance(request, pricer, anchor),
        "reference_workload": {"prompt_tokens": request.prompt_tokens, "output_tokens": request.output_tokens},
        "validity": {"prompt_tokens": [float(PROMPT_GRID[0]), float(PROMPT_GRID[-1])],
                     "output_tokens": [32.0, 4096.0], "batch_size": [1.0, float(fitted.batches[-1])]},
        "derivation": derivation_table(request, pricer, fitted, anchor),
        "step_model": step_model_table(request.method, fitted, decode_scale, prefill_scale, request.overheads,
                                       int(pricer.shapes["layers"])),
    }
    if pricer.routing is not None:
        streamed = written_number(fitted.experts_s * decode_scale)
        result["moe"] = {"experts_per_token": pricer.routing[0], "experts": pricer.routing[1],
                         "coverage": {"baseline_c1_step_s": streamed, "c1v_s": streamed}}
    return result


def file_text(derived: dict[str, Any]) -> str:
    """The derived calibration ``derived`` as the TOML file ``sdplan derive`` writes, under :data:`HEADER`."""
    return dumps_toml(derived, header=HEADER)
