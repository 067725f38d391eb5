"""``sdplan calibrate`` on the served system: options, the measurement, the calibration document.

Order of work: every option is checked before any process starts (a usage
error costs nothing); then per configuration a server is started, swept
(:mod:`sdplan.measure.sweep`) and stopped; the points are fitted with the same
machinery as ``sdplan fit`` (:func:`sdplan.fit.fit_pooled`); the calibration is
written even when its fit is poor, and the caller decides the exit status from
:attr:`ServedCalibration.poor_reasons`.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from sdplan.errors import InfeasibleError, InvalidValueError, MissingDependencyError
from sdplan.methods import check_method
from sdplan.measure.store import PointRecord, ResultStore
from sdplan.measure.sweep import (SERVED_GRIDS, Configuration, ServedGrid, Sweep, SweepEvents,
                                  ReadBack, configurations)

#: A calibration whose own points are predicted worse than this is poor (mean absolute % error of mean E2E).
POOR_MAPE_PCT = 10.0
#: ... or whose R2 over its own points is below this.
POOR_R2 = 0.9
#: vLLM SD methods that need a draft model folder.
METHODS_WITH_MODEL = ("draft_model", "eagle", "eagle3")
#: Options sdplan sets itself on ``vllm serve``: not accepted in --serve-arg.
_OWNED_FLAGS = ("--host", "--port", "--speculative-config", "--speculative_config")


@dataclass(frozen=True, slots=True)
class ServedOptions:
    """Everything ``sdplan calibrate`` (served) needs; validated by :func:`check_options`."""

    target: str | None
    draft: str | None
    endpoint: str | None
    method: str
    draft_lengths: tuple[int, ...]
    prompt_tokens: int
    output_tokens: int
    grid_name: str
    serve_arguments: tuple[str, ...]
    results_dir: Path
    temperature: float = 0.0
    seed: int = 0
    resume: bool = False
    server_timeout_s: float = 900.0
    #: --endpoint: the configuration's name in the results folder (default: from the server's metrics).
    label: str | None = None
    #: A JSON Lines prompt file (vLLM's custom dataset) instead of random prompts; ``output_tokens`` 0
    #: then takes every line's own ``output_tokens``.
    dataset: Path | None = None
    #: Target length of each Poisson point (None: the grid's).
    poisson_seconds: float | None = None
    #: Measurements of every point, each in its own round of fresh servers (None: the grid's).
    repeats: int | None = None
    python: str = sys.executable

    @property
    def grid(self) -> ServedGrid:
        return SERVED_GRIDS[self.grid_name]

    @property
    def rounds(self) -> int:
        """Measurements of every point, one per round: ``--repeats``, else the grid's."""
        return self.grid.repeats if self.repeats is None else self.repeats

    def serve_value(self, flag: str) -> str | None:
        """The value of a ``vllm serve`` flag among the user's arguments (:func:`sdplan.serving.serve_flag`)."""
        from sdplan.serving import serve_flag

        return serve_flag(self.serve_arguments, flag)

    def max_clients(self) -> int:
        """The most closed-loop clients the sweep may run: the server's batch cap, else the grid's largest N."""
        return self.batch_cap() or max(self.grid.concurrency)

    def batch_cap(self) -> int | None:
        """The most requests the server runs at once (vLLM ``max_num_seqs``): ``--max-num-seqs`` where the
        serving flags set it, else vLLM's default for this machine (:func:`sdplan.serving.engine_max_num_seqs`,
        128 on a CPU), lowered to ``--max-num-batched-tokens`` as vLLM lowers its default. None with
        ``--endpoint``: the server is the user's, its flags unknown."""
        value = self.serve_value("--max-num-seqs")
        if value and value.isdigit():
            return int(value)
        if self.endpoint is not None:
            return None
        from sdplan.serving import served_max_num_seqs

        return served_max_num_seqs(self.serve_arguments, hardware_description())

    def manifest_options(self) -> dict[str, Any]:
        """The options a resumed invocation must repeat exactly."""
        # The endpoint URL is left out: invocations against servers the user restarts (another port, SD on) merge.
        return {"target": self.target, "draft": self.draft, "endpoint": self.endpoint is not None,
                "method": self.method,
                "draft_lengths": list(self.draft_lengths), "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "grid": self.grid_name,
                "serve_arguments": list(self.serve_arguments), "temperature": self.temperature, "seed": self.seed,
                **({"dataset": str(self.dataset)} if self.dataset is not None else {}),
                **({"poisson_seconds": self.poisson_seconds} if self.poisson_seconds is not None else {}),
                **({"repeats": self.repeats} if self.repeats is not None else {})}

    def workload_text(self) -> str:
        """The requests, as the provenance states them."""
        if self.dataset is None:
            return f"random prompts {self.prompt_tokens} in / {self.output_tokens} out"
        output = "each line's output_tokens" if self.output_tokens < 1 else f"{self.output_tokens} out"
        return f"prompts from {self.dataset} (as written, no chat template), {output}"


