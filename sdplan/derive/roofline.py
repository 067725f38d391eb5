"""The datasheet roofline: calibrations priced from public figures, nothing measured.

``scripts/derive_roofline.py`` writes the shipped ``calibrations/*_roofline.toml`` with it, and
``benchmarks/accuracy_silicon.py`` sets its predictions beside measured rows.

Each step of a forward pass is costed as
memory time plus compute time (additive, a linear upper bound of the roofline
max), from public figures:

* accelerator: HBM bandwidth and dense BF16 peak from the vendor datasheet;
* model: layer shapes from the model's public ``config.json``.

Besides separate draft models, it prices the proposers people deploy
(``provenance.speculative_method``), each as the draft step of the per-step
form, so the Kong coefficients follow as for a draft model
(``sdplan/calibration/scaling.py`` ``coefficients_from_steps``):

* EAGLE/EAGLE-3 head (``eagle3``): one decoder layer on the target's hidden
  states plus its fc and draft-vocabulary LM head, run once per draft token
  (chain drafting, top-k 1). Its weights are streamed once per step
  (load-independent ``c1d``); its compute and one layer of KV per sequence
  grow with the batch (``c2d``). Li et al., EAGLE-3, arXiv 2503.01840.
* MTP (``mtp``): the target's own next-token-prediction module (one decoder
  layer with its experts, an ``eh_proj`` and the shared LM head) run once per
  draft token; same split as a head. DeepSeek-AI, DeepSeek-V3 technical
  report, arXiv 2412.19437, section 2.2.
* n-gram prompt lookup (``ngram``): no device weights; the proposer matches
  on the host once per cycle (a load-independent part and a part per
  sequence, in ``step_model.speculation``), and the only device cost per
  draft token is verifying it (``T.tok`` in ``c2d``). vLLM
  ``vllm/v1/spec_decode/ngram_proposer.py`` (numba, CPU).

The output is the per-step form of ``sdplan-calibration(5)``; every
assumption is written into the file's ``provenance.assumptions``.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from sdplan import __version__

#: Fixed so that re-running the script reproduces the shipped files byte for byte.
DERIVED_ON = datetime.date(2026, 11, 22)
BYTES_PER_PARAM = 2  # BF16 weights and KV cache
MEMORY_EFFICIENCY = 0.80  # achieved / datasheet HBM bandwidth for weight and KV streaming
DECODE_COMPUTE_EFFICIENCY = 0.50  # achieved / peak dense BF16 FLOP/s for decode/verify matmuls
PREFILL_COMPUTE_EFFICIENCY = 0.60  # achieved / peak for prefill matmuls
TARGET_STEP_OVERHEAD_S = 1.0e-3  # engine step: scheduling, input prep, sampling (vLLM, CUDA graphs)
DRAFT_STEP_OVERHEAD_S = 0.25e-3  # one extra draft forward inside an engine step
PER_SEQUENCE_OVERHEAD_S = 5.0e-6  # per running sequence per step (metadata, sampling)
SD_CYCLE_OVERHEAD_S = 0.5e-3  # rejection sampling and SD bookkeeping per cycle
ALLREDUCE_S = 10e-6  # per all-reduce with tensor parallelism (two per layer)
NGRAM_HOST_FIXED_S = 50e-6  # n-gram proposer per SD cycle on the host (vLLM ngram_proposer, numba)
NGRAM_HOST_PER_SEQUENCE_S = 10e-6  # n-gram matching per running sequence per cycle (KMP over ~2k context tokens)


@dataclass(frozen=True)
class Accelerator:
    key: str
    name: str
    hbm_bytes_per_s: float
    bf16_dense_flops: float
    source: str


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    source: str
    experts: int = 0  # MoE: experts per layer (0 = dense)
    experts_per_token: int = 0
    bytes_per_param: float = BYTES_PER_PARAM  # weights (KV cache stays BF16)
    attention_params: float = 0.0  # per layer when not grouped-query attention (MLA); 0 = GQA shapes
    kv_bytes: float = 0.0  # KV-cache bytes per token when not GQA (MLA caches a latent); 0 = GQA
    dense_layers: int = 0  # MoE: leading dense layers (first_k_dense_replace)
    dense_intermediate: int = 0
    shared_experts: int = 0  # MoE: always-active experts per layer

    @property
    def _attention(self) -> float:
        if self.attention_params:
            return self.attention_params
        return self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2

    @property
    def _dense_extra(self) -> float:
        """Leading dense layers' MLPs and the shared experts of the MoE layers (0 for the simple shapes)."""
        shared = (self.layers - self.dense_layers) * self.shared_experts * 3 * self.hidden * self.intermediate
        return self.dense_layers * 3 * self.hidden * self.dense_intermediate + shared

    @property
    def matmul_params(self) -> float:
        """Parameters multiplied per token: all layers (active experts only) plus the LM head."""
        mlp = 3 * self.hidden * self.intermediate * (self.experts_per_token if self.experts else 1)
        if self.dense_layers or self.shared_experts:
            return ((self.layers - self.dense_layers) * (self._attention + mlp) + self.dense_layers * self._attention
                    + self._dense_extra + self.vocab * self.hidden)
        return self.layers * (self._attention + mlp) + self.vocab * self.hidden

    @property
    def expert_params(self) -> float:
        """Parameters of all experts (MoE), streamed in proportion to expert coverage."""
        moe_layers = self.layers - self.dense_layers
        return moe_layers * self.experts * 3 * self.hidden * self.intermediate if self.experts else 0.0

    @property
    def dense_params(self) -> float:
        """Parameters read on every step whatever the routing (attention, router-free parts, LM head)."""
        if not self.experts:
            return self.matmul_params
        if self.dense_layers or self.shared_experts:
            return self.layers * self._attention + self._dense_extra + self.vocab * self.hidden
        return self.layers * self._attention + self.vocab * self.hidden

    @property
    def kv_bytes_per_token(self) -> float:
        if self.kv_bytes:
            return self.kv_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * BYTES_PER_PARAM


