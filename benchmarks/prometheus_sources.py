"""Figures of calibrating from vLLM's metrics, on the real recordings of tests/data/prometheus-cpu.

1. Same runs, two sources: the calibration fitted from the metrics (text scrapes; the Prometheus export)
   against the one fitted from the ``vllm bench serve`` files of the same runs: per-configuration ``C1``,
   ``C2`` (``L = C1 + B C2``) and the pooled calibrations' predicted mean E2E at the measured rates.
2. Acceptance per position: the windows' against vLLM's own (the bench files', from its counters).
3. Held out: per load level, fitted from the other three loads (both options), the held-out windows
   predicted, against the floor the machine's server-to-server spread puts under any model
   (``sdplan/accuracy/floors.py``, at the spreads measured on these 2-core VMs).
4. Prior scaling: calibrations scaled to the no-SD metrics, predicting the SD server's windows, against the
   same calibrations as they are.

Run from the repository root: ``python benchmarks/prometheus_sources.py [--json OUT]``; ``--data DIR
--rates 2,4,6,8,10`` reads another recording of ``benchmarks/record_prometheus.py``. Reads only recorded
files; nothing is generated from the model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sdplan.accuracy.floors import perfect_model_error
from sdplan.calibration import parse_calibration, resolve_calibration
from sdplan.errors import InputFileError
from sdplan.fitting.fit import fit_configurations, fit_pooled, fitted_document
from sdplan.fitting.validation import predict_latency
from sdplan.metrics.prior import gap, scale_prior
from sdplan.runs import load_runs, screen
from sdplan.runs.record import BenchmarkRun

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "prometheus-cpu"
RATES: tuple[float, ...] = (2, 4, 7, 10)
#: Server-to-server spread of mean latency measured on these 2-core VMs (repeat_sd_pct of acc40-49,
#: benchmarks/RESULTS-accuracy-served-2026-11.md): the least and the most.
SPREADS_PCT = (4.5, 16.3)
PRIORS = ("cpu-epyc-2core_tiny-llama-h256-l4_tiny-llama-h128-l1_measured", "l40s_qwen3-8b_qwen3-0.6b_derived",
          "h100-sxm_llama-3.1-8b_llama-3.2-1b_derived")
PROVENANCE = {"method": "fit", "hardware": "2-core x86_64 VM", "target_model": "tiny successor",
              "draft_model": "tiny successor draft", "engine": "vllm", "engine_version": "0.32.0",
              "date": "2026-11-29"}


def scrapes(option: str) -> Path:
    """The option's scrape file, compressed (the fixtures) or not (a fresh recording)."""
    packed = DATA / f"{option}.scrapes.xz"
    return packed if packed.exists() else DATA / f"{option}.scrapes"


def bench_file(option: str, rate: float) -> Path:
    return DATA / f"{option}-r{rate:g}.json"


def kept(paths: list[Path]) -> list[BenchmarkRun]:
    runs, _ = load_runs([str(p) for p in paths], "auto", None, None)
    return [run for run in runs if not screen(run)]


def calibration(runs: list[BenchmarkRun], name: str) -> Any:
    return parse_calibration(fitted_document(fit_pooled(runs), runs, name=name, provenance=PROVENANCE,
                                             description=name), name)


def percent(value: float, reference: float) -> float:
    """``value`` against ``reference`` in percent (infinite where the reference is 0: a C2 fitted as 0)."""
    return 100 * (value / reference - 1) if reference else float("inf")


