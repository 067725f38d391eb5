"""The calibration document of a served ``sdplan calibrate``: the fit of its points and its provenance.

The points are fitted with the same machinery as ``sdplan fit``
(:func:`sdplan.fitting.fit.fit_pooled`); the calibration is written even when its fit is
poor, and the caller decides the exit status from
:attr:`ServedCalibration.poor_reasons`.
"""

from __future__ import annotations

import datetime
import statistics
from dataclasses import dataclass
from typing import Any

from sdplan._vllm import installed_distribution
from sdplan.errors import InfeasibleError
from sdplan.fitting.fit import fit_pooled, fitted_document
from sdplan.inputs.acceptance import measured_acceptance_table
from sdplan.measure.levels import REPEAT_DISAGREEMENT
from sdplan.measure.options import ServedOptions, hardware_description
from sdplan.measure.run import ServedMeasurement
from sdplan.runs import read_results, screen
from sdplan.runs.screen import stalled_note

#: A calibration whose own points are predicted worse than this is poor (mean absolute % error of mean E2E).
POOR_MAPE_PCT = 10.0
#: ... or whose R2 over its own points is below this.
POOR_R2 = 0.9

@dataclass
class ServedCalibration:
    document: dict[str, Any]
    fit: Any
    poor_reasons: list[str]


def acceptance_document(runs: list[Any], prompts: str = "random-token prompts") -> dict[str, Any] | None:
    """``[acceptance]`` from the SD runs at the largest measured draft length ``K``.

    The per-token alpha is the i.i.d. one with the runs' mean acceptance length at ``K``. Where
    vLLM recorded per-position rates, their mean goes in too, as the schema's conditional rates
    ``a_i = r_i / r_(i-1)``: a drafter's acceptance is rarely i.i.d. (the tiny draft of the
    benchmark accepts its first two tokens 97% of the time and its third 1%), and the planner
    then takes ``E(k) = 1 + r_1 + ... + r_k`` for every ``k <= K`` instead of extrapolating one alpha.
    """
    spec = [r for r in runs if r.draft_length > 0 and r.alpha is not None]
    if not spec:
        return None
    k = max(r.draft_length for r in spec)
    at_k = [r for r in spec if r.draft_length == k]
    alpha = sum(r.alpha for r in at_k) / len(at_k)
    lengths = [r.mean_acceptance_length for r in at_k if r.mean_acceptance_length is not None]
    length_text = f", mean acceptance length {sum(lengths) / len(lengths):.3f}" if lengths else ""
    positions = [r.position_rates for r in at_k if getattr(r, "position_rates", None) is not None]
    cumulative = [sum(rates[i] for rates in positions) / len(positions) for i in range(k)] if positions else None
    if cumulative:
        length_text += ", per position " + ", ".join(f"{rate:.3f}" for rate in cumulative)
    coverages = [r.draft_coverage for r in at_k if r.draft_coverage is not None]
    document, coverage_text = measured_acceptance_table(alpha, k, cumulative,
                                                        sum(coverages) / len(coverages) if coverages else None)
    length_text += coverage_text
    document["source"] = (f"vLLM spec-decode counters over {len(at_k)} served run(s) at k={k}{length_text}; "
                          f"depends on the prompts ({prompts} here) and the temperature")
    return document