@dataclass(frozen=True)
class Proposer:
    """What drafts when it is not a separate LM: an EAGLE head, MTP layers or n-gram lookup.

    ``params`` are read and multiplied once per draft token (matmul
    parameters, all of them streamed each step); ``kv_bytes_per_token`` the
    proposer's own KV cache; ``prefill_params`` what it multiplies per prompt
    token at prefill.
    """

    method: str  # provenance.speculative_method: eagle3, mtp, ngram
    name: str  # provenance.draft_model: the head's name, or the method
    short: str  # file-name part
    weight_params: float  # streamed from HBM per draft step
    matmul_params: float  # multiplied per draft token
    kv_bytes_per_token: float
    prefill_params: float
    bytes_per_param: float
    source: str
    description: str


H200 = Accelerator("h200", "NVIDIA H200 SXM 141GB", 4.8e12, 989e12,
                   "NVIDIA H200 datasheet: 4.8 TB/s HBM3e, 989 TFLOP/s dense BF16")
H100 = Accelerator("h100-sxm", "NVIDIA H100 SXM 80GB", 3.35e12, 989e12,
                   "NVIDIA H100 datasheet: 3.35 TB/s HBM3, 989 TFLOP/s dense BF16")
A100 = Accelerator("a100-sxm-80gb", "NVIDIA A100 SXM 80GB", 2.039e12, 312e12,
                   "NVIDIA A100 datasheet: 2,039 GB/s HBM2e, 312 TFLOP/s dense BF16")
L40S = Accelerator("l40s", "NVIDIA L40S 48GB", 0.864e12, 362e12,
                   "NVIDIA L40S datasheet: 864 GB/s GDDR6, 362 TFLOP/s dense BF16")

LLAMA_8B = ModelConfig("meta-llama/Llama-3.1-8B-Instruct", 4096, 32, 32, 8, 128, 14336, 128256, False,
                       "config.json of meta-llama/Llama-3.1-8B-Instruct")
