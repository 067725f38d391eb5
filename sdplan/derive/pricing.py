"""Step costs priced with AIConfigurator's compiled estimator (``AicEngine``), in seconds.

:class:`Pricer` compiles AIConfigurator's engines for one request and prices
the steps sdplan's per-step form needs (``sdplan-calibration(5)``,
``[step_model]``): target decode and verification at batch ``B`` with ``q``
query tokens per sequence, the draft's own step, prefill per prompt length
and its interference with decode, and the KV cache AIConfigurator's memory
model allows. :class:`Models` gives AIConfigurator the config.json of
architectures it does not ship.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from sdplan.derive.request import (
    ARCHITECTURES,
    EAGLE3_DRAFT_VOCAB,
    GPU_MEMORY_UTILIZATION,
    MODEL_ALIASES,
    MS,
    DeriveRequest,
    aic_version,
    draft_tp,
    quant_modes,
)
from sdplan.errors import InvalidValueError

#: How AIConfigurator's memory model (``estimate_kv_cache``) says the weights and runtime memory fill the GPU.
NO_KV_BUDGET = "no KV budget"


class Models:
    """config.json folders for the architectures AIConfigurator lacks, written once per derivation."""

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="sdplan-derive-")
        self.root = Path(self._folder.name)

    def path(self, name: str, config: dict[str, Any] | None = None) -> str:
        """The model path AIConfigurator reads for ``name`` (its own, an alias, or a folder written here).

        Raises
        ------
        InvalidValueError
            For a name AIConfigurator ships no config for and that is no folder with a config.json: it would
            download the config from Hugging Face, and sdplan derive works offline.
        """
        from aiconfigurator_core.sdk.common import DefaultHFModels

        if config is None and name in ARCHITECTURES:
            config = ARCHITECTURES[name]
        if config is None:
            known = MODEL_ALIASES.get(name, name)
            if known not in DefaultHFModels and not (Path(name) / "config.json").is_file():
                raise InvalidValueError(
                    f"{name}: AIConfigurator {aic_version()} ships no config.json for it and it is not a folder "
                    "with one; give the folder of the model's config.json (sdplan derive works offline)")
            return known
        folder = self.root / name.replace("/", "--")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config, sort_keys=True))
        return str(folder)

    def close(self) -> None:
        self._folder.cleanup()


def shown_path(path: str) -> str:
    """A model path for a file or message: AIConfigurator's name, or the architecture a temporary folder held."""
    return Path(path).name.replace("--", "/") if Path(path).is_absolute() else path


def checkpoint_quant_modes(precision: str, shapes: dict[str, Any]) -> dict[str, str]:
    """AIConfigurator's GEMM and MoE quantisation modes for a ``--precision`` on a target checkpoint.

    Notes
    -----
    :func:`~sdplan.derive.request.quant_modes`, except that an fp8 target whose checkpoint is block-scaled
    (its config.json gives ``quantization_config.weight_block_size``; AIConfigurator's inferred ``quant_algo``
    is then ``fp8_block``) has its experts priced at ``fp8_block``. The engine picks its fused-MoE method from
    the checkpoint's scales: vLLM's ``Fp8MoEMethod`` runs block-scaled experts for such a checkpoint, never the
    per-tensor ModelOpt kernel that AIConfigurator's ``fp8`` MoE rows time (vLLM 0.24.0 database on H200:
    0.19 ms a layer for Qwen3-235B-A22B's experts at one token and two GPUs, three times its bf16 kernel and
    the block-scaled kernel's 0.06 ms). The dense GEMMs keep ``--precision``.
    """
    modes = quant_modes(precision)
    if precision == "fp8" and shapes.get("num_experts") and \
            (shapes.get("raw_config") or {}).get("quant_algo") == "fp8_block":
        modes["moe_quant_mode"] = "fp8_block"
    return modes


