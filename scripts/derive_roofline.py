#!/usr/bin/env python3
"""Derive the shipped roofline calibrations from datasheets and model configs.

Usage::

    python scripts/derive_roofline.py            # rewrite calibrations/*_roofline.toml
    python scripts/derive_roofline.py --out DIR  # write elsewhere (the tests do this)

Nothing here is measured. Each step of a forward pass is costed as
memory time plus compute time (additive, a linear upper bound of the roofline
max), from public figures:

* accelerator: HBM bandwidth and dense BF16 peak from the vendor datasheet;
* model: layer shapes from the model's public ``config.json``.

The output is the per-step form of ``sdplan-calibration(5)``; every
assumption is written into the file's ``provenance.assumptions``.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sdplan import __version__  # noqa: E402
from sdplan.fileio import atomic_write_text, dumps_toml  # noqa: E402

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

    @property
    def _attention(self) -> float:
        return self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2

    @property
    def matmul_params(self) -> float:
        """Parameters multiplied per token: all layers (active experts only) plus the LM head."""
        mlp = 3 * self.hidden * self.intermediate * (self.experts_per_token if self.experts else 1)
        return self.layers * (self._attention + mlp) + self.vocab * self.hidden

    @property
    def expert_params(self) -> float:
        """Parameters of all experts (MoE), streamed in proportion to expert coverage."""
        return self.layers * self.experts * 3 * self.hidden * self.intermediate if self.experts else 0.0

    @property
    def dense_params(self) -> float:
        """Parameters read on every step whatever the routing (attention, router-free parts, LM head)."""
        if not self.experts:
            return self.matmul_params
        return self.layers * self._attention + self.vocab * self.hidden

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * BYTES_PER_PARAM


H100 = Accelerator("h100-sxm", "NVIDIA H100 SXM 80GB", 3.35e12, 989e12, "NVIDIA H100 datasheet: 3.35 TB/s HBM3, 989 TFLOP/s dense BF16")
A100 = Accelerator("a100-sxm-80gb", "NVIDIA A100 SXM 80GB", 2.039e12, 312e12, "NVIDIA A100 datasheet: 2,039 GB/s HBM2e, 312 TFLOP/s dense BF16")
L40S = Accelerator("l40s", "NVIDIA L40S 48GB", 0.864e12, 362e12, "NVIDIA L40S datasheet: 864 GB/s GDDR6, 362 TFLOP/s dense BF16")

LLAMA_8B = ModelConfig("meta-llama/Llama-3.1-8B-Instruct", 4096, 32, 32, 8, 128, 14336, 128256, False, "config.json of meta-llama/Llama-3.1-8B-Instruct")
LLAMA_1B = ModelConfig("meta-llama/Llama-3.2-1B-Instruct", 2048, 16, 32, 8, 64, 8192, 128256, True, "config.json of meta-llama/Llama-3.2-1B-Instruct")
LLAMA_70B = ModelConfig("meta-llama/Llama-3.1-70B-Instruct", 8192, 80, 64, 8, 128, 28672, 128256, False, "config.json of meta-llama/Llama-3.1-70B-Instruct")
QWEN3_14B = ModelConfig("Qwen/Qwen3-14B", 5120, 40, 40, 8, 128, 17408, 151936, False, "config.json of Qwen/Qwen3-14B")
QWEN3_1_7B = ModelConfig("Qwen/Qwen3-1.7B", 2048, 28, 16, 8, 128, 6144, 151936, True, "config.json of Qwen/Qwen3-1.7B")
QWEN3_8B = ModelConfig("Qwen/Qwen3-8B", 4096, 36, 32, 8, 128, 12288, 151936, False, "config.json of Qwen/Qwen3-8B")
QWEN3_0_6B = ModelConfig("Qwen/Qwen3-0.6B", 1024, 28, 16, 8, 128, 3072, 151936, True, "config.json of Qwen/Qwen3-0.6B")
QWEN3_30B_A3B = ModelConfig("Qwen/Qwen3-30B-A3B", 2048, 48, 32, 4, 128, 768, 151936, False,
                            "config.json of Qwen/Qwen3-30B-A3B (128 experts, 8 per token, moe_intermediate_size 768)",
                            experts=128, experts_per_token=8)

#: (accelerator, GPUs per replica, target, draft)
PAIRS = [
    (H100, 1, LLAMA_8B, LLAMA_1B),
    (A100, 1, LLAMA_8B, LLAMA_1B),
    (H100, 4, LLAMA_70B, LLAMA_8B),
    (H100, 1, QWEN3_14B, QWEN3_1_7B),
    (L40S, 1, QWEN3_8B, QWEN3_0_6B),
    (H100, 1, QWEN3_30B_A3B, QWEN3_0_6B),
]


def step_model(gpu: Accelerator, tp: int, model: ModelConfig, overhead_s: float) -> dict[str, float]:
    """Linear step-time model of one forward pass of ``model`` on ``tp`` GPUs."""
    bandwidth = gpu.hbm_bytes_per_s * MEMORY_EFFICIENCY * tp
    compute = gpu.bf16_dense_flops * DECODE_COMPUTE_EFFICIENCY * tp
    allreduce = 2 * model.layers * ALLREDUCE_S if tp > 1 else 0.0
    return {
        "fixed_s": model.dense_params * BYTES_PER_PARAM / bandwidth + overhead_s + allreduce,
        "per_sequence_s": PER_SEQUENCE_OVERHEAD_S,
        "per_query_token_s": 2.0 * model.matmul_params / compute,
        "per_context_token_s": model.kv_bytes_per_token / bandwidth,
    }


def _short(model: ModelConfig) -> str:
    return model.name.split("/")[-1].lower().replace("-instruct", "")


def calibration(gpu: Accelerator, tp: int, target: ModelConfig, draft: ModelConfig) -> tuple[str, dict]:
    """The calibration document of one pair, and its file stem."""
    hardware_key = f"{tp}x{gpu.key}" if tp > 1 else gpu.key
    name = f"{hardware_key}_{_short(target)}_{_short(draft)}_roofline"
    prefill_flops = gpu.bf16_dense_flops * PREFILL_COMPUTE_EFFICIENCY * tp
    prefill_per_token = 2.0 * (target.matmul_params + draft.matmul_params) / prefill_flops
    target_steps = step_model(gpu, tp, target, TARGET_STEP_OVERHEAD_S)
    hardware = f"{tp}x {gpu.name}, tensor parallel" if tp > 1 else gpu.name
    document = {
        "schema_version": 1,
        "name": name,
        "description": f"{_short(target)} with a {_short(draft)} draft on {hardware}, derived from datasheets (not measured)",
        "provenance": {
            "method": "roofline",
            "hardware": hardware,
            "target_model": target.name,
            "draft_model": draft.name,
            "engine": "vllm",
            "engine_version": "any (engine overheads assumed, see assumptions)",
            "date": DERIVED_ON,
            "created_by": f"scripts/derive_roofline.py (sdplan {__version__})",
            "dtype": "bfloat16",
            "tensor_parallel_size": tp,
            "assumptions": [
                "step time = memory time + compute time (additive linear bound of the roofline max)",
                f"achieved HBM bandwidth = {MEMORY_EFFICIENCY:.0%} of datasheet; BF16 weights and KV cache",
                f"decode/verify matmuls at {DECODE_COMPUTE_EFFICIENCY:.0%} of dense BF16 peak, prefill at {PREFILL_COMPUTE_EFFICIENCY:.0%}",
                f"engine step overhead {TARGET_STEP_OVERHEAD_S * 1e3:g} ms (target), {DRAFT_STEP_OVERHEAD_S * 1e3:g} ms per draft step, "
                f"{PER_SEQUENCE_OVERHEAD_S * 1e6:g} us per sequence per step, {SD_CYCLE_OVERHEAD_S * 1e3:g} ms per SD cycle",
                "prefill of the draft model is paid with the target's; attention FLOPs and prefix caching are ignored",
                "a concurrent request's prefill delays others by its full prefill compute time (chunked prefill)",
                (f"tensor parallelism: {ALLREDUCE_S * 1e6:g} us per all-reduce, two per layer, bandwidth and FLOP/s scale with GPUs"
                 if tp > 1 else "single GPU, no communication"),
                "acceptance is not part of this file: give it per workload (--acceptance)",
            ],
            "sources": [gpu.source, target.source, draft.source],
            "notes": "Replace with a measured calibration ('sdplan calibrate') or a fitted one ('sdplan fit') before relying on absolute numbers.",
        },
        "reference_workload": {"prompt_tokens": 1024, "output_tokens": 512},
        "validity": {"prompt_tokens": [128, 8192], "output_tokens": [32, 4096], "batch_size": [1, 256]},
        "step_model": {
            "target": target_steps,
            "draft": step_model(gpu, tp, draft, DRAFT_STEP_OVERHEAD_S),
            "prefill": {
                "fixed_s": target_steps["fixed_s"],
                "per_prompt_token_s": prefill_per_token,
                "load_per_prompt_token_s": prefill_per_token,
            },
            "speculation": {"overhead_fixed_s": SD_CYCLE_OVERHEAD_S, "overhead_per_sequence_s": 0.0},
        },
    }
    if target.experts:
        expert_stream_s = target.expert_params * BYTES_PER_PARAM / (gpu.hbm_bytes_per_s * MEMORY_EFFICIENCY * tp)
        document["moe"] = {
            "experts_per_token": target.experts_per_token,
            "experts": target.experts,
            "coverage": {"baseline_c1_step_s": expert_stream_s, "c1v_s": expert_stream_s},
        }
        document["provenance"]["assumptions"].insert(
            -1, f"MoE target: step weight traffic = dense part + phi(T) x all {target.experts} experts "
                f"({target.expert_params / 1e9:.1f}B params), uniform routing of {target.experts_per_token} experts per token")
        document["step_model"]["prefill"]["fixed_s"] = (
            target_steps["fixed_s"] + expert_stream_s)  # a prompt of p >= 128 tokens touches every expert
    return name, document


def _round(value: object) -> object:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {key: _round(item) for key, item in value.items()}
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "calibrations", help="output folder")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for gpu, tp, target, draft in PAIRS:
        name, document = calibration(gpu, tp, target, draft)
        header = "Derived, not measured: see provenance.assumptions.\nRegenerate with: python scripts/derive_roofline.py"
        atomic_write_text(args.out / f"{name}.toml", dumps_toml(_round(document), header=header))
        print(args.out / f"{name}.toml")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
