"""Acceptance from a speculation_profile.json (NVIDIA Model-Optimizer schema 1.0)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sdplan.errors import ExitStatus, InputFileError
from sdplan.inputs.speculation_profile import load_speculation_profile, parse_speculation_profile

DATA = Path(__file__).parent / "data" / "speculation-profiles"
EAGLE3 = DATA / "eagle3-k3.json"
DFLASH = DATA / "dflash-k3.json"


def _document(path: Path = EAGLE3) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_published_eagle3_profile_gives_running_products_of_the_conditional_rates() -> None:
    profile = load_speculation_profile(str(EAGLE3))
    assert profile.measured_at_k == 3
    # r_i = a_1 ... a_i from the conditional rates 0.816082, 0.776577, 0.749591
    assert profile.position_rates == pytest.approx((0.816082, 0.816082 * 0.776577, 0.816082 * 0.776577 * 0.749591))
    spec = profile.acceptance()
    # E(3) = 1 + sum r_i is the profile's own mean_accept_length
    assert spec.tokens_per_cycle([1, 2, 3])[0, 2] == pytest.approx(2.924887, abs=1e-5)
    assert spec.tokens_per_cycle([1])[0, 0] == pytest.approx(1.816082)
    assert "measured at k=3" in spec.source and "eagle3" in spec.source and "mtbench" in spec.source
    assert spec.only_draft_length is None


def test_block_parallel_profile_holds_at_its_own_draft_length_only(sdplan: Any) -> None:
    profile = load_speculation_profile(str(DFLASH))
    assert profile.acceptance().only_draft_length == 3
    result = sdplan("plan", "--acceptance-profile", str(DFLASH), "--rates", "1", "-f", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [row["draft_length_tokens"] for row in document["results"][0]["draft_lengths"]] == [3]
    # the per-step mean of the measured histogram: (8611 + 2*7814 + 3*5337 + 4*8891) / 30653
    assert document["results"][0]["draft_lengths"][0]["tokens_per_cycle"] == pytest.approx(
        (8611 + 2 * 7814 + 3 * 5337 + 4 * 8891) / 30653, abs=1e-5)
    refused = sdplan("plan", "--acceptance-profile", str(DFLASH), "-k", "2", "--rates", "1")
    assert refused.exit_code == ExitStatus.USAGE
    assert "draft length 3 only" in refused.stderr


@pytest.mark.parametrize(("change", "key", "message"), [
    ({"schema_version": "2.0"}, "schema_version", "not supported"),
    ({"schema_version": None}, "schema_version", "missing"),
    ({"measured": False}, "measured", "stub"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens", "integer"),
    ({"conditional_accept_rates": [0.8, 0.7]}, "conditional_accept_rates", "list of 3"),
    ({"conditional_accept_rates": [0.8, 1.7, 0.5]}, "conditional_accept_rates[1]", "probability"),
    ({"conditional_accept_rates": None, "marginal_accept_rates": None,
      "vectors_unavailable_reason": "block verification does not give a longest-prefix distribution"},
     "conditional_accept_rates", "longest-prefix"),
    ({"marginal_accept_rates": [0.9, 0.8, 0.7]}, "marginal_accept_rates[", "disagrees"),
    ({"mean_accept_length": 3.5}, "mean_accept_length", "imply"),
])
def test_bad_profiles_are_refused_naming_the_field(change: dict[str, Any], key: str, message: str) -> None:
    document = _document()
    document.update(change)
    if change.get("schema_version", "") is None:
        del document["schema_version"]
    with pytest.raises(InputFileError) as error:
        parse_speculation_profile(document, "p.json")
    assert (error.value.key or "").startswith(key)
    assert message in error.value.problem


def test_unknown_version_is_a_one_line_input_error(sdplan: Any, tmp_path: Path) -> None:
    document = _document()
    document["schema_version"] = "1.1"
    path = tmp_path / "speculation_profile.json"
    path.write_text(json.dumps(document))
    result = sdplan("plan", "--acceptance-profile", str(tmp_path), "--rates", "1")  # a folder holding one
    assert result.exit_code == ExitStatus.BAD_INPUT
    assert "schema_version: version '1.1' is not supported; this sdplan reads 1.0" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_marginals_alone_are_enough() -> None:
    document = _document()
    document["conditional_accept_rates"] = None
    profile = parse_speculation_profile(document, "p.json")
    assert profile.conditional_rates == pytest.approx((0.816082, 0.776577, 0.749591), abs=1e-5)


def _disagreeing_profile(tmp_path: Path) -> tuple[Path, float]:
    """A drafter that is good for two tokens and poor after: conditional 0.9, 0.85, then 0.2."""
    conditional = [0.9, 0.85, 0.2, 0.2, 0.2, 0.2]
    marginal, product = [], 1.0
    for rate in conditional:
        product *= rate
        marginal.append(product)
    mean = 1.0 + sum(marginal)
    document = {"schema_version": "1.0", "measured": True, "method": "eagle3", "num_speculative_tokens": 6,
                "conditional_accept_rates": conditional, "marginal_accept_rates": marginal,
                "mean_accept_length": mean, "accept_length_model": "chain_analytic"}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(document))
    return path, mean


def _hand_latency(coefficients: dict[str, float], rate: float, tokens: float, k: int) -> float:
    """L = C1 / (1 - lambda C2), C1 = c1p + g/E (c1v + k c1d), C2 = c2p + g/E (c2v + k c2d) (sdplan.latency.model)."""
    g = coefficients["output_tokens"]
    c1 = coefficients["c1p_s"] + g / tokens * (coefficients["c1v_s"] + k * coefficients["c1d_s"])
    c2 = coefficients["c2p_s"] + g / tokens * (coefficients["c2v_s"] + k * coefficients["c2d_s"])
    return c1 / (1.0 - rate * c2)


def test_profile_and_one_alpha_disagree_on_the_best_draft_length(sdplan: Any, tmp_path: Path,
                                                                 write_calibration: Any,
                                                                 direct_document: dict[str, Any]) -> None:
    """One alpha with the profile's own mean length at K=6 drafts 3; the profile's shape says 2.

    By hand with the test calibration (c1p 0.05, c2p 0.01, c1v 0.009, c2v 1e-4, c1d 0.001,
    c2d 5e-5 s; g = 500) at 0.5 req/s: the profile's E(k) = 1.9, 2.665, 2.818, ... gives
    L = 2.750, 2.165, 2.240, 2.407, 2.595, 2.788 s (best k = 2); the i.i.d. alpha 0.6714 with
    the same E(6) = 2.856 gives L = 3.127, 2.719, 2.605, 2.611, 2.681, 2.788 s (best k = 3).
    """
    calibration = write_calibration(direct_document)
    profile, mean = _disagreeing_profile(tmp_path)
    common = ("-c", str(calibration), "--rates", "0.5", "-k", "1-6", "-f", "json")
    by_profile = json.loads(sdplan("plan", *common, "--acceptance-profile", str(profile)).stdout)
    by_alpha = json.loads(sdplan("plan", *common, "--acceptance-length", f"{mean!r}", "--acceptance-k", "6").stdout)
    coefficients = by_profile["coefficients"]
    position = [0.9, 0.9 * 0.85] + [0.9 * 0.85 * 0.2 ** i for i in range(1, 5)]
    profile_tokens = [1.0 + sum(position[:k]) for k in range(1, 7)]
    alpha = by_alpha["results"][0]["per_token_alpha"]
    alpha_tokens = [(1.0 - alpha ** (k + 1)) / (1.0 - alpha) for k in range(1, 7)]
    hand_profile = [_hand_latency(coefficients, 0.5, profile_tokens[k - 1], k) for k in range(1, 7)]
    hand_alpha = [_hand_latency(coefficients, 0.5, alpha_tokens[k - 1], k) for k in range(1, 7)]
    assert hand_profile == pytest.approx([2.750, 2.165, 2.240, 2.407, 2.595, 2.788], abs=1e-3)
    assert hand_alpha == pytest.approx([3.127, 2.719, 2.605, 2.611, 2.681, 2.788], abs=1e-3)
    best_profile = by_profile["results"][0]["rates"][0]["best"]["draft_length_tokens"]
    best_alpha = by_alpha["results"][0]["rates"][0]["best"]["draft_length_tokens"]
    assert best_profile == 1 + hand_profile.index(min(hand_profile)) == 2
    assert best_alpha == 1 + hand_alpha.index(min(hand_alpha)) == 3


@pytest.mark.parametrize("command", [
    ("check", "--rate", "1", "--slo", "e2e:mean<=60s"),
    ("capacity", "--target-rate", "2", "--slo", "e2e:mean<=60s"),
    ("simulate", "--rates", "1", "--requests", "50", "--seeds", "2"),
])
def test_every_planning_command_takes_the_profile(sdplan: Any, command: tuple[str, ...]) -> None:
    result = sdplan(*command, "--acceptance-profile", str(EAGLE3), "-f", "json")
    assert result.exit_code == 0, result.output
    assert "speculation profile" in result.stdout and "measured at k=3" in result.stdout


def test_workload_file_key_resolves_relative_to_the_file(sdplan: Any, tmp_path: Path) -> None:
    (tmp_path / "speculation_profile.json").write_text(EAGLE3.read_text())
    workload = tmp_path / "chat.toml"
    workload.write_text('schema_version = 1\nslos = ["e2e:mean<=60s"]\n[traffic]\nrequest_rate_rps = 1.0\n'
                        '[acceptance]\nprofile = "speculation_profile.json"\n')
    result = sdplan("check", "-w", str(workload), "-f", "json")
    assert result.exit_code == 0, result.output
    acceptance = json.loads(result.stdout)["workload"]["acceptance"]
    assert acceptance["metric_given"] == "per-position"
    assert acceptance["measured_at_k"] == 3
    assert "speculation_profile.json" in acceptance["source"]
    both = tmp_path / "both.toml"
    both.write_text('schema_version = 1\n[acceptance]\nprofile = "p.json"\nper_token_alpha = 0.7\n')
    refused = sdplan("check", "-w", str(both), "--rate", "1", "--slo", "e2e:mean<=60s")
    assert refused.exit_code == ExitStatus.BAD_INPUT
    assert "give one of" in refused.stderr


def test_profile_with_another_metric_is_a_usage_error(sdplan: Any) -> None:
    result = sdplan("plan", "--acceptance-profile", str(EAGLE3), "--acceptance", "0.7")
    assert result.exit_code == ExitStatus.USAGE
    assert "one metric only" in result.stderr
