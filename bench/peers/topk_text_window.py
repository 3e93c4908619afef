"""W6T's hand-written peer: the top-K job over texts as a Spark user writes it, one Python process, no lakescore step.

Spark reads the candidate Parquet; ``pyspark.ml.functions.predict_batch_udf`` scores the ``text`` column with the
model and its tokenizer, loaded once per Python worker (each slice of ``--batch`` texts tokenized padded to its
longest row, truncated at the tokenizer's limit, the one logit through a sigmoid); ``row_number()`` over a window
per user ordered by score descending then ``item_id`` ascending keeps the best ``--top-k`` rows; Delta overwrites
``--output`` with (``user_id``, ``item_id``, ``score``, ``rank``). The session is W6's hand job's
(:mod:`bench.peers.topk_window`). ``--timings`` gets the input's rows, the seconds from the read to the written table
(session start excluded) and the batch size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Optional, Sequence


def make_predict_fn(model_dir: str):
    """``predict_batch_udf``'s loading hook: the tokenizer and model, and a function from texts to float64 scores."""

    def load():
        import numpy as np
        import torch
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()

        def predict(texts: np.ndarray) -> np.ndarray:
            features = tokenizer(list(texts), padding=True, truncation=True, return_tensors="pt")
            with torch.inference_mode():
                return torch.sigmoid(model(**features).logits[:, 0]).double().numpy()

        return predict

    return load


def main(argv: Optional[Sequence[str]] = None) -> int:
    from lakescore.jobs.config import ScoringConfig, SparkConfig

    parser = argparse.ArgumentParser(prog="bench.peers.topk_text_window")
    parser.add_argument("--input", required=True, help="Parquet directory with user_id, item_id and text")
    parser.add_argument("--model", required=True, help="a sequence classification model directory with its tokenizer")
    parser.add_argument("--output", required=True, help="Delta path to overwrite")
    parser.add_argument("--timings", required=True, help="JSON file to write the timings to")
    parser.add_argument("--top-k", type=int, required=True, help="rows kept per user")
    parser.add_argument("--batch", type=int, default=ScoringConfig().max_batch_rows, help="rows per forward")
    parser.add_argument("--master", default=SparkConfig().master, help="Spark master (lakescore's default)")
    args = parser.parse_args(argv)

    import pyarrow.parquet as pq
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType
    from pyspark.sql.window import Window

    from bench.peers.topk_window import hand_session

    spark = hand_session(args.master)
    try:
        started = time.perf_counter()
        score = predict_batch_udf(make_predict_fn(args.model), return_type=DoubleType(), batch_size=args.batch)
        scored = spark.read.parquet(args.input).select("user_id", "item_id", score("text").alias("score"))
        best = Window.partitionBy("user_id").orderBy(F.desc("score"), F.asc("item_id"))
        top = scored.withColumn("rank", F.row_number().over(best)).where(F.col("rank") <= args.top_k)
        top.write.format("delta").mode("overwrite").save(args.output)
        seconds = time.perf_counter() - started
    finally:
        spark.stop()
    files = pq.ParquetDataset(args.input).files  # the row count from the footers: no second Spark job
    with open(args.timings, "w", encoding="utf-8") as handle:
        json.dump({"rows": sum(pq.ParquetFile(f).metadata.num_rows for f in files), "job_seconds": seconds,
                   "batch": args.batch, "top_k": args.top_k, "master": args.master}, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
