"""``benchmarks/sd_measured.py`` on source files it was not written for: a team's own measurements, given with
``--data``, are priced from their own fields, and what cannot be priced is said, not dropped or crashed on."""

from __future__ import annotations

import csv
import datetime
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sdplan.calibration import parse_calibration, resolve_calibration
from sdplan.latency.model import step_times

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPT = BENCHMARKS / "sd_measured.py"

pytest.importorskip("aiconfigurator_core", reason="sdplan derive prices the setups: pip install -e '.[derive]'")
from sdplan.derive import DeriveRequest, derive  # noqa: E402  (after the skip: it needs the extra)


def _series(series_id: str, **changes: Any) -> dict[str, Any]:
    """A closed-loop series in data/sd-measured/README.md's schema (values typed in for the test, not a source)."""
    series = {
        "id": series_id, "locator": "test table",
        "hardware": {"gpu": "NVIDIA H100 80GB", "count": 1, "tensor_parallel": 1},
        "engine": {"name": "vllm", "version": "0.11.0"},
        "target_model": "Qwen/Qwen3-8B",
        "draft": {"method": "eagle3", "model": "AngelSlim/Qwen3-8B_eagle3", "k_tokens": 3, "structure": "chain"},
        "acceptance": {"metric": None, "value": None},
        "workload": {"dataset": "team chat logs", "prompt_tokens_mean": 200.0, "output_tokens_mean": 400.0},
        "mode": "closed_loop_batch", "metric": "throughput with SD over without, same batch",
        "reading": {"method": "table"},
        "points": [{"batch": 1, "speedup": 1.8}, {"batch": 16, "speedup": 1.7}, {"batch": 64, "speedup": 1.4}],
    }
    for key, value in changes.items():
        series[key] = value
    return series


def _source(folder: Path, name: str, series: list[dict[str, Any]]) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps({
        "schema_version": 1, "id": name, "measured": True,
        "source": {"title": "t", "authors": "a", "reference": "r", "url": "u", "repo_refs": ["o/r@c:p"],
                   "locator": "l"},
        "series": series}))
    return path


def _run(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *arguments], capture_output=True, text=True, timeout=300)


def test_a_team_file_is_priced_from_its_own_fields_and_what_is_not_priced_says_why(tmp_path: Path) -> None:
    unknown_gpu = _series("s2_qwen3-8b_chat_eagle3", hardware={"gpu": "TPU v5e", "count": 1, "tensor_parallel": 1})
    no_lengths = _series("s3_qwen3-8b_chat_eagle3", workload={"dataset": "team chat logs"})
    pcie = _series("s4_qwen3-8b_chat_eagle3", hardware={"gpu": "NVIDIA H100 PCIe", "count": 1, "tensor_parallel": 1})
    # "NVL" names an H100 or H200 card, but a GB200 NVL72 rack's GPU is the GB200 module AIConfigurator describes
    card = _series("s5_qwen3-8b_chat_eagle3", hardware={"gpu": "NVIDIA H200 NVL", "count": 1, "tensor_parallel": 1})
    rack = _series("s6_qwen3-8b_chat_eagle3", hardware={"gpu": "NVIDIA GB200 NVL72", "count": 1,
                                                        "tensor_parallel": 1})
    path = _source(tmp_path, "team_h100", [_series("s1_qwen3-8b_chat_eagle3"), unknown_gpu, no_lengths, pcie, card,
                                           rack])
    found = _run("--data", str(path), "--json", str(tmp_path / "points.json"))
    assert found.returncode == 0, found.stderr
    # priced at the lengths the series states, with derive's calibration of its target, GPU and head
    assert "team_h100/s1_qwen3-8b_chat_eagle3 (derived; 200 prompt / 400 output tokens)" in found.stdout
    assert "not priced: team_h100/s2_qwen3-8b_chat_eagle3: GPU 'TPU v5e'" in found.stdout
    assert "not priced: team_h100/s3_qwen3-8b_chat_eagle3: no prompt or output length" in found.stdout
    # an H100 on a PCIe card has 2.0 TB/s, not the SXM module's 3.35: not priced as one
    assert "not priced: team_h100/s4_qwen3-8b_chat_eagle3: GPU 'NVIDIA H100 PCIe': derive prices the SXM" \
        in found.stdout
    assert "not priced: team_h100/s5_qwen3-8b_chat_eagle3: GPU 'NVIDIA H200 NVL': derive prices the SXM" \
        in found.stdout
    assert "team_h100/s6_qwen3-8b_chat_eagle3 (derived; 200 prompt / 400 output tokens)" in found.stdout
    assert "4 predicted points in 2 series" in found.stdout
    points = [point for point in json.loads((tmp_path / "points.json").read_text())
              if point["series"].endswith("s1_qwen3-8b_chat_eagle3")]
    assert [p["load"] for p in points] == [1, 16, 64] and points[0]["anchor"] and not points[1]["anchor"]
    assert points[0]["predicted"] == pytest.approx(1.8, rel=1e-6)  # E is anchored at the smallest batch
    # the model's SD gain shrinks as the batch grows, as every measured source's does
    assert points[0]["predicted"] > points[1]["predicted"] > points[2]["predicted"] > 1.0


