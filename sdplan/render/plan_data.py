"""Machine-readable views of a :class:`~sdplan.planning.planner.Plan`: the JSON document and the CSV rows."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from sdplan import __version__
from sdplan.inputs.methods import provenance_method
from sdplan.latency.model import NEAR_SATURATION_UTILISATION
from sdplan.planning.planner import NONE_STABLE, SD_OFF
from sdplan.render import JSON_SCHEMA_VERSION
from sdplan.units import finite_or_none

if TYPE_CHECKING:
    from sdplan.inputs.serving import BatchCap
    from sdplan.planning.planner import Plan, PlanInputs
    from sdplan.planning.uncertainty import PlanIntervals

TTFT_NOTE = ("c1p + w_wait x step + B x w_load x per-request step cost + W: the own prefill, the wait for the "
             "running step, the mixed step with B others (weights fitted where TTFT was measured) and the prefills "
             "queued ahead; queueing beyond the batch cap is not modelled")
TPOT_NOTE = "approximation: (L - TTFT)/(g - 1), vLLM's definition (first token excluded)"
#: What each field of the JSON document means (its ``definitions`` table).
DEFINITIONS = {
    "mean_e2e_latency_s": "mean end-to-end latency, arrival to last token: (C1 + W)/(1 - lambda C2), Kong et al. "
    "eq. 1 with W the wait for the prefills queued ahead (docs/model.md#prefills-queued-ahead)",
    "effective_batch_size": "mean requests in flight, lambda * L (Little's law)",
    "utilisation": "lambda * C2 = 1 - (C1 + W)/L (MoE: 1 - (L(0) + W)/L, the dense-equivalent load share); stable "
    "below 1, near_saturation above 0.9",
    "mean_ttft_s": TTFT_NOTE,
    "mean_tpot_s": TPOT_NOTE,
    "mean_e2e_latency_ci95_s": "95% interval [low, high] from the calibration's covariance (parametric "
    "bootstrap over the fitted coefficients, each draw on a server instance of its own speed where the "
    "calibration measured their spread: intervals.server_sd_pct); null high: unstable in some draws",
    "speedup": "no-SD latency / SD latency at the same request rate; null where either is unstable",
    "per_token_alpha": "per-token acceptance probability (i.i.d.)",
    "tokens_per_cycle": "tokens per decode step: mean acceptance length E(alpha, k), bonus token "
                        "included, at draft coverage c (share of steps with a draft): c E + (1 - c)",
    "speedup_lost_to_expert_coverage": "MoE only: speedup if verification routed only 1 + B tokens, minus "
    "the speedup with (1 + B)(k+1) routed tokens (extra experts loaded by the drafted tokens)",
    "saturation_limit": "what sets saturation_rate_rps: compute (lambda C2 = 1) or cap (the batch reaches "
    "batch_cap_sequences)",
    "batch_cap_sequences": "requests the option's engine runs at once: the fewer of max_num_seqs and the "
    "workload's requests its KV cache holds; batch_cap_limit says which (kv_cache or max_num_seqs)",
}


# ----------------------------------------------------------------------------- JSON


def _sd_faster(rate: float, faster_below: bool) -> str:
    if rate == rate:  # finite break-even
        return "below_break_even" if faster_below else "above_break_even"
    return "at_every_rate" if faster_below else "never"


def speculation(k: int) -> str:
    """A ``best_k``-style value in words: ``unstable`` (nothing stable), ``off`` (no SD) or ``on``."""
    return "unstable" if k == NONE_STABLE else ("off" if k == SD_OFF else "on")


def _pair(values: Any) -> list[float | None] | None:
    """A 95% interval as [low, high] (None for an unstable or absent bound), or None when there is none."""
    low, high = (float(v) for v in values)
    if low != low and high != high:
        return None
    return [finite_or_none(low), finite_or_none(high)]


def _point(latency: float, batch: float, rho: float, tpot: float, ttft: float, rate: float, g: float) -> dict[str, Any]:
    stable = latency != float("inf")
    return {
        "mean_e2e_latency_s": finite_or_none(latency),
        "effective_batch_size": finite_or_none(batch),
        "utilisation": finite_or_none(rho),
        "mean_ttft_s": ttft if stable else None,
        "mean_tpot_s": finite_or_none(tpot),
        "output_throughput_tok_s": rate * g if stable else None,
        "regime": regime(rho),
    }


def regime(rho: float) -> str:
    if rho >= 1.0:
        return "unstable"
    return "near_saturation" if rho > NEAR_SATURATION_UTILISATION else "stable"


def _baseline_point(plan: Plan, ir: int) -> dict[str, Any]:
    """No SD at rate ``ir`` (see :func:`_point`)."""
    return _point(plan.baseline_latency_s[ir], plan.baseline_batch[ir], plan.baseline_utilisation[ir],
                  plan.baseline_tpot_s[ir], plan.baseline_ttft_load_s[ir], float(plan.rates_rps[ir]),
                  plan.coefficients.output_tokens)


def _sd_point(plan: Plan, ia: int, ir: int, ik: int) -> dict[str, Any]:
    """SD with draft length ``ik`` at acceptance ``ia`` and rate ``ir`` (see :func:`_point`)."""
    return _point(plan.latency_s[ia, ir, ik], plan.batch[ia, ir, ik], plan.utilisation[ia, ir, ik],
                  plan.tpot_s[ia, ir, ik], plan.ttft_load_s[ia, ir, ik], float(plan.rates_rps[ir]),
                  plan.coefficients.output_tokens)


def calibration_block(inputs: PlanInputs) -> dict[str, Any]:
    """The ``calibration`` object of a plan's JSON document: which file, how made, what it prices."""
    return {
        "name": inputs.calibration_name,
        "path": inputs.calibration_path,
        "method": inputs.calibration_method,
        "hardware": inputs.calibration_provenance.get("hardware"),
        "target_model": inputs.calibration_provenance.get("target_model"),
        "draft_model": inputs.calibration_provenance.get("draft_model"),
        "speculative_method": provenance_method(inputs.calibration_provenance),
    }


