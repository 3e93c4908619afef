"""Run one command as a child process; time it and track the peak RSS of its whole process tree.

Wall time is ``time.perf_counter`` around the child's whole life (start to
exit). Descendants that outlive the child are waited for afterwards, untimed, so the next
command does not share the CPU with them: a Spark driver's JVM shuts down (~0.5 s here) only
after the Python process that started it has exited. Memory is sampled every ``poll_seconds``
from ``/proc``: the resident set of the child plus every descendant (for Spark: the driver, the
JVM it launches and the Python workers the JVM forks), summed. Forked workers share
copy-on-write pages with their parent, so the sum overstates the physical
memory a little; it is the same rule for every peer.

A process that shares its parent's whole address space is its parent's memory and is not
counted again (:func:`shares_parent_memory`). The JVM starts every subprocess (Hadoop's local
file system runs ``chmod``, ``readlink``, ``setsid`` for Delta's files; the Python daemon)
through ``posix_spawn``, whose child runs in the JVM's own memory until it execs: a sample that
fell in that instant counted the JVM twice (seen here: two 726 MiB "java" processes, the second
a spawn child; it made W1 peaks vary by up to ~1 GiB between identical runs).

Every ``smaps_every`` polls the tree's proportional set size (PSS: shared pages split among the
processes that map them, so a library or a memory-mapped weight file counts once) and each
Spark Python worker's private vs shared memory (``/proc/<pid>/smaps_rollup``) are read too:
what the workers of one executor share (libraries, memory-mapped weights) against what each
holds alone.

Linux only (reads ``/proc``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lakescore.jobs.platform.spark.local import python_daemon

__all__ = ["Measurement", "run_measured", "wait_until_gone"]

_PAGE = os.sysconf("SC_PAGE_SIZE")
_SYS_KCMP = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
_KCMP_VM = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Measurement:
    """One child process: exit status, wall seconds, peak summed RSS of its tree."""

    returncode: int
    wall_seconds: float
    peak_rss_bytes: int
    peak_pss_bytes: int = 0
    """Largest summed PSS of the tree (sampled every ``smaps_every`` polls)."""
    worker_private_bytes: int = 0
    """Largest private (unshared) memory of any one Spark Python worker."""
    worker_shared_bytes: int = 0
    """That worker's shared memory at the same sample."""


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


def tree_pids(root: int) -> list[int]:
    """``root`` and every descendant alive right now with an address space of its own (see
    :func:`shares_parent_memory`)."""
    children = _parent_map()
    found, stack = [], [(root, 0)]
    while stack:
        pid, parent = stack.pop()
        if not (parent and shares_parent_memory(pid, parent)):
            found.append(pid)
        stack.extend((child, pid) for child in children.get(pid, ()))
    return found


def shares_parent_memory(pid: int, parent: int) -> bool:
    """Whether ``pid`` runs in ``parent``'s address space (``kcmp(2)``, ``KCMP_VM``): a ``vfork`` /
    ``posix_spawn`` child before its ``exec``. False when the kernel cannot tell (no ``kcmp``, a process gone)."""
    if _SYS_KCMP is None:
        return False
    return _LIBC.syscall(_SYS_KCMP, parent, pid, _KCMP_VM, 0, 0) == 0


def smaps_rollup(pid: int) -> dict[str, int]:
    """``/proc/<pid>/smaps_rollup`` in bytes (``Pss``, ``Private_Dirty``, ``Shared_Clean``, ...); empty when gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
            rows = [line.split() for line in handle if line.rstrip().endswith("kB")]
    except OSError:
        return {}
    return {row[0].rstrip(":"): int(row[1]) * 1024 for row in rows}


def _is_python_worker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read()
        argv = cmdline.decode(errors="replace").split("\0")
        return "pyspark.daemon" in argv or "pyspark.worker" in argv or python_daemon.runs_daemon(argv)
    except OSError:
        return False


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def memory_sample(root: int) -> tuple[int, int, int]:
    """``(tree PSS, largest private bytes of one Python worker, that worker's shared bytes)`` right now.

    A worker is a process the Python daemon forked, not the daemon: lakescore's daemon holds the imported
    runtime privately until it forks the workers that share it
    (:mod:`lakescore.jobs.platform.spark.local.python_daemon`)."""
    pss, private, shared = 0, 0, 0
    for pid in tree_pids(root):
        rollup = smaps_rollup(pid)
        pss += rollup.get("Pss", 0)
        mine = rollup.get("Private_Clean", 0) + rollup.get("Private_Dirty", 0)
        if mine > private and _is_python_worker(pid) and _is_python_worker(_parent(pid)):
            private, shared = mine, rollup.get("Shared_Clean", 0) + rollup.get("Shared_Dirty", 0)
    return pss, private, shared


def run_measured(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    log_path: Path,
    poll_seconds: float = 0.2,
    smaps_every: int = 5,
    lingering_timeout_s: float = 60.0,
) -> Measurement:
    """Run ``cmd`` to completion with stdout and stderr in ``log_path``; return its :class:`Measurement`
    once the descendants it left behind have exited too (at most ``lingering_timeout_s`` later, untimed)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    peak, memory, polls, seen = 0, (0, 0, 0), 0, set()
    with open(log_path, "wb") as log:
        started = time.perf_counter()
        child = subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        while True:
            pids = tree_pids(child.pid)
            seen.update(pids)
            peak = max(peak, sum(_rss_bytes(pid) for pid in pids))
            if polls % smaps_every == 0:
                pss, private, shared = memory_sample(child.pid)
                memory = (max(memory[0], pss), *(memory[1:] if memory[1] >= private else (private, shared)))
            polls += 1
            try:
                child.wait(timeout=poll_seconds)
                break
            except subprocess.TimeoutExpired:
                continue
        wall = time.perf_counter() - started
    wait_until_gone(seen - {child.pid}, timeout_s=lingering_timeout_s)
    return Measurement(child.returncode, wall, peak, *memory)


def wait_until_gone(pids: set[int], timeout_s: float) -> bool:
    """Wait until none of ``pids`` runs (gone, or a zombie nobody reaped yet); ``False`` if some still run
    after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while any(_is_running(pid) for pid in pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] not in ("Z", "X")
