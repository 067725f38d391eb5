"""GuideLLM reports (``guidellm benchmark``/``guidellm run`` JSON) as :class:`~sdplan.runs.record.BenchmarkRun` records.

Schema v1-v2 (``metadata.version`` 1: GuideLLM 0.5-0.6; 2: 0.7-0.8; no ``metadata``:
0.4): ``benchmarks[]`` with ``config.strategy`` (``type_``, ``rate``, ``streams``,
``max_concurrency``, ``worker_count``), ``metrics.<name>.successful.mean`` and, in
0.4-0.8, every request in ``requests.successful[]`` / ``requests.incomplete[]`` with
its ``info.timings`` (epoch seconds). Checked against real GuideLLM 0.8.1, 0.6.1,
0.5.4 and 0.4.0 reports (tests/data/guidellm-cpu, tests/data/guidellm-0.5-cpu,
tests/data/guidellm-0.4-0.6-cpu).

GuideLLM 0.2-0.3 reports (no ``metadata``) keep the strategy in
``args.strategy``, the request counts in ``request_totals`` beside ``metrics``,
warm-up/cool-down in ``args`` and each request's times as ``start_time``,
``end_time``, ``first_token_time`` and ``scheduler_info.targeted_start_time``.
Checked against real GuideLLM 0.3.1 reports (tests/data/guidellm-0.3-cpu).

A benchmark whose strategy is missing or of a kind not listed here is read and
left out of fits (:attr:`~sdplan.runs.record.BenchmarkRun.unknown_load`): without
an arrival rate or a number of clients, the load it measured is unknown.

GuideLLM records no SD settings, but GuideLLM 0.7-0.8 records how many output
tokens each streamed chunk carried (``iter_tokens_per_iteration``,
``output_tokens_per_iteration``): vLLM streams one chunk per engine step, so
more than :data:`SD_TOKENS_PER_ITERATION` tokens per chunk means SD was on, and
the number is the mean acceptance length (:func:`tokens_per_decode_step`). Such
a run is left out of fits until its draft length is given (``FILE:k=K`` or
``--draft-length``; :attr:`~sdplan.runs.record.BenchmarkRun.speculation_unrecorded`),
and its alpha then follows from that length. A report without those metrics
is read as no SD unless ``FILE:k=K,len=L`` or the flags say otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdplan.errors import InputFileError
from sdplan.runs.record import (
    BenchmarkRun,
    count,
    is_finite_number,
    number,
    optional_number,
    others_in_flight,
    peak_in_flight,
)
from sdplan.runs.screen import held_back, kept_up_fraction

#: More output tokens than this per streamed iteration (after the first token) means SD was on: without SD
#: vLLM streams one token per engine step; the margin above one is for chunks merged when the client fell behind.
SD_TOKENS_PER_ITERATION = 1.1
#: How :mod:`sdplan.runs.read` names this format (``--input-format guidellm``) and describes it in errors.
NAME = "guidellm"
DESCRIPTION = "a GuideLLM report"

#: GuideLLM: a request started this much (s) after its scheduled time waited in the client. Its
#: dispatch takes 3-6 ms (median) with a p95 of 6-12 ms when nothing holds it back (real GuideLLM 0.8.1
#: runs, tests/data/guidellm-cpu); under a binding cap the waits were seconds.
LATE_S = 0.05


def repeated_gap_share(scheduled: list[float]) -> float | None:
    """Share of consecutive gaps between scheduled sends that equal the gap before (within 1 us).

    Independent draws from a continuous distribution (Poisson: exponential
    gaps) repeat with probability zero. GuideLLM 0.8.1's ``poisson`` strategy
    draws each gap in every worker process from one seed (``random_seed``, 42),
    and all of them add their draw to one shared clock: each gap comes
    ``worker_count`` times in a row (10 by default). Its real runs here: 77-90%
    repeated; constant rates repeat by design (they are screened as not
    Poisson anyway). None with fewer than 4 sends.
    """
    if len(scheduled) < 4:
        return None
    ordered = sorted(scheduled)
    gaps = [later - earlier for earlier, later in zip(ordered, ordered[1:])]
    repeats = sum(1 for before, gap in zip(gaps, gaps[1:]) if abs(gap - before) < 1e-6)
    return repeats / (len(gaps) - 1)


def schedule_rate(scheduled: list[float]) -> float | None:
    """Arrival rate (req/s) a recorded schedule realised: ``(n - 1)/(t_n - t_1)`` over its scheduled sends.

    The rate the model's ``B = lambda L`` needs (Little's law over the run).
    GuideLLM draws its Poisson gaps without rescaling them to the requested
    rate, so 300 requests at 11 req/s with its default seed were scheduled at
    10.49 req/s: predicted at 11 instead, a run at 55% load comes out about
    5% slow. None with fewer than 2 sends or a schedule of no length.
    """
    if len(scheduled) < 2:
        return None
    span = max(scheduled) - min(scheduled)
    return (len(scheduled) - 1) / span if span > 0 else None


def detects(path: Path, document: Any) -> bool:
    """Whether a decoded JSON document is a GuideLLM report (a ``benchmarks`` list)."""
    return isinstance(document, dict) and isinstance(document.get("benchmarks"), list)


def read(path: str, document: dict[str, Any]) -> tuple[list[BenchmarkRun], list[str]]:
    """The runs of one GuideLLM report (:func:`read_guidellm`), after checking it is one."""
    if not isinstance(document.get("benchmarks"), list):
        raise InputFileError(path, "benchmarks", "missing or not a list; not a GuideLLM report? "
                                                 "try --input-format vllm or auto")
    return read_guidellm(path, document)


def read_guidellm(path: str, document: dict[str, Any]) -> tuple[list[BenchmarkRun], list[str]]:
    """One run per benchmark of a GuideLLM report, and warnings about the report.

    ``synchronous``/``concurrent`` are closed loops of 1/``streams`` clients; ``poisson``/``constant`` open loops
    at ``rate`` (constant recorded as burstiness ``inf``); ``throughput`` a max-load run. With a complete request
    list (:func:`_requests`) the means, the load each request saw, the kept-up score, repeated gaps and late
    starts come from per-request times.
    """
    warnings = []
    metadata = document.get("metadata")
    version = metadata.get("version") if isinstance(metadata, dict) else None
    legacy = metadata is None and any(isinstance(bench, dict) and isinstance(bench.get("args"), dict)
                                      for bench in document["benchmarks"])
    # GuideLLM 0.4 writes no metadata, with 0.5's benchmarks (config.strategy, per-request info.timings)
    unversioned = metadata is None and not legacy and all(
        isinstance(bench, dict) and isinstance(bench.get("config"), dict)
        and isinstance(bench["config"].get("strategy"), dict) for bench in document["benchmarks"])
    if version not in (1, 2) and not legacy and not unversioned:
        warnings.append(f"{path}: GuideLLM report of an unchecked schema (metadata.version {version}; sdplan reads "
                        "GuideLLM 0.2-0.3, 0.4 (no metadata) and metadata.version 1-2, 0.5-0.8): read as version 2")
    runs = [_benchmark(path, f"benchmarks[{index}]", bench) for index, bench in enumerate(document["benchmarks"])]
    if not runs:
        raise InputFileError(path, "benchmarks", "empty; nothing to fit")
    return runs, warnings


@dataclass(frozen=True, slots=True)
class _Load:
    """The load a benchmark's strategy set: its kind, arrival rate (req/s) or clients, or why it is unknown."""

    kind: str
    requested_rps: float | None
    concurrency: int | None
    unknown_load: str | None


