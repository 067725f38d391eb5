"""Windows of a server's metrics as benchmark runs: what ``fit`` and ``validate`` read from metrics.

A window is the span between two points of one stretch (:func:`sdplan.metrics.series.clean`). The
differences of the counters between its ends describe the requests that finished in it: their number
``n``, mean E2E latency ``L = Delta e2e_sum / Delta e2e_count``, mean TTFT and TPOT, mean prompt and
output lengths (vLLM's per-request token histograms), and SD's drafts and accepted tokens. Its load is
the arrival rate: per interval between scrapes, ``arrivals = Delta finished + Delta in flight`` (in
flight = the running and waiting gauges), and Little's law gives the model's ``B = lambda L``
(``docs/model.md#open-and-closed-loops``, ``docs/model.md#windows-of-metrics``).

How windows are cut:

* ``auto`` (the default): where the load changes by going idle. A stretch of scrape intervals with
  requests in flight or finishing, bounded by idle scrapes, is one window: every request of it is
  counted whole, so its mean latency is exact. Its arrival rate is ``(A - 1)/span``, ``A`` arrivals over
  the span between the middles of the first and the last interval with arrivals (each arrival's time is
  known to an interval; the middle is unbiased). A stretch longer than :data:`AUTO_LONGEST_S` (a server
  that never idles) is cut into equal windows of about :data:`AUTO_PIECE_S`.
* a fixed length (``--window 5m``): consecutive windows of that length; the rate is arrivals over the
  length, and the requests at its edges are split between windows as they finished.

Each window then goes through the same steady-state screen as a benchmark run
(:func:`sdplan.runs.screen.screen`): its completions per second against its arrivals find a server that
fell behind. Left out here already, and counted: windows with fewer than
:data:`MIN_WINDOW_COMPLETIONS` completions (no mean to speak of), with none, and those whose requests
in flight kept growing (:data:`QUEUE_GROWTH` : not a steady state).
"""

from __future__ import annotations

import datetime as _dt
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sdplan.errors import InputFileError
from sdplan.inputs.acceptance import alpha_from_mean_length
from sdplan.metrics import names
from sdplan.metrics.changes import rate_changes
from sdplan.metrics.series import Identity, Point, Stretches, arrivals, clean, finished_so_far, in_flight
from sdplan.runs.record import BenchmarkRun

#: Fewest completions a window needs: the mean latency of fewer is mostly noise.
MIN_WINDOW_COMPLETIONS = 20
#: In ``auto``, a window ends where the server stays idle (nothing in flight, nothing finishing) for this long (s)
#: or three scrape intervals, whichever is longer: shorter lulls are the gaps of light Poisson load (at 2 req/s
#: a 5 s gap between arrivals has probability e^-10), not a change of load.
IDLE_SPLIT_S = 5.0
#: In ``auto``, a busy stretch longer than this (s) is cut into pieces of about :data:`AUTO_PIECE_S`.
AUTO_LONGEST_S = 600.0
AUTO_PIECE_S = 300.0
#: A window whose mean in flight over the second half of its arrivals exceeds ``a x first half + b`` grew a
#: queue: past what the server sustains. ``b`` keeps light loads (a few requests in flight, Poisson noise)
#: from tripping it; a run past saturation roughly triples its in-flight count from one half to the next.
QUEUE_GROWTH = (1.5, 2.0)


@dataclass(frozen=True)
class WindowSettings:
    """How to cut windows: ``length_s`` None is ``auto``."""

    length_s: float | None = None
    min_completions: int = MIN_WINDOW_COMPLETIONS


@dataclass(frozen=True)
class SeriesRuns:
    """What one source gave: its windows as runs, and what was skipped, counted by reason."""

    runs: tuple[BenchmarkRun, ...]
    windows: int
    scrapes: int
    skipped: dict[str, int]
    server: Identity

    def summary(self, where: str) -> str | None:
        """One warning line naming what was left out, or None when nothing was."""
        if not self.skipped:
            return None
        parts = ", ".join(f"{count} {reason}" for reason, count in sorted(self.skipped.items(), key=lambda i: -i[1]))
        return (f"{where}: {len(self.runs)} of {self.windows} windows kept from {self.scrapes} scrapes; "
                f"left out or skipped: {parts}")


