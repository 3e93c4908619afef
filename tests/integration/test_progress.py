"""Progress from a real SparkContext: samples move task by task, the bar and the lines both work."""

from __future__ import annotations

import io
import logging
import sys
import time

from lakescore.jobs.platform.spark.adapter import stage_progress
from lakescore.jobs.platform.spark.progress import ProgressReporter


def count_rows_slowly(spark, rows, tasks: int) -> None:
    def work(part):
        for _ in part:
            rows.add(1)
        time.sleep(0.6)  # each task takes a while, like a scoring task

    spark.sparkContext.parallelize(range(40), tasks).foreachPartition(work)


def test_samples_move_as_tasks_finish_and_end_at_the_total(spark, caplog):
    rows = spark.sparkContext.accumulator(0)
    caplog.set_level(logging.INFO, logger="lakescore.progress")
    with (
        stage_progress(spark) as tasks,
        ProgressReporter(tasks, lambda: rows.value, total_rows=40, interval=1, chunks=2, terminal=False) as progress,
    ):
        progress.chunk(1)
        count_rows_slowly(spark, rows, tasks=8)
    samples = progress.samples()
    assert samples[0] == (0.0, 0) and samples[-1][1] == 40
    counts = [r for _, r in samples]
    assert counts == sorted(counts) and len(set(counts)) >= 3  # moved before the last task ended
    assert any("chunk 2/2" in r.getMessage() for r in caplog.records)


def test_terminal_bar_draws_to_stderr(spark, monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stderr", screen)
    rows = spark.sparkContext.accumulator(0)
    with (
        stage_progress(spark) as tasks,
        ProgressReporter(tasks, lambda: rows.value, total_rows=40, interval=1, terminal=True),
    ):
        count_rows_slowly(spark, rows, tasks=4)
    assert "40/40 rows" in screen.getvalue() and "chunk 1/1" in screen.getvalue()
