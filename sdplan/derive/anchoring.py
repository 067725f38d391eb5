"""The no-SD part of a derived calibration anchored to measured closed-loop rows.

Where AIConfigurator's measured end-to-end rows (``systems/silicon_sample.csv``,
read by :mod:`sdplan.runs.silicon`) exist for the request's target, GPU,
backend, tensor parallelism and precision, :func:`fit_anchor` scales the
priced decode and prefill costs to them; the derived file keeps
AIConfigurator's ratios of every SD step to the plain decode step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sdplan.derive.fitting import fit_linear
from sdplan.derive.pricing import MXFP4_EXPERTS, Pricer
from sdplan.derive.request import MS, DeriveRequest, model_key
from sdplan.errors import MissingDependencyError
from sdplan.runs import silicon
from sdplan.runs.record import BenchmarkRun


@dataclass(frozen=True, slots=True)
class MeasuredRows:
    """Closed-loop runs to anchor on, each with the engine version that measured it."""

    runs: tuple[BenchmarkRun, ...] = ()
    versions: tuple[str, ...] = ()


def measured_rows(request: DeriveRequest, quant: dict[str, str] | None = None) -> MeasuredRows:
    """The installed ``silicon_sample.csv``'s aggregated rows for the request's configuration.

    The rows of the request's backend (every version), system, tensor parallelism and precision
    (``fp8_block`` reads the ``fp8`` rows, ``nvfp4`` the ``fp4`` ones; a blank precision is bf16) without
    attention data or pipeline parallelism, whose model is the target's
    (:func:`~sdplan.derive.request.model_key`: ``nvidia/Llama-3.1-8B-Instruct-FP8`` is Llama-3.1-8B), each
    measurement once (:func:`~sdplan.runs.silicon.distinct_measurements`). A target
    whose experts are priced as MXFP4 (``quant``, :func:`~sdplan.derive.pricing.checkpoint_quant_modes`: gpt-oss)
    reads the ``fp4`` rows. None where the package's file is absent.
    """
    try:
        path = silicon.resolve_path(silicon.PACKAGED)
    except MissingDependencyError:
        return MeasuredRows()
    key = model_key(request.target_model)
    precision = {"fp8_block": "fp8", "nvfp4": "fp4"}.get(request.precision, request.precision)
    if quant is not None and quant.get("moe_quant_mode") == MXFP4_EXPERTS:
        precision = "fp4"
    runs, versions = [], []
    for line, row in silicon.parse_rows(str(path), path.read_text(encoding="utf-8")):
        cells = {name: silicon.cell_value(row, name) for name in ("backend", "system", "tp", "precision", "dp")}
        if (cells["backend"] == request.backend and cells["system"] == request.system
                and cells["tp"] == str(request.tensor_parallel_size) and cells["dp"] == "1"
                and {silicon.UNRECORDED: "bf16"}.get(cells["precision"], cells["precision"]) == precision
                and (row.get("pp_size") or "1").strip() == "1" and model_key(row["model_path"]) == key):
            runs.append(silicon.run_of(str(path), line, row))
            versions.append(silicon.cell_value(row, "version"))
    # A measurement the file lists under several ids weighs once, as in sdplan fit.
    version_of = {id(run): version for run, version in zip(runs, versions)}
    distinct, _ = silicon.distinct_measurements(runs)
    return MeasuredRows(tuple(distinct), tuple(version_of[id(run)] for run in distinct))


def fit_anchor(measured: MeasuredRows, pricer: Pricer, kv_tokens: int | None) -> dict[str, Any] | None:
    """Scale AIConfigurator's decode and prefill costs to measured closed-loop TPOT.

    Notes
    -----
    A closed loop of ``N`` clients with prompts of ``p`` and outputs of ``g``
    tokens runs ``N`` sequences per decode step and admits ``N / g`` new
    prompts per step, each adding its prefill to the step it is chunked into
    (sdplan's ``c2p``: ``sdplan-calibration(5)``). Its time per output token is
    then ``TPOT = a D(N, s) + b (N / g) P(p) + o`` with ``o`` the engine's host
    overhead per step (:func:`~sdplan.derive.request.engine_overheads`, fixed), and ``D`` AIConfigurator's
    decode step at the mean context ``s = p + g/2`` and ``P`` its prefill of one
    prompt. ``a`` and ``b`` are fitted by
    :func:`~sdplan.derive.fitting.fit_linear` to the measured rows whose
    sequences fit the KV cache at their longest (``N (p + g)`` tokens at most: no
    request is ever preempted; beyond it requests may queue for memory or be
    computed again, which no step cost describes). The derived
    file keeps AIConfigurator's ratios of every SD step to the plain decode
    step: every target and draft step cost is multiplied by ``a``, every
    prefill cost by ``b``. None with fewer than three usable rows.
    """
    design, measured_s, used = [], [], []
    waited = silicon.waited_for_admission(measured.runs)
    for run, version, queued in zip(measured.runs, measured.versions, waited):
        clients, prompt, output = int(run.concurrency or 0), int(run.prompt_tokens), int(run.output_tokens)
        if (run.mean_tpot_s is None or queued
                or (kv_tokens is not None and clients * (prompt + output) > kv_tokens)):
            continue
        decode = pricer.target_decode(clients, prompt + output // 2)
        prefill = float(pricer.target.predict_prefill_latency(1, prompt)) * MS * clients / output
        design.append([decode, prefill, 1.0])
        measured_s.append(run.mean_tpot_s)
        used.append((clients, version))
    if len(design) < 3:
        return None
    # The engine's step overhead is part of every measured step but no op AIConfigurator prices: it is fixed
    # at its sourced value, and a and b scale what remains.
    o = pricer.request.overheads.step_s
    (decode_scale, prefill_scale), _, _ = fit_linear([row[:2] for row in design],
                                                     [max(m - o, 1e-6) for m in measured_s])
    fitted = [decode_scale * d + prefill_scale * p + o for d, p, _ in design]
    errors = [abs(f - m) / m * 100.0 for f, m in zip(fitted, measured_s)]
    mape, worst = sum(errors) / len(errors), max(errors)
    raw = [abs(d + p + o - m) / m * 100.0 for (d, p, _), m in zip(design, measured_s)]
    bias = sum((d + p + o - m) / m * 100.0 for (d, p, _), m in zip(design, measured_s)) / len(measured_s)
    return {
        "rows": len(used),
        "rows_left_out": len(measured.runs) - len(used),
        "row_versions": sorted({version for _, version in used}),
        "decode_scale": decode_scale,
        "prefill_scale": prefill_scale,
        "gap_mape_pct": sum(raw) / len(raw),
        "gap_bias_pct": bias,
        "anchored_mape_pct": mape,
        "anchored_max_error_pct": worst,
        "concurrency": [min(clients for clients, _ in used), max(clients for clients, _ in used)],
    }