LLAMA_1B = ModelConfig("meta-llama/Llama-3.2-1B-Instruct", 2048, 16, 32, 8, 64, 8192, 128256, True,
                       "config.json of meta-llama/Llama-3.2-1B-Instruct")
LLAMA_70B = ModelConfig("meta-llama/Llama-3.1-70B-Instruct", 8192, 80, 64, 8, 128, 28672, 128256, False,
                        "config.json of meta-llama/Llama-3.1-70B-Instruct")
QWEN3_14B = ModelConfig("Qwen/Qwen3-14B", 5120, 40, 40, 8, 128, 17408, 151936, False, "config.json of Qwen/Qwen3-14B")
QWEN3_1_7B = ModelConfig("Qwen/Qwen3-1.7B", 2048, 28, 16, 8, 128, 6144, 151936, True, "config.json of Qwen/Qwen3-1.7B")
QWEN3_8B = ModelConfig("Qwen/Qwen3-8B", 4096, 36, 32, 8, 128, 12288, 151936, False, "config.json of Qwen/Qwen3-8B")
QWEN3_0_6B = ModelConfig("Qwen/Qwen3-0.6B", 1024, 28, 16, 8, 128, 3072, 151936, True, "config.json of Qwen/Qwen3-0.6B")
QWEN3_30B_A3B = ModelConfig("Qwen/Qwen3-30B-A3B", 2048, 48, 32, 4, 128, 768, 151936, False,
                            "config.json of Qwen/Qwen3-30B-A3B (128 experts, 8 per token, moe_intermediate_size 768)",
                            experts=128, experts_per_token=8)

LLAMA_3_3_70B = ModelConfig("meta-llama/Llama-3.3-70B-Instruct", 8192, 80, 64, 8, 128, 28672, 128256, False,
                            "config.json of meta-llama/Llama-3.3-70B-Instruct")
_MLA_V3 = (7168 * 1536 + 1536 * 128 * (128 + 64)  # q_a, q_b (q_lora_rank 1536, qk_nope 128 + qk_rope 64)
           + 7168 * (512 + 64) + 512 * 128 * (128 + 128)  # kv_a (kv_lora_rank 512 + rope 64), kv_b (nope + v 128)
           + 128 * 128 * 7168)  # o_proj
DEEPSEEK_V3 = ModelConfig(
    "deepseek-ai/DeepSeek-V3", 7168, 61, 128, 1, 128, 2048, 129280, False,
    "config.json of deepseek-ai/DeepSeek-V3 (MLA q_lora_rank 1536, kv_lora_rank 512, qk_rope/nope 64/128, v 128; "
    "256 routed + 1 shared experts, 8 per token, moe_intermediate_size 2048; first_k_dense_replace 3 with "
    "intermediate_size 18432; FP8 weights; num_nextn_predict_layers 1)",
    experts=256, experts_per_token=8, bytes_per_param=1, attention_params=_MLA_V3, kv_bytes=61 * (512 + 64) * 2,
    dense_layers=3, dense_intermediate=18432, shared_experts=1)


def _eagle3_head(hidden: int, heads: int, kv_heads: int, intermediate: int, draft_vocab: int) -> float:
    """Matmul parameters of a one-layer EAGLE-3 head: fc (3 fused target features), attention on [embedding;
    hidden] (2h in), MLP, and the draft-vocabulary LM head."""
    head_dim = hidden // heads
    return (3 * hidden * hidden + 2 * hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
            + 3 * hidden * intermediate + draft_vocab * hidden)


EAGLE3_8B = Proposer("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "eagle3",
                     _eagle3_head(4096, 32, 8, 14336, 32000), _eagle3_head(4096, 32, 8, 14336, 32000),
                     2 * 1 * 8 * 128 * BYTES_PER_PARAM, _eagle3_head(4096, 32, 8, 14336, 32000), BYTES_PER_PARAM,
                     "config.json of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B (1 layer, hidden 4096, draft vocab 32000)",
                     "an EAGLE-3 head")
