"""The simulator against queueing theory, Little's law, the analytic model, and itself."""

from __future__ import annotations

import json
import math

import numpy
import pytest

from sdplan.errors import ExitStatus, InvalidValueError
from sdplan.inputs.serving import KvHold, kv_hold
from sdplan.latency import model
from sdplan.latency.coefficients import Coefficients
from sdplan.simulate import SimulationConfig, cycles_needed, simulate

C = Coefficients(c1p_s=0.04, c2p_s=0.03, c1v_s=0.0072, c2v_s=1e-4, c1d_s=0.0012, c2d_s=5.6e-5,
                 baseline_c1_step_s=0.0067, baseline_c2_step_s=1e-4, prompt_tokens=1024.0, output_tokens=512.0)


def rates(alpha: float, k: int) -> tuple[float, ...]:
    return tuple(alpha ** (j + 1) for j in range(k))


@pytest.mark.parametrize(("alpha", "k"), [(0.5, 1), (0.8, 3), (0.9, 6), (1.0, 4), (0.0, 2)])
def test_acceptance_sampling_reproduces_expected_tokens(alpha: float, k: int) -> None:
    rng = numpy.random.default_rng(0)
    # one very long request: tokens / cycles converges to E(alpha, k)
    cycles, expected = cycles_needed(numpy.array([400_000]), rates(alpha, k), rng)
    assert expected == pytest.approx(1 + sum(rates(alpha, k)))
    assert 400_000 / cycles[0] == pytest.approx(expected, rel=0.01)


def test_single_server_queue_matches_m_d_1() -> None:
    """k = 0, step time independent of batch, batch cap 1: an M/D/1 queue (Pollaczek-Khinchine)."""
    c = Coefficients(c1p_s=0.05, c2p_s=0.0, c1v_s=0.0, c2v_s=0.0, c1d_s=0.0, c2d_s=0.0,
                     baseline_c1_step_s=0.01, baseline_c2_step_s=0.0, prompt_tokens=100.0, output_tokens=51.0)
    service = 0.05 + 50 * 0.01  # own prefill, then 50 decode steps
    for rho in (0.3, 0.7):
        lam = rho / service
        waits = []
        for seed in range(4):
            run = simulate(c, SimulationConfig(rate_rps=lam, draft_length=0, position_rates=(), requests=20_000,
                                               prompt_tokens=100, output_tokens=51, max_num_seqs=1),
                           numpy.random.default_rng(seed))
            waits.append(run.e2e_s.mean())
        theory = service + rho * service / (2 * (1 - rho))
        assert numpy.mean(waits) == pytest.approx(theory, rel=0.03), rho


@pytest.mark.parametrize("load", [0.2, 0.5, 0.7])
def test_littles_law_on_the_trace_and_agreement_with_the_model(load: float) -> None:
    c1, c2 = model.speculative_demand(C, 0.8, 3)
    lam = load / float(c2)
    run = simulate(C, SimulationConfig(rate_rps=lam, draft_length=3, position_rates=rates(0.8, 3), requests=20_000),
                   numpy.random.default_rng(1))
    little = run.arrival_rate_rps * run.e2e_s.mean()
    assert run.mean_in_system == pytest.approx(little, rel=0.05)  # time average vs lambda * W, measured separately
    analytic = float(model.mean_latency(c1, c2, lam))
    # stated tolerance: the mean model holds within 5% up to 70% utilisation (batch fluctuations grow beyond)
    assert run.e2e_s.mean() == pytest.approx(analytic, rel=0.05)


def test_batch_cap_is_where_the_mean_model_breaks() -> None:
    c1, c2 = model.baseline_demand(C)
    lam = 0.9 / c2  # needs ~ hundreds in flight
    capped = simulate(C, SimulationConfig(rate_rps=lam, draft_length=0, position_rates=(), requests=8000,
                                          max_num_seqs=32), numpy.random.default_rng(2))
    assert capped.e2e_s.mean() > 1.5 * float(model.mean_latency(c1, c2, lam))
    assert capped.queue_s.mean() > 1.0 and capped.mean_running <= 32 + 1e-9


def test_same_seed_same_result_and_percentiles_ordered() -> None:
    config = SimulationConfig(rate_rps=5.0, draft_length=2, position_rates=rates(0.7, 2), requests=3000,
                              arrival_cv=2.0)
    first = simulate(C, config, numpy.random.default_rng(7))
    second = simulate(C, config, numpy.random.default_rng(7))
    assert numpy.array_equal(first.e2e_s, second.e2e_s)
    stats = [first.statistic("e2e", s) for s in ("p50", "p90", "p99")]
    assert stats == sorted(stats) and first.statistic("e2e", "mean") > 0
    other = simulate(C, config, numpy.random.default_rng(8))
    assert not numpy.array_equal(first.e2e_s, other.e2e_s)