def _load(path: str, where: str, strategy: dict[str, Any], at: str) -> _Load:
    """A benchmark's load from its strategy (found at ``at``, see :func:`_strategy`)."""
    kind = str(strategy.get("type_", "unknown"))
    requested = None
    if kind in ("constant", "poisson") and strategy.get("rate") is not None:
        requested = number(strategy["rate"], path, f"{where}.{at}.rate")
    concurrency = None
    if kind == "synchronous":
        concurrency = 1
    elif kind == "concurrent" and strategy.get("streams") is not None:
        concurrency = count(strategy["streams"], path, f"{where}.{at}.streams") or None
    unknown_load = None
    if requested is None and concurrency is None and kind != "throughput":
        unknown_load = (f"GuideLLM strategy {kind!r} without a rate or streams" if strategy
                        else "no GuideLLM strategy (config.strategy or args.strategy)")
    return _Load(kind, requested, concurrency, unknown_load)


def _totals(path: str, where: str, bench: dict[str, Any], metrics: dict[str, Any]) -> tuple[int, int, int]:
    """(successful, errored, incomplete) request counts of a benchmark."""
    totals_at = "metrics.request_totals" if "request_totals" in metrics else "request_totals"
    totals = metrics.get("request_totals", bench.get("request_totals", {}))
    if not isinstance(totals, dict):
        raise InputFileError(path, f"{where}.{totals_at}", "expected an object of counts")
    successful = count(totals.get("successful", 0) or 0, path, f"{where}.{totals_at}.successful")
    failed = count(totals.get("errored", 0) or 0, path, f"{where}.{totals_at}.errored")
    # incomplete: cancelled unfinished when a time or count limit ended the run, not failures
    incomplete = count(totals.get("incomplete", 0) or 0, path, f"{where}.{totals_at}.incomplete")
    return successful, failed, incomplete


