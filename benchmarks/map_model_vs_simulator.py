#!/usr/bin/env python3
"""Map where the closed-form mean latency agrees with the simulator (prints a table; nothing passes or fails).

Grid: prompt p x output g x draft length k (alpha 0.8) x utilisation rho of
the analytic model's saturation (``1/C2`` past the compute-bound knee), default calibration, no binding
batch cap (max_num_seqs 8192, the token budget) so only the mean-value approximation is measured. Per
point: simulated mean E2E over 3 replications of 20,000 requests, its difference to
``C1/(1 - lambda C2)`` with the demands that hold at the rate (:func:`sdplan.latency.knee.mean_latency`,
as the planner takes them), and the share of C2 that is prefill interference (``c2p/C2``, below the knee).

Usage: python benchmarks/map_model_vs_simulator.py [--requests N] [--seeds N]
"""

from __future__ import annotations

import argparse


def main() -> None:
    import numpy

    from sdplan.calibration import resolve_calibration
    from sdplan.inputs.acceptance import expected_tokens_per_cycle
    from sdplan.latency import knee, model
    from sdplan.simulate import SimulationConfig, simulate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    cal = resolve_calibration(None)
    print(f"{'p':>6} {'g':>5} {'k':>2} {'c2p/C2':>7} " + " ".join(f"rho={r:.1f}" for r in (0.3, 0.6, 0.8, 0.9)))
    for p in (128, 1024, 8192):
        for g in (64, 512):
            c = cal.coefficients_at(p, g)
            for k in (0, 3):
                if k == 0:
                    c1, c2 = model.baseline_demand(c)
                    bend = model.baseline_knee(c, c1, c2)
                else:
                    c1, c2 = model.speculative_demand(c, 0.8, k)
                    bend = model.speculative_knee(c, c1, c2, expected_tokens_per_cycle(0.8, k), k)
                cells = []
                for rho in (0.3, 0.6, 0.8, 0.9):
                    # rho of the saturation, which lies past the knee: 1/C2 above it
                    lam = rho / float(bend.c2_above_s)
                    analytic = float(knee.mean_latency(c1, c2, bend, lam))
                    runs = [simulate(c, SimulationConfig(rate_rps=lam, draft_length=k,
                                                         position_rates=tuple(0.8 ** (j + 1) for j in range(k)),
                                                         requests=args.requests, prompt_tokens=p, output_tokens=g,
                                                         max_num_seqs=8192),
                                     numpy.random.default_rng(seed)).e2e_s.mean() for seed in range(args.seeds)]
                    cells.append(f"{(numpy.mean(runs) / analytic - 1) * 100:+7.1f}%")
                print(f"{p:>6} {g:>5} {k:>2} {c.c2p_s / float(c2):>7.2f} " + " ".join(cells))


if __name__ == "__main__":
    main()
