"""Processes a test started, found by parent pid in ``/proc`` (to signal exactly those, by id)."""

from __future__ import annotations

import os
from pathlib import Path


def child_pids(parent: int, program: str) -> list[int]:
    """Pids of ``parent``'s children running ``program``: a ``python -m`` module name (an argv element)
    or an executable's name (the basename of argv[0])."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and (program.encode() in argv or os.path.basename(argv[0]) == program.encode()):
            pids.append(int(entry.name))
    return sorted(pids)
