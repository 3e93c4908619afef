"""Test-only hooks at the job's step boundaries and at named points inside steps, set by environment variables.

Every hook is off unless ``LAKESCORE_TEST_HOOKS=1`` is set too (the test suite's ``tests/conftest.py`` sets
it), so a stray ``LAKESCORE_TEST_KILL`` in a production environment cannot kill a driver.

``LAKESCORE_TEST_BARRIER="<step>:<parties>:<directory>"``: a run that reaches ``<step>``
(:class:`~lakescore.jobs.steps.clock.StepClock` names them) records its arrival in
``<directory>`` and waits until ``<parties>`` runs have arrived (at most
``LAKESCORE_TEST_BARRIER_SECONDS``, default 600), so a test can prove that concurrent runs
overlapped: e.g. both staged and validated before either published.

``LAKESCORE_TEST_KILL="<point>"`` (or ``"<point>@<seconds>"``): the process SIGKILLs itself when it
reaches ``<point>`` (or ``<seconds>`` later, from a timer thread, so the kill lands inside whatever
runs next: a chunk's commit, the validation), as a driver killed by its platform (OOM killer,
preempted node) dies: no ``finally``, no shutdown hook of Python's. The points are every step
boundary (``startup``, ``read_check``, ``prepare``, ``score_stage``, ``validate``, ``report_data``,
``publish``) and :data:`POINTS` inside the steps. Tests kill at each and check that the rerun's
result is exact (``tests/integration/test_kill_matrix.py``).

``LAKESCORE_TEST_ANNOUNCE="<file>"``: the process appends ``<point> <unix time>`` to ``<file>`` as it
reaches each step boundary and point, so a test watching the file can act at a named instant from
outside, e.g. SIGKILL an executor JVM while the validation or the publish runs on it
(``tests/cluster/test_faults.py``).

Unset, the default, a point costs one environment lookup.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

__all__ = ["at_step", "at_point", "ANNOUNCE_ENV", "BARRIER_ENV", "ENABLE_ENV", "KILL_ENV", "POINTS"]

ENABLE_ENV = "LAKESCORE_TEST_HOOKS"
ANNOUNCE_ENV = "LAKESCORE_TEST_ANNOUNCE"
BARRIER_ENV = "LAKESCORE_TEST_BARRIER"
KILL_ENV = "LAKESCORE_TEST_KILL"

POINTS = {
    "chunk_commit:<k>": "right before chunk k's staging commit (with @seconds: during it)",
    "chunk_committed:<k>": "after chunk k's staging commit, before the next chunk",
    "batch_submit": "a provider batch run: before a round of lines is submitted (generate.endpoint.batch)",
    "batch_created": "on the executor, right after a provider batch is created, before the ledger records it",
    "batches_recorded": "a round's batches recorded in the ledger, before polling",
    "batch_polling": "each pass of polling the provider's batches",
    "batch_collect": "before the ended batches' files are downloaded",
    "staging_pinned": "every chunk staged and the staging snapshot pinned, before accounting",
    "validation_running": "accounting done, right before the GX suite runs (with @seconds: during it)",
    "publish_commit": "the publish decided, right before the output's commit",
    "publish_committed": "after the output's commit, before the errors table's",
    "errors_committed": "after the errors table's commit, before staging is dropped",
}
"""The points inside steps (beside the step boundaries) where :data:`KILL_ENV` can kill the driver."""


def at_step(step: str) -> None:
    """Run the hooks configured for ``step`` (none unless :data:`ENABLE_ENV` is ``1`` and a hook's variable is set)."""
    if not _enabled():
        return
    barrier = os.environ.get(BARRIER_ENV)
    if barrier:
        name, parties, directory = barrier.split(":", 2)
        if name == step:
            _wait_at_barrier(Path(directory), int(parties), float(os.environ.get(f"{BARRIER_ENV}_SECONDS", "600")))
    at_point(step)


def at_point(point: str) -> None:
    """Announce ``point`` if :data:`ANNOUNCE_ENV` names a file; kill this process if :data:`KILL_ENV`
    names ``point`` (at once, or after its ``@seconds``); nothing unless :data:`ENABLE_ENV` is ``1``."""
    if not _enabled():
        return
    announce = os.environ.get(ANNOUNCE_ENV)
    if announce:
        with open(announce, "a") as file:
            file.write(f"{point} {time.time()}\n")
    kill = os.environ.get(KILL_ENV)
    if kill:
        name, _, delay = kill.partition("@")
        if name == point:
            _kill_self(float(delay) if delay else 0.0)


def _enabled() -> bool:
    return os.environ.get(ENABLE_ENV) == "1"


def _kill_self(delay: float) -> None:
    if delay <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL))
    timer.daemon = True
    timer.start()


def _wait_at_barrier(directory: Path, parties: int, timeout: float) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"arrived-{os.getpid()}-{threading.get_ident()}").write_text(str(time.time()))  # runs may be threads
    deadline = time.monotonic() + timeout
    while len(list(directory.glob("arrived-*"))) < parties:
        if time.monotonic() > deadline:
            raise RuntimeError(f"test barrier at {directory}: {parties} runs did not arrive within {timeout:.0f} s")
        time.sleep(0.05)
