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
  that never idles) is cut into equal windows of about :data:`AUTO_PIECE_S`; one busy for
  :data:`AUTO_HOLD_S` is ended there first (:class:`AutoWindows`).
* a fixed length (``--window 5m``): consecutive windows of that length; the rate is arrivals over the
  length, and the requests at its edges are split between windows as they finished.

Both are cut as the source is read (:class:`FixedWindows`, :class:`AutoWindows`), holding the open window's
points (``auto``: the open busy spell's, at most :data:`AUTO_HOLD_S` of them), not the file's.

Each window then goes through the same steady-state screen as a benchmark run
(:func:`sdplan.runs.screen.screen`): its completions per second against its arrivals find a server that
fell behind. Left out here already, and counted: windows with fewer than
:data:`MIN_WINDOW_COMPLETIONS` completions (no mean to speak of), with none, and those whose requests
in flight kept growing (:data:`QUEUE_GROWTH` : not a steady state).
"""

from __future__ import annotations

import datetime as _dt
import itertools
import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from sdplan.errors import InputFileError
from sdplan.inputs.acceptance import alpha_from_mean_length
from sdplan.metrics import names
from sdplan.metrics.changes import rate_changes
from sdplan.metrics.series import (
    Identity,
    Point,
    StreamCleaner,
    arrivals,
    finished_so_far,
    in_flight,
    one_finished_counter,
)
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
#: In ``auto``, a busy spell is held for at most this long (s), then ended as if a lull came: it bounds the memory
#: of a server that never idles (an hour of 15-second scrapes is 240 points, 0.12 MiB) and is a multiple of
#: :data:`AUTO_PIECE_S`, so such a server's windows are still pieces of about 5 minutes.
AUTO_HOLD_S = 3600.0
#: A window whose mean in flight over the second half of its arrivals exceeds ``a x first half + b`` grew a
#: queue: past what the server sustains. ``b`` keeps light loads (a few requests in flight, Poisson noise)
#: from tripping it; a run past saturation roughly triples its in-flight count from one half to the next.
QUEUE_GROWTH = (1.5, 2.0)
#: The most labels a suggested ``--select`` combines before it names all of a server's own (the combinations to
#: try grow as 2^labels).
SELECTOR_MOST = 3


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


def matches(identity: Identity, labels: tuple[tuple[str, str], ...]) -> bool:
    """Whether a server has every label of a selection, each with its value (exact)."""
    own = dict(identity)
    return all(own.get(key) == value for key, value in labels)


def pick_server(where: str, servers: Collection[Identity], labels: tuple[tuple[str, str], ...]) -> Identity:
    """The one server of ``servers`` that ``labels`` (``--select model_name=...,ReplicaId=...``) picks, or the only one.

    Any label may pick (``--select`` takes every Prometheus label name): a file of several servers is told which
    labels tell them apart and a ``--select`` that picks one of them (:func:`_selector`).

    Raises
    ------
    InputFileError
        If the source has no vLLM series, or the selection matches none or several servers (the message
        lists them, the labels that differ and the ``--select`` that picks one).
    """
    if not servers:
        raise InputFileError(where, None, f"no vLLM series ({names.SHOWN['e2e_sum']} and the others); is this "
                                          "a scrape of vLLM's /metrics?")
    summed = [key for key, _ in labels if key in names.SUMMED_LABELS]
    if summed:  # an engine of a data-parallel server is not a server the planner answers for
        raise InputFileError(where, None, f"--select {summed[0]}=...: {summed[0]} splits one server's series, "
                                          "which are summed over it; pick a server by a label that names one "
                                          "(model_name, instance, ...)")
    chosen = [identity for identity in servers if matches(identity, labels)]
    if len(chosen) == 1:
        return chosen[0]
    listed = "; ".join(",".join(f"{k}={v}" for k, v in identity) or "(no labels)" for identity in
                       sorted(servers)[:4]) + (f"; and {len(servers) - 4} more" if len(servers) > 4 else "")
    if not chosen:
        asked = ",".join(f"{k}={v}" for k, v in labels)
        raise InputFileError(where, None, f"--select {asked} matches none of its servers ({listed})")
    differing = sorted({key for identity in chosen for key, _ in identity
                        if len({dict(other).get(key) for other in chosen}) > 1})
    raise InputFileError(where, None, f"holds {len(chosen)} servers ({listed}), told apart by the label"
                                      f"{'s' if len(differing) > 1 else ''} {', '.join(differing)}; pick one with "
                                      f"--select {_selector(chosen, labels)}")


def _selector(chosen: list[Identity], labels: tuple[tuple[str, str], ...]) -> str:
    """A ``--select`` that picks exactly one of ``chosen`` (each matching ``labels``): ``labels`` and the fewest
    of one server's own labels that no other of them shares, the first server (sorted) that has such. Combinations
    of up to :data:`SELECTOR_MOST` labels are tried, then all of the server's own.

    A server whose labels another one also has (with more besides) cannot be picked by labels alone; a server with
    the most labels always can, by all of its own.
    """
    for identity in sorted(chosen):
        others = [other for other in chosen if other != identity]
        own = [(key, value) for key, value in identity if (key, value) not in labels]
        tries = [extra for size in range(1, min(len(own), SELECTOR_MOST) + 1)
                 for extra in itertools.combinations(own, size)] + [tuple(own)]
        for extra in tries:
            if not any(matches(other, extra) for other in others):
                return ",".join(f"{k}={v}" for k, v in (*labels, *extra))
    return ",".join(f"{k}={v}" for k, v in labels)  # not reached: a server with the most labels is picked by them


# ----------------------------------------------------------------------------- cutting


def _busy(before: Point, after: Point) -> bool:
    """Whether the interval between two points served requests: some finished, or some were in flight."""
    return (after.values["e2e_count"] > before.values["e2e_count"] or finished_so_far(after) > finished_so_far(before)
            or bool(in_flight(before)) or bool(in_flight(after)))


def _pieces(spell: Sequence[Point]) -> list[tuple[int, int]]:
    """An ``auto`` busy spell's windows as ``(first, last)`` indices: cut where its arrival rate changes
    (:func:`~sdplan.metrics.changes.rate_changes`), and a piece longer than :data:`AUTO_LONGEST_S` into equal
    ones of about :data:`AUTO_PIECE_S`."""
    pieces = []
    for first, last in rate_changes(spell, 0, len(spell) - 1):
        span = spell[last].time_s - spell[first].time_s
        if span <= AUTO_LONGEST_S:
            pieces.append((first, last))
            continue
        count = max(2, round(span / AUTO_PIECE_S))
        bounds = _fixed(spell[first:last + 1], span / count)
        pieces += [(first + a, first + b) for a, b in bounds]
    return pieces


def _fixed(stretch: Sequence[Point], length_s: float) -> list[tuple[int, int]]:
    """Consecutive windows of about ``length_s``: each ends at the first point at or past its end time."""
    windows: list[tuple[int, int]] = []
    first = 0
    origin = stretch[0].time_s
    for i in range(1, len(stretch)):
        if _window_ends(origin, stretch[i], length_s, len(windows)):
            windows.append((first, i))
            first = i
    if _last_piece_kept(stretch[first:], length_s):
        windows.append((first, len(stretch) - 1))
    return windows


def _window_ends(origin_s: float, point: Point, length_s: float, cut: int) -> bool:
    """Whether ``point`` ends the next fixed window of a stretch that began at ``origin_s`` with ``cut`` windows
    cut: it is the first point at or past ``origin_s + (cut + 1) length_s``, so windows do not drift."""
    return point.time_s - origin_s >= length_s * (cut + 1) - 1e-9


def _last_piece_kept(piece: Sequence[Point], length_s: float) -> bool:
    """Whether a stretch's last piece after its fixed windows is a window too: two points at least half a window
    apart."""
    return len(piece) >= 2 and piece[-1].time_s - piece[0].time_s >= 0.5 * length_s


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


# ----------------------------------------------------------------------------- a source's runs, streamed


def streamed_runs(where: str, name: str, stream: Iterable[tuple[Identity, Point]],
                  read: Callable[[], tuple[Counter[str], int]], labels: tuple[tuple[str, str], ...],
                  settings: WindowSettings) -> tuple[list[BenchmarkRun], list[str]]:
    """The windows of the selected server as runs, cut as ``stream`` is read, and the summary of what was left out.

    Each server that ``labels`` may pick is cut on its own (:class:`FixedWindows`, :class:`AutoWindows`); the
    others are only named. ``read()`` gives the reader's skipped scrapes and scrapes read once the stream is
    exhausted; then the server is picked (:func:`pick_server`).

    Raises
    ------
    InputFileError
        As :func:`pick_server`, or with no window to read.
    """
    cutting: dict[Identity, Windows] = {}
    passed: set[Identity] = set()
    for identity, point in stream:
        windows = cutting.get(identity)
        if windows is None:
            if identity in passed:
                continue
            if not matches(identity, labels):
                passed.add(identity)
                continue
            windows = cutting[identity] = (AutoWindows(name, settings) if settings.length_s is None
                                           else FixedWindows(name, settings))
        windows.add(point)
    skipped, scrapes = read()
    identity = pick_server(where, [*cutting, *passed], labels)
    result = cutting[identity].finish(where, skipped, scrapes, identity)
    summary = result.summary(where)
    return list(result.runs), [summary] if summary else []


class Windows(ABC):
    """One server's windows, cut as its points arrive (:meth:`add`), named ``name#w<i>[hh:mm:ss-...]``.

    The points go through :class:`~sdplan.metrics.series.StreamCleaner` (skipped points, stretches cut at
    resets and gaps); a subclass holds what its windows still need. A window's finished requests are counted by
    one counter (:func:`~sdplan.metrics.series.one_finished_counter`).
    """

    def __init__(self, name: str, settings: WindowSettings) -> None:
        self.name, self.settings = name, settings
        self.cleaner = StreamCleaner()
        self.points = 0
        self.windows = 0
        self.runs: list[BenchmarkRun] = []
        self.reasons: Counter[str] = Counter()

    def add(self, point: Point) -> None:
        """The server's next point, in the source's order."""
        self.points += 1
        starts = self.cleaner.add(point)
        if starts is not None:
            self._next(point, starts)

    def finish(self, where: str, skipped: Counter[str], scrapes: int, server: Identity) -> SeriesRuns:
        """The server's windows as runs, once its last point is read.

        Raises
        ------
        InputFileError
            With no window at all: the scrapes and what was skipped, and what to record.
        """
        self._end_stretch()
        counts: Counter[str] = Counter(skipped)
        counts.update(self.cleaner.skipped())
        counts.update(self.reasons)
        if not self.runs and not self.windows:
            raise InputFileError(where, None, f"no window to read: {self.points} scrapes"
                                 + (f" ({', '.join(f'{c} {r}' for r, c in counts.items())})" if counts else "")
                                 + "; record at least two scrapes while requests are served")
        return SeriesRuns(tuple(self.runs), self.windows, scrapes, dict(counts), server)

    @property
    @abstractmethod
    def held(self) -> int:
        """Points held now for the windows still open."""

    @abstractmethod
    def _next(self, point: Point, starts: bool) -> None:
        """A usable point: the start of a stretch (``starts``) or the next point of the open one."""

    @abstractmethod
    def _end_stretch(self) -> None:
        """The open windows cut, at the end of a stretch or of the stream."""

    def _window(self, points: Sequence[Point]) -> None:
        self.windows += 1
        found = window_run(f"{self.name}#w{self.windows}", one_finished_counter(list(points)), self.settings)
        if isinstance(found, str):
            self.reasons[found] += 1
        else:
            self.runs.append(found)


class FixedWindows(Windows):
    """Fixed-length windows (:func:`_fixed`), holding the open window's points and nothing older.

    A window is cut when its end is read (a point at or past ``length_s`` times the windows so far after the
    stretch's first point), and a stretch's last piece of at least half a window when the stretch ends (a reset,
    a gap) or the stream does. Memory holds one window's points whatever the length of the file.
    """

    def __init__(self, name: str, settings: WindowSettings) -> None:
        super().__init__(name, settings)
        assert settings.length_s is not None
        self.length_s = settings.length_s
        self._open: list[Point] = []
        self._origin = 0.0
        self._cut = 0  # windows cut in this stretch

    @property
    def held(self) -> int:
        return len(self._open)

    def _next(self, point: Point, starts: bool) -> None:
        if starts:
            self._end_stretch()
            self._open, self._origin, self._cut = [point], point.time_s, 0
            return
        self._open.append(point)
        if _window_ends(self._origin, point, self.length_s, self._cut):
            self._window(self._open)
            self._cut += 1
            self._open = [point]

    def _end_stretch(self) -> None:
        """The stretch's last piece, if it is a window (:func:`_last_piece_kept`)."""
        if _last_piece_kept(self._open, self.length_s):
            self._window(self._open)
        self._open = []


class AutoWindows(Windows):
    """``auto`` windows: busy spells between lulls, each cut where its arrival rate changes (:func:`_pieces`).

    A spell starts at the point before an interval that served requests (:func:`_busy`) and ends at its last
    such interval's point, once the server has stayed idle for :data:`IDLE_SPLIT_S` or three typical intervals,
    whichever is longer (the typical interval is :class:`~sdplan.metrics.series.StreamCleaner`'s recent
    median), or once the stretch ends. Memory holds the open spell's points, and the last point while idle. A
    spell busy for :data:`AUTO_HOLD_S` is ended there as if a lull came (the next starts at its last point), so
    a server that never idles holds at most that long a spell, not the whole file.
    """

    def __init__(self, name: str, settings: WindowSettings) -> None:
        super().__init__(name, settings)
        self._held: list[Point] = []  # the open spell's points from its first, or the last point while idle
        self._last_busy: int | None = None  # index in _held of the spell's last busy point; None: idle

    @property
    def held(self) -> int:
        return len(self._held)

    def _next(self, point: Point, starts: bool) -> None:
        if starts:
            self._end_stretch()
            self._held = [point]
            return
        busy = _busy(self._held[-1], point)
        self._held.append(point)
        if busy:
            if self._last_busy is None:  # a spell starts at the point before its first busy interval
                del self._held[:-2]
            self._last_busy = len(self._held) - 1
            if point.time_s - self._held[0].time_s >= AUTO_HOLD_S:
                self._end_stretch()
        elif self._last_busy is None:
            self._held = [point]
        elif point.time_s - self._held[self._last_busy].time_s >= max(IDLE_SPLIT_S, 3 * self.cleaner.interval_s):
            self._end_stretch()  # a long enough lull: any later busy interval starts a new spell

    def _end_stretch(self) -> None:
        """The open spell's windows; then only the last point is held."""
        if self._last_busy is not None:
            spell = one_finished_counter(self._held[:self._last_busy + 1])  # rate changes difference it too
            for first, last in _pieces(spell):
                self._window(spell[first:last + 1])
        self._held = self._held[-1:]
        self._last_busy = None