#: What :func:`_requests` reads: send times, latencies, TTFTs and scheduled sends (s), and the cut-off requests.
_RequestTimes = tuple[list[float], list[float], list[float] | None, list[float] | None,
                      tuple[list[float], list[float]]]


@dataclass
class _Measured:
    """A benchmark's means (latency in s, TTFT and ITL in ms) and, from per-request times, the load they saw."""

    achieved_rps: float
    mean_latency_s: float
    prompt_tokens: float
    output_tokens: float
    ttft_ms: float | None
    itl_ms: float | None
    mean_concurrency: float | None
    others: float | None = None
    others_ttft: float | None = None
    kept_up: float | None = None
    held: str | None = None
    repeated: float | None = None
    sent_late: str | None = None
    scheduled_rate_rps: float | None = None
    cap: int | None = None
    workers: int | None = None


def _summary(path: str, where: str, metrics: dict[str, Any]) -> _Measured:
    """A benchmark's summary means (``metrics.<name>.successful.mean``), the required ones checked > 0."""
    ttft = _optional_mean(metrics, "time_to_first_token_ms", path, where)
    itl = _optional_mean(metrics, "inter_token_latency_ms", path, where)
    achieved = _mean(metrics, "requests_per_second", path, where)
    latency = _mean(metrics, "request_latency", path, where)
    prompt = _mean(metrics, "prompt_token_count", path, where)
    output = _mean(metrics, "output_token_count", path, where)
    for key, value in (("requests_per_second", achieved), ("request_latency", latency),
                       ("prompt_token_count", prompt), ("output_token_count", output)):
        if value <= 0:
            raise InputFileError(path, f"{where}.metrics.{key}.successful.mean", "must be > 0")
    return _Measured(achieved_rps=achieved, mean_latency_s=latency, prompt_tokens=prompt, output_tokens=output,
                     ttft_ms=ttft, itl_ms=itl,
                     mean_concurrency=_optional_mean(metrics, "request_concurrency", path, where))


