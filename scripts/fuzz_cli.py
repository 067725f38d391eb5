"""Long bad-input run of the whole CLI: >= 10^4 inputs, figures printed.

Runs the property of ``tests/test_fuzz_cli.py`` (no exit 70, no traceback, nothing half-written,
bounded time) on many more inputs, with larger simulations than the suite allows, and prints: inputs
run, exit statuses, time percentiles, the slowest inputs, peak memory, and every input that broke the
property (grouped by problem). Exit status 1 if any did.

    python scripts/fuzz_cli.py                 # 10,000 inputs, seed 0
    python scripts/fuzz_cli.py -n 20000 --seed 7 --time-limit 60
    python scripts/fuzz_cli.py -n 2000 --large    # simulations at default sizes (slow)
    python scripts/fuzz_cli.py --readers       # also mutate result files, speculation profiles and
                                               # InferenceX rows, and simulate huge prompts
"""

from __future__ import annotations

import argparse
import collections
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fuzz_cli import (  # noqa: E402
    Outcome,
    cases,
    field_cases,
    focused_cases,
    no_warnings_escape,
    reader_cases,
    run_case,
)
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--inputs", type=int, default=10_000, help="inputs to run (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds allowed per input (default 60)")
    parser.add_argument("--large", action="store_true",
                        help="simulations at their default sizes (seconds each) instead of the suite's small ones")
    parser.add_argument("--plots", action="store_true", help="also write figures (--plot-file; slower)")
    parser.add_argument("--readers", action="store_true",
                        help="also mutate benchmark result files and speculation profiles")
    parser.add_argument("--show", type=int, default=5, help="failing inputs shown per problem (default 5)")
    args = parser.parse_args()
    no_warnings_escape()

    outcomes: list[Outcome] = []
    strategies = [cases(small=not args.large, plots=args.plots), focused_cases()]
    strategy = (st.one_of(*strategies, reader_cases(), field_cases()) if args.readers
                else st.one_of(*strategies))
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="sdplan-fuzz-"))

    @settings(max_examples=args.inputs, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(case=strategy)
    def run(case):  # type: ignore[no-untyped-def]
        outcome = run_case(case, args.time_limit, root)
        outcomes.append(outcome)
        if len(outcomes) % 1000 == 0:
            print(f"  {len(outcomes):,} inputs, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    seed(args.seed)(run)()
    elapsed = time.perf_counter() - started

    exits = collections.Counter(outcome.exit_code for outcome in outcomes)
    times = sorted(outcome.seconds for outcome in outcomes)
    commands = collections.Counter(outcome.case.argv[0] for outcome in outcomes)
    problems: dict[str, list[Outcome]] = collections.defaultdict(list)
    for outcome in outcomes:
        for problem in outcome.problems:
            problems[problem.split(":")[0][:80]].append(outcome)

    def pct(q: float) -> float:
        return times[min(len(times) - 1, int(q * len(times)))]

    print(f"inputs: {len(outcomes):,} in {elapsed:.0f} s "
          f"(seed {args.seed}, time limit {args.time_limit:g} s per input)")
    print("commands: " + ", ".join(f"{name} {count}" for name, count in commands.most_common()))
    print("exit statuses: " + ", ".join(f"{code}: {count}" for code, count in sorted(exits.items())))
    print(f"seconds per input: median {pct(0.5):.3f}, p90 {pct(0.9):.3f}, p99 {pct(0.99):.3f}, max {times[-1]:.2f}; "
          f"over 30 s: {sum(1 for t in times if t > 30)}; exit 70: {exits.get(70, 0)}")
    print(f"peak memory of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    print("slowest inputs:")
    for outcome in sorted(outcomes, key=lambda o: -o.seconds)[:5]:
        print(f"  {outcome.seconds:6.2f} s  exit {outcome.exit_code}  {str(outcome.case)[:160]}")
    failing = sum(1 for outcome in outcomes if outcome.problems)
    print(f"inputs breaking the property: {failing}")
    for problem, found in sorted(problems.items(), key=lambda item: -len(item[1])):
        print(f"  {len(found)} x {problem}")
        for outcome in found[: args.show]:
            print(f"      {str(outcome.case)[:200]}")
            print(f"        -> {outcome.stderr.strip().splitlines()[-1][:200] if outcome.stderr.strip() else ''}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
