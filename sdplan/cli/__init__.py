"""Command-line entry point: the root group, lazy command loading, error mapping.

Command modules are imported only when their command runs (or when help
lists them, which imports every one). So at module level they import only
click, the standard library and the modules that need neither numpy nor
rich (errors, limits, fileio, methods, the option helpers); the core and
the renderers are imported inside the command functions and their helpers.
That is the one place sdplan imports lazily, besides the optional heavy
packages (vLLM, torch, AIConfigurator, matplotlib, plotext, pandas, scipy's
solvers), and it keeps ``sdplan --help`` free of numpy, scipy, rich and vllm.

Exit statuses are decided here and nowhere else (``tests/test_structure.py``
refuses ``SystemExit``, ``sys.exit`` and ``exit(`` elsewhere in ``sdplan/``,
bar the vLLM launcher, a process of its own). Every
:class:`~sdplan.errors.SdplanError` becomes a one-line ``Error: ...`` on
stderr with its :class:`~sdplan.errors.ExitStatus`; any other exception is an
internal error (exit 70, never 1), with the traceback only under
``SDPLAN_DEBUG=1``. A command whose verdict is not an error (``check`` missed
an SLO, ``validate`` exceeded ``--max-error``, ``calibrate`` wrote a poor
calibration) says so itself and returns the :class:`ExitStatus`, which
:meth:`SdplanGroup.invoke` turns into the exit code.
"""

from __future__ import annotations

import atexit
import errno
import gc
import importlib
import math
import os
import sys
import warnings
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
    "derive": "sdplan.cli.derive:derive",
    "fit": "sdplan.cli.fit:fit",
    "validate": "sdplan.cli.validate:validate",
    "simulate": "sdplan.cli.simulate:simulate",
    "scrape": "sdplan.cli.scrape:scrape",
}


class ReportedError(click.ClickException):
    """A user-facing error with sdplan's exit status."""

    def __init__(self, message: str, exit_status: ExitStatus) -> None:
        super().__init__(message)
        # click declares exit_code on the class; each reported error carries its own status
        self.exit_code = int(exit_status)  # type: ignore[misc]


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
        return _guard_numbers(command)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            status = super().invoke(ctx)
        except SdplanError as error:
            raise ReportedError(printable(str(error)), error.exit_status) from error
        except (KeyboardInterrupt, click.Abort):
            # click would report Ctrl-C as exit 1, which a CI gate reads as "SLO violated"
            raise ReportedError("interrupted; files already written are kept", ExitStatus.INTERRUPTED) from None
        except click.ClickException as error:
            error.message = printable(error.message)  # type: ignore[misc]  # click marks it Final
            raise
        except click.exceptions.Exit:
            raise
        except BrokenPipeError:
            # the reader went away (sdplan plan | head): stop quietly, as a shell pipeline expects
            _silence_stdout()
            raise click.exceptions.Exit(int(ExitStatus.BROKEN_PIPE)) from None
        except OSError as error:
            if error.filename is None:  # writing stdout failed (disk full): keep the shutdown flush quiet
                _silence_stdout()
            raise ReportedError(printable(_describe_os_error(error)), ExitStatus.BAD_INPUT) from None
        except MemoryError:
            raise ReportedError(
                "out of memory; ask for less work (fewer rates, draft lengths, requests or replications)",
                ExitStatus.USAGE,
            ) from None
        except Exception as error:  # a bug: report it as such, never as exit 1
            if os.environ.get("SDPLAN_DEBUG"):
                raise
            message = (
                f"internal error: {type(error).__name__}: {error} "
                "(a bug in sdplan; re-run with SDPLAN_DEBUG=1 for the traceback and report it)"
            )
            raise ReportedError(printable(message), ExitStatus.INTERNAL) from error
        # a command returns its verdict (None: success); the message, if any, is already on stderr
        if status is not None and status != ExitStatus.OK:
            raise click.exceptions.Exit(int(ExitStatus(status)))
        return status

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().main(*args, **kwargs)
        finally:
            _flush_stdout_or_silence()


