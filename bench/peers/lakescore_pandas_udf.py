"""Peer (p): ``lakescore.pandas_udf`` in a ``select`` — the iterator pandas UDF for notebooks.

Same model cache, length-sorted token-budget batching and order restore as (t); what differs is
Spark's pandas round trip (every embedding becomes a Python object on the way back to Arrow).
The input is spread over every core first, as ``transform`` does by itself: a ``select`` keeps
the input's partitioning, and a one-file Parquet would otherwise score on one core.
"""

from __future__ import annotations

from bench.model import model_dir


def score_frame(frame):
    """``review_id`` and ``embedding`` of every row of ``frame``."""
    import lakescore
    from lakescore.jobs.platform.spark.adapter import default_parallelism

    embed = lakescore.pandas_udf(task="embed", model=model_dir())
    frame = frame.repartition(default_parallelism(frame.sparkSession))
    return frame.select("review_id", embed("body").alias("embedding"))
