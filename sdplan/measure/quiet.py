"""Detecting a disturbed measurement: CPU time used by processes that are not ours.

On a CPU server any concurrent CPU-bound process inflates vLLM's step times
10-50x (measured on this project's 2-core machines), and on a GPU box a busy
host thread slows the scheduler the same way. Every load point is therefore
bracketed by two readings of ``/proc``: the machine's busy CPU time
(``/proc/stat``) minus the CPU time of our own process groups (the server,
the benchmark client, sdplan itself). What is left was used by someone else.
Linux only; elsewhere the reading is ``None`` and nothing is flagged.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

#: Foreign CPU use (cores, averaged over a point) above which the point is disturbed.
DISTURBED_FOREIGN_CORES = 0.15


def _ticks() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0


def machine_busy_s() -> float | None:
    """Busy CPU seconds of the whole machine since boot (all cores), from ``/proc/stat``."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    values = [float(v) for v in first[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0.0)  # idle + iowait
    busy = sum(values[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy / _ticks()


def group_cpu_s(groups: set[int]) -> float:
    """CPU seconds used so far by live processes of the given process groups, and by this process."""
    total = 0.0
    ticks = _ticks()
    own = os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0.0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()  # after "pid (comm) "
        try:
            pgrp = int(fields[2])
            used = (float(fields[11]) + float(fields[12]) + float(fields[13]) + float(fields[14])) / ticks
        except (IndexError, ValueError):
            continue
        if pgrp in groups or int(entry) == own:
            total += used
    return total


@dataclass
class ForeignCpu:
    """Brackets one measurement: ``start()``, then ``stop()`` gives foreign CPU cores used on average."""

    groups: set[int]
    _busy: float | None = None
    _ours: float = 0.0
    _wall: float = 0.0

    def start(self) -> None:
        self._busy = machine_busy_s()
        self._ours = group_cpu_s(self.groups)
        self._wall = time.monotonic()

    def stop(self) -> float | None:
        """Mean number of cores used by other processes since ``start()`` (None where unknown)."""
        busy = machine_busy_s()
        if busy is None or self._busy is None:
            return None
        wall = max(time.monotonic() - self._wall, 1e-6)
        foreign = (busy - self._busy) - (group_cpu_s(self.groups) - self._ours)
        return max(foreign, 0.0) / wall
