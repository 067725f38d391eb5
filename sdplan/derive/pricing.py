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

import functools
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdplan.derive.request import (
    ARCHITECTURES,
    EAGLE3_DRAFT_VOCAB,
    MODEL_ALIASES,
    MS,
    PEAK_FLOPS_KEYS,
    WEIGHT_BYTES,
    DeriveRequest,
    ModelName,
    aic_version,
    draft_precision,
    draft_tp,
    quant_modes,
    resolve_model_name,
)
from sdplan.errors import InvalidValueError
from sdplan.inputs.serving import kv_memory_share

#: How AIConfigurator's memory model (``estimate_kv_cache``) says the weights and runtime memory fill the GPU.
NO_KV_BUDGET = "no KV budget"
#: Token rows at which a GEMM's database time gives its rate of computing (:func:`gemm_ceilings`): the engine's
#: step budget (vLLM's default ``max_num_batched_tokens`` on these GPUs), where every GEMM of a dense model
#: of 1B parameters or more is bound by its FLOPs, not by reading its weights.
COMPUTE_BOUND_ROWS = 8192
#: Bytes of an activation element (bfloat16) read and written by a GEMM, whatever its weights' precision.
ACTIVATION_BYTES = 2


def decode_step(handle: Any, rows: int, context: int) -> float:
    """One decode step over ``rows`` single-token rows at mean context ``context``, seconds (AIConfigurator's)."""
    return float(handle.decode_step_latency(int(rows), max(int(context) - 2, 1), 2)) * MS


def gpu_spec(system: str) -> dict[str, Any]:
    """The ``gpu`` table of AIConfigurator's system file for ``system`` (empty where it ships none)."""
    import aiconfigurator_core
    import yaml

    path = Path(aiconfigurator_core.__file__).parent / "systems" / f"{system}.yaml"
    return dict(yaml.safe_load(path.read_text()).get("gpu", {})) if path.is_file() else {}


@dataclass(frozen=True, slots=True)
class GemmCeiling:
    """The most one GEMM op of a step may cost at ``rows`` token rows (:func:`gemm_ceilings`), in seconds.

    Attributes
    ----------
    stream_s : float
        Reading the op's weights once, in every layer it runs in, at the GPU's empirical bandwidth, with the
        fixed latency of a memory-bound op.
    per_row_s : float
        What each token row adds: its activations in and out at that bandwidth, and its FLOPs at the rate
        the database itself times for the op when bound by compute.
    """

    stream_s: float
    per_row_s: float

    def at(self, rows: int) -> float:
        return self.stream_s + rows * self.per_row_s


