"""``sdplan check --concurrency N``: the SLO gate for a closed loop of N clients, priced as ``plan --concurrency``."""

from __future__ import annotations

import json

import pytest

from sdplan.errors import ExitStatus

ACCEPTANCE = ("--acceptance", "0.8")


def _plan_option(sdplan, clients: int, draft_length: int | None = None) -> dict:
    """``plan --concurrency``'s entry for one N: its best option, or the option of ``draft_length``."""
    plan = json.loads(sdplan("plan", "--concurrency", str(clients), *ACCEPTANCE, "-f", "json").stdout)
    entry = plan["results"][0]["concurrency"][0]
    wanted = entry["best_draft_length_tokens"] if draft_length is None else draft_length
    return next(option for option in entry["options"] if option["draft_length_tokens"] == wanted)


def _check(sdplan, *args: str):
    result = sdplan("check", *ACCEPTANCE, *args, "-f", "json")
    return result, json.loads(result.stdout) if result.stdout else None


@pytest.mark.parametrize("clients", [1, 64, 512])
def test_the_gate_sees_what_plan_concurrency_predicts_and_fails_just_past_it(sdplan, clients: int) -> None:
    """The operating point is plan --concurrency's best option at N; an SLO 1% inside it passes, 1% past it fails."""
    expected = _plan_option(sdplan, clients)
    tpot_ms = expected["mean_tpot_s"] * 1e3
    passed, report = _check(sdplan, "--concurrency", str(clients), "--slo", f"tpot:mean<={tpot_ms * 1.01:.6g}ms")
    assert passed.exit_code == ExitStatus.OK, passed.output
    point = report["operating_point"]
    assert report["speculation"]["draft_length_tokens"] == (expected["draft_length_tokens"] or None)
    assert point["mean_e2e_latency_s"] == pytest.approx(expected["mean_e2e_latency_s"], rel=1e-12)
    assert point["mean_ttft_s"] == pytest.approx(expected["mean_ttft_s"], rel=1e-12)
    assert point["mean_tpot_s"] == pytest.approx(expected["mean_tpot_s"], rel=1e-12)
    assert point["output_throughput_tok_s"] == pytest.approx(expected["output_throughput_tok_s"], rel=1e-12)
    loop = report["closed_loop"]
    assert report["request_rate_rps"] is None and loop["clients"] == clients
    assert loop["completed_rate_rps"] == pytest.approx(expected["throughput_rps"], rel=1e-12)
    assert (loop["running_requests"], loop["waiting_requests"]) == (expected["running_requests"],
                                                                    expected["waiting_requests"])
    failed, report = _check(sdplan, "--concurrency", str(clients), "--slo", f"tpot:mean<={tpot_ms * 0.99:.6g}ms")
    assert failed.exit_code == ExitStatus.SLO_VIOLATED and report["passed"] is False
    assert f"FAIL: 0/1 SLOs met at {clients} clients" in failed.stderr


def test_past_the_cap_clients_wait_and_the_loop_still_has_a_steady_state(sdplan) -> None:
    """512 clients on the default file: SD k=2 runs what its KV cache keeps running (254), the rest wait; the latency
    SLOs are judged on the priced wait, and only utilisation (1 from the cap on) is at its limit."""
    result, report = _check(sdplan, "--concurrency", "512", "--draft-length", "2", "--slo", "e2e:mean<=60s",
                            "--slo", "utilisation<=0.99")
    assert result.exit_code == ExitStatus.SLO_VIOLATED
    assert report["operating_point"]["regime"] == "waiting_for_admission"
    assert report["closed_loop"]["running_requests"] == 254 and report["closed_loop"]["waiting_requests"] == 258
    assert report["operating_point"]["utilisation"] == 1.0
    verdicts = {verdict["slo"]: verdict["passed"] for verdict in report["verdicts"]}
    assert verdicts == {"e2e:mean<=60s": True, "utilisation<=0.99": False}
    assert any("the other 258 wait for admission" in warning for warning in report["warnings"])
    below = _check(sdplan, "--concurrency", "64", "--draft-length", "2", "--slo", "utilisation<=0.99")[1]
    assert 0 < below["operating_point"]["utilisation"] < 1 and below["operating_point"]["regime"] == "stable"


def test_a_fixed_draft_length_and_sd_off_are_checked_as_given(sdplan) -> None:
    for choice, expected in (("off", 0), ("5", 5)):
        result, report = _check(sdplan, "--concurrency", "16", "--draft-length", choice, "--slo", "e2e:mean<=60s")
        assert result.exit_code == ExitStatus.OK
        assert report["speculation"]["draft_length_tokens"] == (expected or None)
        assert report["operating_point"]["mean_e2e_latency_s"] == pytest.approx(
            _plan_option(sdplan, 16, expected)["mean_e2e_latency_s"], rel=1e-12)


@pytest.mark.parametrize("extra, named", [
    (("--rate", "3"), "--rate and --concurrency"),
    (("--simulate",), "--simulate"),
    (("--pessimistic",), "--pessimistic"),
])
def test_what_a_closed_loop_does_not_combine_with_is_a_one_line_usage_error(sdplan, extra: tuple[str, ...],
                                                                            named: str) -> None:
    result = sdplan("check", "--concurrency", "8", "--slo", "e2e:mean<=5s", *extra)
    assert result.exit_code == ExitStatus.USAGE
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {named}") and "Traceback" not in result.stderr


def test_a_workload_file_can_hold_the_closed_loop_and_a_flag_replaces_it(sdplan, tmp_path) -> None:
    body = ('schema_version = 1\nslos = ["tpot:mean<=20ms"]\n[acceptance]\nper_token_alpha = 0.8\n'
            "[traffic]\n")
    path = tmp_path / "loop.toml"
    path.write_text(body + "concurrency = 64\n")
    from_file = json.loads(sdplan("check", "-w", str(path), "-f", "json").stdout)
    flagged = json.loads(sdplan("check", "--concurrency", "64", *ACCEPTANCE, "--slo", "tpot:mean<=20ms",
                                "-f", "json").stdout)
    assert from_file["closed_loop"] == flagged["closed_loop"]
    assert from_file["operating_point"] == flagged["operating_point"]
    by_rate = json.loads(sdplan("check", "-w", str(path), "--rate", "3", "-f", "json").stdout)
    assert by_rate["closed_loop"] is None and by_rate["request_rate_rps"] == 3.0
    path.write_text(body + "concurrency = 64\nrequest_rate_rps = 3\n")
    both = sdplan("check", "-w", str(path))
    assert both.exit_code == ExitStatus.BAD_INPUT
    assert both.stderr.strip() == (f"Error: {path}: traffic.concurrency: give request_rate_rps (an open loop) or "
                                   "concurrency (a closed loop of clients), not both")