def test_tpot_pairs_of_a_concurrency_sweep_or_a_rate_sweep_are_priced_as_plan_prices_them(tmp_path: Path) -> None:
    """Engines' benchmarks often give the mean TPOT with and without SD (vllm bench serve): the ratio no SD over SD
    is scored against plan's, E solved at the lowest load."""
    sweep = _series("s1_qwen3-8b_chat_eagle3", points=[
        {"concurrency": 1, "sd_tpot_s": 0.004, "baseline_tpot_s": 0.0072},
        {"concurrency": 16, "sd_tpot_s": 0.0055, "baseline_tpot_s": 0.0085},
        {"concurrency": 64, "sd_tpot_s": 0.0095, "baseline_tpot_s": 0.012}])
    rates = _series("s2_qwen3-8b_chat_eagle3", mode="open_loop_rate", points=[
        {"rate_rps": 0.5, "sd_tpot_s": 0.004, "baseline_tpot_s": 0.0072},
        {"rate_rps": 4.0, "sd_tpot_s": 0.0045, "baseline_tpot_s": 0.0076}])
    path = _source(tmp_path, "team_tpot", [sweep, rates])
    found = _run("--data", str(path), "--json", str(tmp_path / "points.json"))
    assert found.returncode == 0, found.stderr
    assert "not priced" not in found.stdout and "3 predicted points in 2 series" in found.stdout
    points = {(p["series"], p["load"]): p for p in json.loads((tmp_path / "points.json").read_text())}
    for first in (("s1_qwen3-8b_chat_eagle3", 1), ("s2_qwen3-8b_chat_eagle3", 0.5)):
        assert points[first]["anchor"] and points[first]["predicted"] == pytest.approx(1.8, rel=1e-3)
    assert points["s1_qwen3-8b_chat_eagle3", 16]["measured"] == pytest.approx(0.0085 / 0.0055)
    # the model's TPOT gain shrinks as clients are added (more sequences a step; a longer verification)
    sweep_predicted = [points["s1_qwen3-8b_chat_eagle3", n]["predicted"] for n in (1, 16, 64)]
    assert sweep_predicted[0] > sweep_predicted[1] > sweep_predicted[2] > 1.0


def test_a_bad_team_file_is_refused_naming_the_file_series_and_field(tmp_path: Path) -> None:
    bad = _series("s1_qwen3-8b_chat_eagle3", precision="int3")
    bad["points"][1] = {"batch": 16, "speedup": -1.0}
    path = _source(tmp_path, "team_bad", [bad, _series("s2_qwen3-8b_chat_eagle3", target_model=8),
                                           _series("s3_qwen3-8b_chat_eagle3", kv_cache_dtype="fp16")])
    found = _run("--data", str(path))
    assert found.returncode == 2 and found.stdout == ""
    lines = found.stderr.strip().splitlines()
    assert any("team_bad.json:s1_qwen3-8b_chat_eagle3: precision must be one of" in line for line in lines)
    assert any("point 1: 'speedup' must be a positive number, got -1.0" in line for line in lines)
    assert any("s2_qwen3-8b_chat_eagle3: target_model must be the model's name" in line for line in lines)
    assert any("s3_qwen3-8b_chat_eagle3: kv_cache_dtype must be one of ['auto', 'bf16', 'fp8']" in line
               for line in lines)
    assert "Traceback" not in found.stderr


def test_a_team_file_needs_no_url_or_repository_but_bad_ones_are_refused(tmp_path: Path) -> None:
    path = _source(tmp_path, "team_private", [_series("s1_qwen3-8b_chat_eagle3")])
    document = json.loads(path.read_text())
    del document["source"]["url"]
    document["source"]["repo_refs"] = []
    path.write_text(json.dumps(document))
    found = _run("--data", str(path))
    assert found.returncode == 0, found.stderr
    document["source"]["repo_refs"] = "o/r@c:p"
    path.write_text(json.dumps(document))
    found = _run("--data", str(path))
    assert found.returncode == 2 and "team_private.json: source.repo_refs must be a list" in found.stderr


