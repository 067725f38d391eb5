"""``capacity`` and ``check`` on a served calibration answer for servers as much slower as its own speed error allows.

The calibration is fitted here from real ``vllm bench serve`` results (acc41's quick grid,
``tests/data/served-frontend-floor-cpu``: repeats 8.6% apart), as ``sdplan fit`` writes it.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
from pathlib import Path

import pytest

from sdplan.fitting.fit import fit_pooled, fitted_document
from sdplan.planning.uncertainty import MARGIN_Z
from sdplan.runs import read_results

DATA = Path(__file__).parent / "data"
CPU = "cpu-epyc-2core_tiny-llama-h256-l4_tiny-llama-h128-l1_measured"
PROVENANCE = {"method": "fit", "hardware": "test", "target_model": "t", "draft_model": "d", "engine": "vllm",
              "engine_version": "0", "date": datetime.date(2026, 11, 27)}
#: A 128/64-token workload (the calibrated one), an SLO near saturation and a target of several replicas.
ARGS = ("--slo", "e2e:mean<=3s", "--acceptance", "0.8", "-k", "2,4", "--prompt-tokens", "128",
        "--output-tokens", "64", "--target-rate", "20")


@pytest.fixture(scope="module")
def acc41() -> dict:
    points = read_results(DATA / "served-frontend-floor-cpu", "vllm")[0]
    return fitted_document(fit_pooled(points), points, name="acc41", provenance=PROVENANCE, description="test")


def _capacity(sdplan, path: Path, *extra: str) -> dict:
    result = sdplan("capacity", "-c", str(path), *ARGS, "-f", "json", *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _replicas(report: dict) -> tuple[int, int]:
    return report["fleet"]["no_sd"]["replicas"], report["fleet"]["best_sd"]["replicas"]


def test_the_margin_sizes_a_larger_fleet_and_the_opt_out_restores_the_plain_one(sdplan, write_calibration,
                                                                                  acc41) -> None:
    sigma = acc41["uncertainty"]["repeat_sd_pct"]
    assert sigma == pytest.approx(8.56, abs=0.01)
    plain_document = copy.deepcopy(acc41)
    del plain_document["uncertainty"]["repeat_sd_pct"]
    spread = _capacity(sdplan, write_calibration(acc41, "spread"))
    opted_out = _capacity(sdplan, write_calibration(acc41, "spread"), "--at-calibrated-speed")
    plain = _capacity(sdplan, write_calibration(plain_document, "plain"))
    u = math.exp(MARGIN_Z * sigma / 100.0)  # a fitted calibration records no instances: n = 1
    margin = spread["speed_margin"]
    assert margin["u"] == pytest.approx(u) and margin["sigma_pct"] == sigma and margin["instances"] == 1
    assert margin["applied"] is True and margin["z"] == pytest.approx(1.645, abs=1e-3)
    # every cost times u: C1 and C2 of each option scale by u, so the saturation rate falls by 1/u
    for slow, fast in zip(spread["options"], opted_out["options"]):
        assert slow["c1_s"] == pytest.approx(u * fast["c1_s"], rel=1e-9)
        assert slow["saturation_rate_rps"] == pytest.approx(fast["saturation_rate_rps"] / u, rel=1e-9)
        assert slow["max_rate_under_slo_rps"] < fast["max_rate_under_slo_rps"]
    assert _replicas(spread) != _replicas(opted_out)
    assert all(a >= b for a, b in zip(_replicas(spread), _replicas(opted_out)))
    # the opt-out is the answer without a measured spread, and each side names the other's fleet
    assert [o["max_rate_under_slo_rps"] for o in opted_out["options"]] == \
        [o["max_rate_under_slo_rps"] for o in plain["options"]]
    assert _replicas(opted_out) == _replicas(plain)
    assert opted_out["speed_margin"]["applied"] is False
    other = margin["other_side"]["fleet"]
    assert (other["no_sd"]["replicas"], other["best_sd"]["replicas"]) == _replicas(opted_out)
    back = opted_out["speed_margin"]["other_side"]["fleet"]
    assert (back["no_sd"]["replicas"], back["best_sd"]["replicas"]) == _replicas(spread)
    # the intervals are the calibration's, not shifted again by the margin
    assert spread["max_rate_under_slo_ci95_rps"] == opted_out["max_rate_under_slo_ci95_rps"]
    assert plain["speed_margin"] == {**plain["speed_margin"], "u": 1.0, "sigma_pct": None, "applied": False,
                                     "other_side": None}


def test_the_caveat_says_how_fast_the_servers_are_assumed(sdplan, write_calibration, acc41) -> None:
    plain_document = copy.deepcopy(acc41)
    del plain_document["uncertainty"]["repeat_sd_pct"]
    path = write_calibration(acc41, "spread")
    report = _capacity(sdplan, path, "--at-calibrated-speed")
    no_sd, best_sd = _replicas(report)
    text = sdplan("capacity", "-c", str(path), *ARGS)
    assert text.exit_code == 0, text.output
    words = " ".join(text.stdout.split())
    assert "sized for servers up to 15% slower than this calibration's" in words
    assert "its servers 8.6% apart (repeat_sd_pct) over 1 instance per configuration" in words
    assert f"At the calibration's speed (--at-calibrated-speed): {no_sd} replicas without SD, {best_sd} with" in words
    opted = sdplan("capacity", "-c", str(path), *ARGS, "--at-calibrated-speed")
    words = " ".join(opted.stdout.split())
    assert "sized at the calibration's speed (--at-calibrated-speed)" in words
    assert "sized for servers up to" not in words
    plain = sdplan("capacity", "-c", str(write_calibration(plain_document, "plain")), *ARGS)
    words = " ".join(plain.stdout.split())
    assert "the answer assumes servers exactly as fast as the ones it measured" in words


def test_a_served_calibration_weighs_its_instances(sdplan, write_calibration, acc41) -> None:
    """Two instances per configuration halve the calibration's speed variance: u = exp(z sigma / sqrt(2))."""
    document = copy.deepcopy(acc41)
    document["provenance"]["method"] = "measured"
    document["measurement"] = {"method": "served", "server_instances_per_configuration": 2}
    report = _capacity(sdplan, write_calibration(document, "served"))
    sigma = document["uncertainty"]["repeat_sd_pct"]
    assert report["speed_margin"]["instances"] == 2
    assert report["speed_margin"]["u"] == pytest.approx(math.exp(MARGIN_Z * sigma / 100.0 / math.sqrt(2)))