def select_server(where: str, servers: dict[Identity, list[Point]],
                  labels: tuple[tuple[str, str], ...]) -> tuple[Identity, list[Point]]:
    """The one server ``labels`` (``--select model_name=...,instance=...``) picks, or the only one.

    Raises
    ------
    InputFileError
        If the source has no vLLM series, or the selection matches none or several servers (the message
        lists them and the ``--select`` that picks one).
    """
    if not servers:
        raise InputFileError(where, None, f"no vLLM series ({names.SHOWN['e2e_sum']} and the others); is this "
                                          "a scrape of vLLM's /metrics?")
    chosen = [identity for identity in servers
              if all(dict(identity).get(key) == value for key, value in labels)]
    if len(chosen) == 1:
        return chosen[0], servers[chosen[0]]
    listed = "; ".join(",".join(f"{k}={v}" for k, v in identity) or "(no labels)" for identity in
                       sorted(servers)[:4]) + (f"; and {len(servers) - 4} more" if len(servers) > 4 else "")
    if not chosen:
        asked = ",".join(f"{k}={v}" for k, v in labels)
        raise InputFileError(where, None, f"--select {asked} matches none of its servers ({listed})")
    differing = [(k, v) for k, v in sorted(chosen)[0] if any(dict(o).get(k) != v for o in chosen)]
    example = next((f"{k}={v}" for k, v in differing if k in names.SELECT_LABELS), None)
    if example is None and differing:  # the servers differ only in labels that --select does not take
        raise InputFileError(where, None, f"holds {len(chosen)} servers ({listed}), told apart by the label "
                                          f"{differing[0][0]}, which --select cannot pick (it picks by "
                                          f"{', '.join(names.SELECT_LABELS)}); export one server's series")
    raise InputFileError(where, None, f"holds {len(chosen)} servers ({listed}); pick one with --select "
                                      f"{example or 'instance=HOST:PORT'}")


def series_runs(where: str, name: str, points: list[Point], settings: WindowSettings,
                skipped: Counter[str] | None = None, scrapes: int | None = None,
                server: Identity = ()) -> SeriesRuns:
    """The windows of one server's points as runs (see the module notes), named ``name#w<i>[hh:mm:ss-...]``."""
    counts: Counter[str] = Counter(skipped or {})
    cleaned: Stretches = clean(points)
    counts.update(cleaned.skipped)
    runs: list[BenchmarkRun] = []
    windows = 0
    for stretch in cleaned.stretches:
        for first, last in cut(stretch, settings):
            windows += 1
            found = window_run(f"{name}#w{windows}", stretch[first:last + 1], settings)
            if isinstance(found, str):
                counts[found] += 1
            else:
                runs.append(found)
    if not runs and not windows:
        raise InputFileError(where, None, f"no window to read: {len(points)} scrapes"
                             + (f" ({', '.join(f'{c} {r}' for r, c in counts.items())})" if counts else "")
                             + "; record at least two scrapes while requests are served")
    return SeriesRuns(tuple(runs), windows, scrapes if scrapes is not None else len(points), dict(counts), server)


# ----------------------------------------------------------------------------- cutting