def _from_requests(timed: _RequestTimes, requested: float | None, strategy: dict[str, Any],
                   measured: _Measured) -> None:
    """Exact means, the load each request saw, the kept-up score, repeated gaps and late starts (:func:`_requests`)."""
    starts, latencies, ttfts, scheduled, cut_off = timed
    measured.mean_latency_s = sum(latencies) / len(latencies)
    if ttfts is not None:
        measured.ttft_ms = 1e3 * sum(ttfts) / len(ttfts)
    others = others_in_flight(starts, latencies, background=cut_off)
    others_ttft = (others_in_flight(starts, latencies, ttfts, background=cut_off)
                   if ttfts is not None else None)
    if math.isfinite(others):
        measured.others, measured.others_ttft = others, others_ttft
    if requested is not None:
        duration = max(start + latency for start, latency in zip(starts, latencies)) - min(starts)
        measured.kept_up = kept_up_fraction(starts, latencies, duration, requested)
        if scheduled is not None:
            measured.scheduled_rate_rps = schedule_rate(scheduled)
            measured.repeated = repeated_gap_share(scheduled)
            cap = measured.cap = _positive_int(strategy.get("max_concurrency"))
            late = [start - due for start, due in zip(starts, scheduled)]
            if cap is not None and peak_in_flight(starts, latencies) >= cap:
                measured.held = held_back(cap, late, None, None, wait_s=LATE_S)
            else:  # late with no cap reached: the client itself fell behind its schedule
                measured.sent_late = held_back(cap or 0, late, None, None, wait_s=LATE_S, waited_as="started late")
    measured.workers = _positive_int(strategy.get("worker_count"))


def _benchmark(path: str, where: str, bench: Any) -> BenchmarkRun:
    """One benchmark of a report (``where`` names it): its load, counts, summary means and per-request times."""
    if not isinstance(bench, dict) or not isinstance(bench.get("metrics"), dict):
        raise InputFileError(path, f"{where}.metrics", "missing or not an object")
    metrics = bench["metrics"]
    strategy, at = _strategy(bench)
    load = _load(path, where, strategy, at)
    successful, failed, incomplete = _totals(path, where, bench, metrics)
    measured = _summary(path, where, metrics)
    notes: list[str] = []
    if incomplete:
        notes.append(f"{incomplete} requests cut off unfinished when the run ended (GuideLLM incomplete): the "
                     "means are over finished requests")
    timed = _requests(bench, successful, notes)
    if timed is not None:
        _from_requests(timed, load.requested_rps, strategy, measured)
    requested = load.requested_rps
    return BenchmarkRun(
        source=f"{Path(path.split('#')[0]).name}#{where}", requested_rate_rps=requested,
        achieved_rate_rps=measured.achieved_rps, concurrency=load.concurrency, draft_length=0, alpha=None,
        prompt_tokens=measured.prompt_tokens, output_tokens=measured.output_tokens,
        mean_e2e_latency_s=measured.mean_latency_s,
        mean_ttft_s=measured.ttft_ms / 1e3 if measured.ttft_ms is not None else None,
        mean_tpot_s=measured.itl_ms / 1e3 if measured.itl_ms is not None else None,
        mean_concurrency=measured.mean_concurrency, others_in_flight=measured.others,
        others_at_first_token=measured.others_ttft, completed=successful or None, failed=failed,
        open_loop_unbounded=load.kind == "throughput",
        burstiness={"constant": math.inf, "poisson": 1.0}.get(load.kind) if requested is not None else None,
        kept_up=measured.kept_up, client_cap=measured.cap, held_back_by_cap=measured.held,
        repeated_gaps=measured.repeated, client_workers=measured.workers, sent_late=measured.sent_late,
        scheduled_rate_rps=measured.scheduled_rate_rps, unknown_load=load.unknown_load,
        **_speculation(tokens_per_decode_step(metrics, measured.output_tokens, path, where)),
        notes=tuple(notes),
    )


def _speculation(per_step: float | None) -> dict[str, Any]:
    """A run's SD fields from its tokens per streamed iteration: SD on above :data:`SD_TOKENS_PER_ITERATION`."""
    if per_step is None or per_step <= SD_TOKENS_PER_ITERATION:
        return {}
    return {"mean_acceptance_length": per_step, "records_acceptance": True,
            "speculation_unrecorded": f"GuideLLM recorded {per_step:.3g} output tokens per streamed iteration "
                                      "after the first token"}