def test_a_file_with_nothing_to_predict_says_so(tmp_path: Path) -> None:
    """One load a series: its acceptance is solved there, so no point is left to score."""
    path = _source(tmp_path, "team_one", [_series("s1_qwen3-8b_chat_eagle3", points=[{"batch": 1, "speedup": 1.5}])])
    found = _run("--data", str(path))
    assert found.returncode == 1 and "nothing to score" in found.stderr and "Traceback" not in found.stderr


def test_a_series_id_repeated_across_files_is_refused(tmp_path: Path) -> None:
    first = _source(tmp_path, "team_a", [_series("s1_qwen3-8b_chat_eagle3")])
    second = _source(tmp_path, "team_b", [_series("s1_qwen3-8b_chat_eagle3")])
    found = _run("--data", str(first), "--data", str(second))
    assert found.returncode == 2
    assert "team_b:s1_qwen3-8b_chat_eagle3: the series id is also in team_a" in found.stderr


def test_options_measured_side_by_side_are_one_panel_in_the_choice_scores(tmp_path: Path) -> None:
    ngram = _series("s1_qwen3-8b_chat_ngram", draft={"method": "ngram", "model": None, "k_tokens": 3,
                                                     "structure": "chain"},
                    points=[{"batch": 1, "speedup": 1.2}, {"batch": 16, "speedup": 1.15},
                            {"batch": 64, "speedup": 1.05}])
    path = _source(tmp_path, "team_h100", [_series("s1_qwen3-8b_chat_eagle3"), ngram])
    found = _run("--data", str(path))
    assert found.returncode == 0, found.stderr
    # one panel (no SD, EAGLE-3, n-gram) at the two predicted batches: two choices, not four
    assert "team_h100: best chosen at" in found.stdout and " of 2; regret" in found.stdout
    assert "4 predicted points in 2 series" in found.stdout


def test_a_reasoning_runs_output_length_gives_back_its_measured_no_sd_throughput(tmp_path: Path) -> None:
    """SpecDecode-Bench's Qwen3-8B thinking runs state no output length: the benchmark takes the one at which the
    derived file gives the no-SD throughput measured at the largest batch, and that length must give it back."""
    shipped = json.loads((BENCHMARKS / "data" / "sd-measured" / "specdecode_bench_2601.11580.json").read_text())
    series = next(s for s in shipped["series"] if s["id"] == "fig3a_qwen3-8b-thinking_gsm8k_eagle3")
    path = tmp_path / "specdecode_bench_2601.11580.json"
    path.write_text(json.dumps(shipped | {"series": [series]}))
    found = _run("--data", str(path))
    assert found.returncode == 0, found.stderr
    lengths = re.search(r"fig3a_qwen3-8b-thinking_gsm8k_eagle3 \(derived; ([0-9.e+]+) prompt / ([0-9.e+]+) output",
                        found.stdout)
    assert lengths is not None, found.stdout
    prompt, output = float(lengths[1]), float(lengths[2])
    assert prompt == 94.5 and output > 5 * 166.2  # thinking outputs: far longer than GSM8K's answers without
    request = DeriveRequest(target_model="Qwen/Qwen3-8B", system="h100_sxm", method="eagle3",
                            draft_model="AngelSlim/Qwen3-8B_eagle3", date=datetime.date(2026, 11, 29))
    calibration = parse_calibration(derive(request).document, "<derived>")
    coefficients = calibration.coefficients_at(prompt, output)
    last = series["points"][-1]
    batch = float(last["batch"])
    tau_0 = step_times(coefficients, [3], np.asarray([batch]), calibration.moe_at(prompt, output))[0][0]
    # a static batch without SD: its prefill, then g - 1 decode steps
    without = coefficients.c1p_s + (batch - 1.0) * coefficients.c2p_s + (output - 1.0) * float(tau_0)
    assert batch * output / without == pytest.approx(last["baseline_tokens_per_s"], rel=0.005)


def test_a_static_batch_of_one_prompts_copies_routes_one_sequences_tokens_through_the_experts(tmp_path: Path) -> None:
    """SpecDecode-Bench's batches are one prompt copied ``B`` times, decoded greedily: the copies route the same
    tokens, so GLM-4.5-Air's (an MoE) steps touch the experts of one sequence's rows. Priced so, its n-gram runs hold
    within 10% at batch 2 and 4; priced as ``B`` distinct sequences they fall 12-16% below the measured ratio."""
    shipped = json.loads((BENCHMARKS / "data" / "sd-measured" / "specdecode_bench_2601.11580.json").read_text())
    series = [s for s in shipped["series"] if "glm-4.5-air" in s["id"]]
    assert len(series) == 4
    path = tmp_path / "specdecode_bench_2601.11580.json"
    path.write_text(json.dumps(shipped | {"series": series}))
    found = _run("--data", str(path))
    assert found.returncode == 0, found.stderr
    assert "not priced" not in found.stdout, found.stdout
    table = re.search(r"fig3g_glm-4.5-air_aime22-24_ngram \(derived;[^\n]*\n\s+load[^\n]*\n\s+meas ([^\n]*)\n"
                      r"\s+pred ([^\n]*)", found.stdout)
    assert table is not None, found.stdout
    measured, predicted = (np.array([float(x) for x in row.split()]) for row in (table[1], table[2]))
    assert np.all(np.abs(predicted[1:] / measured[1:] - 1.0) < 0.10), (measured, predicted)