def test_shipped_derived_calibrations_carry_no_margin(sdplan) -> None:
    result = sdplan("capacity", "--slo", "e2e:mean<=5s", "--acceptance", "0.8", "--target-rate", "100", "-f", "json")
    assert result.exit_code == 0, result.output
    assert "speed_margin" not in json.loads(result.stdout)
    text = sdplan("capacity", "--slo", "e2e:mean<=5s", "--acceptance", "0.8", "--target-rate", "100")
    assert "servers" not in " ".join(text.stdout.split()).split("Why:")[0]


def test_the_shipped_measured_calibration_says_it_assumes_its_servers_speed(sdplan) -> None:
    """cpu-epyc-2core_..._measured records no repeat_sd_pct: u = 1, the numbers of --at-calibrated-speed."""
    args = ("capacity", "-c", CPU, "--slo", "e2e:mean<=5s", "--acceptance", "0.8", "--target-rate", "10")
    report = json.loads(sdplan(*args, "-f", "json").stdout)
    opted = json.loads(sdplan(*args, "-f", "json", "--at-calibrated-speed").stdout)
    assert report["speed_margin"]["u"] == 1.0 and report["speed_margin"]["sigma_pct"] is None
    assert report["options"] == opted["options"] and report["fleet"] == opted["fleet"]
    words = " ".join(sdplan(*args).stdout.split())
    assert "the answer assumes servers exactly as fast as the ones it measured" in words


