"""Progress while the scoring stage runs: rows, %, rows/s, ETA, chunk k/n, tasks.

Tasks come from the session (:func:`lakescore.jobs.platform.spark.adapter.stage_progress`).
Rows come from the workers' ``rows`` accumulator in a classic session, which Spark merges on the
driver as each task finishes, so the figures move once per finished task. To make them move
early, :func:`progress_partitions` cuts a chunk into a few tasks per slot, so the first tasks end
after a fraction of the stage rather than at its half. A Spark Connect session has no
accumulators: its progress counts tasks, with the ETA from the share of tasks done.

On a terminal the progress is a live bar (``rich``) redrawn a few times a second, with
log lines printed above it; elsewhere (CI, Databricks logs) it is a plain log line
every ``interval`` seconds. Either way the reporter keeps a ``(seconds, rows)`` sample
at every change (classic sessions only), which the run report draws as throughput over time.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["ProgressReporter", "progress_partitions", "uneven_last_wave", "scoring_tasks", "TASKS_PER_SLOT"]

log = logging.getLogger("lakescore.progress")

TASKS_PER_SLOT = 4
"""Scoring tasks per task slot when the user set no ``scoring.partitions``: progress then first moves
after about a quarter of the first wave rather than at its end."""

_MIN_TASK_ROWS = 500
"""Fewer rows than this per task would mostly measure task overhead; small inputs keep fewer tasks. At this size
a task's fixed cost stays a small part of scoring its rows, and a chunk too small for :data:`TASKS_PER_SLOT` such
tasks per slot is scored quickly enough that early progress matters little."""

_POLL_SECONDS = 0.25


def progress_partitions(rows: int, slots: int, tasks_per_slot: int = TASKS_PER_SLOT) -> int:
    """Scoring tasks for ``rows`` rows on ``slots`` task slots: ``tasks_per_slot`` per slot, never
    under ``slots``, and no more than leaves each task about :data:`_MIN_TASK_ROWS` rows, rounded up to
    whole waves (a multiple of ``slots``).

    >>> (progress_partitions(12000, 2), progress_partitions(900, 2), progress_partitions(1500, 2),
    ...  progress_partitions(10**7, 200))
    (8, 2, 4, 800)
    """
    slots = max(1, slots)
    tasks = max(slots, min(slots * tasks_per_slot, math.ceil(rows / _MIN_TASK_ROWS)))
    return math.ceil(tasks / slots) * slots


def uneven_last_wave(partitions: int, slots: int) -> bool:
    """Whether ``partitions`` tasks on ``slots`` slots end in a part-empty wave while there are few waves
    (at most :data:`TASKS_PER_SLOT`), where the idle slots are a real share of the stage: 3 tasks on 2 slots
    leave one slot idle for a third of it.

    >>> uneven_last_wave(3, 2), uneven_last_wave(4, 2), uneven_last_wave(1001, 200)
    (True, False, False)
    """
    slots = max(1, slots)
    return partitions % slots != 0 and partitions <= slots * TASKS_PER_SLOT


def scoring_tasks(planned: int, slots: int, rows: int, row_seconds: float | None, interval: float) -> int | None:
    """Tasks to repartition ``rows`` rows read in ``planned`` partitions into before scoring
    (:func:`progress_partitions`), or ``None`` to score them as read: kept when they fill every slot in even waves
    and either are more than that many or each of their tasks scores within ``interval`` seconds at ``row_seconds``
    per row (``None``: unknown), since then the shuffle would cost more than the progress it shows. Planned
    partitions as many as wanted are spread too: a split may hold no rows (a Parquet file of one row group read in
    two splits), and with long tasks an idle slot costs more than the shuffle.

    >>> scoring_tasks(1, 2, 12000, 0.01, 15), scoring_tasks(4, 2, 10**7, 2e-6, 15), scoring_tasks(4, 2, 10**7, 1e-3, 15)
    (8, None, 8)
    >>> (scoring_tasks(3, 2, 10**7, 2e-6, 15), scoring_tasks(4, 2, 10**7, None, 15),
    ...  scoring_tasks(40, 2, 10**7, None, 15))
    (8, 8, None)
    >>> scoring_tasks(2, 2, 750, 0.5, 15), scoring_tasks(2, 2, 750, 1e-3, 15)  # slow images in two splits; a fast model
    (2, None)
    >>> scoring_tasks(0, 2, 0, 2e-6, 15)  # an empty input (nothing changed in an incremental run)
    2
    """
    wanted = progress_partitions(rows, slots)
    idle_slot = planned < slots or uneven_last_wave(planned, slots)
    if idle_slot:
        return wanted
    long_tasks = row_seconds is None or rows / planned * row_seconds > interval
    return wanted if planned <= wanted and long_tasks else None


class ProgressReporter:
    """Context manager: shows scoring progress until the block ends, and records it.

    ``tasks()`` returns (done, total) tasks of the running stages; ``rows()`` the rows scored so
    far, or ``rows`` is ``None`` where the session cannot count them (Spark Connect).
    ``interval`` is the seconds between plain lines (0: none, and no bar). ``terminal``
    (default: whether stderr is a TTY) picks the live bar. :meth:`chunk` tells it which
    of ``chunks`` is being scored; :meth:`samples` returns what it recorded.
    """

    def __init__(
        self,
        tasks: Callable[[], tuple[int, int]],
        rows: Callable[[], int] | None,
        total_rows: int,
        interval: float = 15.0,
        chunks: int = 1,
        terminal: bool | None = None,
    ) -> None:
        self._tasks, self._rows, self._total, self._interval = tasks, rows, total_rows, interval
        self._chunks, self._chunk = chunks, 0
        self._terminal = sys.stderr.isatty() if terminal is None else terminal
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._samples: list[tuple[float, int]] = []

    def __enter__(self) -> ProgressReporter:
        self._started = time.monotonic()
        self._samples = [(0.0, 0)]
        self._thread = threading.Thread(target=self._run, name="lakescore-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample(final=True)

    def chunk(self, index: int) -> None:
        """Chunk ``index`` (0-based) is being scored now."""
        self._chunk = index

    def samples(self) -> list[tuple[float, int]]:
        """``(seconds since start, rows scored)`` at the start, at every change and at the end."""
        return list(self._samples)

    def line(self) -> str:
        """The current progress as one line."""
        rows, elapsed, rate, eta = self._figures()
        tasks_done, tasks_total = self._tasks()
        tasks = f"tasks {tasks_done}/{tasks_total} in active stages"
        eta_text = f"{eta:.0f} s" if eta is not None else "unknown"
        chunk = f"chunk {self._chunk + 1}/{self._chunks}"
        if self._rows is None:
            share = tasks_done / tasks_total if tasks_total else 0.0
            return (
                f"scoring: {self._total} rows, {chunk}, {tasks} ({100 * share:.0f}%), "
                f"elapsed {elapsed:.0f} s, ETA {eta_text}"
            )
        pct = 100.0 * rows / self._total if self._total else 100.0
        return (
            f"scoring: {rows}/{self._total} rows ({pct:.0f}%), {chunk}, {tasks}, "
            f"{rate:.1f} rows/s, elapsed {elapsed:.0f} s, ETA {eta_text}"
        )

    def _figures(self) -> tuple[int, float, float, float | None]:
        """(rows, elapsed seconds, rows/s, ETA seconds or None); without live rows, rows and the ETA
        follow the share of tasks done."""
        elapsed = time.monotonic() - self._started
        if self._rows is None:
            done, total = self._tasks()
            share = done / total if total else 0.0
            rows = round(self._total * share)
            eta = elapsed * (1 - share) / share if share > 0 else None
        else:
            rows = self._rows()
            eta = (self._total - rows) * elapsed / rows if rows > 0 else None
        rate = rows / elapsed if elapsed > 0 else 0.0
        return rows, elapsed, rate, eta

    def _sample(self, final: bool = False) -> None:
        if self._rows is None:
            return
        try:
            rows = self._rows()
        except Exception:  # the JVM went away; keep what was recorded
            return
        if rows != self._samples[-1][1] or final:
            self._samples.append((round(time.monotonic() - self._started, 2), rows))

    def _run(self) -> None:
        try:
            if self._terminal and self._interval > 0:
                self._run_bar()
            else:
                self._run_lines()
        except Exception:  # the JVM went away (an interrupted run): the main thread reports that, once
            log.debug("progress stopped", exc_info=True)

    def _run_lines(self) -> None:
        last_line = time.monotonic()
        while not self._stop.wait(_POLL_SECONDS):
            self._sample()
            if self._interval > 0 and time.monotonic() - last_line >= self._interval:
                last_line = time.monotonic()
                log.info(self.line())

    def _run_bar(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

        bar = Progress(
            TextColumn("scoring"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn(
                "{task.completed:,}/{task.total:,} rows • {task.fields[rate]} • ETA {task.fields[eta]} • "
                "chunk {task.fields[chunk]} • tasks {task.fields[tasks]}"
            ),
            console=Console(file=sys.stderr),
            refresh_per_second=4,
            redirect_stderr=True,
            redirect_stdout=True,
        )
        with bar:
            task = bar.add_task("scoring", total=self._total, rate="… rows/s", eta="…", chunk="", tasks="")
            while True:
                stopping = self._stop.wait(_POLL_SECONDS)
                self._sample()
                rows, _, rate, eta = self._figures()
                done, total = self._tasks()
                bar.update(
                    task,
                    completed=rows,
                    rate=f"{rate:,.1f} rows/s" if rows else "… rows/s",
                    eta=_clock(eta) if rows else "…",
                    chunk=f"{self._chunk + 1}/{self._chunks}",
                    tasks=f"{done}/{total}" if total else "-",
                )
                if stopping:
                    return


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "…"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}:{secs:02d}"
