"""What ``sdplan derive`` is asked for, the settings it prices with, and the estimator's import.

:class:`DeriveRequest` names a (GPU system, target, proposer) pair served by
one engine version; the constants are the grids priced and the costs
assumed rather than priced (each is recorded in the derived file's
``provenance.assumptions``).
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from sdplan.errors import InvalidValueError, MissingDependencyError
from sdplan.inputs.serving import OVERHEADS_MEASURED, engine_batch_cap

#: The distribution and version the shipped files were built with (``pyproject.toml`` extra ``derive``).
AIC_DISTRIBUTION = "aiconfigurator-core"
AIC_VERSION = "0.12.0"
AIC_LICENCE = "Apache-2.0"
INSTALL_HINT = (f"sdplan derive needs NVIDIA AIConfigurator's estimator: pip install {AIC_DISTRIBUTION}=={AIC_VERSION} "
                "(Python >= 3.11), or pip install -e '.[derive]' in a checkout")

METHODS = ("draft_model", "eagle", "eagle3", "mtp", "ngram")
#: ``--precision`` values: weights (and activations) as AIConfigurator prices them; the KV cache is
#: ``--kv-cache-dtype``'s (:data:`KV_CACHE_DTYPES`).
PRECISIONS = ("bf16", "fp8", "fp8_block", "nvfp4")
#: ``--kv-cache-dtype`` values, vLLM's names; ``auto`` follows the checkpoint
#: (:func:`sdplan.derive.pricing.kv_cache_dtype`).
KV_CACHE_DTYPES = ("auto", "bf16", "fp8")
#: AIConfigurator system name -> hardware as sdplan files name it, and the file-name part.
SYSTEMS = {
    "h100_sxm": ("NVIDIA H100 SXM 80GB", "h100-sxm"),
    "h200_sxm": ("NVIDIA H200 SXM 141GB", "h200"),
    "b200_sxm": ("NVIDIA B200 SXM 180GB", "b200"),
    "a100_sxm": ("NVIDIA A100 SXM 80GB", "a100-sxm-80gb"),
    "l40s": ("NVIDIA L40S 48GB", "l40s"),
    "gb200": ("NVIDIA GB200", "gb200"),
    "b300_sxm": ("NVIDIA B300 SXM 288GB", "b300"),
    "gb300": ("NVIDIA GB300", "gb300"),
}
#: Public model names -> the name AIConfigurator ships a config.json for (same architecture).
MODEL_ALIASES = {
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-8B": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.3-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-405B-Instruct": "meta-llama/Meta-Llama-3.1-405B",
    "meta-llama/Llama-3.1-405B": "meta-llama/Meta-Llama-3.1-405B",
    # the same checkpoints under their first Hugging Face names, and Llama 3 (the 3.1 shapes, a shorter context)
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Meta-Llama-3.1-405B-Instruct": "meta-llama/Meta-Llama-3.1-405B",
    "meta-llama/Meta-Llama-3-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Meta-Llama-3-8B": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Meta-Llama-3-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Meta-Llama-3-70B": "meta-llama/Meta-Llama-3.1-70B",
}
#: Architectures AIConfigurator 0.12.0 does not ship, from each model's public config.json (shapes only).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-3.2-1B-Instruct": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
        "intermediate_size": 8192, "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16"},
    "meta-llama/Llama-3.2-3B-Instruct": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 3072,
        "intermediate_size": 8192, "num_attention_heads": 24, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16"},
    "Qwen/Qwen3-4B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2560,
        "intermediate_size": 9728, "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16"},
    "Qwen/Qwen3-14B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120,
        "intermediate_size": 17408, "num_attention_heads": 40, "num_hidden_layers": 40, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16"},
}
# base checkpoints have their instruction-tuned twins' shapes
ARCHITECTURES["meta-llama/Llama-3.2-1B"] = ARCHITECTURES["meta-llama/Llama-3.2-1B-Instruct"]
ARCHITECTURES["meta-llama/Llama-3.2-3B"] = ARCHITECTURES["meta-llama/Llama-3.2-3B-Instruct"]
#: Dated re-releases, priced with their first release's architecture: Qwen's July 2025 updates
#: (``Qwen3-30B-A3B-Instruct-2507``, ``-Thinking-2507``), DeepSeek's (``DeepSeek-V3-0324``, ``DeepSeek-R1-0528``).
RELEASE_MARKS = ("-instruct-2507", "-thinking-2507", "-2507", "-0528", "-0324")
#: Name endings of a quantised checkpoint of a known architecture, and the ``--precision`` values its weights
#: can be priced at (a ``-FP8`` checkpoint may be per-tensor or block-scaled).
QUANTISED_MARKS = (("-fp8-dynamic", ("fp8",)), ("-fp8", ("fp8", "fp8_block")), ("-nvfp4", ("nvfp4",)),
                   ("-fp4", ("nvfp4",)))


@dataclass(frozen=True, slots=True)
class ModelName:
    """The name a model is priced under, and the assumption that says so where it is another name's."""

    name: str
    note: str | None = None
    #: the name says the checkpoint is quantised, and ``name`` is its base architecture's unquantised config
    quantised: bool = False