def test_check_is_made_on_the_slower_server_as_capacity_sizes(sdplan, write_calibration, acc41) -> None:
    """A rate between the slower server's capacity and the calibration's passes only at the calibration's speed;
    --pessimistic gates on the same, unshifted intervals either way (the draws carry the spread already)."""
    path = str(write_calibration(acc41, "spread"))
    report = _capacity(sdplan, Path(path), "--draft-lengths", "2")
    slow = report["options"][0]["max_rate_under_slo_rps"]
    fast = report["speed_margin"]["other_side"]["best_max_rate_under_slo_rps"]
    assert slow < fast
    rate = f"{(slow + fast) / 2:.4g}"
    args = ("check", "-c", path, "--rate", rate, "--slo", "e2e:mean<=3s", "--acceptance", "0.8", "--draft-length",
            "off", "--prompt-tokens", "128", "--output-tokens", "64")
    default = sdplan(*args, "-f", "json")
    opted = sdplan(*args, "-f", "json", "--at-calibrated-speed")
    assert default.exit_code == 1 and opted.exit_code == 0
    checked = json.loads(default.stdout)
    assert checked["passed"] is False and checked["speed_margin"]["applied"] is True
    assert checked["speed_margin"]["u"] == pytest.approx(report["speed_margin"]["u"])
    assert checked["speed_margin"]["other_side"]["passed"] is True
    assert json.loads(opted.stdout)["speed_margin"]["other_side"]["passed"] is False
    words = " ".join(sdplan(*args).stdout.split())
    assert "checked for servers up to 15% slower than this calibration's" in words
    assert "At the calibration's speed (--at-calibrated-speed): PASS, 1/1 SLOs met" in words
    pessimistic = [json.loads(sdplan(*args, "-f", "json", "--pessimistic", *extra).stdout)["pessimistic"]
                   for extra in ((), ("--at-calibrated-speed",))]
    assert pessimistic[0]["intervals"] == pessimistic[1]["intervals"]


def test_a_simulated_answer_runs_on_the_slower_server(sdplan, write_calibration, acc41) -> None:
    """The simulator gets the slower server's costs; the other side is not simulated a second time."""
    path = str(write_calibration(acc41, "spread"))
    args = ("capacity", "-c", path, "--slo", "e2e:p90<=4s", "--acceptance", "0.8", "-k", "2", "--prompt-tokens",
            "128", "--output-tokens", "64", "--simulate", "--requests", "200", "--seeds", "1", "-f", "json")
    slow, fast = (json.loads(sdplan(*args, *extra).stdout) for extra in ((), ("--at-calibrated-speed",)))
    assert slow["speed_margin"]["applied"] is True and slow["speed_margin"]["other_side"] is None
    assert "rerun with --at-calibrated-speed" in slow["speed_margin"]["caveat"]
    for a, b in zip(slow["options"], fast["options"]):
        assert a["max_rate_under_slo_rps"] < b["max_rate_under_slo_rps"]


def test_a_closed_loop_is_checked_on_the_slower_server_too(sdplan, write_calibration, acc41) -> None:
    """check --concurrency applies the same margin: an SLO between the slower server's latency and the
    calibration's passes only with --at-calibrated-speed."""
    path = str(write_calibration(acc41, "spread"))
    args = ("check", "-c", path, "--concurrency", "8", "--acceptance", "0.8", "--draft-length", "off",
            "--prompt-tokens", "128", "--output-tokens", "64", "-f", "json")
    probe = json.loads(sdplan(*args, "--slo", "e2e:mean<=100s").stdout)
    slow = probe["verdicts"][0]["predicted_s"]
    fast = probe["speed_margin"]["other_side"]["verdicts"][0]["predicted_s"]
    assert probe["speed_margin"]["applied"] is True
    assert slow == pytest.approx(fast * probe["speed_margin"]["u"], rel=0.05) and slow > fast
    slo = ("--slo", f"e2e:mean<={(slow + fast) / 2:.6g}s")
    assert sdplan(*args, *slo).exit_code == 1 and sdplan(*args, *slo, "--at-calibrated-speed").exit_code == 0
