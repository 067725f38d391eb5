"""Options shared by ``fit`` and ``validate``: result files, format, and what the files may not say."""

from __future__ import annotations

from typing import Any

import click

from sdplan.cli._options import acceptance_options, apply_options
from sdplan.errors import InvalidValueError


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
                     "several: model_name, instance, job, pod, namespace, node, service, container. Repeatable."),
        click.option("--window", "window", metavar="DURATION", callback=window_seconds,
                     help="Metrics files: cut the series into windows of this length (5m, 90s). Default: auto, "
                     "one window per busy stretch between idle scrapes (long ones cut into ~5 min)."),
        click.option("--draft-length", "draft_length", type=click.IntRange(min=0), metavar="K",
                     help="Draft length of runs whose files do not record it (GuideLLM; InferenceX SD rows; vLLM "
                     "without spec_decode fields). 0 means no SD."),
        lambda f: acceptance_options(f, for_results=True),
    ])


def override_alpha(alpha: list[float] | None, length: list[float] | None, rate: list[float] | None,
                   k: int | None, positions: list[float] | None = None) -> float | None:
    """One per-token alpha from the acceptance flags, or None when none is given."""
    from sdplan.acceptance import AcceptanceMetric, make_acceptance
    if positions is not None:
        raise InvalidValueError("--position-acceptance is not used for result files: fits take one alpha per run "
                                "(vLLM files carry their own spec_decode fields)")
    given = [(m, v) for m, v in ((AcceptanceMetric.PER_TOKEN, alpha), (AcceptanceMetric.MEAN_LENGTH, length),
                                 (AcceptanceMetric.DRAFT_RATE, rate)) if v is not None]
    if not given:
        if k is not None:
            raise InvalidValueError("--acceptance-k needs --acceptance-length or --draft-acceptance-rate")
        return None
    if len(given) > 1:
        raise InvalidValueError("give acceptance in one metric only")
    metric, values = given[0]
    if len(values) != 1:
        raise InvalidValueError("give a single acceptance value for result files")
    return make_acceptance(metric, tuple(values), k, "command line").alphas[0]


def window_seconds(ctx: click.Context, param: click.Parameter, text: str | None) -> float | None:
    """``--window``'s callback: its value in seconds (None: auto)."""
    if text is None or text.strip().lower() == "auto":
        return None
    from sdplan.cli.scrape import parse_duration

    return parse_duration(ctx, param, text)
