"""A Poisson client that fell behind its own schedule, told from its send times (real runs).

tests/data/served-client-behind-cpu (see its README): decode-heavy runs whose ``vllm bench serve`` client
froze for seconds on a 2-core VM, and runs that kept to their schedule. ``vllm bench serve`` does not
write its schedule; requests it sends at once when it resumes are the evidence
(:func:`sdplan.runs.screen.sent_in_bursts`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sdplan.errors import InputFileError
from sdplan.runs import read_results, screen
from sdplan.runs.screen import MAX_BURST_LATENESS, sent_in_bursts

DATA = Path(__file__).parent / "data"


def run(name: str):
    return read_results(DATA / "served-client-behind-cpu" / name)[0][0]


@pytest.mark.parametrize(("name", "told"), [
    ("nosd_w16x192_r3.24.json", "34 of 81 requests sent at once in 5 bursts, about 8.95 s behind in all, 34%"),
    ("k2_w16x192_r5.94.json", "43 of 148 requests sent at once in 3 bursts, about 6.73 s behind in all, 25%"),
])
def test_a_client_that_froze_is_left_out_with_how_far_behind(name: str, told: str) -> None:
    measured = run(name)
    assert measured.sent_late is not None and measured.sent_late.startswith(told)
    reasons = screen(measured)
    assert len(reasons) == 1 and reasons[0].startswith(f"the client fell behind its own schedule ({told}")


@pytest.mark.parametrize("name", ["k4_w16x192_r3.24.json", "nosd_w128x64_r11.json", "k2_w128x64_r16.json"])
def test_runs_within_a_tenth_of_their_schedule_are_kept(name: str) -> None:
    measured = run(name)
    assert measured.sent_late is None and screen(measured) == []


def test_other_real_vllm_runs_are_told_behind_only_where_the_client_froze() -> None:
    """Of every real vLLM Poisson run the tests keep, from other days and servers, one is told behind: a
    calibration point of 2026-11-22 (served-cpu/nosd_p75_r0.json, 11.8 req/s) whose client sent 74 of 354
    requests in 13 bursts, one of 14 within a millisecond, and, in a burst of 7, got every answer whole
    1.2 s after sending (TTFT equal to the latency), the freeze of the decode-heavy runs."""
    told = {}
    checked = 0
    for folder in ("served-cpu", "served-arrivals-cpu", "served-behind-cpu", "served-passes-cpu",
                   "served-eagle-cpu", "served-eagle-cpu-2"):
        for path in sorted((DATA / folder).rglob("*.json")):
            try:
                runs = read_results(path)[0]
            except InputFileError:  # not every JSON file there is a vLLM result (calibration manifests)
                continue
            for measured in runs:
                if measured.requested_rate_rps and measured.held_back_by_cap is None:
                    checked += 1
                    if measured.sent_late is not None:
                        told[f"{folder}/{path.name}"] = measured.sent_late
    assert checked >= 10
    assert list(told) == ["served-cpu/nosd_p75_r0.json"]
    assert told["served-cpu/nosd_p75_r0.json"].startswith("74 of 354 requests sent at once in 13 bursts, about 5.17 s")


def test_burst_rule_on_send_times() -> None:
    """Three sends within 1 ms are a burst of 3 (2 gaps of 1/rate behind); two are not; the share is of the run."""
    rate, duration = 4.0, 10.0
    spaced = [i * 0.25 for i in range(40)]
    assert sent_in_bursts(spaced, rate, duration) is None
    pair = spaced[:10] + [2.5, 2.5005] + spaced[11:]
    assert sent_in_bursts(pair, rate, duration) is None
    behind = MAX_BURST_LATENESS * duration  # 1 s: a burst of 5 (4 gaps of 0.25 s) is exactly that, not over
    five = spaced[:10] + [2.5 + 1e-4 * i for i in range(5)] + spaced[15:]
    assert sent_in_bursts(five, rate, duration) is None and 4 / rate == pytest.approx(behind)
    six = spaced[:10] + [2.5 + 1e-4 * i for i in range(6)] + spaced[16:]
    assert sent_in_bursts(six, rate, duration) == (
        "6 of 40 requests sent at once in 1 burst, about 1.25 s behind in all, 12% of the run")
    assert sent_in_bursts(six, float("inf"), duration) is None and sent_in_bursts(six, rate, None) is None