def cut(stretch: Sequence[Point], settings: WindowSettings) -> list[tuple[int, int]]:
    """Windows of a stretch as ``(first, last)`` point indices (sharing ends: nothing falls between)."""
    if settings.length_s is not None:
        return _fixed(stretch, settings.length_s)
    busy = [False] + [after.values["e2e_count"] > before.values["e2e_count"]
                      or finished_so_far(after) > finished_so_far(before)
                      or bool(in_flight(before)) or bool(in_flight(after))
                      for before, after in zip(stretch, stretch[1:])]
    gaps = sorted(b.time_s - a.time_s for a, b in zip(stretch, stretch[1:]))
    idle_needed = max(IDLE_SPLIT_S, 3 * gaps[len(gaps) // 2]) if gaps else IDLE_SPLIT_S
    windows: list[tuple[int, int]] = []
    start: int | None = None
    last_busy = 0
    for i in range(1, len(stretch)):
        if busy[i]:
            if start is None:
                start = i - 1
            elif stretch[i - 1].time_s - stretch[last_busy].time_s >= idle_needed:  # a long enough lull: split
                windows.append((start, last_busy))
                start = i - 1
            last_busy = i
    if start is not None:
        windows.append((start, last_busy))
    windows = [piece for first, last in windows for piece in rate_changes(stretch, first, last)]
    pieces = []
    for first, last in windows:
        span = stretch[last].time_s - stretch[first].time_s
        if span <= AUTO_LONGEST_S:
            pieces.append((first, last))
            continue
        count = max(2, round(span / AUTO_PIECE_S))
        bounds = _fixed(stretch[first:last + 1], span / count)
        pieces += [(first + a, first + b) for a, b in bounds]
    return pieces


def _fixed(stretch: Sequence[Point], length_s: float) -> list[tuple[int, int]]:
    """Consecutive windows of about ``length_s``: each ends at the first point at or past its end time."""
    windows: list[tuple[int, int]] = []
    first = 0
    origin = stretch[0].time_s
    for i in range(1, len(stretch)):
        if stretch[i].time_s - origin >= length_s * (len(windows) + 1) - 1e-9:
            windows.append((first, i))
            first = i
    if first < len(stretch) - 1 and stretch[-1].time_s - stretch[first].time_s >= 0.5 * length_s:
        windows.append((first, len(stretch) - 1))  # a last piece of at least half a window
    return windows


# ----------------------------------------------------------------------------- one window


def _delta(first: Point, last: Point, quantity: str) -> float | None:
    a, b = first.values.get(quantity), last.values.get(quantity)
    return None if a is None or b is None else b - a


def _mean(first: Point, last: Point, total: str, count: str) -> float | None:
    """A histogram's mean over the window: ``Delta _sum / Delta _count`` (None without both or no count)."""
    s, n = _delta(first, last, total), _delta(first, last, count)
    return s / n if s is not None and n is not None and n > 0 else None


def _clock(time_s: float) -> str:
    return _dt.datetime.fromtimestamp(time_s, tz=_dt.timezone.utc).strftime("%H:%M:%S")


def window_run(name: str, points: Sequence[Point], settings: WindowSettings) -> BenchmarkRun | str:
    """One window (its points, ends included) as a run, or why it is left out."""
    first, last = points[0], points[-1]
    e2e_count = _delta(first, last, "e2e_count") or 0.0
    if e2e_count <= 0:
        return "windows with no completions"
    if e2e_count < settings.min_completions:
        return f"windows with fewer than {settings.min_completions} completions"
    latency = _mean(first, last, "e2e_sum", "e2e_count")
    assert latency is not None
    if latency <= 0:
        return "windows whose mean E2E latency is not positive (a broken histogram)"
    finished = finished_so_far(last) - finished_so_far(first)
    failed = (last.failed - first.failed) if last.failed is not None and first.failed is not None else 0.0
    load = _load(points, finished, settings)
    if isinstance(load, str):
        return load
    rate, achieved, span_s, grew = load
    if grew is not None:
        return grew
    prompt = _mean(first, last, "prompt_sum", "prompt_count") or _per_request(first, last, "prompt_tokens", finished)
    output = _mean(first, last, "output_sum", "output_count") or _per_request(first, last, "output_tokens", finished)
    if not prompt or not output or prompt <= 0 or output <= 0:
        return "windows without token counts (vllm:request_prompt_tokens / request_generation_tokens)"
    k, alpha, tau, rates, coverage, unrecorded = _speculation(first, last, finished, output)
    if k and alpha is None and unrecorded is None:
        return "windows of an SD server without drafts (spec_decode counters unchanged)"
    tpot = _mean(first, last, "tpot_sum", "tpot_count")
    if tpot is None:  # vLLM before 0.11: no per-request TPOT
        tpot = _decode_per_token(first, last) or _mean(first, last, "itl_sum", "itl_count")
    notes = [f"metrics window {_clock(first.time_s)}-{_clock(last.time_s)} UTC ({last.time_s - first.time_s:.0f} s, "
             f"arrivals over {span_s:.1f} s): {round(e2e_count)} requests"]
    gauges = _gauge_means(points)
    if gauges:
        notes.append(", ".join(f"mean {label} {value:.3g}" for label, value in gauges.items()))
    for label, total, count in (("queue", "queue_sum", "queue_count"), ("prefill", "prefill_sum", "prefill_count"),
                                ("decode", "decode_sum", "decode_count")):
        value = _mean(first, last, total, count)
        if value is not None:
            notes.append(f"mean {label} time {value:.4g} s")
    return BenchmarkRun(
        source=f"{name}[{_clock(first.time_s)}-{_clock(last.time_s)}]", requested_rate_rps=rate,
        achieved_rate_rps=achieved, draft_length=k, alpha=alpha, prompt_tokens=prompt, output_tokens=output,
        mean_e2e_latency_s=latency, mean_ttft_s=_mean(first, last, "ttft_sum", "ttft_count"), mean_tpot_s=tpot,
        completed=max(round(finished - failed), 0), failed=max(round(failed), 0), mean_acceptance_length=tau,
        draft_coverage=coverage, position_rates=rates, records_draft_length=unrecorded is None,
        records_acceptance=alpha is not None, speculation_unrecorded=unrecorded, notes=tuple(notes),
        spec_decode_drafts=_delta(first, last, "drafts") if alpha is not None else None)


def _decode_per_token(first: Point, last: Point) -> float | None:
    """Time per output token after the first, ``Delta decode time / Delta (output tokens - requests)`` (s).

    vLLM 0.11+ records TPOT per request, ``decode time / (output tokens - 1)`` (``vllm/v1/metrics/stats.py``);
    before it, only the inter-token latency, one observation per engine step that gave a request tokens. With SD
    a step gives several tokens, so that mean is a step time, up to ``k + 1`` times the time per token
    (vllm#52853). The decode time (``vllm:request_decode_time_seconds``, first to last token) over the tokens
    after the first is the time per token whatever a step gives: the same ratio as vLLM's, weighted by tokens
    rather than by requests.
    """
    decode, outputs, requests = (_delta(first, last, q) for q in ("decode_sum", "output_sum", "output_count"))
    if decode is None or outputs is None or requests is None or outputs - requests <= 0:
        return None
    return decode / (outputs - requests)


def _per_request(first: Point, last: Point, quantity: str, finished: float) -> float | None:
    total = _delta(first, last, quantity)
    return total / finished if total is not None and finished > 0 else None


def _load(points: Sequence[Point], finished: float,
          settings: WindowSettings) -> tuple[float, float, float, str | None] | str:
    """``(arrival rate, completion rate, arrival span (s), why the queue grew or None)`` of a window.

    With the gauges, arrivals per interval are known (:func:`arrivals`). In ``auto``, an end of the window
    with nothing in flight or next to an interval without arrivals (a lull where the load changed) is placed
    at the middle of the first (last) interval with arrivals, where the first (last) arrival lies on average;
    an end within traffic, and every end of a fixed-length window, is the window's own.
    Over a span between the first and the last arrival ``A`` arrivals make ``A - 1`` gaps, so the rate is
    ``(A - e/2)/span`` with ``e`` the ends placed at arrivals. The completion rate runs from the same start
    to the middle of the last interval with completions (a drain included, as a benchmark's duration does).
    """
    first, last = points[0], points[-1]
    duration = last.time_s - first.time_s
    flights = [in_flight(p) for p in points]
    counts = arrivals(points)
    if counts is None:  # no gauges: completions over the window stand for arrivals
        rate = finished / duration
        return rate, rate, duration, None
    total = sum(counts)
    busy = [i for i, count in enumerate(counts) if count > 0]
    if total <= 0 or not busy:
        return "windows with no arrivals"
    middle = [(a.time_s + b.time_s) / 2 for a, b in zip(points, points[1:])]
    idle_start = settings.length_s is None and (flights[0] == 0 or counts[0] == 0)
    idle_end = settings.length_s is None and (flights[-1] == 0 or counts[-1] == 0)
    begin = middle[busy[0]] if idle_start else first.time_s
    end = middle[busy[-1]] if idle_end else last.time_s
    span = end - begin
    placed = (idle_start + idle_end) / 2
    if span <= 0 or total - placed <= 0:  # every arrival within one interval: the interval is all that is known
        span = points[busy[0] + 1].time_s - points[busy[0]].time_s
        rate = total / span
    else:
        rate = (total - placed) / span
    finishing = [i for i, (a, b) in enumerate(zip(points, points[1:]))
                 if finished_so_far(b) > finished_so_far(a) or b.values["e2e_count"] > a.values["e2e_count"]]
    completion_end = middle[finishing[-1]] if idle_end and finishing else last.time_s
    active = max(completion_end - begin, span)
    achieved = finished / active if active > 0 else rate
    lo, hi = (busy[0], busy[-1] + 2) if settings.length_s is None else (0, len(points))
    return rate, achieved, span, _queue_grew(points[lo:hi], flights[lo:hi])


def _queue_grew(points: Sequence[Point], flights: Sequence[float | None]) -> str | None:
    """Why a window's requests in flight grew (:data:`QUEUE_GROWTH`), or None: compared half against half."""
    if len(points) < 4:
        return None
    middle = (points[0].time_s + points[-1].time_s) / 2
    early = [f for p, f in zip(points, flights) if f is not None and p.time_s <= middle]
    late = [f for p, f in zip(points, flights) if f is not None and p.time_s > middle]
    if not early or not late:
        return None
    before, after = sum(early) / len(early), sum(late) / len(late)
    growth, margin = QUEUE_GROWTH
    if after > growth * before + margin:
        return "windows whose requests in flight kept growing (a queue building up: past what the server sustains)"
    return None


def _gauge_means(points: Sequence[Point]) -> dict[str, float]:
    """Time-weighted means of the gauges over a window (trapezoids between scrapes)."""
    means = {}
    for quantity, label in (("running", "running"), ("waiting", "waiting"), ("kv_cache", "KV cache use")):
        pairs = [(p.time_s, p.values[quantity]) for p in points if quantity in p.values]
        if len(pairs) < 2:
            continue
        area = sum((t1 - t0) * (v0 + v1) / 2 for (t0, v0), (t1, v1) in zip(pairs, pairs[1:]))
        means[label] = area / (pairs[-1][0] - pairs[0][0])
    return means


def _speculation(first: Point, last: Point, finished: float, output: float) -> tuple[
        int, float | None, float | None, tuple[float, ...] | None, float | None, str | None]:
    """``(k, alpha, mean acceptance length, per-position rates, draft coverage, unrecorded)`` from SD counters.

    ``k`` is the number of positions vLLM counts (``vllm:spec_decode_num_accepted_tokens_per_pos``), else
    draft tokens per draft. Per-position rate ``i`` is accepted-at-``i`` over drafts, vLLM's own ratio (as
    ``vllm bench serve`` reports it); the mean acceptance length is ``1 + accepted/drafts``, and ``alpha``
    solves ``E(alpha, k) = length`` (:func:`sdplan.inputs.acceptance.alpha_from_mean_length`). Without drafts
    counted, SD may still have been on (:func:`_unrecorded_speculation`): ``k`` 0 and the reason.
    """
    drafts = _delta(first, last, "drafts")
    positions = len(last.positions) if len(last.positions) == len(first.positions) else 0
    if drafts is None and not positions:
        return 0, None, None, None, None, _unrecorded_speculation(first, last)
    if not drafts or drafts <= 0:
        return positions or 1, None, None, None, None, None
    draft_tokens = _delta(first, last, "draft_tokens")
    k = positions or (round(draft_tokens / drafts) if draft_tokens else 0)
    if not k:
        return 0, None, None, None, None, "spec_decode drafts counted without draft tokens or positions"

    accepted = _delta(first, last, "accepted") or 0.0
    tau = min(max(1.0 + accepted / drafts, 1.0), k + 1.0)
    rates: tuple[float, ...] | None = None
    if positions:
        values: list[float] = []
        for before, after in zip(first.positions, last.positions):
            rate = min(max((after - before) / drafts, 0.0), 1.0)
            values.append(min(rate, values[-1]) if values else rate)
        rates = tuple(values) if all(math.isfinite(v) for v in values) else None
    total_output = _delta(first, last, "output_tokens")
    coverage = None
    if total_output is not None and finished > 0:
        undrafted = max(0.0, total_output - finished - drafts - accepted)
        coverage = drafts / (drafts + undrafted)
    return k, float(alpha_from_mean_length(tau, k)), tau, rates, coverage, None


def _unrecorded_speculation(first: Point, last: Point) -> str | None:
    """Why a window without drafts counted was an SD server's all the same, or None: a server without SD.

    vLLM V0 (0.5-0.10) exports ``spec_decode_num_emitted_tokens`` and the ``draft_acceptance_rate`` gauge, and
    adds to its SD counters the totals since its start at each log interval (vllm#15415): their differences
    mean nothing, the gauge is the acceptance since the start. V1 before 0.8.5 counts draft and accepted
    tokens but not drafts (vllm#16665), so neither ``k`` nor the acceptance length follows. Read as no SD,
    either would calibrate the SD server as a plain one.
    """
    emitted, draft_tokens = _delta(first, last, "emitted"), _delta(first, last, "draft_tokens")
    since_start = last.values.get("v0_acceptance_rate")
    if since_start is not None or (emitted or 0.0) > 0:
        rate = f"; its draft acceptance rate since it started: {since_start:.1%}" if since_start is not None else ""
        return (f"vLLM V0 SD series, whose counters add up totals since the start and do not give a window's "
                f"drafts{rate}")
    if draft_tokens is not None and draft_tokens > 0:
        accepted = _delta(first, last, "accepted")
        rate = f", {accepted / draft_tokens:.1%} of them accepted" if accepted is not None else ""
        return (f"{draft_tokens:.0f} draft tokens{rate}, but no vllm:spec_decode_num_drafts (vLLM before 0.8.5)")
    return None


# ----------------------------------------------------------------------------- a source's runs


def runs_of(where: str, name: str, servers: dict[Identity, list[Point]], skipped: Counter[str], scrapes: int,
            labels: tuple[tuple[str, str], ...], settings: WindowSettings) -> tuple[list[BenchmarkRun], list[str]]:
    """The runs of one source's selected server, and its one-line summary of what was left out."""
    identity, points = select_server(where, servers, labels)
    result = series_runs(where, name, points, settings, skipped, scrapes, identity)
    summary = result.summary(where)
    return list(result.runs), [summary] if summary else []
