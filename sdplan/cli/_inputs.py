"""What a command was given, as typed records, and from them its :class:`sdplan.planning.scenario.Scenario`.

Rule: a command parses its options once, into one frozen request built from
its own parameters, and passes that request to everything that needs an
option. Nothing reads options back from click's context
(``click.get_current_context``): what a function depends on is in its
signature (``tests/test_structure.py`` refuses it outside a parameter
callback). The core applies the precedence (:mod:`sdplan.planning.scenario`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from sdplan.cli._options import complete_file
from sdplan.inputs.serving import LimitOptions

if TYPE_CHECKING:
    from sdplan.planning.scenario import Scenario


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioFlags:
    """The options a scenario is resolved from (``plan``, ``check``, ``capacity``, ``simulate``), as click parsed
    them: None where not given, and where the command has no such option."""

    calibration: str | None = None
    workload_path: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    acceptance_alpha: list[float] | None = None
    acceptance_length: list[float] | None = None
    draft_acceptance_rate: list[float] | None = None
    acceptance_k: int | None = None
    position_acceptance: list[float] | None = None
    acceptance_profile: str | None = None
    spec_method: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_tokens: float | None = None
    lengths_file: str | None = None


def workload_file_option(fn: Any) -> Any:
    return click.option(
        "-w", "--workload", "workload_path", metavar="FILE", shell_complete=complete_file,
        help="Workload TOML file (sdplan-workload(5)): calibration, traffic, acceptance, SLOs. "
        "Every flag overrides the file.",
    )(fn)


def command_scenario(flags: ScenarioFlags, draft_lengths: Sequence[int] | None, *,
                     single_acceptance: bool = True) -> Scenario:
    """The scenario of a command's ``flags`` and candidate ``draft_lengths`` (the lengths file is read here)."""
    from sdplan.inputs.workload import load_lengths_file
    from sdplan.planning.scenario import AcceptanceGiven, ScenarioOptions, resolve_scenario

    return resolve_scenario(ScenarioOptions(
        calibration=flags.calibration,
        workload_path=flags.workload_path,
        prompt_tokens=flags.prompt_tokens,
        output_tokens=flags.output_tokens,
        acceptance=AcceptanceGiven(alpha=flags.acceptance_alpha, mean_length=flags.acceptance_length,
                                   draft_rate=flags.draft_acceptance_rate, measured_at_k=flags.acceptance_k,
                                   position_rates=flags.position_acceptance, profile=flags.acceptance_profile),
        draft_lengths=draft_lengths,
        lengths=load_lengths_file(flags.lengths_file) if flags.lengths_file else None,
        limits=LimitOptions(max_num_seqs=flags.max_num_seqs, max_num_batched_tokens=flags.max_num_batched_tokens,
                            kv_cache_tokens=flags.kv_cache_tokens),
        spec_method=flags.spec_method,
        single_acceptance=single_acceptance))
