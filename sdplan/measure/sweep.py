"""Running the served measurement plan against live servers, and storing every point.

:class:`Sweep` measures one configuration's round 1 (the closed-loop levels, the
probes, the Poisson points), its later rounds on fresh servers and its re-measure
round, reading back points a results folder already holds (``--resume``). The
rules it follows (grids, levels, when to stop, repeats that disagree) are
:mod:`sdplan.measure.levels`, where the plan is described.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from sdplan.measure.client import LoadPoint, bench_arguments
from sdplan.measure.levels import (
    LOWER_RATE_SUFFIX,
    POISSON_SECONDS,
    REPEAT_DISAGREEMENT,
    Configuration,
    ServedGrid,
    concurrency_levels,
    disagree,
    next_clients,
    overload_reason,
    point_key,
    point_seed,
    poisson_length_s,
    probe_points,
    repeat_spread,
    repeated_levels,
    requests_held,
    slowest_over_fastest,
)
from sdplan.measure.quiet import DISTURBED_FOREIGN_CORES, ForeignCpu
from sdplan.measure.store import ResultStore
from sdplan.runs import read_results
from sdplan.runs.manifest import PointRecord


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
    #: Rounds of fresh servers: measurements of every point (:attr:`sdplan.measure.options.ServedOptions.rounds`).
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
        round 1 measured): none with ``--dataset``; on SD configurations the grid's ``speculative_probes``."""
        measured = self.main_levels(configuration.name) if levels is None else levels
        names = None if configuration.draft_length == 0 else self.grid.speculative_probes
        if self.dataset is not None or not measured or names == ():
            return []
        return probe_points(self.grid, self.prompt_tokens, self.output_tokens, max(measured),
                            max_model_len=self.max_model_len, extra_tokens=self.draft_tokens,
                            requests_held=lambda prompt, output: self.kv_bound(configuration.name, prompt, output),
                            names=names)

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
        """The most requests of the workload (this sweep's lengths unless given) that a configuration's KV cache
        holds (:func:`sdplan.measure.levels.requests_held`), or None when unknown (server not started yet, not
        vLLM, or ``--dataset``, whose lengths vary)."""
        tokens = self.kv_cache_tokens.get(configuration) if configuration is not None else None
        if tokens is None or self.dataset is not None:
            return None
        return requests_held(tokens, self.prompt_tokens if prompt_tokens is None else prompt_tokens,
                             self.output_tokens if output_tokens is None else output_tokens)

    def requests_at_once(self, configuration: str | None) -> int | None:
        """The most requests a configuration's server runs at once: its ``max_num_seqs`` (:attr:`batch_cap`),
        or fewer where its KV cache holds fewer (:meth:`kv_bound`); None when neither is known."""
        known = [cap for cap in (self.batch_cap, self.kv_bound(configuration)) if cap is not None]
        return min(known) if known else None

    def warm_up(self, configuration: Configuration, server: Server, client: Client) -> None:
        """One unrecorded closed-loop run at the largest level: compiles and caches every batch shape
        the points will use, so the first point does not pay for them."""
        clients = max(self.levels(configuration.name))
        # the lengths vary like the points' (+-25%): every prefill and batch shape is compiled here, not in a point
        point = self._load(max(clients, 32), concurrency=clients)
        self.events.on_point(f"{configuration.name}: warm-up")
        path = self.store.folder / f"warmup-{configuration.name}.json"
        path.unlink(missing_ok=True)
        client.run(bench_arguments(point, base_url=server.base_url, model=self.model, result=path,
                                   seed=point_seed(self.seed, f"warmup-{configuration.name}", 0),
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
            reading_back = isinstance(client, ReadBack) and not self.measured(lower)
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
        in order) of a configuration, or None when the sweep is over (:func:`sdplan.measure.levels.next_clients`,
        within the requests its server runs at once, :meth:`requests_at_once`); ``say``: tell why in notes."""
        level, why = next_clients(measured, self.levels(configuration), self.requests_at_once(configuration),
                                  self.batch_cap)
        if say and why is not None:
            self.events.on_note(f"{configuration}: {why}")
        return level


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
            if len(outcomes) >= 2 and disagree([o.mean_latency_s for o in outcomes]):
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
        if not all(self.measured(key) for key in self.round_keys(configuration, self.rounds)):
            gaps = ", ".join(f"{point.label} +{self._gap(configuration, point.label):.0%}" for point in points)
            self.events.on_note(f"{configuration.name}: repeats on fresh servers differ by more than "
                                f"{REPEAT_DISAGREEMENT:.0%} (slowest over fastest: {gaps}); "
                                "measuring the configuration once more")
        results = self.repeat_configuration(configuration, server, client, self.rounds, warm_up=warm_up)
        for point in self.plans[configuration.name]:
            outcomes = self._repeats_of(configuration, point.label, self.rounds + 1)
            if len(outcomes) >= 3 and disagree([o.mean_latency_s for o in outcomes]):
                median = sorted(o.mean_latency_s for o in outcomes)[len(outcomes) // 2]
                for o in outcomes:
                    if abs(o.mean_latency_s - median) > REPEAT_DISAGREEMENT * median and not o.record.disturbed:
                        o.record = replace(o.record, disturbed=True)
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
        return slowest_over_fastest([o.mean_latency_s for o in self._repeats_of(configuration, label, self.rounds)])

    def _repeats_of(self, configuration: Configuration, label: str, below_repeat: int) -> list[PointOutcome]:
        return [o for o in self.outcomes if o.record.configuration == configuration.name and o.record.label == label
                and o.record.repeat < below_repeat and not o.record.overloaded]

    def poisson_length_s(self, unloaded_s: float) -> float:
        """How long the Poisson points of a configuration send for (s): :func:`sdplan.measure.levels.poisson_length_s`
        of this sweep's ``poisson_seconds``."""
        return poisson_length_s(self.poisson_seconds, unloaded_s)


    def _poisson(self, configuration: Configuration, name: str, rate_rps: float, server: Server,
                 client: Client, seconds: float) -> list[PointOutcome]:
        rate = float(f"{rate_rps:.3g}")
        requests = max(self.grid.min_requests * 2, int(rate * seconds))
        point = self._load(min(requests, 2000), rate_rps=rate, name=name)
        self.plans[configuration.name].append(point)
        return [self._measure(configuration, point, 0, server, client)]

    def _overloaded(self, configuration: Configuration, outcomes: list[PointOutcome],
                    again: bool = True) -> float | None:
        """Flag the repeats of a Poisson point that did not keep up (:func:`sdplan.measure.levels.overload_reason`,
        with the requests its server runs at once, :meth:`requests_at_once`); the rate they sustained, or None."""
        cap = self.requests_at_once(configuration.name)

        def why(o: PointOutcome) -> str | None:
            return overload_reason(o.kept_up, o.offered_rps, o.mean_latency_s, cap)

        behind = [o for o in outcomes if why(o) is not None]
        if not behind:
            return None
        for o in behind:
            if not o.record.overloaded:
                o.record = replace(o.record, overloaded=True)
                self.store.append(o.record)
                self.done[o.record.key] = o.record
        worst = min(behind, key=lambda o: o.kept_up if o.kept_up is not None else 1.0)
        self.events.on_note(
            f"{configuration.name} {worst.record.label}: the server did not keep up with {worst.offered_rps or 0:.3g} "
            f"req/s (completed {worst.throughput_rps:.3g} req/s, {why(worst)}: past what it sustains); left out of "
            "the fit"
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

    def measured(self, key: str) -> bool:
        """Whether a point is measured: recorded, and the file its line names (which the fit reads) on disk."""
        record = self.done.get(key)
        return record is not None and (self.store.folder / record.file).is_file()

    def _stored(self, key: str) -> PointOutcome | None:
        """The outcome of a point already measured (:meth:`measured`), else None."""
        return _outcome(self.done[key], self.store.folder / self.done[key].file) if self.measured(key) else None

    def _measure(self, configuration: Configuration, point: LoadPoint, repeat: int, server: Server,
                 client: Client) -> PointOutcome:
        key = point_key(configuration.name, point.label, repeat)
        stored = self._stored(key)
        if stored is not None:
            return stored
        path = self.store.result_path(key)
        if (kept := self.store.set_aside(path)) is not None:
            self.events.on_note(f"{path.name} is on disk but no manifest line records it: kept as {kept.name}, "
                                "and the point is measured again")
        attempts = 0
        while True:
            self.events.on_point(f"{configuration.name} {point.label}"
                                 + (f" (repeat {repeat + 1})" if self.rounds > 1 or repeat else ""))
            monitor = ForeignCpu(server.process_groups() | client.process_groups())
            begin = time.monotonic()
            monitor.start()
            client.run(bench_arguments(point, base_url=server.base_url, model=self.model, result=path,
                                       seed=point_seed(self.seed, self._seed_key(configuration, point, key), attempts),
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


def _outcome(record: PointRecord, path: Path) -> PointOutcome:
    run = read_results(path, "vllm")[0][0]
    return PointOutcome(record=record, mean_latency_s=run.mean_e2e_latency_s, throughput_rps=run.achieved_rate_rps,
                        offered_rps=run.requested_rate_rps, kept_up=run.kept_up)

