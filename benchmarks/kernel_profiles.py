#!/usr/bin/env python3
"""AIConfigurator's GEMM timings against Vidur's measured ones, per layer, at 1-1,024 token rows.

Usage::

    pip install -e '.[derive]'
    python benchmarks/kernel_profiles.py            # table of measured over database time
    python benchmarks/kernel_profiles.py --specdecode-gemm-factor 1.26   # SpecDecode-Bench at those GEMMs

Every derived calibration's decode and verify steps are priced from AIConfigurator's op database. A verify
step of ``B`` sequences and ``k`` drafts runs its GEMMs on ``B (k + 1)`` rows (256 at batch 64 and k=3), so
whether the database's GEMMs are right at 160-512 rows decides how dear SD's cycle is under load. No GPU is
needed for this check: Vidur (``data/kernel-profiles/README.md``) published per-layer timings of the same
four GEMMs on H100s and A100s, measured with cuBLAS in 2024. For each of its models and tensor-parallel
degrees this script compiles a decoder of the same layer shapes in AIConfigurator (vLLM's database for the
GPU, bfloat16) and prints Vidur's time over the database's at each row count, then the median ratio in
three bands of rows. A ratio above 1 says the database prices those GEMMs cheaper than Vidur measured them.
The LM head is in neither (Vidur does not profile it here; the database's is left out).

``--specdecode-gemm-factor F`` asks the converse: which of the two kernel measurements do end-to-end SD runs
side with? It prices every H100 setup of SpecDecode-Bench (``sd_measured.py``, every one derived afresh, the
shipped files' included) with the database's GEMMs above :data:`ABOVE_ROWS` rows multiplied by ``F`` (1.26 is
the H100 median ratio at 160-512 rows this script prints), and prints ``sd_measured.py``'s scores of them. It
replaces :func:`sdplan.derive.pricing.decode_step` and ``Pricer.split`` in this process only.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "kernel-profiles"
#: Vidur's file stem -> (AIConfigurator system, decoder shapes: heads, KV heads, hidden size, MLP size).
CASES = {
    "h100_llama-2-7b": ("h100_sxm", (32, 32, 4096, 11008)),
    "h100_llama-2-70b": ("h100_sxm", (64, 8, 8192, 28672)),
    "h100_codellama-34b": ("h100_sxm", (64, 8, 8192, 22016)),
    "a100_llama-3-8b": ("a100_sxm", (32, 8, 4096, 14336)),
    "a100_llama-3-70b": ("a100_sxm", (64, 8, 8192, 28672)),
}
ROWS = (1, 16, 32, 64, 128, 160, 192, 256, 320, 384, 512, 768, 1024)
#: Row bands summarised: a decode step's (and a small batch's verify), a verify step's at batch 40-128 and k=3,
#: and a prefill chunk's.
BANDS = ((1, 128), (160, 512), (768, 1024))
#: Layers of the decoder compiled; the database's per-op times are summed over them and divided back.
LAYERS = 4
#: Vidur's four GEMM columns (data/kernel-profiles/README.md) and the database's ops for them.
VIDUR_OPS = ("qkv_ms", "o_proj_ms", "gate_up_ms", "down_ms")
DATABASE_OPS = ("generation_qkv_gemm", "generation_proj_gemm", "generation_gate_ffn1_gemm", "generation_ffn2_gemm")


def measured(stem: str) -> dict[tuple[int, int], float]:
    """(tensor parallel, rows) -> Vidur's four GEMMs of one layer, ms."""
    with (DATA / f"vidur_{stem}.csv").open(newline="") as handle:
        return {(int(row["tensor_parallel"]), int(row["token_rows"])): sum(float(row[op]) for op in VIDUR_OPS)
                for row in csv.DictReader(handle)}


def database(engine, system: str, shapes: tuple[int, int, int, int], tp: int, folder: Path):
    """The database's four GEMMs of one layer (ms) at ``rows``, for a decoder of ``shapes`` on ``tp`` GPUs."""
    heads, kv_heads, hidden, inter = shapes
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": hidden // heads, "num_hidden_layers": LAYERS, "vocab_size": 32000,
              "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    model = folder / f"{system}-{hidden}-{inter}-{heads}-{kv_heads}"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(config))
    handle = engine.EngineHandle.compile(str(model), system, "vllm", tp_size=tp, moe_tp_size=tp, moe_ep_size=1,
                                         gemm_quant_mode="bfloat16", moe_quant_mode="bfloat16")

    def at(rows: int) -> float:
        ops = {name: float(ms) for name, ms, *_ in handle.decode_step_per_op(rows, 254, 2)}
        return sum(ops[name] for name in DATABASE_OPS) / LAYERS

    return at