def workload_block(inputs: PlanInputs) -> dict[str, Any]:
    """The ``workload`` object of a plan's JSON document: lengths and acceptance."""
    return {
        "prompt_tokens": inputs.prompt_tokens,
        "output_tokens": inputs.output_tokens,
        "acceptance": inputs.acceptance.document(),
    }


def plan_document(plan: Plan, inputs: PlanInputs) -> dict[str, Any]:
    """The JSON document of a plan (``schema_version`` 1; units in every key)."""
    g = plan.coefficients.output_tokens
    intervals = inputs.intervals
    results = [{"per_token_alpha": float(alpha),
                "draft_lengths": [_per_k_entry(plan, inputs, ia, ik) for ik in range(len(plan.draft_lengths))],
                "rates": [_rate_row(plan, intervals, ia, ir) for ir in range(len(plan.rates_rps))]}
               for ia, alpha in enumerate(plan.alphas)]
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "sdplan_version": __version__,
        "command": "plan",
        "calibration": calibration_block(inputs),
        "workload": workload_block(inputs),
        "definitions": dict(DEFINITIONS),
        "moe": None if plan.moe_speedup_lost is None else {
            "solver": "monotone fixed-point iteration from L = 0 (smallest fixed point)",
            "max_relative_residual": plan.moe_max_residual,
            "c1_s": "at zero load", "c2_s": "at full expert coverage (saturation uses it)",
            "break_even_rate_rps": "first rate where the solved speedup crosses 1; every crossing is in "
            "break_even_rates_rps",
        },
        "coefficients": asdict(plan.coefficients),
        "baseline": {
            "c1_s": plan.baseline_c1_s,
            "c2_s": plan.baseline_c2_s,
            "saturation_rate_rps": finite_or_none(plan.baseline_saturation_rate_rps),
            "saturation_limit": plan.baseline_saturation_limit,
            **_cap_fields(inputs, 0),
            "max_output_throughput_tok_s": finite_or_none(g * plan.baseline_saturation_rate_rps),
        },
        "intervals": None if intervals is None else {
            "level": 0.95, "draws": intervals.draws, "server_sd_pct": intervals.server_sd_pct,
            "covers": intervals.covers},
        "warnings": list(inputs.warnings),
        "extrapolated": list(inputs.extrapolated),
        "results": results,
    }


