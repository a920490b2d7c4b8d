"""A process's CPU time read from ``/proc``: the bench's own processes and mongod's."""

from __future__ import annotations

import os


def cpu_ticks(pid: int) -> int | None:
    """The user + system CPU time of process ``pid``, every thread of it, in clock ticks
    (``os.sysconf("SC_CLK_TCK")`` a second); None when it is gone or there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime


def cpu_seconds(pids: list[int]) -> float:
    """The CPU time of ``pids`` together, in seconds (those gone count nothing)."""
    return sum(cpu_ticks(pid) or 0 for pid in pids) / os.sysconf("SC_CLK_TCK")
