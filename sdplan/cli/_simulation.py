"""Options and glue shared by ``simulate`` and ``check --simulate``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from sdplan.cli._options import apply_options
from sdplan.limits import MAX_BATCH_SIZE, MAX_REPLICATIONS, MAX_REQUESTS

if TYPE_CHECKING:
    from sdplan.calibration import Calibration


def simulation_options(fn: Any, requests: int = 20_000, seeds: int = 3) -> Any:
    return apply_options(fn, [
        click.option("--requests", type=click.IntRange(10, MAX_REQUESTS), default=requests, show_default=True,
                     help="Requests per replication (the first 10% are discarded as warm-up)."),
        click.option("--seeds", type=click.IntRange(1, MAX_REPLICATIONS), default=seeds, show_default=True,
                     help="Independent replications; confidence intervals (95%) come from their spread."),
        click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True,
                     help="First seed; results are reproducible."),
        click.option("--arrival-cv", type=click.FloatRange(0.05, 10), default=1.0, show_default=True,
                     help="Coefficient of variation of inter-arrival times: 1 Poisson, > 1 bursty (gamma)."),
        click.option("--max-num-seqs", type=click.IntRange(1, MAX_BATCH_SIZE), default=256, show_default=True,
                     help="Batch cap (vLLM max_num_seqs). A served calibration's default: the max_num_seqs its "
                     "servers ran with."),
        click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=8192, show_default=True,
                     help="Token budget per step (decode tokens first, then prefill chunks)."),
        click.option("--kv-cache-tokens", type=click.FloatRange(min=1), metavar="TOKENS",
                     help="KV cache capacity in tokens (prompt + output reserved per running request). "
                     "Default: the KV cache a served calibration's server of that draft length reported, "
                     "else unlimited."),
        click.option("--lengths-file", metavar="CSV",
                     help="Histogram of request lengths: CSV with prompt_tokens,output_tokens,weight; requests "
                     "draw from it (the model uses its means)."),
    ])


def read_lengths(path: str) -> tuple[list[float], list[float], list[float]]:
    from sdplan.workload import load_lengths_file

    return load_lengths_file(path)


def histogram_means(lengths: tuple[list[float], list[float], list[float]] | None, prompt_tokens: int | None,
                    output_tokens: int | None) -> tuple[int | None, int | None]:
    """Prompt/output lengths for the model: the histogram's weighted means where none is given."""
    if lengths is None:
        return prompt_tokens, output_tokens
    total = sum(lengths[2])
    if prompt_tokens is None:
        prompt_tokens = round(sum(p * w for p, w in zip(lengths[0], lengths[2])) / total)
    if output_tokens is None:
        output_tokens = round(sum(g * w for g, w in zip(lengths[1], lengths[2])) / total)
    return prompt_tokens, output_tokens


def calibrated_max_num_seqs(max_num_seqs: int, calibration: Calibration) -> int:
    """``--max-num-seqs`` as given, else the served calibration's (its servers' command lines), else the default."""
    from sdplan.cli._options import option_given

    served = calibration.served_batch_cap()
    return max_num_seqs if option_given("max_num_seqs") or served is None else served[0]


def _served_kv_cache(served: tuple[float, str] | None) -> tuple[float | None, str]:
    """A served server's KV cache (tokens, configuration) as (tokens, what it is, for warnings)."""
    if served is None:
        return None, ""
    return served[0], f"KV cache of {served[0]:,.0f} tokens the calibrated {served[1]} server reported"


def calibrated_kv_cache_tokens(kv_cache_tokens: float | None, calibration: Calibration,
                               draft_length: int) -> tuple[float | None, str]:
    """``--kv-cache-tokens`` as given, else the KV cache the served calibration's server of ``draft_length``
    reported (:meth:`~sdplan.calibration.Calibration.served_kv_cache_tokens`), else None (unlimited); with
    what it is, for warnings."""
    if kv_cache_tokens is not None:
        return kv_cache_tokens, ""
    return _served_kv_cache(calibration.served_kv_cache_tokens(draft_length))