def cap_fields(cap: BatchCap | None) -> dict[str, Any]:
    """An option's batch cap and the limit that sets it, as every JSON answer names them (null: no engine limits)."""
    return {"batch_cap_sequences": None if cap is None else cap.requests,
            "batch_cap_limit": None if cap is None else cap.limit}


def _cap_fields(inputs: PlanInputs, option: int) -> dict[str, Any]:
    """:func:`cap_fields` of an option (0: no SD); none where the inputs carry no caps."""
    return cap_fields(inputs.batch_caps[option]) if inputs.batch_caps else {}


def _per_k_entry(plan: Plan, inputs: PlanInputs, ia: int, ik: int) -> dict[str, Any]:
    """One draft length at one acceptance: its demand, saturation and break-even (with its interval)."""
    intervals = inputs.intervals
    g = plan.coefficients.output_tokens
    c1, c2 = float(plan.c1_s[ia, ik]), float(plan.c2_s[ia, ik])
    entry: dict[str, Any] = {
        "draft_length_tokens": int(plan.draft_lengths[ik]),
        "tokens_per_cycle": float(plan.tokens_per_cycle[ia, ik]),
        "c1_s": c1,
        "c2_s": c2,
        "zero_load_latency_s": c1,
        "zero_load_speedup": plan.baseline_c1_s / c1,
        "saturation_rate_rps": finite_or_none(plan.saturation_rate_rps[ia, ik]),
        "saturation_limit": str(plan.saturation_limit[ia, ik]),
        **_cap_fields(inputs, ik + 1),
        "max_output_throughput_tok_s": finite_or_none(g * plan.saturation_rate_rps[ia, ik]),
        "break_even_rate_rps": finite_or_none(plan.break_even_rate_rps[ia, ik]),
        "sd_faster": _sd_faster(float(plan.break_even_rate_rps[ia, ik]), bool(plan.sd_faster_below_break_even[ia, ik])),
    }
    if plan.step_speedup is not None and plan.step_batches is not None:  # a closed loop's throughput ratio
        entry["step_speedup"] = [{"batch_requests": float(n), "speedup": finite_or_none(float(x))}
                                 for n, x in zip(plan.step_batches, plan.step_speedup[ia, ik])]
    if intervals is not None:
        entry["break_even_rate_ci95_rps"] = _pair(intervals.break_even_rate_rps[:, ia, ik])
    if plan.moe_break_even_rates_rps is not None:  # MoE: the speedup can cross 1 several times
        entry["break_even_rates_rps"] = [float(x) for x in plan.moe_break_even_rates_rps[ia, ik] if x == x]
    return entry


def _rate_row(plan: Plan, intervals: PlanIntervals | None, ia: int, ir: int) -> dict[str, Any]:
    """One request rate at one acceptance: no SD, every draft length, the policies and the best option."""
    baseline = _baseline_point(plan, ir)
    if intervals is not None:
        baseline["mean_e2e_latency_ci95_s"] = _pair(intervals.baseline_latency_s[:, ir])
    baseline_stable = baseline["mean_e2e_latency_s"] is not None
    best_k = int(plan.best_k[ia, ir])
    return {
        "request_rate_rps": float(plan.rates_rps[ir]),
        "policies": _policies(plan, ia, ir),
        "baseline": baseline,
        "speculative": [_speculative_point(plan, intervals, ia, ir, ik, baseline_stable)
                        for ik in range(len(plan.draft_lengths))],
        "best": {
            "speculation": speculation(best_k),
            "draft_length_tokens": best_k if best_k > 0 else None,
            "mean_e2e_latency_s": finite_or_none(plan.best_latency_s[ia, ir]),
            "speedup": finite_or_none(plan.best_speedup[ia, ir]) if baseline_stable else None,
        },
    }


