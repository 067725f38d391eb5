"""The calibration file's schema: every table and key, its type, bounds and meaning.

One declarative :class:`~sdplan.schema.Table` tree, checked by
:func:`sdplan.schema.validate` before anything reads the file, and documented
for users in ``sdplan-calibration(5)``.
"""

from __future__ import annotations

from sdplan.schema import Field, Table

#: The calibration schema version this sdplan reads.
SCHEMA_VERSION = 1
#: How a calibration's numbers were obtained (``[provenance] method``).
METHODS = ("measured", "fit", "roofline", "derived")


def _cost(doc: str, required: bool = True) -> Field:
    """A cost in seconds: a finite number, at least 0."""
    return Field("float", doc, required=required, minimum=0.0)


_STEP = Table(
    {
        "fixed_s": _cost("seconds per step, independent of batch size (weights streaming, launch, scheduling)"),
        "per_sequence_s": _cost("seconds per step per running sequence"),
        "per_query_token_s": _cost("seconds per step per query token processed (compute)"),
        "per_context_token_s": _cost("seconds per step per KV-cache token read (context length)"),
    }
)

#: The target's step: the linear model, and optionally the knee past which the step is bound by compute
#: (``docs/model.md#compute-bound-knee``).
_TARGET_STEP = Table(
    {
        **_STEP.fields,
        "knee_tokens": Field("float", "token rows in one step (sequences x query tokens) past which the step is "
                             "bound by compute; needs per_token_above_knee_s", required=False, minimum=1.0),
        "per_token_above_knee_s": _cost("seconds each token row past knee_tokens adds beyond per_query_token_s",
                                        required=False),
    }
)

