"""The compute-bound knee of the target's step (sdplan/latency/knee.py, docs/model.md#compute-bound-knee)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from sdplan.calibration import resolve_calibration
from sdplan.derive.fitting import fit_knee, step_rows
from sdplan.latency import knee, model
from sdplan.latency.model import step_times
from sdplan.planning import planner

#: The shipped file without its knee, and with a knee of 2e-5 s a row past 256 rows.
BASE = dataclasses.replace(resolve_calibration("h100-sxm_llama-3.1-8b_eagle3_derived").coefficients_at(1024, 512),
                           knee_tokens=0.0, knee_per_token_s=0.0)
KNEE = dataclasses.replace(BASE, knee_tokens=256.0, knee_per_token_s=2e-5)


def fixed_point(c: object, k: int, tokens_per_cycle: float, rate: float) -> float:
    """``L = C1 + W + B C2 + n b max(0, t (1 + B) - R)`` with ``B = rate L``, by plain iteration from 0 (``W``
    the open loop's wait for the prefills queued ahead)."""
    wait = float(knee.prefill_wait_s(c.c2p_s, c.prompt_cv, rate))  # type: ignore[attr-defined]
    if k == 0:
        c1, c2 = model.baseline_demand(c)  # type: ignore[arg-type]
        steps, rows = model.baseline_steps(c.output_tokens), 1.0  # type: ignore[attr-defined]
    else:
        c1, c2 = (float(x) for x in model.demand_from_tokens(c, np.asarray(tokens_per_cycle), k))  # type: ignore[arg-type]
        steps, rows = c.output_tokens / tokens_per_cycle, k + 1.0  # type: ignore[attr-defined]
    latency = 0.0
    for _ in range(200_000):
        others = rate * latency
        new = c1 + wait + others * c2 + steps * c.knee_per_token_s * max(0.0, rows * (1 + others) - c.knee_tokens)  # type: ignore[attr-defined]
        if new > 1e6:
            return math.inf
        if abs(new - latency) <= 1e-12 * new:
            return new
        latency = new
    return math.inf


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_the_closed_form_is_the_fixed_point_of_the_knee(k: int) -> None:
    result = planner.plan(KNEE, np.linspace(0.5, 20, 12), [1, 3, 5], [0.7])
    tokens = float(result.tokens_per_cycle[0, [1, 3, 5].index(k)]) if k else 1.0
    for ir, rate in enumerate(result.rates_rps):
        predicted = result.baseline_latency_s[ir] if k == 0 else result.latency_s[0, ir, [1, 3, 5].index(k)]
        expected = fixed_point(KNEE, k, tokens, float(rate))
        if math.isinf(expected):
            assert math.isinf(predicted)
        else:
            assert predicted == pytest.approx(expected, rel=1e-6)


def test_without_a_slope_the_knee_changes_nothing() -> None:
    flat = dataclasses.replace(BASE, knee_tokens=64.0, knee_per_token_s=0.0)
    a, b = planner.plan(BASE, [1, 5, 9], [1, 3], [0.8]), planner.plan(flat, [1, 5, 9], [1, 3], [0.8])
    np.testing.assert_array_equal(a.latency_s, b.latency_s)
    np.testing.assert_array_equal(a.break_even_rate_rps, b.break_even_rate_rps)


def test_past_the_knee_sd_loses_its_speedup_first() -> None:
    """SD's rows grow k + 1 times faster with the batch: the same knee takes its speedup away under load."""
    rates = np.linspace(0.5, 16.4, 40)  # up to no SD's saturation: SD's batch passes its knee (63 others)
    kneed = planner.plan(KNEE, rates, [3], [0.7])
    with_knee, without = kneed.speedup[0, :, 0], planner.plan(BASE, rates, [3], [0.7]).speedup[0, :, 0]
    # where no SD's own batch stays below its knee (255 others), only SD's latency can change
    stable = np.isfinite(with_knee) & np.isfinite(without) & (with_knee > 0) & (kneed.baseline_batch < 255)
    assert with_knee[0] == pytest.approx(without[0])  # at low load neither is past its knee
    assert np.all(with_knee[stable] <= without[stable] + 1e-12)
    assert np.any(with_knee[stable] < without[stable] - 1e-9)
    # at a fixed batch (a closed loop, as SpecDecode-Bench measures) SD's throughput ratio falls past the knee
    sizes = np.asarray([64.0, 128.0, 192.0, 256.0])
    tokens = float(planner.plan(KNEE, [1.0], [3], [0.7]).tokens_per_cycle[0, 0])
    taus = step_times(KNEE, [3], sizes)
    ratio = tokens * taus[:, 0] / taus[:, 1]
    assert np.all(np.diff(ratio) < 0)


def test_the_break_even_is_where_the_latencies_cross() -> None:
    result = planner.plan(KNEE, [1.0], [1, 2, 3, 4, 5], [0.7])
    for ik, rate in enumerate(result.break_even_rate_rps[0]):
        if not math.isfinite(rate):
            continue
        below = planner.plan(KNEE, [rate * 0.99], [int(result.draft_lengths[ik])], [0.7])
        above = planner.plan(KNEE, [rate * 1.01], [int(result.draft_lengths[ik])], [0.7])
        assert (below.speedup[0, 0, 0] - 1.0) * (above.speedup[0, 0, 0] - 1.0) < 0


def test_steps_past_the_knee_cost_more_in_the_engine_schedule() -> None:
    sizes = np.asarray([1.0, 64.0, 128.0, 256.0])
    plain, kneed = step_times(BASE, [3], sizes), step_times(KNEE, [3], sizes)
    rows = sizes[:, None] * np.asarray([1.0, 4.0])[None, :]
    np.testing.assert_allclose(kneed - plain, 2e-5 * np.maximum(rows - 256.0, 0.0), rtol=1e-12, atol=1e-15)
    assert knee.step_excess_s(KNEE, 300.0) == pytest.approx(2e-5 * 44)


def test_fit_knee_finds_a_knee_in_priced_steps_and_holds_the_floor() -> None:
    """Steps flat to 192 rows then 20 us a row: the fit finds that knee; a higher floor holds the slope."""
    points = [(b, q, s) for b in (1, 2, 4, 8, 16, 32, 64, 128) for q in (1, 2, 4, 6) for s in (256, 2048)]
    values = [6e-3 + b * s * 4e-8 + 1e-6 * b * q + 2e-5 * max(b * q - 192, 0) for b, q, s in points]
    found = fit_knee(points, values)
    assert found is not None and found.knee_tokens == 192.0
    assert found.target[2] + found.per_token_above_knee_s == pytest.approx(2.1e-5, rel=0.02)
    assert found.mean_error_pct < 0.5
    held = fit_knee(points, values, floor_s=3e-5)
    assert held is not None and held.target[2] + held.per_token_above_knee_s >= 3e-5 - 1e-12
    # a straight line needs no knee
    straight = [6e-3 + b * s * 4e-8 + 1e-5 * b * q for b, q, s in points]
    assert fit_knee(points, straight) is None
    assert len(step_rows(points)) == len(points)


def test_derived_steps_cost_at_least_what_the_matrix_units_need() -> None:
    """Llama-3.1-8B on an H100: 2 x 7.5e9 matmul weights per row at 989 TFLOP/s is 15.2 us; no derived file
    prices a row past its knee below that."""
    from sdplan.derive import DeriveRequest, Models, Pricer, load_aic

    request = DeriveRequest(target_model="meta-llama/Llama-3.1-8B-Instruct", system="h100_sxm", method="ngram")
    models = Models()
    try:
        pricer = Pricer(load_aic(), request, models)
        floor = pricer.row_compute_floor_s()
    finally:
        models.close()
    assert floor == pytest.approx(2 * 7_504_658_432 / 989e12, rel=1e-6)
    # the database's own compute-bound rate of the same GEMMs (what accuracy_silicon screens rows by) is slower
    # than the peak, and not absurdly so: a model of the GEMMs' rows, not of something else
    database = pricer.target_bound.gemm_row_s
    assert floor < database < 3 * floor
    for name in ("h100-sxm_llama-3.1-8b_eagle3_derived", "h100-sxm_llama-3.1-8b_llama-3.2-1b_derived",
                 "h100-sxm_llama-3.1-8b_ngram_derived"):
        target = resolve_calibration(name).document["step_model"]["target"]
        assert target["per_query_token_s"] + target["per_token_above_knee_s"] >= floor * (1 - 1e-5), name


def _shipped_dense_derived() -> list[str]:
    from sdplan.calibration import shipped_calibrations

    return [path.stem for path in shipped_calibrations()
            if path.stem.endswith("_derived") and "moe" not in resolve_calibration(path.stem).document]


@pytest.mark.parametrize("name", _shipped_dense_derived())
def test_no_shipped_step_costs_less_than_its_kernels_need(name: str) -> None:
    """Every step a shipped dense file prices, B = 1-512 sequences and k = 0-8 (up to 4,608 token rows) at the
    reference workload's mean context, takes at least what its kernels need at the GPU's peaks: its GEMMs the
    longer of the target's rows, B (k + 1) x 2 P / (TP F), and reading their weights, W / BW; then attention
    reading the KV cache, B s kv / BW. Physics, whatever the database says."""
    from sdplan.derive import DeriveRequest, Models, Pricer, load_aic

    cal = resolve_calibration(name)
    provenance, derivation = cal.document["provenance"], cal.document["derivation"]
    request = DeriveRequest(target_model=provenance["target_model"], system=derivation["system"], method="ngram",
                            tensor_parallel_size=int(provenance.get("tensor_parallel_size", 1)),
                            precision=derivation.get("precision", "bf16"), backend=derivation["backend"])
    batches = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512], dtype=np.float64)
    context = 1024 + 512 / 2
    models = Models()
    try:
        pricer = Pricer(load_aic(), request, models)
        floor = pricer.row_compute_floor_s()
        weights_s, kv_s = pricer.memory_floor_s(1, context)
    finally:
        models.close()
    assert floor > 0.0 and weights_s > 0.0 and kv_s > 0.0
    ks = list(range(1, 9))
    rows = batches[:, None] * (1.0 + np.array([0, *ks]))[None, :]
    kernels = np.maximum(rows * floor, weights_s) + batches[:, None] * kv_s
    assert np.all(step_times(cal.coefficients_at(1024, 512), ks, batches) >= kernels)