def _predicted(stdout: str, series_id: str) -> np.ndarray:
    """The ``pred`` row the benchmark prints under a series' table."""
    table = re.search(rf"{re.escape(series_id)} \([^\n]*\n\s+load[^\n]*\n\s+meas[^\n]*\n\s+pred ([^\n]*)", stdout)
    assert table is not None, stdout
    return np.array([float(x) for x in table[1].split()])


def test_a_team_file_says_whether_its_batches_are_copies_of_one_prompt(tmp_path: Path) -> None:
    """``workload.batch_of_copies``: identical sequences route the same tokens, so at batch 16 an MoE's decode step
    and SD cycle touch the experts of one sequence's rows, not sixteen times as many, and the priced ratio moves
    (on this file no SD's step, whose coverage grows most, gains most); at one sequence nothing moves. A value that
    is not a boolean, or one given with rates, is refused."""
    def series(series_id: str, copies: bool) -> dict[str, Any]:
        workload = {"dataset": "team chat logs", "prompt_tokens_mean": 200.0, "output_tokens_mean": 400.0,
                    "batch_of_copies": copies}
        return _series(series_id, workload=workload, target_model="Qwen/Qwen3-30B-A3B",
                       sdplan={"calibration": "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived"},
                       draft={"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "k_tokens": 3,
                              "structure": "chain"})
    path = _source(tmp_path, "team_moe", [series("copies_moe", True), series("distinct_moe", False)])
    found = _run("--data", str(path))
    assert found.returncode == 0, found.stderr
    copies, distinct = _predicted(found.stdout, "copies_moe"), _predicted(found.stdout, "distinct_moe")
    assert copies[0] == distinct[0]  # one sequence: the same rows either way
    assert copies[1] < distinct[1] / 1.05

    bad = series("bad_moe", True)
    bad["workload"]["batch_of_copies"] = "yes"
    rated = series("rated_moe", True) | {"mode": "open_loop_rate",
                                         "points": [{"rate_rps": 1.0, "sd_latency_s": 2.0, "baseline_latency_s": 3.0}]}
    refused = _run("--data", str(_source(tmp_path, "team_bad", [bad, rated])))
    assert refused.returncode == 2
    assert "bad_moe: workload.batch_of_copies must be true or false" in refused.stderr
    assert "rated_moe: workload.batch_of_copies says each batch is one prompt copied" in refused.stderr


def test_replicas_are_priced_at_their_share_of_the_load_and_a_tree_is_not_priced_as_a_chain(tmp_path: Path) -> None:
    """Two data-parallel replicas at batch 2N run what one runs at N, so the ratio is one replica's at N, printed at
    the source's loads; a tree's drafting (top-k over 1) is not a chain of k, so it is said not to be priced."""
    one = _series("s1_qwen3-8b_chat_eagle3", points=[{"batch": 1, "speedup": 1.8}, {"batch": 16, "speedup": 1.7},
                                                     {"batch": 64, "speedup": 1.4}])
    two = _series("s2_qwen3-8b_chat_eagle3", hardware={"gpu": "NVIDIA H100 80GB", "count": 2, "tensor_parallel": 1},
                  points=[{"batch": 2, "speedup": 1.8}, {"batch": 32, "speedup": 1.7}, {"batch": 128, "speedup": 1.4}])
    tree = _series("s3_qwen3-8b_chat_eagle3", draft={"method": "eagle3", "model": "AngelSlim/Qwen3-8B_eagle3",
                                                     "k_tokens": 3, "structure": "tree"})
    uneven = _series("s4_qwen3-8b_chat_eagle3", hardware={"gpu": "NVIDIA H100 80GB", "count": 3, "tensor_parallel": 2})
    alone = _series("s5_qwen3-8b_chat_eagle3", points=two["points"])
    path = _source(tmp_path, "team_dp", [one, two, tree, uneven, alone])
    found = _run("--data", str(path), "--json", str(tmp_path / "points.json"))
    assert found.returncode == 0, found.stderr
    assert "s2_qwen3-8b_chat_eagle3 (derived; 200 prompt / 400 output tokens; 2 replicas of TP1" in found.stdout
    assert "not priced: team_dp/s3_qwen3-8b_chat_eagle3: tree drafting" in found.stdout
    assert "not priced: team_dp/s4_qwen3-8b_chat_eagle3: hardware.count 3 is not a multiple of tensor_parallel 2" \
        in found.stdout
    points = json.loads((tmp_path / "points.json").read_text())
    single = [p for p in points if p["series"] == one["id"]]
    shared = [p for p in points if p["series"] == two["id"]]
    assert [p["load"] for p in shared] == [2, 32, 128]
    assert [p["predicted"] for p in shared] == pytest.approx([p["predicted"] for p in single], rel=1e-9)
    # a replica's share is not the whole load: the same 128 sequences on one engine gain less
    assert shared[-1]["predicted"] > [p for p in points if p["series"] == alone["id"]][-1]["predicted"] * 1.05


