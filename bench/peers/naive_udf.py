"""Peer (b): the naive Spark pattern, a scalar pandas UDF (Series -> Series).

The model lives in a module global of each Python worker (:func:`bench.model.load_model`);
each Arrow batch is encoded in fixed 64-row chunks in table order, so every
chunk is padded to its longest text.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench.model import BATCH_SIZE, load_model


def embed_series(texts: pd.Series) -> pd.Series:
    """Embed ``texts`` chunk by chunk in the order given."""
    model = load_model()
    chunks = [
        model.encode(texts.iloc[start : start + BATCH_SIZE].tolist(), batch_size=BATCH_SIZE, normalize_embeddings=True)
        for start in range(0, len(texts), BATCH_SIZE)
    ]
    vectors = np.concatenate(chunks) if chunks else np.zeros((0, 0), dtype=np.float32)
    return pd.Series(list(vectors.astype(np.float32)), index=texts.index)


def make_udf():
    """The scalar pandas UDF: a string column in, ``array<float>`` out."""
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import ArrayType, FloatType

    return pandas_udf(embed_series, returnType=ArrayType(FloatType()))
