"""``vllm bench serve`` results as :class:`~sdplan.runs.record.BenchmarkRun` records.

What is read (checked against vLLM 0.32's ``vllm/benchmarks/serve.py`` and
``sweep/serve.py``): ``bench serve --save-result`` files, one JSON object per
file; ``--append-result`` files (JSON Lines, one object per run); and
``vllm bench sweep serve`` output folders (``run=N.json`` files; ``summary``,
``warmup`` and ``*.failure.json`` are skipped). Fields: ``request_rate``
(number or ``"inf"``), ``max_concurrency`` (a closed loop when the rate is
``inf``), ``completed``, ``failed``, ``duration``, token totals, ``mean_*_ms``
and ``p*_ms`` metrics, the ``spec_decode_*`` fields (acceptance rate in
**percent**), and with ``--save-detailed`` the per-request lists
``start_times``, ``latencies``, ``ttfts``, ``output_lens``, ``queue_times``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdplan.errors import InputFileError
from sdplan.inputs.acceptance import alpha_from_mean_length
from sdplan.runs.record import (
    BenchmarkRun,
    count,
    full_load_share,
    is_finite_number,
    number,
    optional_number,
    others_in_flight,
    percentile_fields,
)
from sdplan.runs.screen import held_back, kept_up_fraction, sent_in_bursts, stalled_share

#: How :mod:`sdplan.runs.read` names this format (``--input-format vllm``) and describes it in errors.
NAME = "vllm"
DESCRIPTION = "vLLM bench serve JSON"


def detects(path: Path, document: Any) -> bool:
    """Whether a decoded JSON document is a ``vllm bench serve`` result (and not a GuideLLM report)."""
    return (isinstance(document, dict) and not isinstance(document.get("benchmarks"), list)
            and ("request_throughput" in document or "completed" in document))


def read(path: str, document: dict[str, Any]) -> tuple[list[BenchmarkRun], list[str]]:
    """The run of one result object, and no warnings (the run carries its notes)."""
    if "benchmarks" in document and "completed" not in document:
        raise InputFileError(path, None, "this is a GuideLLM report; use --input-format guidellm or auto")
    return [read_run(path, document)], []


def _acceptance_from_vllm(document: dict[str, Any], path: str) -> tuple[int, float | None, float | None, list[str]]:
    """(draft length, per-token alpha, mean acceptance length, notes) from vLLM's spec_decode fields."""
    per_position = document.get("spec_decode_per_position_acceptance_rates")
    drafts = document.get("spec_decode_num_drafts")
    draft_tokens = document.get("spec_decode_draft_tokens")
    k = None
    if isinstance(per_position, list) and per_position:
        k = len(per_position)
    elif drafts and draft_tokens:
        k = round(number(draft_tokens, path, "spec_decode_draft_tokens")
                  / number(drafts, path, "spec_decode_num_drafts"))
    for key in ("num_speculative_tokens", "draft_length"):
        if k is None and document.get(key) is not None:
            k = count(document[key], path, key)
    if not k:
        return 0, None, None, []
    length = document.get("spec_decode_acceptance_length")
    rate = document.get("spec_decode_acceptance_rate")
    if length is not None:
        tau = number(length, path, "spec_decode_acceptance_length")
    elif rate is not None:
        tau = 1.0 + k * number(rate, path, "spec_decode_acceptance_rate") / 100.0  # percent
    else:
        return k, None, None, ["SD run without acceptance fields"]
    tau = min(max(tau, 1.0), k + 1.0)
    return k, float(alpha_from_mean_length(tau, k)), tau, []


def _position_rates(document: dict[str, Any], path: str, k: int) -> tuple[float, ...] | None:
    """vLLM's ``spec_decode_per_position_acceptance_rates`` (fractions, non-increasing), if the run has k of them.

    Rounding can leave a later rate a hair above an earlier one; the running minimum keeps them
    a valid sequence (position ``i`` is accepted only where ``i - 1`` was).
    """
    rates = document.get("spec_decode_per_position_acceptance_rates")
    if not k or not isinstance(rates, list) or len(rates) != k:
        return None
    values: list[float] = []
    for index, rate in enumerate(rates):
        value = number(rate, path, f"spec_decode_per_position_acceptance_rates[{index}]")
        if not 0.0 <= value <= 1.0:
            raise InputFileError(path, f"spec_decode_per_position_acceptance_rates[{index}]",
                                 f"is {value}; vLLM writes fractions in [0, 1]")
        values.append(min(value, values[-1]) if values else value)
    return tuple(values)


