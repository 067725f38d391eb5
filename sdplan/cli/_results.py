"""Options shared by ``fit`` and ``validate``: result files, format, and what the files may not say."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from sdplan.cli._options import acceptance_options, apply_options

if TYPE_CHECKING:
    from sdplan.measure.result_files import ResultFiles


def results_options(fn: Any) -> Any:
    return apply_options(fn, [
        click.argument("results", nargs=-1, required=True, metavar="RESULTS..."),
        click.option("--input-format",
                     type=click.Choice(("auto", "prometheus-text", "prometheus-api", "vllm", "guidellm", "aic-silicon",
                                        "inferencex", "csv")),
                     default="auto", metavar="FORMAT",
                     show_default=True, help="Format of RESULTS, one of auto, prometheus-text, prometheus-api, vllm, "
                     "guidellm, aic-silicon, inferencex, csv: vLLM bench serve JSON, GuideLLM report, "
                     "InferenceX rows, CSV "
                     "(request_rate_rps, draft_length, acceptance, prompt_tokens, output_tokens, mean_e2e_latency_s"
                     "[, mean_concurrency]) or AIConfigurator's silicon_sample.csv (aic-silicon; the installed "
                     "package's own as aic:silicon_sample), vLLM's Prometheus metrics: scrapes recorded by "
                     "sdplan scrape (prometheus-text) or a Prometheus query_range export (prometheus-api). auto "
                     "detects it."),
        click.option("--select", "select", multiple=True, metavar="KEY=VALUE[,...]",
                     help="Rows of one configuration of an AIConfigurator silicon file: model, system, backend, "
                     "version, tp, precision, quant, dp, moe_tp, moe_ep, e.g. "
                     "model=Qwen3-32B,system=h100_sxm,backend=vllm,tp=4; or the server of a metrics file with "
                     "several: any label, e.g. model_name=NAME, instance=HOST:PORT, ReplicaId=ID. "
                     "Repeatable."),
        click.option("--window", "window", metavar="DURATION", callback=window_seconds,
                     help="Metrics files: cut the series into windows of this length (5m, 90s). Default: auto, "
                     "one window per busy stretch between idle scrapes (long ones cut into ~5 min)."),
        click.option("--draft-length", "draft_length", type=click.IntRange(min=0), metavar="K",
                     help="Draft length of runs whose files do not record it (GuideLLM; InferenceX SD rows; vLLM "
                     "without spec_decode fields). 0 means no SD."),
        lambda f: acceptance_options(f, for_results=True),
    ])


def result_files(results: tuple[str, ...], input_format: str, select: tuple[str, ...], window: float | None,
                 draft_length: int | None, alpha: list[float] | None, length: list[float] | None,
                 rate: list[float] | None, k: int | None, positions: list[float] | None) -> ResultFiles:
    """The options of :func:`results_options` as one typed request (checked in the core:
    :func:`sdplan.measure.result_files.result_alpha`)."""
    from sdplan.measure.result_files import ResultFiles
    from sdplan.planning.scenario import AcceptanceGiven

    return ResultFiles(results=results, input_format=input_format, select=select, window_s=window,
                       draft_length=draft_length,
                       acceptance=AcceptanceGiven(alpha=alpha, mean_length=length, draft_rate=rate, measured_at_k=k,
                                                  position_rates=positions))


def window_seconds(ctx: click.Context, param: click.Parameter, text: str | None) -> float | None:
    """``--window``'s callback: its value in seconds (None: auto)."""
    if text is None or text.strip().lower() == "auto":
        return None
    from sdplan.cli.scrape import parse_duration

    return parse_duration(ctx, param, text)