def dataset_reader_installed() -> bool:
    """vLLM's custom-dataset reader needs pandas (its ``bench`` extra), which vLLM itself does not require."""
    import importlib.util

    return importlib.util.find_spec("pandas") is not None


def check_options(options: ServedOptions) -> None:
    """Refuse conflicting or impossible options before anything starts.

    Raises
    ------
    InvalidValueError
        (exit 2) with the option to fix.
    MissingDependencyError
        (exit 5) when vLLM is not installed in this Python.
    """
    from sdplan._vllm import INSTALL_HINT, installed_distribution
    from sdplan.measure.server import check_model_folder

    if installed_distribution() is None:
        raise MissingDependencyError(INSTALL_HINT)
    if options.endpoint is None and options.target is None:
        raise InvalidValueError("give --target MODEL (sdplan starts vllm serve) or --endpoint URL (a running server)")
    if options.label is not None and (options.endpoint is None or not options.label.replace("-", "").isalnum()):
        raise InvalidValueError("--label names an --endpoint configuration: letters, digits and '-' only")
    if options.endpoint is not None:
        if options.target is not None or options.serve_arguments or options.draft is not None:
            raise InvalidValueError("--endpoint measures a server you run: --target, --draft and serving flags "
                                    "belong to that server's command line, not to sdplan calibrate")
        if not options.endpoint.startswith(("http://", "https://")):
            raise InvalidValueError(f"--endpoint {options.endpoint}: give a URL, e.g. http://127.0.0.1:8000")
    if options.target is not None:
        check_model_folder(options.target)
    check_method(options.method)
    if options.endpoint is None and options.method in METHODS_WITH_MODEL and options.draft is None \
            and options.draft_lengths:
        raise InvalidValueError(f"--spec-method {options.method} needs --draft MODEL (or --draft-lengths 0 to "
                                "measure no SD only)")
    if options.draft is not None:
        check_model_folder(options.draft)
    # vLLM (config/speculative.py, 0.32) turns draft_model/mtp into another method when the draft's path -- the
    # target's for mtp -- contains one of these words: the server would measure a method the TOML does not name
    drafted = options.draft if options.method == "draft_model" else options.target if options.method == "mtp" else None
    hijack = next((word for word in ("eagle-", "eagle3", "dflash", "dspark")
                   if drafted is not None and options.draft_lengths and word in drafted.lower()), None)
    if hijack is not None:
        raise InvalidValueError(f"{drafted}: vLLM reads a model path containing '{hijack}' as that SD method, "
                                f"whatever --spec-method {options.method} says; rename or link the folder")
    if any(k < 1 or k > 64 for k in options.draft_lengths):
        raise InvalidValueError("--draft-lengths must lie in 1..64")
    for arg in options.serve_arguments:
        if arg.split("=", 1)[0] in _OWNED_FLAGS:
            raise InvalidValueError(f"serving flag {arg}: sdplan sets it itself (a free port on 127.0.0.1; the "
                                    "speculative config from --draft/--draft-lengths/--spec-method); remove it")
    from sdplan.measure.client import LENGTH_SPREAD, read_prompt_file

    spread = 1.0 + LENGTH_SPREAD
    k_tokens = max(options.draft_lengths, default=0) + 1
    if options.dataset is not None:
        prompts = read_prompt_file(options.dataset)
        if not dataset_reader_installed():
            raise MissingDependencyError("--dataset needs pandas (vLLM's custom-dataset reader uses it): pip install "
                                         "pandas, or pip install -e '.[calibrate]'")
        if options.output_tokens < 1 and not prompts.output_lengths:
            raise InvalidValueError(f"{options.dataset}: not every line has output_tokens; give --output-tokens")
        # words are a lower bound on tokens: a request longer than this surely fails
        longest = prompts.longest_words + max(options.output_tokens, 1) + k_tokens
        what = f"the longest prompt of {options.dataset} ({prompts.longest_words} words, at least as many tokens)"
    else:
        longest = int(options.prompt_tokens * spread) + int(options.output_tokens * spread) + k_tokens
        what = (f"prompt and output up to {LENGTH_SPREAD:.0%} above {options.prompt_tokens}/"
                f"{options.output_tokens}, plus {k_tokens} draft tokens")
    max_model_len = options.serve_value("--max-model-len")
    if max_model_len is not None:
        if not max_model_len.isdigit():
            raise InvalidValueError(f"--max-model-len {max_model_len}: expected a whole number of tokens")
        if int(max_model_len) < longest:
            raise InvalidValueError(
                f"--max-model-len {max_model_len} is shorter than the longest calibration request: {what} "
                f"= {longest}; raise it or shorten the requests")
    seqs = options.serve_value("--max-num-seqs")
    if seqs is not None and (not seqs.isdigit() or int(seqs) < 1):
        raise InvalidValueError(f"--max-num-seqs {seqs}: expected a whole number >= 1")
    batched = options.serve_value("--max-num-batched-tokens")
    if batched is not None and batched.isdigit() and int(batched) < options.prompt_tokens and \
            "--no-enable-chunked-prefill" in options.serve_arguments:
        raise InvalidValueError(f"--max-num-batched-tokens {batched} < --prompt-tokens {options.prompt_tokens} "
                                "without chunked prefill: no request could be scheduled")
    import os

    sockets = os.environ.get("VLLM_RPC_BASE_PATH")
    if options.endpoint is None and sockets is not None and not Path(sockets).is_dir():
        raise InvalidValueError(f"VLLM_RPC_BASE_PATH={sockets}: no such folder, and vllm serve puts its IPC sockets "
                                "there; create it, or unset the variable (sdplan then gives each server a folder "
                                "of its own)")
    parent = options.results_dir.parent
    if not parent.exists():
        raise InvalidValueError(f"{parent}: no such folder for the results; create it or change --results-dir")


