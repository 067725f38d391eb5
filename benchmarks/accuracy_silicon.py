"""sdplan fitted to measured GPU rows, checked on rows it was not fitted to.

Data: NVIDIA AIConfigurator's ``silicon_sample.csv`` (``aiconfigurator-core`` 0.12.0, Apache-2.0),
read by ``sdplan.runs.silicon`` exactly as ``sdplan fit --select`` reads it: every aggregated row is a
closed loop of N clients at fixed prompt/output lengths with its mean TTFT and TPOT (mean E2E =
TTFT + (OSL - 1) x TPOT), no SD.

Configurations: every (model, system, backend and version, TP, precision, quantisation, attention DP,
MoE TP/EP) of vLLM and SGLang aggregated rows on H100, H200, B200 and B300 with at least
``MIN_POINTS`` distinct (ISL, OSL, N) points at three or more concurrencies. A configuration whose
rows repeat another's measurements exactly under another label (the file lists some DeepSeek-R1
rows again as DeepSeek-V3, for example) is counted once, under the first label.

Splits (documented; nothing is tuned on the held-out rows):

* ``concurrency`` (the headline): per configuration, sort its distinct concurrencies
  ``N_0 < ... < N_m``; hold out every other interior one (``N_1, N_3, ...`` below ``N_m``) at every
  length, fit on the rest (the lowest, the highest and every other level between).
* ``length``: per configuration with three or more (ISL, OSL) shapes, hold out the shape whose mean
  context ``ISL + OSL/2`` is the median (the lower of the two middle ones), at every concurrency,
  and fit on the other shapes.

The fit is ``sdplan.fitting.fit.fit_pooled`` (what ``sdplan fit`` runs), after the same steady-state screen;
predictions are ``sdplan.fitting.validation.predict_latency``/``predict_ttft`` (what ``sdplan validate``
prints) and TPOT = (E2E - TTFT)/(OSL - 1), vLLM's definition. Beside them, where the datasheet
roofline (``sdplan.derive.roofline``, what ``scripts/derive_roofline.py`` writes) knows the model and
the GPU, its prediction of the same held-out rows (weights at the rows' precision: 1 byte for fp8,
else 2). With ``--aic``,
also AIConfigurator's own estimate of the same rows from its compiled engine
(``aiconfigurator_core.sdk.engine.EngineHandle``, ``run_static``: a static batch of N requests,
context then generation; TTFT = its context latency, TPOT = generation / (OSL - 1)), at the rows'
backend version where its database has it, else the database's (about 3 s per configuration).

With ``--derived``, also calibrations built by ``sdplan derive``'s pricing (``sdplan.derive``, the
target only: n-gram, draft length 1, ``max_num_seqs`` the larger of 256 and the configuration's
largest concurrency) for every configuration it can price: *derived only* (no anchoring to measured
rows), checked on every screened row of the configuration, none of which it saw; and *anchored*
(``sdplan.derive.fit_anchor`` on the fitted split's rows only), checked on the held-out rows. Beside
them, the fitted calibration on the same held-out rows. Derive prices one precision for every
weight (bf16, fp8 or fp8_block; a configuration of fp8 GEMMs and fp8_block experts is priced as
fp8_block; an fp8 target whose checkpoint is block-scaled has its experts priced block-scaled,
``docs/model.md#mixture-of-experts``), attention data parallelism 1 and the experts split by TP alone; it
says which configurations it cannot price and why (a target that leaves no KV cache on its GPUs, too).
An MoE target's ``[moe]`` expert coverage is applied as the planner applies it, by
``predict_latency``/``predict_ttft`` (what ``sdplan validate`` does with a calibration's ``[moe]``). For each
dense configuration it also prints the largest share of the GPUs' peak matrix throughput a row's closed-loop
rate needs (:func:`matrix_shares`); and, per kind, the
derived-only E2E with the measured TTFT in place of the predicted one (how far TPOT alone is off).
A dense row whose closed-loop rate needs more than all of its GPUs' time for the target's GEMMs alone, timed
as AIConfigurator's database times them bound by compute (:data:`UNLABELLED_SHARE`), cannot have run as
labelled; the derived section neither anchors to nor scores such rows, lists them with their errors, and gives
each kind's figures with them too (``--keep-unlabelled`` scores them). The fitted section keeps every row.
A derived file prices vLLM's prefill overhead per target layer (``[step_model.engine] prefill_overhead_s``),
fitted to these rows at their lowest concurrency (:func:`prefill_overheads`): the derived figures score each
model with the value fitted on the other models' rows, and print the all-rows value beside the shipped one.
About 1.5 minutes in all on a 2-core VM.

    python benchmarks/accuracy_silicon.py [--csv PATH] [--split concurrency|length] [--aic] [--derived]
                                          [--kv-cap] [--rounds R] [--waves engine|opening|none]
                                          [--keep-unlabelled] [--backends vllm,sglang,trtllm]
                                          [--markdown FILE]

A derived file has no fitted TTFT weights, so its closed loops are given their waves of prompts
(``sdplan.fitting.validation.run_waves``, ``docs/model.md#ttft-and-tpot``): the N clients send at once, and
the prefills queue in chunks of the engine's token budget before each first token. By default
(``--waves opening``) every engine is priced as vLLM: only the opening wave queues, in chunks of vLLM's
default ``max_num_batched_tokens``, and spread over the ``--rounds`` requests each client sends
(:data:`ROUNDS`) it adds ``sdplan.latency.model.closed_loop_wave_s`` to TTFT. ``--waves engine``
prices each as the derived file's engine schedules prompts (``sdplan.inputs.serving.prefill_scheduling``):
SGLang prefills first, so where the rows' benchmark sent fixed lengths (:func:`fixed_lengths`) a round's
requests (those its KV cache admits together) decode in step, finish together and come back as the next
wave: every round's TTFT takes the wave and E2E does not change
(``sdplan.latency.model.closed_loop_waves_s``); ``--waves engine-any`` assumes fixed lengths for every
SGLang configuration, ``--waves none`` leaves the waves out. The fitted calibrations are predicted as
``sdplan validate`` predicts them.

``--kv-cap`` lets the derived calibrations' KV cache (AIConfigurator's memory model) hold back a closed
loop past it; off by default: that estimate is below what the measured servers held (the rows whose TTFT
grows over 5x: E2E 65.6% without it, 69.9% with it; RESULTS-sd-measured-2026-11.md).

Goal: pooled held-out MAPE of E2E and TPOT <= 10%, TTFT <= 25%, over >= 20 configurations.
About 30 s on a 2-core VM (each fit profiles the fixed share of the step cost), a minute more with --aic.
"""

