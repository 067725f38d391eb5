"""The latency model and the planner against closed forms, limits and properties."""

from __future__ import annotations

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose

from sdplan.errors import InvalidValueError
from sdplan.inputs.acceptance import expected_tokens_per_cycle
from sdplan.latency import knee, model
from sdplan.latency.coefficients import Coefficients
from sdplan.planning import planner


def coefficients(**overrides: float) -> Coefficients:
    values = dict(
        c1p_s=0.05, c2p_s=0.01, c1v_s=0.009, c2v_s=1e-4, c1d_s=0.001, c2d_s=5e-5,
        baseline_c1_step_s=0.008, baseline_c2_step_s=1e-4, prompt_tokens=1000.0, output_tokens=500.0,
    )
    values.update(overrides)
    return Coefficients(**values)


positive = st.floats(1e-6, 1e-1, allow_nan=False, allow_infinity=False)


@st.composite
def random_coefficients(draw: st.DrawFn) -> Coefficients:
    return Coefficients(
        c1p_s=draw(positive), c2p_s=draw(positive), c1v_s=draw(positive), c2v_s=draw(positive),
        c1d_s=draw(positive), c2d_s=draw(positive), baseline_c1_step_s=draw(positive),
        baseline_c2_step_s=draw(positive), prompt_tokens=float(draw(st.integers(1, 8192))),
        output_tokens=float(draw(st.integers(2, 4096))),
    )


def test_demand_matches_equation_3_by_hand() -> None:
    c = coefficients()
    alpha, k = 0.8, 3
    e = 1 + 0.8 + 0.64 + 0.512
    c1, c2 = model.speculative_demand(c, alpha, k)
    assert float(c1) == pytest.approx(0.05 + 500 / e * (0.009 + 3 * 0.001), rel=1e-12)
    assert float(c2) == pytest.approx(0.01 + 500 / e * (1e-4 + 3 * 5e-5), rel=1e-12)
    c1_d, c2_d = model.baseline_demand(c)
    # no SD: the prefill emits token 1, then g - 1 = 499 decode steps (docs/model.md#cycles)
    assert c1_d == pytest.approx(0.05 + 499 * 0.008)
    assert c2_d == pytest.approx(0.01 + 499 * 1e-4)


def test_frontend_floor_binds_where_the_steps_are_cheap_per_streamed_chunk() -> None:
    # C2 = c2p + (g - 1) c2_step = 0.01 + 499e-4 = 0.0599 s off; 500 chunks x 0.2 ms = 0.1 s binds
    floored = coefficients(frontend_chunk_s=2e-4)
    c1_d, c2_d = model.baseline_demand(floored)
    assert c1_d == pytest.approx(model.baseline_demand(coefficients())[0])  # C1 never moves
    assert c2_d == pytest.approx(500 * 2e-4)
    assert float(model.saturation_rate(c2_d)) == pytest.approx(10.0)  # 1/(n phi): the frontend's plateau
    # with SD an answer streams in g/E chunks: 500/2.952 x 0.2 ms = 0.0339 s, under eq. 3's C2 = 0.0523 s
    alpha, k = 0.8, 3
    assert float(model.speculative_demand(floored, alpha, k)[1]) == pytest.approx(
        float(model.speculative_demand(coefficients(), alpha, k)[1]))
    # a floor above eq. 3's C2 sets it per chunk
    tokens = float(expected_tokens_per_cycle(alpha, k))
    high = coefficients(frontend_chunk_s=1e-3)
    assert float(model.speculative_demand(high, alpha, k)[1]) == pytest.approx(500 / tokens * 1e-3)
    # phi = 0 (every calibration that did not measure it) leaves C2 as it is, a negative draw included
    assert float(model.frontend_floor(coefficients(), -0.01)) == -0.01
    # and the option table the planner reads carries the floor in column 0 only
    demands = model.option_demands(floored, [3], numpy.array([tokens]))
    assert demands.c2_s[0] == pytest.approx(0.1)
    assert demands.c2_s[1] == pytest.approx(float(model.speculative_demand(coefficients(), alpha, k)[1]))