def served_calibration(options: ServedOptions, measurement: ServedMeasurement, *, name: str,
                       version: str) -> ServedCalibration:
    """Fit the measured points and build a ``method = "measured"`` calibration.

    Raises
    ------
    InfeasibleError
        When too few points were measured to fit.
    """
    kept, overloaded, screened = _fit_points(measurement)
    reference = (options.prompt_tokens, options.output_tokens)
    if options.dataset is not None:  # the dataset's lengths, as served
        reference = (round(sum(r.prompt_tokens for r in kept) / len(kept)),
                     round(sum(r.output_tokens for r in kept) / len(kept)))
    fit = fit_pooled(kept, reference=reference)
    spread_fields, spread_note = _spread_summary(measurement.repeat_spreads)
    stalled = stalled_note(kept)  # its TTFT fit rests on delivery delays: said in the provenance
    left_out = ([f"{len(screened)} measured point(s) left out of the fit by the steady-state screen "
                 "(screened_points, with why)"] if screened else [])
    provenance = _provenance(options, measurement, kept, version,
                             [*fit.notes, *measurement.notes, *spread_note, *([stalled] if stalled else []),
                              *left_out])
    table = _measurement_table(options, measurement, kept, fit, overloaded, screened, spread_fields)
    document = fitted_document(
        fit, kept, name=name, provenance=provenance,
        description=f"{provenance['target_model']} served by vLLM on {provenance['hardware']}, measured with "
                    "sdplan calibrate",
        extra={"measurement": table}, acceptance=acceptance_document(
            kept, "random-token prompts" if options.dataset is None else f"the prompts of {options.dataset.name}"))
    return ServedCalibration(document=document, fit=fit, poor_reasons=_poor_reasons(fit, measurement))


def _fit_points(measurement: ServedMeasurement) -> tuple[list[Any], list[str], list[str]]:
    """The runs to fit (read and screened, :func:`sdplan.runs.screen`), a line per point the server did
    not keep up with, and a line per point the screen left out, with why (both left out of the fit)."""
    runs = []
    for path in measurement.result_files():
        runs += read_results(path, "vllm")[0]
    kept, screened = [], []
    for run in runs:
        reasons = screen(run)
        if reasons:
            screened.append(f"{run.source}: {'; '.join(reasons)}")
        else:
            kept.append(run)
    overloaded = []
    for path in measurement.result_files(overloaded=True):
        for run in read_results(path, "vllm")[0]:
            overloaded.append(f"{run.source}: {run.achieved_rate_rps:.3g} of {run.requested_rate_rps or 0:.3g} req/s "
                              f"offered, {(run.requested_rate_rps or 0) * run.mean_e2e_latency_s:.3g} requests in "
                              "flight on average")
    if len(kept) < 3:
        raise InfeasibleError(f"only {len(kept)} usable points in {measurement.folder}; measure more (--resume) "
                              "or a larger --grid")
    return kept, overloaded, screened


def _poor_reasons(fit: Any, measurement: ServedMeasurement) -> list[str]:
    """Why the calibration is poor (empty: it is not): its own points predicted worse than
    :data:`POOR_MAPE_PCT`, an R2 below :data:`POOR_R2`, or more than a quarter of its points disturbed."""
    disturbed = [r for r in measurement.records if r.disturbed]
    poor = []
    if fit.mape_pct > POOR_MAPE_PCT:
        poor.append(f"own-point MAPE {fit.mape_pct:.1f}% > {POOR_MAPE_PCT:g}%")
    if fit.r2 < POOR_R2:
        poor.append(f"R2 {fit.r2:.3f} < {POOR_R2:g}")
    if disturbed and len(disturbed) * 4 > len(measurement.records):
        poor.append(f"{len(disturbed)} of {len(measurement.records)} points disturbed (other processes used CPU, "
                    "or their repeats disagree)")
    return poor


def _provenance(options: ServedOptions, measurement: ServedMeasurement, kept: list[Any], version: str,
                notes: list[str]) -> dict[str, Any]:
    """The ``[provenance]`` table: the machine, the models, vLLM's version, and how the points were measured."""
    lengths = sorted({r.draft_length for r in kept if r.draft_length > 0})
    levels = sorted({r.concurrency for r in kept if r.concurrency}, key=int)
    distribution = installed_distribution()
    engine_version = f"{distribution[1]} ({distribution[0]})" if distribution else "unknown"
    return {
        "method": "measured", "hardware": hardware_description(),
        "target_model": options.target or options.endpoint or "unknown",
        "speculative_method": options.method,
        "draft_model": options.draft or (options.method if options.method != "draft_model" else "none"),
        "engine": "vllm", "engine_version": engine_version, "date": datetime.date.today(),
        "created_by": f"sdplan calibrate --method served (sdplan {version})",
        "sources": [f"vllm bench serve results: {measurement.folder}"],
        "notes": (f"served: vllm serve loaded by vllm bench serve ({options.workload_text()}, temperature "
                  f"{options.temperature:g}); closed-loop clients "
                  f"{levels}, grid '{options.grid_name}'; draft lengths {lengths or 'none'}. "
                  + " ".join(note.rstrip(".") + "." for note in notes)),
    }