def resolve_model_name(name: str, known: Collection[str], precision: str | None = None,
                       option: str = "--precision") -> ModelName | None:
    """The name AIConfigurator (or :data:`ARCHITECTURES`) prices ``name`` under; None where no rule finds one.

    In order: :data:`MODEL_ALIASES`; a known name as given; the same name up to case, or without its
    organisation where one known name has that model part; a dated re-release (:data:`RELEASE_MARKS`) as its
    first release; a quantised checkpoint (:data:`QUANTISED_MARKS`) as its base architecture at ``precision``
    (``option`` names the command-line option that sets it, for the message).

    Raises
    ------
    InvalidValueError
        For a quantised checkpoint's name at a ``precision`` its name rules out (``-FP8`` priced at bf16): its
        base architecture is named with the ``--precision`` to give.
    """
    if name in MODEL_ALIASES:
        return ModelName(MODEL_ALIASES[name], f"{name} is priced with AIConfigurator's {MODEL_ALIASES[name]} "
                                              "(same architecture)")
    if name in known:
        return ModelName(name)
    found = _lookup(name, known)
    if found is not None:
        return ModelName(found, f"{name} is priced as {found} (the same model name up to case and organisation)")
    organisation, _, model = name.rpartition("/")
    lowered = model.lower()
    for mark in RELEASE_MARKS:
        if mark in lowered:
            first = lowered.replace(mark, "", 1)
            found = _lookup(f"{organisation}/{first}" if organisation else first, known) or _lookup(first, known)
            if found is not None:
                return ModelName(found, f"{name} is priced with {found}'s architecture (a dated re-release of it)")
    for mark, precisions in QUANTISED_MARKS:
        if lowered.endswith(mark):
            base = resolve_model_name(model[:-len(mark)], known)
            if base is None:
                return None
            if precision is not None and precision not in precisions:
                raise InvalidValueError(
                    f"{name}: its name says {mark[1:].upper()} weights, not {precision}; give {option} "
                    f"{precisions[0]} to price it as {base.name} at {precisions[0]}, or the folder of its "
                    "config.json")
            return ModelName(base.name, f"{name} is priced with {base.name}'s architecture at {option} "
                                        f"{precision or precisions[0]} (its name says {mark[1:].upper()} weights)",
                             quantised=True)
    return None


def _lookup(name: str, known: Collection[str]) -> str | None:
    """A known name equal to ``name`` up to case, or, for a name without an organisation, the one known name whose
    model part it is (up to case); :data:`MODEL_ALIASES` followed. None where none or several match."""
    lowered = name.lower()
    matches = {entry for entry in known if entry.lower() == lowered}
    if not matches and "/" not in name:
        matches = {entry for entry in known if entry.rpartition("/")[2].lower() == lowered}
    if len(matches) != 1:
        return None
    (match,) = matches
    return MODEL_ALIASES.get(match, match)