def eagle_head_config(target: dict[str, Any]) -> dict[str, Any]:
    """A one-layer decoder pricing an EAGLE/EAGLE-3 head on a target of AIConfigurator's parsed shapes.

    Notes
    -----
    An EAGLE-3 head (Li et al., EAGLE-3, arXiv 2503.01840) is one decoder layer
    with the target's hidden size and heads whose attention reads
    ``[embedding; hidden]`` (``2h`` inputs), an ``fc`` fusing three target
    features (``3h x h``) and a draft-vocabulary LM head. AIConfigurator has no
    such op graph, so it is priced as a one-layer Llama of the target's shapes
    whose MLP is widened by the parameters of the ``fc`` and of the extra QKV
    inputs, ``dI = (3 h^2 + h (n + 2 n_kv) d) / (3 h)``: the same weights
    streamed and multiplied per token.
    """
    hidden, heads, kv_heads = int(target["hidden_size"]), int(target["n"]), int(target["n_kv"])
    head_dim = int(target["d"])
    extra = (3 * hidden * hidden + hidden * (heads + 2 * kv_heads) * head_dim) // (3 * hidden)
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": int(target["inter_size"]) + extra, "num_attention_heads": heads,
            "num_hidden_layers": 1, "num_key_value_heads": kv_heads, "head_dim": head_dim,
            "vocab_size": EAGLE3_DRAFT_VOCAB, "max_position_embeddings": 131072, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16"}