def test_latency_closed_form_and_zero_load() -> None:
    assert float(model.mean_latency(2.0, 0.1, 0.0)) == 2.0  # lambda -> 0 gives C1
    assert float(model.mean_latency(2.0, 0.1, 5.0)) == pytest.approx(4.0)
    assert float(model.mean_latency(2.0, 0.1, 10.0)) == numpy.inf  # at saturation: unstable, not NaN
    assert float(model.mean_latency(2.0, 0.1, 50.0)) == numpy.inf
    assert float(model.effective_batch(5.0, 4.0)) == 20.0


@given(random_coefficients(), st.floats(0.0, 1.0), st.integers(1, 10))
def test_latency_tends_to_c1_at_zero_load(c: Coefficients, alpha: float, k: int) -> None:
    c1, c2 = model.speculative_demand(c, alpha, k)
    tiny = 1e-9 / float(c2)
    assert float(model.mean_latency(c1, c2, tiny)) == pytest.approx(float(c1), rel=1e-8)


@given(random_coefficients(), st.floats(0.0, 1.0), st.integers(1, 10))
def test_latency_strictly_increasing_below_saturation(c: Coefficients, alpha: float, k: int) -> None:
    c1, c2 = model.speculative_demand(c, alpha, k)
    rates = numpy.linspace(0.0, 0.999, 50) / float(c2)
    latency = model.mean_latency(c1, c2, rates)
    assert numpy.all(numpy.isfinite(latency))
    assert numpy.all(numpy.diff(latency) > 0)


@given(random_coefficients(), st.floats(0.01, 0.99), st.integers(1, 10))
def test_zero_load_speedup_is_c1_ratio(c: Coefficients, alpha: float, k: int) -> None:
    result = planner.plan(c, [0.0], [k], [alpha])
    c1_d, _ = model.baseline_demand(c)
    assert float(result.speedup[0, 0, 0]) == pytest.approx(c1_d / float(result.c1_s[0, 0]), rel=1e-12)


@settings(max_examples=200)
@given(st.floats(0.1, 10.0), st.floats(1e-3, 1.0), st.floats(0.05, 0.98), st.floats(1.02, 5.0), st.booleans())
def test_speedup_is_one_at_break_even(c1_d: float, c2_d: float, c1_ratio: float, c2_ratio: float, flip: bool) -> None:
    # A break-even exists when SD is better on one demand and worse on the other; try both orders.
    c1_r, c2_r = (1 / c1_ratio, 1 / c2_ratio) if flip else (c1_ratio, c2_ratio)
    c1, c2 = c1_d * c1_r, c2_d * c2_r
    even = model.break_even(c1_d, c2_d, numpy.array([c1]), numpy.array([c2]))
    rate = float(even.rate_rps[0])
    assert numpy.isfinite(rate) and rate > 0
    latency_d = model.mean_latency(c1_d, c2_d, rate)
    latency_sd = model.mean_latency(c1, c2, rate)
    assert numpy.isfinite(latency_d) and numpy.isfinite(latency_sd)  # lies below both saturation rates
    assert float(model.speedup(latency_d, latency_sd)) == pytest.approx(1.0, rel=1e-9)
    # and the side on which SD wins is the one reported
    below = rate * 0.5
    faster_below = float(model.mean_latency(c1, c2, below)) < float(model.mean_latency(c1_d, c2_d, below))
    assert faster_below == bool(even.sd_faster_below[0]) == (not flip)


@given(random_coefficients(), st.floats(0.01, 0.99), st.integers(1, 10))
def test_break_even_from_random_coefficients_is_consistent(c: Coefficients, alpha: float, k: int) -> None:
    c1_d, c2_d = model.baseline_demand(c)
    c1, c2 = model.speculative_demand(c, alpha, k)
    even = model.break_even(c1_d, c2_d, c1, c2)
    crosses = (float(c1) - c1_d) * (float(c2) - c2_d) < 0
    assert numpy.isfinite(float(even.rate_rps)) == crosses
    if crosses:
        rate = float(even.rate_rps)
        ratio = model.speedup(model.mean_latency(c1_d, c2_d, rate), model.mean_latency(c1, c2, rate))
        assert float(ratio) == pytest.approx(1.0, rel=1e-6)  # cancellation when C2 ~ C2_D (g = 2)


