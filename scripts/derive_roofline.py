#!/usr/bin/env python3
"""Derive the shipped roofline calibrations from datasheets and model configs.

Usage::

    python scripts/derive_roofline.py            # rewrite calibrations/*_roofline.toml
    python scripts/derive_roofline.py --out DIR  # write elsewhere (the tests do this)
    python scripts/derive_roofline.py --retired --out DIR  # the pairs now shipped as *_derived.toml

Only pairs ``sdplan derive`` (AIConfigurator) cannot build ship as rooflines
(``SHIPPED``, each with why); the others are in ``RETIRED``, kept for
comparison with the derived files.

Nothing here is measured: the roofline (each step's memory and compute time
from datasheets and public model configs, and every assumption written into
the file's ``provenance.assumptions``) is :mod:`sdplan.derive.roofline`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sdplan.derive.roofline import (
    A100,
    DEEPSEEK_V3,
    EAGLE3_8B,
    EAGLE3_70B,
    H100,
    H200,
    L40S,
    LLAMA_1B,
    LLAMA_3_3_70B,
    LLAMA_8B,
    LLAMA_70B,
    NGRAM,
    QWEN3_0_6B,
    QWEN3_1_7B,
    QWEN3_8B,
    QWEN3_14B,
    QWEN3_30B_A3B,
    V3_MTP,
    calibration,
)
from sdplan.fileio import atomic_write_text, dumps_toml

REPO = Path(__file__).resolve().parent.parent

#: Pairs derived from AIConfigurator instead (scripts/derive_shipped.py, calibrations/*_derived.toml); the
#: script still writes them with --out, for comparison with the derived files.
RETIRED = [
    (H100, 1, LLAMA_8B, EAGLE3_8B),
    (H100, 4, LLAMA_3_3_70B, EAGLE3_70B),
    (H200, 8, DEEPSEEK_V3, V3_MTP),
    (H100, 1, LLAMA_8B, NGRAM),
    (H100, 1, LLAMA_8B, LLAMA_1B),
    (H100, 4, LLAMA_70B, LLAMA_8B),
    (H100, 1, QWEN3_14B, QWEN3_1_7B),
    (L40S, 1, QWEN3_8B, QWEN3_0_6B),
    (H100, 1, QWEN3_30B_A3B, QWEN3_0_6B),
]

#: (accelerator, GPUs per replica, target, draft) shipped as rooflines, with why sdplan derive cannot build them
SHIPPED = {
    (A100, 1, LLAMA_8B, LLAMA_1B): "Kept as a roofline: AIConfigurator 0.12.0's A100 vLLM 0.14.0 database has no "
    "decode attention for Llama-3.2-1B's head size 64, so 'sdplan derive' cannot build this pair.",
}


def _round(value: object) -> object:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {key: _round(item) for key, item in value.items()}
    return value

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "calibrations", help="output folder")
    parser.add_argument("--retired", action="store_true",
                        help="write the retired pairs instead (for comparison; never into calibrations/)")
    args = parser.parse_args(argv)
    if args.retired and args.out.resolve() == (REPO / "calibrations").resolve():
        parser.error("--retired needs --out elsewhere: those pairs ship as *_derived.toml")
    args.out.mkdir(parents=True, exist_ok=True)
    for gpu, tp, target, draft in (RETIRED if args.retired else list(SHIPPED)):
        name, document = calibration(gpu, tp, target, draft)
        why = SHIPPED.get((gpu, tp, target, draft))
        if why:
            document["provenance"]["notes"] = f"{why} {document['provenance']['notes']}"
        header = ("Derived, not measured: see provenance.assumptions.\n"
                  "Regenerate with: python scripts/derive_roofline.py")
        atomic_write_text(args.out / f"{name}.toml", dumps_toml(_round(document), header=header))
        print(args.out / f"{name}.toml")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
