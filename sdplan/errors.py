"""Exit statuses and the error hierarchy shared by the core and the CLI.

The core raises :class:`SdplanError` subclasses and never exits; the CLI maps
each one to its :class:`ExitStatus` in one place (``sdplan.cli``). The same
table is documented under EXIT STATUS in every man page.
"""

from __future__ import annotations

from enum import IntEnum


class ExitStatus(IntEnum):
    """Process exit codes of every ``sdplan`` command."""

    OK = 0
    #: A gate failed: ``check`` missed an SLO (unstable counts), ``validate`` exceeded ``--max-error``.
    SLO_VIOLATED = 1
    #: Bad command line: unknown option, malformed value, conflicting flags, more work than the budget allows.
    USAGE = 2
    #: An input file (calibration, workload, results) is unreadable or invalid, or the output cannot be
    #: written (a folder, a full disk, no permission): an input/output error.
    BAD_INPUT = 3
    #: No configuration can meet the request (e.g. no rate meets the SLO).
    INFEASIBLE = 4
    #: An optional dependency (e.g. vLLM for ``calibrate``) is not installed.
    MISSING_DEPENDENCY = 5
    #: The serving engine (vLLM) failed to start or to run on this machine.
    ENGINE_ERROR = 6
    #: ``calibrate`` wrote a calibration that predicts its own points poorly (see its message).
    POOR_CALIBRATION = 7
    #: An unexpected internal error (a bug): never confused with an SLO miss.
    INTERNAL = 70
    #: Interrupted by Ctrl-C (128 + SIGINT).
    INTERRUPTED = 130
    #: The reader of standard output went away (``sdplan plan | head``): 128 + SIGPIPE, as a shell expects.
    BROKEN_PIPE = 141


class SdplanError(Exception):
    """Base class of every error sdplan reports to the user.

    The message is one line in the form ``<where>: <what is wrong>; <how to fix>``.
    """

    exit_status: ExitStatus = ExitStatus.INTERNAL


class InputFileError(SdplanError):
    """An input file cannot be read or fails validation."""

    exit_status = ExitStatus.BAD_INPUT

    def __init__(self, path: str, key: str | None, problem: str) -> None:
        self.path = path
        self.key = key
        self.problem = problem
        where = f"{path}: {key}" if key else str(path)
        super().__init__(f"{where}: {problem}")


class NoLoadCostError(InputFileError):
    """A calibration whose cost per request in flight (``C2``) is 0: nothing would ever saturate."""


class InvalidValueError(SdplanError):
    """A value given on the command line is out of its domain."""

    exit_status = ExitStatus.USAGE


class InfeasibleError(SdplanError):
    """The question has no answer under the given constraints."""

    exit_status = ExitStatus.INFEASIBLE


class MissingDependencyError(SdplanError):
    """An optional extra is needed for this command."""

    exit_status = ExitStatus.MISSING_DEPENDENCY


class EngineError(SdplanError):
    """The serving engine could not start or run the measurement."""

    exit_status = ExitStatus.ENGINE_ERROR
