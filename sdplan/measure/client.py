"""vLLM's own benchmark client, ``vllm bench serve``, one process for many load points.

Each point writes an ordinary ``vllm bench serve --save-result --save-detailed``
JSON file, the same file a user gets from the command line, so that
``sdplan fit`` and ``sdplan validate`` read calibration data and user data
alike. The client runs in its own process group (stopped like the server).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdplan._vllm.launch import subprocess_environment
from sdplan.errors import EngineError, InputFileError
from sdplan.measure.server import log_tail, track, untrack

#: Lengths are drawn uniformly within +-25% of the means (vLLM's --random-range-ratio) unless a point says otherwise.
LENGTH_SPREAD = 0.25


@dataclass(frozen=True, slots=True)
class LoadPoint:
    """One benchmark run: a closed loop of ``concurrency`` clients or Poisson arrivals at ``rate_rps``.

    Exactly one of ``concurrency`` and ``rate_rps`` is set.
    """

    prompt_tokens: int
    output_tokens: int
    requests: int
    concurrency: int | None = None
    rate_rps: float | None = None
    #: Lengths are drawn uniformly within +-spread of the means (vLLM's --random-range-ratio).
    spread: float = LENGTH_SPREAD
    #: A stable name for the point (Poisson points are named by their fraction of the peak, not their rate).
    name: str | None = None
    #: A JSON Lines prompt file in vLLM's custom format instead of random prompts (``output_tokens`` < 1:
    #: each line's own ``output_tokens``).
    dataset: str | None = None

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return f"c{self.concurrency}" if self.concurrency is not None else f"r{self.rate_rps:g}"


def bench_arguments(point: LoadPoint, *, base_url: str, model: str, result: Path, seed: int,
                    temperature: float, extra: tuple[str, ...] = ()) -> list[str]:
    """The ``vllm bench serve`` arguments of one point: random prompts at the point's lengths, or its dataset.

    A dataset is vLLM's ``custom`` one, sent as written (no chat template); its prompts are
    shuffled with the point's seed and repeated when the point needs more requests than it has.
    """
    if point.dataset is None:
        workload = ["--dataset-name", "random", "--random-input-len", str(point.prompt_tokens),
                    "--random-output-len", str(point.output_tokens), "--random-range-ratio", f"{point.spread:g}"]
    else:
        workload = ["--dataset-name", "custom", "--dataset-path", point.dataset, "--skip-chat-template",
                    "--custom-output-len", str(point.output_tokens if point.output_tokens > 0 else -1)]
    args = [
        "--backend", "vllm", "--base-url", base_url, "--model", model, *workload,
        "--num-prompts", str(point.requests), "--ignore-eos", "--seed", str(seed),
        "--temperature", f"{temperature:g}",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--save-result", "--save-detailed", "--result-dir", str(result.parent), "--result-filename", result.name,
        "--disable-tqdm",
    ]
    if point.concurrency is not None:
        args += ["--max-concurrency", str(point.concurrency), "--request-rate", "inf"]
    else:
        args += ["--request-rate", f"{point.rate_rps:g}"]
    return args + list(extra)


@dataclass(frozen=True, slots=True)
class PromptFile:
    """A checked prompt file for ``vllm bench serve --dataset-name custom``."""

    path: Path
    prompts: int
    #: Every line carries its own ``output_tokens``.
    output_lengths: bool
    #: The longest prompt in whitespace-separated words (a rough bound before tokenisation).
    longest_words: int


def read_prompt_file(path: Path) -> PromptFile:
    """Check a JSON Lines prompt file in vLLM's custom-dataset format.

    One object per line: ``{"prompt": "text", "output_tokens": 128}``, ``output_tokens``
    optional (a positive whole number). vLLM's reader (pandas) takes only ``.jsonl`` names.

    Raises
    ------
    InputFileError
        Naming the line and what to fix.
    """
    where = str(path)
    if path.suffix != ".jsonl":
        raise InputFileError(where, None, "vLLM's custom dataset reads JSON Lines files named *.jsonl; rename it")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or "not UTF-8 text"
        raise InputFileError(where, None, f"cannot read ({reason}); check the path") from None
    count, with_lengths, longest = 0, 0, 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            raise InputFileError(where, f"line {number}", "empty line; vLLM's reader refuses them, remove it")
        try:
            row = json.loads(line)
        except ValueError:
            raise InputFileError(where, f"line {number}", 'not JSON; expected {"prompt": "text"}') from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise InputFileError(where, f"line {number}", 'expected {"prompt": "non-empty text"}')
        if "output_tokens" in row:
            value = row["output_tokens"]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputFileError(where, f"line {number}: output_tokens",
                                     f"{value!r}; expected a whole number of tokens >= 1")
            with_lengths += 1
        count += 1
        longest = max(longest, len(row["prompt"].split()))
    if count == 0:
        raise InputFileError(where, None, 'no prompts; add lines like {"prompt": "text"}')
    return PromptFile(path=path, prompts=count, output_lengths=with_lengths == count, longest_words=longest)


@dataclass(eq=False)
class BenchClient:
    """A running ``python -m sdplan._vllm.launch bench-driver`` (a context manager)."""

    log_path: Path
    python: str = sys.executable
    startup_timeout_s: float = 300.0
    process: subprocess.Popen[str] | None = None
    jobs: int = 0
    ready: bool = False

    def start(self) -> None:
        """Start the driver without waiting for it: it imports vLLM (about 10 s on a 2-core CPU) while the
        first server starts, and :meth:`run` waits for it to be ready."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("a", encoding="utf-8")
        self.process = subprocess.Popen([self.python, "-m", "sdplan._vllm.launch", "bench-driver"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1,
                                        env=subprocess_environment(), start_new_session=True)
        log.close()
        self.ready = False
        track(self)

    def wait_ready(self) -> None:
        """Block until the driver has imported vLLM; raises :class:`EngineError` if it failed to."""
        if self.ready:
            return
        reply = self._read(self.startup_timeout_s)
        if not reply.get("ready"):
            self.stop()
            raise EngineError(f"vllm bench serve did not start (log {self.log_path})")
        self.ready = True

    def _read(self, timeout_s: float) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise EngineError(f"vllm bench serve exited with status {self.process.returncode} "
                                  f"(log {self.log_path}): {log_tail(self.log_path)}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EngineError(f"vllm bench serve gave no answer in {timeout_s:.0f} s (log {self.log_path})")
            ready, _, _ = select.select([self.process.stdout], [], [], min(remaining, 1.0))
            if ready:
                line = self.process.stdout.readline()
                if not line:
                    continue
                try:
                    return dict(json.loads(line))
                except ValueError:
                    continue

    def run(self, arguments: list[str], timeout_s: float) -> None:
        """Run one benchmark; raises :class:`EngineError` if it fails or exceeds ``timeout_s``."""
        self.wait_ready()
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(json.dumps(arguments) + "\n")
        self.process.stdin.flush()
        reply = self._read(timeout_s)
        self.jobs += 1
        if reply.get("status") != 0:
            raise EngineError(f"vllm bench serve failed: {reply.get('error')} (log {self.log_path})")

    def process_groups(self) -> set[int]:
        return {self.process.pid} if self.process is not None else set()

    def stop(self) -> None:
        untrack(self)
        process = self.process
        self.process = None
        if process is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if process.stdin:
                process.stdin.close()
        try:
            process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)
                try:
                    process.wait(timeout=5.0)
                    break
                except subprocess.TimeoutExpired:
                    continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError, ValueError):
            if process.stdout:
                process.stdout.close()

    def __enter__(self) -> BenchClient:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
