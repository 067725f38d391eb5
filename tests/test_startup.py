"""``--help`` stays light: no numpy, scipy, rich or vllm imported; a plain ``plan`` loads only what it uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sdplan.cli import COMMANDS

PROBE = """
import json, sys
from sdplan.cli import cli
try:
    cli.main(args=sys.argv[1:], prog_name="sdplan")
except SystemExit:
    pass
heavy = [m for m in ("numpy", "scipy", "rich", "vllm", "torch", "aiconfigurator_core") if m in sys.modules]
print("\\nHEAVY=" + json.dumps(heavy))
"""


@pytest.mark.parametrize("args", [["--help"], ["--version"], *[[name, "--help"] for name in COMMANDS]])
def test_help_imports_no_heavy_module(args: list[str]) -> None:
    completed = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, check=True)
    assert "Usage:" in completed.stdout or "version" in completed.stdout
    heavy = json.loads(completed.stdout.rsplit("HEAVY=", 1)[1])
    assert heavy == [], f"sdplan {' '.join(args)} imported {heavy}"


def test_python_dash_m_works() -> None:
    completed = subprocess.run([sys.executable, "-m", "sdplan", "--version"], capture_output=True, text=True)
    assert completed.returncode == 0 and "sdplan" in completed.stdout


MODULES_PROBE = """
import io, json, sys
BASELINE = ("import numpy, click, rich\\nfrom rich.console import Console\\nfrom rich.table import Table\\n"
            "Console(file=io.StringIO()).print(Table())")
if sys.argv[1] == "baseline":
    exec(BASELINE)
else:
    from sdplan.cli import cli
    sys.stdout = io.StringIO()
    try:
        cli.main(args=sys.argv[1:], prog_name="sdplan")
    except SystemExit as exit:
        assert not exit.code, exit.code
    sys.stdout = sys.__stdout__
print("\\nMODULES=" + json.dumps(sorted(sys.modules)))
"""

#: What a plain ``sdplan plan`` must leave unimported: the optional heavy dependencies, imported only by the
#: code that needs them (the engine, AIConfigurator, figure files, terminal plots, the fits' solvers).
NOT_FOR_PLAN = ("vllm", "torch", "transformers", "aiconfigurator", "aiconfigurator_core", "matplotlib", "plotext",
                "pandas", "scipy")

#: sdplan's own modules that a plain ``plan`` does not use, kept off its path by the layout (cold start): the
#: simulator (``simulate``, ``capacity/check --simulate``), SLOs (``check``, ``capacity``), plots (``--plot``), the
#: fit and the intervals (a calibration with a covariance), and the readers of result files.
NOT_FOR_PLAN_OWN = ("sdplan.simulate", "sdplan.planning.simulation_inputs", "sdplan.inputs.slo",
                    "sdplan.render.plots", "sdplan.fitting", "sdplan.planning.uncertainty", "sdplan.runs",
                    "sdplan.metrics", "sdplan.measure", "sdplan.derive")

#: A calibration given as a file, not by its shipped name.
CALIBRATION_FILE = str(Path(__file__).resolve().parent.parent / "calibrations"
                       / "h100-sxm_llama-3.1-8b_eagle3_derived.toml")


def imported(*args: str) -> set[str]:
    completed = subprocess.run([sys.executable, "-c", MODULES_PROBE, *args], capture_output=True, text=True,
                               check=True, env={**os.environ, "NO_COLOR": "1"})
    return set(json.loads(completed.stdout.rsplit("MODULES=", 1)[1]))


@pytest.mark.parametrize("args", [["plan"], ["plan", "--format", "json"], ["plan", "-c", CALIBRATION_FILE]])
def test_plain_plan_imports_only_what_it_uses(args: list[str]) -> None:
    extra = imported(*args) - imported("baseline")
    assert "sdplan.planning.planner" in extra and "sdplan.calibration" in extra  # the probe did run the command
    unneeded = sorted(name for name in extra if any(name == banned or name.startswith(banned + ".")
                                                    for banned in (*NOT_FOR_PLAN, *NOT_FOR_PLAN_OWN)))
    assert unneeded == [], f"sdplan {' '.join(args)} imported {unneeded}"


FREEZE_PROBE = """
import atexit, gc, sys
# registered before main's own handler, so it runs after it (exit handlers run last in, first out)
atexit.register(lambda: sys.stderr.write(f"FROZEN={gc.get_freeze_count()}\\n"))
from sdplan.cli import main
main(["--version"])
"""


def test_exit_skips_the_final_collection_of_long_lived_objects() -> None:
    """The console script freezes what is alive at exit, so the interpreter's last collection does not walk and free
    every module, class and function (``sdplan.cli.main``); the command's output and status are unchanged."""
    completed = subprocess.run([sys.executable, "-c", FREEZE_PROBE], capture_output=True, text=True)
    assert completed.returncode == 0 and "sdplan" in completed.stdout
    assert int(completed.stderr.rsplit("FROZEN=", 1)[1]) > 1000