# ----------------------------------------------------------------------------- the engine's caps bound throughput

def test_each_option_saturates_at_its_own_cap() -> None:
    """A cap of N requests bounds an option at lambda_N = N / (C1_N + W(lambda_N) + N C2_N); past it the queue
    grows."""
    caps = [256.0, 120.0]
    capped = planner.plan(BASE, [1.0], [3], [0.7], batch_caps=caps)

    def wait(rate: float) -> float:
        return float(knee.prefill_wait_s(BASE.c2p_s, BASE.prompt_cv, rate))

    c1_d, c2_d = model.baseline_demand(BASE)
    base_sat = float(capped.baseline_saturation_rate_rps)
    assert base_sat < 1 / c2_d and base_sat < 256 / (c1_d + 256 * c2_d)  # the wait lowers the cap's rate
    assert base_sat * (c1_d + wait(base_sat) + 256 * c2_d) == pytest.approx(256)
    c1, c2 = float(capped.c1_s[0, 0]), float(capped.c2_s[0, 0])
    sd_sat = float(capped.saturation_rate_rps[0, 0])
    assert sd_sat * (c1 + wait(sd_sat) + 120 * c2) == pytest.approx(120)
    assert str(capped.saturation_limit[0, 0]) == "cap"
    sat = float(capped.saturation_rate_rps[0, 0])
    below, past = planner.plan(BASE, [sat * 0.999, sat * 1.001], [3], [0.7], batch_caps=caps).latency_s[0, :, 0]
    assert math.isfinite(below) and math.isinf(past)
    # without caps the same option saturates only at 1/C2
    free = planner.plan(BASE, [1.0], [3], [0.7])
    assert free.saturation_rate_rps[0, 0] == pytest.approx(1 / c2) and str(free.saturation_limit[0, 0]) == "compute"


