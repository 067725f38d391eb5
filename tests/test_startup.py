"""``--help`` stays light: no numpy, scipy, rich or vllm imported."""

from __future__ import annotations

import json
import subprocess
import sys

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
