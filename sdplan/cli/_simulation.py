"""Options shared by ``simulate``, ``check --simulate`` and ``capacity --simulate``, and the engine limits.

Each command parses them into a :class:`sdplan.planning.simulation_inputs.SimulationSettings` in its request;
the engine limits, which ``plan`` takes too, into :class:`sdplan.inputs.serving.LimitOptions`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import click

from sdplan.cli._options import apply_options
from sdplan.limits import MAX_BATCH_SIZE, MAX_REPLICATIONS, MAX_REQUESTS

#: The engine's limits, which every answer holds each option to (``plan``, ``check``, ``capacity``, ``simulate``):
#: parsed into :class:`sdplan.inputs.serving.LimitOptions` (:func:`sdplan.cli._inputs.command_scenario`).
ENGINE_LIMIT_OPTIONS = [
    click.option("--max-num-seqs", type=click.IntRange(1, MAX_BATCH_SIZE), metavar="N",
                 help="Batch cap (vLLM max_num_seqs, SGLang --max-running-requests). Default: the workload "
                 "file's deployment.max_batch_size (with -w), else the max_num_seqs a served calibration's "
                 "servers ran with or a derived one was priced for (SGLang's SD options: at most 48, its "
                 "limit under SD), else vLLM's default for the calibration's hardware "
                 "(1024 on H100/H200/B200, 256 on A100/L40S, 128 on CPU)."),
    click.option("--max-num-batched-tokens", type=click.IntRange(min=1), metavar="N",
                 help="Token budget per step (decode tokens first, then prefill chunks). Default: the "
                 "--max-num-batched-tokens a served calibration's servers ran with, else 8192."),
    click.option("--kv-cache-tokens", type=click.FloatRange(min=1), metavar="TOKENS",
                 help="KV cache capacity in tokens (vLLM: a running request holds its prompt and half its output "
                 "on average; SGLang, TensorRT-LLM: prompt + output reserved). "
                 "Default: the KV cache a served calibration's server of that draft length reported or a "
                 "derived one was priced with, else unlimited."),
]


#: A histogram of request lengths (``plan``, ``check``, ``capacity``, ``simulate``), read by
#: :func:`sdplan.cli._inputs.command_scenario`.
LENGTHS_FILE_OPTION = click.option(
    "--lengths-file", metavar="CSV",
    help="Histogram of request lengths: CSV with prompt_tokens,output_tokens,weight. The model uses its means, and "
    "the mean squared prompt for a prefill priced with a squared term; simulated requests draw from it.")


def engine_limit_options(fn: Any) -> Any:
    """``--max-num-seqs``, ``--max-num-batched-tokens`` and ``--kv-cache-tokens`` (:data:`ENGINE_LIMIT_OPTIONS`)."""
    return apply_options(fn, ENGINE_LIMIT_OPTIONS)


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
        *ENGINE_LIMIT_OPTIONS,
        LENGTHS_FILE_OPTION,
    ])


def progress_reporter(bars: ExitStack, description: str) -> Callable[[int, int, str], None]:
    """A progress callback that opens its bar (on ``bars``) at the first report: a search that never
    reports, or fails its budget check first, draws none. Shared by ``simulate`` and ``capacity --simulate``."""
    advance: Callable[[int, int, str], None] | None = None

    def report(done: int, total: int, label: str) -> None:
        nonlocal advance
        if advance is None:
            from sdplan.render.progress import progress_bar

            advance = bars.enter_context(progress_bar(description, total))
        advance(done, total, label)

    return report