from __future__ import annotations

import argparse
import collections
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from sdplan.derive import roofline
from sdplan.derive.request import PREFILL_OVERHEAD_PER_LAYER_S
from sdplan.fitting.fit import fit_configurations, fit_pooled
from sdplan.fitting.validation import ClosedLoopWaves, derived_waves, predict_run
from sdplan.inputs.serving import prefill_scheduling
from sdplan.runs import screen, silicon

#: Engines whose rows are scored by default: the issue's figures (vLLM and SGLang); ``--backends`` adds
#: TensorRT-LLM's rows (the same file holds 1,338 aggregated ones), scored the same way.
BACKENDS = ("vllm", "sglang")
ALL_BACKENDS = ("vllm", "sglang", "trtllm")
SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm")
#: Fewest distinct (ISL, OSL, N) points a configuration needs.
MIN_POINTS = 9
#: Requests each client sends in a measured closed loop, which the rows do not record: NVIDIA Dynamo's
#: benchmark script runs ``genai-perf --concurrency N --request-count $((N*10)) --warmup-request-count
#: $((N*2))`` (ai-dynamo/dynamo benchmarks/llm/perf.sh); AIConfigurator's own generated ``bench_run.sh``
#: runs ``aiperf --num-requests $((N*20))`` (``--rounds 20``). Spreads the opening wave of the derived
#: calibrations' closed loops (:func:`sdplan.latency.model.closed_loop_wave_s`).
ROUNDS = 10.0
#: Model names (lower case, without the organisation) that are mixtures of experts.
MOE_MODELS = ("deepseek-r1", "deepseek-v3", "qwen3-235b-a22b-fp8", "qwen3.5-397b-a17b", "kimi-k2.5", "glm-5",
              "minimax-m2.5", "gpt-oss-120b", "qwen3-30b-a3b")


@dataclass
class Errors:
    """Relative errors (predicted/measured - 1) of held-out rows."""

    e2e: list[float]
    tpot: list[float]
    ttft: list[float]

    @staticmethod
    def empty() -> Errors:
        return Errors([], [], [])

    def extend(self, other: Errors) -> None:
        self.e2e += other.e2e
        self.tpot += other.tpot
        self.ttft += other.ttft


def mape(values: list[float]) -> float:
    return 100.0 * sum(abs(v) for v in values) / len(values) if values else math.nan


def bias(values: list[float]) -> float:
    return 100.0 * sum(values) / len(values) if values else math.nan


def cell(values: list[float]) -> str:
    """``MAPE% (bias%)`` of relative errors, ``-`` for none."""
    return f"{mape(values):.1f}% ({bias(values):+.1f}%)" if values else "-"


def add_to_buckets(buckets: dict[str, Errors], runs: list, errors: Errors, kind: str | None = None) -> None:
    """Each run's errors into its bucket of prompt length (4,096 tokens) and concurrency (64), and the rows
    where the KV cache binds: TTFT over 5x its lowest-concurrency value at the same lengths (the issue's
    definition: requests wait for admission, :func:`sdplan.runs.silicon.waited_for_admission`), those also
    by ``kind`` (dense or MoE) where given."""
    for run, queued, e2e, tpot, ttft in zip(runs, silicon.waited_for_admission(runs), errors.e2e, errors.tpot,
                                            errors.ttft):
        key = (f"prompt {'>=' if run.prompt_tokens >= 4096 else '<'} 4096, "
               f"N {'>=' if run.concurrency >= 64 else '<'} 64")
        buckets[key].extend(Errors([e2e], [tpot], [ttft]))
        if queued:
            buckets["KV cache binds (TTFT > 5x low load)"].extend(Errors([e2e], [tpot], [ttft]))
            if kind is not None:
                buckets[f"KV cache binds, {kind}"].extend(Errors([e2e], [tpot], [ttft]))


def group_table(title: str, groups: dict[str, Errors], buckets: dict[str, Errors]) -> list[str]:
    """Markdown rows of the errors per group, then per bucket (:func:`add_to_buckets`)."""
    lines = ["", f"| {title} | rows | E2E MAPE (bias) | TPOT MAPE (bias) | TTFT MAPE (bias) |", "|---|---|---|---|---|"]
    for group in sorted(groups) + sorted(buckets):
        errors = groups.get(group) or buckets[group]
        lines.append(f"| {group} | {len(errors.e2e)} | {cell(errors.e2e)} | {cell(errors.tpot)} | "
                     f"{cell(errors.ttft)} |")
    return lines


def configurations(text: str, name: str, backends: tuple[str, ...] = BACKENDS
                   ) -> list[tuple[silicon.SiliconConfiguration, list, list[str], list[str]]]:
    """(configuration, runs, labels it repeats, the reader's notes) for every eligible configuration, duplicates
    folded: a configuration measured under another label once, a measurement listed in several rows of one
    configuration once (the reader's rule, :func:`sdplan.runs.silicon.distinct_measurements`, says so in a note)."""
    rows = silicon.parse_rows(name, text)
    groups: dict[tuple[str, ...], list] = collections.defaultdict(list)
    for line, row in rows:
        if row["backend"] in backends and row["system"] in SYSTEMS:
            groups[tuple(silicon.cell_value(row, key) for key in silicon.KEYS)].append((line, row))
    found: dict[tuple, tuple[silicon.SiliconConfiguration, list, list[str], list[str]]] = {}
    for key in sorted(groups):
        selection = silicon.Selection(tuple(zip(silicon.KEYS, key)))
        runs, configuration, notes = silicon.read_silicon(name, text, selection)
        points = {(r.prompt_tokens, r.output_tokens, r.concurrency) for r in runs}
        levels = {r.concurrency for r in runs}
        if len(points) < MIN_POINTS or len(levels) < 3:
            continue
        signature = tuple(sorted((r.prompt_tokens, r.output_tokens, r.concurrency, round(r.mean_ttft_s, 9),
                                  round(r.mean_tpot_s, 9)) for r in runs))
        if signature in found:
            found[signature][2].append(label(configuration))
            continue
        found[signature] = (configuration, runs, [], notes)
    return list(found.values())


