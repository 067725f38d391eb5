"""The measured GEMM timings in ``benchmarks/data/kernel-profiles/`` as their README describes them."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "kernel-profiles"


def _bench():
    spec = importlib.util.spec_from_file_location("kernel_profiles", ROOT / "benchmarks" / "kernel_profiles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_profile_the_benchmark_reads_is_listed_and_whole() -> None:
    bench = _bench()
    readme = (DATA / "README.md").read_text()
    files = sorted(path.name for path in DATA.glob("*.csv"))
    assert files == sorted(f"vidur_{stem}.csv" for stem in bench.CASES)
    for name in files:
        assert f"`{name}`" in readme
        with (DATA / name).open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert set(rows[0]) == {"tensor_parallel", "token_rows", *bench.VIDUR_OPS}
        for tp in (1, 2, 4, 8):
            counts = {int(row["token_rows"]) for row in rows if int(row["tensor_parallel"]) == tp}
            assert set(bench.ROWS) <= counts and max(counts) == 1024


def test_a_layers_gemms_cost_more_at_many_rows_and_less_on_more_gpus() -> None:
    """What any real profile shows: 1,024 rows cost more than one, and a TP shard costs less than the whole."""
    bench = _bench()
    for stem in bench.CASES:
        measured = bench.measured(stem)
        for tp in (1, 2, 4, 8):
            assert measured[tp, 1024] > 1.5 * measured[tp, 1] > 0
        assert measured[8, 1024] < measured[1, 1024] / 4
