"""A prefill that grows as the square of its prompt, over prompts of different lengths.

A derived file prices a prompt's prefill as ``a p + a2 p^2`` and its interference as ``l p + l2 p^2``
(``docs/model.md#per-step-form``). The model works at the mean request, so over a mix of prompts it must take the
mean of ``p^2``, not the square of the mean; the simulator prices each request at its own length.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy
import pytest

from sdplan.calibration import resolve_calibration
from sdplan.latency.coefficients import Coefficients, over_prompts
from sdplan.planning.scenario import ScenarioOptions, histogram_prompt_cv, resolve_scenario
from sdplan.simulate import SimulationConfig, simulate

#: Interference per prompt token and per squared prompt token at a mean prompt of 1,024 tokens.
LINEAR_S, SQUARE_S, MEAN_PROMPT = 1.6e-5, 7e-10, 1024.0
#: A forward pass of an idle engine pays c1p - c2p besides its chunk.
IDLE_S = 0.02


def coefficients(prompt_cv: float = 0.0) -> Coefficients:
    square = SQUARE_S * MEAN_PROMPT**2 * (1.0 + prompt_cv**2)
    c2p = LINEAR_S * MEAN_PROMPT + square
    return Coefficients(c1p_s=IDLE_S + c2p, c2p_s=c2p, c2p_sq_s=square, prompt_cv=prompt_cv, c1v_s=0.0072,
                        c2v_s=1e-4, c1d_s=0.0012, c2d_s=5.6e-5, baseline_c1_step_s=0.0067, baseline_c2_step_s=1e-4,
                        prompt_tokens=MEAN_PROMPT, output_tokens=8.0)


@pytest.mark.parametrize(("prompt", "budget", "prompt_cv"), [(256, 8192, 0.0), (4096, 1024, 0.0),
                                                            (4096, 1024, 1.5), (1_000_000, 8192, 0.7)])
def test_a_lone_prompt_adds_its_own_lengths_interference(prompt: int, budget: int, prompt_cv: float) -> None:
    # Alone, a prompt of p tokens under a budget of b takes ceil(p / b) forward passes of an idle engine, whose
    # chunks add up to l p + l2 p^2 (the squared term at its own length, not the mean's), whatever cv the
    # coefficients average over. The old rule, c2p / p_mean a token, gave l p + l2 p p_mean (cv = 0).
    run = simulate(coefficients(prompt_cv), SimulationConfig(
        rate_rps=1e-6, draft_length=0, position_rates=(), requests=10, prompt_tokens=prompt, output_tokens=8,
        max_num_batched_tokens=budget), numpy.random.default_rng(0))
    expected = math.ceil(prompt / budget) * IDLE_S + LINEAR_S * prompt + SQUARE_S * prompt**2
    assert run.ttft_s == pytest.approx(expected, rel=1e-9, abs=1e-6)  # arrivals ~10^7 s in


def test_over_prompts_adds_the_squared_terms_times_the_variance() -> None:
    base = dataclasses.replace(coefficients(), c1p_s=0.05, c1p_sq_s=4e-10 * MEAN_PROMPT**2)
    spread = over_prompts(base, 2.0)
    variance = (2.0 * MEAN_PROMPT) ** 2
    assert spread.c2p_s == pytest.approx(base.c2p_s + SQUARE_S * variance, rel=1e-12)
    assert spread.c1p_s == pytest.approx(base.c1p_s + 4e-10 * variance, rel=1e-12)
    back = over_prompts(over_prompts(spread, 0.5), 0.0)  # from any spread to any other: the same as from none
    for name in ("c1p_s", "c2p_s", "c1p_sq_s", "c2p_sq_s", "prompt_cv"):
        assert getattr(back, name) == pytest.approx(getattr(base, name), rel=1e-12, abs=1e-15)


def test_a_histogram_is_priced_at_the_mean_of_its_prompts_costs() -> None:
    # The default file (derived) has squared prefill terms. Over a histogram of 256- and 8,192-token prompts the
    # model's c1p and c2p are each prompt's own, averaged with the weights (outputs equal, so the decode terms do
    # not enter): the spread adds 11% and 20% to them.
    calibration = resolve_calibration(None)
    prompts, weights, output = [256.0, 8192.0], [1.0, 1.0 / 3.0], 512.0
    scenario = resolve_scenario(ScenarioOptions(lengths=(prompts, [output, output], weights)))
    mean_prompt = numpy.average(prompts, weights=weights)
    assert scenario.workload.prompt_tokens == round(mean_prompt)
    assert histogram_prompt_cv((prompts, [output, output], weights)) == pytest.approx(
        math.sqrt(numpy.average((numpy.asarray(prompts) - mean_prompt) ** 2, weights=weights)) / mean_prompt)
    own = [calibration.coefficients_at(p, output) for p in prompts]
    model = scenario.coefficients
    assert model.c2p_sq_s > 0.0
    # the model's p is the rounded mean (2,240 here, exactly the mean): the linear terms are the mean's
    for name in ("c1p_s", "c2p_s"):
        assert getattr(model, name) == pytest.approx(numpy.average([getattr(c, name) for c in own],
                                                                   weights=weights), rel=1e-9)
    at_mean = calibration.coefficients_at(scenario.workload.prompt_tokens, output)
    assert model.c2p_s > 1.18 * at_mean.c2p_s and model.c1p_s > 1.09 * at_mean.c1p_s
    # a prompt length given on the command line is a single length: no spread
    given = resolve_scenario(ScenarioOptions(lengths=(prompts, [output, output], weights), prompt_tokens=2240))
    assert given.coefficients.c2p_s == pytest.approx(at_mean.c2p_s, rel=1e-12)


@pytest.mark.parametrize(("calibration", "lower"), [("h100-sxm_llama-3.1-8b_llama-3.2-1b_derived", True),
                                                    ("cpu-epyc-2core_tiny-llama-h256-l4_tiny-llama-h128-l1_measured",
                                                     False)])
def test_plan_takes_a_lengths_file(sdplan, tmp_path, calibration: str, lower: bool) -> None:
    # plan plans the histogram's mean request, with its prompts' spread where the file prices a squared prefill
    # (derived): it saturates earlier than at the mean prompt alone. A file whose prefill is linear in the prompt
    # (measured on CPU) plans the same as at the mean.
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("prompt_tokens,output_tokens,weight\n256,512,3\n8192,512,1\n")
    runs = {}
    for name, flags in (("file", ("--lengths-file", str(lengths))), ("mean", ("--prompt-tokens", "2240",
                                                                              "--output-tokens", "512"))):
        result = sdplan("plan", "-c", calibration, *flags, "-f", "json")
        assert result.exit_code == 0, result.output
        runs[name] = json.loads(result.stdout)
    assert runs["file"]["workload"]["prompt_tokens"] == 2240
    file, mean = (runs[name]["baseline"]["saturation_rate_rps"] for name in ("file", "mean"))
    if lower:
        assert runs["file"]["coefficients"]["prompt_cv"] > 1.5
        assert file < 0.97 * mean
    else:  # the same prefill as at the mean; only the prefill queue's wait grows with the prompts' spread
        for key in ("c1p_s", "c2p_s"):
            assert runs["file"]["coefficients"][key] == pytest.approx(runs["mean"]["coefficients"][key], rel=1e-12)
        assert 0.99 * mean < file < mean