EAGLE3_70B = Proposer("eagle3", "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", "eagle3",
                      _eagle3_head(8192, 64, 8, 28672, 32000), _eagle3_head(8192, 64, 8, 28672, 32000),
                      2 * 1 * 8 * 128 * BYTES_PER_PARAM, _eagle3_head(8192, 64, 8, 28672, 32000), BYTES_PER_PARAM,
                      "config.json of yuhuili/EAGLE3-LLaMA3.3-Instruct-70B (1 layer, hidden 8192, draft vocab 32000)",
                      "an EAGLE-3 head")
_V3_EXPERT = 3 * 7168 * 2048
_V3_MTP_ACTIVE = _MLA_V3 + 2 * 7168 * 7168 + 9 * _V3_EXPERT + 129280 * 7168  # eh_proj, 8 routed + 1 shared, head
V3_MTP = Proposer("mtp", "mtp", "mtp", _V3_MTP_ACTIVE - 9 * _V3_EXPERT + 257 * _V3_EXPERT, _V3_MTP_ACTIVE,
                  (512 + 64) * 2, _V3_MTP_ACTIVE - 129280 * 7168, 1,
                  "DeepSeek-V3 technical report (arXiv 2412.19437) section 2.2: one MTP module = one MoE decoder "
                  "layer + eh_proj, sharing the embedding and LM head", "its MTP module")
NGRAM = Proposer("ngram", "ngram", "ngram", 0.0, 0.0, 0.0, 0.0, BYTES_PER_PARAM,
                 "vLLM vllm/v1/spec_decode/ngram_proposer.py: prompt lookup on the host (numba), no weights",
                 "n-gram prompt lookup")

def step_model(gpu: Accelerator, tp: int, model: ModelConfig, overhead_s: float) -> dict[str, float]:
    """Linear step-time model of one forward pass of ``model`` on ``tp`` GPUs."""
    bandwidth = gpu.hbm_bytes_per_s * MEMORY_EFFICIENCY * tp
    compute = gpu.bf16_dense_flops * DECODE_COMPUTE_EFFICIENCY * tp
    allreduce = 2 * model.layers * ALLREDUCE_S if tp > 1 else 0.0
    return {
        "fixed_s": model.dense_params * model.bytes_per_param / bandwidth + overhead_s + allreduce,
        "per_sequence_s": PER_SEQUENCE_OVERHEAD_S,
        "per_query_token_s": 2.0 * model.matmul_params / compute,
        "per_context_token_s": model.kv_bytes_per_token / bandwidth,
    }


def proposer_step_model(gpu: Accelerator, tp: int, proposer: Proposer) -> dict[str, float]:
    """Draft step of an EAGLE head or MTP module (one layer: two all-reduces under TP); zero for n-gram."""
    if not proposer.weight_params:
        return {"fixed_s": 0.0, "per_sequence_s": 0.0, "per_query_token_s": 0.0, "per_context_token_s": 0.0}
    bandwidth = gpu.hbm_bytes_per_s * MEMORY_EFFICIENCY * tp
    compute = gpu.bf16_dense_flops * DECODE_COMPUTE_EFFICIENCY * tp
    allreduce = 2 * ALLREDUCE_S if tp > 1 else 0.0
    return {
        "fixed_s": proposer.weight_params * proposer.bytes_per_param / bandwidth + DRAFT_STEP_OVERHEAD_S + allreduce,
        "per_sequence_s": PER_SEQUENCE_OVERHEAD_S,
        "per_query_token_s": 2.0 * proposer.matmul_params / compute,
        "per_context_token_s": proposer.kv_bytes_per_token / bandwidth,
    }


