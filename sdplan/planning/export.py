"""Engine configurations from a k schedule: vLLM, SGLang and TensorRT-LLM, in the forms they read verbatim.

Each builder takes an :class:`~sdplan.planning.schedule.EngineSchedule` (inclusive
``(start, end, k)`` tiers over ``1..max_num_seqs``), the SD method and the
weights it loads, and returns the text to hand the engine plus warnings
(what the engine will do differently from the model). None of them is
called for a schedule that is off everywhere: that answer is "serve without
SD", with no speculative config at all (the caller says so).

Sources of the formats (read in the engines' code, cited per builder):

* vLLM 0.33 ``--speculative-config`` JSON with
  ``num_speculative_tokens_per_batch_size`` (``docs/engines.md#vllm-per-batch-size-schedule``);
* SGLang ``--speculative-adaptive-config`` JSON, batch-size-keyed tiers
  (sgl-project/sglang#24055; ``python/sglang/srt/speculative/adaptive_spec_params.py``);
* TensorRT-LLM ``speculative_config.draft_len_schedule``
  (NVIDIA/TensorRT-LLM#10860, #12262; ``tensorrt_llm/llmapi/llm_args.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sdplan.errors import InvalidValueError
from sdplan.inputs.methods import NGRAM_LOOKUP_TOKENS
from sdplan.inputs.serving import engine_name
from sdplan.planning.schedule import check_vllm_schedule

if TYPE_CHECKING:
    from sdplan.planning.schedule import EngineSchedule

#: Methods vLLM runs a per-batch-size schedule for on Model Runner V1 (``vllm==0.33.0:vllm/config/vllm.py:1088-1108``).
VLLM_V1_SCHEDULE_METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash")
#: SGLang ``--speculative-algorithm`` per method; adaptive tiers run for EAGLE/EAGLE3 only (MTP runs as EAGLE).
SGLANG_ALGORITHMS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "EAGLE", "draft_model": "STANDALONE",
                     "ngram": "NGRAM"}
#: TensorRT-LLM ``speculative_config.decoding_type`` per method.
TRTLLM_DECODING_TYPES = {"eagle": "Eagle", "eagle3": "Eagle3", "mtp": "MTP", "draft_model": "Draft_Target",
                         "ngram": "NGram"}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What to hand the engine (``text``), how (``usage``), and what the engine does differently (``warnings``)."""

    text: str
    usage: str
    warnings: list[str] = field(default_factory=list)


def _k0_warning(schedule: EngineSchedule, engine: str) -> list[str]:
    if not any(k == 0 for _, _, k in schedule.tiers):
        return []
    return [f"tiers with k = 0 switch SD off per step on {engine}; with MTP on vLLM Model Runner V1 and in "
            "TensorRT-LLM's one-model path this starved the drafter and collapsed throughput (vllm-project/vllm"
            "#49548, NVIDIA/TensorRT-LLM#16888): give --min-k 1 to keep SD on at every batch size"]


@dataclass(frozen=True, slots=True)
class DraftServing:
    """How the calibration priced the draft: the GPUs it runs on and its weights' precision (None: not said)."""

    tensor_parallel_size: int | None = None
    precision: str | None = None


#: vLLM's speculative-config ``quantization`` for a draft priced at a precision vLLM can load a draft at
#: whatever its checkpoint (``Fp8Config``: an FP8 checkpoint as it is, block-scaled or not, a 16-bit one
#: quantised online); NVFP4 needs a checkpoint quantised so, which vLLM detects by itself.
VLLM_DRAFT_QUANTIZATION = {"fp8": "fp8", "fp8_block": "fp8"}


def _draft_precision_warning(draft: DraftServing, weights: str | None, engine: str) -> list[str]:
    """Where the engine loads draft weights and its config cannot say their priced precision: a warning naming
    it (none for MTP and n-gram, which load no draft of their own)."""
    if weights is None or draft.precision in (None, "bf16"):
        return []
    return [f"the draft was priced at {draft.precision} ([derivation] draft_precision): serve a draft checkpoint "
            f"quantised so; {engine} loads a draft at its checkpoint's precision"]


#: vLLM's ``--kv-cache-dtype`` for a KV cache dtype ``sdplan derive --kv-cache-dtype`` priced.
VLLM_KV_CACHE_DTYPES = {"bf16": "bfloat16", "fp8": "fp8"}