@functools.lru_cache(maxsize=1)
def hardware_description() -> str:
    """Accelerator (nvidia-smi) or CPU model, with the core count."""
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                   text=True, timeout=10, check=False).stdout.split("\n")
            names = [n.strip() for n in names if n.strip()]
            if names:
                return f"{len(names)}x {names[0]}" if len(names) > 1 else names[0]
    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    import os

    return f"{name} (CPU, {os.cpu_count()} cores)"


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
    from sdplan.measure.client import BenchClient
    from sdplan.measure.sweep import latest_records

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
    from sdplan.measure import server as server_module

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
    from sdplan.measure.server import ServedEngine, kv_cache_tokens
    from sdplan.measure.sweep import summarise_binding

    def serve(configuration: Configuration, keys: list[str], work: Any, suffix: str) -> None:
        arguments = [*options.serve_arguments, *configuration.serve_arguments()]
        server = ServedEngine(model=sweep.model, arguments=arguments, python=options.python,
                              log_path=options.results_dir / f"server-{configuration.name}{suffix}.log",
                              startup_timeout_s=options.server_timeout_s)
        if not suffix:
            measurement.server_commands.append(server.display_command())
        if all(key in sweep.done for key in keys):
            work(_Endpoint(""), ReadBack())  # every point measured: read back only
            return
        events.on_point(f"{configuration.name}: starting vllm serve" + (f" ({suffix[1:]})" if suffix else ""))
        try:
            server.start()
            sweep.record_kv_cache(configuration.name, kv_cache_tokens(server.base_url))
            if not measurement.binding:
                measurement.binding = summarise_binding(server.log_path.read_text(encoding="utf-8", errors="replace"))
            work(server, client)
            if not suffix:
                _note_prefix_cache(options, measurement, configuration.name, server.base_url, events)
        finally:
            server.stop()

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
    from sdplan.measure.server import prefix_cache_share

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
    from sdplan.measure.sweep import point_key

    levels = sweep.stored_levels(configuration)
    labels = [f"c{n}" for n in levels] + [point.label for point in sweep.probes(configuration, levels)]
    keys = [point_key(configuration.name, label, 0) for label in labels]
    return keys + (_open_loop_keys(sweep, configuration) if sweep.instances == 1 else [])