CALIBRATION_SCHEMA = Table(
    {
        "schema_version": Field("int", f"calibration schema version; this sdplan reads {SCHEMA_VERSION}"),
        "name": Field("str", "short identifier of the calibration"),
        "description": Field("str", "one sentence for listings", required=False),
        "provenance": Table(
            {
                "method": Field("str", "how the numbers were obtained", choices=METHODS),
                "hardware": Field("str", "accelerator, count and interconnect"),
                "target_model": Field("str", "target (verifier) model"),
                "draft_model": Field("str", "draft model, or the proposer method"),
                "speculative_method": Field("str", "SD method the costs describe (vLLM's name); default draft_model",
                                            required=False,
                                            choices=("draft_model", "eagle", "eagle3", "mtp", "ngram")),
                "engine": Field("str", "serving engine, e.g. vllm"),
                "engine_version": Field("str", "serving engine version"),
                "date": Field("date", "date the calibration was produced"),
                "created_by": Field("str", "tool or script that produced the file", required=False),
                "dtype": Field("str", "weight/activation dtype", required=False),
                "tensor_parallel_size": Field("int", "GPUs per replica", required=False, minimum=1),
                "assumptions": Field("str_list", "assumptions behind derived numbers", required=False),
                "sources": Field("str_list", "data sources (datasheets, benchmark files)", required=False),
                "notes": Field("str", "free text", required=False),
            }
        ),
        "reference_workload": Table(
            {
                "prompt_tokens": Field("int", "prompt length the coefficients were measured at", minimum=1),
                "output_tokens": Field("int", "output length the coefficients were measured at", minimum=1),
            }
        ),
        "validity": Table(
            {
                "prompt_tokens": Field("range", "prompt lengths covered, [min, max] tokens", required=False, minimum=1),
                "output_tokens": Field("range", "output lengths covered, [min, max] tokens", required=False, minimum=1),
                "batch_size": Field("range", "batch sizes covered, [min, max] sequences", required=False, minimum=1),
            },
            required=False,
        ),
        "fit_quality": Table(
            {
                "r2": Field("float", "coefficient of determination of the fit", maximum=1.0),
                "rmse_s": Field("float", "root-mean-square error in seconds", required=False, minimum=0.0),
                "mape_pct": Field("float", "mean absolute percentage error", required=False, minimum=0.0),
                "points": Field("int", "number of measurements fitted", required=False, minimum=0),
                "detail": Field("str", "per-term quality, free text", required=False),
            },
            required=False,
        ),
        "acceptance": Table(
            {
                "per_token_alpha": Field("float", "per-token acceptance probability", minimum=0.0, maximum=1.0),
                "measured_at_k": Field("int", "draft length it was measured at", required=False, minimum=1),
                "per_position_rates": Field(
                    "float_list", "conditional acceptance per draft position", required=False, minimum=0.0, maximum=1.0
                ),
                "draft_coverage": Field(
                    "float", "fraction of decode steps that carried a draft (n-gram/suffix propose only where the "
                    "context repeats; 1 when absent)", required=False, minimum=0.0, maximum=1.0),
                "source": Field("str", "how the acceptance was obtained (dataset, temperature)"),
            },
            required=False,
        ),
        "moe": Table(
            {
                "experts_per_token": Field("int", "experts each token is routed to (m), target", minimum=1),
                "experts": Field("int", "experts per MoE layer (M), target", minimum=1),
                "coverage": Table(
                    {key: _cost(f"seconds added to {key[:-2]} at full expert coverage (phi = 1)", required=False)
                     for key in ("c1p_s", "c2p_s", "baseline_c1_step_s", "baseline_c2_step_s", "c1v_s", "c2v_s")},
                    required=False,
                ),
            },
            required=False,
        ),
        "coefficients": Table(
            {
                "scaling": Field(
                    "str", "how to scale to other lengths", required=False, choices=("proportional", "none")
                ),
                "c1p_s": _cost("prefill, load-independent: seconds per request"),
                "c2p_s": _cost("prefill, load-dependent: seconds per request per concurrent request"),
                "frontend_chunk_s": _cost(
                    "serving-frontend seconds per streamed chunk: C2 is at least the answer's chunks (g without "
                    "SD, g/E with it) times this; 0 or absent: no floor", required=False),
                "knee_tokens": Field("float", "token rows in one target step past which it is bound by compute "
                                     "(docs/model.md#compute-bound-knee); needs knee_per_token_s", required=False,
                                     minimum=1.0),
                "knee_per_token_s": _cost("seconds each token row past knee_tokens adds to a target step",
                                          required=False),
                "load_concavity_sqrt_requests": Field(
                    "float", "psi of the concave load law L = C1 + C2 (B + psi sqrt(B)) "
                    "(docs/model.md#concave-load); 0 or absent: the straight line", required=False, minimum=0.0,
                    maximum=100.0),
                "baseline": Table(
                    {
                        "c1_step_s": _cost("plain decode step: seconds per step"),
                        "c2_step_s": _cost("plain decode step: seconds per step per concurrent request"),
                        "c2_step_per_context_token_s": _cost(
                            "slope of c2_step in the mean context p + g/2: seconds per context token", required=False),
                        "c2_step_fixed_s": _cost(
                            "the part of c2_step that does not grow with the context (at most c2_step_s); only the "
                            "rest scales", required=False),
                    }
                ),
                "speculative": Table(
                    {
                        "c1v_s": _cost("verification: seconds per cycle"),
                        "c2v_s": _cost("verification: seconds per cycle per concurrent request"),
                        "c1d_s": _cost("drafting: seconds per draft token"),
                        "c2d_s": _cost("drafting: seconds per draft token per concurrent request"),
                        "c2v_per_context_token_s": _cost(
                            "slope of c2v in the mean context p + g/2: seconds per context token", required=False),
                        "c2d_per_context_token_s": _cost(
                            "slope of c2d in the mean context p + g/2: seconds per context token", required=False),
                    }
                ),
            },
            required=False,
        ),
        "ttft": Table(
            {
                "wait_steps": Field("float", "TTFT: steps of the running option's fixed cost an arrival waits",
                                    minimum=0.0, maximum=1e3),
                "load_steps": Field("float", "TTFT: steps of per-request cost per other request in flight",
                                    minimum=0.0, maximum=1e3),
                "offset_s": Field("float", "TTFT: seconds added to c1p at zero load (fitted; may be negative)",
                                  required=False, minimum=-3600.0, maximum=3600.0),
                "prefill_per_prompt_token_s": Field(
                    "float", "TTFT: seconds per prompt token added to c1p for the request's own prefill (fitted "
                    "where TTFT was measured at several prompt lengths)", required=False, minimum=0.0, maximum=1.0),
                "closed_loop_load_steps": Field(
                    "float", "TTFT: the load weight closed-loop runs were fitted with (theirs only; the planner "
                    "predicts open loops with load_steps)", required=False, minimum=0.0, maximum=1e3),
                "source": Field("str", "how the weights were obtained (fitted or default)", required=False),
            },
            required=False,
        ),
        "closed_loop": Table(
            {
                "factor": Field("float", "a closed loop of N clients loads like factor x (N - 1) open-loop others",
                                minimum=0.1, maximum=10.0),
                "source": Field("str", "fitted or default", required=False),
            },
            required=False,
        ),
        "uncertainty": Table(
            {
                "parameters": Field("str_list", "coefficient names, in covariance order"),
                "covariance_s2": Field("float_matrix", "covariance of the coefficients, seconds squared"),
                "not_identified": Field("str_list", "coefficients the data did not determine", required=False),
                "stderr_above_value": Field("str_list", "those of them whose standard error exceeds their value "
                                            "(the others have no runs that could tell them)", required=False),
                "method": Field("str", "how the covariance was computed", required=False),
                "repeat_sd_pct": Field("float", "standard deviation of one point's log mean latency between its "
                                       "repeats (on fresh server instances in calibrate), percent; widens the "
                                       "intervals", required=False, minimum=0.0),
                "step_share_sd_pct": Field("float", "standard deviation of the share of c2_step that does not "
                                           "grow with the context (c2_step_fixed_s / c2_step_s), percentage "
                                           "points; widens the intervals away from the reference context",
                                           required=False, minimum=0.0, maximum=100.0),
            },
            required=False,
        ),
        "measurement": Table(
            {
                "method": Field("str", "served (vllm serve + vllm bench serve) or engine (in-process steps)",
                                choices=("served", "engine")),
                "server_commands": Field("str_list", "vllm serve command lines measured", required=False),
                "client": Field("str", "load generator", required=False),
                "cpu_binding": Field("str", "vLLM's CPU thread binding as logged", required=False),
                "wall_time_s": Field("float", "wall time of the measurement, all invocations", required=False,
                                     minimum=0.0),
                "invocations": Field("int", "invocations (1 + resumes)", required=False, minimum=1),
                "server_instances_per_configuration": Field("int", "server starts that measured each "
                                                            "configuration (rounds x instances per round)",
                                                            required=False, minimum=1),
                "points": Field("int", "load points measured", required=False, minimum=0),
                "disturbed_points": Field("int", "points disturbed by other processes, or whose repeats disagree",
                                          required=False, minimum=0),
                "repeat_spread_median_pct": Field("float", "median over points measured more than once of "
                                                  "(max - min) / mean of their repeats' mean E2E, percent",
                                                  required=False, minimum=0.0),
                "repeat_spread_max_pct": Field("float", "the largest such spread, percent", required=False,
                                               minimum=0.0),
                "repeat_spread_max_point": Field("str", "the point of the largest spread", required=False),
                "closed_loop_full_load_min_pct": Field("float", "smallest share of a closed-loop point's "
                                                       "duration with all its clients' requests in flight, "
                                                       "percent (the rest: ramp-up and drain)", required=False,
                                                       minimum=0.0),
                "closed_loop_full_load_min_point": Field("str", "the point of that share", required=False),
                "overloaded_points": Field("str_list", "Poisson points the server did not keep up with (not fitted)",
                                           required=False),
                "screened_points": Field("str_list", "points the steady-state screen left out of the fit, each "
                                         "with why", required=False),
                "results_dir": Field("str", "folder of the raw vllm bench serve results", required=False),
                "point_labels": Field("str_list", "fitted points, in order", required=False),
                "point_errors_pct": Field("float_list", "fit error of mean E2E per point, percent", required=False),
                "point_ttft_errors_pct": Field("float_list", "fit error of mean TTFT per point, percent",
                                               required=False),
                "excludes": Field("str", "what the measurement leaves out", required=False),
                "prefix_cache": Field("str", "share of prompt tokens vLLM's prefix cache served, per configuration",
                                      required=False),
                "kv_cache_configurations": Field("str_list", "configurations whose server reported its KV cache",
                                                 required=False),
                "kv_cache_tokens": Field("float_list", "tokens each one's KV cache holds (num_gpu_blocks x "
                                         "block_size), in that order", required=False, minimum=1.0),
            },
            required=False,
        ),
        "derivation": Table(
            {
                "source": Field("str", "the estimator and its package, version and licence"),
                "package": Field("str", "Python distribution that priced the steps"),
                "package_version": Field("str", "its version"),
                "licence": Field("str", "its licence"),
                "system": Field("str", "the estimator's system (GPU) name"),
                "backend": Field("str", "serving engine whose op database priced the steps"),
                "database_version": Field("str", "version of that engine's op database"),
                "precision": Field("str", "weights precision priced"),
                "draft_precision": Field("str", "the draft's weights precision priced (a draft model or head)",
                                         required=False),
                "draft_tensor_parallel_size": Field("int", "GPUs a draft model was priced on (vLLM's "
                                                    "draft_tensor_parallel_size)", required=False, minimum=1),
                "kv_cache_dtype": Field("str", "the KV cache dtype the engine must be given (vLLM's "
                                        "--kv-cache-dtype; absent: auto, the checkpoint's)", required=False,
                                        choices=("bf16", "fp8")),
                "target_priced_as": Field("str", "model (architecture) the target was priced as"),
                "target_layers": Field("int", "the target's decoder layers priced", required=False, minimum=1),
                "draft_priced_as": Field("str", "model (architecture) the proposer was priced as"),
                "draft_lengths": Field("float_list", "draft lengths priced", minimum=1.0),
                "max_num_seqs": Field("int", "largest batch the engine runs", minimum=1),
                "batch_sizes": Field("float_list", "batch sizes priced", minimum=1.0),
                "context_tokens": Field("float_list", "mean contexts priced, tokens", minimum=1.0),
                "prompt_tokens": Field("float_list", "prompt lengths priced, tokens", minimum=1.0),
                "points": Field("int", "target steps priced", minimum=0),
                "kv_cache_tokens": Field("int", "tokens the estimator's memory model gives the KV cache",
                                         required=False, minimum=1),
                "kv_cache_tokens_without_draft": Field(
                    "int", "the same without the draft's weights and KV cache: no SD's cache", required=False,
                    minimum=1),
                "measured": Field("str", "what was measured end to end (the anchor's rows), or nothing"),
                **{f"{component}_{stat}_error_pct": Field(
                    "float", f"{stat} relative error of the fitted {component} step form over the priced grid, percent",
                    required=component != "draft", minimum=0.0)
                   for component in ("target", "draft", "prefill", "interference") for stat in ("mean", "max")},
                **{f"target_linear_{stat}_error_pct": Field(
                    "float", f"{stat} relative error of a straight-line target step (no knee) over the priced grid, "
                    "percent, where the knee was kept", required=False, minimum=0.0) for stat in ("mean", "max")},
                "anchor": Field("str", "how the no-SD part was anchored to measured rows, or why not"),
                "anchor_rows": Field("int", "measured rows anchored to", required=False, minimum=0),
                "anchor_decode_scale": Field("float", "factor on every step cost", required=False, minimum=0.0),
                "anchor_prefill_scale": Field("float", "factor on every prefill cost", required=False, minimum=0.0),
                "anchor_gap_mape_pct": Field("float", "measured-vs-derived TPOT gap before anchoring, MAPE %",
                                             required=False, minimum=0.0),
                "anchor_gap_bias_pct": Field("float", "its signed mean, % (negative: derived too fast)",
                                             required=False, minimum=-100.0),
                "anchor_anchored_mape_pct": Field("float", "TPOT MAPE after anchoring, on the same rows, %",
                                                  required=False, minimum=0.0),
                "anchor_anchored_max_error_pct": Field("float", "largest TPOT error after anchoring, %",
                                                       required=False, minimum=0.0),
            },
            required=False,
        ),
        "step_model": Table(
            {
                "target": _TARGET_STEP,
                "draft": _STEP,
                "prefill": Table(
                    {
                        "fixed_s": _cost("seconds per request, independent of prompt length"),
                        "per_prompt_token_s": _cost("seconds per prompt token (own prefill)"),
                        "load_per_prompt_token_s": _cost(
                            "seconds per prompt token a concurrent request's prefill adds to yours"
                        ),
                        "per_prompt_token_sq_s": _cost("seconds per squared prompt token (own prefill's attention "
                                                       "over its prefix; default 0)", required=False),
                        "load_per_prompt_token_sq_s": _cost("seconds per squared prompt token a concurrent "
                                                            "request's prefill adds to yours (default 0)",
                                                            required=False),
                    }
                ),
                "speculation": Table(
                    {
                        "overhead_fixed_s": _cost("extra seconds per SD cycle (rejection sampling, bookkeeping)"),
                        "overhead_per_sequence_s": _cost("extra seconds per SD cycle per running sequence"),
                    },
                    required=False,
                ),
                "engine": Table(
                    {
                        "step_overhead_s": _cost("the engine's host seconds per step, SD or not (scheduling, "
                                                 "input preparation, sampling, output processing)",
                                                 required=False),
                        "prefill_overhead_s": _cost("the server's seconds around a request's prefill beyond its "
                                                    "steps' cost, in its TTFT and latency only", required=False),
                    },
                    required=False,
                ),
            },
            required=False,
        ),
    }
)