def vllm_config(schedule: EngineSchedule, method: str, weights: str | None, data_parallel_size: int = 1,
                draft: DraftServing = DraftServing(), kv_cache_dtype: str | None = None) -> EngineConfig:
    """``vllm serve --speculative-config`` JSON with the per-batch-size schedule.

    Notes
    -----
    Keys are ``SpeculativeConfig`` fields (``vllm==0.33.0:vllm/config/speculative.py``,
    a pydantic dataclass with ``extra="forbid"``): ``method`` (a
    ``SpeculativeMethod``), ``model`` only for methods that load weights (the
    draft LM, or the EAGLE head; MTP uses the target's own layers and n-gram
    none), ``prompt_lookup_min/max`` for n-gram, ``num_speculative_tokens``
    (the largest k: vLLM clamps every tier to it, ``dynamic/utils.py:113-145``)
    and ``num_speculative_tokens_per_batch_size``, ``[[start, end, k], ...]``
    inclusive, first range at 1 (``dynamic/utils.py:21-72``), covering the
    engine's ``max_num_seqs``.

    The draft runs as it was priced (``draft``): a draft model's
    ``draft_tensor_parallel_size`` is written where the calibration says it
    (vLLM's default is the target's, and 1 is the only other value it takes);
    ``quantization`` is written for a draft model or head priced at FP8
    (:data:`VLLM_DRAFT_QUANTIZATION`), since vLLM otherwise loads it at its
    checkpoint's precision. A KV cache dtype the calibration was priced at by choice (``kv_cache_dtype``,
    ``[derivation] kv_cache_dtype``) goes into the usage line as ``--kv-cache-dtype``: unasked, vLLM serves the
    checkpoint's own.
    """
    check_vllm_schedule(schedule.tiers)
    config: dict[str, Any] = {"method": method}
    if weights is not None:
        config["model"] = weights
    if method == "ngram":
        config["prompt_lookup_min"], config["prompt_lookup_max"] = NGRAM_LOOKUP_TOKENS
    if weights is not None and method == "draft_model" and draft.tensor_parallel_size is not None:
        config["draft_tensor_parallel_size"] = draft.tensor_parallel_size
    warnings = []
    if weights is not None and draft.precision in VLLM_DRAFT_QUANTIZATION:
        config["quantization"] = VLLM_DRAFT_QUANTIZATION[draft.precision]
    else:
        warnings += _draft_precision_warning(draft, weights, engine_name("vllm"))
    config["num_speculative_tokens"] = schedule.max_k
    config["num_speculative_tokens_per_batch_size"] = [list(tier) for tier in schedule.tiers]
    if weights is not None and "/" not in weights:
        warnings.append(f"model \"{weights}\" is a bare name: vLLM loads it from ./{weights} or as a Hugging Face id; "
                        "replace it with the path or repository of the weights you serve")
    if data_parallel_size > 1:
        warnings.append(f"data parallel size {data_parallel_size}: vLLM disables the per-batch-size schedule "
                        "(ranks could pick different k and deadlock) and runs the static num_speculative_tokens = "
                        f"{schedule.max_k} at every batch size (vllm==0.33.0 config/vllm.py:1110-1127); size with "
                        "a fixed k instead ('sdplan plan'), or serve each rank as its own replica")
    warnings.append("on Model Runner V1 (vLLM's default) a per-batch-size schedule forces CUDA graphs to PIECEWISE "
                    "(vllm==0.33.0 config/vllm.py:1069-1086): steps are slower than a calibration measured with "
                    "FULL graphs; set VLLM_USE_V2_MODEL_RUNNER=1, or calibrate with the schedule on")
    if method not in VLLM_V1_SCHEDULE_METHODS:
        warnings.append(f"method {method}: Model Runner V1 ignores the schedule for it (static k)")
    warnings += _k0_warning(schedule, engine_name("vllm"))
    usage = (f"vllm serve TARGET --max-num-seqs {schedule.max_num_seqs} --speculative-config \"$(cat FILE)\""
             + (f" --data-parallel-size {data_parallel_size}" if data_parallel_size > 1 else "")
             + (f" --kv-cache-dtype {VLLM_KV_CACHE_DTYPES[kv_cache_dtype]}" if kv_cache_dtype else ""))
    return EngineConfig(json.dumps(config) + "\n", usage, warnings)


