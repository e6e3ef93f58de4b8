"""CPU seconds (user + system) of whole process trees, read from ``/proc/<pid>/stat``.

A stack's CPU over a window is the sum, over every process of its tree seen at either end of the
window, of ``utime + stime`` at the end minus at the start (a process born inside the window counts from
zero; one that died inside it is lost, which for long-lived servers is nothing). Threads are included:
``/proc/<pid>/stat`` sums a process's threads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def parse_stat(text: str) -> tuple[int, int]:
    """``(ppid, utime + stime in clock ticks)`` from one ``/proc/<pid>/stat`` line.

    The command name (field 2) is in parentheses and may hold spaces or ``)``: split after the last ``)``.
    """
    fields = text.rsplit(")", 1)[1].split()
    # after the name: state(3) ppid(4) ... utime(14) stime(15) -> indexes 0, 1, ..., 11, 12
    return int(fields[1]), int(fields[11]) + int(fields[12])


def _all_stats() -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            out[int(entry.name)] = parse_stat((entry / "stat").read_text())
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
    return out


def descendants(stats: dict[int, tuple[int, int]], roots: Iterable[int]) -> set[int]:
    """``roots`` (those alive) and every process below them in ``stats`` (pid -> (ppid, ticks))."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [r for r in roots if r in stats]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def tree_ticks(roots: Iterable[int]) -> dict[int, int]:
    """pid -> CPU ticks of every process in the trees under ``roots`` right now."""
    stats = _all_stats()
    return {pid: stats[pid][1] for pid in descendants(stats, roots)}


def cpu_between(before: dict[int, int], after: dict[int, int]) -> float:
    """CPU seconds spent between two :func:`tree_ticks` snapshots of the same trees."""
    return sum(ticks - before.get(pid, 0) for pid, ticks in after.items()) / _TICK


def tree_names(roots: Iterable[int]) -> list[str]:
    """Command names (``/proc/<pid>/comm``) of the processes in the trees under ``roots``, sorted."""
    names = []
    for pid in descendants(_all_stats(), roots):
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            continue
    return sorted(names)


class CpuMeter:
    """``with`` a window: :attr:`seconds` is the CPU the trees under ``roots`` used inside it."""

    def __init__(self, roots: Iterable[int]) -> None:
        self.roots = list(roots)
        self.seconds = 0.0
        self._before: dict[int, int] = {}

    def __enter__(self) -> CpuMeter:
        self._before = tree_ticks(self.roots)
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = cpu_between(self._before, tree_ticks(self.roots))
