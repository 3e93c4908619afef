"""Executors fork Python workers from lakescore's daemon, which imported the model runtime first (real Spark)."""

from __future__ import annotations

import dataclasses
import threading
import time

import pandas as pd
import pytest

from lakescore.jobs.platform.spark.local import python_daemon
from lakescore.jobs.steps.context import PythonWorkerStart, ScoringLayout
from lakescore.jobs.steps.preflight import ExecutorPreflight
from lakescore.jobs.steps.read import open_input


def test_workers_fork_from_a_daemon_that_imported_torch(spark):
    """The session the tests share is built as `lakescore score` builds one. Each worker's parent is the daemon
    run as :mod:`lakescore.jobs.platform.spark.local.python_daemon`, with torch's library already mapped: imported
    there, before the fork, not by the worker. pyspark comes from the installed package, not the zip Spark puts first on
    the workers' path (the same files, uncompiled)."""
    PythonWorkerStart(spark, ScoringLayout(None, None)).wait()

    def parent_facts(batches):
        import os

        import pyarrow as pa
        import pyspark

        for _ in batches:
            pass
        parent = os.getppid()
        with open(f"/proc/{parent}/cmdline", "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ").decode()
        with open(f"/proc/{parent}/maps", encoding="utf-8", errors="replace") as handle:
            torch_mapped = any("libtorch_cpu" in line for line in handle)
        yield pa.RecordBatch.from_pydict(
            {"cmdline": [cmdline], "torch_mapped": [torch_mapped], "pyspark": [pyspark.__file__]}
        )

    schema = "cmdline string, torch_mapped boolean, pyspark string"
    rows = spark.range(2, numPartitions=2).mapInArrow(parent_facts, schema).collect()
    assert len(rows) == 2
    for row in rows:
        assert f"-m {python_daemon.__name__}" in row.cmdline, row.cmdline
        assert row.torch_mapped, f"the daemon {row.cmdline!r} has not imported torch"
        assert ".zip" not in row.pyspark and row.pyspark.endswith("pyspark/__init__.py"), row.pyspark


def test_a_failing_step_cancels_the_preflight_waiting_for_its_worker(spark, job_config, tmp_path):
    """The driver's checks run inside :class:`ExecutorPreflight`, whose preflight first waits for the worker started
    while the input was read. When a check fails meanwhile, that worker's job is cancelled and the preflight starts
    no job of its own. A job holding both task slots keeps the worker's job queued, so the wait is certain."""
    source = tmp_path / "reviews"
    spark.createDataFrame(pd.DataFrame({"review_id": [1, 2], "body": ["good", "bad"]})).write.parquet(str(source))
    run = open_input(job_config(input=str(source), output=str(tmp_path / "out")), spark)
    run.worker_start.wait()

    def hold_slot(batches):
        import time

        for _ in batches:
            pass
        time.sleep(20)  # outlasts the test body (~2 s); a cancelled task's Python worker sleeps on
        yield from ()

    def hold_both_slots():
        spark.addTag("test-holds-slots")
        try:
            spark.range(2, numPartitions=2).mapInArrow(hold_slot, "id long").collect()
        except Exception:  # noqa: BLE001 (cancelled below)
            pass

    holder = threading.Thread(target=hold_both_slots, daemon=True)
    holder.start()
    tracker = spark.sparkContext.statusTracker()
    deadline = time.time() + 60
    while sum(tracker.getStageInfo(s).numActiveTasks for s in tracker.getActiveStageIds()) < 2:
        assert time.time() < deadline, "the slot-holding job did not start"
        time.sleep(0.1)
    try:
        queued = dataclasses.replace(run, worker_start=PythonWorkerStart(spark, run.layout))
        preflight = ExecutorPreflight(queued)
        with pytest.raises(ValueError, match="a driver check failed"), preflight:
            raise ValueError("a driver check failed")
        with pytest.raises(RuntimeError, match="preflight cancelled"):
            preflight.identity()
    finally:
        spark.interruptTag("test-holds-slots")
        holder.join(timeout=60)
