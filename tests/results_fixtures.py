"""Benchmark result files in the real formats, written by the tests from known coefficients.

Field names follow the documented lists (``docs/engines.md#benchmark-result-fields``: vLLM
``bench serve`` and GuideLLM v2 reports); values come from the model with seeded multiplicative noise, so a fit
of these files must recover the coefficients that made them.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

from sdplan.inputs.acceptance import expected_tokens_per_cycle
from sdplan.latency import knee, model
from sdplan.latency.coefficients import Coefficients

TRUE = Coefficients(c1p_s=0.04, c2p_s=0.02, c1v_s=0.009, c2v_s=1.2e-4, c1d_s=0.0012, c2d_s=5e-5,
                    baseline_c1_step_s=0.007, baseline_c2_step_s=1e-4, prompt_tokens=1024, output_tokens=512,
                    ttft_wait_steps=0.7, ttft_load_steps=2.0)
CONFIGURATIONS = [(0, None), (2, 0.6), (4, 0.6), (2, 0.85), (4, 0.85), (6, 0.85)]
LOADS = (0.1, 0.25, 0.4, 0.55, 0.7, 0.85)  # fractions of the earliest saturation rate


def points(noise: float = 0.0, seed: int = 3, coefficients: Coefficients = TRUE,
           configurations=CONFIGURATIONS, loads=LOADS):
    """(k, alpha, rate, latency, ttft, tpot) tuples for every configuration and load."""
    rng = random.Random(seed)
    g = coefficients.output_tokens

    def demand(k, alpha):
        c1, c2 = model.baseline_demand(coefficients) if k == 0 else model.speculative_demand(coefficients, alpha, k)
        return float(c1), float(c2)

    # One rate grid for every configuration, as in a real sweep (fractions of the earliest saturation).
    ceiling = 1.0 / max(demand(k, alpha)[1] for k, alpha in configurations)
    for k, alpha in configurations:
        c1, c2 = demand(k, alpha)
        for load in loads:
            rate = load * ceiling
            # an open loop's law, with the wait for the prefills queued ahead (docs/model.md#prefills-queued-ahead)
            wait = float(knee.prefill_wait_s(coefficients.c2p_s, coefficients.prompt_cv, rate))
            exact = (c1 + wait) / (1 - rate * c2)
            latency = exact * (1 + rng.gauss(0, noise))
            tokens = 1.0 if k == 0 else float(expected_tokens_per_cycle(alpha, k))
            ttft = float(model.time_to_first_token(coefficients, k, rate * exact, tokens, rate))
            ttft *= 1 + rng.gauss(0, noise)
            yield k, alpha, rate, latency, ttft, (latency - ttft) / (g - 1)


def write_vllm(folder: Path, noise: float = 0.0, with_e2el: bool = True, old_goodput_key: bool = False,
               extra_runs: list[dict] | None = None, seed: int = 3) -> list[Path]:
    """One vLLM bench serve result JSON per run, as vLLM names them."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    g, p, n = TRUE.output_tokens, TRUE.prompt_tokens, 200
    for index, (k, alpha, rate, latency, ttft, tpot) in enumerate(points(noise, seed=seed)):
        document = {
            "date": "20261122-120000", "endpoint_type": "openai", "backend": "vllm", "label": None,
            "model_id": "meta-llama/Llama-3.1-8B-Instruct", "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
            "num_prompts": n, "request_rate": rate, "burstiness": 1.0, "max_concurrency": None,
            "duration": n / rate, "completed": n, "failed": 0, "total_input_tokens": int(p * n),
            "total_output_tokens": int(g * n), "request_throughput": rate,
            ("request_goodput:" if old_goodput_key else "request_goodput"): None,
            "output_throughput": rate * g, "total_token_throughput": rate * (g + p),
            "max_concurrent_requests": int(rate * latency * 2) + 1,
            "mean_ttft_ms": ttft * 1e3, "median_ttft_ms": ttft * 1e3, "std_ttft_ms": 0.0, "p99_ttft_ms": ttft * 1.5e3,
            "mean_tpot_ms": tpot * 1e3, "median_tpot_ms": tpot * 1e3, "std_tpot_ms": 0.0, "p99_tpot_ms": tpot * 1.3e3,
            "mean_itl_ms": tpot * 1e3, "median_itl_ms": tpot * 1e3, "std_itl_ms": 0.0, "p99_itl_ms": tpot * 2e3,
        }
        if with_e2el:
            document.update({"mean_e2el_ms": latency * 1e3, "median_e2el_ms": latency * 1e3, "std_e2el_ms": 0.0,
                             "p99_e2el_ms": latency * 1.4e3})
        if k:
            cycles = round(n * g / float(expected_tokens_per_cycle(alpha, k)))
            accepted = round(cycles * (float(expected_tokens_per_cycle(alpha, k)) - 1))
            positions = [alpha ** (i + 1) for i in range(k)]
            document.update({
                "spec_decode_acceptance_rate": accepted / (cycles * k) * 100.0,  # percent, as vLLM writes it
                "spec_decode_acceptance_length": 1 + accepted / cycles,
                "spec_decode_num_drafts": cycles, "spec_decode_draft_tokens": cycles * k,
                "spec_decode_accepted_tokens": accepted, "spec_decode_per_position_acceptance_rates": positions,
            })
        path = folder / f"vllm-{rate:.3f}qps-k{k}-{index}.json"
        path.write_text(json.dumps(document, indent=2))
        paths.append(path)
    for index, extra in enumerate(extra_runs or []):
        path = folder / f"extra-{index}.json"
        path.write_text(json.dumps(extra))
        paths.append(path)
    return paths