#: Draft vocabulary of the public EAGLE-3 heads (yuhuili/EAGLE3-*, AngelSlim/*_eagle3: draft_vocab_size).
EAGLE3_DRAFT_VOCAB = 32000
#: The engine's overheads, which AIConfigurator's op database does not price (it times device ops). Source:
#: SpecDecode-Bench's step-cost model fitted to real vLLM 0.10.1 runs of Llama-3.1-8B with EAGLE-3 on one
#: H100 (Liu et al., arXiv 2601.11580; SpecDecode-Bench/simulator@2fdccbd6:predictor.py, class Llama8BH100;
#: benchmarks/data/sd-measured/specdecode_bench_2601.11580.json, fitted_step_model).
#: Host time every engine step pays, SD or not (scheduling, input preparation, sampling, output processing):
#: ``overhead_constant_per_step``.
ENGINE_STEP_OVERHEAD_S = 1.20683946e-3
#: Their EAGLE-3 drafting phase per SD cycle at k = 3, its fixed part: ``draft_c_fixed``.
EAGLE_DRAFT_PHASE_S = 2.13526175e-3
#: AIConfigurator's price of one EAGLE-3 head step of that setup (Llama-3.1-8B on h100_sxm, vLLM 0.24.0
#: database, batch 1): the device work inside that phase.
EAGLE_HEAD_STEP_PRICED_S = 0.325e-3
#: The SD cycle's own overhead (launching the drafting phase, rejection sampling, bookkeeping): the measured
#: phase less the three head steps priced, about 1.16 ms; taken for every proposer that runs a model.
SD_CYCLE_OVERHEAD_S = EAGLE_DRAFT_PHASE_S - 3 * EAGLE_HEAD_STEP_PRICED_S
#: vLLM's n-gram proposer (numba, on the host) per cycle, as a share of the verification step it precedes:
#: ``ngram_draft_percentage``, the same source.
NGRAM_DRAFT_SHARE = 0.005875
#: The server's time around a request's prefill that the op database does not time, per target layer: the
#: median over AIConfigurator's measured vLLM rows (``systems/silicon_sample.csv``, each shape at its lowest
#: concurrency, 4-8 clients) of measured TTFT less the derived TTFT without it, over the target's layers.
#: Fitted, not sourced: no public measurement isolates it. ``benchmarks/accuracy_silicon.py --derived`` fits it
#: and scores every model with the value fitted on the other models' rows (RESULTS-accuracy-silicon-2026-11.md,
#: "vLLM's prefill overhead"). AIConfigurator 0.12.0's own vLLM backend adds 0.8 ms a layer for the same gap.
PREFILL_OVERHEAD_PER_LAYER_S = 0.60e-3


@dataclass(frozen=True, slots=True)
class EngineOverheads:
    """An engine's own costs, which AIConfigurator's op database does not time, and where they come from.

    Attributes
    ----------
    step_s : float
        Host time every engine step pays, SD or not (``[step_model.engine] step_overhead_s``).
    sd_cycle_s : float
        The SD cycle's own overhead for a proposer that runs a model (``[step_model.speculation]``).
    ngram_share : float
        n-gram matching per cycle as a share of the verification step.
    prefill_per_layer_s : float
        The server's time around a request's prefill beyond the op database's, per target layer
        (``[step_model.engine] prefill_overhead_s`` is it times the target's layers).
    measured : bool
        Whether the values come from measurements of this engine.
    source : str
        Where the values come from, for the file's assumptions.
    """

    step_s: float
    sd_cycle_s: float
    ngram_share: float
    prefill_per_layer_s: float
    measured: bool
    source: str