def tokens_per_decode_step(metrics: dict[str, Any], output_tokens: float, path: str, where: str) -> float | None:
    """Mean output tokens per streamed iteration after the first token: vLLM's tokens per step ``E``.

    vLLM streams each engine step's new tokens as one chunk, so with SD a
    chunk holds the tokens one verification cycle committed, bonus included:
    GuideLLM 0.7-0.8's ``iter_tokens_per_iteration`` (each request's
    ``(g - 1)/(n - 1)`` over its ``n`` chunks, pooled over chunks) is the mean
    acceptance length. Where only ``output_tokens_per_iteration`` is recorded
    (``sum g / sum n``, the first chunk's token included), with the mean output
    length ``g`` it gives the same pooled ratio::

        E = (g - 1) / (g / o - 1).

    None where neither is recorded, or the requests were not streamed in
    several chunks. A client that reads slower than the server steps gets
    several steps merged into one chunk (vLLM's output collector merges
    what the client has not taken yet), so under load this overstates ``E``.
    """
    per_step = _optional_mean(metrics, "iter_tokens_per_iteration", path, where)
    if per_step is None:
        per_chunk = _optional_mean(metrics, "output_tokens_per_iteration", path, where)
        if per_chunk is None or per_chunk <= 0 or output_tokens / per_chunk <= 1.0 + 1e-9:
            return None
        per_step = (output_tokens - 1.0) / (output_tokens / per_chunk - 1.0)
    return per_step if per_step >= 1.0 else None