def two_sources() -> dict[str, Any]:
    sources = {"scrapes": [scrapes("nosd"), scrapes("sd")],
               "prometheus": [DATA / "nosd.query_range.json", DATA / "sd.query_range.json"],
               "bench": [bench_file(o, r) for o in ("nosd", "sd") for r in RATES]}
    runs = {name: kept(paths) for name, paths in sources.items()}
    configurations = {name: {f.draft_length: f for f in fit_configurations(found)} for name, found in runs.items()}
    result: dict[str, Any] = {"kept_runs": {name: len(found) for name, found in runs.items()}, "per_configuration": []}
    for k in (0, 3):
        bench = configurations["bench"][k]
        for name in ("scrapes", "prometheus"):
            mine = configurations[name][k]
            result["per_configuration"].append({
                "option": k, "source": name, "c1_s": mine.c1_s, "c2_s": mine.c2_s, "bench_c1_s": bench.c1_s,
                "bench_c2_s": bench.c2_s, "c1_diff_pct": percent(mine.c1_s, bench.c1_s),
                "c2_diff_pct": percent(mine.c2_s, bench.c2_s)})
    # the pooled calibrations' predictions at the measured rates (the bench files' runs, as they were measured)
    try:
        metrics_cal, bench_cal = calibration(runs["scrapes"], "metrics"), calibration(runs["bench"], "bench")
    except InputFileError as error:  # e.g. a C2 fitted as 0: runs whose latency did not grow with the load
        result["predictions"], result["max_prediction_diff_pct"] = [], None
        result["no_calibration"] = str(error)
        return result
    predictions = []
    for run in load_runs([str(p) for p in sources["bench"]], "auto", None, None)[0]:
        ours = predict_latency(metrics_cal.coefficients_at(run.prompt_tokens, run.output_tokens), run)
        theirs = predict_latency(bench_cal.coefficients_at(run.prompt_tokens, run.output_tokens), run)
        predictions.append({"run": run.source, "rate_rps": run.arrival_rate_rps, "metrics_s": ours, "bench_s": theirs,
                            "diff_pct": 100 * (ours / theirs - 1), "measured_client_s": run.mean_e2e_latency_s})
    result["predictions"] = predictions
    result["max_prediction_diff_pct"] = max(abs(p["diff_pct"]) for p in predictions)
    return result


def acceptance() -> dict[str, Any]:
    windows = kept([scrapes("sd")]) + kept([DATA / "sd.query_range.json"])
    worst = 0.0
    for run in windows:
        rate = RATES[int(run.source.split("#w")[1].split("[")[0]) - 1]
        recorded = json.loads(bench_file("sd", rate).read_text())["spec_decode_per_position_acceptance_rates"]
        worst = max(worst, max(abs(a - b) for a, b in zip(run.position_rates or (), recorded)))
    return {"windows": len(windows), "max_abs_diff": worst}


def held_out() -> list[dict[str, Any]]:
    windows = kept([scrapes("nosd"), scrapes("sd")])
    rows = []
    for index, rate in enumerate(RATES):
        tag = f"#w{index + 1}["
        train = [run for run in windows if tag not in run.source]
        try:
            cal = calibration(train, f"without-{rate}")
        except InputFileError:  # a C2 fitted as 0 (latency flat in the load): no calibration to predict with
            continue
        for run in (run for run in windows if tag in run.source):
            coefficients = cal.coefficients_at(run.prompt_tokens, run.output_tokens)
            predicted = predict_latency(coefficients, run)
            from sdplan.fitting.runmodel import run_demand

            _, c2 = run_demand(coefficients, run)
            load = run.arrival_rate_rps * c2
            rows.append({"held_out": run.source, "option": run.draft_length, "rate_rps": run.arrival_rate_rps,
                         "measured_s": run.mean_e2e_latency_s, "predicted_s": predicted,
                         "error_pct": 100 * (predicted / run.mean_e2e_latency_s - 1), "load": load,
                         **{f"floor_pct_at_{s:g}": 100 * perfect_model_error(load, s / 100, 1) for s in SPREADS_PCT}})
    return rows


def held_out_per_option() -> list[dict[str, Any]]:
    """Per option, ``L = C1 + B C2`` fitted to three loads' windows (:func:`sdplan.fitting.fit.fit_configurations`), the
    fourth predicted at its arrival rate, ``C1/(1 - lambda C2)``."""
    windows = kept([scrapes("nosd"), scrapes("sd")])
    rows = []
    for k in (0, 3):
        mine = [run for run in windows if run.draft_length == k]
        for run in mine:
            (fit,) = fit_configurations([other for other in mine if other is not run])
            load = run.arrival_rate_rps * fit.c2_s
            predicted = fit.c1_s / (1 - load) if load < 1 else float("inf")
            rows.append({"held_out": run.source, "option": k, "rate_rps": run.arrival_rate_rps, "load": load,
                         "measured_s": run.mean_e2e_latency_s, "predicted_s": predicted,
                         "error_pct": 100 * (predicted / run.mean_e2e_latency_s - 1),
                         **{f"floor_pct_at_{s:g}": 100 * perfect_model_error(load, s / 100, 1) for s in SPREADS_PCT}})
    return rows


