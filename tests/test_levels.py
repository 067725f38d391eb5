"""The served measurement plan's rules (:mod:`sdplan.measure.levels`), called directly: no servers, no fakes."""

from __future__ import annotations

import pytest

from sdplan.fitting.steady_state import MIN_KEPT_UP_FRACTION
from sdplan.measure.levels import (
    MIN_THROUGHPUT_GAIN,
    SERVED_GRIDS,
    concurrency_levels,
    next_clients,
    overload_reason,
    point_seed,
    requests_held,
)

GRID = concurrency_levels(SERVED_GRIDS["quick"], 256)  # 1, 4, 16, 64


def test_next_clients_walks_the_grid_then_doubles_while_the_line_forecasts_a_gain() -> None:
    assert next_clients([], GRID, 256, 256) == (1, None)
    assert next_clients([(1, 10.0), (4, 38.0)], GRID, 256, 256) == (16, None)
    # past the grid: N = 16 at 140 and N = 64 at 500 req/s put 64 at 53% of the line's plateau
    level, why = next_clients([(1, 10.0), (4, 38.0), (16, 140.0), (64, 500.0)], GRID, 256, 256)
    assert level == 128 and why is not None and "measuring N=128" in why
    # a KV cache that holds fewer requests than max_num_seqs caps the doubling, and the note says so
    level, why = next_clients([(1, 10.0), (4, 38.0), (16, 140.0), (64, 500.0)], GRID, 100, 256)
    assert level == 100 and why is not None and "its KV cache holds 100" in why


def test_next_clients_stops_on_a_plateau_at_the_cap_and_without_a_known_cap() -> None:
    flat = 38.0 * MIN_THROUGHPUT_GAIN * 0.99  # less than the gain that goes on
    level, why = next_clients([(1, 10.0), (4, 38.0), (16, flat)], GRID, 256, 256)
    assert level is None and why is not None and why.startswith("throughput stopped rising at N=16")
    assert next_clients([(1, 10.0), (4, 38.0), (16, 140.0), (64, 500.0)], GRID, 64, 64) == (None, None)
    level, why = next_clients([(1, 10.0), (4, 38.0), (16, 140.0), (64, 500.0)], GRID, None, None)
    assert level is None and why is not None and "max_num_seqs is not known" in why


def test_overload_reason_names_the_rule_that_judged_the_point() -> None:
    behind = MIN_KEPT_UP_FRACTION - 0.2
    assert overload_reason(behind, 20.0, 0.1, 8) == f"kept up {behind:.0%} < {MIN_KEPT_UP_FRACTION:.0%}"
    # kept up, but 20 req/s x 0.5 s = 10 requests in flight on average, of which the server runs 8
    assert overload_reason(0.99, 20.0, 0.5, 8) == "10 requests in flight on average > the 8 it runs at once"
    assert overload_reason(0.99, 20.0, 0.35, 8) is None  # 7 in flight: every request runs
    assert overload_reason(None, 20.0, 0.5, None) is None  # no per-request times, no cap: not judged
    assert overload_reason(None, None, 0.5, 8) is None  # a closed loop


@pytest.mark.parametrize(("tokens", "prompt", "output", "expected"), [
    (40 * 192 + 100, 128, 64, 40),
    (100, 128, 64, 1),  # the server started, so one request fits
    (1000, 0, 0, None),  # an empty workload
])
def test_requests_held_by_a_kv_cache(tokens, prompt, output, expected) -> None:
    assert requests_held(tokens, prompt, output) == expected


def test_every_point_and_attempt_draws_its_own_seed() -> None:
    seeds = {point_seed(seed, key, attempt) for seed in (0, 1) for key in ("nosd_c1_r0", "nosd_c4_r0", "k2_c1_r0")
             for attempt in (0, 1)}
    assert len(seeds) == 12 and all(0 <= s < 2**31 for s in seeds)
    assert point_seed(3, "k2_p75_r0", 0) == point_seed(3, "k2_p75_r0", 0)  # the same point: the same prompts
