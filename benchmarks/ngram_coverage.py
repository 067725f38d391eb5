#!/usr/bin/env python3
"""Draft coverage of vLLM's n-gram proposer, and EAGLE-3's acceptance, from SpecDecode-Bench's acceptance traces.

Usage (standard library only; the traces are not vendored, 9 MB)::

    git clone https://github.com/SpecDecode-Bench/simulator        # commit 2fdccbd6 was read
    python benchmarks/ngram_coverage.py simulator/data/llama3.1-8B
    python benchmarks/ngram_coverage.py simulator/data/llama3.1-8B \
        --summary benchmarks/data/sd-measured/specdecode_bench_llama3.1-8b_traces.csv

``--summary`` writes what ``benchmarks/sd_measured.py`` prices each request of the traces with (one row a
request: its lengths and its cycles at k = 3 and 5, ``SUMMARY_COLUMNS``), 60 kB in place of the 9 MB.

vLLM's n-gram proposer drafts for a sequence only where its last n tokens recur in its context; for a
sequence without a match it proposes nothing, and that sequence verifies one token row instead of
``k + 1``. The share of cycles that carry a draft, the draft coverage ``c``, so sets how many token rows
an n-gram cycle puts into the target's step (``1 + c k`` per sequence, :func:`sdplan.latency.model.verified_rows`).

SpecDecode-Bench (Liu et al., arXiv 2601.11580) recorded, for Llama-3.1-8B-Instruct's greedy outputs on
GSM8K, CNN/DailyMail, ShareGPT and InstructCoder, the n-gram acceptance length at every output position
(``combined_<dataset>.jsonl``, ``acc_ngram.acc_len``: 1 + the drafted tokens the target accepts there).
Its simulator (``simulator.py``: ``get_input_len``, ``_not_matched_ngram``,
``NGRAM_MATCHING_PROBABILITY``) prices a cycle as follows, and so does this script:

* at a position whose acceptance length is over 1 the proposer drafted (a token was accepted): ``k``
  tokens drafted, ``min(acc_len, k + 1)`` committed;
* at a position whose acceptance length is 1 it drafted with the dataset's matching probability ``m``
  (the authors' figure: ShareGPT 0.2, CNN/DailyMail 0.4, GSM8K 0.2, InstructCoder 0.8), and one token
  is committed.

Walking each trace cycle by cycle gives ``c`` (cycles with a draft over all cycles) and ``E`` (tokens per
cycle, cycles without a draft included). ``c`` with ``m = 0`` is the least the traces allow (only the
drafts that were accepted), with ``m = 1`` the most. The values are printed for ``k = 3`` and ``k = 5``,
the draft lengths SpecDecode-Bench ran, and ``k = 4``, the vLLM blog's (2024-10-17);
``benchmarks/sd_measured.py`` carries them as ``NGRAM_DRAFT_COVERAGE``.

The same files hold the EAGLE-3 head's acceptance length at every position (``acc_eagle.acc_len``, which the
simulator reads for its ``eagle3`` proposer: ``main.py`` maps ``"eagle3"`` to ``AccLenGroundTruth.EAGLE``). An
EAGLE-3 chain of ``k`` drafts every cycle and commits ``min(acc_len, k + 1)`` tokens, so the walk above with
``m = 1`` gives its tokens per cycle: over all tokens and cycles of a file (what a run that times the prompts
one after another and divides their tokens by their time sees), and the mean of each request's own.
``benchmarks/sd_measured.py`` carries the first as ``EAGLE3_TRACE_TOKENS_PER_CYCLE``: the source's own
acceptance for its Llama-3.1-8B EAGLE-3 series.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

#: simulator.py's NGRAM_MATCHING_PROBABILITY (SpecDecode-Bench/simulator@2fdccbd6), keyed by trace file.
MATCHING_PROBABILITY = {"gsm8k": 0.2, "cnn": 0.4, "sharegpt": 0.2, "instructcoder": 0.8}
#: The trace files' dataset names as sd_measured.py spells them.
DATASETS = {"gsm8k": "gsm8k", "cnn": "cnn_dailymail", "sharegpt": "sharegpt", "instructcoder": "instructcoder"}


def walk(acceptance_lengths: list[int], k: int, matching: float) -> tuple[float, float, int]:
    """Expected cycles with a draft, and tokens committed, over one trace: ``(drafted cycles, tokens, cycles)``.

    The tokens are the trace's length: the last cycle commits only what is left of the output (the run stopped
    there), whatever its acceptance length."""
    drafted = 0.0
    tokens = cycles = position = 0
    while position < len(acceptance_lengths):
        length = acceptance_lengths[position]
        cycles += 1
        if length > 1:
            drafted += 1.0
            step = min(length, k + 1)
        else:
            drafted += matching
            step = 1
        tokens += step
        position += step
    return drafted, float(min(tokens, len(acceptance_lengths))), cycles


def coverage(path: Path, k: int, matching: float) -> tuple[float, float]:
    """``(c, E)`` over every request of one trace file."""
    drafted = tokens = 0.0
    cycles = 0
    for line in path.read_text().splitlines():
        d, t, n = walk(json.loads(line)["acc_ngram"]["acc_len"], k, matching)
        drafted, tokens, cycles = drafted + d, tokens + t, cycles + n
    return drafted / cycles, tokens / cycles


#: The per-request summary's columns: the prompt; the plain output (``generated_token_ids``, which the n-gram
#: trace follows token for token); the EAGLE-3 run's own output (its trace's length: its greedy output drifts
#: from the plain one in about half the requests); and per draft length the cycles each proposer takes over its
#: output, the n-gram ones also as those that certainly drafted (acceptance length over 1).
SUMMARY_COLUMNS = ("dataset", "request_id", "prompt_tokens", "output_tokens", "eagle3_output_tokens",
                   "eagle3_cycles_k3", "eagle3_cycles_k5", "ngram_cycles_k3", "ngram_matched_cycles_k3",
                   "ngram_cycles_k5", "ngram_matched_cycles_k5")


def request_summary(path: Path, dataset: str) -> list[dict[str, object]]:
    """One :data:`SUMMARY_COLUMNS` row per request of a trace file."""
    rows: list[dict[str, object]] = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        eagle, ngram = record["acc_eagle"]["acc_len"], record["acc_ngram"]["acc_len"]
        row: dict[str, object] = {"dataset": dataset, "request_id": record["id"],
                                  "prompt_tokens": len(record["prompt_token_ids"]),
                                  "output_tokens": len(record["generated_token_ids"]),
                                  "eagle3_output_tokens": len(eagle)}
        for k in (3, 5):
            row[f"eagle3_cycles_k{k}"] = walk(eagle, k, 1.0)[2]
            matched, _, cycles = walk(ngram, k, 0.0)
            row[f"ngram_cycles_k{k}"], row[f"ngram_matched_cycles_k{k}"] = cycles, int(matched)
        rows.append(row)
    return rows


def eagle3_acceptance(path: Path, k: int) -> tuple[float, float]:
    """EAGLE-3's tokens per cycle over one trace file: ``(all tokens / all cycles, mean of the requests' own)``."""
    tokens = 0.0
    cycles = 0
    own = []
    for line in path.read_text().splitlines():
        _, t, n = walk(json.loads(line)["acc_eagle"]["acc_len"], k, 1.0)
        tokens, cycles = tokens + t, cycles + n
        own.append(t / n)
    return tokens / cycles, sum(own) / len(own)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", type=Path, help="SpecDecode-Bench/simulator's data/llama3.1-8B folder")
    parser.add_argument("--summary", type=Path, metavar="CSV", help="also write the per-request summary there")
    options = parser.parse_args()
    if options.summary:
        with options.summary.open("w", newline="", encoding="utf-8") as out:
            writer = csv.DictWriter(out, SUMMARY_COLUMNS, lineterminator="\n")
            writer.writeheader()
            for name in MATCHING_PROBABILITY:
                writer.writerows(request_summary(options.traces / f"combined_{name}.jsonl", DATASETS[name]))
    print("dataset        k  coverage c  (m=0 .. m=1)   E incl. undrafted cycles")
    for name, matching in MATCHING_PROBABILITY.items():
        path = options.traces / f"combined_{name}.jsonl"
        for k in (3, 4, 5):
            c, tokens = coverage(path, k, matching)
            low, _ = coverage(path, k, 0.0)
            high, _ = coverage(path, k, 1.0)
            print(f"{DATASETS[name]:14s} {k}  {c:.3f}       ({low:.3f} .. {high:.3f})   {tokens:.3f}")
    print("\nEAGLE-3 (acc_eagle)  k  E, all tokens / all cycles  E, mean of the requests' own")
    for name in MATCHING_PROBABILITY:
        for k in (3, 5):
            pooled, own = eagle3_acceptance(options.traces / f"combined_{name}.jsonl", k)
            print(f"{DATASETS[name]:20s} {k}  {pooled:.3f}                      {own:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
