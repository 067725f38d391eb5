"""``sdplan derive``'s GEMM ceiling: no GEMM is priced above reading its weights and then computing its rows
(``sdplan.derive.pricing.gemm_ceilings``, docs/model.md#compute-bound-knee)."""

from __future__ import annotations

from typing import Any

import pytest

from sdplan.derive.pricing import COMPUTE_BOUND_ROWS, StepBound, dense_gemm_shapes, gemm_ceilings

#: A GPU of 8 TB/s that reaches 80% of it, 3 us a memory-bound op (AIConfigurator's H100/H200/B200 corrections).
GPU = {"mem_bw": 8e12, "mem_bw_empirical_scaling_factor": 0.8, "mem_empirical_constant_latency": 3e-6}
#: A small dense decoder in AIConfigurator's parsed shapes.
SHAPES = {"hidden_size": 4096, "n": 32, "n_kv": 8, "d": 128, "inter_size": 14336, "layers": 32, "vocab": 128256}


def test_the_ceiling_is_reading_the_weights_then_computing_the_rows() -> None:
    # 80 layers of an 8192 x 8192 fp8 weight; the database times the op at 8192 rows at 0.2 s
    (ceiling,) = gemm_ceilings({"op": (80, 8192, 8192, 1.0)}, GPU, {"op": 0.2}).values()
    read = 80 * (8192 * 8192 / 6.4e12 + 3e-6)
    row = 80 * 2 * (8192 + 8192) / 6.4e12 + 0.2 / COMPUTE_BOUND_ROWS
    assert ceiling.stream_s == pytest.approx(read, rel=1e-12)
    assert ceiling.at(16) == pytest.approx(read + 16 * row, rel=1e-12)
    # where the database is bound by compute, the ceiling lies above it and never binds
    assert ceiling.at(COMPUTE_BOUND_ROWS) > 0.2
    # no bandwidth in the system file, or no compute-bound time for the op: no ceiling
    assert gemm_ceilings({"op": (80, 8192, 8192, 1.0)}, {}, {"op": 0.2}) == {}
    assert gemm_ceilings({"op": (80, 8192, 8192, 1.0)}, GPU, {}) == {}


def test_the_gemms_are_the_dense_decoders_per_gpu_weights() -> None:
    gemms = dense_gemm_shapes(SHAPES, 4, 1.0)
    # every weight of the model's matmuls, split four ways (the KV heads 8 / 4 = 2 a GPU), LM head in bf16
    per_layer = sum(n * k for layers, n, k, _ in gemms.values() if layers == 32)
    assert per_layer == (4096 * (32 + 2 * 8) * 128 + 32 * 128 * 4096 + 3 * 4096 * 14336) // 4
    assert gemms["generation_logits_gemm"] == (1, 128256 // 4, 4096, 2.0)
    # more GPUs than KV heads: each GPU keeps one KV head, as AIConfigurator splits them
    assert dense_gemm_shapes(SHAPES, 16, 1.0)["generation_qkv_gemm"][1] == 32 * 128 // 16 + 2 * 128


class Database:
    """A compiled engine whose GEMMs cost ``gemm_s(rows)`` seconds each, beside 1 ms of attention."""

    def __init__(self, gemm_s: Any) -> None:
        self.gemm_s = gemm_s

    def decode_step_per_op(self, rows: int, isl: int, osl: int) -> list[tuple[str, float, float, str]]:
        gemms = [(name, self.gemm_s(rows) * 1e3, 0.0, "silicon") for name in dense_gemm_shapes(SHAPES, 1, 2.0)]
        return [*gemms, ("generation_attention", 1.0, 0.0, "silicon")]

    def decode_step_latency(self, rows: int, isl: int, osl: int) -> float:
        return sum(latency_ms for _, latency_ms, *_ in self.decode_step_per_op(rows, isl, osl))


def test_a_step_keeps_the_database_below_its_ceiling_and_the_ceiling_above_it() -> None:
    # every GEMM at 0.5 s up to 5,000 rows (small batches far above reading its weights), then 100 us a row
    database = Database(lambda rows: max(0.5, 1e-4 * rows))
    bound = StepBound(database, SHAPES, 1, {"gemm_quant_mode": "bfloat16"}, GPU)
    assert len(bound.ceilings) == 5
    for rows in (1, 4, 64):
        ceilings = sum(ceiling.at(rows) for ceiling in bound.ceilings.values())
        assert ceilings < 5 * 0.5
        assert bound.decode(rows, 1024) == pytest.approx(ceilings + 1e-3, rel=1e-12)
        assert bound.excess(rows) == pytest.approx(5 * 0.5 - ceilings, rel=1e-12)
    # bound by compute, the database stands as priced
    assert bound.excess(COMPUTE_BOUND_ROWS) == 0.0
    assert bound.decode(COMPUTE_BOUND_ROWS, 1024) == pytest.approx(5 * 1e-4 * COMPUTE_BOUND_ROWS + 1e-3, rel=1e-12)
    # a mixture of experts has no ceilings: its step is the database's
    moe = StepBound(database, {**SHAPES, "num_experts": 128}, 1, {"gemm_quant_mode": "bfloat16"}, GPU)
    assert moe.ceilings == {} and moe.decode(4, 1024) == pytest.approx(5 * 0.5 + 1e-3, rel=1e-12)


def test_llama_70b_fp8_on_b200_is_held_to_its_weights_read_and_no_lower() -> None:
    """AIConfigurator's B200 vLLM database prices Llama-3.1-70B's fp8 GEMMs far above reading their weights at
    small batch: the ceiling binds there, no step falls below reading its weights at the datasheet bandwidth,
    and a compute-bound step is the database's own."""
    pytest.importorskip("aiconfigurator_core.sdk.engine", reason="aiconfigurator-core is not installed")
    from sdplan.derive import DeriveRequest, Models, Pricer, load_aic
    from sdplan.derive.pricing import gpu_spec

    request = DeriveRequest(target_model="meta-llama/Llama-3.1-70B-Instruct", system="b200_sxm", method="ngram",
                            tensor_parallel_size=4, precision="fp8")
    models = Models()
    try:
        pricer = Pricer(load_aic(), request, models)
        assert set(pricer.target_bound.ceilings) == set(dense_gemm_shapes(pricer.shapes, 4, 1.0))
        weights_read = sum(layers * n * k * size for layers, n, k, size in
                           dense_gemm_shapes(pricer.shapes, 4, 1.0).values()) / gpu_spec("b200_sxm")["mem_bw"]
        for batch in (1, 4, 16):
            held, priced = pricer.verify(batch, 1, 1536), pricer.decode(pricer.target, batch, 1536)
            assert weights_read < held < priced
        assert pricer.target_bound.excess(COMPUTE_BOUND_ROWS) == 0.0
    finally:
        models.close()
