"""What a benchmark reads about a process from ``/proc`` (Linux): resident memory, CPU
time, children. The ``family_`` figures add up a process and every process under it
(a server's store writer and workers are part of what it costs)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """Resident memory of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used so far, user and system, all its threads (a resolution
    of one clock tick, 10 ms: read it around blocks of many requests)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def family_rss_mib(pid: int) -> float:
    """Resident memory of a process and every process under it, MiB."""
    return sum(_or_zero(rss_mib, one) for one in family(pid))


def family_cpu_seconds(pid: int) -> float:
    """CPU time of a process and of every process under it that still runs (see
    :func:`cpu_seconds`)."""
    return sum(_or_zero(cpu_seconds, one) for one in family(pid))


def family(pid: int) -> list[int]:
    """``pid`` and every process under it."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, waiting = [], [pid]
    while waiting:
        one = waiting.pop()
        found.append(one)
        waiting += parents.get(one, [])
    return found


def _or_zero(read: Callable[[int], float], pid: int) -> float:
    try:
        return read(pid)
    except (OSError, ValueError):  # it ended in between
        return 0.0


def children_named(parent: int, name: str) -> list[int]:
    """The processes called ``name`` whose parent is ``parent``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rpartition(")")[2].split()
        if comm == name and int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found