def _metric(mean: float) -> dict:
    return {"successful": {"mean": mean, "median": mean, "mode": mean, "variance": 0.0, "std_dev": 0.0,
                           "min": mean, "max": mean, "count": 100, "total_sum": mean * 100,
                           "percentiles": {"p50": mean, "p90": mean, "p99": mean}}}


def write_guidellm(path: Path, draft_length: int, alpha: float | None, noise: float = 0.0,
                   version: int | None = 2, little_off: bool = False, throughput_run: bool = False,
                   strategy: str = "poisson") -> Path:
    """A GuideLLM v2 report with one benchmark per load level of one configuration (``strategy``: its
    rate type, ``poisson`` or ``constant``)."""
    g, p = TRUE.output_tokens, TRUE.prompt_tokens
    benchmarks = []
    for _k, _a, rate, latency, ttft, tpot in points(noise, configurations=[(draft_length, alpha)]):
        concurrency = rate * latency * (1.5 if little_off else 1.0)
        benchmarks.append({
            "type_": "generative_benchmark",
            "config": {"id_": f"b{len(benchmarks)}", "run_id": "r", "run_index": len(benchmarks),
                       "strategy": {"type_": strategy, "rate": rate}},
            "metrics": {
                "request_totals": {"successful": 100, "incomplete": 0, "errored": 0, "total": 100},
                "requests_per_second": _metric(rate),
                "request_concurrency": _metric(concurrency),
                "request_latency": _metric(latency),  # seconds
                "prompt_token_count": _metric(p),
                "output_token_count": _metric(g),
                "time_to_first_token_ms": _metric(ttft * 1e3),
                "inter_token_latency_ms": _metric(tpot * 1e3),
                "time_per_output_token_ms": _metric(latency / g * 1e3),  # includes the first token
            },
        })
    if throughput_run:
        benchmarks.append({**benchmarks[-1], "config": {"strategy": {"type_": "throughput"}}})
    document = {"metadata": {"version": version, "guidellm_version": "0.7.0"} if version else {},
                "config": {}, "benchmarks": benchmarks}
    path.write_text(json.dumps(document, indent=2))
    return path


def write_csv(path: Path, noise: float = 0.0, seed: int = 3) -> Path:
    with path.open("w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["request_rate_rps", "draft_length", "acceptance", "prompt_tokens", "output_tokens",
                         "mean_e2e_latency_s", "mean_concurrency"])
        for k, alpha, rate, latency, _, _ in points(noise, seed=seed):
            writer.writerow([rate, k, alpha if alpha is not None else 0.0, TRUE.prompt_tokens, TRUE.output_tokens,
                             latency, rate * latency])
    return path