def _open_loop_keys(sweep: Sweep, configuration: Configuration) -> list[str]:
    """Keys of the open-loop part of round 1 of a configuration: on a second instance the repeats of the
    sweep's smallest and largest levels first; the Poisson points, and the lower-rate point measured after each
    Poisson point the server did not keep up with."""
    from sdplan.measure.sweep import LOWER_RATE_SUFFIX, point_key, repeated_levels

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
    """SIGTERM and SIGHUP raise KeyboardInterrupt, so every ``finally`` stops its processes."""
    import signal

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# ----------------------------------------------------------------------------- the calibration


@dataclass
class ServedCalibration:
    document: dict[str, Any]
    fit: Any
    poor_reasons: list[str]


def acceptance_document(runs: list[Any], prompts: str = "random-token prompts") -> dict[str, Any] | None:
    """``[acceptance]`` from the SD runs at the largest measured draft length ``K``.

    The per-token alpha is the i.i.d. one with the runs' mean acceptance length at ``K``. Where
    vLLM recorded per-position rates, their mean goes in too, as the schema's conditional rates
    ``a_i = r_i / r_(i-1)``: a drafter's acceptance is rarely i.i.d. (the tiny draft of the
    benchmark accepts its first two tokens 97% of the time and its third 1%), and the planner
    then takes ``E(k) = 1 + r_1 + ... + r_k`` for every ``k <= K`` instead of extrapolating one alpha.
    """
    spec = [r for r in runs if r.draft_length > 0 and r.alpha is not None]
    if not spec:
        return None
    k = max(r.draft_length for r in spec)
    at_k = [r for r in spec if r.draft_length == k]
    alpha = sum(r.alpha for r in at_k) / len(at_k)
    lengths = [r.mean_acceptance_length for r in at_k if r.mean_acceptance_length is not None]
    length_text = f", mean acceptance length {sum(lengths) / len(lengths):.3f}" if lengths else ""
    document: dict[str, Any] = {"per_token_alpha": round(alpha, 6), "measured_at_k": k}
    positions = [r.position_rates for r in at_k if getattr(r, "position_rates", None) is not None]
    if positions:
        cumulative = [sum(rates[i] for rates in positions) / len(positions) for i in range(k)]
        document["per_position_rates"] = [
            round(rate / previous, 6) if previous > 0 else 0.0
            for rate, previous in zip(cumulative, [1.0, *cumulative[:-1]])]
        length_text += ", per position " + ", ".join(f"{rate:.3f}" for rate in cumulative)
    coverages = [r.draft_coverage for r in at_k if r.draft_coverage is not None]
    coverage = sum(coverages) / len(coverages) if coverages else 1.0
    if coverage < 0.98:  # a draft model drafts on every step; prompt lookup where the context repeats
        document["draft_coverage"] = round(coverage, 4)
        length_text += f", drafts on {coverage:.0%} of decode steps"
    document["source"] = (f"vLLM spec-decode counters over {len(at_k)} served run(s) at k={k}{length_text}; "
                          f"depends on the prompts ({prompts} here) and the temperature")
    return document


