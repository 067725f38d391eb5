"""Closed loops of N clients: the shared rule (``sdplan.latency.closed_loop``) and ``sdplan plan --concurrency``."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from sdplan.errors import ExitStatus
from sdplan.fitting.validation import predict_latency, predict_ttft
from sdplan.inputs.acceptance import expected_tokens_per_cycle
from sdplan.latency import closed_loop, model
from sdplan.planning.closed_loop_answer import ClosedLoopQuery, answer_closed_loop
from sdplan.planning.scenario import AcceptanceGiven, ScenarioOptions, resolve_scenario
from sdplan.runs import BenchmarkRun

MOE_FILE = "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived"


def scenario(calibration: str | None = None, alpha: float = 0.7, ks: tuple[int, ...] = (1, 2, 3, 4)):
    return resolve_scenario(ScenarioOptions(calibration=calibration, acceptance=AcceptanceGiven(alpha=[alpha]),
                                            draft_lengths=ks, single_acceptance=False))


# ----------------------------------------------------------------------------- the rule


def test_one_client_takes_the_zero_load_latency_and_a_few_the_linear_law() -> None:
    coefficients = scenario().coefficients
    c1_d, c2_d = model.baseline_demand(coefficients)
    assert closed_loop.closed_loop_latency(coefficients, 0, 1.0, 1) == pytest.approx(c1_d, rel=1e-12)
    tokens = 2.53
    c1, c2 = model.demand_from_tokens(coefficients, np.asarray(tokens), 3)
    assert closed_loop.closed_loop_latency(coefficients, 3, tokens, 1) == pytest.approx(float(c1), rel=1e-12)
    # four clients are far below this file's knee: L = C1 + f (N - 1) C2
    f = coefficients.closed_loop_factor
    assert closed_loop.closed_loop_latency(coefficients, 0, 1.0, 4) == pytest.approx(c1_d + f * 3 * c2_d, rel=1e-12)
    assert closed_loop.closed_loop_latency(coefficients, 3, tokens, 4) == pytest.approx(float(c1 + f * 3 * c2),
                                                                                         rel=1e-12)


def test_clients_past_the_cap_wait_for_admission_by_littles_law() -> None:
    coefficients = scenario().coefficients
    full = closed_loop.closed_loop_point(coefficients, 2, 2.19, 10, batch_cap=10)
    assert full.running == 10 and full.waiting == 0
    point = closed_loop.closed_loop_point(coefficients, 2, 2.19, 40, batch_cap=10.7)
    assert point.running == 10 and point.waiting == 30
    assert point.latency_s == pytest.approx(4 * full.latency_s, rel=1e-12)  # 10 served every L(10)
    assert point.throughput_rps == pytest.approx(full.throughput_rps, rel=1e-12)  # the plateau
    assert point.ttft_s == pytest.approx(full.ttft_s + 0.75 * point.latency_s, rel=1e-12)
    assert point == full.with_clients(40)
    with pytest.raises(ValueError):
        point.with_clients(80)  # only a point nobody waits in extends


def test_validate_predicts_a_measured_closed_loop_with_the_same_rule() -> None:
    cal = scenario().calibration
    coefficients = cal.coefficients_at(1024, 512)
    run = BenchmarkRun(source="closed", requested_rate_rps=None, achieved_rate_rps=1.0, draft_length=3, alpha=0.7,
                       prompt_tokens=1024, output_tokens=512, mean_e2e_latency_s=5.0, mean_ttft_s=0.05,
                       concurrency=300)
    latency = predict_latency(coefficients, run, batch_cap=213)
    tokens = float(expected_tokens_per_cycle(0.7, 3))
    assert latency == closed_loop.closed_loop_latency(coefficients, 3, tokens, 300, batch_cap=213)
    assert predict_ttft(coefficients, run, latency, batch_cap=213) == closed_loop.closed_loop_ttft(
        coefficients, 3, tokens, 300, latency, batch_cap=213)


# ----------------------------------------------------------------------------- the use case


def test_the_best_option_has_the_highest_throughput_and_speedup_is_the_throughput_ratio() -> None:
    answer = answer_closed_loop(scenario(), ClosedLoopQuery(clients=(1, 4, 16, 64, 128, 256, 512)))
    plan = answer.plan
    throughput = plan.throughput_rps[0]
    assert np.array_equal(plan.best[0], np.argmax(throughput, axis=1))
    ratio = throughput / throughput[:, :1]
    np.testing.assert_allclose(plan.speedup[0], ratio, rtol=1e-12)
    # one client: the zero-load speedup C1_D / C1_SD the rate plan reports
    c1_d, _ = model.baseline_demand(plan_coefficients := scenario().coefficients)
    c1_3, _ = model.demand_from_tokens(plan_coefficients, np.asarray(plan.tokens_per_cycle[0, 2]), 3)
    assert plan.speedup[0, 0, 3] == pytest.approx(c1_d / float(c1_3), rel=1e-12)
    # a closed loop's throughput grows with its clients up to the engine's cap, then holds
    for option in range(plan.latency_s.shape[2]):
        assert np.all(np.diff(throughput[:, option]) >= -1e-9 * throughput[:, option].max())
    assert plan.running[-1, 0] == 336 and plan.running[-1, 3] == 254  # KV caches: the draft takes some
    # the speedup measured sources report shrinks with the batch on this file
    best_speedup = plan.speedup[0][np.arange(plan.clients.size), plan.best[0]]
    assert best_speedup[0] > best_speedup[-1] > 1.0


def test_a_moe_target_is_priced_at_the_expert_coverage_of_its_clients() -> None:
    moe_scenario = scenario(MOE_FILE, ks=(1, 2))
    assert moe_scenario.moe is not None
    plan = answer_closed_loop(moe_scenario, ClosedLoopQuery(clients=(1, 8, 32))).plan
    dense = scenario(MOE_FILE, ks=(1, 2))
    dense_latency = closed_loop.closed_loop_latency(dense.coefficients, 0, 1.0, 8, None, 1e9)
    # more experts load as the batch grows: slower than the low-coverage coefficients alone
    assert plan.latency_s[0, 1, 0] > dense_latency
    assert np.all(np.isfinite(plan.latency_s))


# ----------------------------------------------------------------------------- the command


def test_plan_concurrency_table(sdplan) -> None:
    result = sdplan("plan", "--concurrency", "1,16,128,512", "-k", "1-3")
    assert result.exit_code == ExitStatus.OK, result.output
    out = result.stdout
    assert "Closed loop of N clients" in out and "clients" in out and "running" in out
    assert out.startswith("Answer: k=")
    assert "(+258 wait)" in out  # 512 clients, 254 running with SD
    assert "wait for admission" in out


def test_plan_concurrency_json_and_csv(sdplan) -> None:
    result = sdplan("plan", "--concurrency", "1,64", "-k", "2,3", "--acceptance", "0.6,0.8", "-f", "json")
    assert result.exit_code == ExitStatus.OK, result.output
    doc = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"JSON contains {c}"))
    assert doc["command"] == "plan" and doc["mode"] == "closed_loop"
    assert [block["per_token_alpha"] for block in doc["results"]] == [0.6, 0.8]
    level = doc["results"][1]["concurrency"][1]
    assert level["clients"] == 64
    assert [o["draft_length_tokens"] for o in level["options"]] == [0, 2, 3]
    option = level["options"][2]
    assert set(option) == {"speculation", "draft_length_tokens", "tokens_per_cycle", "running_requests",
                           "waiting_requests", "mean_e2e_latency_s", "mean_ttft_s", "mean_tpot_s", "throughput_rps",
                           "output_throughput_tok_s", "speedup"}
    assert option["throughput_rps"] == pytest.approx(64 / option["mean_e2e_latency_s"])
    assert option["speedup"] == pytest.approx(level["options"][0]["mean_e2e_latency_s"]
                                              / option["mean_e2e_latency_s"])
    best = max(level["options"], key=lambda o: o["throughput_rps"])
    assert level["best_draft_length_tokens"] == best["draft_length_tokens"]
    rows = list(csv.DictReader(io.StringIO(sdplan("plan", "--concurrency", "1,64", "-k", "2,3", "-f", "csv").stdout)))
    assert len(rows) == 2 * 3 and rows[0]["speculation"] == "off" and rows[0]["speedup"] == "1.0"
    assert sum(row["best"] == "true" for row in rows) == 2


@pytest.mark.parametrize("args, message", [
    (("--concurrency", "1,4", "--rates", "2"), "--rates"),
    (("--concurrency", "4", "--policy", "goodput"), "--policy goodput"),
    (("--concurrency", "4", "--wide"), "--wide"),
    (("--concurrency", "0"), "at least 1 client"),
    (("--concurrency", "2-1"), "empty range"),
    (("--concurrency", "many"), "not an integer"),
    (("--concurrency", "1-2000000"), "goes beyond"),
    (("--concurrency", "1-100000", "-k", "1-8"), "grid points"),
])
def test_plan_concurrency_refuses_what_it_cannot_answer(sdplan, args, message) -> None:
    result = sdplan("plan", *args)
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_an_option_whose_kv_cache_holds_no_request_serves_nothing(sdplan) -> None:
    """400,000-token prompts: no SD's KV cache holds one request, the draft's share leaves SD none. SD is then
    unstable at every concurrency, as the rate plan says, never priced as if the engine admitted it."""
    result = sdplan("plan", "--concurrency", "1,4", "--prompt-tokens", "400000", "--output-tokens", "100", "-k", "2,3",
                    "-f", "json")
    assert result.exit_code == ExitStatus.OK, result.output
    doc = json.loads(result.stdout)
    for level in doc["results"][0]["concurrency"]:
        assert level["best_draft_length_tokens"] == 0
        off, *sd = level["options"]
        assert off["running_requests"] == 1 and off["mean_e2e_latency_s"] > 0
        for option in sd:
            assert option["running_requests"] == 0 and option["mean_e2e_latency_s"] is None
            assert option["throughput_rps"] == 0.0
    assert any("serve no request of this workload" in w for w in doc["warnings"])
    table = sdplan("plan", "--concurrency", "1,4", "--prompt-tokens", "400000", "--output-tokens", "100").stdout
    assert table.startswith("Answer, extrapolated past the measured workloads (prompt tokens 400000")


def test_a_workload_no_engine_admits_is_an_answer_not_an_error(sdplan) -> None:
    result = sdplan("plan", "--concurrency", "1,4", "--prompt-tokens", "500000", "--output-tokens", "100", "-k", "2")
    assert result.exit_code == ExitStatus.OK, result.output
    assert "nothing serves at 1-4 clients" in result.stdout
    doc = json.loads(sdplan("plan", "--concurrency", "1", "--prompt-tokens", "500000", "--output-tokens", "100",
                            "-k", "2", "-f", "json").stdout)
    assert all(o["speedup"] is None and o["throughput_rps"] == 0.0
               for o in doc["results"][0]["concurrency"][0]["options"])


def test_the_answer_says_where_an_moe_targets_gain_peaks(sdplan) -> None:
    """An MoE target's verification reads more experts than a decode step until the batch reads most of them, so
    its gain can rise at medium batch and fall after (docs/model.md, Mixture of experts): the answer names the
    peak and why, and its figures are the table's."""
    result = sdplan("plan", "-c", MOE_FILE, "--concurrency", "1,4,32,128", "-k", "3", "--acceptance-length", "2.5",
                    "--acceptance-k", "3", "-f", "json")
    assert result.exit_code == ExitStatus.OK, result.output
    rows = json.loads(result.stdout)["results"][0]["concurrency"]
    gains = [max(option["speedup"] for option in row["options"]) for row in rows]
    assert gains[2] > 1.02 * max(gains[0], gains[-1])  # the file's shape: 1.11x, 1.04x, 1.25x, 1.00x
    text = " ".join(sdplan("plan", "-c", MOE_FILE, "--concurrency", "1,4,32,128", "-k", "3", "--acceptance-length",
                           "2.5", "--acceptance-k", "3").stdout.split())
    assert f"it rises to {gains[2]:.2f}x at 32 clients (an MoE target:" in text
    assert "then falls: SD's longer steps (k + 1 token rows to verify, and the drafting) grow faster" in text
    # a dense target whose gain only falls keeps the plain wording
    dense = " ".join(sdplan("plan", "--concurrency", "1,16,64,128").stdout.split())
    assert "it falls: SD's longer steps" in dense and "rises to" not in dense