@pytest.mark.parametrize("caps", [[256.0, 0.0], [0.0, 120.0], [0.5, 0.0]])
def test_a_cap_below_one_request_is_unstable_at_every_rate(caps: list[float]) -> None:
    """A KV cache that holds no whole request admits nobody: unstable from rate 0, utilisation inf, never 0/0.

    The suite turns warnings into errors, so a 0/0 at rate 0 fails here as it failed the fuzzed CLI.
    """
    capped = planner.plan(BASE, [0.0, 1.0], [3], [0.7], batch_caps=caps)
    base_full, sd_full = caps[0] < 1.0, caps[1] < 1.0
    assert np.isinf(capped.baseline_latency_s).all() == base_full
    assert np.isinf(capped.baseline_utilisation).all() == base_full
    assert np.isinf(capped.latency_s[0, :, 0]).all() == sd_full
    assert np.isinf(capped.utilisation[0, :, 0]).all() == sd_full
    if not sd_full:
        assert math.isfinite(capped.latency_s[0, 0, 0])


def test_a_derived_drafts_memory_shrinks_only_sds_cap() -> None:
    """The default file: no SD has the GPU's memory to itself (its KV cache keeps 336 requests running, under vLLM's
    max_num_seqs of 1024), SD shares it with the 1B draft's weights and KV cache and each request holds k lookahead
    slots too."""
    from sdplan.inputs.serving import LimitOptions, resolve_limits

    calibration = resolve_calibration(None)
    derivation = calibration.records.derivation
    assert derivation is not None and derivation.kv_cache_tokens_without_draft is not None
    assert derivation.kv_cache_tokens_without_draft > derivation.kv_cache_tokens
    limits = resolve_limits(calibration, None, LimitOptions(), [0, 3], 1024, 512)
    caps = limits.caps([3])
    # each request holds its prompt, half its output and half a 16-token block on average (vLLM fills as they run)
    assert caps[0] == derivation.kv_cache_tokens_without_draft // (1024 + 512 / 2 + 8) == 336
    assert caps[1] == derivation.kv_cache_tokens // (1024 + 512 / 2 + 8 + 3) == 254
    assert "KV cache of" in limits.cap_phrase(3) and "KV cache of" in limits.cap_phrase(0)


