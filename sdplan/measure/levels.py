"""The rules of the served measurement plan: grids, configurations, load levels, repeats.

Pure functions and records, no processes: :mod:`sdplan.measure.sweep` runs them
against live servers and stores what they measure.


Per configuration (no SD, then SD at each draft length) one server is started
and loaded by a **closed-loop concurrency sweep**: ``N`` clients, each sending
its next request as soon as the last one finishes (``vllm bench serve
--max-concurrency N --request-rate inf``). A closed loop is the fast, stable
core of a calibration: its load is set exactly (``N - 1`` others per request,
``L = C1 + (N - 1) C2``, see :mod:`sdplan.fitting.fit`), it cannot overload the server,
and it reaches steady state at once. ``N`` steps through the grid's levels
(quick: 1, 4, 16, 64) up to the server's ``max_num_seqs``, and stops early once
throughput stops rising (less than 5% more for the next level: saturated).
Where the next doubling past the grid's largest level is forecast to gain 10%
(:func:`forecast_gain_per_doubling`), ``N`` doubles on up to ``max_num_seqs``
(the user's, else vLLM's default for the hardware: 128 on a CPU, 256 or 1024 on
a GPU), so the plateau is measured, not extrapolated. Then Poisson points at fractions of the measured peak throughput:
the open-loop regime the planner predicts, which fixes the closed-loop factor of
the fit (:mod:`sdplan.fitting.fit`). Lengths vary by +-25% around the requested means
(``--random-range-ratio``), so closed-loop clients do not finish in lockstep
and prefill together as they would with identical requests.

**Probes tell the prefill from the decode steps.** One workload measures the sums
``C1 = c1p + (g - 1) c1_step`` and ``C2 = c2p + (g - 1) c2_step`` (no SD,
:func:`sdplan.latency.model.baseline_demand`) once each, so how they split between the
prefill and the steps, which is what a question at another workload needs, is
not identified (a served calibration at 64/64 tokens put ``c1p`` at 3.5e-17 s
and was 31-71% wrong at 256/32). A grid's :class:`Probe` workloads, a
prompt-heavy one (prompt x4, output /2) and a decode-heavy one (prompt /4,
output x3), are measured as closed loops at two levels each (:func:`probe_points`):
``N = 1`` gives their ``C1``, a larger ``N`` their ``C2``. Their prefill and
step shares differ from the main workload's, which separates the terms, and
the calibration's validity range spans them. They run after the main levels,
on the same server, so that a server's own speed does not enter the split. SD
configurations measure the grid's ``speculative_probes`` (quick: the
prompt-heavy one): their costs do not follow the prompt as the no-SD steps do.

**A configuration is measured on two server instances** where the grid says so
(the quick grid, with one round): the first runs the closed-loop sweep (and the
probes), the second, started after every configuration's first, measures the
sweep's smallest and largest levels again, then the Poisson points at fractions
of its own peak. Servers of one configuration started minutes apart differed by
7-46% at one level (benchmarks/RESULTS-accuracy-served-2026-11.md); a
calibration that rests on one instance per configuration carries that error
unseen, and the repeated levels show the spread between instances.

**Repeats are measured in rounds, each on fresh servers.** Round 1 decides
the plan of a configuration (its levels, where the sweep stopped, its Poisson
rates); every later round starts each configuration's server again and repeats
that plan, in the reverse order of configurations (no SD, k=2, k=4, then k=4,
k=2, no SD). On these machines the speed drifts over minutes and from one
server start to the next (benchmarks/RESULTS-accuracy-served-2026-11.md: 4-40%
between a calibration and servers started minutes later), and two repeats run
back to back measure the same window: they agree, and the drift goes into the
calibration unseen. Spread over the calibration, repeats that disagree show the
drift, and the fit averages it.

A configuration with a point whose slowest repeat's mean latency is more than
10% above its fastest's is measured once more, whole, in a re-measure round on
fresh servers; a point a process outside the measurement disturbed (CPU used during the point) is measured again
at once, up to ``remeasure`` times. What stays apart is kept, flagged, and
down-weighted by the robust fit; the spread of the repeats is reported.

A Poisson point the server did not keep up with (its :func:`sdplan.runs.screen.kept_up_fraction`
below :data:`sdplan.runs.screen.MIN_KEPT_UP_FRACTION`, or more requests in flight on average than
the server's ``--max-num-seqs``) ran past the sustained capacity: a queue built
up that the fitted relation leaves out, so its mean latency measures the run's
length, not the load. A short closed loop can overstate what a server sustains
under open-loop arrivals (seen with tiny models on a 2-core CPU, where the API
server falls behind). Such a point is kept and flagged ``overloaded``, left out
of the fit, and measured again once at the same fraction of the rate it did
sustain, which also becomes the peak of the later points.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sdplan.inputs.serving import kv_cache_requests
from sdplan.measure.client import LENGTH_SPREAD, LoadPoint
from sdplan.runs import MIN_KEPT_UP_FRACTION, fell_behind

#: Repeats of one point disagree when the slowest's mean latency is more than this above the fastest's.
REPEAT_DISAGREEMENT = 0.10
#: Target length of a Poisson point in the standard and thorough grids (requests = rate x this;
#: ``--poisson-seconds`` overrides every grid's).
POISSON_SECONDS = 15.0
#: A Poisson point lasts at least this many unloaded request latencies (the mean latency of the sweep's
#: smallest closed loop, N = 1): requests sent in its first latency or so meet a server still filling up,
#: so a run only a few latencies long under-states the steady state. 20 unloaded latencies are about 5-10
#: latencies at the 40-75% loads of the grids. CPU-sized requests (0.3 s) leave the grids' 8-15 s as they
#: are; a GPU's 1024/128-token request of about 1 s gets 20 s, a 2048-token answer of 15 s gets 300 s.
POISSON_MIN_UNLOADED_LATENCIES = 20.0
#: ... but no Poisson point is made longer than this (s) by that rule.
POISSON_MAX_SECONDS = 600.0
#: Label suffix of a Poisson point measured again, at a lower rate, after one that did not keep up.
LOWER_RATE_SUFFIX = "-lower"
#: Doubling the clients must raise throughput by at least this much to go on.
MIN_THROUGHPUT_GAIN = 1.05
#: Past the grid's largest N the sweep doubles on only while the next doubling is forecast to gain at least
#: this much. The forecast is the model's own: the line ``L = C1 + (N - 1) C2`` through the last two levels
#: (``L = N / X`` by Little's law) gives ``X(2N) / X(N) = 2 L(N) / L(2N) = 2 / (1 + X(N) C2)``
#: (:func:`forecast_gain_per_doubling`). Below 10% the last level ran at 82% or more of that line's plateau
#: ``1 / C2``, which the fit extrapolates from the slope it measured. The step's own gain over-states the
#: next one (throughput is concave in N), the more so across the quick grid's fourfold steps, so the step's
#: gain would extend sweeps that no longer gain (figures: benchmarks/RESULTS-accuracy-runs-2026-11.md).
EXTEND_THROUGHPUT_GAIN = 1.10


@dataclass(frozen=True, slots=True)
class Probe:
    """A workload beside the calibration's own, measured as closed loops to split the demand.

    Attributes
    ----------
    name : str
        Label prefix of its points (``prompt-c1``, ``decode-c16``).
    prompt_factor, output_factor : float
        Its mean prompt and output lengths as multiples of the calibration's.
    levels : tuple of int
        Closed-loop client counts: 1 for ``C1``, a larger one for ``C2`` (capped at the
        configuration's largest measured level and at what its KV cache holds).
    """

    name: str
    prompt_factor: float
    output_factor: float
    levels: tuple[int, ...]

    def lengths(self, prompt_tokens: int, output_tokens: int) -> tuple[int, int]:
        """Its (prompt, output) mean lengths in tokens: at least 1 prompt and 2 output tokens."""
        return max(1, round(prompt_tokens * self.prompt_factor)), max(2, round(output_tokens * self.output_factor))


#: A probe level that stands for the configuration's largest measured level (probe levels are capped there).
TOP_LEVEL = 1 << 30
#: The probes of the grids. Without SD, ``C1 = c1p p/p_ref + (g - 1) c1_step`` (``c1p`` scales with the prompt,
#: :mod:`sdplan.calibration`): the main workload and a prompt-heavy one at 4x the prompt and half the output
#: weigh the two terms 8:1 differently, a decode-heavy one at a quarter of the prompt and 3x the output 12:1 the
#: other way; with the main workload, three points on the two-term line at ``N = 1`` and three at a larger
#: ``N``. The prompt-heavy probe's is ``N = 16``: 16 clients already put ``(N - 1) C2`` well above ``C1`` on every
#: machine measured (CPU: ``C2/C1`` 0.1-0.3 per other request). The decode-heavy probe's is the sweep's top: its
#: steps are the cheapest per streamed chunk, so it shows the plateau of the workloads whose chunks, not whose
#: prompts, load the server (no SD at 16/192 tokens on a 2-core CPU: 9.5 req/s at N = 64 where the steps fitted at
#: N <= 16 allow 12.2).
PROBES = (Probe("prompt", 4.0, 0.5, (1, 16)), Probe("decode", 0.25, 3.0, (1, TOP_LEVEL)))


@dataclass(frozen=True, slots=True)
class ServedGrid:
    """What to measure per configuration.

    Attributes
    ----------
    concurrency : tuple of int
        Closed-loop client counts (capped at the server's ``max_num_seqs``).
    requests_per_client : int
        Requests per point = ``max(min_requests, requests_per_client * N)``.
    repeats : int
        Measurements of each point, one per round of fresh servers (a configuration with disagreeing
        repeats is measured again in one more round).
    poisson_fractions : tuple of float
        Open-loop points at these fractions of the configuration's peak throughput.
    poisson_seconds : float
        Target length of each Poisson point (``--poisson-seconds`` overrides).
    draft_lengths : tuple of int
        Default draft lengths to measure (``--draft-lengths`` overrides).
    probes : tuple of Probe
        Workloads beside the main one (none with ``--dataset``, whose lengths are the user's).
    speculative_probes : tuple of str
        The names of the probes SD configurations measure too (no SD measures every probe). The split of
        ``c1p``, ``c2p`` is shared by all configurations, but an SD configuration's costs do not follow the
        context as the no-SD ones do: on one quick-grid calibration's servers (2-core CPU, tiny pair), SD at 4x
        the prompt measured 15-26% slower than a fit without SD probes predicted and SD at 3x the output
        24% faster at N = 64, while the no-SD probes fitted within 7%. With the prompt probe on SD too
        (22 s of the quick grid), that calibration predicted four earlier benchmark runs' validation runs at
        16.8, 14.9, 25.3 and 17.9% E2E MAPE instead of 23.2, 15.0, 28.6 and 33.4%; the decode probe as well
        (62 s more) at 16.1, 14.8, 24.1 and 18.4% (benchmarks/RESULTS-accuracy-served-2026-11.md).
    instances : int
        Server starts per configuration in a single round (1 or 2): with 2 the second repeats the
        sweep's smallest and largest levels and runs the Poisson points. More rounds (``--repeats``)
        start fresh servers anyway, and a server the user runs (``--endpoint``) cannot be restarted: 1.
    """

    concurrency: tuple[int, ...]
    requests_per_client: int
    min_requests: int
    repeats: int
    poisson_fractions: tuple[float, ...]
    draft_lengths: tuple[int, ...]
    poisson_seconds: float = POISSON_SECONDS
    probes: tuple[Probe, ...] = PROBES
    speculative_probes: tuple[str, ...] = ()
    instances: int = 1

    def requests(self, clients: int) -> int:
        return max(self.min_requests, self.requests_per_client * clients)


SERVED_GRIDS = {
    # quick: N in steps of 4 up to 64, the largest batch most deployments run (a sweep that stops at 32 misses
    # the throughput still gained from 32 to 64, and predicted saturation 16-19% low on real runs)
    "quick": ServedGrid(concurrency=(1, 4, 16, 64), requests_per_client=3, min_requests=16, repeats=1,
                        poisson_fractions=(0.4, 0.75), draft_lengths=(2, 4), poisson_seconds=8.0, instances=2,
                        speculative_probes=("prompt",)),
    "standard": ServedGrid(concurrency=(1, 2, 4, 8, 16, 32, 64), requests_per_client=8, min_requests=24, repeats=2,
                           poisson_fractions=(0.3, 0.55, 0.8), draft_lengths=(1, 2, 4),
                           speculative_probes=("prompt", "decode")),
    "thorough": ServedGrid(concurrency=(1, 2, 4, 8, 16, 32, 64, 128), requests_per_client=10, min_requests=32,
                           repeats=3, poisson_fractions=(0.25, 0.5, 0.75), draft_lengths=(1, 2, 3, 4, 6),
                           speculative_probes=("prompt", "decode")),
}


def concurrency_levels(grid: ServedGrid, max_clients: int) -> list[int]:
    """The grid's client counts up to the server's ``max_num_seqs``, which is itself measured when the
    grid steps over it (quick, N 1, 4, 16, 64 at max_num_seqs 8: 1, 4, 8): the sweep reaches the batch cap.
    Below three levels, doublings fill in (max_num_seqs 4: 1, 2, 4), so that ``L(N)`` has a slope to fit."""
    levels = [n for n in grid.concurrency if n <= max_clients] or [1]
    if levels[-1] < max_clients < max(grid.concurrency):
        levels.append(max_clients)
    if len(levels) < 3:
        levels = sorted(set(levels) | {2**i for i in range(max_clients.bit_length()) if 2**i <= max_clients})
    return levels


def probe_points(grid: ServedGrid, prompt_tokens: int, output_tokens: int, top_level: int, *,
                 max_model_len: int | None = None, extra_tokens: int = 0,
                 requests_held: Callable[[int, int], int | None] = lambda prompt, output: None,
                 names: tuple[str, ...] | None = None) -> list[LoadPoint]:
    """The closed-loop points of a grid's probes (:class:`Probe`; only those ``names`` where given) for a main
    workload of ``prompt_tokens`` / ``output_tokens``.

    Each probe's levels are capped at ``top_level`` (the configuration's largest measured level) and at
    ``requests_held(prompt, output)``, the requests of the probe's lengths the server's KV cache holds
    (None: unknown); levels that coincide are measured once. A probe whose longest request (lengths up to
    :data:`sdplan.measure.client.LENGTH_SPREAD` above the means, plus ``extra_tokens`` of drafts) exceeds
    ``max_model_len`` is left out: the server would refuse its requests.
    """
    points = []
    for probe in grid.probes:
        if names is not None and probe.name not in names:
            continue
        prompt, output = probe.lengths(prompt_tokens, output_tokens)
        longest = int(prompt * (1 + LENGTH_SPREAD)) + int(output * (1 + LENGTH_SPREAD)) + extra_tokens
        if max_model_len is not None and longest > max_model_len:
            continue
        held = requests_held(prompt, output)
        cap = min(top_level, held) if held is not None else top_level
        for clients in sorted({min(level, max(cap, 1)) for level in probe.levels}):
            points.append(LoadPoint(prompt, output, grid.requests(clients), concurrency=clients,
                                    name=f"{probe.name}-c{clients}"))
    return points


@dataclass(frozen=True, slots=True)
class Configuration:
    """One server configuration: no SD (``draft_length = 0``) or SD at one draft length."""

    name: str
    draft_length: int
    speculative_config: dict[str, Any] | None

    def serve_arguments(self) -> list[str]:
        if self.speculative_config is None:
            return []
        return ["--speculative-config", json.dumps(self.speculative_config, separators=(",", ":"))]


def configurations(draft: str | None, method: str, draft_lengths: tuple[int, ...],
                   extra: dict[str, Any] | None = None) -> list[Configuration]:
    """No SD first, then one configuration per draft length (``method``: vLLM's SD method)."""
    found = [Configuration("nosd", 0, None)]
    for k in draft_lengths:
        spec: dict[str, Any] = {"method": method, "num_speculative_tokens": k}
        if draft:
            spec["model"] = draft
        spec.update(extra or {})
        found.append(Configuration(f"k{k}", k, spec))
    return found



def next_clients(measured: list[tuple[int, float]], grid_levels: list[int], cap: int | None,
                 batch_cap: int | None) -> tuple[int | None, str | None]:
    """The closed-loop client count round 1 measures after the levels ``measured`` (``(N, throughput)``, in
    order), or None when the sweep is over, with why it goes on or stops (None: nothing to say).

    The ``grid_levels`` (:func:`concurrency_levels`, up to what the server runs at once), stopping once a
    level gains less than :data:`MIN_THROUGHPUT_GAIN` over the best before it. Past the grid's largest N,
    twice the clients, up to ``cap`` (the requests the server runs at once: its ``batch_cap``, the
    ``max_num_seqs``, or fewer where its KV cache holds fewer), while the line through the last two levels
    forecasts at least :data:`EXTEND_THROUGHPUT_GAIN` for the next doubling (:func:`forecast_gain_per_doubling`):
    a GPU's throughput often still doubles from 64 to 256 clients, and a plateau extrapolated from N <= 64
    would be far too high. With no ``max_num_seqs`` known (``--endpoint``) the sweep stops there.
    """
    if len(measured) >= 2:
        last, throughput = measured[-1]
        best_before = max(rps for _, rps in measured[:-1])
        if last >= 4 and throughput < MIN_THROUGHPUT_GAIN * best_before:
            return None, (f"throughput stopped rising at N={last} ({throughput:.3g} vs {best_before:.3g} req/s); "
                          "no larger N")
    if len(measured) < len(grid_levels):
        return grid_levels[len(measured)], None
    if len(measured) < 2 or (cap is not None and measured[-1][0] >= cap):
        return None, None
    (before, before_rps), (last, last_rps) = measured[-2], measured[-1]
    gain = forecast_gain_per_doubling(before, before_rps, last, last_rps)
    line = f"the line through N={before} and N={last} forecasts {gain - 1:+.0%} for N={2 * last}"
    if gain < EXTEND_THROUGHPUT_GAIN:
        return None, f"{line}, so N={last} ran at about {2 / gain - 1:.0%} of the plateau; no larger N (the rest " \
                     "is extrapolated)"
    if batch_cap is None or cap is None:  # (cap is None only without a batch cap)
        return None, (f"{line}, and the server's max_num_seqs is not known (--endpoint): saturation is "
                      f"extrapolated past N={last}")
    further = min(2 * last, cap)
    held = "" if cap == batch_cap else f"; its KV cache holds {cap}"
    return further, f"{line}; measuring N={further} (the server runs up to {batch_cap} requests at once{held})"


def requests_held(kv_cache_tokens: int, prompt_tokens: int, output_tokens: int) -> int | None:
    """The most requests of ``prompt_tokens`` + ``output_tokens`` that fit a server's KV cache of
    ``kv_cache_tokens`` together (:func:`sdplan.inputs.serving.kv_cache_requests`, at least 1: the server started,
    so one fits), or None for an empty workload.

    Past it vLLM preempts running requests to admit new ones and computes them again: a closed loop of
    more clients measures that recomputation and a queue, not ``L = C1 + (N - 1) C2``, and would pull
    the fit's ``C2`` up. A served model with long requests on a small cache (a CPU's
    ``VLLM_CPU_KVCACHE_SPACE=1``: 87,296 tokens for the tiny test model, 37 requests of 2048 + 256
    tokens) reaches it inside the grid.
    """
    if prompt_tokens + output_tokens <= 0:
        return None
    return max(1, kv_cache_requests(kv_cache_tokens, prompt_tokens, output_tokens))


def overload_reason(kept_up: float | None, offered_rps: float | None, mean_latency_s: float,
                    cap: int | None) -> str | None:
    """Why a Poisson point did not keep up with the rate it was offered, or None where it did.

    A point did not keep up when its :func:`sdplan.runs.screen.kept_up_fraction` ``kept_up`` is below
    :data:`sdplan.runs.screen.MIN_KEPT_UP_FRACTION`, or when, with the requests the server runs at once known
    (``cap``: its ``max_num_seqs``, or fewer where its KV cache holds fewer), more requests were in flight on
    average (``lambda L``, Little's law) than that: they waited for a batch slot, a queue the fitted relation
    ``L = C1 + B C2`` leaves out (the planner caps the rate there instead).
    """
    if fell_behind(kept_up):
        return f"kept up {kept_up:.0%} < {MIN_KEPT_UP_FRACTION:.0%}"
    in_flight = (offered_rps or 0.0) * mean_latency_s
    if offered_rps and cap and in_flight > cap:
        return f"{in_flight:.3g} requests in flight on average > the {cap} it runs at once"
    return None


def forecast_gain_per_doubling(clients_before: int, throughput_before: float, clients: int,
                               throughput: float) -> float:
    """Throughput's growth factor from ``N`` to ``2N`` closed-loop clients, forecast by the line through two levels.

    With ``L = N / X`` (Little's law) at levels ``N_a < N_b``, the closed-loop relation ``L = C1 + (N - 1) C2``
    (:mod:`sdplan.fitting.fit`) gives the slope ``C2 = (L_b - L_a) / (N_b - N_a)`` and

    ``X(2 N_b) / X(N_b) = 2 L(N_b) / L(2 N_b) = 2 / (1 + X_b C2)``,

    where ``X_b C2`` is the share of the plateau ``1 / C2`` that ``N_b`` ran at: 1.04 for N = 16 at 140 and
    N = 64 at 170 req/s (93% of the plateau), 2 where latency did not grow. 1 for levels out of order.
    """
    if clients <= clients_before or throughput_before <= 0 or throughput <= 0:
        return 1.0
    slope = (clients / throughput - clients_before / throughput_before) / (clients - clients_before)
    return 2.0 / (1.0 + throughput * max(slope, 0.0))


def poisson_length_s(seconds: float, unloaded_s: float) -> float:
    """How long the Poisson points of a configuration send for (s): ``seconds`` (``--poisson-seconds`` or the
    grid's), at least :data:`POISSON_MIN_UNLOADED_LATENCIES` times ``unloaded_s``, the mean latency of its
    smallest closed loop, at most :data:`POISSON_MAX_SECONDS` by that rule."""
    return max(seconds, min(POISSON_MIN_UNLOADED_LATENCIES * unloaded_s, POISSON_MAX_SECONDS))


def repeated_levels(levels: list[int]) -> list[int]:
    """The closed-loop levels a second server instance measures again: the smallest and the largest."""
    return sorted({levels[0], levels[-1]}) if levels else []


def point_key(configuration: str, label: str, repeat: int) -> str:
    """The manifest key (and result file stem) of one repeat of one point, e.g. ``k2_p75_r0``."""
    return f"{configuration}_{label}_r{repeat}"


def point_seed(seed: int, key: str, attempt: int) -> int:
    """The seed of a point's prompts (and Poisson arrivals), from the run's ``seed``, the point's key and its
    measurement ``attempt``: every point (and re-measure) draws its own prompts, since with vLLM's prefix
    caching on (its default), prompts repeated from an earlier point would skip their prefill and flatter the
    later points."""
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")
    return (seed * 1_000_003 + digest + 7919 * attempt) % (2**31)


def slowest_over_fastest(values: list[float]) -> float:
    """max / min - 1 of a point's repeated mean latencies: the measure :data:`REPEAT_DISAGREEMENT` bounds."""
    return max(values) / min(values) - 1.0


def disagree(mean_latencies_s: list[float]) -> bool:
    """Whether the repeats of a point disagree: the slowest more than :data:`REPEAT_DISAGREEMENT` above the
    fastest."""
    return slowest_over_fastest(mean_latencies_s) > REPEAT_DISAGREEMENT


def repeat_spread(values: list[float]) -> float:
    """(max - min) / mean of a point's repeated mean latencies (0 for fewer than two)."""
    if len(values) < 2:
        return 0.0
    return (max(values) - min(values)) / (sum(values) / len(values))
