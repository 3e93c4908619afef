"""W6's hand-written peer: the top-K job as a Spark user writes it, one Python process, no lakescore step.

Spark reads the candidate Parquet; ``pyspark.ml.functions.predict_batch_udf`` scores the feature columns (one
``struct``, so each slice of ``--batch`` rows arrives as one float32 matrix) with the TorchScript program, loaded once
per Python worker, its one output the score; ``row_number()`` over a window per user ordered by score descending
then ``item_id`` ascending keeps the best ``--top-k`` rows; Delta overwrites ``--output`` with (``user_id``,
``item_id``, ``score``, ``rank``). With ``--top-k 0`` (W7) nothing is ranked: every scored row is written, without
``rank``.

The session has what lakescore's own local session has that is not a lakescore feature: the same master, the Delta
extension and catalog from the same cached jars, Arrow batches of lakescore's default size, WARN logging; none of
lakescore's local accelerations (worker preload, class archive, JVM flags). ``--timings`` gets the input's rows, the
seconds from the read to the written table (session start excluded) and the batch size.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np


def make_predict_fn(model_path: str):
    """``predict_batch_udf``'s loading hook: the program, and a function from a ``(rows, features)`` matrix to float64
    scores."""

    def load():
        import torch

        program = torch.jit.load(model_path, map_location="cpu").eval()

        def predict(features: np.ndarray) -> np.ndarray:
            matrix = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
            with torch.inference_mode():
                return program(matrix).reshape(len(matrix)).double().numpy()

        return predict

    return load


def hand_session(master: str):
    """The hand jobs' Spark session (this module's docstring says what it has and lacks)."""
    from pyspark.sql import SparkSession

    from lakescore.jobs.config import ScoringConfig, SparkConfig
    from lakescore.jobs.platform.spark.adapter import set_log_level
    from lakescore.jobs.platform.spark.session import jar_confs

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName("bench-topk-window")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(ScoringConfig().arrow_max_records_per_batch))
    )
    for key, value in jar_confs(SparkConfig(), (), {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    set_log_level(spark, "WARN")
    return spark


def hand_job_parser(prog: str, input_help: str, model_help: str, top_k_help: str) -> argparse.ArgumentParser:
    """The arguments every hand-written ranking job takes (its own are added by its caller)."""
    from lakescore.jobs.config import ScoringConfig, SparkConfig

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--input", required=True, help=input_help)
    parser.add_argument("--model", required=True, help=model_help)
    parser.add_argument("--output", required=True, help="Delta path to overwrite")
    parser.add_argument("--timings", required=True, help="JSON file to write the timings to")
    parser.add_argument("--top-k", type=int, required=True, help=top_k_help)
    parser.add_argument("--batch", type=int, default=ScoringConfig().max_batch_rows, help="rows per forward")
    parser.add_argument("--master", default=SparkConfig().master, help="Spark master (lakescore's default)")
    return parser


def run_hand_job(args: argparse.Namespace, load: Callable, model_input: Callable) -> int:
    """Score ``args.input`` with ``predict_batch_udf`` over ``load`` (its input: ``model_input()``, a column or a tuple
    of columns built once the session exists), keep each user's best ``args.top_k`` rows by score then ``item_id`` (0:
    every row, no rank), overwrite ``args.output`` in Delta and write ``args.timings``."""
    import pyarrow.parquet as pq
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType
    from pyspark.sql.window import Window

    spark = hand_session(args.master)
    try:
        started = time.perf_counter()
        score = predict_batch_udf(load, return_type=DoubleType(), batch_size=args.batch)
        inputs = model_input()
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        scored = spark.read.parquet(args.input).select("user_id", "item_id", score(*inputs).alias("score"))
        top = scored
        if args.top_k:  # 0: W7, score and write only
            best = Window.partitionBy("user_id").orderBy(F.desc("score"), F.asc("item_id"))
            top = scored.withColumn("rank", F.row_number().over(best)).where(F.col("rank") <= args.top_k)
        top.write.format("delta").mode("overwrite").save(args.output)
        seconds = time.perf_counter() - started
    finally:
        spark.stop()
    files = pq.ParquetDataset(args.input).files  # the row count from the footers: no second Spark job
    with open(args.timings, "w", encoding="utf-8") as handle:
        json.dump(
            {
                "rows": sum(pq.ParquetFile(f).metadata.num_rows for f in files),
                "job_seconds": seconds,
                "batch": args.batch,
                "top_k": args.top_k,
                "master": args.master,
            },
            handle,
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = hand_job_parser(
        "bench.peers.topk_window",
        "Parquet directory with user_id, item_id and the features",
        "a TorchScript program (.pt)",
        "rows kept per user (0: no ranking, W7)",
    )
    parser.add_argument("--features", required=True, help="feature columns in the program's order, comma-separated")
    args = parser.parse_args(argv)
    from pyspark.sql import functions as F

    features = args.features.split(",")
    return run_hand_job(args, make_predict_fn(args.model), lambda: F.struct(*features))


if __name__ == "__main__":
    sys.exit(main())
