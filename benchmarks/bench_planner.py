#!/usr/bin/env python3
"""Print sdplan's speed figures (a benchmark, not a test: nothing here passes or fails).

* solver throughput: grid points per second of ``planner.plan`` on a
  10^6-point (rate x draft length x acceptance) grid, best of several runs;
* cold start: wall and CPU time of ``sdplan plan`` and ``sdplan --help`` in a
  fresh process, next to ``python -c "import numpy, rich, click"`` measured in
  the same run (median of repeats).

Usage: python benchmarks/bench_planner.py [--repeats N]
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

    from sdplan import planner
    from sdplan.calibration import resolve_calibration

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

    from sdplan import planner
    from sdplan.calibration import resolve_calibration

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

    from sdplan import model
    from sdplan.calibration import resolve_calibration
    from sdplan.simulate import SimulationConfig, simulate

    coefficients = resolve_calibration(None).coefficients_at(1024, 512)
    _, c2 = model.speculative_demand(coefficients, 0.8, 3)
    config = SimulationConfig(rate_rps=0.5 / float(c2), draft_length=3, position_rates=(0.8, 0.64, 0.512),
                              requests=20_000)
    start = time.perf_counter()
    result = simulate(coefficients, config, numpy.random.default_rng(0))
    return config.requests, time.perf_counter() - start, result.duration_s


def cold(command: list[str], repeats: int) -> tuple[float, float]:
    """Median wall seconds and median CPU (user+sys) seconds of a fresh process."""
    walls, cpus = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env={**os.environ, "NO_COLOR": "1"})
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return statistics.median(walls), statistics.median(cpus)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    points, seconds = solver_throughput(args.repeats)
    print(f"solver: {points:,} grid points in {seconds * 1e3:.1f} ms = {points / seconds / 1e6:.1f} M points/s "
          f"(best of {args.repeats})")
    points, seconds, _ = moe_throughput(max(1, args.repeats // 2))
    print(f"MoE fixed-point solver: {points:,} grid points in {seconds * 1e3:.0f} ms = "
          f"{points / seconds / 1e6:.2f} M points/s (monotone iteration, loads up to saturation)")

    sdplan = shutil.which("sdplan")
    base = [sdplan] if sdplan else [sys.executable, "-m", "sdplan"]
    rows = [
        ("python -c 'import numpy, rich, click'", [sys.executable, "-c", "import numpy, rich, click"]),
        ("sdplan plan", [*base, "plan"]),
        ("sdplan plan --format json", [*base, "plan", "--format", "json"]),
        ("sdplan --help", [*base, "--help"]),
        ("python -c 'pass'", [sys.executable, "-c", "pass"]),
    ]
    requests, seconds, simulated = simulator_throughput()
    print(f"simulator: {requests:,} requests ({simulated:,.0f} s of serving) in {seconds:.2f} s = "
          f"{requests / seconds:,.0f} requests/s")
    print(f"cold start, median of {args.repeats} fresh processes:")
    for label, command in rows:
        wall, cpu = cold(command, args.repeats)
        print(f"  {label:40s} wall {wall * 1e3:7.1f} ms   cpu {cpu * 1e3:7.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
