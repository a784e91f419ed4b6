"""CPU time and resident memory of a process and its descendants, read from Linux's /proc.

The draft runs its model in a child process, so what it costs is the sum over the process tree.
"""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first); None if the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, grandchildren, ...), from the parent ids in /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def cpu_seconds(pid: int, tree: bool = True) -> float | None:
    """User + system CPU seconds of a process (all threads) and, with ``tree``, its live descendants."""
    total = 0.0
    for p in [pid, *(descendants(pid) if tree else [])]:
        fields = _stat_fields(p)
        if fields is None:
            if p == pid:
                return None
            continue
        # After the command name: utime and stime are fields 14 and 15 of proc(5), 12th and 13th here.
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def rss_bytes(pid: int, tree: bool = True) -> int | None:
    """Resident memory of a process and, with ``tree``, its live descendants (VmRSS from /proc status)."""
    total = 0
    for p in [pid, *(descendants(pid) if tree else [])]:
        try:
            lines = Path(f"/proc/{p}/status").read_text().splitlines()
        except OSError:
            if p == pid:
                return None
            continue
        total += next((int(line.split()[1]) * 1024 for line in lines if line.startswith("VmRSS:")), 0)
    return total
