#!/usr/bin/env python3
"""Print sdplan's speed figures (a benchmark, not a test: nothing here passes or fails).

* solver throughput: grid points per second of ``planner.plan`` on a
  10^6-point (rate x draft length x acceptance) grid, best of several runs;
* cold start: wall and CPU time of ``sdplan plan`` and ``sdplan --help`` in a
  fresh process, next to the bare-imports baseline (``import numpy, click,
  rich`` and print an empty rich table) measured in the same run, the commands
  taking turns so that load on a shared machine hits them alike; medians of
  repeats, the interquartile range as the noise, ``sdplan plan``'s median
  over the baseline's (the start-up goal: at most 1.5x), the median of each
  round's own ratio, and the load average before and after.

Usage: python benchmarks/bench_planner.py [--repeats N] [--cold-only]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time


def best_time(action: object, repeats: int) -> float:
    """Best wall time of ``action()`` over ``repeats`` runs, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        action()  # type: ignore[operator]
        best = min(best, time.perf_counter() - start)
    return best


def solver_throughput(repeats: int) -> tuple[int, float]:
    import numpy

    from sdplan.calibration import resolve_calibration
    from sdplan.planning import planner

    cal = resolve_calibration(None)
    coefficients = cal.coefficients_at(1024, 512)
    rates = numpy.linspace(0.0, 15.0, 1000)
    ks = numpy.arange(1, 11)
    alphas = numpy.linspace(0.5, 0.99, 100)
    points = rates.size * ks.size * alphas.size
    return points, best_time(lambda: planner.plan(coefficients, rates, ks, alphas), repeats)


def moe_throughput(repeats: int) -> tuple[int, float, int]:
    """Grid points per second of the MoE fixed-point solver (10^5 points, loads up to saturation)."""
    import numpy

    from sdplan.calibration import resolve_calibration
    from sdplan.planning import planner

    cal = resolve_calibration("h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived")
    coefficients = cal.coefficients_at(1024, 512)
    moe = cal.moe_at(1024, 512)
    rates = numpy.linspace(0.0, 25.0, 500)
    ks = numpy.arange(1, 11)
    alphas = numpy.linspace(0.5, 0.95, 20)
    points = rates.size * ks.size * alphas.size
    return points, best_time(lambda: planner.plan(coefficients, rates, ks, alphas, moe=moe), repeats), 3


def simulator_throughput() -> tuple[int, float, float]:
    """Requests simulated per second: 20,000 requests at 50% of saturation, default calibration, k = 3."""
    import numpy

    from sdplan.calibration import resolve_calibration
    from sdplan.latency import model
    from sdplan.simulate import SimulationConfig, simulate

    coefficients = resolve_calibration(None).coefficients_at(1024, 512)
    _, c2 = model.speculative_demand(coefficients, 0.8, 3)
    config = SimulationConfig(rate_rps=0.5 / float(c2), draft_length=3, position_rates=(0.8, 0.64, 0.512),
                              requests=20_000)
    start = time.perf_counter()
    result = simulate(coefficients, config, numpy.random.default_rng(0))
    return config.requests, time.perf_counter() - start, result.duration_s


#: The bare-imports baseline of the start-up goal: what any numpy + click + rich command pays.
BASELINE = ("import numpy, click, rich\nfrom rich.console import Console\nfrom rich.table import Table\n"
            "Console().print(Table())")


def cold(commands: list[list[str]], repeats: int) -> list[tuple[list[float], list[float]]]:
    """Wall and CPU (user+sys) seconds of each command in fresh processes, the commands taking turns.

    Bytecode is cached as an installed package's is (``PYTHONDONTWRITEBYTECODE``
    is dropped and each command runs once first): compiling sdplan's sources
    at every start would be measured otherwise.
    """
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    env["NO_COLOR"] = "1"
    for command in commands:
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    samples: list[tuple[list[float], list[float]]] = [([], []) for _ in commands]
    for _ in range(repeats):
        for command, (walls, cpus) in zip(commands, samples):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            walls.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return samples


def spread(values: list[float]) -> str:
    """Median and interquartile range, in ms."""
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{quartiles[1] * 1e3:6.1f} ms (IQR {quartiles[0] * 1e3:5.1f}-{quartiles[2] * 1e3:5.1f})"


def paired(values: list[float], baseline: list[float]) -> float:
    """Median over rounds of ``values / baseline`` measured in the same round: load that drifts between rounds
    hits both sides of each ratio."""
    return statistics.median(value / base for value, base in zip(values, baseline))


def cold_start(repeats: int) -> None:
    sdplan = shutil.which("sdplan")
    base = [sdplan] if sdplan else [sys.executable, "-m", "sdplan"]
    rows = [
        ("baseline: numpy, click, rich + empty table", [sys.executable, "-c", BASELINE]),
        ("sdplan plan", [*base, "plan"]),
        ("sdplan plan --format json", [*base, "plan", "--format", "json"]),
        ("sdplan --help", [*base, "--help"]),
        ("python -c 'pass'", [sys.executable, "-c", "pass"]),
    ]
    load_before = os.getloadavg()[0]
    samples = cold([command for _, command in rows], repeats)
    print(f"cold start, {repeats} fresh processes each, taking turns (median, interquartile range); "
          f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after:")
    for (label, _), (walls, cpus) in zip(rows, samples):
        print(f"  {label:44s} wall {spread(walls)}   cpu {spread(cpus)}")
    (base_wall, base_cpu), (plan_wall, plan_cpu) = samples[0], samples[1]
    print(f"  sdplan plan / baseline: wall {statistics.median(plan_wall) / statistics.median(base_wall):.2f}x, "
          f"cpu {statistics.median(plan_cpu) / statistics.median(base_cpu):.2f}x (goal <= 1.5x); "
          f"median of the rounds' own ratios: wall {paired(plan_wall, base_wall):.2f}x, "
          f"cpu {paired(plan_cpu, base_cpu):.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cold-only", action="store_true", help="only the cold-start comparison")
    args = parser.parse_args()
    if args.cold_only:
        cold_start(args.repeats)
        return 0

    points, seconds = solver_throughput(args.repeats)
    print(f"solver: {points:,} grid points in {seconds * 1e3:.1f} ms = {points / seconds / 1e6:.1f} M points/s "
          f"(best of {args.repeats})")
    points, seconds, _ = moe_throughput(max(1, args.repeats // 2))
    print(f"MoE fixed-point solver: {points:,} grid points in {seconds * 1e3:.0f} ms = "
          f"{points / seconds / 1e6:.2f} M points/s (monotone iteration, loads up to saturation)")
    requests, seconds, simulated = simulator_throughput()
    print(f"simulator: {requests:,} requests ({simulated:,.0f} s of serving) in {seconds:.2f} s = "
          f"{requests / seconds:,.0f} requests/s")
    cold_start(args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