class Pricer:
    """AIConfigurator engines for one request, and the step costs sdplan's model needs (seconds)."""

    def __init__(self, engine: Any, request: DeriveRequest, models: Models) -> None:
        self.engine, self.request = engine, request
        self.version = self._literal_version()
        self.target_path = models.path(request.target_model)
        from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

        shapes = get_model_config_from_model_path(self.target_path)
        self.shapes = shapes
        #: AIConfigurator's quantisation modes for every model priced (:func:`checkpoint_quant_modes`)
        self.quant = checkpoint_quant_modes(request.precision, shapes)
        self.target = self.compile(self.target_path)
        #: (experts per token m, experts per layer M) of an MoE target, None for a dense one
        self.routing = (int(shapes["topk"]), int(shapes["num_experts"])) if shapes.get("num_experts") else None
        self._mtp: dict[int, Any] = {}
        self.draft_path: str | None = None
        self.draft: Any = None
        if request.method == "draft_model":
            self.draft_path = models.path(str(request.draft_model))
            self.draft = self.compile(self.draft_path, tp=draft_tp(request))
        elif request.method in ("eagle", "eagle3"):
            head = eagle_head_config(shapes)
            self.draft_path = models.path(f"{request.draft_model}--priced-head", head)
            self.draft = self.compile(self.draft_path)

    def _literal_version(self) -> str:
        from aiconfigurator_core.sdk import perf_database

        requested = self.request.backend_version or "current"
        return str(perf_database.resolve_query_version(self.request.system, self.request.backend, requested))

    def compile(self, path: str, nextn: int = 0, tp: int | None = None) -> Any:
        request = self.request
        tp = tp or request.tensor_parallel_size
        return self.engine.EngineHandle.compile(
            path, request.system, request.backend, backend_version=self.version, tp_size=tp,
            moe_tp_size=tp, moe_ep_size=1, nextn=nextn, **self.quant)

    def mtp(self, k: int) -> Any:
        if k not in self._mtp:
            self._mtp[k] = self.compile(self.target_path, nextn=k)
        return self._mtp[k]

    @staticmethod
    def decode(handle: Any, rows: int, context: int) -> float:
        """One decode step over ``rows`` single-token rows at mean context ``context``, seconds."""
        return float(handle.decode_step_latency(int(rows), max(int(context) - 2, 1), 2)) * MS

    @staticmethod
    def split(handle: Any, rows: int, context: int) -> tuple[float, float]:
        """A decode step's attention ops and all its other ops, seconds (AIConfigurator's per-op values)."""
        attention = other = 0.0
        for name, latency_ms, *_ in handle.decode_step_per_op(int(rows), max(int(context) - 2, 1), 2):
            if "attention" in name or "mla" in name:
                attention += float(latency_ms) * MS
            else:
                other += float(latency_ms) * MS
        return attention, other

    def verify(self, batch: int, query: int, context: int) -> float:
        """Target step over ``batch`` sequences of ``query`` tokens each, seconds.

        Notes
        -----
        Every op but attention is AIConfigurator's at ``batch x query`` token
        rows (the rows its MTP verification prices); attention is its decode
        attention of ``batch`` sequences at ``context``: a verification step
        reads each sequence's KV cache once for its ``query`` tokens, as the
        multi-query attention kernels of vLLM's speculative decoding do, where
        pricing ``batch x query`` single-token rows would read it ``query``
        times. With ``query = 1`` this is AIConfigurator's decode step.
        """
        if query == 1:
            return self.decode(self.target, batch, context)
        attention, _ = self.split(self.target, batch, context)
        _, other = self.split(self.target, batch * query, context)
        return attention + other

    def draft_step(self, batch: int, context: int, k: int) -> float:
        """One draft token's step for ``batch`` sequences; MTP from AIConfigurator's nextn = k step."""
        if self.request.method == "mtp":
            whole = self.decode(self.mtp(k), batch, context)
            return max((whole - self.decode(self.target, batch * (k + 1), context)) / k, 0.0)
        return self.decode(self.draft, batch, context) if self.draft is not None else 0.0

    def prefill(self, prompt: int) -> float:
        """Own prefill of one prompt (target and, for a draft LM or head, the proposer), seconds."""
        total = float(self.target.predict_prefill_latency(1, int(prompt))) * MS
        if self.draft is not None:
            total += float(self.draft.predict_prefill_latency(1, int(prompt))) * MS
        return total

    def interference(self, prompt: int, batch: int, context: int) -> float:
        """Seconds a prompt's prefill adds to a decode step of ``batch`` sequences (chunked prefill)."""
        def delta(handle: Any) -> float:  # its decode rows sit at isl + osl/2: the decode step's context
            mixed = float(handle.mixed_step_latency(int(prompt), int(batch), int(prompt),
                                                    max(2 * (int(context) - int(prompt)), 2)))
            return max(mixed * MS - self.decode(handle, batch, context), 0.0)

        return delta(self.target) + (delta(self.draft) if self.draft is not None else 0.0)

    def row_compute_floor_s(self) -> float:
        """Seconds the matrix units need per token row of a target step, at the GPU's peak: ``2 P / (TP F)``.

        ``P`` is the dense target's matmul weights per token (attention projections, MLP and LM head, from its
        shapes), ``F`` the GPU's peak tensor FLOP/s at the request's precision (AIConfigurator's system file,
        ``bfloat16_tc_flops`` or ``fp8_tc_flops``). No step of more rows can cost less per further row: the
        floor :func:`~sdplan.derive.fitting.fit_knee` holds the slope past the knee to. 0 for an MoE target
        (its rows spread over experts) or a GPU whose file gives no peak.
        """
        import aiconfigurator_core
        import yaml

        shapes = self.shapes
        if shapes.get("num_experts"):
            return 0.0
        hidden, heads, kv_heads, head = (int(shapes[key]) for key in ("hidden_size", "n", "n_kv", "d"))
        per_layer = (hidden * (heads + 2 * kv_heads) * head + heads * head * hidden
                     + 3 * hidden * int(shapes["inter_size"]))
        weights = int(shapes["layers"]) * per_layer + int(shapes["vocab"]) * hidden
        system = Path(aiconfigurator_core.__file__).parent / "systems" / f"{self.request.system}.yaml"
        gpu = yaml.safe_load(system.read_text()).get("gpu", {}) if system.is_file() else {}
        peak = gpu.get("fp8_tc_flops" if self.request.precision.startswith("fp8") else "bfloat16_tc_flops")
        return 2.0 * weights / (self.request.tensor_parallel_size * float(peak)) if peak else 0.0

    def _kv_estimate(self, path: str, tp: int) -> dict[str, Any] | None:
        """AIConfigurator's memory model for one model on ``tp`` GPUs (None where it cannot say).

        Raises
        ------
        InvalidValueError
            Where the model says the weights and runtime memory leave no KV cache: the model does not fit
            these GPUs at this tensor parallelism, and no step of it can be served (Qwen3-235B-A22B-FP8 on
            one H200: 242 GB of non-KV memory against 151 GB).
        """
        from aiconfigurator_core.sdk.memory import estimate_kv_cache

        quant = self.quant
        try:
            return estimate_kv_cache(
                path, self.request.system, self.request.backend, self.version,
                max_num_tokens=8192, max_batch_size=self.request.max_num_seqs, memory_fraction_kind="of_total",
                memory_fraction_value=GPU_MEMORY_UTILIZATION, tp_size=tp, moe_tp_size=tp, moe_ep_size=1,
                gemm_quant_mode=quant["gemm_quant_mode"], moe_quant_mode=quant["moe_quant_mode"])
        except ValueError as error:
            if str(error).startswith(NO_KV_BUDGET):
                raise InvalidValueError(
                    f"{shown_path(path)} does not fit {tp}x {self.request.system} at {self.request.precision}: "
                    f"AIConfigurator's memory model leaves no KV cache ({str(error).splitlines()[0]}); "
                    "raise --tp") from None
            return None
        except (KeyError, TypeError, AttributeError):
            return None

    def kv_cache_tokens_without_draft(self) -> int | None:
        """Tokens of KV cache AIConfigurator's memory model gives the target alone (no SD: no draft loaded)."""
        target = self._kv_estimate(self.target_path, self.request.tensor_parallel_size)
        if target is None:
            return None
        free, per_token = float(target["total_kv_size_bytes"]), kv_bytes_per_token(target)
        return max(int(free / per_token), 0) if per_token > 0 else None

    def kv_cache_tokens(self) -> int | None:
        """Tokens of KV cache AIConfigurator's memory model gives the target (the draft's weights and KV taken out)."""
        target = self._kv_estimate(self.target_path, self.request.tensor_parallel_size)
        if target is None:
            return None
        free, per_token = float(target["total_kv_size_bytes"]), kv_bytes_per_token(target)
        if self.draft_path is not None:
            draft = self._kv_estimate(self.draft_path, draft_tp(self.request))
            if draft is not None:  # a draft on fewer GPUs loads its weights and KV onto those: as much per GPU
                free -= float(draft["memory_breakdown"]["weights_bytes"])
                per_token += kv_bytes_per_token(draft)
        return max(int(free / per_token), 0) if per_token > 0 else None


def kv_bytes_per_token(estimate: dict[str, Any]) -> float:
    """Bytes of KV cache one token of context takes, from AIConfigurator's memory model (``estimate_kv_cache``).

    Its ``kv_size_per_token_bytes``, unless its own count of the tokens that fit, ``total_kv_size_tokens``,
    says otherwise: for a hybrid model whose linear-attention layers keep a fixed recurrent state per
    sequence (Qwen3.5's Gated DeltaNet), ``kv_size_per_token_bytes`` holds that state of one whole sequence
    (24 MB per GPU for Qwen3.5-397B-A17B on 8 GPUs, against 15 KB of attention KV per token), and dividing
    the free bytes by it gives 4,910 tokens where AIConfigurator itself counts 7.7 million. Then the bytes
    per token are the free bytes over its count. For every other model its count is the free bytes over
    ``kv_size_per_token_bytes``, rounded down, and that value is kept unchanged.
    """
    free, per_token = float(estimate["total_kv_size_bytes"]), float(estimate["kv_size_per_token_bytes"])
    counted = estimate.get("total_kv_size_tokens")
    if per_token > 0 and counted and int(counted) != int(free / per_token):
        return free / float(counted)
    return per_token
