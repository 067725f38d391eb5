"""``benchmarks/gpu_steps.py score``: a calibration's step curve against step timings measured elsewhere.

Run as a subprocess (tests do not import benchmark modules). The timings below are written for the test, not
measured: what is checked is that the script prices the same steps ``sdplan show`` does, and what it reports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FILE = "h100-sxm_llama-3.1-8b_eagle3_derived"


def _score(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_steps.py"), "score", *arguments],
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize("calibration", [FILE, "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived"])
def test_engine_steps_are_priced_as_show_prices_them(sdplan, tmp_path: Path, calibration: str) -> None:
    """A dense file's steps, and an MoE file's with the experts its routed tokens touch."""
    shown = sdplan("show", "-c", calibration, "--batch-sizes", "1,64", "-k", "3", "-f", "json")
    steps = json.loads(shown.stdout)["step_times_at_workload"]["options"][0]["step_s"]  # no SD, at 1024 + 512 / 2
    timings = tmp_path / "steps.csv"
    timings.write_text("batch,query_tokens,context_tokens,step_s\n"
                       f"1,1,1280,{steps[0] * 1.1}\n64,1,1280,{steps[1] * 0.9}\n64,4,1280,{steps[1]}\n")
    done = _score(calibration, str(timings), "--engine-steps")
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("target")]
    assert [float(row[-1]) for row in rows[:2]] == [round(1 / 1.1, 2), round(1 / 0.9, 2)]
    assert "3 steps: MAPE" in done.stdout and "B=  64 k=3 s=  1280" in done.stdout
    # device time leaves the engine's host overhead out: every priced step is lower
    device = _score(calibration, str(timings))
    priced = [float(line.split()[4]) for line in device.stdout.splitlines() if line.startswith("target")]
    assert all(p < float(row[4]) for p, row in zip(priced, rows))


def test_a_step_priced_below_its_measured_gemms_fails_and_bad_files_say_what_to_fix(tmp_path: Path) -> None:
    timings = tmp_path / "floor.csv"
    timings.write_text("model,batch,query_tokens,context_tokens,step_s,gemm_s\n"
                       "target,1,1,1024,0.0065,0.0090\ndraft,1,1,1024,0.0004,\n")
    done = _score(FILE, str(timings))
    assert done.returncode == 1 and "priced below their GEMMs' measured time: 1 (target B=1 q=1 s=1024)" in done.stdout
    # the same timings in milliseconds, as a profiler prints them, with spaces after the commas: the same report
    timings.write_text("model, batch, query_tokens, context_tokens, step_ms, gemm_ms\n"
                       "target, 1, 1, 1024, 6.5, 9.0\ndraft, 1, 1, 1024, 0.4,\n")
    in_ms = _score(FILE, str(timings))
    assert in_ms.returncode == 1 and in_ms.stdout.splitlines()[1:] == done.stdout.splitlines()[1:]
    for text, said in (("batch,step_s\n1,0.1\n", "lacks the column(s) query_tokens, context_tokens"),
                       ("batch,query_tokens,context_tokens,step_s\n1,1,1024,-2\n", "line 2: batch"),
                       ("model,batch,query_tokens,context_tokens,step_s\nverify,1,1,1024,0.01\n",
                        "line 2: model is 'verify'")):
        timings.write_text(text)
        done = _score(FILE, str(timings))
        assert done.returncode != 0 and said in done.stderr and "Traceback" not in done.stderr
    both = "batch,query_tokens,context_tokens,step_s,step_ms\n1,1,1024,0.01,10\n"
    for text, said in ((both, "gives both step_s and step_ms"), ("batch,query_tokens,context_tokens,t\n1,1,1,1\n",
                                                                  "lacks a step time column")):
        timings.write_text(text)
        done = _score(FILE, str(timings))
        assert done.returncode != 0 and said in done.stderr and "Traceback" not in done.stderr
    unknown = _score("no-such-calibration", str(timings))
    assert unknown.returncode != 0 and unknown.stderr.startswith("gpu_steps: no-such-calibration: no such file")
