#!/usr/bin/env python3
"""Regenerate the shipped ``calibrations/*_derived.toml`` with ``sdplan derive`` (AIConfigurator).

Usage::

    pip install -e '.[derive]'                  # aiconfigurator-core==0.12.0
    python scripts/derive_shipped.py            # rewrite calibrations/*_derived.toml
    python scripts/derive_shipped.py --out DIR  # write elsewhere
    python scripts/derive_shipped.py --only h100-sxm_llama-3.1-8b_ngram_derived --out DIR

Every file is priced by :func:`sdplan.derive.derive` with the date fixed
below, so a rerun with the same ``aiconfigurator-core`` writes the same bytes
(tests/test_derive.py checks every file). The pairs are those of the shipped set; each
retired roofline file's pair is among them. Not built: Llama-3.1-8B with
Llama-3.2-1B on A100 SXM (``scripts/derive_roofline.py`` keeps it):
AIConfigurator 0.12.0's A100 vLLM 0.14.0 database has no decode attention
for Llama-3.2-1B's head size 64.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

from sdplan.derive import AIC_VERSION, DeriveRequest, aic_version, derive, file_stem
from sdplan.fileio import atomic_write_text, dumps_toml

REPO = Path(__file__).resolve().parent.parent

#: Fixed so that re-running the script reproduces the shipped files byte for byte.
DERIVED_ON = datetime.date(2026, 11, 25)
HEADER = ("Derived with 'sdplan derive' from NVIDIA AIConfigurator's op database: see [derivation] and "
          "provenance.assumptions.\nRegenerate with: python scripts/derive_shipped.py")

LLAMA_8B, LLAMA_1B = "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"
LLAMA_70B, LLAMA_3_3_70B = "meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.3-70B-Instruct"
EAGLE3_8B, EAGLE3_70B = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"
QWEN3_32B, EAGLE3_QWEN3_32B = "Qwen/Qwen3-32B", "AngelSlim/Qwen3-32B_eagle3"

#: (system, TP, target, method, draft, precision)
PAIRS = [
    ("h100_sxm", 1, LLAMA_8B, "draft_model", LLAMA_1B, "bf16"),
    ("h100_sxm", 1, LLAMA_8B, "eagle3", EAGLE3_8B, "bf16"),
    ("h100_sxm", 1, LLAMA_8B, "ngram", None, "bf16"),
    *[(system, tp, LLAMA_70B, method, draft, precision)
      for system, tp in (("h100_sxm", 4), ("h200_sxm", 2))
      for method, draft in (("eagle3", EAGLE3_70B), ("draft_model", LLAMA_8B))
      for precision in ("fp8", "bf16")],
    ("h100_sxm", 4, LLAMA_3_3_70B, "eagle3", EAGLE3_70B, "bf16"),
    *[("h100_sxm", tp, QWEN3_32B, "eagle3", EAGLE3_QWEN3_32B, "bf16") for tp in (2, 4, 8)],
    ("h200_sxm", 2, QWEN3_32B, "eagle3", EAGLE3_QWEN3_32B, "bf16"),
    ("h100_sxm", 1, "Qwen/Qwen3-30B-A3B", "draft_model", "Qwen/Qwen3-0.6B", "bf16"),
    ("h200_sxm", 8, "deepseek-ai/DeepSeek-V3", "mtp", None, "fp8_block"),
    ("b200_sxm", 1, LLAMA_8B, "eagle3", EAGLE3_8B, "bf16"),
    ("b200_sxm", 2, LLAMA_70B, "draft_model", LLAMA_8B, "fp8"),
    ("h100_sxm", 1, "Qwen/Qwen3-14B", "draft_model", "Qwen/Qwen3-1.7B", "bf16"),
    ("l40s", 1, "Qwen/Qwen3-8B", "draft_model", "Qwen/Qwen3-0.6B", "bf16"),
]


def requests() -> list[DeriveRequest]:
    """The shipped set, one request per file."""
    return [DeriveRequest(target_model=target, system=system, method=method, draft_model=draft,
                          tensor_parallel_size=tp, precision=precision, date=DERIVED_ON)
            for system, tp, target, method, draft, precision in PAIRS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "calibrations", help="output folder")
    parser.add_argument("--only", action="append", metavar="NAME", help="derive only this file stem (repeatable)")
    args = parser.parse_args(argv)
    if aic_version() != AIC_VERSION:
        print(f"warning: aiconfigurator-core {aic_version()} installed; the shipped files were built with "
              f"{AIC_VERSION}", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = [request for request in requests() if not args.only or file_stem(request) in args.only]
    if args.only and len(chosen) != len(set(args.only)):
        parser.error(f"--only: unknown names; known: {', '.join(file_stem(r) for r in requests())}")
    for request in chosen:
        result = derive(request)
        path = args.out / f"{result.document['name']}.toml"
        atomic_write_text(path, dumps_toml(result.document, header=HEADER))
        print(path, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