def _speculative_point(plan: Plan, intervals: PlanIntervals | None, ia: int, ir: int, ik: int,
                       baseline_stable: bool) -> dict[str, Any]:
    """One draft length at one rate: the point, its speedup over no SD (null unless both are stable), its
    interval and, for MoE, the speedup lost to expert coverage."""
    point = _sd_point(plan, ia, ir, ik)
    point["speedup"] = finite_or_none(plan.speedup[ia, ir, ik]) if point["mean_e2e_latency_s"] else None
    if intervals is not None:
        point["mean_e2e_latency_ci95_s"] = _pair(intervals.latency_s[:, ia, ir, ik])
    if not baseline_stable:
        point["speedup"] = None
    if plan.moe_speedup_lost is not None:
        lost = plan.moe_speedup_lost[ia, ir, ik]
        point["speedup_lost_to_expert_coverage"] = finite_or_none(lost) if point["speedup"] else None
    return {"draft_length_tokens": int(plan.draft_lengths[ik]), **point}


def _policies(plan: Plan, ia: int, ir: int) -> dict[str, Any] | None:
    """The goodput policy and the zero-load-tuned k at one rate (None without ``--policy goodput``)."""
    if plan.goodput_latency_s is None or plan.goodput_k is None or plan.zero_load_k is None \
            or plan.zero_load_k_latency_s is None:
        return None
    gk = int(plan.goodput_k[ia, ir])
    zk = int(plan.zero_load_k[ia])
    return {
        "goodput": {
            "mean_e2e_latency_s": finite_or_none(plan.goodput_latency_s[ia, ir]),
            "draft_length_tokens": gk if gk > 0 else None,
            "speculation": speculation(gk),
        },
        "zero_load_static": {
            "draft_length_tokens": zk if zk > 0 else None,
            "mean_e2e_latency_s": finite_or_none(plan.zero_load_k_latency_s[ia, ir]),
        },
    }


# ----------------------------------------------------------------------------- CSV

CSV_COLUMNS = (
    "per_token_alpha",
    "request_rate_rps",
    "speculation",
    "draft_length_tokens",
    "tokens_per_cycle",
    "mean_e2e_latency_s",
    "effective_batch_size",
    "utilisation",
    "mean_ttft_s",
    "mean_tpot_s",
    "output_throughput_tok_s",
    "speedup",
    "regime",
    "is_best",
)


def plan_csv(plan: Plan) -> str:
    """One row per (alpha, rate, k), plus a ``speculation=off`` row per (alpha, rate)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)

    def cell(value: float | None) -> str:
        return "" if value is None else repr(float(value))

    for ia, alpha in enumerate(plan.alphas):
        for ir, rate in enumerate(plan.rates_rps):
            best = int(plan.best_k[ia, ir])
            base = _baseline_point(plan, ir)
            writer.writerow(
                [cell(alpha), cell(rate), "off", 0, cell(1.0), cell(base["mean_e2e_latency_s"]),
                 cell(base["effective_batch_size"]), cell(base["utilisation"]), cell(base["mean_ttft_s"]),
                 cell(base["mean_tpot_s"]), cell(base["output_throughput_tok_s"]), "", base["regime"],
                 str(best == 0).lower()]
            )
            for ik, k in enumerate(plan.draft_lengths):
                point = _sd_point(plan, ia, ir, ik)
                speed = finite_or_none(plan.speedup[ia, ir, ik])
                if point["mean_e2e_latency_s"] is None or base["mean_e2e_latency_s"] is None:
                    speed = None
                writer.writerow(
                    [cell(alpha), cell(rate), "on", int(k), cell(plan.tokens_per_cycle[ia, ik]),
                     cell(point["mean_e2e_latency_s"]), cell(point["effective_batch_size"]),
                     cell(point["utilisation"]), cell(point["mean_ttft_s"]), cell(point["mean_tpot_s"]),
                     cell(point["output_throughput_tok_s"]), cell(speed), point["regime"],
                     str(best == int(k)).lower()]
                )
    return buffer.getvalue()