def test_speedup_equation_2_form() -> None:
    c = coefficients()
    c1_d, c2_d = model.baseline_demand(c)
    c1, c2 = model.speculative_demand(c, 0.7, 4)
    c1_r, c2_r = float(c1) / c1_d, float(c2) / c2_d
    for rate in (0.5, 2.0, 5.0, 8.0):
        r = rate * c2_d
        eq2 = (1 / c1_r) * (1 + (1 - c2_r) * r / (1 - r))
        ours = model.speedup(model.mean_latency(c1_d, c2_d, rate), model.mean_latency(c1, c2, rate))
        assert float(ours) == pytest.approx(eq2, rel=1e-12)


def test_break_even_cases() -> None:
    # SD faster at zero load, slower per concurrent request: a break-even exists, SD wins below it.
    even = model.break_even(2.0, 0.1, numpy.array([1.0]), numpy.array([0.2]))
    assert even.rate_rps[0] == pytest.approx((0.5 - 1) / (0.5 - 2.0) / 0.1)
    assert bool(even.sd_faster_below[0])
    # SD better on both: never loses.
    even = model.break_even(2.0, 0.1, numpy.array([1.0]), numpy.array([0.05]))
    assert numpy.isnan(even.rate_rps[0]) and bool(even.sd_faster_below[0])
    # SD worse on both: never wins.
    even = model.break_even(2.0, 0.1, numpy.array([3.0]), numpy.array([0.2]))
    assert numpy.isnan(even.rate_rps[0]) and not bool(even.sd_faster_below[0])
    # SD slower at zero load but cheaper per request: wins above the break-even.
    even = model.break_even(2.0, 0.1, numpy.array([3.0]), numpy.array([0.05]))
    assert numpy.isfinite(even.rate_rps[0]) and not bool(even.sd_faster_below[0])


def test_regime_labels() -> None:
    assert list(model.regime(numpy.array([0.1, 0.9, 0.95, 1.0, 3.0]))) == [
        "stable", "stable", "near_saturation", "unstable", "unstable",
    ]


def test_speedup_edge_cases_are_explicit() -> None:
    result = model.speedup(numpy.array([numpy.inf, 1.0, numpy.inf]), numpy.array([1.0, numpy.inf, numpy.inf]))
    assert result[0] == numpy.inf and result[1] == 0.0 and numpy.isnan(result[2])


def test_plan_shapes_and_best_k_matches_brute_force() -> None:
    c = coefficients()
    rates = numpy.linspace(0, 12, 25)
    ks = numpy.arange(1, 9)
    alphas = [0.5, 0.7, 0.9]
    result = planner.plan(c, rates, ks, alphas)
    assert result.latency_s.shape == (3, 25, 8)
    assert result.best_k.shape == (3, 25)
    c1_d, c2_d = model.baseline_demand(c)
    for ia, alpha in enumerate(alphas):
        for ir, rate in enumerate(rates):
            wait = float(knee.prefill_wait_s(c.c2p_s, c.prompt_cv, rate))  # the prefills queued ahead
            options = {0: float(model.mean_latency(c1_d + wait, c2_d, rate))}
            for k in ks:
                c1, c2 = model.speculative_demand(c, alpha, int(k))
                options[int(k)] = float(model.mean_latency(c1 + wait, c2, rate))
            best = min(options, key=lambda key: (options[key], key))
            if numpy.isinf(options[best]):
                assert result.best_k[ia, ir] == planner.NONE_STABLE
            else:
                assert result.best_k[ia, ir] == best
                assert result.best_latency_s[ia, ir] == pytest.approx(options[best], rel=1e-12)