def test_a_series_own_acceptance_in_tokens_per_cycle_makes_every_point_a_prediction(tmp_path: Path) -> None:
    """Where the series states its acceptance as tokens per cycle, nothing is anchored: each point, the lowest load
    too, is priced with it (a closed loop, and an open loop at its stated lengths); an acceptance a chain of k cannot
    reach is refused as a schema error."""
    acceptance = {"metric": "mean acceptance length, tokens per cycle incl. bonus", "value": 2.6}
    closed = _series("s1_qwen3-8b_chat_eagle3", acceptance=acceptance)
    opened = _series("s2_qwen3-8b_chat_eagle3", acceptance=acceptance, mode="open_loop_rate",
                     metric="mean end-to-end latency", points=[
                         {"rate_rps": 1, "sd_latency_s": 2.0, "baseline_latency_s": 3.6},
                         {"rate_rps": 4, "sd_latency_s": 2.3, "baseline_latency_s": 4.0}])
    path = _source(tmp_path, "team_acc", [closed, opened])
    found = _run("--data", str(path), "--json", str(tmp_path / "points.json"))
    assert found.returncode == 0, found.stderr
    assert "5 predicted points in 2 series" in found.stdout
    points = json.loads((tmp_path / "points.json").read_text())
    assert not any(p["anchor"] for p in points)
    per_cycle = _series("s3_qwen3-8b_chat_eagle3", acceptance={"metric": "tokens per cycle", "value": 4.5})
    over = _series("s4_qwen3-8b_chat_eagle3")
    over["points"][1]["acceptance_tokens_per_cycle"] = 5.0
    found = _run("--data", str(_source(tmp_path, "team_bad_acc", [per_cycle, over])))
    assert found.returncode == 2 and "Traceback" not in found.stderr
    assert "s3_qwen3-8b_chat_eagle3: acceptance.value is tokens per cycle with the bonus token: between 1 and " \
           "k_tokens + 1 = 4, got 4.5" in found.stderr
    assert "s4_qwen3-8b_chat_eagle3 point 1: 'acceptance_tokens_per_cycle' is tokens per cycle" in found.stderr


def test_a_series_acceptance_in_the_engines_own_words_is_read_as_tokens_per_cycle(tmp_path: Path) -> None:
    """vLLM and SGLang report a mean acceptance length (the bonus token counted), a draft acceptance rate (accepted
    over drafted) or per-position acceptance rates (each position's accepted drafts over the cycles). The same
    acceptance in each of these words prices every point the same, with nothing anchored."""
    forms = [{"metric": "tokens per cycle", "value": 2.5},
             {"metric": "mean acceptance length (vLLM spec_decode)", "value": 2.5},
             {"metric": "draft acceptance rate (vLLM /metrics)", "value": 0.5},
             {"metric": "per-position acceptance rate", "value": [0.8, 0.45, 0.25]}]
    series = [_series(f"a{i}_qwen3-8b_chat_eagle3", acceptance=form) for i, form in enumerate(forms)]
    found = _run("--data", str(_source(tmp_path, "team_words", series)), "--json", str(tmp_path / "points.json"))
    assert found.returncode == 0, found.stderr
    points = json.loads((tmp_path / "points.json").read_text())
    assert len(points) == 12 and not any(p["anchor"] for p in points)
    by_load: dict[int, set[float]] = {}
    for point in points:
        by_load.setdefault(point["load"], set()).add(round(point["predicted"], 12))
    assert all(len(values) == 1 for values in by_load.values())
    # more positions than the chain drafts is not read: the series is anchored at its lowest load instead
    loose = _series("a9_qwen3-8b_chat_eagle3", acceptance={"metric": "per-position acceptance rate",
                                                            "value": [0.8, 0.5, 0.3, 0.2]})
    found = _run("--data", str(_source(tmp_path, "team_loose", [loose])), "--json", str(tmp_path / "loose.json"))
    assert found.returncode == 0 and json.loads((tmp_path / "loose.json").read_text())[0]["anchor"]


