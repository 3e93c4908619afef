"""Progress lines while the scoring stage runs: tasks done, rows scored, rows/s and an ETA.

Tasks come from the session (:func:`lakescore.jobs.platform.spark_adapter.stage_progress`).
Rows come from the workers' ``rows`` accumulator in a classic session, which Spark merges on
the driver as each task finishes, so the figures move in steps of one task; a Spark Connect
session has no accumulators, and its line reports tasks, with the ETA from the tasks done.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

__all__ = ["ProgressReporter"]

log = logging.getLogger("lakescore.progress")


class ProgressReporter:
    """Context manager: logs a progress line every ``interval`` seconds until the block ends."""

    def __init__(
        self,
        tasks: Callable[[], tuple[int, int]],
        rows: Optional[Callable[[], int]],
        total_rows: int,
        interval: float = 15.0,
    ) -> None:
        """``tasks()``: (done, total) tasks of the running stages; ``rows()``: rows scored so far, or ``None`` if unknown."""
        self._tasks, self._rows, self._total, self._interval = tasks, rows, total_rows, interval
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._started = 0.0

    def __enter__(self) -> "ProgressReporter":
        self._started = time.monotonic()
        if self._interval > 0:
            self._thread = threading.Thread(target=self._run, name="lakescore-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def line(self) -> str:
        """The current progress as one line."""
        elapsed = time.monotonic() - self._started
        tasks_done, tasks_total = self._tasks()
        tasks = f"tasks {tasks_done}/{tasks_total} in active stages"
        if self._rows is None:
            share = tasks_done / tasks_total if tasks_total else 0.0
            eta = f"{elapsed * (1 - share) / share:.0f} s" if share > 0 else "unknown"
            return f"scoring: {self._total} rows, {tasks} ({100 * share:.0f}%), elapsed {elapsed:.0f} s, ETA {eta}"
        rows = self._rows()
        rate = rows / elapsed if elapsed > 0 else 0.0
        eta = f"{(self._total - rows) / rate:.0f} s" if rate > 0 else "unknown"
        pct = 100.0 * rows / self._total if self._total else 100.0
        return (
            f"scoring: {rows}/{self._total} rows ({pct:.0f}%), {tasks}, "
            f"{rate:.1f} rows/s, elapsed {elapsed:.0f} s, ETA {eta}"
        )

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            log.info(self.line())
