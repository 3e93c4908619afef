"""Peer (c): Spark's own ``pyspark.ml.functions.predict_batch_udf`` with ``batch_size=64``.

Spark cuts each Arrow batch into 64-row slices in table order and calls the
predict function once per slice; the function comes from :func:`make_predict_fn`,
which Spark calls once per Python worker (and caches there).
"""

from __future__ import annotations

import numpy as np

from bench.model import BATCH_SIZE, load_model


def make_predict_fn():
    """Spark's model-loading hook: return a function from a batch of texts to an ``(n, 384)`` array."""
    model = load_model()

    def predict(texts: np.ndarray) -> np.ndarray:
        return model.encode(texts.tolist(), batch_size=BATCH_SIZE, normalize_embeddings=True)

    return predict


def make_udf():
    """``predict_batch_udf`` over :func:`make_predict_fn`: a string column in, ``array<float>`` out."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType

    return predict_batch_udf(make_predict_fn, return_type=ArrayType(FloatType()), batch_size=BATCH_SIZE)
