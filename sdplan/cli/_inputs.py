"""Merging a workload file with command-line flags (flags win), shared by check and capacity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from sdplan.cli._options import complete_file

if TYPE_CHECKING:
    from sdplan.calibration import Calibration
    from sdplan.workload import Workload, WorkloadFile


def workload_file_option(fn: Any) -> Any:
    return click.option(
        "-w", "--workload", "workload_path", metavar="FILE", shell_complete=complete_file,
        help="Workload TOML file (sdplan-workload(5)): calibration, traffic, acceptance, SLOs. "
        "Every flag overrides the file.",
    )(fn)


@dataclass(frozen=True)
class Inputs:
    file: WorkloadFile | None
    calibration: Calibration
    workload: Workload

    def context(self) -> dict[str, Any]:
        """Calibration and workload description for JSON output."""
        from sdplan.methods import provenance_method

        acceptance = self.workload.acceptance
        provenance = self.calibration.provenance
        return {
            "calibration": {
                "name": self.calibration.name,
                "path": self.calibration.path,
                "method": self.calibration.method,
                "hardware": provenance.get("hardware"),
                "target_model": provenance.get("target_model"),
                "draft_model": provenance.get("draft_model"),
                "speculative_method": provenance_method(provenance),
            },
            "workload": {
                "file": self.file.path if self.file else None,
                "prompt_tokens": self.workload.prompt_tokens,
                "output_tokens": self.workload.output_tokens,
                "acceptance": acceptance.document(),
            },
        }


def resolve_inputs(workload_path: str | None, calibration: str | None, prompt_tokens: int | None,
                   output_tokens: int | None, alpha: list[float] | None, mean_length: list[float] | None,
                   draft_rate: list[float] | None, acceptance_k: int | None,
                   position_rates: list[float] | None = None) -> Inputs:
    """Load the workload file (if any) and the calibration, apply flags over file values."""
    from sdplan.calibration import resolve_calibration
    from sdplan.errors import InvalidValueError
    from sdplan.workload import load_workload_file, resolve_workload

    file = load_workload_file(workload_path) if workload_path else None
    cal = resolve_calibration(calibration or (file.calibration if file else None))
    source = "command line"
    if (file is not None and alpha is None and mean_length is None and draft_rate is None and acceptance_k is None
            and position_rates is None):
        if file.alpha is not None:
            alpha, source = [file.alpha], f"workload file {file.path}"
        elif file.mean_length is not None:
            mean_length, acceptance_k, source = [file.mean_length], file.measured_at_k, f"workload file {file.path}"
        elif file.draft_rate is not None:
            draft_rate, acceptance_k, source = [file.draft_rate], file.measured_at_k, f"workload file {file.path}"
        elif file.position_rates is not None:
            position_rates, source = list(file.position_rates), f"workload file {file.path}"
    workload = resolve_workload(
        cal,
        prompt_tokens=prompt_tokens if prompt_tokens is not None else (file.prompt_tokens if file else None),
        output_tokens=output_tokens if output_tokens is not None else (file.output_tokens if file else None),
        alpha=alpha, mean_length=mean_length, draft_rate=draft_rate, measured_at_k=acceptance_k, source=source,
        position_rates=position_rates,
    )
    if len(workload.acceptance.alphas) != 1:
        raise InvalidValueError("give a single acceptance value here (one operating point is evaluated)")
    return Inputs(file=file, calibration=cal, workload=workload)


def candidate_lengths(cli_value: str | None, file: WorkloadFile | None) -> list[int]:
    """Candidate draft lengths: flag, else file, else 1-8."""
    from sdplan.cli._options import parse_int_list

    if cli_value is not None:
        values = parse_int_list(cli_value, "draft lengths in tokens")
    elif file is not None and file.draft_lengths is not None:
        values = list(file.draft_lengths)
    else:
        values = list(range(1, 9))
    if any(k < 0 for k in values):
        raise click.BadParameter("draft lengths must be >= 0 tokens", param_hint="'--draft-lengths'")
    positive = sorted({k for k in values if k > 0})
    if not positive:
        raise click.BadParameter("give at least one draft length >= 1", param_hint="'--draft-lengths'")
    return positive
