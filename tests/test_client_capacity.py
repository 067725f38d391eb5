"""``sdplan capacity --closed-loop``: the most clients a replica keeps in flight under the SLOs."""

from __future__ import annotations

import json
import math

import pytest

from sdplan.errors import ExitStatus

MOE = "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived"


def answer(sdplan, *arguments: str) -> dict:
    result = sdplan("capacity", "--closed-loop", "--acceptance", "0.8", "-k", "1-3", "-f", "json", *arguments)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def check(sdplan, clients: int, option: dict, slo: str, calibration: tuple[str, ...] = ()) -> bool:
    """``check --concurrency``'s verdict on one option: the same closed loop, priced the same way."""
    length = str(option["draft_length_tokens"]) if option["speculation"] else "off"
    result = sdplan("check", *calibration, "--concurrency", str(clients), "--draft-length", length, "--slo", slo,
                    "--acceptance", "0.8", "-f", "json")
    return bool(json.loads(result.stdout)["verdicts"][0]["passed"])


@pytest.mark.parametrize(("slo", "calibration"), [
    ("e2e:mean<=8s", ()), ("tpot:mean<=12ms", ()), ("ttft:mean<=120ms", ()), ("e2e:mean<=6s", ("-c", MOE))])
def test_capacity_is_the_most_clients_check_passes(sdplan, slo, calibration) -> None:
    """Per option, check --concurrency passes at max_clients and misses the binding SLO one client later."""
    document = answer(sdplan, *calibration, "--slo", slo)
    for option in document["options"]:
        most = option["max_clients"]
        assert option["feasible"] and most > 0 and option["binding_slo"] == slo
        assert check(sdplan, most, option, slo, calibration)
        assert not check(sdplan, most + 1, option, slo, calibration)
        rate = most / option["mean_e2e_latency_s"]  # Little's law
        assert option["throughput_rps"] == pytest.approx(rate)
        assert option["output_throughput_tok_s"] == pytest.approx(rate * document["workload"]["output_tokens"])


def test_past_the_cap_the_clients_wait_and_the_wait_is_priced(sdplan) -> None:
    """Under a loose latency SLO more clients than the engine holds keep it full; the rest wait for admission."""
    document = answer(sdplan, "--slo", "e2e:mean<=60s")
    caps = document["batch_caps_sequences"]
    for option, cap in zip(document["options"], caps, strict=True):
        assert option["max_clients"] > cap and option["running_requests"] == math.floor(cap)
        assert not option["at_batch_cap"]
    assert any("wait for admission" in warning for warning in document["warnings"])


def test_a_ttft_slo_stops_at_the_cap_where_the_wait_begins(sdplan) -> None:
    """Qwen3-30B-A3B: the draft leaves a KV cache that keeps 36 requests running; the 37th client's wait misses a
    TTFT SLO."""
    document = answer(sdplan, "-c", MOE, "--slo", "ttft:mean<=200ms")
    assert [option["max_clients"] for option in document["options"]] == [91, 36, 36, 36]
    assert all(option["at_batch_cap"] for option in document["options"])


def test_a_throughput_floor_needs_clients_and_can_rule_an_option_out(sdplan) -> None:
    base = answer(sdplan, "--slo", "e2e:mean<=10s")["options"]
    floor = (base[0]["output_throughput_tok_s"] + base[3]["output_throughput_tok_s"]) / 2  # between no SD and k=3
    document = answer(sdplan, "--slo", "e2e:mean<=10s", "--slo", f"throughput>={floor:.0f}tok/s")
    off, k3 = document["options"][0], document["options"][3]
    assert not off["feasible"] and off["binding_slo"].startswith("throughput>=")
    assert k3["feasible"] and 1 < k3["min_clients"] <= k3["max_clients"] == base[3]["max_clients"]


def test_a_target_concurrency_sizes_the_fleet(sdplan) -> None:
    document = answer(sdplan, "--slo", "e2e:mean<=8s", "--target-concurrency", "1000", "--gpu-hour-cost", "2")
    fleet, options = document["fleet"], {option["option"]: option for option in document["options"]}
    for side in ("no_sd", "best_sd"):
        item = fleet[side]
        assert item["replicas"] == math.ceil(1000 / options[item["option"]]["max_clients"])
        assert item["cost_per_hour_usd"] == pytest.approx(2.0 * item["gpus"])
        per_million = item["cost_per_hour_usd"] / (item["output_throughput_tok_s"] * 3600) * 1e6
        assert item["cost_per_million_output_tokens_usd"] == pytest.approx(per_million)
    assert fleet["replicas_saved_by_sd"] == fleet["no_sd"]["replicas"] - fleet["best_sd"]["replicas"] > 0
    table = sdplan("capacity", "--slo", "e2e:mean<=8s", "--acceptance", "0.8", "--target-concurrency", "1000")
    assert table.exit_code == 0 and "clients in flight per replica" in table.stdout
    assert f"SD saves {fleet['replicas_saved_by_sd']} replica(s) at 1,000 clients" in table.stdout


@pytest.mark.parametrize(("arguments", "message"), [
    (["--closed-loop", "--slo", "e2e:mean<=8s", "-f", "vllm-config"], "--format vllm-config"),
    (["--target-concurrency", "10", "--target-rate", "5", "--slo", "e2e:mean<=8s"], "--target-rate and"),
    (["--closed-loop", "--simulate", "--slo", "e2e:mean<=8s"], "--simulate"),
    (["--closed-loop", "--slo", "throughput>=100tok/s"], "bounds the clients"),
    (["--closed-loop", "--slo", "tpot:mean<=50ms"], "with any number of clients"),
    (["--closed-loop", "--slo", "e2e:p99<=8s"], "p99"),
    (["--target-concurrency", "0", "--slo", "e2e:mean<=8s"], "--target-concurrency"),
])
def test_what_a_closed_loop_does_not_combine_with_is_one_line(sdplan, arguments, message) -> None:
    result = sdplan("capacity", *arguments)
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert message in result.stderr and "Traceback" not in result.stderr


def test_no_option_meeting_the_slos_exits_4(sdplan) -> None:
    result = sdplan("capacity", "--closed-loop", "--slo", "e2e:mean<=0.5s", "--acceptance", "0.8")
    assert result.exit_code == ExitStatus.INFEASIBLE and "any number of clients" in result.stdout


def test_a_workload_files_target_concurrency_asks_for_clients(sdplan, tmp_path) -> None:
    """traffic.target_concurrency sizes a closed loop's fleet unless the command line asks for a rate; a file
    with both targets is refused, naming the key."""
    from sdplan.fileio import dumps_toml

    def workload(**traffic) -> str:
        path = tmp_path / "w.toml"
        path.write_text(dumps_toml({"schema_version": 1, "slos": ["e2e:mean<=8s"], "traffic": traffic,
                                    "acceptance": {"per_token_alpha": 0.8}}))
        return str(path)

    document = json.loads(sdplan("capacity", "-w", workload(target_concurrency=500), "-f", "json").stdout)
    assert document["mode"] == "closed_loop" and document["fleet"]["target_clients"] == 500
    rate = json.loads(sdplan("capacity", "-w", workload(target_concurrency=500), "--target-rate", "20",
                             "-f", "json").stdout)
    assert "mode" not in rate and rate["fleet"]["target_rate_rps"] == 20
    both = sdplan("capacity", "-w", workload(target_concurrency=500, target_rate_rps=20.0))
    assert both.exit_code == ExitStatus.BAD_INPUT and "traffic.target_concurrency" in both.stderr