def _strategy(bench: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A benchmark's scheduling strategy and where it was: ``config.strategy`` (GuideLLM 0.4+) or
    ``args.strategy`` (0.2-0.3); an empty dict when neither is an object."""
    for holder in ("config", "args"):
        section = bench.get(holder)
        if isinstance(section, dict) and isinstance(section.get("strategy"), dict):
            return section["strategy"], f"{holder}.strategy"
    return {}, "config.strategy"


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _requests(bench: dict[str, Any], successful: int, notes: list[str]
              ) -> _RequestTimes | None:
    """Per-request send times, latencies, TTFTs, scheduled sends of a GuideLLM benchmark (s), and the cut-off ones.

    GuideLLM 0.5-0.8 keep every request in ``requests.successful[]`` with its
    ``info.timings`` (epoch seconds): ``request_start``/``request_end`` (their
    difference is its ``request_latency``), ``first_token_iteration`` and
    ``targeted_start``, the time its schedule meant the request to start.
    Requests cancelled unfinished at the end (``requests.incomplete[]``, with a
    ``request_start`` and no ``request_end``) count as in flight from their
    start until they were resolved (``resolve_end``, else the last end).
    GuideLLM 0.2-0.3 entries give the same times as :func:`_times` reads them. Used
    only when the list holds every successful request and no warm-up or
    cool-down was cut out of the measurement (else the requests in flight
    would be undercounted); None otherwise, and the run is read from its
    summary metrics.
    """
    requests = bench.get("requests")
    listed = requests.get("successful") if isinstance(requests, dict) else None
    if not isinstance(listed, list) or not listed:
        return None
    if len(listed) != successful:
        notes.append(f"{len(listed)} of {successful} requests listed (sampled): read from the summary metrics")
        return None
    args = bench.get("args")
    if any(isinstance(holder.get(key), (int, float)) and holder[key] > 0
           for holder in ((bench, args) if isinstance(args, dict) else (bench,))
           for key in ("warmup_duration", "cooldown_duration", "warmup_number", "cooldown_number")):
        notes.append("warm-up/cool-down requests are not listed: the load each request saw is taken from the "
                     "summary metrics")
        return None
    starts, latencies, ttfts, scheduled = [], [], [], []
    for entry in listed:
        values = _times(entry)
        if values is None:
            notes.append("requests without their times (info.timings, or start_time/end_time): read from the "
                         "summary metrics")
            return None
        numeric = [is_finite_number(v) for v in values]
        if not (numeric[0] and numeric[1]) or values[1] <= values[0]:
            notes.append("a request without finite start and end times, start before end: read from the summary "
                         "metrics")
            return None
        starts.append(float(values[0]))
        latencies.append(float(values[1] - values[0]))
        ttfts.append(float(values[2] - values[0]) if numeric[2] and values[2] >= values[0] else math.nan)
        scheduled.append(float(values[3]) if numeric[3] else math.nan)
    origin = min(starts)
    last_end = max(start + latency for start, latency in zip(starts, latencies))
    cut_starts, cut_lengths = [], []
    unfinished = requests.get("incomplete") if isinstance(requests, dict) else None
    for entry in unfinished if isinstance(unfinished, list) else []:
        values = _times(entry)
        if values is None or not is_finite_number(values[0]):
            continue  # never sent: it loaded nothing
        begin, end = values[0], values[4]
        end = end if is_finite_number(end) and end > begin else last_end
        cut_starts.append(float(begin) - origin)
        cut_lengths.append(float(end) - float(begin))
    starts = [start - origin for start in starts]
    return (starts, latencies, None if any(math.isnan(t) for t in ttfts) else ttfts,
            None if any(math.isnan(t) for t in scheduled) else [t - origin for t in scheduled],
            (cut_starts, cut_lengths))


def _times(entry: Any) -> tuple[Any, Any, Any, Any, Any] | None:
    """One request's recorded times (epoch s, unchecked): start, end, first token, scheduled start, resolved.

    GuideLLM 0.5-0.8: ``info.timings`` ``request_start``, ``request_end``,
    ``first_token_iteration``, ``targeted_start``, ``resolve_end``. GuideLLM
    0.2-0.3: ``start_time``, ``end_time``, ``first_token_time`` and
    ``scheduler_info.targeted_start_time`` (-1 when unset; an unfinished request:
    ``scheduler_info.worker_end``). None when the entry has neither.
    """
    if not isinstance(entry, dict):
        return None
    info = entry.get("info")
    timings = info.get("timings") if isinstance(info, dict) else None
    if isinstance(timings, dict):
        return (timings.get("request_start"), timings.get("request_end"), timings.get("first_token_iteration"),
                timings.get("targeted_start"), timings.get("resolve_end"))
    if "start_time" in entry or "end_time" in entry:
        section = entry.get("scheduler_info")
        scheduler = section if isinstance(section, dict) else {}
        due = scheduler.get("targeted_start_time", math.nan)  # absent or null: no scheduled start
        return (entry.get("start_time"), entry.get("end_time"), entry.get("first_token_time"),
                due if is_finite_number(due) and due > 0 else None, scheduler.get("worker_end"))
    return None


def _optional_mean(metrics: dict[str, Any], name: str, path: str, where: str) -> float | None:
    """``metrics.<name>.successful.mean`` of a benchmark, None where it is absent (or null)."""
    entry = metrics.get(name)
    successful = entry.get("successful") if isinstance(entry, dict) else None
    if not isinstance(successful, dict) or "mean" not in successful:
        return None
    return optional_number(successful["mean"], path, f"{where}.metrics.{name}.successful.mean")


def _mean(metrics: dict[str, Any], name: str, path: str, where: str) -> float:
    """``metrics.<name>.successful.mean`` of a benchmark, which must be there."""
    key = f"{where}.metrics.{name}.successful.mean"
    entry = metrics.get(name)
    successful = entry.get("successful") if isinstance(entry, dict) else None
    if not isinstance(successful, dict) or "mean" not in successful:
        raise InputFileError(path, key, "missing")
    return number(successful["mean"], path, key)
