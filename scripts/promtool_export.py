#!/usr/bin/env python3
"""Put recorded scrapes into a real Prometheus and export them as ``promtool query range -o json`` prints them.

Usage::

    python scripts/promtool_export.py tests/data/prometheus-cpu/{nosd,sd}.scrapes.xz \\
        -o tests/data/prometheus-cpu/both.promtool.json.gz

Needs Debian's ``prometheus`` package (``prometheus`` and ``promtool`` on the PATH). The scrapes (``sdplan
scrape`` files of a real vLLM ``/metrics``) are written as one OpenMetrics exposition with every sample stamped
at its scrape's time and the labels a Prometheus scrape adds (``instance``: the header URL's ``host:port``;
``job="vllm"``); ``promtool tsdb create-blocks-from openmetrics`` backfills them into a fresh TSDB; a
``prometheus`` serves it on a loopback port (no scrape targets) and ``promtool query range -o json`` exports
the raw vLLM series (buckets and ``_created`` left out) at a 1 s step over the recordings' span. The server is
stopped however the script ends. Every value is a recorded one; nothing comes from sdplan's model.
"""

from __future__ import annotations

import argparse
import gzip
import lzma
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sdplan.metrics.scrape import END_MARK, SCRAPE_MARK
from sdplan.metrics.textfile import header_instance

QUERY = '{__name__=~"vllm:.+",__name__!~".+_(bucket|created)"}'


def openmetrics(paths: list[Path]) -> tuple[str, float, float]:
    """The scrapes as one stamped OpenMetrics exposition, and the first and last scrape times."""
    families: dict[str, tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]]]] = {}
    times: list[float] = []
    for path in paths:
        text = lzma.open(path, "rt").read() if path.suffix == ".xz" else path.read_text()
        for part in text.split(f"{SCRAPE_MARK} time=")[1:]:
            header, _, body = part.partition("\n")
            when = float(header.split()[0])
            times.append(when)
            target = {"instance": header_instance(f"{SCRAPE_MARK} time={header}") or "", "job": "vllm"}
            for family in text_string_to_metric_families(body.rsplit(END_MARK, 1)[0]):
                if not family.name.startswith("vllm:"):
                    continue
                kind = family.type if family.type in ("counter", "gauge", "histogram") else "unknown"
                series = families.setdefault(family.name, (kind, defaultdict(list)))[1]
                for sample in family.samples:
                    if not sample.name.endswith("_created") and math.isfinite(sample.value):
                        labels = tuple(sorted({**sample.labels, **target}.items()))
                        series[(sample.name, labels)].append((when, sample.value))

    def quoted(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    lines = []
    for name, (kind, series) in families.items():
        lines.append(f"# TYPE {name} {kind}\n")
        for (sample, labels), points in series.items():
            text = ",".join(f'{key}="{quoted(value)}"' for key, value in labels)
            lines += [f"{sample}{{{text}}} {value!r} {when:.3f}\n" for when, value in sorted(points)]
    lines.append("# EOF\n")
    return "".join(lines), min(times), max(times)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scrapes", nargs="+", type=Path, help="sdplan scrape files (.xz or plain)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the export (.gz: gzip'd)")
    args = parser.parse_args(argv)
    exposition, first, last = openmetrics(args.scrapes)
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        (folder / "input.om").write_text(exposition)
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(folder / "input.om"),
                        str(folder / "data")], check=True)
        (folder / "prometheus.yml").write_text("global:\n  scrape_interval: 1s\nscrape_configs: []\n")
        port = free_port()
        server = subprocess.Popen(["prometheus", f"--config.file={folder / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={folder / 'data'}", "--storage.tsdb.retention.time=100y",
                                   f"--web.listen-address=127.0.0.1:{port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(120):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1) as answer:
                        if answer.status == 200:
                            break
                except OSError:
                    time.sleep(0.5)
            else:
                sys.exit("prometheus did not become ready")
            export = subprocess.run(["promtool", "query", "range", "-o", "json", f"--start={math.floor(first)}",
                                     f"--end={math.ceil(last)}", "--step=1s", f"http://127.0.0.1:{port}", QUERY],
                                    check=True, capture_output=True).stdout
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    data = gzip.compress(export, mtime=0) if args.output.suffix == ".gz" else export
    temporary = args.output.with_name(args.output.name + f".{os.getpid()}.tmp")
    temporary.write_bytes(data)
    temporary.replace(args.output)
    print(f"wrote {args.output}: {len(export)} bytes of promtool query range -o json over {last - first:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