#: Token rows above which ``--specdecode-gemm-factor`` scales the database's GEMMs (where the two measurements
#: part: within 10% of each other up to 128 rows on H100s).
ABOVE_ROWS = 128


def specdecode_with_gemm_factor(factor: float) -> int:
    """``sd_measured.py`` on SpecDecode-Bench's H100 series with the GEMMs above :data:`ABOVE_ROWS` rows scaled."""
    import sdplan.derive.pricing as pricing

    def ops(handle, rows: int, context: int) -> list[tuple[str, float]]:
        scaled = []
        for name, ms, *_ in handle.decode_step_per_op(int(rows), max(int(context) - 2, 1), 2):
            gemm = "gemm" in name and "logits" not in name and int(rows) > ABOVE_ROWS
            scaled.append((name, float(ms) * (factor if gemm else 1.0) * pricing.MS))
        return scaled

    def decode_step(handle, rows: int, context: int) -> float:
        return sum(seconds for _, seconds in ops(handle, rows, context))

    def split(handle, rows: int, context: int) -> tuple[float, float]:
        parts = ops(handle, rows, context)
        attention = sum(seconds for name, seconds in parts if "attention" in name or "mla" in name)
        return attention, sum(seconds for _, seconds in parts) - attention

    pricing.decode_step = decode_step
    pricing.Pricer.decode = staticmethod(decode_step)
    pricing.Pricer.split = staticmethod(split)
    import sd_measured  # the sibling benchmark (this folder is first on the path when it runs)

    llama_8b = "meta-llama/Llama-3.1-8B-Instruct"
    eagle_8b = dict(target_model=llama_8b, system="h100_sxm", method="eagle3",
                    draft_model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    # the shipped files were priced at the database's GEMMs: derive their setups afresh
    sd_measured.SETUPS.update({
        "llama3.1-8b:eagle": eagle_8b, "llama3.1-8b:eagle3": eagle_8b,
        "llama3.1-8b:ngram": dict(target_model=llama_8b, system="h100_sxm", method="ngram"),
        "llama3-70b:eagle": dict(target_model=sd_measured.LLAMA_70B, system="h100_sxm", method="eagle3",
                                 draft_model="yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", tensor_parallel_size=4)})
    with tempfile.TemporaryDirectory() as folder:
        source = sd_measured.DATA / "specdecode_bench_2601.11580.json"
        (Path(folder) / source.name).write_text(source.read_text())
        sd_measured.DATA = Path(folder)
        sys.argv = [sys.argv[0]]
        return sd_measured.main()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specdecode-gemm-factor", type=float, metavar="F",
                        help="score SpecDecode-Bench's H100 series with the database's GEMMs above 128 rows x F")
    options = parser.parse_args(argv)
    try:
        from aiconfigurator_core.sdk import engine
    except ImportError:
        print("needs AIConfigurator: pip install -e '.[derive]'", file=sys.stderr)
        return 5
    if options.specdecode_gemm_factor is not None:
        return specdecode_with_gemm_factor(options.specdecode_gemm_factor)
    print("Vidur's measured GEMM time per layer over AIConfigurator's, at token rows " + " ".join(map(str, ROWS)))
    bands: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for stem, (system, shapes) in CASES.items():
            vidur = measured(stem)
            for tp in (1, 2, 4, 8):
                at = database(engine, system, shapes, tp, Path(folder))
                ratios = {rows: vidur[tp, rows] / at(rows) for rows in ROWS}
                print(f"  {stem:20s} TP{tp}  " + " ".join(f"{ratios[rows]:5.2f}" for rows in ROWS))
                for low, high in BANDS:
                    key = f"{stem[:4]} rows {low}-{high}"
                    bands.setdefault(key, []).extend(r for rows, r in ratios.items() if low <= rows <= high)
    print("median (range) of the ratio per GPU and band of rows:")
    for key, values in bands.items():
        print(f"  {key:22s} {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}), "
              f"{len(values)} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
