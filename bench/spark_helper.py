"""The one Spark harness shared by the Spark peers (b: naive pandas UDF, c: ``predict_batch_udf``,
t: ``lakescore.transform``, p: ``lakescore.pandas_udf``).

``python -m bench.spark_helper --peer MODULE --input PARQUET``
builds the session, embeds ``body`` with the peer module's ``make_udf()`` (or ``score_frame``),
keeps ``review_id`` beside the vector (as lakescore's output does) and writes
with the ``noop`` sink, which computes every row and stores nothing (cheaper
than lakescore's Delta write, so that choice favours the peers).

Session settings match what lakescore builds for itself where they matter to
scoring speed: ``local[*]``, Python workers run this interpreter, Arrow
batches of lakescore's default ``scoring.arrow_max_records_per_batch`` rows,
default driver memory. No Delta extension or metastore (not needed to read
Parquet and write ``noop``).

Workers import ``bench.peers.<peer>`` to unpickle the UDF, so the caller puts
the repository root on ``PYTHONPATH`` (the harness does).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["SPARK_PEERS", "main"]

SPARK_PEERS = ("naive_udf", "predict_batch", "lakescore_transform", "lakescore_pandas_udf")
"""Modules under :mod:`bench.peers` that provide ``make_udf()`` (a UDF over ``body``) or ``score_frame(frame)``."""


def _session(app_name: str):
    from pyspark.sql import SparkSession

    from lakescore.jobs.config import ScoringConfig
    from lakescore.jobs.platform.spark.adapter import set_log_level

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[*]")
        .appName(app_name)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(ScoringConfig().arrow_max_records_per_batch))
        .getOrCreate()
    )
    set_log_level(spark, "WARN")
    return spark


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.spark_helper")
    parser.add_argument("--peer", required=True, choices=SPARK_PEERS)
    parser.add_argument("--input", required=True, help="Parquet file or directory with review_id, body")
    args = parser.parse_args(argv)

    peer = importlib.import_module(f"bench.peers.{args.peer}")
    spark = _session(f"bench-{args.peer}")
    try:
        frame = spark.read.parquet(args.input)
        if hasattr(peer, "score_frame"):
            scored = peer.score_frame(frame)
        else:
            scored = frame.select("review_id", peer.make_udf()("body").alias("embedding"))
        scored.write.format("noop").mode("overwrite").save()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