def test_a_knee_needs_both_keys() -> None:
    import copy

    from sdplan.calibration import parse_calibration
    from sdplan.errors import InputFileError

    document = copy.deepcopy(resolve_calibration(None).document)
    del document["step_model"]["target"]["per_token_above_knee_s"]
    with pytest.raises(InputFileError, match="step_model.target.per_token_above_knee_s.*add per_token_above_knee_s"):
        parse_calibration(document, "half-knee.toml")
    document["step_model"]["target"]["per_token_above_knee_s"] = 1e-5
    document["step_model"]["engine"] = {"step_overhead_s": 2e-3}
    costs = parse_calibration(document, "whole.toml").coefficients_at(1024, 512)
    without = copy.deepcopy(document)
    without["step_model"]["engine"]["step_overhead_s"] = 0.0
    bare = parse_calibration(without, "bare.toml").coefficients_at(1024, 512)
    # the engine's step overhead is paid once per step, SD or not, and by no other request
    assert costs.baseline_c1_step_s - bare.baseline_c1_step_s == pytest.approx(2e-3)
    assert costs.c1v_s - bare.c1v_s == pytest.approx(2e-3)
    assert (costs.baseline_c2_step_s, costs.c2v_s) == (bare.baseline_c2_step_s, bare.c2v_s)


def test_the_prefill_overhead_is_the_requests_own() -> None:
    """``prefill_overhead_s`` adds to the request's own prefill (its TTFT and latency), not to what its prefill
    costs the others (c2p) nor to any step; a negative one is refused naming the key."""
    import copy

    from sdplan.calibration import parse_calibration
    from sdplan.errors import InputFileError
    from sdplan.latency.model import time_to_first_token

    document = copy.deepcopy(resolve_calibration(None).document)
    document["step_model"]["engine"]["prefill_overhead_s"] = 0.05
    costs = parse_calibration(document, "with.toml").coefficients_at(1024, 512)
    document["step_model"]["engine"]["prefill_overhead_s"] = 0.0
    bare = parse_calibration(document, "bare.toml").coefficients_at(1024, 512)
    assert costs.c1p_s - bare.c1p_s == pytest.approx(0.05)
    assert costs.server_prefill_s == 0.05 and bare.server_prefill_s == 0.0  # the simulator's share of c1p
    assert dataclasses.replace(costs, c1p_s=bare.c1p_s, server_prefill_s=0.0) == bare
    assert float(time_to_first_token(costs) - time_to_first_token(bare)) == pytest.approx(0.05)
    document["step_model"]["engine"]["prefill_overhead_s"] = -0.01
    with pytest.raises(InputFileError, match="prefill_overhead_s"):
        parse_calibration(document, "negative.toml")
    # either overhead stands alone: the other is then 0
    document["step_model"]["engine"] = {"prefill_overhead_s": 0.05}
    alone = parse_calibration(document, "alone.toml").coefficients_at(1024, 512)
    assert alone.c1p_s == pytest.approx(costs.c1p_s)
    assert alone.baseline_c1_step_s == pytest.approx(bare.baseline_c1_step_s - resolve_calibration(None).document[
        "step_model"]["engine"]["step_overhead_s"])


