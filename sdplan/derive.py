"""Calibrations derived from NVIDIA AIConfigurator's silicon-measured step estimator.

``sdplan derive`` prices the steps of sdplan's per-step form
(``sdplan-calibration(5)``, ``[step_model]``) with ``aiconfigurator-core``'s
compiled estimator (``AicEngine``: decode, prefill and mixed prefill+decode
step latency composed from a per-operation database measured on the GPU, for
one serving engine and version), fits the linear step model to them, records
how well the linear form represents AIConfigurator's curve, and, where the
package's measured end-to-end rows (``systems/silicon_sample.csv``) exist for
the same target, GPU, tensor parallelism and precision, anchors the no-SD part
to them. This is the only module that imports ``aiconfigurator_core``, and it
does so lazily (:func:`load_aic`); an absent package is a
:class:`~sdplan.errors.MissingDependencyError` (exit 5) naming the install line.

The step model fitted (``sdplan/calibration.py`` ``_coefficients_from_steps``)::

    T(B, q, s) = fixed + B (per_sequence + q per_query_token + s per_context_token)

with ``B`` running sequences, ``q`` query tokens per sequence and ``s`` the
mean KV context. What is priced, and how:

* target decode (``q = 1``) and verification (``q = k + 1``) at batch ``B``:
  AIConfigurator's decode step, its non-attention ops at ``B q`` token rows
  (its own verification model: ``nextn`` multiplies the decode batch by
  ``k + 1``) and its attention at ``B`` sequences (:meth:`Pricer.verify`);
* the draft's own step (``q = 1``): a draft LM's decode step; an EAGLE/EAGLE-3
  head as a one-layer decoder with the target's shapes and a draft
  vocabulary; MTP as AIConfigurator's own MTP layers (the difference between
  its ``nextn = k`` step and the plain verification step, per draft token);
  n-gram lookup as no device work;
* prefill per prompt length (``c1p``) and its interference with decode
  (``c2p``): AIConfigurator's mixed step with a prompt's tokens minus the
  decode-only step, per prompt token.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdplan.errors import InvalidValueError, MissingDependencyError

#: The distribution and version the shipped files were built with (``pyproject.toml`` extra ``derive``).
AIC_DISTRIBUTION = "aiconfigurator-core"
AIC_VERSION = "0.12.0"
AIC_LICENCE = "Apache-2.0"
INSTALL_HINT = (f"sdplan derive needs NVIDIA AIConfigurator's estimator: pip install {AIC_DISTRIBUTION}=={AIC_VERSION} "
                "(Python >= 3.11), or pip install -e '.[derive]' in a checkout")

METHODS = ("draft_model", "eagle", "eagle3", "mtp", "ngram")
PRECISIONS = ("bf16", "fp8", "fp8_block")
#: AIConfigurator system name -> hardware as sdplan files name it, and the file-name part.
SYSTEMS = {
    "h100_sxm": ("NVIDIA H100 SXM 80GB", "h100-sxm"),
    "h200_sxm": ("NVIDIA H200 SXM 141GB", "h200"),
    "b200_sxm": ("NVIDIA B200 SXM 180GB", "b200"),
    "a100_sxm": ("NVIDIA A100 SXM 80GB", "a100-sxm-80gb"),
    "l40s": ("NVIDIA L40S 48GB", "l40s"),
    "gb200": ("NVIDIA GB200", "gb200"),
}
#: Public model names -> the name AIConfigurator ships a config.json for (same architecture).
MODEL_ALIASES = {
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-8B": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.3-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
}
#: Architectures AIConfigurator 0.12.0 does not ship, from each model's public config.json (shapes only).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-3.2-1B-Instruct": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
        "intermediate_size": 8192, "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16"},
    "Qwen/Qwen3-14B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120,
        "intermediate_size": 17408, "num_attention_heads": 40, "num_hidden_layers": 40, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16"},
}
#: Draft vocabulary of the public EAGLE-3 heads (yuhuili/EAGLE3-*, AngelSlim/*_eagle3: draft_vocab_size).
EAGLE3_DRAFT_VOCAB = 32000
#: Host cost of vLLM's n-gram proposer (numba, CPU) per SD cycle and per running sequence: assumed, not priced.
NGRAM_HOST_FIXED_S = 50e-6
NGRAM_HOST_PER_SEQUENCE_S = 10e-6
#: Rejection sampling and SD bookkeeping per cycle: assumed (AIConfigurator prices device steps only).
SD_CYCLE_OVERHEAD_S = 0.5e-3
#: Share of GPU memory vLLM gives the model and its KV cache (--gpu-memory-utilization default).
GPU_MEMORY_UTILIZATION = 0.9
#: Grids priced: batch sizes (capped by max_num_seqs and the KV cache), mean contexts and prompt lengths.
BATCH_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTEXT_GRID = (256, 1024, 2048, 4096, 8192)
PROMPT_GRID = (128, 256, 512, 1024, 2048, 4096, 8192)
INTERFERENCE_BATCHES = (8, 32, 128)
MS = 1e-3


@dataclass(frozen=True, kw_only=True)
class DeriveRequest:
    """What to derive: a (GPU system, target, proposer) pair served by one engine version."""

    target_model: str
    system: str
    method: str
    draft_model: str | None = None
    backend: str = "vllm"
    backend_version: str | None = None
    tensor_parallel_size: int = 1
    precision: str = "bf16"
    draft_lengths: tuple[int, ...] = (1, 2, 3, 4, 5)
    max_num_seqs: int = 256
    prompt_tokens: int = 1024
    output_tokens: int = 512
    name: str | None = None
    date: _dt.date = field(default_factory=_dt.date.today)
    anchor: bool = True

    def check(self) -> None:
        """Refuse a request no derivation can serve (one line naming the option)."""
        if self.method not in METHODS:
            raise InvalidValueError(f"--method {self.method}: not one of {', '.join(METHODS)}")
        if self.precision not in PRECISIONS:
            raise InvalidValueError(f"--precision {self.precision}: not one of {', '.join(PRECISIONS)}")
        if self.system not in SYSTEMS:
            raise InvalidValueError(f"--system {self.system}: sdplan derives for {', '.join(SYSTEMS)}")
        if self.method in ("draft_model", "eagle", "eagle3") and not self.draft_model:
            raise InvalidValueError(f"--method {self.method} needs --draft-model (the draft LM or the head's name)")
        if not self.draft_lengths or min(self.draft_lengths) < 1:
            raise InvalidValueError("--draft-lengths: give draft lengths of at least 1, e.g. 1-5")


@dataclass(frozen=True)
class Derivation:
    """A derived calibration document and what the derivation found."""

    document: dict[str, Any]
    errors: dict[str, tuple[float, float]]  # component -> (mean, max) relative error of the fitted form, percent
    anchor: dict[str, Any] | None


def load_aic() -> Any:
    """Import ``aiconfigurator_core``'s engine module, or raise the exit-5 error naming the install line."""
    import logging

    try:
        from aiconfigurator_core.sdk import engine
    except ImportError:
        raise MissingDependencyError(INSTALL_HINT) from None
    # its notes on low-fidelity fallback tables are for its own users; sdplan records the database it priced with
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return engine


