"""Which CPU cores a process runs on: Linux's CPU list syntax (``0``, ``0-3,8``) and the affinity call.

On a machine the draft shares with its targets (one node, or a benchmark on a few cores), where it runs matters:
vLLM's CPU build binds each replica's model worker to its own cores and reserves another for its engine process,
which polls while the worker computes. A draft left to the scheduler competes with that poll; a draft on the
worker's cores runs while the worker waits for its proposals, as vLLM's in-process draft does.
"""

from __future__ import annotations

import os


class CpuListError(ValueError):
    """A CPU list that cannot be read, or names cores this process may not use."""


def parse_cpu_list(text: str) -> frozenset[int]:
    """``"0-3,8"`` -> {0, 1, 2, 3, 8}: comma-separated cores and inclusive ranges, as in /proc and taskset."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise CpuListError(f"{text!r} is not a CPU list (cores and ranges, e.g. 0 or 0-3,8)") from None
        if first < 0 or last < first:
            raise CpuListError(f"{part!r} in {text!r} is not a range of cores (e.g. 0-3)")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: frozenset[int] | set[int]) -> str:
    """The shortest CPU list for ``cpus``: {0, 1, 2, 3, 8} -> ``"0-3,8"``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def unavailable(cpus: frozenset[int], allowed: frozenset[int] | set[int]) -> str | None:
    """Why ``cpus`` cannot be used by a process that may run on ``allowed`` (None: they can)."""
    missing = cpus - set(allowed)
    if missing:
        return (
            f"CPU {format_cpu_list(missing)} is not among the cores this process may use "
            f"({format_cpu_list(set(allowed))})"
        )
    return None


def pin(text: str) -> frozenset[int]:
    """Run this process (and the processes it starts from now on) on the cores ``text`` lists; returns them.
    Raises :class:`CpuListError` for a list that cannot be read or names cores outside this process's set."""
    cpus = parse_cpu_list(text)
    if (problem := unavailable(cpus, os.sched_getaffinity(0))) is not None:
        raise CpuListError(problem)
    os.sched_setaffinity(0, cpus)
    return cpus
