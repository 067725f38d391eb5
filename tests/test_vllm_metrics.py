"""``sdplan scrape`` on a real vLLM server, then ``fit``'s reader on what it recorded (real engine: ``-m vllm``).

Needs vLLM's CPU build and torch (see .ci/run); about 1-2 minutes on a 2-core CPU.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sdplan.testing.tiny_models import served_pair

pytestmark = [pytest.mark.vllm, pytest.mark.filterwarnings("default")]


def test_scrapes_of_a_real_server_read_as_windows_with_vllms_acceptance(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from sdplan.measure.client import BenchClient, LoadPoint, bench_arguments
    from sdplan.measure.server import ServedEngine
    from sdplan.runs import read_results

    pair = served_pair(tmp_path / "models", hidden=128, target_layers=2, skip_every=3)
    for name, value in (("VLLM_CPU_KVCACHE_SPACE", "1"), ("HF_HUB_OFFLINE", "1"),
                        ("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))):
        monkeypatch.setenv(name, os.environ.get(name, value))
    spec = json.dumps({"method": "draft_model", "model": str(pair["draft"]), "num_speculative_tokens": 2})
    server = ServedEngine(model=str(pair["target"]), log_path=tmp_path / "server.log",
                          arguments=["--dtype", "float32", "--max-num-seqs", "8", "--max-model-len", "256",
                                     "--enforce-eager", "--speculative-config", spec])
    out = tmp_path / "live.scrapes"
    scraper = None
    try:
        server.start()
        # Ctrl-C as a terminal delivers it, also where this test runs in a script's background job (which
        # starts with SIGINT ignored, and so would its children)
        scraper = subprocess.Popen([sys.executable, "-m", "sdplan", "scrape", server.base_url, "--every", "1s",
                                    "-o", str(out)], start_new_session=True,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(3)
        with BenchClient(log_path=tmp_path / "bench.log") as client:
            client.run(bench_arguments(LoadPoint(48, 24, 40, rate_rps=4.0), base_url=server.base_url,
                                       model=str(pair["target"]), result=tmp_path / "r4.json", seed=1,
                                       temperature=0.0), 600)
        time.sleep(7)
    finally:
        if scraper is not None:
            os.killpg(scraper.pid, signal.SIGINT)
            scraper.wait(timeout=30)
        server.stop()
    assert scraper.returncode == 0
    runs, _ = read_results(out)
    (bench,), _ = read_results(tmp_path / "r4.json")
    (window,) = runs
    assert window.completed == bench.completed == 40
    assert window.draft_length == bench.draft_length == 2
    assert window.position_rates == bench.position_rates
    assert window.prompt_tokens == pytest.approx(bench.prompt_tokens)
    assert window.mean_e2e_latency_s < bench.mean_e2e_latency_s  # the server's clock starts later
