"""The first screen: what ``sdplan plan`` with its defaults answers, on the shipped default calibration.

The first answer a new user got once put saturation past the limit its own KV cache sets, and had SD's
gain grow with the load, where every published measurement has it shrink. These check both against
bounds computed here from the step model, and against SpecDecode-Bench's measured speedups.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy

from sdplan.latency.model import step_times
from sdplan.planning.scenario import ScenarioOptions, resolve_scenario
from tests.test_cli_plan import strict_json

SPECDECODE_BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "sd-measured" / \
    "specdecode_bench_2601.11580.json"


def _default_plan(sdplan) -> dict:
    return strict_json(sdplan("plan", "-f", "json").stdout)


def test_default_saturation_is_at_or_below_what_its_binding_limit_allows(sdplan) -> None:
    doc = _default_plan(sdplan)
    scenario = resolve_scenario(ScenarioOptions())
    coefficients = scenario.coefficients
    options = doc["results"][0]["draft_lengths"]
    draft_lengths = [o["draft_length_tokens"] for o in options]
    caps = scenario.limits.caps(draft_lengths)
    g = coefficients.output_tokens
    steps = [g - 1.0] + [g / o["tokens_per_cycle"] for o in options]
    saturations = [doc["baseline"]["saturation_rate_rps"]] + [o["saturation_rate_rps"] for o in options]
    for column, (cap, n_steps, saturation) in enumerate(zip(caps, steps, saturations)):
        # a server held full at its cap of N sequences completes at most N requests per request time at N
        tau = step_times(coefficients, draft_lengths, numpy.array([cap]))[0, column]
        full = coefficients.c1p_s + (cap - 1.0) * coefficients.c2p_s + n_steps * tau
        # and at most 1/C2 while compute bound
        c2 = doc["baseline"]["c2_s"] if column == 0 else options[column - 1]["c2_s"]
        assert saturation <= min(cap / full, 1.0 / c2) * (1.0 + 1e-9), (column, saturation, cap / full, 1.0 / c2)
    # the default's binding limit is its batch cap (max_num_seqs without SD, the KV cache with the draft)
    assert doc["baseline"]["saturation_limit"] == "cap"
    assert caps[1] < caps[0]


def test_default_speedup_at_a_fixed_batch_shrinks_as_measured(sdplan) -> None:
    doc = _default_plan(sdplan)
    measured = json.loads(SPECDECODE_BENCH.read_text())
    # SpecDecode-Bench, Figure 1: speedup at batch 128 over batch 1, every k = 3 series (vLLM 0.10.1, H100)
    ratios = []
    for series in measured["series"]:
        speedups = {p["batch"]: p["speedup"] for p in series["points"] if "speedup" in p}
        if series["id"].startswith("fig1") and series["draft"]["k_tokens"] == 3 and {1, 128} <= speedups.keys():
            ratios.append(speedups[128] / speedups[1])
    assert len(ratios) >= 10 and max(ratios) < 1.0
    for option in doc["results"][0]["draft_lengths"]:
        curve = [(s["batch_requests"], s["speedup"]) for s in option["step_speedup"]]
        speedups = [s for _, s in curve]
        assert all(b <= a for a, b in zip(speedups, speedups[1:])), (option["draft_length_tokens"], curve)
        if option["draft_length_tokens"] == 3:
            at = dict(curve)
            assert min(ratios) <= at[128.0] / at[1.0] <= max(ratios), (at, min(ratios), max(ratios))


def test_capacity_says_the_saturation_and_break_even_plan_says(sdplan) -> None:
    """One rule for both answers: each option saturates at the lower of 1/C2 and its batch cap's rate, and a
    break-even past SD's own limit is SD's limit (k=8 at alpha 0.8 on the default file: its cap comes first)."""
    plan = json.loads(sdplan("plan", "--acceptance", "0.8", "-f", "json").stdout)
    capacity = json.loads(sdplan("capacity", "--slo", "e2e:mean<=5s", "--acceptance", "0.8", "-f", "json").stdout)
    options = {option["draft_length_tokens"]: option for option in capacity["options"]}
    assert options[None]["saturation_rate_rps"] == plan["baseline"]["saturation_rate_rps"]
    assert plan["baseline"]["saturation_limit"] == "cap"
    planned = plan["results"][0]["draft_lengths"]
    for option in planned:
        assert options[option["draft_length_tokens"]]["saturation_rate_rps"] == option["saturation_rate_rps"]
        assert options[option["draft_length_tokens"]]["break_even_rate_rps"] == option["break_even_rate_rps"]
    assert options[8]["break_even_rate_rps"] == options[8]["saturation_rate_rps"] < options[None]["saturation_rate_rps"]
