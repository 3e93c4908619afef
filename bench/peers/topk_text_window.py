"""W6T's hand-written peer: the top-K job over texts as a Spark user writes it, one Python process, no lakescore step.

Spark reads the candidate Parquet; ``pyspark.ml.functions.predict_batch_udf`` scores the ``text`` column with the
model and its tokenizer, loaded once per Python worker (each slice of ``--batch`` texts tokenized padded to its
longest row, truncated at the tokenizer's limit, the one logit through a sigmoid); ``row_number()`` over a window
per user ordered by score descending then ``item_id`` ascending keeps the best ``--top-k`` rows; Delta overwrites
``--output`` with (``user_id``, ``item_id``, ``score``, ``rank``). Session, window, write and timings are
W6's hand job's (:func:`bench.peers.topk_window.run_hand_job`): ``--timings`` gets the input's rows, the seconds
from the read to the written table (session start excluded) and the batch size.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


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


def main(argv: Sequence[str] | None = None) -> int:
    from bench.peers.topk_window import hand_job_parser, run_hand_job

    parser = hand_job_parser(
        "bench.peers.topk_text_window",
        "Parquet directory with user_id, item_id and text",
        "a sequence classification model directory with its tokenizer",
        "rows kept per user",
    )
    args = parser.parse_args(argv)
    from pyspark.sql import functions as F

    return run_hand_job(args, make_predict_fn(args.model), lambda: F.col("text"))


if __name__ == "__main__":
    sys.exit(main())