def engine_overheads(backend: str, prefill_per_layer_s: float | None = None) -> EngineOverheads:
    """The overheads of an engine: vLLM's from SpecDecode-Bench's fit and its prefill overhead fitted to
    AIConfigurator's vLLM rows (:data:`PREFILL_OVERHEAD_PER_LAYER_S`, or ``prefill_per_layer_s``); another
    engine, whose overheads no public measurement gives, takes vLLM's and says so (an engine has host work per
    step: none would be further off; on AIConfigurator's SGLang rows, derived dense E2E is 15.1% with none and
    13.9% with vLLM's)."""
    source = "SpecDecode-Bench's fit to vLLM 0.10.1 on one H100, arXiv 2601.11580"
    per_layer = PREFILL_OVERHEAD_PER_LAYER_S if prefill_per_layer_s is None else prefill_per_layer_s
    if backend in OVERHEADS_MEASURED:
        return EngineOverheads(ENGINE_STEP_OVERHEAD_S, SD_CYCLE_OVERHEAD_S, NGRAM_DRAFT_SHARE, per_layer, True,
                               source)
    return EngineOverheads(ENGINE_STEP_OVERHEAD_S, SD_CYCLE_OVERHEAD_S, NGRAM_DRAFT_SHARE, per_layer, False,
                           f"assumed: no public measurement of {backend}'s, so vLLM's from {source}")
#: Grids priced: batch sizes (capped by max_num_seqs and the KV cache), mean contexts and prompt lengths (the
#: file's validity range).
BATCH_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTEXT_GRID = (256, 1024, 2048, 4096, 8192)
PROMPT_GRID = (128, 256, 512, 1024, 2048, 4096, 8192)
#: Prompts whose prefill, alone and mixed into decode steps of INTERFERENCE_BATCHES sequences, is priced where
#: the KV cache holds it: past PROMPT_GRID too, so that the prefill's squared term (its attention over its own
#: prefix) is fitted where it dominates and a longer prompt is not extrapolated from short ones.
PREFILL_GRID = (*PROMPT_GRID, 16384, 32768)
INTERFERENCE_PROMPTS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
INTERFERENCE_BATCHES = (8, 32, 128)
MS = 1e-3