def test_invalid_configurations() -> None:
    with pytest.raises(InvalidValueError):
        simulate(C, SimulationConfig(rate_rps=0.0, draft_length=0, position_rates=()), numpy.random.default_rng(0))
    with pytest.raises(InvalidValueError, match="draft length"):
        simulate(C, SimulationConfig(rate_rps=1.0, draft_length=3, position_rates=(0.5,)), numpy.random.default_rng(0))
    # 1e308 req/s: every arrival gap underflows to one instant (the fuzz's exit 70 in the steady-state fit)
    # 5.7e-289 req/s: the arrival times overflow (the fuzz's exit 70 in check --simulate)
    for rate in (1e308, math.inf, math.nan, 5.671e-289):
        with pytest.raises(InvalidValueError, match="1e-09 to 1e\\+09 req/s"):
            simulate(C, SimulationConfig(rate_rps=rate, draft_length=0, position_rates=()), numpy.random.default_rng(0))


def test_cli_simulate_of_an_absurd_rate_is_a_usage_error(sdplan) -> None:
    result = sdplan("simulate", "-r", "1e308", "--requests", "100", "--seeds", "1", "-f", "json")
    assert result.exit_code == ExitStatus.USAGE and "1e-09 to 1e+09 req/s" in result.stderr
    tiny = sdplan("check", "--simulate", "-r", "5.671e-289", "--slo", "e2e:p99<=10s", "--requests", "100",
                  "--seeds", "1")
    assert tiny.exit_code == ExitStatus.USAGE and "1e-09 to 1e+09 req/s" in tiny.stderr


def test_cli_simulate_formats(sdplan, tmp_path) -> None:
    args = ["simulate", "--acceptance", "0.8", "--rates", "3,8", "--requests", "2000", "--seeds", "2"]
    table = sdplan(*args, "--ascii")
    assert table.exit_code == 0, table.output
    assert "p99" in table.stdout and "Little's law" in table.stdout and "analytic mean E2E" in table.stdout
    doc = json.loads(sdplan(*args, "-f", "json").stdout)
    assert doc["command"] == "simulate" and len(doc["rates"]) == 2
    stats = doc["rates"][0]["statistics"]
    assert stats["e2e_p99_s"]["value"] >= stats["e2e_p50_s"]["value"]
    assert stats["e2e_mean_s"]["ci95_half_width"] is not None
    assert abs(doc["rates"][0]["simulated_vs_analytic_pct"]) < 10
    csv_text = sdplan(*args, "-f", "csv").stdout
    assert csv_text.splitlines()[0] == "request_rate_rps,draft_length_tokens,metric,statistic,value_s,ci95_half_width_s"
    # deterministic for a seed
    assert sdplan(*args, "-f", "csv").stdout == csv_text
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("prompt_tokens,output_tokens,weight\n256,128,3\n2048,512,1\n")
    assert sdplan("simulate", "--rates", "2", "--requests", "1000", "--seeds", "1", "--lengths-file", str(lengths),
                  "--draft-length", "off").exit_code == 0
    svg = tmp_path / "cdf.svg"
    plotted = sdplan(*args, "--plot", "--plot-file", str(svg))
    assert plotted.exit_code == 0 and "E2E latency CDF" in plotted.stdout and "fraction of requests" in svg.read_text()


def test_check_percentile_slos_with_simulate(sdplan) -> None:
    base = ["check", "--rate", "6", "--acceptance", "0.8", "--requests", "3000", "--seeds", "2"]
    refused = sdplan(*base, "--slo", "e2e:p99<=60s")
    assert refused.exit_code == ExitStatus.USAGE and "check --simulate" in refused.stderr
    passed = sdplan(*base, "--slo", "e2e:p99<=60s", "--slo", "ttft:p90<=1s", "--simulate", "-f", "json")
    assert passed.exit_code == ExitStatus.OK, passed.output
    doc = json.loads(passed.stdout)
    assert doc["evaluated_by"].startswith("simulated") and doc["verdicts"][0]["statistic"] == "p99"
    failed = sdplan(*base, "--slo", "e2e:p99<=1s", "--simulate")
    assert failed.exit_code == ExitStatus.SLO_VIOLATED and "(simulated)" in failed.stderr


def test_search_rate_bisection() -> None:
    from sdplan.planning.capacity import search_rate

    rate, binding = search_rate(lambda r: None if r <= 3.0 else "e2e:p99<=1s", 10.0, iterations=12)
    assert 3.0 - 10.0 / 2**12 <= rate <= 3.0 and binding == "e2e:p99<=1s"
    assert search_rate(lambda r: None, 10.0) == (10.0, None)
    assert search_rate(lambda r: "x", 10.0)[0] == 0.0