def sglang_config(schedule: EngineSchedule, method: str, weights: str | None,
                  draft: DraftServing = DraftServing()) -> EngineConfig:
    """SGLang adaptive-steps config (JSON) pinning ``speculative_num_steps`` per batch-size tier, and its flags.

    Notes
    -----
    The file is read by ``_load_adaptive_config``
    (sgl-project/sglang ``python/sglang/srt/speculative/adaptive_spec_params.py``@015c8726,
    batch-size tiers of sgl-project/sglang#24055): an object whose integer-string
    keys are tier lower bounds, each with ``candidate_steps``, a non-empty list
    of non-negative ints; a step is routed to the largest key <= its batch size
    after padding to the CUDA-graph batch sizes (``adaptive_step_router.py``).
    One candidate per tier pins k there (the EMA has nothing to choose).
    Adaptive mode runs only for ``--speculative-algorithm EAGLE/EAGLE3`` with
    ``--speculative-eagle-topk 1`` (``adaptive_unsupported_reason``); with top-k 1
    the draft is a chain and ``--speculative-num-draft-tokens`` is steps + 1.

    Raises
    ------
    InvalidValueError
        For methods SGLang cannot tier (draft models, n-gram).
    """
    algorithm = SGLANG_ALGORITHMS[method]
    if algorithm not in ("EAGLE", "EAGLE3"):
        raise InvalidValueError(f"--format sglang: SGLang adapts speculative steps per batch size only for "
                                f"EAGLE/EAGLE3 (and MTP as EAGLE) with --speculative-eagle-topk 1, not for {method} "
                                f"({algorithm}); use --format vllm-config or --format trtllm")
    config = {str(start): {"candidate_steps": [k]} for start, _, k in schedule.tiers}
    top = schedule.max_k  # the initial tier; each slot snaps it to its own candidates
    flags = [f"--speculative-algorithm {algorithm}"]
    if weights is not None:
        flags.append(f"--speculative-draft-model-path {weights}")
    flags += [f"--speculative-num-steps {top}", "--speculative-eagle-topk 1",
              f"--speculative-num-draft-tokens {top + 1}", "--speculative-adaptive",
              "--speculative-adaptive-config FILE", f"--max-running-requests {schedule.max_num_seqs}"]
    warnings = ["SGLang pads a batch up to its CUDA-graph batch sizes before picking the tier "
                "(adaptive_step_router.py): a tier takes effect at the first graph size at or above its start"]
    warnings += _k0_warning(schedule, engine_name("sglang"))
    warnings += _draft_precision_warning(draft, weights, engine_name("sglang"))
    return EngineConfig(json.dumps(config, indent=2) + "\n",
                        "python -m sglang.launch_server --model-path TARGET " + " ".join(flags), warnings)


def trtllm_config(schedule: EngineSchedule, method: str, weights: str | None,
                  draft: DraftServing = DraftServing()) -> EngineConfig:
    """TensorRT-LLM ``speculative_config`` (YAML for ``trtllm-serve --config``) with ``draft_len_schedule``.

    Notes
    -----
    ``draft_len_schedule`` maps batch size to draft length with *upper-bound*
    keys: ``{4: 4, 8: 2, 32: 1}`` runs k = 4 for batch sizes 1-4, 2 for 5-8,
    1 for 9-32 and 0 (no SD) above 32 (``get_draft_len_for_batch_size``,
    ``bisect_left``; NVIDIA/TensorRT-LLM#10860). The validator
    (``DecodingBaseConfig.validate_draft_len_schedule_and_sort``) wants keys
    >= 1, lengths >= 0, the smallest key's length equal to ``max_draft_len``
    and none above it; ``max_concurrency`` must not be set with it. A final
    tier with k = 0 is left implicit; a final tier with k > 0 ends at the
    covered ``max_num_seqs``, beyond which TensorRT-LLM drafts nothing.
    """
    tiers = list(schedule.tiers)
    first = tiers[0][2]
    warnings = []
    if any(k > first for _, _, k in tiers):
        warnings.append(f"TensorRT-LLM requires batch size 1 to use the longest draft (max_draft_len = {first}); "
                        f"longer drafts at larger batches are cut to {first}")
        clamped: list[tuple[int, int, int]] = []
        for a, b, k in tiers:
            if clamped and clamped[-1][2] == min(k, first):
                clamped[-1] = (clamped[-1][0], b, clamped[-1][2])
            else:
                clamped.append((a, b, min(k, first)))
        tiers = clamped
    while tiers and tiers[-1][2] == 0:
        tiers.pop()
    if first == 0 or not tiers:
        raise InvalidValueError("--format trtllm: the schedule drafts nothing at batch size 1, and TensorRT-LLM "
                                "needs max_draft_len = the batch-1 draft length > 0; serve without SD")
    lines = ["speculative_config:", f"  decoding_type: {TRTLLM_DECODING_TYPES[method]}", f"  max_draft_len: {first}"]
    if weights is not None:
        lines.append(f"  speculative_model: {json.dumps(weights)}")
    if method == "mtp":
        lines.append(f"  num_nextn_predict_layers: {first}")
    if method == "ngram":
        lines.append(f"  max_matching_ngram_size: {NGRAM_LOOKUP_TOKENS[1]}")
    lines.append("  draft_len_schedule:")
    lines += [f"    {end}: {k}" for _, end, k in tiers]
    if tiers[-1][1] == schedule.max_num_seqs:
        warnings.append(f"TensorRT-LLM drafts nothing above the last key ({schedule.max_num_seqs}); give "
                        "--max-num-seqs equal to its max_batch_size so the schedule covers every batch")
    warnings += _k0_warning(schedule, engine_name("trtllm"))
    warnings += _draft_precision_warning(draft, weights, engine_name("trtllm"))
    return EngineConfig("\n".join(lines) + "\n", "trtllm-serve TARGET --config FILE", warnings)