@dataclass(frozen=True, slots=True, kw_only=True)
class DeriveRequest:
    """What to derive: a (GPU system, target, proposer) pair served by one engine version."""

    target_model: str
    system: str
    method: str
    draft_model: str | None = None
    backend: str = "vllm"
    backend_version: str | None = None
    tensor_parallel_size: int = 1
    #: GPUs the draft model runs on (vLLM's draft_tensor_parallel_size); None: the target's.
    draft_tensor_parallel_size: int | None = None
    precision: str = "bf16"
    #: The draft's weights precision; None: its checkpoint's own (:func:`draft_precision`).
    draft_precision: str | None = None
    #: The KV cache's dtype (:data:`KV_CACHE_DTYPES`); ``auto``: the checkpoint's, as vLLM reads it.
    kv_cache_dtype: str = "auto"
    draft_lengths: tuple[int, ...] = (1, 2, 3, 4, 5)
    #: The engine's largest batch; None: the engine's own default on the system (:attr:`batch_cap`).
    max_num_seqs: int | None = None
    prompt_tokens: int = 1024
    output_tokens: int = 512
    name: str | None = None
    date: _dt.date = field(default_factory=_dt.date.today)
    anchor: bool = True
    #: The engine's prefill overhead per target layer; None: :data:`PREFILL_OVERHEAD_PER_LAYER_S` (a benchmark
    #: sets it to score each model with a value fitted without that model's rows).
    prefill_overhead_per_layer_s: float | None = None

    @property
    def overheads(self) -> EngineOverheads:
        """The engine's overheads this derivation prices (:func:`engine_overheads`)."""
        return engine_overheads(self.backend, self.prefill_overhead_per_layer_s)

    @property
    def batch_cap(self) -> int:
        """``max_num_seqs``, else what the engine runs with by default on the system
        (:func:`sdplan.inputs.serving.engine_batch_cap`: vLLM 1,024 on H100, H200 and B200, 256 on A100 and L40S)."""
        return self.max_num_seqs if self.max_num_seqs is not None else engine_batch_cap(self.backend, self.system)[0]

    def check(self) -> None:
        """Refuse a request no derivation can serve (one line naming the option)."""
        if self.method not in METHODS:
            raise InvalidValueError(f"--method {self.method}: not one of {', '.join(METHODS)}")
        if self.precision not in PRECISIONS:
            raise InvalidValueError(f"--precision {self.precision}: not one of {', '.join(PRECISIONS)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidValueError(f"--kv-cache-dtype {self.kv_cache_dtype}: not one of {', '.join(KV_CACHE_DTYPES)}")
        if self.draft_precision is not None and self.draft_precision not in PRECISIONS:
            raise InvalidValueError(f"--draft-precision {self.draft_precision}: not one of {', '.join(PRECISIONS)}")
        if self.draft_precision is not None and self.method in ("mtp", "ngram"):
            raise InvalidValueError(f"--draft-precision: --method {self.method} has no draft checkpoint of its own "
                                    "(MTP layers are the target's, at --precision); leave it out")
        if self.system not in SYSTEMS:
            raise InvalidValueError(f"--system {self.system}: sdplan derives for {', '.join(SYSTEMS)}")
        for flag, precision in (("--precision", self.precision), ("--draft-precision", self.draft_precision)):
            units, systems = TENSOR_CORE_SYSTEMS.get(str(precision), ("", SYSTEMS))
            if self.system not in systems:
                raise InvalidValueError(f"{flag} {precision}: {self.system} has no {units} tensor cores, and "
                                        f"AIConfigurator times {precision} only on {', '.join(systems)}; "
                                        f"give {flag} bf16 or another --system")
        if self.method in ("draft_model", "eagle", "eagle3") and not self.draft_model:
            raise InvalidValueError(f"--method {self.method} needs --draft-model (the draft LM or the head's name)")
        draft_tp = self.draft_tensor_parallel_size
        if draft_tp is not None and (draft_tp < 1 or draft_tp > self.tensor_parallel_size):
            raise InvalidValueError(f"--draft-tp {draft_tp}: a draft runs on 1 to the target's "
                                    f"{self.tensor_parallel_size} GPUs")
        # vLLM refuses any other draft_tensor_parallel_size (SpeculativeConfig._verify_and_get_draft_tp)
        if draft_tp is not None and self.backend == "vllm" and draft_tp not in (1, self.tensor_parallel_size):
            raise InvalidValueError(f"--draft-tp {draft_tp}: vLLM runs a draft model on 1 GPU or on the target's "
                                    f"{self.tensor_parallel_size}; give --draft-tp 1 or leave it out")
        if not self.draft_lengths or min(self.draft_lengths) < 1:
            raise InvalidValueError("--draft-lengths: give draft lengths of at least 1, e.g. 1-5")


def load_aic() -> Any:
    """Import ``aiconfigurator_core``'s engine module, or raise the exit-5 error naming the install line."""
    try:
        from aiconfigurator_core.sdk import engine
    except ImportError:
        raise MissingDependencyError(INSTALL_HINT) from None
    # its notes on low-fidelity fallback tables are for its own users; sdplan records the database it priced with
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return engine


def aic_version() -> str:
    """The installed ``aiconfigurator-core`` version ("unknown" when its metadata is missing)."""
    try:
        return metadata.version(AIC_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def model_key(name: str) -> str:
    """A model name reduced to its architecture and size: ``nvidia/Llama-3.1-8B-Instruct-FP8`` -> ``llama-3.1-8b``."""
    text = name.rstrip("/").rsplit("/", 1)[-1].lower()
    for prefix in ("meta-",):
        text = text.removeprefix(prefix)
    for suffix in ("-fp8", "-instruct"):
        text = text.removesuffix(suffix)
    return text


#: What AIConfigurator infers a checkpoint's ``quant_algo`` to be, as a ``--precision``.
CHECKPOINT_PRECISIONS = {"fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}


def draft_precision(request: DeriveRequest, draft_shapes: dict[str, Any] | None = None) -> str:
    """The precision a draft runs at: ``--draft-precision``, else what vLLM loads it at.

    Notes
    -----
    vLLM builds the draft's model config with the speculative config's own ``quantization``, unset by
    default ("If None, we assume the model weights are not quantized"; ``vllm/config/speculative.py``,
    0.32), so a draft model or an EAGLE head runs at its checkpoint's precision, not the target's
    ``--quantization``: a quantised checkpoint (its config.json's quantisation, ``draft_shapes``) at that,
    an unquantised one and an EAGLE head (priced from the target's shapes, no checkpoint read) at bf16.
    MTP layers are the target's own, and vLLM aligns them to its quantisation: ``--precision``.
    """
    if request.method == "mtp":
        return request.precision
    if request.draft_precision is not None:
        return request.draft_precision
    checkpoint = ((draft_shapes or {}).get("raw_config") or {}).get("quant_algo")
    return CHECKPOINT_PRECISIONS.get(str(checkpoint), "bf16")


def draft_tp(request: DeriveRequest) -> int:
    """GPUs the draft model runs on: ``draft_tensor_parallel_size``, else the target's."""
    return request.draft_tensor_parallel_size or request.tensor_parallel_size


#: Bytes a weight of each AIConfigurator GEMM mode occupies: NVFP4 packs 4 bits and one fp8 scale per
#: 16 elements (0.5 + 1/16); the fp8 modes' per-tensor or per-block scales are left out (under 0.01%).
WEIGHT_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "nvfp4": 0.5625}
#: The AIConfigurator systems with FP4 tensor cores (Blackwell), where ``--precision nvfp4`` can be priced.
FP4_SYSTEMS = ("b200_sxm", "gb200", "b300_sxm", "gb300")
#: The systems with FP8 tensor cores (Ada, Hopper, Blackwell: every one but the A100), where the fp8 modes can be
#: priced: AIConfigurator 0.12.0's a100_sxm file gives no ``fp8_tc_flops``.
FP8_SYSTEMS = tuple(system for system in SYSTEMS if system != "a100_sxm")
#: The tensor cores a ``--precision`` needs and the systems that have them; bf16 runs on every system.
TENSOR_CORE_SYSTEMS = {"fp8": ("FP8", FP8_SYSTEMS), "fp8_block": ("FP8", FP8_SYSTEMS), "nvfp4": ("FP4", FP4_SYSTEMS)}
#: The key of a GPU's peak tensor FLOP/s for each ``--precision`` in AIConfigurator's system files.
PEAK_FLOPS_KEYS = {"bf16": "bfloat16_tc_flops", "fp8": "fp8_tc_flops", "fp8_block": "fp8_tc_flops",
                   "nvfp4": "fp4_tc_flops"}


def quant_modes(precision: str) -> dict[str, str]:
    """AIConfigurator's GEMM and MoE quantisation modes for a ``--precision``."""
    mode = {"bf16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}[precision]
    return {"gemm_quant_mode": mode, "moe_quant_mode": mode}


def file_stem(request: DeriveRequest) -> str:
    """``[Nx]gpu_target_draft_derived``, as the shipped files are named."""
    gpu = SYSTEMS[request.system][1]
    tp = request.tensor_parallel_size
    draft = {"eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp", "ngram": "ngram"}.get(
        request.method, model_key(str(request.draft_model)))
    precision = "" if request.precision == "bf16" or request.method == "mtp" else f"-{request.precision}"
    return f"{f'{tp}x' if tp > 1 else ''}{gpu}_{model_key(request.target_model)}{precision}_{draft}_derived"