#: Largest integer any option takes: beyond it a float would round (2**53), and C arrays overflow.
LARGEST_INTEGER = 2**53


def _guard_numbers(command: click.Command) -> click.Command:
    """Refuse non-finite floats and integers too large for arithmetic, for every numeric option.

    A safety net under the per-option ranges: ``--target-rate inf`` or
    ``--max-batch-size 99999999999999999999`` become a usage error naming
    the option, whichever command declares it.
    """
    if getattr(command, "_sdplan_numbers_guarded", False) or command.callback is None:
        return command
    numeric = [param for param in command.params
               if isinstance(param.type, (click.types.FloatParamType, click.types.IntParamType))]
    callback = command.callback

    def checked(*args: Any, **kwargs: Any) -> Any:
        for param in numeric:
            value = kwargs.get(param.name or "")
            for item in value if isinstance(value, (tuple, list)) else (value,):
                _check_number(param, item)
        return callback(*args, **kwargs)

    checked.__doc__ = callback.__doc__
    command.callback = checked
    command._sdplan_numbers_guarded = True  # type: ignore[attr-defined]
    return command


def _check_number(param: click.Parameter, value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number; give a real value", param=param)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > LARGEST_INTEGER:
        shown = str(value) if abs(value) < 10**30 else f"a {len(str(abs(value)))}-digit number"
        raise click.BadParameter(f"{shown} is too large (at most {LARGEST_INTEGER})", param=param)


def printable(text: str) -> str:
    """``text`` on one line: newlines and other control characters shown escaped (``\\n``)."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def _describe_os_error(error: OSError) -> str:
    """One line for an operating-system error that escaped the readers and writers."""
    where = error.filename if error.filename is not None else "standard output"
    reason = error.strerror or type(error).__name__
    fixes = {
        errno.ENOSPC: "free some space or write elsewhere",
        errno.EDQUOT: "free some space or write elsewhere",
        errno.EACCES: "check the permissions of the file and of its folders",
        errno.EPERM: "check the permissions of the file and of its folders",
        errno.ENAMETOOLONG: "use a shorter file name",
        errno.EROFS: "write to a writable file system",
    }
    fix = fixes.get(error.errno or 0, "check the path")
    return f"{where}: {reason}; {fix}"


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a real file (tests) or already closed
        pass


def _flush_stdout_or_silence() -> None:
    """Flush stdout now; if that fails (disk full, closed pipe) say so instead of a shutdown traceback."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
    except OSError as error:
        _silence_stdout()
        click.echo(f"Error: {printable(_describe_os_error(error))}", err=True)
        sys.exit(int(ExitStatus.BAD_INPUT))
    except ValueError:  # stdout closed
        pass


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

    Exit status: 0 ok, 1 SLO violated, 2 usage error or too much work asked,
    3 invalid input file or unwritable output, 4 infeasible, 5 missing optional
    dependency, 6 engine error, 7 poor calibration written, 70 internal error,
    130 interrupted, 141 output pipe closed.
    See sdplan(1).
    """


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point.

    Floating-point warnings from numpy never reach the user: results past
    saturation are reported as "unstable", not as warnings with source paths
    (the test suite turns warnings into errors, so any that remain are found).

    At exit the interpreter's last garbage collection walks every object still
    alive and frees the cycles of modules, classes and functions one by one,
    memory the operating system takes back a moment later anyway: 20-40 ms of
    CPU time of a cold ``sdplan plan`` on a 2-core VM
    (``benchmarks/RESULTS-simulator-2026-11.md``).
    :func:`gc.freeze` at exit moves them out of that collection. It runs as an
    exit handler, after the command and the handlers registered during it;
    objects that are not in a cycle are still released as before, and stdout
    and stderr are still flushed.
    """
    atexit.register(gc.freeze)
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    try:
        cli.main(args=argv, prog_name="sdplan")
    except KeyboardInterrupt:
        click.echo("Aborted.", err=True)
        sys.exit(int(ExitStatus.INTERRUPTED))
