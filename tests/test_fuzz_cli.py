"""Property: no input makes sdplan crash, hang or leave a half-written file.

Derandomised hypothesis runs of a few thousand command lines across every command, in-process with
click's CliRunner, each bounded in time (see ``tests/fuzz_cli.py`` for the strategies and the property;
``python -m tests.fuzz_cli`` runs the same property on >= 10^4 inputs and prints figures).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz_cli import Case, cases, environment_ok, field_cases, focused_cases, reader_cases, run_case

#: Per-input time bound in the suite (generous: a loaded 2-core CI machine).
TIME_LIMIT_S = 20.0

pytestmark = pytest.mark.skipif(not environment_ok(), reason="needs POSIX signals to bound each input's time")

FUZZ = settings(derandomize=True, deadline=None, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


def _check(case: Case, root: Path) -> None:
    outcome = run_case(case, TIME_LIMIT_S, root)
    assert not outcome.problems, f"{case}: {outcome.problems}; stderr: {outcome.stderr[-500:]}"


@settings(FUZZ, max_examples=2000)
@given(case=cases(small=True))
def test_no_input_crashes_hangs_or_half_writes(case: Case, tmp_path_factory: pytest.TempPathFactory) -> None:
    _check(case, tmp_path_factory.getbasetemp())


@settings(FUZZ, max_examples=1000)
@given(case=focused_cases())
def test_valid_command_lines_with_one_thing_wrong(case: Case, tmp_path_factory: pytest.TempPathFactory) -> None:
    _check(case, tmp_path_factory.getbasetemp())


@settings(FUZZ, max_examples=500)
@given(case=reader_cases())
def test_no_results_file_crashes_fit_or_validate(case: Case, tmp_path_factory: pytest.TempPathFactory) -> None:
    _check(case, tmp_path_factory.getbasetemp())


@settings(FUZZ, max_examples=300)
@given(case=field_cases())
def test_no_profile_row_report_or_huge_prompt_crashes(case: Case, tmp_path_factory: pytest.TempPathFactory) -> None:
    _check(case, tmp_path_factory.getbasetemp())
