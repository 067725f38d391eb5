"""Streamed answers delivered late, told from the gaps between their chunks (real runs).

tests/data/served-stalled-streams-cpu (see its README): vLLM CPU runs whose API server and client share a core
with the engine core's busy-waiting, so that answers were generated on time and delivered in a rush.
:func:`sdplan.runs.screen.stalled_share` counts them; ``fit`` and ``validate`` say so and keep the runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdplan.runs import load_runs, read_results, screen
from sdplan.runs.screen import HELD_CHUNK_GAP_S, STALLED_CHUNKS, STALLED_SHARE_NOTED, stalled_share

DATA = Path(__file__).parent / "data"
STALLED = DATA / "served-stalled-streams-cpu"


@pytest.mark.parametrize(("name", "share"), [
    ("nosd_w16x192_r2.84.json", 55 / 71), ("nosd_w128x64_r5.86.json", 24 / 146), ("k2_w256x32_r9.03.json", 0.0)])
def test_the_share_of_stalled_streams_is_read_from_vllm_chunk_gaps(name: str, share: float) -> None:
    run = read_results(STALLED / name)[0][0]
    assert run.stalled_streams == pytest.approx(share)


def test_stalled_runs_are_kept_and_named_in_one_warning() -> None:
    runs, warnings = load_runs([str(STALLED)], "auto", None, None)
    assert len(runs) == 3
    clean = next(r for r in runs if r.source.endswith("k2_w256x32_r9.03.json"))
    assert screen(clean) == []  # stalls are reported, not a reason to leave a run out
    stalled = [w for w in warnings if "stalled streams" in w]
    assert len(stalled) == 1
    folder = "served-stalled-streams-cpu/"
    assert stalled[0].startswith(f"2 of 3 runs had stalled streams ({folder}nosd_w16x192_r2.84.json 77%, "
                                 f"{folder}nosd_w128x64_r5.86.json 16% of their requests")


def test_validate_reports_stalled_streams_per_run_and_warns(sdplan) -> None:
    result = sdplan("validate", "-c", str(DATA / "served-passes-cpu" / "served.toml"), str(STALLED), "-f", "json")
    assert result.exit_code == 0, result.output
    assert "2 of 3 runs had stalled streams" in result.stderr
    document = json.loads(result.stdout)
    shares = {run["source"]: run["stalled_stream_share"] for run in document["runs"] + document["runs_skipped"]}
    assert shares["served-stalled-streams-cpu/k2_w256x32_r9.03.json"] == 0.0
    assert shares["served-stalled-streams-cpu/nosd_w16x192_r2.84.json"] == pytest.approx(55 / 71)


def test_files_without_chunk_gaps_have_no_share_and_no_warning() -> None:
    runs, warnings = load_runs([str(DATA / "served-client-behind-cpu")], "auto", None, None)
    assert runs and all(run.stalled_streams is None for run in runs)  # itls were removed from those files
    assert not any("stalled streams" in w for w in warnings)


def test_the_rule_at_its_edges() -> None:
    held, step = HELD_CHUNK_GAP_S / 2, 0.004
    assert stalled_share(None) is None and stalled_share([]) is None
    assert stalled_share([[step] * 50]) == 0.0
    assert stalled_share([[step] * 10 + [held] * (STALLED_CHUNKS - 1) + [step] * 10]) == 0.0  # one short
    assert stalled_share([[step] * 10 + [held] * STALLED_CHUNKS + [step] * 10, [step] * 20]) == 0.5
    assert stalled_share([[HELD_CHUNK_GAP_S] * 20]) == 0.0  # 1 ms apart: an engine step can be that short
    assert stalled_share([[held, step] * 20]) == 0.0  # pairs coalesced in one read are not a stall
    assert stalled_share([[]]) == 0.0  # a one-chunk answer has no gaps


def test_a_run_at_the_noted_share_is_not_named() -> None:
    from dataclasses import replace

    from sdplan.runs.screen import stalled_note

    run = read_results(STALLED / "k2_w256x32_r9.03.json")[0][0]
    at = replace(run, source="at.json", stalled_streams=STALLED_SHARE_NOTED)
    above = replace(run, source="above.json", stalled_streams=STALLED_SHARE_NOTED + 0.01)
    assert stalled_note([run, at]) is None
    note = stalled_note([run, at, above])
    assert note is not None and note.startswith("1 of 3 runs had stalled streams (above.json 11% of")
    many = [replace(run, source=f"r{i}.json", stalled_streams=0.5 + i / 100) for i in range(5)]
    assert "(r4.json 54%, r3.json 53%, r2.json 52% and 2 more of their requests" in (stalled_note(many) or "")