def draft_coverage(document: dict[str, Any], completed: int) -> float | None:
    """The fraction of decode steps that carried a draft, from a vLLM result's counters.

    vLLM counts a draft only when a step verified draft tokens; each such step
    emits its accepted tokens plus one. The other decode steps emitted one token
    each, so with ``T`` output tokens over ``n`` requests (one from each prefill),
    ``d`` drafts and ``a`` accepted tokens there were ``max(0, T - n - d - a)``
    steps without a draft. Draft models draft on every step (1, up to the last
    step's overshoot); prompt lookup (``ngram``, ``suffix``) only where the
    context repeats.
    """
    values = [document.get(key, math.nan) for key in ("total_output_tokens", "spec_decode_num_drafts",
                                                      "spec_decode_accepted_tokens")]
    if not all(is_finite_number(v) and v >= 0
               for v in values) or completed < 1:
        return None
    total, drafts, accepted = (float(v) for v in values)
    if drafts <= 0:
        return 0.0 if total > completed else None
    undrafted = max(0.0, total - completed - drafts - accepted)
    return drafts / (drafts + undrafted)


def _list(document: dict[str, Any], key: str, count: int, notes: list[str] | None = None) -> list[float] | None:
    """A per-request list of ``count`` finite numbers, else None (and, for a list of the right length
    with other entries, a note in ``notes`` that the run is read without it)."""
    values = document.get(key)
    if not isinstance(values, list) or len(values) != count or not values:
        return None
    if not all(is_finite_number(v) for v in values):
        if notes is not None:
            notes.append(f"{key}: not all finite numbers; read without this per-request list")
        return None
    return [float(v) for v in values]


def _chunk_gaps(document: dict[str, Any], count: int) -> list[list[float]] | None:
    """vLLM's ``itls`` (``--save-detailed``): per request, the times between its streamed chunks (s); None unless
    every one of the ``count`` entries is a list of finite numbers."""
    values = document.get("itls")
    if not isinstance(values, list) or len(values) != count or not values:
        return None
    if not all(isinstance(v, list) and all(is_finite_number(x) for x in v) for v in values):
        return None
    return [[float(x) for x in v] for v in values]


@dataclass(frozen=True, slots=True)
class _Load:
    """What a result's summary fields say about the load: counts, rates, loop kind and mean lengths."""

    completed: int
    failed: int
    duration_s: float | None
    achieved_rps: float
    requested_rps: float | None
    unbounded_rate: bool
    concurrency: int | None
    ramp_up: str | None
    closed: bool
    burstiness: float | None
    client_cap: int | None
    prompt_tokens: float
    output_tokens: float


@dataclass
class _Latency:
    """A run's latency means (s), percentiles and the load its requests saw, filled in phase by phase."""

    mean_e2e_s: float | None
    mean_ttft_s: float | None
    mean_tpot_s: float | None
    percentiles: list[tuple[str, float]] = field(default_factory=list)
    others: float | None = None
    others_ttft: float | None = None
    kept_up: float | None = None
    full_load: float | None = None


def _throughput(path: str, document: dict[str, Any]) -> tuple[int, int, float | None, float]:
    """(completed, failed, duration in s, achieved rate in req/s) of a result, checked."""
    if document.get("completed") is None:
        raise InputFileError(path, "completed", "missing; not a vLLM bench serve result?")
    completed = count(document["completed"], path, "completed")
    if completed <= 0:
        raise InputFileError(path, "completed", "no completed requests; nothing to fit")
    failed = count(document.get("failed", 0) or 0, path, "failed")
    duration = optional_number(document.get("duration"), path, "duration")
    if duration is not None and duration <= 0:
        raise InputFileError(path, "duration", f"must be > 0 s, got {duration:g}")
    if document.get("request_throughput") is not None:
        achieved = number(document["request_throughput"], path, "request_throughput")
    elif duration:
        achieved = completed / duration
    else:
        raise InputFileError(path, "request_throughput", "missing (and no duration to derive it)")
    if achieved <= 0:
        raise InputFileError(path, "request_throughput", "must be > 0")
    return completed, failed, duration, achieved


