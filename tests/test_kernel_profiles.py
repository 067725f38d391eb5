"""The measured GEMM timings in ``benchmarks/data/kernel-profiles/`` as their README describes them."""

from __future__ import annotations

import csv
import re
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "kernel-profiles"
COLUMNS = ("tensor_parallel", "token_rows", "qkv_ms", "o_proj_ms", "gate_up_ms", "down_ms")


def _profiles() -> dict[str, dict[tuple[int, int], float]]:
    """file name -> (tensor parallel, rows) -> the four GEMMs of one layer, ms."""
    found = {}
    for path in sorted(DATA.glob("*.csv")):
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert tuple(rows[0]) == COLUMNS, path.name
        found[path.name] = {(int(row["tensor_parallel"]), int(row["token_rows"])):
                            sum(float(row[name]) for name in COLUMNS[2:]) for row in rows}
    return found


def test_every_profile_is_listed_and_covers_the_rows_the_benchmark_reads() -> None:
    readme = (DATA / "README.md").read_text()
    listed = set(re.findall(r"`(vidur_[a-z0-9.-]+_[a-z0-9.-]+\.csv)`", readme))
    profiles = _profiles()
    assert set(profiles) == listed and len(listed) == 5
    for name, times in profiles.items():
        for tp in (1, 2, 4, 8):
            rows = {count for shard, count in times if shard == tp}
            assert {1, 16, 32, 64, 128, 160, 192, 256, 320, 384, 512, 768, 1024} <= rows, (name, tp)
            assert max(rows) == 1024


def test_a_layers_gemms_cost_more_at_many_rows_and_less_on_more_gpus() -> None:
    """What any real profile shows: 1,024 rows cost more than one, and a TP shard costs less than the whole."""
    for name, times in _profiles().items():
        for tp in (1, 2, 4, 8):
            assert times[tp, 1024] > 1.5 * times[tp, 1] > 0, name
        assert times[8, 1024] < times[1, 1024] / 4, name