def dense_gemm_shapes(shapes: dict[str, Any], tp: int, weight_bytes: float) -> dict[str, tuple[int, int, int, float]]:
    """``op name -> (layers, N, K, bytes per weight)`` of a dense decoder's decode-step GEMMs on one of ``tp`` GPUs.

    As AIConfigurator's dense decoder builds them (``sdk/models/llama.py``, which Llama, Qwen2 and Qwen3 use):
    the fused QKV projection, the attention output projection, the fused gate/up projection, the down
    projection, each once a layer, and the LM head once a step, always in bfloat16.
    """
    hidden, heads, kv_heads, head = (int(shapes[key]) for key in ("hidden_size", "n", "n_kv", "d"))
    layers, inter, vocab = int(shapes["layers"]), int(shapes["inter_size"]), int(shapes["vocab"])
    kv_per_gpu = -(-kv_heads // tp)
    return {
        "generation_qkv_gemm": (layers, heads * head // tp + 2 * head * kv_per_gpu, hidden, weight_bytes),
        "generation_proj_gemm": (layers, hidden, heads * head // tp, weight_bytes),
        "generation_gate_ffn1_gemm": (layers, 2 * inter // tp, hidden, weight_bytes),
        "generation_ffn2_gemm": (layers, hidden, inter // tp, weight_bytes),
        "generation_logits_gemm": (1, vocab // tp, hidden, 2.0),
    }


def gemm_ceilings(gemms: dict[str, tuple[int, int, int, float]], gpu: dict[str, Any],
                  compute_bound_s: dict[str, float]) -> dict[str, GemmCeiling]:
    """The most each GEMM op may cost: reading its weights, then computing its rows, one after the other.

    Parameters
    ----------
    gemms : dict
        ``op name -> (layers, N, K, bytes per weight)`` (:func:`dense_gemm_shapes`).
    gpu : dict
        AIConfigurator's system file ``gpu`` table (:func:`gpu_spec`).
    compute_bound_s : dict
        ``op name ->`` its database time at :data:`COMPUTE_BOUND_ROWS` rows, seconds.

    Notes
    -----
    For an op run ``L`` times a step with an ``N x K`` weight of ``b_w`` bytes per element, at ``m`` rows::

        T_max(m) = L [(N K b_w + 2 m (N + K)) / (f B) + c] + m T_db(M) / M

    with ``B`` the GPU's memory bandwidth, ``f`` and ``c`` AIConfigurator's own empirical correction of it
    (``mem_bw_empirical_scaling_factor`` 0.8 and ``mem_empirical_constant_latency`` 3 us in its H100, H200
    and B200 system files) and ``T_db(M)`` the database's time for the op at ``M`` rows, bound by compute.
    A kernel that did not overlap reading its weights with computing would take this sum; the engine's
    kernels overlap them (the roofline is the larger of the two terms, not their sum), so no GEMM of a
    served step costs more. Where the database's small-batch timings exceed it, they time noise or a kernel
    the engine does not pick at that size: AIConfigurator's vLLM 0.24.0 database prices Llama-3.1-70B's fp8
    GEMMs on B200 at 2-3 times their weight-streaming time at small batch (``benchmarks/RESULTS-accuracy-
    silicon-2026-11.md``, "Derive's MoE and dense pricing"). Empty where the system file gives no bandwidth.
    """
    bandwidth = float(gpu.get("mem_bw") or 0.0) * float(gpu.get("mem_bw_empirical_scaling_factor", 1.0))
    if bandwidth <= 0.0:
        return {}
    latency = float(gpu.get("mem_empirical_constant_latency", 0.0))
    ceilings = {}
    for name, (layers, n, k, weight_bytes) in gemms.items():
        if name not in compute_bound_s:
            continue
        stream = layers * (n * k * weight_bytes / bandwidth + latency)
        per_row = layers * ACTIVATION_BYTES * (n + k) / bandwidth + compute_bound_s[name] / COMPUTE_BOUND_ROWS
        ceilings[name] = GemmCeiling(stream_s=stream, per_row_s=per_row)
    return ceilings


class StepBound:
    """A compiled model's step with its GEMMs held to their ceilings (:func:`gemm_ceilings`).

    :meth:`excess` is what the database's GEMMs at ``rows`` token rows cost above their ceilings, summed:
    subtracted from any step whose GEMMs run on those rows. No ceilings for a mixture of experts (its rows
    spread over experts whose weights a step reads in part) or a GPU whose system file gives no bandwidth.
    """

    def __init__(self, handle: Any, shapes: dict[str, Any], tp: int, quant: dict[str, str],
                 gpu: dict[str, Any]) -> None:
        self.handle = handle
        self.ceilings: dict[str, GemmCeiling] = {}
        #: Seconds the target's GEMMs take per token row at the database's own compute-bound rate (its timings
        #: at :data:`COMPUTE_BOUND_ROWS` rows over those rows); 0 for an MoE target
        self.gemm_row_s = 0.0
        if not shapes.get("num_experts"):
            gemms = dense_gemm_shapes(shapes, tp, WEIGHT_BYTES[quant["gemm_quant_mode"]])
            at_budget = {name: float(latency_ms) * MS for name, latency_ms, *_ in self._ops(COMPUTE_BOUND_ROWS)}
            compute_bound = {name: at_budget[name] for name in gemms if name in at_budget}
            self.ceilings = gemm_ceilings(gemms, gpu, compute_bound)
            self.gemm_row_s = sum(compute_bound.values()) / COMPUTE_BOUND_ROWS
        self._excess: dict[int, float] = {}

    def _ops(self, rows: int) -> list[tuple[Any, ...]]:
        # a GEMM's time does not depend on the attention context; the shortest one priced is asked for
        return list(self.handle.decode_step_per_op(int(rows), 254, 2))

    def decode(self, rows: int, context: int) -> float:
        """One decode step of ``rows`` sequences at mean context ``context`` (:func:`decode_step`), held."""
        return decode_step(self.handle, rows, context) - self.excess(rows)

    def excess(self, rows: int) -> float:
        """Seconds the database's GEMMs at ``rows`` token rows cost above their ceilings (0 where none binds)."""
        rows = int(rows)
        if rows not in self._excess:
            total = 0.0
            for name, latency_ms, *_ in self._ops(rows) if self.ceilings else []:
                ceiling = self.ceilings.get(name)
                if ceiling is not None:
                    total += max(float(latency_ms) * MS - ceiling.at(rows), 0.0)
            self._excess[rows] = total
        return self._excess[rows]


@functools.cache
def known_model_names() -> frozenset[str]:
    """The model names derive prices from files at hand: AIConfigurator's model list and packaged config.json
    files, :data:`ARCHITECTURES` and the :data:`MODEL_ALIASES` names."""
    from importlib import resources

    from aiconfigurator_core.sdk.common import DefaultHFModels

    folder = resources.files("aiconfigurator_core") / "model_configs"
    packaged = {entry.name.removesuffix("_config.json").replace("--", "/") for entry in folder.iterdir()
                if entry.name.endswith("_config.json") and not entry.name.endswith("_hf_quant_config.json")}
    return frozenset(DefaultHFModels) | packaged | set(ARCHITECTURES) | set(MODEL_ALIASES)


def priced_model_name(name: str, precision: str | None = None, option: str = "--precision") -> ModelName:
    """The name ``name`` is priced under (:func:`sdplan.derive.request.resolve_model_name` over
    :func:`known_model_names`), with the assumption that says so; a folder with a config.json is priced as itself.

    Raises
    ------
    InvalidValueError
        Where no rule finds one (sdplan derive works offline and does not download a config), or a quantised
        checkpoint's name rules out ``precision``.
    """
    if (Path(name) / "config.json").is_file():
        return ModelName(name)
    resolved = resolve_model_name(name, known_model_names(), precision, option)
    if resolved is None:
        raise InvalidValueError(
            f"{name}: AIConfigurator {aic_version()} ships no config.json for it and it is not a folder with one; "
            "give the folder of the model's config.json (sdplan derive works offline)")
    return resolved


def shipped_config_files(name: str) -> list[tuple[Any, str]]:
    """AIConfigurator's packaged ``config.json`` (and ``hf_quant_config.json``) of a model name, with the file
    names a model folder gives them; empty where the package ships none."""
    from importlib import resources

    stem = name.replace("/", "--")
    folder = resources.files("aiconfigurator_core") / "model_configs"
    files = [(folder / f"{stem}_config.json", "config.json"),
             (folder / f"{stem}_hf_quant_config.json", "hf_quant_config.json")]
    found = [(source, target) for source, target in files if source.is_file()]
    return found if found and found[0][1] == "config.json" else []


#: config.json keys that declare a model's own multi-token-prediction layers (DeepSeek, GLM, MiMo, Nemotron:
#: ``num_nextn_predict_layers``; Qwen3.5: ``mtp_num_hidden_layers``; MiniMax: ``num_mtp_modules``), at its top level
#: or in its ``text_config``.
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules", "mtp_transformer_layers")


def model_config_json(name: str) -> dict[str, Any] | None:
    """The config.json a model name is priced from: sdplan's own table, a folder's, or AIConfigurator's packaged
    one; None where none of these is at hand (nothing to read it from offline)."""
    folder = Path(name) / "config.json"
    if folder.is_file():
        loaded: dict[str, Any] = json.loads(folder.read_text())
        return loaded
    resolved = resolve_model_name(name, known_model_names())
    if resolved is None:
        return None
    if resolved.name in ARCHITECTURES:
        return ARCHITECTURES[resolved.name]
    shipped = shipped_config_files(resolved.name)
    return json.loads(shipped[0][0].read_text()) if shipped else None


def has_mtp_layers(config: dict[str, Any]) -> bool:
    """Whether a config.json declares MTP layers (:data:`MTP_LAYER_KEYS` above 0): the only layers vLLM's and
    SGLang's MTP proposers draft with."""
    for scope in (config, config.get("text_config") or {}):
        if any(isinstance(scope.get(key), int) and scope[key] > 0 for key in MTP_LAYER_KEYS):
            return True
    return False


def per_query_context(config: dict[str, Any]) -> int | None:
    """Tokens of context each query token of an attention block reads on its own, or None for a bare kernel.

    AIConfigurator's multi-head latent attention op (MLA: a ``kv_lora_rank`` in config.json, at its top level or
    in its ``text_config``) is a block: its query, latent and output projections run on every token row, and only
    its kernel's read of the cached latents is shared by the query tokens of one sequence, so 1 token. DeepSeek
    sparse attention (DSA: an ``index_topk`` as well, DeepSeek-V3.2 and GLM-5) has each query token select and
    read its own ``index_topk`` cached entries; only the indexer's scan of the rest of the context is shared. A
    model with neither prices attention as a bare kernel (its projections are ops of their own), whose cache read
    a sequence's query tokens share whole. :meth:`Pricer.verify` prices the block so.
    """
    for scope in (config, config.get("text_config") or {}):
        if isinstance(scope.get("kv_lora_rank"), int) and scope["kv_lora_rank"] > 0:
            topk = scope.get("index_topk")
            return int(topk) if isinstance(topk, int) and topk > 0 else 1
    return None


class Models:
    """config.json folders for the architectures AIConfigurator lacks, written once per derivation."""

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="sdplan-derive-")
        self.root = Path(self._folder.name)

    def path(self, name: str, config: dict[str, Any] | None = None) -> str:
        """The model path AIConfigurator reads for ``name``, a name :func:`priced_model_name` gives (AIConfigurator's
        own, a folder with a config.json, or one of :data:`ARCHITECTURES`, written here), or ``config`` written here.

        Raises
        ------
        InvalidValueError
            For a name AIConfigurator ships no config for and that is no folder with a config.json: it would
            download the config from Hugging Face, and sdplan derive works offline.
        """
        from aiconfigurator_core.sdk.common import DefaultHFModels

        if config is None:
            config = ARCHITECTURES.get(name)
        if config is None:
            shipped = shipped_config_files(name)
            if name not in DefaultHFModels and shipped:
                # a config AIConfigurator ships but no longer lists (Mixtral): its own files, as a local folder
                folder = self.root / name.replace("/", "--")
                folder.mkdir(parents=True, exist_ok=True)
                for source, target in shipped:
                    (folder / target).write_bytes(source.read_bytes())
                return str(folder)
            return name
        folder = self.root / name.replace("/", "--")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config, sort_keys=True))
        return str(folder)

    def close(self) -> None:
        self._folder.cleanup()


def shown_path(path: str) -> str:
    """A model path for a file or message: AIConfigurator's name, or the architecture a temporary folder held."""
    return Path(path).name.replace("--", "/") if Path(path).is_absolute() else path


#: AIConfigurator's MoE mode for experts a checkpoint ships in MXFP4 (:func:`checkpoint_quant_modes`).
MXFP4_EXPERTS = "w4a16_mxfp4"


def checkpoint_quant_modes(precision: str, shapes: dict[str, Any], backend: str = "vllm") -> dict[str, str]:
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

    vLLM quantises an unquantised MoE checkpoint served at fp8 (``--quantization fp8``; no ``quant_algo``
    in its config.json) online, with the same ``Fp8MoEMethod`` as a block-scaled one: its experts are priced
    at ``fp8_block`` too, the rows AIConfigurator 0.12.0's vLLM databases time for that method
    (``kernel_source`` ``vllm_fp8moe_*``), where its ``fp8`` rows time ModelOpt's method
    (``vllm_modeloptfp8moe_*``), which only a ModelOpt checkpoint loads. Other engines keep ``--precision``.

    An MoE checkpoint whose experts ship in MXFP4 (gpt-oss: ``quantization_config.quant_method = mxfp4``,
    attention, router, embeddings and LM head left in bfloat16) has its experts priced at AIConfigurator's
    ``w4a16_mxfp4``, 4-bit weights with 16-bit activations, whatever ``--precision`` says: the engine loads
    the checkpoint's 4-bit experts (vLLM's ``Mxfp4MoEMethod``) and no other kind; its dense GEMMs keep
    ``--precision`` (bf16 for such a checkpoint).
    """
    modes = quant_modes(precision)
    checkpoint = (shapes.get("raw_config") or {}).get("quant_algo")
    if shapes.get("num_experts") and checkpoint == "mxfp4":
        modes["moe_quant_mode"] = MXFP4_EXPERTS
    elif precision == "fp8" and shapes.get("num_experts") and (
            checkpoint == "fp8_block" or (checkpoint is None and backend == "vllm")):
        modes["moe_quant_mode"] = "fp8_block"
    return modes


def kv_cache_dtype(requested: str, shapes: dict[str, Any]) -> str:
    """The KV cache's dtype, ``bf16`` or ``fp8``, that ``--kv-cache-dtype requested`` serves a checkpoint with.

    Notes
    -----
    ``auto`` is vLLM's default, which follows the checkpoint: an fp8 cache where the checkpoint declares one
    (ModelOpt's ``kv_cache_quant_algo``, or a compressed-tensors ``kv_cache_scheme``; AIConfigurator reads both
    into its ``kv_cache_quant_algo``), otherwise the model's own dtype, bfloat16 (vLLM pull request 29980,
    "Load kv-cache dtype from hf_quant_config.json automatically"; SGLang and TensorRT-LLM read the same
    declaration). Fp8 weights alone do not make an fp8 cache: DeepSeek-V3's block-scaled checkpoint is served
    with a bfloat16 cache unless ``--kv-cache-dtype fp8`` is given. AIConfigurator left to itself prices an fp8
    cache for every fp8 or nvfp4 checkpoint, which halves the cache's bytes a token and doubles the requests
    a derived file says its cache holds.
    """
    if requested != "auto":
        return requested
    declared = (shapes.get("raw_config") or {}).get("kv_cache_quant_algo")
    return "fp8" if str(declared).lower() == "fp8" else "bf16"


def kv_cache_modes(dtype: str) -> dict[str, str]:
    """AIConfigurator's KV-cache (and, for a bfloat16 cache, attention) quantisation modes for a cache dtype.

    An fp8 cache leaves the attention kernel's mode to AIConfigurator, which takes it per engine (vLLM's
    tables time bfloat16 attention over an fp8 cache); a bfloat16 cache is read by bfloat16 attention.
    """
    if dtype == "fp8":
        return {"kvcache_quant_mode": "fp8"}
    return {"kvcache_quant_mode": "bfloat16", "fmha_quant_mode": "bfloat16"}


#: Head sizes every AIConfigurator 0.12.0 decode-attention table holds (vLLM 0.24.0 on GB200: 64, 128, 192,
#: 256 and 512; SGLang and TensorRT-LLM: 64 and 128 at least).
TIMED_HEAD_DIMS = (64, 128)
#: The head size an EAGLE head's attention is priced at where the target's is not in :data:`TIMED_HEAD_DIMS`.
HEAD_ATTENTION_DIM = 128


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

    A target whose head size is not one AIConfigurator times attention at (an MLA target's ``d`` is its
    hidden size over its heads: 112 for Kimi-K2, 56 for DeepSeek-V3) has its head's attention priced at
    :data:`HEAD_ATTENTION_DIM` with as many heads as keep the query width ``n d``; the head's GEMMs keep
    their widths. Its KV reads are then those of plain multi-head attention, more than MLA's compressed
    cache: a bound on the side of a dearer draft.
    """
    hidden, heads, kv_heads = int(target["hidden_size"]), int(target["n"]), int(target["n_kv"])
    head_dim = int(target["d"])
    if head_dim not in TIMED_HEAD_DIMS:
        width = heads * head_dim
        kv_heads = max(1, round(kv_heads * head_dim / HEAD_ATTENTION_DIM))
        heads, head_dim = max(1, round(width / HEAD_ATTENTION_DIM)), HEAD_ATTENTION_DIM
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
        #: the names the target (and a draft model) are priced under, with the assumptions that say so
        self.target_name = priced_model_name(request.target_model, request.precision)
        self.draft_name = priced_model_name(str(request.draft_model), request.draft_precision or "bf16",
                                            "--draft-precision") if request.method == "draft_model" else None
        self.target_path = models.path(self.target_name.name)
        config = model_config_json(request.target_model) if request.method == "mtp" else None
        if config is not None and not has_mtp_layers(config):
            raise InvalidValueError(
                f"--method mtp: {request.target_model}'s config.json declares no MTP layers "
                f"({', '.join(MTP_LAYER_KEYS)}), and MTP drafts only with the target's own; choose --method eagle3, "
                "draft_model or ngram")
        from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

        shapes = get_model_config_from_model_path(self.target_path)
        self.shapes = shapes
        #: the context each query token of the target's attention reads on its own (:func:`per_query_context`)
        self.query_context = per_query_context(shapes.get("raw_config") or {})
        #: the KV cache's dtype (:func:`kv_cache_dtype`): one cache serves the target and its draft
        self.kv_cache_dtype = kv_cache_dtype(request.kv_cache_dtype, shapes)
        kv_modes = kv_cache_modes(self.kv_cache_dtype)
        #: AIConfigurator's quantisation modes for every model priced (:func:`checkpoint_quant_modes`)
        self.quant = checkpoint_quant_modes(request.precision, shapes, request.backend) | kv_modes
        self.target = self.compile(self.target_path)
        #: (experts per token m, experts per layer M) of an MoE target, None for a dense one
        self.routing = (int(shapes["topk"]), int(shapes["num_experts"])) if shapes.get("num_experts") else None
        #: the target's steps with a dense target's GEMMs held to what reading their weights and computing
        #: their rows needs (:class:`StepBound`). A draft's steps keep the database's price: the measured rows
        #: that check the rule time targets only, and a small draft's GEMMs (hidden size 1,024-2,048) have too
        #: few output tiles to read at 80% of the bandwidth the ceiling assumes.
        #: AIConfigurator's system file ``gpu`` table: bandwidth for the GEMM ceilings, peak for the row floor
        self.gpu = gpu_spec(request.system)
        self.target_bound = StepBound(self.target, shapes, request.tensor_parallel_size, self.quant, self.gpu)
        self._mtp: dict[int, Any] = {}
        self.draft_path: str | None = models.path(self.draft_name.name) if self.draft_name is not None else None
        draft_shapes = get_model_config_from_model_path(self.draft_path) if self.draft_path is not None else None
        self.draft: Any = None
        #: the precision the draft runs at and AIConfigurator's modes for it (:func:`draft_precision`): its own
        #: checkpoint's, not the target's; MTP layers are the target's
        self.draft_precision = draft_precision(request, draft_shapes)
        self.draft_quant = self.quant
        if self.draft_path is not None and draft_shapes is not None:
            self.draft_quant = checkpoint_quant_modes(self.draft_precision, draft_shapes, request.backend) | kv_modes
            self.draft = self.compile(self.draft_path, tp=draft_tp(request), quant=self.draft_quant)
        elif request.method in ("eagle", "eagle3"):
            head = eagle_head_config(shapes)
            self.draft_path = models.path(f"{request.draft_model}--priced-head", head)
            self.draft_quant = quant_modes(self.draft_precision) | kv_modes
            self.draft = self.compile(self.draft_path, quant=self.draft_quant)

    def _literal_version(self) -> str:
        from aiconfigurator_core.sdk import perf_database

        requested = self.request.backend_version or "current"
        return str(perf_database.resolve_query_version(self.request.system, self.request.backend, requested))

    def compile(self, path: str, nextn: int = 0, tp: int | None = None, quant: dict[str, str] | None = None) -> Any:
        """AIConfigurator's engine for a model on ``tp`` GPUs (the target's) at ``quant`` (the target's modes)."""
        request = self.request
        tp = tp or request.tensor_parallel_size
        return self.engine.EngineHandle.compile(
            path, request.system, request.backend, backend_version=self.version, tp_size=tp,
            moe_tp_size=tp, moe_ep_size=1, nextn=nextn, **(quant or self.quant))

    def mtp(self, k: int) -> Any:
        if k not in self._mtp:
            self._mtp[k] = self.compile(self.target_path, nextn=k)
        return self._mtp[k]

    #: One decode step over ``rows`` single-token rows at mean context ``context``, seconds (:func:`decode_step`).
    decode = staticmethod(decode_step)

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
        times. An attention block that carries its projections (MLA, DSA:
        :func:`per_query_context`, ``c`` tokens each query reads on its own) is
        priced as the part at context ``c0 = min(context, c)`` on every row and
        the rest of the context once a sequence,

            A(B q, c0) + A(B, s) - A(B, c0),

        with ``A(rows, s)`` AIConfigurator's attention op and ``A(B q, c0) - A(B, c0)`` at least 0 (TensorRT-LLM's
        MLA op for DeepSeek-R1 at fp8 on 8 H200s times 32 sequences at ``c0 = 1`` at 70 ms and 64 at 5 ms: taken
        as it stands, a verification of 2 tokens for 32 sequences cost -33 ms). With ``query = 1``
        this is AIConfigurator's decode step. A dense target's GEMMs cost at
        most their ceilings at ``batch x query`` rows (:class:`StepBound`).
        """
        if query == 1:
            return self.target_decode(batch, context)
        attention, _ = self.split(self.target, batch, context)
        on_rows, other = self.split(self.target, batch * query, context)
        if self.query_context is not None:
            if self.query_context >= context:  # c0 = s: the whole block on every row
                attention = on_rows
            else:  # more rows never cost less: a database whose op is not monotone in its rows adds nothing
                own = self.query_context
                attention += max(self.split(self.target, batch * query, own)[0]
                                 - self.split(self.target, batch, own)[0], 0.0)
        return attention + other - self.target_bound.excess(batch * query)

    def target_decode(self, rows: int, context: int) -> float:
        """The target's decode step (:meth:`decode`) with its GEMMs held to their ceilings, seconds."""
        return self.target_bound.decode(rows, context)

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
        """Seconds a prompt's prefill adds to a decode step of ``batch`` sequences (chunked prefill).

        AIConfigurator's mixed step (the prompt's tokens and ``batch`` decode rows in one step) less its decode
        step, for the target and a proposer that runs a model. The target's GEMMs are held to their ceilings in
        both steps (:class:`StepBound`), the mixed step's at ``prompt + batch`` rows: a decode step priced above
        its ceiling would otherwise shrink the prefill's share by as much.
        """
        def mixed(handle: Any) -> float:  # its decode rows sit at isl + osl/2: the decode step's context
            return float(handle.mixed_step_latency(int(prompt), int(batch), int(prompt),
                                                   max(2 * (int(context) - int(prompt)), 2))) * MS

        bound = self.target_bound
        target = mixed(self.target) - bound.excess(int(prompt) + int(batch)) - bound.decode(batch, context)
        draft = mixed(self.draft) - self.decode(self.draft, batch, context) if self.draft is not None else 0.0
        return max(target, 0.0) + max(draft, 0.0)

    def row_compute_floor_s(self) -> float:
        """Seconds the matrix units need per token row of a target step, at the GPU's peak: ``2 P / (TP F)``.

        ``P`` is the dense target's matmul weights per token (attention projections, MLP and LM head, from its
        shapes), ``F`` the GPU's peak tensor FLOP/s at the request's precision (AIConfigurator's system file,
        :data:`~sdplan.derive.request.PEAK_FLOPS_KEYS`: ``bfloat16_tc_flops``, ``fp8_tc_flops`` or
        ``fp4_tc_flops``). No step of more rows can cost less per further row: the floor
        :func:`~sdplan.derive.fitting.fit_knee` holds the slope past the knee to. 0 for an MoE target (its rows
        spread over experts) or a GPU whose file gives no peak.
        """
        if self.shapes.get("num_experts"):
            return 0.0
        # the whole model's GEMMs (one GPU's share at TP 1), each weight used once a token row
        weights = sum(layers * n * k for layers, n, k, _ in dense_gemm_shapes(self.shapes, 1, 1.0).values())
        peak = self.gpu.get(PEAK_FLOPS_KEYS[self.request.precision])
        return 2.0 * weights / (self.request.tensor_parallel_size * float(peak)) if peak else 0.0

    def memory_floor_s(self, batch: int, context: float) -> tuple[float, float]:
        """Seconds a target step needs for its memory traffic at the GPU's peak bandwidth ``BW``, one GPU's share:
        ``(W / BW, B s kv / BW)``.

        ``W`` is the bytes of the dense target's GEMM weights, each read once a step (:func:`dense_gemm_shapes` at
        the checkpoint's GEMM precision); ``kv`` the bytes of KV cache a token of context takes
        (AIConfigurator's memory model); ``B s`` the tokens of context ``batch`` sequences at mean ``context``
        read once a step. A GEMM takes at least the longer of its weights' read and its rows' FLOPs
        (:meth:`row_compute_floor_s`); attention runs in kernels of its own, after them, so no step costs less
        than ``max(W / BW, rows 2P / (TP F)) + B s kv / BW``. ``(0, 0)`` for an MoE target or a GPU whose file
        gives no bandwidth.
        """
        bandwidth = float(self.gpu.get("mem_bw") or 0.0)
        if self.shapes.get("num_experts") or bandwidth <= 0.0:
            return 0.0, 0.0
        gemms = dense_gemm_shapes(self.shapes, self.request.tensor_parallel_size,
                                  WEIGHT_BYTES[self.quant["gemm_quant_mode"]])
        weights = sum(layers * n * k * size for layers, n, k, size in gemms.values())
        target = self._target_kv()
        per_token = target[1] if target is not None else 0.0
        return weights / bandwidth, batch * context * per_token / bandwidth

    def _target_kv(self) -> tuple[float, float] | None:
        """The target's KV cache in AIConfigurator's memory model: ``(free bytes, bytes a token)`` for one GPU's
        share (None where it cannot say)."""
        target = self._kv_estimate(self.target_path, self.request.tensor_parallel_size)
        if target is None:
            return None
        return float(target["total_kv_size_bytes"]), kv_bytes_per_token(target)

    def _kv_estimate(self, path: str, tp: int, quant: dict[str, str] | None = None) -> dict[str, Any] | None:
        """AIConfigurator's memory model for one model on ``tp`` GPUs (None where it cannot say).

        Raises
        ------
        InvalidValueError
            Where the model says the weights and runtime memory leave no KV cache: the model does not fit
            these GPUs at this tensor parallelism, and no step of it can be served (Qwen3-235B-A22B-FP8 on
            one H200: 242 GB of non-KV memory against 151 GB).
        """
        from aiconfigurator_core.sdk.memory import estimate_kv_cache

        quant = quant or self.quant
        kind, share = kv_memory_share(self.request.backend)
        if share is None:  # SGLang's mem_fraction_static, from the GPU's capacity and the server's parallelism
            from aiconfigurator_core.sdk.backends.sglang_backend import derive_sglang_mem_fraction_static

            share = derive_sglang_mem_fraction_static(int(self.gpu["mem_capacity"]),
                                                      tp_size=self.request.tensor_parallel_size)
        try:
            return estimate_kv_cache(
                path, self.request.system, self.request.backend, self.version,
                max_num_tokens=8192, max_batch_size=self.request.batch_cap, memory_fraction_kind=kind,
                memory_fraction_value=share, tp_size=tp, moe_tp_size=tp, moe_ep_size=1,
                gemm_quant_mode=quant["gemm_quant_mode"], moe_quant_mode=quant["moe_quant_mode"],
                kvcache_quant_mode=quant.get("kvcache_quant_mode"), fmha_quant_mode=quant.get("fmha_quant_mode"))
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
        target = self._target_kv()
        if target is None:
            return None
        free, per_token = target
        return max(int(free / per_token), 0) if per_token > 0 else None

    def kv_cache_tokens(self) -> int | None:
        """Tokens of KV cache AIConfigurator's memory model gives the target (the draft's weights and KV taken out).

        Raises
        ------
        InvalidValueError
            Where the draft's weights take what the target left: no request could be admitted with SD on.
        """
        target = self._target_kv()
        if target is None:
            return None
        free, per_token = target
        if self.draft_path is not None:
            draft = self._kv_estimate(self.draft_path, draft_tp(self.request), self.draft_quant)
            if draft is not None:  # a draft on fewer GPUs loads its weights and KV onto those: as much per GPU
                free -= float(draft["memory_breakdown"]["weights_bytes"])
                per_token += kv_bytes_per_token(draft)
        tokens = max(int(free / per_token), 0) if per_token > 0 else None
        if tokens == 0:
            request = self.request
            raise InvalidValueError(
                f"{request.target_model} with {shown_path(str(self.draft_path))} as draft leaves no KV cache on "
                f"{request.tensor_parallel_size}x {request.system} at {request.precision}: the draft's weights take "
                "what the target's leave; raise --tp")
        return tokens


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
