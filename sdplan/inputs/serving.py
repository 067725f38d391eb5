"""The serving setup: the engine limits one replica runs under, resolved once.

A vLLM replica holds at most ``max_num_seqs`` requests in its running batch,
schedules at most ``max_num_batched_tokens`` tokens per step, and keeps each
running request's tokens in a KV cache of ``kv_cache_tokens`` tokens, which it
fills as the requests run (:class:`KvHold`). The *batch cap* is the number of
requests of the workload it keeps running at once: ``min(max_num_seqs,
floor(kv_cache_tokens / (p + g/2 + k + block/2)))``. Past it requests queue for
a slot, which the mean model ``L = C1/(1 - lambda C2)``
(:mod:`sdplan.latency.model`) does not represent; the simulator does.

:func:`resolve_limits` is the one place that decides each limit, with one
precedence for every command (``plan``, ``check``, ``capacity``,
``simulate``):

1. the value given on the command line;
2. the workload file (``[deployment] max_batch_size`` for ``max_num_seqs``);
3. what the served calibration's servers ran with or reported
   (``[measurement] server_commands`` and ``kv_cache_tokens``), or what a
   derived calibration was priced for (``[derivation] max_num_seqs`` and
   the ``kv_cache_tokens`` of AIConfigurator's memory model);
4. vLLM's default for the calibration's hardware (:func:`engine_max_num_seqs`;
   :data:`DEFAULT_MAX_NUM_BATCHED_TOKENS`; an unlimited KV cache).

Every :class:`EngineLimits` field carries a phrase saying where it came from,
so a warning can name it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sdplan.errors import InvalidValueError

if TYPE_CHECKING:
    from sdplan.calibration import Calibration
    from sdplan.inputs.workload import WorkloadFile

#: Token budget per step when neither the command line nor a served calibration's servers set one.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


# ----------------------------------------------------------------------------- vLLM's rules


def serve_flag(arguments: Sequence[str], flag: str) -> str | None:
    """The value of a ``vllm serve`` flag among ``arguments`` (``--flag V`` or ``--flag=V``), None if absent.

    vLLM's argument parser reads ``--max_num_seqs`` as ``--max-num-seqs``, so the name matches either way.
    """
    for index, argument in enumerate(arguments):
        name, equals, value = argument.partition("=")
        if not name.startswith("--") or name.replace("_", "-") != flag:
            continue
        if equals:
            return value
        if index + 1 < len(arguments):
            return arguments[index + 1]
    return None


def engine_max_num_seqs(hardware: str) -> int:
    """vLLM's default ``max_num_seqs`` for ``vllm serve`` on this hardware.

    1024 on GPUs of at least 70 GiB other than A100 (H100, H200, B200), 256
    elsewhere (A100, L40S), 128 per CPU socket
    (``vllm==0.33.0:vllm/engine/arg_utils.py:2973-3005``; the same table in 0.32).
    """
    text = hardware.lower()
    if "cpu" in text:
        return 128
    if any(name in text for name in ("h100", "h200", "h20", "b200", "b300", "gb200", "gb300")):
        return 1024
    return 256


def served_max_num_seqs(arguments: Sequence[str], hardware: str) -> int:
    """The ``max_num_seqs`` a ``vllm serve`` with these arguments runs with on this hardware.

    ``--max-num-seqs`` where given, else :func:`engine_max_num_seqs` (doubled with
    ``--performance-mode throughput``), lowered to ``--max-num-batched-tokens`` as vLLM lowers its default.
    """
    value = serve_flag(arguments, "--max-num-seqs")
    if value and value.isdigit():
        return int(value)
    cap = engine_max_num_seqs(hardware)
    if serve_flag(arguments, "--performance-mode") == "throughput":
        cap *= 2  # vLLM doubles its default max_num_seqs in throughput mode
    batched = serve_flag(arguments, "--max-num-batched-tokens")
    return min(cap, int(batched)) if batched and batched.isdigit() and int(batched) > 0 else cap


#: SGLang's running-request pool when ``--max-running-requests`` is not given: at least 2,048
#: (``ModelRunner``: ``min(max(KV tokens / context length x 512, 2048), 4096)``, then at most half the KV
#: tokens), so the KV cache binds before it on every priced workload.
SGLANG_MIN_RUNNING_REQUESTS = 2048
#: ``trtllm-serve --max_batch_size`` when not given.
TRTLLM_MAX_BATCH_SIZE = 256


#: The share of GPU memory an engine sizes its KV cache from when not told, as AIConfigurator's memory model
#: takes it (``memory_fraction_kind``, ``memory_fraction_value``): vLLM's ``--gpu-memory-utilization``, 0.9 of the
#: GPU's total with the weights and activations inside it; SGLang's ``--mem-fraction-static``, also of the total,
#: which SGLang computes from the GPU's capacity and the parallelism (None here: the GPU's memory less a reserve
#: for prefill chunks, CUDA graphs and the parallel groups, at least 10 GiB on a GPU over 60 GB; 0.836 on one
#: 80 GB H100, 0.907 on one H200; ``ServerArgs._handle_gpu_memory_settings``, which AIConfigurator's
#: ``derive_sglang_mem_fraction_static`` mirrors); TensorRT-LLM's ``KvCacheConfig.free_gpu_memory_fraction``, 0.9
#: of what the weights and activations leave free (its LLM API reference), a budget AIConfigurator refuses to
#: take as a share of the total.
KV_MEMORY_SHARE: dict[str, tuple[str, float | None]] = {"trtllm": ("of_free", 0.9), "sglang": ("of_total", None)}
VLLM_KV_MEMORY_SHARE: tuple[str, float | None] = ("of_total", 0.9)


def kv_memory_share(engine: str) -> tuple[str, float | None]:
    """``(kind, fraction)`` of GPU memory ``engine`` sizes its KV cache from by default (:data:`KV_MEMORY_SHARE`;
    vLLM's for any other engine); fraction None: the engine's own rule from the GPU's capacity (SGLang)."""
    return KV_MEMORY_SHARE.get(engine.lower(), VLLM_KV_MEMORY_SHARE)


def engine_batch_cap(engine: str, hardware: str) -> tuple[int, str]:
    """The running-request cap ``engine`` serves with by default on ``hardware``, and where that comes from.

    vLLM: :func:`engine_max_num_seqs`. SGLang: :data:`SGLANG_MIN_RUNNING_REQUESTS`. TensorRT-LLM:
    :data:`TRTLLM_MAX_BATCH_SIZE`. Another engine is taken to cap as vLLM does, and the phrase says so.
    """
    name = engine.lower()
    if name == "sglang":
        return SGLANG_MIN_RUNNING_REQUESTS, "SGLang's default running-request pool (at least 2,048)"
    if name == "trtllm":
        return TRTLLM_MAX_BATCH_SIZE, "trtllm-serve's default max_batch_size"
    where = hardware or "this hardware"
    phrase = f"vLLM's default max_num_seqs on {where}"
    return engine_max_num_seqs(hardware), phrase if name == "vllm" else f"assumed for {engine}: {phrase}"


def kv_cache_requests(kv_cache_tokens: float, prompt_tokens: float, output_tokens: float) -> int:
    """How many requests of the workload a KV cache holds at their longest: ``floor(tokens / (p + g))``.

    vLLM's own "maximum concurrency" line at start-up: up to this many requests run without one ever
    being preempted, so a calibration's sweep stops here (:mod:`sdplan.measure.levels`). The requests a
    cache keeps running on average are more (:class:`KvHold`). 0 where not one fits (vLLM refuses to start a
    ``max_model_len`` over the cache). The hold of an engine that reserves the whole output.
    """
    return KvHold().running(kv_cache_tokens, prompt_tokens, output_tokens)


#: Tokens of one KV cache block in vLLM by default: 16 on a GPU (its attention backends' block), 128 on a CPU
#: (``vllm==0.32.0:vllm/platforms/cpu.py``, ``CpuPlatform.check_and_update_config``). A request's last block is
#: half empty on average.
KV_BLOCK_TOKENS_GPU, KV_BLOCK_TOKENS_CPU = 16, 128


@dataclass(frozen=True, slots=True)
class KvHold:
    """What one running request holds of the KV cache on average: ``p + share g + k + block/2`` tokens.

    vLLM allocates a request's blocks as it runs: it admits a waiting request once its prompt fits
    (``KVCacheManager.allocate_slots`` checks the tokens the request has, not its ``max_tokens``), gives a
    running request a block when its tokens fill the last one, and when none is free preempts the newest
    running request (``Scheduler.schedule``). Over its life a request's output so far is ``g/2`` on
    average, so its hold is ``p + g/2``, with its ``k`` lookahead slots under SD and half a block
    (``output_share`` 0.5). Measured with vLLM 0.32 (CPU, 128-token blocks, a 7,680-token cache; 32
    clients at 256/512 and 128/896 tokens): 12.3 and 11.6 requests running on average over three runs each,
    where this hold gives 13.3 and 12.0 and ``p + g`` 10 and 7 (``benchmarks/kv_running.py``;
    benchmarks/RESULTS-accuracy-served-2026-11.md, eighth session). SGLang and TensorRT-LLM reserve the
    output at admission (``PrefillAdder.add_one_req``; ``GUARANTEED_NO_EVICT``): ``output_share`` 1 and no
    block term; SGLang at most :data:`SGLANG_CLIP_MAX_NEW_TOKENS` of it.

    Attributes
    ----------
    output_share : float
        Share of the output tokens held on average (0.5 allocated as it runs, 1 reserved).
    block_tokens : int
        Tokens of one block; half of one is held empty on average (0 for an engine that reserves).
    output_clip : float
        The most output tokens counted (SGLang's reservation stops at 4,096; unlimited otherwise).
    """

    output_share: float = 1.0
    block_tokens: int = 0
    output_clip: float = math.inf

    @property
    def rule(self) -> str:
        """How the engine fills its cache, a phrase with the engine as its subject (``fills the cache as ...``)."""
        if self.output_share < 1.0:
            return "fills the cache as requests run, so each holds its prompt and half its output on average"
        clip = "" if math.isinf(self.output_clip) else f", at most {self.output_clip:,.0f} tokens of it,"
        return f"reserves each request's prompt and output{clip} at admission"

    def tokens(self, prompt_tokens: float, output_tokens: float, lookahead: int = 0) -> float:
        """Tokens one running request holds on average."""
        return (prompt_tokens + self.output_share * min(output_tokens, self.output_clip) + lookahead
                + self.block_tokens / 2.0)

    def running(self, kv_cache_tokens: float, prompt_tokens: float, output_tokens: float, lookahead: int = 0) -> int:
        """Requests of the workload the cache keeps running at once; 0 where one whole request does not fit."""
        if prompt_tokens + output_tokens + lookahead > kv_cache_tokens:
            return 0
        return max(1, math.floor(kv_cache_tokens / self.tokens(prompt_tokens, output_tokens, lookahead)))


#: The most requests SGLang runs at once under speculative decoding where ``--max-running-requests`` is not
#: given: ``ServerArgs`` sets ``max_running_requests = 48`` for every speculative algorithm (EAGLE, EAGLE3,
#: STANDALONE: a draft model, NEXTN: MTP, run as EAGLE, and NGRAM) (``python/sglang/srt/server_args.py``: in
#: ``__post_init__`` in spring 2025, for EAGLE and EAGLE3; in ``_handle_speculative_decoding`` later, for all
#: five, with the warning "Max running requests is reset to 48 for speculative decoding"). Without SD its limit
#: is far higher (the KV cache's).
SGLANG_SD_MAX_RUNNING_REQUESTS = 48

#: Engines as their projects write them, by the name calibration files give (``[provenance] engine``).
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


def engine_name(engine: str) -> str:
    """``engine`` as its project writes it (``sglang``: SGLang); a name not known is returned as given."""
    return ENGINE_NAMES.get(engine.lower(), engine)


#: Engines whose host overheads a step and an SD cycle a public measurement gives (SpecDecode-Bench's fit to real
#: vLLM 0.10.1 runs, :data:`sdplan.derive.request.ENGINE_STEP_OVERHEAD_S`); ``sdplan derive`` prices another engine
#: with vLLM's, and its files say so (:func:`assumed_overheads_warning`).
OVERHEADS_MEASURED = frozenset({"vllm"})
#: What is known of how far vLLM's overheads are from another engine's, from measured runs: SGLang's SD runs
#: (``benchmarks/RESULTS-sd-measured-2026-11.md``, the EAGLE-3 paper's Table 3 on SGLang 0.4.4); TensorRT-LLM's
#: no-SD rows in AIConfigurator's silicon sample (``benchmarks/RESULTS-accuracy-silicon-2026-11.md``, 693 rows, E2E
#: 20.7% MAPE, +16.2% bias): a step priced slow also makes the steps SD saves worth more.
ASSUMED_OVERHEADS_EVIDENCE = {
    "sglang": ("on SGLang 0.4.4's measured EAGLE and EAGLE-3 runs (Llama-3.1-8B, one H100) a file priced so put SD's "
               "throughput 10-50% above the measured at 8-48 requests in flight"),
    "trtllm": ("on AIConfigurator's measured TensorRT-LLM rows without SD, files priced so put the mean latency "
               "16.2% above the measured on average, so the steps SD saves may be worth less than priced"),
}


def assumed_overheads_warning(engine: str, name: str) -> str | None:
    """The warning a derived calibration of ``engine`` gives with an SD answer, where its SD cycle takes vLLM's
    measured overheads (:data:`OVERHEADS_MEASURED`); None for an engine they were measured on."""
    if engine.lower() in OVERHEADS_MEASURED:
        return None
    evidence = ASSUMED_OVERHEADS_EVIDENCE.get(engine.lower())
    return (f"{name}'s SD cycle takes vLLM's engine overheads, assumed for {engine_name(engine)} (no public "
            f"measurement of its cycle); " + (f"{evidence}; " if evidence else "")
            + "check SD's gain on your server before relying on it (sdplan validate)")


#: The KV cache dtypes ``sdplan derive --kv-cache-dtype`` prices, by their names in words.
KV_CACHE_DTYPE_NAMES = {"bf16": "bfloat16", "fp8": "float8"}


def sd_max_num_seqs(engine: str) -> int | None:
    """The most requests ``engine`` runs at once with SD where nothing sets it; None: no limit of its own (the
    engine's ``max_num_seqs`` holds for SD too). SGLang: :data:`SGLANG_SD_MAX_RUNNING_REQUESTS`."""
    return SGLANG_SD_MAX_RUNNING_REQUESTS if engine.lower() == "sglang" else None


def kv_hold(engine: str, hardware: str) -> KvHold:
    """How ``engine`` fills its KV cache (:class:`KvHold`): as requests run (vLLM, and any engine not named),
    or reserved at admission (SGLang, TensorRT-LLM)."""
    if engine.lower() == "sglang":
        return KvHold(output_clip=SGLANG_CLIP_MAX_NEW_TOKENS)
    if engine.lower() == "trtllm":
        return KvHold()
    return KvHold(0.5, KV_BLOCK_TOKENS_CPU if "cpu" in hardware.lower() else KV_BLOCK_TOKENS_GPU)


# ----------------------------------------------------------------------------- what a served calibration ran with


def _server_arguments(calibration: Calibration) -> Sequence[Sequence[str]] | None:
    """The argument lists of a served calibration's ``vllm serve`` commands; None if it was not served."""
    measurement = calibration.records.measurement
    return None if measurement is None else measurement.server_arguments


def served_batch_cap(calibration: Calibration) -> tuple[int, str] | None:
    """The ``max_num_seqs`` the calibrated servers ran with, and where that comes from; None if not served.

    A served calibration records its ``vllm serve`` command lines (``[measurement]
    server_commands``); each ran with :func:`served_max_num_seqs` of its flags on the calibration's
    hardware, the rule calibrate's sweep used (the smallest, if they differ).
    """
    servers = _server_arguments(calibration)
    if servers is None:
        return None
    hardware = calibration.records.provenance.hardware
    caps = [served_max_num_seqs(words, hardware) for words in servers] or [served_max_num_seqs([], hardware)]
    given = any((serve_flag(words, "--max-num-seqs") or "").isdigit() for words in servers)
    return min(caps), ("the calibrated server's max_num_seqs" if given
                       else "vLLM's default max_num_seqs, which the calibrated server ran with")


def served_max_num_batched_tokens(calibration: Calibration) -> int | None:
    """The smallest ``--max-num-batched-tokens`` the calibrated servers were given; None if none was."""
    values = [serve_flag(words, "--max-num-batched-tokens") for words in _server_arguments(calibration) or []]
    given = [int(value) for value in values if value and value.isdigit() and int(value) > 0]
    return min(given) if given else None


def served_kv_cache_tokens(calibration: Calibration, draft_length: int) -> tuple[float, str] | None:
    """The KV cache (tokens) the calibrated server of a draft length reported, and its configuration.

    A served calibration records each server's KV cache (``[measurement] kv_cache_configurations``,
    ``kv_cache_tokens``: vLLM's ``num_gpu_blocks x block_size``). Configurations are named ``nosd``
    and ``k<N>`` (``ep-nosd``/``ep-k<N>`` for ``--endpoint``); a draft length without a server of its
    own takes the smallest cache of the SD servers (the draft model's KV shares the memory whatever k
    is). None for no SD without a ``nosd`` server, or a calibration that recorded none. (A file whose
    two lists differ in length does not load.)
    """
    measurement = calibration.records.measurement
    if measurement is None or not measurement.kv_cache:
        return None
    by_length: dict[int, tuple[float, str]] = {}
    for name, size in measurement.kv_cache:
        match = re.search(r"(?:^|-)(?:k(\d+)|(nosd))$", name)
        if match:
            length = int(match.group(1)) if match.group(1) else 0
            by_length.setdefault(length, (size, name))
    if draft_length in by_length:
        return by_length[draft_length]
    speculative = [found for length, found in by_length.items() if length > 0]
    return min(speculative) if draft_length > 0 and speculative else None


def derived_kv_cache_tokens(calibration: Calibration, draft_length: int) -> tuple[float, str] | None:
    """The KV cache (tokens) a derived calibration was priced with for one option, and a phrase saying so.

    With SD the draft's weights and KV cache share the memory (``[derivation] kv_cache_tokens``); without
    it the target has the memory to itself (``kv_cache_tokens_without_draft``, where the file records it;
    else the SD cache, a lower bound). None for a calibration that is not derived or records no cache.
    """
    derivation = calibration.records.derivation
    if calibration.method != "derived" or derivation is None or not derivation.kv_cache_tokens:
        return None
    if draft_length == 0 and derivation.kv_cache_tokens_without_draft:
        tokens = float(derivation.kv_cache_tokens_without_draft)
        return tokens, f"KV cache of {tokens:,.0f} tokens without the draft, as the derived calibration priced it"
    tokens = float(derivation.kv_cache_tokens)
    return tokens, f"KV cache of {tokens:,.0f} tokens the derived calibration was priced with"


# ----------------------------------------------------------------------------- how an engine schedules prompts

#: SGLang's ``--max-prefill-tokens`` default: prompt tokens one prefill batch takes at most
#: (``max_prefill_tokens: int = 16384`` in ``python/sglang/srt/server_args.py``, sgl-project/sglang 0.4-0.5).
SGLANG_MAX_PREFILL_TOKENS = 16384
#: The most of a new request's output SGLang's admission reserves KV cache for (``CLIP_MAX_NEW_TOKENS``, env
#: ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``, in ``python/sglang/srt/managers/schedule_policy.py``).
SGLANG_CLIP_MAX_NEW_TOKENS = 4096
#: SGLang's default ``--chunked-prefill-size`` by GPU memory: (below GB, tokens), else the last value; GPUs of
#: 160 GiB or more (B200, B300, MI300X) take 16384 (``ServerArgs`` in ``python/sglang/srt/server_args.py``).
SGLANG_CHUNKED_PREFILL_SIZES = ((35.0, 2048), (160.0, 8192))
SGLANG_LARGE_CHUNKED_PREFILL_SIZE = 16384
#: GPUs whose hardware names carry no memory size but hold 160 GiB or more.
LARGE_MEMORY_GPUS = ("b200", "b300", "gb200", "gb300", "mi300", "mi325", "mi355")


@dataclass(frozen=True, slots=True)
class PrefillScheduling:
    """How an engine schedules the prompts that wait for their prefill (``docs/model.md#ttft-and-tpot``).

    Attributes
    ----------
    engine : str
        The engine, as calibration files name it (``vllm``, ``sglang``).
    budget_tokens : int
        Prompt tokens one step prefills at most: vLLM's ``max_num_batched_tokens``; SGLang's
        ``min(chunked_prefill_size, max_prefill_tokens)``. A prompt that does not fit is split.
    prefill_first : bool
        True where waiting prompts are prefilled before the running requests decode again (SGLang's
        scheduler without ``--enable-mixed-chunk``); False where a step decodes every running request and
        fills the rest of its budget with prompts (vLLM's chunked prefill).
    source : str
        Where the rule comes from, a phrase.
    """

    engine: str
    budget_tokens: int
    prefill_first: bool
    source: str

    def admitted_together(self, clients: int, prompt_tokens: float, output_tokens: float,
                          kv_cache_tokens: float | None) -> int:
        """How many of ``clients`` requests that arrive together into an empty batch the engine admits at once.

        The engine admits a waiting request only while what it holds (:func:`kv_hold`) fits what the KV cache
        has left after those admitted before it: ``min(N, floor(kv_cache_tokens / hold))``, at least one. For
        SGLang, the prefill-first engine, the hold is its prompt and its output, at most
        :data:`SGLANG_CLIP_MAX_NEW_TOKENS` of it (``PrefillAdder.add_one_req``). None for the cache: unlimited,
        all ``N``. A prefill-first engine's rounds arrive together, so this is the size of the wave that recurs
        (:func:`sdplan.fitting.validation.run_waves`).
        """
        if kv_cache_tokens is None:
            return clients
        held = math.floor(kv_cache_tokens / kv_hold(self.engine, "").tokens(prompt_tokens, output_tokens))
        return max(1, min(clients, held))


def gpu_memory_gb(hardware: str) -> float | None:
    """The memory of one GPU named in a hardware string (``2x NVIDIA H200 SXM 141GB, ...``: 141), None if unnamed."""
    found = re.search(r"(\d+(?:\.\d+)?)\s*GB\b", hardware, flags=re.IGNORECASE)
    return float(found.group(1)) if found else None


def sglang_chunked_prefill_size(hardware: str) -> int:
    """SGLang's default ``--chunked-prefill-size`` on this hardware: 8192 on H100 and H200, 16384 on B200.

    SGLang sets it from the GPU's memory (:data:`SGLANG_CHUNKED_PREFILL_SIZES`); a hardware string that names
    no memory takes 16384 for the GPUs of :data:`LARGE_MEMORY_GPUS`, else 8192.
    """
    memory = gpu_memory_gb(hardware)
    if memory is None:
        large = any(name in hardware.lower() for name in LARGE_MEMORY_GPUS)
        return SGLANG_LARGE_CHUNKED_PREFILL_SIZE if large else SGLANG_CHUNKED_PREFILL_SIZES[-1][1]
    return next((size for below, size in SGLANG_CHUNKED_PREFILL_SIZES if memory < below),
                SGLANG_LARGE_CHUNKED_PREFILL_SIZE)


def prefill_scheduling(engine: str, hardware: str) -> PrefillScheduling:
    """How ``engine`` schedules waiting prompts on ``hardware`` with its default settings.

    SGLang runs a new prefill batch whenever requests wait and admission allows, before decoding the running
    batch again (``Scheduler.get_next_batch_to_run``), with ``min(chunked_prefill_size, max_prefill_tokens)``
    prompt tokens a batch (:func:`sglang_chunked_prefill_size`, :data:`SGLANG_MAX_PREFILL_TOKENS`). vLLM's
    scheduler decodes its running requests first and fills the rest of the step's
    :data:`DEFAULT_MAX_NUM_BATCHED_TOKENS` with prompts (its default for the API server on GPUs of 70 GiB or
    more). Another engine is taken to schedule as vLLM does, and the source says so.
    """
    name = engine.lower()
    if name == "sglang":
        chunk = sglang_chunked_prefill_size(hardware)
        return PrefillScheduling(
            engine="sglang", budget_tokens=min(chunk, SGLANG_MAX_PREFILL_TOKENS), prefill_first=True,
            source=f"SGLang's defaults: prefill first, chunked_prefill_size {chunk} on {hardware or 'this GPU'}, "
                   f"max_prefill_tokens {SGLANG_MAX_PREFILL_TOKENS}")
    source = f"vLLM's chunked prefill with max_num_batched_tokens {DEFAULT_MAX_NUM_BATCHED_TOKENS}"
    return PrefillScheduling(engine=name, budget_tokens=DEFAULT_MAX_NUM_BATCHED_TOKENS, prefill_first=False,
                             source=source if name == "vllm" else f"assumed for {engine}: {source}")


def derived_prefill_scheduling(calibration: Calibration) -> PrefillScheduling | None:
    """How the engine a derived calibration was priced for schedules prompts (None: not a derived calibration).

    A derived file has no fitted TTFT weights to hold a closed loop's waves of prompts; its engine
    (``[derivation] backend``) and hardware (``[provenance] hardware``) say how they queue.
    """
    derivation = calibration.records.derivation
    if calibration.method != "derived" or derivation is None:
        return None
    return prefill_scheduling(derivation.backend, calibration.records.provenance.hardware)


def derived_limits(calibration: Calibration) -> tuple[int | None, float | None]:
    """The ``max_num_seqs`` and KV cache tokens a derived calibration was priced for (None where it records none).

    ``sdplan derive`` prices batches up to ``[derivation] max_num_seqs`` and records the KV cache
    AIConfigurator's memory model gives the target with the draft's weights and KV cache taken out
    (``[derivation] kv_cache_tokens``); with no SD the draft is not loaded and the cache is larger,
    so for no SD this cache is a lower bound.
    """
    derivation = calibration.records.derivation
    if calibration.method != "derived" or derivation is None:
        return None, None
    seqs, tokens = derivation.max_num_seqs, derivation.kv_cache_tokens
    return (int(seqs) if seqs else None), (float(tokens) if tokens else None)


# ----------------------------------------------------------------------------- the limits, resolved once


@dataclass(frozen=True, slots=True)
class LimitOptions:
    """The limits given on the command line; None where not given (an infinite KV cache is unlimited)."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_tokens: float | None = None


#: What sets an option's batch cap: the KV cache's room for the workload's requests, or the engine's
#: ``max_num_seqs`` (SGLang's ``--max-running-requests``, TensorRT-LLM's ``max_batch_size``).
CAP_LIMITS = ("kv_cache", "max_num_seqs")


@dataclass(frozen=True, slots=True)
class BatchCap:
    """The requests one option's engine keeps running at once, where that number comes from, and which limit sets
    it (one of :data:`CAP_LIMITS`)."""

    requests: int
    source: str
    limit: str

    @property
    def phrase(self) -> str:
        """``batch cap of 213 sequences: KV cache of ...``, for warnings and answers."""
        return f"batch cap of {self.requests:g} sequences: {self.source}"


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineLimits:
    """The engine limits one replica runs under, each with where it came from (a phrase for warnings).

    Attributes
    ----------
    max_num_seqs : int
        Largest running batch (vLLM ``max_num_seqs``), requests.
    max_num_batched_tokens : int
        Token budget per step (vLLM ``max_num_batched_tokens``), tokens.
    kv_cache_tokens : float or None
        KV cache capacity in tokens; None is unlimited.
    batch_cap : BatchCap
        Requests of the workload the engine keeps running at once (:func:`batch_cap`), where that number
        comes from and which limit sets it; 0 requests where not one fits.
    max_num_seqs_source, max_num_batched_tokens_source, kv_cache_source : str
        Where each came from, as a phrase a warning can quote (e.g. ``the calibrated server's
        max_num_seqs``); ``kv_cache_source`` is empty for an unlimited cache.
    option_caps : tuple
        ``(k, BatchCap)`` of each option resolved on its own server.
    kv_hold : KvHold
        What one running request holds of the KV cache on average (the engine's rule).
    """

    max_num_seqs: int
    max_num_seqs_source: str
    max_num_batched_tokens: int
    max_num_batched_tokens_source: str
    kv_cache_tokens: float | None
    kv_cache_source: str
    batch_cap: BatchCap
    option_caps: tuple[tuple[int, BatchCap], ...] = ()
    kv_hold: KvHold = KvHold()

    def cap_of(self, draft_length: int) -> BatchCap:
        """An option's cap (0: no SD): its own where one was resolved, else :attr:`batch_cap`."""
        return next((cap for k, cap in self.option_caps if k == draft_length), self.batch_cap)

    def batch_caps(self, draft_lengths: Sequence[int]) -> tuple[BatchCap, ...]:
        """:meth:`cap_of` no SD, then of each draft length, in that order."""
        return tuple(self.cap_of(k) for k in (0, *draft_lengths))

    def caps(self, draft_lengths: Sequence[int]) -> list[float]:
        """Requests each option's engine holds at once, no SD first, then ``draft_lengths`` (for
        :func:`sdplan.planning.planner.plan`)."""
        return [float(cap.requests) for cap in self.batch_caps(draft_lengths)]

    def cap_phrase(self, draft_length: int) -> str:
        """An option's cap and where it comes from: ``batch cap of 213 sequences: KV cache of ...``."""
        return self.cap_of(draft_length).phrase

    def cap_phrases(self, draft_lengths: Sequence[int]) -> tuple[str, ...]:
        """:meth:`cap_phrase` of no SD, then of each draft length, in that order."""
        return tuple(cap.phrase for cap in self.batch_caps(draft_lengths))

    def reached(self, batch: float) -> bool:
        """Whether a mean batch of ``batch`` requests (``B = lambda L``; ``inf`` past saturation) reaches the cap."""
        return batch >= self.batch_cap.requests

    def require_fit(self, request_tokens: float) -> None:
        """Refuse a workload of which not even one request (``request_tokens = p + g``) fits the KV cache.

        Raises
        ------
        InvalidValueError
            If the batch cap is 0.
        """
        if self.batch_cap.requests < 1:
            raise InvalidValueError(f"a request of {request_tokens:g} tokens (prompt + output) does not fit the "
                                    f"{self.kv_cache_source}; raise --kv-cache-tokens")


def _max_num_seqs(calibration: Calibration, file: WorkloadFile | None, given: int | None,
                  speculative: bool = False) -> tuple[int, str]:
    """``max_num_seqs`` and where it comes from: given, else the workload file's, else the calibration's or its
    engine's default. A server of SD options (``speculative``) takes its engine's own limit under SD instead of that
    default where it is the smaller (:func:`sd_max_num_seqs`: SGLang's 48)."""
    if given is not None:
        return given, "the max_num_seqs given"
    if file is not None and file.max_batch_size is not None:
        return file.max_batch_size, f"deployment.max_batch_size of {file.path}"
    engine = calibration.records.provenance.engine
    own = sd_max_num_seqs(engine) if speculative else None
    found = _default_max_num_seqs(calibration)
    if own is not None and own < found[0]:
        return own, f"{engine_name(engine)}'s max_running_requests under speculative decoding, {own} unless " \
                    "--max-running-requests is given"
    return found


def _default_max_num_seqs(calibration: Calibration) -> tuple[int, str]:
    """The ``max_num_seqs`` a calibration's servers ran with or a derived one was priced for, else vLLM's default
    on its hardware."""
    served = served_batch_cap(calibration)
    if served is not None:
        return served
    derived, _ = derived_limits(calibration)
    if derived is not None:
        return derived, "the max_num_seqs the derived calibration was priced for"
    hardware = calibration.records.provenance.hardware
    return engine_max_num_seqs(hardware), f"vLLM's default max_num_seqs on {hardware or 'this hardware'}"


def _kv_cache(calibration: Calibration, given: float | None, draft_lengths: Sequence[int]) -> tuple[float | None, str]:
    """The KV cache given, else the smallest the served servers of the options reported, else the smallest a
    derived calibration was priced with for them (:func:`derived_kv_cache_tokens`), else unlimited.

    The servers of a set of options are the no-SD server (where 0 is among ``draft_lengths``) and the server of
    the longest draft length: shorter draft lengths without a server of their own share the SD servers'
    smallest cache (:func:`served_kv_cache_tokens`).
    """
    if given is not None and math.isfinite(given):
        return given, f"KV budget of {given:g} tokens"
    if given is not None:
        return None, ""
    longest = max(draft_lengths, default=0)
    servers = {longest} | ({0} if 0 in draft_lengths else set())
    caches = [cache for cache in (served_kv_cache_tokens(calibration, k) for k in sorted(servers)) if cache]
    if not caches:
        derived = [cache for cache in (derived_kv_cache_tokens(calibration, k) for k in sorted(servers)) if cache]
        return min(derived) if derived else (None, "")
    tokens, name = min(caches)
    return tokens, f"KV cache of {tokens:,.0f} tokens the calibrated {name} server reported"


def resolve_limits(calibration: Calibration, workload_file: WorkloadFile | None, given: LimitOptions,
                   draft_lengths: Sequence[int], prompt_tokens: float, output_tokens: float) -> EngineLimits:
    """The engine limits of a replica serving ``draft_lengths`` (0: no SD) for a workload of ``p + g`` tokens.

    Each limit is, in this order of precedence (one rule for every command):

    1. ``given`` (the command line);
    2. ``workload_file`` (``deployment.max_batch_size`` is ``max_num_seqs``);
    3. what the served calibration's servers ran with (their ``--max-num-seqs`` or vLLM's default on
       their hardware, their ``--max-num-batched-tokens``) or reported (the KV cache of the no-SD
       server, where 0 is among ``draft_lengths``, and of the longest draft length's server: the
       smallest); for a derived calibration, the ``max_num_seqs`` and KV cache it was priced for
       (:func:`derived_limits`);
    4. vLLM's default for the calibration's hardware (:func:`engine_max_num_seqs`),
       :data:`DEFAULT_MAX_NUM_BATCHED_TOKENS`, and an unlimited KV cache.

    The batch cap is ``min(max_num_seqs, floor(kv_cache_tokens / hold))``, the hold of the calibration's engine
    (:func:`kv_hold`), named after whichever of the two is smaller. Where neither 1 nor 2 sets ``max_num_seqs``,
    an engine with a limit of its own under SD (:func:`sd_max_num_seqs`: SGLang's 48) holds its SD options, and a
    server that runs SD only (0 not among ``draft_lengths``: the simulator's, check's), to it.
    """
    seqs, seqs_source = _max_num_seqs(calibration, workload_file, given.max_num_seqs)
    sd_seqs, sd_seqs_source = _max_num_seqs(calibration, workload_file, given.max_num_seqs, speculative=True)
    if draft_lengths and 0 not in draft_lengths:
        seqs, seqs_source = sd_seqs, sd_seqs_source
    if given.max_num_batched_tokens is not None:
        batched, batched_source = given.max_num_batched_tokens, "the max_num_batched_tokens given"
    elif (served := served_max_num_batched_tokens(calibration)) is not None:
        batched, batched_source = served, "the calibrated server's max_num_batched_tokens"
    else:
        batched, batched_source = DEFAULT_MAX_NUM_BATCHED_TOKENS, "sdplan's default max_num_batched_tokens"
    kv, kv_source = _kv_cache(calibration, given.kv_cache_tokens, draft_lengths)
    hold = kv_hold(calibration.records.provenance.engine, calibration.records.provenance.hardware)
    cap = batch_cap(hold, (seqs, seqs_source), (kv, kv_source) if kv is not None else None, prompt_tokens,
                    output_tokens)
    return EngineLimits(max_num_seqs=seqs, max_num_seqs_source=seqs_source, max_num_batched_tokens=batched,
                        max_num_batched_tokens_source=batched_source, kv_cache_tokens=kv, kv_cache_source=kv_source,
                        batch_cap=cap, option_caps=tuple(
                            _option_cap(calibration, given.kv_cache_tokens, k, *((sd_seqs, sd_seqs_source) if k
                                                                                   else (seqs, seqs_source)),
                                        prompt_tokens, output_tokens, hold) for k in sorted(set(draft_lengths))),
                        kv_hold=hold)


def _option_cap(calibration: Calibration, given: float | None, draft_length: int, seqs: int, seqs_source: str,
                prompt_tokens: float, output_tokens: float, hold: KvHold) -> tuple[int, BatchCap]:
    """``(k, cap)``: the requests one option's engine keeps running, ``min(max_num_seqs, floor(KV / h))``.

    Its KV cache: the one given, else what its calibrated server reported, else what a derived calibration
    priced for it (:func:`derived_kv_cache_tokens`: no SD without the draft's memory), else unlimited. vLLM
    keeps ``k`` lookahead slots per running request for the drafted tokens, so an SD request's hold ``h``
    (:class:`KvHold`) has ``k`` tokens more.
    """
    if given is not None:
        found = (given, f"KV budget of {given:g} tokens") if math.isfinite(given) else None
    else:
        served = served_kv_cache_tokens(calibration, draft_length)
        found = (served[0], f"KV cache of {served[0]:,.0f} tokens the calibrated {served[1]} server reported") \
            if served else derived_kv_cache_tokens(calibration, draft_length)
    return draft_length, batch_cap(hold, (seqs, seqs_source), found, prompt_tokens, output_tokens, draft_length)


def batch_cap(hold: KvHold, max_num_seqs: tuple[int, str], kv_cache: tuple[float, str] | None,
              prompt_tokens: float, output_tokens: float, lookahead: int = 0) -> BatchCap:
    """The requests of a workload one engine keeps running at once: ``min(max_num_seqs, floor(KV / h))``.

    ``max_num_seqs`` and ``kv_cache`` (None: unlimited) come with where they came from; ``h`` is what one
    running request of ``p + g`` tokens holds of the cache under the engine's rule (:class:`KvHold`), with
    ``lookahead`` slots more for an SD option's drafted tokens. The cap is named after whichever limit is
    the smaller, the engine's where they tie.
    """
    seqs, seqs_source = max_num_seqs
    if kv_cache is not None:
        held = hold.running(kv_cache[0], prompt_tokens, output_tokens, lookahead)
        if held < seqs:
            return BatchCap(held, kv_cache[1], "kv_cache")
    return BatchCap(seqs, seqs_source, "max_num_seqs")


def batch_cap_warning(limits: EngineLimits, where: str) -> str:
    """The one wording of "the mean model's batch reaches the engine's batch cap", ``where`` saying where.

    ``where`` is e.g. ``at 12 req/s`` (see :meth:`EngineLimits.reached`). The mean model has no batch cap:
    past ``B = batch_cap`` requests queue for a slot (:func:`sdplan.latency.model.batch_cap_rate`), so its latency is
    a lower bound there. Where vLLM's KV cache sets the cap, it fills as requests run (:class:`KvHold`) and
    preempts the newest when full (0.9-1.1 and 2.6 times a request on a real server, benchmarks/kv_running.py),
    which the model does not price: the warning says so. With a cap of 0 it says that not one request fits the KV
    cache.
    """
    cap = limits.batch_cap
    if cap.requests < 1:
        return (f"not one request of the workload fits the {limits.kv_cache_source}: that server cannot run it "
                "(vLLM refuses a max_model_len over its KV cache); the model assumes memory it does not have")
    churn = ("; a full KV cache also preempts running requests, whose tokens are computed again: not priced"
             if cap.limit == "kv_cache" and limits.kv_hold.output_share < 1.0 else "")
    return (f"{where} the mean model's batch reaches the batch cap of {cap.requests:g} sequences "
            f"({cap.source}): from there requests wait for a batch slot; the model takes that rate as "
            "the option's saturation and does not price the wait just below it, so its latency is a lower bound "
            f"there; the simulator models the cap{churn}")
