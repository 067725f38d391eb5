"""The served measurement plan: configurations, load points, repeats, re-measures.

Per configuration (no SD, then SD at each draft length) one server is started
and loaded by a **closed-loop concurrency sweep**: ``N`` clients, each sending
its next request as soon as the last one finishes (``vllm bench serve
--max-concurrency N --request-rate inf``). A closed loop is the fast, stable
core of a calibration: its load is set exactly (``N - 1`` others per request,
``L = C1 + (N - 1) C2``, see :mod:`sdplan.fit`), it cannot overload the server,
and it reaches steady state at once. ``N`` steps through the grid's levels
(quick: 1, 4, 16, 64) up to the server's ``max_num_seqs``, and stops early once
throughput stops rising (less than 5% more for the next level: saturated).
Where the next doubling past the grid's largest level is forecast to gain 10%
(:func:`forecast_gain_per_doubling`), ``N`` doubles on up to ``max_num_seqs``
(the user's, else vLLM's default for the hardware: 128 on a CPU, 256 or 1024 on
a GPU), so the plateau is measured, not extrapolated. Then Poisson points at fractions of the measured peak throughput:
the open-loop regime the planner predicts, which fixes the closed-loop factor of
the fit (:mod:`sdplan.fit`). Lengths vary by +-25% around the requested means
(``--random-range-ratio``), so closed-loop clients do not finish in lockstep
and prefill together as they would with identical requests.

**Probes tell the prefill from the decode steps.** One workload measures the sums
``C1 = c1p + (g - 1) c1_step`` and ``C2 = c2p + (g - 1) c2_step`` (no SD,
:func:`sdplan.model.baseline_demand`) once each, so how they split between the
prefill and the steps, which is what a question at another workload needs, is
not identified (a served calibration at 64/64 tokens put ``c1p`` at 3.5e-17 s
and was 31-71% wrong at 256/32). A grid's :class:`Probe` workloads, a
prompt-heavy one (prompt x4, output /2) and a decode-heavy one (prompt /4,
output x3), are measured as closed loops at two levels each (:func:`probe_points`):
``N = 1`` gives their ``C1``, a larger ``N`` their ``C2``. Their prefill and
step shares differ from the main workload's, which separates the terms, and
the calibration's validity range spans them. They run after the main levels,
on the same server, so that a server's own speed does not enter the split.

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
below :data:`MIN_KEPT_UP_FRACTION`, or more requests in flight on average than
the server's ``--max-num-seqs``) ran past the sustained capacity: a queue built
up that the fitted relation leaves out, so its mean latency measures the run's
length, not the load. A short closed loop can overstate what a server sustains
under open-loop arrivals (seen with tiny models on a 2-core CPU, where the API
server falls behind). Such a point is kept and flagged ``overloaded``, left out
of the fit, and measured again once at the same fraction of the rate it did
sustain, which also becomes the peak of the later points.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from sdplan.measure.client import LoadPoint
from sdplan.measure.quiet import DISTURBED_FOREIGN_CORES
from sdplan.measure.store import PointRecord, ResultStore
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


#: The probes of the grids. Without SD, ``C1 = c1p p/p_ref + (g - 1) c1_step`` (``c1p`` scales with the prompt,
#: :mod:`sdplan.calibration`): the main workload and a prompt-heavy one at 4x the prompt and half the output
#: weigh the two terms 8:1 differently, a decode-heavy one at a quarter of the prompt and 3x the output 12:1 the
#: other way; with the main workload, three points on the two-term line at ``N = 1`` and three at ``N = 16``.
#: ``N = 16`` and not the sweep's top: a decode-heavy request is three times as long, and 16 clients already
#: put ``(N - 1) C2`` well above ``C1`` on every machine measured (CPU: ``C2/C1`` 0.1-0.3 per other request).
PROBES = (Probe("prompt", 4.0, 0.5, (1, 16)), Probe("decode", 0.25, 3.0, (1, 16)))


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
    probe_every_configuration : bool
        Probes on every configuration; False: on the no-SD one only (the split of ``c1p``, ``c2p`` is
        shared by all configurations, and the SD steps scale with the context as the no-SD ones do).
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
    probe_every_configuration: bool = False
    instances: int = 1

    def requests(self, clients: int) -> int:
        return max(self.min_requests, self.requests_per_client * clients)


SERVED_GRIDS = {
    # quick: N in steps of 4 up to 64, the largest batch most deployments run (a sweep that stops at 32 misses
    # the throughput still gained from 32 to 64, and predicted saturation 16-19% low on real runs)
    "quick": ServedGrid(concurrency=(1, 4, 16, 64), requests_per_client=3, min_requests=16, repeats=1,
                        poisson_fractions=(0.4, 0.75), draft_lengths=(2, 4), poisson_seconds=8.0, instances=2),
    "standard": ServedGrid(concurrency=(1, 2, 4, 8, 16, 32, 64), requests_per_client=8, min_requests=24, repeats=2,
                           poisson_fractions=(0.3, 0.55, 0.8), draft_lengths=(1, 2, 4), probe_every_configuration=True),
    "thorough": ServedGrid(concurrency=(1, 2, 4, 8, 16, 32, 64, 128), requests_per_client=10, min_requests=32,
                           repeats=3, poisson_fractions=(0.25, 0.5, 0.75), draft_lengths=(1, 2, 3, 4, 6),
                           probe_every_configuration=True),
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
                 requests_held: Callable[[int, int], int | None] = lambda prompt, output: None) -> list[LoadPoint]:
    """The closed-loop points of a grid's probes (:class:`Probe`) for a main workload of ``prompt_tokens`` /
    ``output_tokens``.

    Each probe's levels are capped at ``top_level`` (the configuration's largest measured level) and at
    ``requests_held(prompt, output)``, the requests of the probe's lengths the server's KV cache holds
    (None: unknown); levels that coincide are measured once. A probe whose longest request (lengths up to
    :data:`sdplan.measure.client.LENGTH_SPREAD` above the means, plus ``extra_tokens`` of drafts) exceeds
    ``max_model_len`` is left out: the server would refuse its requests.
    """
    from sdplan.measure.client import LENGTH_SPREAD

    points = []
    for probe in grid.probes:
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


class Server(Protocol):
    """What the sweep needs of a server: where it is, what it serves, its process groups."""

    base_url: str

    def process_groups(self) -> set[int]: ...


class Client(Protocol):
    def run(self, arguments: list[str], timeout_s: float) -> None: ...

    def process_groups(self) -> set[int]: ...


@dataclass
class SweepEvents:
    """Callbacks for progress (the core never prints)."""

    on_point: Callable[[str], None] = lambda description: None
    on_done: Callable[[PointRecord], None] = lambda record: None
    on_note: Callable[[str], None] = lambda note: None


@dataclass
class PointOutcome:
    record: PointRecord
    mean_latency_s: float
    throughput_rps: float
    #: The Poisson rate asked for (None: a closed loop).
    offered_rps: float | None = None
    #: :func:`sdplan.runs.screen.kept_up_fraction` of a Poisson point (None: a closed loop, or no per-request times).
    kept_up: float | None = None


@dataclass
class Sweep:
    """Runs the plan of one configuration against a live server."""

    grid: ServedGrid
    store: ResultStore
    done: dict[str, PointRecord]
    prompt_tokens: int
    output_tokens: int
    max_clients: int
    seed: int
    temperature: float
    model: str
    remeasure: int = 2
    point_timeout_s: float = 1800.0
    bench_extra: tuple[str, ...] = ()
    #: A JSON Lines prompt file (vLLM's custom dataset) instead of random prompts.
    dataset: str | None = None
    poisson_seconds: float = POISSON_SECONDS
    #: The server's max_num_seqs: the user's, else vLLM's default for the hardware (None: unknown, --endpoint).
    batch_cap: int | None = None
    events: SweepEvents = field(default_factory=SweepEvents)
    outcomes: list[PointOutcome] = field(default_factory=list)
    #: Rounds of fresh servers: measurements of every point (:attr:`sdplan.measure.served.ServedOptions.rounds`).
    rounds: int = 1
    #: Per configuration, the tokens its (first) server's KV cache holds, as vLLM reports them.
    kv_cache_tokens: dict[str, int] = field(default_factory=dict)
    #: Per configuration, the points its first round measured, in order: what later rounds repeat.
    plans: dict[str, list[LoadPoint]] = field(default_factory=dict)
    #: Every round runs on servers started for it (False: --endpoint, one server throughout).
    fresh_servers: bool = True
    #: The server's --max-model-len, if given: probes whose requests would not fit are left out.
    max_model_len: int | None = None
    #: Draft tokens the longest SD configuration adds to a request's context (the largest k, plus one).
    draft_tokens: int = 0

    @property
    def instances(self) -> int:
        """Server starts per configuration: the grid's with one round on fresh servers, else 1
        (:attr:`ServedGrid.instances`)."""
        return self.grid.instances if self.rounds == 1 and self.fresh_servers else 1

    def probes(self, configuration: Configuration, levels: list[int] | None = None) -> list[LoadPoint]:
        """The probe points of a configuration (:func:`probe_points`) after its main ``levels`` (default: those
        round 1 measured): none with ``--dataset``, and on SD configurations only where the grid probes every
        configuration."""
        measured = self.main_levels(configuration.name) if levels is None else levels
        if self.dataset is not None or not measured or (configuration.draft_length != 0
                                                         and not self.grid.probe_every_configuration):
            return []
        return probe_points(self.grid, self.prompt_tokens, self.output_tokens, max(measured),
                            max_model_len=self.max_model_len, extra_tokens=self.draft_tokens,
                            requests_held=lambda prompt, output: self.kv_bound(configuration.name, prompt, output))

    def main_levels(self, configuration: str) -> list[int]:
        """The closed-loop levels of the main workload round 1 measured for a configuration, in order."""
        return [point.concurrency for point in self.plans.get(configuration, [])
                if point.concurrency is not None and point.label == f"c{point.concurrency}"]

    def levels(self, configuration: str | None = None) -> list[int]:
        """The grid's levels for a configuration, up to the requests its server runs at once
        (:meth:`requests_at_once`)."""
        return concurrency_levels(self.grid, min(self.max_clients, self.requests_at_once(configuration) or
                                                 self.max_clients))

    def record_kv_cache(self, configuration: str, tokens: int | None) -> None:
        """Keep the KV cache size of a configuration's first server, in the manifest too (``--resume`` reads
        it back without a server): it bounds the clients the sweep runs (:meth:`kv_bound`)."""
        if tokens is not None and configuration not in self.kv_cache_tokens:
            self.kv_cache_tokens[configuration] = tokens
            self.store.record_kv_cache(configuration, tokens)

    def kv_bound(self, configuration: str | None, prompt_tokens: int | None = None,
                 output_tokens: int | None = None) -> int | None:
        """The most requests of the workload whose prompt and output fit the configuration's KV cache together
        (:func:`sdplan.serving.kv_cache_requests`, at least 1: the server started, so one fits), or
        None when unknown (server not started yet, not vLLM, or ``--dataset``, whose lengths vary).

        Past it vLLM preempts running requests to admit new ones and computes them again: a closed loop of
        more clients measures that recomputation and a queue, not ``L = C1 + (N - 1) C2``, and would pull
        the fit's ``C2`` up. A served model with long requests on a small cache (a CPU's
        ``VLLM_CPU_KVCACHE_SPACE=1``: 87,296 tokens for the tiny test model, 37 requests of 2048 + 256
        tokens) reaches it inside the grid.
        """
        tokens = self.kv_cache_tokens.get(configuration) if configuration is not None else None
        prompt = self.prompt_tokens if prompt_tokens is None else prompt_tokens
        output = self.output_tokens if output_tokens is None else output_tokens
        if tokens is None or self.dataset is not None or prompt + output <= 0:
            return None
        from sdplan.serving import kv_cache_requests

        return max(1, kv_cache_requests(tokens, prompt, output))

    def requests_at_once(self, configuration: str | None) -> int | None:
        """The most requests a configuration's server runs at once: its ``max_num_seqs`` (:attr:`batch_cap`),
        or fewer where its KV cache holds fewer (:meth:`kv_bound`); None when neither is known."""
        known = [cap for cap in (self.batch_cap, self.kv_bound(configuration)) if cap is not None]
        return min(known) if known else None

    def warm_up(self, configuration: Configuration, server: Server, client: Client) -> None:
        """One unrecorded closed-loop run at the largest level: compiles and caches every batch shape
        the points will use, so the first point does not pay for them."""
        from sdplan.measure.client import bench_arguments

        clients = max(self.levels(configuration.name))
        # the lengths vary like the points' (+-25%): every prefill and batch shape is compiled here, not in a point
        point = self._load(max(clients, 32), concurrency=clients)
        self.events.on_point(f"{configuration.name}: warm-up")
        path = self.store.folder / f"warmup-{configuration.name}.json"
        path.unlink(missing_ok=True)
        client.run(bench_arguments(point, base_url=server.base_url, model=self.model, result=path,
                                   seed=self._point_seed(f"warmup-{configuration.name}", 0),
                                   temperature=self.temperature, extra=self.bench_extra), self.point_timeout_s)

    def run_configuration(self, configuration: Configuration, server: Server, client: Client,
                          warm_up: bool = True) -> list[PointOutcome]:
        """Measure the first round of one configuration, which decides its plan (points already done are
        read back): the closed-loop sweep and its probes, then, unless a second server instance runs them
        (:attr:`instances`), the Poisson points."""
        results = self.run_sweep(configuration, server, client, warm_up)
        if self.instances == 1:
            results += self.run_open_loop(configuration, server, client, warm_up=False)
        return results

    def run_sweep(self, configuration: Configuration, server: Server, client: Client,
                  warm_up: bool = True) -> list[PointOutcome]:
        """The closed-loop levels of round 1 (which decide the plan), then the probes at their own lengths."""
        results: list[PointOutcome] = []
        plan = self.plans[configuration.name] = []
        if warm_up and not isinstance(client, ReadBack):
            self.warm_up(configuration, server, client)
        measured: list[tuple[int, float]] = []
        bound = self.kv_bound(configuration.name)
        if bound is not None and bound < min(self.max_clients, max(self.grid.concurrency)) \
                and not isinstance(client, ReadBack):  # past the grid, the note on going further says so
            self.events.on_note(
                f"{configuration.name}: the server's KV cache holds {self.kv_cache_tokens[configuration.name]} "
                f"tokens, {bound} requests of {self.prompt_tokens} + {self.output_tokens}: the sweep goes no "
                f"further than N={bound} (past it vLLM preempts requests), nor does a server you deploy so")
        while (clients := self.next_level(measured, configuration.name, say=True)) is not None:
            point = self._load(self.grid.requests(clients), concurrency=clients)
            plan.append(point)
            outcomes = [self._measure(configuration, point, 0, server, client)]
            results += outcomes
            measured.append((clients, max(o.throughput_rps for o in outcomes)))
        for point in self.probes(configuration):
            plan.append(point)
            results.append(self._measure(configuration, point, 0, server, client))
        self.outcomes += results
        return results

    def instance_repeats(self, configuration: Configuration) -> list[LoadPoint]:
        """The points a second server instance measures again: the sweep's smallest and largest levels
        (the unloaded latency and the plateau, where instances differed most)."""
        chosen = set(repeated_levels(self.main_levels(configuration.name)))
        return [point for point in self.plans[configuration.name]
                if point.concurrency in chosen and point.label == f"c{point.concurrency}"]

    def run_open_loop(self, configuration: Configuration, server: Server, client: Client, warm_up: bool = True,
                      second: bool = False) -> list[PointOutcome]:
        """The Poisson points of round 1 at the grid's fractions of the configuration's peak throughput.

        ``second``: on a second server instance, which first measures :meth:`instance_repeats` again (as
        repeat 1 of those points) and scales the peak by its own throughput at the largest level over the
        first instance's, so that each instance is loaded at the fractions of what it sustains.
        """
        results: list[PointOutcome] = []
        name = configuration.name
        main = {f"c{n}" for n in self.main_levels(name)}
        first = [o for o in self.outcomes if o.record.configuration == name and o.record.repeat == 0
                 and o.record.label in main]
        peak = max(o.throughput_rps for o in first)
        unloaded_s = first[0].mean_latency_s  # levels ascend: first[0] is the smallest N
        if second:
            if warm_up and not isinstance(client, ReadBack):
                self.warm_up(configuration, server, client)
            repeats = self.instance_repeats(configuration)
            for point in repeats:
                results.append(self._measure(configuration, point, 1, server, client))
            top = repeats[-1].label
            before = next(o.throughput_rps for o in first if o.record.label == top)
            again = next(o.throughput_rps for o in results if o.record.label == top)
            if before > 0 and again > 0:
                peak *= again / before
        seconds = self.poisson_length_s(unloaded_s)
        for fraction in self.grid.poisson_fractions:
            label = f"p{round(fraction * 100)}"
            outcomes = self._poisson(configuration, label, fraction * peak, server, client, seconds)
            sustained = self._overloaded(configuration, outcomes)
            lower = point_key(name, label + LOWER_RATE_SUFFIX, 0)
            # reading back a folder measured before points were judged: flagged now, but there is no server
            reading_back = isinstance(client, ReadBack) and lower not in self.done
            if sustained is not None and not reading_back:  # once more at the same fraction of what it sustained
                peak = min(peak, sustained)
                lowered = self._poisson(configuration, label + LOWER_RATE_SUFFIX, fraction * peak, server, client,
                                        seconds)
                if self._overloaded(configuration, lowered) is not None:
                    peak = min(peak, min(o.throughput_rps for o in lowered))
                outcomes += lowered
            results += outcomes
        self.outcomes += results
        return results

    def next_level(self, measured: list[tuple[int, float]], configuration: str | None = None,
                   say: bool = False) -> int | None:
        """The closed-loop client count round 1 measures after the levels ``measured`` (``(N, throughput)``,
        in order) of a configuration, or None when the sweep is over; ``say``: tell why in notes.

        The grid's levels (up to the batch cap and the KV cache's :meth:`kv_bound`), stopping once a level
        gains less than :data:`MIN_THROUGHPUT_GAIN` over the best before it. Past the grid's largest N, twice
        the clients, up to the server's batch cap and KV cache, while the line through the last two levels
        forecasts at least :data:`EXTEND_THROUGHPUT_GAIN` for the next doubling (:func:`forecast_gain_per_doubling`):
        a GPU's throughput often still doubles from 64 to 256 clients, and a plateau extrapolated from N <= 64
        would be far too high. With no ``max_num_seqs``
        known (``--endpoint``) the sweep stops there.
        """
        note = self.events.on_note if say else (lambda text: None)
        if len(measured) >= 2:
            last, throughput = measured[-1]
            best_before = max(rps for _, rps in measured[:-1])
            if last >= 4 and throughput < MIN_THROUGHPUT_GAIN * best_before:
                note(f"{configuration}: throughput stopped rising at N={last} ({throughput:.3g} vs "
                     f"{best_before:.3g} req/s); no larger N")
                return None
        grid = self.levels(configuration)
        if len(measured) < len(grid):
            return grid[len(measured)]
        cap = self.requests_at_once(configuration)
        if len(measured) < 2 or (cap is not None and measured[-1][0] >= cap):
            return None
        (before, before_rps), (last, last_rps) = measured[-2], measured[-1]
        gain = forecast_gain_per_doubling(before, before_rps, last, last_rps)
        line = f"the line through N={before} and N={last} forecasts {gain - 1:+.0%} for N={2 * last}"
        if gain < EXTEND_THROUGHPUT_GAIN:
            note(f"{configuration}: {line}, so N={last} ran at about {2 / gain - 1:.0%} of the plateau; no larger "
                 "N (the rest is extrapolated)")
            return None
        if self.batch_cap is None or cap is None:  # (cap is None only without a batch cap)
            note(f"{configuration}: {line}, and the server's max_num_seqs is not known (--endpoint): saturation "
                 f"is extrapolated past N={last}")
            return None
        further = min(2 * last, cap)
        held = "" if cap == self.batch_cap else f"; its KV cache holds {cap}"
        note(f"{configuration}: {line}; measuring N={further} (the server runs up to {self.batch_cap} requests at "
             f"once{held})")
        return further

    def stored_levels(self, configuration: Configuration) -> list[int]:
        """The closed-loop levels round 1 measures, as far as the points already stored decide them: the
        first level not yet stored ends the list (reading back needs every one; a missing one needs a server)."""
        measured: list[tuple[int, float]] = []
        while (clients := self.next_level(measured, configuration.name)) is not None:
            stored = self._stored(point_key(configuration.name, f"c{clients}", 0))
            if stored is None:
                return [n for n, _ in measured] + [clients]
            measured.append((clients, stored.throughput_rps))
        return [n for n, _ in measured]

    def round_keys(self, configuration: Configuration, repeat: int) -> list[str]:
        """Keys of a later round (``repeat`` >= 1) of a configuration whose first round has run."""
        return [point_key(configuration.name, point.label, repeat) for point in self.plans[configuration.name]]

    def repeat_configuration(self, configuration: Configuration, server: Server, client: Client, repeat: int,
                             warm_up: bool = True) -> list[PointOutcome]:
        """Round ``repeat`` + 1 of a configuration: its first round's points again, on the server given.

        A Poisson point the server does not keep up with this time is flagged and left out of the fit, as in
        the first round, but not measured again at a lower rate: the rates stay those of the first round, so
        that the repeats of a point compare.
        """
        if warm_up and not isinstance(client, ReadBack):
            self.warm_up(configuration, server, client)
        results = []
        for point in self.plans[configuration.name]:
            outcome = self._measure(configuration, point, repeat, server, client)
            if point.rate_rps is not None:
                self._overloaded(configuration, [outcome], again=False)
            results.append(outcome)
        self.outcomes += results
        return results

    def disagreeing(self, configuration: Configuration, below_repeat: int) -> list[LoadPoint]:
        """The points of a configuration whose repeats numbered below ``below_repeat`` disagree: the slowest
        more than :data:`REPEAT_DISAGREEMENT` above the fastest."""
        found = []
        for point in self.plans.get(configuration.name, []):
            outcomes = self._repeats_of(configuration, point.label, below_repeat)
            if len(outcomes) >= 2 and _disagree(outcomes):
                found.append(point)
        return found

    def remeasure_keys(self, configuration: Configuration) -> list[str]:
        """Keys of the re-measure round of a configuration (after every round has run): its whole plan when
        any of its points' repeats disagree, else none."""
        if not self.disagreeing(configuration, self.rounds):
            return []
        return self.round_keys(configuration, self.rounds)

    def remeasure_configuration(self, configuration: Configuration, server: Server, client: Client,
                                warm_up: bool = True) -> list[PointOutcome]:
        """When some points' repeats disagree, measure the configuration's whole plan once more on the server
        given, then flag the repeats that stay more than :data:`REPEAT_DISAGREEMENT` from their point's median.

        The whole plan, in its order, not the disagreeing points alone: a point measured right after the
        warm-up meets a server in another state than the same point after the ones before it (real runs: a
        Poisson point at 75% load measured alone that way took 1.5-2.5x as long in 3 of 5 cases).
        """
        points = self.disagreeing(configuration, self.rounds)
        if not points:
            return []
        if any(key not in self.done for key in self.round_keys(configuration, self.rounds)):
            gaps = ", ".join(f"{point.label} +{self._gap(configuration, point.label):.0%}" for point in points)
            self.events.on_note(f"{configuration.name}: repeats on fresh servers differ by more than "
                                f"{REPEAT_DISAGREEMENT:.0%} (slowest over fastest: {gaps}); "
                                "measuring the configuration once more")
        results = self.repeat_configuration(configuration, server, client, self.rounds, warm_up=warm_up)
        for point in self.plans[configuration.name]:
            outcomes = self._repeats_of(configuration, point.label, self.rounds + 1)
            if len(outcomes) >= 3 and _disagree(outcomes):
                median = sorted(o.mean_latency_s for o in outcomes)[len(outcomes) // 2]
                for o in outcomes:
                    if abs(o.mean_latency_s - median) > REPEAT_DISAGREEMENT * median and not o.record.disturbed:
                        o.record = _flag(o.record)
                        self.store.append(o.record)
                        self.done[o.record.key] = o.record
        return results

    def spreads(self) -> dict[str, float]:
        """Per point measured more than once (``configuration label``), the spread of its repeats' mean
        latencies, (max - min) / mean, over every repeat kept (overloaded ones left out)."""
        found = {}
        for configuration, plan in self.plans.items():
            for point in plan:
                values = [o.mean_latency_s for o in self.outcomes if o.record.configuration == configuration
                          and o.record.label == point.label and not o.record.overloaded]
                if len(values) >= 2:
                    found[f"{configuration} {point.label}"] = repeat_spread(values)
        return found

    def _gap(self, configuration: Configuration, label: str) -> float:
        return _slowest_over_fastest([o.mean_latency_s for o in self._repeats_of(configuration, label, self.rounds)])

    def _repeats_of(self, configuration: Configuration, label: str, below_repeat: int) -> list[PointOutcome]:
        return [o for o in self.outcomes if o.record.configuration == configuration.name and o.record.label == label
                and o.record.repeat < below_repeat and not o.record.overloaded]

    def poisson_length_s(self, unloaded_s: float) -> float:
        """How long the Poisson points of a configuration send for (s): ``--poisson-seconds`` (or the grid's),
        at least :data:`POISSON_MIN_UNLOADED_LATENCIES` times ``unloaded_s``, the mean latency of its smallest
        closed loop, at most :data:`POISSON_MAX_SECONDS` by that rule."""
        return max(self.poisson_seconds, min(POISSON_MIN_UNLOADED_LATENCIES * unloaded_s, POISSON_MAX_SECONDS))

    def _poisson(self, configuration: Configuration, name: str, rate_rps: float, server: Server,
                 client: Client, seconds: float) -> list[PointOutcome]:
        rate = float(f"{rate_rps:.3g}")
        requests = max(self.grid.min_requests * 2, int(rate * seconds))
        point = self._load(min(requests, 2000), rate_rps=rate, name=name)
        self.plans[configuration.name].append(point)
        return [self._measure(configuration, point, 0, server, client)]

    def _overloaded(self, configuration: Configuration, outcomes: list[PointOutcome],
                    again: bool = True) -> float | None:
        """Flag the repeats of a Poisson point that did not keep up; the rate they sustained, or None.

        A point did not keep up when its :func:`sdplan.runs.screen.kept_up_fraction` is below :data:`MIN_KEPT_UP_FRACTION`,
        or when, with the server's ``max_num_seqs`` or KV cache known (:meth:`requests_at_once`), more
        requests were in flight on average (``lambda L``, Little's law) than the server runs at once: they
        waited for a batch slot, a queue the fitted relation ``L = C1 + B C2`` leaves out (the planner caps
        the rate there instead).
        """
        def in_flight(o: PointOutcome) -> float:
            return (o.offered_rps or 0.0) * o.mean_latency_s

        cap = self.requests_at_once(configuration.name)
        behind = [o for o in outcomes if fell_behind(o.kept_up)
                  or (o.offered_rps and cap and in_flight(o) > cap)]
        if not behind:
            return None
        for o in behind:
            if not o.record.overloaded:
                from dataclasses import replace

                o.record = replace(o.record, overloaded=True)
                self.store.append(o.record)
                self.done[o.record.key] = o.record
        worst = min(behind, key=lambda o: o.kept_up if o.kept_up is not None else 1.0)
        why = (f"kept up {worst.kept_up:.0%} < {MIN_KEPT_UP_FRACTION:.0%}"
               if fell_behind(worst.kept_up)
               else f"{in_flight(worst):.3g} requests in flight on average > the {cap} it runs at once")
        self.events.on_note(
            f"{configuration.name} {worst.record.label}: the server did not keep up with {worst.offered_rps or 0:.3g} "
            f"req/s (completed {worst.throughput_rps:.3g} req/s, {why}: past what it sustains); left out of the fit"
            + ("" if worst.record.label.endswith(LOWER_RATE_SUFFIX) or not again
               else ", measuring again at a lower rate"))
        return max(o.throughput_rps for o in behind)

    def _load(self, requests: int, **how: Any) -> LoadPoint:
        return LoadPoint(self.prompt_tokens, self.output_tokens, requests, dataset=self.dataset, **how)

    def _seed_key(self, configuration: Configuration, point: LoadPoint, key: str) -> str:
        """The key a point's prompts and arrivals are drawn from: on fresh servers, every repeat of a point
        sends the first round's requests at the first round's times, so that repeats differ by the machine
        alone; on a server the user runs (no restart between rounds), each repeat draws its own."""
        return point_key(configuration.name, point.label, 0) if self.fresh_servers else key

    def _point_seed(self, key: str, attempt: int) -> int:
        """Every point (and re-measure) draws its own prompts: with vLLM's prefix caching on (its default),
        prompts repeated from an earlier point would skip their prefill and flatter the later points."""
        return (self.seed * 1_000_003 + _stable_hash(key) + 7919 * attempt) % (2**31)

    def _stored(self, key: str) -> PointOutcome | None:
        """The outcome of a point already measured (recorded, its result file present), else None."""
        record = self.done.get(key)
        path = self.store.result_path(key)
        return _outcome(record, path) if record is not None and path.exists() else None

    def _measure(self, configuration: Configuration, point: LoadPoint, repeat: int, server: Server,
                 client: Client) -> PointOutcome:
        from sdplan.measure.client import bench_arguments
        from sdplan.measure.quiet import ForeignCpu

        key = point_key(configuration.name, point.label, repeat)
        stored = self._stored(key)
        if stored is not None:
            return stored
        path = self.store.result_path(key)
        attempts = 0
        while True:
            self.events.on_point(f"{configuration.name} {point.label}"
                                 + (f" (repeat {repeat + 1})" if self.rounds > 1 or repeat else ""))
            monitor = ForeignCpu(server.process_groups() | client.process_groups())
            begin = time.monotonic()
            monitor.start()
            client.run(bench_arguments(point, base_url=server.base_url, model=self.model, result=path,
                                       seed=self._point_seed(self._seed_key(configuration, point, key), attempts),
                                       temperature=self.temperature,
                                       extra=self.bench_extra),
                       self.point_timeout_s)
            foreign = monitor.stop()
            wall = time.monotonic() - begin
            disturbed = foreign is not None and foreign > DISTURBED_FOREIGN_CORES
            if disturbed and attempts < self.remeasure:
                attempts += 1
                self.events.on_note(f"{configuration.name} {point.label}: other processes used "
                                    f"{foreign:.2f} CPU cores during the point; measuring again")
                time.sleep(2.0)
                continue
            record = PointRecord(key=key, file=path.name, configuration=configuration.name,
                                 draft_length=configuration.draft_length, label=point.label, repeat=repeat,
                                 foreign_cpu_cores=None if foreign is None else round(foreign, 4),
                                 disturbed=disturbed, wall_s=round(wall, 3))
            self.store.append(record)
            self.done[key] = record
            self.events.on_done(record)
            return _outcome(record, path)


class ReadBack:
    """A client for configurations whose points are all measured: reading them back needs no load."""

    def run(self, arguments: list[str], timeout_s: float) -> None:
        raise AssertionError("every point of this configuration is already measured")

    def process_groups(self) -> set[int]:
        return set()


def forecast_gain_per_doubling(clients_before: int, throughput_before: float, clients: int,
                               throughput: float) -> float:
    """Throughput's growth factor from ``N`` to ``2N`` closed-loop clients, forecast by the line through two levels.

    With ``L = N / X`` (Little's law) at levels ``N_a < N_b``, the closed-loop relation ``L = C1 + (N - 1) C2``
    (:mod:`sdplan.fit`) gives the slope ``C2 = (L_b - L_a) / (N_b - N_a)`` and

    ``X(2 N_b) / X(N_b) = 2 L(N_b) / L(2 N_b) = 2 / (1 + X_b C2)``,

    where ``X_b C2`` is the share of the plateau ``1 / C2`` that ``N_b`` ran at: 1.04 for N = 16 at 140 and
    N = 64 at 170 req/s (93% of the plateau), 2 where latency did not grow. 1 for levels out of order.
    """
    if clients <= clients_before or throughput_before <= 0 or throughput <= 0:
        return 1.0
    slope = (clients / throughput - clients_before / throughput_before) / (clients - clients_before)
    return 2.0 / (1.0 + throughput * max(slope, 0.0))


def repeated_levels(levels: list[int]) -> list[int]:
    """The closed-loop levels a second server instance measures again: the smallest and the largest."""
    return sorted({levels[0], levels[-1]}) if levels else []


def point_key(configuration: str, label: str, repeat: int) -> str:
    """The manifest key (and result file stem) of one repeat of one point, e.g. ``k2_p75_r0``."""
    return f"{configuration}_{label}_r{repeat}"


def _stable_hash(text: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def _flag(record: PointRecord) -> PointRecord:
    from dataclasses import replace

    return replace(record, disturbed=True)


def _slowest_over_fastest(values: list[float]) -> float:
    """max / min - 1 of a point's repeated mean latencies: the measure :data:`REPEAT_DISAGREEMENT` bounds."""
    return max(values) / min(values) - 1.0


def _disagree(outcomes: list[PointOutcome]) -> bool:
    return _slowest_over_fastest([o.mean_latency_s for o in outcomes]) > REPEAT_DISAGREEMENT


def repeat_spread(values: list[float]) -> float:
    """(max - min) / mean of a point's repeated mean latencies (0 for fewer than two)."""
    if len(values) < 2:
        return 0.0
    return (max(values) - min(values)) / (sum(values) / len(values))


def _outcome(record: PointRecord, path: Path) -> PointOutcome:
    from sdplan.runs import read_results

    run = read_results(path, "vllm")[0][0]
    return PointOutcome(record=record, mean_latency_s=run.mean_e2e_latency_s, throughput_rps=run.achieved_rate_rps,
                        offered_rps=run.requested_rate_rps, kept_up=run.kept_up)


def latest_records(records: dict[str, PointRecord] | list[PointRecord]) -> list[PointRecord]:
    """The last record of every key (a point flagged later appears twice in the manifest)."""
    latest: dict[str, PointRecord] = {}
    for record in (records.values() if isinstance(records, dict) else records):
        latest[record.key] = record
    return list(latest.values())


def summarise_binding(log_text: str) -> str:
    """vLLM's CPU thread binding from a server log (empty on GPUs)."""
    import re

    keep = []
    prefix = re.compile(r"^.*?\[[\w./-]+\.py:\d+\]\s*")  # vLLM's "(Proc pid=..) INFO date [file.py:123] "
    for line in log_text.splitlines():
        for marker in ("reserved_cpus", "Reducing Torch threads", "OMP threads binding of Process", "local_omp_cpuid",
                       "VLLM_CPU_OMP_THREADS_BIND"):
            if marker in line:
                keep.append(prefix.sub("", line).strip())
    unique = list(dict.fromkeys(keep))
    return "; ".join(unique)[:400]