def test_capacity_simulate_with_percentiles(sdplan) -> None:
    base = ["--acceptance", "0.8", "--requests", "1500", "--seeds", "1"]
    refused = sdplan("capacity", "--slo", "e2e:p99<=6s", *base)
    assert refused.exit_code == ExitStatus.USAGE
    result = sdplan("capacity", "--slo", "e2e:p99<=6s", "-k", "3", "--simulate", *base, "-f", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["evaluated_by"].startswith("simulated")
    sd = next(o for o in doc["options"] if o["option"] == "k=3")
    assert 0 < sd["max_rate_under_slo_rps"] < sd["saturation_rate_rps"]
    # the same simulation at that rate meets the SLO (the search returns the last rate found feasible)
    check = sdplan("check", "--rate", repr(sd["max_rate_under_slo_rps"]), "--slo", "e2e:p99<=6s", "--draft-length", "3",
                   "--simulate", *base)
    assert check.exit_code == ExitStatus.OK, check.output


def test_goodput_policy_in_the_simulator() -> None:
    """Per-step adaptation by goodput: never much worse than the best static k, and its k falls with load."""
    from sdplan.planning import planner

    ks = list(range(1, 9))
    position = tuple(0.8 ** (j + 1) for j in range(8))
    mean_k = []
    for lam in (2.0, 9.0):
        best = int(planner.plan(C, [lam], ks, [0.8]).best_k[0, 0])
        static = simulate(C, SimulationConfig(rate_rps=lam, draft_length=best, position_rates=position[:best],
                                              requests=8000), numpy.random.default_rng(5))
        adaptive = simulate(C, SimulationConfig(rate_rps=lam, draft_length=8, position_rates=position, requests=8000,
                                                adaptive_draft_lengths=(0, *ks)), numpy.random.default_rng(5))
        assert adaptive.e2e_s.mean() <= static.e2e_s.mean() * 1.03
        mean_k.append(adaptive.mean_draft_length)
    assert mean_k[0] > mean_k[1] > 0


def test_cli_simulate_goodput(sdplan) -> None:
    result = sdplan("simulate", "--acceptance", "0.8", "--rates", "6", "--draft-length", "goodput", "--requests",
                    "2000", "--seeds", "2", "-f", "json")
    assert result.exit_code == 0, result.output
    rate = json.loads(result.stdout)["rates"][0]
    assert rate["policy"] == "goodput" and 1 <= rate["goodput_mean_draft_length_tokens"]["value"] <= 8
    assert sdplan("check", "--rate", "3", "--slo", "e2e:mean<=9s", "--draft-length", "goodput").exit_code == 2


def test_baseline_counts_g_minus_one_decode_steps_like_an_idle_engine() -> None:
    # Alone in the engine a request pays its prefill (which emits token 1) and g - 1 decode steps.
    g = 16
    c = Coefficients(c1p_s=0.04, c2p_s=0.03, c1v_s=0.0072, c2v_s=1e-4, c1d_s=0.0012, c2d_s=5.6e-5,
                     baseline_c1_step_s=0.0067, baseline_c2_step_s=1e-4, prompt_tokens=128.0, output_tokens=g)
    run = simulate(c, SimulationConfig(rate_rps=1e-3, draft_length=0, position_rates=(), requests=50,
                                       prompt_tokens=128, output_tokens=g), numpy.random.default_rng(3))
    alone = 0.04 + (g - 1) * 0.0067
    assert numpy.allclose(run.e2e_s, alone, rtol=1e-9)  # arrivals 1000 s apart never overlap
    c1_d, _ = model.baseline_demand(c)
    assert c1_d == pytest.approx(alone, rel=1e-12)


def test_the_servers_time_around_a_prefill_delays_the_request_not_the_engine() -> None:
    """``server_prefill_s`` is in ``c1p`` but no step waits for it: the engine's whole timeline moves by it, so at
    any load every request's TTFT and latency grow by exactly it and its queueing delay and TPOT do not change.
    The same seconds as engine time (in ``c1p`` alone) are paid only by an idle engine's pass, so at this load
    they add less than that to the mean latency, as the analytic model's ``c1p`` does not."""
    import dataclasses

    server = 0.02
    config = SimulationConfig(rate_rps=0.6 / float(model.speculative_demand(C, 0.8, 3)[1]), draft_length=3,
                              position_rates=rates(0.8, 3), requests=4_000)
    bare = simulate(C, config, numpy.random.default_rng(5))
    served = simulate(dataclasses.replace(C, c1p_s=C.c1p_s + server, server_prefill_s=server), config,
                      numpy.random.default_rng(5))
    assert numpy.allclose(served.ttft_s, bare.ttft_s + server, rtol=0, atol=1e-9)
    assert numpy.allclose(served.e2e_s, bare.e2e_s + server, rtol=0, atol=1e-9)
    assert numpy.allclose(served.queue_s, bare.queue_s, rtol=0, atol=1e-9)
    assert numpy.allclose(served.tpot_s, bare.tpot_s, rtol=0, atol=1e-9, equal_nan=True)
    engine = simulate(dataclasses.replace(C, c1p_s=C.c1p_s + server), config, numpy.random.default_rng(5))
    assert 0.0 < engine.e2e_s.mean() - bare.e2e_s.mean() < 0.5 * server


def test_token_budget_chunks_long_prefills_across_steps() -> None:
    # One request alone: prompt 4096 with a 1024-token budget takes 4 prefill steps, each a forward pass of an idle
    # engine (fixed part c1p - c2p, plus c2p/p per prompt token), so TTFT = 4 (c1p - c2p) + 4096 c2p / p.
    c = Coefficients(c1p_s=0.05, c2p_s=0.03, c1v_s=0.0072, c2v_s=1e-4, c1d_s=0.0012, c2d_s=5.6e-5,
                     baseline_c1_step_s=0.0067, baseline_c2_step_s=1e-4, prompt_tokens=4096.0, output_tokens=8.0)
    ttft = {}
    for budget in (1024, 4096, 8192):
        run = simulate(c, SimulationConfig(rate_rps=1e-3, draft_length=0, position_rates=(), requests=20,
                                           prompt_tokens=4096, output_tokens=8, max_num_batched_tokens=budget),
                       numpy.random.default_rng(0))
        ttft[budget] = float(run.ttft_s.mean())
    assert ttft[4096] == pytest.approx(0.05, rel=1e-9) and ttft[8192] == pytest.approx(0.05, rel=1e-9)
    assert ttft[1024] == pytest.approx(4 * 0.02 + 0.03, rel=1e-9)
    # Under load a smaller budget spreads prefills over more steps: different (longer) TTFT.
    loaded = [simulate(C, SimulationConfig(rate_rps=8.0, draft_length=0, position_rates=(), requests=3000,
                                           max_num_batched_tokens=b), numpy.random.default_rng(4)).ttft_s.mean()
              for b in (512, 8192)]
    assert loaded[0] > 1.2 * loaded[1]


def test_kv_budget_refuses_requests_that_never_fit_and_limits_the_batch() -> None:
    with pytest.raises(InvalidValueError, match="does not fit the KV budget"):
        simulate(C, SimulationConfig(rate_rps=1.0, draft_length=0, position_rates=(), requests=100,
                                     kv_cache_tokens=1), numpy.random.default_rng(0))
    # Room for 4 requests of 1536 tokens: the running batch never exceeds 4.
    run = simulate(C, SimulationConfig(rate_rps=2.0, draft_length=0, position_rates=(), requests=2000,
                                       kv_cache_tokens=4 * 1536 + 100), numpy.random.default_rng(0))
    assert run.mean_running <= 4 + 1e-9 and run.queue_s.mean() > 0.1


def test_past_saturation_is_flagged_not_steady() -> None:
    _, c2 = model.baseline_demand(C)
    stable = simulate(C, SimulationConfig(rate_rps=0.5 / c2, draft_length=0, position_rates=(), requests=4000),
                      numpy.random.default_rng(1))
    overloaded = simulate(C, SimulationConfig(rate_rps=1.3 / c2, draft_length=0, position_rates=(), requests=4000),
                          numpy.random.default_rng(1))
    assert stable.steady and not overloaded.steady


def test_search_root_never_overstates_and_brackets_from_a_far_guess() -> None:
    from sdplan.planning.capacity import Excess, search_root

    root = 7.3
    for guess in (0.5, 7.0, 7.5, 30.0):
        rate, binding, count = search_root(lambda r: Excess(r / root - 1.0, "x"), guess, 50.0, tolerance=0.01)
        assert root * 0.99 <= rate <= root and binding == "x" and count <= 14
    unstable = lambda r: Excess(math.inf if r > 4.0 else r / 3.0 - 1.0, "e2e")  # noqa: E731
    rate, _, _ = search_root(unstable, 8.0, 10.0)
    assert 3.0 * 0.99 <= rate <= 3.0
    assert search_root(lambda r: Excess(-0.5, None), 2.0, 10.0)[:2] == (10.0, None)


def test_capacity_simulate_with_a_lower_bound_slo(sdplan) -> None:
    # throughput>= holds only above some rate; it must not drive the search to 0.
    base = ["capacity", "--slo", "e2e:mean<=20s", "--acceptance", "0.8", "-k", "3", "--simulate", "--requests",
            "1500", "--seeds", "1", "-f", "json"]
    result = sdplan(*base, "--slo", "throughput>=3584tok/s")
    assert result.exit_code == 0, result.output
    options = {o["option"]: o for o in json.loads(result.stdout)["options"]}
    assert options["k=3"]["max_rate_under_slo_rps"] >= 3584 / 512 and options["off"]["max_rate_under_slo_rps"] > 7
    impossible = sdplan(*base, "--slo", "throughput>=50000tok/s")
    assert impossible.exit_code == ExitStatus.INFEASIBLE
    options = {o["option"]: o for o in json.loads(impossible.stdout)["options"]}
    assert options["k=3"]["binding_slo"] == "throughput>=50000tok/s"


def test_check_and_capacity_simulate_use_the_lengths_file_workload(sdplan, tmp_path) -> None:
    # Coefficients, the stability gate and the analytic comparison come from the histogram's means.
    short = tmp_path / "short.csv"
    short.write_text("prompt_tokens,output_tokens,weight\n128,64,1\n")
    args = ["--rate", "20", "--draft-length", "3", "--acceptance", "0.8", "--requests", "3000", "--seeds", "2",
            "--slo", "e2e:mean<=100s", "--lengths-file", str(short)]
    result = sdplan("check", "--simulate", *args, "-f", "json")
    assert result.exit_code == ExitStatus.OK, result.output
    doc = json.loads(result.stdout)
    assert doc["workload"]["prompt_tokens"] == 128 and doc["workload"]["output_tokens"] == 64
    assert doc["verdicts"][0]["predicted_s"] < 2.0
    analytic = sdplan("check", *args, "-f", "json")
    assert analytic.exit_code == ExitStatus.OK and json.loads(analytic.stdout)["workload"]["prompt_tokens"] == 128
    cap = sdplan("capacity", "--slo", "e2e:p99<=2s", "-k", "3", "--acceptance", "0.8", "--simulate", "--requests",
                 "1500", "--seeds", "1", "--lengths-file", str(short), "-f", "json")
    assert cap.exit_code == 0, cap.output
    assert json.loads(cap.stdout)["workload"]["prompt_tokens"] == 128


def test_cli_simulate_flags_runs_past_saturation(sdplan) -> None:
    from sdplan.calibration import resolve_calibration

    # 30% above the default calibration's no-SD saturation rate, so the queue grows without bound
    saturation = 1.0 / model.baseline_demand(resolve_calibration(None).coefficients_at(1024, 512))[1]
    past = round(1.3 * saturation)
    result = sdplan("simulate", "--acceptance", "0.8", "--rates", f"4,{past}", "--draft-length", "off",
                    "--requests", "3000", "--seeds", "1", "-f", "json")
    assert result.exit_code == 0, result.output
    rates = json.loads(result.stdout)["rates"]
    assert [r["steady_state"] for r in rates] == [True, False]
    assert f"not at steady state at {past} req/s" in result.stderr
    too_big = sdplan("simulate", "--rates", "2", "--kv-cache-tokens", "1", "--requests", "100")
    assert too_big.exit_code == ExitStatus.USAGE and "does not fit the KV budget" in too_big.stderr


def test_token_budget_below_the_batch_cap_is_refused_like_vllm() -> None:
    with pytest.raises(InvalidValueError, match="max_num_batched_tokens"):
        simulate(C, SimulationConfig(rate_rps=1.0, draft_length=0, position_rates=(), requests=100,
                                     max_num_batched_tokens=1), numpy.random.default_rng(0))


def test_goodput_step_table_picks_the_per_step_argmax_on_shipped_calibrations() -> None:
    """The simulator looks the goodput policy's k up by batch size: the table must equal scoring every option."""
    from pathlib import Path

    from sdplan.calibration import resolve_calibration
    from sdplan.latency.policy import step_choices

    names = sorted(path.stem for path in (Path(__file__).resolve().parent.parent / "calibrations").glob("*.toml"))
    assert len(names) >= 5
    batches = numpy.arange(0, 601)
    checked = 0
    for name in names:
        calibration = resolve_calibration(name)
        for prompt_tokens, output_tokens in ((128, 64), (1024, 512), (8192, 256)):
            c = calibration.coefficients_at(prompt_tokens, output_tokens)
            for alpha in (0.3, 0.6, 0.8, 0.95):
                for options in ((0, *range(1, 9)), (1, 2, 4, 8), (0, 3)):
                    costs = [(c.c1v_s + o * c.c1d_s, c.c2v_s + o * c.c2d_s) if o else
                             (c.baseline_c1_step_s, c.baseline_c2_step_s) for o in options]
                    expected = [1.0 + sum(alpha ** (j + 1) for j in range(o)) for o in options]
                    table = step_choices(expected, costs, int(batches[-1]))
                    scheduled = numpy.maximum(batches, 1)[:, None]
                    fixed = numpy.array([f for f, _ in costs])
                    per_sequence = numpy.array([s for _, s in costs])
                    goodput = numpy.array(expected) / (fixed + (scheduled - 1) * per_sequence)
                    reference = numpy.argmax(goodput, axis=1)  # first maximum: ties go to the lower index
                    assert table == reference.tolist(), (name, prompt_tokens, output_tokens, alpha, options)
                    checked += 1
    assert checked == len(names) * 36


@pytest.mark.parametrize("block", [1, 7, 1000])
def test_goodput_policy_results_do_not_depend_on_the_uniform_block(monkeypatch: pytest.MonkeyPatch,
                                                                   block: int) -> None:
    """Drawing uniforms ahead in blocks consumes the stream exactly as drawing each leap's cycles on its own.

    A block of 1 draws every leap's uniforms when the leap needs them, so
    this compares the buffered stream against unbuffered draws, across block
    boundaries, mixed draft lengths (the token cache per block) and SD off.
    The per-cycle sampler is what outputs too long for the stretch tables
    use; a table limit of 0 selects it here.
    """
    from sdplan.simulate import sampling as simulator

    monkeypatch.setattr(simulator, "STRETCH_TABLE_CELLS", 0)

    position = rates(0.8, 8)
    lengths = numpy.random.default_rng(3).integers(1, 700, 1500).astype(float)
    configs = [
        SimulationConfig(rate_rps=7.0, draft_length=8, position_rates=position, requests=1500,
                         adaptive_draft_lengths=(0, *range(1, 9)), output_tokens=lengths),
        SimulationConfig(rate_rps=3.0, draft_length=6, position_rates=(0.9, 0.7, 0.75, 0.5, 0.55, 0.3),
                         requests=1500, adaptive_draft_lengths=(0, 2, 6), max_num_seqs=32,
                         max_num_batched_tokens=512),
    ]
    default = [simulate(C, config, numpy.random.default_rng(11)) for config in configs]
    monkeypatch.setattr(simulator, "UNIFORM_BLOCK", block)
    for config, expected in zip(configs, default):
        run = simulate(C, config, numpy.random.default_rng(11))
        assert 0 < run.mean_draft_length < config.draft_length
        for field in ("e2e_s", "ttft_s", "tpot_s", "queue_s"):
            numpy.testing.assert_array_equal(getattr(run, field), getattr(expected, field))
        assert (run.duration_s, run.mean_draft_length) == (expected.duration_s, expected.mean_draft_length)


def test_a_prompt_of_10_8_tokens_is_prefilled_in_leaps_with_the_same_times() -> None:
    # Alone, a 10^8-token prompt under an 8192-token budget takes ceil(10^8 / 8192) = 12208 chunked-prefill steps of
    # an idle engine: TTFT = 12208 (c1p - c2p) + 10^8 c2p / p. The simulator leaps over the identical steps.
    prompt = 100_000_000
    c = Coefficients(c1p_s=0.05, c2p_s=0.03, c1v_s=0.0072, c2v_s=1e-4, c1d_s=0.0012, c2d_s=5.6e-5,
                     baseline_c1_step_s=0.0067, baseline_c2_step_s=1e-4, prompt_tokens=1024.0, output_tokens=8.0)
    run = simulate(c, SimulationConfig(rate_rps=1e-9, draft_length=0, position_rates=(), requests=10,
                                       prompt_tokens=prompt, output_tokens=8), numpy.random.default_rng(0))
    assert run.ttft_s == pytest.approx(math.ceil(prompt / 8192) * 0.02 + prompt * 0.03 / 1024, rel=1e-9)


def test_prefill_leaps_beside_running_sequences_agree_between_fixed_and_adaptive_paths() -> None:
    # With every draft accepted both decode paths are deterministic, and their prefill leaps are coded apart (the
    # fixed-k one stops before the next completion, the adaptive one at it and at arrivals): same times to 1e-9.
    config = dict(rate_rps=3.0, draft_length=2, position_rates=(1.0, 1.0), requests=400, prompt_tokens=20000,
                  output_tokens=64, max_num_batched_tokens=1024, max_num_seqs=64)
    fixed = simulate(C, SimulationConfig(**config), numpy.random.default_rng(1))
    adaptive = simulate(C, SimulationConfig(**config, adaptive_draft_lengths=(2,)), numpy.random.default_rng(1))
    assert fixed.e2e_s.mean() > 10.0  # past saturation: long prefills queue behind each other and beside decodes
    assert numpy.allclose(fixed.e2e_s, adaptive.e2e_s, rtol=1e-9)
    assert numpy.allclose(fixed.ttft_s, adaptive.ttft_s, rtol=1e-9)


@pytest.mark.parametrize("policy", ["best", "goodput"])
def test_cli_simulate_of_huge_prompts_ends(sdplan, policy: str) -> None:
    # the fuzz's case: 2,000 requests of 10^8 prompt tokens at 4 req/s (50 s before the prefill leaps)
    result = sdplan("simulate", "--rates", "4", "--requests", "2000", "--prompt-tokens", "100000000",
                    "--kv-cache-tokens", "1e12", "--draft-length", policy, "-f", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rates"][0]["steady_state"] is False


class _CountingRng:
    """A numpy Generator that counts the uniforms drawn through ``random``."""

    def __init__(self, seed: int) -> None:
        self.rng = numpy.random.default_rng(seed)
        self.drawn = 0

    def random(self, size=None):  # type: ignore[no-untyped-def]
        values = self.rng.random(size)
        self.drawn += int(numpy.size(values))
        return values

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.rng, name)


def test_goodput_policy_draws_about_the_cycles_it_runs() -> None:
    # 10 requests of 10^5 output tokens, each alone: about g/E = 29,748 cycles each at alpha 0.8, k = 4
    # (E = 3.3616). Drawing up to each request's whole horizon (10^5 cycles) per leap drew 3.4x that; the leap
    # now draws about what the next completion needs.
    alpha, k, g, n = 0.8, 4, 100_000, 10
    rng = _CountingRng(5)
    config = SimulationConfig(rate_rps=1e-6, draft_length=k, position_rates=rates(alpha, k), requests=n,
                              prompt_tokens=128, output_tokens=g, adaptive_draft_lengths=(k,))
    run = simulate(C, config, rng)  # type: ignore[arg-type]
    cycles = (g - 1) / sum(alpha**j for j in range(k + 1))
    assert run.tpot_s.size == n - 1  # every request finished (the first is warm-up)
    from sdplan.simulate import UNIFORM_BLOCK

    assert rng.drawn <= 1.3 * n * cycles + 2 * UNIFORM_BLOCK  # uniforms are drawn in blocks


# ----------------------------------------------------------------------------- the goodput policy's stretches

#: Coefficients whose goodput choice falls from k = 5 at one sequence to k = 1 at 19 (a steep draft cost per
#: sequence), so k changes often under load: about 1,500 times in 3,000 requests at 5 req/s.
STEEP = Coefficients(c1p_s=0.04, c2p_s=0.03, c1v_s=0.0072, c2v_s=4e-4, c1d_s=0.0008, c2d_s=4e-4,
                     baseline_c1_step_s=0.0067, baseline_c2_step_s=4e-4, prompt_tokens=256.0, output_tokens=128.0)


def steep_config(requests: int, rate_rps: float = 5.0) -> SimulationConfig:
    output = numpy.random.default_rng(3).integers(1, 300, requests).astype(float)
    return SimulationConfig(rate_rps=rate_rps, draft_length=8, position_rates=rates(0.8, 8), requests=requests,
                            prompt_tokens=256, output_tokens=output, adaptive_draft_lengths=(0, *range(1, 9)))


def test_goodput_policy_chooses_the_per_step_argmax_at_every_change_of_k() -> None:
    # (a) Every k the run switches to is the option of highest goodput E(k) / (f_k + (n - 1) s_k) at the sequences
    # n in that step, scored here from the coefficients, independently of the simulator's table.
    config = steep_config(3000)
    trace: list[tuple[int, int]] = []
    simulate(STEEP, config, numpy.random.default_rng(1), draft_trace=trace)
    position = rates(0.8, 8)
    expected = numpy.array([1 + sum(position[:k]) for k in range(9)])
    fixed = numpy.array([STEEP.baseline_c1_step_s] + [STEEP.c1v_s + k * STEEP.c1d_s for k in range(1, 9)])
    per_sequence = numpy.array([STEEP.baseline_c2_step_s] + [STEEP.c2v_s + k * STEEP.c2d_s for k in range(1, 9)])
    assert len(trace) > 500 and len({k for _, k in trace}) >= 4
    for sequences, k in trace:
        goodput = expected / (fixed + (max(sequences, 1) - 1) * per_sequence)
        assert k == int(numpy.argmax(goodput)), (sequences, k)
    assert all(a[1] != b[1] for a, b in zip(trace, trace[1:]))  # recorded only where k changes


def _paired_gaps(config: SimulationConfig, seeds: int) -> dict[str, tuple[float, float]]:
    """Mean difference (stretch draws - per-cycle draws) of each replication's mean E2E and TTFT, and its standard
    error over seeds; the two samplers share each seed's arrivals (paired)."""
    from sdplan.simulate import sampling

    gaps: dict[str, list[float]] = {"e2e": [], "ttft": []}
    for seed in range(seeds):
        stretch = simulate(STEEP, config, numpy.random.default_rng(seed))
        cells = sampling.STRETCH_TABLE_CELLS
        sampling.STRETCH_TABLE_CELLS = 0  # the per-cycle sampler (AdaptiveDecode), the exact reference
        try:
            per_cycle = simulate(STEEP, config, numpy.random.default_rng(seed))
        finally:
            sampling.STRETCH_TABLE_CELLS = cells
        gaps["e2e"].append(stretch.e2e_s.mean() - per_cycle.e2e_s.mean())
        gaps["ttft"].append(stretch.ttft_s.mean() - per_cycle.ttft_s.mean())
    return {metric: (float(numpy.mean(values)), float(numpy.std(values, ddof=1)) / math.sqrt(seeds))
            for metric, values in gaps.items()}


def test_goodput_stretch_draws_agree_with_per_cycle_draws() -> None:
    # (b) Redrawing each sequence's progress at a change of k (given it has not finished) has the distribution of
    # drawing every cycle: the paired mean gaps of E2E and TTFT over 16 seeds x 3,000 requests stay within 4
    # standard errors (a two-sided 6e-5 chance of a false alarm for each).
    gaps = _paired_gaps(steep_config(3000), 16)
    for metric, (gap, error) in gaps.items():
        assert error > 0
        assert abs(gap) <= 4 * error, (metric, gap, error)


def _one_token_per_cycle(self, draft, cycles, tokens, uniforms):  # type: ignore[no-untyped-def]
    return cycles.copy()


def _unconditioned(self, draft, cycles, tokens, uniforms):  # type: ignore[no-untyped-def]
    if draft == 0:
        return cycles.copy()
    rows = self.below[draft][cycles]
    return numpy.minimum((rows < uniforms[:, None]).sum(axis=1), tokens - 1)


@pytest.mark.parametrize("wrong", [_one_token_per_cycle, _unconditioned])
def test_the_agreement_check_catches_wrong_progress(monkeypatch: pytest.MonkeyPatch, wrong) -> None:  # type: ignore[no-untyped-def]
    # The agreement check can fail: drawing the tokens produced at one per cycle (the least possible; +1.3 s of
    # E2E, 68 standard errors) or from S_c without the condition S_c < m, clipped to m - 1 (-3.8 ms, 4.8
    # standard errors on 16 seeds x 3,000 requests), is caught.
    from sdplan.simulate.sampling import StretchTables

    monkeypatch.setattr(StretchTables, "produced", wrong)
    gap, error = _paired_gaps(steep_config(3000), 16)["e2e"]
    assert abs(gap) > 4 * error


def test_littles_law_on_the_goodput_policy_trace() -> None:
    # (c) The time-averaged number in the system equals lambda x mean E2E (measured apart) under the goodput policy.
    run = simulate(STEEP, steep_config(20_000), numpy.random.default_rng(2))
    assert run.steady
    little = run.arrival_rate_rps * run.e2e_s.mean()
    assert run.mean_in_system == pytest.approx(little, rel=0.05)
    assert 1.0 < run.mean_draft_length < 5.0


@pytest.mark.parametrize(("hold", "cap"), [(KvHold(), 20_300 // (100 + 100 + 3)),
                                           (KvHold(0.5, 16), 20_300 // (100 + 50 + 3 + 8))])
def test_a_full_kv_cache_keeps_its_cap_running_to_the_end(hold: KvHold, cap: int) -> None:
    """Overloaded SD with a KV budget: every completed request gives back what it held, lookahead slots included,
    so the engine keeps the cap running to the end (it lost k tokens a request before, 9,000 of these 20,300)."""
    config = SimulationConfig(rate_rps=2_000.0, draft_length=3, position_rates=rates(0.7, 3), requests=3000,
                              prompt_tokens=100, output_tokens=100, max_num_seqs=512, kv_cache_tokens=20_300,
                              kv_hold=hold, warmup_fraction=0.0)
    run = simulate(C, config, numpy.random.default_rng(5))
    assert cap * 0.95 <= run.mean_running <= cap + 1e-9


def test_an_engine_that_fills_its_cache_as_requests_run_keeps_more_of_them() -> None:
    """vLLM holds a prompt, half the output and half a block on average; SGLang and TensorRT-LLM reserve the output."""
    vllm, sglang = kv_hold("vllm", "NVIDIA H100 SXM 80GB"), kv_hold("sglang", "NVIDIA H100 SXM 80GB")
    assert vllm.running(432_992, 1024, 512) == 432_992 // (1024 + 256 + 8) == 336
    assert sglang.running(432_992, 1024, 512) == kv_hold("trtllm", "B200").running(432_992, 1024, 512) == 281
    # SGLang reserves at most 4,096 output tokens (CLIP_MAX_NEW_TOKENS); TensorRT-LLM all of them
    assert sglang.tokens(1024, 8192) == 1024 + 4096 and kv_hold("trtllm", "B200").tokens(1024, 8192) == 1024 + 8192
    assert vllm.running(328_102, 1024, 512, 3) == 328_102 // (1024 + 256 + 3 + 8)
    assert kv_hold("vllm", "AMD EPYC (CPU, 2 cores)").tokens(256, 512) == 256 + 256 + 64  # 128-token blocks
    # one request must fit whole: vLLM refuses a max_model_len over its cache
    assert vllm.running(1_500, 1024, 512) == 0 and vllm.running(1_536, 1024, 512) == 1


def test_an_moe_targets_steps_pay_for_their_experts_as_the_model_prices_them(sdplan) -> None:
    """Qwen3-30B-A3B on an H100 (derived): each simulated step pays phi(n (k + 1)) of streaming every expert, the
    model's MoE fixed point; at the default rates (now within the KV cap's saturation) the two means agree."""
    done = sdplan("simulate", "-c", "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived", "--acceptance", "0.7",
                  "--requests", "2000", "--seeds", "2", "-f", "json")
    assert done.exit_code == 0, done.output
    rates = json.loads(done.stdout)["rates"]
    assert len(rates) == 4 and all(rate["steady_state"] for rate in rates)
    for rate in rates:
        simulated, analytic = rate["statistics"]["e2e_mean_s"]["value"], rate["analytic_mean_e2e_latency_s"]
        assert simulated == pytest.approx(analytic, rel=0.05), rate["request_rate_rps"]
    checked = sdplan("check", "-c", "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived", "--acceptance", "0.7", "--rate", "2",
                     "--slo", "e2e:p99<=12s", "--simulate", "--requests", "1000", "--seeds", "2")
    assert checked.exit_code == 0, checked.output


def test_the_goodput_policy_counts_what_else_a_step_costs() -> None:
    """An option whose steps cost more (an MoE target's experts, ``extra_s``) is not chosen where it loses."""
    from sdplan.latency.policy import step_choices

    expected, costs = [1.0, 2.0], [(0.010, 1e-4), (0.015, 1.5e-4)]
    assert step_choices(expected, costs, 8) == [1] * 9
    dearer = step_choices(expected, costs, 8, extra_s=lambda option, n: 0.02 * option * n / 8)
    assert dearer[:2] == [1, 1] and dearer[-1] == 0
