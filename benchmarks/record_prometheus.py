"""Record real vLLM metrics for ``tests/data/prometheus-cpu``: scrapes, a Prometheus export, bench files.

For each option (no SD; SD with the successor draft at k=3) one ``vllm serve`` of the tiny successor target
(``tests/tiny_models.served_pair``) runs Poisson load from ``vllm bench serve`` at several rates, one after
the other with idle gaps, while

* ``sdplan scrape`` records its ``/metrics`` into ``<option>.scrapes`` (every ``--every`` s), and
* a real Prometheus, listening and scraping on 127.0.0.1 only, stores the same series; at the end its HTTP API
  ``/api/v1/query_range`` is exported into ``<option>.query_range.json``;

and the bench result files of the same runs are kept (``<option>-r<rate>.json``). Never metrics generated
from the model: every number comes from the running server.

Run with the Python of vLLM's environment, with sdplan installed in it::

    /work/vllm-venv/bin/python benchmarks/record_prometheus.py --out /tmp/prom-record

Every process started (servers, Prometheus, the scraper, vLLM's client) is stopped, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from sdplan.measure.client import BenchClient, LoadPoint, bench_arguments
from sdplan.measure.server import ServedEngine, free_port, http_get
from sdplan.testing.tiny_models import served_pair

#: The non-bucket vLLM series the export holds (buckets are not needed for means, and would triple it).
EXPORT_QUERY = '{__name__=~"vllm:.+",__name__!~".+_(bucket|created)"}'


def prometheus_config(folder: Path, target_port: int, interval_s: float) -> Path:
    config = folder / "prometheus.yml"
    config.write_text(f"""global:
  scrape_interval: {round(interval_s * 1000)}ms
  scrape_timeout: {round(max(interval_s * 0.8, 0.5) * 1000)}ms
scrape_configs:
  - job_name: vllm
    static_configs:
      - targets: ["127.0.0.1:{target_port}"]
""")
    return config


def start_prometheus(folder: Path, target_port: int, interval_s: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = prometheus_config(folder, target_port, interval_s)
    log = (folder / "prometheus.log").open("ab")
    process = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={folder / 'tsdb'}",
                                f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1d"],
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        if http_get(base + "/-/ready", timeout_s=1.0)[0] == 200:
            return process, base
        if process.poll() is not None:
            break
        time.sleep(0.5)
    stop_group(process)
    raise RuntimeError(f"prometheus did not start; see {folder / 'prometheus.log'}")


def stop_group(process: subprocess.Popen[bytes] | None, first: int = signal.SIGTERM) -> None:
    if process is None or process.poll() is not None:
        return
    for sig, wait_s in ((first, 20.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def cpu_list(cpus: set[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))


@contextlib.contextmanager
def affinity(cpus: set[int] | None) -> Iterator[None]:
    """Run the block on ``cpus`` (None: as it is); a process started inside inherits them, and its children."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def export_query_range(base: str, start_s: float, end_s: float, step_s: float) -> dict[str, object]:
    query = urllib.parse.urlencode({"query": EXPORT_QUERY, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}",
                                    "step": f"{step_s:g}"})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{query}", timeout=60) as response:  # noqa: S310
        return dict(json.loads(response.read()))