def aic_version() -> str:
    """The installed ``aiconfigurator-core`` version ("unknown" when its metadata is missing)."""
    from importlib import metadata

    try:
        return metadata.version(AIC_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def silicon_sample_path() -> Path:
    """The measured end-to-end rows shipped in ``aiconfigurator-core`` (``systems/silicon_sample.csv``)."""
    import aiconfigurator_core

    return Path(aiconfigurator_core.__file__).resolve().parent / "systems" / "silicon_sample.csv"


def model_key(name: str) -> str:
    """A model name reduced to its architecture and size: ``nvidia/Llama-3.1-8B-Instruct-FP8`` -> ``llama-3.1-8b``."""
    text = name.rstrip("/").rsplit("/", 1)[-1].lower()
    for prefix in ("meta-",):
        text = text.removeprefix(prefix)
    for suffix in ("-fp8", "-instruct"):
        text = text.removesuffix(suffix)
    return text


def _quant(precision: str) -> dict[str, str]:
    mode = {"bf16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block"}[precision]
    return {"gemm_quant_mode": mode, "moe_quant_mode": mode}


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


def fit_linear(rows: Sequence[Sequence[float]], values: Sequence[float]) -> tuple[list[float], float, float]:
    """Non-negative least squares in relative error: the coefficients and the mean and max error (%).

    Notes
    -----
    Minimises ``sum_i ((x_i . c - y_i) / y_i)^2`` over ``c >= 0`` (every cost of
    the step model is a time, ``sdplan-calibration(5)``), by
    :func:`scipy.optimize.nnls` on the rows scaled by ``1 / y_i``.
    """
    import numpy as np
    from scipy.optimize import nnls

    x = np.asarray(rows, dtype=float)
    y = np.asarray(values, dtype=float)
    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    solution, _ = nnls((x / scale) / y[:, None], np.ones_like(y))
    coefficients = solution / scale
    errors = np.abs(x @ coefficients - y) / y * 100.0
    return [float(c) for c in coefficients], float(errors.mean()), float(errors.max())


def _round(value: float) -> float:
    return float(f"{value:.6g}")


class Pricer:
    """AIConfigurator engines for one request, and the step costs sdplan's model needs (seconds)."""

    def __init__(self, engine: Any, request: DeriveRequest, models: Models) -> None:
        self.engine, self.request = engine, request
        self.version = self._literal_version()
        self.target_path = models.path(request.target_model)
        self.target = self.compile(self.target_path)
        from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

        shapes = get_model_config_from_model_path(self.target_path)
        #: (experts per token m, experts per layer M) of an MoE target, None for a dense one
        self.routing = (int(shapes["topk"]), int(shapes["num_experts"])) if shapes.get("num_experts") else None
        self._mtp: dict[int, Any] = {}
        self.draft_path: str | None = None
        self.draft: Any = None
        if request.method == "draft_model":
            self.draft_path = models.path(str(request.draft_model))
            self.draft = self.compile(self.draft_path)
        elif request.method in ("eagle", "eagle3"):
            head = eagle_head_config(shapes)
            self.draft_path = models.path(f"{request.draft_model}--priced-head", head)
            self.draft = self.compile(self.draft_path)

    def _literal_version(self) -> str:
        from aiconfigurator_core.sdk import perf_database

        requested = self.request.backend_version or "current"
        return str(perf_database.resolve_query_version(self.request.system, self.request.backend, requested))

    def compile(self, path: str, nextn: int = 0) -> Any:
        request = self.request
        tp = request.tensor_parallel_size
        return self.engine.EngineHandle.compile(
            path, request.system, request.backend, backend_version=self.version, tp_size=tp,
            moe_tp_size=tp, moe_ep_size=1, nextn=nextn, **_quant(request.precision))

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

    def kv_cache_tokens(self) -> int | None:
        """Tokens of KV cache AIConfigurator's memory model gives the target (the draft's weights and KV taken out)."""
        from aiconfigurator_core.sdk.memory import estimate_kv_cache

        quant = _quant(self.request.precision)

        def estimate(path: str) -> dict[str, Any] | None:
            try:
                return estimate_kv_cache(
                    path, self.request.system, self.request.backend, self.version,
                    max_num_tokens=8192, max_batch_size=self.request.max_num_seqs, memory_fraction_kind="of_total",
                    memory_fraction_value=GPU_MEMORY_UTILIZATION, tp_size=self.request.tensor_parallel_size,
                    moe_tp_size=self.request.tensor_parallel_size, moe_ep_size=1,
                    gemm_quant_mode=quant["gemm_quant_mode"], moe_quant_mode=quant["moe_quant_mode"])
            except (ValueError, KeyError, TypeError, AttributeError):
                return None

        target = estimate(self.target_path)
        if target is None:
            return None
        free, per_token = float(target["total_kv_size_bytes"]), float(target["kv_size_per_token_bytes"])
        if self.draft_path is not None:
            draft = estimate(self.draft_path)
            if draft is not None:
                free -= float(draft["memory_breakdown"]["weights_bytes"])
                per_token += float(draft["kv_size_per_token_bytes"])
        return max(int(free / per_token), 0) if per_token > 0 else None


def _batches(request: DeriveRequest, kv_tokens: int | None) -> list[int]:
    """Batch sizes priced: up to max_num_seqs and what the KV cache holds at the reference workload."""
    cap = request.max_num_seqs
    if kv_tokens:
        cap = min(cap, max(kv_tokens // (request.prompt_tokens + request.output_tokens), 1))
    return [b for b in BATCH_GRID if b <= cap] or [1]


def _fits_cache(batch: int, context: int, kv_tokens: int | None) -> bool:
    return kv_tokens is None or batch * context <= kv_tokens or batch == 1


def _step_rows(points: list[tuple[int, int, int]], routing: tuple[int, int] | None = None) -> list[list[float]]:
    """Design rows of T(B, q, s) = fixed + B seq + B q tok + B s ctx [+ phi(B q) experts].

    For an MoE target routing ``m`` of ``M`` experts per token, the last column
    is the expected fraction of experts a step of ``B q`` tokens touches,
    ``phi(T) = 1 - (1 - m/M)^T`` (:mod:`sdplan.moe`), whose coefficient is the
    time to stream every expert: ``[moe.coverage]`` of ``sdplan-calibration(5)``.
    """
    rows = [[1.0, float(b), float(b * q), float(b * s)] for b, q, s in points]
    if routing is not None:
        miss = 1.0 - routing[0] / routing[1]
        for row, (b, q, _) in zip(rows, points):
            row.append(1.0 - miss ** (b * q))
    return rows


def anchor_rows(request: DeriveRequest, path: Path) -> list[dict[str, str]]:
    """Measured aggregated rows of ``silicon_sample.csv`` for the request's target, system, backend, TP, precision."""
    key, precision = model_key(request.target_model), {"fp8_block": "fp8"}.get(request.precision, request.precision)
    with path.open(newline="") as stream:
        return [row for row in csv.DictReader(stream)
                if row["backend"] == request.backend and row["mode"] == "agg" and row["system"] == request.system
                and model_key(row["model_path"]) == key and row["tp_size"] == str(request.tensor_parallel_size)
                and (row["precision"] or "bf16") == precision and row["attention_dp_size"] in ("", "1")
                and row["pp_size"] in ("", "1") and row["silicon_tpot_ms"] and row["batch_size"]]


def fit_anchor(rows: list[dict[str, str]], pricer: Pricer, kv_tokens: int | None) -> dict[str, Any] | None:
    """Scale AIConfigurator's decode and prefill costs to measured closed-loop TPOT.

    Notes
    -----
    A closed loop of ``N`` clients with prompts of ``p`` and outputs of ``g``
    tokens runs ``N`` sequences per decode step and admits ``N / g`` new
    prompts per step, each adding its prefill to the step it is chunked into
    (sdplan's ``c2p``: ``sdplan-calibration(5)``). Its time per output token is
    then ``TPOT = a D(N, s) + b (N / g) P(p)`` with ``D`` AIConfigurator's
    decode step at the mean context ``s = p + g/2`` and ``P`` its prefill of one
    prompt. ``a`` and ``b`` are fitted by :func:`fit_linear` to the measured
    rows whose sequences fit the KV cache (``N (p + g)`` tokens at most; beyond
    it requests queue for memory, which no step cost describes). The derived
    file keeps AIConfigurator's ratios of every SD step to the plain decode
    step: every target and draft step cost is multiplied by ``a``, every
    prefill cost by ``b``.
    """
    design, measured, used = [], [], []
    for row in rows:
        clients, prompt, output = int(row["batch_size"]), int(row["isl"]), int(row["osl"])
        if kv_tokens is not None and clients * (prompt + output) > kv_tokens:
            continue
        decode = pricer.decode(pricer.target, clients, prompt + output // 2)
        prefill = float(pricer.target.predict_prefill_latency(1, prompt)) * MS * clients / output
        design.append([decode, prefill])
        measured.append(float(row["silicon_tpot_ms"]) * MS)
        used.append(row)
    if len(design) < 3:
        return None
    (decode_scale, prefill_scale), mape, worst = fit_linear(design, measured)
    raw = [abs(d + p - m) / m * 100.0 for (d, p), m in zip(design, measured)]
    bias = sum((d + p - m) / m * 100.0 for (d, p), m in zip(design, measured)) / len(measured)
    versions = sorted({row["backend_version"] or "unrecorded" for row in used})
    return {
        "rows": len(used),
        "rows_left_out": len(rows) - len(used),
        "row_versions": versions,
        "decode_scale": decode_scale,
        "prefill_scale": prefill_scale,
        "gap_mape_pct": sum(raw) / len(raw),
        "gap_bias_pct": bias,
        "anchored_mape_pct": mape,
        "anchored_max_error_pct": worst,
        "concurrency": [min(int(r["batch_size"]) for r in used), max(int(r["batch_size"]) for r in used)],
    }


def derive(request: DeriveRequest, progress: Callable[[str], None] | None = None) -> Derivation:
    """Price a pair with AIConfigurator and fit sdplan's per-step form to it.

    Raises
    ------
    MissingDependencyError
        If ``aiconfigurator-core`` is not installed (exit 5).
    InvalidValueError
        If AIConfigurator cannot build the pair (a model, system or engine version its database lacks).
    """
    request.check()
    engine = load_aic()
    note = progress or (lambda _text: None)
    models = Models()
    try:
        try:
            return _derive(request, Pricer(engine, request, models), note)
        except (ValueError, KeyError, FileNotFoundError, RuntimeError) as error:  # AIConfigurator's own errors
            raise InvalidValueError(f"AIConfigurator {aic_version()} cannot price {request.target_model} + "
                                    f"{request.draft_model or request.method} on {request.system} with "
                                    f"{request.backend} {request.backend_version or 'current'}: "
                                    f"{str(error).splitlines()[0]}") from None
    finally:
        models.close()


def _derive(request: DeriveRequest, pricer: Pricer, note: Callable[[str], None]) -> Derivation:
    kv_tokens = pricer.kv_cache_tokens()
    batches = _batches(request, kv_tokens)
    longest = max(request.draft_lengths)
    note(f"pricing {len(batches)} batch sizes up to {batches[-1]} (KV cache {kv_tokens or 'unknown'} tokens)")
    points = [(b, q, s) for b in batches for q in range(1, longest + 2) for s in CONTEXT_GRID
              if _fits_cache(b, s, kv_tokens)]
    target_values = [pricer.verify(b, q, s) for b, q, s in points]
    target, target_mean, target_max = fit_linear(_step_rows(points, pricer.routing), target_values)
    experts = target[4] if pricer.routing is not None else 0.0
    errors = {"target": (target_mean, target_max)}

    draft = [0.0, 0.0, 0.0, 0.0]
    if request.method != "ngram":
        draft_points = [(b, 1, s) for b in batches for s in CONTEXT_GRID if _fits_cache(b, s, kv_tokens)]
        if request.method == "mtp":  # one draft token's cost, averaged over the draft lengths priced
            values = [sum(pricer.draft_step(b, s, k) for k in request.draft_lengths) / len(request.draft_lengths)
                      for b, _, s in draft_points]
        else:
            values = [pricer.draft_step(b, s, 1) for b, _, s in draft_points]
        rows = [[1.0, float(b), float(b * s)] for b, _, s in draft_points]
        (d_fixed, d_seq, d_ctx), d_mean, d_max = fit_linear(rows, values)
        draft = [d_fixed, d_seq, 0.0, d_ctx]
        errors["draft"] = (d_mean, d_max)

    prompts = [p for p in PROMPT_GRID if _fits_cache(1, p, kv_tokens)]
    (p_fixed, p_tok), p_mean, p_max = fit_linear([[1.0, float(p)] for p in prompts],
                                                 [pricer.prefill(p) for p in prompts])
    errors["prefill"] = (p_mean, p_max)
    mix = [(p, b) for p in (512, 1024, 2048, 4096) for b in INTERFERENCE_BATCHES
           if b in batches and _fits_cache(b, p + request.output_tokens, kv_tokens)]
    mix = mix or [(request.prompt_tokens, 1)]
    (load_tok,), l_mean, l_max = fit_linear([[float(p)] for p, _ in mix],
                                            [max(pricer.interference(p, b, p + request.output_tokens), 1e-9)
                                             for p, b in mix])
    errors["interference"] = (l_mean, l_max)

    anchor = None
    silicon = silicon_sample_path()
    if request.anchor and silicon.is_file():
        anchor = fit_anchor(anchor_rows(request, silicon), pricer, kv_tokens)
    decode_scale = anchor["decode_scale"] if anchor else 1.0
    prefill_scale = anchor["prefill_scale"] if anchor else 1.0
    note(f"fitted; anchor: {'none' if anchor is None else str(anchor['rows']) + ' measured rows'}")
    document = _document(request, pricer, target[:4], draft, (p_fixed, p_tok, load_tok), errors, anchor,
                         decode_scale, prefill_scale, batches, kv_tokens, len(points))
    if pricer.routing is not None:
        streamed = _round(experts * decode_scale)
        document["moe"] = {"experts_per_token": pricer.routing[0], "experts": pricer.routing[1],
                           "coverage": {"baseline_c1_step_s": streamed, "c1v_s": streamed}}
    return Derivation(document=document, errors=errors, anchor=anchor)


def file_stem(request: DeriveRequest) -> str:
    """``[Nx]gpu_target_draft_derived``, as the shipped files are named."""
    gpu = SYSTEMS[request.system][1]
    tp = request.tensor_parallel_size
    draft = {"eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp", "ngram": "ngram"}.get(
        request.method, model_key(str(request.draft_model)))
    precision = "" if request.precision == "bf16" or request.method == "mtp" else f"-{request.precision}"
    return f"{f'{tp}x' if tp > 1 else ''}{gpu}_{model_key(request.target_model)}{precision}_{draft}_derived"


def _document(request: DeriveRequest, pricer: Pricer, target: list[float], draft: list[float],
              prefill: tuple[float, float, float], errors: dict[str, tuple[float, float]],
              anchor: dict[str, Any] | None, decode_scale: float, prefill_scale: float, batches: list[int],
              kv_tokens: int | None, points: int) -> dict[str, Any]:
    from sdplan import __version__

    hardware, _ = SYSTEMS[request.system]
    tp = request.tensor_parallel_size
    if tp > 1:
        hardware = f"{tp}x {hardware}, tensor parallel"
    method = request.method
    draft_name = {"mtp": "mtp", "ngram": "ngram"}.get(method, str(request.draft_model))
    version = aic_version()
    precision_text = {"bf16": "bfloat16 weights, activations and KV cache",
                      "fp8": "float8 weights and activations (per tensor), bfloat16 KV cache",
                      "fp8_block": "float8 weights (blockwise), bfloat16 KV cache"}[request.precision]
    assumptions = [
        f"step costs are AIConfigurator {version}'s estimates from its per-operation database measured on "
        f"{request.system} with {request.backend} {pricer.version}; serving overheads outside the GPU ops are in "
        "the anchor only",
        "verification of k+1 tokens per sequence: every op but attention at batch x (k+1) token rows, as "
        "AIConfigurator prices MTP verification; attention at batch sequences (each sequence's KV read once per "
        "step, as multi-query attention kernels do)",
        "chain drafting (top-k 1): one token per draft step, k + 1 tokens verified; tree drafting is not modelled",
        f"SD bookkeeping and rejection sampling: {SD_CYCLE_OVERHEAD_S * 1e3:g} ms per cycle (assumed, not priced)",
        "chunked prefill: a concurrent prompt's prefill delays the decode step it joins by AIConfigurator's mixed "
        "step minus its decode step",
    ]
    if method in ("eagle", "eagle3"):
        assumptions.append(f"{draft_name} is not in AIConfigurator's model set: priced as a one-layer decoder of "
                           f"the target's shapes with a {EAGLE3_DRAFT_VOCAB}-token draft vocabulary, its fc and "
                           "doubled QKV input as extra MLP width of the same parameter count")
    elif method == "mtp":
        assumptions.append("the MTP module is priced by AIConfigurator's own MTP model: its nextn = k step minus "
                           "the verification step, per draft token, averaged over the draft lengths priced")
    elif method == "ngram":
        assumptions.append(f"n-gram lookup has no device work; its host cost, {NGRAM_HOST_FIXED_S * 1e6:g} us per "
                           f"cycle and {NGRAM_HOST_PER_SEQUENCE_S * 1e6:g} us per sequence, is assumed (vLLM "
                           "ngram_proposer, numba on the host), not priced")
    else:
        assumptions.append(f"the draft model runs with the target's tensor parallelism ({tp}) and precision on the "
                           "same GPUs, sharing their memory; its prefill is paid with the target's")
    for name in (request.target_model, request.draft_model):
        if name in MODEL_ALIASES and MODEL_ALIASES[name] != name:
            assumptions.append(f"{name} is priced with AIConfigurator's {MODEL_ALIASES[name]} (same architecture)")
        elif name in ARCHITECTURES:
            assumptions.append(f"{name} is not in AIConfigurator's model set: priced from its config.json shapes "
                               "(sdplan.derive.ARCHITECTURES)")
    assumptions.append("acceptance is not part of this file: give it per workload (--acceptance)")

    spec_overhead = (NGRAM_HOST_FIXED_S if method == "ngram" else 0.0) + SD_CYCLE_OVERHEAD_S
    per_sequence_overhead = NGRAM_HOST_PER_SEQUENCE_S if method == "ngram" else 0.0
    keys = ("fixed_s", "per_sequence_s", "per_query_token_s", "per_context_token_s")
    measured = ("nothing end to end: AIConfigurator's per-operation timings only" if anchor is None else
                f"{anchor['rows']} closed-loop rows of AIConfigurator's silicon_sample.csv ({request.backend} "
                f"{', '.join(anchor['row_versions'])}, concurrency {anchor['concurrency'][0]}-"
                f"{anchor['concurrency'][1]}) anchor the no-SD decode and prefill costs")
    derivation: dict[str, Any] = {
        "source": f"NVIDIA AIConfigurator ({AIC_DISTRIBUTION} {version}, {AIC_LICENCE})",
        "package": AIC_DISTRIBUTION,
        "package_version": version,
        "licence": AIC_LICENCE,
        "system": request.system,
        "backend": request.backend,
        "database_version": pricer.version,
        "precision": request.precision,
        "target_priced_as": _shown_path(pricer.target_path),
        "draft_priced_as": _shown_path(pricer.draft_path) if pricer.draft_path else "none (no device work)"
        if method == "ngram" else "the target's MTP layers",
        "draft_lengths": [float(k) for k in request.draft_lengths],
        "max_num_seqs": request.max_num_seqs,
        "batch_sizes": [float(b) for b in batches],
        "context_tokens": [float(s) for s in CONTEXT_GRID],
        "prompt_tokens": [float(p) for p in PROMPT_GRID],
        "points": points,
        "measured": measured,
    }
    if kv_tokens is not None:
        derivation["kv_cache_tokens"] = kv_tokens
    for component, (mean, worst) in errors.items():
        derivation[f"{component}_mean_error_pct"] = _round(mean)
        derivation[f"{component}_max_error_pct"] = _round(worst)
    if anchor is not None:
        derivation["anchor"] = ("a closed loop's TPOT = a x AIConfigurator decode step + b x (N/g) x its prefill, "
                                "fitted to the measured rows; every step cost x a, every prefill cost x b "
                                "(AIConfigurator's SD-to-no-SD step ratios kept)")
        for key in ("rows", "decode_scale", "prefill_scale", "gap_mape_pct", "gap_bias_pct", "anchored_mape_pct",
                    "anchored_max_error_pct"):
            value = anchor[key]
            derivation[f"anchor_{key}"] = value if isinstance(value, int) else _round(value)
    else:
        derivation["anchor"] = "none: silicon_sample.csv has no measured rows for this target, system, TP and precision"

    stem = request.name or file_stem(request)
    target_model = request.target_model
    return {
        "schema_version": 1,
        "name": stem,
        "description": f"{model_key(target_model)} with "
                       + {"eagle": "an EAGLE head", "eagle3": "an EAGLE-3 head", "mtp": "its MTP module",
                          "ngram": "n-gram lookup"}.get(method, model_key(draft_name) + " as draft")
                       + f" on {hardware}, {request.backend} {pricer.version}, priced by AIConfigurator "
                       + ("and anchored to measured rows" if anchor else "(not measured end to end)"),
        "provenance": {
            "method": "derived",
            "hardware": hardware,
            "target_model": target_model,
            "draft_model": draft_name,
            "speculative_method": method,
            "engine": request.backend,
            "engine_version": pricer.version,
            "date": request.date,
            "created_by": f"sdplan derive (sdplan {__version__}, {AIC_DISTRIBUTION} {version})",
            "dtype": precision_text,
            "tensor_parallel_size": tp,
            "assumptions": assumptions,
            "sources": [f"{AIC_DISTRIBUTION} {version} ({AIC_LICENCE}): systems/data/{request.system} "
                        f"{request.backend} {pricer.version} per-operation database, AicEngine step estimator"]
            + ([f"{AIC_DISTRIBUTION} {version}: systems/silicon_sample.csv ({anchor['rows']} rows)"] if anchor else []),
            "notes": "Derived from AIConfigurator's op database: check it against your own measurement "
                     "('sdplan validate') before relying on absolute numbers.",
        },
        "reference_workload": {"prompt_tokens": request.prompt_tokens, "output_tokens": request.output_tokens},
        "validity": {"prompt_tokens": [float(PROMPT_GRID[0]), float(PROMPT_GRID[-1])],
                     "output_tokens": [32.0, 4096.0], "batch_size": [1.0, float(batches[-1])]},
        "derivation": derivation,
        "step_model": {
            "target": {key: _round(value * decode_scale) for key, value in zip(keys, target)},
            "draft": {key: _round(value * decode_scale) for key, value in zip(keys, draft)},
            "prefill": {"fixed_s": _round(prefill[0] * prefill_scale),
                        "per_prompt_token_s": _round(prefill[1] * prefill_scale),
                        "load_per_prompt_token_s": _round(prefill[2] * prefill_scale)},
            "speculation": {"overhead_fixed_s": _round(spec_overhead),
                            "overhead_per_sequence_s": _round(per_sequence_overhead)},
        },
    }


def _shown_path(path: str) -> str:
    """A model path for the file: AIConfigurator's name, or the architecture a temporary folder held."""
    return Path(path).name.replace("--", "/") if Path(path).is_absolute() else path