def _proposer_assumptions(proposer: Proposer) -> list[str]:
    """What the proposer's costs are and which of them grow with the batch."""
    if proposer.method == "ngram":
        return [f"n-gram proposer on the host: {NGRAM_HOST_FIXED_S * 1e6:g} us per SD cycle (load-independent) + "
                f"{NGRAM_HOST_PER_SEQUENCE_S * 1e6:g} us per running sequence (grows with the batch), in "
                "step_model.speculation; no device weights, so a draft token costs only its verification compute",
                "no prefill for the proposer; attention FLOPs and prefix caching are ignored"]
    what = ("one decoder layer on the target's hidden states + fc + draft-vocabulary LM head"
            if proposer.method.startswith("eagle") else "one MoE decoder layer + eh_proj + the shared LM head, "
            "all its experts streamed each draft step (an upper bound below ~32 tokens per step)")
    return [f"{proposer.description}: {what}; {proposer.weight_params / 1e9:.2f}B params streamed per draft step "
            f"(load-independent c1d), {proposer.matmul_params / 1e9:.2f}B multiplied per draft token and "
            f"{proposer.kv_bytes_per_token:g} B of KV read per context token (grow with the batch, c2d)",
            "chain drafting (top-k 1): one token per draft step, k + 1 tokens verified; tree drafting is not modelled",
            f"the proposer's prefill ({proposer.prefill_params / 1e9:.2f}B params per prompt token) is paid with the "
            "target's; attention FLOPs and prefix caching are ignored"]


def _short(model: ModelConfig | Proposer) -> str:
    if isinstance(model, Proposer):
        return model.short
    return model.name.split("/")[-1].lower().replace("-instruct", "")


def calibration(gpu: Accelerator, tp: int, target: ModelConfig,
                draft: ModelConfig | Proposer) -> tuple[str, dict[str, Any]]:
    """The calibration document of one pair, and its file stem."""
    hardware_key = f"{tp}x{gpu.key}" if tp > 1 else gpu.key
    name = f"{hardware_key}_{_short(target)}_{_short(draft)}_roofline"
    prefill_flops = gpu.bf16_dense_flops * PREFILL_COMPUTE_EFFICIENCY * tp
    proposer = draft if isinstance(draft, Proposer) else None
    draft_prefill = draft.matmul_params if proposer is None else proposer.prefill_params
    prefill_per_token = 2.0 * (target.matmul_params + draft_prefill) / prefill_flops
    target_steps = step_model(gpu, tp, target, TARGET_STEP_OVERHEAD_S)
    hardware = f"{tp}x {gpu.name}, tensor parallel" if tp > 1 else gpu.name
    drafting = f"a {_short(draft)} draft" if proposer is None else proposer.description
    document: dict[str, Any] = {
        "schema_version": 1,
        "name": name,
        "description": f"{_short(target)} with {drafting} on {hardware}, derived from datasheets (not measured)",
        "provenance": {
            "method": "roofline",
            "hardware": hardware,
            "target_model": target.name,
            "draft_model": draft.name,
            "engine": "vllm",
            "engine_version": "any (engine overheads assumed, see assumptions)",
            "date": DERIVED_ON,
            "created_by": f"scripts/derive_roofline.py (sdplan {__version__})",  # the shipped files' writer
            "dtype": "bfloat16",
            "tensor_parallel_size": tp,
            "assumptions": [
                "step time = memory time + compute time (additive linear bound of the roofline max)",
                f"achieved HBM bandwidth = {MEMORY_EFFICIENCY:.0%} of datasheet; BF16 weights and KV cache",
                f"decode/verify matmuls at {DECODE_COMPUTE_EFFICIENCY:.0%} of dense BF16 peak, "
                f"prefill at {PREFILL_COMPUTE_EFFICIENCY:.0%}",
                f"engine step overhead {TARGET_STEP_OVERHEAD_S * 1e3:g} ms (target), "
                f"{DRAFT_STEP_OVERHEAD_S * 1e3:g} ms per draft step, "
                f"{PER_SEQUENCE_OVERHEAD_S * 1e6:g} us per sequence per step, "
                f"{SD_CYCLE_OVERHEAD_S * 1e3:g} ms per SD cycle",
                "prefill of the draft model is paid with the target's; attention FLOPs and prefix caching are ignored",
                "a concurrent request's prefill delays others by its full prefill compute time (chunked prefill)",
                (f"tensor parallelism: {ALLREDUCE_S * 1e6:g} us per all-reduce, two per layer, "
                 "bandwidth and FLOP/s scale with GPUs"
                 if tp > 1 else "single GPU, no communication"),
                "acceptance is not part of this file: give it per workload (--acceptance)",
            ],
            "sources": [gpu.source, target.source] + ([draft.source] if draft.source != target.source else []),
            "notes": "Replace with a measured calibration ('sdplan calibrate') or a fitted one ('sdplan fit') "
                     "before relying on absolute numbers.",
        },
        "reference_workload": {"prompt_tokens": 1024, "output_tokens": 512},
        "validity": {"prompt_tokens": [128, 8192], "output_tokens": [32, 4096], "batch_size": [1, 256]},
        "step_model": {
            "target": target_steps,
            "draft": (step_model(gpu, tp, draft, DRAFT_STEP_OVERHEAD_S) if not isinstance(draft, Proposer)
                      else proposer_step_model(gpu, tp, draft)),
            "prefill": {
                "fixed_s": target_steps["fixed_s"],
                "per_prompt_token_s": prefill_per_token,
                "load_per_prompt_token_s": prefill_per_token,
            },
            "speculation": {"overhead_fixed_s": SD_CYCLE_OVERHEAD_S, "overhead_per_sequence_s": 0.0},
        },
    }
    if proposer is not None:
        _describe_proposer(document, target, proposer)
    if target.experts:
        expert_stream_s = target.expert_params * target.bytes_per_param / (gpu.hbm_bytes_per_s * MEMORY_EFFICIENCY * tp)
        document["moe"] = {
            "experts_per_token": target.experts_per_token,
            "experts": target.experts,
            "coverage": {"baseline_c1_step_s": expert_stream_s, "c1v_s": expert_stream_s},
        }
        document["provenance"]["assumptions"].insert(
            -1, f"MoE target: step weight traffic = dense part + phi(T) x all {target.experts} experts "
                f"({target.expert_params / 1e9:.1f}B params), "
                f"uniform routing of {target.experts_per_token} experts per token")
        document["step_model"]["prefill"]["fixed_s"] = (
            target_steps["fixed_s"] + expert_stream_s)  # a prompt of p >= 128 tokens touches every expert
    return name, document