def test_vllms_draft_acceptance_rate_is_taken_as_one_plus_k_times_it(tmp_path: Path) -> None:
    """A point's draft_acceptance_rate (accepted over drafted tokens) prices it as 1 + k r tokens per cycle: the
    same predictions as those tokens per cycle given outright; a percentage, or both keys at one point, refused."""
    by_rate, by_tokens = _series("s1_qwen3-8b_chat_eagle3"), _series("s2_qwen3-8b_chat_eagle3", panel="other")
    for rate, point, same in zip((0.6, 0.55, 0.5), by_rate["points"], by_tokens["points"]):
        point["draft_acceptance_rate"] = rate
        same["acceptance_tokens_per_cycle"] = 1 + 3 * rate
    found = _run("--data", str(_source(tmp_path, "team_rate", [by_rate, by_tokens])), "--json",
                 str(tmp_path / "points.json"))
    assert found.returncode == 0, found.stderr
    points = json.loads((tmp_path / "points.json").read_text())
    predicted = {}
    for point in points:
        assert not point["anchor"]
        predicted.setdefault(point["series"].split("/")[-1][:2], []).append(point["predicted"])
    assert len(predicted["s1"]) == 3 and predicted["s1"] == pytest.approx(predicted["s2"], rel=1e-12)
    bad = _series("s3_qwen3-8b_chat_eagle3")
    bad["points"][0]["draft_acceptance_rate"] = 62.0
    bad["points"][1] |= {"draft_acceptance_rate": 0.5, "acceptance_tokens_per_cycle": 2.5}
    found = _run("--data", str(_source(tmp_path, "team_bad_rate", [bad])))
    assert found.returncode == 2 and "Traceback" not in found.stderr
    assert "point 0: 'draft_acceptance_rate' is accepted over drafted tokens, at most 1; got 62.0" in found.stderr
    assert "point 1: give 'acceptance_tokens_per_cycle' or 'draft_acceptance_rate', not both" in found.stderr


def test_an_open_loops_per_user_tokens_per_s_is_read_as_its_tpot(tmp_path: Path) -> None:
    """At a rate both options serve the same requests: each user's output tokens/s is one token a TPOT, so a
    series of them is priced as the same series of TPOT pairs would be."""
    rates = ((1.0, 180.0, 110.0), (4.0, 160.0, 105.0), (8.0, 120.0, 100.0))
    per_user = _series("s1_qwen3-8b_chat_eagle3", mode="open_loop_rate", metric="output tokens/s per user", points=[
        {"rate_rps": r, "sd_tokens_per_s_per_user": sd, "baseline_tokens_per_s_per_user": base}
        for r, sd, base in rates])
    tpots = _series("s2_qwen3-8b_chat_eagle3", mode="open_loop_rate", metric="mean TPOT", points=[
        {"rate_rps": r, "sd_tpot_s": 1.0 / sd, "baseline_tpot_s": 1.0 / base} for r, sd, base in rates])
    found = _run("--data", str(_source(tmp_path, "team_users", [per_user, tpots])), "--json",
                 str(tmp_path / "points.json"))
    assert found.returncode == 0, found.stderr
    assert "not priced" not in found.stdout
    points = json.loads((tmp_path / "points.json").read_text())
    by_series: dict[str, list[float]] = {}
    for point in points:
        by_series.setdefault(point["series"].split("/")[-1][:2], []).append(point["predicted"])
    assert len(by_series["s1"]) == 3 and by_series["s1"] == pytest.approx(by_series["s2"], rel=1e-12)


def test_a_closed_loops_latency_pairs_are_its_throughput_ratio(tmp_path: Path) -> None:
    """With N requests in flight each option completes N / L requests a second (Little's law): latency pairs at a
    batch or concurrency are priced as the speedup L0 / Lk."""
    pairs = ((1, 4.0, 6.8), (16, 5.0, 8.0), (64, 7.5, 9.9))
    latencies = _series("s1_qwen3-8b_chat_eagle3", metric="mean request latency", points=[
        {"batch": b, "sd_latency_s": sd, "baseline_latency_s": base} for b, sd, base in pairs])
    speedups = _series("s2_qwen3-8b_chat_eagle3", points=[{"batch": b, "speedup": base / sd} for b, sd, base in pairs])
    found = _run("--data", str(_source(tmp_path, "team_latency", [latencies, speedups])), "--json",
                 str(tmp_path / "points.json"))
    assert found.returncode == 0, found.stderr
    assert "not priced" not in found.stdout
    by_series: dict[str, list[float]] = {}
    for point in json.loads((tmp_path / "points.json").read_text()):
        by_series.setdefault(point["series"].split("/")[-1][:2], []).extend((point["measured"], point["predicted"]))
    assert len(by_series["s1"]) == 6 and by_series["s1"] == pytest.approx(by_series["s2"], rel=1e-12)