def smallest_served_kv_cache(kv_cache_tokens: float | None, calibration: Calibration,
                             draft_lengths: list[int]) -> tuple[float | None, str]:
    """``--kv-cache-tokens`` as given, else the smallest KV cache of the served calibration's servers that the
    options run on (no SD and the longest draft length: the shorter ones share the SD servers' smallest),
    else None (unlimited); with what it is, for warnings."""
    if kv_cache_tokens is not None:
        return kv_cache_tokens, ""
    caches = [cache for cache in (calibration.served_kv_cache_tokens(k) for k in (0, max(draft_lengths, default=0)))
              if cache is not None]
    return _served_kv_cache(min(caches, default=None))


def served_engine_cap(calibration: Calibration, draft_lengths: list[int], prompt_tokens: float,
                      output_tokens: float) -> tuple[int, str] | None:
    """The batch a served calibration's servers could hold: their ``max_num_seqs``, or fewer requests of the
    workload where the smallest KV cache of the servers the options run on (:func:`smallest_served_kv_cache`)
    holds fewer; None if the calibration was not served. A cache that holds not even one request gives a cap
    of 0."""
    from sdplan.schedule import kv_cache_requests

    served = calibration.served_batch_cap()
    if served is None:
        return None
    tokens, what = smallest_served_kv_cache(None, calibration, draft_lengths)
    if tokens is not None:
        held = kv_cache_requests(tokens, prompt_tokens, output_tokens)
        if held < served[0]:
            return held, what
    return served


def engine_batch_cap(max_num_seqs: int, kv_cache_tokens: float | None, prompt_tokens: float,
                     output_tokens: float, kv_source: str = "") -> tuple[float, str]:
    """The batch the engine can hold: ``max_num_seqs``, or fewer when the KV budget reserves ``p + g`` each.

    ``kv_source`` says what the budget is (default: ``KV budget of N tokens``).

    Raises
    ------
    InvalidValueError
        If not even one request of the workload fits the KV budget.
    """
    import math

    from sdplan.errors import InvalidValueError
    from sdplan.schedule import kv_cache_requests

    if kv_cache_tokens is not None and math.isfinite(kv_cache_tokens):
        by_kv = kv_cache_requests(kv_cache_tokens, prompt_tokens, output_tokens)
        what = kv_source or f"KV budget of {kv_cache_tokens:g} tokens"
        if by_kv < 1:
            raise InvalidValueError(f"a request of {prompt_tokens + output_tokens:g} tokens (prompt + output) does "
                                    f"not fit the {what}; raise --kv-cache-tokens")
        if by_kv < max_num_seqs:
            return float(by_kv), what
    return float(max_num_seqs), "max_num_seqs"


def echo_warnings(warnings: list[str]) -> None:
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


def build_config(rate: float, draft_length: int, acceptance: Any, prompt: int, output: int, requests: int,
                 arrival_cv: float, max_num_seqs: int, max_num_batched_tokens: int, kv_cache_tokens: float | None,
                 lengths: tuple[list[float], list[float], list[float]] | None, seed: int) -> Any:
    """A SimulationConfig; request lengths drawn from the histogram when one is given."""
    import math

    import numpy as np

    from sdplan.limits import check_simulation_memory
    from sdplan.simulate import SimulationConfig

    per_cycle = float(acceptance.tokens_per_cycle([draft_length])[0, 0]) if draft_length else 1.0
    check_simulation_memory(requests, max(lengths[1]) if lengths is not None else output, draft_length, per_cycle,
                            max_num_seqs)
    if draft_length:
        if acceptance.position_rates is not None:
            rates = tuple(acceptance.position_rates[:draft_length])
        else:
            alpha = acceptance.alphas[0]
            rates = tuple(alpha ** (j + 1) for j in range(draft_length))
    else:
        rates = ()
    prompts: Any = prompt
    outputs: Any = output
    if lengths is not None:
        rng = np.random.default_rng(seed + 10_000)
        weights = np.asarray(lengths[2]) / sum(lengths[2])
        pick = rng.choice(len(weights), size=requests, p=weights)
        prompts, outputs = np.asarray(lengths[0])[pick], np.asarray(lengths[1])[pick]
    return SimulationConfig(rate_rps=rate, draft_length=draft_length, position_rates=rates, requests=requests,
                            prompt_tokens=prompts, output_tokens=outputs, arrival_cv=arrival_cv,
                            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                            kv_cache_tokens=kv_cache_tokens if kv_cache_tokens is not None else math.inf)
