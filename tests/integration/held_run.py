"""Run a scoring job in a thread held at one of its steps, so a test can change the world meanwhile.

The job waits at ``step`` on the test barrier (:data:`~lakescore.jobs.testing_hooks.BARRIER_ENV`, two
parties): once it has arrived, ``meanwhile()`` runs in the test's thread (an upstream commit, a write to
staging), then the test arrives too and the job goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from lakescore.jobs.config import JobConfig
from lakescore.jobs.report.model import RunReport
from lakescore.jobs.score_job import run_scoring
from lakescore.jobs.testing_hooks import BARRIER_ENV

__all__ = ["run_held_at"]


def run_held_at(
    spark, cfg: JobConfig, step: str, barrier: Path, meanwhile: Callable[[], None], monkeypatch, seconds: float = 300
) -> RunReport:
    """``run_scoring(cfg, spark)`` held at ``step`` while ``meanwhile()`` runs; its report.

    Fails the test when the run ends or ``seconds`` pass before it reaches ``step``; re-raises what the run raised.
    """
    monkeypatch.setenv(BARRIER_ENV, f"{step}:2:{barrier}")
    result = {}

    def run():
        try:
            result["report"] = run_scoring(cfg, spark)
        except BaseException as exc:  # re-raised in the test's thread
            result["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + seconds
    while not list(barrier.glob("arrived-*")) and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(barrier.glob("arrived-*")), f"the run never reached {step}: {result}"
    meanwhile()
    (barrier / "arrived-test").write_text("")
    worker.join(seconds)
    monkeypatch.delenv(BARRIER_ENV)
    if "error" in result:
        raise result["error"]
    return result["report"]
