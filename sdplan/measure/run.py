"""Running a served calibration: a server per configuration, swept in rounds, every point saved.

Per configuration a server is started, swept (:mod:`sdplan.measure.sweep`) and
stopped, round after round on fresh servers (or an ``--endpoint`` the user runs,
swept back to back); :func:`measure_served` returns what the calibration
document (:mod:`sdplan.measure.document`) is built from.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdplan.measure import server as server_module
from sdplan.measure.client import BenchClient
from sdplan.measure.levels import LOWER_RATE_SUFFIX, Configuration, configurations, point_key, repeated_levels
from sdplan.measure.options import ServedOptions
from sdplan.measure.server import ServedEngine, SpareLauncher, interrupt_all, kv_cache_tokens, prefix_cache_share
from sdplan.measure.store import ResultStore
from sdplan.measure.sweep import ReadBack, Sweep, SweepEvents
from sdplan.runs.manifest import PointRecord
from sdplan.stopping import stop_signals


@dataclass
class ServedMeasurement:
    """What a served measurement produced (for the fit and the provenance)."""

    records: list[PointRecord]
    folder: Path
    server_commands: list[str] = field(default_factory=list)
    binding: str = ""
    wall_s: float = 0.0
    invocations: int = 1
    notes: list[str] = field(default_factory=list)
    #: Percent of prompt tokens served from vLLM's prefix cache, per configuration measured in this invocation.
    prefix_cache_hit_pct: dict[str, float] = field(default_factory=dict)
    #: Per point measured more than once ("k4 p75"), (max - min) / mean of its repeats' mean latencies.
    repeat_spreads: dict[str, float] = field(default_factory=dict)
    #: Per configuration, the tokens its server's KV cache holds (vLLM's ``cache_config_info``).
    kv_cache_tokens: dict[str, int] = field(default_factory=dict)
    #: Server instances that measured each configuration (rounds times instances per round; 1: --endpoint).
    instances: int = 1

    def result_files(self, overloaded: bool = False) -> list[Path]:
        """Result files of the points to fit (``overloaded=True``: of the points the server did not keep up with)."""
        return [self.folder / r.file for r in self.records
                if r.overloaded == overloaded and (self.folder / r.file).exists()]


@dataclass
class _Endpoint:
    base_url: str

    def process_groups(self) -> set[int]:
        return set()


def measure_served(options: ServedOptions, events: SweepEvents | None = None) -> ServedMeasurement:
    """Start, sweep and stop a server per configuration (or sweep ``--endpoint``), saving every point.

    Raises
    ------
    EngineError
        If a server or the benchmark client fails (their logs are kept in the results folder).
    """
    events = events or SweepEvents()
    started = time.monotonic()
    store = ResultStore(options.results_dir, options.manifest_options())
    done = store.start(options.resume)
    earlier_s, earlier_count = store.invocation_seconds()
    method_extra: dict[str, Any] = {}
    if options.method == "ngram":
        method_extra = {"prompt_lookup_min": 2, "prompt_lookup_max": 5}
    lengths = options.draft_lengths
    plans = configurations(options.draft, options.method, lengths, method_extra)
    measurement = ServedMeasurement(records=[], folder=options.results_dir)
    model = options.target or ""
    sweep = Sweep(grid=options.grid, store=store, done=done, prompt_tokens=options.prompt_tokens,
                  output_tokens=options.output_tokens, max_clients=options.max_clients(), seed=options.seed,
                  temperature=options.temperature, model=model, events=events,
                  dataset=str(options.dataset) if options.dataset is not None else None,
                  poisson_seconds=options.poisson_seconds or options.grid.poisson_seconds,
                  batch_cap=options.batch_cap(), rounds=options.rounds,
                  bench_extra=_client_arguments(options), kv_cache_tokens=store.kv_cache_tokens(),
                  max_model_len=_whole(options.serve_value("--max-model-len")),
                  draft_tokens=max(lengths, default=-1) + 1)
    try:
        with BenchClient(log_path=options.results_dir / "bench.log", python=options.python) as client:
            if options.endpoint is not None:
                _measure_endpoint(options, sweep, client, measurement, events)
            else:
                _measure_rounds(options, sweep, plans, client, measurement, events)
    finally:
        wall = time.monotonic() - started
        store.record_invocation(wall)
    measurement.records = latest_records(store.load())
    measurement.wall_s = earlier_s + wall
    measurement.invocations = earlier_count + 1
    measurement.repeat_spreads = sweep.spreads()
    measurement.kv_cache_tokens = dict(sweep.kv_cache_tokens)
    measurement.instances = sweep.rounds * sweep.instances if sweep.fresh_servers else 1
    return measurement


def _measure_endpoint(options: ServedOptions, sweep: Sweep, client: Any, measurement: ServedMeasurement,
                      events: SweepEvents) -> None:
    """The rounds of one configuration on a server the user runs: back to back, as it cannot be restarted."""
    assert options.endpoint is not None
    endpoint = _Endpoint(options.endpoint.rstrip("/"))
    sweep.fresh_servers = False
    sweep.model = server_module.served_model_name(options.endpoint)
    tokens = server_module.kv_cache_tokens(options.endpoint)
    if tokens is not None:  # for the warm-up's level, before the configuration has its name
        sweep.kv_cache_tokens["endpoint"] = tokens
    sweep.warm_up(Configuration("endpoint", -1, None), endpoint, client)
    sweep.kv_cache_tokens.pop("endpoint", None)
    k = server_module.probe_draft_length(options.endpoint)
    name = options.label or (f"ep-k{k}" if k else "ep-nosd")
    sweep.record_kv_cache(name, tokens)
    configuration = Configuration(name, k, None)
    sweep.run_configuration(configuration, endpoint, client, warm_up=False)
    for repeat in range(1, sweep.rounds):
        sweep.repeat_configuration(configuration, endpoint, client, repeat, warm_up=False)
    sweep.remeasure_configuration(configuration, endpoint, client, warm_up=False)
    _note_prefix_cache(options, measurement, name, endpoint.base_url, events)
    measurement.server_commands.append(f"(a server the user runs, at {options.endpoint}: "
                                       f"{'SD, k=' + str(k) if k else 'no SD'}, labelled {name})")


def _measure_rounds(options: ServedOptions, sweep: Sweep, plans: list[Configuration], client: Any,
                    measurement: ServedMeasurement, events: SweepEvents) -> None:
    """Round 1 over every configuration (each on a server of its own), later rounds in alternating order on
    fresh servers, then a re-measure round of the configurations with points whose repeats disagree (see
    :mod:`sdplan.measure.sweep`)."""
    spares: list[SpareLauncher] = []  # at most one: imports vLLM's server while a server starts

    def launch_spare(waited_s: float) -> None:
        if not spares:
            spares.append(SpareLauncher.launch(options.python, options.results_dir))

    def serve(configuration: Configuration, keys: list[str], work: Any, suffix: str) -> None:
        arguments = [*options.serve_arguments, *configuration.serve_arguments()]
        server = ServedEngine(model=sweep.model, arguments=arguments, python=options.python,
                              log_path=options.results_dir / f"server-{configuration.name}{suffix}.log",
                              startup_timeout_s=options.server_timeout_s)
        if not suffix:
            measurement.server_commands.append(server.display_command())
        if all(sweep.measured(key) for key in keys):
            work(_Endpoint(""), ReadBack())  # every point measured: read back only
            return
        events.on_point(f"{configuration.name}: starting vllm serve" + (f" ({suffix[1:]})" if suffix else ""))
        try:
            server.start(on_wait=launch_spare, spare=spares.pop() if spares else None)
            if spares and not spares[0].wait_ready():  # nothing but the server may use the CPU from here on
                spares.clear()
            sweep.record_kv_cache(configuration.name, kv_cache_tokens(server.base_url))
            if not measurement.binding:
                measurement.binding = summarise_binding(server.log_path.read_text(encoding="utf-8", errors="replace"))
            work(server, client)
            if not suffix:
                _note_prefix_cache(options, measurement, configuration.name, server.base_url, events)
        finally:
            server.stop()

    try:
        _serve_rounds(sweep, plans, serve)
    finally:
        for spare in spares:
            spare.stop()


def _serve_rounds(sweep: Sweep, plans: list[Configuration], serve: Callable[..., None]) -> None:
    """Each round's configurations, in order, through ``serve(configuration, keys, work, suffix)``."""
    for configuration in plans:
        serve(configuration, _keys(sweep, configuration),
              lambda server, bench, c=configuration: sweep.run_configuration(c, server, bench), "")
    if sweep.instances > 1:  # the second instances in the reverse order: each far in time from the first
        for configuration in plans[::-1]:
            serve(configuration, _open_loop_keys(sweep, configuration),
                  lambda server, bench, c=configuration: sweep.run_open_loop(c, server, bench, second=True),
                  "-instance2")
    for repeat in range(1, sweep.rounds):
        for configuration in (plans[::-1] if repeat % 2 else plans):
            serve(configuration, sweep.round_keys(configuration, repeat),
                  lambda server, bench, c=configuration, r=repeat: sweep.repeat_configuration(c, server, bench, r),
                  f"-round{repeat + 1}")
    for configuration in plans:
        keys = sweep.remeasure_keys(configuration)
        if keys:
            serve(configuration, keys,
                  lambda server, bench, c=configuration: sweep.remeasure_configuration(c, server, bench),
                  "-remeasure")