def priors() -> list[dict[str, Any]]:
    base = kept([scrapes("nosd")])
    sd = kept([scrapes("sd")])
    rows = []
    for name in PRIORS:
        prior = resolve_calibration(name)
        scaled = scale_prior(prior, base, name="scaled", provenance=dict(PROVENANCE))
        after = gap(parse_calibration(scaled.document, "scaled").coefficients_at, sd)
        before = gap(prior.coefficients_at, sd)
        rows.append({"prior": name, "c1_scale": scaled.c1_scale, "c2_scale": scaled.c2_scale,
                     "no_sd_gap_before_pct": scaled.before.mape_pct, "no_sd_gap_after_pct": scaled.after.mape_pct,
                     "sd_prior_alone_pct": before.mape_pct, "sd_scaled_pct": after.mape_pct,
                     "sd_scaled_bias_pct": after.bias_pct})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="Write every figure here too.")
    parser.add_argument("--data", type=Path, help="Another recording's folder (default: the fixtures).")
    parser.add_argument("--rates", help="Its rates, e.g. 2,4,6,8,10 (default 2,4,7,10).")
    args = parser.parse_args()
    global DATA, RATES
    DATA = args.data or DATA
    RATES = tuple(float(v) for v in args.rates.split(",")) if args.rates else RATES
    figures = {"two_sources": two_sources(), "acceptance": acceptance(), "held_out": held_out(),
               "held_out_per_option": held_out_per_option(), "priors": priors()}
    two = figures["two_sources"]
    print(f"runs kept: {two['kept_runs']}")
    for row in two["per_configuration"]:
        print(f"k={row['option']} {row['source']:>10}: C1 {row['c1_s']:.4f} s vs bench {row['bench_c1_s']:.4f} "
              f"({row['c1_diff_pct']:+.1f}%), C2 {row['c2_s']:.5f} vs {row['bench_c2_s']:.5f} "
              f"({row['c2_diff_pct']:+.1f}%)")
    for row in two["predictions"]:
        print(f"  {row['run']:>14} at {row['rate_rps']:g} req/s: metrics {row['metrics_s']:.4f} s, bench "
              f"{row['bench_s']:.4f} s ({row['diff_pct']:+.1f}%); client measured {row['measured_client_s']:.4f} s")
    if two["max_prediction_diff_pct"] is None:
        print(f"no pooled comparison: {two['no_calibration']}")
    else:
        print(f"largest difference of predicted mean E2E: {two['max_prediction_diff_pct']:.1f}%")
    print(f"acceptance per position, {figures['acceptance']['windows']} windows: largest difference from vLLM's "
          f"{figures['acceptance']['max_abs_diff']:.3g}")
    for row in figures["held_out"] + figures["held_out_per_option"]:
        how = "(pooled) " if row in figures["held_out"] else "(C1, C2) "
        print(f"held out {how}{row['held_out']} (k={row['option']}, rho {row['load']:.2f}): "
              f"error {row['error_pct']:+.1f}%, "
              + ", ".join(f"floor {row[f'floor_pct_at_{s:g}']:.1f}% at sigma {s:g}%" for s in SPREADS_PCT))
    for row in figures["priors"]:
        print(f"prior {row['prior']}: x{row['c1_scale']:.3g} / x{row['c2_scale']:.3g}; no-SD gap "
              f"{row['no_sd_gap_before_pct']:.1f}% -> {row['no_sd_gap_after_pct']:.1f}%; SD windows "
              f"{row['sd_prior_alone_pct']:.1f}% alone, {row['sd_scaled_pct']:.1f}% scaled")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
