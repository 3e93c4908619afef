"""Run one command as a child process; time it and track the peak RSS of its whole process tree.

Wall time is ``time.perf_counter`` around the child's whole life (start to
exit). Memory is sampled every ``poll_seconds`` from ``/proc``: the resident
set of the child plus every descendant (for Spark: the driver, the JVM it
launches and the Python workers the JVM forks), summed. Forked workers share
copy-on-write pages with their parent, so the sum overstates the physical
memory a little; it is the same rule for every peer.

Linux only (reads ``/proc``).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["Measurement", "run_measured", "tree_rss_bytes"]

_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Measurement:
    """One child process: exit status, wall seconds, peak summed RSS of its tree."""

    returncode: int
    wall_seconds: float
    peak_rss_bytes: int


def _parent_map() -> dict[int, list[int]]:
    """Children of every live process, from ``/proc/<pid>/stat`` (field 4 is the parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:  # exited while we looked
            continue
        # comm (field 2) is in parentheses and may hold spaces: split after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss_bytes(root: int) -> int:
    """Summed RSS of ``root`` and all its descendants right now (0 if it is gone)."""
    children = _parent_map()
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += _rss_bytes(pid)
        stack.extend(children.get(pid, ()))
    return total


def run_measured(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    log_path: Path,
    poll_seconds: float = 0.2,
) -> Measurement:
    """Run ``cmd`` to completion with stdout and stderr in ``log_path``; return its :class:`Measurement`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    peak = 0
    with open(log_path, "wb") as log:
        started = time.perf_counter()
        child = subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        while True:
            peak = max(peak, tree_rss_bytes(child.pid))
            try:
                child.wait(timeout=poll_seconds)
                break
            except subprocess.TimeoutExpired:
                continue
        wall = time.perf_counter() - started
    return Measurement(returncode=child.returncode, wall_seconds=wall, peak_rss_bytes=peak)
