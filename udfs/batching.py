"""Length-ordered batching: the shared core every task head scores through.

Rows arrive in table order, where a long review sits next to a one-liner and a
fixed-size batch is padded to its longest row. Scoring rows in length order
(as ``SentenceTransformer.encode`` does) keeps batches of similar length, and
the results are scattered back so output row *i* always belongs to input row *i*.

Pure Python and numpy: unit-tested without Spark.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

__all__ = ["length_order", "score_in_length_order"]


def length_order(texts: Sequence[str]) -> np.ndarray:
    """Indices that visit ``texts`` longest first (stable for equal lengths)."""
    lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    return np.argsort(-lengths, kind="stable")


def score_in_length_order(
    texts: Sequence[Optional[str]],
    score_batch: Callable[[list[str]], np.ndarray],
    *,
    batch_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Score non-null ``texts`` in length-sorted batches of at most ``batch_size``.

    ``score_batch`` takes a list of strings and returns an array whose first
    dimension equals the list's length (one row of outputs per text).

    Returns ``(outputs, valid)``: ``outputs[i]`` belongs to ``texts[i]``;
    ``valid`` is a boolean mask, False where the text was null (``None`` or NaN),
    whose output row is left as zeros and must not be used.

    Raises ``ValueError`` if ``batch_size`` < 1 or ``score_batch`` returns the
    wrong number of rows.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    valid = np.fromiter((isinstance(t, str) for t in texts), dtype=bool, count=len(texts))
    present = np.flatnonzero(valid)
    present_texts = [texts[i] for i in present]
    order = length_order(present_texts)

    outputs: Optional[np.ndarray] = None
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        scored = np.asarray(score_batch([present_texts[i] for i in rows]))
        if scored.shape[0] != len(rows):
            raise ValueError(f"score_batch returned {scored.shape[0]} rows for a batch of {len(rows)} texts")
        if outputs is None:
            outputs = np.zeros((len(texts),) + scored.shape[1:], dtype=scored.dtype)
        outputs[present[rows]] = scored
    if outputs is None:  # no non-null text in this batch: shape is unknown, nothing to keep
        outputs = np.zeros((len(texts), 0), dtype=np.float32)
    return outputs, valid