def test_best_k_shrinks_as_load_grows_when_c2_grows_with_k() -> None:
    # c2d > 0 makes C2 grow with k (for these alphas); the best k must not increase with load.
    c = coefficients(c2d_s=2e-4)
    result = planner.plan(c, numpy.linspace(0, 20, 200), numpy.arange(1, 11), [0.6, 0.8, 0.9])
    for ia in range(3):
        stable = result.best_k[ia][result.best_k[ia] != planner.NONE_STABLE]
        assert numpy.all(numpy.diff(stable) <= 0), stable
        assert stable[0] > stable[-1]  # and it actually changes across the load range


@given(random_coefficients(), st.floats(0.0, 1.0))
def test_plan_never_produces_nan_latency(c: Coefficients, alpha: float) -> None:
    _, c2_d = model.baseline_demand(c)
    rates = numpy.linspace(0, 2.0 / c2_d, 11)
    result = planner.plan(c, rates, [1, 2, 4, 8], [alpha])
    assert not numpy.any(numpy.isnan(result.latency_s))
    assert not numpy.any(numpy.isnan(result.baseline_latency_s))
    unstable = result.utilisation >= 1
    assert numpy.all(numpy.isinf(result.latency_s[unstable]))
    assert numpy.all(numpy.isfinite(result.latency_s[~unstable]))


def test_tokens_per_cycle_in_plan() -> None:
    result = planner.plan(coefficients(), [1.0], [1, 4], [0.8])
    assert_allclose(result.tokens_per_cycle, expected_tokens_per_cycle(0.8, numpy.array([[1, 4]])))


@pytest.mark.parametrize(
    ("rates", "ks", "alphas", "message"),
    [
        ([-1.0], [1], [0.5], "rates"),
        ([numpy.nan], [1], [0.5], "rates"),
        ([1.0], [0], [0.5], "draft lengths"),
        ([1.0], [1], [1.5], "acceptance"),
        ([], [1], [0.5], "at least one"),
    ],
)
def test_plan_rejects_bad_grids(rates, ks, alphas, message) -> None:
    with pytest.raises(InvalidValueError, match=message):
        planner.plan(coefficients(), rates, ks, alphas)


def test_default_rates_reach_saturation() -> None:
    c = coefficients()
    rates = planner.default_rates(c, [1, 2, 3], [0.7])
    assert len(rates) == 12 and rates == sorted(rates) and rates[0] > 0
    _, c2_d = model.baseline_demand(c)
    assert rates[-1] >= 0.99 / c2_d


def test_option_demands_put_off_in_column_0_and_keep_the_acceptance_rows() -> None:
    c = coefficients()
    ks = [1, 3, 5]
    tokens = expected_tokens_per_cycle(numpy.array([[0.6], [0.9]]), numpy.array([ks], dtype=float))  # (2, 3)
    options = model.option_demands(c, ks, tokens)
    assert options.draft_lengths.tolist() == [0, 1, 3, 5]
    assert options.c1_s.shape == options.c2_s.shape == options.tokens_per_cycle.shape == (2, 4)
    c1_d, c2_d = model.baseline_demand(c)
    assert_allclose(options.c1_s[:, 0], c1_d)
    assert_allclose(options.c2_s[:, 0], c2_d)
    assert_allclose(options.tokens_per_cycle[:, 0], 1.0)
    c1_sd, c2_sd = model.speculative_demand(c, numpy.array([[0.6], [0.9]]), numpy.array([ks], dtype=float))
    assert_allclose(options.c1_s[:, 1:], c1_sd)
    assert_allclose(options.c2_s[:, 1:], c2_sd)
    one_row = model.option_demands(c, ks, tokens[1])
    assert one_row.c1_s.shape == (4,)
    assert_allclose(one_row.c1_s, options.c1_s[1])


def test_frontend_bound_options_are_those_whose_c2_is_the_floor() -> None:
    floored = coefficients(frontend_chunk_s=3e-4)  # off: 500 chunks x 0.3 ms = 0.15 s > its 0.0599 s
    # two acceptances; at the second k=3 streams 417 chunks (0.125 s > 0.114 s), k=6 385 (0.115 s < 0.164 s)
    tokens = numpy.array([[2.952, 3.5], [1.2, 1.3]])
    demands = model.option_demands(floored, [3, 6], tokens)
    assert planner.frontend_bound_options(floored, [0, 3, 6], demands.c2_s, demands.tokens_per_cycle) == ["off", "k=3"]
    assert planner.frontend_bound_options(coefficients(), [0, 3, 6], demands.c2_s, demands.tokens_per_cycle) == []