#: Share of prompt tokens served from the prefix cache above which random-prompt points are flattered.
PREFIX_CACHE_NOTE_PCT = 5.0


def _note_prefix_cache(options: ServedOptions, measurement: ServedMeasurement, name: str, base_url: str,
                       events: SweepEvents) -> None:
    """Record how much of the prompts the server's prefix cache served; say so when random prompts hit it.

    vLLM's random prompts are runs of consecutive token ids from a random start: with a small vocabulary
    (tiny test models: 256 tokens) two prompts of one point often start alike, and the cache skips their
    prefill, more so in longer points. Real vocabularies (32k+ tokens) make this rare. With ``--dataset``
    the repeats are the user's own prompts, which the deployed server caches too.
    """
    share = prefix_cache_share(base_url)
    if share is None:
        return
    measurement.prefix_cache_hit_pct[name] = round(100.0 * share, 1)
    if options.dataset is None and 100.0 * share > PREFIX_CACHE_NOTE_PCT:
        note = (f"{name}: vLLM's prefix cache served {100.0 * share:.0f}% of the random prompts' tokens (a small "
                "vocabulary repeats them), which flatters prefill; serve with --no-enable-prefix-caching, or "
                "measure your prompts with --dataset")
        measurement.notes.append(note)
        events.on_note(note)


