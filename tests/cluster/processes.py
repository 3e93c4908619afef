"""A ``lakescore score`` CLI run in a subprocess and the processes Spark starts for it, read from ``/proc``.

Shared by the multi-JVM tests (faults, flat memory at scale): each finds its own run's driver JVM,
executor JVMs and Python workers among the descendants of the CLI process it started (the machine is
shared, so never by name alone).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 900


class CliRun:
    """One ``lakescore score`` subprocess with its output in a log file (polled while it runs)."""

    def __init__(self, cmd: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None):
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            **(env or {}),
        }
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115 (the process writes it until wait() closes it)
        self.started = time.time()
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.seconds = None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self) -> int:
        try:
            code = self.proc.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"lakescore ran over {RUN_TIMEOUT} s:\n{self.text()[-4000:]}") from None
        finally:
            self._out.close()
        self.seconds = round(time.time() - self.started, 1)
        print(f"{self.log.name}: exit {code} after {self.seconds} s")
        return code

    def error_line(self) -> str:
        lines = [line for line in self.text().splitlines() if line.startswith("lakescore: error:")]
        return lines[-1] if lines else ""


def procs_now() -> dict[int, tuple[int, str, float]]:
    """pid -> (ppid, cmdline, age in seconds) for every process we can read."""
    ticks = os.sysconf("SC_CLK_TCK")
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        out[int(entry.name)] = (int(fields[1]), cmdline, uptime - int(fields[19]) / ticks)
    return out


def descendants(root: int, procs) -> set[int]:
    """Every process under ``root`` in ``procs`` (as :func:`procs_now` returns), children and theirs."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def executors(run: CliRun, procs) -> list[int]:
    """This run's executor JVMs (only descendants of its own CLI process: the machine is shared)."""
    return sorted(p for p in descendants(run.proc.pid, procs) if "CoarseGrainedExecutorBackend" in procs[p][1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