def served_calibration(options: ServedOptions, measurement: ServedMeasurement, *, name: str,
                       version: str) -> ServedCalibration:
    """Fit the measured points and build a ``method = "measured"`` calibration.

    Raises
    ------
    InfeasibleError
        When too few points were measured to fit.
    """
    from sdplan.fit import fit_pooled
    from sdplan.runs import read_results, screen

    runs = []
    for path in measurement.result_files():
        runs += read_results(path, "vllm")[0]
    kept = [r for r in runs if not screen(r)]
    overloaded = []
    for path in measurement.result_files(overloaded=True):
        for run in read_results(path, "vllm")[0]:
            overloaded.append(f"{run.source}: {run.achieved_rate_rps:.3g} of {run.requested_rate_rps or 0:.3g} req/s "
                              f"offered, {(run.requested_rate_rps or 0) * run.mean_e2e_latency_s:.3g} requests in "
                              "flight on average")
    if len(kept) < 3:
        raise InfeasibleError(f"only {len(kept)} usable points in {measurement.folder}; measure more (--resume) "
                              "or a larger --grid")
    reference = (options.prompt_tokens, options.output_tokens)
    if options.dataset is not None:  # the dataset's lengths, as served
        reference = (round(sum(r.prompt_tokens for r in kept) / len(kept)),
                     round(sum(r.output_tokens for r in kept) / len(kept)))
    fit = fit_pooled(kept, reference=reference)
    disturbed = [r for r in measurement.records if r.disturbed]
    poor = []
    if fit.mape_pct > POOR_MAPE_PCT:
        poor.append(f"own-point MAPE {fit.mape_pct:.1f}% > {POOR_MAPE_PCT:g}%")
    if fit.r2 < POOR_R2:
        poor.append(f"R2 {fit.r2:.3f} < {POOR_R2:g}")
    if disturbed and len(disturbed) * 4 > len(measurement.records):
        poor.append(f"{len(disturbed)} of {len(measurement.records)} points disturbed (other processes used CPU, "
                    "or their repeats disagree)")
    spread_fields, spread_note = _spread_summary(measurement.repeat_spreads)
    from sdplan.fit import fitted_document

    lengths = sorted({r.draft_length for r in kept if r.draft_length > 0})
    levels = sorted({r.concurrency for r in kept if r.concurrency}, key=int)
    distribution = __import__("sdplan._vllm", fromlist=["installed_distribution"]).installed_distribution()
    engine_version = f"{distribution[1]} ({distribution[0]})" if distribution else "unknown"
    target = options.target or options.endpoint or "unknown"
    provenance = {
        "method": "measured", "hardware": hardware_description(), "target_model": target,
        "speculative_method": options.method,
        "draft_model": options.draft or (options.method if options.method != "draft_model" else "none"),
        "engine": "vllm", "engine_version": engine_version, "date": datetime.date.today(),
        "created_by": f"sdplan calibrate --method served (sdplan {version})",
        "sources": [f"vllm bench serve results: {measurement.folder}"],
        "notes": (f"served: vllm serve loaded by vllm bench serve ({options.workload_text()}, temperature "
                  f"{options.temperature:g}); closed-loop clients "
                  f"{levels}, grid '{options.grid_name}'; draft lengths {lengths or 'none'}. "
                  + " ".join(note.rstrip(".") + "." for note in [*fit.notes, *measurement.notes, *spread_note])),
    }
    measurement_table = {
        "method": "served",
        "server_commands": measurement.server_commands,
        "client": f"vllm bench serve --dataset-name {'random' if options.dataset is None else 'custom'} "
                  "--ignore-eos --save-detailed (one process, vLLM's own benchmark client)",
        "cpu_binding": measurement.binding or "not reported by the server (GPU, or binding disabled)",
        "wall_time_s": round(measurement.wall_s, 1),
        "invocations": measurement.invocations,
        "server_instances_per_configuration": measurement.instances,
        "points": len(measurement.records),
        "disturbed_points": len(disturbed),
        **spread_fields,
        **_full_load_fields(kept),
        **({"overloaded_points": overloaded} if overloaded else {}),
        "results_dir": str(measurement.folder),
        "point_labels": [f"{r.load_level} k={r.draft_length} ({r.source})" for r in fit.residuals],
        "point_errors_pct": [round(r.error_pct, 3) for r in fit.residuals],
        "point_ttft_errors_pct": [round(r.ttft_error_pct, 3) if r.ttft_error_pct is not None else 0.0
                                  for r in fit.residuals],
        **({"prefix_cache": ", ".join(f"{name} {pct:g}%" for name, pct in measurement.prefix_cache_hit_pct.items())
            + " of prompt tokens served from vLLM's prefix cache"} if measurement.prefix_cache_hit_pct else {}),
        **({"kv_cache_configurations": list(measurement.kv_cache_tokens),
            "kv_cache_tokens": list(measurement.kv_cache_tokens.values())} if measurement.kv_cache_tokens else {}),
    }
    document = fitted_document(
        fit, kept, name=name, provenance=provenance,
        description=f"{target} served by vLLM on {provenance['hardware']}, measured with sdplan calibrate",
        extra={"measurement": measurement_table}, acceptance=acceptance_document(
            kept, "random-token prompts" if options.dataset is None else f"the prompts of {options.dataset.name}"))
    return ServedCalibration(document=document, fit=fit, poor_reasons=poor)