def test_show_prints_the_engines_overheads(sdplan) -> None:
    """``show`` names both engine overheads of a derived file, with their values."""
    engine = resolve_calibration(None).document["step_model"]["engine"]
    assert engine["prefill_overhead_s"] > 0.0
    table = sdplan("show").stdout
    for key in ("step_overhead_s", "prefill_overhead_s"):
        row = next(line for line in table.splitlines() if f" {key} " in line)
        assert f"{engine[key]:.6g}" in row
    shown = json.loads(sdplan("show", "--format", "json").stdout)
    assert shown["document"]["step_model"]["engine"] == engine


def test_the_simulator_admits_a_request_with_its_lookahead_slots() -> None:
    """An SD request holds p + g + k tokens of KV cache; a cache one token short never admits it."""
    from sdplan.errors import InvalidValueError
    from sdplan.simulate import SimulationConfig

    fits = SimulationConfig(rate_rps=1.0, draft_length=3, position_rates=(0.7, 0.49, 0.343), requests=100,
                            prompt_tokens=100, output_tokens=50, kv_cache_tokens=153.0)
    fits.validate()
    with pytest.raises(InvalidValueError, match=r"153 tokens \(prompt \+ output \+ k\)"):
        dataclasses.replace(fits, kv_cache_tokens=152.0).validate()
    dataclasses.replace(fits, draft_length=0, position_rates=(), kv_cache_tokens=150.0).validate()


def test_a_closed_loop_past_the_cap_waits_for_admission() -> None:
    """N clients on an engine that holds N_cap: each request takes N L_cap / N_cap, TTFT adds the wait."""
    from sdplan.fitting.validation import predict_latency, predict_ttft
    from sdplan.runs import BenchmarkRun

    run = BenchmarkRun(source="closed", draft_length=0, prompt_tokens=1024, output_tokens=512, alpha=None,
                       mean_e2e_latency_s=10.0, concurrency=200, mean_ttft_s=1.0, requested_rate_rps=None,
                       achieved_rate_rps=20.0)
    held = dataclasses.replace(run, concurrency=50)
    c = BASE
    at_cap = predict_latency(c, held)
    assert predict_latency(c, run, batch_cap=50) == pytest.approx(at_cap * 200 / 50)
    assert predict_latency(c, run, batch_cap=400) == pytest.approx(predict_latency(c, run))
    latency = predict_latency(c, run, batch_cap=50)
    wait = latency - at_cap
    assert predict_ttft(c, run, latency, batch_cap=50) == pytest.approx(predict_ttft(c, held, at_cap) + wait)


def test_the_simulators_goodput_choice_pays_the_knee() -> None:
    """Past the knee the k + 1 rows of SD cost more per step: the per-step policy switches SD off sooner."""
    from sdplan.latency.policy import step_choices

    expected, costs = [1.0, 2.5], [(0.010, 0.0001), (0.012, 0.00012)]
    plain = step_choices(expected, costs, 300)
    kneed = step_choices(expected, costs, 300, [1.0, 4.0], (128.0, 5e-4))
    assert plain[300] == 1 and kneed[300] == 0  # at 300 sequences SD's 1,200 rows are far past the knee
    assert kneed[1] == plain[1] == 1  # one sequence: 4 rows, below the knee, nothing changes
