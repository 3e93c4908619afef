"""``lakescore fetch-jars``' JVM class archive: trained once per host by a small Spark job in a child process.

:mod:`lakescore.jobs.platform.spark.local.class_archive` names the archive and starts sessions from it; the training job
lives here, with the command that runs it, so the platform never runs a session of its own.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from lakescore.jobs.platform.spark.local.class_archive import archive_path

__all__ = ["build_archive"]

log = logging.getLogger(__name__)


def build_archive(jars_dir: str, settings: Mapping[str, str], timeout_s: float = 600) -> Path | None:
    """Train and save the archive for a driver started with ``settings``; return its path (``None``: none can apply).

    Idempotent: an archive already there is kept. Runs :func:`_train` in a child Python whose JVM
    dumps the classes it loaded when it exits; the file is renamed into place only then. Raises
    :class:`RuntimeError` naming the exit code when the training run fails.
    """
    target = archive_path(jars_dir, settings)
    if target is None or target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=".train-", dir=target.parent) as scratch:
        dumped = Path(scratch) / target.name
        env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        result = subprocess.run(
            [sys.executable, "-m", "lakescore.jobs.commands.fetch_jars", str(dumped), jars_dir, scratch],
            env=env,
            check=False,
            timeout=timeout_s,
        )
        if result.returncode != 0 or not dumped.is_file() or dumped.stat().st_size == 0:
            raise RuntimeError(
                f"training the JVM class archive failed (exit {result.returncode}); sessions start without one"
            )
        os.replace(dumped, target)
    log.info(
        "JVM class archive ready in %s (%.0f MiB, %.0f s)",
        target,
        target.stat().st_size / 2**20,
        time.monotonic() - started,
    )
    return target


def _train(dump_to: Path, jars_dir: str, scratch: Path) -> None:
    """The training run (in a child process): a local session whose JVM dumps its classes to ``dump_to`` at exit."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from lakescore.jobs.config import SparkConfig
    from lakescore.jobs.platform.spark.adapter import stop_classic_jvm
    from lakescore.jobs.platform.spark.session import get_or_create_session
    from lakescore.jobs.platform.tables import last_commit, own_commit, read_pinned, table_id, write_delta

    cfg = SparkConfig(
        master="local[1]",
        app_name="lakescore-class-archive",
        jars_dir=jars_dir,
        class_archive=False,
        warehouse_dir=str(scratch / "warehouse"),
        conf={
            "spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={dump_to} -Xlog:cds=error",
            "spark.ui.enabled": "false",
        },
    )
    spark, _ = get_or_create_session(cfg)
    rows = spark.range(64).select(F.col("id"), F.concat(F.lit("text "), F.col("id").cast("string")).alias("body"))
    rows.write.parquet(str(scratch / "input"))
    source, _ = read_pinned(spark, str(scratch / "input"))
    scored = (
        source.mapInArrow(lambda batches: batches, source.schema)
        .withColumn("digest", F.sha2("body", 256))
        .withColumn("chunk", F.col("id") % 2)
    )
    out = str(scratch / "output")
    write_delta(scored, out, partition_by="chunk", user_metadata="train", txn=("train", 1))
    own_commit(spark, out, "train")
    pinned = spark.read.format("delta").option("versionAsOf", last_commit(spark, out).version).load(out)
    table_id(spark, out)
    pinned.agg(
        F.count("*"), F.countDistinct("id"), F.min("body"), F.max("body"), F.sum(F.col("id").isNull().cast("int"))
    ).collect()
    table = DeltaTable.forPath(spark, out)
    (
        table.alias("t")
        .merge(pinned.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .whenNotMatchedBySourceDelete()
        .execute()
    )
    spark.sql("CREATE DATABASE IF NOT EXISTS lakescore_train")
    pinned.write.format("delta").mode("overwrite").saveAsTable("lakescore_train.scores")
    spark.table("lakescore_train.scores").count()
    stop_classic_jvm(spark)  # the JVM writes the archive as it exits


if __name__ == "__main__":
    _train(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