def test_sglang_runs_at_most_48_requests_under_sd_in_tpot_and_rate_series_too(tmp_path: Path) -> None:
    """SGLang holds SD to 48 running requests: past 48 clients the others wait for admission, in their TTFT, so
    SD's TPOT stops growing while no SD's grows on, and the ratio turns up; at rates, SD saturates where its 48
    are full, so its latency gain collapses before no SD's does."""
    engine = {"name": "sglang", "version": "0.5.9"}
    tpot = [{"concurrency": 1, "sd_tpot_s": 0.004, "baseline_tpot_s": 0.0072},
            {"concurrency": 64, "sd_tpot_s": 0.008, "baseline_tpot_s": 0.012},
            {"concurrency": 128, "sd_tpot_s": 0.009, "baseline_tpot_s": 0.016}]
    sweeps = [_series(f"s{i}_qwen3-8b_chat_eagle3", engine=engine if i == 1 else _series("x")["engine"], points=tpot)
              for i in (1, 2)]
    rates = [_series(f"s{i}_qwen3-8b_chat_eagle3", engine=engine if i == 3 else _series("x")["engine"],
                     mode="open_loop_rate", metric="mean end-to-end latency", points=[
                         {"rate_rps": 0.5, "sd_latency_s": 2.0, "baseline_latency_s": 3.6},
                         {"rate_rps": 28.0, "sd_latency_s": 3.0, "baseline_latency_s": 6.0}])
             for i in (3, 4)]
    found = _run("--data", str(_source(tmp_path, "team_sglang", sweeps + rates)),
                 "--json", str(tmp_path / "points.json"))
    assert found.returncode == 0, found.stderr
    everything = json.loads((tmp_path / "points.json").read_text())
    # at the stated lengths, E is solved so that the lowest load gives back its measured ratio
    assert all(p["predicted"] == pytest.approx(p["measured"], rel=1e-3) for p in everything if p["anchor"])
    points = {(p["series"], p["load"]): p["predicted"] for p in everything}
    sglang = [points["s1_qwen3-8b_chat_eagle3", n] for n in (64, 128)]
    vllm = [points["s2_qwen3-8b_chat_eagle3", n] for n in (64, 128)]
    assert sglang[1] > sglang[0] and vllm[1] < vllm[0]
    # 28 req/s fills SGLang's 48 under SD (unstable: ratio 0) while vLLM's SD still gains
    assert points["s3_qwen3-8b_chat_eagle3", 28.0] < 1.0 < points["s4_qwen3-8b_chat_eagle3", 28.0]