def label(configuration: silicon.SiliconConfiguration) -> str:
    model = configuration.model.rpartition("/")[2]
    parallel = f"TP{configuration.tp}" + (f" DP{configuration.dp}" if configuration.dp > 1 else "") + (
        f" EP{configuration.moe_ep}" if configuration.moe_ep > 1 else "")
    version = configuration.version if len(configuration.version) <= 12 else configuration.version[:11] + "~"
    return (f"{model} {configuration.system.partition('_')[0]} {configuration.backend} {version} {parallel} "
            f"{configuration.precision if configuration.precision != silicon.UNRECORDED else '-'}")


def split(runs: list, how: str) -> tuple[list, list]:
    """(train, held) of one configuration's runs (see the module notes)."""
    if how == "concurrency":
        levels = sorted({r.concurrency for r in runs})
        held_levels = {level for index, level in enumerate(levels) if index % 2 == 1 and index < len(levels) - 1}
        return ([r for r in runs if r.concurrency not in held_levels],
                [r for r in runs if r.concurrency in held_levels])
    shapes = sorted({(r.prompt_tokens, r.output_tokens) for r in runs}, key=lambda s: (s[0] + s[1] / 2, s))
    if len(shapes) < 3:
        return runs, []
    middle = shapes[(len(shapes) - 1) // 2]
    return ([r for r in runs if (r.prompt_tokens, r.output_tokens) != middle],
            [r for r in runs if (r.prompt_tokens, r.output_tokens) == middle])


#: Where a row's ``silicon_data_source`` names it, the rows AIConfigurator measured itself (its gap analysis),
#: with the benchmark script it generates: ``aiperf --isl ISL --isl-stddev 0 --osl OSL --osl-stddev 0
#: --extra-inputs ignore_eos:true``, one prompt and one output length. InferenceX's runs draw lengths
#: (``benchmark_serving.py --random-range-ratio``, SemiAnalysisAI/InferenceX benchmarks/benchmark_lib.sh).
FIXED_LENGTH_SOURCES = ("aic-auto-gap-analysis",)


def fixed_lengths(runs: list, sources: dict[int, str]) -> bool:
    """Whether every row of a configuration came from a benchmark of fixed lengths (:data:`FIXED_LENGTH_SOURCES`)."""
    lines = [int(run.source.rpartition(":")[2]) for run in runs]
    return bool(lines) and all(any(name in sources.get(line, "") for name in FIXED_LENGTH_SOURCES)
                               for line in lines)


def errors_of(coefficients_at, runs: list, moe_at=None, batch_cap_at=None,
              waves: ClosedLoopWaves | None = None) -> Errors:
    """Held-out errors of E2E, TPOT and TTFT for a ``coefficients_at(prompt, output)`` (and ``moe_at``);
    ``batch_cap_at(run)``: the requests the engine holds at once for the run (None: no cap); ``waves``: how the
    closed loops' waves of prompts add to TTFT (``sdplan.fitting.validation.run_waves``, as ``sdplan
    validate`` adds them for a derived calibration; None: no wave, as a fitted calibration's TTFT weights hold it)."""
    result = Errors.empty()
    for run in runs:
        coefficients = coefficients_at(run.prompt_tokens, run.output_tokens)
        moe = None if moe_at is None else moe_at(run.prompt_tokens, run.output_tokens)
        cap = None if batch_cap_at is None else batch_cap_at(run)
        latency, ttft = predict_run(coefficients, run, moe, cap, waves)
        tpot = (latency - ttft) / (run.output_tokens - 1.0)
        result.e2e.append(latency / run.mean_e2e_latency_s - 1.0)
        result.tpot.append(tpot / run.mean_tpot_s - 1.0)
        result.ttft.append(ttft / run.mean_ttft_s - 1.0)
    return result


# ----------------------------------------------------------------------------- the roofline beside


def roofline_predictor(configuration: silicon.SiliconConfiguration):
    """``coefficients_at`` of the datasheet roofline of this configuration, or None where it has no model/GPU."""
    from sdplan.calibration import parse_calibration

    gpus = {"h100_sxm": roofline.H100, "h200_sxm": roofline.H200}
    qwen3_32b = roofline.ModelConfig("Qwen/Qwen3-32B", 5120, 64, 64, 8, 128, 25600, 151936, False,
                                     "config.json of Qwen/Qwen3-32B")
    models = {"qwen/qwen3-32b": (qwen3_32b, roofline.QWEN3_0_6B),
              "meta-llama/llama-3.1-70b": (roofline.LLAMA_70B, roofline.LLAMA_8B),
              "meta-llama/llama-3.1-8b-instruct": (roofline.LLAMA_8B, roofline.LLAMA_1B),
              "nvidia/llama-3.1-8b-instruct-fp8": (roofline.LLAMA_8B, roofline.LLAMA_1B)}
    gpu = gpus.get(configuration.system)
    pair = models.get(configuration.model.lower())
    if gpu is None or pair is None or configuration.dp != 1:
        return None
    target, draft = pair
    if configuration.precision == "fp8":
        target = replace(target, bytes_per_param=1)
    _, document = roofline.calibration(gpu, configuration.tp, target, draft)
    return parse_calibration(document, "roofline").coefficients_at


# ----------------------------------------------------------------------------- AIConfigurator's own estimate

#: The names AIConfigurator's packaged model configs use for models the silicon file names otherwise.
AIC_MODEL_NAMES = {"meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
                   "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
                   "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
                   "zhipuai/GLM-5": "zai-org/GLM-5"}


def aic_predictor(configuration: silicon.SiliconConfiguration, rows_quant: tuple[str, str]):
    """``(predict(run) -> (e2e_s, ttft_s, tpot_s), database version)`` from AIConfigurator's engine, or (None, why)."""
    import contextlib
    import io
    import logging

    from aiconfigurator_core.sdk.engine import EngineHandle

    logging.disable(logging.WARNING)  # its database loader logs every fallback table
    gemm, moe = (None if value in ("", silicon.UNRECORDED) else value for value in rows_quant)
    options = {"tp_size": configuration.tp, "attention_dp_size": configuration.dp,
               "moe_tp_size": configuration.moe_tp or None, "moe_ep_size": configuration.moe_ep or None,
               "gemm_quant_mode": gemm, "moe_quant_mode": moe}
    handle, used, why = None, None, ""
    for version in (configuration.version, None):
        if version == silicon.UNRECORDED:
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                model = AIC_MODEL_NAMES.get(configuration.model, configuration.model)
                handle = EngineHandle.compile(model, configuration.system, configuration.backend,
                                              backend_version=version, **options)
            used = version or "database default"
            break
        except Exception as error:  # noqa: BLE001  (any failure: report it, go on)
            why = f"{type(error).__name__}: {str(error).splitlines()[0][:80] if str(error) else ''}"
    if handle is None:
        return None, why

    def predict(run) -> tuple[float, float, float]:
        context, generation, total = handle.run_static(batch_size=run.concurrency, isl=int(run.prompt_tokens),
                                                       osl=int(run.output_tokens))
        return total / 1e3, context / 1e3, generation / 1e3 / (run.output_tokens - 1.0)

    return predict, used


def aic_errors(predict, runs: list) -> Errors:
    result = Errors.empty()
    for run in runs:
        e2e, ttft, tpot = predict(run)
        result.e2e.append(e2e / run.mean_e2e_latency_s - 1.0)
        result.tpot.append(tpot / run.mean_tpot_s - 1.0)
        result.ttft.append(ttft / run.mean_ttft_s - 1.0)
    return result


# ----------------------------------------------------------------------------- sdplan derive's calibrations

#: Derive's ``--precision`` for a configuration's quantisation (``gemm`` or ``gemm/moe``); others it cannot price.
DERIVE_PRECISIONS = {"unrecorded": "bf16", "bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block",
                     "fp8/fp8_block": "fp8_block", "nvfp4": "nvfp4"}


def derive_request(configuration: silicon.SiliconConfiguration, runs: list, version: str | None):
    """``(DeriveRequest, None)`` pricing this configuration's target, or ``(None, why derive cannot)``."""
    from sdplan.derive import DeriveRequest

    precision = DERIVE_PRECISIONS.get(configuration.quant)
    if AIC_MODEL_NAMES.get(configuration.model, configuration.model).startswith("openai/gpt-oss"):
        # gpt-oss ships MXFP4 experts and bf16 attention, whatever the rows label it (fp4, nvfp4): derive prices
        # the checkpoint's experts at MXFP4 by itself (sdplan.derive.pricing.checkpoint_quant_modes)
        precision = "bf16"
    if precision is None:
        return None, f"quantisation {configuration.quant}: derive prices bf16, fp8, fp8_block and nvfp4"
    if configuration.dp > 1 or configuration.moe_ep > 1:
        return None, (f"attention DP {configuration.dp}, MoE EP {configuration.moe_ep}: derive prices DP 1 "
                      "with the experts split by TP")
    largest = max(int(run.concurrency) for run in runs)
    return DeriveRequest(target_model=AIC_MODEL_NAMES.get(configuration.model, configuration.model),
                         system=configuration.system, method="ngram", backend=configuration.backend,
                         backend_version=version, tensor_parallel_size=configuration.tp, precision=precision,
                         draft_lengths=(1,), max_num_seqs=max(256, largest), anchor=False), None


def kv_cap(calibration):
    """``batch_cap_at(run)`` of a derived calibration: the requests of the run's lengths its KV cache keeps running
    as its engine fills it (:func:`sdplan.inputs.serving.kv_hold`; its ``max_num_seqs`` is at least every row's
    concurrency, :func:`derive_request`)."""
    from sdplan.inputs.serving import derived_kv_cache_tokens, kv_hold

    found = derived_kv_cache_tokens(calibration, 0)
    if found is None:
        return None
    hold = kv_hold(calibration.records.provenance.engine, calibration.records.provenance.hardware)
    return lambda run: float(hold.running(found[0], run.prompt_tokens, run.output_tokens))


def derived_predictors(configuration: silicon.SiliconConfiguration, kept: list, train: list):
    """``(derived-only calibration, anchored calibration or None, database version)``, or (None, None, why).

    Tries the rows' engine version, then the database's current one (AIConfigurator resolves versions
    through its own slots, so most rows' versions are not queryable).
    """
    from dataclasses import replace as replaced

    from sdplan.calibration import parse_calibration
    from sdplan.derive import MeasuredRows, derive
    from sdplan.errors import InvalidValueError

    why = ""
    for version in (configuration.version, None):
        if version == silicon.UNRECORDED:
            continue
        request, why = derive_request(configuration, kept, version)
        if request is None:
            return None, None, why
        try:
            only = derive(request)
        except InvalidValueError as error:
            why = (str(error).partition(": ")[2] or str(error)).split(" at /")[0][:120]
            continue
        measured = MeasuredRows(tuple(train), (configuration.version,) * len(train))
        anchored = derive(replaced(request, anchor=True), measured=measured)
        database = only.document["derivation"]["database_version"]
        anchored_calibration = (parse_calibration(anchored.document, "anchored")
                                if anchored.anchor is not None else None)
        return parse_calibration(only.document, "derived"), anchored_calibration, database
    return None, None, why


@dataclass
class Pending:
    """A configuration derive priced, before it is scored: its rows and its calibrations."""

    configuration: silicon.SiliconConfiguration
    kind: str
    database: str
    labelled: list  # the rows scored (derived only)
    held: list  # the held-out rows among them (anchored, fitted)
    unlabelled: list  # (row, shares) screened as not run as labelled
    only: object  # the derived-only calibration
    anchored: object  # the anchored calibration, or None
    fit: object  # the fitted calibration's result
    cap: object  # batch_cap_at(run) of --kv-cap (kv_cap), or None
    waves: ClosedLoopWaves | None

    @property
    def layers(self) -> int:
        return int(self.only.document["derivation"]["target_layers"])

    def shifted(self, coefficients_at, per_layer_s: float):
        """``coefficients_at`` with the engine's prefill overhead at ``per_layer_s`` a layer instead of the
        shipped :data:`~sdplan.derive.request.PREFILL_OVERHEAD_PER_LAYER_S` (it adds to ``c1p`` alone)."""
        shift = self.layers * (per_layer_s - PREFILL_OVERHEAD_PER_LAYER_S)

        def at(prompt_tokens: float, output_tokens: float):
            coefficients = coefficients_at(prompt_tokens, output_tokens)
            return replace(coefficients, c1p_s=coefficients.c1p_s + shift)
        return at

    def scored(self, per_layer_s: float):
        """``coefficients_at`` of the derived-only and the anchored calibration (or None) at ``per_layer_s``."""
        anchored = self.shifted(self.anchored.coefficients_at, per_layer_s) if self.anchored is not None else None
        return self.shifted(self.only.coefficients_at, per_layer_s), anchored


def model_family(model: str) -> str:
    """The model a configuration serves, whatever its checkpoint's precision or tuning (``Llama-3.1-8B-Instruct``
    and ``-FP8`` are one), so that a model is never scored with a value fitted on its own rows."""
    name = model.rpartition("/")[2].lower()
    for suffix in ("-fp8", "-instruct"):
        name = name.removesuffix(suffix)
    return name


@dataclass
class PrefillOverheads:
    """vLLM's prefill overhead per target layer, fitted to its rows at their lowest concurrency."""

    all_rows_s: float  # the median over every vLLM configuration's lowest-concurrency rows: the shipped value
    held_out: dict[str, float]  # per model: the median over the other models' rows (what it is scored with)
    samples: dict[str, list[float]]  # per model: its rows' excess TTFT per layer with no overhead


def prefill_overheads(pending: list[Pending]) -> PrefillOverheads:
    """Fit the engine's prefill overhead: per vLLM shape (ISL, OSL) at its lowest concurrency, the measured TTFT
    less the derived-only TTFT without the overhead, over the target's layers; the median of them.

    Each model is scored with the median over the *other* models' rows (leave one model out), so no figure
    reported is fitted on the rows it scores. SGLang rows are not fitted: its derived files take vLLM's value.
    """
    samples: dict[str, list[float]] = collections.defaultdict(list)
    for entry in pending:
        if entry.configuration.backend != "vllm":
            continue
        without = entry.shifted(entry.only.coefficients_at, 0.0)
        for run in silicon.lowest_concurrency_runs(entry.labelled).values():
            moe = entry.only.moe_at(run.prompt_tokens, run.output_tokens) if entry.only.moe_at else None
            cap = entry.cap(run) if entry.cap is not None else None
            _, ttft = predict_run(without(run.prompt_tokens, run.output_tokens), run, moe, cap, entry.waves)
            samples[model_family(entry.configuration.model)].append((run.mean_ttft_s - ttft) / entry.layers)
    every = [value for values in samples.values() for value in values]
    models = {model_family(entry.configuration.model) for entry in pending}
    held_out = {model: statistics.median(value for other, values in samples.items() if other != model
                                         for value in values) for model in models}
    return PrefillOverheads(statistics.median(every), held_out, dict(samples))


def prefill_overhead_report(overheads: PrefillOverheads, pending: list[Pending]) -> list[str]:
    """Markdown lines: the fitted overhead, the value each model is scored with, and TTFT without it."""
    none, shipped = Errors.empty(), Errors.empty()
    for entry in pending:
        for per_layer, errors in ((0.0, none), (overheads.all_rows_s, shipped)):
            only_at, _ = entry.scored(per_layer)
            errors.extend(errors_of(only_at, entry.labelled, entry.only.moe_at, entry.cap, entry.waves))
    count = sum(len(values) for values in overheads.samples.values())
    lines = [f"\nvLLM's prefill overhead (`[step_model.engine] prefill_overhead_s`, per target layer): the median "
             f"of {count} vLLM shapes at their lowest concurrency over {len(overheads.samples)} models is "
             f"{overheads.all_rows_s * 1e3:.3f} ms (shipped: {PREFILL_OVERHEAD_PER_LAYER_S * 1e3:.3f} ms). The "
             "derived figures above score each model with the median of the other models' rows: "
             + "; ".join(f"{model} {value * 1e3:.3f} ms" for model, value in sorted(overheads.held_out.items()))
             + "."]
    lines.append(f"Derived only, every row: TTFT {cell(none.ttft)} and E2E {cell(none.e2e)} without it; "
                 f"{cell(shipped.ttft)} and {cell(shipped.e2e)} with the all-rows value (fitted on these rows).")
    return lines


#: A row whose closed-loop rate needs more than this share of the GPUs' time for its target's GEMMs alone, at the
#: rate AIConfigurator's database times those GEMMs bound by compute, did not run as labelled (:func:`matrix_shares`).
UNLABELLED_SHARE = 1.0


def matrix_shares(configuration: silicon.SiliconConfiguration, runs: list) -> list[tuple[float, float]] | None:
    """Per run of a dense configuration, the share of its GPUs' time its closed-loop rate needs for the target's
    GEMMs: ``(at the GPU's peak, at the database's compute-bound rate)``; None for MoE or what derive cannot price.

    A closed loop of N clients completes N / E2E requests a second, each multiplying its ISL + OSL token rows by
    the weights. At the GPU's peak tensor FLOP/s a row takes at least ``Pricer.row_compute_floor_s``
    (``2 P / (TP F)``); at the rate the database itself times the target's GEMMs at 8,192 rows (where they are
    bound by compute, ``StepBound.gemm_row_s``) it takes that. The second is still a lower bound of what the rows
    need: it leaves out attention, the decode steps' weight reads and every overhead. Over
    :data:`UNLABELLED_SHARE` the row did not run as labelled (fewer GPUs, or prompts served from a prefix cache).
    """
    from sdplan.derive import Models, Pricer, load_aic

    request, _ = derive_request(configuration, runs, None)
    if request is None:
        return None
    models = Models()
    try:
        pricer = Pricer(load_aic(), request, models)
        floor, database = pricer.row_compute_floor_s(), pricer.target_bound.gemm_row_s
    except Exception:  # noqa: BLE001  (a configuration AIConfigurator cannot build: nothing to say)
        return None
    finally:
        models.close()
    if floor <= 0.0 or database <= 0.0:
        return None
    rows_per_s = [run.concurrency / run.mean_e2e_latency_s * (run.prompt_tokens + run.output_tokens) for run in runs]
    return [(rate * floor, rate * database) for rate in rows_per_s]


@dataclass
class Scored:
    """A derived configuration's errors: derived only on every row and on the held-out rows, anchored on the fit
    split (None where no anchor), and the fitted calibration's, on the held-out rows."""

    name: str
    kind: str  # dense or MoE
    engine: str  # the rows' backend
    database: str
    kept: list  # the rows scored
    only: Errors
    only_held: Errors
    anchored: Errors | None
    fitted: Errors


def derived_report(entries: list[Scored]) -> list[str]:
    """Markdown lines: derived only on every row, and derived only / anchored / fitted on the held-out rows."""
    lines = [("| configuration | kind | database | rows | derived only: E2E MAPE (bias) | TPOT | TTFT | held rows | "
             "derived only, held: E2E / TPOT | anchored on the fit split, held: E2E | TPOT | TTFT | "
             "fitted, held: E2E / TPOT |"), "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    pooled = {name: Errors.empty() for name in ("only", "only_held", "anchored", "fitted_anchored", "fitted")}
    only_anchored = Errors.empty()
    buckets: dict[str, Errors] = collections.defaultdict(Errors.empty)
    by_kind: dict[str, Errors] = collections.defaultdict(Errors.empty)
    with_ttft: dict[str, list[float]] = collections.defaultdict(list)
    for entry in entries:
        name, kind, engine, database, kept = entry.name, entry.kind, entry.engine, entry.database, entry.kept
        only, only_held, anchored, fitted = entry.only, entry.only_held, entry.anchored, entry.fitted
        pooled["only"].extend(only)
        pooled["only_held"].extend(only_held)
        pooled["fitted"].extend(fitted)
        by_kind[kind].extend(only)
        by_kind[f"{engine} engine"].extend(only)
        # E2E with the measured TTFT in place of the predicted one: how far TPOT alone is off
        with_ttft[kind] += [(run.mean_ttft_s + (run.output_tokens - 1.0) * run.mean_tpot_s * (1.0 + tpot))
                            / run.mean_e2e_latency_s - 1.0 for run, tpot in zip(kept, only.tpot)]
        if anchored is not None:
            pooled["anchored"].extend(anchored)
            pooled["fitted_anchored"].extend(fitted)
            only_anchored.extend(only_held)
        add_to_buckets(buckets, kept, only, kind)
        anchored_cells = (f"{cell(anchored.e2e)} | {cell(anchored.tpot)} | {cell(anchored.ttft)}"
                          if anchored is not None else "- | - | -")
        lines.append(f"| {name} | {kind} | {database} | {len(kept)} | {cell(only.e2e)} | {cell(only.tpot)} | "
                     f"{cell(only.ttft)} | {len(only_held.e2e)} | {mape(only_held.e2e):.1f}% / "
                     f"{mape(only_held.tpot):.1f}% | {anchored_cells} | {mape(fitted.e2e):.1f}% / "
                     f"{mape(fitted.tpot):.1f}% |")
    anchored_count = sum(1 for entry in entries if entry.anchored is not None)
    lines.append(f"| **pooled, {len(entries)} configurations** | | | {len(pooled['only'].e2e)} | "
                 f"**{cell(pooled['only'].e2e)}** | **{cell(pooled['only'].tpot)}** | "
                 f"**{cell(pooled['only'].ttft)}** | "
                 f"{len(pooled['only_held'].e2e)} | {mape(pooled['only_held'].e2e):.1f}% / "
                 f"{mape(pooled['only_held'].tpot):.1f}% | {cell(pooled['anchored'].e2e)} | "
                 f"{cell(pooled['anchored'].tpot)} | {cell(pooled['anchored'].ttft)} "
                 f"({anchored_count} configurations) | {mape(pooled['fitted'].e2e):.1f}% / "
                 f"{mape(pooled['fitted'].tpot):.1f}% |")
    lines += group_table("derived only, rows of", by_kind, buckets)
    lines.append("\nDerived only, E2E with the measured TTFT in place of the predicted one (TPOT's share of the "
                 "error): " + "; ".join(f"{kind} {cell(errors)}" for kind, errors in sorted(with_ttft.items())) + ".")
    if pooled["anchored"].e2e:
        lines.append(f"\nOn the {len(pooled['anchored'].e2e)} held-out rows of the {anchored_count} anchored "
                     f"configurations: derived only E2E {cell(only_anchored.e2e)}, TPOT {cell(only_anchored.tpot)}, "
                     f"TTFT {cell(only_anchored.ttft)}; anchored on the fit split E2E {cell(pooled['anchored'].e2e)}, "
                     f"TPOT {cell(pooled['anchored'].tpot)}, TTFT {cell(pooled['anchored'].ttft)}; fitted E2E "
                     f"{cell(pooled['fitted_anchored'].e2e)}, TPOT {cell(pooled['fitted_anchored'].tpot)}, TTFT "
                     f"{cell(pooled['fitted_anchored'].ttft)}.")
    return lines


# ----------------------------------------------------------------------------- report


def _backends(text: str) -> tuple[str, ...]:
    """``--backends``: engine names from :data:`ALL_BACKENDS`, comma-separated."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in ALL_BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{','.join(unknown) or text!r}: choose from {','.join(ALL_BACKENDS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", default=silicon.PACKAGED, help="silicon_sample.csv (default: the installed one)")
    parser.add_argument("--split", choices=("concurrency", "length"), default="concurrency")
    parser.add_argument("--aic", action="store_true", help="also AIConfigurator's own estimate (needs the package)")
    parser.add_argument("--derived", action="store_true",
                        help="also sdplan derive's calibrations, derived only and anchored (needs the package)")
    parser.add_argument("--kv-cap", action="store_true",
                        help="with --derived: a closed loop past the KV cache AIConfigurator's memory model allows "
                        "waits for admission (sdplan.fitting.validation.predict_latency's batch_cap)")
    parser.add_argument("--rounds", type=float, default=ROUNDS,
                        help=f"with --derived: requests per client of the measured closed loops, over which their "
                        f"opening wave spreads (default {ROUNDS:g}; at least 1)")
    parser.add_argument("--waves", choices=("opening", "engine", "engine-any", "none"), default="opening",
                        help="with --derived: the closed loops' waves of prompts as vLLM's opening wave, for every "
                        "engine (default: the TTFT of 2026-11-29); as the derived file's engine schedules them, the "
                        "prefill-first wave recurring where the rows' benchmark sent fixed lengths (engine) or "
                        "wherever the engine is SGLang (engine-any); or none (the TTFT before 2026-11-29)")
    parser.add_argument("--keep-unlabelled", action="store_true",
                        help="with --derived: anchor to and score the rows that need more than the GPUs' time for "
                        "the target's GEMMs (by default screened as not run as labelled, and listed)")
    parser.add_argument("--backends", type=_backends, default=BACKENDS, metavar="LIST",
                        help=f"engines whose rows are scored, comma-separated from {','.join(ALL_BACKENDS)} "
                        f"(default {','.join(BACKENDS)}, the rows of the issue's figures)")
    parser.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    args = parser.parse_args(argv)
    path = silicon.resolve_path(args.csv)
    text = path.read_text(encoding="utf-8")
    sources = {line: row.get("silicon_data_source", "") for line, row in silicon.parse_rows(str(path), text)}
    table = []
    pooled, pooled_roof, pooled_aic, sdplan_aic = Errors.empty(), Errors.empty(), Errors.empty(), Errors.empty()
    aic_failures: list[str] = []
    by_group: dict[str, Errors] = collections.defaultdict(Errors.empty)
    buckets: dict[str, Errors] = collections.defaultdict(Errors.empty)
    folded = []
    own_fit: dict[str, list[float]] = collections.defaultdict(list)  # the pooled fit's MAPE on its own rows
    per_shape: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)  # (R2, worst residual)
    derived: list[Scored] = []
    not_derived: list[str] = []
    peak_shares: list[str] = []  # dense configurations: the largest share of peak matrix throughput a row needs
    unlabelled_rows: list[str] = []  # rows screened from the derived scores (matrix_shares)
    unlabelled_errors: dict[str, Errors] = collections.defaultdict(Errors.empty)
    reader_notes: list[str] = []  # e.g. a measurement listed in several rows of one configuration, counted once
    pending: list[Pending] = []  # derived configurations, scored once the prefill overheads are fitted
    for configuration, runs, repeats, notes in configurations(text, str(path), args.backends):
        reader_notes += [f"{label(configuration)}: {note}" for note in notes]
        kept = [run for run in runs if not screen(run)]
        train, held = split(kept, args.split)
        if not held or len(train) < 3:
            continue
        fit = fit_pooled(train)
        kind = "MoE" if configuration.model.rpartition("/")[2].lower() in MOE_MODELS else "dense"
        own_fit[kind].append(fit.mape_pct)
        for shape in fit_configurations(kept):  # L = C1 + B C2 per (ISL, OSL) over all its concurrencies
            members = [r for r in kept if (round(r.prompt_tokens), round(r.output_tokens))
                       == (shape.prompt_tokens, shape.output_tokens)]
            worst = max(abs((shape.c1_s + r.mean_others * shape.c2_s) / r.mean_e2e_latency_s - 1) for r in members)
            per_shape[kind].append((shape.r2, worst))
        errors = errors_of(fit.coefficients_at, held)
        predictor = roofline_predictor(configuration)
        roof = errors_of(predictor, held) if predictor is not None else None
        aic = None
        if args.aic:
            quant = (configuration.quant.partition("/")[0], configuration.quant.partition("/")[2]
                     or configuration.quant.partition("/")[0])
            predict, used = aic_predictor(configuration, quant)
            if predict is None:
                aic_failures.append(f"{label(configuration)} ({used})")
            else:
                try:
                    aic = aic_errors(predict, held)
                except Exception as error:  # noqa: BLE001  (its database lacks an operation: report it)
                    aic_failures.append(f"{label(configuration)} ({type(error).__name__}: "
                                        f"{str(error).split(' at ')[0][:120]})")
                else:
                    pooled_aic.extend(aic)
                    sdplan_aic.extend(errors)
        if args.derived:
            kind = "MoE" if configuration.model.rpartition("/")[2].lower() in MOE_MODELS else "dense"
            shares = matrix_shares(configuration, kept) if kind == "dense" else None
            if shares is not None:
                peak_shares.append(f"{label(configuration)} {100 * max(peak for peak, _ in shares):.0f}%")
            # rows that did not run as labelled are neither anchored to nor scored (kept unless --keep-unlabelled)
            unlabelled = [] if shares is None or args.keep_unlabelled else \
                [(run, share) for run, share in zip(kept, shares) if share[1] > UNLABELLED_SHARE]
            screened = [run for run, _ in unlabelled]
            labelled = [run for run in kept if run not in screened]
            labelled_train = [run for run in train if run not in screened]
            labelled_held = [run for run in held if run not in screened]
            only, anchored, database = derived_predictors(configuration, labelled, labelled_train)
            if only is None:
                not_derived.append(f"{label(configuration)} ({database})")
            else:
                cap = kv_cap(only) if args.kv_cap else None
                fixed = args.waves == "engine-any" or (args.waves == "engine" and fixed_lengths(kept, sources))
                waves = None if args.waves == "none" else derived_waves(only, 0, args.rounds, fixed)
                if waves is not None and args.waves == "opening":
                    waves = replace(waves, scheduling=prefill_scheduling("vllm", ""))
                pending.append(Pending(configuration, kind, database, labelled, labelled_held, unlabelled,
                                       only, anchored, fit, cap, waves))
        pooled.extend(errors)
        if roof is not None:
            pooled_roof.extend(roof)
        moe = configuration.model.rpartition("/")[2].lower() in MOE_MODELS
        for group in (configuration.backend, configuration.system.partition("_")[0], "MoE" if moe else "dense"):
            by_group[group].extend(errors)
        add_to_buckets(buckets, held, errors)
        folded += [(label(configuration), repeat) for repeat in repeats]
        table.append((label(configuration), "MoE" if moe else "dense", len(train), len(held), errors, roof, aic))
    lines = []
    header = ("| configuration | kind | fit / held rows | E2E MAPE (bias) | TPOT MAPE (bias) | TTFT MAPE (bias) "
              "| roofline E2E / TPOT MAPE (bias) |" + (" AIConfigurator E2E / TPOT MAPE (bias) |" if args.aic else ""))
    lines += [header, "|---|---|---|---|---|---|---|" + ("---|" if args.aic else "")]

    def pair(other: Errors | None) -> str:
        return f"{mape(other.e2e):.1f}% / {mape(other.tpot):.1f}% ({bias(other.e2e):+.1f}%)" if other else "-"

    for name, kind, fitted, held_count, errors, roof, aic in table:
        lines.append(f"| {name} | {kind} | {fitted} / {held_count} | {cell(errors.e2e)} | {cell(errors.tpot)} | "
                     f"{cell(errors.ttft)} | {pair(roof)} |" + (f" {pair(aic)} |" if args.aic else ""))
    lines.append(f"| **pooled, {len(table)} configurations** | | {sum(t[2] for t in table)} / {len(pooled.e2e)} | "
                 f"**{cell(pooled.e2e)}** | **{cell(pooled.tpot)}** | **{cell(pooled.ttft)}** | "
                 f"{mape(pooled_roof.e2e):.1f}% / {mape(pooled_roof.tpot):.1f}% ({bias(pooled_roof.e2e):+.1f}%), "
                 f"{len(pooled_roof.e2e)} rows |"
                 + (f" {pair(pooled_aic)}, {len(pooled_aic.e2e)} rows |" if args.aic else ""))
    lines += group_table("held-out rows of", by_group, buckets)
    if pooled_roof.e2e:
        sdplan_same = Errors.empty()
        for _, _, _, _, errors, roof, _ in table:
            if roof is not None:
                sdplan_same.extend(errors)
        lines.append(f"\nOn the {len(pooled_roof.e2e)} held-out rows the roofline covers: sdplan fitted E2E "
                     f"{cell(sdplan_same.e2e)}, TPOT {cell(sdplan_same.tpot)}, TTFT {cell(sdplan_same.ttft)}; "
                     f"roofline E2E {cell(pooled_roof.e2e)}, TPOT {cell(pooled_roof.tpot)}, "
                     f"TTFT {cell(pooled_roof.ttft)}.")
    if args.aic and pooled_aic.e2e:
        lines.append(f"\nOn the {len(pooled_aic.e2e)} held-out rows AIConfigurator's engine covers: sdplan fitted E2E "
                     f"{cell(sdplan_aic.e2e)}, TPOT {cell(sdplan_aic.tpot)}, TTFT {cell(sdplan_aic.ttft)}; "
                     f"AIConfigurator (static batch) E2E {cell(pooled_aic.e2e)}, TPOT {cell(pooled_aic.tpot)}, "
                     f"TTFT {cell(pooled_aic.ttft)}.")
    if aic_failures:
        lines.append("\nAIConfigurator's engine did not compile: " + "; ".join(aic_failures) + ".")
    for kind in sorted(own_fit):
        r2s = sorted(r2 for r2, _ in per_shape[kind])
        worst = sorted(w for _, w in per_shape[kind])
        lines.append(f"\n{kind}: the pooled fit's E2E MAPE on its own rows, median over configurations "
                     f"{sorted(own_fit[kind])[len(own_fit[kind]) // 2]:.1f}% (max {max(own_fit[kind]):.1f}%); "
                     f"L = C1 + B C2 fitted per (ISL, OSL) over all its concurrencies ({len(r2s)} shapes): median R2 "
                     f"{r2s[len(r2s) // 2]:.4f}, worst row within {100 * worst[len(worst) // 2]:.1f}% (median over "
                     f"shapes), {100 * worst[int(0.9 * (len(worst) - 1))]:.1f}% (90th percentile).")
    if folded:
        lines.append("\nCounted once (the same measurements under another label): "
                     + "; ".join(f"{repeat} = {name}" for name, repeat in folded) + ".")
    if reader_notes:
        lines.append("\nThe silicon reader's notes: " + "; ".join(reader_notes) + ".")
    if args.derived:
        overheads = prefill_overheads(pending)
        for entry in pending:
            only_at, anchored_at = entry.scored(overheads.held_out[model_family(entry.configuration.model)])
            for run, share in entry.unlabelled:
                error = errors_of(only_at, [run], entry.only.moe_at, entry.cap, entry.waves)
                unlabelled_rows.append(
                    f"{label(entry.configuration)} {run.prompt_tokens:.0f}/{run.output_tokens:.0f} at "
                    f"{run.concurrency:.0f} clients: {100 * share[1]:.0f}% ({100 * share[0]:.0f}% at peak), "
                    f"derived-only E2E {100 * error.e2e[0]:+.1f}%")
                unlabelled_errors[entry.kind].extend(error)
            derived.append(Scored(
                label(entry.configuration), entry.kind, entry.configuration.backend, entry.database, entry.labelled,
                errors_of(only_at, entry.labelled, entry.only.moe_at, entry.cap, entry.waves),
                errors_of(only_at, entry.held, entry.only.moe_at, entry.cap, entry.waves),
                errors_of(anchored_at, entry.held, entry.anchored.moe_at, entry.cap, entry.waves)
                if anchored_at is not None else None,
                errors_of(entry.fit.coefficients_at, entry.held)))
        lines += ["", f"## sdplan derive's calibrations ({args.split} split)", ""] + derived_report(derived)
        lines += prefill_overhead_report(overheads, pending)
        if not_derived:
            lines.append("\nsdplan derive cannot price: " + "; ".join(not_derived) + ".")
        if peak_shares:
            lines.append("\nThe largest share of the GPUs' peak matrix throughput (dense FLOP/s at the rows' "
                         "precision) a row's closed-loop rate needs, per dense configuration: "
                         + "; ".join(peak_shares) + ".")
        if unlabelled_rows:
            lines.append(f"\nNot scored above, as not run as labelled ({len(unlabelled_rows)} rows whose closed-loop "
                         "rate needs more than the GPUs' time for the target's GEMMs alone at the rate "
                         "AIConfigurator's database times them bound by compute; at peak in brackets): "
                         + "; ".join(unlabelled_rows) + ".")
            for kind, errors in sorted(unlabelled_errors.items()):
                everything = Errors.empty()
                for entry in derived:
                    if entry.kind == kind:
                        everything.extend(entry.only)
                everything.extend(errors)
                lines.append(f"Derived only, {kind}, with them: E2E {cell(everything.e2e)}, TPOT "
                             f"{cell(everything.tpot)}, TTFT {cell(everything.ttft)} ({len(everything.e2e)} rows).")
    report = "\n".join(lines)
    print(f"split: {args.split}; data: {path}")
    print(report)
    goal = mape(pooled.e2e) <= 10.0 and mape(pooled.tpot) <= 10.0 and mape(pooled.ttft) <= 25.0 and len(table) >= 20
    print(f"\ngoal (E2E and TPOT <= 10%, TTFT <= 25%, >= 20 configurations): {'met' if goal else 'NOT met'}")
    if args.markdown:
        Path(args.markdown).write_text(report + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
