"""The benchmark client's driver: real processes, with a stand-in for vLLM's benchmark on PYTHONPATH.

The stand-in starts a thread when it is imported (as vLLM's import starts torch's) and, run as a job,
writes the niceness its main thread, that thread and a thread started by the job run at.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sdplan._vllm.launch import CLIENT_NICENESS
from sdplan.measure.client import BenchClient

REPOSITORY = Path(__file__).resolve().parent.parent

FAKE_BENCHMARK = '''
import os
import threading

_ask, _answer = threading.Event(), {}


def _started_at_import():
    _ask.wait()
    _answer["import_thread"] = os.getpriority(os.PRIO_PROCESS, 0)  # Linux: the calling thread's


threading.Thread(target=_started_at_import, daemon=True).start()


def add_cli_args(parser):
    parser.add_argument("--result")


def main(args):
    import json

    late = threading.Thread(target=lambda: _answer.__setitem__("job_thread", os.getpriority(os.PRIO_PROCESS, 0)))
    late.start()
    late.join()
    _ask.set()
    while "import_thread" not in _answer:
        pass
    _answer["main_thread"] = os.getpriority(os.PRIO_PROCESS, 0)
    with open(args.result, "w") as stream:
        json.dump(_answer, stream)
'''


@pytest.fixture
def fake_benchmark(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "fake"
    for package in ("vllm", "vllm/benchmarks", "vllm/utils"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "vllm" / "benchmarks" / "serve.py").write_text(FAKE_BENCHMARK)
    (root / "vllm" / "utils" / "argparse_utils.py").write_text("from argparse import ArgumentParser as "
                                                                  "FlexibleArgumentParser\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), str(REPOSITORY)]))
    return root


def _may_raise_priority() -> bool:
    """Whether a process started from here may lower its niceness to the client's (root, CAP_SYS_NICE)."""
    probe = f"import os; os.setpriority(os.PRIO_PROCESS, 0, {CLIENT_NICENESS})"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def test_the_driver_runs_its_benchmarks_ahead_of_the_server_where_it_may(tmp_path, fake_benchmark) -> None:
    expected = CLIENT_NICENESS if _may_raise_priority() else os.getpriority(os.PRIO_PROCESS, 0)
    result = tmp_path / "result.json"
    with BenchClient(log_path=tmp_path / "bench.log") as client:
        client.run(["--result", str(result)], 60.0)
        assert client.niceness == expected
    # every thread: the job's, one started by the job, and one the import started before the driver was ready
    assert json.loads(result.read_text()) == {"job_thread": expected, "import_thread": expected,
                                              "main_thread": expected}


def test_the_calibration_says_when_its_client_could_not_run_ahead_of_the_server() -> None:
    from sdplan.measure.document import _client_priority

    assert _client_priority(None) == ""  # no benchmark ran in this invocation
    assert _client_priority(CLIENT_NICENESS) == f", at niceness {CLIENT_NICENESS}, ahead of the server's processes"
    assert "needs root or CAP_SYS_NICE" in _client_priority(0)
