"""A step-level fake of a served engine and of ``vllm bench serve``, for the served calibration tests.

The fake server runs continuous batching step by step: a step with ``n`` running
requests costs ``tau1 + (n - 1) tau2`` seconds (plus the prefill of requests admitted
in it), every running request gains ``E`` tokens per step (1 without SD), a new
request's first token comes at the end of its admission step. Closed loops restart
a request the moment one finishes; open loops admit Poisson arrivals at step
boundaries. It is *not* the model's formula: the tests check that fitting its
closed-loop points predicts its open-loop points.

The fake client writes the same JSON fields ``vllm bench serve --save-result
--save-detailed`` does, per-request lists included.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import sdplan.measure.document
import sdplan.measure.options
import sdplan.measure.quiet
import sdplan.measure.run
from sdplan.inputs.acceptance import expected_tokens_per_cycle


@dataclass
class FakeEngine:
    """Per-step costs of the fake served engine (seconds)."""

    step_fixed_s: float = 0.004
    step_per_request_s: float = 0.0006
    verify_fixed_s: float = 0.005
    verify_per_request_s: float = 0.0007
    draft_fixed_s: float = 0.0008
    draft_per_request_s: float = 0.00008
    prefill_s: float = 0.02
    #: Prefill cost per prompt token and step cost per running request per token of its context (s): a
    #: served engine whose prefill grows with the prompt and whose steps read every request's KV cache.
    prefill_per_token_s: float = 0.0
    step_per_context_token_s: float = 0.0
    alpha: float = 0.8
    noise: float = 0.0
    run_noise: float = 0.0
    overhead_ttft_s: float = 0.01
    #: Every this-many-th request's answer reaches the client in one rush at its end (None: none do), as a
    #: stalled stream does; written as vLLM's ``itls`` (one chunk per token, else evenly spaced).
    stall_every: int | None = None
    #: Steps a closed-loop replacement request misses before it is admitted. A real client sends it only
    #: after the last token has travelled through the API server, when the engine already runs the next
    #: step; a Poisson arrival lands anywhere in a step.
    closed_loop_lag_steps: int = 0
    #: Every step of an open-loop (Poisson) run costs this many times more: a server that sustains less under
    #: open-loop arrivals than its short closed loops suggest (a real one's API server falling behind).
    open_loop_slowdown: float = 1.0
    #: The n-th server started runs every step this many times slower (cycled): a machine whose speed moves
    #: from one server start to the next, over minutes.
    server_slowdowns: tuple[float, ...] = ()

    def step(self, k: int) -> tuple[float, float, float]:
        """(tau1, tau2, tokens per step) of an option."""
        if k == 0:
            return self.step_fixed_s, self.step_per_request_s, 1.0
        return (self.verify_fixed_s + k * self.draft_fixed_s, self.verify_per_request_s + k * self.draft_per_request_s,
                float(expected_tokens_per_cycle(self.alpha, k)))


def run_load(engine: FakeEngine, k: int, prompt: int, output: int, requests: int, clients: int | None,
             rate: float | None, seed: int, spread: float = 0.0, max_running: int | None = None,
             server_slowdown: float = 1.0) -> dict[str, Any]:
    """Simulate one benchmark run; returns a vLLM bench serve result document.

    Output lengths are uniform within +-``spread`` of ``output`` (vLLM's --random-range-ratio). At most
    ``max_running`` requests run at once (the server's ``--max-num-seqs``); later arrivals wait their turn.
    """
    rng = random.Random(seed)
    low, high = max(2, round(output * (1 - spread))), max(2, round(output * (1 + spread)))
    lengths = [rng.randint(low, high) for _ in range(requests + (clients or 0))]
    tau1, tau2, per_step = engine.step(k)
    slowdown = math.exp(rng.gauss(0.0, engine.run_noise)) * server_slowdown  # a whole run slower or faster
    if clients is None:
        slowdown *= engine.open_loop_slowdown
    tau1, tau2 = tau1 * slowdown, tau2 * slowdown
    t = 0.0
    pending: list[float] = []
    if clients is None:
        arrival = 0.0
        for _ in range(requests):
            arrival += rng.expovariate(rate)
            pending.append(arrival)
        # as vllm bench serve does (vllm/benchmarks/serve.py, get_request): the intervals are rescaled so that
        # the last request is sent at requests/rate, and every run offers exactly the rate asked for
        pending = [t * (requests / rate) / pending[-1] for t in pending]
    started = 0
    running: list[dict[str, float]] = []
    done: list[dict[str, float]] = []
    if clients is not None:
        for _ in range(min(clients, requests)):
            running.append({"start": 0.0, "left": float(lengths[started]), "out": lengths[started], "first": -1.0})
            started += 1
    lagged: list[list[Any]] = []  # [steps still to miss, request] of closed-loop replacements
    while len(done) < requests:
        while pending and pending[0] <= t and (max_running is None or len(running) < max_running):
            running.append({"start": pending.pop(0), "left": float(lengths[started]), "out": lengths[started],
                            "first": -1.0})
            started += 1
        if not running:  # an idle engine steps as soon as a request arrives
            lagged = [[0, request] for _, request in lagged]
        running += [request for steps, request in lagged if steps <= 0]
        lagged = [[steps - 1, request] for steps, request in lagged if steps > 0]
        if not running:
            t = max(t, pending[0])
            continue
        new = sum(1 for r in running if r["first"] < 0)
        prefill = (engine.prefill_s + engine.prefill_per_token_s * prompt) \
            * (1.0 if clients else engine.open_loop_slowdown) * server_slowdown
        context = sum(prompt + r["out"] - r["left"] for r in running) * engine.step_per_context_token_s * slowdown
        cost = tau1 + (len(running) - 1) * tau2 + new * prefill + context
        t += cost * (1.0 + rng.gauss(0.0, engine.noise))
        finished = []
        for r in running:
            if r["first"] < 0:
                r["first"] = t + engine.overhead_ttft_s
                r["left"] -= 1.0
            else:
                r["left"] -= per_step
            if r["left"] <= 1e-9:
                finished.append(r)
        for r in finished:
            running.remove(r)
            r["end"] = max(t, r["first"])
            done.append(r)
            if clients is not None and started < requests:
                replacement = {"start": t, "left": float(lengths[started]), "out": lengths[started], "first": -1.0}
                if engine.closed_loop_lag_steps:
                    lagged.append([engine.closed_loop_lag_steps, replacement])
                else:
                    running.append(replacement)
                started += 1
    done = done[:requests]
    latencies = [r["end"] - r["start"] for r in done]
    ttfts = [r["first"] - r["start"] for r in done]
    duration = max(r["end"] for r in done) - min(r["start"] for r in done)
    document: dict[str, Any] = {
        "date": "20261122-120000", "backend": "vllm", "model_id": "fake", "num_prompts": requests,
        "request_rate": "inf" if clients is not None else rate, "burstiness": 1.0, "max_concurrency": clients,
        "duration": duration, "completed": requests, "failed": 0, "total_input_tokens": prompt * requests,
        "total_output_tokens": sum(r["out"] for r in done), "request_throughput": requests / duration,
        "mean_e2el_ms": sum(latencies) / requests * 1e3, "mean_ttft_ms": sum(ttfts) / requests * 1e3,
        "mean_tpot_ms": sum((e2e - f) / (r["out"] - 1) for e2e, f, r in zip(latencies, ttfts, done)) / requests * 1e3,
        "latencies": latencies, "ttfts": ttfts, "start_times": [r["start"] for r in done],
        "output_lens": [r["out"] for r in done], "input_lens": [prompt] * requests, "errors": [""] * requests,
    }
    if engine.stall_every:
        document["itls"] = [[0.0 if i % engine.stall_every == 0 else (e2e - f) / (r["out"] - 1)] * (r["out"] - 1)
                            for i, (e2e, f, r) in enumerate(zip(latencies, ttfts, done))]
    if k:
        tau = float(expected_tokens_per_cycle(engine.alpha, k))
        drafts = round(requests * output / tau)
        accepted = round(drafts * (tau - 1))
        document.update({"spec_decode_acceptance_rate": accepted / (drafts * k) * 100, "spec_decode_acceptance_length":
                         1 + accepted / drafts, "spec_decode_num_drafts": drafts,
                         "spec_decode_draft_tokens": drafts * k, "spec_decode_accepted_tokens": accepted,
                         "spec_decode_per_position_acceptance_rates": [engine.alpha ** (i + 1) for i in range(k)]})
    return document


def parse_bench_arguments(arguments: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for index, arg in enumerate(arguments):
        if arg.startswith("--") and index + 1 < len(arguments) and not arguments[index + 1].startswith("--"):
            values[arg] = arguments[index + 1]
    return values


@dataclass
class FakeServer:
    """Stands in for ``ServedEngine``: records starts and stops; knows its draft length."""

    model: str
    arguments: list[str]
    log_path: Path
    python: str = ""
    startup_timeout_s: float = 0.0
    port: int = 1
    started: list[str] = field(default_factory=list)
    live: bool = False
    instances: Any = None
    #: This server's place among the servers started (0: the first), None: never started.
    start_order: int | None = None

    def __post_init__(self) -> None:
        FakeServer.registry.append(self)

    registry: Any = None  # set by the fixture

    @property
    def base_url(self) -> str:
        return "http://127.0.0.1:1"

    @property
    def draft_length(self) -> int:
        if "--speculative-config" in self.arguments:
            return int(json.loads(self.arguments[self.arguments.index("--speculative-config") + 1])
                       ["num_speculative_tokens"])
        return 0

    def display_command(self) -> str:
        return "vllm serve " + " ".join([self.model, *self.arguments])

    def start(self, on_wait: Any = None, spare: Any = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("INFO reserved_cpus=[1]\n")
        self.live = True
        self.start_order = sum(1 for s in FakeServer.registry if s.start_order is not None)
        FakeServer.current = self
        self.spare = spare
        if spare is not None:
            spare.hand_over()
        if on_wait is not None:
            on_wait(1.0)

    spare: Any = None

    def stop(self) -> None:
        self.live = False

    def process_groups(self) -> set[int]:
        return set()

    current: Any = None
    #: Requests run at once without --max-num-seqs (vLLM's default on a CPU; None: a user's --endpoint).
    default_max_num_seqs: Any = 128


@dataclass(eq=False)
class FakeSpare:
    """Stands in for ``SpareLauncher``: records whether it was handed to a server, stopped, or left waiting."""

    state: str = "waiting"
    launched: Any = None  # every spare launched, in order (set by the fixture)

    @classmethod
    def launch(cls, python: str, folder: Path) -> FakeSpare:
        spare = cls()
        cls.launched.append(spare)
        return spare

    def wait_ready(self, timeout_s: float = 120.0) -> bool:
        return self.state == "waiting"

    def hand_over(self) -> None:
        assert self.state == "waiting", "a spare was handed over twice or after it stopped"
        self.state = "handed"

    def stop(self) -> None:
        if self.state == "waiting":
            self.state = "stopped"


@dataclass
class FakeClient:
    """Stands in for ``BenchClient``: writes what vllm bench serve would, from :func:`run_load`."""

    log_path: Path
    python: str = ""
    engine: FakeEngine = field(default_factory=FakeEngine)
    calls: int = 0
    interrupt_after: int | None = None
    last_arguments: Any = None  # of the last benchmark any client ran (class-wide)

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def run(self, arguments: list[str], timeout_s: float) -> None:
        FakeClient.last_arguments = list(arguments)
        if self.interrupt_after is not None and self.calls >= self.interrupt_after:
            raise KeyboardInterrupt
        self.calls += 1
        values = parse_bench_arguments(arguments)
        server = FakeServer.current
        assert server is not None and server.live, "the client ran without a live server"
        clients = int(values["--max-concurrency"]) if "--max-concurrency" in values else None
        rate = None if clients else float(values["--request-rate"])
        if values["--dataset-name"] == "custom":  # the fake serves the file's mean lengths (words = tokens)
            rows = [json.loads(line) for line in Path(values["--dataset-path"]).read_text().splitlines()]
            prompt = round(sum(len(r["prompt"].split()) for r in rows) / len(rows))
            output = int(values["--custom-output-len"])
            if output < 1:
                output = round(sum(r["output_tokens"] for r in rows) / len(rows))
            spread = 0.0
        else:
            prompt, output = int(values["--random-input-len"]), int(values["--random-output-len"])
            spread = float(values.get("--random-range-ratio", 0))
        cap = int(server.arguments[server.arguments.index("--max-num-seqs") + 1]) \
            if "--max-num-seqs" in server.arguments else FakeServer.default_max_num_seqs
        document = run_load(self.engine, server.draft_length, prompt, output, int(values["--num-prompts"]), clients,
                            rate, int(values["--seed"]), spread, max_running=cap,
                            server_slowdown=self.engine.server_slowdowns[server.start_order
                                                                        % len(self.engine.server_slowdowns)]
                            if self.engine.server_slowdowns and server.start_order is not None else 1.0)
        path = Path(values["--result-dir"]) / values["--result-filename"]
        path.write_text(json.dumps(document))

    def process_groups(self) -> set[int]:
        return set()


@dataclass
class FakeServed:
    """What :func:`install_fake_served` put in place; a test sets ``engine`` (and ``interrupt_after``) before
    it runs ``sdplan calibrate`` and reads the clients made afterwards."""

    engine: FakeEngine = field(default_factory=FakeEngine)
    interrupt_after: int | None = None
    clients: list[FakeClient] = field(default_factory=list)


def install_fake_served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeServed:
    """vLLM 'installed', servers and the bench client replaced by fakes, /proc readings quiet, and model
    folders ``target`` and ``draft`` in ``tmp_path``."""
    served = FakeServed()
    FakeServer.registry = []
    FakeServer.current = None

    def client(**kwargs: Any) -> FakeClient:
        made = FakeClient(**kwargs, engine=served.engine, interrupt_after=served.interrupt_after)
        served.clients.append(made)
        return made

    # each replaced where it is looked up: the modules that import it
    for module in (sdplan.measure.options, sdplan.measure.document):
        monkeypatch.setattr(module, "installed_distribution", lambda: ("vllm", "0.0.0"))
    monkeypatch.setattr(sdplan.measure.run, "ServedEngine", FakeServer)
    FakeSpare.launched = []
    monkeypatch.setattr(sdplan.measure.run, "SpareLauncher", FakeSpare)
    monkeypatch.setattr(sdplan.measure.run, "BenchClient", client)
    monkeypatch.setattr(sdplan.measure.quiet, "machine_busy_s", lambda: None)
    monkeypatch.setattr(sdplan.measure.options, "dataset_reader_installed", lambda: True)
    # a CPU, where vLLM runs up to 128 requests at once unless --max-num-seqs says otherwise (as the fake does)
    monkeypatch.setattr(sdplan.measure.options, "hardware_description", lambda: "Fake CPU (CPU, 2 cores)")
    for name in ("target", "draft"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    return served