def _load(path: str, document: dict[str, Any]) -> _Load:
    """The summary fields of a result: how many requests, at what load, of what lengths."""
    completed, failed, duration, achieved = _throughput(path, document)
    requested = optional_number(document.get("request_rate"), path, "request_rate", allow_inf=True)
    if requested is not None and requested <= 0:
        raise InputFileError(path, "request_rate", f"must be > 0 req/s (or \"inf\"), got {requested:g}")
    unbounded_rate = requested is None or math.isinf(requested)
    max_concurrency = document.get("max_concurrency")
    concurrency = count(max_concurrency, path, "max_concurrency") if max_concurrency is not None else None
    if concurrency == 0:
        concurrency = None
    # --ramp-up-strategy raises the arrival rate during the run (request_rate is then "inf";
    # vllm/benchmarks/serve.py writes ramp_up_strategy/_start_rps/_end_rps): no one load, not a closed loop
    ramp_up = None
    if document.get("ramp_up_strategy"):
        ends = [document.get("ramp_up_start_rps"), document.get("ramp_up_end_rps")]
        ramp_up = f"{document['ramp_up_strategy']} from {ends[0]} to {ends[1]} req/s"
    burstiness = client_cap = None
    if not unbounded_rate:  # an open loop at a finite rate: how its requests arrived
        burstiness = optional_number(document.get("burstiness"), path, "burstiness", allow_inf=True)
        if burstiness is not None and burstiness <= 0:
            raise InputFileError(path, "burstiness", f"must be > 0 (1 for Poisson arrivals), got {burstiness:g}")
        client_cap = concurrency
    for key in ("total_input_tokens", "total_output_tokens"):
        if document.get(key) is None:
            raise InputFileError(path, key, "missing; needed for the prompt/output lengths")
    prompt = number(document["total_input_tokens"], path, "total_input_tokens") / completed
    output = number(document["total_output_tokens"], path, "total_output_tokens") / completed
    if prompt <= 0 or output <= 0:
        raise InputFileError(path, "total_output_tokens", "prompt and output lengths must be > 0")
    return _Load(completed=completed, failed=failed, duration_s=duration, achieved_rps=achieved,
                 requested_rps=requested, unbounded_rate=unbounded_rate, concurrency=concurrency, ramp_up=ramp_up,
                 closed=unbounded_rate and concurrency is not None and ramp_up is None, burstiness=burstiness,
                 client_cap=client_cap, prompt_tokens=prompt, output_tokens=output)


def _summary_latency(path: str, document: dict[str, Any]) -> _Latency:
    """The summary's mean TTFT, TPOT and E2E latency (s), each None where the file lacks it."""

    def metric_s(key: str) -> float | None:
        value = optional_number(document.get(key), path, key)
        return value / 1e3 if value is not None else None

    ttft_s, tpot_s = metric_s("mean_ttft_ms"), metric_s("mean_tpot_ms")
    return _Latency(mean_e2e_s=metric_s("mean_e2el_ms"), mean_ttft_s=ttft_s, mean_tpot_s=tpot_s)


def _summary_percentiles(document: dict[str, Any]) -> list[tuple[str, float]]:
    """The summary's median, p90 and p99 of E2E latency, TTFT and TPOT (s), where recorded."""
    percentiles = []
    for metric in ("e2el", "ttft", "tpot"):
        for q in (50, 90, 99):
            value = document.get(f"p{q}_{metric}_ms" if q != 50 else f"median_{metric}_ms", math.nan)
            if is_finite_number(value):
                label = "e2e" if metric == "e2el" else metric
                percentiles.append((f"{label}_p{q}_s", float(value) / 1e3))
    return percentiles


def _from_requests(document: dict[str, Any], load: _Load, starts: list[float] | None, latencies: list[float],
                   ttfts: list[float] | None, result: _Latency, notes: list[str]) -> None:
    """Exact means, percentiles and the load each request saw, from the per-request lists (--save-detailed)."""
    result.mean_e2e_s = sum(latencies) / len(latencies)
    result.percentiles += percentile_fields(latencies, "e2e")
    if ttfts is not None:
        result.mean_ttft_s = sum(ttfts) / len(ttfts)
        result.percentiles += percentile_fields(ttfts, "ttft")
        outputs = _list(document, "output_lens", load.completed, notes)
        if outputs is not None:
            tpots = [(e2e - ttft) / (o - 1) for e2e, ttft, o in zip(latencies, ttfts, outputs) if o > 1]
            if tpots:
                result.mean_tpot_s = sum(tpots) / len(tpots)
                result.percentiles += percentile_fields(tpots, "tpot")
    requested = load.requested_rps
    if requested is not None and not load.unbounded_rate and load.duration_s:  # send order where no send times
        result.kept_up = kept_up_fraction(starts, latencies, load.duration_s, requested)
    if starts is not None:
        if load.closed and load.concurrency:
            result.full_load = full_load_share(starts, latencies, load.concurrency)
        result.others = others_in_flight(starts, latencies)
        if ttfts is not None:
            result.others_ttft = others_in_flight(starts, latencies, ttfts)
        if result.others is not None and not math.isfinite(result.others):
            result.others = result.others_ttft = None