def wave_by_steps(clients: int, prompt_tokens: int, chunk_tokens: int) -> float:
    """The opening wave scheduled step by step: each step takes ``chunk_tokens`` prompt tokens in arrival
    order (a prompt split where it does not fit); returns the mean prompt tokens prefilled by the end of the
    step each prompt finishes in, in prompts (an independent count of what ``opening_wave_prompts`` sums)."""
    left = [prompt_tokens] * clients
    done_tokens, finished = 0, []
    while len(finished) < clients:
        budget = chunk_tokens
        completed_now = []
        for index, remaining in enumerate(left):
            if budget == 0:
                break
            if remaining == 0:
                continue
            take = min(remaining, budget)
            left[index] -= take
            budget -= take
            done_tokens += take
            if left[index] == 0:
                completed_now.append(index)
        finished += [done_tokens] * len(completed_now)
    return sum(finished) / clients / prompt_tokens


@pytest.mark.parametrize(("clients", "prompt", "chunk"), [
    (1, 1024, 8192), (4, 1024, 8192), (64, 1024, 8192), (63, 1000, 8192), (17, 3000, 8192), (64, 8192, 8192),
    (9, 20000, 8192), (128, 100, 256), (5, 4096, 2048)])
def test_opening_wave_matches_a_step_by_step_schedule(clients: int, prompt: int, chunk: int) -> None:
    assert model.opening_wave_prompts(clients, prompt, chunk) == pytest.approx(
        wave_by_steps(clients, prompt, chunk), rel=1e-12)


