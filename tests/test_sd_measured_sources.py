"""The published SD measurements in ``benchmarks/data/sd-measured/`` against what their sources' text says.

Each value there was read from a table or figure; where the source's text states a figure of its own, the
reading must reproduce it, so a mistyped value fails here rather than in the benchmark's scores.
"""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "sd-measured"


def _speedups(doc: dict, series_id: str) -> dict[int, float]:
    series = next(s for s in doc["series"] if s["id"] == series_id)
    return {p["batch"]: p["speedup"] for p in series["points"]}


def test_eagle3_paper_table3_reproduces_the_statements_of_its_text() -> None:
    doc = json.loads((DATA / "eagle3_2503.01840_sglang.json").read_text())
    assert doc["id"] == "eagle3_2503.01840_sglang" and doc["measured"] is True
    eagle = _speedups(doc, "table3_llama3.1-8b_mt_bench_eagle")
    eagle3 = _speedups(doc, "table3_llama3.1-8b_mt_bench_eagle3")
    batches = [2, 4, 8, 16, 24, 32, 48, 56, 64]
    assert list(eagle) == batches and list(eagle3) == batches
    # abstract and section 4.3: "EAGLE-3 achieves a 1.38x throughput improvement at a batch size of 64"
    assert eagle3[64] == 1.38
    # section 4.3: "EAGLE reduces throughput at batch size of 24" (the first batch where it is below 1)
    assert min(b for b, s in eagle.items() if s < 1.0) == 24
    # EAGLE-3 stays above SGLang without SD at every batch; its gain shrinks from the smallest to the largest
    assert min(eagle3.values()) > 1.0 and eagle3[64] < eagle3[2]
    for series in doc["series"]:
        assert series["engine"]["name"] == "sglang" and series["draft"]["k_tokens"] == 3
        assert series["draft"]["structure"] == "chain" and series["mode"] == "closed_loop_batch"


def test_speculators_sweep_reproduces_the_tables_printed_beside_its_csvs() -> None:
    doc = json.loads((DATA / "speculators_qwen3.8-27b_b200_mtp.json").read_text())
    assert doc["id"] == "speculators_qwen3.8-27b_b200_mtp" and doc["measured"] is True
    series = {s["id"]: s["points"] for s in doc["series"]}
    humaneval, math = series["mtp_qwen3.8-27b_humaneval"], series["mtp_qwen3.8-27b_math_reasoning"]
    streams = [1, 2, 4, 8, 16, 32, 64, 128]
    assert [p["concurrency"] for p in humaneval] == streams and [p["concurrency"] for p in math] == streams
    # README tables: "no speculator: tok/s" 92 ... 5,359 (HumanEval) and 91 ... 4,977 (math_reasoning)
    assert [round(p["baseline_tokens_per_s"]) for p in humaneval] == [92, 177, 346, 671, 1250, 2238, 3666, 5359]
    assert [round(p["baseline_tokens_per_s"]) for p in math] == [91, 175, 341, 654, 1196, 2102, 3436, 4977]
    # mtp_*_validate.txt: tok/s and accept columns of the MTP runs
    assert [round(p["sd_tokens_per_s"]) for p in humaneval] == [179, 361, 687, 1273, 2249, 3707, 5174, 6129]
    assert [round(p["sd_tokens_per_s"]) for p in math] == [197, 385, 725, 1302, 2251, 3671, 5093, 6078]
    assert [round(p["acceptance_tokens_per_cycle"], 2) for p in humaneval] == [2.25, 2.27, 2.28, 2.29, 2.26, 2.27,
                                                                             2.28, 2.27]
    assert [round(p["acceptance_tokens_per_cycle"], 2) for p in math] == [2.51, 2.51, 2.53, 2.52, 2.53, 2.53, 2.53,
                                                                        2.54]
    for points in (humaneval, math):
        ratios = [p["sd_tokens_per_s"] / p["baseline_tokens_per_s"] for p in points]
        assert min(ratios) > 1.0 and ratios[-1] < 0.6 * ratios[0]


def test_inferencex_glm5_sweep_reproduces_the_cost_column_printed_beside_it() -> None:
    """The post's $/M tokens is B200's $1.95 a GPU-hour over each row's tok/s/GPU: a mistyped throughput breaks it."""
    doc = json.loads((DATA / "inferencex_glm5_b200_sglang_mtp.json").read_text())
    assert doc["id"] == "inferencex_glm5_b200_sglang_mtp" and doc["measured"] is True
    (series,) = doc["series"]
    points = series["points"]
    assert [p["concurrency"] for p in points] == [4, 8, 16, 32, 64, 128, 256]

    def cost(tokens_per_s_per_gpu: float) -> float:
        return 1.95 / (3600 * tokens_per_s_per_gpu / 1e6)

    # the two tables' $/M tokens columns, MTP and non-MTP, printed to the cent (one prints 0.34 for 0.3345)
    printed = {"sd_tokens_per_s": [1.30, 0.83, 0.57, 0.42, 0.34, 0.28, 0.28],
               "baseline_tokens_per_s": [2.34, 1.42, 0.88, 0.58, 0.42, 0.32, 0.31]}
    for field, column in printed.items():
        assert all(abs(cost(p[field]) - value) <= 0.006 for p, value in zip(points, column, strict=True)), field
    assert series["draft"]["k_tokens"] == 3 and series["draft"]["structure"] == "chain"
    assert series["hardware"] == {"gpu": "NVIDIA B200", "count": 8, "tensor_parallel": 8}
    # ISL 8192 and OSL 1024 drawn uniformly from [0.8 L, L]: means 0.9 L
    assert series["workload"]["prompt_tokens_mean"] == 0.9 * 8192
    assert series["workload"]["output_tokens_mean"] == 0.9 * 1024


def test_every_shipped_source_says_where_it_was_read() -> None:
    """A team's own file may have no URL or repository; the published ones here must give both."""
    for path in sorted(DATA.glob("*.json")):
        source = json.loads(path.read_text())["source"]
        assert source["url"] and source["repo_refs"], path.name
