"""Test-only hooks at the job's step boundaries, set by environment variables.

``LAKESCORE_TEST_BARRIER="<step>:<parties>:<directory>"``: a run that reaches ``<step>``
(:class:`~lakescore.jobs.steps.report.StepClock` names them) records its arrival in
``<directory>`` and waits until ``<parties>`` runs have arrived (at most
``LAKESCORE_TEST_BARRIER_SECONDS``, default 600), so a test can prove that concurrent runs
overlapped: e.g. both staged and validated before either published. Unset, the default, the
hook is one environment lookup per step.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["at_step", "BARRIER_ENV"]

BARRIER_ENV = "LAKESCORE_TEST_BARRIER"


def at_step(step: str) -> None:
    """Run the hooks configured for ``step`` (none unless the test environment variables are set)."""
    barrier = os.environ.get(BARRIER_ENV)
    if barrier:
        name, parties, directory = barrier.split(":", 2)
        if name == step:
            _wait_at_barrier(Path(directory), int(parties), float(os.environ.get(f"{BARRIER_ENV}_SECONDS", "600")))


def _wait_at_barrier(directory: Path, parties: int, timeout: float) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"arrived-{os.getpid()}").write_text(str(time.time()))
    deadline = time.monotonic() + timeout
    while len(list(directory.glob("arrived-*"))) < parties:
        if time.monotonic() > deadline:
            raise RuntimeError(f"test barrier at {directory}: {parties} runs did not arrive within {timeout:.0f} s")
        time.sleep(0.05)
