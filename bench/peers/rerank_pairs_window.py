"""W9's hand-written peer: (query, passage) pairs reranked as a Spark user writes it, one Python process, no lakescore
step.

Spark reads the pairs' Parquet; ``pyspark.ml.functions.predict_batch_udf`` scores the ``query`` and ``text`` columns
with the cross-encoder and its tokenizer, loaded once per Python worker (each slice of ``--batch`` pairs tokenized as
pairs, padded to its longest pair, truncated longest side first at the tokenizer's limit, the one logit through a
sigmoid: ``CrossEncoder.predict``'s computation); ``row_number()`` over a window per query (``user_id``) ordered by
score descending then ``item_id`` ascending keeps the best ``--top-k`` rows; Delta overwrites ``--output``. Session,
window, write and timings are W6's hand job's (:func:`bench.peers.topk_window.run_hand_job`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def make_predict_fn(model_dir: str):
    """``predict_batch_udf``'s loading hook: the tokenizer and model, and a function from queries and passages to
    float64 scores."""

    def load():
        import numpy as np
        import torch
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()

        def predict(queries: np.ndarray, passages: np.ndarray) -> np.ndarray:
            features = tokenizer(
                list(queries), list(passages), padding=True, truncation="longest_first", return_tensors="pt"
            )
            with torch.inference_mode():
                return torch.sigmoid(model(**features).logits[:, 0]).double().numpy()

        return predict

    return load


def main(argv: Sequence[str] | None = None) -> int:
    from bench.peers.topk_window import hand_job_parser, run_hand_job

    parser = hand_job_parser(
        "bench.peers.rerank_pairs_window",
        "Parquet directory with user_id, item_id, query and text",
        "a sequence classification model directory with its tokenizer",
        "passages kept per query",
    )
    args = parser.parse_args(argv)
    from pyspark.sql import functions as F

    return run_hand_job(args, make_predict_fn(args.model), lambda: (F.col("query"), F.col("text")))


if __name__ == "__main__":
    sys.exit(main())
