"""A server started in a spare launcher: real processes, with a stand-in for vLLM's CLI on PYTHONPATH.

The stand-in says when it is imported (to standard error, before the spare has a job) and, run as
``vllm serve MODEL --port P``, answers every GET with 200 until SIGINT, so that
:class:`sdplan.measure.server.ServedEngine` can start and stop it as it does vLLM.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sdplan.measure.server import ServedEngine, SpareLauncher, _group_alive, http_get

REPOSITORY = Path(__file__).resolve().parent.parent

FAKE_MAIN = '''
import os
import sys

if os.environ.get("FAKE_VLLM_FAIL"):
    raise ImportError("no vLLM here")
print(f"fake vllm imported in {os.getpid()}", file=sys.stderr, flush=True)


def main():
    import http.server
    import signal

    # as vLLM's server does: SIGINT stops it even where it was ignored at startup (a background job)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1])
    print(f"fake vllm {' '.join(argv)} pid={os.getpid()} rpc={os.environ.get('VLLM_RPC_BASE_PATH')}", flush=True)

    class Healthy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    with http.server.HTTPServer(("127.0.0.1", port), Healthy) as server:
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            print("fake vllm stopped", flush=True)
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch) -> Path:
    """A ``vllm`` package whose CLI is the stand-in, first on the PYTHONPATH of the processes started."""
    root = tmp_path / "fake"
    cli = root / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for package in (root / "vllm", root / "vllm" / "entrypoints", cli):
        (package / "__init__.py").write_text("")
    (cli / "main.py").write_text(FAKE_MAIN)
    (cli / "serve.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), str(REPOSITORY)]))
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    monkeypatch.delenv("FAKE_VLLM_FAIL", raising=False)
    return root


def test_a_server_runs_in_the_spare_with_its_import_done_and_its_whole_log(tmp_path, fake_vllm) -> None:
    runs = tmp_path / "runs"
    spare = SpareLauncher.launch(sys.executable, runs)
    assert spare.wait_ready(60.0) and spare.process is not None
    spare_pid = spare.process.pid
    server = ServedEngine(model="m", arguments=["--dtype", "float32"], log_path=runs / "server-nosd.log",
                          python=sys.executable)
    server.start(spare=spare)
    folder = server.socket_folder
    try:
        assert server.process is not None and server.process.pid == spare_pid  # no new process
        assert http_get(server.base_url + "/health")[0] == 200
        assert folder is not None and Path(folder).is_dir()
        assert spare.process is None and spare.socket_folder is None  # the server owns both now
    finally:
        server.stop()
    log = (runs / "server-nosd.log").read_text()
    # the command line, then what the spare printed while it imported, then the server itself
    assert log.index(f"$ {sys.executable} -m sdplan._vllm.launch serve m --host 127.0.0.1") \
        < log.index(f"fake vllm imported in {spare_pid}") \
        < log.index(f"fake vllm serve m --host 127.0.0.1 --port {server.port} --dtype float32 pid={spare_pid}") \
        < log.index("fake vllm stopped")
    assert f"rpc={folder}" in log  # the spare's socket folder, removed with the server
    assert not Path(folder).exists() and not _group_alive(spare_pid)
    assert sorted(p.name for p in runs.iterdir()) == ["server-nosd.log"]  # the spare's own log went into it


def test_a_spare_that_failed_gives_way_to_a_new_process(tmp_path, fake_vllm, monkeypatch) -> None:
    runs = tmp_path / "runs"
    monkeypatch.setenv("FAKE_VLLM_FAIL", "1")
    spare = SpareLauncher.launch(sys.executable, runs)
    spare_pid = spare.process.pid if spare.process is not None else None
    monkeypatch.delenv("FAKE_VLLM_FAIL")
    server = ServedEngine(model="m", arguments=[], log_path=runs / "server-k2.log", python=sys.executable)
    server.start(spare=spare)
    try:
        assert server.process is not None and server.process.pid != spare_pid
        assert http_get(server.base_url + "/health")[0] == 200
    finally:
        server.stop()
    log = (runs / "server-k2.log").read_text()
    assert "no vLLM here" not in log and "fake vllm serve m" in log
    assert sorted(p.name for p in runs.iterdir()) == ["server-k2.log"]


def test_a_spare_no_server_needed_is_stopped_with_its_folder_and_log(tmp_path, fake_vllm) -> None:
    runs = tmp_path / "runs"
    spare = SpareLauncher.launch(sys.executable, runs)
    assert spare.wait_ready(60.0) and spare.process is not None and spare.socket_folder is not None
    pid, folder = spare.process.pid, spare.socket_folder
    spare.stop()
    assert not _group_alive(pid) and not Path(folder).exists() and not list(runs.iterdir())
    assert not spare.wait_ready(1.0)  # a stopped spare is never handed a server