@given(st.integers(1, 300), st.integers(1, 64))
def test_opening_wave_closed_forms(clients: int, per_step: int) -> None:
    # one prompt at a time: (N + 1)/2; c whole prompts a step: [c^2 S (S - 1)/2 + (N - (S - 1) c) N] / N
    assert model.opening_wave_prompts(clients, 8192, 4096) == pytest.approx((clients + 1) / 2)
    steps = -(-clients // per_step)
    closed = (per_step ** 2 * steps * (steps - 1) / 2 + (clients - (steps - 1) * per_step) * clients) / clients
    assert model.opening_wave_prompts(clients, 100, 100 * per_step) == pytest.approx(closed)


def test_closed_loop_wave_is_the_wave_spread_over_the_rounds() -> None:
    c = coefficients(c2p_s=0.4, prompt_tokens=8192.0)
    assert model.closed_loop_wave_s(c, 1, 8192, 1) == 0.0  # one client: no one in front
    # 64 prompts of a whole step each: (64 - 1)/2 prompts in front on average, c2p each, over 10 rounds
    assert model.closed_loop_wave_s(c, 64, 8192, 10) == pytest.approx(63 / 2 * 0.4 / 10)
    assert model.closed_loop_wave_s(c, 64, 8192, 20) == pytest.approx(model.closed_loop_wave_s(c, 64, 8192, 10) / 2)
    # shorter prompts share steps: a wave of 64 x 1024 tokens is 8 full steps, each prompt waits for its step
    short = coefficients(c2p_s=0.05, prompt_tokens=1024.0)
    assert model.closed_loop_wave_s(short, 64, 8192, 1) == pytest.approx((36.0 - 1.0) * 0.05)
    with pytest.raises(InvalidValueError, match="at least one round"):
        model.closed_loop_wave_s(c, 4, 8192, 0.5)
    with pytest.raises(InvalidValueError, match="at least one client"):
        model.opening_wave_prompts(0, 1024, 8192)


def prefill_first_closed_loop(clients: int, prompt: int, output: int, chunk: int, rounds: int, per_token_s: float,
                              step_s: float, per_other_s: float) -> tuple[list[float], list[float]]:
    """A prefill-first engine (SGLang's order) under a closed loop, step by step: (TTFT, E2E) of each request.

    While prompt tokens wait, each step prefills up to ``chunk`` of them in arrival order (a prompt split where
    it does not fit) at ``per_token_s`` a token, and the prefill step emits each finished prompt's first token;
    otherwise one decode step of the ``n`` running requests costs ``step_s + (n - 1) per_other_s``. A request
    ends with its ``output``-th token and its client sends the next at once (fixed lengths)."""
    now = 0.0
    waiting = [(client, 0.0, prompt) for client in range(clients)]  # (client, arrival, prompt tokens left)
    running: list[list[float]] = []  # [client, arrival, tokens emitted]
    sent = [1] * clients
    ttft: list[float] = []
    e2e: list[float] = []
    while waiting or running:
        if waiting:
            budget, prefilled, done = chunk, 0, []
            while waiting and budget:
                client, arrival, left = waiting[0]
                take = min(left, budget)
                budget, prefilled = budget - take, prefilled + take
                if take == left:
                    done.append((client, arrival))
                    waiting.pop(0)
                else:
                    waiting[0] = (client, arrival, left - take)
            now += prefilled * per_token_s
            for client, arrival in done:
                ttft.append(now - arrival)
                running.append([client, arrival, 1])
            continue
        now += step_s + (len(running) - 1) * per_other_s
        for request in running:
            request[2] += 1
        for client, arrival, _ in [r for r in running if r[2] == output]:
            e2e.append(now - arrival)
            if sent[int(client)] < rounds:
                sent[int(client)] += 1
                waiting.append((int(client), now, prompt))
        running = [r for r in running if r[2] < output]
    return ttft, e2e


@pytest.mark.parametrize(("clients", "prompt", "chunk"), [(16, 1024, 8192), (40, 4096, 8192), (7, 3000, 16384)])
def test_a_prefill_first_wave_recurs_every_round_and_leaves_e2e_to_the_model(clients: int, prompt: int,
                                                                              chunk: int) -> None:
    per_token_s, step_s, per_other_s, output, rounds = 2e-5, 0.01, 2e-4, 50, 4
    ttft, e2e = prefill_first_closed_loop(clients, prompt, output, chunk, rounds, per_token_s, step_s, per_other_s)
    # the same engine in the model's terms: own prefill c1p = other prompt's prefill c2p = p x per-token cost
    c = coefficients(c1p_s=prompt * per_token_s, c2p_s=prompt * per_token_s, baseline_c1_step_s=step_s,
                     baseline_c2_step_s=per_other_s, prompt_tokens=float(prompt), output_tokens=float(output))
    wave_ttft, wave_e2e = model.closed_loop_waves_s(c, clients, chunk, rounds=None, recurs=True)
    later = slice(clients, None)  # every round after the first is a wave again: its TTFT is the first round's
    assert numpy.mean(ttft[later]) == pytest.approx(numpy.mean(ttft[:clients]), rel=1e-9)
    assert numpy.mean(ttft) == pytest.approx(c.c1p_s + wave_ttft, rel=1e-9)
    # E2E is the steady model's closed loop: every other prompt's prefill once, C2's c2p
    c1, c2 = model.baseline_demand(c)
    assert wave_e2e == 0.0
    assert numpy.mean(e2e) == pytest.approx(c1 + (clients - 1) * c2, rel=1e-9)


def test_closed_loop_waves_open_the_run_only_where_they_do_not_recur() -> None:
    c = coefficients(c2p_s=0.4, prompt_tokens=8192.0)
    opening = model.closed_loop_wave_s(c, 64, 8192, 10)
    # the opening wave does the run's prefills first, not more of them: TTFT only, the mean latency stays
    assert model.closed_loop_waves_s(c, 64, 8192, 10, recurs=False) == (pytest.approx(opening), 0.0)
    assert model.closed_loop_waves_s(c, 64, 8192, None, recurs=False) == (0.0, 0.0)  # rounds unknown
    recurring, e2e = model.closed_loop_waves_s(c, 64, 8192, 10, recurs=True)  # rounds do not matter
    assert (recurring, e2e) == (pytest.approx(10 * opening), 0.0)
