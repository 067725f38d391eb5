"""Record, then compare, the output of a fixed set of sdplan commands.

A refactoring must not change what a user sees. Before it, record the outputs;
after it, compare::

    python scripts/output_baseline.py record /tmp/baseline
    python scripts/output_baseline.py compare /tmp/baseline

Each command runs in a fresh ``python -m sdplan`` process with ``COLUMNS=80``
and ``NO_COLOR=1``; its exit status, standard output, standard error and any
file it writes with ``-o`` are stored in one text file per command. ``compare``
prints a unified diff for each command whose record differs and exits 1 if any
does.
"""

from __future__ import annotations

import argparse
import difflib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
CPU = "cpu-epyc-2core_tiny-llama-h256-l4_tiny-llama-h128-l1_measured"
EAGLE = "h100-sxm_llama-3.1-8b_eagle3_derived"
MOE = "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived"
SILICON_SELECT = "model=Qwen3-32B,system=h100_sxm,backend=vllm,tp=4"

#: (name, arguments). ``{out}`` is replaced by a scratch file whose contents are recorded.
COMMANDS: list[tuple[str, list[str]]] = [
    ("plan-default", ["plan"]),
    ("plan-default-json", ["plan", "-f", "json"]),
    ("plan-default-csv", ["plan", "-f", "csv"]),
    ("plan-wide", ["plan", "--wide", "--acceptance", "0.8", "-k", "1-5", "--rates", "1:15:2"]),
    ("plan-eagle", ["plan", "-c", EAGLE, "--acceptance-length", "2.9", "--acceptance-k", "3"]),
    ("plan-eagle-json", ["plan", "-c", EAGLE, "-f", "json", "--prompt-tokens", "2048"]),
    ("plan-moe", ["plan", "-c", MOE]),
    ("plan-cpu-json", ["plan", "-c", CPU, "-f", "json"]),
    ("plan-goodput", ["plan", "--policy", "goodput", "--position-acceptance", "0.9,0.8,0.7,0.6",
                     "-k", "1-4"]),
    ("check-met", ["check", "--rate", "6", "--slo", "e2e:mean<=5s", "--slo", "ttft:mean<=300ms"]),
    ("check-json", ["check", "--rate", "6", "--slo", "e2e:mean<=5s", "-f", "json"]),
    ("check-missed", ["check", "--rate", "12", "--slo", "e2e:mean<=2s", "--draft-length", "3"]),
    ("check-simulate", ["check", "--rate", "4", "--slo", "e2e:mean<=5s", "--simulate", "--requests", "300",
                        "--seeds", "2", "--seed", "7"]),
    ("capacity", ["capacity", "--slo", "e2e:mean<=5s", "--acceptance", "0.8", "--target-rate", "100"]),
    ("capacity-json", ["capacity", "--slo", "e2e:mean<=5s", "--target-rate", "100", "-f", "json"]),
    ("capacity-vllm", ["capacity", "--slo", "e2e:mean<=5s", "-f", "vllm-config"]),
    ("capacity-eagle", ["capacity", "-c", EAGLE, "--slo", "ttft:mean<=500ms", "--slo", "e2e:mean<=8s"]),
    ("simulate", ["simulate", "--rates", "2,6", "--requests", "300", "--seeds", "2", "--seed", "3"]),
    ("simulate-json", ["simulate", "--rates", "4", "--requests", "300", "--seeds", "2", "--seed", "3",
                       "-f", "json"]),
    ("show-default", ["show"]),
    ("show-eagle-json", ["show", "-c", EAGLE, "-f", "json"]),
    ("show-cpu", ["show", "-c", CPU]),
    ("show-moe-json", ["show", "-c", MOE, "-f", "json"]),
    ("calibrations", ["calibrations"]),
    ("calibrations-json", ["calibrations", "--format", "json"]),
    ("fit-served", ["fit", str(DATA / "served-cpu"), "-o", "{out}"]),
    ("fit-served-json", ["fit", str(DATA / "served-cpu"), "-o", "{out}", "-f", "json"]),
    ("fit-silicon", ["fit", str(DATA / "aic-silicon" / "silicon_sample.csv"), "--select", SILICON_SELECT,
                     "-o", "{out}"]),
    ("fit-guidellm", ["fit", str(DATA / "guidellm-cpu"), "-o", "{out}", "-f", "json"]),
    ("validate-served", ["validate", "-c", CPU, str(DATA / "served-cpu")]),
    ("validate-served-json", ["validate", "-c", CPU, str(DATA / "served-cpu"), "-f", "json"]),
    ("validate-silicon", ["validate", "-c", "4xh100-sxm_qwen3-32b_eagle3_derived",
                          str(DATA / "aic-silicon" / "silicon_sample.csv"), "--select", SILICON_SELECT]),
    ("bad-calibration", ["plan", "-c", "no-such-calibration"]),
    ("bad-slo", ["check", "--rate", "6", "--slo", "e2e:mean<=fast"]),
]


def _run(args: list[str]) -> str:
    # A fixed scratch folder: paths in the output (and so its line wrapping) are the same each run. The lock
    # keeps two runs of this script (two checkouts on one machine) from deleting each other's files.
    scratch = Path(tempfile.gettempdir()) / "sdplan-output-baseline"
    with (Path(tempfile.gettempdir()) / "sdplan-output-baseline.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _run_in(scratch, args)


def _run_in(scratch: Path, args: list[str]) -> str:
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        out = scratch / "out.toml"
        argv = [a.replace("{out}", str(out)) for a in args]
        env = dict(os.environ, COLUMNS="80", NO_COLOR="1", TERM="dumb")
        done = subprocess.run([sys.executable, "-m", "sdplan", *argv], capture_output=True, text=True, env=env,
                              cwd=scratch)
        text = f"$ sdplan {' '.join(args)}\nexit {done.returncode}\n--- stdout\n{done.stdout}--- stderr\n"
        text += done.stderr
        if out.exists():
            text += f"--- {{out}}\n{out.read_text()}"
        return text.replace(str(ROOT), "<root>")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["record", "compare"])
    parser.add_argument("directory", type=Path)
    options = parser.parse_args()
    options.directory.mkdir(parents=True, exist_ok=True)
    changed = 0
    for name, args in COMMANDS:
        text = _run(args)
        path = options.directory / f"{name}.txt"
        if options.mode == "record":
            path.write_text(text)
            print(f"recorded {name}")
            continue
        before = path.read_text()
        if before != text:
            changed += 1
            sys.stdout.writelines(difflib.unified_diff(before.splitlines(True), text.splitlines(True),
                                                       f"{name} (recorded)", f"{name} (now)"))
    if options.mode == "compare":
        print(f"{changed} of {len(COMMANDS)} outputs differ")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