def _client_arguments(options: ServedOptions) -> tuple[str, ...]:
    """Client flags that follow the server's: the tokenizer it serves with (prompt lengths are counted in it)."""
    tokenizer = options.serve_value("--tokenizer")
    return ("--tokenizer", tokenizer) if tokenizer else ()


def _whole(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _keys(sweep: Sweep, configuration: Configuration) -> list[str]:
    """Keys of the first round of a configuration on its first server: the closed-loop levels and the probes,
    then, unless a second instance runs them, the open-loop points (:func:`_open_loop_keys`)."""
    levels = sweep.stored_levels(configuration)
    labels = [f"c{n}" for n in levels] + [point.label for point in sweep.probes(configuration, levels)]
    keys = [point_key(configuration.name, label, 0) for label in labels]
    return keys + (_open_loop_keys(sweep, configuration) if sweep.instances == 1 else [])


def _open_loop_keys(sweep: Sweep, configuration: Configuration) -> list[str]:
    """Keys of the open-loop part of round 1 of a configuration: on a second instance the repeats of the
    sweep's smallest and largest levels first; the Poisson points, and the lower-rate point measured after each
    Poisson point the server did not keep up with."""
    keys = []
    if sweep.instances > 1:
        keys += [point_key(configuration.name, f"c{n}", 1) for n in repeated_levels(sweep.stored_levels(configuration))]
    labels = [f"p{round(f * 100)}" for f in sweep.grid.poisson_fractions]
    labels += [record.label + LOWER_RATE_SUFFIX for record in sweep.done.values()
               if record.configuration == configuration.name and record.overloaded
               and not record.label.endswith(LOWER_RATE_SUFFIX) and record.repeat == 0]
    return keys + [point_key(configuration.name, label, 0) for label in labels]


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT (Ctrl-C), SIGTERM and SIGHUP raise KeyboardInterrupt (where not ignored), so every
    ``finally`` stops its processes; first every process started gets SIGINT at once
    (:func:`sdplan.measure.server.interrupt_all`), so that their shutdowns overlap."""
    with stop_signals(interrupt_all):
        yield


def latest_records(records: dict[str, PointRecord] | list[PointRecord]) -> list[PointRecord]:
    """The last record of every key (a point flagged later appears twice in the manifest)."""
    latest: dict[str, PointRecord] = {}
    for record in (records.values() if isinstance(records, dict) else records):
        latest[record.key] = record
    return list(latest.values())


def summarise_binding(log_text: str) -> str:
    """vLLM's CPU thread binding from a server log (empty on GPUs)."""
    keep = []
    prefix = re.compile(r"^.*?\[[\w./-]+\.py:\d+\]\s*")  # vLLM's "(Proc pid=..) INFO date [file.py:123] "
    for line in log_text.splitlines():
        for marker in ("reserved_cpus", "Reducing Torch threads", "OMP threads binding of Process", "local_omp_cpuid",
                       "VLLM_CPU_OMP_THREADS_BIND"):
            if marker in line:
                keep.append(prefix.sub("", line).strip())
    unique = list(dict.fromkeys(keep))
    return "; ".join(unique)[:400]