def _mean_latency(path: str, result: _Latency, output_tokens: float, notes: list[str]) -> float:
    """The mean E2E latency (s): measured, else derived from the mean TTFT and TPOT."""
    latency = result.mean_e2e_s
    if latency is None:
        if result.mean_ttft_s is not None and result.mean_tpot_s is not None:
            latency = result.mean_ttft_s + result.mean_tpot_s * max(output_tokens - 1.0, 0.0)
            notes.append("mean E2E latency derived as TTFT + TPOT x (output - 1): e2el was not among "
                         "--percentile-metrics")
        else:
            raise InputFileError(path, "mean_e2el_ms", "missing, and no mean_ttft_ms/mean_tpot_ms to derive it; "
                                                       "rerun vllm bench serve with --percentile-metrics "
                                                       "ttft,tpot,itl,e2el")
    if latency <= 0:
        raise InputFileError(path, "mean_e2el_ms", "must be > 0")
    return latency


def _held_back_by_cap(document: dict[str, Any], load: _Load, starts: list[float] | None,
                      latencies: list[float] | None, notes: list[str]) -> str | None:
    """How an open loop's ``--max-concurrency`` held arrivals back (:func:`~sdplan.runs.screen.held_back`)."""
    if load.client_cap is None:
        return None
    queued = _list(document, "queue_times", load.completed, notes)
    held = held_back(load.client_cap, queued, starts, latencies)
    if held is None and queued is None and (starts is None or latencies is None):
        notes.append(f"open loop capped at {load.client_cap} requests in flight (--max-concurrency): without "
                     "per-request times (--save-detailed) sdplan cannot tell whether the cap held arrivals back")
    return held


def read_run(path: str, document: dict[str, Any]) -> BenchmarkRun:
    """One ``vllm bench serve`` result object (``path`` names it in errors and in the run's source).

    Read in phases: the summary fields (:func:`_load`), the latencies from the
    per-request lists where the file has them (``--save-detailed``), else from
    the summary, the client cap's hold-back, and the acceptance.
    """
    load = _load(path, document)
    notes: list[str] = []
    result = _summary_latency(path, document)
    # Per-request lists (--save-detailed): exact means and the load each request saw.
    latencies = _list(document, "latencies", load.completed, notes)
    ttfts = _list(document, "ttfts", load.completed, notes)
    starts = _list(document, "start_times", load.completed, notes)
    errors = document.get("errors")
    if latencies is not None and isinstance(errors, list) and any(errors):
        latencies = None  # with failures the lists mix failed and successful requests; use the summary
    if latencies is not None:
        _from_requests(document, load, starts, latencies, ttfts, result, notes)
    else:
        result.percentiles = _summary_percentiles(document)
    latency = _mean_latency(path, result, load.output_tokens, notes)
    held = _held_back_by_cap(document, load, starts, latencies, notes)
    # bursts tell a late client only where the arrivals were Poisson: gamma gaps (--burstiness < 1) bunch anyway
    poisson = not load.unbounded_rate and load.burstiness in (None, 1.0)
    late = sent_in_bursts(starts, load.requested_rps, load.duration_s) if held is None and poisson else None
    k, alpha, tau, more = _acceptance_from_vllm(document, path)
    stalled = stalled_share(_chunk_gaps(document, load.completed)) if latencies is not None else None
    unbounded = load.unbounded_rate
    return BenchmarkRun(
        source=Path(path.split("#")[0]).name + ("#" + path.split("#")[1] if "#" in path else ""),
        requested_rate_rps=None if unbounded else load.requested_rps, achieved_rate_rps=float(load.achieved_rps),
        concurrency=load.concurrency if load.closed else None, others_in_flight=result.others,
        others_at_first_token=result.others_ttft, draft_length=k, alpha=alpha, mean_acceptance_length=tau,
        prompt_tokens=load.prompt_tokens, output_tokens=load.output_tokens,
        draft_coverage=draft_coverage(document, load.completed) if k else None,
        position_rates=_position_rates(document, path, k), mean_e2e_latency_s=latency,
        mean_ttft_s=result.mean_ttft_s, mean_tpot_s=result.mean_tpot_s, percentiles_s=tuple(result.percentiles),
        completed=load.completed, failed=load.failed,
        open_loop_unbounded=unbounded and not load.closed and load.ramp_up is None, kept_up=result.kept_up,
        full_load_share=result.full_load, ramp_up=load.ramp_up, burstiness=load.burstiness,
        client_cap=load.client_cap, held_back_by_cap=held, sent_late=late, stalled_streams=stalled,
        # bench serve writes spec_decode_* whenever the server speculates: absent means no SD
        records_draft_length=True, records_acceptance=alpha is not None, notes=tuple(notes + more),
    )
