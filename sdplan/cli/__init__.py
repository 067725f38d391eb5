"""Command-line entry point: the root group, lazy command loading, error mapping.

Command modules are imported only when their command runs (or when help
lists them); they import only click at module level, so ``sdplan --help``
never imports numpy, scipy, rich or vllm.

Every :class:`~sdplan.errors.SdplanError` becomes a one-line ``Error: ...``
on stderr with its :class:`~sdplan.errors.ExitStatus`; any other exception is
an internal error (exit 70, never 1), with the traceback only under
``SDPLAN_DEBUG=1``.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from sdplan import __version__
from sdplan.errors import ExitStatus, SdplanError

#: command name -> "module:attribute"
COMMANDS = {
    "plan": "sdplan.cli.plan:plan",
    "calibrations": "sdplan.cli.calibrations:calibrations",
    "show": "sdplan.cli.show:show",
    "check": "sdplan.cli.check:check",
    "capacity": "sdplan.cli.capacity:capacity",
    "calibrate": "sdplan.cli.calibrate:calibrate",
    "fit": "sdplan.cli.fit:fit",
    "validate": "sdplan.cli.validate:validate",
    "simulate": "sdplan.cli.simulate:simulate",
}


class ReportedError(click.ClickException):
    """A user-facing error with sdplan's exit status."""

    def __init__(self, message: str, exit_status: ExitStatus) -> None:
        super().__init__(message)
        self.exit_code = int(exit_status)


class SdplanGroup(click.Group):
    """A group that loads its commands lazily and maps errors to exit codes."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attribute)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SdplanError as error:
            raise ReportedError(str(error), error.exit_status) from error
        except (KeyboardInterrupt, click.Abort):
            # click would report Ctrl-C as exit 1, which a CI gate reads as "SLO violated"
            raise ReportedError("interrupted; files already written are kept", ExitStatus.INTERRUPTED) from None
        except (click.exceptions.Exit, click.ClickException):
            raise
        except Exception as error:  # a bug: report it as such, never as exit 1
            if os.environ.get("SDPLAN_DEBUG"):
                raise
            message = (
                f"internal error: {type(error).__name__}: {error} "
                "(a bug in sdplan; re-run with SDPLAN_DEBUG=1 for the traceback and report it)"
            )
            raise ReportedError(message, ExitStatus.INTERNAL) from error


@click.group(cls=SdplanGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "-V", "--version", prog_name="sdplan")
def cli() -> None:
    """Capacity planner for speculative decoding (SD) in LLM serving.

    Predicts mean latency, speedup, the best draft length and the break-even
    request rate of SD from a calibrated load-aware model, in milliseconds.

    \b
    Quick start:
      sdplan plan                          default calibration and workload
      sdplan plan --acceptance 0.8 --rates 1:20:1 --draft-lengths 1-6
      sdplan calibrations                  list shipped calibrations
      sdplan show -c NAME_OR_FILE          inspect and validate one
      sdplan check --rate 8 --slo 'e2e:mean<=5s'          SLO gate for CI
      sdplan capacity --slo 'e2e:mean<=5s' --target-rate 100   replicas

    Exit status: 0 ok, 1 SLO violated, 2 usage error, 3 invalid input file,
    4 infeasible, 5 missing optional dependency, 6 engine error, 70 internal error,
    130 interrupted.
    See sdplan(1).
    """


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        cli.main(args=argv, prog_name="sdplan")
    except KeyboardInterrupt:
        click.echo("Aborted.", err=True)
        sys.exit(int(ExitStatus.INTERRUPTED))