def _describe_proposer(document: dict[str, Any], target: ModelConfig, proposer: Proposer) -> None:
    """Method, weights, assumptions and host costs of a proposer calibration (in place)."""
    provenance = document["provenance"]
    provenance["draft_model"] = proposer.name
    order = list(provenance)
    order.insert(order.index("draft_model") + 1, "speculative_method")
    provenance["speculative_method"] = proposer.method
    document["provenance"] = provenance = {key: provenance[key] for key in order}
    if target.bytes_per_param != BYTES_PER_PARAM:
        provenance["dtype"] = "float8 weights, bfloat16 activations and KV cache"
        provenance["assumptions"][1] = (f"achieved HBM bandwidth = {MEMORY_EFFICIENCY:.0%} of datasheet; FP8 weights "
                                        "(1 byte per parameter), BF16 KV cache")
        provenance["assumptions"][2] += " (FP8 matmuls priced at the BF16 peak: conservative)"
    provenance["assumptions"][4:5] = _proposer_assumptions(proposer)
    if proposer.method == "ngram":
        provenance["assumptions"][3] = (f"engine step overhead {TARGET_STEP_OVERHEAD_S * 1e3:g} ms (target), "
                                        f"{PER_SEQUENCE_OVERHEAD_S * 1e6:g} us per sequence per step, "
                                        f"{SD_CYCLE_OVERHEAD_S * 1e3:g} ms per SD cycle; no draft forward passes")
        document["step_model"]["speculation"] = {
            "overhead_fixed_s": SD_CYCLE_OVERHEAD_S + NGRAM_HOST_FIXED_S,
            "overhead_per_sequence_s": NGRAM_HOST_PER_SEQUENCE_S,
        }
