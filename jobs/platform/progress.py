"""Progress lines while the scoring stage runs: tasks done, rows scored, rows/s and an ETA.

Rows come from the workers' ``rows`` accumulator, which Spark merges on the
driver as each task finishes, so the figures move in steps of one task.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

from pyspark import Accumulator, SparkContext

__all__ = ["ProgressReporter"]

log = logging.getLogger("lakescore.progress")


class ProgressReporter:
    """Context manager: logs a progress line every ``interval`` seconds until the block ends."""

    def __init__(self, sc: SparkContext, rows: Accumulator, total_rows: int, interval: float = 15.0) -> None:
        self._sc, self._rows, self._total, self._interval = sc, rows, total_rows, interval
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
        rows = self._rows.value
        tasks_done = tasks_total = 0
        tracker = self._sc.statusTracker()
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                tasks_done += info.numCompletedTasks
                tasks_total += info.numTasks
        rate = rows / elapsed if elapsed > 0 else 0.0
        eta = f"{(self._total - rows) / rate:.0f} s" if rate > 0 else "unknown"
        pct = 100.0 * rows / self._total if self._total else 100.0
        return (
            f"scoring: {rows}/{self._total} rows ({pct:.0f}%), tasks {tasks_done}/{tasks_total} in active stages, "
            f"{rate:.1f} rows/s, elapsed {elapsed:.0f} s, ETA {eta}"
        )

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                log.info(self.line())
            except Exception:  # the JVM went away (an interrupted run): the main thread reports that, once
                return