def record_option(name: str, spec: list[str], pair: dict[str, Path], out: Path, work: Path,
                  args: argparse.Namespace, client: BenchClient) -> dict[str, object]:
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    serve_flags = ["--dtype", "float32", "--max-num-seqs", "64", "--no-enable-prefix-caching", *spec]
    # A server on CPUs of its own binds vLLM's OpenMP threads there too (its default binds them itself).
    environment = {"VLLM_CPU_OMP_THREADS_BIND": cpu_list(args.server_cpus)} if args.server_cpus else {}
    server = ServedEngine(model=str(pair["target"]), arguments=serve_flags, log_path=folder / "server.log",
                          environment=environment)
    prometheus = scraper = None
    runs = []
    try:
        with affinity(args.server_cpus):
            server.start()
        prometheus, prom_base = start_prometheus(folder, server.port, args.prometheus_every)
        # warm-up (compilation, first requests) before the recording, as a deployment would be past it
        client.run(bench_arguments(LoadPoint(args.prompt_tokens, args.output_tokens, 24, concurrency=4),
                                   base_url=server.base_url, model=str(pair["target"]),
                                   result=folder / "warmup.json", seed=99, temperature=0.0), 900)
        scrapes = out / f"{name}.scrapes"
        scrapes.unlink(missing_ok=True)
        scraper = subprocess.Popen([sys.executable, "-m", "sdplan", "scrape", server.base_url, "--every",
                                    f"{args.every:g}s", "-o", str(scrapes)],
                                   stdout=subprocess.DEVNULL, stderr=(folder / "scrape.log").open("ab"),
                                   start_new_session=True)
        start_s = time.time()
        time.sleep(args.gap_s)
        for index, rate in enumerate(args.rates):
            result = out / f"{name}-r{rate:g}.json"
            requests = max(8, round(rate * args.seconds))
            begin = time.time()
            client.run(bench_arguments(LoadPoint(args.prompt_tokens, args.output_tokens, requests, rate_rps=rate),
                                       base_url=server.base_url, model=str(pair["target"]), result=result,
                                       seed=index + 1, temperature=0.0), 1800)
            runs.append({"rate_rps": rate, "requests": requests, "file": result.name, "began_unix_s": begin,
                         "ended_unix_s": time.time()})
            print(f"{name}: {rate:g} req/s, {requests} requests, {time.time() - begin:.1f} s", flush=True)
            time.sleep(args.gap_s)
        end_s = time.time()
        stop_group(scraper, signal.SIGINT)
        scraper = None
        time.sleep(2 * args.prometheus_every)
        export = export_query_range(prom_base, start_s - 2, end_s + 1, args.prometheus_every)
        (out / f"{name}.query_range.json").write_text(json.dumps(export, separators=(",", ":")) + "\n")
        return {"option": name, "serve": ["vllm", "serve", "<target>", *serve_flags], "started_unix_s": start_s,
                "ended_unix_s": end_s, "runs": runs, "prometheus_query": EXPORT_QUERY,
                "prometheus_step_s": args.prometheus_every, "scrape_every_s": args.every}
    finally:
        stop_group(scraper, signal.SIGINT)
        stop_group(prometheus)
        server.stop()
        shutil.rmtree(folder / "tsdb", ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rates", type=lambda text: [float(v) for v in text.split(",")], default=[2, 4, 7, 10])
    parser.add_argument("--seconds", type=float, default=35.0, help="Requests per run = rate x seconds.")
    parser.add_argument("--gap-s", type=float, default=6.0, help="Idle time between runs.")
    parser.add_argument("--every", type=float, default=1.0, help="sdplan scrape interval (s).")
    parser.add_argument("--prometheus-every", type=float, default=1.0, help="Prometheus scrape interval (s).")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--options", default="nosd,sd")
    cpus = lambda text: {int(v) for v in text.split(",")}  # noqa: E731
    parser.add_argument("--server-cpus", type=cpus, help="CPUs of the server (vllm serve and its engine).")
    parser.add_argument("--client-cpus", type=cpus,
                        help="CPUs of everything else: vLLM's client, the scraper, Prometheus, this script.")
    args = parser.parse_args()
    if args.client_cpus:
        # set first, so that every process started below inherits it; the server is moved off it when started
        os.sched_setaffinity(0, args.client_cpus)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sdplan-prom-"))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(work / "vllm-cache"))
    pair = served_pair(work / "models", hidden=256, target_layers=6, skip_every=3)
    from importlib.metadata import version

    provenance: dict[str, object] = {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "vllm_cpu": version("vllm-cpu"),
        "prometheus": subprocess.run(["prometheus", "--version"], capture_output=True, text=True).stdout.split("\n")[0],
        "prometheus_client": version("prometheus_client"),
        "workload": {"prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
                     "dataset": "random, range ratio as sdplan.measure.client.LENGTH_SPREAD, --ignore-eos"},
        "models": "tests/tiny_models.served_pair(hidden=256, target_layers=6, skip_every=3)",
        "command": " ".join(sys.argv), "options": [],
        "server_cpus": cpu_list(args.server_cpus) if args.server_cpus else "any",
        "client_cpus": cpu_list(args.client_cpus) if args.client_cpus else "any"}
    options = {"nosd": [], "sd": ["--speculative-config", json.dumps(
        {"method": "draft_model", "model": str(pair["draft"]), "num_speculative_tokens": args.k})]}
    try:
        with BenchClient(log_path=work / "bench.log") as client:
            for name in args.options.split(","):
                provenance["options"].append(record_option(name, options[name], pair, args.out, work, args,  # type: ignore[union-attr]
                                                           client))
                (args.out / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
    finally:
        print(f"work folder (logs): {work}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
