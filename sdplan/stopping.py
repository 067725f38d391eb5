"""Stop requests from outside the process, turned into :class:`KeyboardInterrupt`.

A long command (``calibrate``, ``scrape``) is stopped by Ctrl-C at a terminal, but also by ``kill``,
``timeout``, systemd or a container runtime, which send SIGTERM, and by a closed terminal (SIGHUP).
Python turns only SIGINT into :class:`KeyboardInterrupt`; the others end the process at once, so its
``finally`` blocks never run: started servers keep running, a recording's summary is never printed.
Within :func:`stop_signals` all three raise :class:`KeyboardInterrupt`, so one ``except`` and the
``finally`` blocks serve every way of being stopped.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Any

#: The signals that ask a command to stop: Ctrl-C, ``kill``/``timeout``/systemd, a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_signals(first: Callable[[], None] | None = None) -> Iterator[list[str]]:
    """Within the block, SIGINT, SIGTERM and SIGHUP raise :class:`KeyboardInterrupt`.

    Parameters
    ----------
    first : callable, optional
        Called in the handler before it raises (calibrate sends SIGINT to every server it started, so
        that their shutdowns overlap).

    Yields
    ------
    list of str
        The names of the signals received (``"SIGTERM"``), in order, for the command's last line.

    Notes
    -----
    A signal the caller ignores stays ignored: ``nohup`` ignores SIGHUP so that the command outlives its
    terminal, and a shell without job control starts background jobs with SIGINT ignored, so that a Ctrl-C
    meant for the foreground does not reach them (POSIX, "Shell Command Language", 2.11). SIGTERM, which
    nobody ignores by accident, still stops such a command cleanly. The previous handlers come back when
    the block ends.
    """
    received: list[str] = []

    def handler(signum: int, frame: Any) -> None:
        received.append(signal.Signals(signum).name)
        if first is not None:
            first()
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
