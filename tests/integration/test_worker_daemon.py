"""Executors fork Python workers from lakescore's daemon, which imported the model runtime first (real Spark)."""

from __future__ import annotations

from lakescore.jobs.platform import python_daemon
from lakescore.jobs.steps.preflight import PythonWorkerStart
from lakescore.jobs.steps.score import ScoringLayout


def test_workers_fork_from_a_daemon_that_imported_torch(spark):
    """The session the tests share is built as `lakescore score` builds one. Each worker's parent is the daemon
    run as :mod:`lakescore.jobs.platform.python_daemon`, with torch's library already mapped: imported there,
    before the fork, not by the worker."""
    PythonWorkerStart(spark, ScoringLayout(None, None)).wait()

    def parent_facts(batches):
        import os

        import pyarrow as pa

        for _ in batches:
            pass
        parent = os.getppid()
        with open(f"/proc/{parent}/cmdline", "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ").decode()
        with open(f"/proc/{parent}/maps", encoding="utf-8", errors="replace") as handle:
            torch_mapped = any("libtorch_cpu" in line for line in handle)
        yield pa.RecordBatch.from_pydict({"cmdline": [cmdline], "torch_mapped": [torch_mapped]})

    rows = spark.range(2, numPartitions=2).mapInArrow(parent_facts, "cmdline string, torch_mapped boolean").collect()
    assert len(rows) == 2
    for row in rows:
        assert f"-m {python_daemon.__name__}" in row.cmdline, row.cmdline
        assert row.torch_mapped, f"the daemon {row.cmdline!r} has not imported torch"
