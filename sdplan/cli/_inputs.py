"""From a command's options to its :class:`sdplan.scenario.Scenario` (the core applies the precedence)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from sdplan.cli._options import complete_file, parse_int_list
from sdplan.serving import LimitOptions

if TYPE_CHECKING:
    from sdplan.scenario import Scenario


def workload_file_option(fn: Any) -> Any:
    return click.option(
        "-w", "--workload", "workload_path", metavar="FILE", shell_complete=complete_file,
        help="Workload TOML file (sdplan-workload(5)): calibration, traffic, acceptance, SLOs. "
        "Every flag overrides the file.",
    )(fn)


def draft_lengths_given(text: str | None) -> list[int] | None:
    """``-k/--draft-lengths`` parsed (list or range, >= 0), None when not given."""
    if text is None:
        return None
    values = parse_int_list(text, "draft lengths in tokens")
    if any(k < 0 for k in values):
        raise click.BadParameter("draft lengths must be >= 0 tokens", param_hint="'--draft-lengths'")
    if not any(k > 0 for k in values):
        raise click.BadParameter("give at least one draft length >= 1", param_hint="'--draft-lengths'")
    return values


def command_scenario(draft_lengths: Sequence[int] | None, *, single_acceptance: bool = True,
                     max_num_seqs: int | None = None) -> Scenario:
    """The running command's scenario from its options (those it has; the others count as not given).

    ``max_num_seqs``, when given, replaces the command's ``--max-num-seqs`` (capacity's old alias).
    """
    from sdplan.scenario import AcceptanceGiven, ScenarioOptions, resolve_scenario
    from sdplan.workload import load_lengths_file

    params = click.get_current_context().params
    lengths_file = params.get("lengths_file")
    return resolve_scenario(ScenarioOptions(
        calibration=params.get("calibration"),
        workload_path=params.get("workload_path"),
        prompt_tokens=params.get("prompt_tokens"),
        output_tokens=params.get("output_tokens"),
        acceptance=AcceptanceGiven(alpha=params.get("acceptance_alpha"), mean_length=params.get("acceptance_length"),
                                   draft_rate=params.get("draft_acceptance_rate"),
                                   measured_at_k=params.get("acceptance_k"),
                                   position_rates=params.get("position_acceptance"),
                                   profile=params.get("acceptance_profile")),
        draft_lengths=draft_lengths,
        lengths=load_lengths_file(lengths_file) if lengths_file else None,
        limits=LimitOptions(max_num_seqs=max_num_seqs if max_num_seqs is not None else params.get("max_num_seqs"),
                            max_num_batched_tokens=params.get("max_num_batched_tokens"),
                            kv_cache_tokens=params.get("kv_cache_tokens")),
        spec_method=params.get("spec_method"),
        single_acceptance=single_acceptance))