def test_a_series_that_says_its_engines_running_limit_is_priced_with_it_for_both_options(tmp_path: Path) -> None:
    """A run that set SGLang's --max-running-requests (or vLLM's --max-num-seqs) says so in
    ``engine.max_running_requests``: SD then runs all 64 sequences of a batch of 64, not SGLang's default 48, and
    with a limit of 16 both options run 16 of every larger batch, so their ratio there is the ratio at 16."""
    points = [{"batch": 1, "speedup": 1.8}, {"batch": 16, "speedup": 1.6}, {"batch": 64, "speedup": 1.3}]
    sglang = {"name": "sglang", "version": "0.5.9"}
    series = [_series("r1_qwen3-8b_chat_eagle3", engine=sglang, points=points),
              _series("r2_qwen3-8b_chat_eagle3", engine=sglang | {"max_running_requests": 64}, points=points),
              _series("r3_qwen3-8b_chat_eagle3", engine=sglang | {"max_running_requests": 16}, points=points),
              # an engine named as its project writes it is the same engine
              _series("r4_qwen3-8b_chat_eagle3", engine={"name": "SGLang", "version": "0.5.9"}, points=points),
              _series("r6_qwen3-8b_chat_eagle3", engine={"name": "TensorRT LLM", "version": "1.2"}, points=points)]
    found = _run("--data", str(_source(tmp_path, "team_limit", series)), "--json", str(tmp_path / "points.json"))
    assert found.returncode == 0, found.stderr
    predicted = {(p["series"].split("/")[-1][:2], p["load"]): p["predicted"]
                 for p in json.loads((tmp_path / "points.json").read_text())}
    # the default 48 makes SD run fewer of the 64 than no SD: a lower ratio than with all 64 running
    assert predicted["r1", 64] < predicted["r2", 64]
    assert predicted["r4", 64] == predicted["r1", 64] and ("r6", 64) in predicted
    assert "not priced" not in found.stdout
    # with a limit of 16 a batch of 64 runs as 16 on both sides: the ratio at 16 again; without one it is not
    assert predicted["r3", 64] == pytest.approx(predicted["r3", 16], rel=1e-9)
    assert predicted["r2", 64] != pytest.approx(predicted["r2", 16], rel=1e-3)
    bad = _series("r5_qwen3-8b_chat_eagle3", engine=sglang | {"max_running_requests": 0}, points=points)
    refused = _run("--data", str(_source(tmp_path, "team_bad_limit", [bad])))
    assert refused.returncode == 2 and "engine.max_running_requests must be a positive integer" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_sources_traced_llama_runs_are_priced_request_by_request_at_their_own_acceptance(tmp_path: Path) -> None:
    """SpecDecode-Bench's Llama-3.1-8B EAGLE-3 and n-gram series are priced from its traces: each request at its own
    prompt, output and tokens per cycle, the ratio of the means of the requests' throughputs (how its
    vis_speedup.py plots them), and no point is an anchor, batch 1 included."""
    shipped = json.loads((BENCHMARKS / "data" / "sd-measured" / "specdecode_bench_2601.11580.json").read_text())
    kept = [s for s in shipped["series"]
            if s["id"] in ("fig1a_llama3.1-8b_gsm8k_eagle3", "fig1a_llama3.1-8b_gsm8k_eagle")]
    path = tmp_path / "specdecode_bench_2601.11580.json"
    path.write_text(json.dumps(shipped | {"series": kept}))
    found = _run("--data", str(path), "--json", str(tmp_path / "points.json"))
    assert found.returncode == 0, found.stderr
    assert "fig1a_llama3.1-8b_gsm8k_eagle3 (h100-sxm_llama-3.1-8b_eagle3_derived; 300 traced requests" in found.stdout
    points = json.loads((tmp_path / "points.json").read_text())
    traced = [p for p in points if p["series"].endswith("_eagle3")]
    assert len(traced) == 4 and not any(p["anchor"] for p in traced)
    # the EAGLE-1 series has no trace of its acceptance: anchored at batch 1, priced at the traced requests' lengths
    assert [p["anchor"] for p in points if p["series"].endswith("_eagle")] == [True, False, False, False]
    assert "fig1a_llama3.1-8b_gsm8k_eagle (h100-sxm_llama-3.1-8b_eagle3_derived; 300 traced requests, each at " \
           "its own lengths, one E)" in found.stdout
    with (BENCHMARKS / "data" / "sd-measured" / "specdecode_bench_llama3.1-8b_traces.csv").open() as file:
        requests = [row for row in csv.DictReader(file) if row["dataset"] == "gsm8k"]
    calibration = resolve_calibration("h100-sxm_llama-3.1-8b_eagle3_derived")

    def throughput(batch: float, prompt: float, output: float, cycles: float | None) -> float:
        coefficients = calibration.coefficients_at(prompt, output)
        plain, speculative = step_times(coefficients, [3], np.asarray([batch]))[0]
        prefill = coefficients.c1p_s + (batch - 1.0) * coefficients.c2p_s
        return batch * output / (prefill + (output - 1.0 if cycles is None else cycles) *
                                 (plain if cycles is None else speculative))

    for point in traced:
        batch = point["load"]
        with_sd = np.mean([throughput(batch, float(r["prompt_tokens"]), float(r["eagle3_output_tokens"]),
                                      float(r["eagle3_cycles_k3"])) for r in requests])
        without = np.mean([throughput(batch, float(r["prompt_tokens"]), float(r["output_tokens"]), None)
                           for r in requests])
        assert point["predicted"] == pytest.approx(with_sd / without, rel=1e-9)

    # the EAGLE-1 series: one E for every request, so that the ratio of the mean throughputs at batch 1 is the
    # measured one; then the same mean at the larger batches
    def ratio(batch: float, tokens_per_cycle: float) -> float:
        with_sd = np.mean([throughput(batch, float(r["prompt_tokens"]), float(r["output_tokens"]),
                                      float(r["output_tokens"]) / tokens_per_cycle) for r in requests])
        without = np.mean([throughput(batch, float(r["prompt_tokens"]), float(r["output_tokens"]), None)
                           for r in requests])
        return float(with_sd / without)

    anchored = [p for p in points if p["series"].endswith("_eagle")]
    low, high = 1.0, 4.0
    for _ in range(60):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if ratio(1.0, middle) < anchored[0]["measured"] else (low, middle)
    for point in anchored[1:]:
        assert point["predicted"] == pytest.approx(ratio(point["load"], low), rel=1e-6)