def _measurement_table(options: ServedOptions, measurement: ServedMeasurement, kept: list[Any], fit: Any,
                       overloaded: list[str], screened: list[str], spread_fields: dict[str, Any]) -> dict[str, Any]:
    """The ``[measurement]`` table: how the points were measured, how far they lay apart, and each point's
    error under the fit."""
    return {
        "method": "served",
        "server_commands": measurement.server_commands,
        "client": f"vllm bench serve --dataset-name {'random' if options.dataset is None else 'custom'} "
                  "--ignore-eos --save-detailed (one process, vLLM's own benchmark client)",
        "cpu_binding": measurement.binding or "not reported by the server (GPU, or binding disabled)",
        "wall_time_s": round(measurement.wall_s, 1),
        "invocations": measurement.invocations,
        "server_instances_per_configuration": measurement.instances,
        "points": len(measurement.records),
        "disturbed_points": len([r for r in measurement.records if r.disturbed]),
        **spread_fields,
        **_full_load_fields(kept),
        **({"overloaded_points": overloaded} if overloaded else {}),
        **({"screened_points": screened} if screened else {}),
        "results_dir": str(measurement.folder),
        "point_labels": [f"{r.load_level} k={r.draft_length} ({r.source})" for r in fit.residuals],
        "point_errors_pct": [round(r.error_pct, 3) for r in fit.residuals],
        "point_ttft_errors_pct": [round(r.ttft_error_pct, 3) if r.ttft_error_pct is not None else 0.0
                                  for r in fit.residuals],
        **({"prefix_cache": ", ".join(f"{name} {pct:g}%" for name, pct in measurement.prefix_cache_hit_pct.items())
            + " of prompt tokens served from vLLM's prefix cache"} if measurement.prefix_cache_hit_pct else {}),
        **({"kv_cache_configurations": list(measurement.kv_cache_tokens),
            "kv_cache_tokens": list(measurement.kv_cache_tokens.values())} if measurement.kv_cache_tokens else {}),
    }


def _full_load_fields(runs: list[Any]) -> dict[str, Any]:
    """The measurement table's fields on the closed-loop points' ramp-up and drain: the smallest share of a
    point's duration with all its clients busy (:func:`sdplan.runs.record.full_load_share`), and its point.
    A point of ``3N`` requests is three waves; the rest of its duration is ramp-up and drain, which the fit
    takes in through each request's measured others in flight, but its completed/duration does not."""
    shares = [(r.full_load_share, r) for r in runs if r.concurrency and r.full_load_share is not None]
    if not shares:
        return {}
    share, run = min(shares, key=lambda item: item[0])
    return {"closed_loop_full_load_min_pct": round(100 * share, 1),
            "closed_loop_full_load_min_point": f"N={run.concurrency} k={run.draft_length} ({run.source})"}


def _spread_summary(spreads: dict[str, float]) -> tuple[dict[str, Any], list[str]]:
    """The measurement table's fields on how far the repeats of a point lay apart, and a note when they
    disagree: the repeats ran in rounds, or on a configuration's second server instance, spread over the whole
    calibration (on fresh servers, unless an --endpoint), so their spread is how far the machine's speed moved
    while it was measured, server starts included."""
    if not spreads:
        return {}, []
    median = statistics.median(spreads.values())
    worst = max(spreads, key=spreads.__getitem__)
    fields = {"repeat_spread_median_pct": round(100 * median, 2),
              "repeat_spread_max_pct": round(100 * spreads[worst], 2),
              "repeat_spread_max_point": worst}
    note = []
    if median > REPEAT_DISAGREEMENT:
        note.append(f"The repeats of a point, each on a server instance of its own, lay a median {median:.0%} apart "
                    f"(up to {spreads[worst]:.0%}, {worst}): this machine's speed moved while it was measured, or "
                    "differs from one server start to the next; the fit averages it, and predictions carry an "
                    "error of that order.")
    return fields, note
