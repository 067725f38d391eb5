"""Calibration files: schema, validation, and coefficients at a workload.

A calibration holds the cost coefficients of one (hardware, target model,
draft model) pair, with its provenance. Two forms are accepted (exactly one
per file), both documented in ``sdplan-calibration(5)``:

``[coefficients]`` (direct form)
    Kong et al.'s six coefficients plus the baseline decode step, valid at
    ``[reference_workload]``; scaled to other lengths by proportional rules
    (:func:`scale_direct`).
``[step_model]`` (per-step form)
    Linear step-time models of the target, the draft and prefill
    (``docs/model.md#per-step-form``), from which the coefficients follow at any
    prompt/output length (:func:`_coefficients_from_steps`).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdplan.coefficients import Coefficients
from sdplan.errors import InputFileError
from sdplan.schema import Field, Table, read_toml, validate

if TYPE_CHECKING:
    from sdplan.moe import MoESpec

SCHEMA_VERSION = 1
METHODS = ("measured", "fit", "roofline", "derived")
#: Shipped calibration used when none is given.
DEFAULT_CALIBRATION = "h100-sxm_llama-3.1-8b_llama-3.2-1b_derived"

_SECONDS = dict(kind="float", minimum=0.0)


def _cost(doc: str, required: bool = True) -> Field:
    return Field(doc=doc, required=required, **_SECONDS)  # type: ignore[arg-type]


_STEP = Table(
    {
        "fixed_s": _cost("seconds per step, independent of batch size (weights streaming, launch, scheduling)"),
        "per_sequence_s": _cost("seconds per step per running sequence"),
        "per_query_token_s": _cost("seconds per step per query token processed (compute)"),
        "per_context_token_s": _cost("seconds per step per KV-cache token read (context length)"),
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
                "target_priced_as": Field("str", "model (architecture) the target was priced as"),
                "draft_priced_as": Field("str", "model (architecture) the proposer was priced as"),
                "draft_lengths": Field("float_list", "draft lengths priced", minimum=1.0),
                "max_num_seqs": Field("int", "largest batch the engine runs", minimum=1),
                "batch_sizes": Field("float_list", "batch sizes priced", minimum=1.0),
                "context_tokens": Field("float_list", "mean contexts priced, tokens", minimum=1.0),
                "prompt_tokens": Field("float_list", "prompt lengths priced, tokens", minimum=1.0),
                "points": Field("int", "target steps priced", minimum=0),
                "kv_cache_tokens": Field("int", "tokens the estimator's memory model gives the KV cache",
                                         required=False, minimum=1),
                "measured": Field("str", "what was measured end to end (the anchor's rows), or nothing"),
                **{f"{component}_{stat}_error_pct": Field(
                    "float", f"{stat} relative error of the fitted {component} step form over the priced grid, percent",
                    required=component != "draft", minimum=0.0)
                   for component in ("target", "draft", "prefill", "interference") for stat in ("mean", "max")},
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
                "target": _STEP,
                "draft": _STEP,
                "prefill": Table(
                    {
                        "fixed_s": _cost("seconds per request, independent of prompt length"),
                        "per_prompt_token_s": _cost("seconds per prompt token (own prefill)"),
                        "load_per_prompt_token_s": _cost(
                            "seconds per prompt token a concurrent request's prefill adds to yours"
                        ),
                    }
                ),
                "speculation": Table(
                    {
                        "overhead_fixed_s": _cost("extra seconds per SD cycle (rejection sampling, bookkeeping)"),
                        "overhead_per_sequence_s": _cost("extra seconds per SD cycle per running sequence"),
                    },
                    required=False,
                ),
            },
            required=False,
        ),
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationAcceptance:
    """Acceptance measured together with a calibration (optional)."""

    per_token_alpha: float
    measured_at_k: int | None
    per_position_rates: tuple[float, ...] | None
    source: str
    #: Fraction of decode steps that carried a draft (1: every step drafts, as a draft model does).
    draft_coverage: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """A validated calibration file.

    Attributes
    ----------
    document : dict
        The validated TOML document, as parsed (used by ``show`` and writers).
    path : str
        Where it was read from (or ``<name>`` for an in-memory one).
    """

    document: dict[str, Any]
    path: str

    @property
    def name(self) -> str:
        return str(self.document["name"])

    @property
    def provenance(self) -> dict[str, Any]:
        return dict(self.document["provenance"])

    @property
    def method(self) -> str:
        return str(self.document["provenance"]["method"])

    def origin(self) -> dict[str, Any]:
        """What in this file was measured, what was derived and what was assumed, with versions.

        One home for the answer ``sdplan calibrations`` and ``sdplan show`` give per file:
        ``measured`` and ``derived`` are sentences, ``assumed`` a list, ``versions`` the engine and
        the tools (and for a derived file the estimator's package and database) that produced it.
        """
        provenance = self.document["provenance"]
        method = str(provenance["method"])
        derivation = self.document.get("derivation") or {}
        measurement = self.document.get("measurement") or {}
        quality = self.document.get("fit_quality") or {}
        assumed = [str(item) for item in provenance.get("assumptions", [])]
        if "acceptance" not in self.document:
            assumed = assumed if any("acceptance" in item for item in assumed) else [
                *assumed, "acceptance is not part of this file: given per workload"]
        versions = [f"{provenance['engine']} {provenance['engine_version']}"]
        if provenance.get("created_by"):
            versions.append(str(provenance["created_by"]))
        if method == "derived":
            measured = str(derivation.get("measured", "nothing end to end"))
            errors = [float(derivation.get(f"target_{stat}_error_pct", 0.0)) for stat in ("mean", "max")]
            derived = (f"every step cost, priced by {derivation.get('source')} from its {derivation.get('backend')} "
                       f"{derivation.get('database_version')} op database on {derivation.get('system')} and fitted "
                       f"to the step model (target mean/max error {errors[0]:.1f}/{errors[1]:.1f}%)")
            versions.append(f"{derivation.get('package')} {derivation.get('package_version')} "
                            f"({derivation.get('licence')}), {derivation.get('backend')} database "
                            f"{derivation.get('database_version')}")
        elif method == "roofline":
            measured = "nothing"
            derived = "every cost, from datasheet bandwidth and FLOP/s and the models' shapes (a roofline)"
        elif method == "measured":
            how = measurement.get("method", "engine")
            measured = (f"{measurement.get('points', quality.get('points', '?'))} load points timed on the hardware "
                        f"({'vllm serve under vllm bench serve' if how == 'served' else 'in-process engine steps'})")
            derived = f"the coefficients, fitted to those points (R2 {quality.get('r2', '?')})"
        else:
            sources = len(provenance.get("sources", []))
            measured = f"{quality.get('points', '?')} benchmark runs ({sources} source files)"
            derived = f"the coefficients, fitted to those runs (R2 {quality.get('r2', '?')})"
        if "acceptance" in self.document:
            measured += f"; acceptance: {self.document['acceptance']['source']}"
        return {"measured": measured, "derived": derived, "assumed": assumed, "versions": versions}

    @property
    def form(self) -> str:
        """``"direct"`` or ``"step_model"``."""
        return "direct" if "coefficients" in self.document else "step_model"

    @property
    def reference_prompt_tokens(self) -> int:
        return int(self.document["reference_workload"]["prompt_tokens"])

    @property
    def reference_output_tokens(self) -> int:
        return int(self.document["reference_workload"]["output_tokens"])

    @property
    def acceptance(self) -> CalibrationAcceptance | None:
        table = self.document.get("acceptance")
        if table is None:
            return None
        rates = table.get("per_position_rates")
        return CalibrationAcceptance(
            per_token_alpha=float(table["per_token_alpha"]),
            measured_at_k=table.get("measured_at_k"),
            per_position_rates=tuple(float(r) for r in rates) if rates is not None else None,
            source=str(table["source"]),
            draft_coverage=float(table.get("draft_coverage", 1.0)),
        )

    def coefficients_at(self, prompt_tokens: float, output_tokens: float) -> Coefficients:
        """Cost coefficients for a workload of ``prompt_tokens`` in and ``output_tokens`` out."""
        from dataclasses import replace

        if self.form == "direct":
            coefficients = scale_direct(self.document, prompt_tokens, output_tokens)
        else:
            coefficients = _coefficients_from_steps(self.document["step_model"], prompt_tokens, output_tokens)
        ttft = self.document.get("ttft")
        if ttft is not None:
            coefficients = replace(coefficients, ttft_wait_steps=float(ttft["wait_steps"]),
                                   ttft_load_steps=float(ttft["load_steps"]),
                                   ttft_offset_s=float(ttft.get("offset_s", 0.0)),
                                   ttft_prefill_s=float(ttft.get("prefill_per_prompt_token_s", 0.0)) * prompt_tokens)
        closed = self.document.get("closed_loop")
        if closed is not None:
            coefficients = replace(coefficients, closed_loop_factor=float(closed["factor"]))
        return coefficients

    @property
    def not_identified(self) -> tuple[str, ...]:
        """Coefficients a fitted calibration's data did not determine (``[uncertainty]``)."""
        table = self.document.get("uncertainty") or {}
        return tuple(table.get("not_identified", ()))

    @property
    def without_runs(self) -> tuple[str, ...]:
        """The coefficients no run of the fit could tell: :attr:`not_identified` less those that were fitted
        but with a standard error above their value (``[uncertainty] stderr_above_value``)."""
        weak = set((self.document.get("uncertainty") or {}).get("stderr_above_value", ()))
        return tuple(name for name in self.not_identified if name not in weak)

    def moe_at(self, prompt_tokens: float, output_tokens: float) -> MoESpec | None:
        """The MoE routing and coverage increments at a workload; None for a dense target.

        Increments follow the proportional length scaling of the direct form
        (prefill terms with ``p``, per-concurrent-request step terms with the
        mean context), relative to the reference workload.
        """
        table = self.document.get("moe")
        if table is None:
            return None
        from sdplan.moe import MoESpec

        reference = self.document["reference_workload"]
        prefill = prompt_tokens / reference["prompt_tokens"]
        context = mean_context(prompt_tokens, output_tokens) / mean_context(
            reference["prompt_tokens"], reference["output_tokens"])
        scale = {"c1p_s": prefill, "c2p_s": prefill, "baseline_c2_step_s": context, "c2v_s": context}
        coverage = {key: value * scale.get(key, 1.0) for key, value in table.get("coverage", {}).items()}
        return MoESpec(experts_per_token=int(table["experts_per_token"]), experts=int(table["experts"]),
                       coverage=coverage)

    def outside_measured(self, prompt_tokens: float, output_tokens: float) -> list[tuple[str, float, float, float]]:
        """The lengths of a workload outside the calibration's ``[validity]`` ranges: ``(name, value, low,
        high)`` each (``("prompt tokens", 256, 123, 134)``); empty where the workload lies inside what was
        measured (or the file gives no range)."""
        validity = self.document.get("validity", {})
        found = []
        for key, value in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
            span = validity.get(key)
            if span is not None and not span[0] <= value <= span[1]:
                found.append((key.replace("_", " "), float(value), float(span[0]), float(span[1])))
        return found

    def validity_warnings(self, prompt_tokens: float, output_tokens: float, batch: float | None = None) -> list[str]:
        """Warnings for a workload (and optionally an effective batch) outside the calibrated ranges.

        ``batch`` is the largest finite effective batch ``B = lambda L``
        (requests) the caller reports; it is checked against
        ``validity.batch_size`` (the batch sizes the step model was fitted or
        derived on: beyond them the linear step model is extrapolated).
        """
        import math

        warnings = [f"{name} {value:g} is outside the calibrated range [{low:g}, {high:g}] of {self.name}; "
                    "predictions are extrapolated"
                    for name, value, low, high in self.outside_measured(prompt_tokens, output_tokens)]
        validity = self.document.get("validity", {})
        span = validity.get("batch_size")
        if span is not None and batch is not None and math.isfinite(batch) and batch > span[1]:
            warnings.append(
                f"effective batch up to {batch:.4g} requests exceeds the calibrated batch sizes "
                f"[{span[0]:g}, {span[1]:g}] of {self.name}; the step model is extrapolated there"
            )
        return warnings


def mean_context(prompt_tokens: float, output_tokens: float) -> float:
    """Time-averaged KV context per sequence during decoding, ``p + g/2`` tokens."""
    return prompt_tokens + output_tokens / 2.0


def scale_direct(document: dict[str, Any], prompt_tokens: float, output_tokens: float) -> Coefficients:
    """Direct-form coefficients scaled from the reference workload.

    Notes
    -----
    With ``scaling = "proportional"`` (the default), following the reported
    scalings (``docs/model.md#length-scaling``) and the step model
    (:func:`_coefficients_from_steps`), with ``s = p + g/2`` the mean context:

    * prefill: ``c1p``, ``c2p`` scale with ``p/p_ref``;
    * per-concurrent-request step costs are affine in the context,
      ``c(s) = c_ref + (s - s_ref) * slope``, with the slopes
      ``c2v_per_context_token_s``, ``c2d_per_context_token_s`` and
      ``c2_step_per_context_token_s`` when the file gives them (then the
      direct form equals the step model it was taken from at every workload).
      Without slopes, ``c2v`` and ``c2_step`` (KV reads of one sequence) are
      taken proportional to ``s`` (no intercept, V5), and ``c2d`` constant:
      it is the marginal cost of one drafted token, its verification
      compute plus a small draft step (``T.tok + D.seq + D.tok + s D.ctx``),
      mostly independent of the context. Scaling ``c2d`` with ``s``
      overstated saturation 2.1x at p = g = 128;
    * ``c1v``, ``c1d``, ``c1_step`` (the batch-1 step costs) hold one
      sequence's own context cost (step model: ``c1v = T.fixed + overhead +
      c2v``), so with a slope they move by ``(s - s_ref) * slope`` as their
      ``c2`` does; without one they stay fixed (the batch-1 context share is
      unknown, and fixed costs dominate them).

    The output length enters the model itself through ``g/E``.

    ``c2_step_fixed_s`` (optional, 0 by default): the part of ``c2_step``
    that does not grow with the context, each running sequence's own share of
    a step's work (its matmul rows, sampling); only the rest, ``c2_step -
    c2_step_fixed``, scales as above. Fitted from runs at several contexts
    (:func:`sdplan.fit.fit_pooled`): on GPUs the per-sequence step cost is
    affine in the context (AIConfigurator's measured Qwen3-32B rows on H100
    TP4, tests/data/aic-silicon: 0.125 ms per client at 1024/1024 and 0.29 ms
    at 4096/1024, a ratio of 2.3 for a context ratio of 3).
    """
    table = document["coefficients"]
    reference = document["reference_workload"]
    spec, base = table["speculative"], table["baseline"]
    proportional = table.get("scaling", "proportional") == "proportional"
    reference_context = mean_context(reference["prompt_tokens"], reference["output_tokens"])
    shift = mean_context(prompt_tokens, output_tokens) - reference_context if proportional else 0.0
    prefill = prompt_tokens / reference["prompt_tokens"] if proportional else 1.0

    def affine(value: float, slope: float | None, default_slope: float) -> float:
        return max(value + shift * (default_slope if slope is None else slope), 0.0)

    def own(value: float, slope: float | None) -> float:
        """A batch-1 cost: it holds its own sequence's context cost, moved only by a given slope."""
        return max(value + shift * (slope or 0.0), 0.0)

    v_slope, d_slope = spec.get("c2v_per_context_token_s"), spec.get("c2d_per_context_token_s")
    step_slope = base.get("c2_step_per_context_token_s")
    step_fixed = min(float(base.get("c2_step_fixed_s", 0.0)), base["c2_step_s"])
    step_context = base["c2_step_s"] - step_fixed
    return Coefficients(
        c1p_s=table["c1p_s"] * prefill,
        c2p_s=table["c2p_s"] * prefill,
        c1v_s=own(spec["c1v_s"], v_slope),
        c2v_s=affine(spec["c2v_s"], v_slope, spec["c2v_s"] / reference_context),
        c1d_s=own(spec["c1d_s"], d_slope),
        c2d_s=affine(spec["c2d_s"], d_slope, 0.0),
        baseline_c1_step_s=own(base["c1_step_s"], step_slope),
        baseline_c2_step_s=step_fixed + affine(step_context, step_slope, step_context / reference_context),
        prompt_tokens=float(prompt_tokens),
        output_tokens=float(output_tokens),
    )


def _coefficients_from_steps(steps: dict[str, Any], prompt_tokens: float, output_tokens: float) -> Coefficients:
    """Kong coefficients from per-step linear time models.

    Notes
    -----
    A forward step over ``B`` sequences of ``q`` query tokens each at mean
    context ``s`` costs ``T(B, q, s) = fixed + B*(per_sequence + q*per_query_token
    + s*per_context_token)``. An SD cycle is one target step with ``q = k+1``
    and ``k`` draft steps with ``q = 1``; a plain decode step is one target
    step with ``q = 1``. ``C1`` is the batch-size-1 (synchronous) latency, so
    it carries the request's own per-sequence cost, and ``B C2`` with
    ``B = lambda L`` counts the others (``docs/model.md#per-step-form``). With
    ``s = p + g/2``, per cycle ``tau(B) = (c1v + k c1d) + (B - 1)(c2v + k c2d)``::

        c2v = T.seq + T.tok + s T.ctx + overhead_seq
        c2d = T.tok + D.seq + D.tok + s D.ctx     (the k extra verified tokens)
        c1v = T.fixed + overhead_fixed + c2v      c1d = D.fixed + c2d
        c1p = P.fixed + p P.tok                   c2p = p P.load_tok
        baseline: c2_step = T.seq + T.tok + s T.ctx,  c1_step = T.fixed + c2_step

    The draft's KV context is taken equal to the target's.
    """
    target, draft, prefill = steps["target"], steps["draft"], steps["prefill"]
    overhead = steps.get("speculation", {"overhead_fixed_s": 0.0, "overhead_per_sequence_s": 0.0})
    context = mean_context(prompt_tokens, output_tokens)
    target_per_sequence = (
        target["per_sequence_s"] + target["per_query_token_s"] + context * target["per_context_token_s"]
    )
    c2v = target_per_sequence + overhead["overhead_per_sequence_s"]
    c2d = (target["per_query_token_s"] + draft["per_sequence_s"] + draft["per_query_token_s"]
           + context * draft["per_context_token_s"])
    return Coefficients(
        c1p_s=prefill["fixed_s"] + prompt_tokens * prefill["per_prompt_token_s"],
        c2p_s=prompt_tokens * prefill["load_per_prompt_token_s"],
        c1v_s=target["fixed_s"] + overhead["overhead_fixed_s"] + c2v,
        c2v_s=c2v,
        c1d_s=draft["fixed_s"] + c2d,
        c2d_s=c2d,
        baseline_c1_step_s=target["fixed_s"] + target_per_sequence,
        baseline_c2_step_s=target_per_sequence,
        prompt_tokens=float(prompt_tokens),
        output_tokens=float(output_tokens),
    )


def parse_calibration(document: dict[str, Any], path: str) -> Calibration:
    """Validate a parsed calibration document.

    Raises
    ------
    InputFileError
        On the first schema violation, naming ``path`` and the key.
    """
    version = document.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version != SCHEMA_VERSION:
        raise InputFileError(
            path,
            "schema_version",
            f"version {version} is not supported; this sdplan reads version {SCHEMA_VERSION} (upgrade sdplan)",
        )
    forms = [key for key in ("coefficients", "step_model") if key in document]
    if len(forms) != 1:
        problem = "both are present; keep one" if forms else "neither is present; add one"
        raise InputFileError(path, "coefficients|step_model", f"exactly one coefficient form is required, {problem}")
    validate(document, CALIBRATION_SCHEMA, path)
    provenance = document["provenance"]
    moe = document.get("moe")
    if isinstance(moe, dict) and isinstance(moe.get("experts"), int) and isinstance(moe.get("experts_per_token"), int) \
            and moe["experts_per_token"] > moe["experts"]:
        raise InputFileError(path, "moe.experts_per_token", "cannot exceed moe.experts (m <= M)")
    if provenance["method"] in ("roofline", "derived") and not provenance.get("assumptions"):
        raise InputFileError(
            path, "provenance.assumptions", f"a {provenance['method']} calibration must list its assumptions; add them"
        )
    if provenance["method"] == "derived" and "derivation" not in document:
        raise InputFileError(path, "derivation", "a derived calibration must say how it was derived; add [derivation] "
                             "(sdplan derive writes it)")
    if provenance["method"] in ("measured", "fit") and "fit_quality" not in document:
        raise InputFileError(
            path, "fit_quality", f"a '{provenance['method']}' calibration must report its fit quality; add [fit_quality]"
        )
    check_plausible(document, path)
    date = provenance["date"]
    if isinstance(date, str):
        try:
            _dt.date.fromisoformat(date)
        except ValueError:
            raise InputFileError(path, "provenance.date", f'"{date}" is not a date; write YYYY-MM-DD') from None
    return Calibration(document=document, path=path)


#: Longest time any one cost may take, seconds: a step or a prefill of an hour describes no hardware.
MAX_COST_S = 3600.0
#: Shortest plain decode step, seconds: no accelerator runs a forward pass of a model in under 100 ns.
MIN_STEP_S = 1e-7


def check_plausible(document: dict[str, Any], path: str) -> None:
    """Refuse a schema-valid calibration that cannot describe hardware.

    Every cost in seconds must be at most :data:`MAX_COST_S`; at the
    reference workload a plain decode step and a verification cycle must
    take at least :data:`MIN_STEP_S` (an all-zero file would predict zero
    latency and infinite capacity); counts (lengths, experts, GPUs) must be
    within the bounds of :mod:`sdplan.limits`.

    Raises
    ------
    InputFileError
        Naming the key and the range it must be in.
    """
    from sdplan.limits import MAX_TOKENS

    def walk(table: dict[str, Any], prefix: str) -> None:
        for key, value in table.items():
            dotted = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(value, f"{dotted}.")
            elif key.endswith("_s") and isinstance(value, (int, float)) and value > MAX_COST_S:
                raise InputFileError(path, dotted, f"{value:g} s is not a plausible cost (at most {MAX_COST_S:g} s); "
                                     "costs are in seconds: check the unit (ms or us written as s?)")

    for section in ("coefficients", "step_model", "moe"):
        if isinstance(document.get(section), dict):
            walk(document[section], f"{section}.")
    for key in ("prompt_tokens", "output_tokens"):
        if document["reference_workload"][key] > MAX_TOKENS:
            raise InputFileError(path, f"reference_workload.{key}", f"must be at most {MAX_TOKENS} tokens")
    moe = document.get("moe")
    if isinstance(moe, dict) and moe.get("experts", 0) > 100_000:
        raise InputFileError(path, "moe.experts", "must be at most 100000 experts per layer")
    if document["provenance"].get("tensor_parallel_size", 1) > 1_000_000:
        raise InputFileError(path, "provenance.tensor_parallel_size", "must be at most 1000000 GPUs")
    reference = document["reference_workload"]
    calibration = Calibration(document=document, path=path)
    coefficients = calibration.coefficients_at(reference["prompt_tokens"], reference["output_tokens"])
    where = "coefficients" if calibration.form == "direct" else "step_model.target"
    from sdplan.model import baseline_demand

    # A fit without SD runs leaves the SD coefficients undetermined (listed, and refused when planning SD).
    speculative = not {"c1v_s", "c2v_s"} <= set(calibration.without_runs)
    checks = [("a plain decode step", coefficients.baseline_c1_step_s,
               "coefficients.baseline.c1_step_s" if calibration.form == "direct" else where)]
    if speculative:
        checks.append(("a verification cycle", coefficients.c1v_s,
                       "coefficients.speculative.c1v_s" if calibration.form == "direct" else where))
    for name, value, key in checks:
        if not value >= MIN_STEP_S:
            raise InputFileError(path, key, f"{name} would take {value:g} s at the reference workload; a calibration "
                                 f"must describe hardware that takes time (>= {MIN_STEP_S:g} s per step); fill in "
                                 "the measured costs")
    # The load-dependent demand C2 (prefill interference plus the per-request step cost) must be positive: a
    # fit may put all of it in c2p, so the parts are not checked one by one.
    loads = [("no SD", float(baseline_demand(coefficients)[1]),
              "coefficients.baseline.c2_step_s" if calibration.form == "direct" else where)]
    if speculative:
        loads.append(("a verification cycle", coefficients.c2p_s + coefficients.c2v_s,
                      "coefficients.speculative.c2v_s" if calibration.form == "direct" else where))
    for name, value, key in loads:
        if not value > 0:
            raise InputFileError(path, key, f"{name} would cost nothing per concurrent request (0 s), so latency "
                                 "would never grow with load and the replica would never saturate; no hardware "
                                 "works so: fill in the per-sequence or per-context-token cost")


def load_calibration(path: Path) -> Calibration:
    """Read and validate a calibration TOML file."""
    return parse_calibration(read_toml(path), str(path))


def shipped_directory() -> Path:
    """Folder of the calibrations shipped with sdplan.

    In a wheel they are installed as package data (``sdplan/calibrations``);
    in a source checkout or an editable install they live in the repository's
    top-level ``calibrations/``.
    """
    packaged = Path(__file__).resolve().parent / "calibrations"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "calibrations"


def shipped_calibrations() -> list[Path]:
    """Paths of the shipped calibration files, sorted by name."""
    return sorted(shipped_directory().glob("*.toml"))


def resolve_calibration(reference: str | None) -> Calibration:
    """Load a calibration from a path or a shipped name; ``None`` means the default.

    Raises
    ------
    InputFileError
        If the path does not exist and no shipped calibration has that name.
    """
    name = reference or DEFAULT_CALIBRATION
    candidate = Path(name)
    if candidate.exists():
        return load_calibration(candidate)
    shipped = {path.stem: path for path in shipped_calibrations()}
    if name in shipped:
        return load_calibration(shipped[name])
    if candidate.suffix == ".toml" or "/" in name:
        raise InputFileError(name, None, "no such file; check the path, or run 'sdplan calibrations' for shipped names")
    known = ", ".join(sorted(shipped)) or "(none installed)"
    raise InputFileError(name, None, f"no such file or shipped calibration; shipped names: {known}")
