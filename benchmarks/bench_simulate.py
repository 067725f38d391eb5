#!/usr/bin/env python3
"""Print the simulator's speed figures (a benchmark, not a test: nothing here passes or fails).

* simulator throughput: requests simulated per second of one replication
  (20,000 requests, default calibration, 1024/512), SD off and k=3 at
  utilisation 0.3/0.7/0.9, and the goodput policy (k = 0..8 per step at 0.7
  of k=3's saturation); best of several runs, and for the goodput policy
  also the median wall and CPU times;
* ``capacity --simulate``: wall time of the default command
  (``--slo 'e2e:p99<=6s' --acceptance 0.8``, k = 1..8, 4,000 requests x 2 seeds
  per point) in a fresh process, next to a bare ``sdplan plan``, and the
  simulation evaluations the search ran (median of repeats).

Usage: python benchmarks/bench_simulate.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from bench_planner import best_time  # noqa: E402  (benchmarks run as scripts: their folder is on sys.path)


def simulator_throughput(repeats: int) -> None:
    import numpy

    from sdplan.calibration import resolve_calibration
    from sdplan.latency import model
    from sdplan.simulate import SimulationConfig, simulate

    coefficients = resolve_calibration(None).coefficients_at(1024, 512)
    n = 20_000
    positions = tuple(0.8 ** (j + 1) for j in range(8))
    for k in (0, 3):
        _, c2 = model.baseline_demand(coefficients) if k == 0 else model.speculative_demand(coefficients, 0.8, k)
        for rho in (0.3, 0.7, 0.9):
            config = SimulationConfig(rate_rps=rho / float(c2), draft_length=k, position_rates=positions[:k],
                                      requests=n)
            seconds = best_time(lambda config=config: simulate(coefficients, config, numpy.random.default_rng(0)),
                                repeats)
            print(f"  k={k} rho={rho:.1f}: {n / seconds:>10,.0f} requests/s")
    _, c2 = model.speculative_demand(coefficients, 0.8, 3)
    config = SimulationConfig(rate_rps=0.7 / float(c2), draft_length=8, position_rates=positions, requests=n,
                              adaptive_draft_lengths=(0, *range(1, 9)))
    walls, cpus = [], []
    for _ in range(repeats):  # median of repeats: the goodput policy's figure is the one with a goal (1e5/s)
        wall, cpu = time.perf_counter(), time.process_time()
        simulate(coefficients, config, numpy.random.default_rng(0))
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    print(f"  goodput policy rho=0.7: {n / min(walls):>10,.0f} requests/s (median of {repeats}: wall "
          f"{n / statistics.median(walls):,.0f}, CPU {n / statistics.median(cpus):,.0f})")


def command_time(arguments: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sdplan", *arguments], check=False, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def capacity_search() -> int:
    """Evaluations of the default capacity --simulate search."""
    from sdplan.inputs.slo import parse_slo
    from sdplan.planning.capacity import capacity, simulated_capacity
    from sdplan.planning.scenario import AcceptanceGiven, ScenarioOptions, resolve_scenario
    from sdplan.planning.simulation_inputs import SimulationSettings, simulation_config

    scenario = resolve_scenario(ScenarioOptions(acceptance=AcceptanceGiven(alpha=[0.8])))
    coefficients = scenario.coefficients
    slos = [parse_slo("e2e:p99<=6s", True)]
    ks = scenario.draft_lengths
    cap = capacity(coefficients, ks, 0.8, slos, tokens_per_cycle=scenario.tokens_per_cycle[0])
    settings = SimulationSettings(requests=4000, seeds=2, seed=0, arrival_cv=1.0)

    def configure(rate: float, k: int) -> object:
        return simulation_config(scenario, rate, k, scenario.limits, settings)

    return simulated_capacity(cap, coefficients, slos, configure, 2, 0)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    repeats = parser.parse_args().repeats
    print(f"simulator throughput (one replication of 20,000 requests, best of {repeats}):")
    simulator_throughput(repeats)
    plan = command_time(["plan", "--acceptance", "0.8"], repeats)
    simulated = command_time(["capacity", "--slo", "e2e:p99<=6s", "--acceptance", "0.8", "--simulate"], repeats)
    print(f"sdplan plan --acceptance 0.8                                   wall {plan * 1e3:8.0f} ms")
    print(f"sdplan capacity --slo 'e2e:p99<=6s' --acceptance 0.8 --simulate wall {simulated * 1e3:8.0f} ms"
          f"  ({simulated / plan:.1f}x plan; {capacity_search()} simulation evaluations of 2 x 4,000 requests)")


if __name__ == "__main__":
    main()