def _full_load_fields(runs: list[Any]) -> dict[str, Any]:
    """The measurement table's fields on the closed-loop points' ramp-up and drain: the smallest share of a
    point's duration with all its clients busy (:func:`sdplan.runs.record.full_load_share`), and its point.
    A point of ``3N`` requests is three waves; the rest of its duration is ramp-up and drain, which the fit
    takes in through each request's measured others in flight, but its completed/duration does not."""
    shares = [(r.full_load_share, r) for r in runs if r.concurrency and r.full_load_share is not None]
    if not shares:
        return {}
    share, run = min(shares, key=lambda item: item[0])
    return {"closed_loop_full_load_min_pct": round(100 * share, 1),
            "closed_loop_full_load_min_point": f"N={run.concurrency} k={run.draft_length} ({run.source})"}


def _spread_summary(spreads: dict[str, float]) -> tuple[dict[str, Any], list[str]]:
    """The measurement table's fields on how far the repeats of a point lay apart, and a note when they
    disagree: the repeats ran in rounds, or on a configuration's second server instance, spread over the whole
    calibration (on fresh servers, unless an --endpoint), so their spread is how far the machine's speed moved
    while it was measured, server starts included."""
    if not spreads:
        return {}, []
    import statistics

    median = statistics.median(spreads.values())
    worst = max(spreads, key=spreads.__getitem__)
    fields = {"repeat_spread_median_pct": round(100 * median, 2),
              "repeat_spread_max_pct": round(100 * spreads[worst], 2),
              "repeat_spread_max_point": worst}
    note = []
    from sdplan.measure.sweep import REPEAT_DISAGREEMENT

    if median > REPEAT_DISAGREEMENT:
        note.append(f"The repeats of a point, each on a server instance of its own, lay a median {median:.0%} apart "
                    f"(up to {spreads[worst]:.0%}, {worst}): this machine's speed moved while it was measured, or "
                    "differs from one server start to the next; the fit averages it, and predictions carry an "
                    "error of that order.")
    return fields, note
